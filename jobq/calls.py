"""The scripts' typed front end: one method per script.

Each method builds its script's arguments and decodes its reply; nothing
else in jobq knows a script's argument list. The methods run over
``run(script, *argv)`` of the caller's choice (a context's pooled client,
a pool thread's own connection, a fetch thread's blocking client).
``SCRIPT_METHODS`` maps every script to its method, for the test that checks
each method against its script's header.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import redis

from .errors import ScriptCode
from .keys import OBLITERATED

Run = Callable[..., Any]


def _text(value: Any) -> str | None:
    if value is None or value is False:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _raw(value: Any) -> Any:
    """A bulk reply, with nil and RESP3's false as None."""
    return None if value is None or value is False else value


# -- the worker's scripts ------------------------------------------------------------


class TakeArgs(NamedTuple):
    """What a take needs: moveToActive's arguments (and the tail of a
    finishing call that takes the next job along)."""

    token: str
    lock_ms: int
    worker: str
    limit_max: int
    limit_ms: int


class Taken(NamedTuple):
    """A job a take locked for the worker: its id, the lock token, and its
    record as a flat field/value list."""

    job_id: str
    token: str
    record: list[bytes]


class TakeReply(NamedTuple):
    """moveToActive's reply: a job, or how long to wait for one."""

    taken: Taken | None = None
    #: nothing taken: ms until the next delayed job is due (-1: none)
    next_delay_ms: int = -1
    #: > 0: the rate limiter allows no take for this many ms
    limited_ms: int = 0
    #: a job was taken and others wait to be taken
    more: bool = False


class FinishReply(NamedTuple):
    """complete's or fail's reply."""

    code: ScriptCode
    #: server time of the call (epoch seconds); None when refused
    finished_on: float | None = None
    #: the next job, when the call was asked to take one
    next: TakeReply | None = None
    #: the cancel's reason, when the call ended a cancelled attempt (CANCELLED)
    reason: str | None = None


def _decode_take(reply: Any, token: str) -> TakeReply:
    code = int(reply[0])
    if code == 1:
        # (a reply of the retried take, taken_by, does not say: "maybe")
        return TakeReply(Taken(reply[1].decode(), token, reply[2]),
                         more=len(reply) < 4 or reply[3] == 1)
    if code == 2:
        return TakeReply(limited_ms=max(1, int(reply[1])))
    return TakeReply(next_delay_ms=int(reply[1]))


def _decode_finish(reply: Any, take: TakeArgs | None) -> FinishReply:
    if not isinstance(reply, list):
        return FinishReply(ScriptCode(int(reply)))
    taken = reason = None
    if take is not None and len(reply) > 2 and isinstance(reply[2], list):
        taken = _decode_take(reply[2], take.token)
    if len(reply) > 3:
        reason = reply[3].decode("utf-8", "replace")
    return FinishReply(ScriptCode(int(reply[0])), float(reply[1]) / 1000.0, taken, reason)


class WorkerScripts:
    """The scripts a worker runs."""

    __slots__ = ("_run",)

    def __init__(self, run: Run) -> None:
        self._run = run

    def take(self, take: TakeArgs, *, retried: bool = False) -> TakeReply:
        """moveToActive.lua: promote due delayed jobs, take the next job.
        ``retried``: this take's token was sent before and its reply lost."""
        reply = self._run("moveToActive", *take, "1" if retried else "0")
        return _decode_take(reply, take.token)

    def complete(
        self, job_id: str, token: str, result: bytes, take: TakeArgs | None
    ) -> FinishReply:
        """complete.lua: finish an attempt successfully (and take the next job,
        unless the server is out of memory)."""
        return self._finish("complete", (job_id, token, result), take)

    def fail(
        self, job_id: str, token: str, reason: str, stacktrace: bytes, delay_ms: int,
        take: TakeArgs | None, exc_type: str = "",
    ) -> FinishReply:
        """fail.lua: end a failed attempt; ``delay_ms`` -1 forbids a retry;
        ``exc_type`` is the type name of the exception that failed it."""
        return self._finish(
            "fail", (job_id, token, reason, stacktrace, delay_ms, exc_type), take)

    def _finish(self, script: str, args: tuple[Any, ...], take: TakeArgs | None) -> FinishReply:
        """Finish, and take the next job along when ``take``: by the script's
        variant that the server refuses when out of memory (scripts.VARIANTS),
        and then by the script itself, which finishes without taking (but
        hands back the job a first call whose reply was lost took: 'r')."""
        if take is None:
            return _decode_finish(self._run(script, *args), None)
        try:
            return _decode_finish(self._run(script + "Take", *args, *take), take)
        except redis.exceptions.OutOfMemoryError:  # nothing of it ran
            return _decode_finish(self._run(script, *args, *take, "r"), take)

    def extend_locks(
        self, lock_ms: int, held: Iterable[tuple[str, str]]
    ) -> tuple[set[str], set[str]]:
        """extendLocks.lua: renew (job id, token) locks; (the tokens lost,
        the tokens whose job's cancel was requested)."""
        argv: list[Any] = [lock_ms]
        for job_id, token in held:
            argv += (job_id, token)
        lost, cancelled = self._run("extendLocks", *argv)
        return {t.decode() for t in lost}, {t.decode() for t in cancelled}

    def stalled_check(self, max_stalled: int, guard_ms: int, batch: int) -> list[str]:
        """stalledCheck.lua: recover jobs of dead workers; the ids recovered."""
        return [i.decode() for i in self._run("stalledCheck", max_stalled, guard_ms, batch)]


