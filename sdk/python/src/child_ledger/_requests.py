"""The Worker's requests: claims, leases, outcome batches and releases (a mixin of Worker)."""
from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any, Deque, Dict, List, Optional, Set, Tuple

from ._base import backoff, dumps
from .errors import LedgerError, ProblemError, UnavailableError

log = logging.getLogger("child_ledger")

MAX_OUTCOMES = 1000
MAX_OUTCOME_BYTES = 900_000


class _Chunk:
    __slots__ = ("claim_id", "size", "remaining", "lost", "keeper", "started_at", "expired", "stats")

    def __init__(self, claim_id: str, size: int, expired: int) -> None:
        self.claim_id, self.size, self.remaining, self.expired = claim_id, size, size, expired
        self.lost = False
        self.keeper: Optional[asyncio.Task[None]] = None
        self.started_at = time.monotonic()
        self.stats = [0, 0, 0, 0]  # processed, failed, skipped, released


class _Requests:
    """Claims, leases, outcomes and releases; the state lives on Worker."""

    # Set up by Worker.__init__ and Worker._setup.
    queue: str
    name: str
    batch: int
    lease_seconds: int
    wait_seconds: int
    flush_seconds: float
    stats: Dict[str, int]
    _api: Any
    _async: bool
    _cap: int
    _half: int
    _changed: asyncio.Event
    _todo: Deque[Tuple[_Chunk, Any]]
    _claims: Dict["asyncio.Task[Any]", int]
    _bg: Set["asyncio.Task[Any]"]
    _keepers: Set["asyncio.Task[Any]"]
    _releases: Dict[str, Tuple[_Chunk, List[Any]]]
    _fatal: Optional[ProblemError]
    _idle: bool
    _in_hand: int
    _stopping: bool
    _pending: List[Dict[str, Any]]
    _pending_bytes: int
    _pending_since: float

    def _feed(self, items: List[Tuple[_Chunk, Any]]) -> None:
        raise NotImplementedError

    # ---- claims ----
    def _maybe_claim(self) -> None:
        while len(self._claims) < (1 if self._idle else 1_000_000):
            room = self._cap - self._in_hand - sum(self._claims.values())
            if room < self._half:
                return
            limit = min(self.batch, room)
            outcomes = self._take_outcomes()
            task = asyncio.ensure_future(self._claim(limit, outcomes))
            self._claims[task] = limit

    def _take_outcomes(self) -> List[Dict[str, Any]]:
        pending = self._pending
        if len(pending) <= MAX_OUTCOMES and self._pending_bytes <= MAX_OUTCOME_BYTES:
            self._pending, self._pending_bytes = [], 0
            return pending
        # Over a request's worth: take as many as fit, judged by the average estimated size.
        average = max(1.0, self._pending_bytes / len(pending))
        n = max(1, min(MAX_OUTCOMES, int(MAX_OUTCOME_BYTES / average)))
        size = int(average * n)
        taken, self._pending = pending[:n], pending[n:]
        self._pending_bytes = max(0, self._pending_bytes - size)
        return taken

    async def _claim(self, limit: int, outcomes: List[Dict[str, Any]]) -> None:
        body = {"limit": limit, "lease_seconds": self.lease_seconds, "wait_seconds": self.wait_seconds,
                "worker": self.name}
        task = asyncio.current_task()
        try:
            if outcomes:
                body["outcomes"] = _jsonable(outcomes)
            try:
                claim = await self._forever(self._api._claim(self.queue, body))
            except ProblemError as err:
                if not outcomes or err.status in (401, 403):
                    raise
                log.warning("a claim carrying %d outcomes was refused (%s): posting them on their own",
                            len(outcomes), err)
                await self._post_outcomes(outcomes, retries=3)
                outcomes = []
                body.pop("outcomes")
                claim = await self._forever(self._api._claim(self.queue, body))
        except asyncio.CancelledError:
            if outcomes:  # maybe recorded, maybe not: post them again (a repeat is answered duplicate)
                self._pending[:0] = outcomes
                self._pending_bytes += sum(_size(o) for o in outcomes)
            raise
        except ProblemError as err:
            log.info("claim on %s refused: %s", self.queue, err)
            if self._fatal is None:
                self._fatal = err
            self._changed.set()
            return
        finally:
            self._claims.pop(task, None)  # type: ignore[arg-type]
        if outcomes:
            self._count_results(outcomes, claim.get("outcome_results") or [])
        children = claim["children"]
        self._idle = not children
        if children:
            self._take_chunk(claim["claim_id"], children)
        self._changed.set()

    def _take_chunk(self, claim_id: str, children: List[Any]) -> None:
        expired = sum(1 for c in children if c.get("previous_attempt") == "expired")
        chunk = _Chunk(claim_id, len(children), expired)
        self.stats["claimed"] += len(children)
        self._in_hand += len(children)
        chunk.keeper = asyncio.ensure_future(self._keep(chunk))
        self._keepers.add(chunk.keeper)
        chunk.keeper.add_done_callback(self._keepers.discard)
        if self._stopping:  # answered after the stop: give it all back
            self._releases[claim_id] = (chunk, list(children))
            chunk.stats[3] += len(children)
            self._in_hand -= len(children)
            chunk.remaining = 0
            chunk.keeper.cancel()
            return
        self._feed([(chunk, c) for c in children])

    async def _keep(self, chunk: _Chunk) -> None:
        """Extends the chunk's lease every third of ``lease_seconds``."""
        deadline = time.monotonic() + self.lease_seconds
        while True:
            await asyncio.sleep(max(0.2, self.lease_seconds / 3))
            sent = time.monotonic()
            try:
                answer = await self._api._call(self._api._extend(chunk.claim_id, self.lease_seconds), retries=2)
            except LedgerError as err:
                log.warning("extend %s: %s", chunk.claim_id, err)
                if time.monotonic() >= deadline:
                    chunk.lost = True
                    return
                continue
            if answer["extended"] == 0:
                log.warning("claim %s holds nothing any more (its lease ran out): its children not started "
                            "will not be", chunk.claim_id)
                chunk.lost = True
                return
            deadline = sent + self.lease_seconds

    async def _forever(self, op: Any) -> Any:
        """The request, retried without limit while it can get better (429, 502-504, no connection)."""
        attempt = 0
        while True:
            try:
                return await self._api._call(op, retries=0)
            except ProblemError as err:
                if err.status not in (429, 502, 503, 504):
                    raise
                why, retry_after = str(err), err.response.headers.get("retry-after") if err.response else None
            except UnavailableError as err:
                why, retry_after = str(err), None
            delay = backoff(attempt, retry_after)
            log.warning("%s %s: %s; retrying in %.2fs", op.method, op.path, why, delay)
            await asyncio.sleep(delay)
            attempt += 1

    # ---- outcomes ----
    def _maybe_flush(self) -> None:
        if not self._pending:
            return
        if not self._stopping and time.monotonic() - self._pending_since < self.flush_seconds:
            return
        while self._pending:
            self._spawn(self._post_outcomes(self._take_outcomes(), retries=None if not self._stopping else 4))

    async def _post_outcomes(self, outcomes: List[Dict[str, Any]], retries: Optional[int]) -> None:
        op = self._api._record_outcomes(_jsonable(outcomes), None)
        try:
            answer = await (self._forever(op) if retries is None else self._api._call(op, retries=retries))
        except LedgerError as err:
            log.error("%d outcomes not recorded (the children come back when their lease runs out): %s",
                      len(outcomes), err)
            self.stats["abandoned"] += len(outcomes)
            return
        self._count_results(outcomes, answer["results"])

    def _count_results(self, outcomes: List[Dict[str, Any]], results: List[Any]) -> None:
        stats, other = self.stats, collections.Counter()  # type: ignore[var-annotated]
        for item, result in zip(outcomes, results):
            if result["status"] == "applied":
                stats[item["outcome"]] += 1
            else:
                other[result["status"]] += 1
        if other:
            stats["not_applied"] += sum(other.values())
            log.info("%d outcomes not applied (already terminal; not retried): %s", sum(other.values()), dict(other))

    async def _release(self, chunk: _Chunk, raws: List[Any], retries: Optional[int]) -> None:
        op = self._api._release(chunk.claim_id, raws, 0)
        try:
            answer = await (self._forever(op) if retries is None else self._api._call(op, retries=retries))
        except LedgerError as err:
            log.error("release %s: %s (the children come back when the lease runs out)", chunk.claim_id, err)
            self.stats["abandoned"] += len(raws)
            return
        self.stats["released"] += answer["released"]
        self.stats["abandoned"] += len(raws) - answer["released"]

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg_done)

    def _bg_done(self, task: "asyncio.Task[Any]") -> None:
        self._bg.discard(task)
        self._changed.set()


def _size(value: Any) -> int:
    try:
        return len(dumps(value))
    except (TypeError, ValueError):
        return 100


def _jsonable(outcomes: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The outcomes, with any result that is not JSON replaced by a failure saying so."""
    try:
        dumps(outcomes)
        return outcomes
    except (TypeError, ValueError):
        pass
    for item in outcomes:
        try:
            dumps(item.get("result"))
        except (TypeError, ValueError) as err:
            item.pop("result", None)
            item["outcome"] = "failed"
            item["reason"] = f"the handler's result is not JSON: {err}"[:1000]
    return outcomes
