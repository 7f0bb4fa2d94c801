"""Background threads: naming, a capped retry backoff, joining on a deadline."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable


def start_thread(name: str, target: Callable[[], None]) -> threading.Thread:
    """Start a daemon thread named ``name`` running ``target``."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread


def join_all(threads: Iterable[threading.Thread], timeout: float | None) -> bool:
    """Join threads against one shared deadline; True if all ended."""
    deadline = None if timeout is None else time.monotonic() + timeout
    current = threading.current_thread()
    for thread in threads:
        if thread is current:
            continue
        thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    return not any(t.is_alive() for t in threads if t is not current)


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
