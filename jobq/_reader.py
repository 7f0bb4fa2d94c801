"""The threads of a QueueEvents: the reader of the queue's event channel,
which answers waiters (it wakes their threads, a batch at a time; the waker
thread, WakeGate, wakes those beyond a batch), and the dispatcher, which
runs everything a user wrote (listeners, futures' done-callbacks) so that
none runs on the reader."""

from __future__ import annotations

import dataclasses
import logging
import queue as _queue
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from redis.cluster import RedisCluster

from . import _fork
from . import connection as _connection
from . import events as _events
from ._context import QueueContext
from ._waiters import (
    CHECKPOINT,
    MISSING,
    Completed,
    Failed,
    Outcome,
    StreamId,
    Unreadable,
    Waiter,
    WaiterTable,
    completed,
    generation,
    sid,
    valid_id,
)
from .connection import Client, blocking_client
from .errors import SerializationError
from .events import Event
from .keys import QueueKeys
from .listeners import ListenerRegistry, call_safely

logger = logging.getLogger("jobq.queue_events")  # the public module's name, as documented

ALL = "*"
#: Events that end a run of a job (they carry the run's token).
RUN_ENDS = frozenset({"completed", "failed", "removed"})
_RUN_ENDS_RAW = frozenset({b"completed", b"failed", b"removed"})
#: Seconds between two looks for a trimmed gap while events keep coming
#: (each reads the stream's length again: a Queue may have lowered it).
GAP_CHECK_INTERVAL = 1.0
#: Seconds between two looks of a pub/sub reader at the stored mode: a
#: server that lost the queue's settings (FLUSHALL, a restart without
#: persistence) has the scripts write to the stream again.
MODE_CHECK_INTERVAL = 5.0
#: Entries read at most per XREAD: a reader behind catches up in few reads.
READ_COUNT = 5000
#: The stream entry storeSettings.lua writes when a Queue stores pub/sub
#: mode: a reader that began on the stream (no mode was stored) moves to the
#: channel. It is no event: readers never dispatch it.
_MODE_STORED = b"__jobq_mode__"


class ModeChanged(ConnectionError):
    """The queue's event mode was stored as pub/sub after the reader began
    on its stream, or is no longer stored: connect again (every waiter
    re-checked)."""


class _Callback:
    """A future's done-callback queued on the dispatcher (see ``call_back``)."""

    __slots__ = ("action",)

    def __init__(self, action: Callable[[], None]) -> None:
        self.action = action

    def __call__(self) -> None:
        self.action()


