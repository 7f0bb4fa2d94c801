"""The fetch thread of a Worker of a sharded queue.

A cluster refuses a blocking call over keys of several slots (BZPOPMIN on
every shard's marker would be CROSSSLOT), so the fetcher does not block on
the markers. Instead it keeps one connection per node, subscribed (SSUBSCRIBE,
one command per channel: one per slot) to the wake-up channel of each shard
the node serves; a shard's scripts publish on it whenever they make a job
ready (``mark_ready`` in _common.lua). The fetcher takes (moveToActive,
non-blocking) from the shards that signalled, in turn, starting after the
shard it took from last; a pool thread's finishing calls take at most
``_shard_worker.CHAIN_LIMIT`` jobs of the same shard along before its slot
comes back to this turn, so a ready shard waits at most about
``(shards - 1) x (CHAIN_LIMIT + 1)`` takes of a worker of concurrency 1.
It also looks at every shard after each (re)subscription (a wake-up sent
while it was not listening is not lost), when a shard's next delayed job is
due, and every ``drain_delay`` at least.

A node's connection also listens to each shard's cancel channel, so a cancel
reaches a running job at once. When a slot moves, the server ends the
subscriptions of its channels (SUNSUBSCRIBE): the fetcher subscribes again
where the slot now lives.

The rate limiter holds across the shards: its window is counted on the
logical queue's base (one round trip before each take), not per shard.
"""

from __future__ import annotations

import logging
import select
import time
from collections.abc import Callable
from typing import Any

from redis.cluster import RedisCluster

from ._attempt import Attempt
from ._cancel import check_marks
from ._fetcher import Fetcher
from ._sentinel import brief
from ._shard_worker import ShardedContext
from ._threads import RetryBackoff, reached
from .calls import TakeArgs, WorkerScripts
from .connection import (
    BLOCK_CAP,
    blocking_client,
    close_subscription,
    cut_client,
    is_transient,
    next_message,
    ssubscribe,
)

logger = logging.getLogger("jobq.worker")

#: Longest wait for a free pool slot before the subscriptions are read
#: again (a cancel must reach a running job within about 100 ms).
SLOT_WAIT = 0.1

class _Node:
    """One node's subscription: its client, pubsub, and shards by channel."""

    def __init__(self, client: Any, channels: dict[bytes, tuple[int, bool]]) -> None:
        self.client = client
        self.pubsub = client.pubsub()
        self.channels = channels  # channel -> (shard, is the cancel channel)

    def subscribe(self, stopping: Callable[[], bool]) -> None:
        ssubscribe(self.pubsub, self.channels, stopping, "the shards' channels")

    def socket(self) -> Any:
        return getattr(self.pubsub.connection, "_sock", None)

    def close(self) -> None:
        close_subscription(self.client, self.pubsub)


def _kind(message: dict[str, Any]) -> str:
    kind = message["type"]
    return kind.decode() if isinstance(kind, bytes) else str(kind)


