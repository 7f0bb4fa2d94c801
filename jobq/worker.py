"""Worker: take jobs from a queue and run them in a pool of threads."""

from __future__ import annotations

import itertools
import logging
import os
import queue as _queue
import signal
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Mapping
from types import FrameType
from typing import TYPE_CHECKING, Any

from . import serializer
from ._checks import warn_if_evicting
from ._context import QueueContext
from ._threads import RetryBackoff, join_all, start_thread
from .connection import (
    BLOCK_CAP,
    TRANSIENT_ERRORS,
    Blocked,
    Client,
    blocking_client,
    client_id,
    close_client,
    unblock,
)
from .errors import (
    JOB_MISSING,
    LOCK_LOST,
    ClosedError,
    JobTimeoutError,
    LockLostError,
    PayloadTooLarge,
    SerializationError,
    UnrecoverableError,
)
from .events import Event
from .job import MAX_STACKTRACES, Job
from .listeners import Listener, ListenerRegistry
from .options import Backoff, byte_limit
from .registry import DEFAULT_HEARTBEAT_TTL, announce, withdraw

if TYPE_CHECKING:
    from types import TracebackType

    from .queue_events import QueueEvents

__all__ = ["Worker"]

logger = logging.getLogger(__name__)

Processor = Callable[[Job], Any]
_CHANNEL_EVENTS = frozenset({"drained", "stalled"})
#: Stalled jobs recovered per script call.
STALLED_BATCH = 1000


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
    return float(value)


class _Attempt:
    """One run of one job by this worker, keyed by its lock token."""

    __slots__ = ("job", "token", "deadline", "claimed", "error", "started", "chain", "next")

    def __init__(self, job: Job, token: str, deadline: float | None) -> None:
        self.job = job
        self.token = token
        self.deadline = deadline
        self.claimed = False  # finalised (or being finalised): exactly once
        self.error: BaseException | None = None  # raised instead of running
        self.started = time.monotonic()
        self.chain = False  # finalising may take the worker's next job too
        self.next: tuple[str, Any] | None = None  # (token, moveToActive reply)


