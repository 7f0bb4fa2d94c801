"""QueueEvents: follow a queue's events live, and resolve waiting callers."""

from __future__ import annotations

import logging
import queue as _queue
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from . import connection as _connection
from . import events as _events
from . import serializer
from ._context import QueueContext
from ._threads import RetryBackoff, join_all, start_thread
from .connection import BLOCK_CAP, Client, blocking_client, close_client
from .errors import (
    ClosedError,
    JobFailedError,
    JobNotFoundError,
    WaitUntilFinishedTimeoutError,
)
from .events import Event
from .listeners import Listener, ListenerRegistry, call_safely

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["QueueEvents"]

logger = logging.getLogger(__name__)

#: Outcomes of finished jobs that the reader remembers, for waiters that
#: register after the event was read (a job removed on completion).
RECENT_OUTCOMES = 10_000
#: Seconds between re-checks of a waited-on job's record, so that a lost
#: event can never leave a waiter hanging.
RECHECK_INTERVAL = 10.0
#: Waiters' record checks that may run at once (each holds a pooled connection).
CONCURRENT_CHECKS = 16
_ALL = "*"
_CHECKPOINT = "__jobq_checkpoint__"
_TERMINAL = frozenset({"completed", "failed", "removed"})
#: Errors of a re-check that the reader's reconnect-and-poke recovers from.
_TRANSIENT = _connection.TRANSIENT_ERRORS
#: Seconds before a check that failed on a transient error is tried again.
RETRY_CHECK = 0.25
#: Seconds between two looks for a trimmed gap while events keep coming.
GAP_CHECK_INTERVAL = 5.0
_TERMINAL_RAW = frozenset({b"completed", b"failed", b"removed"})

# An outcome: ("completed", value) | ("failed", reason, stacktrace)
#             | ("missing",) | ("closed",)
Outcome = tuple[Any, ...]


def _sid(value: str) -> tuple[int, int]:
    """Parse a stream id ("ms-seq" or "ms") into a comparable tuple."""
    ms, _, seq = value.partition("-")
    return int(ms), int(seq or 0)


class _Waiter:
    """One caller (or future) waiting for one job's outcome."""

    __slots__ = ("job_id", "event", "outcome", "poked", "callback", "checkpoint", "_lock")

    def __init__(self, job_id: str, callback: Callable[[Outcome], None] | None = None) -> None:
        self.job_id = job_id
        self.event = threading.Event()
        self.outcome: Outcome | None = None
        self.poked = False
        self.callback = callback
        # Set when the job's record was found missing: resolve "missing" once
        # the reader has passed this point without seeing the job finish.
        self.checkpoint: tuple[int, int] | str | None = None
        self._lock = threading.Lock()

    def resolve(self, outcome: Outcome) -> None:
        # the reader and a re-check may race to resolve: the first one wins
        with self._lock:
            if self.outcome is not None:
                return
            self.outcome = outcome
        self.event.set()
        if self.callback is not None:
            self.callback(outcome)

    def poke(self) -> None:
        self.poked = True
        self.event.set()


