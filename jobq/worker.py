"""Worker: take jobs from a queue and run them in a pool of threads.

The Worker is an orchestrator with one lifecycle (``NEW`` -> ``RUNNING`` ->
``CLOSING`` -> ``CLOSED``, under one condition). Its roles each own a thread
(or a pool) and meet through narrow objects of ``_attempt``:

- ``_fetcher.Fetcher`` takes jobs (blocking on the queue's marker) while the
  ``TakeGate`` is open and a pool slot is free;
- ``_runner.Runner`` runs them, and its ``Finisher`` completes or fails each
  attempt exactly once (taking the next job in the same call);
- ``lock_manager.LockRenewer`` renews every lock in the ``AttemptTable``, and
  ``lock_manager.TimeoutWatch`` fails attempts past their timeout;
- ``_maintenance.Maintenance`` beats the heartbeat and recovers stalled jobs;
- a ``ListenerDispatcher`` calls local listeners off every one of those paths.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from . import _fork
from ._attempt import Pausing
from ._closing import ClosedOnExit
from ._context import QueueContext
from ._lifecycle import CloseStep, Lifecycle, WorkerState, shut_down
from ._roles import Roles, Settings, TakeTokens
from ._runner import pool_size
from ._shard_worker import ShardedContext, worker_context
from ._shards import validate_count
from ._threads import start_thread
from .connection import BLOCK_CAP, clone_client, close_client, resolve
from .errors import ClosedError, JobqError
from .events import Event
from .job import Job
from .listeners import ListenerMethods, ListenerRegistry
from .options import MAX_SECONDS, byte_limit, flag, wait_timeout
from .registry import DEFAULT_HEARTBEAT_TTL
from .tasks import refuse_async

if TYPE_CHECKING:

    from ._sharded_events import ShardedQueueEvents
    from .queue_events import QueueEvents

__all__ = ["Worker"]

logger = logging.getLogger(__name__)

Processor = Callable[[Job], Any]
_CHANNEL_EVENTS = frozenset({"drained", "stalled"})
#: The events of a Worker's local listeners (SPEC, Worker).
WORKER_EVENTS = frozenset({
    "ready", "active", "progress", "completed", "failed", "stalled", "drained", "paused",
    "resumed", "error", "closing", "closed",
})
#: Longest wait in ``start()`` for the event subscription of ``drained`` /
#: ``stalled`` listeners.
EVENTS_READY_TIMEOUT = 10.0
#: Least time ``close()`` gives its threads to end once told to stop.
JOIN_GRACE = BLOCK_CAP + 0.5
_BAD_NAME = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")


def _positive(name: str, value: Any) -> float:
    # at least a whole ms: the server's lock and key ttls are in ms, and 0 ms
    # is refused there (a take would fail half-way); at most MAX_SECONDS, as
    # infinity overflows converting to ms, in a background thread
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0.001
            or not value <= MAX_SECONDS):
        raise ValueError(f"{name} must be a number of seconds from 0.001 to "
                         f"{MAX_SECONDS:g}, not {value!r}")
    return float(value)


def _count(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, not {value!r}")
    return value


#: Most pool threads one worker runs: each is an OS thread that may keep a
#: connection of its own (a server's default maxclients is 10,000). Run
#: more processes for more.
MAX_CONCURRENCY = 4096


def _concurrency(value: Any) -> int:
    count = _count("concurrency", value, 1)
    if count > MAX_CONCURRENCY:
        raise ValueError(f"concurrency must be at most {MAX_CONCURRENCY} (a thread each), not "
                         f"{count}; run several worker processes for more")
    return count


def _worker_name(name: Any) -> str:
    if name is None:
        return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
    if not isinstance(name, str) or not name or len(name) > 200 or _BAD_NAME.search(name):
        raise ValueError(
            f"worker name must be a non-empty str of at most 200 characters without "
            f"control characters or lone surrogates, not {name!r}"
        )
    return name


def _routes(
    processor: Processor | Mapping[str, Processor],
) -> tuple[dict[str, Processor] | None, Processor | None]:
    """(routes by job name, or None; the one processor, or None)."""
    if isinstance(processor, Mapping):
        bad = [k for k, v in processor.items() if not isinstance(k, str) or not callable(v)]
        if bad or not processor:
            raise TypeError("processor dict must map job names to callables")
        for name, route in processor.items():
            refuse_async(route, f"the processor for job name {name!r}")
        return dict(processor), None
    if callable(processor):
        refuse_async(processor, "processor")
        return None, processor
    raise TypeError("processor must be a callable or a dict of callables")


def _settings(
    name: str, *, concurrency: Any, lock_duration: Any, stalled_interval: Any,
    max_stalled_count: Any, drain_delay: Any, heartbeat_ttl: Any,
    limiter: Mapping[str, float] | None, max_result_bytes: int | None,
) -> Settings:
    """Validate a Worker's arguments (ValueError naming the bad one)."""
    limit = (0, 0)
    if limiter is not None:
        if not isinstance(limiter, Mapping):
            raise ValueError("limiter must be {'max': int >= 1, 'duration': seconds}, "
                             f"not {limiter!r}")
        unknown = set(limiter) - {"max", "duration"}
        count = limiter.get("max")
        if unknown or isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError("limiter must be {'max': int >= 1, 'duration': seconds}")
        duration = _positive("limiter duration", limiter.get("duration"))
        limit = (count, max(1, round(duration * 1000)))
    return Settings(
        name=name, concurrency=_concurrency(concurrency),
        lock_duration=_positive("lock_duration", lock_duration),
        stalled_interval=_positive("stalled_interval", stalled_interval),
        max_stalled_count=_count("max_stalled_count", max_stalled_count, 0),
        drain_delay=_positive("drain_delay", drain_delay),
        heartbeat_ttl=_positive("heartbeat_ttl", heartbeat_ttl),
        max_result_bytes=byte_limit("max_result_bytes", max_result_bytes), limit=limit,
    )


