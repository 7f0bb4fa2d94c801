"""Callers waiting for jobs: their outcomes, their registry, and the checks
of the jobs' records that resolve them.

A job id may be used by several runs over time (a custom id reused after its
job was removed). Every run has a token: the id of its ``added`` event in
stream mode, ``p<n>`` in pub/sub mode. The token is recorded in the job's
record and carried by the events that end the run (``completed``,
``failed``, ``removed``), so that a waiter is only ever answered by the run
it waits for. A retry of a finished job begins the run's next generation:
its token gains ``#<n>`` (retry.lua). A waiter takes an outcome of its
generation or a later one, never an earlier one.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import redis

from . import events as _events
from . import serializer
from ._batch_check import BatchCheck
from ._context import QueueContext
from .calls import OutcomeReply
from .errors import (
    ClosedError,
    JobCancelledError,
    JobFailedError,
    JobNotFoundError,
    SerializationError,
)

logger = logging.getLogger("jobq.queue_events")  # the public module's name, as documented

#: Outcomes of finished runs that the reader remembers, for waiters that
#: register after the event was read (a job removed on completion).
RECENT_OUTCOMES = 10_000
#: Waiters' record checks that may run at once (each holds a pooled connection).
CONCURRENT_CHECKS = 16
#: Calls of getOutcome.lua (2,000 events each) a check may make to scan a
#: removed run's events: the whole stream at the default max_events.
SCAN_CALLS = 100
#: Most woken threads that have yet to run; more are woken when half of
#: those have run, or when none has run for WAKE_STALE seconds. See WakeGate.
WAKE_BATCH = 64
WAKE_STALE = 0.25
#: Most waiters one read answers that the reader wakes itself; more (a
#: burst, e.g. thousands of threads waiting) go through the waker thread,
#: so that the reader reads on while they are woken.
DIRECT_WAKES = 16

StreamId = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Completed:
    """The run completed with ``value``."""

    value: Any


@dataclass(frozen=True, slots=True)
class Failed:
    """The run failed for good; ``stacktrace`` None when it must be read."""

    reason: str | None
    stacktrace: list[str] | None = None
    exc_type: str | None = None
    #: failed by a cancel: waiters raise JobCancelledError
    cancelled: bool = False


@dataclass(frozen=True, slots=True)
class Unreadable:
    """The run completed, with a value this process cannot decode: waiters
    raise ``error`` (a SerializationError)."""

    error: Exception


@dataclass(frozen=True, slots=True)
class Missing:
    """The run does not exist, or was removed."""


@dataclass(frozen=True, slots=True)
class Closed:
    """The QueueEvents was closed during the wait."""


Outcome = Completed | Failed | Unreadable | Missing | Closed
MISSING = Missing()
CLOSED = Closed()


def sid(value: str) -> StreamId:
    """Parse a stream id ("ms-seq" or "ms") into a comparable tuple."""
    ms, _, seq = value.partition("-")
    return int(ms), int(seq or 0)


def valid_id(value: str) -> bool:
    """Whether ``value`` parses as a stream id."""
    try:
        sid(value)
    except ValueError:
        return False
    return True


def generation(token: str) -> tuple[str, int]:
    """A run token's first part (the run's) and its generation."""
    first, mark, gen = token.rpartition("#")
    if mark and gen.isdigit():
        return first, int(gen)
    return token, 0


def later(token: str, than: str) -> bool:
    """Whether run token ``token`` is a later generation of ``than``'s run."""
    first, gen = generation(token)
    mine, floor = generation(than)
    return first == mine and gen > floor


def text(value: bytes | None) -> str | None:
    """Decode a reply's bytes, None staying None."""
    return None if value is None else value.decode("utf-8", "replace")


