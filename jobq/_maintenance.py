"""The Worker's maintenance thread: its heartbeat in the registry, the
periodic check for jobs of dead workers (stalled jobs), and the check that
keeps job schedulers going (a due scheduler whose tick job is missing gets
it back; a cron tick just taken gets the slot after the next one)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ._context import QueueContext
from ._schedulers import due_schedulers, sync_scheduler
from ._sentinel import brief
from ._threads import BackgroundLoop
from .calls import WorkerScripts
from .errors import JobqError
from .registry import announce

if TYPE_CHECKING:
    from ._shard_worker import ShardedContext

logger = logging.getLogger("jobq.worker")  # the public module's name, as documented

#: Stalled jobs recovered per script call.
STALLED_BATCH = 1000
#: Longest time between two checks of the queue's job schedulers, seconds.
SCHEDULER_CHECK = 5.0

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
        token: str,
        heartbeat_ttl: float,
        stalled_interval: float,
        max_stalled_count: int,
        status: Callable[[], Mapping[str, Any]],
        on_error: Callable[[Exception], None],
    ) -> None:
        self._context = context
        self._name = worker_name
        self.token = token  # this Worker's, in the registry
        self._clash_told = False
        self._ttl = heartbeat_ttl
        self._interval = stalled_interval
        self._max_stalled = max_stalled_count
        self._status = status
        self._scripts = WorkerScripts(context.run)
        now = time.monotonic()
        self._next_beat = now
        self._next_check = now
        self._next_schedulers = now
        self._schedulers_every = min(SCHEDULER_CHECK, stalled_interval)
        self._ticks: set[str] = set()  # schedulers whose cron tick was just taken
        self._ticks_lock = threading.Lock()
        self._on_error = on_error
        self._first_beat = True
        self._announced: dict[str, Any] | None = None
        self._told: str | None = None  # the last shard-count trouble told
        self._marks_checked = False
        self.loop = BackgroundLoop(
            f"jobq-maint-{context.name}", self._step, on_error=on_error, log=logger
        )

    def tick_taken(self, scheduler_id: str) -> None:
        """A tick job of this scheduler was taken: sync it soon (any thread)."""
        with self._ticks_lock:
            self._ticks.add(scheduler_id)
        self.loop.wake()

    def _step(self) -> float:
        now = time.monotonic()
        status = dict(self._status())
        if now >= self._next_beat or status != self._announced:
            self._beat(status)
            self._next_beat = now + self._ttl / 3
        if now >= self._next_check:
            self._check_stalled()
            self._check_not_sharded()
            self._next_check = now + self._interval
        with self._ticks_lock:
            ticks, self._ticks = self._ticks, set()
        if now >= self._next_schedulers:
            self._next_schedulers = now + self._schedulers_every
            ticks.update(due_schedulers(self._context))
        for sid in sorted(ticks):
            self._sync(sid)
        wake = min(self._next_beat, self._next_check, self._next_schedulers,
                   now + STATUS_INTERVAL)
        return max(0.0, wake - time.monotonic())

    def _sync(self, scheduler_id: str) -> None:
        try:
            sync_scheduler(self._context, scheduler_id)
        except Exception as exc:  # a collision is reported loudly, and tried again later
            logger.error("scheduler %r of %r: %s", scheduler_id, self._context.name, exc)
            self._on_error(exc)

    def _beat(self, status: dict[str, Any]) -> None:
        # a failed beat is tried again on schedule, not at every look
        self._announced = status
        try:
            clash = announce(self._context, self._name, self.token, self._ttl,
                             first=self._first_beat, **status)
        except Exception as exc:  # the announcement expires by itself; try next time
            logger.warning("heartbeat of worker %r failed: %s", self._name, brief(exc))
            return
        # the first beat may replace a worker of this name that went away
        # without leaving; a later one found another's beat since this one's
        if clash and not self._first_beat and not self._clash_told:
            self._clash_told = True
            logger.warning(
                "another live worker is named %r (queue %r): the registry shows one of "
                "them (Queue.get_workers, jobq info); give each worker a name of its own",
                self._name, self._context.queue_name)
        self._first_beat = False

    def _check_not_sharded(self) -> None:
        """A worker serving a plain queue whose name has since become a
        sharded queue's (its first write came after the worker started)
        serves none of its jobs: say so, once, loudly. A sharded one's:
        store its count and marks again if the server lost them."""
        from ._shard_worker import ShardedContext
        from ._shards import stored_count

        context = self._context
        if isinstance(context, ShardedContext):
            if self._marks_checked:  # the first: the fetcher stores them as it starts
                self._keep_shard_marks(context)
            self._marks_checked = True
            return
        if self._told is not None:
            return
        count = stored_count(context.client, context.prefix, context.name)
        if count is None:
            return
        self._tell_once(JobqError(
            f"queue {context.name!r} is a sharded queue of {count} shards, but this worker "
            "serves it as a plain queue (it started before the queue's first write, or "
            "while the server could not say): restart the worker, or start it with "
            f"Worker(..., shards={count})"
        ))

    def _keep_shard_marks(self, context: ShardedContext) -> None:
        """The queue's shard count and each shard's mark (its scripts then
        publish the wake-ups the fetchers and readers wait for) are written
        once, by the first write and at each subscription: a server that
        lost them (FLUSHALL, a restart without persistence) had every job
        wait up to a ``drain_delay`` to be taken, for as long as the
        processes ran. Store them again when they are gone."""
        from ._shards import COUNT_FIELD, GONE_FIELD, SHARD_FIELD

        pipe = context.client.pipeline(transaction=False)
        pipe.hmget(context.keys.meta, [COUNT_FIELD, GONE_FIELD])
        for keys in context.shard_keys:
            pipe.hget(keys.meta, SHARD_FIELD)
        (count, gone), *marks = pipe.execute()
        if count is None and gone:  # obliterated while this worker ran: it stays gone
            self._tell_once(JobqError(
                f"queue {context.name!r} was obliterated while this worker ran: it serves "
                "none of the queue's jobs now; close it (a queue made again under the "
                "name is served by workers started since)"))
            return
        if count is not None and int(count) != context.count:  # made again, another count
            self._tell_once(JobqError(
                f"queue {context.name!r} has {int(count)} shards now, but this worker serves "
                f"{context.count} (the queue was obliterated and made again while it ran): "
                "restart the worker"))
            return
        self._told = None  # (a state told of has passed: told again if it comes back)
        if count is not None and all(marks):
            return
        logger.warning("queue %r: its shard count or marks are gone (the server lost its "
                       "data?); storing them again", context.name)
        context.store_count(restore=True)

    def _tell_once(self, error: JobqError) -> None:
        """Log and emit ``error``, once until the state it tells of changes."""
        if self._told == str(error):
            return
        self._told = str(error)
        logger.error("%s", error)
        self._on_error(error)

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
