"""What the dashboard reads from Redis, and the cache that bounds how often.

Every read is bounded by what a page shows: one page of a state's jobs
(LRANGE / ZRANGE of that page, then one HGETALL per job in a pipeline), the
newest lines of a job's log, the newest entries of the event stream. Nothing
scans a whole state.
"""

from __future__ import annotations

import codecs
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import redis

from .. import _fork
from .._queue_ops import ranked
from ..events import Event, from_stream
from ..job import STATES, Dependencies, Job
from ..registry import WorkerInfo
from ..sharding import ShardedQueue

if TYPE_CHECKING:
    from .._context import QueueContext
    from .._schedulers import Scheduler
    from ..queue import Queue

T = TypeVar("T")

#: The deepest job a page of a sharded queue's list shows: its page reads
#: every shard's jobs up to it, and merges them.
SHARDED_DEPTH = 2_500
#: Jobs per page of a state's list.
PAGE_SIZE = 25
#: Newest log lines shown on a job's page ...
LOG_LINES = 200
#: ... each cut to this many bytes, and no more read once those shown make
#: this many (a line may be as long as a payload: a MiB by default)
LOG_LINE_BYTES = 10_000
LOG_BYTES = 100_000
#: Newest entries of the event stream searched for a job's timeline.
TIMELINE_SCAN = 2000
#: Minutes of completed / failed counts drawn in a queue's chart.
CHART_MINUTES = 60
#: Minutes over which jobs per minute are averaged.
RATE_MINUTES = 5


class SharedCache:
    """Reads shared by every request of one app: each key is read from Redis
    at most once per ``ttl`` seconds, and one read runs at a time, so the
    load on Redis stays bounded however many browsers poll.

    No thread of its own: a request that finds its entry stale reads it
    again, under that key's read lock; the others asking for it wait and
    take its result. Reads of other keys go on meanwhile (one read lock for
    all: a page slow to read, of a cluster's node that does not answer or
    a deep page of a sharded queue, held up every page of the app).
    """

    def __init__(self, ttl: float, max_entries: int = 256) -> None:
        self.ttl = ttl
        self._max = max_entries
        self._entries: dict[Hashable, tuple[float, Any]] = {}
        self._sweep_at = 0.0  # when stale entries are next dropped
        self._lock = threading.Lock()
        # the read lock of each key being read, and how many requests use it
        self._reading: dict[Hashable, tuple[threading.Lock, int]] = {}
        #: how many reads went to Redis (for tests and the curious)
        self.reads = 0
        _fork.track(self)

    def _after_fork(self) -> None:
        """In a forked child: new locks (a parent's request may have held
        one at the fork, e.g. during a read)."""
        self._lock = threading.Lock()
        self._reading = {}

    def _fresh(self, key: Hashable) -> tuple[bool, Any]:
        with self._lock:
            hit = self._entries.get(key)
        if hit is not None and hit[0] > time.monotonic():
            return True, hit[1]
        return False, None

    def get(self, key: Hashable, read: Callable[[], T]) -> T:
        """The cached value of ``key``, read again by ``read()`` when stale."""
        found, value = self._fresh(key)
        if found:
            return value  # type: ignore[no-any-return]
        with self._lock:
            lock, users = self._reading.get(key, (threading.Lock(), 0))
            self._reading[key] = (lock, users + 1)
        try:
            with lock:
                found, value = self._fresh(key)  # another request may have read it meanwhile
                if found:
                    return value  # type: ignore[no-any-return]
                value = read()
                self._store(key, value)
                return value
        finally:
            with self._lock:
                lock, users = self._reading[key]
                if users == 1:
                    del self._reading[key]
                else:
                    self._reading[key] = (lock, users - 1)

    def _store(self, key: Hashable, value: Any) -> None:
        with self._lock:
            self.reads += 1
            now = time.monotonic()
            self._entries[key] = (now + self.ttl, value)
            # stale entries go once a ttl (they held pages read long ago)
            if len(self._entries) > self._max or now >= self._sweep_at:
                self._sweep_at = now + self.ttl
                for old in [k for k, (exp, _) in self._entries.items() if exp <= now]:
                    del self._entries[old]
                while len(self._entries) > self._max:  # the oldest inserted go first
                    del self._entries[next(iter(self._entries))]

    def clear(self) -> None:
        """Forget everything (after an action, so that its effect shows at once)."""
        with self._lock:
            self._entries.clear()


@dataclass(frozen=True)
class QueueSummary:
    """One queue as the overview and the queue page show it."""

    name: str
    counts: dict[str, int]
    paused: bool
    workers: int
    completed_rate: float
    failed_rate: float
    completed_minutes: list[int] = field(default_factory=list)
    failed_minutes: list[int] = field(default_factory=list)
    scheduler_count: int = 0