class Waiter:
    """One caller (or future) waiting for one run of one job."""

    __slots__ = (
        "job_id", "run", "event", "outcome", "callback", "checkpoint", "gate", "stale", "since",
        "_gone", "_lock",
    )

    def __init__(
        self,
        job_id: str,
        run: str | None = None,
        callback: Callable[[Waiter, Outcome], None] | None = None,
        stale: bool = False,
    ) -> None:
        self.job_id = job_id
        self.run = run  # None: whatever run the record holds (a Job built by hand)
        # The token may be stale (the Job was waited on before: the job may
        # have been retried since). The reader's outcomes answer the waiter
        # only once a check of the record has brought the token up to date,
        # else the reader, behind, could answer it with the run before the
        # retry between its registration and its check.
        self.stale = stale
        # The table's count of outcomes read when this waiter registered: a
        # waiter without a run takes only an outcome read since (see
        # WaiterTable.remembered).
        self.since = 0
        self.event = threading.Event()
        self.outcome: Outcome | None = None
        self.callback = callback
        # Set when the record was found missing: resolve "missing" once the
        # reader has passed this point without seeing the run end.
        self.checkpoint: StreamId | str | None = None
        # the WakeGate of the batch that woke this waiter's thread, if any
        self.gate: WakeGate | None = None
        self._gone = False  # its thread no longer waits (see resumed)
        self._lock = threading.Lock()

    def matches(self, run: str | None) -> bool:
        """Whether an outcome of ``run`` (None: unknown) answers this waiter:
        the same run, at the waiter's generation or a later one."""
        if run is None or self.run is None or run == self.run:
            return True
        first, gen = generation(run)
        mine, floor = generation(self.run)
        return first == mine and gen >= floor

    def resolve(self, outcome: Outcome, gate: WakeGate | None = None) -> bool:
        """Set the outcome; the first one wins (the reader and a check race).
        Return whether this call set it: not once its thread has stopped
        waiting. ``gate``: the WakeGate that wakes the thread, told when the
        thread runs (``resumed``)."""
        with self._lock:
            if self.outcome is not None or self._gone:
                return False
            self.outcome = outcome
            self.gate = gate
        self.event.set()
        if self.callback is not None:
            self.callback(self, outcome)
        return True

    def resumed(self) -> None:
        """Called by the waiting thread as it stops waiting (answered, timed
        out, closed): tell the gate that woke it that it runs. A waiter
        whose thread is gone is answered no more: a gate counted it as a
        woken thread yet to run, for ever, and held up the next batches by
        a quarter of a second each (a burst of waits timing out as their
        jobs finished woke the threads behind them seconds late)."""
        with self._lock:
            self._gone = True
            gate, self.gate = self.gate, None
        if gate is not None:
            gate.passed()

    def poke(self) -> None:
        """Wake the waiting thread so that it checks the record again."""
        self.event.set()

    def afresh(self) -> None:
        """A future's waiter in a forked child: undecided, its record to be
        checked again (what the parent's threads did with it is not here)."""
        self._lock = threading.Lock()
        self.event = threading.Event()
        self.outcome, self.gate, self.checkpoint = None, None, None
        self._gone, self.stale = False, True
        self.since = 0  # the child's table remembers nothing yet


def completed(raw: bytes | None) -> Completed | Unreadable:
    """The outcome of a run that completed with the encoded value ``raw``."""
    try:
        return Completed(serializer.decode(raw, "return value"))
    except SerializationError as exc:  # its waiters raise it; the reader reads on
        return Unreadable(exc)


def result_of(job_id: str, outcome: Outcome | None, what: str) -> Any:
    """The value of a completed run, or the error its outcome stands for."""
    if isinstance(outcome, Completed):
        return outcome.value
    if isinstance(outcome, Unreadable):
        raise outcome.error
    if isinstance(outcome, Failed):
        error = JobCancelledError if outcome.cancelled else JobFailedError
        raise error(job_id, outcome.reason, outcome.stacktrace or [], outcome.exc_type)
    if isinstance(outcome, Missing):
        raise JobNotFoundError(job_id)
    raise ClosedError(f"{what} closed during the wait for {job_id!r}")


