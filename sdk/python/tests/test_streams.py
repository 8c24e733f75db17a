"""watch / wait across a restart, and the 1,000,000-child register and results streams."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from typing import Any, Dict, Iterator, List

import pytest

from child_ledger import AsyncLedger, Event, Ledger
from conftest import FIGURES, Service, wait_for

MILLION = 1_000_000

REGISTER = r"""
import json, sys, time
from child_ledger import Ledger
url, pid, queue, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
started = time.monotonic()
with Ledger(url, timeout=120) as ledger:
    parent = ledger.register(pid, queue, ({"payload": {"i": i}, "key": f"k{i}"} for i in range(n)))
took = time.monotonic() - started
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
print(json.dumps({"parent": parent, "seconds": took, "hwm_kib": int(status["VmHWM"].split()[0])}))
"""

RESULTS = r"""
import json, sys, time
from child_ledger import Ledger
def kib(field):
    status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    return int(status[field].split()[0])
url, pid = sys.argv[1], sys.argv[2]
with Ledger(url, timeout=120) as ledger:
    ledger.get_parent(pid)
    before = kib("VmRSS")
    started = time.monotonic()
    count, states, last = 0, set(), -1
    for row in ledger.results(pid):
        assert row["sequence"] == last + 1
        last = row["sequence"]
        count += 1
        states.add(row["state"])
print(json.dumps({"count": count, "states": sorted(states), "seconds": time.monotonic() - started,
                  "growth_kib": kib("VmHWM") - before}))
"""


def run_script(script: str, *args: str, timeout: float = 300) -> Dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_watch_queue_reports_each_completion(ledger: Ledger, service: Service, queue: str) -> None:
    # First in this file on purpose: see test_queue_stream_after_a_closed_parent_stream below.
    _watch_queue_check(ledger, service, queue, 15)


def _watch_queue_check(ledger: Ledger, service: Service, queue: str, timeout: float) -> None:
    ledger.register("P1-" + queue, queue, [{"payload": 1}])
    events: List[Event] = []
    watcher = Ledger(service.url)

    def follow() -> None:
        for event in watcher.watch_queue(queue):
            events.append(event)
            if sum(e.event == "completed" for e in events) == 2:
                return

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    wait_for(lambda: events, 10, what="the snapshot")
    assert events[0].event == "snapshot" and events[0].data["queue"] == queue
    ledger.cancel("P1-" + queue, "first")
    ledger.register("P2-" + queue, queue, [{"payload": 2}])
    ledger.cancel("P2-" + queue, "second")
    thread.join(timeout)
    assert not thread.is_alive(), [(e.event, e.id, e.data.get("parent_id")) for e in events]
    completed = [e.data["parent_id"] for e in events if e.event == "completed"]
    assert completed == ["P1-" + queue, "P2-" + queue]
    watcher.close()


@pytest.fixture(scope="module")
def million(service: Service) -> Iterator[Dict[str, Any]]:
    queue = f"million-{service.store}-{int(time.time())}"
    pid = "P-" + queue
    out = run_script(REGISTER, service.url, pid, queue, str(MILLION))
    out["pid"] = pid
    FIGURES.append(f"[{service.store}] register 1,000,000 children: {out['seconds']:.1f}s, "
                   f"client VmHWM {out['hwm_kib'] / 1024:.1f} MiB")
    yield out


def test_register_a_million_from_a_generator_in_bounded_memory(million: Dict[str, Any]) -> None:
    parent = million["parent"]
    assert parent["state"] != "decomposing" and parent["counts"]["total"] == MILLION
    assert million["hwm_kib"] < 100 * 1024, f"client RSS peaked at {million['hwm_kib'] / 1024:.1f} MiB"


def test_results_stream_a_million_rows_in_bounded_memory(million: Dict[str, Any], service: Service,
                                                         ledger: Ledger) -> None:
    cancelled = ledger.cancel(million["pid"], "results test")
    assert cancelled["parent"]["complete"] and cancelled["parent"]["verdict"] == "cancelled"
    out = run_script(RESULTS, service.url, million["pid"])
    FIGURES.append(f"[{service.store}] results 1,000,000 rows: {out['seconds']:.1f}s, "
                   f"client RSS growth {out['growth_kib'] / 1024:.1f} MiB")
    assert out["count"] == MILLION and out["states"] == ["skipped"]
    assert out["growth_kib"] < 100 * 1024


def test_watch_survives_a_restart_and_reports_completed_once(ledger: Ledger, service: Service, queue: str) -> None:
    pid = "P-" + queue
    ledger.register(pid, queue, [{"payload": i} for i in range(3)])
    events: List[Event] = []
    watcher = Ledger(service.url)

    def follow() -> None:
        for event in watcher.watch(pid):
            events.append(event)

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    wait_for(lambda: events, 10, what="the snapshot")
    assert events[0].event == "snapshot" and events[0].data["parent_id"] == pid
    service.restart()
    claim = ledger.claim(queue, limit=3, lease_seconds=30)
    service.restart()
    ledger.record_outcomes([{"parent_id": pid, "sequence": c["sequence"], "outcome": "processed",
                             "claim_id": claim["claim_id"]} for c in claim["children"]])
    thread.join(30)
    assert not thread.is_alive(), "watch did not end after completed"
    names = [e.event for e in events]
    assert names.count("completed") == 1 and names[-1] == "completed"
    assert names.count("snapshot") >= 2, "it did not reconnect"
    assert events[-1].data["verdict"] == "succeeded" and events[-1].id
    assert ledger.wait(pid, timeout=10)["complete"]  # already complete: at once
    watcher.close()


def test_async_wait_and_timeout(service: Service, queue: str) -> None:
    async def main() -> Any:
        async with AsyncLedger(service.url) as ledger:
            pid = "P-" + queue
            await ledger.register(pid, queue, [{"payload": 1}])
            with pytest.raises(TimeoutError):
                await ledger.wait(pid, timeout=0.5)

            async def later() -> None:
                await asyncio.sleep(0.3)
                await ledger.cancel(pid, "done")

            task = asyncio.ensure_future(later())
            parent = await ledger.wait(pid, timeout=10)
            await task
            first = [e async for e in ledger.watch(pid)]
            return parent, first

    parent, events = asyncio.run(main())
    assert parent["verdict"] == "cancelled" and parent["complete"]
    assert [e.event for e in events] == ["snapshot", "completed"]



def test_queue_stream_after_a_closed_parent_stream(ledger: Ledger, service: Service, queue: str) -> None:
    ledger.register("A-" + queue, queue, [{"payload": 1}])
    ledger.cancel("A-" + queue, "done")
    assert [e.event for e in ledger.watch("A-" + queue)] == ["snapshot", "completed"]  # closes after completed
    _watch_queue_check(ledger, service, queue + "-b", 4)
