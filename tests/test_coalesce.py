"""The script calls of concurrent threads share one connection and go out
together (jobq/_coalesce.py): each caller gets its own reply, an error
reply or a dead connection fails no call that could have succeeded.

The client is a plain one to the session's server (in the cluster pass, to
the node that owns every slot): coalescing is a plain client's path.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from jobq import Queue

THREADS = 24
ADDS = 40
WAIT = 30.0


@pytest.fixture
def named(redis_server: object, queue_name: str) -> Iterator[tuple[redis.Redis, str]]:
    """A plain client whose connections carry a name of the test's own."""
    name = f"co-{queue_name[-8:]}"
    resp3 = {"protocol": 3} if os.environ.get("JOBQ_TEST_RESP3") == "1" else {}
    client = redis_server.client(client_name=name, **resp3)  # type: ignore[attr-defined]
    try:
        yield client, name
    finally:
        client.close()


def connections_named(client: redis.Redis, name: str) -> int:
    return sum(1 for c in client.client_list() if c["name"] == name)


def add_from_threads(queue: Queue, threads: int, adds: int) -> dict[tuple[int, int], str]:
    """Add ``adds`` jobs from each of ``threads`` threads started together;
    return each job's id by its data."""
    ids: dict[tuple[int, int], str] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(threads)
    lock = threading.Lock()

    def produce(t: int) -> None:
        try:
            start.wait(WAIT)
            for i in range(adds):
                job = queue.add("x", [t, i])
                with lock:
                    ids[(t, i)] = job.id
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    workers = [threading.Thread(target=produce, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(WAIT)
    assert not errors, errors[0]
    assert not any(w.is_alive() for w in workers)
    return ids


def test_concurrent_adds_share_one_connection_and_get_their_own_jobs(
    named: tuple[redis.Redis, str], queue_name: str
) -> None:
    client, name = named
    with Queue(queue_name, connection=client) as queue:
        queue.add("x", "first")  # the queue's first-use setup is done
        before = connections_named(client, name)
        ids = add_from_threads(queue, THREADS, ADDS)
        # every add went over one connection: the pool would have opened
        # one per thread in flight
        assert connections_named(client, name) == before
        assert len(set(ids.values())) == THREADS * ADDS
        for (t, i), job_id in ids.items():
            job = queue.get_job(job_id)
            assert job is not None and job.data == [t, i]
        assert queue.count() == THREADS * ADDS + 1
        queue.obliterate(force=True)


def test_calls_find_the_library_again_after_a_flush(
    named: tuple[redis.Redis, str], queue_name: str
) -> None:
    client, _ = named
    with Queue(queue_name, connection=client) as queue:
        queue.add("x", "first")
        client.function_flush()  # every call of the next batches is refused
        ids = add_from_threads(queue, 8, 5)
        assert queue.count() == 41 and len(set(ids.values())) == 40
        queue.obliterate(force=True)


def test_a_connection_closed_while_idle_is_opened_again_before_a_call(
    named: tuple[redis.Redis, str], queue_name: str
) -> None:
    client, name = named
    with Queue(queue_name, connection=client) as queue:
        queue.add("x", 1)
        # the server closes the idle connection (a timeout, a restart, a kill)
        own = client.client_id()
        killed = [c for c in client.client_list() if c["name"] == name and int(c["id"]) != own]
        assert killed
        for c in killed:
            client.client_kill_filter(_id=c["id"])
        job = queue.add("x", 2)  # not refused: nothing was sent on the dead socket
        assert queue.get_job(job.id).data == 2  # type: ignore[union-attr]
        assert queue.count() == 2
        queue.obliterate(force=True)


def test_a_closed_queue_gives_its_connection_back(
    named: tuple[redis.Redis, str], queue_name: str
) -> None:
    client, name = named
    pool = client.connection_pool
    with Queue(queue_name, connection=client) as queue:
        add_from_threads(queue, 4, 5)
        queue.obliterate(force=True)
    # the caller's client keeps its pool; nothing of jobq's stays checked out
    assert len(pool._in_use_connections) == 0  # type: ignore[attr-defined]
    assert connections_named(client, name) >= 1


def test_the_queues_of_one_client_share_its_connection(
    redis_server: Any, queue_name: str
) -> None:
    # one connection each would exhaust a pool (redis-py 6's default is 100):
    # a dashboard, or a process with many queues, then failed every call
    resp3 = {"protocol": 3} if os.environ.get("JOBQ_TEST_RESP3") == "1" else {}
    client = redis_server.client(max_connections=20, **resp3)
    pool = client.connection_pool
    count = pool.max_connections + 5
    queues = [Queue(f"{queue_name}-{n}", connection=client) for n in range(count)]
    try:
        for queue in queues:
            assert queue.add("x").id
        assert len(pool._in_use_connections) == 1  # type: ignore[attr-defined]
        for queue in queues[1:]:
            queue.close()
        assert queues[0].add("x").id  # the last user keeps it
        assert len(pool._in_use_connections) == 1  # type: ignore[attr-defined]
    finally:
        for n, queue in enumerate(queues):
            if n == 0:
                queue.obliterate(force=True)
            queue.close()
        for n in range(1, len(queues)):
            client.delete(*client.keys(f"jobq:{{{queue_name}-{n}}}:*"))
    assert len(pool._in_use_connections) == 0  # type: ignore[attr-defined]
    client.close()


def test_a_close_during_a_batch_leaves_its_connection_to_the_batch(redis_url: str) -> None:
    """The last user's close() while a batch was being written gave the
    connection back to the pool at once: the pool could lend it to another
    caller while the batch's leader still wrote on it (reconnected by
    redis-py under it: the close had disconnected it). Now the batch
    fails, and its leader gives the connection back once done."""
    from hiredis import pack_command

    from jobq._coalesce import Coalescer
    from jobq.connection import take_connection
    from tests.held import Held

    held = Held("write")
    pool = held.pool(redis_url)
    coalescer = Coalescer(pool)
    outcome: list[Any] = []
    lent: Any = None

    def call() -> None:
        try:
            outcome.append(coalescer.call(pack_command(("PING",))))
        except redis.exceptions.ConnectionError:
            outcome.append("ConnectionError")

    try:
        assert coalescer.call(pack_command(("PING",))) in (b"PONG", "PONG")
        batch_connection = coalescer._connection
        def close_and_take() -> Any:
            coalescer.close()
            return take_connection(pool)  # what another caller gets meanwhile

        thread, lent = held.meet(call, close_and_take)
        assert lent is not batch_connection
        assert not thread.is_alive()
        assert outcome == ["ConnectionError"]
        # the batch gave its connection back: only the one lent above is out
        assert pool._in_use_connections == {lent}  # type: ignore[attr-defined]
    finally:
        if lent is not None:
            pool.release(lent)
        pool.disconnect()
