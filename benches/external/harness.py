#!/usr/bin/env python3
"""Runs hardbyte/postgresql-job-queue-benchmarking natively, without Docker.

    python benches/external/harness.py [--harness DIR] [--results-dir DIR] [--check] \
        -- <the harness's `bench run` arguments>

e.g. `-- --scenario chaos_crash_recovery --systems child-ledger,pgboss --replicas 2`.

The harness checkout (default: ../postgresql-job-queue-benchmarking beside
this repository, or $BENCH_HARNESS) is used unmodified: it is put on
sys.path, patched in memory here, and its CLI (`bench_harness.orchestrator:main`)
is called with the arguments after `--` (`run` is implied when they do not
start with a subcommand). What the patches change:

- Postgres is the server at $BENCH_PG_URL (default
  postgres://postgres@127.0.0.1:5432/postgres; or BENCH_PG_HOST / _PORT /
  _USER / _PASSWORD), not the compose service on :15555. Every database URL
  the harness builds points there.
- `docker compose up` / `down` become a readiness check and a no-op. As a
  fresh compose volume would, each system starts on a dropped and recreated
  database (child_ledger_bench, pgboss_bench).
- The `postgres-restart` phase (chaos_postgres_restart) stops and starts the
  local cluster: `pg_ctlcluster <ver> <name> stop -m fast` / `start`, or
  `pg_ctl -D <data_directory>` without pg_ctlcluster, or $BENCH_PG_STOP_CMD /
  $BENCH_PG_START_CMD (shell commands) when set.
- Two native adapters are registered: `child-ledger` (node main.mjs in
  benches/external/child-ledger-bench, which starts $CHILD_LEDGER_BIN,
  default target/release/child-ledger) and `pgboss` (the harness's
  pgboss-bench/main.js run by the local node from $PGBOSS_NATIVE_DIR,
  default /tmp/pgboss-native, where its package-lock is installed with
  `npm ci`). The harness's Docker-built adapters are refused up front.
- PRODUCER_PACING defaults to `adapter`: neither adapter reads the harness's
  ENQUEUE tokens on stdin, and once a pipe nobody reads is full the harness
  blocks closing it when it stops or kills a replica.
- Version capture and the manifest record the native launch (project git
  SHA, binary, node version) instead of image names.

`--check` prints what would be used (server, restart commands, node, the
binary, pg-boss loading) and exits without running anything; `--install`
installs pg-boss (and builds the binary if it is missing) first.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pwd
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parent.parent
CHILD_LEDGER_BENCH = HERE / "child-ledger-bench"
NATIVE_SYSTEMS = ["child-ledger", "pgboss"]
SUBCOMMANDS = {"run", "combine", "compare"}
DOCKER_ONLY: set[str] = set()  # filled by install()


def log(message: str) -> None:
    print(f"[native] {message}", file=sys.stderr, flush=True)


# ─── Postgres ────────────────────────────────────────────────────────────


def admin_url() -> str:
    url = os.environ.get("BENCH_PG_URL")
    if url:
        return url
    user = os.environ.get("BENCH_PG_USER", "postgres")
    password = os.environ.get("BENCH_PG_PASSWORD", "")
    host = os.environ.get("BENCH_PG_HOST", "127.0.0.1")
    port = os.environ.get("BENCH_PG_PORT", "5432")
    auth = quote(user, safe="") + (":" + quote(password, safe="") if password else "")
    return f"postgres://{auth}@{host}:{port}/postgres"


def db_url(dbname: str) -> str:
    """The admin URL with its database swapped for `dbname`."""
    parts = urlsplit(admin_url())
    return urlunsplit((parts.scheme, parts.netloc, "/" + dbname, parts.query, parts.fragment))


def _connect(url: str, timeout: float = 3.0):
    import psycopg

    return psycopg.connect(url, autocommit=True, connect_timeout=max(1, int(timeout)))


def wait_ready(seconds: float) -> None:
    """Until a `SELECT 1` on the admin database answers, at most `seconds`."""
    deadline = time.monotonic() + seconds
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with _connect(admin_url()) as conn:
                conn.execute("SELECT 1").fetchone()
            return
        except Exception as exc:  # psycopg.OperationalError, mostly
            last = exc
            time.sleep(0.5)
    raise RuntimeError(f"Postgres at {redacted(admin_url())} did not answer within {seconds:.0f}s: {last}")


def redacted(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(":" + parts.password + "@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


class LocalCluster:
    """The server behind admin_url(): what it is, and how to stop and start it."""

    def __init__(self) -> None:
        with _connect(admin_url()) as conn:
            row = conn.execute(
                "SELECT version(), current_setting('server_version_num')::int, "
                "current_setting('data_directory'), current_setting('config_file'), "
                "current_setting('port')::int"
            ).fetchone()
            self.has_pgstattuple = (
                conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pgstattuple'").fetchone()
                is not None
            )
        self.version, version_num, data_dir, config_file, self.port = row
        self.major = str(version_num // 10000)
        self.data_dir = Path(data_dir)
        self.config_file = Path(config_file)
        self.host = urlsplit(admin_url()).hostname or "localhost"

    def describe(self) -> str:
        return f"{self.version.split(',')[0]} at {self.host}:{self.port} ({self.data_dir})"

    def _cluster_name(self) -> str | None:
        """pg_lsclusters' name for this data directory (Debian's postgresql-common)."""
        if not shutil.which("pg_ctlcluster") or not shutil.which("pg_lsclusters"):
            return None
        out = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            fields = line.split()
            # Ver Cluster Port Status Owner Data-directory Log-file
            if len(fields) >= 6 and fields[0] == self.major and Path(fields[5]) == self.data_dir:
                return fields[1]
        return None

    def _as_owner(self, argv: list[str]) -> list[str]:
        """pg_ctl refuses root: run it as the data directory's owner."""
        if os.geteuid() != 0:
            return argv
        owner = pwd.getpwuid(self.data_dir.stat().st_uid).pw_name
        if shutil.which("runuser"):
            return ["runuser", "-u", owner, "--", *argv]
        return ["su", owner, "-s", "/bin/sh", "-c", shlex.join(argv)]

    def _pg_ctl(self) -> str:
        explicit = os.environ.get("BENCH_PG_CTL")
        if explicit:
            return explicit
        debian = Path(f"/usr/lib/postgresql/{self.major}/bin/pg_ctl")
        if debian.exists():
            return str(debian)
        if shutil.which("pg_config"):
            bindir = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True).stdout.strip()
            if bindir and (Path(bindir) / "pg_ctl").exists():
                return str(Path(bindir) / "pg_ctl")
        found = shutil.which("pg_ctl")
        if found:
            return found
        raise RuntimeError("no pg_ctlcluster and no pg_ctl found: set BENCH_PG_STOP_CMD and BENCH_PG_START_CMD")

    def commands(self) -> tuple[list[str], list[str]]:
        """(stop, start) argv lists."""
        stop_cmd = os.environ.get("BENCH_PG_STOP_CMD")
        start_cmd = os.environ.get("BENCH_PG_START_CMD")
        if stop_cmd or start_cmd:
            if not (stop_cmd and start_cmd):
                raise RuntimeError("set both BENCH_PG_STOP_CMD and BENCH_PG_START_CMD, or neither")
            return ["sh", "-c", stop_cmd], ["sh", "-c", start_cmd]
        if self.host not in ("127.0.0.1", "localhost", "::1") and not self.host.startswith("/"):
            raise RuntimeError(
                f"Postgres at {self.host} is not local: set BENCH_PG_STOP_CMD and BENCH_PG_START_CMD "
                "to stop and start it"
            )
        name = self._cluster_name()
        if name:
            return (
                ["pg_ctlcluster", self.major, name, "stop", "-m", "fast"],
                ["pg_ctlcluster", self.major, name, "start"],
            )
        pg_ctl = self._pg_ctl()
        start = [pg_ctl, "-D", str(self.data_dir), "start", "-w", "-t", "60",
                 "-l", str(self.data_dir / "bench-restart.log")]
        if self.config_file.parent != self.data_dir:
            start += ["-o", f"-c config_file={self.config_file}"]
        return (
            self._as_owner([pg_ctl, "-D", str(self.data_dir), "stop", "-m", "fast", "-w", "-t", "60"]),
            self._as_owner(start),
        )


