"""Register a parent of 1,000 events from a generator, then wait for its verdict.

    pip install ./sdk/python
    python examples/python/producer.py [--parent orders-2026-12-07] [--url http://127.0.0.1:8080]

Every child row is written before any worker can claim one: a crash of this
script, of a worker or of the service loses nothing. Running it again with
the same parent id is safe (the same registration answers 200 and writes
nothing), so a producer that is not sure its call went through just repeats it.
"""
import argparse

from child_ledger import Ledger


def events(n):
    """Any iterator will do; past 10,000 children the SDK pages through them."""
    for i in range(n):
        if i % 250 == 249:
            # Invalid input is recorded as skipped, with its reason, never dropped.
            yield {"key": f"evt-{i}", "payload": {"event": i}, "skip": "no customer id"}
        else:
            yield {"key": f"evt-{i}", "payload": {"event": i, "customer": f"c-{i % 37}"}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parent", default="orders-example")
    parser.add_argument("--queue", default="events")
    parser.add_argument("--children", type=int, default=1000)
    parser.add_argument("--url", default=None, help="default: LEDGER_URL or http://127.0.0.1:8080")
    parser.add_argument("--no-wait", action="store_true", help="register and exit")
    args = parser.parse_args()

    with Ledger(args.url) as ledger:
        parent = ledger.register(args.parent, args.queue, events(args.children), max_attempts=5,
                                 retry_backoff={"initial_seconds": 1, "max_seconds": 60})
        print(f"registered {parent['parent_id']}: {parent['counts']['total']} children, state {parent['state']}")
        if args.no_wait:
            return
        done = ledger.wait(args.parent)  # follows the parent's event stream to its completion
        print(f"verdict {done['verdict']}: {done['counts']}")
        for reason in ledger.summary(args.parent)["reasons"]:
            print(f"  {reason['count']} {reason['state']}: {reason['reason']}")


if __name__ == "__main__":
    main()