class WakeGate:
    """Wakes many waiting threads a batch at a time, between the reader's reads.

    Each woken Python thread must take the GIL. Ten thousand woken at once
    all wait for it, and each waiting thread wakes every switch interval
    (5 ms) to ask for it: the process spends its time in those wake-ups.
    On a 2-core machine here, waking 10,000 threads blocked on Events took
    3.1-5.1 s one after another, and 0.8 s in batches of 64, each woken
    once the previous batch had run (bench/load/README.md, L1).

    The reader hands over the waiters its reads answer (``add``): a few
    (the usual case) it wakes itself, with no hop through another thread;
    a burst it queues, and a thread of its own (``work``) wakes them,
    keeping at most WAKE_BATCH woken threads that have yet to run. The
    reader never waits for them, so it does not fall behind the stream
    while they run.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._queued: deque[tuple[Waiter, Outcome]] = deque()
        self._actions: deque[Callable[[], object]] = deque()  # see defer
        self._outstanding = 0  # threads woken that have yet to run
        self._progress = 0.0  # when one last ran, or the last were woken
        self._pumping = False  # the waker waits for woken threads to run

    def passed(self) -> None:
        """A woken thread runs: tell the waker, if it waits for that (a
        thread the reader woke itself must not wake the waker for nothing:
        one more thread switch per wait)."""
        with self._cond:
            self._outstanding -= 1
            self._progress = time.monotonic()
            if self._pumping and self._outstanding <= WAKE_BATCH // 2:
                self._cond.notify()

    def idle(self) -> bool:
        """Whether no waiter is queued."""
        return not self._queued

    def add(self, answered: list[tuple[Waiter, Outcome]]) -> None:
        """Wake the answered waiters' threads here, with no hop through the
        waker thread, when they are few (at most DIRECT_WAKES: the common
        case), none is queued and fewer than WAKE_BATCH woken have yet to
        run; else queue them for the waker thread. A future's (no thread
        waits on it) is resolved at once."""
        queued = False
        few = len(answered) <= DIRECT_WAKES
        for waiter, outcome in answered:
            if waiter.callback is not None:
                waiter.resolve(outcome)
                continue
            with self._cond:  # counted first: the thread may run at once
                direct = few and not self._queued and self._outstanding < WAKE_BATCH
                if direct:
                    self._outstanding += 1
                    self._progress = time.monotonic()
            if not direct:
                self._queued.append((waiter, outcome))
                queued = True
                continue
            if not waiter.resolve(outcome, self):
                with self._cond:
                    self._outstanding -= 1
        if queued:
            with self._cond:
                self._cond.notify_all()

    def defer(self, action: Callable[[], object]) -> None:
        """Run ``action`` on the waker thread: the settling of a job's
        future (the reader must not read a record or run callbacks, and the
        dispatcher may be held up by a slow listener) and the futures'
        checks."""
        with self._cond:
            self._actions.append(action)
            self._cond.notify_all()

    def work(self, stop: threading.Event) -> float:
        """The waker thread's step: wait (a second at most) for queued
        waiters and actions, run the actions, then wake the waiters, a
        batch at a time."""
        with self._cond:
            self._cond.wait_for(
                lambda: bool(self._queued) or bool(self._actions) or stop.is_set(), 1.0)
        self._run_actions()
        if stop.is_set():
            self.flush()
        else:
            self.pump(math.inf)
        return 0.0

    def _run_actions(self) -> None:
        while self._actions:
            try:
                action = self._actions.popleft()
            except IndexError:  # taken by a flush on another thread
                return
            try:
                action()
            except Exception:  # the waker must outlive any of them
                logger.exception("a deferred call on the waker thread raised")

    def stop(self) -> None:
        """End the waker's wait for work (its stop event is set)."""
        with self._cond:
            self._cond.notify_all()

    def pump(self, seconds: float) -> None:
        """For up to ``seconds``: wake waiters until WAKE_BATCH woken threads
        have yet to run, then wait until half of those have run, and so on."""
        deadline = time.monotonic() + seconds
        while self._queued:
            with self._cond:
                while self._outstanding > WAKE_BATCH // 2:
                    now = time.monotonic()
                    if now - self._progress > WAKE_STALE:
                        # none ran for a while: a thread whose wait ended
                        # before it was answered never will; stop counting
                        self._outstanding = 0
                        break
                    if now >= deadline:
                        return  # read, then go on
                    self._pumping = True
                    self._cond.wait(min(deadline - now, WAKE_STALE))
                    self._pumping = False
                room = WAKE_BATCH - self._outstanding
            woken = 0
            while self._queued and woken < room:
                waiter, outcome = self._queued.popleft()
                if waiter.resolve(outcome, self):
                    woken += 1
            with self._cond:
                self._outstanding += woken
                self._progress = time.monotonic()

    def flush(self) -> None:
        """Run the actions and wake every queued waiter now (the reader
        stops, or cannot read; a close, once the threads are joined)."""
        self._run_actions()
        while self._queued:
            waiter, outcome = self._queued.popleft()
            waiter.resolve(outcome)


