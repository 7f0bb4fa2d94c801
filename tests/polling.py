"""Bounded polling for tests: wait for a condition another thread or
process brings about, and fail clearly when it does not come."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

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
