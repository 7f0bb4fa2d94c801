"""OpenTelemetry tracing (jobq.telemetry): producer and consumer spans, the
trace context carried in the job's record, across threads and processes;
and nothing of it while no instrumentor is on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode

from jobq import FlowProducer, Job, JobFailedError, Queue, Worker
from jobq.keys import JOB_FIELDS
from jobq.telemetry import JobqInstrumentor

from .polling import until

ROOT = Path(__file__).resolve().parent.parent
WAIT = 10.0


class Traced:
    """The provider, its exporter and a tracer for the test's own spans."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("tests")

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name == name]

    def wait_spans(self, name: str, count: int) -> list[ReadableSpan]:
        """The spans called ``name`` once there are ``count`` (an attempt's
        span ends just after its job's outcome is published)."""
        return until(lambda: len(self.spans(name)) >= count and self.spans(name), WAIT)


@pytest.fixture
def traced() -> Iterator[Traced]:
    t = Traced()
    JobqInstrumentor().instrument(tracer_provider=t.provider)
    try:
        yield t
    finally:
        JobqInstrumentor().uninstrument()
        t.provider.shutdown()


def _ctx(span: ReadableSpan) -> Any:
    context = span.get_span_context()
    assert context is not None
    return context


def _record_field(queue: Queue, job_id: str, field: str) -> bytes | None:
    value: bytes | None = queue.client.hget(queue._context.keys.job(job_id), field)
    return value


def _worker(queue: Queue, handler: Any, **kwargs: Any) -> Worker:
    return Worker(queue.name, handler, connection=queue.client, prefix=queue.prefix, **kwargs)


def test_an_add_is_a_producer_span_and_its_attempt_a_child_consumer_span(
    queue: Queue, traced: Traced
) -> None:
    with traced.tracer.start_as_current_span("request") as request:
        job = queue.add("welcome", {"user": 7})
    (send,) = traced.spans(f"send {queue.name}")
    assert send.kind is SpanKind.PRODUCER
    assert send.parent is not None and send.parent.span_id == request.get_span_context().span_id
    assert dict(send.attributes or {}) == {
        "messaging.system": "jobq",
        "messaging.destination.name": queue.name,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.message.id": job.id,
        "jobq.job.name": "welcome",
    }
    # the context lives in its own field of the record, never in the data
    carried = _record_field(queue, job.id, "tc")
    assert carried is not None and "tc" in JOB_FIELDS
    sent = _ctx(send)
    assert carried.decode() == f"00-{sent.trace_id:032x}-{sent.span_id:016x}-{sent.trace_flags:02x}"
    assert queue.get_job(job.id).data == {"user": 7}  # type: ignore[union-attr]

    with _worker(queue, lambda j: j.data["user"] * 2):
        assert job.wait_until_finished(timeout=WAIT) == 14
        (process,) = traced.wait_spans(f"process {queue.name}", 1)
    assert process.kind is SpanKind.CONSUMER
    assert _ctx(process).trace_id == _ctx(send).trace_id
    assert process.parent is not None and process.parent.span_id == _ctx(send).span_id
    assert dict(process.attributes or {}) == {
        "messaging.system": "jobq",
        "messaging.destination.name": queue.name,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.message.id": job.id,
        "jobq.job.name": "welcome",
        "jobq.job.attempt": 1,
    }
    assert process.status.status_code is StatusCode.UNSET


def test_the_handler_runs_inside_the_attempt_span(queue: Queue, traced: Traced) -> None:
    def handler(job: Job) -> str:
        with traced.tracer.start_as_current_span("inner"):
            return "ok"

    job = queue.add("nested")
    with _worker(queue, handler):
        assert job.wait_until_finished(timeout=WAIT) == "ok"
        (process,) = traced.wait_spans(f"process {queue.name}", 1)
    (inner,) = traced.spans("inner")
    assert inner.parent is not None and inner.parent.span_id == _ctx(process).span_id