_LIVE: weakref.WeakSet[Worker] = weakref.WeakSet()


def _fixed(field: str, doc: str) -> Any:
    """A Worker's setting, read-only: set when the worker is made (an
    assignment was taken silently, changed nothing, and was reported by
    the registry as if it had)."""

    def refuse(worker: Worker, value: object) -> None:
        raise AttributeError(f"a Worker's {field} is set when it is made: close this one and "
                             f"make another with {field}={value!r}")

    return property(lambda worker: getattr(worker._settings, field), refuse, doc=doc)


class Worker(ListenerMethods, ClosedOnExit):
    """Run a queue's jobs in a pool of ``concurrency`` threads.

    Args:
        queue_name: the queue to take jobs from.
        processor: ``processor(job) -> result``, or a dict routing job names
            to such callables: plain functions, run on the pool's threads
            (an ``async def`` one is refused with TypeError; wrap it in a
            function that calls ``asyncio.run``).
        connection: as for Queue. The worker makes its calls through a pool
            of its own (same server and settings), so it never takes a
            connection the application's client counts on.
        prefix: the queue's key prefix.
        concurrency: jobs run at once, each in its own pool thread (at
            most ``MAX_CONCURRENCY``, 4096).
        name: this worker's name (recorded as ``processed_by``).
        lock_duration: seconds a job's lock lasts; renewed every half of it.
        stalled_interval: seconds between checks for jobs of dead workers.
        max_stalled_count: stalls a job may have before it fails.
        drain_delay: longest idle time between two looks at the queue.
        limiter: ``{"max": n, "duration": s}``, shared by all workers of
            the queue: at most n jobs start in each window of s seconds.
            Windows are fixed (each begins at its first take, as BullMQ's),
            so up to 2n may start within s across two windows' edge.
        autorun: start at once (as ``start()``).
        max_result_bytes: largest msgpack-encoded return value (default
            1 MiB); a larger one fails the attempt with ``PayloadTooLarge``.
            None for no limit but the server's.
        heartbeat_ttl: seconds the worker's announcement in the registry
            (``Queue.get_workers()``) outlives its last heartbeat; it beats
            every third of that.
        shards: the shard count of a sharded queue (``ShardedQueue``). None
            (the default) reads the count stored with the queue at
            ``start()``: a worker started before the queue's first write
            serves it as a plain queue unless told the count here (and
            reports that with an ``error`` event once the count is stored).
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
        shards: int | None = None,
    ) -> None:
        flag("autorun", autorun)
        self._shards = None if shards is None else validate_count(shards)
        self._routes, self._processor = _routes(processor)
        self._given_name: str | None = name
        self._settings = _settings(
            _worker_name(name), concurrency=concurrency, lock_duration=lock_duration,
            stalled_interval=stalled_interval, max_stalled_count=max_stalled_count,
            drain_delay=drain_delay, heartbeat_ttl=heartbeat_ttl, limiter=limiter,
            max_result_bytes=max_result_bytes,
        )
        self._context = QueueContext(
            queue_name, _own_client(connection, self.name, self.concurrency), prefix,
            "the worker of queue", owned=True,
        )
        self._announced_queues: tuple[str, ...] = (queue_name,)  # the CLI names all it serves
        self._listeners = ListenerRegistry()
        self._life = WorkerState()
        self._pause = Pausing(self._life.cond)
        self._roles: Roles | None = None
        self._channel = _Channel(self._life.cond)
        self._take_args = TakeTokens(self._settings)
        self._run_context = self._context
        _LIVE.add(self)
        if autorun:
            self.start()

    name = _fixed("name", "This worker's name (recorded as ``processed_by``).")
    concurrency = _fixed("concurrency", "Jobs run at once, each in a pool thread.")
    max_stalled_count = _fixed("max_stalled_count", "Stalls a job may have before it fails.")
    max_result_bytes = _fixed("max_result_bytes", "Largest encoded return value (None: any).")

    # -- lifecycle ----------------------------------------------------------

    @property
    def queue_name(self) -> str:
        """The queue this worker serves."""
        return self._context.name

    @property
    def state(self) -> Lifecycle:
        """Where the worker is in its life."""
        return self._life.state

    def __repr__(self) -> str:
        return f"<Worker {self.name!r} queue={self.queue_name!r} {self._life.state.value}>"

    def is_running(self) -> bool:
        """Whether the worker was started and is not closing or closed."""
        return self._life.state is Lifecycle.RUNNING

    def start(self) -> Worker:
        """Start fetching and running jobs in background threads; return self.
        Listeners of ``drained`` / ``stalled`` attached before it hear every
        such event after it returns (it waits for their subscription, at
        most ``EVENTS_READY_TIMEOUT``). Raises ``ShardCountError`` when
        ``shards`` is not the count stored with the queue, and redis-py's
        ``AuthenticationError`` when the server refuses the login (a server
        away is waited for: its loops retry)."""
        _fork.check()
        if not self._life.begin_start(self.name):
            return self
        # what may wait for the server is done without the lock: a close()
        # from another thread ends it (it held the lock for up to 20 s)
        run_context = self._context
        try:
            run_context = worker_context(  # sharding.py
                self._context, self._shards, lambda: self._life.state is not Lifecycle.NEW)
            if any(self._listeners.has(e) for e in _CHANNEL_EVENTS):
                with self._life.cond:  # opened unless closed: a close then closes it too
                    if self._life.state is Lifecycle.NEW:
                        self._channel.open(run_context, self._emit)
                self._channel.wait_ready(self.name)
            with self._life.cond:
                if self._life.state is not Lifecycle.NEW:  # closed meanwhile: it stays closed
                    raise ClosedError(f"worker {self.name!r} was closed while it started")
                self._run_context = run_context
                route = functools.partial(_handler_for, self._routes, self._processor, self.name)
                roles = self._roles = Roles.build(
                    self._run_context, self._settings, self._listeners,
                    paused=self._pause.paused, handler_for=route, take_args=self._take_args,
                    status=functools.partial(_status, self),
                )
                self._life.state = Lifecycle.RUNNING
                roles.start()
        except BaseException as exc:
            if self._roles is None:
                self._undo_start(run_context)
            elif self._life.state is Lifecycle.RUNNING:  # its threads, part of the way
                self._life.end_start()
                self.close(timeout=JOIN_GRACE)
                raise JobqError(f"worker {self.name!r} could not start: {exc}") from exc
            if self._life.state is Lifecycle.CLOSED and not isinstance(exc, ClosedError):
                # the close cut what the start waited for
                raise ClosedError(f"worker {self.name!r} was closed while it started") from exc
            raise
        finally:
            self._life.end_start()
        return self

    def _undo_start(self, run_context: QueueContext) -> None:
        """Close what a start that did not end opened."""
        self._channel.close(JOIN_GRACE)
        if run_context is not self._context:  # a sharded worker's own
            run_context.close()

    def run(self) -> None:
        """Run until ``close()``. In the main thread, SIGINT / SIGTERM / SIGHUP
        close gracefully and a second one forces. After ``start()``, it waits for
        the close the same way (the worker is not started twice)."""
        self._life.serve(self.name, self.start, self.close)

    def close(self, timeout: float | None = None, force: bool = False) -> None:
        """Stop taking jobs, let jobs in flight finish (a timed-out attempt's
        handler still running too), join every thread.

        Args:
            timeout: seconds for the whole close; jobs still in flight when
                it runs out are abandoned (no ``failed``; they are recovered
                as stalled), and a handler still running is left to its
                thread (a daemon), as is a listener still running (its
                ``jobq-listeners-...`` thread). A thread still in a call to a server that
                does not answer then has its connection cut, and
                ``JOIN_GRACE`` seconds to end. None: the close waits for
                the jobs in flight and for a listener still running, for as
                long as they take (until a forced close).
            force: abandon jobs in flight at once.

        Called from a handler, it starts the close in the background and
        returns at once. A second call waits (up to ``timeout``) for the
        first to end (a listener's returns at once: the first waits for
        it); with ``force`` it makes the first abandon its jobs. One on the
        thread already closing (from a signal handler: the second of two
        signals) returns at once, as the close under way cannot end while
        its thread waits for it. Interrupted in its waits (a
        ``KeyboardInterrupt``: a second Ctrl-C in a ``with`` block's exit),
        it abandons the jobs in flight as ``force`` does, ends its threads,
        and lets the interruption through.
        """
        timeout, force = wait_timeout(timeout), flag("force", force)
        _fork.check()
        roles = self._roles
        if roles is not None and threading.current_thread() in roles.runner.threads:
            start_thread(f"jobq-closer-{self.queue_name}", lambda: self.close(timeout, force))
            return
        deadline = None if timeout is None else time.monotonic() + timeout

        def waits() -> bool:  # not a listener's call: the close waits for it
            roles = self._roles
            return roles is None or threading.current_thread() is not roles.dispatcher.thread

        step = self._life.begin_close(force, waits, timeout)
        if step is CloseStep.DONE:
            return
        roles = self._roles
        if roles is None:  # never started
            if step is CloseStep.STARTING:  # a start under way on another thread: end its wait
                self._channel.close(JOIN_GRACE if timeout is None else timeout)
            self._listeners.emit("closing")
            self._context.close()
            self._listeners.emit("closed")
            return
        self._life.shut_down(lambda delivered: shut_down(
            roles, self.name, deadline, self._life.forced, self._channel.close, self._context,
            self._run_context, delivered))

    def __enter__(self) -> Worker:
        return self.start()

    def _after_fork(self) -> None:
        """In a forked child: none of the parent's run, and a worker of its
        own (see ``_child_identity``)."""
        self._settings, self._take_args = _child_identity(self._given_name, self._settings)
        if self._life.after_fork():
            self._roles = None
        self._pause.cond = self._life.cond
        self._listeners.after_fork()
        self._channel = _Channel(self._life.cond)

    # -- pausing ------------------------------------------------------------

    def pause(self, wait: bool = True, timeout: float | None = None) -> None:
        """Stop taking jobs in this worker; emits ``paused`` (once, on the
        call that paused it).

        Args:
            wait: also wait for the jobs in flight to finish (as BullMQ's
                ``pause()``); with False, return once no take is under way.
                A call with ``wait`` on a worker paused already waits too.
            timeout: seconds to wait at most; the worker is paused when it
                returns, whether its jobs finished or not (``is_paused()``).

        Called from a handler, it waits for the other jobs in flight, not
        for the caller's own (which ends when its handler returns), nor for
        those of other handlers waiting in ``pause()`` too. The wait ends
        early if the worker is resumed or closed meanwhile.

        Raises:
            ClosedError: the worker is closed.
        """
        self._check_open("pause")
        if self._pause.pause(lambda: self._roles, flag("wait", wait), wait_timeout(timeout),
                             lambda: self._life.state is Lifecycle.CLOSED):
            self._listeners.emit("paused")  # on the caller's thread, before returning

    def resume(self) -> None:
        """Take jobs again after ``pause()``. Emits ``resumed``.

        Raises:
            ClosedError: the worker is closed.
        """
        self._check_open("resume")
        if self._pause.resume(lambda: self._roles):
            self._listeners.emit("resumed")

    def is_paused(self) -> bool:
        """Whether this worker is paused (see ``pause``)."""
        return self._pause.paused

    def _check_open(self, what: str) -> None:
        # paused / resumed listeners ran after closed, for nothing
        if self._life.state is Lifecycle.CLOSED:
            raise ClosedError(f"worker {self.name!r} is closed: it cannot {what}")

    # -- listeners (on / once / off / listener_count: ListenerMethods) -----------

    def _check_listenable(self, event: str) -> None:
        if event not in WORKER_EVENTS:  # a misspelt name would never be called
            raise ValueError(f"a Worker has no event {event!r}; its events are "
                             f"{', '.join(sorted(WORKER_EVENTS))}")
        if self._life.state is Lifecycle.CLOSED:
            raise ClosedError(f"worker {self.name!r} is closed: its listeners are never called")

    def _listener_added(self, event: str) -> None:
        if event in _CHANNEL_EVENTS and self._life.state is Lifecycle.RUNNING:
            self._channel.open(self._run_context, self._emit)

    def _emit(self, event: str, *args: Any) -> None:
        roles = self._roles
        if roles is not None:
            roles.dispatcher.emit(event, *args)
        else:
            self._listeners.emit(event, *args)


def _status(worker: Worker) -> dict[str, Any]:
    """What a worker's heartbeat records of it (``Queue.get_workers``)."""
    roles = worker._roles
    return {
        "queues": worker._announced_queues, "concurrency": worker.concurrency,
        "done": roles.finisher.done if roles else 0,
        "failed": roles.finisher.failed if roles else 0,
        "active": len(roles.table) if roles else 0, "paused": worker._pause.paused,
    }


def _handler_for(
    routes: dict[str, Processor] | None, processor: Processor | None, worker: str, job: Job
) -> Processor:
    """The processor of a job: the worker's one, or the route of its name."""
    if processor is not None:
        return processor
    assert routes is not None
    handler = routes.get(job.name)
    if handler is None:
        # an ordinary failed attempt, retried per `attempts`: during a
        # rolling deploy a newer worker may know the name
        known = ", ".join(sorted(map(repr, routes)))
        raise JobqError(
            f"no processor for job name {job.name!r} in worker {worker!r}; it handles {known}"
        )
    return handler


def _child_identity(given: str | None, settings: Settings) -> tuple[Settings, TakeTokens]:
    """A forked child's worker name (a new one unless the name was given:
    its own entry in the registry) and lock tokens (never its parent's: a
    stalled parent's late finish must not pass for the child's)."""
    settings = dataclasses.replace(settings, name=given or _worker_name(None))
    return settings, TakeTokens(settings)


def _own_client(connection: object, name: str, concurrency: int) -> Any:
    """A client with a pool of the worker's own: its pool threads keep a
    connection each, and handlers call through it too."""
    client, owned = resolve(connection)
    size = pool_size(concurrency)  # per node on a cluster
    if not hasattr(client, "connection_pool"):  # a cluster of the worker's own: as it is
        return client if owned else clone_client(client, f"jobq-worker-{name}",
                                                 max_connections=size)
    own = clone_client(client, f"jobq-worker-{name}", max_connections=size)
    if owned:
        close_client(client)
    return own


class _Channel:
    """A worker's reader of its queue's event channel, which forwards
    ``drained`` and ``stalled`` to the worker's local listeners: opened by
    ``start()`` when such a listener is there, or by the first one added
    later."""

    def __init__(self, lock: threading.Condition) -> None:
        self._lock = lock
        self._events: QueueEvents | ShardedQueueEvents | None = None

    def open(self, context: QueueContext, emit: Callable[..., None]) -> None:
        """Open it unless open (its reader starts on its own)."""
        with self._lock:
            if self._events is None:
                self._events = _channel_events(context, emit)

    def wait_ready(self, worker: str) -> None:
        """Wait until it reads, if open (bounded; a close ends the wait)."""
        events = self._events
        if events is not None and not events.wait_until_ready(EVENTS_READY_TIMEOUT) \
                and not events.closed:
            logger.warning("worker %r: the queue's event channel is not readable yet; "
                           "drained / stalled listeners may miss events", worker)

    def close(self, timeout: float) -> None:
        events, self._events = self._events, None
        if events is not None:
            events.close(timeout)


def _channel_events(
    context: QueueContext, emit: Callable[..., None]
) -> QueueEvents | ShardedQueueEvents:
    """A reader of the queue's event channel that forwards ``drained`` and
    ``stalled`` to a worker's local listeners."""
    from .queue_events import QueueEvents

    events: QueueEvents | ShardedQueueEvents
    if isinstance(context, ShardedContext):  # every shard's events
        from ._sharded_events import ShardedQueueEvents

        events = ShardedQueueEvents(
            context.name, shards=context.count, connection=context.client, prefix=context.prefix
        )
    else:
        events = QueueEvents(context.name, connection=context.client, prefix=context.prefix)

    def forward(event: Event) -> None:
        if event._custom:  # Queue.emit's: for QueueEvents listeners only
            return
        if event.name == "drained":
            emit("drained")
        else:
            emit("stalled", event.job_id)

    events.on("drained", forward)
    events.on("stalled", forward)
    return events


def _after_fork_in_child() -> None:
    for worker in list(_LIVE):
        worker._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