# -- the queue's scripts ---------------------------------------------------------------


class NewJob(NamedTuple):
    """One job of add.lua, as its header lists the values."""

    job_id: str  # '' to generate one
    name: str
    data: bytes
    opts: bytes
    delay_ms: int
    priority: int
    lifo: bool
    attempts: int
    keep_completed_count: int
    keep_completed_age_ms: int
    keep_failed_count: int
    keep_failed_age_ms: int
    #: (dedup id or '', ttl ms or 0, extend '1' | '0', replace '1' | '0')
    dedup: tuple[str, int, str, str]
    #: its failure policy for when it is (or becomes) a child: '' its parent
    #: waits on it, or a code of options.FAILURE_POLICIES (field fpol)
    policy: str = ""
    #: the trace context to store with the job ('' for none: see _tracing.py)
    trace: str = ""


class Added(NamedTuple):
    """One job of add.lua's reply."""

    job_id: str
    #: 0 added; 1 an existing custom id; 2 deduplicated, 3 debounced (job_id
    #: is then the dedup key's owner)
    duplicated: int
    #: the run's token: its `added` event's id (``p<n>`` in pub/sub mode)
    run: str | None
    #: an existing custom id's record, read by the add (``duplicated`` 1)
    record: dict[bytes, bytes] | None = None


def _added(job_id: bytes, duplicated: Any, run: Any) -> Added:
    if isinstance(run, list):  # an existing id's record
        record = dict(zip(run[::2], run[1::2], strict=True))
        return Added(job_id.decode(), int(duplicated), None, record)
    return Added(job_id.decode(), int(duplicated), _text(run) or None)


class Counts(NamedTuple):
    """getCounts.lua's reply."""

    waiting: int
    delayed: int
    active: int
    completed: int
    failed: int
    paused: bool
    waiting_children: int = 0


class FlowNode(NamedTuple):
    """One node of addFlow.lua: its queue's base, its parent node's index
    (1-based, 0 for none), and the job (its name '' for a reference to an
    existing job)."""

    base: str
    parent: int
    job: NewJob


class MetricsReply(NamedTuple):
    """getMetrics.lua's reply."""

    now_ms: int
    total: int  # jobs counted so far
    wait_ms: int
    run_ms: int
    minute: int | None
    minute_base: int
    finished: list[int]


class OutcomeReply(NamedTuple):
    """getOutcome.lua's reply."""

    state: str | None
    value: bytes | None
    reason: str | None
    stacktrace: bytes | None
    checkpoint: str | None
    final: bool
    cursor: str | None
    anchored: bool
    #: the record's run token when the record answered (a later generation
    #: than the one asked for after a retry)
    run: str | None = None
    #: the type name of the exception that failed the job, when known
    exc_type: str | None = None


