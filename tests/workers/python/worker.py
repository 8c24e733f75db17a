#!/usr/bin/env python3
"""A raw-protocol child-ledger worker: Python 3.9+, standard library only.

A contract test kept beside examples/node/worker.mjs (users take the SDK in
sdk/python instead).

    python3 worker.py --queue events [--url http://127.0.0.1:8080] [--token T] [--exit-when-empty]

With access control on, give a token with the `worker` role (--token, or
LEDGER_TOKEN in the environment): it is sent as `Authorization: Bearer`.

The loop, for anyone writing a worker in another language (the contract is
the OpenAPI document, openapi/openapi.json in the repository and GET
/openapi.json on the service):

1. Claim a leased chunk: POST /v1/queues/{queue}/claims
       {"limit": 50, "lease_seconds": 30, "worker": "python-123", "wait_seconds": 5}
   -> {"claim_id": "<uuid>", "lease_expires_at": "...", "children": [{"parent_id",
       "sequence", "key", "payload", "attempt", "idempotency_key", "previous_attempt",
       "traceparent"}]}
   An empty "children" list means nothing was claimable (after long-polling up
   to wait_seconds, 0-20).
2. Keep the lease while working: a background timer calls
   POST /v1/claims/{claim_id}/extend {"lease_seconds": 30} whenever about a third
   of the lease remains. {"extended": 0} means the claim holds nothing any more
   (the lease ran out and the children went back to the queue): stop starting
   them, as when by our own clock the lease may have run out (extends failing).
   Children never started are released (step 5) whatever ended the chunk.
3. Work each child. If "previous_attempt" is "expired", an earlier holder may
   already have had the remote effect: look the child's "idempotency_key" up on
   the remote side first and, if it is there, record the outcome without redoing it.
4. Record outcomes in batches: POST /v1/outcomes {"outcomes": [{"parent_id",
   "sequence", "outcome": "processed"|"failed", "reason", "result", "claim_id"}]}
   -> {"results": [{"parent_id", "sequence", "status"}]}, in request order.
   "applied" means this write made the child terminal. Anything else ("duplicate":
   the same outcome was already recorded, "conflict": a different one won,
   "not_found", "not_decomposed") is logged and never retried: the first terminal
   write wins. ("duplicate" is also what a retried post gets for its own
   earlier write, so "not_applied" in the summary counts those too.) Outcomes
   are not fenced by the lease: a late write still counts if it is the first.
   Trace context: a child's "traceparent" (W3C, or null) is logged and sent as
   the `traceparent` header of the outcome post that reports it, so the outcome
   joins the producer's trace; a batch holds children of one traceparent only
   (with the service exporting traces, each claimed child has its own, and its
   outcome goes alone).
   A chunk's last batch goes with the next claim instead, as its "outcomes"
   member: one request records them and claims the next chunk, and its answer's
   "outcome_results" is what POST /v1/outcomes would have answered. (Not when
   the batch carries a traceparent, which is a header of its own request, nor
   when stopping: then it is posted at once.)
5. On SIGTERM/SIGINT: stop claiming, finish the child in hand, post the outcomes
   already computed, give the rest back with POST /v1/claims/{claim_id}/release
   {"children": [{"parent_id", "sequence"}]} (fenced by claim_id: only children
   this claim still holds move) and exit 0.
6. What can get better is retried with exponential backoff, honouring
   Retry-After: a refused or lost connection, a timeout, 429, 502, 503 and 504.
   Outcome, extend and release calls are safe to repeat. A claim whose answer
   was lost leaves its children leased to nobody until the lease runs out; they
   then come back with previous_attempt "expired" (step 3).
   What cannot get better stops the worker at once with a clear message and
   exit status 2: any other answer to a claim (401 a token the service does
   not know, 403, 404, 422 a flag out of range: application/problem+json, whose
   "type" and "detail" are logged), a token that cannot go in a header, an
   answer that is not JSON. Such an answer to an extend, an outcome batch or
   a release is logged; those children come back when the lease runs out.
7. --exit-when-empty: exit once a claim comes back empty and nothing this
   worker claimed is still in flight (children whose outcome it could not
   record stay leased to it until their lease runs out; it claims on until
   then). Other workers' leases are theirs: it does not wait for them.

stderr gets one log line per chunk (and one per child that carries a traceparent); stdout gets one JSON line at exit:
{"worker", "lang", "claimed", "processed", "failed", "deduplicated", "not_applied",
 "released", "abandoned"}, where claimed = processed + failed + not_applied +
released + abandoned ("deduplicated" is part of "processed"; "abandoned" children
come back to some worker when their lease runs out).
"""
import argparse
import http.client
import json
import os
import re
import signal
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

