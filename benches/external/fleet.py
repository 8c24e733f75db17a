#!/usr/bin/env python3
"""Worker scaling with the adapter's shape, without the harness.

For each worker count, a fresh Postgres database (never analyzed), one
replica of `child-ledger-bench/main.mjs` in depth-target mode (the queue
topped up to --depth in parents of 128), pg-boss's chunk rule, 1 ms of work a
child. After one sample period of warm-up it reads the adapter's samples for
--seconds and prints, per worker count: completions/s, claim p50/p99, the
CPU each process spent per completed child (utime + stime from /proc: the
service, every Postgres backend, the Node adapter), and the ratio to the best
of 8, 32 and 64 workers. With --baseline, a second binary runs the same
counts in the same run, and each row gets its ratio to the baseline's.

    python3 benches/external/fleet.py                       # 8 32 64 128 256
    python3 benches/external/fleet.py --workers 32 128 --baseline /path/to/old/child-ledger

Needs Node 20+, psql, and a Postgres superuser at --admin-url.
"""
from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TICK = os.sysconf("SC_CLK_TCK")


def psql(admin: str, sql: str, db: str | None = None) -> str:
    url = admin if db is None else admin.rsplit("/", 1)[0] + "/" + db
    out = subprocess.run(["psql", url, "-Atqc", sql], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"psql: {out.stderr.strip()}")
    return out.stdout


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def postgres_ticks() -> int:
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() in ("postgres", "postmaster"):
                total += cpu_ticks(int(pid))
        except (FileNotFoundError, ProcessLookupError, IndexError):
            pass
    return total


def service_pid(adapter: int) -> int:
    """The service the adapter started (its child, or its child's child under setpriv)."""
    for _ in range(100):
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except (FileNotFoundError, ProcessLookupError):
                continue
            parent = int(stat[1])
            if cmd and cmd[0].endswith(b"/child-ledger") and (parent == adapter or _parent(parent) == adapter):
                return int(pid)
        time.sleep(0.1)
    sys.exit("the adapter's service did not start")


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return -1


def run(args: argparse.Namespace, binary: str, workers: int) -> dict:
    db = "fleet_bench"
    psql(args.admin_url, f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    psql(args.admin_url, f"CREATE DATABASE {db}")
    env = dict(
        os.environ,
        DATABASE_URL=args.admin_url.rsplit("/", 1)[0] + "/" + db,
        WORKER_COUNT=str(workers),
        PRODUCER_MODE="depth-target",
        PRODUCER_RATE=str(args.rate),
        TARGET_DEPTH=str(args.depth),
        SAMPLE_EVERY_S="5",
        CHILD_LEDGER_BIN=binary,
        CHILD_LEDGER_PORT=str(args.port),
    )
    adapter = subprocess.Popen(
        ["node", str(HERE / "child-ledger-bench" / "main.mjs")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        return measure(args, adapter)
    finally:
        if adapter.poll() is None:
            adapter.send_signal(signal.SIGTERM)
            try:
                adapter.wait(15)
            except subprocess.TimeoutExpired:
                adapter.kill()


def measure(args: argparse.Namespace, adapter: subprocess.Popen) -> dict:
    service = service_pid(adapter.pid)
    selector = selectors.DefaultSelector()
    selector.register(adapter.stdout, selectors.EVENT_READ)
    samples: list[dict] = []
    start = None
    deadline = time.time() + args.seconds + 30
    while time.time() < deadline:
        if not selector.select(timeout=1):
            continue
        line = adapter.stdout.readline()
        if not line:
            break
        record = json.loads(line)
        if record.get("kind") != "adapter":
            continue
        if start is None:
            if record["metric"] == "completed_total":
                # The first sample period was warm-up: measure from here.
                start = (time.time(), record["value"], cpu_ticks(service), postgres_ticks(), cpu_ticks(adapter.pid))
                deadline = time.time() + args.seconds
            continue
        samples.append(record)
    end = (time.time(), None, cpu_ticks(service), postgres_ticks(), cpu_ticks(adapter.pid))
    last = lambda metric: [s["value"] for s in samples if s["metric"] == metric][-1]  # noqa: E731
    done = last("completed_total") - start[1]
    seconds = end[0] - start[0]
    per_child = lambda i: round((end[i] - start[i]) / TICK * 1e6 / max(done, 1), 1)  # noqa: E731
    return {
        "per_second": done / seconds,
        "claim_p50": last("claim_p50_ms"),
        "claim_p99": last("claim_p99_ms"),
        "service_us": per_child(2),
        "postgres_us": per_child(3),
        "adapter_us": per_child(4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, nargs="+", default=[8, 32, 64, 128, 256])
    parser.add_argument("--seconds", type=int, default=30, help="measured seconds per worker count")
    parser.add_argument("--rate", type=int, default=800, help="PRODUCER_RATE: only sizes the chunks (pg-boss's rule)")
    parser.add_argument("--depth", type=int, default=4000, help="pending children the producer keeps")
    parser.add_argument("--binary", default=str(ROOT / "target" / "release" / "child-ledger"))
    parser.add_argument("--baseline", help="another child-ledger binary, run at the same counts")
    parser.add_argument("--admin-url", default="postgres://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--port", type=int, default=18390)
    args = parser.parse_args()

    binaries = [("this", args.binary)] + ([("baseline", args.baseline)] if args.baseline else [])
    results: dict[str, list[dict]] = {name: [] for name, _ in binaries}
    for workers in args.workers:
        for name, binary in binaries:
            result = {"workers": workers, **run(args, binary, workers)}
            results[name].append(result)
            print(f"{name} {workers} workers: {result['per_second']:.0f}/s", file=sys.stderr)

    print("| binary | workers | completions/s | claim p50 / p99 ms | service µs/child | Postgres µs/child "
          "| adapter µs/child | vs best of 8-64 | vs baseline |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, rows in results.items():
        small = [r["per_second"] for r in rows if r["workers"] <= 64] or [max(r["per_second"] for r in rows)]
        best = max(small)
        for i, r in enumerate(rows):
            versus = ""
            if name == "this" and args.baseline:
                versus = f"{r['per_second'] / results['baseline'][i]['per_second']:.2f}"
            print(
                f"| {name} | {r['workers']} | {r['per_second']:,.0f} | {r['claim_p50']:g} / {r['claim_p99']:g} "
                f"| {r['service_us']} | {r['postgres_us']} | {r['adapter_us']} | {r['per_second'] / best:.2f} | {versus} |"
            )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
