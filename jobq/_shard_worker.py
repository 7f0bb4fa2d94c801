"""A Worker of a sharded queue: the same roles as for a plain queue, over a
context that sends each script to the shard it concerns.

``ShardedContext`` stands for the queue in the worker's roles: a script
about one job (complete, fail, updateJob, ...) goes to the shard its id
names, lock renewal and the stalled check go to every shard (split and
joined), the worker registry lives on the logical queue's base. Takes are
the fetcher's (``_shard_fetcher.ShardFetcher``), which turns over the
shards; a finishing call takes the next job of its own shard along (saving
a round trip) at most ``CHAIN_LIMIT`` times in a row per pool thread, then
the slot goes back to the fetcher's turn (fairness).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import redis

from ._context import QueueContext
from ._sentinel import brief
from ._shards import (
    holds_jobs,
    mismatch,
    on_every_shard,
    plain_queue_on_shard,
    shard_keys,
    shard_of,
    shard_served_plain,
    stored_marks,
)
from ._threads import RetryBackoff
from .connection import database, is_transient, login_refused, moved, unreachable
from .errors import JobqError
from .keys import QueueKeys

logger = logging.getLogger("jobq.worker")

#: Scripts whose first argument is the id of the job they concern.
_BY_JOB = frozenset({
    "cancel", "changeDelay", "changePriority", "complete", "completeTake", "fail", "failTake",
    "getOutcome", "promote", "remove", "updateJob", "updateJobHeld",
})
#: Scripts of the logical queue's own base (the worker registry).
_LOGICAL = frozenset({"heartbeat", "getWorkers"})
#: How many arguments of complete / fail are the job's own: the rest take
#: the next job along (from the same shard).
_FINISH_ARGS = {"complete": 3, "completeTake": 3, "fail": 6, "failTake": 6}
#: Most jobs a pool thread takes along in a row from its shard before its
#: slot goes back to the fetcher's turn over the shards: the bound of
#: fairness (a ready shard waits at most about ``shards x (CHAIN_LIMIT + 1)``
#: takes of a worker of concurrency 1) against the round trip a finishing
#: call that takes the next job along saves.
CHAIN_LIMIT = 16


class RoutedKeys(QueueKeys):
    """The logical queue's keys, but a job's keys on the job's shard."""

    __slots__ = ("shards",)

    def __init__(self, prefix: str, queue: str, shards: tuple[QueueKeys, ...]) -> None:
        super().__init__(prefix, queue)
        self.shards = shards

    def of(self, job_id: str) -> QueueKeys:
        """The keys of the job's shard."""
        return self.shards[shard_of(job_id, len(self.shards))]

    def job(self, job_id: str) -> str:
        return self.of(job_id).job(job_id)

    def logs(self, job_id: str) -> str:
        return self.of(job_id).logs(job_id)

    def lock(self, job_id: str) -> str:
        return self.of(job_id).lock(job_id)

    def parent_key(self, kind: str, job_id: str) -> str:
        return self.of(job_id).parent_key(kind, job_id)


