"""Tracing with OpenTelemetry: one trace from a request to every attempt.

A "request" span adds a job that fails once and then succeeds; the trace
holds the add's PRODUCER span and both attempts' CONSUMER spans, the failed
one with its exception. Needs ``pip install "jobq[otel]" opentelemetry-sdk``
(an application exports with its own SDK setup: OTLP, say). Run it with
``python examples/tracing.py``; it uses ``$JOBQ_REDIS_URL`` when set, else
starts a private server.
"""

# ci: run

from __future__ import annotations

import os

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from jobq import Job, Queue, Worker
from jobq.telemetry import JobqInstrumentor
from jobq.testing import embedded_url


def main() -> int:
    """Trace an add and two attempts; print the trace; return the exit code."""
    exporter = InMemorySpanExporter()  # an application would export (OTLP, ...)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    JobqInstrumentor().instrument(tracer_provider=provider)
    tracer = provider.get_tracer("example")

    def charge(job: Job) -> str:
        if job.attempts_made == 0:
            raise ConnectionError("payment gateway busy")
        return "charged"

    try:
        with embedded_url() as url:
            name = f"tracing-{os.getpid()}"
            with Queue(name, connection=url) as queue:
                with tracer.start_as_current_span("POST /checkout"):
                    job = queue.add("charge", {"order": 42}, attempts=2)
                with Worker(name, charge, connection=url):
                    print("result:", job.wait_until_finished(timeout=10))
                # Worker.close() returned: every attempt's span has ended
                queue.obliterate(force=True)
    finally:
        JobqInstrumentor().uninstrument()
    spans = sorted(exporter.get_finished_spans(), key=lambda s: s.start_time or 0)
    ids = {s.get_span_context().span_id: s.name for s in spans}  # type: ignore[union-attr]
    for span in spans:
        parent = ids.get(span.parent.span_id, "?") if span.parent else "-"
        attempt = span.attributes.get("jobq.job.attempt", "") if span.attributes else ""
        print(f"trace {span.get_span_context().trace_id:032x}  "  # type: ignore[union-attr]
              f"{span.kind.name:8} {span.name:24} attempt {attempt or '-':<2} "
              f"parent {parent:24} {span.status.status_code.name}")
    return 0 if len({s.get_span_context().trace_id for s in spans}) == 1 else 1  # type: ignore[union-attr]


if __name__ == "__main__":
    raise SystemExit(main())
