"""A background loop whose connection is dropped after it was made again
retries at once: the backoff is for a server that cannot be reached, not
for one that accepted the loop and later closed its connection (a proxy's
idle timeout, CLIENT KILL, a failover). Each loop used to count every
drop during its blocking read as one more failure in a row, so that a
connection dropped a few times while idle left the reader (or the worker's
fetch or cancel loop) waiting seconds before it read again."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest
import redis

from jobq import Queue, QueueEvents, ShardedQueue, Worker
from tests.polling import until

WAIT = 20.0
DROPS = 6


def _blocked(admin: redis.Redis, name: str, command: str) -> dict[str, Any] | None:
    """The connection named ``name`` once it is back in its blocking read."""
    for client in admin.client_list():
        if client["name"] == name and client["cmd"] == command:
            return client
    return None


def _in_a_row(records: list[logging.LogRecord], who: str) -> list[int]:
    counts = []
    for record in records:
        message = record.getMessage()
        found = re.search(r"\((\d+) in a row\)", message)
        if who in message and found:
            counts.append(int(found.group(1)))
    return counts


@pytest.fixture
def admin(redis_server: Any) -> Iterator[redis.Redis]:
    client = redis_server.client(decode_responses=True)
    try:
        yield client
    finally:
        client.close()


def _component(case: str, queue: Queue, redis_url: str) -> tuple[
        AbstractContextManager[Any], Callable[[], Any], str, str, str]:
    """What to open and how to start it, the name its connection carries,
    the command it blocks in, and the name its failures are logged under."""
    if case == "events reader":
        events = QueueEvents(queue.name, connection=redis_url)
        return (events, lambda: events.wait_until_ready(WAIT), f"jobq-events-{queue.name}",
                "xread", f"events reader of {queue.name!r}")
    worker = Worker(queue.name, lambda job: None, connection=redis_url)
    if case == "worker fetch":
        return (worker, worker.start, f"jobq-fetch-{worker.name}", "bzpopmin",
                f"jobq-fetch-{queue.name}")
    return (worker, worker.start, f"jobq-cancel-{queue.name}", "ssubscribe",
            f"jobq-cancel-{queue.name}")


@pytest.mark.parametrize("case", ["events reader", "worker fetch", "worker cancel"])
def test_a_connection_dropped_after_it_was_made_again_is_retried_at_once(
    case: str, queue: Queue, redis_url: str, admin: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if case == "worker fetch" and "+cluster://" in redis_url:
        pytest.skip("a cluster client sends a dropped blocking pop again itself")
    queue.add("x")  # a queue in stream mode (see test_events for one not yet used)
    component, start, name, command, who = _component(case, queue, redis_url)
    with caplog.at_level(logging.WARNING, logger="jobq"), component:
        start()
        for drop in range(1, DROPS + 1):
            client = until(lambda: _blocked(admin, name, command), WAIT)
            assert admin.client_kill_filter(_id=client["id"]) == 1
            until(lambda d=drop: len(_in_a_row(caplog.records, who)) >= d, WAIT)
        until(lambda: _blocked(admin, name, command), WAIT)  # and back once more
        counts = _in_a_row(caplog.records, who)
    assert len(counts) == DROPS
    assert counts == [1] * DROPS  # each drop the first failure in a row


def test_a_read_refused_after_connecting_still_backs_off(
    queue: Queue, redis_server: Any, redis_url: str, admin: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Only a dropped connection starts the count again: a read the server
    refuses each time (an ACL without XREAD) waits longer each time, as
    before, instead of logging a warning per attempt."""
    if "+cluster://" in redis_url:
        pytest.skip("one node's ACL")
    admin.acl_setuser("jobq-no-xread", enabled=True, nopass=True, keys=["*"], channels=["*"],
                      commands=["+@all", "-xread"])
    try:
        queue.add("x")
        url = f"redis://jobq-no-xread@127.0.0.1:{redis_server.port}/0"
        who = f"events reader of {queue.name!r}"
        with caplog.at_level(logging.WARNING, logger="jobq"), \
                QueueEvents(queue.name, connection=url) as events:
            events.wait_until_ready(WAIT)
            counts = until(lambda: [n for n in _in_a_row(caplog.records, who) if n == 3], WAIT)
        assert counts and _in_a_row(caplog.records, who)[:3] == [1, 2, 3]
    finally:
        admin.acl_deluser("jobq-no-xread")


@pytest.mark.parametrize("sharded", [False, True])
def test_a_wait_whose_reader_may_not_run_a_command_raises_it(
    queue: Queue, redis_server: Any, redis_url: str, admin: redis.Redis, sharded: bool
) -> None:
    """A user one permission short of the guide's lines (no XREVRANGE, which
    the reader's start needs): a wait timed out, or without a timeout
    blocked for ever, the reader's NoPermissionError only logged. It is
    raised as an unreachable server's error is."""
    if "+cluster://" in redis_url:
        pytest.skip("one node's ACL")
    admin.acl_setuser("jobq-no-xrevrange", enabled=True, nopass=True, keys=["*"],
                      channels=["*"], commands=["+@all", "-xrevrange"])
    try:
        url = f"redis://jobq-no-xrevrange@127.0.0.1:{redis_server.port}/0"
        with (ShardedQueue(queue.name + "-s", shards=2, connection=url) if sharded
              else Queue(queue.name, connection=url)) as producer:
            job = producer.add("x")  # the stream is there: the reader looks at its end
            with pytest.raises(redis.exceptions.NoPermissionError,
                               match=r"refused a command: .*xrevrange.*security\.md"):
                job.wait_until_finished(timeout=WAIT)
            if sharded:
                producer.obliterate(force=True)
    finally:
        admin.acl_deluser("jobq-no-xrevrange")