LANG = "python"
RETRY_STATUSES = {429, 502, 503, 504}


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Problem(Exception):
    """An error answer that retrying will not fix (an RFC 9457 problem document)."""

    def __init__(self, status, body):
        self.status, self.body = status, body
        super().__init__(f"HTTP {status} {body.get('type', '?')}: {body.get('detail', body)}")


class Unavailable(Exception):
    """The service stayed unreachable (or kept answering 503) through every retry."""


class Fatal(Exception):
    """Something retrying will not fix that is not a problem answer: stop with this message."""


class Ledger:
    """JSON over HTTP, retrying transient failures."""

    def __init__(self, base_url, stop, token=None):
        self.base, self.stop = base_url.rstrip("/"), stop
        self.headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"

    def call(self, method, path, body=None, timeout=30, tries=8, give_up_on_stop=False, traceparent=None):
        data = None if body is None else json.dumps(body).encode()
        headers = dict(self.headers, traceparent=traceparent) if traceparent else self.headers
        delay = 0.5
        for attempt in range(1, tries + 1):
            request = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=timeout) as response:
                    raw = response.read()
                try:
                    return json.loads(raw)
                except ValueError:
                    raise Fatal(f"{method} {path}: the answer is not JSON (is --url the ledger?): "
                                f"{raw[:200].decode(errors='replace')}") from None
            except urllib.error.HTTPError as err:
                raw = err.read()
                try:
                    problem = json.loads(raw)
                except ValueError:
                    problem = {"detail": raw.decode(errors="replace")}
                if err.code not in RETRY_STATUSES:
                    raise Problem(err.code, problem if isinstance(problem, dict) else {}) from None
                why, wait = f"HTTP {err.code}", retry_after(err.headers.get("Retry-After"), delay)
            except (OSError, http.client.HTTPException) as err:  # refused, reset, timed out, cut short
                why, wait = str(getattr(err, "reason", err)), delay
            except ValueError as err:  # an unusable --url or header: ours to fix
                raise Fatal(f"{method} {path}: {err}") from None
            if attempt == tries or (give_up_on_stop and self.stop.is_set()):
                raise Unavailable(f"{method} {path}: gave up after {attempt} tries ({why})")
            log(f"{method} {path}: {why}; retrying in {wait:.1f}s")
            if give_up_on_stop:
                self.stop.wait(wait)
            else:
                time.sleep(wait)
            delay = min(delay * 2, 10)


def retry_after(header, default):
    try:
        return max(0.0, float(header))
    except (TypeError, ValueError):  # absent, or an HTTP date: use our own backoff
        return default


class Effects:
    """Stand-in for the remote side's idempotency lookup: a JSON-lines file of
    the idempotency keys whose effect has happened (shared by all workers)."""

    def __init__(self, path):
        self.path = path

    def already_done(self, key):
        if not self.path or not os.path.exists(self.path):
            return False
        with open(self.path, encoding="utf-8") as lines:
            for line in lines:
                try:
                    if json.loads(line).get("key") == key:
                        return True
                except ValueError:
                    continue
        return False

    def mark_done(self, key):
        if self.path:  # one small O_APPEND write per key
            with open(self.path, "a", encoding="utf-8") as out:
                out.write(json.dumps({"key": key}) + "\n")


def do_work(child, worker, work_ms):
    """The job itself: replace this. Return the JSON result; raise to record `failed`."""
    if work_ms:
        time.sleep(work_ms / 1000)
    return {"worker": worker, "lang": LANG, "attempt": child["attempt"]}


class LeaseKeeper(threading.Thread):
    """Extends one claim whenever about a third of its lease remains, until `done`.
    `expired()` turns true once the claim holds nothing any more or, judged by our
    own clock, the lease may have run out (e.g. the extends kept failing)."""

    def __init__(self, api, claim_id, lease_seconds):
        super().__init__(daemon=True)
        self.api, self.claim_id, self.lease_seconds = api, claim_id, lease_seconds
        self.deadline = time.monotonic() + lease_seconds  # the claim's answer just arrived
        self.done, self.lost = threading.Event(), False

    def expired(self):
        return self.lost or time.monotonic() >= self.deadline

    def run(self):
        while not self.done.wait(max(0.5, self.deadline - self.lease_seconds / 3 - time.monotonic())):
            sent = time.monotonic()
            try:
                answer = self.api.call("POST", f"/v1/claims/{self.claim_id}/extend",
                                       {"lease_seconds": self.lease_seconds}, tries=3)
            except (Problem, Unavailable) as err:
                log(f"extend {self.claim_id}: {err}")
                continue
            if answer["extended"] == 0:
                if not self.done.is_set():
                    log(f"claim {self.claim_id} holds nothing any more: lease lost")
                self.lost = True
                return
            self.deadline = sent + self.lease_seconds