class Dispatcher:
    """The dispatcher thread: listeners in registration order, and the
    futures' done-callbacks, each in a try/except."""

    def __init__(self, listeners: ListenerRegistry, stop: threading.Event) -> None:
        self._listeners = listeners
        self._stop = stop
        self.after_fork()

    def after_fork(self) -> None:
        """Start afresh (a forked child has no dispatcher thread)."""
        self._queue: _queue.SimpleQueue[Event | Callable[[], None] | None] = _queue.SimpleQueue()
        self.dispatched_id: str | None = None
        self._thread: threading.Thread | None = None
        #: set once a close ran the callbacks left queued: later ones run
        #: where they come from (see ``call_back``)
        self.finished = False

    def on_thread(self) -> bool:
        """Whether the caller is the dispatcher thread (a listener, a
        future's done-callback)."""
        return threading.current_thread() is self._thread

    def put(self, event: Event) -> None:
        """Queue an event for the listeners."""
        self._queue.put(event)

    def call_soon(self, action: Callable[[], None]) -> None:
        """Run ``action`` on the dispatcher thread."""
        self._queue.put(action)

    def call_back(self, action: Callable[[], None]) -> None:
        """Run a future's done-callback on the dispatcher thread; one still
        queued when the QueueEvents closes runs then (``run_left``), never
        lost behind a listener that held the thread past the close."""
        self._queue.put(_Callback(action))

    def run_left(self) -> None:
        """At the end of a close, on the closing thread: run the futures'
        done-callbacks still queued (the events left go undelivered)."""
        while True:
            try:
                item = self._queue.get_nowait()
            except _queue.Empty:
                break
            if isinstance(item, _Callback):
                self._run(item)
        self.finished = True

    def error(self, exc: BaseException) -> None:
        """Tell the ``error`` listeners of a background error, on this
        thread: a slow one must not hold up the reader that met it."""
        def tell() -> None:
            for callback in self._listeners.take("error"):
                call_safely(callback, "error", exc)

        self.call_soon(tell)

    def wake(self) -> None:
        """End a wait for work (close)."""
        self._queue.put(None)

    def idle(self) -> bool:
        """Whether nothing is queued."""
        return self._queue.empty()

    def loop(self) -> None:
        """The dispatcher thread's body, until the stop event is set."""
        self._thread = threading.current_thread()
        while not self._stop.is_set():
            try:
                item = self._queue.get(timeout=0.5)
            except _queue.Empty:
                continue
            if item is None:
                continue
            if not isinstance(item, Event):
                self._run(item)
                if _fork.forked_off():  # a future's callback forked: as a listener's
                    return
                continue
            channels: tuple[str, ...] = (
                (item.name, ALL) if item.job_id is None  # not the job "None"'s
                else (item.name, f"{item.name}:{item.job_id}", ALL))
            if item.name == ALL:  # written by some other client: still once to each
                channels = channels[1:]
            for channel, callback in self._listeners.take_many(channels):
                call_safely(callback, channel, item)
            if _fork.forked_off():  # a listener forked: none of the parent's work here
                return
            if item.id is not None and not item._more:
                self.dispatched_id = item.id

    @staticmethod
    def _run(action: Callable[[], None]) -> None:
        try:
            action()
        except BaseException:  # the dispatcher must outlive any callback...
            if _fork.forked_off():  # ...but in a child it forked, it ends it (sys.exit())
                raise
            logger.exception("a callback on the events dispatcher raised")