def test_a_command_a_script_may_not_run_is_a_no_permission_error(
    queue: Queue, redis_server: Any, redis_url: str, admin: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A script's command refused by the user's ACL came back as a bare
    ResponseError ("The user executing the script can't run this
    command..."), which ``except NoPermissionError`` missed, naming neither
    what to do nor, on Redis, the command."""
    if "+cluster://" in redis_url:
        pytest.skip("one node's ACL")
    queue.add("x")  # the functions loaded by a user who may
    admin.acl_setuser("jobq-no-hset", enabled=True, nopass=True, keys=["*"], channels=["*"],
                      commands=["+@all", "-hset"])
    try:
        url = f"redis://jobq-no-hset@127.0.0.1:{redis_server.port}/0"
        with Queue(queue.name, connection=url) as producer, \
                pytest.raises(redis.exceptions.NoPermissionError,
                              match=r"^this user's ACL refused a command, key or channel that "
                                    r"jobq's 'add' call uses .*docs/guide/security\.md"):
            producer.add("y")
    finally:
        admin.acl_deluser("jobq-no-hset")
    # a worker's take (its own connection, past Scripts.run), and a key refused
    admin.acl_setuser("jobq-no-rpop", enabled=True, nopass=True, keys=["*"], channels=["*"],
                      commands=["+@all", "-rpop"])  # only its take's script pops
    base = f"jobq:{{{queue.name}}}:"  # all keys but the job id counter, which add's script bumps
    admin.acl_setuser("jobq-no-id-key", enabled=True, nopass=True, channels=["*"],
                      keys=["~jobq:[^{]*", f"~{base}", f"~{base}[^i]*", f"~{base}i[^d]*"],
                      commands=["+@all"])
    try:
        url = f"redis://jobq-no-rpop@127.0.0.1:{redis_server.port}/0"
        with caplog.at_level(logging.WARNING, logger="jobq"), \
                Worker(queue.name, lambda job: None, connection=url):
            said = until(lambda: [r.getMessage() for r in caplog.records
                                  if "jobq's 'moveToActive' call uses" in r.getMessage()],
                         WAIT)
        assert said and "NoPermissionError" in said[0], said
        url = f"redis://jobq-no-id-key@127.0.0.1:{redis_server.port}/0"
        with Queue(queue.name, connection=url) as producer, \
                pytest.raises(redis.exceptions.NoPermissionError,
                              match=r"^this user's ACL refused .* jobq's 'add' call uses .*key"):
            producer.add("y")
    finally:
        admin.acl_deluser("jobq-no-rpop", "jobq-no-id-key")


def test_the_end_of_an_outage_is_logged_as_its_start_was(
    queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker's loops logged each failure while the server was away and
    nothing once it was back: the log never said the outage ended."""
    from jobq.testing import RedisServer, find_server_binary

    def said(text: str) -> list[str]:
        return [r.getMessage() for r in caplog.records
                if text in r.getMessage() and f"jobq-fetch-{queue_name}" in r.getMessage()]

    with RedisServer(find_server_binary()) as server, \
            caplog.at_level(logging.INFO, logger="jobq"):
        worker = Worker(queue_name, lambda job: job.data, connection=server.url)
        try:
            worker.start()
            server.shutdown()
            until(lambda: said("in a row"), WAIT)
            assert not said("working again")
            server.restart()
            lines = until(lambda: said("working again after"), WAIT)
            assert re.search(r"after \d+ failure\(s\) in a row", lines[0]), lines
            with Queue(queue_name, connection=server.url) as queue:
                assert queue.add("x", 7).wait_until_finished(timeout=WAIT) == 7
        finally:
            worker.close()


def test_a_loops_connection_lost_while_idle_is_reported_not_made_again() -> None:
    """A blocking loop's connection closed by the server while it sat in
    its pool (between the events reader's look at the stream and its next
    read) was connected again, silently, when the pool lent it next: the
    reader never looked for the events trimmed meanwhile nor re-checked its
    waiters (a wait ran out its timeout). The loss is an error now, which
    the loop answers by connecting again with a new client."""
    from jobq.connection import blocking_client, take_connection
    from jobq.testing import RedisServer, find_server_binary

    name = "jobq-test-loop"
    with RedisServer(find_server_binary()) as server, \
            server.client(decode_responses=True) as admin, server.client() as client:
        blocking = blocking_client(client, name)
        try:
            assert blocking.ping()
            pool = blocking.connection_pool
            connection = take_connection(pool)  # taken, as the reader holds it
            (entry,) = [c for c in admin.client_list() if c.get("name") == name]
            admin.client_kill_filter(_id=entry["id"])

            def closed() -> bool:
                try:
                    return bool(connection.can_read(timeout=0))
                except (redis.ConnectionError, OSError):
                    return True

            assert until(closed, 10.0)
            pool.release(connection)  # given back for a look at the stream: idle, lost
            with pytest.raises(redis.ConnectionError):
                blocking.ping()
            assert [c for c in admin.client_list() if c.get("name") == name] == []
        finally:
            blocking.close()
            blocking.connection_pool.disconnect()
