"""A thread's wait for a job through a QueueEvents (``wait_for``): its
deadline, the first look at the job's record, and the loop that sleeps until
the reader answers (or a check of the record does)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ._threads import wait_event
from ._waiters import Waiter
from .connection import is_transient
from .errors import ClosedError, WaitUntilFinishedTimeoutError

if TYPE_CHECKING:
    from .queue_events import QueueEvents

#: Longest single sleep of a waiting thread with no deadline (it only loops).
WAIT_SLICE = 60.0
#: Seconds before a check that failed on a transient error is tried again.
RETRY_CHECK = 0.25
#: Seconds a wait's first look at the job's record (and at its result) may
#: take past a shorter timeout: ``timeout=0`` asks whether the job has
#: finished, and the look is a round trip.
FIRST_LOOK = 1.0


class ThreadWait:
    """One call of ``QueueEvents.wait_for``: the job, its timeout (None: no
    limit), and the time its first look at the record may take (a short
    timeout still gets it)."""

    def __init__(self, events: QueueEvents, job_id: str, timeout: float | None) -> None:
        self._events = events
        self.job_id, self.timeout = job_id, timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.look_by = None if self.deadline is None else \
            max(self.deadline, time.monotonic() + FIRST_LOOK)
        self._unread: Exception | None = None  # why the last look at the record failed

    def remaining(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def to_look(self) -> float | None:  # a short timeout still gets its look
        return None if self.look_by is None else max(0.0, self.look_by - time.monotonic())

    def _timed_out(self) -> WaitUntilFinishedTimeoutError:
        """The timeout's error; its last look at the record failed: saying so
        (the job may have finished: a slot moving refused the look)."""
        unread = self._unread
        error = WaitUntilFinishedTimeoutError(
            self.job_id, float(self.timeout or 0), str(unread) if unread else None)
        error.__cause__ = unread
        return error

    def _closed(self) -> ClosedError:
        return ClosedError(f"QueueEvents {self._events.name!r} closed during the wait")

    def ready(self) -> None:
        """Wait for the reader to be ready (within the first look)."""
        events = self._events
        if events.closed:
            raise ClosedError(f"QueueEvents {events.name!r} is closed")
        reader = events._reader
        if not events.wait_until_ready(0):
            # the first use: an unreachable server is an error, as for a Queue
            wait_event(reader.tried, self.to_look())
            if events.closed:  # its first connect cut by the close
                raise self._closed()
            error = reader.unreachable
            if error is not None and not reader.ready.is_set():
                raise type(error)(*error.args)
        if not events.wait_until_ready(self.to_look()):
            if events.closed:
                raise self._closed()
            raise self._timed_out()

    def result(self, run: str | None, fresh: bool) -> Any:
        """Wait for the outcome of ``run`` (see ``wait_for``); its result."""
        self.ready()
        events, table = self._events, self._events._table
        # no run: the reader answers it once a look at the record named its run
        waiter = Waiter(self.job_id, run, stale=not fresh or run is None)
        unseen = table.register(waiter, fresh and events._reader.follows(run))
        try:
            # a run the reader has not yet seen end needs no look at its
            # record, unless there is no time to wait: its last event will
            # reach this waiter
            checked = True if unseen and self.remaining() != 0.0 else \
                self._try_check(waiter, self.look_by)
            while waiter.outcome is None:
                left = self.remaining()
                if left is not None and left <= 0:
                    raise self._timed_out()
                # Woken when answered, or poked to check the record (after a
                # reconnect, or when a batched look could not decide); a
                # check that failed (server away, slot migrating) is retried
                # soon. The periodic look at the record is the waker's,
                # batched: ten thousand threads each waking to check their
                # own kept the process busy with wake-ups (bench/load, L1).
                wait = WAIT_SLICE if checked else RETRY_CHECK
                if left is not None:
                    wait = min(left, wait)
                if not wait_event(waiter.event, wait):
                    if checked:
                        continue
                elif waiter.outcome is not None:
                    break
                waiter.event.clear()
                if waiter.outcome is None and self.remaining() != 0.0:
                    checked = self._try_check(waiter, self.deadline)
            return events._result(waiter, self.look_by)
        finally:
            table.unregister(waiter)
            waiter.resumed()  # the reader wakes more threads once this one is done

    def _try_check(self, waiter: Waiter, deadline: float | None) -> bool:
        """The waiter's record check; False when it failed for now (a lost
        connection, a BUSY or LOADING reply, a slot moving: kept for the
        timeout's error). A check cut by ``close()`` (its connection
        dropped under it, which some redis-py versions report as any error)
        raises ClosedError. ``deadline``: the waiting thread's own (see
        ``WaiterTable.check``)."""
        try:
            self._events._table.check(waiter, deadline)
        except Exception as exc:
            if self._events.closed:
                raise self._closed() from None
            if not is_transient(exc):
                raise
            self._unread = exc
            return False
        self._unread = None
        return True
