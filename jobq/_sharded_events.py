"""ShardedQueueEvents: the events of every shard of a sharded queue, to one
set of listeners.

One reader thread reads every shard (``_shard_reader``: one blocking read
on a single server, two connections per node on a cluster), one dispatcher
thread runs the listeners and one waker thread wakes waiting callers, as
for a plain queue. Each shard has a part (a ``QueueEvents`` sharing those)
that keeps the shard's position in its stream and its waiters: a wait goes
to the part of the job's shard. Events of different shards come in no
guaranteed order relative to each other; each shard's come in order.

A shard writes ``drained`` when it has nothing waiting or active; the
sharded queue is drained only when every shard is. So a shard's ``drained``
reaches the listeners only if, checked when it is dispatched (one round
trip per node), no shard has a job waiting or active, and (stream mode) some
event was written since the last ``drained`` reported: shards that finish
together report one ``drained``, not one each.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import redis

from . import _fork
from ._closing import ClosedOnExit
from ._context import QueueContext
from ._reader import ALL, Dispatcher
from ._shard_reader import ShardReader
from ._shards import COUNT_FIELD, mismatch, shard_names, shard_of, validate_count
from ._threads import start_thread, wait_event
from ._waiters import CLOSED, WakeGate
from ._waiting import FIRST_LOOK
from .connection import BLOCK_CAP, close_client, resolve
from .errors import ClosedError
from .events import Event
from .keys import QueueKeys, lookup_id, validate_name
from .listeners import Listener, ListenerMethods, ListenerRegistry, call_safely
from .options import blocking_seconds, flag, wait_timeout
from .queue_events import (
    QueueEvents,
    Shared,
    close_threads,
    left_of,
    logger,
    wake_bound,
    wake_loop,
)

__all__ = ["ShardedQueueEvents"]


class ShardedQueueEvents(ListenerMethods, ClosedOnExit):
    """Read every shard's events of a sharded queue (see ``QueueEvents``).

    Args:
        queue_name: the sharded queue's name.
        shards: its shard count.
        connection: as for Queue (a client of the caller's is shared).
        prefix: the queue's key prefix.
        last_event_id: ``"$"`` (from now on) or ``"0"`` (everything retained),
            for every shard.
        blocking_timeout: as for QueueEvents.
        autorun: start reading on first use (a listener added, a wait);
            else call ``run()``.
    """

    def __init__(
        self,
        queue_name: str,
        *,
        shards: int,
        connection: object = None,
        prefix: str = "jobq",
        last_event_id: str = "$",
        blocking_timeout: float = 10,
        autorun: bool = True,
    ) -> None:
        if last_event_id not in ("$", "0"):
            raise ValueError("a sharded queue's readers start at '$' or '0'")
        blocking_seconds(blocking_timeout)
        flag("autorun", autorun)
        self._name = validate_name(queue_name)
        self._prefix = prefix
        self._count = validate_count(shards)
        self._client, self._owned = resolve(connection)
        self._listeners = ListenerRegistry()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._dispatcher = _ShardedDispatcher(self._listeners, self._stop, self._all_drained)
        shared = Shared(self._listeners, self._stop, self._dispatcher, [], self.run, self.close)
        self._threads = shared.threads
        self._readers = tuple(
            QueueEvents._part_of(
                QueueContext(shard, self._client, prefix, "QueueEvents"), last_event_id,
                blocking_timeout, shared,
            )
            for shard in shard_names(self._name, self._count)
        )
        self._share_gate()
        block = max(0.01, min(float(blocking_timeout), BLOCK_CAP))
        self._reader = ShardReader(
            self._name, self._client, tuple(part._reader for part in self._readers), block,
            self._stop, self._dispatcher.error,
        )
        self._started = False
        self._restart = bool(autorun)  # no I/O here: start on first use
        _fork.track(self)

    def _share_gate(self) -> None:
        """One waker thread wakes the callers waiting on every shard."""
        self._gate = WakeGate()
        for part in self._readers:
            part._table.gate = self._gate

    @property
    def name(self) -> str:
        """The sharded queue's name."""
        return self._name

    @property
    def prefix(self) -> str:
        """The queue's key prefix."""
        return self._prefix

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._stop.is_set()

    @property
    def readers(self) -> tuple[QueueEvents, ...]:
        """Each shard's part, in shard order: its waits and position (its
        listeners, threads and ``close`` are this object's)."""
        return self._readers

    @property
    def connections(self) -> int:
        """How many connections of its own the reader may hold now: one on
        a single server in stream mode, else two per node, one of them
        subscribed to the shards' channels (0 before the first read)."""
        return self._reader.connections

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("running" if self._started else "idle")
        return f"<ShardedQueueEvents {self._name!r} shards={self._count} {state}>"

    def reader_for(self, job_id: str) -> QueueEvents:
        """The part of the shard of a job (``Job.wait_until_finished``
        given this object waits through it)."""
        if self.closed:
            raise ClosedError(f"QueueEvents {self._name!r} is closed")
        return self._readers[shard_of(lookup_id(job_id), self._count)]

    def run(self) -> ShardedQueueEvents:
        """Start reading (when ``autorun=False``; else on first use); return self.

        Raises:
            ShardCountError: ``shards`` is not the count stored with the
                queue (its readers would read none of its events).
        """
        _fork.check()
        with self._lock:
            if self._stop.is_set():
                raise ClosedError(f"QueueEvents {self._name!r} is closed")
            if self._started:
                return self
            # by a deadline: a wait starts the readers, and keeps to its
            # timeout on a server that does not answer (within its first look)
            deadline = time.monotonic() + FIRST_LOOK
            try:
                raw = self._readers[0]._context.command_by(
                    deadline, "HGET", QueueKeys(self._prefix, self._name).meta, COUNT_FIELD)
                stored = int(raw) if raw else None
            except redis.exceptions.RedisError:
                stored = None  # a server away: the readers wait for it
            if stored is not None and stored != self._count:
                raise mismatch(self._name, stored, self._count)
            self._started = True
            self._restart = False
            self._threads[:] = [
                start_thread(f"jobq-events-{self._name}", self._reader.loop),
                start_thread(f"jobq-dispatch-{self._name}", self._dispatcher.loop),
                start_thread(f"jobq-wake-{self._name}", self._wake_loop),
            ]
        return self

    def wait_until_ready(self, timeout: float | None = None) -> bool:
        """Wait until every shard's events emitted from now on will be delivered."""
        timeout = wait_timeout(timeout)
        if not self._started and not self._stop.is_set():
            self.run()
        deadline = None if timeout is None else time.monotonic() + timeout
        for part in self._readers:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not wait_event(part._reader.ready, left):
                return False
        return not self._stop.is_set()

    def close(self, timeout: float | None = 5.0) -> None:
        """Stop reading, fail pending waits with ClosedError, join the threads
        for ``timeout`` at most; a thread then still in a call to a server
        that does not answer has its connection cut, half a second (at most
        half the timeout) before it. The reader, whose reads last about a
        second at most, is cut after 1.5 s (READ_GRACE) if still reading: a
        close on a server that stopped answering is over in about two
        seconds."""
        timeout = wait_timeout(timeout)
        start = time.monotonic()
        _fork.check()
        with self._lock:
            if self._stop.is_set():
                return
            self._stop.set()
        for part in self._readers:
            part._reader.stopped()
            for waiter in part._table.close():
                waiter.resolve(CLOSED)
        self._gate.stop()
        self._dispatcher.wake()
        self._reader.wake(wake_bound(timeout))
        close_threads(self._threads, left_of(timeout, start), self._reader.interrupt,
                      *(part._context.close for part in self._readers))
        self._gate.flush()  # futures the reader answered as the waker stopped
        self._dispatcher.run_left()  # and their done-callbacks not run yet
        for part in self._readers:
            part._context.close()
        if self._owned:
            close_client(self._client)

    def _after_fork(self) -> Any:
        """In a forked child: forget what the parent's threads knew; start
        again on first use (at once when listeners are registered, or
        futures pending)."""
        self._lock = threading.Lock()
        self._stop._at_fork_reinit()  # type: ignore[attr-defined]
        self._listeners.after_fork()
        self._dispatcher.after_fork()
        self._reader.after_fork()
        pending = False
        for part in self._readers:
            part._reader.after_fork()
            pending = part._table.after_fork() or pending
        self._share_gate()
        was_running = self._started and not self._stop.is_set()
        self._started = False
        self._threads.clear()
        self._restart = was_running
        # (not when a handler or listener forked, on a thread of jobq's: that
        # child is its own, and the parent's listeners are not its work)
        if was_running and (self._listeners.has_any() or pending) and not _fork.forked_off():
            return self.run
        return None

    # -- listeners ----------------------------------------------------------

    def _listener_added(self, event: str) -> None:
        self._resume()

    def _resume(self) -> None:
        if self._restart:
            self.run()

    def _check_listenable(self, event: str = "") -> None:
        if self.closed:
            raise ClosedError(f"QueueEvents {self._name!r} is closed: its listeners are never "
                              "called")

    def on_all_events(self, callback: Listener) -> Listener:
        """Call ``callback(event)`` on every event of every shard."""
        _fork.check()
        self._check_listenable()
        self._listeners.on(ALL, callback)
        self._resume()  # after: a reader it starts may dispatch at once
        return callback

    def off_all_events(self, callback: Listener) -> bool:
        """Remove an ``on_all_events`` listener."""
        return self._listeners.off(ALL, callback)

    # -- waiting ------------------------------------------------------------

    def wait_for(self, job_id: str, timeout: float | None = None, run: str | None = None,
                 **kwargs: Any) -> Any:
        """Wait for a job through its shard's part (see QueueEvents)."""
        return self.reader_for(job_id).wait_for(job_id, timeout, run, **kwargs)

    def future_for(self, job_id: str, run: str | None = None) -> Future[Any]:
        """A Future of a job's outcome, through its shard's part (see QueueEvents)."""
        return self.reader_for(job_id).future_for(job_id, run)

    def _all_drained(self) -> tuple[object, ...] | None:
        """None if a shard has a job waiting or active now; else what marks
        this drained state: the last entry id of each shard's stream (in
        pub/sub mode, nothing: each such state is a new one)."""
        streams = all(part._reader.mode == "stream" for part in self._readers)
        pipe = self._client.pipeline(transaction=False)
        for part in self._readers:
            keys = part._context.keys
            if streams:  # before the counts: an event written after them changes it
                pipe.xrevrange(keys.events, "+", "-", count=1)
            pipe.llen(keys.wait)
            pipe.zcard(keys.prioritized)
            pipe.zcard(keys.active)
        replies = pipe.execute()
        per_shard = 4 if streams else 3
        marks: list[object] = []
        for i in range(0, len(replies), per_shard):
            if any(replies[i + per_shard - 3:i + per_shard]):
                return None
            if streams:
                marks.append(replies[i][0][0] if replies[i] else None)
        return tuple(marks)

    def _wake_loop(self) -> None:
        wake_loop(self._name, self._gate, list(self._readers), self._stop)


class _ShardedDispatcher(Dispatcher):
    """The dispatcher of a ShardedQueueEvents: a shard's ``drained`` is
    dispatched only when the whole queue is drained (see the module's
    docstring), checked on the dispatcher thread in the order of events."""

    def __init__(
        self,
        listeners: ListenerRegistry,
        stop: threading.Event,
        all_drained: Callable[[], tuple[object, ...] | None],
    ) -> None:
        super().__init__(listeners, stop)
        self._all_drained = all_drained
        self._reported: tuple[object, ...] | None = None  # the last drained state told

    def put(self, event: Event) -> None:
        if event.name == "drained" and not event._custom:  # a custom one is passed on as is
            self.call_soon(functools.partial(self._drained, event))
        else:
            super().put(event)

    def _drained(self, event: Event) -> None:
        if self._listeners.has("drained") or self._listeners.has(ALL):
            try:
                state = self._all_drained()
            except Exception as exc:  # cannot tell: the shard's word stands
                logger.warning("could not check the other shards for drained: %s", exc)
                state = ()
            if state is not None and (state == () or state != self._reported):
                self._reported = state
                channels = (event.name, ALL)  # the queue's: no job id
                for channel, callback in self._listeners.take_many(channels):
                    call_safely(callback, channel, event)
        if event.id is not None and not event._more:
            self.dispatched_id = event.id
