"""What a ShardedQueue reads and how it is administered, as two mixins:
each call goes to the shard a job id names, or to every shard and sums."""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import redis

from ._queue_ops import state_names
from ._shards import COUNT_FIELD, GONE_FIELD, on_every_shard, shard_of
from .errors import JobqError
from .job import STATES, Job
from .keys import lookup_id, lookup_key, queues_key
from .metrics import Metrics
from .options import byte_limit, flag, list_index
from .registry import WorkerInfo, live_workers

if TYPE_CHECKING:
    from ._context import QueueContext
    from ._schedulers import Scheduler
    from .queue import Queue

logger = logging.getLogger("jobq.queue")


def _order(state: str) -> Callable[[Job], tuple[float, ...]]:
    """The order a plain queue lists jobs of ``state`` in (see get_jobs),
    from what each Job holds."""
    if state in ("completed", "failed"):  # the set's score: whole ms
        return lambda job: (math.floor((job.finished_on or 0.0) * 1000),)
    if state == "delayed":  # by when due (after a retry's backoff or a change too)
        return lambda job: (_ready(job),)
    if state == "active":  # by when taken
        return lambda job: (job.processed_on or 0.0,)
    if state == "waiting":
        return _run_order
    return lambda job: (job.timestamp or 0.0,)


def _ready(job: Job) -> float:
    return job._ready_at if job._ready_at is not None else (job.timestamp or 0.0) + job.delay


def _run_order(job: Job) -> tuple[float, ...]:
    """Waiting jobs as they run: those without a priority first, then by
    priority; in each, lifo ones first (the last in first), then by when
    they became ready."""
    lifo = bool(job.opts.get("lifo"))
    ready = _ready(job)
    return (job.priority, 0 if lifo else 1, -ready if lifo else ready)


class ShardedReading:
    """Reading a sharded queue's jobs (a mixin of ShardedQueue)."""

    _context: QueueContext
    _shards: tuple[Queue, ...]
    _count: int

    def _shard(self, job_id: str) -> Queue:
        self._context.ensure_ready()
        return self._shards[shard_of(lookup_id(job_id), self._count)]

    def _every(self) -> tuple[Queue, ...]:
        self._context.ensure_ready()
        return self._shards

    def get_job(self, job_id: str) -> Job | None:
        """The job with that id (read from its shard), or None."""
        return self._shard(job_id).get_job(job_id)

    def get_job_state(self, job_id: str) -> str:
        """The job's state (see ``Queue.get_job_state``)."""
        return self._shard(job_id).get_job_state(job_id)

    def get_job_result(self, job_id: str, default: Any = None) -> Any:
        """The return value of a completed job, else ``default``."""
        return self._shard(job_id).get_job_result(job_id, default)

    def get_job_counts(self, *states: str) -> dict[str, int]:
        """Jobs per state summed over the shards (every state when none is named)."""
        total = dict.fromkeys(states or STATES, 0)
        for counts in self.shard_counts(*states):
            for state, count in counts.items():
                total[state] += count
        return total

    def shard_counts(self, *states: str) -> list[dict[str, int]]:
        """Jobs per state of each shard, in shard order."""
        return [shard.get_job_counts(*states) for shard in self._every()]

    def count(self) -> int:
        """Jobs waiting or delayed, on every shard."""
        counts = self.get_job_counts("waiting", "delayed")
        return counts["waiting"] + counts["delayed"]

    def get_jobs(
        self, states: str | Sequence[str], start: int = 0, end: int = -1, asc: bool = False
    ) -> list[Job]:
        """Jobs in the given state(s) over every shard, newest first (oldest
        first when ``asc``): each state's jobs, in the order a plain queue
        lists them (finished ones by when they finished, delayed ones by
        when they are due, active ones by when they were taken, waiting
        ones as they run: without a priority first, then by priority, each
        by when it became ready; the others by when they were added),
        merged across the shards; the states in the order named. ``start`` and
        ``end`` index each state's jobs inclusively, like LRANGE, as a plain
        queue's do. Reads up to ``end + 1`` jobs of each shard and state
        (every job when ``start`` or ``end`` is negative)."""
        start, end = list_index("start", start), list_index("end", end)
        per_shard_end = end if end >= 0 and start >= 0 else -1
        names, asc = state_names(states), flag("asc", asc)
        jobs: list[Job] = []
        for state in names:
            # each shard's list is in that order already, so a page of the
            # whole needs no more than that page of each shard; sorted (not
            # merged) as a job moved by hand may sit out of it
            lists = [shard.get_jobs(state, 0, per_shard_end, asc) for shard in self._every()]
            ordered = sorted(itertools.chain(*lists), key=_order(state), reverse=not asc)
            first = max(0, len(ordered) + start) if start < 0 else start
            last = len(ordered) + end if end < 0 else end
            jobs += ordered[first : last + 1] if last >= 0 else []
        return jobs

    @property
    def event_mode(self) -> str:
        """The shards' event mode, ``"stream"`` or ``"pubsub"``."""
        return self._every()[0].event_mode

    @property
    def max_payload_bytes(self) -> int | None:
        """Largest encoded ``data`` an add takes (as ``Queue``'s); may be
        changed, for every shard (an assignment was kept and never applied)."""
        return self._every()[0].max_payload_bytes

    @max_payload_bytes.setter
    def max_payload_bytes(self, value: int | None) -> None:
        limit = byte_limit("max_payload_bytes", value)
        for shard in self._every():
            shard.max_payload_bytes = limit

    def get_schedulers(self) -> list[Scheduler]:
        """None: job schedulers are not supported on a sharded queue."""
        return []

    def upsert_scheduler(self, scheduler_id: str, **options: Any) -> Scheduler:
        """Refused: job schedulers are not supported on a sharded queue.

        Raises:
            JobqError: always.
        """
        raise JobqError(
            f"queue {self._context.name!r} is sharded: job schedulers are not supported on "
            "a sharded queue; schedule into a plain queue"
        )

    def get_scheduler(self, scheduler_id: str) -> Scheduler | None:
        """None: job schedulers are not supported on a sharded queue."""
        lookup_key(scheduler_id, "scheduler_id")
        return None

    def remove_scheduler(self, scheduler_id: str) -> bool:
        """False: job schedulers are not supported on a sharded queue."""
        lookup_key(scheduler_id, "scheduler_id")
        return False

    def get_dedup_job_id(self, key: str) -> str | None:
        """The id of the job that owns a dedup key (on the key's shard), or None."""
        return self._shard(lookup_key(key, "dedup key")).get_dedup_job_id(key)

    def remove_dedup_key(self, key: str) -> bool:
        """Release a dedup key (on the key's shard)."""
        return self._shard(lookup_key(key, "dedup key")).remove_dedup_key(key)


