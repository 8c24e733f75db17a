"""Request building shared by Ledger and AsyncLedger: every operation is an `_Op`."""
from __future__ import annotations

import json
import os
import random
import re
from typing import Any, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence
from urllib.parse import quote

import httpx

from .errors import LedgerError, ProblemError, problem_error

DEFAULT_URL = "http://127.0.0.1:8080"
RETRY_STATUSES = frozenset({429, 502, 503, 504})
_TOKEN_RE = re.compile(r"[\x21-\x7e]+")
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def dumps(value: Any) -> bytes:
    """Compact JSON, as sent on the wire."""
    return _dumps(value).encode()


def seg(value: Any) -> str:
    """One URL path segment."""
    return quote(str(value), safe="")


class _Op(NamedTuple):
    method: str
    path: str
    body: Optional[bytes] = None
    params: Optional[Dict[str, Any]] = None
    headers: Optional[Dict[str, str]] = None
    timeout: Optional[float] = None


def _op(method: str, path: str, body: Any = None, params: Optional[Dict[str, Any]] = None,
        headers: Optional[Dict[str, str]] = None, timeout: Optional[float] = None) -> _Op:
    if params:
        params = {k: _param(v) for k, v in params.items() if v is not None}
    return _Op(method, path, None if body is None else dumps(body), params or None, headers, timeout)


