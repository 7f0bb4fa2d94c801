"""The roles of one run of a Worker, wired together, started and stopped as one.

``Roles.build`` makes them from the worker's settings; ``start`` starts
their threads; ``stop`` stops taking, waits for jobs in flight (or abandons
them), stops every loop and joins every thread but those inside user code.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._attempt import Attempt, AttemptTable, TakeGate
from ._cancel import CancelListener
from ._context import QueueContext
from ._fetcher import Fetcher
from ._maintenance import Maintenance
from ._runner import Finisher, Runner
from ._shard_fetcher import ShardFetcher
from ._shard_worker import ShardedContext
from ._threads import BackgroundLoop, join_or_cut
from .calls import TakeArgs
from .connection import BLOCK_CAP, cut_client
from .errors import LockLostError
from .job import Job
from .listeners import ListenerDispatcher, ListenerRegistry
from .lock_manager import LockRenewer, TimeoutWatch

logger = logging.getLogger("jobq.worker")  # the public module's name, as documented

#: Least time the threads of a stopping run get to end once told to.
JOIN_GRACE = BLOCK_CAP + 0.5


@dataclass(frozen=True)
class Settings:
    """What the roles need of a Worker's configuration."""

    name: str
    concurrency: int
    lock_duration: float
    stalled_interval: float
    max_stalled_count: int
    drain_delay: float
    heartbeat_ttl: float
    max_result_bytes: int | None
    limit: tuple[int, int]  # rate limit: max jobs per window (0: none), window ms
    #: this Worker object's in the registry: two workers given one name differ by it
    token: str = field(default_factory=lambda: uuid.uuid4().hex)


