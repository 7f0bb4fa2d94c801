"""Background threads: naming, a capped retry backoff, joining on a deadline,
and the one guarded loop every background thread of jobq runs."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import redis

from . import _fork
from ._sentinel import brief

logger = logging.getLogger(__name__)


def wait_event(event: threading.Event, timeout: float | None) -> bool:
    """``event.wait(timeout)``, which returns at once if ``event`` is set.

    Under gevent's monkey-patching (a gunicorn gevent worker) a wait on a set
    event is put behind the wake-up of its earlier waiters, if one is still
    due; when the last of those waiters leaves first (its timeout ran out),
    that wake-up is cancelled and the later wait never returns, whatever its
    timeout (gevent 26.9). A request of such a worker hung for ever in
    ``wait_until_finished``. Asking first never waits on a set event."""
    return event.is_set() or event.wait(timeout)


def start_thread(name: str, target: Callable[[], None]) -> threading.Thread:
    """Start a daemon thread named ``name`` running ``target``."""
    thread = threading.Thread(target=_fork.body(target), name=name, daemon=True)
    _fork.thread_started(thread)
    thread.start()
    return thread


def join_all(threads: Iterable[threading.Thread], timeout: float | None) -> bool:
    """Join threads against one shared deadline; True if all ended."""
    deadline = None if timeout is None else time.monotonic() + timeout
    current = threading.current_thread()
    threads = [t for t in threads if t is not current]
    for thread in threads:
        thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    return not any(t.is_alive() for t in threads)


def join_or_cut(
    threads: Iterable[threading.Thread], timeout: float | None, grace: float,
    *cuts: Callable[[], object],
) -> bool:
    """Join threads for ``timeout``; if some are left (stuck in a call to a
    server that does not answer), call each of ``cuts`` (they cut those
    threads' connections) and join them for ``grace`` more. True if all ended."""
    threads = list(threads)
    if join_all(threads, timeout):
        return True
    for cut in cuts:
        cut()
    return join_all(threads, grace)


class RetryBackoff:
    """Capped exponential backoff with jitter, for background loops."""

    def __init__(self, base: float = 0.05, cap: float = 5.0) -> None:
        self._base = base
        self._cap = cap
        self._failures = 0

    def next(self) -> float:
        """Seconds to wait after one more consecutive failure."""
        self._failures += 1
        delay = min(self._cap, self._base * 2 ** min(self._failures - 1, 20))
        return float(delay * (0.5 + random.random() / 2))

    def reset(self) -> None:
        """Forget past failures after a success."""
        self._failures = 0

    @property
    def failures(self) -> int:
        """Consecutive failures so far."""
        return self._failures


#: Failures that say a connection was lost (redis-py's ConnectionError and
#: TimeoutError are not OSErrors; a socket's own errors are).
DROPPED = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)

#: The BackgroundLoop each thread runs, by thread id: a ``threading.local``
#: made before gevent's monkey-patching is one for every greenlet.
_running: dict[int, BackgroundLoop] = {}


def reached() -> None:
    """Tell the BackgroundLoop running this thread that its step has made
    its connection and used it: if the connection drops later in the step,
    that is the first failure in a row, retried after the shortest wait.
    Without it, a connection dropped again and again while it waits (a
    proxy's idle timeout, CLIENT KILL) would wait longer each time, as for
    a server that cannot be reached."""
    loop = _running.get(threading.get_ident())
    if loop is not None:
        loop._reached = True


class BackgroundLoop:
    """A named daemon thread that runs ``step()`` until ``stop()``.

    ``step`` returns how many seconds to wait before the next step (0 for at
    once); ``wake()`` cuts a wait short. An exception from a step never ends
    the loop: it is logged (the first few in a row, then every 20th), given
    to ``on_error``, and the next step comes after a capped backoff.
    ``on_error`` itself may not raise; ``on_exit`` runs on the thread when
    the loop ends (to close what the loop opened). ``start()`` runs it on a
    thread of its own, ``run()`` on the calling thread.
    """

    def __init__(
        self,
        name: str,
        step: Callable[[], float],
        *,
        on_error: Callable[[Exception], Any] | None = None,
        on_exit: Callable[[], Any] | None = None,
        cap: float = 5.0,
        stop: threading.Event | None = None,
        log: logging.Logger = logger,
    ) -> None:
        self.name = name
        self._step = step
        self._on_error = on_error
        self._on_exit = on_exit
        self._log = log
        self._backoff = RetryBackoff(cap=cap)
        self._reached = False  # see reached()
        # a stop Event of the owner's: the loop also ends when it is set
        # (then its waits are on it, and wake() has no effect)
        self._stop = stop or threading.Event()
        self._wake = self._stop if stop is not None else threading.Event()
        self.thread: threading.Thread | None = None

    @property
    def stopping(self) -> bool:
        """Whether ``stop()`` was called."""
        return self._stop.is_set()

    def start(self) -> BackgroundLoop:
        """Start the thread; return self."""
        self.thread = start_thread(self.name, self._run)
        return self

    def stop(self) -> None:
        """Ask the loop to end after its current step (from any thread)."""
        self._stop.set()
        self._wake.set()

    def wake(self) -> None:
        """End the current wait between steps at once."""
        self._wake.set()

    def sleep(self, seconds: float) -> bool:
        """Wait up to ``seconds`` inside a step; True if the loop was stopped."""
        return wait_event(self._stop, seconds)

    def run(self) -> None:
        """Run the loop on the calling thread until stopped."""
        self._run()

    def _run(self) -> None:
        ident = threading.get_ident()
        _running[ident] = self
        try:
            self._loop()
        finally:
            _running.pop(ident, None)
            if self._on_exit is not None:
                self._on_exit()

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self._wake is not self._stop:
                self._wake.clear()  # before the step, so no wake-up is lost
            self._reached = False
            try:
                wait = self._step()
                if self._backoff.failures:  # the end of an outage, said as its start was
                    self._log.info("%s: working again after %d failure(s) in a row",
                                   self.name, self._backoff.failures)
                self._backoff.reset()
            except Exception as exc:
                if self._stop.is_set():
                    break
                if self._reached and isinstance(exc, DROPPED):
                    self._backoff.reset()  # made again, then dropped: not in a row
                wait = self._backoff.next()
                failures = self._backoff.failures
                if failures <= 3 or failures % 20 == 0:
                    self._log.warning(
                        "%s: %s: %s (%d in a row); again in %.2f s",
                        self.name, type(exc).__name__, brief(exc), failures, wait,
                    )
                if self._on_error is not None:
                    self._on_error(exc)
            if wait > 0:
                wait_event(self._wake, wait)