class Worker:
    def __init__(self, args):
        self.args = args
        self.stop = threading.Event()
        self.api = Ledger(args.url, self.stop, args.token)
        self.effects = Effects(args.effects_file)
        self.work = lambda child: do_work(child, args.worker, args.work_ms)
        self.stats = dict.fromkeys(
            ["claimed", "processed", "failed", "deduplicated", "not_applied", "released", "abandoned"], 0)
        # Until when (our clock) children this worker abandoned may still be leased to it.
        self.own_leases_until = 0.0

    def run(self):
        a = self.args
        path = f"/v1/queues/{urllib.parse.quote(a.queue, safe='')}/claims"
        body = {"limit": a.limit, "lease_seconds": a.lease_seconds, "worker": a.worker,
                "wait_seconds": a.wait_seconds}
        carried = []  # the last chunk's last outcomes, recorded by the next claim
        while not self.stop.is_set():
            claimed = time.monotonic()
            ask = dict(body, outcomes=[item for item, _ in carried]) if carried else body
            try:
                claim = self.api.call("POST", path, ask, timeout=a.wait_seconds + 30, give_up_on_stop=True)
            except Unavailable as err:
                log(f"claim: {err}")  # the outcomes it carried go again (a repeat is answered "duplicate")
                continue
            except Problem as err:
                if carried:
                    self.not_recorded(carried, err)
                raise
            if carried:
                self.count_results(carried, claim["outcome_results"])
            carried = []
            if claim["children"]:
                carried = self.work_chunk(claim["claim_id"], claim["children"])
            elif a.exit_when_empty and claimed > self.own_leases_until:
                log("nothing claimable and nothing of ours in flight: exiting")
                return
            elif a.wait_seconds == 0:
                self.stop.wait(1)
        if carried:
            self.post_outcomes(carried, None)

    def work_chunk(self, claim_id, children):
        """Works a chunk; returns its last batch of outcomes when it goes with the next claim."""
        started, before = time.monotonic(), dict(self.stats)
        self.stats["claimed"] += len(children)
        keeper = LeaseKeeper(self.api, claim_id, self.args.lease_seconds)
        keeper.start()
        todo, batch, trace, carried = list(children), [], None, []
        try:
            while todo and not self.stop.is_set() and not keeper.expired():
                child = todo.pop(0)
                # One traceparent per outcome post: a child of another trace context starts a batch.
                if batch and child.get("traceparent") != trace:
                    self.post_outcomes(batch, trace)
                    batch = []
                trace = child.get("traceparent")
                if trace:
                    log(f"{child['parent_id']}/{child['sequence']}: traceparent {trace}")
                batch.append(self.outcome_for(claim_id, child))
                if len(batch) >= self.args.batch_size:
                    self.post_outcomes(batch, trace)
                    batch = []
            if batch and (trace or self.stop.is_set()):
                self.post_outcomes(batch, trace)
            else:
                carried = batch
        finally:
            keeper.done.set()
        if todo:  # never started: give back what this claim still holds
            self.release(claim_id, todo)
        # Children whose outcome was not recorded (or that were not given back)
        # stay leased to this claim until the lease runs out.
        if self.stats["abandoned"] > before["abandoned"]:
            self.own_leases_until = max(self.own_leases_until, keeper.deadline)
        delta = {k: v - before[k] for k, v in self.stats.items() if v != before[k]}
        expired = sum(c.get("previous_attempt") == "expired" for c in children)
        riding = f", {len(carried)} outcomes going with the next claim" if carried else ""
        log(f"{self.args.worker} claim {claim_id}: {len(children)} children ({expired} after an "
            f"expired lease) {json.dumps(delta)}{riding} in {time.monotonic() - started:.2f}s")
        return carried

    def outcome_for(self, claim_id, child):
        """Returns (outcome item for POST /v1/outcomes, whether the work was skipped as done)."""
        item = {"parent_id": child["parent_id"], "sequence": child["sequence"], "claim_id": claim_id}
        key = child["idempotency_key"]
        if child.get("previous_attempt") == "expired" and self.effects.already_done(key):
            result = {"worker": self.args.worker, "lang": LANG, "deduplicated": True}
            return dict(item, outcome="processed", result=result), True
        try:
            result = self.work(child)
        except Exception as err:  # any failure of the job is the child's outcome
            return dict(item, outcome="failed", reason=f"{type(err).__name__}: {err}"[:1000]), False
        self.effects.mark_done(key)
        return dict(item, outcome="processed", result=result), False

    def post_outcomes(self, batch, traceparent):
        try:
            answer = self.api.call("POST", "/v1/outcomes", {"outcomes": [item for item, _ in batch]},
                                   traceparent=traceparent)
        except (Problem, Unavailable) as err:
            self.not_recorded(batch, err)
            return
        self.count_results(batch, answer["results"])

    def not_recorded(self, batch, err):
        log(f"{len(batch)} outcomes not recorded (the children come back when the lease runs out): {err}")
        self.stats["abandoned"] += len(batch)

    def count_results(self, batch, results):
        """Counts what became of a batch's outcomes (one result per item, in order)."""
        for (item, deduplicated), result in zip(batch, results):
            if result["status"] == "applied":
                self.stats["processed" if item["outcome"] == "processed" else "failed"] += 1
                self.stats["deduplicated"] += deduplicated
            else:
                self.stats["not_applied"] += 1
                log(f"{item['parent_id']}/{item['sequence']}: {result['status']}, not applied "
                    "(already terminal; not retried)")

    def release(self, claim_id, children):
        refs = [{"parent_id": c["parent_id"], "sequence": c["sequence"]} for c in children]
        try:
            answer = self.api.call("POST", f"/v1/claims/{claim_id}/release", {"children": refs}, tries=4)
        except (Problem, Unavailable) as err:
            log(f"release {claim_id}: {err} (the children come back when the lease runs out)")
            self.stats["abandoned"] += len(refs)
            return
        self.stats["released"] += answer["released"]
        self.stats["abandoned"] += len(refs) - answer["released"]  # expired, or already handed to another claim