class ReaderPosition(Protocol):
    """What the waiter table needs to know of the reader."""

    @property
    def mode(self) -> str: ...

    @property
    def read_id(self) -> StreamId | None: ...

    @property
    def publish(self) -> str: ...

    def ping(self, token: str) -> None:
        """Have the reader's subscription echo ``token`` (for a client
        refused PUBLISH): its echo settles the checkpoint as a published one."""


@dataclass(frozen=True, slots=True)
class _Remembered:
    outcome: Outcome
    run: str | None
    at: StreamId
    seq: int  # the table's count of outcomes read, this one included


class WaiterTable:
    """The registered waiters of one QueueEvents, by job id, with the
    reader's memory of recent outcomes and the checks of jobs' records."""

    def __init__(self, context: QueueContext, reader: ReaderPosition) -> None:
        self._context, self._reader = context, reader
        self._batch = BatchCheck(context, self._apply)
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._by_job: dict[str, list[Waiter]] = {}
        self._pending: set[Waiter] = set()
        self._recent: OrderedDict[str, _Remembered] = OrderedDict()
        self._seq = 0  # outcomes read so far (see _Remembered.seq)
        self.evicted_upto: StreamId = (0, 0)
        self._closed = False
        self._slots = threading.BoundedSemaphore(CONCURRENT_CHECKS)
        self.gate = WakeGate()
        self._publish_refused = False  # the client may not PUBLISH checkpoints

    def after_fork(self) -> bool:
        """In a forked child: forget the parent's waiting threads (not here)
        and everything the parent's reader read. The futures' waiters stay,
        afresh: a future is the child's too, and settles there once a reader
        runs (which checks every waiter when ready). Whether there are any."""
        closed = self._closed
        # read without the lock (a parent's thread may have held it): the
        # child's only thread
        futures = [w for ws in list(self._by_job.values()) for w in ws
                   if w.callback is not None]
        self._reset()
        self._closed = closed
        if closed:
            return False
        for waiter in futures:
            waiter.afresh()
            self._by_job.setdefault(waiter.job_id, []).append(waiter)
        return bool(futures)

    # -- registry ---------------------------------------------------------

    def register(self, waiter: Waiter, follows: bool = False) -> bool:
        """Register a waiter. With ``follows`` (the reader sees every event
        of its run), return True when no outcome of any run of its job id
        is remembered: the reader will deliver its run's, so the record need
        not be read."""
        with self._lock:
            closed = self._closed
            if not closed:
                waiter.since = self._seq
                self._by_job.setdefault(waiter.job_id, []).append(waiter)
                # an outcome remembered of another run of the id may have
                # taken the place of this run's (a later run of a reused
                # id): then this run's end may have been read already
                unseen = follows and self._recent.get(waiter.job_id) is None
        if closed:
            waiter.resolve(CLOSED)
            return True
        return unseen

    def unregister(self, waiter: Waiter) -> None:
        """Forget a waiter (idempotent)."""
        with self._lock:
            waiters = self._by_job.get(waiter.job_id)
            if waiters is not None:
                try:
                    waiters.remove(waiter)
                except ValueError:
                    pass
                if not waiters:
                    del self._by_job[waiter.job_id]
            self._pending.discard(waiter)

    def waiting_on(self, job_id: str) -> bool:
        """Whether any waiter waits on ``job_id``."""
        return job_id in self._by_job

    def empty(self) -> bool:
        """Whether no waiter is registered."""
        return not self._by_job

    def jobs(self) -> int:
        """How many jobs are waited on."""
        return len(self._by_job)

    def settled(self) -> bool:
        """Whether no waiter awaits a checkpoint."""
        return not self._pending

    def of_job(self, job_id: str) -> list[Waiter]:
        """The waiters registered on ``job_id``."""
        with self._lock:
            return list(self._by_job.get(job_id, ()))

    def snapshot(self) -> list[Waiter]:
        """Every registered waiter."""
        with self._lock:
            return [w for ws in self._by_job.values() for w in ws]

    def close(self) -> list[Waiter]:
        """Refuse new waiters; return the registered ones, forgotten."""
        with self._lock:
            self._closed = True
            waiters = [w for ws in self._by_job.values() for w in ws]
            self._by_job.clear()
            self._pending.clear()
        return waiters

    # -- the reader's side ------------------------------------------------

    def record(self, job_id: str, run: str | None, outcome: Outcome, at: StreamId) -> list[Waiter]:
        """Remember how a run ended; return the waiters it answers."""
        with self._lock:
            self._seq += 1
            self._recent[job_id] = _Remembered(outcome, run, at, self._seq)
            self._recent.move_to_end(job_id)
            if len(self._recent) > RECENT_OUTCOMES:
                _, evicted = self._recent.popitem(last=False)
                self.evicted_upto = max(self.evicted_upto, evicted.at)
            return [w for w in self._by_job.get(job_id, ())
                    if not w.stale and w.matches(run)]

    def forget_upto(self, at: StreamId) -> None:
        """Events up to ``at`` may be lost: see ``EventReader.follows``."""
        with self._lock:
            self.evicted_upto = max(self.evicted_upto, at)

    def remembered(self, waiter: Waiter) -> Outcome | None:
        """The remembered outcome of the waiter's run, if any. A waiter
        that knows no run (its record was gone when looked at: a Job built by
        hand, or the one an ignored dedup add returns) takes only an outcome
        read after it registered: one read before was of a run that had
        ended before the wait, and answering with it made the wait return
        a result in a process whose reader happened to read it, where any
        other raised JobNotFoundError."""
        found = self._recent.get(waiter.job_id)
        if found is None or not waiter.matches(found.run):
            return None
        if waiter.run is None and found.seq <= waiter.since:
            return None
        return found.outcome

    def settle(self, token: str | None = None) -> None:
        """Resolve waiters whose checkpoint the reader has passed: with
        their run's remembered outcome, else "missing"."""
        if not self._pending:
            return
        read_id = self._reader.read_id
        settled = []
        with self._lock:
            for waiter in list(self._pending):
                mark = waiter.checkpoint
                if isinstance(mark, str):
                    passed = mark == token
                else:
                    passed = mark is not None and read_id is not None and read_id >= mark
                if passed:
                    self._pending.discard(waiter)
                    settled.append(waiter)
        for waiter in settled:
            waiter.resolve(self.remembered(waiter) or MISSING)

    # -- checking records -------------------------------------------------

    def check(self, waiter: Waiter, deadline: float | None = None) -> None:
        """Resolve the waiter from its run's record, if it is final or gone.

        ``deadline`` (``time.monotonic``): the waiting thread's own; the
        check gives up then, both in the queue for a connection and in the
        read of a server that does not answer.

        Raises:
            redis.exceptions.ConnectionError (and other transient errors):
                the server could not be asked; try again later.
        """
        calls = self._context.calls_by(deadline)
        cursor, anchored = "", False
        # thousands of threads starting to wait at once must not take a pooled
        # connection each (redis-py's pools hold 100 by default)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not self._slots.acquire(timeout=left):
            raise redis.exceptions.TimeoutError("no connection free to check the record in time")
        try:
            for _ in range(SCAN_CALLS):
                reply = calls.get_outcome(waiter.job_id, waiter.run or "", cursor, anchored)
                if reply.cursor is None:
                    break
                # a long scan of the run's events goes on in another call
                cursor, anchored = reply.cursor, reply.anchored
        finally:
            self._slots.release()
        self._apply(waiter, reply, deadline=deadline)

    def check_many(self, waiters: list[Waiter], unreached: bool = True) -> list[Waiter]:
        """``check`` many waiters at once: CHECK_BATCH of them per pipelined
        round trip, one pooled connection in all; the threads of those
        answered are queued on the gate, for the reader to wake. Return the
        waiters this could not decide (a transient error, an error reply such
        as MOVED, a run whose events need a longer scan): each must be
        checked on its own; with ``unreached`` False, not those a transient
        error left unchecked (the periodic look leaves them to its next round).
        Ten thousand waiters re-checked after a gap cost twenty round trips
        here, against ten thousand (each thread checking its own record).
        """
        left, answered = self._batch.run(waiters, unreached)
        self.gate.add(answered)  # the reader wakes them, a batch at a time
        return left

    def _apply(
        self, waiter: Waiter, reply: OutcomeReply,
        answered: list[tuple[Waiter, Outcome]] | None = None, deadline: float | None = None,
    ) -> None:
        """Resolve the waiter from getOutcome's complete reply, if it decides
        (or add it to ``answered``, for the caller to resolve); a checkpoint
        it publishes keeps to ``deadline``."""
        with self._lock:
            if reply.run is not None and waiter.run is None:
                # a wait for the job whatever its run (``wait_for(id)``, a Job
                # built by hand): the run its record holds now. Left open, a
                # later run of the id (removed, then added again) answered it.
                waiter.run = reply.run
            elif reply.run is not None and reply.state not in ("completed", "failed", "cancelled"):
                # the record is of a later generation (the job was retried
                # since this waiter's Job was made): wait for that one, not
                # an earlier outcome the reader has yet to read
                if waiter.run is not None and later(reply.run, waiter.run):
                    waiter.run = reply.run
            # the token is up to date: the reader answers the waiter from now
            # on, and an outcome of its run read while it was stale (skipped
            # by ``record``) is remembered
            stale, waiter.stale = waiter.stale, False
            known = self.remembered(waiter) if stale else None
        outcome: Outcome | None = None
        if reply.state == "completed":
            outcome = completed(reply.value)
        elif reply.state in ("failed", "cancelled"):
            stacktrace = reply.stacktrace
            trace = serializer.decode(stacktrace, "stack trace") if stacktrace else None
            traces = list(trace) if isinstance(trace, list) else None
            outcome = Failed(reply.reason, traces, reply.exc_type,
                             cancelled=reply.state == "cancelled")
        elif reply.state is None and reply.final:
            outcome = MISSING
        elif known is not None:
            outcome = known
        elif reply.state is None:
            self._await_checkpoint(waiter, reply.checkpoint or "", deadline)
        if outcome is not None and answered is not None:
            answered.append((waiter, outcome))
        elif outcome is not None:
            waiter.resolve(outcome)

    def _await_checkpoint(self, waiter: Waiter, checkpoint: str, deadline: float | None) -> None:
        """The run's record is missing: removed, or finished and removed
        before we looked. Decide once the reader has read past this instant."""
        outcome = None
        with self._lock:
            outcome = self.remembered(waiter)
            if outcome is None and self._reader.mode == "stream":
                mark = sid(checkpoint) if checkpoint else (0, 0)
                read_id = self._reader.read_id
                if read_id is not None and read_id >= mark:
                    outcome = MISSING
                else:
                    waiter.checkpoint = mark
                    self._pending.add(waiter)
            elif outcome is None:
                waiter.checkpoint = uuid.uuid4().hex
                self._pending.add(waiter)
        if outcome is not None:
            waiter.resolve(outcome)
        elif isinstance(waiter.checkpoint, str):
            # in pub/sub mode the checkpoint is a marker we publish ourselves
            # on the bounded client: a caller's timeout holds under an outage
            if self._publish_refused:
                self._reader.ping(waiter.checkpoint)
                return
            message = _events.to_netstrings(["ev", CHECKPOINT, "jid", waiter.checkpoint])
            try:
                self._context.command_by(deadline, self._reader.publish,
                                         self._context.keys.events, message)
            except redis.exceptions.NoPermissionError:
                # an ACL without PUBLISH (the monitor's): the reader's own
                # subscription echoes the checkpoint, after its current block
                self._publish_refused = True
                self._reader.ping(waiter.checkpoint)