def test_each_retry_is_an_attempt_span_of_the_same_trace_and_failures_are_recorded(
    queue: Queue, traced: Traced
) -> None:
    def handler(job: Job) -> str:
        if job.attempts_made < 2:
            raise ValueError(f"attempt {job.attempts_made + 1} fails")
        return "third time"

    job = queue.add("flaky", attempts=3)
    lost = queue.add("doomed")  # one attempt only: fails for good
    with _worker(queue, lambda j: handler(j) if j.name == "flaky" else 1 / 0):
        assert job.wait_until_finished(timeout=WAIT) == "third time"
        spans = traced.wait_spans(f"process {queue.name}", 4)
    sends = {s.attributes["messaging.message.id"]: s for s in traced.spans(f"send {queue.name}")}  # type: ignore[index]
    attempts = sorted(
        (s for s in spans if s.attributes["messaging.message.id"] == job.id),  # type: ignore[index]
        key=lambda s: s.attributes["jobq.job.attempt"],  # type: ignore[index]
    )
    assert [s.attributes["jobq.job.attempt"] for s in attempts] == [1, 2, 3]  # type: ignore[index]
    send = sends[job.id]
    for span in attempts:
        assert _ctx(span).trace_id == _ctx(send).trace_id
        assert span.parent is not None and span.parent.span_id == _ctx(send).span_id
    assert len({_ctx(s).span_id for s in attempts}) == 3
    for span, n in zip(attempts[:2], (1, 2), strict=True):
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description == f"ValueError: attempt {n} fails"
        (event,) = span.events
        assert event.name == "exception"
        assert event.attributes["exception.type"] == "ValueError"  # type: ignore[index]
    assert attempts[2].status.status_code is StatusCode.UNSET and not attempts[2].events
    (doomed,) = [s for s in spans if s.attributes["messaging.message.id"] == lost.id]  # type: ignore[index]
    assert doomed.status.status_code is StatusCode.ERROR
    assert doomed.attributes["error.type"] == "ZeroDivisionError"  # type: ignore[index]
    assert _ctx(doomed).trace_id == _ctx(sends[lost.id]).trace_id


def test_a_timed_out_attempt_is_recorded_as_failed(queue: Queue, traced: Traced) -> None:
    job = queue.add("slow", timeout=0.2)
    with _worker(queue, lambda j: j.cancelled.wait(WAIT)):
        until(lambda: job.get_state() == "failed", WAIT)
        (process,) = traced.wait_spans(f"process {queue.name}", 1)
    assert process.status.status_code is StatusCode.ERROR
    # named as the exception event names it (a class's module too)
    assert process.attributes["error.type"] == "jobq.errors.JobTimeoutError"  # type: ignore[index]
    assert [e.attributes["exception.type"] for e in process.events] == [  # type: ignore[index]
        "jobq.errors.JobTimeoutError"]


class _BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message")


def _raise_broken(job: Job) -> None:
    raise _BrokenStr()


def test_an_exception_whose_str_raises_fails_its_job_traced_too(
    queue: Queue, traced: Traced
) -> None:
    """The span records the failure without str() of the exception; the job
    fails as untraced (it stalled, and ran again and again)."""
    job = queue.add("broken")
    with _worker(queue, _raise_broken):
        with pytest.raises(JobFailedError) as info:
            job.wait_until_finished(timeout=WAIT)
        (process,) = traced.wait_spans(f"process {queue.name}", 1)
    assert info.value.failed_reason == "_BrokenStr (its message could not be read)"
    assert job.refresh().attempts_made == 1
    assert process.status.status_code is StatusCode.ERROR
    assert process.status.description == "_BrokenStr (its message could not be read)"
    assert process.attributes["error.type"] == "tests.test_telemetry._BrokenStr"  # type: ignore[index]