class ShardedAdmin:
    """Administering a sharded queue (a mixin of ShardedQueue)."""

    _context: QueueContext
    _shards: tuple[Queue, ...]
    _count: int
    _recorded: bool | None
    _record: Callable[[], None]  # ShardedQueue's: lists the logical name once

    def _shard(self, job_id: str) -> Queue:
        raise NotImplementedError  # ShardedReading's

    def _every(self) -> tuple[Queue, ...]:
        raise NotImplementedError  # ShardedReading's

    def remove(self, job_id: str, *, remove_children: bool = True) -> bool:
        """Remove a job (see ``Queue.remove``)."""
        return self._shard(job_id).remove(job_id, remove_children=remove_children)

    def cancel(self, job_id: str, reason: str | None = None) -> bool:
        """Cancel a job, from any process (see ``Queue.cancel``)."""
        return self._shard(job_id).cancel(job_id, reason)

    # A call over every shard acts on each that answers, then raises the
    # first failure (a shard whose slot is moving, or whose node is away):
    # one such shard leaves none of the others undone (on_every_shard).
    # Call it again to finish.

    def pause(self) -> None:
        """Pause every shard (durable); emits ``paused`` on each."""
        on_every_shard(self._every(), lambda shard: shard.pause())
        self._record()

    def resume(self) -> None:
        """Resume every shard; emits ``resumed`` on each, and wakes the
        workers (a shard's resume writes no wake-up of its own)."""
        def resume(shard: Queue) -> None:
            shard.resume()
            self._context.client.execute_command("SPUBLISH", shard._context.keys.marker, "1")

        on_every_shard(self._every(), resume)
        self._record()

    def is_paused(self) -> bool:
        """Whether every shard is paused."""
        return all(shard.is_paused() for shard in self._every())

    def drain(self, delayed: bool = False) -> int:
        """Remove every waiting job of every shard (and delayed ones when asked)."""
        return sum(on_every_shard(self._every(), lambda shard: shard.drain(delayed)))

    def clean(self, grace: float, limit: int = 0, state: str = "completed") -> list[str]:
        """Remove jobs of ``state`` older than ``grace`` seconds from every
        shard, at most ``limit`` in all (0: no cap); return their ids."""
        removed: list[str] = []

        def clean(shard: Queue) -> None:
            if not limit or len(removed) < limit:
                removed.extend(shard.clean(grace, limit - len(removed) if limit else 0, state))

        on_every_shard(self._every(), clean)
        return removed

    def obliterate(self, force: bool = False) -> None:
        """Delete every shard's jobs, events and metrics, the worker
        registry and the stored shard count (see ``Queue.obliterate``).

        Raises:
            JobqError: a shard has active jobs and ``force`` is False
                (checked on every shard, each held paused from then on so
                that no worker takes a job, before any is touched).
        """
        force = flag("force", force)
        shards = self._every()
        if not force:
            held: list[Queue] = []  # shards paused here, let go of unless obliterated
            try:
                for shard in shards:
                    if shard._context.redis.hsetnx(shard._context.keys.meta, "paused", "1"):
                        held.append(shard)
                busy = [s.name for s in shards if s.get_job_counts("active")["active"]]
            except BaseException:  # a node away: nothing is deleted, nothing left paused
                _let_go(held)
                raise
            if busy:
                _let_go(held)
                raise JobqError(
                    f"queue {self._context.name!r} has active jobs (shards {', '.join(busy)}); "
                    "obliterate(force=True) removes them anyway"
                )
        on_every_shard(shards, lambda shard: shard.obliterate(force=True))
        client = self._context.client
        keys = self._context.keys
        client.delete(keys.workers, keys.base + "limiter")
        # its workers still running do not store the count again (as after
        # the server lost it): the queue stays gone, until made again
        pipe = client.pipeline(transaction=False)
        pipe.hdel(keys.meta, COUNT_FIELD)
        pipe.hset(keys.meta, GONE_FIELD, "1")
        pipe.execute()
        client.srem(queues_key(self._context.prefix), self._context.name)
        self._recorded = False
        self._context.on_first_use(self._restore)

    def _restore(self) -> None:
        raise NotImplementedError  # ShardedQueue's first use

    def retry_jobs(self, state: str = "failed", *, reset_attempts: bool = False) -> int:
        """Move every failed (or completed) job of every shard back to waiting."""
        return sum(on_every_shard(
            self._every(), lambda shard: shard.retry_jobs(state, reset_attempts=reset_attempts)))

    def promote_jobs(self, count: int | None = None) -> int:
        """Make every delayed job of every shard wait now, or ``count`` of
        them in all (the soonest due of one shard, then of the next: not
        the soonest of the whole queue); return how many."""
        if count is None:
            return sum(on_every_shard(self._every(), lambda shard: shard.promote_jobs()))
        left = [list_index("count", count, minimum=0)]

        def promote(shard: Queue) -> None:
            if left[0] > 0:
                left[0] -= shard.promote_jobs(left[0])

        on_every_shard(self._every(), promote)  # one that fails is passed over, then raised
        return count - left[0]

    def get_workers(self) -> list[WorkerInfo]:
        """The live workers of this queue."""
        self._context.ensure_ready()
        return live_workers(self._context)

    def get_metrics(self, kind: str, start: int = 0, end: int = -1) -> Metrics:
        """Counts of finished jobs per minute summed over the shards (see
        ``Queue.get_metrics``)."""
        return summed_metrics([shard.get_metrics(kind, start, end) for shard in self._every()])

    def trim_events(self, max_len: int) -> int:
        """Trim each shard's event stream to about ``max_len`` entries."""
        return sum(on_every_shard(self._every(), lambda shard: shard.trim_events(max_len)))

    def emit(self, event: str, **fields: Any) -> None:
        """Publish a custom event (on the first shard's channel: every
        reader of the sharded queue reads every shard)."""
        self._every()[0].emit(event, **fields)


