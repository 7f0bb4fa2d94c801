"""QueueEvents: follow a queue's events live, and resolve waiting callers.

The threads live in ``_reader`` (the reader, and the dispatcher that runs
listeners and futures' callbacks); the tracking of waiting callers in
``_waiters``. This module ties them together behind the public API.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Any

from . import _fork
from . import connection as _connection
from ._closing import ClosedOnExit
from ._context import QueueContext
from ._reader import ALL, Dispatcher, EventReader
from ._reader_loop import ReaderLoop
from ._sentinel import brief
from ._threads import BackgroundLoop, join_or_cut, start_thread, wait_event
from ._waiters import CLOSED, Outcome, Waiter, WaiterTable, WakeGate, valid_id, waited_result
from ._waiting import FIRST_LOOK, ThreadWait
from .connection import BLOCK_CAP, UNBLOCK_TIMEOUT
from .errors import ClosedError
from .keys import lookup_id
from .listeners import Listener, ListenerMethods, ListenerRegistry
from .options import blocking_seconds, flag, wait_timeout

__all__ = ["QueueEvents"]

logger = logging.getLogger(__name__)

#: Seconds between looks at the records of every waited-on job, in pipelined
#: batches (the waiting threads' and the futures', on the waker thread), so
#: that an event lost without the reader knowing (a record
#: deleted by hand, FLUSHDB, an eviction) can never leave a waiter hanging.
RECHECK_INTERVAL = 10.0
#: Seconds a close gives its threads once it has cut a reader stuck on a
#: server that does not answer (past the close's own timeout).
CUT_GRACE = 0.5
#: Seconds a closing reader may take to end: its longest block, and a half.
#: One still reading then waits on a server that does not answer.
READ_GRACE = BLOCK_CAP + 0.5


@dataclasses.dataclass
class Shared:
    """What a QueueEvents reads and runs with. A plain one's own; the parts
    of a ShardedQueueEvents (one per shard) share the whole's listeners,
    stop event, dispatcher and threads, and their ``run`` and ``close``
    are the whole's."""

    listeners: ListenerRegistry
    stop: threading.Event
    dispatcher: Dispatcher
    threads: list[threading.Thread]
    run: Callable[[], object] | None
    close: Callable[[float | None], None] | None


