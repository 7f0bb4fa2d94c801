"""Fixtures of the fault suite: private servers, worker processes, the ledger.

Destructive scenarios (kills, restarts, maxmemory, DEBUG SLEEP) run on a
server of their own (``make_server``); the session server is never disturbed.
The ledger lives on the session server, so it survives a fault server's
crash. Each scenario records its figure with ``figure(...)``; the figures are
printed at the end of the run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from jobq.testing import RedisServer, find_server_binary
from tests.faults.harness import WAIT, Ledger, Proc

_FIGURES: list[tuple[str, str]] = []


@pytest.fixture
def figure(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Record a scenario's measured figure (printed in the run's summary)."""

    def record(text: str) -> None:
        _FIGURES.append((request.node.name, text))

    return record


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print the figures the fault scenarios measured."""
    if _FIGURES:
        terminalreporter.section("fault scenario figures")
        for test, text in _FIGURES:
            terminalreporter.write_line(f"{test}: {text}")


@pytest.fixture
def make_server() -> Iterator[Callable[..., RedisServer]]:
    """Start private servers (function scope); all stopped after the test."""
    servers: list[RedisServer] = []

    def start(**kwargs: Any) -> RedisServer:
        binary = kwargs.pop("binary", None) or find_server_binary()
        server = RedisServer(binary, **kwargs)
        servers.append(server)
        return server.start()

    try:
        yield start
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def ledger_client(redis_client: redis.Redis) -> redis.Redis:
    """A client to the session server, where every ledger lives."""
    return redis_client


@pytest.fixture
def ledger(ledger_client: redis.Redis, queue_name: str) -> Iterator[Ledger]:
    """The test queue's ledger; deleted after the test."""
    book = Ledger(ledger_client, queue_name)
    book.clear()
    try:
        yield book
    finally:
        book.clear()


@pytest.fixture
def spawn(
    redis_url: str, ledger: Ledger, tmp_path: Path
) -> Iterator[Callable[..., Proc]]:
    """Start a fault_worker process on the test's queue and wait until it fetches.

    ``spawn(url=None, **options)``: ``url`` defaults to the session server;
    options are ``concurrency``, ``lock``, ``interval``, ``max_stalled``.
    Every process is killed and reaped after the test.
    """
    procs: list[Proc] = []

    def start(url: str | None = None, wait_ready: bool = True, **options: Any) -> Proc:
        log = tmp_path / f"worker-{len(procs)}.log"
        proc = Proc(url or redis_url, redis_url, ledger.queue, log, **options)
        procs.append(proc)
        if wait_ready:
            try:
                ledger.wait_for(lambda r: r.kind == "ready" and r.pid == proc.pid, WAIT)
            except AssertionError:
                raise AssertionError(f"worker did not start:\n{proc.output()}") from None
        return proc

    try:
        yield start
    finally:
        for proc in procs:
            proc.stop()
