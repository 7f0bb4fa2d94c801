"""SIGINT / SIGTERM / SIGHUP for ``Worker.run`` and the ``jobq`` commands."""

from __future__ import annotations

import itertools
import logging
import signal
import threading
import time
from types import FrameType
from typing import Any

logger = logging.getLogger(__name__)

_HANGUP = getattr(signal, "SIGHUP", None)  # none on Windows
_STOPPING = tuple(s for s in (signal.SIGINT, signal.SIGTERM, _HANGUP) if s is not None)


class StopSignals:
    """The first SIGINT / SIGTERM / SIGHUP sets ``stopped``, a second sets
    ``forced``.

    SIGHUP (a closed terminal, a supervisor's reload) stops gracefully too:
    its default ended the process at once, leaving its jobs active until the
    stall check. A process started with SIGHUP ignored (``nohup``) keeps
    ignoring it, and an application's own SIGHUP handler (one that reopens
    its logs, say) stays.

    The handler only sets attributes: taking a lock in a signal handler (as
    ``Event.set()`` does) can deadlock with the main thread holding it, and
    ``next()`` on a counter tells a second signal from the first even when it
    interrupts the first one's handler. Use it as a context manager in the
    main thread; the previous handlers come back on exit.
    """

    def __init__(self, on_first: str = "", on_second: str = "") -> None:
        self.stopped = False
        self.forced = False
        self._signals = itertools.count(1)
        self._pause = threading.Event()  # never set: a sleep that is not time.sleep
        self._on_first, self._on_second = on_first, on_second
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if next(self._signals) == 1:
            self.stopped = True
            if self._on_first:
                logger.info(self._on_first, signal.Signals(signum).name)
        else:
            self.forced = True
            if self._on_second:
                logger.warning(self._on_second, signal.Signals(signum).name)

    def set(self) -> None:
        """Stop, as a first signal would (from any thread)."""
        self.stopped = True

    def __enter__(self) -> StopSignals:
        for signum in _STOPPING:
            if signum == _HANGUP and signal.getsignal(signum) != signal.SIG_DFL:
                continue  # nohup's ignore, or the application's own (logrotate's reopen)
            self._previous[int(signum)] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``, waking within 50 ms of a stop; True once stopped."""
        deadline = time.monotonic() + seconds
        while not self.stopped:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._pause.wait(min(left, 0.05))
        return True