class EventMode:
    """What a reader knows of its queue's stored settings, read again on
    every (re)connect: the event mode and the stream's length. While the
    queue has neither a mode stored nor an event written (``undecided``), a
    Queue may yet store pub/sub mode: the reader then subscribes before it
    reads the stream, and keeps that subscription aside (``standby``) so
    that nothing published from then on is lost if it does (``stored``).
    So does a reader of a queue that is to be in pub/sub mode
    (``expects_pubsub``), for as long as no mode is stored: it was before
    the server lost its settings (a Queue that followed that mode stores it
    again), or the Queue whose reader it is was given it."""

    def __init__(self, context: QueueContext) -> None:
        self._context = context
        self._told_sharded = False
        #: its reader listens to the channel whatever the mode (a shard's,
        #: read by a ShardReader): a mode stored later needs no standby
        self.always_listened = False
        #: while no mode is stored, a Queue is to store pub/sub mode (see the
        #: class): undecided, whatever its stream holds
        self.expects_pubsub = False
        self.reset()

    def reset(self) -> None:
        self.mode = "stream"
        #: what publishes on the events channel in pub/sub mode, as the
        #: scripts do (_common.lua's meta): SPUBLISH for a shard and in a
        #: cluster, else PUBLISH (which 0.1 processes subscribe to)
        self.publish = "SPUBLISH"
        self.undecided = False
        self.undecided_from: StreamId = (0, 0)
        self.gap_batch = 1000  # a read this long may follow a trimmed gap
        self._next_look = 0.0  # the next timed look for a gap (monotonic)
        self._unlooked = 0  # the longest read since that no look followed
        self.standby: Any = None
        self._standby_client: Any = None  # its client (a cluster's has more connections)
        self._standby_publish = ""  # how it subscribed
        self._standby_until: float | None = None  # kept until then once decided (monotonic)

    def read(self, client: Client) -> str:
        """Read the queue's event mode (returned) and stream length."""
        keys = self._context.keys
        mode, max_events, shards, shard, sharded = client.hmget(
            keys.meta, ["em", "maxev", "shards", "shard", "sp"])
        if shards and not self._told_sharded:  # its events are in its shards' streams
            self._told_sharded = True
            logger.warning(
                "queue %r is a sharded queue of %s shards: this QueueEvents reads its "
                "logical stream, where no job's events are; use ShardedQueueEvents",
                self._context.name, shards.decode(),
            )
        was, self.mode = self.mode, "pubsub" if mode == b"pubsub" else "stream"
        #: where an undecided reader starts: after an obliterate's event, if
        #: that is all its stream holds
        self.undecided_from = (0, 0)
        self.undecided = False
        if mode is not None:
            if self.expects_pubsub and self.mode == "stream" and self.standby is not None:
                self._standby_until = time.monotonic()  # stream mode stored: it goes
            self.expects_pubsub = False
        elif was == "pubsub" and not self.always_listened:
            self.expects_pubsub = True  # the server lost its settings
        if mode is None:
            last = client.xrevrange(keys.events, "+", "-", count=1)
            if self.expects_pubsub or not last or _first_is_obliterated(last[0]):
                self.undecided = True  # obliterated, or expected: it may be pub/sub yet
                self.undecided_from = sid(_text(last[0][0])) if last else (0, 0)
        # as the scripts publish (sp: stored by a writer on a cluster's
        # node); a cluster client's reader subscribes on the queue's node
        # even before a 0.2 writer stored sp there (a queue of 0.1's: its
        # events, published to every node, are not heard until then)
        in_cluster = isinstance(client, RedisCluster)
        self.publish = "SPUBLISH" if shard or sharded or in_cluster else "PUBLISH"
        if self.standby is not None and self.publish != self._standby_publish:
            self.close()  # subscribed the other way: connect again (ModeChanged)
        self.gap_batch = _gap_batch(max_events)
        return self.mode

    def gap_look(self, read: int, now: float) -> bool | None:
        """After a read of ``read`` entries: whether to look for a trimmed
        gap. None: no; False: the read is long enough to follow one
        (trimming keeps at least max_events entries, so a loss shows as a
        read of min(1000, max_events) entries or more); True: the timed look
        (every GAP_CHECK_INTERVAL: a manual trim_events to less, a length
        lowered since it was read), which also asks ``missed``."""
        if now >= self._next_look:
            self._next_look = now + GAP_CHECK_INTERVAL
            return True
        if read >= self.gap_batch:
            return False
        self._unlooked = max(self._unlooked, read)
        return None

    def missed(self, client: Client) -> bool:
        """Read the stream's length again (a Queue may have lowered
        ``max_events`` since): whether a read that no look followed was long
        enough to follow a gap at that length."""
        self.gap_batch = _gap_batch(client.hget(self._context.keys.meta, "maxev"))
        missed, self._unlooked = self._unlooked >= self.gap_batch, 0
        return missed

    def subscribe(self, client: Client, stopping: Callable[[], bool]) -> Any:
        """After ``read``: the subscription to read in pub/sub mode, None in
        stream mode (undecided: with a subscription kept aside, and the mode
        read again once it is there, in case it was stored meanwhile)."""
        if self.mode != "pubsub" and not self.undecided:
            return None
        # undecided: on a client of its own (the reader's one reads the stream)
        own = blocking_client(client, f"jobq-events-{self._context.name}") \
            if self.undecided else client
        pubsub = own.pubsub()  # sharded: the queue's own node
        kind = self.publish
        try:
            _connection.ssubscribe(pubsub, [self._context.keys.events], stopping,
                                   "the events channel", sharded=kind == "SPUBLISH")
        except BaseException:
            _connection.close_subscription(own if own is not client else None, pubsub)
            raise
        if self.undecided:
            mode = self.read(client)
            if self.publish != kind:  # a writer stored it the other way meanwhile
                _connection.close_subscription(own, pubsub)
                raise ModeChanged(f"queue {self._context.name!r}: its events are published "
                                  "the other way")
            if mode == "stream":
                if self.undecided:
                    self.standby, self._standby_client = pubsub, own
                    self._standby_publish = kind
                else:  # an event was written: the queue uses its stream
                    _connection.close_subscription(own, pubsub)
                return None
        return pubsub

    def stored(self, client: Client) -> tuple[Any, Client] | None:
        """The stream says a Queue stored a mode: in pub/sub mode, the
        subscription kept aside, which missed nothing, and its client, which
        the reader uses from then on (ModeChanged without one: connect
        again); None when the mode is still stream."""
        if self.read(client) != "pubsub":
            return None
        if self.standby is None:
            if self.always_listened:  # what is published comes by that subscription
                return None
            raise ModeChanged(f"queue {self._context.name!r} uses pub/sub events now")
        taken = self.standby, self._standby_client
        self.standby = self._standby_client = self._standby_until = None
        return taken

    def decided(self) -> None:
        """An event came by the stream: the queue uses it. The subscription
        kept aside goes MODE_CHECK_INTERVAL later (``expire``): the add of
        a Queue that found its settings gone (the server lost its data)
        writes to the stream, then the Queue stores pub/sub mode again; the
        subscription closed at once, its reader lost what was published
        until it subscribed again."""
        self.undecided = False
        if self.standby is not None and self._standby_until is None and not self.expects_pubsub:
            self._standby_until = time.monotonic() + MODE_CHECK_INTERVAL

    def expire(self, now: float) -> None:
        """Close the subscription kept aside once its time after ``decided`` is up."""
        if self._standby_until is not None and now >= self._standby_until and not self.undecided:
            self.close()

    def close(self) -> None:
        _connection.close_subscription(self._standby_client, self.standby)
        self.standby = self._standby_client = None
        self._standby_until = None