@dataclass(frozen=True)
class Refused:
    """A queue whose summary the server refused to read (a key of the
    wrong type, set by hand): its name and the server's reason."""

    name: str
    reason: str


def summary_or_refusal(queue: Queue) -> QueueSummary | Refused:
    """The overview's row of a queue: its summary, or why it has none."""
    try:
        return summary(queue, minutes=0)
    except redis.exceptions.ResponseError as exc:
        return Refused(queue.name, str(exc))


def summary(queue: Queue, minutes: int = CHART_MINUTES) -> QueueSummary:
    """Counts, paused flag, live workers and per-minute metrics of a queue."""
    completed = queue.get_metrics("completed", 0, max(minutes, RATE_MINUTES) - 1)
    failed = queue.get_metrics("failed", 0, max(minutes, RATE_MINUTES) - 1)
    client = queue._context.redis
    return QueueSummary(
        name=queue.name,
        counts=queue.get_job_counts(),
        paused=queue.is_paused(),
        workers=len(queue.get_workers()),
        completed_rate=completed.per_minute(RATE_MINUTES),
        failed_rate=failed.per_minute(RATE_MINUTES),
        completed_minutes=completed.data[:minutes],
        failed_minutes=failed.data[:minutes],
        scheduler_count=int(client.zcard(queue._context.keys.schedulers)),
    )


@dataclass(frozen=True)
class UnreadableJob:
    """A job whose record cannot be read into a :class:`Job` (undecodable
    data, a field that is not a number, ...): its id, its raw fields as
    text, and why. Shown as such, so that one bad record never hides the
    others, and removable like any job (actions work on ids)."""

    id: str
    fields: dict[str, str]
    error: str

    @property
    def name(self) -> str:
        """The job's name as stored, '' when it has none."""
        return self.fields.get("name", "")


def read_job(context: QueueContext, job_id: str, record: dict[bytes, bytes]
             ) -> Job | UnreadableJob:
    """The job of a record, or an :class:`UnreadableJob` saying why it cannot be read."""
    try:
        return _decoded(Job.from_record(context, job_id, record))
    except Exception as exc:  # a record written by hand or another version can hold anything
        fields = {k.decode("utf-8", "backslashreplace"): v.decode("utf-8", "backslashreplace")
                  for k, v in record.items()}
        return UnreadableJob(job_id, fields, f"{type(exc).__name__}: {exc}")


def _decoded(job: Job) -> Job:
    """``job``, its values decoded now (a page shows them): raises when one cannot be."""
    job.data, job.return_value, job.progress  # noqa: B018 - read to decode
    return job


def _checked(queue: ShardedQueue, job: Job) -> Job | UnreadableJob:
    """A job of a sharded listing, or its record's :class:`UnreadableJob`."""
    try:
        return _decoded(job)
    except Exception:
        shard = queue.shard_for(job.id)._context
        return read_job(shard, job.id, shard.redis.hgetall(shard.keys.job(job.id)))


