"""The Worker's pool threads: run attempts, and finish them exactly once.

``Runner`` owns the pool threads: each takes an attempt handed over by the
fetcher, builds its Job (a record that cannot be read fails the job, never
the thread), calls the handler and finishes the attempt through the
``Finisher``, whose finishing call may take the worker's next job too; that
job is held (its lock renewed) from the moment the call returns, and runs
on the same thread.
"""

from __future__ import annotations

import logging
import queue as _queue
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from . import _fork, _tracing, serializer
from ._attempt import Attempt, AttemptTable, TakeGate
from ._context import QueueContext
from ._json import printable
from ._sentinel import brief
from ._threads import RetryBackoff, start_thread, wait_event
from .calls import FinishReply, TakeArgs, WorkerScripts
from .connection import is_transient
from .errors import (
    JobCancelledError,
    JobqError,
    JobTimeoutError,
    LockLostError,
    PayloadTooLarge,
    ScriptCode,
    UnrecoverableError,
)
from .job import MAX_STACKTRACES, Job
from .options import Backoff
from .tasks import run_as_current

logger = logging.getLogger("jobq.worker")  # the public module's name, as documented

#: How often a close waiting for handlers still running looks again (and at
#: whether it was forced meanwhile), in seconds.
USER_CODE_POLL = 0.05

#: Seconds a pool thread waiting for work keeps its connection: then it
#: goes back to the pool, where a thread finishing a job finds it (a server
#: whose ``maxclients`` the worker's threads reach connects no more).
IDLE_HOLD = 1.0

#: Longest failed reason and stack trace kept per attempt, in characters.
MAX_REASON = 16 * 1024
MAX_TRACE = 64 * 1024
#: Longest exception class name kept (``Job.exc_type``), in characters.
MAX_EXC_TYPE = 256

Emit = Callable[..., None]


def pool_size(concurrency: int) -> int:
    """Connections of a worker's own pool: one kept by each pool thread, one
    for each handler's calls (progress, logs), and a few for the other
    threads."""
    return 2 * concurrency + 8


