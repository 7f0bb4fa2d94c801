"""A Worker's lifecycle: one state under one condition, moved forward only
by the transitions of ``start()`` and ``close()`` (see worker.py), and the
sequence in which a close shuts a running worker down."""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable

from . import _tracing
from ._context import QueueContext
from ._roles import Roles
from ._signals import StopSignals
from .errors import ClosedError
from .registry import withdraw

logger = logging.getLogger("jobq.worker")  # the public module's name, as documented

#: Least time a close with no timeout gives its last call, leaving the
#: worker registry, however long its threads took to end.
LEAVE_GRACE = 1.0
#: Least time ``close()`` gives the listeners' thread to deliver ``closed``
#: and end, when the close ran past its deadline.
LISTENER_GRACE = 0.5
#: Times a close that failed with an error (not an interruption such as a
#: Ctrl-C, after which it always goes on) starts its rest again, forced.
CLOSE_TRIES = 3


class Lifecycle(enum.Enum):
    """Where a Worker is in its life; it only ever moves forward."""

    NEW = "new"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"


class CloseStep(enum.Enum):
    """What a ``close()`` call has to do, as ``WorkerState.begin_close`` decides."""

    NEVER_STARTED = "never started"  # closed now: close what __init__ opened
    STARTING = "starting"  # the same, and end the wait of a start under way
    SHUT_DOWN = "shut down"  # this call closes the running worker
    DONE = "done"  # another call closes (or closed) it


