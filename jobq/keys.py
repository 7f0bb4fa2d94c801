"""The key schema of a queue, all under one cluster hash tag, and the
fields of a job's record: written here once. The scripts build the same names
from the queue's base (tests/test_schema.py checks that every name a script
uses is listed here), and ``obliterate`` deletes what this schema says."""

from __future__ import annotations

import re
from typing import TypeGuard

#: whitespace, control characters and lone surrogates (not encodable as
#: UTF-8: a key or argument with one fails only when it is sent)
_BAD = r"\s\x00-\x1f\x7f\ud800-\udfff"
_NAME_RE = re.compile(rf"[^{{}}*?\[\]{_BAD}]{{1,100}}")
_JOB_ID_RE = re.compile(rf"[^{_BAD}]{{1,200}}")
#: a lone surrogate, which no text sent to the server may hold
SURROGATE = re.compile(r"[\ud800-\udfff]")


def is_valid_name(value: object) -> TypeGuard[str]:
    """Whether ``value`` is a valid queue name (see ``validate_name``)."""
    return isinstance(value, str) and _NAME_RE.fullmatch(value) is not None


def validate_name(value: object, what: str = "queue name") -> str:
    """Return ``value`` if it is a valid queue name or prefix, else raise ValueError."""
    if not is_valid_name(value):
        raise ValueError(
            f"invalid {what} {value!r}: 1 to 100 characters, without braces, "
            "'*', '?', '[', ']', whitespace, control characters or lone surrogates"
        )
    return value


_PREFIX_RE = re.compile(
    rf"[^{{}}*?\[\]{_BAD}]*(?:\{{[^{{}}*?\[\]{_BAD}]+\}})?[^{{}}*?\[\]{_BAD}]*"
)


def validate_prefix(value: object) -> str:
    """Return ``value`` if it is a valid key prefix, else raise ValueError.

    A prefix is a queue name's characters, and may hold one hash tag
    (``"{flows}"``, ``"app:{flows}"``): then every queue of that prefix
    lives in the tag's cluster slot, as the queues of one flow must on a
    cluster (see FlowProducer).
    """
    if not isinstance(value, str) or not 1 <= len(value) <= 100 or not _PREFIX_RE.fullmatch(value):
        raise ValueError(
            f"invalid prefix {value!r}: 1 to 100 characters, without '*', '?', '[', ']', "
            "whitespace, control characters or lone surrogates, and braces only around one "
            "hash tag (e.g. '{flows}')"
        )
    return value


def validate_job_id(value: object) -> str:
    """Return a custom job id if it is valid, else raise ValueError."""
    if not isinstance(value, str) or not _JOB_ID_RE.fullmatch(value):
        raise ValueError(
            f"invalid job_id {value!r}: a non-empty string of at most 200 characters "
            "without whitespace, control characters or lone surrogates"
        )
    if value.isdigit():
        raise ValueError(
            f"invalid job_id {value!r}: an all-digit id could collide with generated ids; "
            "give it a non-digit part (e.g. 'order-123')"
        )
    return value


def lookup_id(value: object) -> str:
    """A job id given to look a job up (``get_job``, ``remove``, ``cancel``,
    ...): a str, or an int for a generated id (``get_job(7)`` is job "7").

    Raises:
        TypeError: anything else; ``None`` would otherwise name the job
            whose custom id is ``"None"``.
        ValueError: a str with lone surrogates (no job has such an id: it
            cannot be sent to the server).
    """
    if isinstance(value, str):
        return _encodable(value, "job_id")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    raise TypeError(f"job_id must be a str (or an int >= 0, a generated id), not {value!r}")


def lookup_key(value: object, what: str) -> str:
    """A scheduler id or dedup key given to look one up or release it: a str.

    Raises:
        TypeError: anything else; ``None`` would otherwise name the
            scheduler (or dedup key) ``"None"``.
        ValueError: a str with lone surrogates (see ``lookup_id``).
    """
    if isinstance(value, str):
        return _encodable(value, what)
    raise TypeError(f"{what} must be a str, not {value!r}")


def _encodable(value: str, what: str) -> str:
    if SURROGATE.search(value):
        raise ValueError(f"invalid {what} {value!r}: lone surrogates cannot be sent to the "
                         "server (no job, scheduler or key can have them)")
    return value


