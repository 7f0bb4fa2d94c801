"""The reader thread of a plain QueueEvents: its own connection, opened
again after every failure, and its loop of blocking reads (the stream, or
the pub/sub channel) whose entries its ``EventReader`` consumes. A
ShardedQueueEvents has one thread for all its shards instead
(``_shard_reader``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from . import _reader
from . import connection as _connection
from ._context import QueueContext
from ._reader import READ_COUNT, EventReader, ModeChanged, publish_wake
from ._threads import BackgroundLoop, reached
from .connection import Client, blocking_client

logger = logging.getLogger("jobq.queue_events")  # the public module's name, as documented


class ReaderLoop:
    """The reader thread of one ``EventReader``: reads on its own connection
    (blocks of ``block`` seconds) until ``stop`` is set; ``failed`` hears
    every failed read."""

    def __init__(self, context: QueueContext, reader: EventReader, block: float,
                 stop: threading.Event, failed: Callable[[BaseException], None]) -> None:
        self._reader = reader
        self._context = context
        self._block = block
        self._stop = stop
        self._failed = failed
        self.after_fork()

    def after_fork(self) -> None:
        """Start afresh: no connection yet."""
        self._blocked: _connection.Blocked | None = None
        self._client: Client | None = None  # the reader thread's own
        self._next_mode_check = 0.0  # pub/sub mode: monotonic

    @property
    def name(self) -> str:
        return self._context.name

    def wake(self, timeout: float = _connection.UNBLOCK_TIMEOUT) -> None:
        """Cut the reader's current block short, so that close is prompt
        (trying for ``timeout`` at most)."""
        if self._reader.mode == "pubsub":
            publish_wake(self._context, self._reader.publish, timeout)
        else:
            _connection.unblock(self._context.bounded, self._blocked, timeout)

    def interrupt(self) -> None:
        """Cut the connections under a read or connect that does not return (close's last)."""
        _connection.cut_client(self._client)

    def loop(self) -> None:
        """The reader thread's body, until the stop event is set."""
        BackgroundLoop(
            f"events reader of {self.name!r}", self._step, on_error=self._reconnect,
            on_exit=self._disconnect, stop=self._stop, log=logger,
        ).run()

    def _step(self) -> float:
        reader = self._reader
        if self._client is None:
            client = self._client = blocking_client(
                self._context.client, f"jobq-events-{self.name}"
            )
            if self._stop.is_set():  # closed before the client was there to cut
                return 0.0
            try:
                self._blocked = _connection.client_id(client, self._context.keys.events)
                reader.pubsub = self._connect(client)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                    OSError) as exc:
                raise reader.connect_failed(exc) from exc
            except redis.exceptions.ResponseError as exc:
                # a cluster's node, or a user without a command the reader
                # needs: a wait raises it, as an unreachable server's error
                if not (_connection.moved(exc)
                        or isinstance(exc, redis.exceptions.NoPermissionError)):
                    raise
                raise reader.connect_failed(exc) from exc
            reached()
        if reader.pubsub is not None:
            self._read_pubsub(reader.pubsub)
            self._check_mode(self._client)
        else:
            self._read_stream(self._client)
            if reader.switched is not None:  # the stream's client closed: the subscription's
                self._client, reader.switched, self._blocked = reader.switched, None, None
        return 0.0

    def _check_mode(self, client: Client) -> None:
        """Pub/sub mode, every MODE_CHECK_INTERVAL: if the queue's stored
        mode is gone (its settings lost with the server's data), read its
        stream from the start: the events are written there again."""
        now = time.monotonic()
        if now < self._next_mode_check:
            return
        self._next_mode_check = now + _reader.MODE_CHECK_INTERVAL
        was = self._reader.publish
        if self._reader.read_mode(client) != "pubsub":
            logger.warning("queue %r: its pub/sub event mode is no longer stored (the server "
                           "lost its data?); reading its stream", self.name)
            self._drain_pubsub()  # published before the mode went: read before it closes
            raise ModeChanged(f"queue {self.name!r} uses its stream again")
        if self._reader.publish != was:  # a writer on a cluster's node stored sp since
            raise ModeChanged(f"queue {self.name!r}: its events are published the other way")

    def _reconnect(self, exc: Exception) -> None:
        """A failed read: report it; the next step connects again."""
        if not isinstance(exc, ModeChanged):
            self._failed(exc)
        self._disconnect()

    def _disconnect(self) -> None:
        reader = self._reader
        reader.event_mode.close()
        _connection.close_subscription(self._client, reader.pubsub)
        if reader.switched is not None:  # a switch cut short by an error
            _connection.close_client(reader.switched)
        self._client, reader.pubsub, reader.held, reader.switched = None, None, None, None

    def _connect(self, client: Client) -> Any:
        """(Re)connect: read the queue's mode, subscribe, resolve the start id."""
        reader = self._reader
        reader.read_mode(client)
        self._next_mode_check = time.monotonic() + _reader.MODE_CHECK_INTERVAL
        pubsub = reader.event_mode.subscribe(client, self._stop.is_set)
        reader.start(client)
        return pubsub

    def _read_stream(self, client: Client) -> None:
        reader = self._reader
        assert reader.read_id is not None
        # kept from read to read (a loan polls the socket and keeps the
        # pool's books); the pool's only one, whose id ``client_id`` recorded
        if reader.held is None and _connection.pooled(client):
            reader.held = _connection.take_connection(client.connection_pool)
        reply = _connection.xread(
            client, self._context.keys.events, reader.position(), READ_COUNT,
            int(self._block * 1000), reader.held,
        )
        reader.consume(_connection.stream_entries(reply), client)
        if reader.pubsub is None and reader.event_mode.standby is not None:
            now = time.monotonic()  # undecided: every MODE_CHECK_INTERVAL
            if now >= self._next_mode_check:
                self._next_mode_check = now + _reader.MODE_CHECK_INTERVAL
                reader.look_for_mode(client)
            if reader.pubsub is None:
                reader.event_mode.expire(now)

    def _drain_pubsub(self) -> None:
        """Read what the subscription holds already (the server wrote it
        before its reply to a look on another connection)."""
        pubsub = self._reader.pubsub
        while pubsub is not None:
            message = pubsub.get_sharded_message(timeout=0)
            if message is None:
                return
            self._reader.consume_message(message)

    def _read_pubsub(self, pubsub: Any) -> None:
        self._reader.send_pings(pubsub)
        message = _connection.next_message(pubsub, self._block)
        if message is not None:
            self._reader.consume_message(message)
