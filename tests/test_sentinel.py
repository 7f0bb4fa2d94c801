"""Redis Sentinel: a ``redis+sentinel://`` URL or a ``Sentinel.master_for``
client, on a private master, replica and Sentinel (tests/sentinels.py);
failovers under load are in tests/faults/test_sentinel_failover.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from redis.sentinel import Sentinel, SentinelConnectionPool

from jobq import Queue, QueueEvents, Worker
from jobq.cli import main
from jobq.connection import describe, resolve
from tests.polling import until
from tests.sentinels import SERVICE, SentinelSet, free_port, running

pytestmark = pytest.mark.sentinel
WAIT = 20.0


@pytest.fixture(scope="module")
def sentinels() -> Iterator[SentinelSet]:
    """One set for the tests that do not fail it over."""
    with running() as group:
        yield group


def names_on(port: int) -> list[str]:
    with redis.Redis(port=port) as client:
        return [c["name"] for c in client.client_list() if c["name"].startswith("jobq")]


@pytest.mark.parametrize("query", ["", "?protocol=3"], ids=["resp2", "resp3"])
def test_a_sentinel_url_runs_jobs_and_waits_on_the_master(
    sentinels: SentinelSet, queue_name: str, capsys: pytest.CaptureFixture[str], query: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = sentinels.url + query
    with Queue(queue_name, connection=url) as q, \
            Worker(queue_name, lambda job: job.data * 2, connection=url) as worker:
        worker.start()
        assert q.add("double", 21).wait_until_finished(timeout=WAIT) == 42
        pool = q._context.redis.connection_pool
        assert isinstance(pool, SentinelConnectionPool)
        protocol = pool.connection_kwargs.get("protocol")  # redis-py 5.0 keeps the URL's text
        assert (int(protocol) if protocol else 2) == (3 if query else 2)
        # the worker's own connections (fetch, reader) are the master's
        master = sentinels.master_port()
        assert any(name.startswith("jobq-worker") for name in names_on(master))
        assert not names_on(next(s.port for s in sentinels.servers if s.port != master))
    # no thread of theirs failed (redis-py 5.0.0's Sentinel connections
    # broke RESP3 subscriptions: the cancel hints' thread)
    assert not [r.getMessage() for r in caplog.records if r.name.startswith("jobq")]
    assert main(["info", "--url", url, "--json", queue_name]) == 0
    assert '"completed": 1' in capsys.readouterr().out


def test_a_client_from_sentinel_master_for_is_accepted(
    sentinels: SentinelSet, queue_name: str
) -> None:
    manager = Sentinel([("127.0.0.1", sentinels.port)], socket_timeout=5)
    client = manager.master_for(SERVICE, socket_timeout=5)
    try:
        with Queue(queue_name, connection=client) as q, \
                QueueEvents(queue_name, connection=client) as events, \
                Worker(queue_name, lambda job: job.data + 1, connection=client) as worker:
            worker.start()
            assert q.add("inc", 1).wait_until_finished(events, timeout=WAIT) == 2
            where = describe(client)
            assert where == f"redis+sentinel://127.0.0.1:{sentinels.port}/{SERVICE}/0"
        assert client.ping()  # the caller's client stays usable
    finally:
        client.close()
        for sentinel in manager.sentinels:
            sentinel.close()


def test_sentinel_urls_are_parsed_without_connecting() -> None:
    client, owned = resolve(
        "rediss+sentinel://app:s%40cret@10.0.0.1:26380,[::1],sentinel-2/orders/3"
        "?socket_timeout=2.5&sentinel_password=watch&ssl_cert_reqs=none")
    try:
        pool = client.connection_pool
        assert owned and isinstance(pool, SentinelConnectionPool)
        assert pool.service_name == "orders"
        assert "SSL" in pool.connection_class.__name__
        kwargs = pool.connection_kwargs
        assert (kwargs["username"], kwargs["password"], kwargs["db"]) == ("app", "s@cret", 3)
        assert kwargs["socket_timeout"] == 2.5
        watchers = [s.connection_pool.connection_kwargs for s in pool.sentinel_manager.sentinels]
        assert [(w["host"], w["port"]) for w in watchers] == [
            ("10.0.0.1", 26380), ("::1", 26379), ("sentinel-2", 26379)]
        assert {w.get("password") for w in watchers} == {"watch"}
        assert {w.get("socket_timeout") for w in watchers} == {2.5}
        assert describe(client) == (
            "rediss+sentinel://10.0.0.1:26380,[::1]:26379,sentinel-2:26379/orders/3")
    finally:
        client.close()
    for bad in ("redis+sentinel://h:26379", "redis+sentinel://h:port/svc",
                "redis+sentinel://h/svc/db", "redis+sentinel:///svc", "redis+sentinel://h/a/1/2"):
        with pytest.raises(ValueError, match="form is redis\\+sentinel://"):
            resolve(bad)
    with pytest.raises(ValueError, match="decode"):
        resolve("redis+sentinel://h/svc?decode_responses=True")


def test_no_master_is_said_in_one_short_line(
    queue_name: str, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    # with no Sentinel answering, redis-py appends each Sentinel client's
    # repr (over a thousand characters) to MasterNotFoundError's message
    port = free_port()  # nothing listens there
    url = f"redis+sentinel://127.0.0.1:{port}/orders"
    with Queue(queue_name, connection=url) as q, pytest.raises(redis.ConnectionError) as caught:
        q.add("x", 1)
    assert str(caught.value) == (
        f"cannot reach the Redis server at redis+sentinel://127.0.0.1:{port}/orders/0: "
        "No master found for 'orders'")
    # a worker's threads retry, in short lines, and end with close() (a
    # Sentinel that does not answer is not retried inside redis-py for
    # seconds: the test's thread-leak guard checks that none is left)
    with Worker(queue_name, lambda job: None, connection=url) as worker:
        worker.start()
        until(lambda: sum("No master found" in r.getMessage() for r in caplog.records) >= 3,
              timeout=WAIT)
    said = [r.getMessage() for r in caplog.records if "No master found" in r.getMessage()]
    assert all(len(line) < 300 for line in said), said
    assert not [r for r in caplog.records if "did not end in time" in r.getMessage()]
    # and the command line's error (it carried the reprs)
    capsys.readouterr()
    assert main(["info", "--url", url]) == 3
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"jobq: cannot reach Redis at {url}: No master found for 'orders'\n")


def test_a_worker_whose_sentinels_refuse_the_login_says_so_at_start(
    sentinels: SentinelSet, queue_name: str
) -> None:
    """redis-py turns the Sentinels' refusal into "No master found": the
    start waited 10 s, then its threads retried the login for ever."""
    url = f"{sentinels.url}?sentinel_username=nobody&sentinel_password=hunter2"
    worker = Worker(queue_name, lambda job: None, connection=url)
    with pytest.raises(redis.exceptions.AuthenticationError,
                       match="the Sentinels of .* refused the login") as refused:
        worker.start()
    assert "hunter2" not in str(refused.value)
    assert not worker.is_running()
    worker.close()