@dataclass(frozen=True)
class JobPage:
    """One page of the jobs of one state."""

    state: str
    page: int
    total: int
    jobs: list[Job | UnreadableJob]
    #: of delayed jobs: when each is due (s), by id (a retry's backoff
    #: counts from its failure, not from when the job was added)
    due: dict[str, float] = field(default_factory=dict)
    #: the last page shown, when the list goes on past it (a sharded queue's:
    #: see SHARDED_DEPTH)
    last_shown: int | None = None

    @property
    def pages(self) -> int:
        """How many pages there are (at least 1)."""
        return max(1, -(-self.total // PAGE_SIZE))


def job_page(queue: Queue, state: str, page: int) -> JobPage:
    """Page ``page`` (from 1) of the jobs in ``state``: waiting in the order
    they will run, delayed soonest first, active oldest first, finished jobs
    newest first. Reads only that page."""
    if state not in STATES:
        raise ValueError(f"unknown state {state!r}")
    if isinstance(queue, ShardedQueue):  # every shard's page, merged
        start = (page - 1) * PAGE_SIZE
        total = queue.get_job_counts(state)[state]
        last_shown = SHARDED_DEPTH // PAGE_SIZE
        if page > last_shown:  # not read: every shard's jobs up to it would be
            return JobPage(state, page, total, [], last_shown=last_shown)
        newest_first = state in ("completed", "failed")
        found = queue.get_jobs(state, start, start + PAGE_SIZE - 1, asc=not newest_first)
        due_at: dict[str, float] = {}
        if state == "delayed":
            for job in found:  # a page of one state: a read per job, as a merge does
                at = _due(job._context.redis.hget(job._context.keys.job(job.id), "rdy"))
                if at is not None:
                    due_at[job.id] = at
        return JobPage(state, page, total, [_checked(queue, job) for job in found], due_at,
                       last_shown if total > SHARDED_DEPTH else None)
    context = queue._context
    keys = context.keys
    client = context.redis
    start = (page - 1) * PAGE_SIZE
    end = start + PAGE_SIZE - 1
    ids: list[bytes] = []
    if state == "waiting":
        pipe = client.pipeline(transaction=False)
        pipe.llen(keys.wait)
        pipe.zcard(keys.prioritized)
        in_list, prioritized = pipe.execute()
        total = int(in_list) + int(prioritized)
        if start < in_list:
            # the wait list is taken from its right end: index i in run order
            # is -(i + 1) from the left
            last = min(end, in_list - 1)
            ids.extend(client.lrange(keys.wait, -(last + 1), -(start + 1))[::-1])
        if end >= in_list:
            ids.extend(client.zrange(keys.prioritized, max(0, start - in_list), end - in_list))
    else:
        key = keys.state_set(state)
        total = int(client.zcard(key))
        newest_first = state in ("completed", "failed")
        ids.extend(ranked(client, key, start, end, newest_first))
    pipe = client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hgetall(keys.job(job_id.decode()))
    records = [(raw_id.decode(), record)
               for raw_id, record in zip(ids, pipe.execute(), strict=True) if record]
    jobs = [read_job(context, jid, record) for jid, record in records]
    when_due: dict[str, float] = {}
    if state == "delayed":
        for jid, record in records:
            at = _due(record.get(b"rdy"))
            if at is not None:
                when_due[jid] = at
    return JobPage(state, page, total, jobs, when_due)


def _due(ready: bytes | None) -> float | None:
    """When a delayed job is due (s), from its record's `rdy` (ms)."""
    try:
        return float(ready) / 1000.0 if ready is not None else None
    except ValueError:  # not a number (written by hand)
        return None


@dataclass(frozen=True)
class JobDetail:
    """Everything a job's page shows."""

    job: Job | UnreadableJob
    state: str
    log_total: int
    logs: list[str]
    timeline: list[Event]
    scheduler: Scheduler | None
    #: its children in a flow (or the jobs it depends on), when it has any
    dependencies: Dependencies | None = None


def job_detail(queue: Queue, job_id: str) -> JobDetail | None:
    """A job with its newest log lines, its events among the newest
    ``TIMELINE_SCAN`` entries of the stream, and its scheduler; None when
    there is no such job."""
    if isinstance(queue, ShardedQueue):  # the job's shard holds all of it
        queue = queue.shard_for(job_id)
    context = queue._context
    keys = context.keys
    client = context.redis
    record = client.hgetall(keys.job(job_id))
    if not record:
        return None
    job = read_job(context, job_id, record)
    state = record.get(b"state", b"unknown").decode("utf-8", "replace")
    log_total, lines = context.calls.get_logs(job_id, LOG_LINES, LOG_LINE_BYTES, LOG_BYTES)
    timeline: list[Event] = []
    if queue.event_mode == "stream":
        for entry_id, raw in client.xrevrange(keys.events, count=TIMELINE_SCAN):
            if raw.get(b"jid") == job_id.encode():
                try:
                    timeline.extend(reversed(from_stream(entry_id, raw)))
                except Exception:  # an entry of another version: leave it out
                    continue
        timeline.reverse()
    scheduler = None
    sid = record.get(b"sch")
    if sid:
        scheduler = queue.get_scheduler(sid.decode("utf-8", "replace"))
    return JobDetail(
        job=job,
        state=state,
        log_total=log_total,
        logs=[_log_line(length, head) for length, head in reversed(lines)],
        timeline=timeline,
        scheduler=scheduler,
        dependencies=job.get_dependencies()
        if isinstance(job, Job) and record.get(b"kids") else None,
    )


def _log_line(length: int, head: bytes) -> str:
    """A log line as shown: whole, or its first bytes and how long it is."""
    if length <= len(head):
        return head.decode("utf-8", "replace")
    # cut: a character split at the cut is held back by the decoder, left out
    text = codecs.getincrementaldecoder("utf-8")("replace").decode(head, final=False)
    return f"{text}… (cut: {len(head):,} of {length:,} bytes)"


def workers(queue: Queue) -> list[WorkerInfo]:
    """The queue's live workers."""
    return queue.get_workers()


def schedulers(queue: Queue) -> list[Scheduler]:
    """The queue's schedulers, soonest next run first."""
    return queue.get_schedulers()
