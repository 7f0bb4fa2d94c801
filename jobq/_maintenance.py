"""The Worker's maintenance thread: its heartbeat in the registry, and the
periodic check for jobs of dead workers (stalled jobs)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from ._context import QueueContext
from ._threads import BackgroundLoop
from .calls import WorkerScripts
from .registry import announce

logger = logging.getLogger("jobq.worker")  # the public module's name, as documented

#: Stalled jobs recovered per script call.
STALLED_BATCH = 1000


class Maintenance:
    """Beat every ``heartbeat_ttl / 3``; look for stalled jobs every
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
        self.loop = BackgroundLoop(
            f"jobq-maint-{context.name}", self._step, on_error=on_error, log=logger
        )

    def _step(self) -> float:
        now = time.monotonic()
        if now >= self._next_beat:
            self._beat()
            self._next_beat = now + self._ttl / 3
        if now >= self._next_check:
            self._check_stalled()
            self._next_check = now + self._interval
        return max(0.0, min(self._next_beat, self._next_check) - time.monotonic())

    def _beat(self) -> None:
        try:
            announce(self._context, self._name, self._ttl, first=self._first_beat,
                     **self._status())
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
