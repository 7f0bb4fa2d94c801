"""Cancellation: ``Queue.cancel`` (a mixin of Queue), and the worker's
listener that sets a running job's ``cancelled`` event when it is cancelled.

cancel.lua writes a durable mark on an active job (its reason) and publishes
the job's id on the queue's cancel channel (a sharded channel of the queue's
slot). The hint only makes the worker quick: the mark is also read at take
(the record a take returns), at every lock renewal (extendLocks.lua), and by
the script that ends the attempt (complete.lua / fail.lua fail it for good).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._threads import BackgroundLoop, reached
from .connection import (
    BLOCK_CAP,
    Client,
    blocking_client,
    close_subscription,
    cut_client,
    next_message,
    ssubscribe,
)
from .keys import lookup_id

if TYPE_CHECKING:
    from ._attempt import AttemptTable
    from ._context import QueueContext

logger = logging.getLogger(__name__)

#: What cancel.lua returns: the job failed now, or its cancel was requested.
_CANCELLED, _REQUESTED = 1, 2


def cancel_job(context: QueueContext, job_id: str, reason: str | None) -> bool:
    """Run cancel.lua for one job; True when it was cancelled or is being
    cancelled (the one place that calls the script)."""
    if reason is not None and not isinstance(reason, str):
        raise TypeError(f"reason must be a str or None, not {type(reason).__name__}")
    code = context.calls.cancel(job_id, reason or "cancelled")
    if code == _CANCELLED:
        from ._schedulers import tick_left

        tick_left(context, job_id)
    return code in (_CANCELLED, _REQUESTED)


class QueueCancel:
    """Cancelling jobs (a mixin of Queue)."""

    _context: QueueContext

    def cancel(self, job_id: str, reason: str | None = None) -> bool:
        """Cancel a job, from any process.

        A waiting, prioritized or delayed job leaves the queue and fails for
        good at once. A running job's ``cancelled`` event is set in the
        worker running it, and its attempt ends failed for good when the
        handler returns or raises (its result discarded, no retry). Emits
        ``cancelled`` (``reason``, ``prev``) then ``failed``; waiters raise
        ``JobCancelledError``; ``failed_reason`` is ``reason`` (or
        ``"cancelled"``).

        Returns:
            True when cancelled, or being cancelled (a second cancel of a
            running job writes nothing); False for a job finished or unknown.
        """
        return cancel_job(self._context, lookup_id(job_id), reason)


def cancel_channel(context: QueueContext) -> str:
    """The sharded channel cancel.lua publishes the ids of running jobs on."""
    return f"{context.keys.base}cancels"


class CancelListener:
    """A worker's subscription to its queue's cancel channel: a cancelled
    job held by the worker gets ``job.cancelled`` set at once.

    After each (re)subscription it reads the cancel marks of every held
    job, so a hint published while it was disconnected is not lost.
    """

    def __init__(
        self,
        context: QueueContext,
        table: AttemptTable,
        *,
        on_error: Callable[[Exception], None],
    ) -> None:
        self._context = context
        self._table = table
        self._client: Client | None = None
        self._pubsub: Any = None
        self.loop = BackgroundLoop(
            f"jobq-cancel-{context.name}", self._step, on_error=on_error,
            on_exit=self._disconnect, cap=1.0,
        )

    def stop(self) -> None:
        """Stop the loop, cutting its blocked read (or connect) short: its
        client's connections are shut down (no command is sent, so a server
        that does not answer cannot hold the stop up)."""
        self.loop.stop()
        cut_client(self._client)

    def _step(self) -> float:
        try:
            if self._pubsub is None:
                self._connect()
                reached()
            message = next_message(self._pubsub, BLOCK_CAP)
            if message is None:
                return 0.0
            kind = message["type"]
            kind = kind.decode() if isinstance(kind, bytes) else kind
            if kind == "ssubscribe":  # a silent reconnect resubscribed
                self._check_marks()
            elif kind == "sunsubscribe":  # the slot moved: subscribe again
                raise ConnectionError("the server ended the cancel subscription")
            elif kind == "smessage":
                self._table.cancel_hinted(message["data"])
            return 0.0
        except Exception:
            self._disconnect()
            raise

    def _connect(self) -> None:
        self._client = blocking_client(self._context.client, self.loop.name)
        if self.loop.stopping:  # stopped before the client was there to cut
            raise ConnectionError("the worker is closing")
        self._pubsub = self._client.pubsub()
        ssubscribe(self._pubsub, [cancel_channel(self._context)], lambda: self.loop.stopping,
                   "the cancel channel")
        self._check_marks()

    def _check_marks(self) -> None:
        check_marks(self._context, self._table)

    def _disconnect(self) -> None:
        pubsub, client = self._pubsub, self._client
        self._pubsub = self._client = None
        close_subscription(client, pubsub)


def check_marks(context: QueueContext, table: AttemptTable) -> None:
    """Cancel the held attempts whose job carries a cancel mark (after a
    subscription to cancel hints starts: a hint sent before it is lost)."""
    held = table.held()
    if not held:
        return
    pipe = context.redis.pipeline(transaction=False)
    for attempt in held:
        pipe.hexists(context.keys.job(attempt.job_id), "cx")
    for attempt, marked in zip(held, pipe.execute(), strict=True):
        if marked:
            attempt.cancel()
