"""What a Queue reads and how it is administered, as two mixins of Queue:
``QueueReading`` (jobs, states, counts, lists) and ``QueueAdmin`` (pause,
remove, drain, clean, obliterate, retries, workers, metrics, the stream)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import redis
from redis.cluster import RedisCluster

from . import serializer
from .errors import ACTIVE_JOBS, LOCK_LOST, JobqError, script_error
from .job import STATES, Job
from .keys import lookup_id, queues_key
from .metrics import Metrics, read_metrics
from .options import flag, list_index, seconds
from .registry import WorkerInfo, live_workers

if TYPE_CHECKING:
    from ._context import QueueContext

#: Characters a SCAN pattern gives a meaning to (escaped in a key prefix).
_GLOB_SPECIAL = re.compile(r"[*?\[\]\\]")

logger = logging.getLogger(__name__)

#: Jobs per script call for bulk adds and batched admin operations.
BATCH = 1000


def ranked(client: Any, key: str, start: int, end: int, reverse: bool) -> list[bytes]:
    """Members ``start``..``end`` of a sorted set, highest score first when
    ``reverse``: ZRANGE ... REV, not redis-py's ``desc=True``, which sends
    ZREVRANGE (not granted by the read-only ACL of docs/guide/security.md)."""
    return list(client.execute_command("ZRANGE", key, start, end, *(("REV",) if reverse else ())))


def record_queue(owner: Any) -> None:
    """List the queue of ``owner`` (a Queue or a ShardedQueue, after a
    write) in the known-queues set, once. Concurrent first writes send one
    SADD between them, not one each: a few hundred greenlets' first adds
    ran the pool out of connections, and adds whose jobs were written
    raised. The write succeeded, so a failure here is not raised: the next
    write lists the queue."""
    if owner._recorded is not False:  # listed, or being listed by another write
        return
    owner._recorded = None
    try:
        owner._context.redis.sadd(queues_key(owner.prefix), owner.name)
    except Exception as exc:
        owner._recorded = False
        logger.debug("listing queue %r failed: %r", owner.name, exc)
        return
    owner._recorded = True


class QueueReading:
    """Reading a queue's jobs (a mixin of Queue)."""

    _context: QueueContext

    def get_job(self, job_id: str) -> Job | None:
        """The job with that id, or None.

        Raises:
            TypeError: ``job_id`` is not a str (or an int, for a generated
                id), as for every method that looks a job up by its id.
        """
        job_id = lookup_id(job_id)
        record = self._context.redis.hgetall(self._context.keys.job(job_id))
        if not record:
            return None
        return Job.from_record(self._context, job_id, record)

    def get_job_state(self, job_id: str) -> str:
        """One of waiting, delayed, active, completed, failed, waiting-children, or unknown."""
        state = self._context.redis.hget(self._context.keys.job(lookup_id(job_id)), "state")
        return state.decode("utf-8", "replace") if state else "unknown"

    def get_job_result(self, job_id: str, default: Any = None) -> Any:
        """The return value of a completed job, else ``default``."""
        key = self._context.keys.job(lookup_id(job_id))
        state, value = self._context.redis.hmget(key, ["state", "rv"])
        if state != b"completed":
            return default
        return serializer.decode(value, "return value")

    def get_job_counts(self, *states: str) -> dict[str, int]:
        """Jobs per state (every state when none is named), zeros included."""
        for state in states:
            if state not in STATES:
                raise ValueError(f"unknown state {state!r}; states are {', '.join(STATES)}")
        counts = self._context.calls.get_counts()
        everything = {
            "waiting": counts.waiting, "delayed": counts.delayed, "active": counts.active,
            "completed": counts.completed, "failed": counts.failed,
            "waiting-children": counts.waiting_children,
        }
        return {state: everything[state] for state in (states or STATES)}

    def count(self) -> int:
        """Jobs waiting or delayed."""
        counts = self.get_job_counts("waiting", "delayed")
        return counts["waiting"] + counts["delayed"]

    def get_jobs(
        self, states: str | Sequence[str], start: int = 0, end: int = -1, asc: bool = False
    ) -> list[Job]:
        """Jobs in the given state(s), newest first (oldest first when ``asc``).

        Waiting jobs come in the order they will run when ``asc`` (the
        reverse otherwise). ``start`` and ``end`` index each state's jobs
        inclusively, like LRANGE.
        """
        start, end = list_index("start", start), list_index("end", end)
        names, asc = state_names(states), flag("asc", asc)
        keys = self._context.keys
        client = self._context.redis
        ids: list[bytes] = []
        for state in names:
            if state not in STATES:
                raise ValueError(f"unknown state {state!r}; states are {', '.join(STATES)}")
            if state == "waiting":
                ids.extend(_waiting(client, keys, start, end, asc))
            else:
                ids.extend(ranked(client, keys.state_set(state), start, end, not asc))
        # an id no job of jobq's has (not UTF-8: written by hand) finds no record
        texts = [job_id.decode("utf-8", "replace") for job_id in ids]
        pipe = client.pipeline(transaction=False)
        for job_id in texts:
            pipe.hgetall(keys.job(job_id))
        return [Job.from_record(self._context, job_id, record)
                for job_id, record in zip(texts, pipe.execute(), strict=True) if record]


