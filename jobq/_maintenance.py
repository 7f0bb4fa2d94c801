"""The Worker's maintenance thread: its heartbeat in the registry, and the
periodic check for jobs of dead workers (stalled jobs)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from ._context import QueueContext
from ._threads import BackgroundLoop
from .registry import announce
from .scripts import WorkerScripts

logger = logging.getLogger(__name__)

#: Stalled jobs recovered per script call.
STALLED_BATCH = 1000
#: Seconds between looks at the worker's counts: a change is announced at
#: the next look (at most one extra heartbeat a second, none while idle), so
#: that `jobq info` and `get_workers()` are never a whole beat late.
STATUS_INTERVAL = 1.0


class Maintenance:
    """Beat every ``heartbeat_ttl / 3``, and within ``STATUS_INTERVAL`` of a
    change of the worker's counts; look for stalled jobs every
    ``stalled_interval`` (one worker of the queue per interval does it)."""

    def __init__(
        self,
        context: QueueContext,
        *,
        worker_name: str,
        heartbeat_ttl: float,
        stalled_interval: float,
        max_stalled_count: int,
        status: Callable[[], Mapping[str, Any]],
        on_error: Callable[[Exception], None],
    ) -> None:
        self._context = context
        self._name = worker_name
        self._ttl = heartbeat_ttl
        self._interval = stalled_interval
        self._max_stalled = max_stalled_count
        self._status = status
        self._scripts = WorkerScripts(context.run)
        now = time.monotonic()
        self._next_beat = now
        self._next_check = now
        self._first_beat = True
        self._announced: dict[str, Any] | None = None
        self.loop = BackgroundLoop(f"jobq-maint-{context.name}", self._step, on_error=on_error)

    def _step(self) -> float:
        now = time.monotonic()
        status = dict(self._status())
        if now >= self._next_beat or status != self._announced:
            self._beat(status)
            self._next_beat = now + self._ttl / 3
        if now >= self._next_check:
            self._check_stalled()
            self._next_check = now + self._interval
        wake = min(self._next_beat, self._next_check, now + STATUS_INTERVAL)
        return max(0.0, wake - time.monotonic())

    def _beat(self, status: dict[str, Any]) -> None:
        # a failed beat is tried again on schedule, not at every look
        self._announced = status
        try:
            announce(self._context, self._name, self._ttl, first=self._first_beat, **status)
        except Exception as exc:  # the announcement expires by itself; try next time
            logger.warning("heartbeat of worker %r failed: %s", self._name, exc)
            return
        self._first_beat = False

    def _check_stalled(self) -> None:
        guard = round(self._interval * 1000)
        while not self.loop.stopping:
            ids = self._scripts.stalled_check(self._max_stalled, guard, STALLED_BATCH)
            if ids:
                logger.warning(
                    "recovered %d stalled job(s) of %r", len(ids), self._context.name
                )
            if len(ids) < STALLED_BATCH:
                return
            guard = 0  # more to do in this round