class _RaisingOnEnd(SimpleSpanProcessor):
    """A span processor whose on_end raises (an exporter's bug)."""

    def on_end(self, span: ReadableSpan) -> None:
        raise RuntimeError("on_end broke")


def test_a_failed_add_is_an_error_span_with_its_error_type(traced: Traced) -> None:
    """An add that raised (the server away) had error status and the
    exception, but no ``error.type``, which the conventions ask for."""
    with Queue("away", connection="redis://127.0.0.1:1/0") as queue, \
            pytest.raises(redis.exceptions.ConnectionError):
        queue.add("x")
    (send,) = traced.wait_spans("send away", 1)
    assert send.status.status_code is StatusCode.ERROR
    assert send.attributes["error.type"] == "redis.exceptions.ConnectionError"  # type: ignore[index]


def test_an_add_refused_by_its_own_checks_opens_no_span(queue: Queue, traced: Traced) -> None:
    """Nothing was sent (docs/guide/tracing.md): the caller gets the error,
    and the next add's span is the only one."""
    from jobq.errors import SerializationError

    with pytest.raises(SerializationError):
        queue.add("x", {1, 2})
    with pytest.raises(ValueError, match="attempts"):
        queue.add("x", 1, attempts=0)
    with pytest.raises(SerializationError):
        queue.add_bulk([{"name": "x", "data": 1}, {"name": "x", "data": object()}])
    queue.add("x", 1)
    assert len(traced.wait_spans(f"send {queue.name}", 1)) == 1
    assert queue.get_job_counts("waiting") == {"waiting": 1}


def test_a_span_processor_that_raises_costs_neither_an_add_nor_a_worker(
    queue: Queue, traced: Traced
) -> None:
    """A processor raising in on_end made add() raise after its job was
    written (a caller that retried made duplicates), and ended the worker's
    pool thread: its jobs stayed active, their locks renewed, for good.
    The error is logged; the add returns and the worker goes on."""
    traced.provider.add_span_processor(_RaisingOnEnd(InMemorySpanExporter()))
    jobs = [queue.add("x", i) for i in range(3)]  # no error: each was written once
    assert queue.count() == 3
    with _worker(queue, lambda job: job.data, concurrency=1):
        assert [j.wait_until_finished(timeout=WAIT) for j in jobs] == [0, 1, 2]
        traced.wait_spans(f"process {queue.name}", 3)


class _RaisingOnStart(SimpleSpanProcessor):
    """A span processor whose on_start raises."""

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        raise RuntimeError("on_start broke")


def test_a_span_processor_raising_on_start_costs_no_add(
    queue: Queue, traced: Traced, redis_url: str
) -> None:
    """The producer span was opened outside any guard: a processor raising
    in on_start made every traced add, bulk add and flow raise, and
    nothing was written. They are added untraced, and the error logged."""
    traced.provider.add_span_processor(_RaisingOnStart(InMemorySpanExporter()))
    jobs = [queue.add("x", 0), *queue.add_bulk([{"name": "x", "data": 1}])]
    with FlowProducer(connection=redis_url) as flows:
        node = flows.add({"name": "parent", "queue": queue.name, "data": 3,
                          "children": [{"name": "x", "queue": queue.name, "data": 2}]})
    jobs += [queue.get_job(node.children[0].job.id), queue.get_job(node.job.id)]
    assert queue.count() == 3 and queue.get_job_counts("waiting-children") == {
        "waiting-children": 1}
    with _worker(queue, lambda job: job.data):
        assert [j.wait_until_finished(timeout=WAIT) for j in jobs] == [0, 1, 2, 3]