def summed_metrics(parts: list[Metrics]) -> Metrics:
    """The shards' metrics summed, minute by minute: each shard's list
    counts back from the minute of its own read, so a read made before a
    minute began is moved one place along (its minutes were added to the
    next ones' when the shards' reads straddled a minute's start)."""
    timestamp = max((p.timestamp for p in parts), default=0.0)
    minute = int(timestamp // 60)
    data = [0] * max((len(p.data) for p in parts), default=0)
    for part in parts:
        shift = minute - int(part.timestamp // 60) if part.timestamp > 0 else 0
        for i, value in enumerate(part.data):
            if 0 <= i + shift < len(data):
                data[i + shift] += value
    return Metrics(
        count=sum(p.count for p in parts), data=data, timestamp=timestamp,
        waited_for=sum(p.waited_for for p in parts), ran_for=sum(p.ran_for for p in parts),
    )


def _let_go(shards: list[Queue]) -> None:
    """Clear the paused flag obliterate set on ``shards`` (best effort: a
    shard that cannot be reached keeps it, and says so in the log)."""
    for shard in shards:
        try:
            shard._context.redis.hdel(shard._context.keys.meta, "paused")
        except redis.exceptions.RedisError as exc:
            logger.warning("shard %r stays paused: %s", shard.name, exc)