class QueueEvents(ListenerMethods, ClosedOnExit):
    """Read a queue's events on a background thread and dispatch them.

    Listeners run on a separate dispatcher thread, in registration order, so a
    slow or raising listener never delays the reader or a waiting caller.

    Args:
        queue_name: the queue to follow.
        connection: as for Queue.
        prefix: the queue's key prefix.
        last_event_id: ``"$"`` from now on, ``"0"`` everything retained, or
            an id to resume after (stream mode; the id of an entry of two
            events, ``added`` and ``waiting``, resumes at it: both again).
        blocking_timeout: longest single blocking read, in seconds (capped
            near 1 s so that ``close()`` is prompt).
        autorun: start reading at once; else call ``run()``.
    """

    def __init__(
        self,
        queue_name: str,
        *,
        connection: object = None,
        prefix: str = "jobq",
        last_event_id: str = "$",
        blocking_timeout: float = 10,
        autorun: bool = True,
    ) -> None:
        if not isinstance(last_event_id, str) or not (
            last_event_id == "$" or valid_id(last_event_id)
        ):
            raise ValueError(
                f"last_event_id must be '$', '0' or a stream id, not {last_event_id!r}"
            )
        blocking_seconds(blocking_timeout)
        flag("autorun", autorun)
        context = QueueContext(queue_name, connection, prefix, "QueueEvents")
        listeners = ListenerRegistry()
        stop = threading.Event()
        dispatcher = Dispatcher(listeners, stop)
        self._setup(context, last_event_id, blocking_timeout,
                    Shared(listeners, stop, dispatcher, [], None, None))
        # start on first use: autorun, or forked while running. No I/O here,
        # so a QueueEvents made at import never touches the server then
        self._restart = flag("autorun", autorun)
        _fork.track(self)

    @classmethod
    def _part_of(cls, context: QueueContext, last_event_id: str, blocking_timeout: float,
                 shared: Shared) -> QueueEvents:
        """The reader of one shard of a ShardedQueueEvents: the whole's
        listeners, threads and life cycle, its own position and waiters (the
        whole's thread reads its events)."""
        part = cls.__new__(cls)
        part._setup(context, last_event_id, blocking_timeout, shared)
        part._restart = False
        return part

    def _setup(self, context: QueueContext, last_event_id: str, blocking_timeout: float,
               shared: Shared) -> None:
        self._context = context
        self._shared = shared
        self._listeners = shared.listeners
        self._stop = shared.stop
        self._lock = threading.Lock()
        self._dispatcher = shared.dispatcher
        block = max(0.01, min(float(blocking_timeout), BLOCK_CAP))
        self._reader = EventReader(
            self._context, last_event_id, self._dispatcher, self._listeners, self._poke_all,
        )
        self._loop = ReaderLoop(self._context, self._reader, block, self._stop,
                                self._dispatcher.error)
        self._table = WaiterTable(self._context, self._reader)
        #: when the waker looks at the futures again, a future's first look
        #: having failed for now (monotonic; None: at the periodic look)
        self._futures_look_at: float | None = None
        self._reader.table = self._table
        self._threads = shared.threads  # filled in place: the parts of a whole share it
        self._started = False

    # -- lifecycle --------------------------------------------------------

    @property
    def name(self) -> str:
        """The queue's name."""
        return self._context.name

    @property
    def prefix(self) -> str:
        """The queue's key prefix."""
        return self._context.prefix

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._stop.is_set()

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("running" if self._started else "idle")
        return f"<QueueEvents {self.name!r} {state}>"

    def run(self) -> QueueEvents:
        """Start the reader (when ``autorun=False``); return self."""
        _fork.check()
        if self._shared.run is not None:
            self._shared.run()
            return self
        with self._lock:
            if self._stop.is_set():
                raise ClosedError(f"QueueEvents {self.name!r} is closed")
            if self._started:
                return self
            self._started = True
            self._restart = False
            self._threads[:] = [
                start_thread(f"jobq-events-{self.name}", self._loop.loop),
                start_thread(f"jobq-dispatch-{self.name}", self._dispatcher.loop),
                start_thread(f"jobq-wake-{self.name}", self._wake_loop),
            ]
        return self

    def wait_until_ready(self, timeout: float | None = None) -> bool:
        """Wait until every event emitted from now on will be delivered."""
        timeout = wait_timeout(timeout)
        _fork.check()
        if not self._started and not self._stop.is_set():
            self.run()  # a shard's part: the whole's run, at each call
        return wait_event(self._reader.ready, timeout) and not self._stop.is_set()

    def close(self, timeout: float | None = 5.0) -> None:
        """Stop reading, fail pending waits with ClosedError, join the threads
        for ``timeout`` at most (see ``close_threads``: on a server that does
        not answer, about two seconds). A listener still running then (user
        code, which nothing can stop) keeps its thread until it returns, as
        a Worker's handler does."""
        timeout = wait_timeout(timeout)
        start = time.monotonic()
        _fork.check()
        if self._shared.close is not None:
            self._shared.close(timeout)
            return
        with self._lock:
            if self._stop.is_set():
                return
            self._stop.set()
        self._reader.stopped()
        for waiter in self._table.close():
            waiter.resolve(CLOSED)
        self._table.gate.stop()
        self._dispatcher.wake()
        self._loop.wake(wake_bound(timeout))
        close_threads(self._threads, left_of(timeout, start), self._loop.interrupt,
                      self._context.close)
        self._table.gate.flush()  # futures the reader answered as the waker stopped
        self._dispatcher.run_left()  # and their done-callbacks not run yet
        self._context.close()

    def _after_fork(self) -> Any:
        """In a forked child: no thread of the parent's is here. Forget what
        they knew and start again on first use (at once when listeners are
        registered, or futures pending: nothing else would start it)."""
        self._lock = threading.Lock()
        self._stop._at_fork_reinit()  # type: ignore[attr-defined]
        self._listeners.after_fork()
        self._dispatcher.after_fork()
        self._reader.after_fork()
        self._loop.after_fork()
        pending = self._table.after_fork()  # futures pending
        was_running = self._started and not self._stop.is_set()
        self._started = False
        self._threads.clear()
        self._restart = was_running
        # (not when a handler or listener forked, on a thread of jobq's: that
        # child is its own, and the parent's listeners are not its work)
        if was_running and (self._listeners.has_any() or pending) and not _fork.forked_off():
            return self.run
        return None


    @property
    def last_event_id(self) -> str | None:
        """Id of the last event dispatched to listeners (stream mode)."""
        return self._dispatcher.dispatched_id

    # -- listeners (on / once / off / listener_count: ListenerMethods) -----

    def _listener_added(self, event: str) -> None:
        if self._restart:  # forked while running: this is the first use
            self.run()

    def _check_listenable(self, event: str = "") -> None:
        if self.closed:
            raise ClosedError(f"QueueEvents {self.name!r} is closed: its listeners are never "
                              "called")

    def on_all_events(self, callback: Listener) -> Listener:
        """Call ``callback(event)`` on every event."""
        _fork.check()
        self._check_listenable()
        self._listeners.on(ALL, callback)
        self._listener_added(ALL)  # after: a reader it starts may dispatch at once
        return callback

    def off_all_events(self, callback: Listener) -> bool:
        """Remove an ``on_all_events`` listener."""
        return self._listeners.off(ALL, callback)

    # -- waiting ----------------------------------------------------------

    def wait_for(
        self, job_id: str, timeout: float | None = None, run: str | None = None,
        fresh: bool = True,
    ) -> Any:
        """Block until job ``job_id`` finishes; see ``Job.wait_until_finished``.

        ``run`` is the token of the run waited for (the id of its ``added``
        event in stream mode): only that run's outcome (or a later
        generation's, after a retry) answers. If this reader began before
        that event, every later event of the run reaches the reader, so the
        record need not be read first, unless the token may be stale
        (``fresh`` False: the run may have been retried since).

        A reader that has never reached the server makes the wait raise that
        ``redis.exceptions.ConnectionError`` (naming the server), not time out;
        once it was ready, a lost connection only delays the wait.
        """
        job_id, timeout = lookup_id(job_id), wait_timeout(timeout)
        return ThreadWait(self, job_id, timeout).result(run, fresh)

    def future_for(self, job_id: str, run: str | None = None) -> Future[Any]:
        """A Future resolved with job ``job_id``'s result (or failure).

        It is settled on the QueueEvents' waker thread, never behind the
        listeners (a slow one holds up neither the future nor a thread
        waiting on it, a listener included). Its done-callbacks run on the
        dispatcher thread, after the listeners of the events read before,
        or on the calling thread when the job has finished already; never
        on the reader.
        ``run`` as for ``wait_for``; the token may be stale whatever the Job
        (a retry elsewhere since), so the reader's outcomes answer the
        future only once a check of the record, made at once (or when the
        reader is first ready), has brought it up to date.
        """
        _fork.check()
        return _future(self, lookup_id(job_id), run)

    def _result(self, waiter: Waiter, deadline: float | None = None) -> Any:
        return waited_result(self._context, waiter, f"QueueEvents {self.name!r}", deadline)

    def _poke_all(self, waiters: list[Waiter] | None = None) -> None:
        """Re-check every waiter's record after a possible loss of events (on the
        reader), or those of ``waiters``: the waiting threads' here, the
        futures' on the waker."""
        waiters = self._table.snapshot() if waiters is None else waiters
        self._check_threads(waiters)
        futures = [w for w in waiters if w.callback is not None]
        if futures:
            self._table.gate.defer(lambda: _check_futures(self, futures))

    def _check_threads(self, waiters: list[Waiter], unreached: bool = True) -> None:
        """Check the undecided waiting threads' records in pipelined batches: those
        answered are woken by the WakeGate, the others to check their own."""
        threads = [w for w in waiters if w.callback is None and w.outcome is None]
        for waiter in self._table.check_many(threads, unreached):
            waiter.poke()

    def _wake_loop(self) -> None:
        """The waker thread (see ``wake_loop``)."""
        wake_loop(self.name, self._table.gate, [self], self._stop)

    def _recheck_futures(self) -> None:
        _check_futures(self, [w for w in self._table.snapshot() if w.callback is not None])


