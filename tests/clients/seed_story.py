"""The seed story, driven only through the generated Python client.

    .ci/clients   # generates target/clients/child_ledger_client
    LEDGER_WORKER_TOKEN=... LEDGER_ADMIN_TOKEN=... PYTHONPATH=target/clients \\
        target/clients-venv/bin/python tests/clients/seed_story.py --url http://127.0.0.1:8080

Registers a parent with one skipped child, claims from a queue, posts a batch
of outcomes, meets a conflict, lets a lease expire and reclaims, completes the
parent, reads its verdict, summary and results (NDJSON and CSV), and runs
reconcile as a dry run, asserting what the service answers at
each step. Worker calls carry a worker token, the rest an admin token (both
as `Authorization: Bearer`). Prints one JSON summary line on success; any
failed check exits non-zero with the step that failed.

Run by tests/generated_client.rs on SQLite and Postgres. It uses nothing but
the generated package (plus the standard library), so a drift in
openapi/openapi.json that breaks what a generated client sees breaks it.
"""

import argparse
import csv
import io
import json
import os
import sys
import time

from child_ledger_client import AuthenticatedClient
from child_ledger_client.api.children import get_child, parent_results
from child_ledger_client.api.claims import claim_from_queue, extend_claim
from child_ledger_client.api.outcomes import record_outcome, record_outcomes
from child_ledger_client.api.parents import get_parent, parent_summary, register_parent
from child_ledger_client.api.reconcile import reconcile_all, reconcile_parent
from child_ledger_client.models import (
    BatchOutcome,
    BatchResults,
    Child,
    ChildSpec,
    ChildState,
    Claim,
    ClaimChildren,
    ExtendClaim,
    Extended,
    Outcome,
    OutcomeStatus,
    Parent,
    ParentState,
    PreviousAttempt,
    Problem,
    ReconcileAll,
    ReconcileParent,
    ReconcileReport,
    RecordOutcome,
    RecordOutcomes,
    RegisterParent,
    Summary,
    SweepReport,
    Verdict,
)
from child_ledger_client.types import UNSET

QUEUE = "seed"
PARENT = "seed-story-1"
SKIP_REASON = "invalid timestamp"
SKIPPED = 2  # the sequence registered with "skip"


def expect(response, status, model, step):
    """The parsed answer, once the status and the generated model are the expected ones."""
    assert response.status_code == status, (
        f"{step}: HTTP {response.status_code}, expected {status}: {response.content[:500]!r}"
    )
    assert isinstance(response.parsed, model), (
        f"{step}: parsed as {type(response.parsed).__name__}, expected {model.__name__}"
    )
    return response.parsed