#: Every key of a queue but the families below, after its base
#: ``<prefix>:{<queue>}:``, and what it holds.
QUEUE_KEYS: dict[str, str] = {
    "wait": "list: ids of waiting jobs without a priority (taken from the right)",
    "prioritized": "sorted set: waiting jobs with a priority (score: priority, order)",
    "delayed": "sorted set: delayed jobs (score: when due, ms)",
    "active": "sorted set: active jobs (score: when taken, ms)",
    "completed": "sorted set: completed jobs kept (score: when finished, ms)",
    "failed": "sorted set: jobs failed for good, kept (score: when finished, ms)",
    "meta": "hash: the queue's settings (em event mode, maxev, rttl) and paused; a sharded "
            "queue's shard count (shards, on its own base; obliterated once it was) or shard "
            "mark (shard, on each shard)",
    "events": "stream of events (in pub/sub mode, the channel's name); on a shard of a "
              "sharded queue in stream mode, also the sharded channel its scripts publish a "
              "wake-up for the queue's readers on",
    "marker": "sorted set: wakes workers blocked on it (BZPOPMIN); on a shard of a sharded "
              "queue, also the sharded channel its scripts publish wake-ups on",
    "workers": "sorted set: live workers' names (score: when their heartbeat expires)",
    "id": "counter: the last generated job id",
    "runs": "counter: the last run token given in pub/sub mode",
    "pc": "counter: the order of prioritized jobs of one priority",
    "limiter": "counter: jobs taken in the rate limiter's window (expires with it)",
    "stalled-check": "guard: set while a stalled check's interval runs",
    "metrics:completed": "hash: totals and the minute being counted, completed jobs",
    "metrics:completed:data": "list: completed jobs per finished minute, newest first",
    "metrics:failed": "hash: totals and the minute being counted, failed jobs",
    "metrics:failed:data": "list: failed jobs per finished minute, newest first",
    "schedulers": "sorted set: scheduler ids (score: their next run, ms)",
    "cancels": "sharded channel: ids of running jobs whose cancel was requested",
    "waiting-children": "sorted set: parents waiting for their children (score: when added, ms)",
}

#: Families of keys named by an id after their prefix.
ITEM_KEYS: dict[str, str] = {
    "job:": "hash: a job's record (JOB_FIELDS)",
    "logs:": "list: a job's log lines",
    "lock:": "string: the lock token of an active job (expires)",
    "result:": "string: a result kept apart from its record, by run token (expires)",
    "failure:": "string: how a run removed as it failed ended (state, exception type, "
                "reason), by run token (expires)",
    "worker:": "hash: a live worker's announcement (expires)",
    "scheduler:": "hash: a scheduler (schedule, template, next run, count)",
    "dedup:": "string: the id of the job that owns a dedup key (may expire)",
    "deps:": "set: a parent's pending children, '<queue>:<id>' each",
    "processed:": "hash: a parent's completed children ('<queue>:<id>') and their results",
    "ignored:": "hash: a parent's children whose failure was ignored, and their reasons",
    "dfailed:": "hash: a parent's failed children it waits on (until retried or removed), "
                "and their reasons",
}

#: Keys ``obliterate`` keeps, so that the queue's name stays usable as it
#: was: its settings, its id counters (ids stay unique for the life of the
#: name) and its event stream (emptied, so a blocked reader reads on).
KEPT_BY_OBLITERATE = frozenset({"meta", "events", "id", "runs"})

#: The keys ``obliterate`` deletes once the jobs are gone.
OBLITERATED = tuple(sorted(set(QUEUE_KEYS) - KEPT_BY_OBLITERATE))

