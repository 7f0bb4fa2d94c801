"""ShardedQueue: one logical queue spread over N sub-queues (shards), each
with its own cluster hash tag, for a queue that outgrows one Redis node.

Each shard is a plain queue (its keys, scripts and guarantees unchanged);
this module routes: a job id names its shard (``jobq._shards``), adds go to
the shard of their id (or of their dedup key) or round robin, and reads and
administration visit every shard and sum. ``Worker(name, ...)`` finds the
shard count stored with the queue and takes from every shard through one
connection per node (``jobq._shard_worker``).
"""

from __future__ import annotations

import functools
import itertools
import logging
import random
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import redis

from . import _fork, _tracing
from ._closing import ClosedOnExit, OfQueue
from ._context import QueueContext
from ._queue_ops import record_queue
from ._sharded_ops import ShardedAdmin, ShardedReading
from ._shards import (
    ShardCountError,
    check_prefix,
    generated_id,
    holds_jobs,
    mismatch,
    on_every_shard,
    plain_queue_on_shard,
    shard_names,
    shard_of,
    stored_count,
    validate_count,
)
from .calls import NewJob
from .connection import first_use_failed
from .errors import ClosedError, JobqError, RedisOOMError
from .job import Job
from .keys import lookup_id, validate_job_id
from .options import FAILURE_POLICIES
from .queue import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    Queue,
    add_refused,
    bulk_entry,
    job_specs,
    partly_added,
)
from .scripts import FunctionsRefused
from .tasks import QueueTasks, Task

if TYPE_CHECKING:
    from ._sharded_events import ShardedQueueEvents
    from .queue_events import QueueEvents

__all__ = ["ShardCountError", "ShardedQueue", "open_queue"]

logger = logging.getLogger("jobq.queue")

_Prepared = tuple[NewJob, dict[str, Any], Any]


def flows_refused(name: str) -> JobqError:
    """The error for ``depends_on`` or a failure policy on a sharded queue."""
    return JobqError(
        f"queue {name!r} is sharded: depends_on and flows need every job of a flow in "
        "one slot; use a plain queue for them"
    )