class QueueAdmin:
    """Administering a queue (a mixin of Queue)."""

    _context: QueueContext
    _recorded: bool | None  # None: being listed (see record_queue)
    _record: Callable[[], None]  # Queue's: lists the queue's name once

    @property
    def name(self) -> str:
        """The queue's name."""
        return self._context.name

    def pause(self) -> None:
        """Pause the queue for every worker (durable); emits ``paused``."""
        self._context.calls.pause(True)
        self._record()  # a queue paused before its first job is a known one

    def resume(self) -> None:
        """Resume the queue; emits ``resumed``."""
        self._context.calls.pause(False)
        self._record()

    def is_paused(self) -> bool:
        """Whether the queue is paused."""
        return bool(self._context.redis.hget(self._context.keys.meta, "paused") == b"1")

    def remove(self, job_id: str, *, remove_children: bool = True) -> bool:
        """Remove a job; False if there is none.

        A parent (in a flow, or a job added with ``depends_on``) is removed
        with its children, whatever their state or queue, and theirs at any
        depth, all or none; ``remove_children=False`` removes it alone (its
        children run on, and their outcomes go nowhere). A child removed is
        dropped from its parent, which moves on if it was the last.

        Raises:
            JobqError: the job, or one of the children it would remove, is
                active with its lock held (cancel it).
        """
        return remove_job(self._context, lookup_id(job_id), remove_children)

    def drain(self, delayed: bool = False) -> int:
        """Remove every waiting job (and delayed ones when asked); return how many.

        As with ``remove``, a parent (in ``waiting-children``) whose last
        pending children this removes moves on: it is waiting (or delayed,
        by its own delay) once the drain returns, and runs; and a
        scheduler whose pending job it removes skips that run: its next
        job is made once the drain is over."""
        delayed = flag("delayed", delayed)
        total, since = 0, 0
        ticks: list[str] = []
        while True:
            removed, looked, since, found = self._context.calls.drain(delayed, BATCH, since)
            total += removed
            ticks += found
            if looked < BATCH or removed == 0:  # done, or only released parents left
                ticks_left(self._context, ticks)
                return total

    def clean(self, grace: float, limit: int = 0, state: str = "completed") -> list[str]:
        """Remove jobs of ``state`` older than ``grace`` seconds; return their ids.

        Finished jobs are aged by when they finished, others by when they were
        added. ``limit`` caps how many (0: no cap). Emits ``removed`` per job
        and ``cleaned`` per batch. Each script call looks at a bounded slice
        of the state's jobs, so a long queue never blocks the server long. A
        scheduler whose pending job it removes skips that run: its next job
        is made once the clean is over.
        """
        if state not in ("completed", "failed", "delayed", "waiting", "waiting-children"):
            raise ValueError(
                "clean takes state completed, failed, delayed, waiting or waiting-children, "
                f"not {state!r}"
            )
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"limit must be an int >= 0, not {limit!r}")
        grace_ms = round(seconds("grace", grace) * 1000)
        removed: list[str] = []
        cursor = b""
        while True:
            batch = BATCH if not limit else min(BATCH, limit - len(removed))
            ids, cursor = self._context.calls.clean(state, grace_ms, batch, cursor)
            removed.extend(ids)
            if not cursor or (limit and len(removed) >= limit):
                if state in ("waiting", "delayed"):
                    ticks_left(self._context, removed)
                return removed

    def obliterate(self, force: bool = False) -> None:
        """Delete the queue's jobs, events, metrics and worker registry.

        The queue's settings (event mode, ``max_events``) and its generated-id
        counter stay, so the name keeps its mode and never reuses an id; the
        paused flag is cleared. The queue is held paused while the jobs go
        (a call per 1000), so that no worker takes one meanwhile. Emits
        ``obliterated`` once everything is gone; then the outcomes kept for
        waiters apart from their records (a job removed as it finished, a
        big result) and the throttle keys whose job is gone go too, found by
        SCAN (a user that may not SCAN leaves them to expire, within the
        queue's ``result_ttl`` and the keys' ttl).

        Raises:
            JobqError: the queue has active jobs and ``force`` is False
                (nothing is deleted).
        """
        force = flag("force", force)
        while True:
            deleted = self._context.calls.obliterate(force, BATCH)
            if deleted == ACTIVE_JOBS:
                raise script_error(deleted, action="obliterate")
            if deleted < BATCH:
                self._context.redis.srem(queues_key(self._context.prefix), self.name)
                self._recorded = False  # listed again by the next add
                self._drop_kept_outcomes()
                return

    def _drop_kept_outcomes(self) -> None:
        """Delete the queue's ``result:<run>`` and ``failure:<run>`` keys
        (obliterate left them for as long as ``result_ttl``, up to 30 days),
        and its throttle keys whose job is gone (a key kept for its ttl
        after its job's retention removed it: adds with it wrote nothing
        for up to that ttl after the obliterate)."""
        client = self._context.redis
        if isinstance(client, RedisCluster):  # on the node of the queue's slot
            node = client.get_node_from_key(self._context.keys.base)  # type: ignore[no-untyped-call]
            client = client.get_redis_connection(node)
        base = _GLOB_SPECIAL.sub(r"\\\g<0>", self._context.keys.base)
        try:
            for kind in ("result:", "failure:", "dedup:"):
                found: list[Any] = []
                for key in client.scan_iter(match=f"{base}{kind}*", count=1000):
                    found.append(key)
                    if len(found) == 500:
                        self._unlink_kept(client, kind, found)
                        found.clear()
                if found:
                    self._unlink_kept(client, kind, found)
        except redis.exceptions.NoPermissionError:
            logger.info("queue %r: its kept outcomes expire by themselves (this user may not "
                        "SCAN or UNLINK)", self.name)
        except redis.exceptions.ResponseError as exc:  # a slot moving: they expire
            logger.info("queue %r: its kept outcomes expire by themselves (%s)", self.name, exc)

    def _unlink_kept(self, client: Any, kind: str, keys: list[bytes]) -> None:
        """Delete ``keys``; of dedup keys, those whose job is gone (a key
        an add made since the obliterate names a job that exists)."""
        if kind == "dedup:":
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.get(key)
            named = [(key, owner) for key, owner in zip(keys, pipe.execute(), strict=True)
                     if owner]
            for _, owner in named:
                pipe.exists(self._context.keys.job(owner.decode("utf-8", "replace")))
            keys = [key for (key, _), held in zip(named, pipe.execute(), strict=True)
                    if not held]
        if keys:
            client.unlink(*keys)

    def retry_jobs(self, state: str = "failed", *, reset_attempts: bool = False) -> int:
        """Move every failed (or completed) job back to waiting (or, as
        ``Job.retry``, a parent with children pending to waiting-children);
        return how many.

        Each job keeps its attempts and stall count as ``Job.retry`` does
        (one more attempt), unless ``reset_attempts`` is True. A cancelled
        job is a failed one: it is retried too, as in BullMQ.
        """
        if state not in ("failed", "completed"):
            raise ValueError(f"state must be 'failed' or 'completed', not {state!r}")
        reset_attempts = flag("reset_attempts", reset_attempts)
        # bounded by what is there now, so jobs failing again are not retried twice
        remaining = int(self._context.redis.zcard(getattr(self._context.keys, state)))
        total = 0
        while remaining > 0:
            moved, _ = self._context.calls.retry(state, min(BATCH, remaining), reset_attempts)
            if moved <= 0:
                break
            total += moved
            remaining -= moved
        return total

    def promote_jobs(self, count: int | None = None) -> int:
        """Make every delayed job (or the ``count`` due soonest) wait now,
        as ``Job.promote`` does each (BullMQ's promoteJobs); return how many.

        Jobs delayed meanwhile (a retry's backoff, a scheduler's next
        tick) are left for a later call: the count is bounded by the
        delayed jobs there are when it starts. A scheduler's pending job
        promoted runs now, and the scheduler's next job is the one of the
        schedule's following time: each promote moves a schedule on a run.
        """
        remaining = int(self._context.redis.zcard(self._context.keys.delayed))
        if count is not None:
            remaining = min(remaining, list_index("count", count, minimum=0))
        total = 0
        while remaining > 0:
            moved, looked = self._context.calls.promote_due_first(min(BATCH, remaining))
            if looked <= 0:
                break
            total += moved
            remaining -= moved if count is not None else looked
        return total

    # -- operating --------------------------------------------------------

    def get_workers(self) -> list[WorkerInfo]:
        """The live workers of this queue (heartbeat not expired), by name."""
        return live_workers(self._context)

    def get_metrics(self, kind: str, start: int = 0, end: int = -1) -> Metrics:
        """Counts of finished jobs per minute, newest first (BullMQ's getMetrics).

        Args:
            kind: ``"completed"``, or ``"failed"`` (terminal failures).
            start, end: which minutes, inclusive, like LRANGE: 0 is the minute
                in progress, 1 the one before; -1 the oldest kept (a day).

        Returns:
            A Metrics: ``count`` (all time), ``data`` (per minute),
            ``waited_for`` and ``ran_for`` (seconds, summed over ``count``).
        """
        return read_metrics(self._context, kind, start, end)

    def trim_events(self, max_len: int) -> int:
        """Trim the event stream to about ``max_len`` entries; return how many went."""
        max_len = list_index("max_len", max_len, minimum=0)
        return int(self._context.redis.xtrim(self._context.keys.events, maxlen=max_len))

