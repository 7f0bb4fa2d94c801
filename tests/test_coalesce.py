"""The script calls of concurrent threads share one connection and go out
together (jobq/_coalesce.py): each caller gets its own reply, an error
reply or a dead connection fails no call that could have succeeded.

The client is a plain one to the session's server (in the cluster pass, to
the node that owns every slot): coalescing is a plain client's path.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

from jobq import Queue, ShardedQueue
from jobq.keys import QueueKeys
from jobq.testing import RedisServer, find_server_binary
from tests.polling import until

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


def add_from_threads(
    queue: Queue | ShardedQueue | list[Queue], threads: int, adds: int
) -> dict[tuple[int, int], str]:
    """Add ``adds`` jobs from each of ``threads`` threads started together
    (thread ``t`` to queue ``t`` of a list, round the list); return each
    job's id by its data."""
    ids: dict[tuple[int, int], str] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(threads)
    lock = threading.Lock()

    def produce(t: int) -> None:
        try:
            start.wait(WAIT)
            target = queue[t % len(queue)] if isinstance(queue, list) else queue
            for i in range(adds):
                job = target.add("x", [t, i])
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


def test_a_close_lets_the_batch_in_flight_have_its_replies(redis_url: str) -> None:
    """A close cut the connection under a batch already written: its calls
    had run (an add's job was written), yet raised ConnectionError, and a
    caller that retried on it added a second job. The close now waits for
    the batch's replies (CLOSE_GRACE at most); a call after it raises
    ClosedError, and was not sent."""
    from hiredis import pack_command

    from jobq import ClosedError
    from jobq._coalesce import Coalescer
    from tests.held import Held

    held = Held("write")
    pool = held.pool(redis_url)
    coalescer = Coalescer(pool)
    outcome: list[Any] = []
    closer = threading.Thread(target=coalescer.close, name="test-closer")

    def call() -> None:
        try:
            outcome.append(coalescer.call(pack_command(("PING",))))
        except redis.exceptions.ConnectionError as exc:
            outcome.append(exc)

    def close_meanwhile() -> None:
        closer.start()
        assert until(lambda: coalescer._closed, timeout=WAIT)  # waiting for the batch

    try:
        assert coalescer.call(pack_command(("PING",))) in (b"PONG", "PONG")
        thread, _ = held.meet(call, close_meanwhile)
        closer.join(WAIT)
        assert not thread.is_alive() and not closer.is_alive()
        assert outcome in ([b"PONG"], ["PONG"])
        with pytest.raises(ClosedError, match="nothing of it was sent"):
            coalescer.call(pack_command(("PING",)))
        assert pool._in_use_connections == set()  # type: ignore[attr-defined]
    finally:
        closer.join(WAIT)
        pool.disconnect()


def test_adds_racing_a_close_either_add_or_raise_closed_error(
    redis_url: str, queue_name: str
) -> None:
    """What a close under 16 adding threads gives them: each add returns
    its job or raises ClosedError, and every job written was returned (a
    ConnectionError for a job written made the callers that retry add it twice)."""
    from jobq import ClosedError

    queue = Queue(queue_name, connection=redis_url)
    added: list[str] = []
    errors: list[BaseException] = []

    def produce() -> None:
        while True:
            try:
                added.append(queue.add("x").id)
            except ClosedError:
                return
            except BaseException as exc:  # reported by the test
                errors.append(exc)
                return

    threads = [threading.Thread(target=produce) for _ in range(16)]
    for thread in threads:
        thread.start()
    try:
        assert until(lambda: len(added) >= 300, timeout=WAIT)
    finally:
        queue.close()
        for thread in threads:
            thread.join(WAIT)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    with Queue(queue_name, connection=redis_url) as again:
        assert again.get_job_counts("waiting")["waiting"] == len(added) == len(set(added))


def test_a_call_of_no_script_under_way_at_a_close_has_its_reply() -> None:
    """The close cut the client's connections under calls that run no
    script: a DEL of a dedup key, held up on its way, was done, yet raised
    ConnectionError. The close lets such calls end too (2 s at most)."""
    from tests.proxy import Proxy

    with RedisServer(find_server_binary()) as server, \
            Proxy(("127.0.0.1", server.port)) as proxy:
        queue = Queue("q", connection=proxy.url)
        queue.add("x", dedup={"id": "k"})
        held = proxy.delay(lambda chunk: b"DEL" in chunk and b"dedup:k" in chunk, 0.5)
        outcome: list[Any] = []

        def remove() -> None:
            try:
                outcome.append(queue.remove_dedup_key("k"))
            except Exception as exc:  # reported by the test
                outcome.append(exc)

        thread = threading.Thread(target=remove)
        thread.start()
        try:
            assert held.wait(WAIT)
            queue.close()
        finally:
            thread.join(WAIT)
        assert outcome == [True]
        with server.client() as client:
            assert client.exists("jobq:{q}:dedup:k") == 0


