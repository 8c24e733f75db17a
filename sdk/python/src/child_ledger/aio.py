"""The asynchronous client, ``AsyncLedger`` (the twin of ``Ledger``)."""
from __future__ import annotations

import json
import logging
import asyncio
import time
from urllib.parse import urlencode
from typing import Any, AsyncIterable, AsyncIterator, Dict, Iterable, List, Mapping, Optional, Sequence, Union, cast

import httpx

from . import _schema as s
from ._base import RETRY_STATUSES, _Op, _op, _Settings, backoff, decode, registration, seg, to_problem
from ._paging import Chunker, append_body, put_body
from .errors import LedgerError, ProblemError, UnavailableError
from .events import Event, SSEParser
from ._fastio import RawPool

__all__ = ["AsyncLedger"]
log = logging.getLogger("child_ledger")


class _Decoded:
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class _RetryStatus(Exception):
    def __init__(self, status: int, retry_after: Optional[str]) -> None:
        super().__init__(f"HTTP {status}")
        self.retry_after = retry_after


class AsyncLedger(_Settings):
    """A child-ledger client (asyncio, over one ``httpx.AsyncClient`` with keep-alive).

    ``url`` defaults to ``$LEDGER_URL``, then ``http://127.0.0.1:8080``; ``token``
    to ``$LEDGER_TOKEN``. Refused or lost connections, timeouts, 429, 502, 503
    and 504 are retried ``retries`` times with exponential backoff and jitter,
    honouring ``Retry-After``; any other error answer raises a ProblemError at once.
    """

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None, *, timeout: float = 30.0,
                 retries: int = 4, headers: Optional[Mapping[str, str]] = None,
                 transport: Optional[httpx.AsyncBaseTransport] = None) -> None:
        super().__init__(url, token, timeout=timeout, retries=retries, headers=headers)
        kwargs = self._client_kwargs()
        if transport is not None:
            kwargs["transport"] = transport
        self._http = httpx.AsyncClient(**kwargs)
        # JSON calls skip httpx (its cost per request is ~10x this pool's) unless a transport is given.
        self._raw = RawPool(self.url, self.headers) if transport is None and RawPool.usable(self.url) else None

    async def _raw_request(self, op: _Op) -> Any:
        """The answer of a JSON call: its JSON when it is a 2xx, else an httpx.Response to judge."""
        target = op.path + ("?" + urlencode(op.params) if op.params else "")
        assert self._raw is not None
        status, headers, content = await self._raw.request(
            op.method, target, op.body, op.headers, op.timeout if op.timeout is not None else self.timeout)
        if status < 300 and headers.get("content-type", "").startswith("application/json"):
            return _Decoded(json.loads(content) if content else None)
        return httpx.Response(status, headers=headers, content=content,
                              request=httpx.Request(op.method, self.url + target))

    async def __aenter__(self) -> "AsyncLedger":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._raw is not None:
            self._raw.close()
        await self._http.aclose()

    close = aclose

    # ---- the one request path ----
    async def _call(self, op: _Op, retries: Optional[int] = None) -> Any:
        tries = self.retries if retries is None else retries
        attempt = 0
        while True:
            retry_after = None
            try:
                if self._raw is not None:
                    response = await self._raw_request(op)
                else:
                    response = await self._http.request(
                        op.method, op.path, content=op.body, params=op.params, headers=op.headers,
                        timeout=op.timeout if op.timeout is not None else httpx.USE_CLIENT_DEFAULT)
            except httpx.TransportError as err:
                why: Union[str, ProblemError] = f"{type(err).__name__}: {err}"
            else:
                if type(response) is _Decoded:
                    return response.value
                if response.status_code not in RETRY_STATUSES:
                    return decode(response)
                why = to_problem(response)
                retry_after = response.headers.get("retry-after")
            if attempt >= tries:
                if isinstance(why, ProblemError):
                    raise why
                raise UnavailableError(f"{op.method} {self.url}{op.path}: gave up after {attempt + 1} tries ({why})")
            delay = backoff(attempt, retry_after)
            log.warning("%s %s: %s; retrying in %.2fs", op.method, op.path, why, delay)
            await asyncio.sleep(delay)
            attempt += 1

    # ---- producer ----
    async def register(self, parent_id: str, queue: Optional[str], children: Union[Iterable[Mapping[str, Any]], AsyncIterable[Mapping[str, Any]]] = (),
                 **settings: Any) -> s.Parent:
        """Registers a parent with its children (a list, any iterable or generator, or an async iterable).

        One request when they fit one page (10,000 children, ~4 MiB); past that,
        the parent is registered undecomposed, the children appended page by page
        and the parent sealed. Safe to repeat. Returns the Parent.
        """
        traceparent = settings.get("traceparent")
        body = registration(queue, settings)
        chunker = Chunker()
        it = _aiter(children)
        first: Optional[List[bytes]] = None
        async for spec in it:
            first = chunker.add(spec)
            if first is not None:
                break
        if first is None:
            return cast(s.Parent, await self._call(self._put_parent(parent_id, put_body(body, chunker.items), traceparent)))
        parent = cast(s.Parent, await self._call(self._put_parent(parent_id, put_body(body, None), traceparent)))
        if parent.get("state") != "decomposing":
            return parent  # registered and sealed before: nothing to send again
        total = 0
        page: Optional[List[bytes]] = first
        while page is not None:
            await self._call(self._append(parent_id, append_body(total, page)))
            total += len(page)
            page = None
            async for spec in it:
                page = chunker.add(spec)
                if page is not None:
                    break
        if chunker.items:
            await self._call(self._append(parent_id, append_body(total, chunker.items)))
            total += len(chunker.items)
        log.info("registered %s: %d children in pages", parent_id, total)
        return await self.seal(parent_id, total)

    async def append(self, parent_id: str, children: Sequence[s.AppendChild]) -> s.Appended:
        """Appends children (each with its explicit ``sequence``) to a decomposing parent."""
        return cast(s.Appended, await self._call(_op("POST", f"/v1/parents/{seg(parent_id)}/children",
                                                {"children": list(children)})))

    async def seal(self, parent_id: str, total: int) -> s.Parent:
        return cast(s.Parent, await self._call(self._seal(parent_id, total)))

    async def get_parent(self, parent_id: str, *, include_payload: bool = False) -> s.Parent:
        return cast(s.Parent, await self._call(self._get_parent(parent_id, include_payload)))

    async def list_parents(self, **query: Any) -> s.ParentList:
        """``queue``, ``state``, ``resumable``, ``has``, ``order``, ``limit``, ``cursor``, ..."""
        return cast(s.ParentList, await self._call(self._list_parents(query)))

    async def summary(self, parent_id: str) -> s.Summary:
        return cast(s.Summary, await self._call(self._summary(parent_id)))

    async def cancel(self, parent_id: str, reason: str) -> s.Cancelled:
        return cast(s.Cancelled, await self._call(self._cancel(parent_id, reason)))

    async def retry(self, parent_id: str, sequence: Optional[int] = None,
              states: Optional[Sequence[str]] = None) -> Union[s.Child, s.Retried]:
        """One held child back to pending (``sequence``), or every child in ``states`` (default held)."""
        return cast(Union[s.Child, s.Retried], await self._call(self._retry(parent_id, sequence, states)))

    async def redrive(self, parent_id: str, into: str, *, states: Optional[Sequence[str]] = None,
                reasons: Optional[Sequence[str]] = None, dry_run: bool = False, queue: Optional[str] = None,
                priority: Optional[int] = None) -> s.Redriven:
        body = {"into": into, "states": states, "reasons": reasons, "dry_run": dry_run, "queue": queue,
                "priority": priority}
        return cast(s.Redriven, await self._call(self._redrive(parent_id, body)))

    async def reconcile(self, parent_id: str, dry_run: bool = True) -> s.ReconcileReport:
        return cast(s.ReconcileReport, await self._call(self._reconcile(parent_id, dry_run)))

    async def get_child(self, parent_id: str, sequence: int) -> s.Child:
        return cast(s.Child, await self._call(self._get_child(parent_id, sequence)))

    async def list_children(self, parent_id: str, **query: Any) -> s.ChildList:
        """``state``, ``after``, ``limit``."""
        return cast(s.ChildList, await self._call(self._list_children(parent_id, query)))

    # ---- queues ----
    async def get_queue(self, queue: str) -> s.Queue:
        return cast(s.Queue, await self._call(self._queue_op("GET", queue)))

    async def pause(self, queue: str) -> s.QueuePause:
        return cast(s.QueuePause, await self._call(self._queue_op("POST", queue, "/pause", {})))

    async def resume(self, queue: str) -> s.QueuePause:
        return cast(s.QueuePause, await self._call(self._queue_op("POST", queue, "/resume", {})))

    async def limits(self, queue: str, key: Optional[str] = None) -> Union[s.QueueLimits, s.KeyLimits]:
        return cast(Any, await self._call(_op("GET", self._limits_path(queue, key))))

    async def set_limits(self, queue: str, key: Optional[str] = None, **limits: Any) -> Union[s.QueueLimits, s.KeyLimits]:
        """``max_in_flight``, ``per_second``, ``burst`` (and ``per_key`` for a queue)."""
        return cast(Any, await self._call(_op("PUT", self._limits_path(queue, key), limits)))

    # ---- worker, low level ----
    async def claim(self, queue: str, *, limit: Optional[int] = None, lease_seconds: Optional[int] = None,
              wait_seconds: Optional[int] = None, worker: Optional[str] = None,
              outcomes: Optional[Sequence[s.BatchOutcome]] = None) -> s.Claim:
        body = {"limit": limit, "lease_seconds": lease_seconds, "wait_seconds": wait_seconds, "worker": worker,
                "outcomes": list(outcomes) if outcomes else None}
        return cast(s.Claim, await self._call(self._claim(queue, body)))

    async def extend(self, claim_id: str, lease_seconds: Optional[int] = None) -> s.Extended:
        return cast(s.Extended, await self._call(self._extend(claim_id, lease_seconds)))

    async def release(self, claim_id: str, children: Optional[Iterable[Mapping[str, Any]]] = None,
                delay_seconds: Optional[int] = None) -> s.Released:
        return cast(s.Released, await self._call(self._release(claim_id, children, delay_seconds)))

    async def record_outcomes(self, outcomes: Sequence[s.BatchOutcome], *, traceparent: Optional[str] = None) -> s.BatchResults:
        return cast(s.BatchResults, await self._call(self._record_outcomes(outcomes, traceparent)))

    async def record_outcome(self, parent_id: str, sequence: int, outcome: str, *, reason: Optional[str] = None,
                       result: Any = None, claim_id: Optional[str] = None) -> s.OutcomeRecorded:
        body: Dict[str, Any] = {"outcome": outcome, "reason": reason, "result": result, "claim_id": claim_id}
        body = {k: v for k, v in body.items() if v is not None}
        return cast(s.OutcomeRecorded, await self._call(self._record_outcome(parent_id, sequence, body)))

    # ---- streams ----
    def watch(self, parent_id: str) -> AsyncIterator[Event]:
        """The parent's events; resumes with ``Last-Event-ID`` after a dropped
        connection or a restart, and ends after its ``completed`` event (once)."""
        return self._events(f"/v1/parents/{seg(parent_id)}/events", True, None)

    def watch_queue(self, queue: str) -> AsyncIterator[Event]:
        """The queue's events (``completed`` for each of its parents); never ends on its own."""
        return self._events(f"/v1/queues/{seg(queue)}/events", False, None)

    async def wait(self, parent_id: str, timeout: Optional[float] = None) -> s.Parent:
        """Blocks until the parent completes; returns it (with its ``verdict``).
        Raises TimeoutError after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        async for event in self._events(f"/v1/parents/{seg(parent_id)}/events", True, deadline):
            if event.event == "completed":
                return cast(s.Parent, event.data)
        raise LedgerError(f"the event stream of {parent_id} ended without its completion")

    async def _events(self, path: str, until_completed: bool, deadline: Optional[float]) -> AsyncIterator[Event]:
        last_id: Optional[str] = None
        attempt = 0
        while True:
            headers = {"Accept": "text/event-stream"}
            if last_id:
                headers["Last-Event-ID"] = last_id
            read = 60.0 if deadline is None else max(0.01, min(60.0, deadline - time.monotonic()))
            retry_after = None
            try:
                async with self._http.stream("GET", path, headers=headers,
                                       timeout=httpx.Timeout(self.timeout, read=read)) as response:
                    if response.status_code >= 400:
                        await response.aread()
                        if response.status_code not in RETRY_STATUSES:
                            raise to_problem(response)
                        raise _RetryStatus(response.status_code, response.headers.get("retry-after"))
                    attempt = 0
                    parser = SSEParser()
                    async for line in response.aiter_lines():
                        event = parser.line(line)
                        if event is None:
                            continue
                        last_id = parser.last_id or last_id
                        yield event
                        if until_completed and event.event == "completed":
                            return
                why: Any = "the stream ended"
            except _RetryStatus as err:
                why, retry_after = err, err.retry_after
            except httpx.TransportError as err:
                why = f"{type(err).__name__}: {err}"
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"{path}: no completion within the timeout")
            delay = backoff(attempt, retry_after, cap=5.0)
            if deadline is not None:
                delay = min(delay, max(0.0, deadline - time.monotonic()))
            log.info("%s: %s; reconnecting in %.2fs", path, why, delay)
            await asyncio.sleep(delay)
            attempt += 1

    async def results(self, parent_id: str, state: Optional[str] = None) -> AsyncIterator[s.ChildResult]:
        """Each child's outcome in sequence order, streamed (NDJSON) with bounded memory."""
        params = {"state": state} if state else None
        path = f"/v1/parents/{seg(parent_id)}/results"
        attempt = 0
        while True:
            async with self._http.stream("GET", path, params=params, headers={"Accept": "application/x-ndjson"},
                                   timeout=httpx.Timeout(self.timeout, read=max(self.timeout, 60.0))) as response:
                if response.status_code >= 400:
                    await response.aread()
                    if response.status_code not in RETRY_STATUSES or attempt >= self.retries:
                        raise to_problem(response)
                    retry_after = response.headers.get("retry-after")
                else:
                    loads = json.loads
                    async for line in response.aiter_lines():
                        if line:
                            yield loads(line)
                    return
            await asyncio.sleep(backoff(attempt, retry_after))
            attempt += 1


async def _aiter(children: Any) -> AsyncIterator[Any]:
    if hasattr(children, "__aiter__"):
        async for item in children:
            yield item
    else:
        for item in children:
            yield item
