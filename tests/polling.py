"""Bounded polling for tests: wait for a condition another thread or
process brings about, and fail clearly when it does not come."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def until(predicate: Callable[[], T], timeout: float = 20.0, interval: float = 0.01) -> T:
    """Poll ``predicate`` until it returns something truthy and return that;
    raise AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        pause.wait(interval)


def jobq_threads(queue_name: str) -> list[str]:
    """The names of the live jobq threads of a queue (they end in its name)."""
    return [t.name for t in threading.enumerate()
            if t.name.startswith("jobq-") and t.name.endswith(queue_name) and t.is_alive()]



def close_while_stopped(
    server: Any, close: Callable[[], object], queue_name: str
) -> tuple[list[str], float]:
    """Stop ``server`` (SIGSTOP: it accepts connections and answers
    nothing), call ``close``, let the server go on; return the queue's jobq
    threads still alive after the close and the seconds it took."""
    server.kill(signal.SIGSTOP)
    try:
        start = time.monotonic()
        close()
        return jobq_threads(queue_name), time.monotonic() - start
    finally:
        server.kill(signal.SIGCONT)