def test_add_bulk_is_one_producer_span_whose_context_every_job_carries(
    queue: Queue, traced: Traced
) -> None:
    jobs = queue.add_bulk([{"name": "bulk", "data": n} for n in range(3)])
    (send,) = traced.spans(f"send {queue.name}")
    assert send.attributes["messaging.batch.message_count"] == 3  # type: ignore[index]
    assert "messaging.message.id" not in (send.attributes or {})
    assert len({_record_field(queue, j.id, "tc") for j in jobs}) == 1
    with _worker(queue, lambda j: j.data):
        for n, job in enumerate(jobs):
            assert job.wait_until_finished(timeout=WAIT) == n
        spans = traced.wait_spans(f"process {queue.name}", 3)
    assert sorted(s.attributes["messaging.message.id"] for s in spans) == sorted(  # type: ignore[index]
        j.id for j in jobs)
    for span in spans:
        assert span.parent is not None and span.parent.span_id == _ctx(send).span_id


def test_a_debounced_job_carries_the_trace_of_the_add_whose_data_it_runs(
    queue: Queue, traced: Traced
) -> None:
    """A debounce replaced the pending job's data, options and settings, but
    not its trace context: the attempt that ran the last add's data was in
    the first add's trace."""
    dedup = {"id": "k", "replace": True}
    with traced.tracer.start_as_current_span("first"):
        first = queue.add("n", "first", delay=60, dedup=dedup)
    with traced.tracer.start_as_current_span("second") as second:
        job = queue.add("n", "second", delay=60, dedup=dedup)
    assert job.id == first.id
    sends = traced.spans(f"send {queue.name}")
    assert len(sends) == 2 and _ctx(sends[1]).trace_id == second.get_span_context().trace_id
    sent = _ctx(sends[1])
    assert _record_field(queue, job.id, "tc") == \
        f"00-{sent.trace_id:032x}-{sent.span_id:016x}-{sent.trace_flags:02x}".encode()
    job.promote()
    with _worker(queue, lambda j: j.data):
        assert job.wait_until_finished(timeout=WAIT) == "second"
        (process,) = traced.wait_spans(f"process {queue.name}", 1)
    assert process.parent is not None and process.parent.span_id == sent.span_id


def test_a_flow_and_a_depends_on_add_keep_the_chain(queue: Queue, traced: Traced) -> None:
    """Every job of a flow carries the context of the one producer span of
    FlowProducer.add; the parent's attempt is in the same trace as the
    request that added the tree; a depends_on add is traced like an add."""
    with traced.tracer.start_as_current_span("request") as request:
        with FlowProducer(connection=queue.client, prefix=queue.prefix) as flow:
            node = flow.add({"name": "parent", "queue": queue.name, "children": [
                {"name": "child", "queue": queue.name, "data": n} for n in range(2)]})
    (send,) = traced.spans(f"send {queue.name}")
    assert send.parent is not None and send.parent.span_id == request.get_span_context().span_id
    assert send.attributes["messaging.batch.message_count"] == 3  # type: ignore[index]
    jobs = [node.job, *(c.job for c in node.children)]
    assert len({_record_field(queue, j.id, "tc") for j in jobs}) == 1
    later = queue.add("after", depends_on=[node.job])
    assert len(traced.spans(f"send {queue.name}")) == 2
    assert _record_field(queue, later.id, "tc") is not None
    with _worker(queue, lambda j: j.data if j.name == "child" else j.name):
        assert later.wait_until_finished(timeout=WAIT) == "after"
        spans = traced.wait_spans(f"process {queue.name}", 4)
    trace = request.get_span_context().trace_id
    in_flow = [s for s in spans if s.attributes["jobq.job.name"] != "after"]  # type: ignore[index]
    assert len(in_flow) == 3 and {_ctx(s).trace_id for s in in_flow} == {trace}
    parent_span = next(s for s in spans if s.attributes["jobq.job.name"] == "parent")  # type: ignore[index]
    assert parent_span.parent is not None and parent_span.parent.span_id == _ctx(send).span_id


