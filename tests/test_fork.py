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
import signal
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from jobq import Event, Job, Queue, ShardedQueue, Worker
from tests.polling import until

WAIT = 10.0
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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
            # the listener runs on the dispatcher, which may trail the waits
            until(lambda: any(e.result == "child-0" for e in completed), timeout=5)
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


def test_a_callers_single_connection_client_has_a_connection_of_its_own_in_the_child(
    queue_name: str, redis_url: str
) -> None:
    """gunicorn --preload with ``Queue(connection=redis.Redis(...,
    single_connection_client=True))``: the children kept the master's
    socket, and requests of two processes read each other's replies (a
    request got another's job result)."""
    if "+cluster" in redis_url:
        pytest.skip("a cluster client is not bound to one connection")
    client = redis.Redis.from_url(redis_url, single_connection_client=True)
    try:
        with (
            Queue(queue_name, connection=client) as queue,
            Worker(queue_name, echo, connection=redis_url),
        ):
            assert queue.add("x", "parent").wait_until_finished(timeout=WAIT) == "parent"
            parent_id = client.client_id()

            def child() -> Any:
                got = queue.add("x", "child").wait_until_finished(timeout=5)
                return {"id": client.client_id(), "result": got}

            answer = in_child(child)
            assert answer == {"id": answer["id"], "result": "child"}
            assert answer["id"] != parent_id  # a connection of its own
            # the parent's connection is the same, and open: the child let
            # go of its copy of the socket without shutting it down
            assert client.client_id() == parent_id
            assert queue.add("x", "after").wait_until_finished(timeout=WAIT) == "after"
    finally:
        client.close()


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
            # the listener runs on the dispatcher, which may trail the waits
            until(lambda: any(e.result == "child-0" for e in completed), timeout=5)
            threads = [t.name for t in threading.enumerate() if t.name.startswith("jobq-")]
            return {"results": results, "threads": threads,
                    "heard": sorted({e.result for e in completed if e.result != "parent"})}

        answer = in_child(child)
        assert answer["results"] == [f"child-{i}" for i in range(8)]
        assert answer["threads"].count(f"jobq-events-{queue_name}") == 1
        assert "child-0" in answer["heard"]
        assert queue.add("x", "after").wait_until_finished(timeout=WAIT) == "after"


def test_child_of_a_sharded_queue_that_added_in_bulk_adds_in_bulk(
    queue_name: str, redis_url: str
) -> None:
    """The parent's add_bulk leaves a thread pool (one thread per shard
    written); in the child its threads are gone, and a bulk add submitted
    to it would hang for ever: the child makes a pool of its own."""
    with ShardedQueue(queue_name, shards=4, connection=redis_url) as queue:
        parent = queue.add_bulk([{"name": "x", "data": i} for i in range(8)])
        assert len({queue.shard_for(job.id).name for job in parent}) > 1  # the pool ran
        assert queue._pool is not None

        def child() -> Any:
            jobs = queue.add_bulk([{"name": "x", "data": 100 + i} for i in range(8)])
            return [queue.get_job(job.id).data for job in jobs]  # type: ignore[union-attr]

        assert in_child(child, timeout=WAIT) == [100 + i for i in range(8)]
        assert queue.get_job_counts("waiting")["waiting"] == 16
        # the parent's pool is undisturbed
        assert len(queue.add_bulk([{"name": "x", "data": i} for i in range(8)])) == 8


def _held_lock_cases(
    queue_name: str, redis_url: str, redis_server: Any
) -> dict[str, tuple[Any, Any, Any]]:
    """Objects whose lock a parent's thread may hold at the fork: (the
    object, its lock, a use of it that takes the lock)."""
    from flask import Flask

    import jobq.contrib.django as django_app
    from jobq._queues import QueueSet
    from jobq.contrib.django.apps import JobqConfig
    from jobq.contrib.flask import JobQ
    from jobq.dashboard._data import SharedCache

    queue = Queue(queue_name, connection=redis_url)  # no call yet: no coalescer
    scripts = queue._context.scripts
    cache = SharedCache(60.0)
    queues = QueueSet(redis_url, "jobq", "a test")
    app = Flask(__name__)
    app.config["JOBQ_URL"] = redis_url
    JobQ(app)
    flask_state = app.extensions["jobq"]
    django_config = JobqConfig("jobq.contrib.django", django_app)
    cases: dict[str, tuple[Any, Any, Any]] = {}
    if "+cluster://" not in redis_url:  # one pool (a cluster client has one per node)
        worker = Worker(queue_name, echo, connection=redis_url)  # its own client and pool
        given = redis_server.client()  # a client the application made
        on_given = Queue(queue_name, connection=given)
        on_given.count()
        cases["worker pool"] = (worker, worker._context.client.connection_pool._lock,
                                lambda: worker._context.client.ping())
        cases["given client"] = (on_given, given.connection_pool._lock,
                                 lambda: on_given.add("x").id)
    return {
        **cases,
        "scripts": (queue, scripts._coalescer_lock, lambda: queue.add("x").id),
        "dashboard cache": (cache, cache._lock, lambda: cache.get("k", lambda: 1)),
        "queue set": (queues, queues._lock, lambda: queues.get(queue_name).name),
        "flask": (flask_state, flask_state.lock, lambda: flask_state.get(queue_name).name),
        "django": (django_config, django_config._lock, lambda: len(django_config.queues())),
    }