class ShardFetcher(Fetcher):
    """Take jobs from every shard while the gate is open and a slot is free
    (``Fetcher``'s life cycle, its own steps)."""

    def __init__(self, context: ShardedContext, **kwargs: Any) -> None:
        super().__init__(context, **kwargs)
        self._context: ShardedContext = context
        count = context.count
        self._nodes: list[_Node] = []
        self._signalled: set[int] = set(range(count))
        self._due: dict[int, float] = {}
        self._last = count - 1  # the shard taken from last
        self._looked = time.monotonic()
        self._limited_until = 0.0
        self._shard_unsure: dict[int, TakeArgs] = {}  # by shard: a take whose reply was lost
        # by shard: one whose take failed for now (its slot moving, its node
        # away) rests until then (monotonic); the others are taken from meanwhile
        self._resting: dict[int, float] = {}
        self._backoffs: dict[int, RetryBackoff] = {}
        self._told_ready = False

    def stop(self) -> None:
        """Stop taking; the thread ends within one wait (at most ``BLOCK_CAP``)."""
        self._loop.stop()

    def interrupt(self) -> None:
        """Cut the subscriptions under a read that does not return."""
        for node in list(self._nodes):
            cut_client(node.client)

    # -- subscriptions ------------------------------------------------------

    def _subscribe(self) -> None:
        client = self._context.client
        context = self._context
        context.store_count()
        groups: dict[Any, dict[bytes, tuple[int, bool]]] = {}
        if isinstance(client, RedisCluster):
            for shard, keys in enumerate(self._context.shard_keys):
                node = client.get_node_from_key(keys.base)  # type: ignore[no-untyped-call]
                group = groups.setdefault(node.name, {})
                group[keys.marker.encode()] = (shard, False)
                group[f"{keys.base}cancels".encode()] = (shard, True)
            nodes = {n.name: n for n in client.get_nodes()}  # type: ignore[no-untyped-call]
            clients = {name: nodes[name].redis_connection for name in groups}
        else:
            group = groups.setdefault("", {})
            for shard, keys in enumerate(self._context.shard_keys):
                group[keys.marker.encode()] = (shard, False)
                group[f"{keys.base}cancels".encode()] = (shard, True)
            clients = {"": client}
        for name, channels in groups.items():
            node = _Node(blocking_client(clients[name], self._name), channels)
            self._nodes.append(node)
            if self._loop.stopping:  # stopped before the client was there to cut
                raise ConnectionError("the worker is closing")
            node.subscribe(lambda: self._loop.stopping)
        # whatever was published before the subscriptions is looked for now
        self._signalled = set(range(self._context.count))
        self._looked = time.monotonic()
        check_marks(self._context, self._table)

    def _listen(self, wait: float) -> None:
        """Read wake-ups for at most ``wait`` seconds (every node's socket at once)."""
        got = self._drain()
        if got or wait <= 0:
            return
        if len(self._nodes) == 1:
            message = next_message(self._nodes[0].pubsub, wait)
            if message is not None:
                self._handle(self._nodes[0], message)
            return
        sockets = [s for s in (node.socket() for node in self._nodes) if s is not None]
        if sockets:
            select.select(sockets, [], [], wait)
            self._drain()

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
        kind = _kind(message)
        if kind == "sunsubscribe":  # the slot moved: subscribe where it lives now
            raise ConnectionError("a shard's slot moved; subscribing again")
        if kind != "smessage":
            return
        channel = message["channel"]
        shard, cancels = node.channels.get(
            channel if isinstance(channel, bytes) else str(channel).encode(), (-1, False)
        )
        if shard < 0:
            return
        if cancels:
            self._table.cancel_hinted(message["data"])
        else:
            self._signalled.add(shard)

    # -- the loop -----------------------------------------------------------

    def _failed(self, exc: Exception) -> None:
        self._close()
        client = self._context.client
        if isinstance(client, RedisCluster):
            try:  # a failover or a moved slot: learn the new map
                client.nodes_manager.initialize()
            except Exception as refresh:
                logger.debug("could not refresh the cluster's slot map: %s", refresh)
        self._on_error(exc)

    def _step(self) -> float:
        if not self._gate.wait_open(BLOCK_CAP):
            return 0.0
        if not self._nodes:
            self._subscribe()
            reached()
        now = time.monotonic()
        if now - self._looked >= self._drain_delay:
            self._signalled = set(range(self._context.count))
            self._looked = now
        for shard, due in list(self._due.items()):
            if due <= now:
                del self._due[shard]
                self._signalled.add(shard)
        for shard, until in list(self._resting.items()):
            if until <= now:
                del self._resting[shard]
        ready = self._pick()
        if ready is not None and now >= self._limited_until:
            return self._take(ready)
        waits = [BLOCK_CAP, self._looked + self._drain_delay - now, *(
            due - now for due in self._due.values()
        ), *(until - now for until in self._resting.values())]
        if ready is not None:
            waits.append(self._limited_until - now)
        self._listen(max(0.0, min(waits)))
        return 0.0

    def _pick(self) -> int | None:
        """The next shard to take from, in turn after the last one: a take
        whose reply was lost first (it is sent again); none resting."""
        for shard in self._shard_unsure:
            if shard not in self._resting:
                return shard
        count = self._context.count
        for step in range(1, count + 1):
            shard = (self._last + step) % count
            if shard in self._signalled and shard not in self._resting:
                return shard
        return None

    def _take(self, shard: int) -> float:
        if not self._slots.acquire(timeout=SLOT_WAIT):
            self._drain()  # every slot busy: cancels still arrive at once
            return 0.0
        if not self._gate.begin():  # paused or closing since the slot came
            self._slots.release()
            return 0.0
        held = False
        try:
            unsure = self._shard_unsure.get(shard)
            take = unsure or self._take_args()
            if unsure is None and take.limit_max:
                wait_ms = self._limit(take)
                if wait_ms:
                    self._limited_until = time.monotonic() + wait_ms / 1000.0
                    return 0.0
            take = take._replace(limit_max=0, limit_ms=0)
            self._shard_unsure[shard] = take  # until its reply is read
            base = self._context.shard_keys[shard].base
            scripts = WorkerScripts(
                lambda script, *argv: self._context.scripts.run(script, base, *argv)
            )
            try:
                reply = scripts.take(take, retried=unsure is not None)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                self._rest(shard, exc)
                return 0.0
            del self._shard_unsure[shard]
            backoff = self._backoffs.pop(shard, None)
            if backoff is not None:
                logger.info("%s: shard %d answers again", self._name, shard)
            if reply.taken is not None:
                job_id, token, record = reply.taken
                attempt = Attempt(job_id, token, record)
                self._table.add(attempt)  # under lock renewal from now on
                held = True
                self._last = shard
                self._hand_off(attempt)
            else:
                self._signalled.discard(shard)
                if reply.next_delay_ms >= 0:
                    self._due[shard] = time.monotonic() + reply.next_delay_ms / 1000.0
        finally:
            self._gate.end()
            if not held:
                self._slots.release()
        if not self._told_ready:
            self._told_ready = True
            self._on_ready()
        return 0.0

    def _rest(self, shard: int, exc: Exception) -> None:
        """A take from ``shard`` failed for now (its slot moving, its node
        away): the shard rests a while (backing off), the others go on. A
        take whose reply may have been lost is sent again when it is tried
        next, as the same take (its job comes back if it took one)."""
        backoff = self._backoffs.setdefault(shard, RetryBackoff(cap=1.0))
        wait = backoff.next()
        self._resting[shard] = time.monotonic() + wait
        logger.warning("%s: shard %d: %s (%d in a row); the other shards go on, it is "
                       "tried again in %.2f s", self._name, shard, brief(exc),
                       backoff.failures, wait)
        self._on_error(exc)

    def _limit(self, take: TakeArgs) -> int:
        """Count one take in the limiter's window (on the logical queue's
        base, shared by every shard); ms to wait when the window is full."""
        key = self._context.keys.base + "limiter"
        # one round trip, not a transaction (a cluster client of redis-py 5
        # has none): a window that ended between the SET and the INCR left
        # a key without a ttl, given one here
        pipe = self._context.client.pipeline(transaction=False)
        pipe.set(key, 0, px=take.limit_ms, nx=True)
        pipe.incr(key)
        pipe.pttl(key)
        _, taken, ttl = pipe.execute()
        if int(ttl) == -1:
            self._context.client.pexpire(key, take.limit_ms)
            ttl = take.limit_ms
        if int(taken) <= take.limit_max:
            return 0
        return max(1, int(ttl))

    def _close(self) -> None:
        nodes, self._nodes = self._nodes, []
        for node in nodes:
            node.close()
