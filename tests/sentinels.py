"""A private Redis Sentinel set for the tests: a master, its replica and one
Sentinel watching them (quorum 1), from the same server binary as the rest
of the suite (``redis-server`` and ``valkey-server`` both run as a Sentinel
with ``--sentinel``). Everything binds loopback and is stopped by ``stop()``.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

from jobq.testing import RedisServer, find_server_binary

SERVICE = "jobq-master"
#: How long the Sentinel waits before it calls a silent master down (ms).
DOWN_AFTER_MS = 1000
START_TIMEOUT = 20.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except (redis.ConnectionError, redis.TimeoutError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} within {timeout} s")
        threading.Event().wait(0.02)


class SentinelSet:
    """A master, a replica and a Sentinel; ``url`` names the master through it."""

    def __init__(self) -> None:
        binary = find_server_binary()
        self.servers = [RedisServer(binary)]
        self._binary = binary
        self._dir = Path(tempfile.mkdtemp(prefix="jobq-sentinel-"))
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None
        self._log = self._dir / "sentinel.log"

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.port}/{SERVICE}"

    def sentinel(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=5)

    def start(self) -> SentinelSet:
        master = self.servers[0].start()
        self.servers.append(RedisServer(
            self._binary, extra_args=("--replicaof", "127.0.0.1", str(master.port))).start())
        # the Sentinel's port, chosen once the servers have theirs: chosen
        # before, it could be the one a server then took (the Sentinel did
        # not start, and the server answered "unknown command 'SENTINEL'")
        taken = {server.port for server in self.servers}
        while self.port in taken:
            self.port = free_port()
        (self._dir / "sentinel.conf").write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {self._dir}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {master.port} 1\n"
            f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {SERVICE} 10000\n"
        )
        with self._log.open("ab") as log:
            self._process = subprocess.Popen(
                [self._binary, str(self._dir / "sentinel.conf"), "--sentinel"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        replica = self.servers[1].client()
        try:
            _until(lambda: replica.info("replication").get("master_link_status") == "up",
                   START_TIMEOUT, "the replica did not sync")
        finally:
            replica.close()
        with self.sentinel() as sentinel:
            # a failover needs the Sentinel to know the replica (from the master's INFO)
            _until(lambda: sentinel.sentinel_slaves(SERVICE), START_TIMEOUT,
                   f"the Sentinel did not find the replica; log {self._log}")
        return self

    def master_port(self) -> int:
        with self.sentinel() as sentinel:
            return int(sentinel.sentinel_get_master_addr_by_name(SERVICE)[1])

    def failover(self, kill: bool) -> RedisServer:
        """Make the replica the master: SIGKILL the master (the Sentinel
        calls it down after DOWN_AFTER_MS), or ask the Sentinel to fail over
        (the old master then serves as a replica). Returns the new master
        once the Sentinel names it (and has made the old one a replica)."""
        old_port = self.master_port()
        old, new = sorted(self.servers, key=lambda s: s.port != old_port)
        if kill:
            old.kill()
        else:
            with self.sentinel() as sentinel:
                sentinel.execute_command("SENTINEL", "FAILOVER", SERVICE)
        _until(lambda: self.master_port() == new.port, START_TIMEOUT,
               f"the Sentinel did not promote the replica; log {self._log}")
        if not kill:
            # until the Sentinel turns it into a replica, the old master still
            # takes writes (which its new master's data then replaces)
            client = old.client()
            try:
                _until(lambda: client.info("replication").get("role") == "slave",
                       START_TIMEOUT, f"the old master was not made a replica; log {self._log}")
            finally:
                client.close()
        return new

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(10)
        for server in self.servers:
            server.stop()
        shutil.rmtree(self._dir, ignore_errors=True)


@contextlib.contextmanager
def running() -> Iterator[SentinelSet]:
    """A started SentinelSet, stopped on exit."""
    group = SentinelSet()
    try:
        yield group.start()
    finally:
        group.stop()
