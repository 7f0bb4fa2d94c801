"""Queues made on demand on one client, closed together: what a
FlowProducer and the dashboard hold (any number of queues of one prefix)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, cast

import redis

from . import _fork
from . import connection as _connection
from .errors import ClosedError

if TYPE_CHECKING:
    from .queue import Queue


class QueueSet:
    """The Queues of one prefix on one client (``connection`` as for Queue:
    a client of the caller's is never closed here)."""

    def __init__(
        self, connection: object, prefix: str, owner: str, stored: bool = False,
        read_timeout: float | None = None,
    ) -> None:
        """``stored``: open each queue as it is stored (a ShardedQueue when
        a shard count is stored with it, see ``jobq.open_queue``);
        ``read_timeout``: as ``connection.resolve``'s."""
        self.prefix = prefix
        self._stored = stored
        self.client, self._owned = _connection.resolve(connection, read_timeout)
        self._owner = owner  # for the error raised once closed
        self._queues: dict[str, Queue] = {}
        self._lock = threading.Lock()
        self.closed = False
        _fork.track(self)

    def _after_fork(self) -> None:
        """In a forked child: a new lock (a parent's thread may have held
        it); the queues reset themselves."""
        self._lock = threading.Lock()

    def get(self, name: str) -> Queue:
        """The Queue of that name (made on first use, on the shared client)."""
        from .queue import Queue

        with self._lock:
            if self.closed:
                raise ClosedError(f"{self._owner} is closed")
            queue = self._queues.get(name)
        if queue is not None:
            return queue
        if self._stored:
            from .sharding import open_queue

            # a ShardedQueue answers every call the dashboard makes; opened
            # outside the lock (it reads the server: a cluster's node that
            # does not answer held up every other queue's request)
            try:
                queue = cast(Queue, open_queue(name, connection=self.client,
                                               prefix=self.prefix))
            except redis.exceptions.ResponseError as exc:
                if _connection.moved(exc):  # a cluster's node, named by a plain URL
                    raise
                # its shard count refused (a key of another type, an ACL): a
                # plain Queue, whose reads are refused too and left out by
                # the caller, as any refused queue's (a scrape answered 503
                # for every queue); keep() looks at it again
                queue = Queue(name, connection=self.client, prefix=self.prefix)
        else:
            queue = Queue(name, connection=self.client, prefix=self.prefix)
        with self._lock:
            kept = None if self.closed else self._queues.setdefault(name, queue)
        if kept is not queue:  # made meanwhile by another thread, or closed since
            queue.close()
            if kept is None:
                raise ClosedError(f"{self._owner} is closed")
        return kept

    def keep(self, names: list[str]) -> None:
        """Close the queues made that are not among ``names`` (obliterated
        since), and, opened as stored, those now stored as the other kind (a
        queue obliterated and made again sharded, or plain): the next
        ``get`` opens them as they are (one pipelined read of the shard
        counts). For a tool that runs for long: the dashboard, ``jobq
        metrics``, ``jobq info --watch``."""
        from .keys import QueueKeys

        with self._lock:
            made = dict(self._queues)
        if not made:
            return
        listed = set(names)
        gone = [name for name in made if name not in listed]
        if self._stored:
            kept = [name for name in made if name in listed]
            pipe = self.client.pipeline(transaction=False)
            for name in kept:
                pipe.hget(QueueKeys(self.prefix, name).meta, "shards")
            for name, raw in zip(kept, pipe.execute(raise_on_error=False), strict=True):
                if isinstance(raw, Exception):  # refused (see get): as it was
                    continue
                stored = int(raw) if raw else None
                if getattr(made[name], "shard_count", None) != stored:
                    gone.append(name)
        with self._lock:
            dropped = [self._queues.pop(name) for name in gone if name in self._queues]
        for queue in dropped:
            queue.close()

    def close(self) -> None:
        """Close every queue made (their event readers), then the client if
        it was made here. Idempotent."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            queues, self._queues = list(self._queues.values()), {}
        for queue in queues:
            queue.close()
        if self._owned:
            _connection.close_client(self.client)