def _param(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def _clean(values: Mapping[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def backoff(attempt: int, retry_after: Optional[str] = None, base: float = 0.25, cap: float = 10.0) -> float:
    """Seconds before retry number ``attempt`` (0-based): ``Retry-After`` when the
    answer gave one (in seconds), else exponential with jitter."""
    if retry_after is not None:
        try:
            return min(max(0.0, float(retry_after)), 60.0)
        except ValueError:  # an HTTP date: use our own backoff
            pass
    ceiling = min(cap, base * (2 ** min(attempt, 16)))
    return ceiling / 2 + random.random() * ceiling / 2


def decode(response: httpx.Response) -> Any:
    """The JSON of a 2xx answer; raises the ProblemError of any other."""
    if response.status_code >= 400:
        raise to_problem(response)
    if response.status_code == 204 or not response.content:
        return None
    try:
        return json.loads(response.content)
    except ValueError:
        raise LedgerError(f"{response.request.method} {response.request.url}: the answer is not JSON "
                          f"(is the URL the ledger?): {response.text[:200]!r}") from None


def to_problem(response: httpx.Response) -> ProblemError:
    try:
        body = json.loads(response.content) if response.content else {}
    except ValueError:
        body = {"detail": response.text[:500]}
    if not isinstance(body, dict):
        body = {"detail": str(body)[:500]}
    body.setdefault("status", response.status_code)
    return problem_error(response.status_code, body, response)


class _Settings:
    """What Ledger and AsyncLedger share: URL, token, timeout, retries, and the operations."""

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None, *, timeout: float = 30.0,
                 retries: int = 4, headers: Optional[Mapping[str, str]] = None) -> None:
        self.url = (url or os.environ.get("LEDGER_URL") or DEFAULT_URL).rstrip("/")
        token = token if token is not None else os.environ.get("LEDGER_TOKEN")
        if token and not _TOKEN_RE.fullmatch(token):
            raise LedgerError("the token (token= or LEDGER_TOKEN) holds characters an HTTP header cannot carry "
                              "(only visible ASCII): give the token `child-ledger token new` printed")
        self.token = token or None
        self.timeout = timeout
        self.retries = retries
        self.headers: Dict[str, str] = {"Accept": "application/json", "Content-Type": "application/json",
                                        "User-Agent": "child-ledger-python"}
        if self.token:
            self.headers["Authorization"] = f"Bearer {self.token}"
        if headers:
            self.headers.update(headers)

    def _client_kwargs(self) -> Dict[str, Any]:
        return dict(base_url=self.url, headers=self.headers, timeout=httpx.Timeout(self.timeout),
                    limits=httpx.Limits(max_connections=100, max_keepalive_connections=20), http2=False)

    # ---- producer ----
    def _put_parent(self, parent_id: str, body: bytes, traceparent: Optional[str]) -> _Op:
        headers = {"traceparent": traceparent} if traceparent else None
        return _Op("PUT", f"/v1/parents/{seg(parent_id)}", body, None, headers, None)

    def _append(self, parent_id: str, body: bytes) -> _Op:
        return _Op("POST", f"/v1/parents/{seg(parent_id)}/children", body)

    def _seal(self, parent_id: str, total: int) -> _Op:
        return _op("POST", f"/v1/parents/{seg(parent_id)}/seal", {"total": total})

    def _get_parent(self, parent_id: str, include_payload: bool = False) -> _Op:
        return _op("GET", f"/v1/parents/{seg(parent_id)}", params={"include": "payload" if include_payload else None})

    def _list_parents(self, query: Mapping[str, Any]) -> _Op:
        return _op("GET", "/v1/parents", params=dict(query))

    def _summary(self, parent_id: str) -> _Op:
        return _op("GET", f"/v1/parents/{seg(parent_id)}/summary")

    def _cancel(self, parent_id: str, reason: str) -> _Op:
        return _op("POST", f"/v1/parents/{seg(parent_id)}/cancel", {"reason": reason})

    def _retry(self, parent_id: str, sequence: Optional[int], states: Optional[Sequence[str]]) -> _Op:
        if sequence is not None:
            return _op("POST", f"/v1/parents/{seg(parent_id)}/children/{int(sequence)}/retry", {})
        return _op("POST", f"/v1/parents/{seg(parent_id)}/retry", {"states": list(states or ["held"])})

    def _redrive(self, parent_id: str, body: Dict[str, Any]) -> _Op:
        return _op("POST", f"/v1/parents/{seg(parent_id)}/redrive", _clean(body))

    def _reconcile(self, parent_id: str, dry_run: bool) -> _Op:
        return _op("POST", f"/v1/parents/{seg(parent_id)}/reconcile", {"dry_run": dry_run})

    def _get_child(self, parent_id: str, sequence: int) -> _Op:
        return _op("GET", f"/v1/parents/{seg(parent_id)}/children/{int(sequence)}")

    def _list_children(self, parent_id: str, query: Mapping[str, Any]) -> _Op:
        return _op("GET", f"/v1/parents/{seg(parent_id)}/children", params=dict(query))

    # ---- queues ----
    def _queue_op(self, method: str, queue: str, tail: str = "", body: Any = None) -> _Op:
        return _op(method, f"/v1/queues/{seg(queue)}{tail}", body)

    def _limits_path(self, queue: str, key: Optional[str]) -> str:
        return f"/v1/queues/{seg(queue)}" + (f"/keys/{seg(key)}/limits" if key is not None else "/limits")

    # ---- worker ----
    def _claim(self, queue: str, body: Dict[str, Any], timeout: Optional[float] = None) -> _Op:
        wait = body.get("wait_seconds") or 0
        return _Op("POST", f"/v1/queues/{seg(queue)}/claims", dumps(_clean(body)), None, None,
                   timeout if timeout is not None else self.timeout + wait)

    def _extend(self, claim_id: str, lease_seconds: Optional[int]) -> _Op:
        return _op("POST", f"/v1/claims/{seg(claim_id)}/extend", _clean({"lease_seconds": lease_seconds}))

    def _release(self, claim_id: str, children: Optional[Iterable[Mapping[str, Any]]],
                 delay_seconds: Optional[int]) -> _Op:
        refs: Optional[List[Dict[str, Any]]] = None
        if children is not None:
            refs = [{"parent_id": c["parent_id"], "sequence": c["sequence"]} for c in children]
        return _op("POST", f"/v1/claims/{seg(claim_id)}/release",
                   _clean({"children": refs, "delay_seconds": delay_seconds}))

    def _record_outcomes(self, outcomes: Sequence[Mapping[str, Any]], traceparent: Optional[str]) -> _Op:
        headers = {"traceparent": traceparent} if traceparent else None
        return _Op("POST", "/v1/outcomes", dumps({"outcomes": list(outcomes)}), None, headers)

    def _record_outcome(self, parent_id: str, sequence: int, body: Dict[str, Any]) -> _Op:
        return _op("POST", f"/v1/parents/{seg(parent_id)}/children/{int(sequence)}/outcome", body)


def registration(queue: Optional[str], settings: Mapping[str, Any]) -> Dict[str, Any]:
    """The PUT body without children (``traceparent`` is a header, not a member)."""
    body = {k: v for k, v in settings.items() if v is not None and k != "traceparent"}
    if queue is not None:
        body["queue"] = queue
    return body
