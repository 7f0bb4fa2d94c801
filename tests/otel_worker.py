"""A traced Worker in a child process, for the cross-process tracing test.

Usage: ``python -m tests.otel_worker URL PREFIX QUEUE N OUT``

Instruments jobq with its own TracerProvider and in-memory exporter, runs a
Worker on QUEUE until N jobs have completed (at most 30 s), closes it, and
writes every span it ended to OUT as JSON (a list of dicts): the test reads
them back once this process has exited.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from jobq import Job, Worker
from jobq.telemetry import JobqInstrumentor

DEADLINE = 30.0


def span_dict(span: ReadableSpan) -> dict[str, Any]:
    """A span as plain JSON values (ids as 32/16 hex digits)."""
    context = span.get_span_context()
    assert context is not None
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent": None if span.parent is None else f"{span.parent.span_id:016x}",
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
    }


def main(url: str, prefix: str, queue: str, count: int, out: str) -> int:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    JobqInstrumentor().instrument(tracer_provider=provider)
    done = threading.Event()
    completed = 0
    lock = threading.Lock()

    def on_completed(job: Job, result: Any) -> None:
        nonlocal completed
        with lock:
            completed += 1
            if completed >= count:
                done.set()

    def handler(job: Job) -> Any:
        return {"welcomed": job.data["user"]}

    worker = Worker(queue, handler, connection=url, prefix=prefix)
    worker.on("completed", on_completed)
    with worker:
        finished = done.wait(DEADLINE)
    JobqInstrumentor().uninstrument()
    with open(out, "w", encoding="utf-8") as f:
        json.dump([span_dict(s) for s in exporter.get_finished_spans()], f)
    return 0 if finished else 1


if __name__ == "__main__":
    url, prefix, queue, count, out = sys.argv[1:6]
    sys.exit(main(url, prefix, queue, int(count), out))