class EventReader:
    """What the reader thread reads for one queue: its position in the event
    channel, the entries it consumes there (it resolves waiters directly, and
    hands events to the dispatcher), and its readiness. Its thread is a
    ``ReaderLoop`` (of a ShardedQueueEvents: the ``ShardReader`` of all)."""

    def __init__(
        self,
        context: QueueContext,
        start_id: str,
        dispatcher: Dispatcher,
        listeners: ListenerRegistry,
        lost: Callable[..., None],
    ) -> None:
        self._context = context
        self._start_id = start_id
        self.event_mode = EventMode(context)
        self._dispatcher = dispatcher
        self._listeners = listeners
        self._lost = lost  # events may have been lost: re-check every waiter
        self.table: WaiterTable | None = None
        # its database's number: pub/sub events of another database are dropped
        self._db = _connection.database(context.client)
        self.after_fork()

    def after_fork(self) -> None:
        """Start afresh, as a new reader with the same start id would."""
        self.ready = threading.Event()
        # set by the first connect, whatever its end (then ``unreachable``)
        self.tried = threading.Event()
        self.unreachable: Exception | None = None
        self.event_mode.reset()
        self.read_id: StreamId | None = None
        self.first_id: StreamId | None = None  # where reading began
        # the reader thread's connection for reads, kept between them (ReaderLoop)
        self.held: Any = None
        self.pubsub: Any = None  # the subscription read in pub/sub mode
        # the client of the subscription kept aside, once it is ``pubsub``:
        # the reader loop's own from then on (see _take_standby)
        self.switched: Client | None = None
        # checkpoints its subscription is to echo (PING), for a client
        # refused PUBLISH; the reader thread sends them before its next block
        self.pings: _queue.SimpleQueue[str] = _queue.SimpleQueue()

    @property
    def name(self) -> str:
        return self._context.name

    @property
    def mode(self) -> str:
        return self.event_mode.mode

    @property
    def publish(self) -> str:
        """The command that publishes on its events channel (``EventMode.publish``)."""
        return self.event_mode.publish

    def ping(self, token: str) -> None:
        """Have the subscription echo ``token`` (see ``send_pings``)."""
        self.pings.put(token)

    def send_pings(self, pubsub: Any) -> None:
        """On the reader thread, before a block: PING each checkpoint asked
        for on the subscription. Its echo comes after every message published
        before it (``consume_message`` settles it as a published checkpoint)."""
        while not self.pings.empty():  # one consumer: the reader thread
            pubsub.ping(self.pings.get_nowait())

    def follows(self, run: str | None) -> bool:
        """Whether this reader sees every event of the run that began with
        ``added`` event ``run`` (it began before, and lost nothing since)."""
        if not run or self.mode != "stream" or self.first_id is None:
            return False
        first, _ = generation(run)  # a retried run: its generations too
        if not valid_id(first):
            return False
        added = sid(first)
        evicted = self.table.evicted_upto if self.table is not None else (0, 0)
        return added > self.first_id and added > evicted

    @property
    def key(self) -> str:
        """The events stream's key (and channel's name)."""
        return self._context.keys.events

    def stopped(self) -> None:
        """Closed: end the waits for its first connect and readiness (they see the stop)."""
        self.tried.set()
        self.ready.set()

    def read_mode(self, client: Client) -> str:
        """Read the queue's stored mode (``EventMode.read``). A reader that
        leaves pub/sub mode (the server lost it with its data) reads the
        stream from its start: the stream began when the mode went."""
        was = self.event_mode.mode
        mode = self.event_mode.read(client)
        if was == "pubsub" and mode == "stream" and self.read_id is None:
            self.read_id = (0, 0)
        return mode

    def connect_failed(self, exc: Exception) -> Exception:
        """A failed connect: the error (naming the server) a never-ready reader's waits raise."""
        error = _connection.unreachable(exc, self._context.client)
        if not self.ready.is_set():
            self.unreachable = error
        self.tried.set()
        return error

    def start(self, client: Client) -> None:
        """Once the caller listens (pub/sub mode) or is about to read: resolve
        the start id (stream mode), or look for a gap since the last read;
        mark the reader ready. After a reconnect (events may have been lost)
        re-check every waiter; on the first connect, the futures registered
        before the reader was ready get their first check."""
        if self.mode == "stream":
            if self.read_id is None:
                if self._start_id != "$":
                    self.read_id = _since(client, self._context.keys, self._start_id)
                elif self.event_mode.undecided:  # no stream when it looked: all of it
                    self.read_id = self.event_mode.undecided_from
                else:
                    last = client.xrevrange(self._context.keys.events, "+", "-", count=1)
                    self.read_id = sid(_text(last[0][0])) if last else (0, 0)
                self.first_id = max(self.read_id, _emptied_upto(client, self._context.keys))
            else:
                self._detect_gap(client)
        reconnect = self.ready.is_set()
        self.ready.set()
        self.unreachable = None
        self.tried.set()
        if reconnect or (self.table is not None and not self.table.empty()):
            self._lost()

    def _forget(self) -> None:
        """Events up to here may be lost: no run added by now is followed."""
        if self.table is not None and self.read_id is not None:
            self.table.forget_upto(self.read_id)
        self._lost()

    def _release_held(self, client: Client) -> None:
        if self.held is not None:
            client.connection_pool.release(self.held)
            self.held = None

    def _detect_gap(self, client: Client, since: StreamId | None = None,
                    timed: bool = False) -> None:
        """Warn and re-check all waiters if events after ``since`` (the last
        read) were trimmed, or (``timed``) may have been in a read that no
        look followed, the stream's length having been lowered."""
        self._release_held(client)  # the look runs on it, through the pool
        missed = timed and self.event_mode.missed(client)
        if missed or trimmed(client, self._context.keys.events, since or self.read_id):
            logger.warning("events of %r were gone before they were read (%s); re-checking "
                           "waiters", self.name, "max_events was lowered" if missed
                           else "trimmed, or lost with the server's data")
            # an emptied stream (trim_events(0)): nothing is left to read up
            # to its last id, and no run added by then is followed
            emptied = _emptied_upto(client, self._context.keys)
            if self.read_id is not None and emptied > self.read_id:
                self.read_id = emptied
            self._forget()

    def position(self) -> str:
        """The id to read after (stream mode, once ready)."""
        assert self.read_id is not None
        return f"{self.read_id[0]}-{self.read_id[1]}"

    def consume(self, entries: list[Any], client: Client) -> None:
        """Handle the entries of a read after ``position()`` (``client``: the gap's look)."""
        assert self.read_id is not None and self.table is not None
        since = self.read_id
        listened = self._listeners.has_any()
        # the waiters answered by this read go to the gate, which wakes a
        # batch at a time (see WakeGate)
        answered: list[tuple[Waiter, Outcome]] = []
        for entry_id, raw in entries:
            entry = _text(entry_id)
            name = raw.get(b"ev")
            if name == _MODE_STORED:
                self.read_id = sid(entry)
                self._release_held(client)  # the look runs on it
                if self._take_standby(client):
                    break
                continue
            if self.event_mode.undecided:
                self.event_mode.decided()
            if (not listened and name not in _RUN_ENDS_RAW and name != b"obliterated"
                    and raw.get(b"ev:2") not in _RUN_ENDS_RAW):
                # nobody listens and no waiter needs it: skip decoding (it
                # counts as dispatched, as in _handle)
                self.read_id = sid(entry)
                if self._dispatcher.idle():
                    self._dispatcher.dispatched_id = entry
                continue
            try:
                events = _events.from_stream(entry, raw)
            except Exception as exc:
                logger.exception("skipping undecodable event %s of %r", entry, self.name)
                events = []
                if name == b"completed" and raw.get(b"jid"):  # its waiters raise the error
                    answered += _unreadable(self.table, entry, raw, exc)
            for event in events:
                self._handle(event, answered)
            self.read_id = sid(entry)  # only after its outcome is recorded
        self.table.gate.add(answered)
        self.table.settle()
        # XREAD cannot tell that entries after ``since`` were trimmed: the
        # stream's first id can (see EventMode.gap_look for when to look)
        if entries and self.pubsub is None:
            timed = self.event_mode.gap_look(len(entries), time.monotonic())
            if timed is not None:
                self._detect_gap(client, since, timed)

    def look_for_mode(self, client: Client) -> None:
        """Undecided (a subscription kept aside): read the stored mode again.
        A 0.1 process that stores pub/sub mode writes no stream entry saying
        so (``_MODE_STORED``): its events then come by the subscription kept
        aside, which missed none of them."""
        if self.pubsub is not None or self.event_mode.standby is None:
            return
        self._release_held(client)
        self._take_standby(client)

    def _take_standby(self, client: Client) -> bool:
        """Pub/sub mode stored: read by the subscription kept aside, and
        its client (``switched``, for the reader loop's own: its looks at
        the stored mode ran on the stream's client, closed here, and failed
        5 s later, a reconnect losing what was published meanwhile).
        Whether it did."""
        taken = self.event_mode.stored(client)
        if taken is None:
            return False
        self.pubsub, self.switched = taken  # what follows comes by it
        _connection.close_client(client)  # one connection open, as ever
        return True

    def consume_message(self, message: dict[str, Any]) -> None:
        """Handle a message of the subscription to the events channel."""
        assert self.table is not None
        kind = _text(message["type"])
        if kind in ("ssubscribe", "subscribe"):  # a silent reconnect resubscribed
            self._lost()
            return
        if kind == "sunsubscribe":  # the slot moved: subscribe again
            raise ConnectionError("the server ended the sharded subscription")
        if kind == "pong":  # a checkpoint's echo (send_pings)
            self.table.settle(_text(message["data"]))
            return
        if kind not in ("smessage", "message"):
            return
        try:
            event, db = _events.from_pubsub(message["data"])
        except Exception:
            logger.exception("skipping undecodable event message of %r", self.name)
            return
        if db is not None and db != self._db:
            return  # the queue of this name in another database of the server
        if db is None and event.name in RUN_ENDS and event.job_id is not None:
            # no database named: a 0.1 process's event (or one written
            # before a 0.2 writer stored the number), maybe of a namesake in
            # another database: its job's waiters read their record instead
            waiters = self.table.of_job(event.job_id)
            if waiters:
                self._lost(waiters)
            if self._listeners.has_any():
                self._dispatcher.put(event)
            return
        if event.name == CHECKPOINT:
            self.table.settle(event.job_id)
            return
        answered: list[tuple[Waiter, Outcome]] = []
        self._handle(event, answered)
        self.table.gate.add(answered)

    def _handle(self, event: Event, answered: list[tuple[Waiter, Outcome]]) -> None:
        """Add the waiters of a run that ended to ``answered`` (the caller
        resolves them), then queue the event for listeners."""
        assert self.table is not None
        job_id = event.job_id
        if event.name in RUN_ENDS and job_id is not None:
            run = event.fields.get("run")
            run = run if isinstance(run, str) else None
            outcome, event = outcome_of(self._context, event, run)
            at = sid(event.id) if event.id else (0, 0)
            waiters = self.table.record(job_id, run, outcome, at)
            answered += ((waiter, outcome) for waiter in waiters)
        elif event.name == "obliterated" and not event._custom:
            # every record is gone: each waiter learns it from its own check
            self._forget()
        if self._listeners.has_any():
            self._dispatcher.put(event)
        elif event.id is not None and not event._more and self._dispatcher.idle():
            self._dispatcher.dispatched_id = event.id


