"""Runs the real child-ledger binary, once per store (sqlite, postgres), for the whole session."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import httpx
import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parents[2]
BIN = os.environ.get("CHILD_LEDGER_BIN", str(REPO / "target" / "release" / "child-ledger"))
ADMIN_URL = os.environ.get("LEDGER_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
STORES = [s.strip() for s in os.environ.get("LEDGER_TEST_STORES", "sqlite,postgres").split(",") if s.strip()]
REQUIRE_PG = os.environ.get("LEDGER_REQUIRE_POSTGRES") == "1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _psql(url: str, sql: str) -> None:
    subprocess.run(["psql", url, "-v", "ON_ERROR_STOP=1", "-qAtc", sql], check=True, capture_output=True,
                   timeout=60)


def _pg_answers() -> bool:
    try:
        _psql(ADMIN_URL, "SELECT 1")
        return True
    except (subprocess.SubprocessError, OSError):
        return False


class Service:
    """One child-ledger process; ``restart()`` keeps its port and database."""

    def __init__(self, store: str, database_url: str, workdir: Path, extra: Optional[List[str]] = None) -> None:
        self.store, self.database_url, self.workdir = store, database_url, workdir
        self.extra = list(extra or [])
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: Optional[subprocess.Popen[bytes]] = None

    def start(self) -> None:
        if not Path(BIN).exists():
            pytest.fail(f"child-ledger binary not found at {BIN} (set CHILD_LEDGER_BIN)")
        log = open(self.workdir / f"service-{self.port}.log", "ab")
        self.proc = subprocess.Popen(
            [BIN, "serve", "--listen", f"127.0.0.1:{self.port}", "--database-url", self.database_url,
             "--reap-interval-ms", "200", *self.extra], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"child-ledger exited with {self.proc.returncode}; see {log.name}")
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        pytest.fail("child-ledger did not become ready within 60 s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture(scope="session", params=STORES)
def store(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def service(store: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    workdir = tmp_path_factory.mktemp(f"ledger-{store}")
    dropdb = None
    if store == "sqlite":
        url = f"sqlite://{workdir}/ledger.db"
    elif store == "postgres":
        if not _pg_answers():
            if REQUIRE_PG:
                pytest.fail(f"Postgres does not answer at {ADMIN_URL} (LEDGER_REQUIRE_POSTGRES=1)")
            pytest.skip(f"Postgres does not answer at {ADMIN_URL}")
        name = f"sdk_py_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        _psql(ADMIN_URL, f"CREATE DATABASE {name}")
        base = ADMIN_URL.rsplit("/", 1)[0]
        url, dropdb = f"{base}/{name}", name
    else:
        raise pytest.UsageError(f"unknown store {store!r} in LEDGER_TEST_STORES")
    svc = Service(store, url, workdir)
    svc.start()
    try:
        yield svc
    finally:
        svc.stop()
        if dropdb:
            try:
                _psql(ADMIN_URL, f"DROP DATABASE IF EXISTS {dropdb} WITH (FORCE)")
            except subprocess.SubprocessError:
                pass


@pytest.fixture
def queue() -> str:
    return f"q-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def ledger(service: Service) -> Iterator["object"]:
    from child_ledger import Ledger

    with Ledger(service.url) as client:
        yield client


def spawn_worker(url: str, queue: str, handler: str = "handlers:record", *args: str,
                 env: Optional[Dict[str, str]] = None, token: Optional[str] = None) -> "subprocess.Popen[str]":
    """``python -m child_ledger worker`` in a subprocess (cwd: the tests folder, where handlers.py is)."""
    full_env = dict(os.environ, **(env or {}))
    full_env.pop("LEDGER_TOKEN", None)
    cmd = [sys.executable, "-m", "child_ledger", "worker", handler, "--queue", queue, "--url", url, *args]
    if token is not None:
        cmd += ["--token", token]
    return subprocess.Popen(cmd, cwd=str(TESTS), env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def read_log(path: Path) -> List[List[str]]:
    if not path.exists():
        return []
    return [line.split() for line in path.read_text().splitlines() if line.strip()]


def wait_for(predicate, timeout: float, interval: float = 0.05, what: str = "condition"):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)




FIGURES: List[str] = []  # measured figures, printed at the end of the run


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if FIGURES:
        terminalreporter.write_sep("-", "measured")
        for line in FIGURES:
            terminalreporter.write_line(line)