class Worker:
    """Run a queue's jobs in a pool of ``concurrency`` threads.

    Args:
        queue_name: the queue to take jobs from.
        processor: ``processor(job) -> result``, or a dict routing job names
            to such callables.
        connection: as for Queue.
        prefix: the queue's key prefix.
        concurrency: jobs run at once, each in its own pool thread.
        name: this worker's name (recorded as ``processed_by``).
        lock_duration: seconds a job's lock lasts; renewed every half of it.
        stalled_interval: seconds between checks for jobs of dead workers.
        max_stalled_count: stalls a job may have before it fails.
        drain_delay: longest idle time between two looks at the queue.
        limiter: ``{"max": n, "duration": s}``, shared by all workers.
        autorun: start at once (as ``start()``).
        max_result_bytes: largest msgpack-encoded return value (default
            1 MiB); a larger one fails the attempt with ``PayloadTooLarge``.
            None for no limit but the server's.
        heartbeat_ttl: seconds the worker's announcement in the registry
            (``Queue.get_workers()``) outlives its last heartbeat; it beats
            every third of that.
    """

    def __init__(
        self,
        queue_name: str,
        processor: Processor | Mapping[str, Processor],
        *,
        connection: object = None,
        prefix: str = "jobq",
        concurrency: int = 1,
        name: str | None = None,
        lock_duration: float = 30,
        stalled_interval: float = 30,
        max_stalled_count: int = 1,
        drain_delay: float = 5,
        limiter: Mapping[str, float] | None = None,
        autorun: bool = False,
        max_result_bytes: int | None = 1024 * 1024,
        heartbeat_ttl: float = DEFAULT_HEARTBEAT_TTL,
    ) -> None:
        if isinstance(processor, Mapping):
            bad = [k for k, v in processor.items() if not isinstance(k, str) or not callable(v)]
            if bad or not processor:
                raise TypeError("processor dict must map job names to callables")
            self._routes: dict[str, Processor] | None = dict(processor)
            self._processor: Processor | None = None
        elif callable(processor):
            self._routes, self._processor = None, processor
        else:
            raise TypeError("processor must be a callable or a dict of callables")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be an int >= 1, not {concurrency!r}")
        if (
            isinstance(max_stalled_count, bool)
            or not isinstance(max_stalled_count, int)
            or max_stalled_count < 0
        ):
            raise ValueError(f"max_stalled_count must be an int >= 0, not {max_stalled_count!r}")
        self._lock_duration = _positive("lock_duration", lock_duration)
        self._stalled_interval = _positive("stalled_interval", stalled_interval)
        self._drain_delay = _positive("drain_delay", drain_delay)
        self._limit = (0, 0)
        if limiter is not None:
            unknown = set(limiter) - {"max", "duration"}
            count = limiter.get("max")
            if unknown or isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError("limiter must be {'max': int >= 1, 'duration': seconds}")
            self._limit = (count, max(1, round(_positive("limiter duration",
                                                          limiter.get("duration")) * 1000)))
        self.max_result_bytes = byte_limit("max_result_bytes", max_result_bytes)
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"name must be a non-empty str, not {name!r}")
        self.concurrency = concurrency
        self.max_stalled_count = max_stalled_count
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._context = QueueContext(queue_name, connection, prefix, "worker")
        self._listeners = ListenerRegistry()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._attempts: dict[str, _Attempt] = {}  # not yet finalised, by token
        self._takes = 0  # next-job takes under way inside complete / fail calls
        # lock tokens: unique per attempt (a counter) and per worker (random)
        self._token_base = uuid.uuid4().hex[:16]
        self._token_seq = itertools.count()
        # per thread: a pool thread's own connection for finishing calls,
        # when the client's pool has room for one per pool thread
        self._local = threading.local()
        self._hold_connections = self._context.can_hold(concurrency)
        self._busy_threads: set[str] = set()  # pool threads inside user code
        self._slots = threading.Semaphore(concurrency)
        self._work: _queue.SimpleQueue[_Attempt | None] = _queue.SimpleQueue()
        self._stop_fetch = threading.Event()
        self._stop_all = threading.Event()
        self._wake_locks = threading.Event()
        self._resumed = threading.Event()
        self._resumed.set()
        self._fetching = threading.RLock()  # held while the fetch loop may take a job
        self._closed = threading.Event()
        self._close_requested = threading.Event()
        self._force = threading.Event()
        self._abandoned = False  # after close: finalise nothing
        self._started = False
        self._closing = False
        self._threads: list[threading.Thread] = []
        self._pool: list[threading.Thread] = []
        self._events: QueueEvents | None = None
        self._blocked_id: Blocked | None = None  # the fetch connection
        self._heartbeat_ttl = _positive("heartbeat_ttl", heartbeat_ttl)
        self._announced_queues: tuple[str, ...] = (queue_name,)  # the CLI names all it serves
        self._jobs_done = 0
        self._jobs_failed = 0
        # one line per job, per queue: logging.getLogger("jobq.jobs.<queue>")
        self._job_log = logging.getLogger(f"jobq.jobs.{queue_name}")
        if autorun:
            self.start()

    # -- public -----------------------------------------------------------

    @property
    def queue_name(self) -> str:
        """The queue this worker serves."""
        return self._context.name

    def __repr__(self) -> str:
        if self._closed.is_set():
            state = "closed"
        else:
            state = "running" if self._started else "idle"
        return f"<Worker {self.name!r} queue={self.queue_name!r} {state}>"

    def start(self) -> Worker:
        """Start fetching and running jobs in background threads; return self."""
        with self._lock:
            if self._closed.is_set() or self._closing:
                raise ClosedError(f"worker {self.name!r} is closed")
            if self._started:
                return self
            self._started = True
        q = self.queue_name
        self._pool = [
            start_thread(f"jobq-worker-{q}-{i}", self._pool_loop) for i in range(self.concurrency)
        ]
        self._threads = [
            start_thread(f"jobq-fetch-{q}", self._fetch_loop),
            start_thread(f"jobq-locks-{q}", self._locks_loop),
            start_thread(f"jobq-stalled-{q}", self._stalled_loop),
        ]
        if any(self._listeners.has(e) for e in _CHANNEL_EVENTS):
            self._ensure_events()
        return self

    def run(self) -> None:
        """Run until ``close()``; SIGINT / SIGTERM in the main thread close gracefully
        (a second signal forces)."""
        previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            # before start(): a signal once jobs may run must close gracefully
            for signum in (signal.SIGINT, signal.SIGTERM):
                previous[int(signum)] = signal.signal(signum, self._on_signal)
        try:
            self.start()
            while not self._close_requested.wait(0.5) and not self._closed.is_set():
                pass
            self.close(force=self._force.is_set())
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._close_requested.is_set():
            logger.warning("second signal %d: closing worker %r at once", signum, self.name)
            # no lock here: the main thread may hold it (close() polls _force)
            self._force.set()
        else:
            logger.info("signal %d: closing worker %r gracefully", signum, self.name)
        self._close_requested.set()

    def is_running(self) -> bool:
        """Whether the worker was started and is not closed."""
        return self._started and not self._closed.is_set() and not self._closing

    def pause(self) -> None:
        """Stop taking jobs in this worker; jobs in flight finish. Emits ``paused``."""
        if self._resumed.is_set():
            self._resumed.clear()
            with self._fetching:  # a take already under way ends before we return
                pass
            with self._idle:
                self._idle.wait_for(lambda: self._takes == 0, timeout=self._lock_duration)
            self._listeners.emit("paused")

    def resume(self) -> None:
        """Take jobs again after ``pause()``. Emits ``resumed``."""
        if not self._resumed.is_set():
            self._resumed.set()
            self._listeners.emit("resumed")

    def is_paused(self) -> bool:
        """Whether this worker is paused (see ``pause``)."""
        return not self._resumed.is_set()

    def on(self, event: str, callback: Listener) -> Listener:
        """Call ``callback`` on each local ``event``; see SPEC for their arguments."""
        self._listeners.on(event, callback)
        self._maybe_events(event)
        return callback

    def once(self, event: str, callback: Listener) -> Listener:
        """Call ``callback`` on the next local ``event`` only."""
        self._listeners.once(event, callback)
        self._maybe_events(event)
        return callback

    def off(self, event: str, callback: Listener) -> bool:
        """Remove a listener; False if it was not registered."""
        return self._listeners.off(event, callback)

    def listener_count(self, event: str | None = None) -> int:
        """Listeners of ``event`` (every listener when None)."""
        return self._listeners.count(event)

    def close(self, timeout: float | None = None, force: bool = False) -> None:
        """Stop taking jobs, let jobs in flight finish, join every thread.

        Args:
            timeout: seconds to wait for jobs in flight; past it they are
                abandoned (no ``failed``; they are recovered as stalled).
            force: abandon jobs in flight at once.

        Called from a handler, it starts the close in the background and
        returns at once.
        """
        if threading.current_thread() in self._pool:
            # called by a handler: closing here would wait for that handler
            start_thread(f"jobq-closer-{self.queue_name}", lambda: self.close(timeout, force))
            return
        with self._lock:
            if self._closing:
                already = True
            else:
                already = False
                self._closing = True
        if already:
            if force:  # escalate a graceful close under way
                self._force.set()
                with self._idle:
                    self._idle.notify_all()
            self._closed.wait(timeout)
            return
        self._listeners.emit("closing")
        self._stop_fetch.set()
        self._resumed.set()
        unblock(self._context.client, self._blocked_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        join_all(self._threads[:1], None if deadline is None else timeout)
        with self._idle:
            while (self._attempts or self._takes) and not (force or self._force.is_set()):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._idle.wait(0.5 if left is None else min(left, 0.5))
            abandoned = list(self._attempts.values())
            self._abandoned = True
        for attempt in abandoned:
            attempt.job.cancelled.set()
        if abandoned:
            logger.warning(
                "worker %r closed with %d job(s) in flight; they will be recovered as stalled",
                self.name, len(abandoned),
            )
        self._stop_all.set()
        self._wake_locks.set()
        for _ in self._pool:
            self._work.put(None)
        join_all(self._threads, 5.0)
        # pool threads still inside user code are left behind (daemon threads)
        idle_pool = [t for t in self._pool if not self._in_user_code(t)]
        join_all(idle_pool, 2.0)
        events, self._events = self._events, None
        if events is not None:
            events.close()
        try:
            withdraw(self._context, self.name)
        except Exception as exc:  # best effort: the announcement expires anyway
            logger.debug("worker %r could not leave the registry: %s", self.name, exc)
        self._context.close()
        self._closed.set()
        self._listeners.emit("closed")

    def _in_user_code(self, thread: threading.Thread) -> bool:
        return thread.name in self._busy_threads

    def __enter__(self) -> Worker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- queue channel events (drained, stalled) --------------------------

    def _maybe_events(self, event: str) -> None:
        if event in _CHANNEL_EVENTS and self._started and not self._closing:
            self._ensure_events()

    def _ensure_events(self) -> None:
        from .queue_events import QueueEvents

        with self._lock:
            if self._events is not None:
                return
            events = QueueEvents(
                self.queue_name, connection=self._context.client, prefix=self._context.prefix
            )
            self._events = events

        def forward(event: Event) -> None:
            if event.name == "drained":
                self._listeners.emit("drained")
            elif event.name == "stalled":
                self._listeners.emit("stalled", event.job_id)

        events.on("drained", forward)
        events.on("stalled", forward)

    # -- fetching ---------------------------------------------------------

    def _fetch_loop(self) -> None:
        backoff = RetryBackoff()
        blocker: Client | None = None
        try:  # the fetch thread's own connection: takes and blocks, never shared
            blocker = blocking_client(self._context.client, f"jobq-fetch-{self.name}")
            self._blocked_id = client_id(blocker, self._context.keys.marker)
            warn_if_evicting(blocker)
        except Exception as exc:  # the loop connects again below
            logger.debug("worker %r: no connection yet: %s", self.name, exc)
            if blocker is not None:
                close_client(blocker)
                blocker = None
        lock_ms = round(self._lock_duration * 1000)
        limit_max, limit_ms = self._limit
        due_at: float | None = None
        last_fetch = 0.0
        need_fetch = True
        ready = False
        while not self._stop_fetch.is_set():
            try:
                if not self._resumed.wait(BLOCK_CAP) or self._stop_fetch.is_set():
                    continue
                if need_fetch or time.monotonic() - last_fetch >= self._drain_delay:
                    if not self._slots.acquire(timeout=BLOCK_CAP):
                        continue
                    with self._fetching:  # pause() waits for a take under way
                        # a slot may free up after close() or pause(): take nothing then
                        if self._stop_fetch.is_set() or not self._resumed.is_set():
                            self._slots.release()
                            continue
                        token = self._new_token()
                        try:
                            if blocker is None:
                                blocker = blocking_client(
                                    self._context.client, f"jobq-fetch-{self.name}"
                                )
                                self._blocked_id = client_id(blocker, self._context.keys.marker)
                            # on the fetch thread's own connection: an idle
                            # worker holds one connection less
                            reply = self._context.scripts.run(
                                "moveToActive", self._context.keys.base, token, lock_ms,
                                self.name, limit_max, limit_ms, client=blocker,
                            )
                        except BaseException:
                            self._slots.release()
                            raise
                    last_fetch = time.monotonic()
                    if not ready:
                        ready = True
                        self._listeners.emit("ready")
                    if reply[0] == 1:
                        self._dispatch(reply[1].decode(), token, reply[2])
                        need_fetch = True
                        backoff.reset()
                        continue
                    self._slots.release()
                    if reply[0] == 2:  # rate limited
                        self._stop_fetch.wait(min(int(reply[1]) / 1000.0, BLOCK_CAP))
                        continue
                    next_ms = int(reply[1])
                    due_at = None if next_ms < 0 else last_fetch + next_ms / 1000.0
                wait = min(BLOCK_CAP, self._drain_delay)
                if due_at is not None:
                    wait = min(wait, due_at - time.monotonic())
                if wait <= 0:
                    need_fetch = True
                    continue
                if blocker is None:
                    blocker = blocking_client(self._context.client, f"jobq-fetch-{self.name}")
                    self._blocked_id = client_id(blocker, self._context.keys.marker)
                popped = blocker.bzpopmin(self._context.keys.marker, wait)
                need_fetch = popped is not None or (
                    due_at is not None and time.monotonic() >= due_at
                )
                backoff.reset()
            except Exception as exc:
                if self._stop_fetch.is_set():
                    break
                self._loop_error("fetch", exc, backoff)
                if blocker is not None:
                    close_client(blocker)
                    blocker = None
                need_fetch = True
        if blocker is not None:
            close_client(blocker)

    def _loop_error(self, loop: str, exc: Exception, backoff: RetryBackoff) -> None:
        delay = backoff.next()
        if backoff.failures <= 3 or backoff.failures % 20 == 0:
            logger.warning(
                "worker %r %s loop failed (%s: %s); retrying in %.2f s",
                self.name, loop, type(exc).__name__, exc, delay,
            )
        self._listeners.emit("error", exc)
        self._stop_all.wait(delay)

    def _dispatch(self, job_id: str, token: str, flat: list[bytes]) -> None:
        self._work.put(self._prepare(job_id, token, flat))

    def _prepare(self, job_id: str, token: str, flat: list[bytes]) -> _Attempt:
        """Register an attempt for a job just taken with ``token``."""
        record = dict(zip(flat[::2], flat[1::2], strict=True))
        error: BaseException | None = None
        try:
            job = Job.from_record(self._context, job_id, record)
        except SerializationError as exc:
            name = (record.get(b"name") or b"").decode("utf-8", "replace")
            job = Job(self._context, job_id, name)
            job.attempts_made = int(record.get(b"atm") or 0)
            error = exc
        job.processed_by = self.name
        job._token = token
        if self._listeners.has("progress"):
            job._on_progress = lambda j, v: self._listeners.emit("progress", j, v)
        timeout = job.opts.get("timeout")
        deadline = time.monotonic() + float(timeout) if timeout else None
        attempt = _Attempt(job, token, deadline)
        attempt.error = error
        with self._lock:
            self._attempts[token] = attempt
        if deadline is not None:
            self._wake_locks.set()
        return attempt

    # -- running ----------------------------------------------------------

    def _pool_loop(self) -> None:
        self._local.pool_thread = True
        try:
            self._pool_jobs()
        finally:
            connection, self._local.connection = getattr(self._local, "connection", None), None
            self._context.release(connection)

    def _pool_connection(self) -> Any:
        """The calling pool thread's own connection (taken on first use), or
        None: off a pool thread, on a cluster, or with a pool too small to
        spare one per pool thread."""
        local = self._local
        if not self._hold_connections or not getattr(local, "pool_thread", False):
            return None
        connection = getattr(local, "connection", None)
        if connection is None:
            connection = local.connection = self._context.own_connection()
        return connection

    def _pool_jobs(self) -> None:
        name = threading.current_thread().name
        while True:
            attempt = self._work.get()
            if attempt is None:
                return
            self._busy_threads.add(name)
            try:
                # finishing a job takes the next one in the same call, which
                # then runs here, on the same slot, without the fetch thread
                while attempt is not None:
                    attempt.chain = True
                    self._run_attempt(attempt)
                    taken, attempt = attempt.next, None
                    if taken is not None:
                        try:
                            reply = taken[1]
                            if int(reply[0]) == 1:
                                attempt = self._prepare(reply[1].decode(), taken[0], reply[2])
                        finally:
                            self._take_done()
            finally:
                self._busy_threads.discard(name)
                self._slots.release()

    def _run_attempt(self, attempt: _Attempt) -> None:
        job = attempt.job
        self._listeners.emit("active", job)
        try:
            if attempt.error is not None:
                raise attempt.error
            result = self._handler_for(job)(job)
        except BaseException as exc:  # any handler failure fails the attempt only
            trace = traceback.format_exc()
            if self._claim(attempt):
                self._fail(attempt, exc, trace)
            return
        if self._claim(attempt):
            self._complete(attempt, result)
        else:
            logger.info("job %r returned after its attempt ended; result discarded", job.id)

    def _handler_for(self, job: Job) -> Processor:
        if self._processor is not None:
            return self._processor
        assert self._routes is not None
        handler = self._routes.get(job.name)
        if handler is None:
            raise UnrecoverableError(f"no processor for job name {job.name!r}")
        return handler

    def _claim(self, attempt: _Attempt) -> bool:
        """Take the right to finalise an attempt; False if it was taken already
        (timed out) or the worker was closed under it."""
        with self._lock:
            if attempt.claimed or self._abandoned:
                return False
            attempt.claimed = True
            return True

    def _release(self, attempt: _Attempt) -> None:
        with self._idle:
            self._attempts.pop(attempt.token, None)
            self._idle.notify_all()

    def _complete(self, attempt: _Attempt, result: Any) -> None:
        job = attempt.job
        try:
            packed = serializer.encode(result, "return value")
            limit = self.max_result_bytes
            if limit is not None and len(packed) > limit:
                raise PayloadTooLarge(
                    f"return value encodes to {len(packed)} bytes, over the worker's "
                    f"max_result_bytes={limit}"
                )
        except SerializationError as exc:
            self._fail(attempt, exc, traceback.format_exc())
            return
        except PayloadTooLarge as exc:
            self._fail(attempt, exc, traceback.format_exc())
            return
        try:
            code = self._finish("complete", attempt, job.id, attempt.token, packed)
        finally:
            self._release(attempt)
        if code is None:
            return
        job.return_value = result
        job.attempts_made += 1
        with self._lock:
            self._jobs_done += 1
        if self._job_log.isEnabledFor(logging.INFO):
            self._job_log.info(
                "job %s (%s) completed in %.3f s", job.id, job.name,
                time.monotonic() - attempt.started,
            )
        self._listeners.emit("completed", job, result)

    def _fail(self, attempt: _Attempt, exc: BaseException, trace: str) -> None:
        job = attempt.job
        attempt_no = job.attempts_made + 1
        attempts = int(job.opts.get("attempts", 1) or 1)
        if isinstance(exc, UnrecoverableError):
            delay_ms = -1
        elif attempt_no < attempts:
            backoff = Backoff.parse(job.opts.get("backoff"))
            delay_ms = 0 if backoff is None else round(backoff.delay_for(attempt_no) * 1000)
        else:
            delay_ms = 0
        reason = str(exc) or type(exc).__name__
        stacktrace = (job.stacktrace + [trace])[-MAX_STACKTRACES:]
        try:
            code = self._finish(
                "fail", attempt, job.id, attempt.token, reason,
                serializer.encode(stacktrace, "stack trace"), delay_ms,
            )
        finally:
            self._release(attempt)
        if code is None:
            return
        job.attempts_made = attempt_no
        job.failed_reason = reason
        job.stacktrace = stacktrace
        with self._lock:
            self._jobs_failed += 1
        if self._job_log.isEnabledFor(logging.INFO):
            self._job_log.log(
                logging.INFO if code == 2 else logging.WARNING,
                "job %s (%s) failed in %.3f s, attempt %d of %d%s: %s", job.id, job.name,
                time.monotonic() - attempt.started, attempt_no, attempts,
                ", will retry" if code == 2 else "", reason,
            )
        self._listeners.emit("failed", job, exc)

    def _finish(self, script: str, attempt: _Attempt, *args: Any) -> int | None:
        """Run a finalising script, retrying connection errors for up to a lock
        duration. Returns its code, or None when the attempt lost its job.

        For a chained attempt the same call also takes the worker's next job
        (``attempt.next``) when the worker may take more.
        """
        take = self._take_args() if attempt.chain else ()
        try:
            code, ambiguous = self._finish_call(script, attempt, args, take)
        finally:
            # a job taken along stays counted until the pool thread has
            # registered it, so that close() and pause() wait for it
            if take and attempt.next is None:
                self._take_done()
        if code is None:
            return None
        job_id = attempt.job.id
        if code == LOCK_LOST or (code == JOB_MISSING and not ambiguous):
            attempt.job.cancelled.set()
            error = LockLostError(
                f"job {job_id!r} was taken over or removed; this worker's result is discarded"
            )
            logger.warning("%s", error)
            self._listeners.emit("error", error)
            return None
        return code

    def _finish_call(
        self, script: str, attempt: _Attempt, args: tuple[Any, ...], take: tuple[Any, ...]
    ) -> tuple[int | None, bool]:
        """(code or None, whether an earlier try may have run) of _finish."""
        job_id = attempt.job.id
        deadline = time.monotonic() + self._lock_duration
        backoff = RetryBackoff(cap=1.0)
        ambiguous = False
        while True:
            try:
                connection = self._pool_connection()
                if connection is None:
                    reply = self._context.run(script, *args, *take)
                else:
                    reply = self._context.run_on(connection, script, *args, *take)
            except TRANSIENT_ERRORS as exc:
                ambiguous = True
                # a retry takes no next job: a lost reply may have taken one
                # already, which then stalls and runs again later
                take = ()
                if time.monotonic() >= deadline or self._stop_all.is_set():
                    logger.error("could not finalise job %r: %s", job_id, exc)
                    self._listeners.emit("error", exc)
                    return None, ambiguous
                self._stop_all.wait(backoff.next())
                continue
            except Exception as exc:
                logger.exception("finalising job %r failed", job_id)
                self._listeners.emit("error", exc)
                return None, ambiguous
            if isinstance(reply, list):  # the next job came along
                attempt.next = (take[0], reply[1])
                return int(reply[0]), ambiguous
            return int(reply), ambiguous

    def _take_args(self) -> tuple[Any, ...]:
        """moveToActive's arguments for taking the next job along with a
        finalising call; none when the worker may take no more jobs."""
        with self._lock:
            if self._stop_fetch.is_set() or not self._resumed.is_set():
                return ()
            self._takes += 1
        limit_max, limit_ms = self._limit
        token = self._new_token()
        return (token, round(self._lock_duration * 1000), self.name, limit_max, limit_ms)

    def _new_token(self) -> str:
        return f"{self._token_base}{next(self._token_seq):x}"

    def _take_done(self) -> None:
        with self._idle:
            self._takes -= 1
            self._idle.notify_all()

    # -- locks and timeouts -----------------------------------------------

    def _locks_loop(self) -> None:
        interval = self._lock_duration / 2
        next_renewal = time.monotonic() + interval
        next_beat = time.monotonic()  # the heartbeat rides on this loop's wake-ups
        first_beat = True
        backoff = RetryBackoff(cap=interval / 2)
        while not self._stop_all.is_set():
            self._wake_locks.clear()  # before looking, so no wake-up is lost
            now = time.monotonic()
            wake = next_renewal
            with self._lock:
                attempts = list(self._attempts.values())
            for attempt in attempts:
                if attempt.deadline is None or attempt.claimed:
                    continue
                if attempt.deadline <= now:
                    self._time_out(attempt)
                else:
                    wake = min(wake, attempt.deadline)
            if now >= next_renewal:
                try:
                    self._renew()
                    backoff.reset()
                    next_renewal = now + interval
                except Exception as exc:
                    self._listeners.emit("error", exc)
                    delay = backoff.next()
                    # bounded logging during an outage: the first few, then every 20th
                    if backoff.failures <= 3 or backoff.failures % 20 == 0:
                        logger.warning(
                            "renewing locks of worker %r failed (%d in a row): %s",
                            self.name, backoff.failures, exc,
                        )
                    next_renewal = now + delay
                wake = min(wake, next_renewal)
            if now >= next_beat:
                if self._heartbeat(first_beat):
                    first_beat = False
                next_beat = now + self._heartbeat_ttl / 3
            wake = min(wake, next_beat)
            self._wake_locks.wait(max(0.0, min(wake - time.monotonic(), BLOCK_CAP)))

    def _heartbeat(self, first: bool) -> bool:
        """Announce this worker in the queue's registry; False if that failed."""
        with self._lock:
            active, done, failed = len(self._attempts), self._jobs_done, self._jobs_failed
        try:
            announce(
                self._context, self.name, self._heartbeat_ttl, queues=self._announced_queues,
                concurrency=self.concurrency, done=done, failed=failed, active=active,
                paused=self.is_paused(), first=first,
            )
        except Exception as exc:
            logger.warning("heartbeat of worker %r failed: %s", self.name, exc)
            return False
        return True

    def _renew(self) -> None:
        with self._lock:
            # an attempt cancelled (lock lost, timed out) is renewed no more
            held = [
                a for a in self._attempts.values() if not a.claimed and not a.job.is_cancelled()
            ]
        if not held:
            return
        args: list[Any] = [round(self._lock_duration * 1000)]
        for attempt in held:
            args.extend((attempt.job.id, attempt.token))
        lost = {t.decode() for t in self._context.run("extendLocks", *args)}
        for attempt in held:
            if attempt.token in lost and not attempt.claimed:
                attempt.job.cancelled.set()
                error = LockLostError(f"lock of job {attempt.job.id!r} was lost")
                logger.warning("%s", error)
                self._listeners.emit("error", error)

    def _time_out(self, attempt: _Attempt) -> None:
        if not self._claim(attempt):
            return
        # the handler still holds its slot: take no next job for it
        attempt.chain = False
        attempt.job.cancelled.set()
        timeout = attempt.job.opts.get("timeout")
        error = JobTimeoutError(f"job {attempt.job.id!r} timed out after {timeout:g} s")
        self._fail(attempt, error, f"{type(error).__name__}: {error}\n")

    # -- stalled jobs -----------------------------------------------------

    def _stalled_loop(self) -> None:
        backoff = RetryBackoff()
        guard_ms = round(self._stalled_interval * 1000)
        while not self._stop_all.is_set():
            try:
                guard = guard_ms
                while True:
                    ids = self._context.run(
                        "stalledCheck", self.max_stalled_count, guard, STALLED_BATCH
                    )
                    if ids:
                        logger.warning(
                            "recovered %d stalled job(s) of %r", len(ids), self.queue_name
                        )
                    if len(ids) < STALLED_BATCH or self._stop_all.is_set():
                        break
                    guard = 0  # more to do in this round
                backoff.reset()
                self._stop_all.wait(self._stalled_interval)
            except Exception as exc:
                if self._stop_all.is_set():
                    break
                self._loop_error("stalled-check", exc, backoff)
