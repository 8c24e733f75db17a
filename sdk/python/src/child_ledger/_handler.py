"""What a handler sees (Child) and raises (Failed, Skipped), and how one child is run."""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Generic, Optional, Tuple, TypeVar

P = TypeVar("P")
_new = object.__new__

# What became of one child, as the runners report it to the worker's loop.
OK, FAILED, SKIPPED, ERROR, DROPPED = 0, 1, 2, 3, 4
Ran = Tuple[int, Any, Optional[str]]  # (kind, result/reason/exception, traceparent of the work)


@dataclass(frozen=True)
class Child(Generic[P]):
    """One claimed child, as a handler gets it."""

    parent_id: str
    sequence: int
    key: Optional[str]
    payload: P
    attempt: int
    idempotency_key: str
    previous_attempt: Optional[str]
    traceparent: Optional[str]
    claim_id: str


class Failed(Exception):
    """Raise it in a handler: the child ends ``failed`` with ``reason`` (and ``result``)."""

    def __init__(self, reason: str, result: Any = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.result = result


class Skipped(Exception):
    """Raise it in a handler: the child ends ``skipped`` with ``reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def is_async(handler: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(getattr(handler, "__call__", None))


def error_text(err: BaseException) -> str:
    text = str(err)
    text = f"{type(err).__name__}: {text}" if text else type(err).__name__
    return text[:1000]


class _Tracing:
    """OpenTelemetry, when the API is installed and a tracer provider is set."""

    def __init__(self, queue: str) -> None:
        self.tracer: Any = None
        self.queue = queue
        try:
            from opentelemetry import propagate, trace
        except ImportError:
            return
        if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            return  # the API alone, no SDK: nothing would be recorded
        self.trace, self.propagate = trace, propagate
        self.tracer = trace.get_tracer("child_ledger")

    def span(self, child: Child[Any]) -> Any:
        ctx = self.propagate.extract({"traceparent": child.traceparent}) if child.traceparent else None
        return self.tracer.start_as_current_span(
            f"child-ledger {self.queue}", context=ctx, kind=self.trace.SpanKind.CONSUMER,
            attributes={"child_ledger.parent_id": child.parent_id, "child_ledger.sequence": child.sequence,
                        "child_ledger.attempt": child.attempt})

    @staticmethod
    def traceparent(span: Any) -> Optional[str]:
        ctx = span.get_span_context()
        if not ctx.is_valid:
            return None
        return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


class Invoker:
    """Builds the Child (validating its payload) and runs the handler, sync or async."""

    def __init__(self, handler: Callable[..., Any], queue: str, payload_model: Any = None) -> None:
        self.handler = handler
        self.model = payload_model
        self.tracing = _Tracing(queue)

    def child(self, raw: Any, claim_id: str) -> Child[Any]:
        payload = raw.get("payload")
        if self.model is not None:
            payload = self.model.model_validate(payload)
        child: Child[Any] = _new(Child)  # as Child(...) would build it, at half the cost (frozen all the same)
        child.__dict__.update(parent_id=raw["parent_id"], sequence=raw["sequence"], key=raw.get("key"),
                              payload=payload, attempt=raw["attempt"], idempotency_key=raw["idempotency_key"],
                              previous_attempt=raw.get("previous_attempt"), traceparent=raw.get("traceparent"),
                              claim_id=claim_id)
        return child

    def run_sync(self, raw: Any, claim_id: str) -> Ran:
        try:
            child = self.child(raw, claim_id)
        except Exception as err:  # the payload model rejected it
            return FAILED, error_text(err), None
        if self.tracing.tracer is None:
            return _outcome(self.handler, child, raw.get("traceparent"))
        with self.tracing.span(child) as span:
            kind, value, _ = _outcome(self.handler, child, None)
            if kind == ERROR:
                span.record_exception(value)
            return kind, value, self.tracing.traceparent(span)

    async def run_async(self, raw: Any, claim_id: str) -> Ran:
        try:
            child = self.child(raw, claim_id)
        except Exception as err:
            return FAILED, error_text(err), None
        if self.tracing.tracer is None:
            return await _aoutcome(self.handler, child, raw.get("traceparent"))
        with self.tracing.span(child) as span:
            kind, value, _ = await _aoutcome(self.handler, child, None)
            if kind == ERROR:
                span.record_exception(value)
            return kind, value, self.tracing.traceparent(span)


def _outcome(handler: Callable[..., Any], child: Child[Any], tp: Optional[str]) -> Ran:
    try:
        return OK, handler(child), tp
    except Failed as err:
        return FAILED, err, tp
    except Skipped as err:
        return SKIPPED, err.reason, tp
    except Exception as err:
        return ERROR, err, tp


async def _aoutcome(handler: Callable[..., Any], child: Child[Any], tp: Optional[str]) -> Ran:
    try:
        return OK, await handler(child), tp
    except Failed as err:
        return FAILED, err, tp
    except Skipped as err:
        return SKIPPED, err.reason, tp
    except Exception as err:
        return ERROR, err, tp