class ShardedQueue(OfQueue, ShardedReading, ShardedAdmin, QueueTasks, ClosedOnExit):
    """A queue spread over ``shards`` sub-queues, each in its own cluster slot.

    Use it as a ``Queue`` (same ``add``, ``add_bulk``, getters and
    administration); workers need not be told: ``Worker(name, ...)`` reads
    the shard count stored with the queue when it starts.

    - The count is stored with the queue on first use; opening the queue
      with another count (or as a plain ``Queue``) raises
      ``ShardCountError``. ``obliterate`` removes every shard and the count.
    - A job id names its shard: a custom ``job_id`` is hashed (so an
      idempotent add and ``get_job`` find it); a generated id is
      ``"<shard>-<32 hex digits>"``, the shard chosen round robin. An add
      with a ``dedup`` key and no id goes to the shard of its dedup key.
    - ``add_bulk`` writes each shard's jobs in its own round trips, the
      shards in parallel; atomic per chunk of one shard.
    - Counts, lists and metrics are summed over the shards; ``shard_counts``
      gives them per shard, ``shards`` the sub-queues themselves.
    - ``pause`` / ``resume`` act on every shard (one call each: a worker may
      take a job from a shard not yet paused while the pause goes round).
    - Not supported on a sharded queue: ``depends_on`` and flows (a parent
      and its children must share a slot), job schedulers. Tasks
      (``@queue.task``) work as on a Queue. Events: ``ShardedQueue.events``
      (one reader per shard).

    Args:
        name: the queue's name. Each shard's name adds a suffix (``~<i>``,
            sometimes ``.<n>``) and may have 100 characters at most: a
            name of up to 90 characters always fits.
        shards: how many sub-queues, 1 to 256. A multiple of the number of
            cluster masters spreads them evenly.
        connection, prefix, event_mode, max_events, default_job_options,
        max_payload_bytes, result_ttl: as for ``Queue``, applied to each
            shard. A prefix with a hash tag is refused (one slot for all).
    """

    def __init__(
        self,
        name: str,
        *,
        shards: int,
        connection: object = None,
        prefix: str = "jobq",
        event_mode: str | None = None,
        max_events: int | None = None,
        default_job_options: Mapping[str, Any] | None = None,
        max_payload_bytes: int | None = DEFAULT_MAX_PAYLOAD_BYTES,
        result_ttl: float | None = None,
    ) -> None:
        self._count = validate_count(shards)
        check_prefix(prefix)
        self._context = QueueContext(name, connection, prefix)
        client = self._context.client
        self._shards = tuple(
            Queue(
                shard, connection=client, prefix=prefix, event_mode=event_mode,
                max_events=max_events, default_job_options=default_job_options,
                max_payload_bytes=max_payload_bytes, result_ttl=result_ttl,
            )
            for shard in shard_names(name, self._count)
        )
        for index, shard_queue in enumerate(self._shards):
            shard_queue._recorded = True  # the logical name is listed, not its shards
            shard_queue._owner_lost = self._settings_lost
            shard_context = shard_queue._context
            shard_context.queue_name = name  # a job's queue is the sharded queue
            # a job's wait goes through this queue's events, not a reader of its shard
            shard_context.events_source = functools.partial(self._shard_events, index)
        self._defaults = dict(default_job_options or {})
        self._tasks: dict[str, Task[Any]] = {}
        self._turn = itertools.count(random.randrange(self._count))
        self._recorded = False
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._context.on_first_use(self._first_use)
        _fork.track(self)

    def _after_fork(self) -> None:
        """In a forked child: the executor's threads are the parent's (a
        task submitted to it would never run), and its lock may have been
        held by one of them. Forget both; the next ``add_bulk`` makes a new
        pool. The shards, their contexts and the events reset themselves."""
        self._pool_lock = threading.Lock()
        self._pool = None

    def _first_use(self) -> None:
        """Store the shard count with the queue's name and each shard's
        settings and mark (its scripts then publish wake-ups): one script
        call each, through the connection the adds share (the shards set up
        at once took a connection of the pool each, past a small pool's
        size)."""
        client = self._context.client
        try:
            calls = self._context.setup_calls
            stored, may = calls.store_shard_count(self._count, look=True)
            if may:  # none stored: no shard's name may be a plain queue's with jobs
                for shard in self._shards:
                    if shard._store_settings("f")[4]:
                        raise plain_queue_on_shard(shard.name, self.name)
                stored, _ = calls.store_shard_count(self._count)
            if stored == 0:
                raise holds_jobs(self.name)
            if stored != self._count:
                raise mismatch(self.name, stored, self._count)
            shards_ready(self._shards)
        except redis.exceptions.RedisError as exc:
            error = first_use_failed(exc, client)
            if error is exc:
                raise
            raise error from exc

    def _restore(self) -> None:
        """After ``obliterate``: the next use stores the count again."""
        self._first_use()

    def _settings_lost(self) -> None:
        """A shard's add found its settings gone (the server lost its data):
        store the count and every shard's settings and marks again, and list
        the queue again."""
        self._context.calls.store_shard_count(self._count)
        self._recorded = False
        # a shard whose slot moves holds up no other's (its next add tries again)
        on_every_shard(self._shards, lambda shard: shard._store_settings("c"))

    # -- what it is ---------------------------------------------------------

    @property
    def shard_count(self) -> int:
        """How many shards the queue has."""
        return self._count

    @property
    def shards(self) -> tuple[Queue, ...]:
        """The shards, as plain queues (for per-shard detail; they refuse
        ``add``, ``add_bulk`` and ``upsert_scheduler``: a job id names its
        shard, so add through the sharded queue)."""
        return self._shards

    def shard_for(self, job_id: str) -> Queue:
        """The shard that holds (or would hold) the job with this id."""
        return self._shards[shard_of(lookup_id(job_id), self._count)]

    def __repr__(self) -> str:
        state = "closed" if self._context.closed else "open"
        return f"<ShardedQueue {self.name!r} shards={self._count} prefix={self.prefix!r} {state}>"

    # -- adding -------------------------------------------------------------

    def add(self, name: str, data: Any = None, **options: Any) -> Job:
        """Add one job to the shard of its id; return it (see ``Queue.add``).

        Raises:
            JobqError: ``depends_on`` or a failure policy (flows are not
                supported on a sharded queue).
            As ``Queue.add`` otherwise.
        """
        return self._add_jobs([{"name": name, "data": data, **options}], bulk=False)[0]

    def add_bulk(self, jobs: Iterable[Mapping[str, Any]]) -> list[Job]:
        """Add many jobs (``{"name": ..., "data": ..., **options}`` each).

        Every job is validated before anything is written; then each shard's
        jobs are written a chunk per round trip, the shards in parallel.
        """
        return self._add_jobs(jobs)

    def _add_jobs(self, jobs: Iterable[Mapping[str, Any]], bulk: bool = True) -> list[Job]:
        """``add_bulk``; an error of a job names its entry when ``bulk``."""
        self._context.ensure_ready()
        groups: dict[int, list[tuple[int, _Prepared]]] = defaultdict(list)
        count = 0
        for index, name, data, options in job_specs(jobs):
            if options.get("depends_on") is not None or any(
                options.get(p) for p in FAILURE_POLICIES
            ):
                raise flows_refused(self.name)
            try:
                shard = self._route(options)
                new, opts = self._shards[shard]._prepare(name, data, options)
            except (TypeError, ValueError) as exc:
                if not bulk:
                    raise
                raise bulk_entry(index, name, exc) from exc
            groups[shard].append((count, (new, opts, data)))
            count += 1
        hook = _tracing.hook
        if hook is None:
            return self._write(groups, count, "")
        names = [new.name for group in groups.values() for _, (new, _, _) in group]
        return hook.send(self.name, names, lambda carrier: self._write(groups, count, carrier))

    def _prepare(self, name: Any, data: Any, options: dict[str, Any]) -> Any:
        """Check a job as ``add`` would (for ``add_on_commit``)."""
        return self._shards[0]._prepare(name, data, options)

    def _route(self, options: dict[str, Any]) -> int:
        """The shard of a new job; gives it a generated id when it has none."""
        job_id = options.get("job_id", self._defaults.get("job_id"))
        dedup = options.get("dedup", self._defaults.get("dedup"))
        key = dedup.get("id") if isinstance(dedup, Mapping) else None
        keyed = isinstance(key, str)
        if job_id is not None:
            if keyed:  # each names the job's shard: its key would be looked for elsewhere
                raise ValueError(
                    f"queue {self.name!r} is sharded: a job takes a custom job_id or a dedup "
                    "key, not both (each names the shard the job lives on)"
                )
            return shard_of(validate_job_id(job_id), self._count)
        if isinstance(key, str):
            shard = shard_of(key, self._count)
        else:
            shard = next(self._turn) % self._count
        options["job_id"] = generated_id(shard)
        return shard

    def _write(
        self, groups: dict[int, list[tuple[int, _Prepared]]], count: int, trace: str
    ) -> list[Job]:
        result: list[Job | None] = [None] * count
        refused: list[RedisOOMError] = []
        failed: list[redis.exceptions.RedisError] = []  # the other shards' jobs are written

        def write(shard: int) -> None:
            group = groups[shard]
            try:
                jobs = self._shards[shard]._write([prepared for _, prepared in group], trace)
            except RedisOOMError as exc:  # the shard's first jobs may be written
                refused.append(exc)
                jobs = list(exc.added)
            except redis.exceptions.RedisError as exc:  # its slot moving, say
                jobs = list(getattr(exc, "added", []))  # its first chunks may be written
                failed.append(exc.__cause__ if jobs and isinstance(
                    exc.__cause__, redis.exceptions.RedisError) else exc)
            for (index, _), job in zip(group, jobs, strict=False):
                result[index] = job

        shards = sorted(groups)
        if len(shards) == 1:
            write(shards[0])
        elif shards:
            for future in [self._executor().submit(write, shard) for shard in shards]:
                future.result()
        if count:
            self._record()
        added = [job for job in result if job is not None]
        for error in refused:
            if isinstance(error, FunctionsRefused):  # said as such: what to do differs
                error.added = added
                raise error
        if refused:
            raise add_refused(added, count) from refused[0]
        if failed:
            if not added:
                raise failed[0]
            raise partly_added(failed[0], added, count) from failed[0]
        return added

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._context.closed:
                raise ClosedError(f"queue {self.name!r} is closed")
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=min(self._count, 16), thread_name_prefix=f"jobq-add-{self.name}"
                )
            return self._pool

    def _record(self) -> None:
        record_queue(self)

    # -- events and closing -------------------------------------------------

    def _shard_events(self, index: int) -> QueueEvents:
        return self.events.readers[index]

    @property
    def events(self) -> ShardedQueueEvents:
        """Events of every shard, started on first use, shared by all threads."""
        self._context.ensure_ready()
        shards_ready(self._shards)  # each shard's settings (its event mode) are stored
        return self._context.held_events(self._make_events)

    def _make_events(self) -> ShardedQueueEvents:
        from ._sharded_events import ShardedQueueEvents

        return ShardedQueueEvents(
            self.name, shards=self._count, connection=self.client, prefix=self.prefix
        )

    def close(self) -> None:
        """Close the shared events reader, the shards and the client jobq created."""
        _fork.check()
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        for shard_queue in self._shards:
            shard_queue.close()
        self._context.close()



def shards_ready(shards: Iterable[Queue]) -> None:
    """Each shard's first use (its settings stored). One that fails for now
    (its slot moving, its node away) holds up none of the others: it sets
    itself up at its own next call, which raises if it still cannot."""
    for shard in shards:
        try:
            shard._context.ensure_ready()
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            logger.debug("shard %r not set up yet: %s", shard.name, exc)


def open_queue(
    name: str, *, connection: object = None, prefix: str = "jobq", **options: Any
) -> Queue | ShardedQueue:
    """Open queue ``name`` as what it is stored as: a ``ShardedQueue`` when a
    shard count is stored with it, else a plain ``Queue`` (one read).

    For tools that are given only a name (``jobq info``, the dashboard).
    ``options`` go to the queue's constructor.
    """
    probe = QueueContext(name, connection, prefix)
    try:
        count = stored_count(probe.client, prefix, name)
    finally:
        probe.close()
    if count is None:
        return Queue(name, connection=connection, prefix=prefix, **options)
    return ShardedQueue(name, shards=count, connection=connection, prefix=prefix, **options)