def _settings(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """add.lua's 14 settings of a job from ``NewJob[4:]``."""
    (delay_ms, priority, lifo, attempts, keep_completed, keep_completed_ms, keep_failed,
     keep_failed_ms, dedup, policy, trace) = values
    return (delay_ms, priority, "1" if lifo else "0", attempts, keep_completed,
            keep_completed_ms, keep_failed, keep_failed_ms, *dedup, policy, trace)


class QueueScripts:
    """The scripts of adding, reading and administering a queue."""

    __slots__ = ("_run",)

    def __init__(self, run: Run) -> None:
        self._run = run

    def add(self, jobs: Sequence[NewJob], mode: str = "") -> tuple[float, list[Added], bool]:
        """add.lua: add jobs atomically; (the server's time, s; each job;
        whether the queue's stored settings are missing, or its event mode
        is not ``mode`` when one is given)."""
        argv: list[Any]
        settings = jobs[0][4:]
        if all(job[4:] == settings for job in jobs):
            # the usual bulk add: settings sent once, 4 values a job, not 18
            # (a tenth less of the server's work per job of a bulk)
            argv = [len(jobs), "1", *_settings(settings)]
            for job in jobs:
                argv += job[:4]
        else:
            argv = [len(jobs), "0"]
            for job in jobs:
                argv += job[:4]
                argv += _settings(job[4:])
        if mode:
            argv.append(mode)
        reply = self._run("add", *argv)
        unset = len(reply) % 3 == 2
        added = [_added(*reply[i : i + 3]) for i in range(1, len(reply) - unset, 3)]
        return float(reply[0]) / 1000.0, added, unset

    def add_flow(
        self, nodes: Sequence[FlowNode], modes: str = ""
    ) -> tuple[float, list[Added], int, int, list[int]]:
        """addFlow.lua: add a tree (or a job and its dependencies) atomically;
        (the server's time, s; each node; 0; 0; the 0-based indexes of the
        nodes written whose queue had no mark of stored settings, or not
        pub/sub mode where ``modes`` (a character a node) has '1'), or, with
        nothing written, (0; []; an error code; the node's 1-based index;
        []): -1 a named job does not exist, -6 it has another parent."""
        argv: list[Any] = [len(nodes)]
        for node in nodes:
            job = node.job
            argv += (node.base, node.parent, job.policy, *job[:6], "1" if job.lifo else "0",
                     *job[7:12], *job.dedup, job.trace)
        if "1" in modes:
            argv.append(modes)
        reply = self._run("addFlow", *argv)
        if len(reply) == 2 and int(reply[0]) < 0:
            return 0.0, [], int(reply[0]), int(reply[1]), []
        end = 1 + 3 * len(nodes)
        added = [
            Added(reply[i].decode(), int(reply[i + 1]), _text(reply[i + 2]) or None)
            for i in range(1, end, 3)
        ]
        return float(reply[0]) / 1000.0, added, 0, 0, [int(i) - 1 for i in reply[end:]]

    def emit(self, event: str, fields: Iterable[tuple[str, bytes]]) -> None:
        """emit.lua: publish a custom event with msgpack-encoded fields."""
        argv: list[Any] = [event]
        for name, packed in fields:
            argv += (name, packed)
        self._run("emit", *argv)

    def get_counts(self) -> Counts:
        """getCounts.lua: jobs per state, in one snapshot."""
        reply = self._run("getCounts")
        waiting, delayed, active, completed, failed = (int(v) for v in reply[:5])
        return Counts(waiting, delayed, active, completed, failed, int(reply[5]) == 1,
                      int(reply[6]))

    def pause(self, paused: bool) -> None:
        """pause.lua: pause or resume the queue."""
        self._run("pause", "1" if paused else "0")

    def store_settings(
        self, event_mode: str, max_events: str, result_ttl_ms: str, writes: str, db: str
    ) -> list[bytes | None]:
        """storeSettings.lua: store the settings given ('' for each not
        given); ``writes`` 'c' the mark of stored settings too, 's' the
        shard mark, 'p' the caller's client is a cluster's; ``db`` the
        caller's database (kept in pub/sub mode). The settings as stored:
        event mode, max_events, result TTL in ms, shard count (None for each
        not stored); then whether the shard mark was refused ('f': the
        name is a plain queue that holds jobs); then the shard mark."""
        return list(self._run("storeSettings", event_mode, max_events, result_ttl_ms, writes,
                              db))

    def store_shard_count(self, count: int, look: bool = False) -> tuple[int, bool]:
        """storeShardCount.lua: store a sharded queue's count unless one is
        (``look``: only say whether one is); (the count stored, 0 when none
        is; whether one may be stored: with 0 and False, the name is a
        plain queue holding jobs)."""
        stored, may = self._run("storeShardCount", count, "look" if look else "")
        return int(stored), bool(int(may))

    def remove(self, job_id: str, children: bool) -> int | str:
        """remove.lua: 1 removed, 0 no such job, -2 active with its lock
        held; with ``children``, the ``"<queue>:<id>"`` of a child active with
        its lock held (then nothing is removed)."""
        reply = self._run("remove", job_id, "1" if children else "0")
        return reply.decode("utf-8", "replace") if isinstance(reply, bytes) else int(reply)

    def drain(
        self, delayed: bool, batch: int, since: int
    ) -> tuple[int, int, int, list[str]]:
        """drain.lua: remove up to ``batch`` waiting (and delayed) jobs;
        (removed, looked at, the drain's start: ``since`` of the next call,
        the ids of schedulers' ticks removed)."""
        removed, looked, start, ticks = self._run("drain", "1" if delayed else "0", batch,
                                                  since)
        return int(removed), int(looked), int(start), [t.decode() for t in ticks]

    def clean(
        self, state: str, grace_ms: int, batch: int, cursor: bytes
    ) -> tuple[list[str], bytes]:
        """clean.lua: one batch; (the ids removed, the cursor to go on from)."""
        ids, nxt = self._run("clean", state, grace_ms, batch, cursor)
        return [i.decode() for i in ids], nxt

    def obliterate(self, force: bool, batch: int) -> int:
        """obliterate.lua: jobs deleted in this call, or -4 (active jobs); the
        keys it deletes at the end are those of the schema (keys.py)."""
        return int(self._run("obliterate", "1" if force else "0", batch, *OBLITERATED))

    def retry(
        self, state: str, batch: int, reset: bool, job_ids: Sequence[str] = ()
    ) -> tuple[int, str]:
        """retry.lua: jobs moved back to waiting (-1 / -3 for a given id) and
        the new run token of the last of them."""
        reply = self._run("retry", state, batch, "1" if reset else "0", *job_ids)
        if not isinstance(reply, list):
            return int(reply), ""
        return int(reply[0]), _text(reply[1]) or ""

    def promote(self, job_id: str) -> int:
        """promote.lua: 1, -1 no such job, -3 not delayed."""
        return int(self._run("promote", job_id))

    def promote_due_first(self, count: int) -> tuple[int, int]:
        """promote.lua for up to ``count`` delayed jobs, the soonest due
        first: (how many it promoted, how many ids it took: records gone
        are dropped)."""
        moved, looked = self._run("promote", "", count)
        return int(moved), int(looked)

    def change_delay(self, job_id: str, delay_ms: int) -> int:
        """changeDelay.lua: 1, -1 no such job, -3 not delayed."""
        return int(self._run("changeDelay", job_id, delay_ms))

    def change_priority(self, job_id: str, priority: int, lifo: bool) -> int:
        """changePriority.lua: 1, -1 no such job."""
        return int(self._run("changePriority", job_id, priority, "1" if lifo else "0"))

    def update_job(
        self, job_id: str, what: str, value: Any, keep: int = 0, token: str | None = None
    ) -> int:
        """updateJob.lua: set data or progress, or append a log line (then:
        the number of lines); -1 no such job; -2 ``token`` (an attempt's)
        no longer owns it."""
        # a running attempt's own progress and log lines run when the server
        # is out of memory, as its finish does (scripts.VARIANTS); data does not
        held = token and what in ("progress", "log")
        return int(self._run("updateJobHeld" if held else "updateJob", job_id, what, value,
                             keep, token or ""))

    def get_metrics(self, kind: str) -> MetricsReply:
        """getMetrics.lua: one kind's metrics with the server's clock."""
        now_ms, count, wait_ms, run_ms, minute, mbase, finished = self._run("getMetrics", kind)
        return MetricsReply(
            int(now_ms), int(count), int(wait_ms), int(run_ms),
            None if minute is None else int(minute), int(mbase),
            [int(c) for c in finished],
        )

    def cancel(self, job_id: str, reason: str) -> int:
        """cancel.lua: 1 cancelled (not running: failed now), 2 cancel
        requested (running), 0 no such job or finished already."""
        return int(self._run("cancel", job_id, reason))

    def upsert_scheduler(
        self, scheduler_id: str, schedule: Sequence[Any], spec: str, first: str, after: str,
        template: Sequence[Any], mode: str = "",
    ) -> tuple[int, str, dict[bytes, bytes], bool]:
        """upsertScheduler.lua: (0 same schedule | 1 new or changed | -5 the
        first tick collides, the next tick's id, the scheduler's record as
        stored: empty when it collides, whether the queue's stored settings
        are missing, or its event mode is not ``mode`` when one is given)."""
        reply = self._run("upsertScheduler", scheduler_id, *schedule, spec, first, after,
                          *template, *([mode] if mode else []))
        code = int(reply[0])
        unset = len(reply) == (3 if code == -5 else 4)
        flat = reply[2] if code != -5 else []
        return (code, _text(reply[1]) or "", dict(zip(flat[::2], flat[1::2], strict=True)),
                unset)

    def scheduler_sync(
        self, scheduler_id: str, pending: str, after_pending: str, first: str, after_first: str
    ) -> int:
        """schedulerSync.lua: make a scheduler's missing next tick; 0 nothing
        to do, 1 made, -5 its id collides with an existing job."""
        return int(self._run("schedulerSync", scheduler_id, pending, after_pending, first,
                             after_first))

    def remove_scheduler(self, scheduler_id: str) -> int:
        """removeScheduler.lua: 1 removed, 0 no such scheduler."""
        return int(self._run("removeScheduler", scheduler_id))

    def heartbeat(self, name: str, ttl_ms: int, token: str, fields: Sequence[Any] = ()) -> bool:
        """heartbeat.lua: announce a worker for ``ttl_ms``; 0 withdraws it
        (its own announcement only). Whether the announcement held another
        worker's token."""
        return bool(int(self._run("heartbeat", name, ttl_ms, token, *fields)[1]))

    def get_workers(self) -> list[tuple[str, list[bytes]]]:
        """getWorkers.lua: (name, flat record) of each live worker."""
        return [(_text(name) or "", flat) for name, flat in self._run("getWorkers")[1:]]

    def get_logs(self, job_id: str, lines: int, line_bytes: int,
                 budget: int) -> tuple[int, list[tuple[int, bytes]]]:
        """getLogs.lua: (lines in the log, (length, first bytes) of the
        newest lines, newest first, within ``budget`` bytes)."""
        reply = self._run("getLogs", job_id, lines, line_bytes, budget)
        return int(reply[0]), [(int(length), bytes(head)) for length, head in reply[1:]]

    def get_outcome(self, job_id: str, run: str, cursor: str, anchored: bool) -> OutcomeReply:
        """getOutcome.lua: what a waiter needs of one run, with the checkpoint."""
        return outcome_reply(self._run("getOutcome", *outcome_args(job_id, run, cursor, anchored)))


def outcome_args(job_id: str, run: str, cursor: str, anchored: bool) -> tuple[str, ...]:
    """getOutcome.lua's ARGV (a pipelined call sends them itself)."""
    return job_id, run, cursor, "1" if anchored else ""


def outcome_reply(reply: Any) -> OutcomeReply:
    """Decode getOutcome.lua's reply."""
    state, value, reason, stacktrace, checkpoint, final = reply[:6]
    more = len(reply) >= 7 and reply[6] is not None  # a scan cut short: its cursor
    return OutcomeReply(
        _text(state), _raw(value), _text(reason), _raw(stacktrace), _text(checkpoint),
        bool(final), (_text(reply[6]) or "") if more else None,
        bool(reply[7]) if more else False,
        _text(reply[8]) if len(reply) >= 9 else None,
        _text(reply[9]) if len(reply) >= 10 else None,
    )


#: Every script and the method that runs it.
SCRIPT_METHODS: dict[str, tuple[type, str]] = {
    "moveToActive": (WorkerScripts, "take"),
    "complete": (WorkerScripts, "complete"),
    "fail": (WorkerScripts, "fail"),
    "extendLocks": (WorkerScripts, "extend_locks"),
    "stalledCheck": (WorkerScripts, "stalled_check"),
    "heartbeat": (QueueScripts, "heartbeat"),
    "add": (QueueScripts, "add"),
    "addFlow": (QueueScripts, "add_flow"),
    "emit": (QueueScripts, "emit"),
    "getCounts": (QueueScripts, "get_counts"),
    "pause": (QueueScripts, "pause"),
    "remove": (QueueScripts, "remove"),
    "storeSettings": (QueueScripts, "store_settings"),
    "storeShardCount": (QueueScripts, "store_shard_count"),
    "drain": (QueueScripts, "drain"),
    "clean": (QueueScripts, "clean"),
    "obliterate": (QueueScripts, "obliterate"),
    "retry": (QueueScripts, "retry"),
    "promote": (QueueScripts, "promote"),
    "changeDelay": (QueueScripts, "change_delay"),
    "changePriority": (QueueScripts, "change_priority"),
    "updateJob": (QueueScripts, "update_job"),
    "getMetrics": (QueueScripts, "get_metrics"),
    "getWorkers": (QueueScripts, "get_workers"),
    "getLogs": (QueueScripts, "get_logs"),
    "getOutcome": (QueueScripts, "get_outcome"),
    "cancel": (QueueScripts, "cancel"),
    "upsertScheduler": (QueueScripts, "upsert_scheduler"),
    "schedulerSync": (QueueScripts, "scheduler_sync"),
    "removeScheduler": (QueueScripts, "remove_scheduler"),
}
