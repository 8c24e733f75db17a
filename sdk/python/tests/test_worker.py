"""The Worker against the real service: outcomes, retries, stopping, crashes, errors."""
from __future__ import annotations

import collections
import signal
import threading
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from child_ledger import Child, Failed, Ledger, Skipped, Worker
from conftest import read_log, spawn_worker, wait_for


def finish(proc: Any, timeout: float) -> Any:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def test_ten_thousand_children_over_four_workers_exactly_once(ledger: Ledger, service: Any, queue: str,
                                                              tmp_path: Path) -> None:
    sizes = [1, 2, 5, 10, 50, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1000, 1032, 1100, 1200, 0]
    sizes[-1] = 10_000 - sum(sizes)
    assert sizes[-1] > 0
    for i, n in enumerate(sizes):
        ledger.register(f"{queue}-p{i}", queue, [{"payload": {"n": j}} for j in range(n)])
    logs = [tmp_path / f"w{i}.log" for i in range(4)]
    procs = [spawn_worker(service.url, queue, "handlers:record" if i % 2 else "handlers:arecord",
                          "--concurrency", "8", "--batch", str([8, 4, 16, 8][i]), "--exit-when-empty",
                          env={"HANDLER_LOG": str(logs[i])}) for i in range(4)]
    results = [finish(p, 120) for p in procs]
    for code, _, err in results:
        assert code == 0, err
    calls = collections.Counter((p, int(s)) for log in logs for _, p, s, *_ in read_log(log))
    assert len(calls) == 10_000 and set(calls.values()) == {1}, "a child was handled twice or never"
    assert sum(1 for log in logs if read_log(log)) >= 2, "the workers did not share the work"
    for i, n in enumerate(sizes):
        pid = f"{queue}-p{i}"
        parent = ledger.get_parent(pid)
        assert parent["complete"] and parent["counts"]["processed"] == n and parent["verdict"] == "succeeded"
        assert ledger.reconcile(pid, dry_run=True)["changes"] == []
        rows = list(ledger.results(pid))
        assert len(rows) == n and all(r["state"] == "processed" and r["attempt"] == 1 for r in rows)


def test_failed_skipped_and_released_until_max_attempts(ledger: Ledger, queue: str) -> None:
    calls: Dict[int, List[int]] = collections.defaultdict(list)

    def handler(child: Child[Any]) -> Any:
        calls[child.sequence].append(child.attempt)
        kind = child.payload["kind"]
        if kind == "fail":
            raise Failed("bad", result={"why": "bad input"})
        if kind == "skip":
            raise Skipped("not needed")
        if kind == "boom":
            raise RuntimeError("kaboom")
        if kind == "flaky" and child.attempt < 2:
            raise ValueError("flaky")
        return {"ok": child.sequence}

    pid = "P-" + queue
    kinds = ["ok", "fail", "skip", "boom", "flaky"]
    ledger.register(pid, queue, [{"payload": {"kind": k}} for k in kinds], max_attempts=3,
                    retry_backoff={"initial_seconds": 0.05, "max_seconds": 0.1})
    stats = Worker(ledger, queue, handler, concurrency=2, exit_when_empty=True, wait_seconds=1).run()
    by_seq = {i: ledger.get_child(pid, i) for i in range(len(kinds))}
    assert by_seq[0]["state"] == "processed" and by_seq[0]["result"] == {"ok": 0}
    assert by_seq[1]["state"] == "failed" and by_seq[1]["reason"] == "bad" and by_seq[1]["result"] == {"why": "bad input"}
    assert by_seq[2]["state"] == "skipped" and by_seq[2]["reason"] == "not needed"
    assert by_seq[3]["state"] == "failed" and by_seq[3]["attempts"] == 3 and "kaboom" in by_seq[3]["reason"]
    assert calls[3] == [1, 2, 3]
    assert by_seq[4]["state"] == "processed" and by_seq[4]["attempts"] == 2 and calls[4] == [1, 2]
    assert stats["processed"] == 2 and stats["failed"] == 2 and stats["skipped"] == 1 and stats["released"] == 3
    assert ledger.get_parent(pid)["complete"]


def test_async_handler_and_payload_model(ledger: Ledger, queue: str) -> None:
    pydantic = pytest.importorskip("pydantic")

    class Item(pydantic.BaseModel):
        n: int

    seen: List[Any] = []

    async def handler(child: Child[Any]) -> Any:
        seen.append(child.payload)
        return child.payload.n * 2

    pid = "P-" + queue
    ledger.register(pid, queue, [{"payload": {"n": 1}}, {"payload": {"n": "x"}}])
    Worker(ledger, queue, handler, payload_model=Item, exit_when_empty=True, wait_seconds=1).run()
    assert ledger.get_child(pid, 0)["result"] == 2 and isinstance(seen[0], Item)
    bad = ledger.get_child(pid, 1)
    assert bad["state"] == "failed" and "n" in bad["reason"] and len(seen) == 1