def _unreadable(
    table: WaiterTable, entry: str, raw: dict[bytes, bytes], exc: Exception
) -> list[tuple[Waiter, Outcome]]:
    """The waiters of a `completed` entry that cannot be decoded here,
    answered with the error (a result of a type registered elsewhere)."""
    error = exc if isinstance(exc, SerializationError) else SerializationError(
        f"the completed event of job {_text(raw[b'jid'])!r} could not be decoded: {exc}")
    outcome = Unreadable(error)
    run = _text(raw[b"run"]) if b"run" in raw else None
    waiters = table.record(_text(raw[b"jid"]), run, outcome, sid(entry))
    return [(waiter, outcome) for waiter in waiters]


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def outcome_of(context: QueueContext, event: Event, run: str | None) -> tuple[Outcome, Event]:
    """How the run ended, and the event as listeners should see it (with
    a result too big for the stream read back in)."""
    if event.name == "failed":
        fields = event.fields
        cancelled = fields.get("cancelled") == "1"
        failed = Failed(fields.get("failed_reason"), None, fields.get("exc_type"), cancelled)
        return failed, event
    if event.name != "completed":
        return MISSING, event
    if "result" in event.fields:
        return Completed(event.fields["result"]), event
    # a big result: in the record if it is of this run, else kept a while
    # under its run's key (see complete.lua)
    assert event.job_id is not None
    client = context.client
    state, value, record_run = client.hmget(
        context.keys.job(event.job_id), ["state", "rv", "run"]
    )
    raw = None
    same_run = run is None or record_run is None or _text(record_run) == run
    if state == b"completed" and same_run:
        raw = value
    elif run is not None:
        raw = client.get(f"{context.keys.base}result:{run}")
    if raw is None:
        return MISSING, event
    outcome = completed(raw)
    if not isinstance(outcome, Completed):  # listeners get the event without it
        logger.warning("events reader of %r: result of job %r: %s", context.name,
                       event.job_id, outcome.error)
        return outcome, event
    fields = {**event.fields, "result": outcome.value}
    return outcome, dataclasses.replace(event, fields=fields)


