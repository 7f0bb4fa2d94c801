"""The hook point of tracing: the one place jobq's hot paths consult.

``hook`` is None unless ``jobq.telemetry.JobqInstrumentor`` is instrumenting,
and every caller reads it once per call (``hook = _tracing.hook``) and does
nothing more when it is None: an uninstrumented jobq pays one module
attribute read per add and per attempt, imports nothing of OpenTelemetry and
writes no trace field. This module imports nothing either; the instrumentor
sets and clears ``hook`` (the one piece of module-level state jobq keeps, by
design: tracing is process-wide, as OpenTelemetry's own providers are).

Callers:

- ``Queue.add_bulk`` hands its write to ``hook.send``, which opens the
  producer span, and calls back with the trace context to store in each job
  (the record's ``tc`` field, see keys.JOB_FIELDS) within the same add call;
- ``QueueSchedulers.upsert_scheduler`` stores ``hook.carrier()`` in the
  scheduler's template, which every tick job it produces copies;
- the Runner opens ``hook.attempt(...)`` around a handler and its finishing
  call, from the record the take returned (no extra read);
- ``Worker.close`` calls ``hook.flush()``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .job import Job

#: The record field that carries a job's trace context.
FIELD = b"tc"


class AttemptSpan(Protocol):
    """The span of one attempt, current on the pool thread until ``end``."""

    def failed(self, exc: BaseException, reason: str) -> None:
        """Record the attempt's failure (any thread); ``reason`` is its
        failed reason (``str(exc)`` may raise)."""

    def end(self) -> None:
        """End the span and detach it (the thread that opened it)."""


class Hook(Protocol):
    """What the instrumentor installs."""

    def send(
        self, queue: str, names: Sequence[str], write: Callable[[str], list[Job]]
    ) -> list[Job]:
        """Run ``write(carrier)`` (the add's script calls) inside a producer
        span; ``carrier`` is the trace context each job stores ('' for none)."""

    def carrier(self) -> str:
        """The current trace context as stored in a record ('' for none)."""

    def attempt(self, job: Job, carrier: bytes | None, scheduled: bool) -> AttemptSpan:
        """Open the span of an attempt of ``job``, current on this thread;
        ``carrier`` is the record's trace context, ``scheduled`` whether a
        scheduler produced the job."""

    def flush(self, seconds: float) -> None:
        """Export the spans ended so far, for ``seconds`` at most (a worker
        is closing)."""


hook: Hook | None = None


def record_field(flat: list[bytes], name: bytes) -> bytes | None:
    """The value of field ``name`` in a record as a flat field/value list."""
    for i in range(0, len(flat) - 1, 2):
        if flat[i] == name:
            return flat[i + 1]
    return None