def waited_result(
    context: QueueContext, waiter: Waiter, where: str, deadline: float | None = None
) -> Any:
    """The resolved waiter's result (its failure raised), with the stack
    traces of a failed run read from its record when the event had none
    (none when they cannot be read by ``deadline``)."""
    outcome = waiter.outcome
    if isinstance(outcome, Failed) and outcome.stacktrace is None:
        outcome = Failed(outcome.reason, _stacktrace(context, waiter, deadline),
                         outcome.exc_type, outcome.cancelled)
    return result_of(waiter.job_id, outcome, where)


def _stacktrace(context: QueueContext, waiter: Waiter, deadline: float | None) -> list[str]:
    """The stack traces of the waiter's failed run, from its record (on the
    bounded client, by the deadline: a wait's timeout holds under an outage)."""
    try:
        raw, run = _hmget(context, context.keys.job(waiter.job_id), ("st", "run"), deadline)
        if not waiter.matches(text(run)):
            return []
        value = serializer.decode(raw, "stack trace")
    except Exception:  # the failure itself is what matters
        return []
    return list(value) if isinstance(value, list) else []


#: Name of the marker events a pub/sub reader publishes to itself.
CHECKPOINT = "__jobq_checkpoint__"


def _hmget(context: QueueContext, key: str, fields: tuple[str, ...],
           deadline: float | None) -> list[Any]:
    """HMGET on the bounded client, its reply awaited until ``deadline`` at most."""
    return list(context.command_by(deadline, "HMGET", key, *fields))