def test_a_task_delay_is_traced_as_an_add(queue: Queue, traced: Traced) -> None:
    @queue.task()
    def double(n: int) -> int:
        return 2 * n

    job = double.delay(21)
    (send,) = traced.spans(f"send {queue.name}")
    assert send.attributes["jobq.job.name"] == double.name  # type: ignore[index]
    with _worker(queue, queue.tasks):
        assert job.wait_until_finished(timeout=WAIT) == 42
        (process,) = traced.wait_spans(f"process {queue.name}", 1)
    assert process.attributes["jobq.job.name"] == double.name  # type: ignore[index]
    assert process.parent is not None and process.parent.span_id == _ctx(send).span_id


def test_scheduled_jobs_start_their_own_trace_linked_to_the_upsert(
    queue: Queue, traced: Traced
) -> None:
    with traced.tracer.start_as_current_span("deploy") as deploy:
        queue.upsert_scheduler("nightly", every=60.0, limit=1, name="report")
    with _worker(queue, lambda j: "done"):
        (process,) = traced.wait_spans(f"process {queue.name}", 1)
    assert process.parent is None  # a root: one trace per run
    assert _ctx(process).trace_id != deploy.get_span_context().trace_id
    (link,) = process.links
    assert link.context.span_id == deploy.get_span_context().span_id
    assert process.attributes["jobq.job.name"] == "report"  # type: ignore[index]


def test_uninstrument_stops_tracing_and_no_field_is_written(
    queue: Queue, traced: Traced
) -> None:
    JobqInstrumentor().uninstrument()
    assert not JobqInstrumentor().is_instrumented_by_opentelemetry
    with traced.tracer.start_as_current_span("request"):
        job = queue.add("quiet")
    with _worker(queue, lambda j: "ok"):
        assert job.wait_until_finished(timeout=WAIT) == "ok"
    assert [s.name for s in traced.spans()] == ["request"]
    assert _record_field(queue, job.id, "tc") is None


def test_a_context_recorded_by_a_traced_producer_is_harmless_to_an_untraced_worker(
    queue: Queue, traced: Traced
) -> None:
    job = queue.add("mixed")
    assert _record_field(queue, job.id, "tc") is not None
    JobqInstrumentor().uninstrument()
    with _worker(queue, lambda j: "ok"):
        assert job.wait_until_finished(timeout=WAIT) == "ok"
    assert [s.name for s in traced.spans()] == [f"send {queue.name}"]


def test_a_malformed_context_makes_a_root_span_and_the_job_runs(
    queue: Queue, traced: Traced
) -> None:
    job = queue.add("first", delay=60)  # delayed: no worker takes it before the change
    queue.client.hset(queue._context.keys.job(job.id), "tc", b"not\xffa traceparent")
    job.promote()
    with _worker(queue, lambda j: "ran"):
        assert job.wait_until_finished(timeout=WAIT) == "ran"
        (process,) = traced.wait_spans(f"process {queue.name}", 1)
    assert process.parent is None and not process.links


def test_without_a_valid_span_context_no_field_is_written(queue: Queue) -> None:
    # instrumented with the API's no-op provider: spans are not recorded,
    # and there is no context worth carrying
    JobqInstrumentor().instrument(tracer_provider=trace.NoOpTracerProvider())
    try:
        job = queue.add("noop")
    finally:
        JobqInstrumentor().uninstrument()
    assert _record_field(queue, job.id, "tc") is None


def test_the_instrumentor_follows_the_convention() -> None:
    first, second = JobqInstrumentor(), JobqInstrumentor()
    assert first is second
    assert not first.is_instrumented_by_opentelemetry
    first.instrument()
    try:
        first.instrument()  # twice: nothing more
        assert second.is_instrumented_by_opentelemetry
    finally:
        second.uninstrument()
    second.uninstrument()
    assert not first.is_instrumented_by_opentelemetry


