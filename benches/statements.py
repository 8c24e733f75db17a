#!/usr/bin/env python3
"""Where a Postgres burn-down's statement time goes, statement by statement.

Registers 2 parents of N/2 children (the cost bench's ~100-byte payloads)
through a release service on a fresh database, runs `VACUUM ANALYZE` and a
`CHECKPOINT`, then drains them with the Node `fetch` worker
(benches/peers/ledger.mjs), then runs a closing `CHECKPOINT`: the cost
bench's window. It prints:
- for each phase (registration, settle, burn-down, checkpoint): CPU µs per
  child of the Postgres processes (all of the server's, from /proc) and of
  the service, and WAL bytes per child; children/s of the burn-down;
- over the burn-down only, per statement (pg_stat_statements): calls, execution time per child,
  buffers touched and dirtied per child, WAL bytes per child, full-page images.

Execution time includes lock waits; with LOOPS=1 it is close to CPU time. It
includes planning time where pg_stat_statements.track_planning is on. It does
not include starting and ending the executor, nor parse, bind and commit:
compare the statements' sum with the Postgres CPU line. DB_QUERY sets the
service's connection options (default sslmode=disable, as the cost bench).

    cargo build --release
    python3 benches/statements.py [N] [BATCH]          # 100000 500
    LOOPS=1 python3 benches/statements.py 60000 500     # no lock waits
    CHILD_LEDGER=/tmp/other-build python3 benches/statements.py
    LIMITS=1 python3 benches/statements.py 200000 100  # keyed, limits that never bind

PARENTS=40 spreads the children over 40 parents (default 2); KEYED=1 keys
parent p with flow key k(p % 20), as the admission bench does; LIMITS=1 keys
them and sets the limits of its `admission.unbound` (so high they never
bind) on the queue first.

Needs psql, node (npm ci in benches/peers) and a Postgres at ADMIN_ROOT
(trust auth) with pg_stat_statements in shared_preload_libraries:
    psql -c "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'"
and a restart. Without it, only the totals are printed.
"""
import glob, json, os, socket, subprocess, sys, time, urllib.request

ROOT = os.environ.get("ADMIN_ROOT", "postgres://postgres@127.0.0.1:5432")
BINARY = os.environ.get("CHILD_LEDGER", "target/release/child-ledger")
N = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
BATCH = sys.argv[2] if len(sys.argv) > 2 else "500"
LOOPS = os.environ.get("LOOPS", "8")
LIMITS = os.environ.get("LIMITS") == "1"
KEYED = LIMITS or os.environ.get("KEYED") == "1"
PARENTS = int(os.environ.get("PARENTS", "2"))
if N % PARENTS or N // PARENTS > 100_000:
    sys.exit(f"{N} children do not split into {PARENTS} parents of at most 100,000 each")
DB = f"statements_{os.getpid()}"
HERE = os.path.dirname(os.path.abspath(__file__))
TICK = os.sysconf("SC_CLK_TCK")


def psql(sql, db=DB):
    return subprocess.check_output(["psql", f"{ROOT}/{db}", "-qAtF", "\t", "-c", sql]).decode().strip()


def cpu_of(stat, children=False):
    parts = stat.rsplit(")", 1)[1].split()
    return sum(int(x) for x in parts[11:15 if children else 13]) / TICK


def service_cpu():
    return cpu_of(open(f"/proc/{service.pid}/stat").read())


def wal_lsn():
    return psql("SELECT pg_current_wal_lsn()")


def phase(name, run):
    """Runs one phase of the window and prints what it cost per child."""
    lsn, pg0, svc0 = wal_lsn(), postgres_cpu(), service_cpu()
    run()
    pg1, svc1 = postgres_cpu(), service_cpu()
    wal = int(psql(f"SELECT pg_current_wal_lsn() - '{lsn}'::pg_lsn"))
    print(f"{name:>12}: CPU µs per child: Postgres {(pg1 - pg0) / N * 1e6:.1f}, service {(svc1 - svc0) / N * 1e6:.1f}; "
          f"WAL {wal / N:.0f} B")


def postgres_cpu():
    """CPU seconds of every process named postgres (backends and helpers)."""
    total = 0.0
    for path in glob.glob("/proc/[0-9]*/stat"):
        try:
            stat = open(path).read()
        except OSError:
            continue
        if "(postgres)" in stat:
            total += cpu_of(stat, children=True)
    return total