def test_stop_from_another_thread_releases_unstarted(ledger: Ledger, queue: str) -> None:
    started: List[int] = []

    def handler(child: Child[Any]) -> None:
        started.append(child.sequence)
        time.sleep(0.5)

    pid = "P-" + queue
    ledger.register(pid, queue, [{"payload": i} for i in range(10)])
    worker = Worker(ledger, queue, handler, concurrency=2, batch=10)
    runner = threading.Thread(target=worker.run)
    runner.start()
    wait_for(lambda: len(started) >= 2, 10, what="two handlers to start")
    worker.stop()
    runner.join(10)
    assert not runner.is_alive()
    assert worker.stats["processed"] == 2 and worker.stats["released"] == 8
    counts = ledger.get_parent(pid)["counts"]
    assert counts["processed"] == 2 and counts["pending"] == 8


def test_sigterm_mid_chunk_releases_unstarted_and_exits_zero(ledger: Ledger, service: Any, queue: str,
                                                             tmp_path: Path) -> None:
    pid, log, total = "P-" + queue, tmp_path / "slow.log", 12
    ledger.register(pid, queue, [{"payload": i} for i in range(total)])
    proc = spawn_worker(service.url, queue, "handlers:slow", "--concurrency", "2", "--batch", "10",
                        env={"HANDLER_LOG": str(log), "HANDLER_SLEEP": "2"})
    wait_for(lambda: len(read_log(log)) >= 2, 20, what="two handlers to start")
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    started = {int(s) for what, _, s, *_ in read_log(log) if what == "start"}
    assert len(started) == 2

    def released() -> bool:
        kids = [ledger.get_child(pid, i) for i in range(10) if i not in started]
        return all(k["state"] == "pending" and k.get("previous_attempt") == "released" for k in kids)

    wait_for(released, 1.0, interval=0.02, what="the unstarted children to be released")
    assert time.monotonic() - sent <= 1.5
    code, _, err = finish(proc, 30)
    assert code == 0, err
    for i in started:
        assert ledger.get_child(pid, i)["state"] == "processed"
    second = spawn_worker(service.url, queue, "handlers:record", "--exit-when-empty",
                          env={"HANDLER_LOG": str(log)})
    assert finish(second, 60)[0] == 0
    done = collections.Counter(int(s) for what, _, s, *_ in read_log(log) if what == "done")
    assert sorted(done) == list(range(total)) and set(done.values()) == {1}
    assert ledger.get_parent(pid)["counts"]["processed"] == total


def test_sigkill_mid_chunk_children_come_back_expired(ledger: Ledger, service: Any, queue: str,
                                                      tmp_path: Path) -> None:
    pid, log = "P-" + queue, tmp_path / "kill.log"
    ledger.register(pid, queue, [{"payload": i} for i in range(6)])
    proc = spawn_worker(service.url, queue, "handlers:slow", "--concurrency", "2", "--batch", "4",
                        "--lease-seconds", "2", env={"HANDLER_LOG": str(log), "HANDLER_SLEEP": "30"})
    wait_for(lambda: len(read_log(log)) >= 2, 20, what="two handlers to start")
    proc.kill()
    proc.wait(10)
    held = {int(s) for _, _, s, *_ in read_log(log)}
    log2 = tmp_path / "after.log"
    second = spawn_worker(service.url, queue, "handlers:record", "--exit-when-empty", "--wait-seconds", "5",
                          env={"HANDLER_LOG": str(log2)})
    assert finish(second, 60)[0] == 0
    rows = {int(s): prev for _, _, s, _, prev in read_log(log2)}
    assert set(rows) == set(range(6))
    for s in held:
        assert rows[s] == "expired"
    assert ledger.get_parent(pid)["counts"]["processed"] == 6


def test_leases_are_extended_while_a_handler_runs(ledger: Ledger, queue: str) -> None:
    def handler(child: Child[Any]) -> str:
        time.sleep(3.5)
        return "slow but done"

    pid = "P-" + queue
    ledger.register(pid, queue, [{"payload": 0}], max_attempts=1)
    stats = Worker(ledger, queue, handler, lease_seconds=1, exit_when_empty=True, wait_seconds=1).run()
    child = ledger.get_child(pid, 0)
    assert child["state"] == "processed" and child["attempts"] == 1 and child["result"] == "slow but done"
    assert stats["processed"] == 1 and stats["not_applied"] == 0
