"""The client: problems, retries, register (one request, pages, idempotent)."""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any, List, Tuple

import httpx
import pytest

from child_ledger import (AsyncLedger, BadRequest, Conflict, Ledger, NotFound, ProblemError, ServiceUnavailable,
                          UnavailableError)
from child_ledger._paging import MAX_PAGE_CHILDREN


class Recording(httpx.HTTPTransport):
    """Forwards to the service and notes (method, path, status, body)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: List[Tuple[str, str, int, Any]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        body = json.loads(request.content) if request.content else None
        self.seen.append((request.method, request.url.path, response.status_code, body))
        return response


def test_problem_error_carries_type_title_detail_field(ledger: Ledger) -> None:
    with pytest.raises(BadRequest) as info:
        ledger.register("p-bad-queue", "Not A Queue", [{"payload": 1}])
    err = info.value
    assert err.status == 422 and isinstance(err, ProblemError)
    assert err.type.endswith("invalid-field") and err.title and err.field == "queue"
    assert err.detail and "queue" in err.detail
    assert err.problem["field"] == "queue"
    assert "queue" in str(err) and err.title in str(err) and "422" in str(err)
    with pytest.raises(NotFound) as missing:
        ledger.get_parent("no-such-parent")
    assert missing.value.status == 404


def test_register_once_is_idempotent_and_conflicts_on_change(service: Any, queue: str) -> None:
    rec = Recording()
    with Ledger(service.url, transport=rec) as ledger:
        children = [{"payload": {"i": i}, "key": f"k{i}"} for i in range(100)]
        first = ledger.register("P-" + queue, queue, children, max_attempts=3)
        again = ledger.register("P-" + queue, queue, iter(children), max_attempts=3)
        assert [(m, s) for m, _, s, _ in rec.seen] == [("PUT", 201), ("PUT", 200)]
        assert rec.seen[0][3]["decomposed"] is True and len(rec.seen[0][3]["children"]) == 100
        assert first["counts"]["total"] == again["counts"]["total"] == 100
        assert again["max_attempts"] == 3 and again["state"] == "active"
        with pytest.raises(Conflict):
            ledger.register("P-" + queue, queue, children[:99], max_attempts=3)


def test_register_pages_past_one_request_and_is_idempotent(service: Any, queue: str) -> None:
    n = MAX_PAGE_CHILDREN * 2 + 5
    rec = Recording()
    with Ledger(service.url, transport=rec) as ledger:
        parent = ledger.register("P-" + queue, queue, ({"payload": i} for i in range(n)), priority=5)
        calls = [(m, p.rsplit("/", 1)[-1], s) for m, p, s, _ in rec.seen]
        assert calls == [("PUT", "P-" + queue, 201), ("POST", "children", 200), ("POST", "children", 200),
                         ("POST", "children", 200), ("POST", "seal", 200)]
        put, pages = rec.seen[0][3], [b for m, p, _, b in rec.seen if p.endswith("/children")]
        assert put["decomposed"] is False and "children" not in put and put["priority"] == 5
        assert [len(p["children"]) for p in pages] == [MAX_PAGE_CHILDREN, MAX_PAGE_CHILDREN, 5]
        assert pages[1]["children"][0] == {"sequence": MAX_PAGE_CHILDREN, "payload": MAX_PAGE_CHILDREN}
        assert rec.seen[-1][3] == {"total": n}
        assert parent["state"] == "active" and parent["counts"]["total"] == n
        rec.seen.clear()
        again = ledger.register("P-" + queue, queue, ({"payload": i} for i in range(n)), priority=5)
        assert [(m, s) for m, _, s, _ in rec.seen] == [("PUT", 200)]  # sealed before: no page sent again
        assert again["counts"]["total"] == n
        child = ledger.get_child("P-" + queue, n - 1)
        assert child["payload"] == n - 1


def test_async_register_from_async_generator(service: Any, queue: str) -> None:
    async def main() -> Any:
        async def gen() -> Any:
            for i in range(MAX_PAGE_CHILDREN + 1):
                yield {"payload": i}

        async with AsyncLedger(service.url) as ledger:
            parent = await ledger.register("P-" + queue, queue, gen())
            return parent, await ledger.summary("P-" + queue)

    parent, summary = asyncio.run(main())
    assert parent["counts"]["total"] == MAX_PAGE_CHILDREN + 1 and parent["state"] == "active"
    assert summary["counts"]["pending"] == MAX_PAGE_CHILDREN + 1


def test_retry_honours_retry_after_then_succeeds() -> None:
    answers = [(503, {"Retry-After": "1"}), (429, {"Retry-After": "0"}), (200, {})]
    times: List[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        times.append(time.monotonic())
        status, headers = answers[len(times) - 1]
        if status != 200:
            return httpx.Response(status, headers=headers,
                                  json={"type": "/problems/unavailable", "title": "Unavailable", "status": status,
                                        "detail": "try later"})
        return httpx.Response(200, json={"parent_id": "p", "queue": "q"})

    with Ledger("http://ledger.invalid", retries=3, transport=httpx.MockTransport(handler)) as ledger:
        assert ledger.get_parent("p")["parent_id"] == "p"
    assert len(times) == 3
    assert times[1] - times[0] >= 0.95  # Retry-After: 1
    assert times[2] - times[1] < 0.5  # Retry-After: 0


def test_retries_run_out_and_other_errors_surface_at_once() -> None:
    calls: List[int] = []

    def unavailable(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(503, headers={"Retry-After": "0"}, json={"title": "Unavailable", "status": 503,
                                                                       "type": "/problems/unavailable", "detail": "db"})

    with Ledger("http://x.invalid", retries=2, transport=httpx.MockTransport(unavailable)) as ledger:
        with pytest.raises(ServiceUnavailable):
            ledger.get_parent("p")
    assert len(calls) == 3
    calls.clear()

    def conflict(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(409, json={"title": "Conflict", "status": 409, "type": "/problems/x", "detail": "d"})

    with Ledger("http://x.invalid", retries=5, transport=httpx.MockTransport(conflict)) as ledger:
        with pytest.raises(Conflict):
            ledger.seal("p", 1)
    assert len(calls) == 1

    def refused(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        raise httpx.ConnectError("refused", request=request)

    calls.clear()
    with Ledger("http://x.invalid", retries=1, transport=httpx.MockTransport(refused)) as ledger:
        with pytest.raises(UnavailableError):
            ledger.get_parent("p")
    assert len(calls) == 2


def test_url_and_token_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEDGER_URL", "http://example.invalid:9/")
    monkeypatch.setenv("LEDGER_TOKEN", "secret-token")
    seen: List[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"parent_id": "p"})

    with Ledger(transport=httpx.MockTransport(handler)) as ledger:
        ledger.get_parent("a/b")
    assert str(seen[0].url) == "http://example.invalid:9/v1/parents/a%2Fb"
    assert seen[0].headers["authorization"] == "Bearer secret-token"
