#!/usr/bin/env python3
"""The SDK workers against the plain Node `fetch` worker, in one run.

    python3 benches/sdk/run.py [--store postgres|sqlite] [--children 200000] [--batches 100,500]

For each claim size, a fresh database gets the same two parents (half the
children each, as the cost bench registers them), and one worker process
drains them with an empty handler:

- `node-fetch`: benches/peers/ledger.mjs --one-request (8 loops in one
  process, each chunk's outcomes on its next claim): the baseline;
- `ts-sdk`: the TypeScript SDK's `child-ledger-worker` (sdk/typescript);
- `py-sdk` / `py-sdk-sync`: `python -m child_ledger worker`, an async and
  a plain `def` handler (sdk/python);
- `py-stdlib`: the raw-protocol Python worker (tests/workers/python).

Each SDK worker runs with `--batch B --concurrency 8*B`, so it keeps up to
8 claims out, as the baseline keeps 8 loops. Printed per row: children per
second, that rate over the baseline's, and CPU microseconds per child of the
worker process and of the service (utime + stime from /proc). Figures are
printed, never asserted: this is a bench, not a test.

Needs: target/release/child-ledger (`cargo build --release`), node 20+,
the Python SDK installed in the Python given by --python (default: the venv
sdk/python/scripts/ci builds, else python3), and for Postgres a server at
LEDGER_TEST_DATABASE_URL (default postgres://postgres@127.0.0.1:5432/postgres).
"""
import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """utime + stime of a process and its reaped children, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / TICKS


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(base, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read() or b"null")


class Service:
    def __init__(self, binary, store, admin_url):
        self.dir = tempfile.mkdtemp(prefix="child-ledger-sdk-bench-")
        self.admin_url, self.db = admin_url, None
        if store == "postgres":
            self.db = f"sdk_bench_{uuid.uuid4().hex[:10]}"
            self.psql(f"CREATE DATABASE {self.db}")
            url = admin_url.rsplit("/", 1)[0] + "/" + self.db
        else:
            url = f"sqlite://{self.dir}/ledger.db"
        self.url = url
        self.base = f"http://127.0.0.1:{free_port()}"
        self.proc = subprocess.Popen(
            [binary, "serve", "--listen", self.base[7:], "--database-url", url],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.dir, "service.log"), "w"))
        for _ in range(300):
            try:
                call(self.base, "GET", "/readyz")
                return
            except Exception:
                time.sleep(0.1)
        raise SystemExit(f"the service did not get ready: see {self.dir}/service.log")

    def psql(self, sql, url=None):
        subprocess.run(["psql", url or self.admin_url, "-qAtc", sql], check=True, stdout=subprocess.DEVNULL)

    def settle(self):
        if self.db:
            self.psql("VACUUM ANALYZE", self.url)
            self.psql("CHECKPOINT", self.url)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)
        if self.db:
            self.psql(f"DROP DATABASE IF EXISTS {self.db} WITH (FORCE)")
        shutil.rmtree(self.dir, ignore_errors=True)


def register(base, parent, n):
    page = 50_000
    call(base, "PUT", f"/v1/parents/{parent}", {"queue": "bench", "decomposed": False})
    for start in range(0, n, page):
        kids = [{"sequence": s, "payload": {"n": s}} for s in range(start, min(n, start + page))]
        call(base, "POST", f"/v1/parents/{parent}/children", {"children": kids})
    call(base, "POST", f"/v1/parents/{parent}/seal", {"total": n})


def command(name, base, batch, children, python):
    ts_cli = os.path.join(ROOT, "sdk/typescript/dist/cli.js")
    sdk = ["--url", base, "--queue", "bench", "--batch", str(batch), "--concurrency", str(8 * batch),
           "--exit-when-empty", "--wait-seconds", "0"]
    return {
        "node-fetch": ["node", "ledger.mjs", "--base", base, "--queue", "bench", "--batch", str(batch),
                       "--concurrency", "8", "--children", str(children), "--one-request"],
        "ts-sdk": ["node", ts_cli, os.path.join(ROOT, "benches/sdk/handler.mjs")] + sdk,
        "py-sdk": [python, "-m", "child_ledger", "worker", "handlers:empty"] + sdk,
        "py-sdk-sync": [python, "-m", "child_ledger", "worker", "handlers:empty_sync"] + sdk,
        "py-stdlib": [python, os.path.join(ROOT, "tests/workers/python/worker.py"), "--url", base,
                      "--queue", "bench", "--limit", str(batch), "--batch-size", str(batch),
                      "--exit-when-empty", "--wait-seconds", "0"],
    }[name]


def drain(name, args, batch, children, python):
    service = Service(args.binary, args.store, args.admin_url)
    try:
        half = children // 2
        register(service.base, "bench-a", half)
        register(service.base, "bench-b", children - half)
        service.settle()
        cwd = os.path.join(ROOT, "benches/peers") if name == "node-fetch" else os.path.join(ROOT, "benches/sdk")
        service_cpu = cpu_seconds(service.proc.pid)
        started = time.monotonic()
        # Its log to a file: a pipe nobody reads until it exits fills and stops it.
        log = open(os.path.join(service.dir, "worker.log"), "w+")
        worker = subprocess.Popen(command(name, service.base, batch, children, python), cwd=cwd,
                                  stdout=subprocess.DEVNULL, stderr=log)
        # Sample the worker's CPU just before it is reaped: /proc/PID/stat of a
        # zombie still holds its totals.
        worker_cpu = 0.0
        while worker.poll() is None:
            try:
                worker_cpu = cpu_seconds(worker.pid)
            except (FileNotFoundError, ProcessLookupError):
                pass
            time.sleep(0.05)
        seconds = time.monotonic() - started
        log.seek(0)
        err = log.read()
        if worker.returncode != 0:
            raise SystemExit(f"{name} exited {worker.returncode}:\n{err[-2000:]}")
        service_cpu = cpu_seconds(service.proc.pid) - service_cpu
        for parent in ("bench-a", "bench-b"):
            p = call(service.base, "GET", f"/v1/parents/{parent}")
            if not p["complete"] or p["counts"]["processed"] != p["counts"]["total"]:
                raise SystemExit(f"{name} left {parent} unfinished: {p['counts']}")
        return {"rate": children / seconds, "seconds": seconds,
                "worker_us": worker_cpu * 1e6 / children, "service_us": service_cpu * 1e6 / children}
    finally:
        service.stop()


def default_python():
    venv = os.path.join(ROOT, "target/sdk-python/venv/bin/python")
    return venv if os.path.exists(venv) else sys.executable


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--children", type=int, default=200_000)
    parser.add_argument("--batches", default="100,500")
    parser.add_argument("--workers", default="node-fetch,ts-sdk,py-sdk,py-sdk-sync,py-stdlib")
    parser.add_argument("--binary", default=os.path.join(ROOT, "target/release/child-ledger"))
    parser.add_argument("--python", default=default_python())
    parser.add_argument("--admin-url", default=os.environ.get(
        "LEDGER_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"))
    args = parser.parse_args()
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    print(f"# SDK workers, {args.children} children, {args.store}, {os.cpu_count()} cores, "
          f"{time.strftime('%Y-%m-%d')}, commit {commit}")
    print(f"{'batch':>5} {'worker':<12} {'children/s':>11} {'vs node':>8} {'worker us/child':>16} "
          f"{'service us/child':>17}")
    report = []
    for batch in [int(b) for b in args.batches.split(",")]:
        baseline = None
        for name in args.workers.split(","):
            r = drain(name, args, batch, args.children, args.python)
            baseline = baseline or (r["rate"] if name == "node-fetch" else None)
            ratio = r["rate"] / baseline if baseline else float("nan")
            print(f"{batch:>5} {name:<12} {r['rate']:>11.0f} {ratio:>8.2f} {r['worker_us']:>16.1f} "
                  f"{r['service_us']:>17.1f}", flush=True)
            report.append({"batch": batch, "worker": name, "vs_node": ratio, **r})
    print(json.dumps({"store": args.store, "children": args.children, "commit": commit, "rows": report}))


if __name__ == "__main__":
    main()
