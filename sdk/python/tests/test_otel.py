"""OpenTelemetry: each handler runs in a span whose parent is the child's traceparent."""
from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from child_ledger import Ledger

pytest.importorskip("opentelemetry.sdk")

TRACE_ID, SPAN_ID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
SCRIPT = r"""
import json, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from child_ledger import Worker
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
inside = []
def handler(child):
    ctx = trace.get_current_span().get_span_context()
    inside.append(f"{ctx.trace_id:032x}")
    return None
stats = Worker(sys.argv[1], sys.argv[2], handler, exit_when_empty=True, wait_seconds=1).run()
spans = [{"trace": f"{s.context.trace_id:032x}", "parent": f"{s.parent.span_id:016x}" if s.parent else None,
          "name": s.name} for s in exporter.get_finished_spans()]
print(json.dumps({"spans": spans, "inside": inside, "stats": stats}))
"""


def test_handler_span_joins_the_childs_trace(ledger: Ledger, service: Any, queue: str) -> None:
    ledger.register("P-" + queue, queue, [{"payload": 1}, {"payload": 2}],
                    traceparent=f"00-{TRACE_ID}-{SPAN_ID}-01")
    done = subprocess.run([sys.executable, "-c", SCRIPT, service.url, queue], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["stats"]["processed"] == 2
    assert out["inside"] == [TRACE_ID, TRACE_ID]
    assert len(out["spans"]) == 2
    for span in out["spans"]:
        assert span["trace"] == TRACE_ID and span["name"] == f"child-ledger {queue}"
        assert span["parent"] is not None