class WorkerState:
    """A Worker's ``Lifecycle`` under its condition (shared with its pause),
    and what its start and close track beside it."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.state = Lifecycle.NEW
        self.starting = False  # a start() is under way
        self.force = False  # set by close(force=True) or a second signal; read, never waited
        self._closer: int | None = None  # the thread that began the close
        self.signals: StopSignals | None = None  # those of a run() in the main thread

    def forced(self) -> bool:
        """Whether the close under way is to abandon the jobs in flight."""
        signals = self.signals
        return self.force or (signals is not None and signals.forced)

    def serve(self, name: str, start: Callable[[], object], close: Callable[[], None]) -> None:
        """``Worker.run``: ``start()``, then wait for the close; in the main
        thread, a first SIGINT / SIGTERM / SIGHUP makes it ``close()``, a second one
        forces that close."""
        if threading.current_thread() is not threading.main_thread():
            start()
            self.wait_closed()
            return
        with StopSignals(
            f"%s: closing worker {name!r} gracefully (again to force)",
            f"%s again: closing worker {name!r} at once",
        ) as signals:
            self.signals = signals
            try:
                start()
                while not signals.wait(0.5) and self.state is Lifecycle.RUNNING:
                    pass
                close()
            finally:
                self.signals = None

    def begin_start(self, name: str) -> bool:
        """Take the start, once any other thread's start has ended; False
        when the worker runs already."""
        with self.cond:
            while self.starting:  # another thread's start (its waits are bounded)
                self.cond.wait(1.0)
            if self.state in (Lifecycle.CLOSING, Lifecycle.CLOSED):
                raise ClosedError(f"worker {name!r} is closed")
            if self.state is Lifecycle.RUNNING:
                return False
            self.starting = True
        return True

    def end_start(self) -> None:
        with self.cond:
            self.starting = False
            self.cond.notify_all()

    def begin_close(self, force: bool, waits: Callable[[], bool],
                    timeout: float | None) -> CloseStep:
        """Move to CLOSED (never started) or CLOSING (running). A call while
        another closes waits for it (``timeout``) when ``waits()``, and
        returns at once on the thread already closing (a signal handler's:
        ``force`` is seen)."""
        with self.cond:
            if force:
                self.force = True
            if self.state is Lifecycle.NEW:
                self.state = Lifecycle.CLOSED
                self.cond.notify_all()
                return CloseStep.STARTING if self.starting else CloseStep.NEVER_STARTED
            if self.state is Lifecycle.RUNNING:
                self.state = Lifecycle.CLOSING
                self._closer = threading.get_ident()
                return CloseStep.SHUT_DOWN
            if self._closer != threading.get_ident() and waits():
                self.cond.wait_for(lambda: self.state is Lifecycle.CLOSED, timeout)
            return CloseStep.DONE

    def closed(self) -> None:
        with self.cond:
            self.state = Lifecycle.CLOSED
            self.cond.notify_all()

    def shut_down(self, attempt: Callable[[set[str]], None]) -> None:
        """Run ``attempt`` (``shut_down`` of the running worker, given the
        events delivered so far) to its end, then move to CLOSED.
        Interrupted in one of its waits (a second Ctrl-C in a `with` block's
        exit), it goes on at once, abandoning the jobs in flight as a forced
        close does, so that no thread, lock renewal or heartbeat outlives
        it; a further Ctrl-C starts that again (each try is a few seconds at
        most), an error CLOSE_TRIES times at most; then the first goes on up."""
        delivered: set[str] = set()  # the close's events, each delivered once
        interrupted: BaseException | None = None
        failures = 0
        try:
            while True:
                try:
                    attempt(delivered)
                    break
                except BaseException as exc:
                    interrupted = interrupted or exc
                    self.force = True
                    failures += isinstance(exc, Exception)
                    if failures >= CLOSE_TRIES:
                        break
        finally:
            self.closed()
        if interrupted is not None:
            raise interrupted

    def wait_closed(self) -> None:
        with self.cond:
            while self.state is not Lifecycle.CLOSED:
                self.cond.wait(1.0)

    def after_fork(self) -> bool:
        """In a forked child: a new condition, and NEW again if the parent
        ran (True then: none of its run is here)."""
        self.cond = threading.Condition()
        self.signals = None
        if self.state in (Lifecycle.RUNNING, Lifecycle.CLOSING):
            self.state = Lifecycle.NEW
            return True
        return False


def shut_down(
    roles: Roles, name: str, deadline: float | None, give_up: Callable[[], bool],
    close_channel: Callable[[float], None], context: QueueContext, run_context: QueueContext,
    delivered: set[str],
) -> None:
    """Close a running worker: stop its roles (``Roles.stop``), close its
    event channel, leave the registry, deliver ``closed``, close its contexts.
    Each step may run again, in a close that goes on after an interruption:
    ``delivered`` holds the events delivered already (each once)."""

    def emit(name: str) -> None:
        if name not in delivered:
            delivered.add(name)
            roles.dispatcher.emit(name)

    emit("closing")
    until = roles.stop(name, deadline, give_up, run_context)
    close_channel(max(0.0, until - time.monotonic()))
    _leave_registry(context, name, roles.maintenance.token, until, deadline)
    emit("closed")
    if deadline is None:  # a listener that runs is waited for, as a handler is
        roles.dispatcher.stop(None, give_up)
    # past the deadline, or forced, too: the thread ends at once unless a listener runs
    roles.dispatcher.stop(max(LISTENER_GRACE, until - time.monotonic()))
    hook = _tracing.hook
    if hook is not None:  # the attempts' spans leave before the process may end
        # within the close's timeout: 5 s at most without one
        hook.flush(5.0 if deadline is None else max(0.0, deadline - time.monotonic()))
    if run_context is not context:
        run_context.close()
    context.close()


def _leave_registry(context: QueueContext, name: str, token: str, until: float,
                    deadline: float | None) -> None:
    """Withdraw a closing worker from the registry: by ``until`` (the close's
    end) with a timeout, else always, with LEAVE_GRACE of its own (its threads
    may have used all their grace on a busy machine)."""
    leave_by = until if deadline is not None else max(until, time.monotonic() + LEAVE_GRACE)
    if time.monotonic() < leave_by:
        try:
            withdraw(context, name, token, leave_by)
        except Exception as exc:  # best effort: the announcement expires anyway
            logger.debug("worker %r could not leave the registry: %s", name, exc)
