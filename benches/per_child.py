#!/usr/bin/env python3
"""Per-child storage, WAL and transactions on one Postgres, for docs/scale-out.md.

Registers 2 parents x 100,000 children (about 100-byte payloads and keys)
through the release service, drains them with 8 HTTP workers (claims of 100,
batches of 100 outcomes with a small result, or none with RESULTS=0), and
prints per-child figures:
WAL bytes (pg_wal_lsn_diff), transactions (pg_stat_database.xact_commit),
/v1 requests, and the `child` table's size with its indexes.

    cargo build --release && python3 benches/per_child.py

Needs psql and a Postgres at ADMIN (trust auth); uses a scratch database.
"""
import os
import json, socket, subprocess, threading, time, urllib.request
ROOT = os.environ.get("ADMIN_ROOT", "postgres://postgres@127.0.0.1:5432")
BINARY = os.environ.get("CHILD_LEDGER", "target/release/child-ledger")
DB = "scaleout_measure"
N_PARENTS, PER = 2, 100_000
def psql(sql, db=DB):
    return subprocess.check_output(["psql", f"{ROOT}/{db}", "-qAt", "-c", sql]).decode().strip()
psql(f"DROP DATABASE IF EXISTS {DB}", "postgres"); psql(f"CREATE DATABASE {DB}", "postgres")
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
base = f"http://127.0.0.1:{port}"
svc = subprocess.Popen([BINARY, "--listen", f"127.0.0.1:{port}", "--database-url",
                        f"{ROOT}/{DB}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
for _ in range(100):
    try:
        urllib.request.urlopen(base + "/readyz"); break
    except Exception: time.sleep(0.1)
def req(method, path, body):
    r = urllib.request.Request(base + path, data=json.dumps(body).encode(), method=method, headers={"content-type": "application/json"})
    with urllib.request.urlopen(r) as resp: return json.loads(resp.read())
def stats():
    lsn = psql("SELECT pg_current_wal_lsn()")
    xact = int(psql(f"SELECT xact_commit FROM pg_stat_database WHERE datname = '{DB}'"))
    return lsn, xact
def wal(a, b): return int(psql(f"SELECT pg_wal_lsn_diff('{b}', '{a}')"))
def size(): return int(psql("SELECT pg_total_relation_size('child')")), int(psql("SELECT pg_relation_size('child')"))
N = N_PARENTS * PER
# RESULTS=0: outcomes without a result, which Postgres records without
# rewriting the child's row (migration 0023).
WITH_RESULT = os.environ.get("RESULTS", "1") != "0"
psql("CHECKPOINT")
l0, x0 = stats()
for p in range(N_PARENTS):
    children = [{"key": f"evt-{p}-{i}", "payload": {"event_id": f"evt-{p}-{i}", "ts": "2026-11-30T10:00:00Z", "body": "x" * 60}} for i in range(PER)]
    req("PUT", f"/v1/parents/m-{p}", {"queue": "m", "children": children})
time.sleep(1)
l1, x1 = stats()
total_pending, heap_pending = size()
done = [0]; lock = threading.Lock()
def worker():
    while True:
        c = req("POST", "/v1/queues/m/claims", {"limit": 100, "lease_seconds": 600})
        kids = c["children"]
        if not kids: return
        req("POST", "/v1/outcomes", {"outcomes": [dict({"parent_id": k["parent_id"], "sequence": k["sequence"], "outcome": "processed", "claim_id": c["claim_id"]}, **({"result": {"remote_id": "r-" + str(k["sequence"])}} if WITH_RESULT else {})) for k in kids]})
        with lock: done[0] += len(kids)
t0 = time.time()
ts = [threading.Thread(target=worker) for _ in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
elapsed = time.time() - t0
time.sleep(1)
l2, x2 = stats()
total_done, heap_done = size()
psql("VACUUM child")
total_vac, heap_vac = size()
metrics = urllib.request.urlopen(base + "/metrics").read().decode()
reqs = sum(float(l.split()[-1]) for l in metrics.splitlines() if l.startswith("child_ledger_http_requests_total{") and 'route="/v1/' in l)
w01, w02, w12 = wal(l0, l1), wal(l0, l2), wal(l1, l2)
svc.terminate(); svc.wait()
psql(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)", "postgres")
out = {
  "children": N, "drained": done[0], "drain_seconds": round(elapsed, 1),
  "register_wal_bytes_per_child": round(w01 / N, 1),
  "lifecycle_wal_bytes_per_child": round(w02 / N, 1),
  "claim_and_outcome_wal_bytes_per_child": round(w12 / N, 1),
  "register_transactions": x1 - x0, "drain_transactions": x2 - x1,
  "transactions_per_child": round((x2 - x0) / N, 4),
  "v1_requests": reqs, "requests_per_child": round(reqs / N, 4),
  "bytes_per_child_pending": round(total_pending / N, 1), "heap_bytes_per_child_pending": round(heap_pending / N, 1),
  "bytes_per_child_terminal_unvacuumed": round(total_done / N, 1),
  "bytes_per_child_terminal_vacuumed": round(total_vac / N, 1), "heap_bytes_per_child_terminal_vacuumed": round(heap_vac / N, 1),
}
print(json.dumps(out, indent=1))
