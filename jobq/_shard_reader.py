"""The reader thread of a ShardedQueueEvents: every shard's events on one
thread, with one connection per node.

On one server in stream mode, one blocking XREAD reads every shard's stream.
A cluster refuses a blocking read over keys of several slots (CROSSSLOT,
even on one node), and in pub/sub mode the events are messages: there the
reader subscribes (SSUBSCRIBE, one per slot) to each shard's events channel,
on one connection per node, and makes its other calls to the node on a
second one of its own. In pub/sub mode the messages are the events. In
stream mode a shard's scripts publish one wake-up on that channel after they
write to its stream (once per call, ``emit`` in _common.lua); the reader
then reads the streams of the shards that signalled, non-blocking, in one
pipelined round trip per node. It subscribes before it first reads, so no
wake-up is lost between a read and the wait that follows it.

Each shard's ``EventReader`` keeps that shard's position, waiters and gap
checks; this module only moves entries and messages to it.
"""

from __future__ import annotations

import logging
import select
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from redis.cluster import RedisCluster

from . import _reader
from . import connection as _connection
from . import events as _events
from ._reader import READ_COUNT, EventReader, ModeChanged, publish_wake
from ._threads import BackgroundLoop, reached
from ._waiters import CHECKPOINT
from .connection import Client, blocking_client, close_subscription, next_message, ssubscribe

logger = logging.getLogger("jobq.queue_events")


class _Node:
    """One node: a client of the reader's own with two connections, one
    subscribed to the events channels of the shards the node serves, one
    for the other calls on their keys (the reads of their streams, their
    modes). A close cuts both: no call of the reader thread is on a client
    it does not own (one on a server that stopped answering would keep
    the thread past the close)."""

    def __init__(self, own: Client, channels: dict[bytes, int]) -> None:
        self.client = own
        self.pubsub = own.pubsub()
        self.channels = channels  # channel -> shard

    def subscribe(self, stopping: Callable[[], bool]) -> None:
        ssubscribe(self.pubsub, self.channels, stopping, "the shards' channels")

    def socket(self) -> Any:
        return getattr(self.pubsub.connection, "_sock", None)


