"""Queue: add jobs and administer them."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import redis

from . import _fork, _tracing, serializer
from ._adding import Batch, JobPreparer
from ._cancel import QueueCancel
from ._closing import ClosedOnExit, OfQueue
from ._context import PAYLOAD_LIMIT, QueueContext, not_a_shard
from ._dedup import QueueDedup
from ._queue_ops import BATCH, QueueAdmin, QueueReading, record_queue
from ._queue_settings import EVENT_MODES, QueueSettings
from ._schedulers import QueueSchedulers
from .calls import NewJob
from .errors import (
    RedisOOMError,
    SerializationError,
    in_entry,
)
from .job import Job
from .options import byte_limit
from .scripts import FunctionsRefused
from .tasks import QueueTasks, Task

logger = logging.getLogger("jobq.queue")

if TYPE_CHECKING:

    from .queue_events import QueueEvents

__all__ = ["Queue"]

#: Largest encoded job data ``add`` accepts by default (1 MiB, as SQS).
DEFAULT_MAX_PAYLOAD_BYTES = PAYLOAD_LIMIT


def job_specs(
    jobs: Iterable[Mapping[str, Any]],
) -> Iterator[tuple[int, Any, Any, dict[str, Any]]]:
    """The jobs of an ``add_bulk``: (index, name, data, options) of each,
    checked (an error names the entry: see ``bulk_entry``)."""
    if isinstance(jobs, (str, bytes, Mapping)) or not isinstance(jobs, Iterable):
        raise TypeError(f"jobs must be an iterable of job dicts, not {type(jobs).__name__}")
    for index, spec in enumerate(jobs):
        if type(spec) is not dict and not isinstance(spec, Mapping):  # the ABC check is slow
            raise TypeError(f"jobs[{index}]: each job must be a dict, not {type(spec).__name__}")
        if "name" not in spec:
            raise ValueError(f"jobs[{index}]: each job needs a 'name'")
        if len(spec) == 1 or (len(spec) == 2 and "data" in spec):
            options: dict[str, Any] = {}  # the common case, without a pass over the spec
        else:
            options = {k: v for k, v in spec.items() if k not in ("name", "data")}
        yield index, spec["name"], spec.get("data"), options


def add_refused(added: list[Job], total: int) -> RedisOOMError:
    """The error of an add the server refused for memory after ``added``
    (in order; ``error.added``) of ``total`` jobs were written."""
    error = RedisOOMError(
        "Redis is out of memory and refused the add (used_memory > maxmemory, "
        "maxmemory-policy noeviction): "
        + (f"{len(added)} of the {total} jobs were added (the error's `added`), "
           "none of the others" if added else "nothing was added"))
    error.added = added
    return error


def partly_added(exc: redis.exceptions.RedisError, added: list[Job],
                 total: int) -> redis.exceptions.RedisError:
    """The error of a bulk add that failed (``exc``) after ``added`` of its
    ``total`` jobs were written (in order; ``error.added``): of the kind
    ``exc`` is (a ConnectionError, a TimeoutError, a ResponseError), saying
    so; an add of them all again would add those twice, unless they have
    job ids."""
    kind = next(k for k in (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                            redis.exceptions.ResponseError, redis.exceptions.RedisError)
                if isinstance(exc, k))
    error = kind(f"{len(added)} of the {total} jobs were added (the error's `added`), the "
                 f"others not, or not surely: {exc}")
    error.added = added  # type: ignore[attr-defined]
    return error


def bulk_entry(index: int, name: Any, exc: BaseException) -> BaseException:
    """The error of an ``add_bulk``'s entry ``index``, naming it."""
    return in_entry(f"jobs[{index}] (name {name!r})", exc)