def wake_loop(name: str, gate: WakeGate, parts: list[QueueEvents], stop: threading.Event) -> None:
    """The waker thread's body: wake the threads whose waits the reader
    answered beyond the batch it woke itself (WakeGate), settle the futures
    it answered, and every RECHECK_INTERVAL look at the records of all
    waiting threads and futures of ``parts`` (see RECHECK_INTERVAL).
    jobq's own thread: no listener or callback runs on it, so a slow one
    cannot hold that look up."""
    due = [time.monotonic() + RECHECK_INTERVAL]

    def step() -> float:
        gate.work(stop)
        if stop.is_set():
            return 0.0
        now = time.monotonic()
        if now >= due[0]:
            due[0] = now + RECHECK_INTERVAL
            for part in parts:
                part._futures_look_at = None
                part._check_threads(part._table.snapshot(), unreached=False)
                part._recheck_futures()
        for part in parts:
            look_at = part._futures_look_at
            if look_at is not None and now >= look_at:  # once: then the periodic look's
                part._futures_look_at = None
                part._recheck_futures()
        return 0.0

    BackgroundLoop(f"waker of {name!r}", step, stop=stop, log=logger).run()


class _JobFuture(Future[Any]):
    """A job's Future, settled on its QueueEvents' waker thread (or on the
    caller's, when the job had finished), whose done-callbacks run on the
    dispatcher thread instead: user code never runs on jobq's reader or
    waker.

    Pending until its job ends: ``cancel()`` gives it up (the job runs on)
    and forgets its waiter, so that futures given up on a job that never
    ends do not pile up in the waiter table."""

    def __init__(self, events: QueueEvents) -> None:
        super().__init__()
        self._dispatcher = events._dispatcher
        self._threads = events._threads
        self._forget: Callable[[], object] | None = None

    def add_done_callback(self, fn: Callable[[Future[Any]], object]) -> None:
        def hop(future: Future[Any]) -> None:
            # settled on the waker: the callback goes to the dispatcher
            # (one left there when the QueueEvents closes runs on the
            # closing thread; once that is done, here: see Dispatcher.run_left)
            if (threading.current_thread() in self._threads
                    and not self._dispatcher.on_thread() and not self._dispatcher.finished):
                self._dispatcher.call_back(functools.partial(_call_back, fn, future))
            else:
                fn(future)  # its errors are logged as Future's own are

        super().add_done_callback(hop)

    def cancel(self) -> bool:
        if not super().cancel():
            return False
        if self._forget is not None:
            self._forget()
        return True

    def settle(self, outcome: Callable[[], Any]) -> None:
        """Set the result ``outcome()`` returns, or what it raises; nothing
        when the future is done already (cancelled meanwhile)."""
        try:
            value = outcome()
        except BaseException as exc:  # the job's failure becomes the future's
            self._set(self.set_exception, exc)
        else:
            self._set(self.set_result, value)

    def _set(self, setter: Callable[[Any], None], value: Any) -> None:
        try:
            setter(value)
        except InvalidStateError:  # cancelled (or settled) meanwhile
            pass


