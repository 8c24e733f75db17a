"""A worker: charge each order once, even across crashes and retries.

    pip install ./sdk/python
    python -m child_ledger worker examples.python.worker:charge --queue events
    python examples/python/worker.py --queue events        # the same, from code

The SDK claims children in chunks, extends their leases while the handler
runs, records each outcome (riding on the next claim), and on Ctrl-C or
SIGTERM gives back what it has not started and lets the rest finish.
"""
import argparse
import logging

from child_ledger import Child, Failed, Ledger, Worker

# Stands in for the remote side (a payment API): what it has already done,
# by idempotency key.
CHARGED = {}


def charge(child: Child):
    order = child.payload
    if "customer" not in order:
        raise Failed("no customer id")           # recorded as failed: retrying will not help
    if child.previous_attempt == "expired" and child.idempotency_key in CHARGED:
        # An earlier holder may have charged before it died: look it up, don't repeat it.
        return {"charge": CHARGED[child.idempotency_key], "deduplicated": True}
    charge_id = f"ch-{child.parent_id}-{child.sequence}"  # a remote call would go here
    CHARGED[child.idempotency_key] = charge_id
    return {"charge": charge_id}                  # recorded as processed, with this result
    # Any other exception releases the child for another attempt (with backoff).


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queue", default="events")
    parser.add_argument("--url", default=None, help="default: LEDGER_URL or http://127.0.0.1:8080")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--exit-when-empty", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    worker = Worker(Ledger(args.url), args.queue, charge, concurrency=args.concurrency,
                    exit_when_empty=args.exit_when_empty)
    print(worker.run())  # returns on SIGTERM/Ctrl-C (or when empty), after in-flight work is recorded


if __name__ == "__main__":
    main()