def claim(worker, limit, lease_seconds, step):
    body = ClaimChildren(limit=limit, lease_seconds=lease_seconds, worker="generated-python", wait_seconds=5)
    answer = expect(claim_from_queue.sync_detailed(QUEUE, client=worker, body=body), 200, Claim, step)
    assert answer.children, f"{step}: nothing claimable"
    return answer


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    args = parser.parse_args()
    worker = AuthenticatedClient(base_url=args.url, token=os.environ["LEDGER_WORKER_TOKEN"], timeout=30.0)
    admin = AuthenticatedClient(base_url=args.url, token=os.environ["LEDGER_ADMIN_TOKEN"], timeout=30.0)

    # 1. Register five children; the third is invalid input, recorded as skipped.
    children = [ChildSpec(payload={"event": i}, key=f"evt-{i}") for i in range(5)]
    children[SKIPPED] = ChildSpec(payload={"event": SKIPPED}, key=f"evt-{SKIPPED}", skip=SKIP_REASON)
    registration = RegisterParent(queue=QUEUE, payload={"source": "generated client"}, children=children)
    parent = expect(register_parent.sync_detailed(PARENT, client=admin, body=registration), 201, Parent, "register")
    assert parent.state == ParentState.ACTIVE and not parent.complete, parent
    counts = parent.counts
    assert (counts.total, counts.skipped, counts.pending, counts.processed) == (5, 1, 4, 0), counts
    again = register_parent.sync_detailed(PARENT, client=admin, body=registration)
    expect(again, 200, Parent, "repeated registration")
    skipped = expect(get_child.sync_detailed(PARENT, SKIPPED, client=worker), 200, Child, "read skipped child")
    assert skipped.state == ChildState.SKIPPED and skipped.reason == SKIP_REASON, skipped

    # 2. Claim from the queue: lowest sequences first, never the skipped child.
    first = claim(worker, 2, 60, "claim")
    assert [(c.sequence, c.attempt) for c in first.children] == [(0, 1), (1, 1)], first
    assert all(c.previous_attempt in (None, UNSET) for c in first.children), first
    assert first.children[0].idempotency_key == f"{PARENT}/0", first.children[0]

    # 3. A batch of outcomes: both applied; the same batch again is a duplicate.
    batch = RecordOutcomes(
        outcomes=[
            BatchOutcome(parent_id=PARENT, sequence=0, outcome=Outcome.PROCESSED,
                         result={"remote_id": "r-0"}, claim_id=first.claim_id),
            BatchOutcome(parent_id=PARENT, sequence=1, outcome=Outcome.FAILED,
                         reason="remote rejected the event", claim_id=first.claim_id),
        ]
    )
    recorded = expect(record_outcomes.sync_detailed(client=worker, body=batch), 200, BatchResults, "batch")
    assert [(r.sequence, r.status) for r in recorded.results] == [
        (0, OutcomeStatus.APPLIED), (1, OutcomeStatus.APPLIED)], recorded
    retried = expect(record_outcomes.sync_detailed(client=worker, body=batch), 200, BatchResults, "batch again")
    assert [r.status for r in retried.results] == [OutcomeStatus.DUPLICATE] * 2, retried

    # 4. A different terminal outcome for a settled child: 409, the first write stands,
    #    and the late write is kept in the child's conflicts; in a batch it is "conflict".
    late = RecordOutcome(outcome=Outcome.FAILED, reason="late failure", claim_id=first.claim_id)
    conflict = expect(record_outcome.sync_detailed(PARENT, 0, client=worker, body=late), 409, Problem, "conflict")
    assert conflict.type_.endswith("/outcome-conflict"), conflict
    assert conflict.child and conflict.child.state == ChildState.PROCESSED, conflict
    late_batch = RecordOutcomes(outcomes=[BatchOutcome(parent_id=PARENT, sequence=1, outcome=Outcome.PROCESSED,
                                                       claim_id=first.claim_id)])
    answer = expect(record_outcomes.sync_detailed(client=worker, body=late_batch), 200, BatchResults, "batch conflict")
    assert [r.status for r in answer.results] == [OutcomeStatus.CONFLICT], answer
    settled = expect(get_child.sync_detailed(PARENT, 0, client=worker), 200, Child, "read conflicted child")
    assert settled.outcome == Outcome.PROCESSED and settled.conflict_count == 1, settled
    assert [c.outcome for c in settled.conflicts] == [Outcome.FAILED], settled.conflicts
    other = expect(get_child.sync_detailed(PARENT, 1, client=worker), 200, Child, "read conflicted child")
    assert other.outcome == Outcome.FAILED and other.conflict_count == 1, other
    conflicts = settled.conflict_count + other.conflict_count
    # Outcomes without a claim_id are for admins: the worker token gets 403.
    unfenced = RecordOutcome(outcome=Outcome.PROCESSED)
    expect(record_outcome.sync_detailed(PARENT, 3, client=worker, body=unfenced), 403, Problem, "unfenced outcome")

    # 5. A lease that runs out: the children come back with previous_attempt "expired".
    short = claim(worker, 10, 1, "short claim")
    assert [(c.sequence, c.attempt) for c in short.children] == [(3, 1), (4, 1)], short
    time.sleep(2.5)
    reclaimed = claim(worker, 10, 60, "reclaim")
    assert [(c.sequence, c.attempt) for c in reclaimed.children] == [(3, 2), (4, 2)], reclaimed
    assert all(c.previous_attempt == PreviousAttempt.EXPIRED for c in reclaimed.children), reclaimed
    extend = ExtendClaim(lease_seconds=60)
    lost = expect(extend_claim.sync_detailed(short.claim_id, client=worker, body=extend), 200, Extended, "extend lost")
    assert lost.extended == 0, lost
    kept = expect(extend_claim.sync_detailed(reclaimed.claim_id, client=worker, body=extend), 200, Extended, "extend")
    assert kept.extended == 2, kept

    # 6. Complete: every child terminal.
    done = RecordOutcomes(outcomes=[
        BatchOutcome(parent_id=PARENT, sequence=c.sequence, outcome=Outcome.PROCESSED,
                     result={"deduplicated": False}, claim_id=reclaimed.claim_id)
        for c in reclaimed.children])
    answer = expect(record_outcomes.sync_detailed(client=worker, body=done), 200, BatchResults, "final batch")
    assert [r.status for r in answer.results] == [OutcomeStatus.APPLIED] * 2, answer
    parent = expect(get_parent.sync_detailed(PARENT, client=worker), 200, Parent, "read parent")
    counts = parent.counts
    assert parent.state == ParentState.COMPLETE and parent.complete, parent
    assert parent.completed_at not in (None, UNSET), parent
    assert (counts.total, counts.processed, counts.failed, counts.skipped) == (5, 3, 1, 1), counts
    assert (counts.pending, counts.in_flight, counts.held) == (0, 0, 0), counts
    assert parent.verdict == Verdict.SUCCEEDED, parent  # no tolerance: a failure does not fail it

    # 7. What came back: the summary's reasons, and every child's result as NDJSON and CSV.
    summary = expect(parent_summary.sync_detailed(PARENT, client=worker), 200, Summary, "summary")
    assert (summary.counts.processed, summary.counts.failed, summary.counts.skipped) == (3, 1, 1), summary
    reasons = [(r.state, r.reason, r.count) for r in summary.reasons]
    assert reasons == [(ChildState.FAILED, "remote rejected the event", 1),
                       (ChildState.SKIPPED, SKIP_REASON, 1)], reasons
    text = expect(parent_results.sync_detailed(PARENT, client=worker), 200, str, "results")
    results = [json.loads(line) for line in text.splitlines()]
    assert [(r["sequence"], r["key"], r["state"]) for r in results] == [
        (0, "evt-0", "processed"), (1, "evt-1", "failed"), (2, "evt-2", "skipped"),
        (3, "evt-3", "processed"), (4, "evt-4", "processed")], results
    assert results[0]["result"] == {"remote_id": "r-0"} and results[0]["attempt"] == 1, results[0]
    assert results[1]["reason"] == "remote rejected the event", results[1]
    assert results[3]["attempt"] == 2 and results[3]["finished_at"], results[3]
    as_csv = worker.with_headers({"Accept": "text/csv"})
    text = expect(parent_results.sync_detailed(PARENT, client=as_csv, state=ChildState.PROCESSED), 200, str,
                  "results as CSV")
    records = list(csv.reader(io.StringIO(text)))
    assert records[0] == ["sequence", "key", "state", "attempt", "result", "reason", "finished_at"], records
    assert [(r[0], r[2], json.loads(r[4])) for r in records[1:]] == [
        ("0", "processed", {"remote_id": "r-0"}), ("3", "processed", {"deduplicated": False}),
        ("4", "processed", {"deduplicated": False})], records

    # 8. Reconcile as a dry run: nothing drifted. It is an admin's call.
    dry = ReconcileParent(dry_run=True)
    expect(reconcile_parent.sync_detailed(PARENT, client=worker, body=dry), 403, Problem, "reconcile as worker")
    report = expect(reconcile_parent.sync_detailed(PARENT, client=admin, body=dry), 200, ReconcileReport, "reconcile")
    assert report.dry_run and not report.applied and report.changes == [], report
    assert report.derived.complete and report.derived.total == 5, report.derived
    sweep = expect(reconcile_all.sync_detailed(client=admin, body=ReconcileAll(dry_run=True, queue=QUEUE)),
                   200, SweepReport, "reconcile sweep")
    assert (sweep.checked, sweep.drifted, sweep.repaired, sweep.parents) == (1, 0, 0, []), sweep

    print(json.dumps({
        "parent_id": PARENT,
        "state": parent.state.value,
        "total": counts.total,
        "processed": counts.processed,
        "failed": counts.failed,
        "skipped": counts.skipped,
        "conflicts": conflicts,
        "reclaimed_expired": len(reclaimed.children),
        "reconcile_checked": sweep.checked,
        "reconcile_drifted": sweep.drifted,
    }))


if __name__ == "__main__":
    try:
        main()
    except AssertionError as failure:
        print(f"seed story failed: {failure}", file=sys.stderr)
        raise