def _call_back(fn: Callable[[Future[Any]], object], future: Future[Any]) -> None:
    """A future's done-callback, on the dispatcher thread."""
    try:
        fn(future)
    except Exception:
        if _fork.forked_off():  # the child it forked ends with it (see _fork.body)
            raise
        logger.exception("exception calling callback for %r", future)


def _future(events: QueueEvents, job_id: str, run: str | None) -> Future[Any]:
    """``QueueEvents.future_for``'s future."""
    future = _JobFuture(events)
    if events._stop.is_set():
        future.set_exception(ClosedError(f"QueueEvents {events.name!r} is closed"))
        return future

    def settle() -> None:
        if not future.done():
            future.settle(lambda: events._result(waiter))

    def resolved(waiter: Waiter, outcome: Outcome) -> None:
        events._table.unregister(waiter)
        if threading.current_thread() in events._threads:
            # on the waker: never on the reader (a record may be read), nor
            # behind the listeners on the dispatcher
            events._table.gate.defer(settle)
        else:
            settle()

    waiter = Waiter(job_id, run, resolved, stale=True)
    future._forget = functools.partial(events._table.unregister, waiter)
    events._table.register(waiter)
    events.wait_until_ready(0)  # starts the reader; it checks waiters once ready
    # a look that failed just now (the server away): the waker's, soon (ten
    # futures asked for in a row on a stopped server took ten seconds)
    if events._reader.ready.is_set() and events._futures_look_at is None:
        try:
            # bounded: a server that does not answer held the caller for its
            # socket timeout
            events._table.check(waiter, time.monotonic() + FIRST_LOOK)
        except Exception as exc:
            # a server away or frozen, BUSY, LOADING...: pending still, for the
            # periodic look and the reader's re-check after a reconnect (a
            # lost connection failed the future for good, job done or not)
            if not _connection.is_transient(exc):
                _fail(events, waiter, future, exc)
            else:  # soon, not at the periodic look's 10 s
                events._futures_look_at = time.monotonic() + FIRST_LOOK
    return future