def state_names(states: object) -> list[str]:
    """The states of a ``get_jobs``: one name or several, each once, in the
    order first named."""
    if isinstance(states, str):
        return [states]
    if isinstance(states, (bytes, Mapping)) or not isinstance(states, Iterable):
        raise TypeError(f"states must be a state name or a list of them, not {states!r}")
    return list(dict.fromkeys(states))


def remove_job(context: QueueContext, job_id: str, remove_children: bool) -> bool:
    """Run remove.lua for one job (the one place that calls it)."""
    code = context.calls.remove(job_id, flag("remove_children", remove_children))
    if isinstance(code, str):
        raise JobqError(
            f"job {job_id!r} was not removed: its child {code} is active (a worker holds "
            "its lock); cancel it first, or remove the job with remove_children=False"
        )
    if code == LOCK_LOST:
        raise JobqError(
            f"job {job_id!r} is active (a worker holds its lock): it cannot be removed; "
            "use cancel() to stop it"
        )
    if code == 1:
        ticks_left(context, [job_id])
    return code == 1


def ticks_left(context: QueueContext, job_ids: list[str]) -> None:
    """After jobs were removed: the schedulers whose pending ticks were
    among them get their next ticks (see ``tick_left``)."""
    from ._schedulers import tick_left

    seen: set[str] = set()
    for job_id in job_ids:
        sid = job_id.rpartition(":")[0]
        if job_id.startswith("repeat:") and sid not in seen:
            seen.add(sid)
            tick_left(context, job_id)


def _waiting(client: Any, keys: Any, start: int, end: int, asc: bool) -> list[bytes]:
    """Waiting jobs ``start``..``end`` (inclusive, negatives from the end, as
    LRANGE) in the order they will run (``asc``; the reverse otherwise): the
    wait list from its right end, then prioritized jobs, most urgent first.
    Only the window is read (the whole list was: 0.17 s and a server blocked
    for 90 ms for ten jobs of 600,000)."""
    pipe = client.pipeline(transaction=False)
    pipe.llen(keys.wait)
    pipe.zcard(keys.prioritized)
    listed, prioritized = pipe.execute()
    total = listed + prioritized
    first = max(0, total + start) if start < 0 else start
    last = min(total - 1, total + end if end < 0 else end)
    if first > last:
        return []
    if not asc:  # the same window counted from the other end
        first, last = total - 1 - last, total - 1 - first
    ids: list[bytes] = []
    if first < listed:  # run order i is the list's index listed - 1 - i
        ids += client.lrange(keys.wait, listed - 1 - min(last, listed - 1),
                             listed - 1 - first)[::-1]
    if last >= listed:
        ids += client.zrange(keys.prioritized, max(first, listed) - listed, last - listed)
    return ids if asc else ids[::-1]
