"""Fork safety (SPEC, "Processes: fork safety"): objects set up before
``os.fork()`` work in the child as in a fresh process.

A child reports through a pipe and leaves with ``os._exit``; every wait on
it is bounded.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import select
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from jobq import Event, Job, Queue, ShardedQueue, Worker

WAIT = 10.0

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def echo(job: Job) -> Any:
    return job.data


def in_child(body: Callable[[], Any], timeout: float = 20.0) -> Any:
    """Run ``body`` in a forked child; return what it returned (JSON), or
    raise what it raised, as an AssertionError."""
    read_fd, write_fd = os.pipe()
    with warnings.catch_warnings():  # Python 3.12 warns about fork with threads
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 0
        try:
            os.close(read_fd)
            try:
                payload = {"ok": body()}
            except BaseException as exc:
                payload = {"error": f"{type(exc).__name__}: {exc}"}
                code = 1
            os.write(write_fd, json.dumps(payload).encode())
            os.close(write_fd)
        finally:
            os._exit(code)
    os.close(write_fd)
    try:
        data = b""
        deadline = timeout
        while True:
            ready, _, _ = select.select([read_fd], [], [], deadline)
            assert ready, f"the child did not answer within {timeout} s"
            chunk = os.read(read_fd, 65536)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(read_fd)
        _reap(pid)
    answer = json.loads(data or b"{}")
    if "error" in answer:
        raise AssertionError(f"in the child: {answer['error']}")
    return answer.get("ok")


def _reap(pid: int) -> None:
    done = threading.Event()

    def wait() -> None:
        os.waitpid(pid, 0)
        done.set()

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    if not done.wait(WAIT):
        os.kill(pid, 9)
        thread.join(WAIT)


@pytest.fixture(params=["url", "client"])
def connection(request: pytest.FixtureRequest, redis_url: str) -> Iterator[Any]:
    """A URL (jobq's own client) or a caller's redis.Redis (its pool checks the pid)."""
    if request.param == "url" or "+cluster" in redis_url:
        yield redis_url
        return
    client = redis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        client.close()


def test_child_of_a_preloaded_queue_waits_and_listens(
    queue_name: str, redis_url: str, connection: Any
) -> None:
    completed: list[Event] = []
    with (
        Queue(queue_name, connection=connection) as queue,
        Worker(queue_name, echo, connection=redis_url, concurrency=4),
    ):
        # the trap of gunicorn --preload and examples/cron_batch.py: the
        # shared reader is running (and a listener registered) before fork
        assert queue.events.wait_until_ready(WAIT)
        queue.events.on("completed", completed.append)
        assert queue.add("x", "parent").wait_until_finished(timeout=WAIT) == "parent"

        def child() -> Any:
            # as in a fresh process: events from the reader's start on are heard
            assert queue.events.wait_until_ready(5)
            results = [queue.add("x", f"child-{i}").wait_until_finished(timeout=5)
                       for i in range(5)]
            gone = queue.add("x", "gone", remove_on_complete=True)
            results.append(gone.wait_until_finished(timeout=5))
            threads = [t.name for t in threading.enumerate() if t.name.startswith("jobq-")]
            return {"results": results, "threads": threads,
                    "heard": sorted({e.result for e in completed if e.result != "parent"})}

        answer = in_child(child)
        assert answer["results"] == [f"child-{i}" for i in range(5)] + ["gone"]
        assert f"jobq-events-{queue_name}" in answer["threads"]
        # the listener registered before the fork fires in the child
        assert "child-0" in answer["heard"]
        # the parent is undisturbed
        assert queue.add("x", "after").wait_until_finished(timeout=WAIT) == "after"


def test_child_of_an_unstarted_queue_starts_its_reader_on_first_use(
    queue_name: str, redis_url: str
) -> None:
    with (
        Queue(queue_name, connection=redis_url) as queue,
        Worker(queue_name, echo, connection=redis_url),
    ):
        queue.add("x")  # the pool has a connection, the reader is not started

        def child() -> Any:
            return queue.add("x", 7).wait_until_finished(timeout=5)

        assert in_child(child) == 7


def test_child_of_a_preloaded_sharded_queue_waits_and_listens(
    queue_name: str, redis_url: str
) -> None:
    completed: list[Event] = []
    with (
        ShardedQueue(queue_name, shards=4, connection=redis_url) as queue,
        Worker(queue_name, echo, connection=redis_url, concurrency=4, shards=4),
    ):
        assert queue.events.wait_until_ready(WAIT)
        queue.events.on("completed", completed.append)
        assert queue.add("x", "parent").wait_until_finished(timeout=WAIT) == "parent"

        def child() -> Any:
            assert queue.events.wait_until_ready(5)
            # each wait is shorter than the re-check: the reader answers it
            results = [queue.add("x", f"child-{i}").wait_until_finished(timeout=5)
                       for i in range(8)]
            threads = [t.name for t in threading.enumerate() if t.name.startswith("jobq-")]
            return {"results": results, "threads": threads,
                    "heard": sorted({e.result for e in completed if e.result != "parent"})}

        answer = in_child(child)
        assert answer["results"] == [f"child-{i}" for i in range(8)]
        assert answer["threads"].count(f"jobq-events-{queue_name}") == 1
        assert "child-0" in answer["heard"]
        assert queue.add("x", "after").wait_until_finished(timeout=WAIT) == "after"


# -- multiprocessing with the fork start method ---------------------------------

_SHARED: dict[str, Queue] = {}


def _mp_task(n: int) -> tuple[int, Any]:
    queue = _SHARED["queue"]
    return n, queue.add("x", n, remove_on_complete=n % 2 == 0).wait_until_finished(timeout=5)


def test_multiprocessing_fork_pool_waits(queue_name: str, redis_url: str) -> None:
    with (
        Queue(queue_name, connection=redis_url) as queue,
        Worker(queue_name, echo, connection=redis_url, concurrency=8),
    ):
        assert queue.events.wait_until_ready(WAIT)
        _SHARED["queue"] = queue
        try:
            context = multiprocessing.get_context("fork")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                pool = context.Pool(2)
            try:
                result = pool.map_async(_mp_task, range(60))
                answers = result.get(timeout=30)
            finally:
                pool.terminate()
                pool.join()
        finally:
            _SHARED.clear()
    assert answers == [(n, n) for n in range(60)]