class ShardReader:
    """Reads every shard's events for their ``EventReader``s, on one thread."""

    def __init__(
        self,
        name: str,
        client: Client,
        readers: tuple[EventReader, ...],
        block: float,
        stop: threading.Event,
        failed: Callable[[BaseException], None],
    ) -> None:
        self._name = name
        self._client = client
        self._readers = readers
        for reader in readers:  # its nodes' subscriptions hear every shard's channel
            reader.event_mode.always_listened = True
        self._by_key = {reader.key: reader for reader in readers}
        self._block = block
        self._stop = stop
        self._failed = failed
        self.after_fork()

    def after_fork(self) -> None:
        """Forget every connection (in a forked child they are the parent's)."""
        self._multi: Client | None = None  # one server, stream mode: one blocking XREAD
        self._own: list[Client] = []  # every client of the reader's own
        self._calls: list[Client] = []  # by shard: the reader's client of its node
        self._next_mode_check = 0.0  # while a shard is in pub/sub mode (monotonic)
        self._blocked: _connection.Blocked | None = None
        self._nodes: list[_Node] = []
        self._signalled: set[int] = set()

    @property
    def connections(self) -> int:
        """How many connections of its own the reader may hold: one on a
        single server in stream mode, else two per node (one subscribed; the
        other from its first call after subscribing)."""
        return 1 if self._multi is not None else 2 * len(self._nodes)

    def wake(self, timeout: float = _connection.UNBLOCK_TIMEOUT) -> None:
        """Cut the current wait short, so that close is prompt (trying for
        ``timeout`` at most, in all)."""
        deadline = time.monotonic() + timeout
        if self._multi is not None:
            _connection.unblock(self._client, self._blocked, timeout)
        for node in list(self._nodes):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            publish_wake(self._readers[next(iter(node.channels.values()))]._context,
                         timeout=left)

    def interrupt(self) -> None:
        """Cut the reader's connections under a read (or connect) that does
        not return: a close's last resort on a server that does not answer."""
        for client in list(self._own):
            _connection.cut_client(client)

    def _check_open(self) -> None:
        """Called once a new client is where ``interrupt`` finds it: a close
        that came before has not cut it."""
        if self._stop.is_set():
            raise ConnectionError("closing")

    # -- the loop -------------------------------------------------------------

    def loop(self) -> None:
        """The reader thread's body, until the stop event is set."""
        BackgroundLoop(
            f"events reader of {self._name!r}", self._step, on_error=self._reconnect,
            on_exit=self._disconnect, stop=self._stop, log=logger,
        ).run()

    def _step(self) -> float:
        if self._multi is None and not self._nodes:
            try:
                self._connect()
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                    redis.exceptions.NoPermissionError, OSError) as exc:
                errors = [reader.connect_failed(exc) for reader in self._readers]
                raise errors[0] from exc
            reached()
        if self._multi is not None:
            self._read_all(self._multi)
        else:
            self._listen()
            self._check_modes()
        return 0.0

    def _check_modes(self) -> None:
        """As ``EventReader._check_mode``, for the shards in pub/sub mode:
        one whose stored mode is gone is read from its stream's start."""
        now = time.monotonic()
        if now < self._next_mode_check:
            return
        self._next_mode_check = now + _reader.MODE_CHECK_INTERVAL
        lost = [r for shard, r in enumerate(self._readers)
                if r.mode == "pubsub" and self._call(shard, r.read_mode) != "pubsub"]
        if lost:
            logger.warning("queue %r: the pub/sub event mode of %d shard(s) is no longer "
                           "stored (the server lost its data?); reading their streams",
                           self._name, len(lost))
            # what was published before the mode went is on the subscriptions'
            # sockets by now (the server wrote it before its reply to the
            # look): read it, before they close
            self._drain()
            raise ModeChanged(f"shards of queue {self._name!r} use their streams again")

    def _reconnect(self, exc: Exception) -> None:
        """A failed read: report it; the next step connects again (on a
        cluster, after learning where the slots now live)."""
        if not isinstance(exc, ModeChanged):  # the settings changed: no failure
            self._failed(exc)
        self._disconnect()
        if isinstance(self._client, RedisCluster):
            try:
                self._client.nodes_manager.initialize()
            except Exception as refresh:
                logger.debug("could not refresh the cluster's slot map: %s", refresh)

    def _disconnect(self) -> None:
        for node in self._nodes:
            close_subscription(None, node.pubsub)
        for client in self._own:
            _connection.close_client(client)
        self.after_fork()

    def _connect(self) -> None:
        client = self._client
        # the shards by node (the slot map the client has: no call), and a
        # client of the reader's own for each node
        groups: dict[str, dict[bytes, int]] = {}
        owns: dict[str, Client] = {}
        for shard, reader in enumerate(self._readers):
            name, node_client = "", client
            if isinstance(client, RedisCluster):
                node = client.get_node_from_key(reader.key)  # type: ignore[no-untyped-call]
                name, node_client = node.name, node.redis_connection
            groups.setdefault(name, {})[reader.key.encode()] = shard
            if name not in owns:
                owns[name] = blocking_client(node_client, f"jobq-events-{self._name}")
                self._own.append(owns[name])
            self._calls.append(owns[name])
        self._check_open()
        modes = {self._call(shard, reader.read_mode)
                 for shard, reader in enumerate(self._readers)}
        self._next_mode_check = time.monotonic() + _reader.MODE_CHECK_INTERVAL
        # a shard with no mode stored yet may take pub/sub: listen to them all
        undecided = any(reader.event_mode.undecided for reader in self._readers)
        if modes == {"stream"} and not undecided and not isinstance(client, RedisCluster):
            multi = self._multi = owns[""]
            self._blocked = _connection.client_id(multi, self._readers[0].key)
            for reader in self._readers:
                reader.start(multi)
            return
        for name, channels in groups.items():
            node = _Node(owns[name], channels)
            self._nodes.append(node)
            node.subscribe(self._stop.is_set)
        # listening now: whatever was written before is read from the streams
        # (of every shard in stream mode: some may be in pub/sub mode yet)
        for shard, reader in enumerate(self._readers):
            self._call(shard, reader.start)
        self._signalled = {i for i, reader in enumerate(self._readers) if reader.mode == "stream"}

    def _call(self, shard: int, call: Callable[[Client], Any]) -> Any:
        """``call`` with the reader's client of ``shard``'s node; on a
        cluster, with the cluster client if that node refused it (the
        shard's slot migrating: ASK; or moved: MOVED), which follows the
        slot."""
        try:
            return call(self._calls[shard])
        except redis.exceptions.ResponseError:
            if not isinstance(self._client, RedisCluster):
                raise
        return call(self._client)

    # -- reading --------------------------------------------------------------

    def _read_all(self, client: Client) -> None:
        """One server, stream mode: one blocking XREAD over every stream."""
        streams = {reader.key: reader.position() for reader in self._readers}
        reply = client.xread(streams, count=READ_COUNT, block=int(self._block * 1000))
        for key, entries in _connection.streams_entries(reply):
            self._by_key[key].consume(entries, client)
        if any(reader.mode == "pubsub" for reader in self._readers):
            # a shard's stream said pub/sub mode was stored (again, after the
            # server lost it): listen to the channels, which this read does not
            raise ModeChanged(f"shards of queue {self._name!r} use pub/sub events now")

    def _listen(self) -> None:
        """Read the streams of the shards that signalled (stream mode), then
        wait for messages (at once if a read left entries unread)."""
        if self._signalled:
            self._read_signalled()
        for node in self._nodes:
            for shard in node.channels.values():
                self._readers[shard].send_pings(node.pubsub)
        wait = 0.0 if self._signalled else self._block
        if self._drain() or wait <= 0 or self._stop.is_set():
            return
        if len(self._nodes) == 1:
            node = self._nodes[0]
            message = next_message(node.pubsub, wait)
            if message is not None:
                self._handle(node, message)
            return
        sockets = [s for s in (node.socket() for node in self._nodes) if s is not None]
        if sockets:
            select.select(sockets, [], [], wait)
            self._drain()

    def _read_signalled(self) -> None:
        """Read each signalled shard's stream, in one pipelined round trip per
        node; a shard whose read was full stays signalled. A shard whose slot
        is migrating (the node sends its read on: ASK) is read through the
        cluster client, which follows that; it holds up no other shard."""
        for node in self._nodes:
            shards = [s for s in node.channels.values() if s in self._signalled]
            if not shards:
                continue
            pipe = node.client.pipeline(transaction=False)
            for shard in shards:
                reader = self._readers[shard]
                pipe.xread({reader.key: reader.position()}, count=READ_COUNT)
            replies = pipe.execute(raise_on_error=False)
            for shard, reply in zip(shards, replies, strict=True):
                reader, client = self._readers[shard], node.client
                if isinstance(reply, redis.exceptions.ResponseError):
                    client = self._client
                    reply = client.xread({reader.key: reader.position()}, count=READ_COUNT)
                entries = _connection.stream_entries(reply)
                reader.consume(entries, client)
                if len(entries) < READ_COUNT:
                    self._signalled.discard(shard)

    def _read_rest(self, shard: int) -> None:
        """Read a shard's stream to its end (it has just left stream mode)."""
        reader = self._readers[shard]
        if reader.read_id is None:
            return

        def read(client: Client) -> int:
            reply = client.xread({reader.key: reader.position()}, count=READ_COUNT)
            entries = _connection.stream_entries(reply)
            reader.consume(entries, client)
            return len(entries)

        while self._call(shard, read) >= READ_COUNT:
            pass
        self._signalled.discard(shard)

    def _drain(self) -> bool:
        got = False
        for node in self._nodes:
            while True:
                message = node.pubsub.get_sharded_message(timeout=0)
                if message is None:
                    break
                got = True
                self._handle(node, message)
        return got

    def _handle(self, node: _Node, message: dict[str, Any]) -> None:
        kind = _text(message["type"])
        if kind in ("ssubscribe", "sunsubscribe"):
            # a silent reconnect resubscribed (events may be lost), or the
            # slot moved: connect again, and look for gaps
            raise ConnectionError(f"the subscription to a shard's events changed ({kind})")
        if kind == "pong":  # a checkpoint's echo (EventReader.send_pings)
            for each in node.channels.values():
                self._readers[each].consume_message(message)
            return
        if kind != "smessage":
            return
        channel = message["channel"]
        shard = node.channels.get(channel if isinstance(channel, bytes) else str(channel).encode())
        if shard is None:
            return
        reader = self._readers[shard]
        published = not _is_checkpoint(message["data"])
        if reader.event_mode.undecided or (reader.mode == "stream" and published):
            # its first write, or an event published: in which mode now? (a
            # mode is stored once, by a queue's first write; this reader read
            # the stream before)
            if self._call(shard, reader.event_mode.read) == "pubsub":
                # the add that stored it again after a data loss wrote its
                # events to the stream first, and published no wake-up for
                # them if the shard's mark was lost too: read them first
                self._read_rest(shard)
        if reader.mode == "pubsub" or published:
            # an event published is in no stream, whatever the mode stored
            # now (one read late, after the server lost the mode, is too)
            reader.consume_message(message)
        else:
            self._signalled.add(shard)


#: How every wake-up and checkpoint published on a shard's channel begins
#: (an event named so is no event: see CHECKPOINT).
_CHECKPOINT = _events.to_netstrings(["ev", CHECKPOINT])


def _is_checkpoint(data: bytes | str) -> bool:
    return (data if isinstance(data, bytes) else str(data).encode()).startswith(_CHECKPOINT)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