@pytest.mark.parametrize(
    "case",
    ["scripts", "dashboard cache", "queue set", "flask", "django", "worker pool", "given client"],
)
def test_a_lock_held_by_a_parent_thread_at_the_fork_is_new_in_the_child(
    queue_name: str, redis_url: str, redis_server: Any, case: str
) -> None:
    """gunicorn --preload forks whatever a thread of the master holds: a
    lock taken at that instant would stay taken for ever in the child."""
    cases = _held_lock_cases(queue_name, redis_url, redis_server)
    if case not in cases:
        _close_all(cases)
        pytest.skip("a cluster client's pools are per node")
    owner, lock, use = cases[case]
    held, release = threading.Event(), threading.Event()

    def holder() -> None:  # another thread: an RLock is not the child's to take
        with lock:
            held.set()
            release.wait(WAIT)

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert held.wait(WAIT)
        answer = in_child(lambda: use() is not None, timeout=5.0)
        assert answer is True
    finally:
        release.set()
        thread.join(WAIT)
        _close_all(cases)


def _close_all(cases: dict[str, tuple[Any, Any, Any]]) -> None:
    for obj, _, _ in cases.values():
        close = getattr(obj, "close", None) or getattr(obj, "close_queues", None)
        if close is not None:
            close()


@pytest.mark.parametrize("parent", ["unstarted", "running"])
def test_a_worker_started_in_a_child_is_a_worker_of_its_own(
    queue_name: str, redis_url: str, parent: str
) -> None:
    """gunicorn-style prefork: the parent builds (or runs) a Worker, each
    child starts it. Each child is a worker of its own: its own name in the
    registry, and lock tokens no other process can hold (a stalled child's
    late finish must never pass for the process that took its job over)."""
    worker = Worker(queue_name, echo, connection=redis_url)
    with Queue(queue_name, connection=redis_url) as queue, worker:
        if parent == "unstarted":
            worker.close()  # as a preloading master would leave it: never run
            worker = Worker(queue_name, echo, connection=redis_url)
        mine = worker._take_args().token

        def child() -> Any:
            with worker:  # starts it here, closes it at the end
                assert queue.add("x", 7).wait_until_finished(timeout=WAIT) == 7
                names = [w.name for w in queue.get_workers()]
                return [worker.name, worker._take_args().token, names]

        name, token, names = in_child(child)
        assert name != worker.name and name in names
        assert token[:16] != mine[:16]  # another random prefix
        if parent == "running":  # the child's close left the parent's entry
            assert [w.name for w in queue.get_workers()] == [worker.name]


# -- multiprocessing with the fork start method ---------------------------------

_SHARED: dict[str, Queue] = {}
#: Tasks of the pool, and threads adding and waiting in each task.
MP_TASKS = 40
MP_THREADS = 8