class ShardedContext(QueueContext):
    """A worker's queue context over the shards of a sharded queue.

    It shares the worker's client (never closing it) and is closed with the
    worker's run.
    """

    def __init__(self, context: QueueContext, count: int) -> None:
        super().__init__(context.name, context.client, context.prefix, "the worker of queue",
                         owned=False)
        self.count = count
        self.shard_keys = shard_keys(context.prefix, context.name, count)
        self.routed = RoutedKeys(context.prefix, context.name, self.shard_keys)
        self._chains = threading.local()  # per pool thread: jobs taken along in a row
        self.keys = self.routed

    def _base(self, script: str, args: tuple[Any, ...]) -> str:
        if script in _BY_JOB:
            return self.routed.of(str(args[0])).base
        if script in _LOGICAL:
            return self.keys.base
        raise JobqError(f"script {script!r} has no one shard in sharded queue {self.name!r}")

    def store_count(self, restore: bool = False) -> None:
        """Store the shard count with the queue's name unless one is
        (storeShardCount.lua, which refuses a plain queue that holds jobs),
        and mark each shard: its scripts then publish wake-ups.

        When none is stored, a shard's name that a plain queue with jobs
        uses is refused, unless ``restore``: the worker served these shards,
        whose count and marks the server lost.

        Raises:
            ShardCountError: another count is stored, or none is and the
                name (or a shard's, unless ``restore``) is a plain queue
                that holds jobs or schedulers.
        """
        def store(*args: Any, once: bool = False) -> list[Any]:
            return list(self.scripts.run(*args, client=self.client, once=once))

        db = str(database(self.client))

        def mark(writes: str, once: bool = False) -> None:  # as a ShardedQueue's first use does
            def one(keys: QueueKeys) -> None:
                if store("storeSettings", keys.base, "", "", "", writes, db, once=once)[4]:
                    raise plain_queue_on_shard(keys.queue, self.name)
            on_every_shard(self.shard_keys, one)

        stored, may = store("storeShardCount", self.keys.base, self.count, "look")
        if int(may):  # none stored: no shard's name may be a plain queue's with jobs
            if not restore:
                mark("sf")
            stored, _ = store("storeShardCount", self.keys.base, self.count, "")
        if int(stored) == 0:
            raise holds_jobs(self.name)
        if int(stored) != self.count:
            raise mismatch(self.name, int(stored), self.count)
        try:
            mark("s", once=True)
        except redis.exceptions.RedisError as exc:
            # a shard's slot moving, say: the others are marked, and a
            # missing mark is stored again by the maintenance's look
            logger.warning("queue %r: a shard's mark could not be stored now (%s); "
                           "it is looked at again", self.name, brief(exc))

    def run(self, script: str, *args: Any) -> Any:
        return self._send(None, script, args)

    def run_on(self, connection: Any, script: str, *args: Any) -> Any:
        return self._send(connection, script, args)

    def run_bounded(self, script: str, *args: Any, deadline: float | None = None) -> Any:
        # a worker's own calls: no waiter checks records through this context
        # (a QueueEvents has contexts of its own), so none has a deadline
        if deadline is not None:
            raise NotImplementedError("a sharded worker's calls have no deadline")
        return self._send(None, script, args, client=self.bounded)

    def _send(
        self, connection: Any, script: str, args: tuple[Any, ...], client: Any = None
    ) -> Any:
        if self.closed or self._setup is not None:
            self.ensure_ready()
        if script == "extendLocks":
            return self._extend_locks(args, client)
        if script == "stalledCheck":  # every shard's; a migrating slot holds up no other
            def check(keys: QueueKeys) -> list[Any]:
                return list(self.scripts.run(script, keys.base, *args, client=client, once=True))
            return [job_id for found in on_every_shard(self.shard_keys, check) for job_id in found]
        if script in _FINISH_ARGS:
            args = self._chain(args, _FINISH_ARGS[script])
        base = self._base(script, args)
        if connection is not None:
            return self.scripts.run_on(connection, script, base, *args)
        return self.scripts.run(script, base, *args, client=client)

    def _chain(self, args: tuple[Any, ...], own: int) -> tuple[Any, ...]:
        """A finishing call's arguments, without those that take the next
        job along when the rate limiter is on (its window is counted on the
        logical queue, by the fetcher) or when this pool thread has taken
        ``CHAIN_LIMIT`` jobs in a row that way: its slot then goes back to
        the fetcher, whose turn over the shards keeps every shard served."""
        if len(args) <= own:
            return args
        chained = getattr(self._chains, "count", 0)
        if int(args[own + 3]) > 0 or chained >= CHAIN_LIMIT:  # the take's limit_max
            self._chains.count = 0
            return args[:own]
        self._chains.count = chained + 1
        return args

    def _extend_locks(self, args: tuple[Any, ...], client: Any) -> list[list[Any]]:
        """extendLocks over the shards of the held jobs; the replies joined."""
        held: defaultdict[int, list[Any]] = defaultdict(list)
        for i in range(1, len(args), 2):
            held[shard_of(str(args[i]), self.count)] += (args[i], args[i + 1])
        lost: list[Any] = []
        cancelled: list[Any] = []

        def extend(shard: int) -> None:
            reply = self.scripts.run(
                "extendLocks", self.shard_keys[shard].base, args[0], *held[shard],
                client=client, once=True,
            )
            lost.extend(reply[0])
            cancelled.extend(reply[1])

        on_every_shard(list(held), extend)  # a migrating slot's locks hold up no others'
        return [lost, cancelled]


#: How long a Worker's start waits for the server to say whether its queue
#: is sharded (a worker started with the server, in a deploy).
SHARD_LOOK_WAIT = 10.0


def worker_context(
    context: QueueContext, shards: int | None, stopping: Callable[[], bool] = lambda: False
) -> QueueContext:
    """The context a Worker's run uses: a ``ShardedContext`` when ``shards``
    is given (``ShardCountError`` when another count is stored; stored by
    the fetcher when none is) or a shard count is stored with the queue,
    else ``context``. A server
    away or busy is waited for, SHARD_LOOK_WAIT at most (or until
    ``stopping()``): a sharded queue's worker that took its name for a
    plain queue would serve none of its jobs. A refused login raises
    redis-py's ``AuthenticationError`` at once."""
    deadline = time.monotonic() + SHARD_LOOK_WAIT
    backoff = RetryBackoff(cap=1.0)
    while True:
        try:
            count, shard = stored_marks(context.client, context.prefix, context.name)
            break
        except Exception as exc:
            if login_refused(exc) or moved(exc):  # no wait makes either right
                raise unreachable(exc, context.client) from exc
            if not is_transient(exc):
                raise
            if stopping() or time.monotonic() >= deadline:
                if shards is not None:  # the fetcher checks it against the stored one
                    return ShardedContext(context, shards)
                # the worker still starts (its loops retry); if the queue is
                # sharded, its maintenance says so once the server is back
                logger.warning(
                    "worker of %r: cannot read whether the queue is sharded (%s); serving "
                    "it as a plain queue (if it is a sharded queue, start the worker again "
                    "once the server is back, or with Worker(..., shards=N))",
                    context.name, brief(exc))
                return context
        threading.Event().wait(min(backoff.next(), max(0.0, deadline - time.monotonic())))
    if shards is not None:
        if count is not None and count != shards:  # it would serve no shard (a start fails)
            raise mismatch(context.name, count, shards)
        return ShardedContext(context, shards)
    if count is None:
        if shard:  # its jobs are the sharded queue's, which its own workers serve
            raise shard_served_plain(context.name)
        return context
    logger.debug("queue %r is sharded over %d shards", context.name, count)
    return ShardedContext(context, count)
