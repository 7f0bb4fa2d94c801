"""What the Worker's roles share: attempts in flight, and the gate for takes.

The fetcher and the runners add attempts to the ``AttemptTable`` the moment a
take returns; the lock renewer renews what it holds, the timeout watch fails
what overran, and ``close()`` / ``pause()`` wait for it to empty. The
``TakeGate`` says whether the worker may take a job now, and counts the takes
under way so that a pause or a close can wait for them. ``Pausing`` is a
worker's pause, over both.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._roles import Roles
    from ._tracing import AttemptSpan
    from .job import Job


class Attempt:
    """One run of one job by this worker, keyed by its lock token.

    ``record`` is the job's hash as the take returned it (flat field/value
    list); ``job`` is built from it by the runner, and ``error`` is what the
    attempt fails with instead of running (a record that cannot be read).
    ``span`` is its trace span while tracing is on (see _tracing.py).
    """

    __slots__ = (
        "job_id", "token", "record", "job", "deadline", "started", "renewed", "claimed", "error",
        "lost", "stop", "span",
    )

    def __init__(self, job_id: str, token: str, record: list[bytes]) -> None:
        self.job_id = job_id
        self.token = token
        self.record = record
        self.job: Job | None = None
        self.deadline: float | None = None  # monotonic; None: no timeout
        self.started = time.monotonic()
        # when the last renewal of its lock that got through was sent: the
        # lock lives at least a lock duration from then
        self.renewed = self.started
        self.claimed = False  # finalised, or being finalised: exactly once
        self.error: BaseException | None = None
        self.lost = False  # its lock is gone: renewed no more
        self.stop = False  # told to stop, maybe before its Job was built
        self.span: AttemptSpan | None = None

    def cancel(self) -> None:
        """Tell a cooperative handler to stop (``job.cancelled``); an
        attempt whose Job is not built yet gets it set when it is."""
        self.stop = True
        if self.job is not None:
            self.job.cancelled.set()

    def cancelled(self) -> bool:
        """Whether the attempt was told to stop."""
        return self.job is not None and self.job.cancelled.is_set()


class AttemptTable:
    """The attempts this worker holds, by token, under one condition."""

    def __init__(self, on_deadline: Callable[[], None] | None = None) -> None:
        self._cond = threading.Condition()
        self._attempts: dict[str, Attempt] = {}
        self._abandoned = False
        self._on_deadline = on_deadline

    def __len__(self) -> int:
        return len(self._attempts)

    def add(self, attempt: Attempt) -> None:
        """Hold an attempt: from now on its lock is renewed."""
        with self._cond:
            self._attempts[attempt.token] = attempt

    def set_deadline(self, attempt: Attempt, seconds: float) -> None:
        """Give a held attempt a timeout, counted from its take."""
        attempt.deadline = attempt.started + seconds
        if self._on_deadline is not None:
            self._on_deadline()

    def discard(self, attempt: Attempt) -> None:
        """Stop holding an attempt (finalised, or given up)."""
        with self._cond:
            self._attempts.pop(attempt.token, None)
            self._cond.notify_all()

    def held(self) -> list[Attempt]:
        """Attempts whose lock is to be renewed: all held whose lock is not
        lost, those being finished included (a slow finishing call must not
        let its job stall), until the finishing call returns."""
        with self._cond:
            return [a for a in self._attempts.values() if not a.lost]

    def timed(self) -> list[Attempt]:
        """Unclaimed attempts that have a deadline."""
        with self._cond:
            return [a for a in self._attempts.values() if a.deadline is not None and not a.claimed]

    def cancel_hinted(self, data: bytes | str) -> None:
        """A message of the cancel channel (cancel.lua): ``"<job id> <lock
        token>"``; tell the attempt it names that its job was cancelled. The
        token is matched, not the id alone: a channel's name has no database
        in it, and a job of the same id in another database of the server
        was cancelled too."""
        text = data.decode() if isinstance(data, bytes) else str(data)
        job_id, _, token = text.partition(" ")
        for attempt in self.by_job(job_id):
            if attempt.token == token:
                attempt.cancel()

    def by_job(self, job_id: str) -> list[Attempt]:
        """The attempts held for one job (one, but for a retried take)."""
        with self._cond:
            return [a for a in self._attempts.values() if a.job_id == job_id]

    def claim(self, attempt: Attempt) -> bool:
        """Take the right to finalise an attempt: False when it was taken
        already (its timeout fired) or the worker abandoned its jobs."""
        with self._cond:
            if attempt.claimed or self._abandoned:
                return False
            attempt.claimed = True
            return True

    def wait_empty(self, deadline: float | None, give_up: Callable[[], bool] = bool) -> bool:
        """Wait until no attempt is held, ``deadline`` (monotonic) passes or
        ``give_up()`` turns true (polled); True when empty."""
        with self._cond:
            while self._attempts:
                if give_up():
                    return False
                left = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def abandon(self) -> list[Attempt]:
        """Finalise nothing from now on; return the attempts left in flight."""
        with self._cond:
            self._abandoned = True
            return list(self._attempts.values())


class TakeGate:
    """Whether the worker may take jobs (not paused, not closing), and how
    many takes are under way: a take counts from before its call until the
    job it returned is in the AttemptTable."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._paused = False
        self._shut = False
        self._takes = 0

    @property
    def open(self) -> bool:
        """Whether a take may start now."""
        return not (self._paused or self._shut)

    def begin(self) -> bool:
        """Start a take if the gate is open; True if one was started."""
        with self._cond:
            if self._paused or self._shut:
                return False
            self._takes += 1
            return True

    def end(self) -> None:
        """A take started with ``begin`` is over."""
        with self._cond:
            self._takes -= 1
            self._cond.notify_all()

    def set_paused(self, paused: bool) -> None:
        """Close (pause) or reopen the gate."""
        with self._cond:
            self._paused = paused
            self._cond.notify_all()

    def shut(self) -> None:
        """Close the gate for good (the worker is closing)."""
        with self._cond:
            self._shut = True
            self._cond.notify_all()

    def wait_open(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the gate to be open; True if open."""
        with self._cond:
            return self._cond.wait_for(lambda: self.open or self._shut, timeout) and self.open

    def wait_idle(self, deadline: float | None) -> bool:
        """Wait until no take is under way or ``deadline`` passes."""
        with self._cond:
            while self._takes:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
            return True


class Pausing:
    """A worker's pause: the flag (under the worker's ``cond``, which
    ``start()`` reads it under too), the gate's pause, and the wait of
    ``pause()`` for the jobs in flight: all of them but those whose handlers
    wait in ``pause()`` too (a handler's own job cannot end while it waits).
    """

    def __init__(self, cond: threading.Condition) -> None:
        self.cond = cond  # the worker's (made anew in a forked child)
        self.paused = False
        self._parked: list[Attempt] = []  # attempts of handlers waiting in pause()

    def pause(
        self, roles_of: Callable[[], Roles | None], wait: bool, timeout: float | None,
        closed: Callable[[], bool],
    ) -> bool:
        """Pause; wait as ``Worker.pause`` says. True if this call paused."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:  # the flag and the gate change together (see resume)
            first = not self.paused
            self.paused = True
            roles = roles_of()
            if roles is not None and first:
                roles.gate.set_paused(True)
        if roles is not None:
            if first:
                roles.fetcher.wake()  # a take sent behind a block ends now
            roles.gate.wait_idle(deadline)
            if wait:
                self._wait_jobs(roles, deadline, closed)
        return first

    def resume(self, roles_of: Callable[[], Roles | None]) -> bool:
        """Take jobs again; True if the worker was paused."""
        with self.cond:  # a pause and a resume at once: the gate ends as the flag
            if not self.paused:
                return False
            self.paused = False
            roles = roles_of()
            if roles is not None:
                roles.gate.set_paused(False)
        return True

    def _wait_jobs(self, roles: Roles, deadline: float | None, closed: Callable[[], bool]) -> None:
        from .tasks import current_job  # the job of the calling handler, if any

        table = roles.table
        job = current_job() if threading.current_thread() in roles.runner.threads else None
        own = [a for a in table.by_job(job.id) if a.job is job] if job is not None else []
        with self.cond:
            self._parked += own

        def done() -> bool:  # resumed, closed, or only parked handlers' jobs left
            if not self.paused or closed():
                return True
            with self.cond:
                parked = list(self._parked)
            waiting = sum(1 for a in parked if any(b is a for b in table.by_job(a.job_id)))
            return len(table) <= waiting

        try:
            table.wait_empty(deadline, give_up=done)
        finally:
            with self.cond:
                for attempt in own:
                    self._parked.remove(attempt)