class Queue(
    OfQueue, QueueSettings, QueueReading, QueueAdmin, QueueCancel, QueueDedup, QueueSchedulers,
    QueueTasks, ClosedOnExit,
):
    """A named queue on Redis: add jobs, read them, administer the queue.

    Args:
        name: the queue's name (no braces, wildcards or whitespace).
        connection: None (``$JOBQ_REDIS_URL``, else localhost), a URL (also
            ``redis+cluster://``, ``redis+sentinel://``), a ``redis.Redis`` or ``RedisCluster``.
        prefix: the first part of every key of the queue.
        event_mode: ``"stream"`` or ``"pubsub"``, stored with the queue; None
            follows the stored mode (stream when none is stored).
        max_events: about how many events the event stream retains; stored
            with the queue when given. None (the default) keeps the stored
            value (10,000 when none is stored): a Queue made to look never
            changes a setting.
        default_job_options: options applied to every ``add`` unless given;
            never ``job_id`` or ``dedup`` (every add would be one job).
        max_payload_bytes: largest msgpack-encoded ``data`` that ``add``
            accepts (default 1 MiB); None for no limit but the server's.
        result_ttl: seconds a result kept apart from its job's record stays
            readable by late waiters (stored with the queue when given, like
            ``max_events``; 60 when none is stored): a result over 1 KiB of
            a job with a retention rule, and in pub/sub mode any result of a
            job removed on completion.
    """

    def __init__(
        self,
        name: str,
        *,
        connection: object = None,
        prefix: str = "jobq",
        event_mode: str | None = None,
        max_events: int | None = None,
        default_job_options: Mapping[str, Any] | None = None,
        max_payload_bytes: int | None = DEFAULT_MAX_PAYLOAD_BYTES,
        result_ttl: float | None = None,
    ) -> None:
        if event_mode is not None and event_mode not in EVENT_MODES:
            raise ValueError(f"event_mode must be 'stream' or 'pubsub', not {event_mode!r}")
        if max_events is not None and (
            isinstance(max_events, bool) or not isinstance(max_events, int) or max_events < 1
        ):
            raise ValueError(f"max_events must be a positive int, not {max_events!r}")
        payload_limit = byte_limit("max_payload_bytes", max_payload_bytes)
        if result_ttl is not None and (
            isinstance(result_ttl, bool)
            or not isinstance(result_ttl, (int, float))
            or not 0.001 <= result_ttl <= 86_400 * 30
        ):
            raise ValueError(
                f"result_ttl must be seconds from 0.001 to 30 days, not {result_ttl!r}"
            )
        self._preparer = JobPreparer(default_job_options)
        self._tasks: dict[str, Task[Any]] = {}
        self._context = QueueContext(name, connection, prefix)
        self._context.payload_limit = payload_limit
        self._settings = (event_mode, max_events, result_ttl)
        self._context.expects_pubsub = event_mode == "pubsub"
        self._recorded = False
        self._owner_lost: Callable[[], None] | None = None  # a shard's ShardedQueue's
        self._marking = False  # a store of settings under way (see _settings_lost)
        self._marked_at = 0.0  # when the last one ended (monotonic)
        # no I/O here: a module-level Queue must not break an import while the
        # server is down; settings are stored and checked on first use
        self._context.on_first_use(self._first_use)

    def _record(self) -> None:
        """Record the queue's name in the known-queues set (for ``jobq info``
        with no queue named), once, when it is first written to."""
        record_queue(self)

    def __repr__(self) -> str:
        state = "closed" if self._context.closed else "open"
        return f"<Queue {self.name!r} prefix={self.prefix!r} {state}>"

    # -- adding -----------------------------------------------------------

    def _prepare(
        self, name: Any, data: Any, options: Mapping[str, Any], batch: Batch | None = None
    ) -> tuple[NewJob, dict[str, Any]]:
        """A job's arguments of add.lua and its options' plain form, every
        value checked; ``batch``: what the jobs of one ``add_bulk`` share."""
        return self._preparer.prepare(self._context, name, data, options, batch)

    def add(self, name: str, data: Any = None, **options: Any) -> Job:
        """Add one job; return it.

        ``options`` are those of SPEC: job_id, delay, priority, attempts,
        backoff, lifo, timeout, remove_on_complete, remove_on_fail, dedup.
        Adding an existing ``job_id`` returns the existing job and emits
        ``duplicated``; an add whose ``dedup`` key holds returns the job that
        owns it and emits ``deduplicated`` (a debounce returns the replaced
        delayed job; of a throttle key whose job retention removed, a Job
        of its id without data, whose wait raises JobNotFoundError: its
        outcome went with its record).

        ``depends_on`` (a list of job ids of this queue, ``(queue, id)``
        pairs or Jobs) makes the job wait in state ``waiting-children``
        until each has completed (see ``FlowProducer``): those completed
        already count as done, failed ones follow their failure policy.
        A failure policy option (``fail_parent_on_failure``, ...; here,
        in ``add_bulk`` or a default) is kept for when the job becomes a child.

        Raises:
            SerializationError: data is not msgpack-encodable.
            PayloadTooLarge: data encodes to more than ``max_payload_bytes``.
            RedisOOMError: the server is out of memory (nothing was added).
            JobNotFoundError: a job of ``depends_on`` does not exist (nothing
                was added).
            CrossSlotFlowError: on a cluster, a dependency's queue is in
                another slot (see ``FlowProducer``).
            TypeError: an unknown option.  ValueError: a bad option value.
        """
        not_a_shard(self._context, "add jobs")
        depends_on = options.pop("depends_on", None)
        if depends_on is not None:
            from .flow import add_with_dependencies

            return add_with_dependencies(self, name, data, options, depends_on)
        return self._add_jobs([{"name": name, "data": data, **options}], bulk=False)[0]

    def add_bulk(self, jobs: Iterable[Mapping[str, Any]]) -> list[Job]:
        """Add many jobs: ``{"name": ..., "data": ..., **options}`` each
        (``depends_on`` is ``add``'s alone: add the jobs it names here, then
        the dependent job with ``add``, or use a ``FlowProducer``).

        Every job is validated before anything is written; then they are
        written a chunk of 1000 per round trip, each chunk atomically.

        Raises:
            RedisOOMError: the server is out of memory; its ``added`` lists
                the jobs of the chunks written before (empty: none).
            As ``add`` otherwise.
        """
        return self._add_jobs(jobs)

    def _add_jobs(self, jobs: Iterable[Mapping[str, Any]], bulk: bool = True) -> list[Job]:
        """``add_bulk``; an error of a job names its entry when ``bulk``."""
        not_a_shard(self._context, "add jobs")
        batch = Batch()
        prepared: list[tuple[NewJob, dict[str, Any], Any]] = []
        for index, name, data, options in job_specs(jobs):
            try:
                if "depends_on" in options:
                    raise TypeError("depends_on is add()'s alone: add the jobs it names "
                                    "first, then the dependent job with add()")
                args, opts = self._prepare(name, data, options, batch)
            except (TypeError, ValueError) as exc:
                if not bulk:
                    raise
                raise bulk_entry(index, name, exc) from exc
            prepared.append((args, opts, data))
        hook = _tracing.hook
        if hook is None:
            return self._write(prepared, "")
        return hook.send(self.name, [new.name for new, _, _ in prepared],
                         lambda carrier: self._write(prepared, carrier))

    def _write(self, prepared: list[tuple[NewJob, dict[str, Any], Any]], trace: str) -> list[Job]:
        """Write validated jobs, a chunk per round trip; ``trace``: the trace
        context each job stores ('' for none). A job found existing by its
        id is built from the record the add read with it."""
        result: list[Job] = []
        for start in range(0, len(prepared), BATCH):
            chunk = prepared[start : start + BATCH]
            jobs = [new._replace(trace=trace) if trace else new for new, _, _ in chunk]
            try:
                sent = time.monotonic()
                timestamp, added, unset = self._context.calls.add(jobs, self._restores())
            except FunctionsRefused as exc:  # said as such: what to do differs
                exc.added = result
                raise
            except redis.exceptions.OutOfMemoryError as exc:
                raise add_refused(result, len(prepared)) from exc
            except redis.exceptions.RedisError as exc:
                if not result:
                    raise
                raise partly_added(exc, result, len(prepared)) from exc
            if unset:
                self._settings_lost(sent)
            for item, (job_id, duplicated, run, record) in zip(chunk, added, strict=True):
                new, opts, data = item
                if record is not None:  # an existing id, read by the add
                    result.append(Job.from_record(self._context, job_id, record))
                    continue
                if duplicated:  # a dedup key's owner
                    try:
                        existing = self.get_job(job_id)
                    except redis.exceptions.RedisError:  # it exists, the reply said
                        existing = None
                    # a throttle key outlives its job's record: still ignored
                    result.append(existing or Job(self._context, job_id, new.name))
                    continue
                job = Job(self._context, job_id, new.name, data, opts, timestamp)
                job._run, job._fresh = run, True
                result.append(job)
        if result:
            self._record()  # after the add: an add whose reply is lost is never resent
        return result

    def emit(self, event: str, **fields: Any) -> None:
        """Publish a custom event to every QueueEvents of this queue.

        Raises:
            ValueError: ``event`` is empty, has a ``:``, or is ``"*"`` (the
                channel of every event, ``on_all_events``).
            SerializationError: a field value is not msgpack-encodable.
        """
        if not isinstance(event, str) or not event or ":" in event or event == "*":
            raise ValueError(
                f"event name must be a non-empty str without ':', and not '*' (the channel "
                f"of every event), not {event!r}")
        packed: list[tuple[str, bytes]] = []
        for key, value in fields.items():
            if key in ("ev", "jid", "c", "ts"):
                raise SerializationError(f"event field name {key!r} is reserved")
            packed.append((key, serializer.encode(value, f"event field {key!r}")))
        self._context.sized(b"".join(value for _, value in packed), f"event {event!r}")
        self._context.calls.emit(event, packed)
        self._record()

    @property
    def max_payload_bytes(self) -> int | None:
        """Largest msgpack-encoded ``data`` (or custom event) an add takes;
        None: no limit but the server's. It may be changed (validated as the
        argument is: an assignment used to be kept and never applied)."""
        return self._context.payload_limit

    @max_payload_bytes.setter
    def max_payload_bytes(self, value: int | None) -> None:
        self._context.payload_limit = byte_limit("max_payload_bytes", value)

    @property
    def events(self) -> QueueEvents:
        """A QueueEvents of this queue, started on first use, shared by all
        threads. No I/O: to be had at once while the server is away or does
        not answer (its reader connects once the server is there; the
        queue's own setup waits for its next call)."""
        _fork.check()
        return self._context.shared_events()

    def close(self) -> None:
        """Close the shared events reader and the client jobq created.

        A Queue never closed does the same once neither it nor any of its
        Jobs is referenced any more (a Queue made per request), its
        ``events`` included."""
        self._context.close()