#: The fields of a job's record (``job:<id>``).
JOB_FIELDS: dict[str, str] = {
    "name": "the job's name",
    "data": "its data (msgpack)",
    "opts": "its options that differ from the defaults (msgpack map)",
    "ts": "when it was added (ms)",
    "delay": "its delay (ms)",
    "priority": "its priority (0: none)",
    "lifo": "'1' when it goes first in line",
    "atts": "attempts allowed (absent: 1)",
    "kc": "completed jobs to keep (absent: all)",
    "ka": "age of completed jobs to keep, ms (absent: any)",
    "kfc": "failed jobs to keep (absent: all)",
    "kfa": "age of failed jobs to keep, ms (absent: any)",
    "state": "waiting, delayed, active, completed, failed or waiting-children",
    "rdy": "when it became ready to run (ms)",
    "run": "the token of its current run (see getOutcome.lua)",
    "atm": "attempts made (ended)",
    "stc": "times it stalled",
    "pon": "when its current attempt started (ms)",
    "pb": "the worker that runs or ran it",
    "tok": "the lock token of its current attempt",
    "ftok": "the lock token that finished it (a retried finish is recognised)",
    "prog": "its progress (msgpack)",
    "rv": "its return value (msgpack)",
    "fr": "its last failed reason",
    "et": "the type name of the exception that failed its last attempt",
    "st": "its stack traces, newest last (msgpack list)",
    "fon": "when it finished (ms)",
    "cx": "the reason of a cancel requested while it ran (the durable mark)",
    "ddk": "the dedup key it owns",
    "ddt": "'1' when that key is a throttle (it expires by itself)",
    "sch": "the scheduler that produced it",
    "slot": "its scheduler's slot (ms)",
    "pid": "a child's parent's id",
    "pqb": "a child's parent's queue base ('<prefix>:{<queue>}:')",
    "fpol": "a child's failure policy: f fail the parent, i ignore, r remove (absent: wait)",
    "kids": "'1' on a job added with children (it has the keys of a parent)",
    "fchild": "the child whose failure failed this parent (a retry of it reopens the parent)",
    "rel": "when its last child ended and it moved on (ms; a parent)",
    "ffs": "the children that failed it (fail_parent_on_failure), space-separated "
           "'<queue>:<id>' each; a parent is failed while one of them is",
    "tc": "the W3C trace context of its producer (traceparent, then a newline and the "
          "tracestate when there is one); written only while tracing is on",
}


class QueueKeys:
    """Every key of one queue; ``base`` carries the hash tag ``{queue}``.

    Scripts take ``base`` as KEYS[1] and derive the other keys from it, which
    keeps every key of a queue in one cluster slot.
    """

    __slots__ = (
        "prefix", "queue", "base", "wait", "prioritized", "delayed", "active",
        "completed", "failed", "meta", "events", "marker", "workers", "schedulers",
        "waiting_children",
    )

    def __init__(self, prefix: str, queue: str) -> None:
        self.prefix = prefix
        self.queue = queue
        self.base = f"{prefix}:{{{queue}}}:"
        self.wait = self.base + "wait"
        self.prioritized = self.base + "prioritized"
        self.delayed = self.base + "delayed"
        self.active = self.base + "active"
        self.completed = self.base + "completed"
        self.failed = self.base + "failed"
        self.meta = self.base + "meta"
        self.events = self.base + "events"
        self.marker = self.base + "marker"
        self.workers = self.base + "workers"
        self.schedulers = self.base + "schedulers"
        self.waiting_children = self.base + "waiting-children"

    def state_set(self, state: str) -> str:
        """The sorted set of a state's jobs (not waiting: a list and a set)."""
        return self.waiting_children if state == "waiting-children" else str(getattr(self, state))

    def job(self, job_id: str) -> str:
        """The hash that holds one job's record."""
        return f"{self.base}job:{job_id}"

    def logs(self, job_id: str) -> str:
        """The list of a job's log lines."""
        return f"{self.base}logs:{job_id}"

    def lock(self, job_id: str) -> str:
        """The string holding the lock token of an active job."""
        return f"{self.base}lock:{job_id}"

    def parent_key(self, kind: str, job_id: str) -> str:
        """A parent's key about its children: kind deps, processed, ignored or dfailed."""
        return f"{self.base}{kind}:{job_id}"

    def scheduler(self, scheduler_id: str) -> str:
        """The hash of one job scheduler (its schedule, template and state)."""
        return f"{self.base}scheduler:{scheduler_id}"

    def dedup(self, key: str) -> str:
        """The string holding the id of the job that owns a dedup key."""
        return f"{self.base}dedup:{key}"

    def worker(self, name: str) -> str:
        """The hash a live worker announces itself in (it expires with its heartbeat)."""
        return f"{self.base}worker:{name}"


def queues_key(prefix: str) -> str:
    """The set of queue names known under ``prefix``, for listing queues.

    Deliberately outside every queue's hash tag: it lists queues, it belongs
    to none (written with single-key commands only, so clusters serve it).
    """
    return f"{prefix}:queues"
