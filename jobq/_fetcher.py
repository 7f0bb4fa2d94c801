"""The Worker's fetch thread: takes jobs and hands them to the runners.

It blocks on the queue's marker key (BZPOPMIN, at most ``BLOCK_CAP`` at a
time) on a connection of its own, takes a job when one may be ready and a
pool slot is free, puts it under lock renewal (the AttemptTable) before
anything else, and hands it over.

While jobs come (one was taken within the last ``drain_delay``) and a slot
is free, the take is sent with the BZPOPMIN, in one write: the server runs
it as soon as the block ends, and the job comes back with the marker, with
no round trip between the two. The take then counts as under way for the
whole block, so ``pause()`` and ``close()`` wake the block (``wake``). An
idle worker blocks on the marker alone, as before.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ._attempt import Attempt, AttemptTable, TakeGate
from ._checks import warn_if_evicting
from ._context import QueueContext
from ._threads import BackgroundLoop, reached
from .calls import TakeArgs, WorkerScripts
from .connection import (
    BLOCK_CAP,
    Blocked,
    blocking_client,
    call_on,
    client_id,
    close_client,
    cut_client,
    pooled,
    take_connection,
    unblock,
)

logger = logging.getLogger("jobq.worker")  # the public module's name, as documented

#: ``Fetcher._fetch``'s answer when a take to send behind a block finds no
#: free slot: the fetcher blocks on the marker alone.
_NO_SLOT = -1.0


class Fetcher:
    """Take jobs while the gate is open and a slot is free.

    Args:
        context: the worker's queue context.
        gate: whether taking is allowed; counts takes under way.
        slots: one per pool thread; a take holds one until its chain ends.
        table: where a taken job is held (its lock renewed) at once.
        hand_off: gives a taken attempt to a pool thread.
        take_args: the arguments of the next take (a fresh token each).
        drain_delay: longest idle time between two looks at the queue.
        on_ready: called once, after the first take.
        on_error: a failed round (logged already).
    """

    def __init__(
        self,
        context: QueueContext,
        *,
        worker_name: str,
        gate: TakeGate,
        slots: threading.Semaphore,
        table: AttemptTable,
        hand_off: Callable[[Attempt], None],
        take_args: Callable[[], TakeArgs],
        drain_delay: float,
        on_ready: Callable[[], None],
        on_error: Callable[[Exception], None],
    ) -> None:
        self._context = context
        self._name = f"jobq-fetch-{worker_name}"
        self._gate = gate
        self._slots = slots
        self._table = table
        self._hand_off = hand_off
        self._take_args = take_args
        self._drain_delay = drain_delay
        self._on_ready = on_ready
        self._on_error = on_error
        self._blocker: Any = None
        self._held: Any = None  # the blocker's one connection (a plain client's)
        self._blocked_id: Blocked | None = None
        self._unsure: TakeArgs | None = None  # a take whose reply was lost
        self._blocking_take = False  # a take waits behind a BZPOPMIN
        self._due_at: float | None = None
        self._last_fetch = 0.0
        self._hot_until = 0.0  # a take sent with each block until then
        self._need_fetch = True
        self._ready = False
        self._loop = BackgroundLoop(
            f"jobq-fetch-{context.name}", self._step, on_error=self._failed,
            on_exit=self._close, log=logger,
        )

    @property
    def thread(self) -> threading.Thread | None:
        """The fetch thread, once started."""
        return self._loop.thread

    def start(self) -> None:
        """Start the fetch thread."""
        self._loop.start()

    def stop(self) -> None:
        """Stop taking; wake a blocked read so that the thread ends at once."""
        self._loop.stop()
        unblock(self._context.client, self._blocked_id)

    def wake(self) -> None:
        """End a block that has a take sent with it (the gate has just been
        closed: its take, under way, must end now, not when the block does)."""
        if self._blocking_take:
            unblock(self._context.client, self._blocked_id)

    def interrupt(self) -> None:
        """Cut the fetch connection under a call that does not return (from
        another thread, when stopping)."""
        cut_client(self._blocker)

    def _connect(self) -> Any:
        if self._blocker is None:
            self._blocker = blocking_client(self._context.client, self._name)
            if self._loop.stopping:  # stopped before the client was there to cut
                raise ConnectionError("the worker is closing")
            self._blocked_id = client_id(self._blocker, self._context.keys.marker)
            warn_if_evicting(self._blocker)
            if pooled(self._blocker):
                # kept for every pop and take, not lent by the pool for each
                # (a loan polls the socket and keeps the pool's books); the
                # pool's only connection, whose id ``client_id`` recorded
                self._held = take_connection(self._blocker.connection_pool)
        return self._blocker

    def _failed(self, exc: Exception) -> None:
        if self._blocker is not None:
            close_client(self._blocker)
            self._blocker = self._held = None
        self._need_fetch = True
        self._on_error(exc)

    def _step(self) -> float:
        if not self._gate.wait_open(BLOCK_CAP):
            return 0.0
        if self._need_fetch or time.monotonic() - self._last_fetch >= self._drain_delay:
            wait = self._fetch()
            if wait is not None:
                return wait
            reached()  # the take reached the server, whatever becomes of the block
        wait = min(BLOCK_CAP, self._drain_delay)
        if self._due_at is not None:
            wait = min(wait, self._due_at - time.monotonic())
        if wait <= 0:
            self._need_fetch = True
            return 0.0
        if self._held is not None and time.monotonic() < self._hot_until:
            after = self._fetch(pop=wait)
            if after != _NO_SLOT:
                return after or 0.0
        popped = self._pop(wait)
        self._need_fetch = popped is not None or (
            self._due_at is not None and time.monotonic() >= self._due_at
        )
        return 0.0

    def _fetch(self, pop: float | None = None) -> float | None:
        """One take: seconds to wait before the next step, or None to block
        on the marker. With ``pop``, the take is sent behind a BZPOPMIN of
        that many seconds, if a slot is free now (else ``_NO_SLOT``)."""
        if pop is not None:
            if not self._slots.acquire(blocking=False):
                return _NO_SLOT
        elif not self._slots.acquire(timeout=BLOCK_CAP):
            return 0.0
        if not self._gate.begin():  # paused or closing since the slot came
            self._slots.release()
            return 0.0
        held = False
        try:
            run = self._run if pop is None else functools.partial(self._pop_then_run, pop)
            scripts = WorkerScripts(run)
            retried = self._unsure is not None
            take = self._unsure or self._take_args()
            self._unsure = take  # until its reply is read
            reply = scripts.take(take, retried=retried)
            self._unsure = None
            self._last_fetch = time.monotonic()
            if reply.taken is not None:
                self._hot_until = self._last_fetch + self._drain_delay
                job_id, token, record = reply.taken
                attempt = Attempt(job_id, token, record)
                self._table.add(attempt)  # under lock renewal from now on
                held = True
                self._hand_off(attempt)
        finally:
            self._gate.end()
            if not held:
                self._slots.release()
        if not self._ready:
            self._ready = True
            self._on_ready()
        if reply.taken is not None:
            # take again at once only when more jobs wait; else block on the
            # marker, which a job made ready since wakes at once
            self._need_fetch = reply.more
            if not reply.more:
                # about to block on the marker: let the pool thread handed
                # the job run now, not after this thread's way to its read
                time.sleep(0)
            return 0.0
        if reply.limited_ms:
            return min(reply.limited_ms / 1000.0, BLOCK_CAP)
        ms = reply.next_delay_ms
        self._due_at = None if ms < 0 else self._last_fetch + ms / 1000.0
        self._need_fetch = False
        return None

    def _pop(self, wait: float) -> Any:
        """BZPOPMIN on the marker for at most ``wait`` seconds (None if
        nothing came)."""
        blocker = self._connect()
        if self._held is None:
            return blocker.bzpopmin(self._context.keys.marker, wait)
        return call_on(self._held, "BZPOPMIN", self._context.keys.marker, wait,
                       check_health=False)

    def _pop_then_run(self, wait: float, script: str, *argv: Any) -> Any:
        """BZPOPMIN on the marker for at most ``wait`` seconds, then script
        ``script``, in one write (see the module's docstring)."""
        self._blocking_take = True
        try:
            _, reply = self._context.scripts.run_after(
                self._held, ("BZPOPMIN", self._context.keys.marker, wait), script,
                self._context.keys.base, *argv,
            )
        finally:
            self._blocking_take = False
        return reply

    def _run(self, script: str, *argv: Any) -> Any:
        blocker = self._connect()
        if self._held is not None:
            return self._context.scripts.run_on(
                self._held, script, self._context.keys.base, *argv
            )
        return self._context.scripts.run(
            script, self._context.keys.base, *argv, client=blocker
        )

    def _close(self) -> None:
        if self._blocker is not None:
            close_client(self._blocker)
            self._blocker = self._held = None