#: The highest sequence number of a stream id.
_LAST_SEQ = 2**64 - 1


def _before(at: StreamId) -> StreamId:
    """The id just before ``at``: a read after it begins at ``at``."""
    ms, seq = at
    return (ms, seq - 1) if seq else (ms - 1, _LAST_SEQ)


def _after(at: StreamId) -> StreamId:
    """The stream id right after ``at``."""
    return (at[0], at[1] + 1) if at[1] < _LAST_SEQ else (at[0] + 1, 0)


def _since(client: Client, keys: QueueKeys, start_id: str) -> StreamId:
    """Where a reader told to start after ``start_id`` really starts: just
    before the stream's first entry when that is later (the entries between
    were trimmed; the runs they began are not followed, so a wait on one
    checks the job's record, and a later trim is seen as a gap). Such a
    start id other than "0" is logged: events it asked for are gone."""
    start = sid(start_id)
    if start != (0, 0):
        # an entry of two events (added, then waiting) names both by its id:
        # a start after it is a start at it, in case only the first was seen
        # (its events come again rather than its second never)
        at = client.xrange(keys.events, start_id, start_id)
        if at and b"ev:2" in at[0][1] and at[0][1].get(b"c") != b"1":
            start = _before(start)
    first = client.xrange(keys.events, "-", "+", count=1)
    if not first:
        return start
    since = max(start, _before(sid(_text(first[0][0]))))
    if start != (0, 0) and since > start:
        logger.warning("events of %r after %s were gone before they were read (trimmed, "
                       "or lost with the server's data)", keys.queue, start_id)
    return since