def wake_bound(timeout: float | None) -> float:
    """How long a close with ``timeout`` tries to wake its reader: its wake
    (CLIENT UNBLOCK, or a publish) came on top of the timeout."""
    return UNBLOCK_TIMEOUT if timeout is None else max(0.01, min(UNBLOCK_TIMEOUT, timeout / 4))


def left_of(timeout: float | None, start: float) -> float | None:
    """What is left at this moment of ``timeout`` seconds from ``start``."""
    return None if timeout is None else max(0.0, timeout - (time.monotonic() - start))


def close_threads(threads: list[threading.Thread], timeout: float | None,
                  cut_reader: Callable[[], object], *cuts: Callable[[], object]) -> None:
    """Join a closing QueueEvents' threads, its reader first in ``threads``,
    for ``timeout`` at most. A reader still in a read past READ_GRACE has
    its connection cut then (a server that does not answer would hold it
    for the whole timeout); the threads left CUT_GRACE before the timeout
    have the bounded calls' connections cut too (``cuts``), and the rest of
    it to end (the grace came on top of the timeout). A thread running a
    listener that outlasts it ends when the listener returns."""
    if timeout is None:
        if threads:
            join_or_cut(threads[:1], READ_GRACE, 0, cut_reader)
        join_or_cut(threads, None, CUT_GRACE, cut_reader, *cuts)
        return
    # the grace of the threads whose connections are cut is part of the timeout
    grace = min(CUT_GRACE, timeout / 2)
    until = time.monotonic() + timeout - grace
    if threads:
        join_or_cut(threads[:1], min(timeout - grace, READ_GRACE), 0, cut_reader)
    join_or_cut(threads, max(0.0, until - time.monotonic()), grace, cut_reader, *cuts)


def _fail(events: QueueEvents, waiter: Waiter, future: _JobFuture, exc: Exception) -> None:
    """A future's first check failed: the future fails with its error."""
    events._table.unregister(waiter)
    future._set(future.set_exception, exc)


def _check_futures(events: QueueEvents, waiters: list[Waiter]) -> None:
    """Check futures' jobs (no thread waits on them), on the waker thread,
    in pipelined batches, then one by one those the batches left; a
    transient error ends the round: the next reconnect or re-check
    tries again."""
    for waiter in events._table.check_many([w for w in waiters if w.outcome is None]):
        if events._stop.is_set():
            return
        try:
            events._table.check(waiter)
        except Exception as exc:
            if _connection.is_transient(exc):
                # one line per round, not one per waiter: the server is away or busy
                logger.warning("re-checking waited-on jobs of %r failed: %s", events.name,
                               brief(exc))
                return
            logger.exception("re-checking job %r failed", waiter.job_id)
