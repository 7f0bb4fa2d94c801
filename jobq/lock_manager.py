"""The Worker's lock renewal and timeout threads.

Renewal never waits behind anything else: it has its own thread, renews
every held lock in one call every ``lock_duration / 2``, and does nothing
but that. Timeouts have a thread of their own, since failing a timed-out
attempt may retry through an outage.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ._attempt import Attempt, AttemptTable
from ._context import QueueContext
from ._threads import BackgroundLoop
from .calls import WorkerScripts

logger = logging.getLogger("jobq.worker")  # the public module's name, as documented

#: Longest wait of the timeout thread between two looks (it is woken when a
#: deadline is set, so this only bounds a lost wake-up).
_TIMEOUT_LOOK = 60.0


class LockRenewer:
    """Renew the locks of every attempt in the table, in one call."""

    def __init__(
        self,
        context: QueueContext,
        table: AttemptTable,
        lock_duration: float,
        *,
        on_lost: Callable[[Attempt], None],
        on_error: Callable[[Exception], None],
    ) -> None:
        self._context = context
        self._table = table
        self._lock_ms = round(lock_duration * 1000)
        self._interval = lock_duration / 2
        self._on_lost = on_lost
        self._scripts = WorkerScripts(context.run)
        self.loop = BackgroundLoop(
            f"jobq-locks-{context.name}", self._step, on_error=on_error,
            cap=self._interval / 2, log=logger,
        )

    def _step(self) -> float:
        held = self._table.held()
        if held:
            sent = time.monotonic()
            lost, cancelled = self._scripts.extend_locks(
                self._lock_ms, [(a.job_id, a.token) for a in held]
            )
            for attempt in held:
                attempt.renewed = sent
                if attempt.token in cancelled:  # a cancel whose hint was missed
                    attempt.cancel()
                if attempt.token in lost:
                    attempt.lost = True
                    attempt.cancel()
                    if not attempt.claimed:  # a finishing call reports it itself
                        self._on_lost(attempt)
        return self._interval


class TimeoutWatch:
    """Fail attempts that run past their job's ``timeout``."""

    def __init__(
        self,
        context: QueueContext,
        table: AttemptTable,
        *,
        on_timeout: Callable[[Attempt], Any],
        on_error: Callable[[Exception], None],
    ) -> None:
        self._table = table
        self._on_timeout = on_timeout
        self.loop = BackgroundLoop(
            f"jobq-timeouts-{context.name}", self._step, on_error=on_error, cap=1.0,
            log=logger,
        )

    def _step(self) -> float:
        now = time.monotonic()
        wake = now + _TIMEOUT_LOOK
        for attempt in self._table.timed():
            assert attempt.deadline is not None
            if attempt.deadline > now:
                wake = min(wake, attempt.deadline)
            elif self._table.claim(attempt):
                attempt.cancel()
                self._on_timeout(attempt)
        return max(0.0, wake - time.monotonic())