def _clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, and encodable as UTF-8 (a lone
    surrogate, as from ``os.fsdecode``, becomes a backslash escape)."""
    if len(text) > limit:
        text = f"{text[:limit]}... ({len(text) - limit} more characters)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


#: The name a class was made with, whatever its metaclass makes of ``__name__``.
_CLASS_NAME = type.__dict__["__name__"]


def type_name(exc: BaseException) -> str:
    """The name of ``exc``'s class: a str, even where a metaclass makes
    ``__name__`` something else, or raise (which failed no attempt: the job
    stalled and ran again)."""
    name: str = _CLASS_NAME.__get__(type(exc))
    return name


def failure_reason(exc: BaseException) -> str:
    """``"<type name>: <str(exc)>"`` (as the last line of a traceback), or
    the type name alone when the message is empty or cannot be read;
    clipped to ``MAX_REASON`` characters."""
    kind = type_name(exc)
    try:
        # str.__str__: a plain str of it (a str subclass returned by __str__
        # may break on use, as its __str__ may)
        text = str.__str__(str(exc))
    except BaseException:  # a broken __str__ must not break the failure path
        return _clip(f"{kind} (its message could not be read)", MAX_REASON)
    return _clip(f"{kind}: {text}" if text else kind, MAX_REASON)


def _span_failed(attempt: Attempt, exc: BaseException, reason: str) -> None:
    """Record a failure on the attempt's span: tracing never costs a job its
    attempt (a span processor that raises is logged)."""
    if attempt.span is None:
        return
    try:
        attempt.span.failed(exc, reason)
    except Exception:
        logger.exception("could not record the failure of job %r on its span", attempt.job_id)


def format_trace(exc: BaseException) -> str:
    """The formatted traceback of ``exc``, clipped to ``MAX_TRACE``."""
    try:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except BaseException:
        text = f"{type_name(exc)} (its traceback could not be formatted)\n"
    return _clip(text, MAX_TRACE)


def _text(value: bytes) -> str:
    return value.decode("utf-8", "replace")


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return default


def retry_delay_ms(job: Job, exc: BaseException, attempt_no: int) -> int:
    """fail.lua's delay: -1 forbids a retry (unrecoverable), else the
    backoff before the next attempt (0 when none is left)."""
    if isinstance(exc, UnrecoverableError):
        return -1
    if attempt_no >= _int(job.opts.get("attempts"), 1):
        return 0
    try:
        backoff = Backoff.parse(job.opts.get("backoff"))
    except (TypeError, ValueError):  # a record written by hand: retry at once
        return 0
    return 0 if backoff is None else round(backoff.delay_for(attempt_no) * 1000)


class _ForkedOff(BaseException):
    """A handler forked and its child came back to the pool thread: the
    attempt is the parent's, so the child finishes nothing, and the thread
    (the child's only one) ends with the handler's exception, if any."""

    def __init__(self, error: BaseException | None) -> None:
        super().__init__()
        self.error = error


class Finisher:
    """Finish attempts (complete or fail), retrying through outages for up
    to a lock duration; the calls are idempotent per lock token, so a retry
    after a lost reply finds its own work done."""

    def __init__(
        self,
        context: QueueContext,
        *,
        table: AttemptTable,
        gate: TakeGate,
        take_args: Callable[[], TakeArgs],
        lock_duration: float,
        max_result_bytes: int | None,
        abandoned: threading.Event,
        emit: Emit,
    ) -> None:
        self._context = context
        self._table = table
        self._gate = gate
        self._take_args = take_args
        self._lock_duration = lock_duration
        self._max_result_bytes = max_result_bytes
        self._abandoned = abandoned
        self._emit = emit
        self._lock = threading.Lock()
        self.done = 0
        self.failed = 0
        self._job_log = logging.getLogger(f"jobq.jobs.{context.name}")
        self._scripts = WorkerScripts(context.run)

    def complete(
        self, attempt: Attempt, result: Any, conn: _HeldConnection | None, chain: bool
    ) -> Attempt | None:
        """Complete a claimed attempt; return the next attempt taken along."""
        job = attempt.job
        assert job is not None
        try:
            packed = serializer.encode(result, "return value")
            limit = self._max_result_bytes
            if limit is not None and len(packed) > limit:
                raise PayloadTooLarge(
                    f"return value encodes to {len(packed)} bytes, over the worker's "
                    f"max_result_bytes={limit}"
                )
        except BaseException as exc:  # an unencodable or oversized result fails the attempt
            return self.fail(attempt, exc, format_trace(exc), conn, chain)
        reply, taken = self._call(
            attempt, conn, chain,
            lambda scripts, take: scripts.complete(job.id, attempt.token, packed, take),
        )
        if reply is None:
            return taken
        if reply.code == ScriptCode.CANCELLED:
            self._cancelled(attempt, reply)
            return taken
        job.return_value = result
        job.attempts_made += 1
        job.finished_on = reply.finished_on
        with self._lock:
            self.done += 1
        if self._job_log.isEnabledFor(logging.INFO):
            self._job_log.info("job %s (%s) completed in %.3f s", printable(job.id),
                               printable(job.name), time.monotonic() - attempt.started)
        self._emit("completed", job, result)
        return taken

    def fail(
        self, attempt: Attempt, exc: BaseException, trace: str, conn: _HeldConnection | None,
        chain: bool,
    ) -> Attempt | None:
        """Fail a claimed attempt (retried or for good); return the next
        attempt taken along."""
        job = attempt.job
        assert job is not None
        attempt_no = job.attempts_made + 1
        reason = failure_reason(exc)
        exc_type = _clip(type_name(exc), MAX_EXC_TYPE)
        _span_failed(attempt, exc, reason)
        delay_ms = retry_delay_ms(job, exc, attempt_no)
        stacktrace = (job.stacktrace + [trace])[-MAX_STACKTRACES:]
        packed = serializer.encode(stacktrace, "stack trace")
        reply, taken = self._call(
            attempt, conn, chain,
            lambda scripts, take: scripts.fail(
                job.id, attempt.token, reason, packed, delay_ms, take, exc_type
            ),
        )
        if reply is None:
            return taken
        if reply.code == ScriptCode.CANCELLED:
            self._cancelled(attempt, reply)
            return taken
        job.attempts_made = attempt_no
        job.failed_reason = reason
        job.exc_type = exc_type
        job.stacktrace = stacktrace
        retrying = reply.code == ScriptCode.RETRYING
        if not retrying:
            job.finished_on = reply.finished_on
        with self._lock:
            self.failed += 1
        # a job failed for good is logged at WARNING, so that it shows when
        # INFO (every job's end) is off
        level = logging.INFO if retrying else logging.WARNING
        if self._job_log.isEnabledFor(level):
            self._job_log.log(
                level,
                "job %s (%s) failed in %.3f s, attempt %d%s: %s", printable(job.id),
                printable(job.name), time.monotonic() - attempt.started, attempt_no,
                ", will retry" if retrying else "", printable(reason),
            )
        self._emit("failed", job, exc)
        return taken

    def _cancelled(self, attempt: Attempt, reply: FinishReply) -> None:
        """The attempt of a job whose cancel was requested ended: the script
        failed it for good with the cancel's reason; tell the listeners."""
        job = attempt.job
        assert job is not None
        reason = reply.reason or "cancelled"
        job.attempts_made += 1
        job.failed_reason = reason
        job.finished_on = reply.finished_on
        with self._lock:
            self.failed += 1
        if self._job_log.isEnabledFor(logging.INFO):  # asked for: not a warning
            self._job_log.info("job %s (%s) cancelled: %s", printable(job.id),
                               printable(job.name), printable(reason))
        error = JobCancelledError(job.id, reason)
        _span_failed(attempt, error, reason)
        self._emit("failed", job, error)

    def _call(
        self,
        attempt: Attempt,
        conn: _HeldConnection | None,
        chain: bool,
        send: Callable[[WorkerScripts, TakeArgs | None], FinishReply],
    ) -> tuple[FinishReply | None, Attempt | None]:
        """Send a finishing call until it is answered; (the reply when the
        call finished the attempt, else None; the attempt taken along)."""
        take = self._take_args() if chain and self._gate.begin() else None
        scripts = self._scripts if conn is None else conn.scripts
        deadline = time.monotonic() + self._lock_duration
        backoff: RetryBackoff | None = None
        ambiguous = False
        taken: Attempt | None = None
        try:
            while True:
                try:
                    reply = send(scripts, take)
                    break
                except Exception as exc:
                    # any failure is tried again until the deadline: the call
                    # is idempotent per token, and giving up leaves the job
                    # to stall (a client library's own failure during a slot
                    # migration, a desynchronised reply, are seen here). A
                    # server away or busy (BUSY) is waited for while the lock
                    # lives: renewals that got through meanwhile extended it.
                    until = deadline
                    if is_transient(exc) and not attempt.lost:
                        until = max(deadline, attempt.renewed + self._lock_duration)
                    if time.monotonic() >= until:
                        logger.error("could not finish job %r: %s", attempt.job_id, brief(exc))
                        self._emit("error", exc)
                        return None, None
                    if not is_transient(exc):
                        logger.warning("finishing job %r failed (%s: %s); trying again",
                                       attempt.job_id, type(exc).__name__, exc)
                        if conn is not None:
                            conn.reset()  # its replies may be out of step
                    elif backoff is None:  # said once: a job held up is never silent
                        logger.warning("finishing job %r failed (%s); trying again while "
                                       "its lock lives", attempt.job_id, brief(exc))
                    # resent with the same take token: a lost reply's take
                    # comes back with the retry (see and_take_next)
                    ambiguous = True
                    backoff = backoff or RetryBackoff(cap=1.0)
                    if wait_event(self._abandoned, backoff.next()):
                        return None, None
            if reply.next is not None and reply.next.taken is not None:
                taken = Attempt(*reply.next.taken)
                self._table.add(taken)  # held from the moment the call returns
        finally:
            self._table.discard(attempt)
            if take is not None:
                self._gate.end()
        code = reply.code
        if code == ScriptCode.LOCK_LOST or (code == ScriptCode.JOB_MISSING and not ambiguous):
            if attempt.job is not None:
                attempt.job.cancelled.set()
            error = LockLostError(
                f"job {attempt.job_id!r} was taken over or removed; this worker's result "
                "is discarded"
            )
            logger.warning("%s", error)
            self._emit("error", error)
            return None, taken
        return reply, taken


class _HeldConnection:
    """A pool thread's own connection of the worker's pool, taken at its
    first call (the server may be away when the thread starts)."""

    def __init__(self, context: QueueContext) -> None:
        self._context = context
        self._connection: Any = None
        self.scripts = WorkerScripts(self.run)

    def run(self, script: str, *argv: Any) -> Any:
        """Run a script on the connection (a failed call drops the socket; the
        next one connects again)."""
        if self._connection is None:
            self._connection = self._context.own_connection()
            if self._connection is None:  # closed under us
                return self._context.run(script, *argv)
        return self._context.run_on(self._connection, script, *argv)

    def reset(self) -> None:
        """Drop the socket (the next call connects again)."""
        if self._connection is not None:
            self._connection.disconnect()

    def release(self) -> None:
        """Give the connection back to the pool."""
        connection, self._connection = self._connection, None
        self._context.release(connection)


class Runner:
    """The pool: ``concurrency`` threads running attempts handed over."""

    def __init__(
        self,
        context: QueueContext,
        *,
        concurrency: int,
        worker_name: str,
        table: AttemptTable,
        slots: threading.Semaphore,
        finisher: Finisher,
        handler_for: Callable[[Job], Callable[[Job], Any]],
        emit: Emit,
        has_listener: Callable[[str], bool],
        on_tick: Callable[[str], None] | None = None,
    ) -> None:
        self._context = context
        self.on_tick = on_tick  # a scheduler's tick job was taken
        self._concurrency = concurrency
        self._worker_name = worker_name
        self._table = table
        self._slots = slots
        self._finisher = finisher
        self._handler_for = handler_for
        self._emit = emit
        self._has_listener = has_listener
        self._work: _queue.SimpleQueue[Attempt | None] = _queue.SimpleQueue()
        self._in_user_code: set[str] = set()
        # the worker's own pool (see pool_size) has room for it
        self._hold = context.can_hold(concurrency, pool_size(concurrency) - concurrency)
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        """Start the pool threads."""
        q = self._context.name
        self.threads = []  # each as it starts: a start that fails part of the way stops them
        for i in range(self._concurrency):
            self.threads.append(start_thread(f"jobq-worker-{q}-{i}", self._pool))

    def submit(self, attempt: Attempt) -> None:
        """Hand an attempt (held in the table) to a free pool thread."""
        self._work.put(attempt)

    def stop(self) -> None:
        """Let each pool thread end once it is idle."""
        for _ in self.threads:
            self._work.put(None)

    def in_user_code(self, thread: threading.Thread) -> bool:
        """Whether a pool thread is inside a handler now."""
        return thread.name in self._in_user_code

    def wait_user_code(self, deadline: float | None, give_up: Callable[[], bool]) -> None:
        """Wait until no pool thread is inside a handler (the handler of an
        attempt that timed out runs on), until ``deadline`` (None: for as
        long as it takes) or ``give_up()``."""
        while not give_up():
            busy = [t for t in self.threads if self.in_user_code(t) and t.is_alive()]
            left = USER_CODE_POLL if deadline is None else deadline - time.monotonic()
            if not busy or left <= 0:
                return
            busy[0].join(min(left, USER_CODE_POLL))  # its handler may return, but not the thread

    def timed_out(self, attempt: Attempt) -> None:
        """Fail an attempt that ran past its timeout (claimed already); its
        handler keeps its pool slot until it returns."""
        assert attempt.deadline is not None
        seconds = attempt.deadline - attempt.started
        error = JobTimeoutError(f"job {attempt.job_id!r} timed out after {seconds:g} s")
        self._finisher.fail(attempt, error, f"{type(error).__name__}: {error}\n", None, False)

    def _pool(self) -> None:
        conn = _HeldConnection(self._context) if self._hold else None
        try:
            while True:
                try:
                    attempt = self._work.get(timeout=IDLE_HOLD)
                except _queue.Empty:  # idle: its connection goes back to the pool
                    if conn is not None:
                        conn.release()
                    attempt = self._work.get()
                if attempt is None:
                    return
                try:
                    while attempt is not None:
                        attempt = self._serve(attempt, conn)
                except _ForkedOff as off:  # this thread ends: in the child, its only one
                    if off.error is not None:
                        raise off.error from None  # sys.exit() ends the child
                    return
                finally:
                    self._slots.release()
        finally:
            if conn is not None and not _fork.forked_off():
                conn.release()

    def _serve(self, attempt: Attempt, conn: _HeldConnection | None) -> Attempt | None:
        """Run one attempt; return the next one taken along, if any. Never
        raises: a failure of jobq's own making is logged, and the job is
        left to be recovered as stalled. While tracing is on, the attempt's
        span covers the handler and the finishing call."""
        try:
            job = self._prepare(attempt)
            hook = _tracing.hook
            if hook is not None:
                flat = attempt.record
                attempt.span = hook.attempt(
                    job, _tracing.record_field(flat, _tracing.FIELD),
                    _tracing.record_field(flat, b"sch") is not None,
                )
            self._emit("active", job)
            name = threading.current_thread().name
            self._in_user_code.add(name)
            try:
                if attempt.error is not None:
                    raise attempt.error
                result = run_as_current(job, self._handler_for(job))
            except BaseException as exc:  # whatever the handler raised fails the attempt only
                if _fork.forked_off():  # in a child the handler forked: not the parent's job's end
                    raise _ForkedOff(exc) from None
                self._in_user_code.discard(name)
                job._token = None  # its handler is done: see Job.update_progress
                trace = format_trace(exc)
                if self._table.claim(attempt):
                    return self._finisher.fail(attempt, exc, trace, conn, True)
                return None
            if _fork.forked_off():
                raise _ForkedOff(None)
            self._in_user_code.discard(name)
            job._token = None  # its handler is done: see Job.update_progress
            if self._table.claim(attempt):
                return self._finisher.complete(attempt, result, conn, True)
            logger.info("job %r returned after its attempt ended; result discarded", job.id)
            return None
        except _ForkedOff:
            raise
        except BaseException as exc:
            logger.exception("worker failed to run job %r; it will be recovered as stalled",
                             attempt.job_id)
            self._table.discard(attempt)
            self._emit("error", exc)
            return None
        finally:
            if attempt.span is not None and not _fork.forked_off():
                attempt.span.end()

    def _progress(self, job: Job, value: Any) -> None:
        """A handler's ``update_progress``: to the worker's ``progress``
        listeners of the moment (one added during the job hears the rest)."""
        if self._has_listener("progress"):
            self._emit("progress", job, value)

    def _prepare(self, attempt: Attempt) -> Job:
        """Build the attempt's Job from the record its take returned; a record
        that cannot be read makes the attempt fail with the reason."""
        flat = attempt.record
        record = dict(zip(flat[::2], flat[1::2], strict=False))
        read: Job | None = None
        try:
            job = read = Job.from_record(self._context, attempt.job_id, record)
            if job._unreadable:  # a listing shows such a job; a worker does not run it
                raise ValueError("; ".join(job._unreadable))
            job.data  # noqa: B018 - decoded here: data that cannot be fails the attempt
            timeout = job.opts.get("timeout")
            seconds = float(timeout) if timeout else None
        except Exception as exc:
            name = (record.get(b"name") or b"").decode("utf-8", "replace")
            job = Job(self._context, attempt.job_id, name)
            job.attempts_made = _int(record.get(b"atm"), 0)
            if read is not None:  # its options (attempts, backoff) and stack traces count
                job.opts, job.stacktrace = read.opts, read.stacktrace
            attempt.error = exc if isinstance(exc, JobqError) else JobqError(
                f"job record of {attempt.job_id!r} cannot be read: {failure_reason(exc)}"
            )
            seconds = None
        if b"cx" in record and attempt.error is None:  # cancelled before the take
            attempt.error = JobCancelledError(job.id, _text(record[b"cx"]))
            attempt.stop = True
        sid = record.get(b"sch")
        if sid is not None and self.on_tick is not None:  # the maintenance thread syncs it
            self.on_tick(_text(sid))
        job.processed_by = self._worker_name
        job._token = attempt.token
        job._on_progress = self._progress
        attempt.job = job
        if attempt.stop:  # a cancel (or a lost lock) that came before the Job
            job.cancelled.set()
        if seconds:
            self._table.set_deadline(attempt, seconds)
        return job
