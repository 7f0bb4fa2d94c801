"""A real Redis Cluster (or Valkey Cluster) on loopback, for tests and benchmarks.

Every node is a :class:`jobq.testing.RedisServer` started in cluster mode;
the slots are spread evenly over the masters, and each master may get
replicas. Exposed as ``jobq.testing.LocalCluster``.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import redis
from redis.cluster import ClusterNode, RedisCluster

from .testing import RedisServer, find_server_binary

__all__ = ["LocalCluster", "cluster_port"]

_SLOTS = 16384


def cluster_port() -> int:
    """A free loopback port for a cluster node: its cluster bus listens
    10,000 ports higher, which must be free too and below 65,536."""
    for _ in range(200):
        port = random.randint(20_000, 45_000)
        with contextlib.ExitStack() as stack:
            try:
                for p in (port, port + 10_000):
                    sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                    sock.bind(("127.0.0.1", p))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port pair for a cluster node")


def _pause(seconds: float) -> None:
    # polling a cluster's gossip has nothing to wait on but the clock
    threading.Event().wait(seconds)


class LocalCluster:
    """A cluster of ``masters`` masters with ``replicas`` replicas each.

    Args:
        masters: how many masters share the slots.
        replicas: replicas per master.
        binary: the server executable (default: :func:`find_server_binary`).
        node_timeout: ``cluster-node-timeout`` in ms; a failover starts about
            that long after a master dies.
    """

    def __init__(
        self,
        masters: int = 3,
        replicas: int = 0,
        *,
        binary: str | None = None,
        node_timeout: int = 1000,
    ) -> None:
        if masters < 1 or replicas < 0:
            raise ValueError("a cluster needs at least one master")
        self._binary = binary or find_server_binary()
        self._node_timeout = node_timeout
        self._count = (masters, replicas)
        self.servers: list[RedisServer] = []
        self._ids: dict[int, str] = {}

    @property
    def url(self) -> str:
        """A ``redis+cluster://`` URL naming a live node of the cluster."""
        for server in self.servers:
            if server.is_running():
                return f"redis+cluster://127.0.0.1:{server.port}"
        raise RuntimeError("no node of the cluster is running")

    def __repr__(self) -> str:
        ports = ",".join(str(s.port) for s in self.servers if s.is_running())
        return f"<LocalCluster nodes={ports or 'none'}>"

    def start(self, timeout: float = 30.0) -> LocalCluster:
        """Start every node, assign the slots, join them, and wait until the
        cluster is ``ok`` on every node."""
        masters, replicas = self._count
        args = (
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(self._node_timeout),
            "--cluster-require-full-coverage", "yes",
        )  # fmt: skip
        try:
            for _ in range(masters * (1 + replicas)):
                server = RedisServer(self._binary, port=cluster_port(), extra_args=args)
                self.servers.append(server.start())
            self._form(masters, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _form(self, masters: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        first = self.servers[0]
        for i, server in enumerate(self.servers):
            with server.client() as client:
                self._ids[server.port] = client.execute_command("CLUSTER", "MYID").decode()
                if i < masters:
                    low = i * _SLOTS // masters
                    high = (i + 1) * _SLOTS // masters - 1
                    client.execute_command("CLUSTER", "ADDSLOTSRANGE", low, high)
                    client.execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
                if server is not first:
                    client.execute_command("CLUSTER", "MEET", "127.0.0.1", first.port)
        self._wait(lambda info: int(info["cluster_known_nodes"]) == len(self.servers), deadline)
        for i, server in enumerate(self.servers[masters:]):
            master = self.servers[i % masters]
            with server.client() as client:
                while True:
                    try:
                        client.execute_command("CLUSTER", "REPLICATE", self._ids[master.port])
                        break
                    except redis.ResponseError:  # the master is not known there yet
                        if time.monotonic() > deadline:
                            raise
                        _pause(0.05)
        self._wait(lambda info: info["cluster_state"] == "ok", deadline)
        for server in self.servers[masters:]:  # a replica must have synced to fail over
            with server.client() as client:
                while client.info("replication").get("master_link_status") != "up":
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"replica {server.port} did not sync in time")
                    _pause(0.05)

    def _wait(self, check: Any, deadline: float) -> None:
        for server in self.servers:
            if not server.is_running():
                continue
            with server.client() as client:
                while True:
                    try:
                        if check(client.cluster("info")):
                            break
                    except redis.RedisError:
                        pass
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{self!r} did not converge in time")
                    _pause(0.05)

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Wait until every live node reports ``cluster_state:ok``."""
        self._wait(lambda info: info["cluster_state"] == "ok", time.monotonic() + timeout)

    def client(self, **kwargs: Any) -> RedisCluster:
        """A new ``RedisCluster`` client; the caller closes it."""
        nodes = [
            ClusterNode("127.0.0.1", s.port)  # type: ignore[no-untyped-call]
            for s in self.servers
            if s.is_running()
        ]
        return RedisCluster(startup_nodes=nodes, **kwargs)

    def server_of_slot(self, slot: int) -> RedisServer:
        """The live master that serves ``slot`` now."""
        for server in self.servers:
            if not server.is_running():
                continue
            with server.client() as client:
                for low, high, master, *_ in client.execute_command("CLUSTER", "SLOTS"):
                    if low <= slot <= high:
                        port = int(master[1])
                        return next(s for s in self.servers if s.port == port)
        raise LookupError(f"no live node serves slot {slot}")

    def masters(self) -> list[RedisServer]:
        """The live masters."""
        out = []
        for server in self.servers:
            if server.is_running():
                with server.client() as client:
                    if client.info("replication")["role"] == "master":
                        out.append(server)
        return out

    def node_id(self, server: RedisServer) -> str:
        """The cluster node id of ``server``."""
        return self._ids[server.port]

    def migrate_slot(self, slot: int, target: RedisServer, batch: int = 100) -> int:
        """Move ``slot`` and its keys to ``target`` (as ``redis-cli --cluster
        reshard`` does); return how many keys moved."""
        source = self.server_of_slot(slot)
        if source is target:
            return 0
        src_id, dst_id = self.node_id(source), self.node_id(target)
        moved = 0
        with source.client() as src, target.client() as dst:
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
            while True:
                keys = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch)
                if not keys:
                    break
                src.execute_command(
                    "MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "REPLACE", "KEYS", *keys
                )
                moved += len(keys)
            for server in self.masters():
                with server.client() as client:
                    client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        return moved

    def stop(self) -> None:
        """Stop every node (idempotent)."""
        for server in self.servers:
            server.stop()

    def __iter__(self) -> Iterator[RedisServer]:
        return iter(self.servers)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