@pytest.fixture
def small_pool(redis_server: object) -> Iterator[redis.Redis]:
    """A plain client of two connections: the coalescer's and one more."""
    resp3 = {"protocol": 3} if os.environ.get("JOBQ_TEST_RESP3") == "1" else {}
    client = redis_server.client(max_connections=2, **resp3)  # type: ignore[attr-defined]
    try:
        yield client
    finally:
        client.close()


def test_a_burst_of_first_adds_lists_the_queue_once(redis_url: str, queue_name: str) -> None:
    """A queue is listed among the known queues after its first write. Each
    add of a burst of first adds listed it on a connection of its own: past
    the pool's size, adds whose jobs were written raised
    MaxConnectionsError (a retry would add them twice). Here the listing
    waits until every thread but the listing ones is done."""
    lock, release = threading.Lock(), threading.Event()
    counts = {"listing": 0, "done": 0}

    def count(what: str) -> None:
        with lock:
            counts[what] += 1
            if counts["listing"] + counts["done"] >= THREADS:
                release.set()

    class Listing(redis.Connection):
        def send_command(self, *args: Any, **kwargs: Any) -> None:
            if args[:1] == ("SADD",):
                count("listing")
                release.wait(WAIT)
            super().send_command(*args, **kwargs)

    url = redis_url.replace("redis+cluster://", "redis://", 1)
    pool = redis.ConnectionPool.from_url(url, connection_class=Listing, max_connections=2)
    client = redis.Redis(connection_pool=pool)  # the coalescer's connection, and one more
    errors: list[BaseException] = []
    try:
        with Queue(queue_name, connection=client) as queue:
            queue.get_job_counts()  # set up: the adds below are its first writes

            def add() -> None:
                try:
                    queue.add("x")
                except BaseException as exc:  # reported below
                    errors.append(exc)
                finally:
                    count("done")

            threads = [threading.Thread(target=add) for _ in range(THREADS)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(WAIT)
            assert not errors, errors[0]
            assert queue.count() == THREADS
            assert queue_name.encode() in client.smembers("jobq:queues")
            queue.obliterate(force=True)
    finally:
        client.close()


def test_a_burst_of_calls_on_a_server_without_the_library_loads_it_once(
    small_pool: redis.Redis, queue_name: str
) -> None:
    """Each call that found the library missing loaded it on a connection
    of its own, then went again on another: past the pool's size the calls
    failed, their jobs not written."""
    small_pool.function_flush()  # a new or restarted server
    with Queue(queue_name, connection=small_pool) as queue:
        # the threads' first adds wait for one of them to set the queue up,
        # then go out in one batch, refused
        ids = add_from_threads(queue, THREADS, 2)
        assert queue.count() == len(set(ids.values())) == THREADS * 2
        queue.obliterate(force=True)


@pytest.mark.parametrize("shape", ["queues", "sharded"])
def test_the_first_calls_of_several_queues_at_once_keep_to_a_small_pool(
    small_pool: redis.Redis, queue_name: str, shape: str
) -> None:
    """Each queue (each shard of a sharded queue) set itself up on its first
    call with a connection of the pool, and loaded the library on another:
    the first adds of several queues at once ran a pool of two out of
    connections (MaxConnectionsError, their jobs not written), 10 runs of
    10. Both now go through the connection the adds share."""
    small_pool.function_flush()  # a new or restarted server
    queues: list[Any] = (
        [Queue(f"{queue_name}-{i}", connection=small_pool) for i in range(4)] if shape == "queues"
        else [ShardedQueue(queue_name, shards=4, connection=small_pool)]
    )
    try:
        ids = add_from_threads(queues if shape == "queues" else queues[0], THREADS, 2)
        assert len(ids) == sum(q.count() for q in queues) == THREADS * 2
    finally:
        for q in queues:
            q.obliterate(force=True)
            q.close()


def test_a_sharded_queue_stores_its_settings_again_through_the_shared_connection(
    small_pool: redis.Redis, queue_name: str
) -> None:
    """After the server lost its data, a sharded queue stored its count and
    shard marks again on the pool, as on its first use: with a pool of two,
    that raced the library's load for the last connection. Each is now one
    script call through the connection the adds share."""
    with ShardedQueue(queue_name, shards=4, connection=small_pool) as queue:
        queue.add("x", "warm")
        small_pool.function_flush()  # a server that lost its data (FLUSHALL, a restart)
        metas = [shard._context.keys.meta for shard in queue.shards]
        logical = QueueKeys("jobq", queue_name).meta
        for key in (logical, *metas):  # one key a call: a cluster's slots
            small_pool.delete(key)
        ids = add_from_threads(queue, THREADS, 2)
        assert queue.count() == len(set(ids.values())) + 1 == THREADS * 2 + 1
        assert small_pool.hget(logical, "shards") == b"4"
        assert small_pool.hget(logical, "cfg") is None  # the name holds no jobs
        assert [small_pool.hmget(m, "shard", "cfg") for m in metas] == [[b"1", b"1"]] * 4
        queue.obliterate(force=True)


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    """A server of the test's own, to stop (SIGSTOP) and let go on."""
    with RedisServer(find_server_binary()) as server:
        yield server


def test_a_caller_that_stops_waiting_leaves_the_next_batch_led(
    own_server: RedisServer, queue_name: str
) -> None:
    """A call queued behind a batch in flight whose caller stopped waiting
    (its time ran out) stayed queued: the batch's leader handed the next
    batch to it, gone, and every later call of the client waited out its
    time and failed. The call now leaves the queue."""
    with Queue(queue_name, connection=own_server.url) as queue:
        queue.add("x", "warm")
        coalescer = queue._context.scripts._coalescer
        assert coalescer is not None
        coalescer._wait = 0.5  # a caller's longest wait: 30 s and more by default
        with ThreadPoolExecutor(max_workers=1) as pool:
            own_server.kill(signal.SIGSTOP)
            try:
                leader = pool.submit(queue.add, "x", "leader")
                # its batch is sent (to a server that answers nothing yet)
                until(lambda: coalescer._leading and not coalescer._queued, timeout=WAIT)
                with pytest.raises(redis.exceptions.TimeoutError):
                    queue.add("x", "follower")  # queued behind it: gives up
            finally:
                own_server.kill(signal.SIGCONT)
            assert leader.result(WAIT).data == "leader"
        assert queue.add("x", "later").data == "later"  # led, not waited out
        assert queue.count() == 3  # the follower's add was never sent


def _run_under_gevent(
    script: str, server: RedisServer, queue_name: str
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (it monkey-patches first) in a new process, given the
    server's URL and process id and the queue's name (at most a minute)."""
    pytest.importorskip("gevent")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [root, *filter(None, [os.environ.get("PYTHONPATH")])]))
    return subprocess.run(
        [sys.executable, "-c", script, server.url, str(server.pid), queue_name],
        cwd=root, env=env, capture_output=True, text=True, timeout=60,
    )


#: What the gevent scripts below begin with: a queue whose calls are batched.
_PRELUDE = """
from gevent import monkey
monkey.patch_all()
import os, signal, sys, time
import gevent
from jobq import Queue

url, pid, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
queue = Queue(name, connection=url)
queue.add("x", "warm")
coalescer = queue._context.scripts._coalescer
"""

_INTERRUPTED = _PRELUDE + """
os.kill(pid, signal.SIGSTOP)
try:
    leader = gevent.spawn(queue.add, "x", "leader")
    deadline = time.monotonic() + 10
    while not (coalescer._leading and not coalescer._queued):  # its batch is sent
        assert time.monotonic() < deadline
        gevent.sleep(0.01)
    try:
        with gevent.Timeout(0.3):  # a caller that stops waiting
            queue.add("x", "follower")
    except gevent.Timeout:
        pass
finally:
    os.kill(pid, signal.SIGCONT)
leader.get(timeout=10)
with gevent.Timeout(10):
    queue.add("x", "later")
sys.stdout.write(str(queue.count()))
sys.stdout.flush()
os._exit(0)
"""


def test_a_caller_interrupted_under_gevent_leaves_the_next_batch_led(
    own_server: RedisServer, queue_name: str
) -> None:
    """The same, for a caller interrupted while it waits (a gevent.Timeout
    around an add): every later add waited 30 s and failed."""
    process = _run_under_gevent(_INTERRUPTED, own_server, queue_name)
    assert process.stdout == "3", process.stderr[-3000:]


_LEADER_INTERRUPTED = _PRELUDE + """

def add(data, seconds):
    try:
        with gevent.Timeout(seconds):
            queue.add("x", data)
        return "added"
    except BaseException as exc:
        return type(exc).__name__

os.kill(pid, signal.SIGSTOP)
try:
    first = gevent.spawn(add, "first", 0.3)  # leads a batch the server does not answer
    deadline = time.monotonic() + 10
    while not (coalescer._leading and not coalescer._queued):  # its batch is sent
        assert time.monotonic() < deadline
        gevent.sleep(0.01)
    # queued behind it; the first leads the next batch once the first's
    # time is out, and its own time runs out in that batch
    leader = gevent.spawn(add, "leader", 0.6)
    other = gevent.spawn(add, "other", 30)
    gevent.joinall([first, leader], timeout=10)
finally:
    os.kill(pid, signal.SIGCONT)
other.join(10)
sys.stdout.write(repr([first.value, leader.value, other.value]))
sys.stdout.flush()
os._exit(0)
"""


def test_a_batch_whose_leader_is_interrupted_fails_the_others_with_a_connection_error(
    own_server: RedisServer, queue_name: str
) -> None:
    """The leader of a batch interrupted while it waits for the replies (a
    gevent.Timeout around its add) failed the other calls of the batch
    with its own interruption: another greenlet's add raised a
    gevent.Timeout that was not its own. They see their connection lost."""
    process = _run_under_gevent(_LEADER_INTERRUPTED, own_server, queue_name)
    assert process.stdout == "['Timeout', 'Timeout', 'ConnectionError']", process.stderr[-3000:]