def _run(argv: list[str], *, check: bool) -> None:
    log("$ " + shlex.join(argv))
    rc = subprocess.run(argv, check=False).returncode
    if rc != 0:
        message = f"{shlex.join(argv)} exited {rc}"
        if check:
            raise RuntimeError(message)
        log(message)


# ─── Adapters ────────────────────────────────────────────────────────────


def node_bin() -> str:
    found = os.environ.get("NODE_BIN") or shutil.which("node")
    if not found:
        raise RuntimeError("node is not on PATH (set NODE_BIN)")
    return found


def node_version() -> str:
    return subprocess.run([node_bin(), "--version"], capture_output=True, text=True).stdout.strip()


def child_ledger_bin() -> Path:
    return Path(os.environ.get("CHILD_LEDGER_BIN") or PROJECT / "target" / "release" / "child-ledger")


def pgboss_dir() -> Path:
    return Path(os.environ.get("PGBOSS_NATIVE_DIR") or "/tmp/pgboss-native")


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(PROJECT), *args], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def install(harness: Path) -> None:
    """Patches the imported harness modules. Call after sys.path holds `harness`."""
    from bench_harness import adapters, orchestrator, versions, writers

    cluster: dict[str, LocalCluster] = {}

    def local() -> LocalCluster:
        if "c" not in cluster:
            cluster["c"] = LocalCluster()
        return cluster["c"]

    # URLs: every database URL the harness builds comes from pg_url, which
    # orchestrator imported by value.
    parts = urlsplit(admin_url())

    def pg_url(dbname: str, host: str | None = None) -> str:
        return db_url(dbname)

    adapters.pg_url = pg_url
    orchestrator.pg_url = pg_url
    adapters.PG_PORT = parts.port or 5432
    adapters.PG_USER = parts.username or ""
    adapters.PG_PASS = parts.password or ""

    # Lifecycle: the server is already running; compose calls become checks.
    def start_postgres(pg_image: str) -> None:
        wait_ready(30)
        if not local().has_pgstattuple:
            raise RuntimeError(
                "the pgstattuple extension is not available on this server "
                f"(Debian: apt-get install postgresql-contrib-{local().major} or postgresql-contrib)"
            )
        log(f"using {local().describe()} (no docker compose)")

    def stop_postgres(pg_image: str) -> None:
        pass  # the local server is left running

    def stop_local(pg_image: str) -> None:
        stop, _ = local().commands()
        _run(stop, check=False)

    def start_local(pg_image: str) -> None:
        _, start = local().commands()
        _run(start, check=True)
        wait_ready(60)

    def restart_local(pg_image: str) -> None:
        stop_local(pg_image)
        start_local(pg_image)

    orchestrator.start_postgres = start_postgres
    orchestrator.stop_postgres = stop_postgres
    orchestrator._compose_stop_postgres = stop_local
    orchestrator._compose_start_postgres = start_local
    orchestrator._restart_postgres = restart_local

    # A fresh database per system, as a fresh compose volume gives.
    preflight = orchestrator.preflight_database

    def preflight_database(manifest, *, recreate: bool = False) -> None:
        preflight(manifest, recreate=True)

    orchestrator.preflight_database = preflight_database
    orchestrator.DEFAULT_PG_IMAGE = "native"
    orchestrator.DEFAULT_SYSTEMS = list(NATIVE_SYSTEMS)
    adapters.DEFAULT_SYSTEMS = list(NATIVE_SYSTEMS)

    # ── child-ledger ──
    def build_child_ledger(skip: bool) -> None:
        binary = child_ledger_bin()
        if binary.is_file() and os.access(binary, os.X_OK):
            return
        if skip or os.environ.get("CHILD_LEDGER_BIN"):
            raise RuntimeError(f"{binary} does not exist: build it with `cargo build --release`")
        log("building child-ledger (cargo build --release)")
        subprocess.run(["cargo", "build", "--release"], cwd=str(PROJECT), check=True)

    def launch_child_ledger(manifest, overrides):
        env = adapters._base_env(manifest, overrides)
        env["CHILD_LEDGER_BIN"] = str(child_ledger_bin())
        return adapters.LaunchSpec(argv=[node_bin(), "main.mjs"], env=env, cwd=str(CHILD_LEDGER_BENCH))

    adapters.ADAPTERS["child-ledger"] = adapters.AdapterEntry(
        bench_dir=CHILD_LEDGER_BENCH, builder=build_child_ledger, launcher=launch_child_ledger
    )

    # ── pg-boss, natively ──
    source = harness / "pgboss-bench"
    checked: dict[str, bool] = {}

    def build_pgboss(skip: bool) -> None:
        target = pgboss_dir()
        target.mkdir(parents=True, exist_ok=True)
        for name in ("main.js", "adapter.json", "package.json"):
            shutil.copyfile(source / name, target / name)
        lock = (source / "package-lock.json").read_bytes()
        stamp = target / ".installed-lock-sha256"
        digest = hashlib.sha256(lock).hexdigest()
        installed = stamp.exists() and stamp.read_text().strip() == digest
        if not installed or not (target / "node_modules" / "pg-boss").is_dir():
            if skip:
                raise RuntimeError(f"pg-boss is not installed in {target}; run without --skip-build")
            (target / "package-lock.json").write_bytes(lock)
            npm = os.environ.get("NPM_BIN") or shutil.which("npm") or "npm"
            _run([npm, "ci", "--omit=dev", "--no-audit", "--no-fund", "--prefix", str(target)], check=True)
            stamp.write_text(digest + "\n")
            checked.clear()
        if not checked.get("loads"):
            # pg-boss 12 is an ES module that main.js require()s: Node 20.19+ or 22.12+.
            probe = subprocess.run(
                [node_bin(), "-e", "require('pg-boss')"], cwd=str(target), capture_output=True, text=True
            )
            if probe.returncode != 0:
                raise RuntimeError(
                    f"pg-boss does not load under node {node_version()} "
                    f"(pgboss-bench/main.js require()s the ES module pg-boss, which needs "
                    f"Node >= 20.19 or >= 22.12): {probe.stderr.strip()[-500:]}"
                )
            checked["loads"] = True

    def launch_pgboss(manifest, overrides):
        env = adapters._base_env(manifest, overrides)
        return adapters.LaunchSpec(argv=[node_bin(), "main.js"], env=env, cwd=str(pgboss_dir()))

    adapters.ADAPTERS["pgboss"] = adapters.AdapterEntry(
        bench_dir=source, builder=build_pgboss, launcher=launch_pgboss
    )

    # The adapters the harness builds with `docker build` cannot run here.
    def refuse(system: str):
        def builder(skip: bool) -> None:
            raise RuntimeError(f"{system} runs in Docker in this harness; natively: {', '.join(NATIVE_SYSTEMS)}")

        return builder

    for system, entry in adapters.ADAPTERS.items():
        if entry.builder.__name__ != "build_awa" and system not in NATIVE_SYSTEMS:
            entry.builder = refuse(system)
            DOCKER_ONLY.add(system)

    # Forensics: what was run, as the harness records images and pins.
    def child_ledger_revision() -> dict:
        binary = child_ledger_bin()
        version = None
        try:
            version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=5).stdout.strip()
        except OSError:
            pass
        return {
            "source": "child-ledger repo",
            "git_sha": _git("rev-parse", "HEAD"),
            "git_short": _git("rev-parse", "--short", "HEAD"),
            "git_branch": _git("rev-parse", "--abbrev-ref", "HEAD"),
            "dirty": bool((_git("status", "--porcelain") or "").strip()),
            "binary": str(binary),
            "binary_version": version or None,
            "node": node_version(),
            "launch": "native",
        }

    pgboss_revision = versions._CAPTURE.get("pgboss")

    def pgboss_native_revision() -> dict:
        block = dict(pgboss_revision()) if pgboss_revision else {}
        block.update({"node": node_version(), "launch": f"native ({pgboss_dir()})"})
        return block

    versions._CAPTURE["child-ledger"] = child_ledger_revision
    versions._CAPTURE["pgboss"] = pgboss_native_revision

    host_env = writers.capture_host_env

    def capture_host_env() -> dict:
        block = host_env()
        block["launch"] = "native: benches/external/harness.py (no Docker)"
        block["postgres_server"] = local().describe()
        return block

    writers.capture_host_env = capture_host_env