def _mp_task(task: int) -> list[tuple[int, Any]]:
    """In a pool's child: MP_THREADS threads each add a job and wait for it
    at once, on the queue (and its running reader) inherited at the fork."""
    queue = _SHARED["queue"]
    answers: list[tuple[int, Any]] = []

    def one(n: int) -> None:
        try:
            job = queue.add("x", n, remove_on_complete=n % 2 == 0)
            answers.append((n, job.wait_until_finished(timeout=WAIT)))
        except Exception as exc:
            answers.append((n, f"{type(exc).__name__}: {exc}"))

    threads = [threading.Thread(target=one, args=(task * MP_THREADS + i,))
               for i in range(MP_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT * 2)
    return sorted(answers)


def test_multiprocessing_fork_pool_waits(queue_name: str, redis_url: str) -> None:
    """A few hundred waits, in four forked processes at once, several
    threads each: every wait gets its own job's result."""
    with (
        Queue(queue_name, connection=redis_url) as queue,
        Worker(queue_name, echo, connection=redis_url, concurrency=16),
    ):
        assert queue.events.wait_until_ready(WAIT)
        _SHARED["queue"] = queue
        try:
            context = multiprocessing.get_context("fork")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                pool = context.Pool(4)
            try:
                result = pool.map_async(_mp_task, range(MP_TASKS))
                answers = result.get(timeout=30)
            finally:
                pool.terminate()
                pool.join()
        finally:
            _SHARED.clear()
    total = MP_TASKS * MP_THREADS
    assert [a for task in answers for a in task] == [(n, n) for n in range(total)]


# -- a fork without Python's hooks (uWSGI's) -----------------------------------


def test_a_fork_without_python_hooks_resets_at_first_use(
    queue_name: str, redis_url: str
) -> None:
    """uWSGI forks its workers from C without running ``os.register_at_fork``
    hooks (unless ``py-call-osafterfork``): jobq notices the new process at
    its first call there. Queues and a ShardedQueue whose readers ran in
    the parent (a listener on one), and Workers built in the parent, work
    in such a child; tests/test_forking_servers.py runs real uWSGI.

    Such a child's interpreter still holds its parent's thread states, over
    stacks the C library gives its new threads: on Python 3.13 one in about
    seventy children on a busy machine died of a segmentation fault in its
    first second, inside the interpreter (completing the fork from the
    child with PyOS_AfterFork_Child aborts: it releases locks that only
    PyOS_BeforeFork, in the parent, takes). That death alone is run again,
    twice at most; any other failure, a hang included, fails the test."""
    if "+cluster" in redis_url:
        pytest.skip("the child process takes a plain URL")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT, *filter(None, [os.environ.get("PYTHONPATH")])]))
    for attempt in range(3):
        process = subprocess.run(
            [sys.executable, "-m", "tests.forking_apps.hookless_fork", redis_url,
             f"{queue_name}-{attempt}"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=90,
        )
        assert process.returncode == 0, process.stderr[-3000:]
        answer = json.loads(process.stdout.strip().splitlines()[-1])
        if answer.get("child_signal") != signal.SIGSEGV:
            break
    assert "error" not in answer, answer["error"]
    assert answer["ok"]["results"] == ["child-0", "child-1", "child-2", "sharded"]
    assert "child-0" in answer["ok"]["heard"]
    assert answer["parent_after"] == ["after", "after"]
    # the child was told of the parent's threads (their risk is the GIL's)
    assert "was forked without Python's fork hooks while jobq's threads ran" in process.stderr


def _run_script(script: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in a new Python process (at most a minute)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT, *filter(None, [os.environ.get("PYTHONPATH")])]))
    return subprocess.run([sys.executable, "-c", script, *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


_PATCHED_LATE = """
import os, sys
from jobq import Queue, QueueEvents
events = QueueEvents(sys.argv[2], connection=sys.argv[1])
assert events.wait_until_ready(10)  # jobq's threads run
from gevent import monkey
monkey.patch_all()
with Queue(sys.argv[2], connection=sys.argv[1]) as queue:
    queue.get_job_counts()  # the first call since the patching
sys.stdout.write("done")
sys.stdout.flush()
os._exit(0)
"""


def test_monkey_patching_after_jobq_started_threads_is_reported(
    queue_name: str, redis_url: str
) -> None:
    """Locks are made again after a patching only while no thread of jobq's
    runs (gunicorn's gevent workers: tests/test_forking_servers.py); after,
    a warning says to patch first."""
    pytest.importorskip("gevent")
    if "+cluster" in redis_url:
        pytest.skip("the child process takes a plain URL")
    process = _run_script(_PATCHED_LATE, redis_url, queue_name)
    assert process.stdout == "done", process.stderr[-3000:]
    assert "threading was monkey-patched (gevent?) after jobq started threads" in process.stderr


_GEVENT_WAITS = """
from gevent import monkey
monkey.patch_all()
import os, sys, threading, time
import gevent
from jobq import QueueEvents

events = QueueEvents(sys.argv[2], connection=sys.argv[1])
assert events.wait_until_ready(10)
events._reader.ready = threading.Event()  # as before the reader's first read
answers = {}

def first():  # asks before the reader is ready: a wait of 0 s, with a timer
    answers["first"] = events.wait_until_ready(0)

def reader():  # the reader's first read: it wakes the waits of the first
    events._reader.ready.set()

def later():  # asks once it is ready, before that wake-up ran
    answers["later"] = events.wait_until_ready(0)

def busy():  # holds the loop up: the first wait's timer runs out first
    end = time.perf_counter() + 0.02
    while time.perf_counter() < end:
        pass

greenlets = [gevent.spawn(f) for f in (first, reader, later, busy)]
# gevent looks at its clock between callbacks every 50: past it, timers run
greenlets += [gevent.spawn(lambda: None) for _ in range(60)]
gevent.joinall(greenlets, timeout=5)
sys.stdout.write(repr(sorted(answers.items())))
sys.stdout.flush()
os._exit(0)
"""


def test_a_gevent_wait_on_a_ready_reader_returns(queue_name: str, redis_url: str) -> None:
    """Under gevent, a wait on a set event went behind the wake-up of the
    event's earlier waiters; when the last of those left first (its timeout
    ran out), gevent cancelled the wake-up and the wait never returned.
    Under gunicorn's gevent workers a request hung in
    ``wait_until_finished`` (tests/test_forking_servers.py, 4 runs in some
    500). jobq asks whether an event is set before waiting on it."""
    pytest.importorskip("gevent")
    process = _run_script(_GEVENT_WAITS, redis_url, queue_name)
    assert process.stdout == "[('first', False), ('later', True)]", process.stderr[-3000:]


_LOOPS_PATCHED_LATER = """
import sys
from jobq import _threads  # imported before the patching, as under gunicorn --preload
from gevent import monkey
monkey.patch_all()
import gevent

seen = []
loops = {}

def step_a():
    gevent.sleep(0.05)  # b runs meanwhile
    _threads.reached()  # a's step made its connection
    seen.append((loops["a"]._reached, loops["b"]._reached))
    loops["a"].stop()
    loops["b"].stop()
    return 0.0

def step_b():
    loops["b"].sleep(1.0)
    return 0.0

loops["a"] = _threads.BackgroundLoop("a", step_a)
loops["b"] = _threads.BackgroundLoop("b", step_b)
greenlets = [gevent.spawn(loops[name].run) for name in "ab"]
gevent.joinall(greenlets, timeout=5)
sys.stdout.write(repr(seen))
"""


def test_a_loop_that_reached_its_server_is_the_one_told_under_gevent() -> None:
    """A loop's step tells its loop it reached the server (a connection
    dropped after that is a first failure). The loop running a thread was
    kept in a ``threading.local`` made at import: imported before gevent's
    patching, it was one for every greenlet, and the last loop started was
    told of every loop's step."""
    pytest.importorskip("gevent")
    process = _run_script(_LOOPS_PATCHED_LATER)
    assert process.stdout == "[(True, False)]", process.stderr[-3000:]


@pytest.mark.parametrize("sharded", [False, True])
def test_a_future_pending_at_a_fork_settles_in_the_child_too(
    queue_name: str, redis_url: str, sharded: bool
) -> None:
    """The child forgot the parent's waiters, its futures' among them, and
    started no reader for them: a future pending at the fork never settled
    there (its result() ran out its timeout), though SPEC has waits behave
    in a child as documented."""
    queue: Any = (ShardedQueue(queue_name, shards=2, connection=redis_url) if sharded
                  else Queue(queue_name, connection=redis_url))
    with queue:
        job = queue.add("x", 21)
        future = job.as_future()
        pid = os.fork()
        if pid == 0:  # the child: exit 0 once its copy of the future has the result
            code = 3
            try:
                code = 0 if future.result(timeout=WAIT) == 42 else 2
            finally:
                os._exit(code)
        with Worker(queue_name, lambda job: job.data * 2, connection=redis_url):
            assert future.result(timeout=WAIT) == 42
            status = _reaped(pid)
    assert status is not None and os.waitstatus_to_exitcode(status) == 0


# -- forks from jobq's own threads (a handler or a listener that forks) ---------


def _reaped(pid: int, timeout: float = 20.0) -> int | None:
    """The exit status of child ``pid`` once it ends; None (and the child
    killed) if it is still running after ``timeout``."""
    import signal
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        threading.Event().wait(0.05)  # bounded poll of another process
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


@pytest.mark.parametrize("uses_jobq", [False, True])
@pytest.mark.parametrize(("ending", "status"), [("returns", 0), ("exits", 3), ("raises", 1)])
def test_a_child_forked_by_a_handler_finishes_nothing_and_ends(
    queue: Queue, redis_url: str, ending: str, status: int, uses_jobq: bool
) -> None:
    """The child of a handler's fork came back into the pool thread: it
    completed or failed the parent's job (whatever the parent's handler
    then did) and, with nothing to run, never exited. A child that used
    jobq (its threads started there) still never exited, and one that did
    not ended with status 0 whatever it raised: it ends as a process whose
    main code ended so would."""
    children: list[int] = []

    def handler(job: Job) -> str:
        if job.name == "child's":
            return "done"
        pid = os.fork()
        if pid == 0:  # the child: only this thread
            if uses_jobq:  # the parent's queue: its reader starts here, and stays
                queue.add("child's").wait_until_finished(timeout=WAIT)
            if ending == "exits":
                sys.exit(3)
            if ending == "raises":
                raise FileNotFoundError("as an exec of a missing program")
            return "the child's"
        children.append(pid)
        return "the parent's"

    job = queue.add("x")
    with Worker(queue.name, handler, connection=redis_url, concurrency=2):
        assert job.wait_until_finished(timeout=WAIT) == "the parent's"
        ended = [_reaped(pid) for pid in children]
    assert job.refresh().return_value == "the parent's" and job.attempts_made == 1
    assert [None if s is None else os.waitstatus_to_exitcode(s) for s in ended] == [status]


@pytest.mark.parametrize(("ending", "status"), [("returns", 0), ("exits", 5)])
def test_a_child_forked_by_a_listener_that_exits_ends(
    queue: Queue, redis_url: str, ending: str, status: int
) -> None:
    """sys.exit() in the child of a listener's fork was swallowed as a
    listener's error, and the child, its readers started again by the fork
    hook, never ended; nor did a child that used jobq and returned."""
    from jobq import QueueEvents

    children: list[int] = []
    forked = threading.Event()

    def on_completed(event: Event) -> None:
        if event.fields.get("result") != 1:
            return
        pid = os.fork()
        if pid == 0:
            queue.add("x", 2).wait_until_finished(timeout=WAIT)  # its reader stays
            if ending == "exits":
                sys.exit(5)
            return
        children.append(pid)
        forked.set()

    with QueueEvents(queue.name, connection=redis_url) as qe:
        qe.on("completed", on_completed)
        assert qe.wait_until_ready(WAIT)
        job = queue.add("x", 1)
        with Worker(queue.name, lambda job: job.data, connection=redis_url):
            assert job.wait_until_finished(qe, timeout=WAIT) == 1
            assert forked.wait(WAIT)
            ended = [_reaped(pid) for pid in children]
    assert [None if s is None else os.waitstatus_to_exitcode(s) for s in ended] == [status]


@pytest.mark.parametrize(("ending", "status"), [("returns", 0), ("exits", 5), ("raises", 1)])
def test_a_child_forked_by_a_futures_callback_ends(
    queue: Queue, redis_url: str, ending: str, status: int
) -> None:
    """A future's done-callback runs on the events dispatcher: the child it
    forked went on running the parent's dispatcher loop, for ever, its
    sys.exit() and errors logged and swallowed."""
    children: list[int] = []
    forked = threading.Event()

    def on_done(future: Any) -> None:
        pid = os.fork()
        if pid == 0:
            if not threading.current_thread().name.startswith("jobq-"):
                os._exit(99)  # not on the dispatcher: never go on with the tests here
            if ending == "exits":
                sys.exit(5)
            if ending == "raises":
                raise RuntimeError("in the child")
            return
        children.append(pid)
        forked.set()

    job = queue.add("x")
    future = job.as_future()
    future.add_done_callback(on_done)
    with Worker(queue.name, lambda job: 1, connection=redis_url):
        assert future.result(timeout=WAIT) == 1
        assert forked.wait(WAIT)
        ended = [_reaped(pid) for pid in children]
    assert [None if s is None else os.waitstatus_to_exitcode(s) for s in ended] == [status]


def test_jobq_objects_refuse_pickling_saying_what_to_pass(queue: Queue, redis_url: str) -> None:
    """A Job handed to a spawn pool (or returned from one) failed with
    "cannot pickle '_thread.lock' object"."""
    import pickle

    from jobq import QueueEvents

    job = queue.add("x")
    with QueueEvents(queue.name, connection=redis_url, autorun=False) as qe, \
            Worker(queue.name, print, connection=redis_url) as worker:
        for obj in (queue, job, qe, worker):
            with pytest.raises(TypeError, match=rf"a jobq {type(obj).__name__} cannot be "
                                                r"pickled.*Queue\(name\)\.get_job\(id\)"):
                pickle.dumps(obj)