psql(f"CREATE DATABASE {DB}", "postgres")
sock = socket.socket(); sock.bind(("127.0.0.1", 0)); port = sock.getsockname()[1]; sock.close()
base = f"http://127.0.0.1:{port}"
# Plain TCP, as the cost bench connects (its peers do not use TLS): with the
# default sslmode=prefer and a server with ssl = on, every round trip is
# encrypted (a fifth more Postgres CPU per child at claims of 100 here).
service = subprocess.Popen([BINARY, "--listen", f"127.0.0.1:{port}", "--database-url",
                            f"{ROOT}/{DB}?" + os.environ.get("DB_QUERY", "sslmode=disable")],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    for _ in range(300):
        try:
            urllib.request.urlopen(base + "/readyz"); break
        except Exception:
            time.sleep(0.1)
    body = "abcdefghijklmnopqrstuvwxyz" * 3
    bodies = [json.dumps({"queue": "cost", "decomposed": True, **({"flow_key": f"k{p % 20}"} if KEYED else {}),
                          "children": [{"payload": {"event": i, "source": "bench", "body": body}}
                                       for i in range(N // PARENTS)]}).encode() for p in range(PARENTS)]
    if LIMITS:
        high = {"max_in_flight": 1_000_000_000, "per_second": 1_000_000, "burst": 1_000_000_000}
        r = urllib.request.Request(f"{base}/v1/queues/cost/limits", method="PUT",
                                   headers={"content-type": "application/json"},
                                   data=json.dumps({**high, "per_key": high}).encode())
        urllib.request.urlopen(r, timeout=60).read()
    psql("CHECKPOINT")
    print(f"{N} children in {PARENTS} parents{', keyed' if KEYED else ''}, claims of {BATCH}, {LOOPS} loops"
          + (", limits that never bind" if LIMITS else ""))

    def register():
        for name, data in ((f"cost-{p}", data) for p, data in enumerate(bodies)):
            r = urllib.request.Request(f"{base}/v1/parents/{name}", method="PUT",
                                       headers={"content-type": "application/json"}, data=data)
            urllib.request.urlopen(r, timeout=600).read()
    phase("registration", register)
    phase("settle", lambda: (psql("VACUUM ANALYZE"), psql("CHECKPOINT")))
    try:  # fails unless the server preloads the library
        psql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); psql("SELECT pg_stat_statements_reset()")
        statements = True
    except subprocess.CalledProcessError:
        statements = False
    wal_io = "SELECT wal_write, wal_sync FROM pg_stat_wal"
    io0 = [int(x) for x in psql(wal_io).split()]
    t0 = time.time()
    phase("burn-down", lambda: subprocess.run(
        ["node", os.path.join(HERE, "peers", "ledger.mjs"), "--base", base, "--queue", "cost", "--batch", BATCH,
         "--concurrency", LOOPS, "--children", str(N)], check=True, stdout=subprocess.DEVNULL))
    io1 = [int(x) for x in psql(wal_io).split()]
    claims = N / int(BATCH)
    print(f"{'':>12}  {N / (time.time() - t0):,.0f} children/s; WAL writes {(io1[0] - io0[0]) / claims:.2f} "
          f"and syncs {(io1[1] - io0[1]) / claims:.2f} per claim")
    phase("checkpoint", lambda: psql("CHECKPOINT"))
    tables = psql("""SELECT relname, pg_relation_size(relid) / 8192, n_tup_upd, n_tup_hot_upd, n_dead_tup
                     FROM pg_stat_user_tables WHERE relname IN ('flow_limit', 'claim_lease', 'lane', 'parent')
                     ORDER BY relname""")
    for line in tables.splitlines():
        name, pages, upd, hot, dead = line.split("\t")
        print(f"{name:>12}: {pages} pages, {upd} updates ({hot} HOT), {dead} dead rows")
    if statements:
        rows = psql(f"""SELECT calls, total_exec_time + total_plan_time, plans, total_plan_time, shared_blks_hit + shared_blks_read, shared_blks_dirtied,
                         wal_bytes, wal_fpi, regexp_replace(left(query, 60), '\\s+', ' ', 'g')
                     FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
                     WHERE d.datname = '{DB}' ORDER BY total_exec_time DESC LIMIT 12""")
        print("| calls | plans | plan µs per child | exec (+ plan) µs per child | buffers per child | dirtied per child | WAL B per child | FPI | statement |")
        print("| --- " * 9 + "|")
        for line in rows.splitlines():
            calls, ms, plans, plan_ms, blocks, dirtied, wal_bytes, fpi, query = line.split("\t")
            print(f"| {calls} | {plans} | {float(plan_ms) * 1000 / N:.2f} | {float(ms) * 1000 / N:.1f} | {int(blocks) / N:.2f} | {int(dirtied) / N:.3f} "
                  f"| {int(wal_bytes) / N:.0f} | {fpi} | `{query.strip()}…` |")
    else:
        print("(pg_stat_statements is not loaded: no per-statement figures)")
finally:
    service.terminate(); service.wait()
    psql(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)", "postgres")