# ─── Entry ───────────────────────────────────────────────────────────────


def _selected_systems(forwarded: list[str]) -> list[str] | None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--systems")
    known, _ = parser.parse_known_args(forwarded)
    if known.systems is None:
        return None
    return [s.strip() for s in known.systems.split(",") if s.strip()]


def check(harness: Path) -> int:
    ok = True
    try:
        cluster = LocalCluster()
        print(f"postgres:      {cluster.describe()} via {redacted(admin_url())}")
        print(f"pgstattuple:   {'available' if cluster.has_pgstattuple else 'MISSING (postgresql-contrib)'}")
        if cluster.has_pgstattuple:
            import psycopg

            with psycopg.connect(admin_url()) as conn:  # one transaction, rolled back
                conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
                conn.rollback()
            print("               CREATE EXTENSION pgstattuple works (rolled back)")
        ok &= cluster.has_pgstattuple
        try:
            stop, start = cluster.commands()
            print(f"restart stop:  {shlex.join(stop)}")
            print(f"restart start: {shlex.join(start)}")
        except RuntimeError as exc:
            print(f"restart:       unavailable: {exc}")
    except Exception as exc:
        print(f"postgres:      {redacted(admin_url())} unreachable: {exc}")
        ok = False
    try:
        print(f"node:          {node_bin()} {node_version()}")
    except RuntimeError as exc:
        print(f"node:          {exc}")
        ok = False
    binary = child_ledger_bin()
    print(f"child-ledger:  {binary} {'(present)' if binary.is_file() else '(MISSING: cargo build --release)'}")
    ok &= binary.is_file()
    target = pgboss_dir()
    if (target / "node_modules" / "pg-boss").is_dir() and shutil.which(os.environ.get("NODE_BIN") or "node"):
        loads = subprocess.run([node_bin(), "-e", "require('pg-boss')"], cwd=str(target), capture_output=True, text=True)
        state = "loads" if loads.returncode == 0 else f"does NOT load: {loads.stderr.strip()[-300:]}"
        ok &= loads.returncode == 0
    else:
        state = "not installed yet (the first run installs it with npm ci)"
    print(f"pg-boss:       {target}: {state}")
    print(f"harness:       {harness}")
    print(f"pacing:        PRODUCER_PACING={os.environ.get('PRODUCER_PACING', 'adapter')}")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, forwarded = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(
        prog="harness.py",
        description="Run hardbyte/postgresql-job-queue-benchmarking natively (no Docker). "
        "Arguments after `--` go to the harness's `bench run`.",
    )
    parser.add_argument(
        "--harness",
        type=Path,
        default=Path(os.environ.get("BENCH_HARNESS") or PROJECT.parent / "postgresql-job-queue-benchmarking"),
        help="the harness checkout (default: $BENCH_HARNESS, else ../postgresql-job-queue-benchmarking)",
    )
    parser.add_argument("--results-dir", type=Path, help="where run directories go (default: <harness>/results)")
    parser.add_argument("--check", action="store_true", help="print what would be used and exit")
    parser.add_argument(
        "--install",
        action="store_true",
        help="install pg-boss into $PGBOSS_NATIVE_DIR (npm ci), build child-ledger if its binary is missing, and exit",
    )
    args = parser.parse_args(own)

    harness = args.harness.resolve()
    if not (harness / "bench_harness" / "orchestrator.py").is_file():
        parser.error(f"{harness} is not a checkout of postgresql-job-queue-benchmarking")
    if sys.version_info < (3, 12):
        parser.error(f"the harness needs Python >= 3.12 (this is {sys.version.split()[0]})")
    sys.path.insert(0, str(harness))

    os.environ.setdefault("PRODUCER_PACING", "adapter")
    if os.environ["PRODUCER_PACING"] == "harness":
        log("PRODUCER_PACING=harness: neither native adapter reads ENQUEUE tokens; runs longer than "
            "a few minutes can hang when a replica is stopped (full stdin pipe)")

    if args.check:
        return check(harness)
    if args.install:
        install(harness)
        from bench_harness import adapters

        for system in NATIVE_SYSTEMS:
            adapters.ADAPTERS[system].builder(False)
        return check(harness)

    if not forwarded or forwarded[0] not in SUBCOMMANDS:
        forwarded = ["run", *forwarded]
    install(harness)
    if forwarded[0] == "run":
        selected = _selected_systems(forwarded[1:]) or NATIVE_SYSTEMS
        docker_only = [s for s in selected if s in DOCKER_ONLY]
        if docker_only:
            parser.error(f"{', '.join(docker_only)}: Docker-only in this harness; natively: {', '.join(NATIVE_SYSTEMS)}")
    if args.results_dir:
        from bench_harness import orchestrator

        orchestrator.RESULTS_ROOT = args.results_dir.resolve()
    from bench_harness.orchestrator import main as bench_main

    return bench_main(forwarded)


if __name__ == "__main__":
    raise SystemExit(main())