class QueueEvents:
    """Read a queue's events on a background thread and dispatch them.

    Listeners run on a separate dispatcher thread, in registration order, so a
    slow or raising listener never delays the reader or a waiting caller.

    Args:
        queue_name: the queue to follow.
        connection: as for Queue.
        prefix: the queue's key prefix.
        last_event_id: ``"$"`` from now on, ``"0"`` everything retained, or
            an id to resume after (stream mode).
        blocking_timeout: longest single blocking read, in seconds (capped
            near 1 s so that ``close()`` is prompt).
        autorun: start reading at once; else call ``run()``.
    """

    def __init__(
        self,
        queue_name: str,
        *,
        connection: object = None,
        prefix: str = "jobq",
        last_event_id: str = "$",
        blocking_timeout: float = 10,
        autorun: bool = True,
    ) -> None:
        if not isinstance(last_event_id, str) or not (
            last_event_id == "$" or _valid_id(last_event_id)
        ):
            raise ValueError(
                f"last_event_id must be '$', '0' or a stream id, not {last_event_id!r}"
            )
        if isinstance(blocking_timeout, bool) or not isinstance(blocking_timeout, (int, float)):
            raise ValueError(f"blocking_timeout must be seconds, not {blocking_timeout!r}")
        self._context = QueueContext(queue_name, connection, prefix, "QueueEvents")
        self._start_id = last_event_id
        self._block = max(0.01, min(float(blocking_timeout), BLOCK_CAP))
        self._listeners = ListenerRegistry()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._waiters: dict[str, list[_Waiter]] = {}
        self._pending: set[_Waiter] = set()
        # job id -> (outcome, id of its event); the newest evicted event's id
        self._recent: OrderedDict[str, tuple[Outcome, tuple[int, int]]] = OrderedDict()
        self._evicted_upto: tuple[int, int] = (0, 0)
        self._first_id: tuple[int, int] | None = None  # where reading began
        self._gap_batch = 1000  # a read this long may follow a trimmed gap
        self._next_gap_check = 0.0
        self._read_id: tuple[int, int] | None = None
        self._dispatched_id: str | None = None
        self._mode = "stream"
        self._dispatch_queue: _queue.SimpleQueue[Event | None] = _queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._started = False
        self._recheck_interval = RECHECK_INTERVAL
        self._blocked_id: _connection.Blocked | None = None
        self._check_slots = threading.BoundedSemaphore(CONCURRENT_CHECKS)
        if autorun:
            self.run()

    # -- lifecycle --------------------------------------------------------

    @property
    def name(self) -> str:
        """The queue's name."""
        return self._context.name

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._stop.is_set()

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("running" if self._started else "idle")
        return f"<QueueEvents {self.name!r} {state}>"

    def run(self) -> QueueEvents:
        """Start the reader (when ``autorun=False``); return self."""
        with self._lock:
            if self._stop.is_set():
                raise ClosedError(f"QueueEvents {self.name!r} is closed")
            if self._started:
                return self
            self._started = True
            self._threads = [
                start_thread(f"jobq-events-{self.name}", self._read_loop),
                start_thread(f"jobq-dispatch-{self.name}", self._dispatch_loop),
            ]
        return self

    def wait_until_ready(self, timeout: float | None = None) -> bool:
        """Wait until every event emitted from now on will be delivered."""
        if not self._started and not self._stop.is_set():
            self.run()
        return self._ready.wait(timeout) and not self._stop.is_set()

    def close(self, timeout: float | None = 5.0) -> None:
        """Stop reading, fail pending waits with ClosedError, join the threads."""
        with self._lock:
            if self._stop.is_set():
                return
            self._stop.set()
            waiters = [w for ws in self._waiters.values() for w in ws]
            self._waiters.clear()
            self._pending.clear()
        for waiter in waiters:
            waiter.resolve(("closed",))
        self._dispatch_queue.put(None)
        self._wake_reader()
        join_all(self._threads, timeout)
        self._context.close()

    def _wake_reader(self) -> None:
        """Cut the reader's current block short, so that close is prompt."""
        if self._mode == "pubsub":
            try:  # a checkpoint marker nobody waits for: every reader ignores it
                message = _events.to_netstrings(["ev", _CHECKPOINT, "jid", "wake"])
                self._context.client.spublish(self._context.keys.events, message)
            except Exception:  # the block ends by itself within a second
                pass
        else:
            _connection.unblock(self._context.client, self._blocked_id)

    def __enter__(self) -> QueueEvents:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def last_event_id(self) -> str | None:
        """Id of the last event dispatched to listeners (stream mode)."""
        return self._dispatched_id

    # -- listeners --------------------------------------------------------

    def on(self, event: str, callback: Listener | None = None) -> Any:
        """Call ``callback(event)`` on each ``event``; without it, a decorator."""
        if callback is None:
            return lambda cb: self._listeners.on(event, cb)
        return self._listeners.on(event, callback)

    def once(self, event: str, callback: Listener) -> Listener:
        """Call ``callback`` on the next ``event`` only."""
        return self._listeners.once(event, callback)

    def off(self, event: str, callback: Listener) -> bool:
        """Remove a listener; False if it was not registered."""
        return self._listeners.off(event, callback)

    def on_all_events(self, callback: Listener) -> Listener:
        """Call ``callback(event)`` on every event."""
        return self._listeners.on(_ALL, callback)

    def off_all_events(self, callback: Listener) -> bool:
        """Remove an ``on_all_events`` listener."""
        return self._listeners.off(_ALL, callback)

    def listener_count(self, event: str | None = None) -> int:
        """Listeners of ``event`` (every listener when None)."""
        return self._listeners.count(event)

    # -- waiting ----------------------------------------------------------

    def wait_for(
        self, job_id: str, timeout: float | None = None, added_event: str | None = None
    ) -> Any:
        """Block until job ``job_id`` finishes; see ``Job.wait_until_finished``.

        ``added_event`` is the id of the job's ``added`` event when the caller
        added it: if this reader began before it, every later event of the
        job reaches the reader, so the job's record need not be read first.
        """
        if timeout is not None and (isinstance(timeout, bool) or timeout < 0):
            raise ValueError(f"timeout must be None or >= 0, not {timeout!r}")
        deadline = None if timeout is None else time.monotonic() + timeout

        def remaining() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        if self._stop.is_set():
            raise ClosedError(f"QueueEvents {self.name!r} is closed")
        if not self.wait_until_ready(remaining()):
            if self._stop.is_set():
                raise ClosedError(f"QueueEvents {self.name!r} closed during the wait")
            raise WaitUntilFinishedTimeoutError(job_id, float(timeout or 0))
        waiter = _Waiter(job_id)
        unseen = self._register(waiter, self._follows(added_event) is not None)
        try:
            # a job the reader has not yet seen finish needs no look at its
            # record: its terminal event will reach this waiter
            checked = True if unseen else self._try_check(waiter)
            while waiter.outcome is None:
                left = remaining()
                if left is not None and left <= 0:
                    raise WaitUntilFinishedTimeoutError(job_id, float(timeout or 0))
                # a check that failed (server away, slot migrating) is retried soon
                wait = self._recheck_interval if checked else RETRY_CHECK
                if left is not None:
                    wait = min(left, wait)
                if waiter.event.wait(wait) and waiter.outcome is not None:
                    break
                # poked after a reconnect, or a re-check is due
                waiter.poked = False
                waiter.event.clear()
                if waiter.outcome is None and remaining() != 0.0:
                    checked = self._try_check(waiter)
            return self._result(job_id, waiter.outcome)
        finally:
            self._unregister(waiter)

    def future_for(self, job_id: str) -> Future[Any]:
        """A Future resolved with job ``job_id``'s result (or failure)."""
        future: Future[Any] = Future()
        if self._stop.is_set():
            future.set_exception(ClosedError(f"QueueEvents {self.name!r} is closed"))
            return future

        def settle(outcome: Outcome) -> None:
            self._unregister(waiter)
            if future.done():
                return
            try:
                future.set_result(self._result(job_id, outcome))
            except BaseException as exc:  # the job's failure becomes the future's
                future.set_exception(exc)

        waiter = _Waiter(job_id, settle)
        future.set_running_or_notify_cancel()
        self._register(waiter)
        self.wait_until_ready(0)  # starts the reader; it checks waiters once ready
        if self._ready.is_set():
            try:
                self._check(waiter)
            except Exception as exc:
                self._unregister(waiter)
                if not future.done():
                    future.set_exception(exc)
        return future

    def _result(self, job_id: str, outcome: Outcome | None) -> Any:
        kind = outcome[0] if outcome else "closed"
        if kind == "completed":
            return outcome[1]  # type: ignore[index]
        if kind == "failed":
            _, reason, stacktrace = outcome  # type: ignore[misc]
            if stacktrace is None:
                stacktrace = self._stacktrace(job_id)
            raise JobFailedError(job_id, reason, stacktrace)
        if kind == "missing":
            raise JobNotFoundError(job_id)
        raise ClosedError(f"QueueEvents {self.name!r} closed during the wait for {job_id!r}")

    def _stacktrace(self, job_id: str) -> list[str]:
        try:
            raw = self._context.client.hget(self._context.keys.job(job_id), "st")
            value = serializer.decode(raw, "stack trace")
        except Exception:  # the failure itself is what matters
            return []
        return list(value) if isinstance(value, list) else []

    def _follows(self, added_event: str | None) -> tuple[int, int] | None:
        """The ``added`` event's id when this reader sees every event of the
        job from there on (began before it, none of it forgotten), else None."""
        if not added_event or self._mode != "stream" or self._first_id is None:
            return None
        added = _sid(added_event)
        with self._lock:
            if added > self._first_id and added > self._evicted_upto:
                return added
        return None

    def _register(self, waiter: _Waiter, follows: bool = False) -> bool:
        """Register a waiter. With ``follows`` (the reader sees every event
        of the job), return True when the reader has recorded no outcome of
        the job yet: the first one it reads from now on is the answer. An
        outcome already recorded may be of an earlier run of the job (it
        was retried since), so then the record must be read."""
        with self._lock:
            closed = self._stop.is_set()
            if not closed:
                self._waiters.setdefault(waiter.job_id, []).append(waiter)
                unseen = follows and waiter.job_id not in self._recent
        if closed:
            waiter.resolve(("closed",))
            return True
        return unseen

    def _unregister(self, waiter: _Waiter) -> None:
        with self._lock:
            waiters = self._waiters.get(waiter.job_id)
            if waiters is not None:
                try:
                    waiters.remove(waiter)
                except ValueError:
                    pass
                if not waiters:
                    del self._waiters[waiter.job_id]
            self._pending.discard(waiter)

    def _try_check(self, waiter: _Waiter) -> bool:
        """``_check``, with transient errors logged; False when it failed."""
        try:
            self._check(waiter)
        except _TRANSIENT as exc:
            logger.debug("checking job %r failed: %s", waiter.job_id, exc)
            return False
        return True

    def _check(self, waiter: _Waiter) -> None:
        """Resolve the waiter from the job's record, if it is final or gone."""
        # thousands of threads starting to wait at once must not take a pooled
        # connection each (redis-py's pools hold 100 by default)
        with self._check_slots:
            reply = self._context.run("getOutcome", waiter.job_id)
        state, value, reason, stacktrace, checkpoint = reply
        if state == b"completed":
            waiter.resolve(("completed", serializer.decode(value, "return value")))
        elif state == b"failed":
            trace = serializer.decode(stacktrace, "stack trace")
            traces = list(trace) if isinstance(trace, list) else []
            waiter.resolve(("failed", _text(reason), traces))
        elif state is None:
            self._await_checkpoint(waiter, _text(checkpoint) or "")

    def _await_checkpoint(self, waiter: _Waiter, checkpoint: str) -> None:
        """The record is missing: removed, or finished and removed before we
        looked. Decide once the reader has read past this instant."""
        with self._lock:
            found = self._recent.get(waiter.job_id)
            recent = None if found is None else found[0]
            if recent is None and self._mode == "stream":
                mark = _sid(checkpoint) if checkpoint else (0, 0)
                if self._read_id is not None and self._read_id >= mark:
                    recent = ("missing",)
                else:
                    waiter.checkpoint = mark
                    self._pending.add(waiter)
            elif recent is None:
                token = uuid.uuid4().hex
                waiter.checkpoint = token
                self._pending.add(waiter)
        if recent is not None:
            waiter.resolve(recent)
        elif isinstance(waiter.checkpoint, str):
            # in pub/sub mode the checkpoint is a marker we publish ourselves
            message = _events.to_netstrings(["ev", _CHECKPOINT, "jid", waiter.checkpoint])
            self._context.client.spublish(self._context.keys.events, message)

    # -- reading ----------------------------------------------------------

    def _read_loop(self) -> None:
        backoff = RetryBackoff()
        client: Client | None = None
        pubsub: Any = None
        while not self._stop.is_set():
            try:
                if client is None:
                    client = blocking_client(self._context.client, f"jobq-events-{self.name}")
                    self._blocked_id = _connection.client_id(client, self._context.keys.events)
                    pubsub = self._connect(client)
                if pubsub is not None:
                    self._read_pubsub(pubsub)
                else:
                    self._read_stream(client)
                backoff.reset()
            except Exception as exc:
                if self._stop.is_set():
                    break
                delay = backoff.next()
                logger.warning(
                    "events reader of %r failed (%s: %s); reconnecting in %.2f s",
                    self.name, type(exc).__name__, exc, delay,
                )
                self._emit_error(exc)
                _close_reader(client, pubsub)
                client, pubsub = None, None
                self._stop.wait(delay)
        _close_reader(client, pubsub)

    def _connect(self, client: Client) -> Any:
        """(Re)connect: read the queue's mode, resolve the start id, subscribe."""
        keys = self._context.keys
        mode, max_events = client.hmget(keys.meta, ["em", "maxev"])
        self._mode = "pubsub" if mode == b"pubsub" else "stream"
        self._gap_batch = min(1000, int(max_events or 10_000))
        reconnect = self._ready.is_set()
        pubsub = None
        if self._mode == "pubsub":
            pubsub = client.pubsub()
            pubsub.ssubscribe(keys.events)  # sharded: served by the queue's own node
            deadline = time.monotonic() + 10.0
            while True:  # wait for the subscription's confirmation
                message = pubsub.get_sharded_message(timeout=self._block)
                if message is not None and message["type"] == "ssubscribe":
                    break
                if self._stop.is_set() or time.monotonic() > deadline:
                    raise ConnectionError("no subscribe confirmation")
        elif self._read_id is None:
            if self._start_id == "$":
                last = client.xrevrange(keys.events, "+", "-", count=1)
                self._read_id = _sid(last[0][0].decode()) if last else (0, 0)
            else:
                self._read_id = _sid(self._start_id)
            self._first_id = self._read_id
        else:
            self._detect_gap(client)
        self._ready.set()
        # after a reconnect events may have been lost; on the first connect,
        # futures registered before the reader was ready get their first check
        if reconnect or self._waiters:
            self._poke_all()
        return pubsub

    def _detect_gap(self, client: Client, since: tuple[int, int] | None = None) -> None:
        """Warn and re-check every waiter when events after ``since`` (by
        default the last id read) were trimmed before they were read."""
        try:
            info = client.xinfo_stream(self._context.keys.events)
        except Exception:  # no stream yet: nothing was lost
            return
        since = since or self._read_id
        if since is None:
            return
        # XTRIM / MAXLEN do not move max-deleted-entry-id (only XDEL does): a
        # stream whose first entry is past the last id read lost that entry,
        # and maybe more after it. Re-checking waiters is harmless if not.
        first = info.get("first-entry")
        # (0, 0) is "before everything" (a "$" resolved on an empty stream, or
        # "0"), not an entry read: only an XDEL past it shows a loss then
        marks = [info.get("max-deleted-entry-id"), first[0] if first and since != (0, 0) else None]
        texts = [m.decode() if isinstance(m, bytes) else str(m) for m in marks if m]
        if any(_sid(text) > since for text in texts if _valid_id(text)):
            logger.warning(
                "events of %r were trimmed before they were read; re-checking waiters",
                self.name,
            )
            self._poke_all()

    def _read_stream(self, client: Client) -> None:
        assert self._read_id is not None
        since = self._read_id
        last = f"{since[0]}-{since[1]}"
        reply = _connection.xread(
            client, self._context.keys.events, last, 1000, int(self._block * 1000)
        )
        entries = reply[0][1] if reply else []
        listened = self._listeners.has_any()
        for entry_id, raw in entries:
            sid = entry_id.decode()
            if not listened and raw.get(b"ev") not in _TERMINAL_RAW:
                # nobody listens and no waiter needs it: skip decoding
                self._read_id = _sid(sid)
                continue
            try:
                event = _events.from_stream(sid, raw)
            except Exception:
                logger.exception("skipping undecodable event %s of %r", sid, self.name)
                event = None
            if event is not None:
                self._handle(event)
            self._read_id = _sid(sid)  # only after its outcome is recorded
        self._settle_pending()
        # XREAD cannot tell that entries after ``since`` were trimmed (a reader
        # stopped, starved or far behind): the stream's first id can. Trimming
        # keeps at least max_events entries, so a loss shows as a read of
        # min(1000, max_events) entries or more; a manual trim_events to less
        # is caught by a look every few seconds.
        now = time.monotonic()
        if entries and (len(entries) >= self._gap_batch or now >= self._next_gap_check):
            self._next_gap_check = now + GAP_CHECK_INTERVAL
            self._detect_gap(client, since)

    def _read_pubsub(self, pubsub: Any) -> None:
        message = pubsub.get_sharded_message(timeout=self._block)
        if message is None:
            return
        if message["type"] == "ssubscribe":  # a silent reconnect resubscribed
            self._poke_all()
            return
        if message["type"] == "sunsubscribe":  # the slot moved: subscribe again
            raise ConnectionError("the server ended the sharded subscription")
        if message["type"] != "smessage":
            return
        try:
            event = _events.from_pubsub(message["data"])
        except Exception:
            logger.exception("skipping undecodable event message of %r", self.name)
            return
        if event.name == _CHECKPOINT:
            self._settle_pending(event.job_id)
            return
        self._handle(event)

    def _handle(self, event: Event) -> None:
        """Resolve waiters of a finished job, then queue the event for listeners."""
        if event.name in _TERMINAL and event.job_id is not None:
            outcome = self._outcome(event)
            at = _sid(event.id) if event.id else (0, 0)
            with self._lock:
                self._recent[event.job_id] = (outcome, at)
                self._recent.move_to_end(event.job_id)
                if len(self._recent) > RECENT_OUTCOMES:
                    _, (_, evicted) = self._recent.popitem(last=False)
                    self._evicted_upto = max(self._evicted_upto, evicted)
                waiters = self._waiters.get(event.job_id, ())
                waiters = list(waiters)
            for waiter in waiters:
                waiter.resolve(outcome)
        if self._listeners.has_any():
            self._dispatch_queue.put(event)
        elif event.id is not None and self._dispatch_queue.empty():
            self._dispatched_id = event.id

    def _outcome(self, event: Event) -> Outcome:
        if event.name == "completed":
            if "result" in event.fields:
                return ("completed", event.fields["result"])
            # a large result stays in the job record, out of the stream
            assert event.job_id is not None
            value = self._context.client.hmget(
                self._context.keys.job(event.job_id), ["state", "rv"]
            )
            if value[0] == b"completed":
                result = serializer.decode(value[1], "return value")
                object.__getattribute__(event, "fields")["result"] = result
                return ("completed", result)
            return ("missing",)
        if event.name == "failed":
            return ("failed", event.fields.get("failed_reason"), None)
        return ("missing",)

    def _settle_pending(self, token: str | None = None) -> None:
        """Resolve "missing" for waiters whose checkpoint the reader has passed."""
        if not self._pending:
            return
        settled = []
        with self._lock:
            for waiter in list(self._pending):
                mark = waiter.checkpoint
                passed = (
                    mark == token
                    if isinstance(mark, str)
                    else mark is not None and self._read_id is not None and self._read_id >= mark
                )
                if passed:
                    self._pending.discard(waiter)
                    settled.append(waiter)
        for waiter in settled:
            found = self._recent.get(waiter.job_id)
            waiter.resolve(("missing",) if found is None else found[0])

    def _poke_all(self) -> None:
        """Make every waiter re-check its job's record (after a possible loss)."""
        with self._lock:
            waiters = [w for ws in self._waiters.values() for w in ws]
        for waiter in waiters:
            if waiter.callback is None:
                waiter.poke()
        self._check_futures([w for w in waiters if w.callback is not None])

    def _emit_error(self, exc: BaseException) -> None:
        for callback in self._listeners.take("error"):
            call_safely(callback, "error", exc)

    # -- dispatching ------------------------------------------------------

    def _dispatch_loop(self) -> None:
        listeners = self._listeners
        next_recheck = time.monotonic() + self._recheck_interval
        while not self._stop.is_set():
            try:
                event = self._dispatch_queue.get(timeout=0.5)
            except _queue.Empty:
                event = None
            if time.monotonic() >= next_recheck:
                next_recheck = time.monotonic() + self._recheck_interval
                self._recheck_futures()
            if event is None:
                continue
            channels = (event.name, f"{event.name}:{event.job_id}", _ALL)
            for channel, callback in listeners.take_many(channels):
                call_safely(callback, channel, event)
            if event.id is not None:
                self._dispatched_id = event.id

    def _recheck_futures(self) -> None:
        with self._lock:
            waiters = [w for ws in self._waiters.values() for w in ws if w.callback is not None]
        self._check_futures(waiters)

    def _check_futures(self, waiters: list[_Waiter]) -> None:
        """Check futures' jobs here (no thread waits on them); a transient
        error ends the round: the next reconnect or re-check tries again."""
        for waiter in waiters:
            if self._stop.is_set():
                return
            try:
                self._check(waiter)
            except _TRANSIENT as exc:
                # one line per round, not one per waiter: the server is away
                logger.warning("re-checking waited-on jobs of %r failed: %s", self.name, exc)
                return
            except Exception:
                logger.exception("re-checking job %r failed", waiter.job_id)


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("utf-8", "replace")


def _valid_id(value: str) -> bool:
    try:
        _sid(value)
    except ValueError:
        return False
    return True


def _close_reader(client: Client | None, pubsub: Any) -> None:
    if pubsub is not None:
        try:
            pubsub.close()
        except Exception:  # closing is best effort
            pass
    if client is not None:
        close_client(client)

