"""``WaiterTable.check_many``: the records of many waiters checked in
pipelined round trips, CHECK_BATCH of them each, on one pooled connection."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis

from ._context import QueueContext
from .calls import OutcomeReply, outcome_args, outcome_reply
from .connection import TRANSIENT_ERRORS
from .scripts import function_missing, load_library

if TYPE_CHECKING:
    from ._waiters import Outcome, Waiter

logger = logging.getLogger("jobq.queue_events")  # the public module's name, as documented

#: Waiters checked in one pipelined round trip when many are checked at once
#: (after a gap in the events or a reconnect).
CHECK_BATCH = 500

Answered = list[tuple["Waiter", "Outcome"]]


class BatchCheck:
    """The pipelined checks of a QueueEvents' waiters; ``apply`` decides a
    waiter from getOutcome's reply (``WaiterTable._apply``), adding it to
    the answered ones when it does."""

    def __init__(self, context: QueueContext,
                 apply: Callable[[Waiter, OutcomeReply, Answered], None]) -> None:
        self._context = context
        self._apply = apply

    def run(self, waiters: list[Waiter], unreached: bool) -> tuple[list[Waiter], Answered]:
        """(the waiters left to check one by one, those answered with their
        outcomes): see ``WaiterTable.check_many``."""
        client = self._context.bounded
        if isinstance(client, redis.RedisCluster):  # the node serving the queue's slot
            node = client.get_node_from_key(self._context.keys.base)  # type: ignore[no-untyped-call]
            client = getattr(node, "redis_connection", None)
        if not isinstance(client, redis.Redis) or self._context.closed:
            return list(waiters), []
        left: list[Waiter] = []
        answered: Answered = []
        for start in range(0, len(waiters), CHECK_BATCH):
            chunk = [w for w in waiters[start:start + CHECK_BATCH] if w.outcome is None]
            try:
                left += self._check_batch(chunk, client, answered)
            except TRANSIENT_ERRORS as exc:
                logger.debug("checking %d jobs at once failed: %s", len(chunk), exc)
                if unreached:
                    left += [w for w in waiters[start:] if w.outcome is None]
                break
        return left, answered

    def _check_batch(self, chunk: list[Waiter], client: Any, answered: Answered) -> list[Waiter]:
        """One pipelined round trip of ``run``; the waiters left."""
        keys, scripts = self._context.keys, self._context.scripts
        # Sent again once when a restarted server (the first call after a
        # reconnect) left the pool's connections dead, and once more when it
        # lacks the library (a try lost to the one does not spend the
        # other's): else every thread of the batch would check on its own.
        retried = loaded = False
        while True:
            try:
                with client.pipeline(transaction=False) as pipe:
                    for waiter in chunk:
                        args = outcome_args(waiter.job_id, waiter.run or "", "", False)
                        scripts.run("getOutcome", keys.base, *args, client=pipe)
                    replies = pipe.execute(raise_on_error=False)
            except TRANSIENT_ERRORS:
                if retried:
                    raise
                retried = True
                continue
            if loaded or not any(map(function_missing, replies)):
                break
            load_library(client)
            loaded = True
        left = []
        for waiter, raw in zip(chunk, replies, strict=True):
            reply = None if isinstance(raw, Exception) else outcome_reply(raw)
            if reply is None or reply.cursor is not None:
                left.append(waiter)  # a function to load again, or a long scan
                continue
            try:
                self._apply(waiter, reply, answered)
            except Exception:  # undecodable: its own check raises it to its caller
                left.append(waiter)
        return left