#: Imports every module of jobq but ``telemetry`` in a fresh interpreter.
_IMPORT_ALL = """
import importlib, pkgutil, sys
import jobq
for m in pkgutil.walk_packages(jobq.__path__, "jobq."):
    skip = m.name in ("jobq.telemetry", "jobq.__main__")
    if not skip and not m.name.startswith("jobq.contrib.django."):
        importlib.import_module(m.name)
import jobq.contrib.django
assert "jobq.cli" in sys.modules and "jobq.contrib.flask" in sys.modules
"""


def _python(code: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr


def test_jobq_imports_nothing_of_opentelemetry() -> None:
    # redis-py imports OpenTelemetry by itself when it is installed (its own
    # observability): jobq's modules add nothing to what the libraries load
    _python(
        "import sys, redis, redis.cluster, flask, django, croniter, msgpack\n"
        "before = {n for n in sys.modules if n.split('.')[0] == 'opentelemetry'}\n"
        + _IMPORT_ALL +
        "after = {n for n in sys.modules if n.split('.')[0] == 'opentelemetry'}\n"
        "assert after == before, sorted(after - before)\n"
    )


def test_without_opentelemetry_every_module_but_telemetry_imports() -> None:
    # as without the extra: any import of opentelemetry fails
    _python(
        "import sys\n"
        "class Absent:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'opentelemetry':\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Absent())\n"
        + _IMPORT_ALL +
        "try:\n"
        "    import jobq.telemetry\n"
        "except ImportError as exc:\n"
        "    assert 'pip install \"jobq[otel]\"' in str(exc), exc\n"
        "else:\n"
        "    raise AssertionError('jobq.telemetry imported without opentelemetry')\n"
    )


def test_one_trace_from_a_flask_view_to_a_worker_in_another_process(
    redis_url: str, tmp_path: Path, traced: Traced
) -> None:
    import flask
    from opentelemetry.propagate import extract

    prefix = f"otel-{uuid.uuid4().hex[:8]}"
    name = "signups"
    app = flask.Flask(__name__)
    queue = Queue(name, connection=redis_url, prefix=prefix)

    @app.post("/signup")
    def signup() -> Any:
        # what a server instrumentation does: continue the caller's trace
        headers = {k.lower(): v for k, v in flask.request.headers.items()}
        with traced.tracer.start_as_current_span(
            "POST /signup", context=extract(headers), kind=SpanKind.SERVER
        ):
            job = queue.add("welcome", {"user": flask.request.json["user"]})
        return {"job": job.id}

    trace_id = uuid.uuid4().hex
    caller = f"00-{trace_id}-{uuid.uuid4().hex[:16]}-01"
    try:
        with app.test_client() as client:
            ids = [client.post("/signup", json={"user": n}, headers={"traceparent": caller})
                   .get_json()["job"] for n in range(2)]
        out = tmp_path / "spans.json"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.run(
            [sys.executable, "-m", "tests.otel_worker", redis_url, prefix, name, "2", str(out)],
            capture_output=True, text=True, timeout=45, env=env, cwd=str(ROOT),
        )
        assert proc.returncode == 0, proc.stderr
        worker_spans = json.loads(out.read_text())
    finally:
        queue.obliterate(force=True)
        queue.close()
    views = traced.spans("POST /signup")
    sends = {s.attributes["messaging.message.id"]: s for s in traced.spans(f"send {name}")}  # type: ignore[index]
    assert len(views) == 2 and sorted(sends) == sorted(ids)
    processes = [s for s in worker_spans if s["name"] == f"process {name}"]
    assert sorted(s["attributes"]["messaging.message.id"] for s in processes) == sorted(ids)
    for span in processes:
        send = sends[span["attributes"]["messaging.message.id"]]
        # one trace: the caller's, through the view and the add, to the attempt
        assert span["trace_id"] == trace_id == f"{_ctx(send).trace_id:032x}"
        assert span["parent"] == f"{_ctx(send).span_id:016x}"
        assert span["kind"] == "CONSUMER" and span["status"] == "UNSET"
    for view in views:
        assert f"{_ctx(view).trace_id:032x}" == trace_id
