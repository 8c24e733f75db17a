"""The Worker: claims children, keeps their leases, runs the handler, records outcomes."""
from __future__ import annotations

import asyncio
import collections
import logging
import os
import signal
import socket
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Set, Tuple, Union

from ._handler import DROPPED, ERROR, FAILED, OK, SKIPPED, Failed, Invoker, Ran, Skipped, error_text, is_async
from .aio import AsyncLedger
from .client import Ledger
from .errors import LedgerError, ProblemError
from ._requests import _Chunk, _Requests, _size

__all__ = ["Worker"]
log = logging.getLogger("child_ledger")

_KINDS = {OK: "processed", FAILED: "failed", SKIPPED: "skipped"}


class Worker(_Requests):
    """Runs ``handler`` on the children of ``queue``; see the package README for the contract.

    ``ledger`` is a Ledger, an AsyncLedger or a URL. The handler may be a function
    or a coroutine function; it gets a :class:`Child`.
    """

    def __init__(self, ledger: Union[Ledger, AsyncLedger, str, None], queue: str, handler: Callable[..., Any], *,
                 concurrency: int = 8, batch: Optional[int] = None, lease_seconds: int = 60,
                 wait_seconds: Optional[int] = None, grace_seconds: float = 30, flush_seconds: float = 0.2,
                 name: Optional[str] = None, payload_model: Any = None, exit_when_empty: bool = False) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self._source = ledger
        self.queue = queue
        self.handler = handler
        self.concurrency = concurrency
        self.batch = min(batch if batch is not None else concurrency, 1000)
        self.lease_seconds = lease_seconds
        self.wait_seconds = wait_seconds if wait_seconds is not None else (1 if exit_when_empty else 10)
        self.grace_seconds = grace_seconds
        self.flush_seconds = flush_seconds
        self.name = name or f"python-{socket.gethostname()}-{os.getpid()}"
        self.payload_model = payload_model
        self.exit_when_empty = exit_when_empty
        self.stats: Dict[str, int] = dict.fromkeys(
            ["claimed", "processed", "failed", "skipped", "released", "not_applied", "abandoned", "errors"], 0)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._stop_requested = False
        self._force = False

    # ---- public ----
    def run(self) -> Dict[str, int]:
        """Runs until stopped (SIGTERM/SIGINT when in the main thread, or ``stop()``); returns the stats."""
        return asyncio.run(self.run_async(_signals=threading.current_thread() is threading.main_thread()))

    def stop(self) -> None:
        """Stops the worker (from any thread); a second call ends the grace period."""
        loop = self._loop
        if loop is None:
            self._stop_requested = True
        elif loop.is_running():
            loop.call_soon_threadsafe(self._request_stop)

    async def run_async(self, _signals: bool = False) -> Dict[str, int]:
        self._setup()
        loop = self._loop = asyncio.get_running_loop()
        installed = []
        if _signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                try:
                    loop.add_signal_handler(sig, self._request_stop, sig)
                    installed.append(sig)
                except (NotImplementedError, RuntimeError, ValueError):
                    pass
        try:
            await self._main()
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            if self._own_ledger:
                await self._api.aclose()
            self._loop = None
        if self._fatal is not None:
            raise self._fatal
        return self.stats

    # ---- state ----
    def _setup(self) -> None:
        src = self._source
        self._own_ledger = not isinstance(src, AsyncLedger)
        if isinstance(src, AsyncLedger):
            self._api = src
        elif isinstance(src, Ledger):
            self._api = AsyncLedger(src.url, src.token, timeout=src.timeout, retries=src.retries)
        else:
            self._api = AsyncLedger(src)
        self._invoker = Invoker(self.handler, self.queue, self.payload_model)
        self._async = is_async(self.handler)
        self._cap = max(self.concurrency, self.batch)
        # Room for a claim: a whole batch when several fit in hand (every
        # claim then asks for a whole one, as few requests as the work
        # needs), else half of one, so the queue never waits for a chunk's
        # slowest handler.
        self._half = self.batch if self._cap >= 2 * self.batch else max(1, (self.batch + 1) // 2)
        self._changed = asyncio.Event()
        self._done: Deque[Tuple[_Chunk, Any, Ran]] = collections.deque()
        self._todo: Deque[Tuple[_Chunk, Any]] = collections.deque()
        self._waiters: Deque["asyncio.Future[None]"] = collections.deque()
        self._cv = threading.Condition()
        self._idle_threads = 0
        self._threads: List[threading.Thread] = []
        self._threads_stop = False
        self._waking = False
        self._runner_waking = False
        self._running: Dict[Tuple[str, int], Tuple[_Chunk, Any]] = {}
        self._in_hand = 0
        self._claims: Dict[asyncio.Task[Any], int] = {}
        self._idle = False
        self._pending: List[Dict[str, Any]] = []
        self._pending_bytes = 0
        self._pending_since = 0.0
        self._bg: Set[asyncio.Task[Any]] = set()
        self._keepers: Set[asyncio.Task[Any]] = set()
        self._parents: "collections.OrderedDict[str, Optional[int]]" = collections.OrderedDict()
        self._releases: Dict[str, Tuple[_Chunk, List[Any]]] = {}
        self._resolving = 0
        self._wake_scheduled = False
        self._fatal: Optional[ProblemError] = None
        self._stopping = self._stop_requested

    def _request_stop(self, sig: Any = None) -> None:
        if self._stopping:
            if not self._force:
                log.warning("stopping at once: the grace period ends now")
            self._force = True
        else:
            log.info("%s: stopping; releasing the children not started, %d handlers in flight get %ss",
                     signal.Signals(sig).name if sig else "stop()", len(self._running), self.grace_seconds)
        self._stopping = True
        self._changed.set()
        self._wake_all()

    def _wake_threadsafe(self) -> None:
        if not self._wake_scheduled:
            self._wake_scheduled = True
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._changed.set)

    # ---- runners: they take children from self._todo, a deque shared with the loop ----
    def _feed(self, items: List[Tuple[_Chunk, Any]]) -> None:
        """Hands children to the runners (waking one; it wakes the next while a backlog lasts)."""
        self._todo.extend(items)
        if self._async:
            self._wake_runner()
        else:
            self._kick()

    def _kick(self) -> None:
        """Gets one more thread going (an idle one, else a new one up to ``concurrency``), unless one is
        already on its way: a busy thread that sees children waiting kicks the next, so threads join in
        as a backlog lasts, and a fast handler keeps the work on a few of them."""
        with self._cv:
            if self._waking or self._stopping:
                return
            if self._idle_threads > 0:
                self._waking = True
                self._cv.notify(1)
            elif len(self._threads) < self.concurrency:
                self._waking = True
                t = threading.Thread(target=self._thread, name=f"child-ledger-{len(self._threads)}", daemon=True)
                self._threads.append(t)
                t.start()

    def _wake_runner(self) -> None:
        """Wakes one idle runner, unless one is already on its way: a runner that sees children waiting
        wakes the next, so runners join in while handlers suspend, and a handler that never does keeps
        the work on one runner."""
        if self._runner_waking:
            return
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._runner_waking = True
                return

    def _wake_all(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
        with self._cv:
            self._cv.notify_all()

    async def _runner(self) -> None:
        todo, done, running, changed = self._todo, self._done, self._running, self._changed
        inv = self._invoker
        fast = inv.tracing.tracer is None and inv.model is None
        handler, make = inv.handler, inv.child
        loop = asyncio.get_running_loop()
        while True:
            if self._stopping:
                return
            if not todo:
                waiter = loop.create_future()
                self._waiters.append(waiter)
                await waiter
                self._runner_waking = False
                continue
            chunk, raw = todo.popleft()
            if todo and not self._runner_waking:
                self._wake_runner()
            if chunk.lost:
                done.append((chunk, raw, (DROPPED, None, None)))
                changed.set()
                continue
            key = (raw["parent_id"], raw["sequence"])
            running[key] = (chunk, raw)
            if fast:
                try:
                    ran: Ran = (OK, await handler(make(raw, chunk.claim_id)), raw.get("traceparent"))
                except Failed as err:
                    ran = (FAILED, err, raw.get("traceparent"))
                except Skipped as err:
                    ran = (SKIPPED, err.reason, raw.get("traceparent"))
                except Exception as err:
                    ran = (ERROR, err, raw.get("traceparent"))
            else:
                ran = await inv.run_async(raw, chunk.claim_id)
            done.append((chunk, raw, ran))
            del running[key]
            changed.set()

    def _thread(self) -> None:
        todo, done, running, invoke, cv = self._todo, self._done, self._running, self._invoker.run_sync, self._cv
        with cv:
            self._waking = False
        while True:
            if self._stopping:
                return
            try:
                item = todo.popleft()
            except IndexError:
                with cv:
                    if self._threads_stop:
                        return
                    if not todo:
                        self._idle_threads += 1
                        cv.wait(1.0)
                        self._idle_threads -= 1
                        self._waking = False
                continue
            if todo and not self._waking:
                self._kick()
            chunk, raw = item
            if chunk.lost:
                done.append((chunk, raw, (DROPPED, None, None)))
            else:
                key = (raw["parent_id"], raw["sequence"])
                running[key] = item
                done.append((chunk, raw, invoke(raw, chunk.claim_id)))
                running.pop(key, None)
            self._wake_threadsafe()

    # ---- the loop ----
    async def _main(self) -> None:
        workers: List[Any] = []
        if self._async:
            workers = [asyncio.ensure_future(self._runner()) for _ in range(self.concurrency)]
        log.info("worker %s on queue %s: concurrency %d, batch %d, lease %ss", self.name, self.queue,
                 self.concurrency, self.batch, self.lease_seconds)
        loop = asyncio.get_running_loop()
        grace_end: Optional[float] = None
        try:
            while True:
                self._changed.clear()
                self._drain()
                if self._fatal is not None:
                    break
                if self._stopping:
                    if grace_end is None:
                        grace_end = time.monotonic() + self.grace_seconds
                        await self._begin_stop()
                    if self._in_hand <= 0 or self._force or time.monotonic() >= grace_end:
                        break
                else:
                    if (self.exit_when_empty and self._idle and self._in_hand == 0 and not self._claims
                            and not self._pending and not self._bg):
                        log.info("nothing claimable and nothing of ours in flight: exiting")
                        break
                    self._maybe_claim()
                self._maybe_flush()
                timeout = self.flush_seconds if self._pending else None
                if grace_end is not None:
                    timeout = min(timeout or 0.1, 0.1)
                handle = loop.call_later(timeout, self._changed.set) if timeout is not None else None
                await self._changed.wait()
                if handle is not None:
                    handle.cancel()
        finally:
            await self._finish(workers)

    def _drain(self) -> None:
        self._wake_scheduled = False
        done = self._done
        while done:
            chunk, raw, (kind, value, tp) = done.popleft()
            if kind == ERROR:
                self._on_error(chunk, raw, value)
                continue
            if kind != DROPPED:
                item: Dict[str, Any] = {"parent_id": raw["parent_id"], "sequence": raw["sequence"],
                                        "outcome": _KINDS[kind], "claim_id": chunk.claim_id}
                size = 100
                if kind == OK:
                    if value is not None:
                        item["result"] = value
                        size += 16 if isinstance(value, (int, float, bool)) else _size(value)
                elif kind == FAILED:
                    if isinstance(value, BaseException):
                        item["reason"] = str(getattr(value, "reason", value))[:1000]
                        if getattr(value, "result", None) is not None:
                            item["result"] = value.result  # type: ignore[attr-defined]
                            size += _size(value.result)  # type: ignore[attr-defined]
                    else:
                        item["reason"] = value
                    size += len(item["reason"])
                else:
                    item["reason"] = str(value)[:1000]
                    size += len(item["reason"])
                if tp:
                    item["traceparent"] = tp
                self._add_outcome(item, size)
                chunk.stats[kind] += 1
            self._child_done(chunk)
        if self._releases:
            batches, self._releases = self._releases, {}
            for claim_id, (chunk, raws) in batches.items():
                self._spawn(self._release(chunk, raws, retries=None if not self._stopping else 2))

    def _add_outcome(self, item: Dict[str, Any], size: int) -> None:
        if not self._pending:
            self._pending_since = time.monotonic()
        self._pending.append(item)
        self._pending_bytes += size

    def _child_done(self, chunk: _Chunk) -> None:
        self._in_hand -= 1
        chunk.remaining -= 1
        if chunk.remaining == 0:
            if chunk.keeper is not None:
                chunk.keeper.cancel()
            p, f, s, r = chunk.stats
            log.debug("claim %s: %d children (%d after an expired lease): %d processed, %d failed, %d skipped, "
                      "%d released in %.3fs", chunk.claim_id, chunk.size, chunk.expired, p, f, s, r,
                      time.monotonic() - chunk.started_at)

    # ---- a handler's error: release, or fail on its last attempt ----
    def _on_error(self, chunk: _Chunk, raw: Any, err: BaseException) -> None:
        self.stats["errors"] += 1
        log.warning("%s/%s attempt %s: %s", raw["parent_id"], raw["sequence"], raw["attempt"], error_text(err))
        parent_id = raw["parent_id"]
        if parent_id in self._parents:
            self._decide(chunk, raw, err, self._parents[parent_id])
        else:
            self._resolving += 1
            self._spawn(self._fetch_then_decide(chunk, raw, err))

    async def _fetch_then_decide(self, chunk: _Chunk, raw: Any, err: BaseException) -> None:
        parent_id = raw["parent_id"]
        max_attempts: Optional[int] = None
        try:
            if parent_id not in self._parents:
                parent = await self._api.get_parent(parent_id)
                self._parents[parent_id] = parent.get("max_attempts")
                while len(self._parents) > 1000:
                    self._parents.popitem(last=False)
            max_attempts = self._parents.get(parent_id)
        except LedgerError as e:
            log.warning("reading parent %s: %s (releasing the child)", parent_id, e)
        self._resolving -= 1
        self._decide(chunk, raw, err, max_attempts)
        self._changed.set()

    def _decide(self, chunk: _Chunk, raw: Any, err: BaseException, max_attempts: Optional[int]) -> None:
        if max_attempts is not None and raw["attempt"] >= max_attempts:
            item = {"parent_id": raw["parent_id"], "sequence": raw["sequence"], "outcome": "failed",
                    "reason": error_text(err), "claim_id": chunk.claim_id}
            self._add_outcome(item, 100 + len(item["reason"]))
            chunk.stats[FAILED] += 1
        else:
            self._releases.setdefault(chunk.claim_id, (chunk, []))[1].append(raw)
            chunk.stats[3] += 1
        self._child_done(chunk)

    # ---- stopping ----
    async def _begin_stop(self) -> None:
        for task in list(self._claims):
            task.cancel()
        if self._claims:
            await asyncio.gather(*self._claims, return_exceptions=True)
        unstarted: List[Tuple[_Chunk, Any]] = []
        while self._todo:
            unstarted.append(self._todo.popleft())
        for chunk, raw in unstarted:
            self._releases.setdefault(chunk.claim_id, (chunk, []))[1].append(raw)
            chunk.stats[3] += 1
            self._child_done(chunk)
        self._drain()  # sends the releases at once
        self._wake_all()

    async def _finish(self, workers: List[Any]) -> None:
        for task in list(self._claims):
            task.cancel()
        self._stopping = self._threads_stop = True
        self._wake_all()
        still = list(self._running.values())
        for w in workers:
            if isinstance(w, asyncio.Future):
                w.cancel()
        if self._async:
            await asyncio.gather(*workers, return_exceptions=True)
        self._drain()
        if still and self._fatal is None:
            log.warning("%d handlers still running after the grace period: releasing their children", len(still))
            for chunk, raw in still:
                self._releases.setdefault(chunk.claim_id, (chunk, []))[1].append(raw)
            self._drain()
        if self._fatal is None:
            self._maybe_flush()
        else:  # stop at once: one try each
            for chunk, raws in self._releases.values():
                self._spawn(self._release(chunk, raws, retries=0))
            self._releases = {}
            if self._pending:
                self._spawn(self._post_outcomes(self._take_outcomes(), retries=0))
        while self._bg:
            await asyncio.gather(*list(self._bg), return_exceptions=True)
        for keeper in list(self._keepers):
            keeper.cancel()
        log.info("worker %s stopped: %s", self.name, self.stats)