def main():
    parser = argparse.ArgumentParser(description="Example child-ledger worker.")
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="service base URL")
    parser.add_argument("--queue", required=True, help="queue to claim from")
    parser.add_argument("--token", default=os.environ.get("LEDGER_TOKEN"),
                        help="bearer token with the worker role (default: $LEDGER_TOKEN)")
    parser.add_argument("--worker", default=f"{LANG}-{os.getpid()}", help="label shown as claimed_by")
    parser.add_argument("--exit-when-empty", action="store_true",
                        help="exit once a claim is empty and nothing this worker claimed is in flight")
    parser.add_argument("--limit", type=int, default=50, help="children per claim (1-1000)")
    parser.add_argument("--lease-seconds", type=int, default=30, help="lease length (1-86400)")
    parser.add_argument("--wait-seconds", type=int, default=None,
                        help="claim long-poll, 0-20 (default 5; 1 with --exit-when-empty)")
    parser.add_argument("--batch-size", type=int, default=25, help="outcomes per POST /v1/outcomes (1-1000)")
    parser.add_argument("--work-ms", type=int, default=0, help="simulated work per child")
    parser.add_argument("--effects-file",
                        help="JSON-lines file standing in for the remote side's idempotency keys")
    args = parser.parse_args()
    # A bearer token is visible ASCII: anything else (a pasted placeholder such
    # as "…") cannot go in a header, and no retry changes that.
    if args.token and not re.fullmatch(r"[\x21-\x7e]+", args.token):
        print("the token (--token or LEDGER_TOKEN) holds characters an HTTP header cannot carry "
              "(only visible ASCII): give the first line `child-ledger token new` printed", file=sys.stderr)
        sys.exit(2)
    if args.wait_seconds is None:
        args.wait_seconds = 1 if args.exit_when_empty else 5

    worker = Worker(args)

    def on_signal(signum, _frame):
        if not worker.stop.is_set():
            log(f"{signal.Signals(signum).name}: stopping; finishing the child in hand, releasing the rest")
        # Set from another thread: the main thread may hold the Event's lock right now.
        threading.Thread(target=worker.stop.set, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    code = 0
    try:
        worker.run()
    except (Problem, Fatal) as err:  # e.g. 401 an unknown token, 400 a bad queue name, 422 --limit 5000
        log(f"giving up: {err}")
        code = 2
    print(json.dumps({"worker": args.worker, "lang": LANG, **worker.stats}), flush=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
