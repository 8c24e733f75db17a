"""What stops a worker (401, 422) and what it rides out (503, 429), through the real service."""
from __future__ import annotations

import hashlib
import http.client
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator, List
from urllib.parse import urlsplit

import pytest

from child_ledger import Child, Ledger, Worker
from conftest import Service, spawn_worker


class FaultProxy:
    """Answers the first claims with the given statuses (Retry-After: 0), then forwards everything."""

    def __init__(self, upstream: str, faults: List[int]) -> None:
        self.faults, self.injected = list(faults), []  # type: ignore[var-annotated]
        self.lock = threading.Lock()
        host, port = urlsplit(upstream).hostname, urlsplit(upstream).port
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _any(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                fault = None
                if self.command == "POST" and self.path.endswith("/claims"):
                    with proxy.lock:
                        if proxy.faults:
                            fault = proxy.faults.pop(0)
                            proxy.injected.append(fault)
                if fault is not None:
                    out = json.dumps({"type": "/problems/injected", "title": "Injected", "status": fault,
                                      "detail": "fault injected by the test proxy"}).encode()
                    self.send_response(fault)
                    self.send_header("Content-Type", "application/problem+json")
                    self.send_header("Retry-After", "0")
                    self.send_header("Content-Length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                    return
                conn = http.client.HTTPConnection(host, port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request(self.command, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length", "date"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def secured(service: Service, tmp_path: Path) -> Iterator[Service]:
    """A second service on the same database, with access control on."""
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [{"name": "w", "sha256": hashlib.sha256(b"right-token").hexdigest(),
                                              "roles": ["worker"], "queues": ["*"]}]}))
    svc = Service(service.store, service.database_url, tmp_path, ["--tokens-file", str(tokens)])
    svc.start()
    yield svc
    svc.stop()


def test_unknown_token_stops_the_worker_with_exit_2(secured: Service, queue: str) -> None:
    started = time.monotonic()
    proc = spawn_worker(secured.url, queue, "handlers:record", token="wrong-token")
    _, err = proc.communicate(timeout=10)
    assert time.monotonic() - started < 5
    assert proc.returncode == 2
    assert "Unauthorized" in err and "401" in err and "--token" in err


def test_out_of_range_flag_stops_the_worker_with_exit_2(service: Service, queue: str) -> None:
    started = time.monotonic()
    proc = spawn_worker(service.url, queue, "handlers:record", "--lease-seconds", "0")
    _, err = proc.communicate(timeout=10)
    assert time.monotonic() - started < 5
    assert proc.returncode == 2
    assert "422" in err and "lease_seconds" in err


def test_worker_raises_problem_in_process(service: Service) -> None:
    from child_ledger import BadRequest

    worker = Worker(service.url, "Bad Queue!", lambda child: None)
    with pytest.raises(BadRequest) as info:
        worker.run()
    assert info.value.status in (400, 422)


@pytest.mark.parametrize("faults", [[503, 503, 503], [429, 429, 503, 429]])
def test_503_and_429_are_retried(ledger: Ledger, service: Service, queue: str, faults: List[int]) -> None:
    pid = "P-" + queue
    ledger.register(pid, queue, [{"payload": i} for i in range(50)])
    proxy = FaultProxy(service.url, faults)
    seen: List[int] = []
    try:
        stats = Worker(Ledger(proxy.url), queue, lambda c: seen.append(c.sequence), concurrency=4, batch=10,
                       exit_when_empty=True, wait_seconds=1).run()
    finally:
        proxy.close()
    assert proxy.injected == faults
    assert sorted(seen) == list(range(50)) and stats["processed"] == 50
    assert ledger.get_parent(pid)["complete"]


def test_outcomes_flush_while_a_long_poll_is_out(ledger: Ledger, queue: str) -> None:
    """A slow tail: its outcomes may not wait for the next claim's answer."""
    pid = "P-" + queue
    ledger.register(pid, queue, [{"payload": i} for i in range(3)])

    def handler(child: Child[Any]) -> None:
        time.sleep(0.3 * child.sequence)

    worker = Worker(ledger, queue, handler, concurrency=3, batch=3, wait_seconds=20)
    runner = threading.Thread(target=worker.run)
    runner.start()
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not ledger.get_parent(pid)["complete"]:
            time.sleep(0.05)
        assert ledger.get_parent(pid)["complete"], "outcomes waited for the long poll"
    finally:
        worker.stop()
        runner.join(30)