def _emptied_upto(client: Client, keys: QueueKeys) -> StreamId:
    """The last id of an empty stream, which had entries (trimmed, or
    emptied by ``obliterate``; (0, 0) if it has entries or is none): a
    reader starting on it has not seen the runs added up to it. Taken as
    followed, their waits looked at no record and waited for events trimmed
    already: a job removed as it finished ran out every wait's timeout."""
    try:
        info = client.xinfo_stream(keys.events)
    except redis.exceptions.ResponseError:  # no stream
        return (0, 0)
    last = _text(info.get("last-generated-id") or "")
    return sid(last) if not info.get("length") and valid_id(last) else (0, 0)


def publish_wake(context: QueueContext, command: str = "SPUBLISH",
                 timeout: float = _connection.UNBLOCK_TIMEOUT) -> None:
    """Publish a checkpoint on a queue's events channel (with ``command``, as
    its reader subscribed): it ends a reader's wait for a message there."""
    try:
        message = _events.to_netstrings(["ev", CHECKPOINT, "jid", "wake"])
        deadline = time.monotonic() + timeout
        context.command_by(deadline, command, context.keys.events, message)
    except Exception:  # the wait ends by itself within a second
        pass


def _gap_batch(max_events: bytes | None) -> int:
    """The least read that may follow a trimmed gap: trimming keeps at least
    ``max_events`` entries (its stored text, as the scripts read it)."""
    return min(1000, int(max_events) if max_events and max_events.isdigit() else 10_000)


