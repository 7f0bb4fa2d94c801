"""OpenTelemetry tracing of jobq (``pip install jobq[otel]``).

::

    from jobq.telemetry import JobqInstrumentor

    JobqInstrumentor().instrument()        # or instrument(tracer_provider=...)
    ...
    JobqInstrumentor().uninstrument()

Once instrumented, in this process:

- ``Queue.add`` and ``add_bulk`` (and so ``Task.delay`` / ``enqueue``) run
  inside a PRODUCER span ``send <queue>`` that covers the add's script call,
  and each job keeps that span's W3C trace context (traceparent and
  tracestate) in its record, beside its data, never in it;
- each attempt a Worker runs is a CONSUMER span ``process <queue>``, a child
  of the context its job carries: the attempts of a job, retries included,
  are spans of the producer's trace. The span covers the handler and the
  finishing call (complete or fail) and is current while the handler runs,
  so spans the handler opens are its children; a failure (an exception, a
  timeout, a cancel) is recorded as an exception with error status;
- a scheduler's jobs (``upsert_scheduler``) keep the trace context current
  at the upsert, and each of their attempts starts a trace of its own with a
  link to it: a scheduler runs for ever, and one trace per run stays small;
- ``Worker.close`` flushes the tracer provider (``force_flush``), so that a
  worker process's last spans are exported before it ends.

Spans carry the messaging semantic-convention attributes
``messaging.system`` (``jobq``), ``messaging.destination.name`` (the queue),
``messaging.operation.type`` and ``messaging.operation.name`` (``send`` /
``process``), ``messaging.message.id`` (the job id; on a bulk add of more
than one job, ``messaging.batch.message_count`` instead), and
``jobq.job.name``, ``jobq.job.attempt`` (1 for the first attempt).

jobq sends its scripts past redis-py's command layer (for speed), so
redis-py's own instrumentation does not see them: these spans are the ones
that cover the time an add and an attempt's end spend on Redis.

Only this module imports OpenTelemetry (the API alone); the rest of jobq
does not, and pays nothing while no instrumentor is on (see
``jobq/_tracing.py``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as exc:  # the extra not installed: say which
    raise ImportError(f"jobq.telemetry needs OpenTelemetry's API ({exc}): "
                      'pip install "jobq[otel]"') from exc

from . import __version__, _tracing

if TYPE_CHECKING:
    from .job import Job

__all__ = ["JobqInstrumentor"]

logger = logging.getLogger(__name__)

#: The trace context travels as W3C Trace Context whatever the process's
#: global propagator is: a worker in another process, configured otherwise,
#: still reads it.
_PROPAGATOR = TraceContextTextMapPropagator()


def _to_field(carrier: dict[str, str]) -> str:
    parent = carrier.get("traceparent", "")
    if not parent:
        return ""
    state = carrier.get("tracestate", "")
    return f"{parent}\n{state}" if state else parent


def _from_field(value: bytes) -> otel_context.Context:
    parent, _, state = value.decode("ascii", "replace").partition("\n")
    carrier = {"traceparent": parent}
    if state:
        carrier["tracestate"] = state
    return _PROPAGATOR.extract(carrier, context=otel_context.Context())


def _error_type(exc: BaseException) -> str:
    """``error.type``: the exception's class as its ``exception.type`` names
    it (the module and the qualified name; a builtin's name alone)."""
    cls = type(exc)
    module = cls.__module__
    return cls.__qualname__ if not module or module == "builtins" else \
        f"{module}.{cls.__qualname__}"


class _AttemptSpan:
    """An attempt's span, attached to the pool thread that runs it."""

    __slots__ = ("_span", "_token", "_ended")

    def __init__(self, span: trace.Span) -> None:
        self._span = span
        self._token = otel_context.attach(trace.set_span_in_context(span))
        self._ended = False

    def failed(self, exc: BaseException, reason: str) -> None:
        kind = _error_type(exc)
        try:
            try:
                self._span.record_exception(exc)
            except Exception:  # a broken __str__ of the exception: its type and reason
                self._span.add_event("exception", {"exception.type": kind,
                                                   "exception.message": reason})
            self._span.set_attribute("error.type", kind)
            self._span.set_status(Status(StatusCode.ERROR, reason))
        except Exception:  # a tracer's trouble must not cost the attempt its end
            logger.exception("recording the failure of an attempt on its span raised")

    def end(self) -> None:
        if self._ended:
            return
        self._ended = True
        otel_context.detach(self._token)
        try:
            self._span.end()
        except Exception:  # a span processor's on_end: the pool thread must go on
            logger.exception("ending the span of an attempt raised")


class _NoSpan:
    """The span of an attempt whose span could not be opened."""

    def failed(self, exc: BaseException, reason: str) -> None:
        pass

    def end(self) -> None:
        pass


class _Hook:
    """What ``jobq._tracing.hook`` holds while instrumented."""

    def __init__(self, tracer: trace.Tracer, provider: Any) -> None:
        self._tracer = tracer
        self._provider = provider

    def carrier(self) -> str:
        carrier: dict[str, str] = {}
        try:
            _PROPAGATOR.inject(carrier)
        except Exception:  # the job (or scheduler) is stored without a trace context
            logger.exception("could not write the current trace context")
            return ""
        return _to_field(carrier)

    def send(
        self, queue: str, names: Sequence[str], write: Callable[[str], list[Job]]
    ) -> list[Job]:
        attributes: dict[str, Any] = {
            "messaging.system": "jobq",
            "messaging.destination.name": queue,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
        }
        if len(names) == 1:
            attributes["jobq.job.name"] = names[0]
        else:
            attributes["messaging.batch.message_count"] = len(names)
        try:
            span = self._tracer.start_span(f"send {queue}", kind=SpanKind.PRODUCER,
                                           attributes=attributes)
        except Exception:  # tracing must never cost an add (a span processor's on_start)
            logger.exception("could not open the span of an add to %r (added untraced)", queue)
            return write("")
        try:
            with trace.use_span(span, end_on_exit=False):  # it records an error raised
                try:
                    jobs = write(self.carrier())
                except BaseException as exc:
                    span.set_attribute("error.type", _error_type(exc))
                    raise
                if len(jobs) == 1 and span.is_recording():
                    span.set_attribute("messaging.message.id", jobs[0].id)
                return jobs
        finally:
            try:
                span.end()
            except Exception:  # written: an add that raised now would be tried again
                logger.exception("ending the span of an add raised (its jobs were added)")

    def attempt(
        self, job: Job, carrier: bytes | None, scheduled: bool
    ) -> _AttemptSpan | _NoSpan:
        try:
            return self._attempt(job, carrier, scheduled)
        except Exception:  # tracing must never cost a job its attempt
            logger.exception("could not open the span of job %r", job.id)
            return _NoSpan()

    def _attempt(self, job: Job, carrier: bytes | None, scheduled: bool) -> _AttemptSpan:
        parent = otel_context.Context()  # never whatever happens to be current
        links: list[Link] = []
        if carrier:
            carried = _from_field(carrier)
            if scheduled:  # a trace per run, linked to the upsert's
                linked = trace.get_current_span(carried).get_span_context()
                if linked.is_valid:
                    links.append(Link(linked))
            else:
                parent = carried
        span = self._tracer.start_span(
            f"process {job.queue_name}",
            context=parent,
            kind=SpanKind.CONSUMER,
            links=links,
            attributes={
                "messaging.system": "jobq",
                "messaging.destination.name": job.queue_name,
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.message.id": job.id,
                "jobq.job.name": job.name,
                "jobq.job.attempt": job.attempts_made + 1,
            },
        )
        return _AttemptSpan(span)

    def flush(self, seconds: float = 5.0) -> None:
        provider = self._provider or trace.get_tracer_provider()
        force_flush = getattr(provider, "force_flush", None)
        if force_flush is not None:
            try:
                force_flush(max(1, round(seconds * 1000)))
            except Exception as exc:  # an exporter's trouble must not break a close
                logger.warning("flushing spans failed: %s", exc)


class JobqInstrumentor:
    """Trace jobq's adds and attempts with OpenTelemetry.

    Follows OpenTelemetry's instrumentor convention: one instance per
    process (every ``JobqInstrumentor()`` is the same object),
    ``instrument(tracer_provider=None)`` turns tracing on (the global
    provider when none is given), ``uninstrument()`` turns it off; calling
    either twice does nothing more.
    """

    _instance: JobqInstrumentor | None = None
    _lock = threading.Lock()

    def __new__(cls) -> JobqInstrumentor:
        with cls._lock:
            if cls._instance is None:
                cls._instance = super().__new__(cls)
            return cls._instance

    @property
    def is_instrumented_by_opentelemetry(self) -> bool:
        """Whether jobq is traced now."""
        return isinstance(_tracing.hook, _Hook)

    def instrumentation_dependencies(self) -> Collection[str]:
        """The packages this instrumentation needs (jobq itself)."""
        return (f"jobq >= {__version__}",)

    def instrument(self, **kwargs: Any) -> None:
        """Turn tracing on; ``tracer_provider=`` picks the provider."""
        with self._lock:
            if self.is_instrumented_by_opentelemetry:
                logger.warning("jobq is already instrumented")
                return
            provider = kwargs.get("tracer_provider")
            tracer = trace.get_tracer(
                "jobq.telemetry", __version__, tracer_provider=provider,
                schema_url="https://opentelemetry.io/schemas/1.26.0",
            )
            _tracing.hook = _Hook(tracer, provider)

    def uninstrument(self, **kwargs: Any) -> None:
        """Turn tracing off (spans already open still end)."""
        with self._lock:
            if isinstance(_tracing.hook, _Hook):
                _tracing.hook = None
