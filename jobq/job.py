"""Job: one unit of work, its record, and the ways to wait for it."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from . import serializer
from ._job_flow import Dependencies, JobFlow
from ._job_record import UserValue, load_record, text
from ._job_waits import JobWaits
from .errors import JobNotFoundError, script_error
from .options import JobOptions, flag, list_index

if TYPE_CHECKING:
    from ._context import QueueContext

__all__ = ["Dependencies", "Job", "STATES"]

#: Every state a job can be in, as ``get_state`` reports it.
STATES = ("waiting", "delayed", "active", "completed", "failed", "waiting-children")

#: At most this many stack traces are kept per job, newest last.
MAX_STACKTRACES = 10


#: Guards the lazy creation of a Job's ``cancelled`` event (the worker's
#: threads and the handler may ask for it at once); new in a forked child.
_CANCELLED_LOCK = threading.Lock()


def _new_lock_after_fork() -> None:
    global _CANCELLED_LOCK
    _CANCELLED_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_after_fork)


class Job(JobFlow, JobWaits):
    """A job of a queue, as last read from Redis.

    Attributes mirror the job's record: ``id``, ``name``, ``data``, ``opts``,
    ``timestamp``, ``delay``, ``priority``, ``attempts_made``,
    ``stalled_counter``, ``progress``, ``return_value``, ``failed_reason``,
    ``exc_type`` (the type name of the exception that failed the last attempt),
    ``stacktrace``, ``processed_on``, ``finished_on``, ``processed_by``,
    ``parent`` (``(queue, id)`` of its parent in a flow, or None).
    Times are epoch seconds (server clock); durations are seconds. Two Job
    objects of one job (its id, queue and prefix) are equal and hash alike.
    ``data``, ``return_value`` and ``progress`` are decoded when first read:
    a value that cannot be decoded here raises ``SerializationError`` there.
    A number field that is not a number (a record written by hand, or by
    another version) reads as absent, as the scripts read it; a worker
    fails such a job with the reason rather than run it.

    Inside a processor, ``cancelled`` is set when the job was cancelled
    (``Queue.cancel``), the attempt timed out or the worker lost the job's
    lock: a cooperative handler may stop early.
    """

    data = UserValue()
    return_value = UserValue()
    progress = UserValue()

    def __init__(
        self,
        context: QueueContext,
        job_id: str,
        name: str,
        data: Any = None,
        opts: Mapping[str, Any] | None = None,
        timestamp: float | None = None,
    ) -> None:
        self._context = context
        self.id = job_id
        self.name = name
        self.data = data
        self.opts: dict[str, Any] = dict(opts or {})
        self.timestamp = timestamp
        self.delay: float = float(self.opts.get("delay", 0.0))
        self.priority: int = int(self.opts.get("priority", 0))
        self.attempts_made = 0
        self.stalled_counter = 0
        self.progress = None
        self.return_value = None
        self.failed_reason: str | None = None
        self.exc_type: str | None = None
        self.stacktrace: list[str] = []
        self.processed_on: float | None = None
        self.finished_on: float | None = None
        self.processed_by: str | None = None
        #: the parent in a flow, ``(queue name, job id)``, or None
        self.parent: tuple[str, str] | None = None
        self._cancelled: threading.Event | None = None  # made on first use
        self._token: str | None = None
        self._unreadable: tuple[str, ...] = ()  # its record's non-numbers (load_record)
        self._ready_at: float | None = None  # ready, or due when delayed (s)
        # the token of this run of the job (the id of its `added` event in
        # stream mode; "#<n>" after the n-th retry), from `add`, `retry` or
        # the record: waits answer for it (or a later generation) alone
        self._run: str | None = None
        # whether this process began that run (add, retry) and made no wait
        # on it since: its first wait may skip the record (the reader sees
        # every event of the run; else a retry made elsewhere may have begun
        # a later generation: see _waiters.py)
        self._fresh = False
        # Set by a worker: its local ``progress`` listeners.
        self._on_progress: Callable[[Job, Any], None] | None = None

    @classmethod
    def from_record(cls, context: QueueContext, job_id: str, record: Mapping[bytes, bytes]) -> Job:
        """Build a Job from its Redis hash."""
        job = cls(context, job_id, text(record.get(b"name")) or "")
        load_record(job, record)
        return job

    def __repr__(self) -> str:
        return f"<Job {self.id!r} name={self.name!r} queue={self.queue_name!r}>"

    def __eq__(self, other: object) -> bool:
        """Whether ``other`` is the same job (its id, queue and prefix),
        however either was read: ``job in queue.get_jobs(...)`` works."""
        if not isinstance(other, Job):
            return NotImplemented
        return self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    def _identity(self) -> tuple[str, str, str]:
        return self._context.prefix, self._context.queue_name, self.id

    @property
    def queue_name(self) -> str:
        """The name of the job's queue (of a sharded queue: its name, not the shard's)."""
        return self._context.queue_name

    @property
    def cancelled(self) -> threading.Event:
        """Set when the running attempt is told to stop (cancel, timeout or
        lost lock); a cooperative handler waits on it or checks it. Made on
        first use: a producer adding thousands of jobs makes none."""
        event = self._cancelled
        if event is None:
            with _CANCELLED_LOCK:
                if self._cancelled is None:
                    self._cancelled = threading.Event()
                event = self._cancelled
        return event

    def is_cancelled(self) -> bool:
        """Whether the running attempt was told to stop (cancel, timeout or lost lock)."""
        return self._cancelled is not None and self._cancelled.is_set()

    # -- reading ----------------------------------------------------------

    def get_state(self) -> str:
        """The job's current state, or ``"unknown"`` when it does not exist."""
        state = self._context.redis.hget(self._context.keys.job(self.id), "state")
        return text(state) or "unknown"

    def refresh(self) -> Job:
        """Re-read the job's record; return self.

        Raises:
            JobNotFoundError: the job no longer exists.
        """
        record = self._context.redis.hgetall(self._context.keys.job(self.id))
        if not record:
            raise JobNotFoundError(self.id)
        load_record(self, record)
        return self

    def get_logs(self, start: int = 0, end: int = -1) -> list[str]:
        """The job's log lines from ``start`` to ``end`` (inclusive, like LRANGE)."""
        lines = self._context.redis.lrange(
            self._context.keys.logs(self.id), list_index("start", start), list_index("end", end))
        return [line.decode("utf-8", "replace") for line in lines]

    # -- changing ---------------------------------------------------------

    def _checked(self, code: int, action: str) -> int:
        if code < 0:
            raise script_error(code, self.id, action)
        return code

    def remove(self, *, remove_children: bool = True) -> bool:
        """Remove the job (with its children: see ``Queue.remove``); False if
        it is gone already.

        Raises:
            JobqError: the job, or one of the children it would remove, is
                active with its lock held (cancel it).
        """
        from ._queue_ops import remove_job

        return remove_job(self._context, self.id, remove_children)

    def cancel(self, reason: str | None = None) -> bool:
        """Cancel the job (see ``Queue.cancel``); False when it is finished or gone."""
        from ._cancel import cancel_job

        return cancel_job(self._context, self.id, reason)

    def retry(self, state: str = "failed", *, reset_attempts: bool = False) -> None:
        """Move a failed (or completed) job back to waiting (a parent with
        children pending to waiting-children).

        The job keeps ``attempts_made``, ``stalled_counter`` and its stack
        traces (as in BullMQ), so a job that used up its attempts gets one
        more; ``reset_attempts=True`` clears all three and gives it its whole
        set of attempts again. A wait on this ``Job`` after the retry is for
        the retried job's outcome, never the one that ended it before.

        Raises:
            JobqError: the job is not in that state.
        """
        if state not in ("failed", "completed"):
            raise ValueError(f"state must be 'failed' or 'completed', not {state!r}")
        reset_attempts = flag("reset_attempts", reset_attempts)
        moved, run = self._context.calls.retry(state, 1, reset_attempts, [self.id])
        self._checked(moved, "retry")
        # the retry began the run's next generation: waits from now on are
        # for it (or a later one), never for the outcome before the retry.
        # The next wait still reads the record first: that generation may
        # have ended in this very call (a parent a child still fails) and
        # begun again since (reopened by that child's retry), while the
        # reader has yet to read the end; taken as unseen, the wait took it
        self._run = run or self._run
        self._fresh = False

    def promote(self) -> None:
        """Run a delayed job now.

        Raises:
            JobNotFoundError: no such job.  JobqError: the job is not delayed.
        """
        self._checked(self._context.calls.promote(self.id), "promote")
        self.delay = 0.0

    def change_delay(self, delay: float) -> None:
        """Reschedule a delayed job to run ``delay`` seconds from now.

        Raises:
            JobNotFoundError: no such job.  JobqError: the job is not delayed.
        """
        opts = JobOptions.parse({"delay": delay})
        code = self._context.calls.change_delay(self.id, round(opts.delay * 1000))
        self._checked(code, "change_delay")
        self.delay = opts.delay

    def change_priority(self, priority: int = 0, *, lifo: bool = False) -> None:
        """Change the job's priority (0: none; 1 is the most urgent).

        Raises:
            JobNotFoundError: no such job.
        """
        JobOptions.parse({"priority": priority, "lifo": lifo})
        code = self._context.calls.change_priority(self.id, priority, lifo)
        self._checked(code, "change_priority")
        self.priority = priority

    def update_data(self, data: Any) -> None:
        """Replace the job's data.

        Raises:
            SerializationError: data is not msgpack-encodable.
            JobNotFoundError: no such job.
            LockLostError: in a handler, its attempt no longer owns the job
                (see ``update_progress``).
        """
        packed = self._context.sized(serializer.encode(data, "data"), "job data")
        code = self._context.calls.update_job(self.id, "data", packed, token=self._token)
        self._checked(code, "update_data")
        self.data = data

    def update_progress(self, value: Any) -> None:
        """Record the job's progress (any msgpack value) and emit ``progress``.

        Raises:
            SerializationError: value is not msgpack-encodable.
            JobNotFoundError: no such job.
            LockLostError: in a handler, its attempt no longer owns the job
                (it timed out, or its lock expired and another worker took
                the job over): nothing is written, as its late result is
                discarded. The same holds for ``update_data`` and ``log``.
                Once the handler returned or raised, its Job writes as any
                other (a worker's ``completed`` listener may log).
        """
        packed = self._context.sized(serializer.encode(value, "progress"), "progress")
        code = self._context.calls.update_job(self.id, "progress", packed, token=self._token)
        self._checked(code, "update_progress")
        self.progress = value
        if self._on_progress is not None:
            self._on_progress(self, value)

    def log(self, message: str, *, keep: int = 0) -> int:
        """Append a line to the job's log; keep the newest ``keep`` (0: all).

        Returns:
            The number of lines in the log.

        Raises:
            LockLostError: in a handler, its attempt no longer owns the job
                (see ``update_progress``).
        """
        line = _log_line(self._context, message)
        list_index("keep", keep, minimum=0)
        code = self._context.calls.update_job(self.id, "log", line, keep, token=self._token)
        return self._checked(code, "log")


def _log_line(context: QueueContext, message: Any) -> bytes:
    """A log message as stored: UTF-8 text within the payload limit."""
    if not isinstance(message, str):
        raise TypeError(f"log message must be a str, not {type(message).__name__}")
    try:
        return context.sized(message.encode("utf-8"), "log line")
    except UnicodeEncodeError as exc:  # a lone surrogate
        raise ValueError(f"log message is not valid text: {exc}") from None