def trimmed(client: Client, key: str, since: StreamId | None) -> bool:
    """Whether events of stream ``key`` after ``since`` may have been
    trimmed before they were read."""
    try:
        info = client.xinfo_stream(key)
    except Exception:  # no stream yet: nothing was lost
        return False
    if since is None:
        return False
    # XTRIM / MAXLEN do not move max-deleted-entry-id (only XDEL does): a
    # stream whose first entry is past the last id read lost that entry,
    # and maybe more after it. Re-checking waiters is harmless if not.
    first = info.get("first-entry")
    # (0, 0) is "before everything" (a "$" resolved on an empty stream, or
    # "0"), not an entry read: only an XDEL past it shows a loss then. An
    # `obliterated` event first in the stream is an obliterate's (it empties
    # the stream, then writes it): what went before it went with the queue,
    # and the reader re-checks every waiter when it reads that event.
    if first and (since == (0, 0) or _first_is_obliterated(first)):
        first = None
    # an entry deleted after `since`; a first entry with ids free between
    # `since` and it (one right after `since` follows it with nothing lost)
    marks = [(info.get("max-deleted-entry-id"), since),
             (first[0] if first else None, _after(since))]
    if not info.get("length") and since != (0, 0):  # emptied (trim_events(0)) past it
        marks.append((info.get("last-generated-id"), since))
    texts = [(_text(m), bound) for m, bound in marks if m]
    return any(sid(t) > bound for t, bound in texts if valid_id(t))


def _first_is_obliterated(first: Any) -> bool:
    """Whether XINFO STREAM's first entry (id, fields) is an obliterate's
    `obliterated` event (not a custom event of that name)."""
    fields = first[1] if len(first) > 1 else None
    if isinstance(fields, (list, tuple)):  # a flat field/value list
        fields = dict(zip(fields[::2], fields[1::2], strict=False))
    if not isinstance(fields, dict):
        return False
    fields = {_text(k): v for k, v in fields.items()}
    return fields.get("ev") in (b"obliterated", "obliterated") and "c" not in fields