class TakeTokens:
    """The arguments of a worker's next take: a lock token unique to the
    worker (a random prefix) and to the take (a counter), and its settings."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._base = uuid.uuid4().hex[:16]
        self._seq = itertools.count()

    def __call__(self) -> TakeArgs:
        s = self._settings
        limit_max, limit_ms = s.limit
        token = f"{self._base}{next(self._seq):x}"
        return TakeArgs(token, round(s.lock_duration * 1000), s.name, limit_max, limit_ms)


@dataclass
class Roles:
    """The objects of one run of a Worker."""

    gate: TakeGate
    table: AttemptTable
    abandoned: threading.Event
    dispatcher: ListenerDispatcher
    finisher: Finisher
    runner: Runner
    fetcher: Fetcher | ShardFetcher
    renewer: LockRenewer
    timeouts: TimeoutWatch
    maintenance: Maintenance
    cancels: CancelListener

    @classmethod
    def build(
        cls,
        context: QueueContext,
        settings: Settings,
        listeners: ListenerRegistry,
        *,
        paused: bool,
        handler_for: Callable[[Job], Callable[[Job], Any]],
        take_args: Callable[[], TakeArgs],
        status: Callable[[], Mapping[str, Any]],
    ) -> Roles:
        """Wire the roles of one run (nothing starts yet)."""
        s = settings
        table = AttemptTable(on_deadline=lambda: timeouts.loop.wake())
        gate = TakeGate()
        gate.set_paused(paused)
        slots = threading.Semaphore(s.concurrency)
        abandoned = threading.Event()
        dispatcher = ListenerDispatcher(listeners, f"jobq-listeners-{context.name}")
        emit = dispatcher.emit

        def on_error(exc: Exception) -> None:
            emit("error", exc)

        def on_lost(attempt: Attempt) -> None:
            error = LockLostError(f"lock of job {attempt.job_id!r} was lost")
            logger.warning("%s", error)
            emit("error", error)

        finisher = Finisher(
            context, table=table, gate=gate, take_args=take_args,
            lock_duration=s.lock_duration, max_result_bytes=s.max_result_bytes,
            abandoned=abandoned, emit=emit,
        )
        runner = Runner(
            context, concurrency=s.concurrency, worker_name=s.name, table=table, slots=slots,
            finisher=finisher, handler_for=handler_for, emit=emit, has_listener=listeners.has,
        )
        timeouts = TimeoutWatch(context, table, on_timeout=runner.timed_out, on_error=on_error)
        maintenance = Maintenance(
            context, worker_name=s.name, token=s.token, heartbeat_ttl=s.heartbeat_ttl,
            stalled_interval=s.stalled_interval, max_stalled_count=s.max_stalled_count,
            status=status, on_error=on_error,
        )
        runner.on_tick = maintenance.tick_taken
        return cls(
            gate=gate, table=table, abandoned=abandoned, dispatcher=dispatcher,
            finisher=finisher, runner=runner,
            fetcher=(ShardFetcher if isinstance(context, ShardedContext) else Fetcher)(
                context, worker_name=s.name, gate=gate, slots=slots, table=table,  # type: ignore[arg-type]
                hand_off=runner.submit, take_args=take_args, drain_delay=s.drain_delay,
                on_ready=lambda: emit("ready"), on_error=on_error,
            ),
            renewer=LockRenewer(
                context, table, s.lock_duration, on_lost=on_lost, on_error=on_error
            ),
            timeouts=timeouts,
            maintenance=maintenance,
            cancels=CancelListener(context, table, on_error=on_error),
        )

    def _loops(self) -> tuple[BackgroundLoop, ...]:
        return (self.renewer.loop, self.timeouts.loop, self.maintenance.loop, self.cancels.loop)

    def start(self) -> None:
        """Start every thread; the fetcher last, once the others can serve it."""
        self.dispatcher.start()
        self.runner.start()
        for loop in self._loops():
            loop.start()
        self.fetcher.start()

    def stop(
        self, worker: str, deadline: float | None, give_up: Callable[[], bool],
        context: QueueContext,
    ) -> float:
        """Stop taking; wait for jobs in flight until ``deadline`` or
        ``give_up()``, then abandon what is left; stop and join the threads
        (those inside user code excepted), cutting the connections of any
        stuck in a call past the deadline. Returns the time (monotonic) by
        which the rest of the close should be over."""
        self.gate.shut()
        self.fetcher.stop()
        self.gate.wait_idle(deadline)
        if not self.table.wait_empty(deadline, give_up=give_up):
            left = self.table.abandon()
            said = self.abandoned.is_set()  # by a try of this close that was interrupted
            self.abandoned.set()
            for attempt in left:
                attempt.cancel()
            if not said:
                logger.warning(
                    "worker %r closed with %d job(s) in flight; they will be recovered as "
                    "stalled", worker, len(left),
                )
        # the handler of an attempt that timed out runs on: in flight as far
        # as a close goes, until its deadline
        self.runner.wait_user_code(deadline, give_up)
        for loop in self._loops():
            loop.stop()
        self.cancels.stop()
        self.runner.stop()
        # the fetcher was told to stop at the start, the loops now: those
        # still in a call to the server at the deadline (or JOIN_GRACE from
        # now, without one) have their connections cut then, and JOIN_GRACE
        # more to end (a close of 2 s on a server that stopped answering
        # took 3.5 s when the cut came JOIN_GRACE past the deadline)
        until = time.monotonic() + JOIN_GRACE if deadline is None else deadline
        threads = [t for t in (self.fetcher.thread, *(loop.thread for loop in self._loops())) if t]
        threads += [t for t in self.runner.threads if not self.runner.in_user_code(t)]
        # threads still in a call to a server that does not answer: their
        # connections are cut (a shut-down socket wakes a blocked read), and
        # none of them connects again
        cut = functools.partial(cut_client, context.client)
        if not join_or_cut(threads, until - time.monotonic(), JOIN_GRACE,
                           context.scripts.refuse_calls, cut, self.fetcher.interrupt):
            logger.warning("worker %r: some threads did not end in time", worker)
        return until
