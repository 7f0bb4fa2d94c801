"""Regression tests of the Worker: each names the bug it pins down.

Tests that need a misbehaving server or network (a lost reply, a held-back
command, a long-running script, DEBUG SLEEP) run on a private server of
their own, through tests/proxy.py where the network must misbehave; the
others use the session server.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from jobq import ClosedError, Job, JobFailedError, Queue, ShardedQueue, Worker
from jobq.cli import main as cli_main
from jobq.scripts import _library, function_name
from jobq.testing import RedisServer, find_server_binary
from tests.conftest import echo
from tests.polling import close_while_stopped, jobq_threads, until
from tests.proxy import Proxy
from tests.test_worker import INTERVAL, LOCK, WAIT, Recorder, make_worker

CLUSTER = os.environ.get("JOBQ_TEST_CLUSTER") == "1"


@pytest.fixture(scope="module")
def private_server() -> Iterator[RedisServer]:
    """A server of this module's own: the tests here stall or busy it."""
    server = RedisServer(find_server_binary()).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def proxy(private_server: RedisServer) -> Iterator[Proxy]:
    with private_server.client() as client:
        port = client.connection_pool.connection_kwargs["port"]
    with Proxy(("127.0.0.1", port)) as p:
        yield p


def _fcall(script: str, server: RedisServer) -> bytes:
    """What a call of ``script`` carries: its function's name. The library
    is loaded on ``server`` first: a rule matching the first call must meet
    one that runs, not a "Function not found" refusal."""
    with server.client() as client:
        try:
            client.function_load(_library()[0])
        except redis.ResponseError as exc:
            assert "already exists" in str(exc)
    return function_name(script).encode()


def _calls(function: bytes, job_id: str) -> Any:
    """Match a chunk that calls ``function`` for ``job_id``."""
    return lambda chunk: function in chunk and job_id.encode() in chunk


# -- 1. nothing a handler raises kills a pool thread --------------------------------


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ raised")

    def __repr__(self) -> str:
        raise RuntimeError("__repr__ raised")


def test_an_exception_whose_str_raises_fails_its_job_and_the_worker_goes_on(
    queue: Queue, redis_url: str
) -> None:
    def handler(job: Job) -> str:
        if job.name == "nasty":
            raise _Unprintable()
        return job.name

    nasty = queue.add("nasty")
    fine = [queue.add(f"fine-{i}") for i in range(3)]
    with make_worker(queue.name, redis_url, handler, concurrency=1):
        with pytest.raises(JobFailedError) as failed:
            nasty.wait_until_finished(timeout=WAIT)
        assert [j.wait_until_finished(timeout=WAIT) for j in fine] == [
            "fine-0", "fine-1", "fine-2"
        ]
    assert "_Unprintable" in (failed.value.failed_reason or "")


class _Named(type):
    """A metaclass whose classes' ``__name__`` is no str (or raises)."""

    @property
    def __name__(cls) -> Any:  # type: ignore[override]
        if cls.__dict__.get("raise_name"):
            raise ZeroDivisionError("__name__ raised")
        return 5


class _OddlyNamed(Exception, metaclass=_Named):
    pass


class _NameRaises(Exception, metaclass=_Named):
    raise_name = True


@pytest.mark.parametrize("error", [_OddlyNamed, _NameRaises], ids=["not-a-str", "raises"])
def test_an_exception_whose_class_name_is_odd_fails_its_attempt_once(
    queue: Queue, redis_url: str, error: type[Exception]
) -> None:
    """The type name was read raw for the failure's reason: the finishing
    call never went, and the job stalled and ran again (attempts=1)."""
    runs: list[str] = []

    def handler(job: Job) -> None:
        runs.append(job.id)
        raise error("odd")

    job = queue.add("odd")
    with make_worker(queue.name, redis_url, handler, concurrency=1):
        with pytest.raises(JobFailedError) as failed:
            job.wait_until_finished(timeout=WAIT)
    assert failed.value.failed_reason == f"{error.__qualname__}: odd"
    assert runs == [job.id]
    stored = job.refresh()
    assert stored.attempts_made == 1 and stored.stalled_counter == 0
    assert stored.exc_type == error.__qualname__


def test_exponential_backoff_past_attempt_1024_does_not_kill_the_worker(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    # 2 ** 1026 overflows a float: the backoff is capped instead
    job = queue.add("fails", attempts=1030, backoff={"type": "exponential", "delay": 0})
    redis_client.hset(queue._context.keys.job(job.id), "atm", 1026)
    after = queue.add("after")

    def handler(job: Job) -> str:
        if job.name == "fails":
            raise ValueError("boom")
        return "ok"

    with make_worker(queue.name, redis_url, handler, concurrency=1):
        with pytest.raises(JobFailedError):
            job.wait_until_finished(timeout=WAIT)
        assert after.wait_until_finished(timeout=WAIT) == "ok"
    assert job.refresh().attempts_made == 1030


# -- 2. a slow local listener never makes a job stall -----------------------------


def test_a_slow_completed_listener_does_not_stall_the_next_job(
    queue: Queue, redis_url: str
) -> None:
    first, second = queue.add("first"), queue.add("second")
    slow = threading.Event()

    def listener(job: Job, result: Any) -> None:
        if job.name == "first":
            slow.wait(3 * LOCK)  # longer than a lock lasts

    worker = make_worker(queue.name, redis_url, lambda job: job.name, concurrency=1,
                         max_stalled_count=0)
    worker.on("completed", listener)
    with worker:
        assert first.wait_until_finished(timeout=WAIT) == "first"
        # taken along with the first job's completion, under lock renewal at once
        assert second.wait_until_finished(timeout=WAIT) == "second"
        slow.set()
    assert second.refresh().stalled_counter == 0


# -- 3. a lost reply of a finish that took the next job -----------------------------


def test_a_lost_reply_of_a_finish_that_took_the_next_job_loses_no_job(
    proxy: Proxy, private_server: RedisServer
) -> None:
    with Queue("lost-reply", connection=private_server.url) as queue:
        queue.obliterate(force=True)
        first = queue.add("first", job_id="first-job")
        second = queue.add("second", job_id="second-job")
        dropped = proxy.drop_reply(_calls(_fcall("complete", private_server), "first-job"))
        worker = Worker(queue.name, lambda job: job.name, connection=proxy.url,
                        lock_duration=30, stalled_interval=INTERVAL)
        with worker:
            assert first.wait_until_finished(timeout=WAIT) == "first"
            # without the fix the second job sits locked by nobody until its
            # lock expires (30 s, long after this wait), and runs as stalled
            assert second.wait_until_finished(timeout=WAIT) == "second"
        assert dropped.is_set()
        assert second.refresh().stalled_counter == 0
        assert second.attempts_made == 1


def test_a_lost_reply_of_a_finish_that_took_the_next_job_then_out_of_memory_loses_no_job(
    proxy: Proxy, private_server: RedisServer
) -> None:
    """The finish is sent again once its reply is lost; out of memory then,
    the server refuses its take (completeTake), and the finish alone (the
    allow-oom complete) did not hand back the job the first call had taken:
    it sat locked by nobody until its lock ran out, and counted as a stall
    (failed for good with max_stalled_count=0)."""
    with Queue("lost-reply-oom", connection=private_server.url) as queue, \
            private_server.client() as admin:
        queue.obliterate(force=True)
        first = queue.add("first", job_id="first-job")
        second = queue.add("second", job_id="second-job")

        def out_of_memory() -> None:  # once the server ran the call
            until(lambda: admin.hget("jobq:{lost-reply-oom}:job:second-job", "state")
                  == b"active", timeout=WAIT)
            admin.config_set("maxmemory", 1)

        dropped = proxy.drop_reply(_calls(_fcall("completeTake", private_server), "first-job"),
                                   then=out_of_memory)
        worker = Worker(queue.name, lambda job: job.name, connection=proxy.url,
                        lock_duration=30, stalled_interval=INTERVAL, max_stalled_count=0)
        try:
            with worker:
                assert first.wait_until_finished(timeout=WAIT) == "first"
                # the second job runs (its finish is allowed out of memory)
                assert second.wait_until_finished(timeout=WAIT) == "second"
        finally:
            admin.config_set("maxmemory", 0)
        assert dropped.is_set()
        assert second.refresh().stalled_counter == 0 and second.attempts_made == 1


# -- 4. BUSY and other "try again" replies are transient ---------------------------

_BUSY_SCRIPT = """
local s = redis.call('TIME')
repeat
  local n = redis.call('TIME')
until (n[1] - s[1]) * 1000000 + (n[2] - s[2]) > tonumber(ARGV[1])
return 1
"""


def test_a_completion_refused_with_busy_is_retried_not_dropped(
    private_server: RedisServer,
) -> None:
    runs: list[str] = []
    started, release = threading.Event(), threading.Event()

    def handler(job: Job) -> str:
        runs.append(job.id)
        started.set()
        assert release.wait(WAIT)
        return "done"

    with private_server.client() as admin, Queue("busy", connection=private_server.url) as q:
        q.obliterate(force=True)
        admin.config_set("busy-reply-threshold", 100)
        try:
            job = q.add("x")
            # a lock that outlives the 1.5 s busy script whenever it was last
            # renewed: the completion meets BUSY, never a stall check's recovery
            with make_worker(q.name, private_server.url, handler, lock_duration=10):
                assert started.wait(WAIT)
                busy = _busy(private_server)
                release.set()  # the completion now meets BUSY
                assert job.wait_until_finished(timeout=WAIT) == "done"
                busy.join(WAIT)
        finally:
            admin.config_set("busy-reply-threshold", 5000)
    assert runs == [job.id]


def test_a_completion_refused_longer_than_the_lock_is_retried_while_renewals_hold_it(
    redis_url: str, queue_name: str
) -> None:
    """A finishing call gave up a lock duration after its first try, though
    the lock was renewed meanwhile (a server busy in bursts: the renewals
    got through between them): the result was dropped, and the job ran
    again once its lock had lapsed. Here the first completions fail for
    longer than the lock, while renewals go through; the job runs once."""
    from jobq.scripts import function_name

    complete = function_name("complete").encode()
    refused: list[float] = []

    class RefusingCompletes(redis.Connection):
        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            blob = command if isinstance(command, bytes) else b"".join(command)
            # seven refusals: their backoffs add up to over 1.2 s, past the lock
            if complete in blob and len(refused) < 7:
                refused.append(time.monotonic())
                raise redis.exceptions.ConnectionError("refused by the test")
            super().send_packed_command(command, check_health)

    url = redis_url.replace("redis+cluster://", "redis://", 1)
    pool = redis.ConnectionPool.from_url(url, connection_class=RefusingCompletes)
    runs: list[str] = []

    def handler(job: Job) -> str:
        runs.append(job.id)
        return "done"

    with redis.Redis(connection_pool=pool) as client, \
         Queue(queue_name, connection=redis_url) as queue:
        job = queue.add("x")
        with make_worker(queue_name, client, handler, lock_duration=1, stalled_interval=0.5):
            assert job.wait_until_finished(timeout=WAIT) == "done"
        assert job.refresh().stalled_counter == 0
    assert len(refused) == 7 and refused[-1] - refused[0] > 1.0
    assert runs == [job.id]


def test_a_wait_and_a_worker_start_meeting_busy_wait_for_the_server(
    private_server: RedisServer,
) -> None:
    """A wait whose look at the job's record met BUSY raised redis-py's
    ResponseError at once, and Worker.start() meeting it (its look for a
    shard count) raised it too: both are "try again" replies, as a lost
    connection is, which both already waited out."""
    url = private_server.url
    with private_server.client() as admin, Queue("busy-wait", connection=url) as q:
        q.obliterate(force=True)
        admin.config_set("busy-reply-threshold", 100)
        try:
            with make_worker(q.name, url, echo):
                job = q.add("x", 2)
                assert job.wait_until_finished(timeout=WAIT) == 2
            busy = _busy(private_server)
            with make_worker(q.name, url, echo):  # started while the server is busy
                assert job.wait_until_finished(timeout=WAIT) == 2  # a second look: the record
                assert q.add("x", 3).wait_until_finished(timeout=WAIT) == 3
            busy.join(WAIT)
        finally:
            admin.config_set("busy-reply-threshold", 5000)


def test_a_call_meeting_busy_raises_connection_error_saying_nothing_ran(
    private_server: RedisServer,
) -> None:
    """An add (or any script call of the caller's) refused with BUSY raised
    redis-py's bare ResponseError: the docs promise ConnectionError /
    TimeoutError in an outage, the errors callers retry on; BUSY means
    that the call did not run."""
    url = private_server.url
    with private_server.client() as admin, Queue("busy-add", connection=url) as q:
        q.obliterate(force=True)
        admin.config_set("busy-reply-threshold", 100)
        try:
            busy = _busy(private_server)
            with pytest.raises(redis.exceptions.ConnectionError, match="BUSY.*nothing of it ran"):
                q.add("x")
            busy.join(WAIT)
        finally:
            admin.config_set("busy-reply-threshold", 5000)
        assert q.get_job_counts("waiting") == {"waiting": 0}
        assert q.add("x").get_state() == "waiting"


def test_a_worker_started_while_the_server_is_away_waits_to_learn_the_queue_is_sharded() -> None:
    """A worker started (without shards=) while the server was away took a
    sharded queue's name for a plain queue's, for good: it served none of
    its jobs once the server was back. Its start now waits for the server
    (SHARD_LOOK_WAIT at most)."""
    with RedisServer(find_server_binary(), appendonly=True) as server:
        with ShardedQueue("sh", shards=4, connection=server.url) as sharded:
            jobs = sharded.add_bulk([{"name": "x", "data": i} for i in range(8)])
        server.shutdown()
        worker = make_worker("sh", server.url, echo)
        starter = threading.Thread(target=worker.start, name="test-starter")
        starter.start()
        try:
            starter.join(0.3)
            assert starter.is_alive()  # waiting for the server, not serving a plain queue
            server.restart()
            starter.join(WAIT)
            assert not starter.is_alive() and worker.is_running()
            with ShardedQueue("sh", shards=4, connection=server.url) as sharded:
                assert [sharded.get_job(j.id).wait_until_finished(timeout=WAIT)  # type: ignore[union-attr]
                        for j in jobs] == list(range(8))
        finally:
            starter.join(WAIT)
            worker.close()


def test_a_worker_with_more_threads_than_the_server_takes_clients_finishes_every_job() -> None:
    """A server with ``maxclients 20`` and a worker of 24 threads: the
    threads left idle at the end kept their connections, those holding
    finished jobs could not connect, and their finishing calls were tried
    again, silently, until the worker closed (the jobs then ran twice, as
    stalled). An idle pool thread gives its connection back."""
    with RedisServer(find_server_binary(), extra_args=["--maxclients", "20"]) as server, \
            Queue("busy", connection=server.url) as queue:
        jobs = queue.add_bulk([{"name": "x", "data": i} for i in range(100)])
        done = threading.Event()
        with Worker("busy", lambda job: done.wait(0.01) or job.data, connection=server.url,
                    concurrency=24):
            assert [job.wait_until_finished(timeout=30) for job in jobs] == list(range(100))


def test_a_worker_whose_login_is_refused_says_so_at_start(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """A wrong password was taken for a server away: the start waited 10 s,
    then returned, and the worker retried the login for ever."""
    redis_client.acl_setuser("jobq-worker-login", enabled=True, passwords=["+right"],
                             commands=["+@all"], keys=["*"], channels=["*"])
    try:
        url = redis_url.replace("://", "://jobq-worker-login:hunter2@", 1)  # any scheme
        worker = None
        with pytest.raises(redis.exceptions.AuthenticationError,
                           match="refused the login") as refused:
            worker = make_worker("q-login", url, echo)  # a cluster's client logs in here
            worker.start()
        assert "hunter2" not in str(refused.value)
        if worker is not None:
            assert not worker.is_running()
            worker.close()
        assert jobq_threads("q-login") == []
    finally:
        redis_client.acl_deluser("jobq-worker-login")


def test_a_job_log_line_escapes_what_would_forge_a_line_or_drive_a_terminal(
    queue: Queue, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    name = "x\nERROR forged line \x1b[2J"

    def handler(job: Job) -> None:
        raise RuntimeError("bad \x1b]0;title\x07")

    job = queue.add(name)
    with caplog.at_level(logging.WARNING, logger=f"jobq.jobs.{queue.name}"):
        with make_worker(queue.name, redis_url, handler):
            with pytest.raises(JobFailedError):
                job.wait_until_finished(timeout=WAIT)
    lines = [r.getMessage() for r in caplog.records if r.name == f"jobq.jobs.{queue.name}"]
    assert len(lines) == 1, lines
    assert "\n" not in lines[0] and "\x1b" not in lines[0]
    assert "x\\nERROR forged line \\x1b[2J" in lines[0] and "bad \\x1b]0;title\\x07" in lines[0]


def _busy(server: RedisServer) -> threading.Thread:
    """A thread running a 1.5 s script on ``server``, started; returned once
    the server answers BUSY (busy-reply-threshold set low by the caller)."""
    busy = threading.Thread(target=lambda: server.client().eval(_BUSY_SCRIPT, 0, 1_500_000),
                            name="test-busy")
    busy.start()
    with server.client(socket_timeout=5) as probe:
        until(lambda: _is_busy(probe), timeout=WAIT)
    return busy


def _is_busy(client: redis.Redis) -> bool:
    try:
        client.ping()
    except redis.exceptions.ResponseError as exc:
        return str(exc).startswith("BUSY")
    return False


# -- 5. a worker name CLIENT SETNAME would refuse ----------------------------------


def test_a_worker_named_with_spaces_and_accents_takes_jobs(
    queue: Queue, redis_url: str
) -> None:
    job = queue.add("x")
    with make_worker(queue.name, redis_url, lambda job: job.processed_by,
                     name="worker one é"):
        assert job.wait_until_finished(timeout=WAIT) == "worker one é"


@pytest.mark.parametrize("name", ["bad\nname", "lone\udc80"])
def test_a_worker_name_with_control_characters_is_refused(redis_url: str, name: str) -> None:
    with pytest.raises(ValueError, match="worker name"):
        Worker("q", lambda job: None, connection=redis_url, name=name)


# -- 6. a corrupt record fails its job, never the worker ---------------------------


@pytest.mark.parametrize("field, value", [("priority", "high"), ("atm", "abc"),
                                          ("ts", "yesterday"), ("opts", "\xc1")])
def test_corrupt_records_fail_their_jobs_and_leak_no_slot(
    queue: Queue, redis_url: str, redis_client: redis.Redis, field: str, value: str
) -> None:
    bad = [queue.add(f"bad-{i}") for i in range(3)]
    for job in bad:
        redis_client.hset(queue._context.keys.job(job.id), field, value)
    good = queue.add("good")
    with make_worker(queue.name, redis_url, lambda job: "ok", concurrency=2):
        assert good.wait_until_finished(timeout=WAIT) == "ok"
        for job in bad:
            with pytest.raises(JobFailedError):
                job.wait_until_finished(timeout=WAIT)
        # every slot is free again: as many jobs as the pool run at once
        more = [queue.add(f"more-{i}") for i in range(4)]
        assert [j.wait_until_finished(timeout=WAIT) for j in more] == ["ok"] * 4


# -- 7. one add() makes one job, whatever the client's retry policy ----------------


def test_an_add_whose_reply_times_out_is_not_sent_twice(
    private_server: RedisServer,
) -> None:
    host, port = "127.0.0.1", private_server.client().connection_pool.connection_kwargs["port"]
    # redis-py's own defaults: a retry policy that resends on a timeout
    client = redis.Redis(host=host, port=port, socket_timeout=0.3)
    # the server sleeps long enough that the add times out even when it is
    # sent well over a second after the probe saw the sleep begin
    sleeper = threading.Thread(
        target=lambda: private_server.client().execute_command("DEBUG", "SLEEP", "2"),
        name="test-sleep",
    )
    try:
        with Queue("once", connection=client) as queue:
            queue.obliterate(force=True)
            sleeper.start()
            with private_server.client(socket_timeout=0.05, retry=Retry(NoBackoff(), 0)) as probe:
                until(lambda: _times_out(probe), timeout=WAIT)
            with pytest.raises((redis.exceptions.TimeoutError, redis.exceptions.ConnectionError)):
                queue.add("x")
            sleeper.join(WAIT)
            assert until(lambda: queue.get_job_counts()["waiting"], timeout=WAIT) == 1
    finally:
        client.close()


def _times_out(client: redis.Redis) -> bool:
    try:
        client.ping()
    except redis.exceptions.TimeoutError:
        return True
    return False


# -- 10. reading never writes a setting ---------------------------------------------


def test_looking_at_a_queue_keeps_its_max_events(
    queue_name: str, redis_url: str, redis_client: redis.Redis,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with Queue(queue_name, connection=redis_url, max_events=50) as queue:
        meta = queue._context.keys.meta
        assert queue.max_events == 50  # stored on first use
        with Queue(queue_name, connection=redis_url) as look:
            assert look.max_events == 50
        assert cli_main(["--url", redis_url, "info", queue_name]) == 0
        assert redis_client.hget(meta, "maxev") == b"50"
        queue.obliterate(force=True)
    capsys.readouterr()


# -- 11. one deadline for the whole close -------------------------------------------


def test_close_with_a_timeout_keeps_to_it_while_the_server_is_paused(
    private_server: RedisServer,
) -> None:
    started = threading.Event()

    def handler(job: Job) -> None:
        started.set()
        job.cancelled.wait(WAIT)  # a cooperative handler: ends once abandoned

    with Queue("close-deadline", connection=private_server.url) as queue:
        queue.obliterate(force=True)
        queue.add("stuck")
        worker = make_worker(queue.name, private_server.url, handler, lock_duration=2)
        worker.on("drained", lambda: None)  # an event subscription to close too
        worker.start()
        assert started.wait(WAIT)
        with private_server.client() as admin:
            # (the pause lasts its whole time: UNPAUSE waits behind it too)
            admin.execute_command("CLIENT", "PAUSE", 15_000, "ALL")
            began = time.monotonic()
            worker.close(timeout=1)
            took = time.monotonic() - began
            admin.execute_command("CLIENT", "UNPAUSE")
    # 1 s for the job, then the join grace for threads told to stop, then
    # the same again for threads whose connections it had to cut: 4.5 s,
    # far from the 15 s of a close that waited for the server
    assert took < 9.0, f"close(timeout=1) took {took:.1f} s"
    assert not worker.is_running()


# -- 13. a worker never takes the application's connections -------------------------


@pytest.mark.skipif(CLUSTER, reason="cluster clients have a pool per node, unbounded")
def test_a_worker_takes_no_connection_from_the_applications_pool(
    queue: Queue, redis_url: str
) -> None:
    pool = redis.ConnectionPool.from_url(redis_url, max_connections=20)
    app = redis.Redis(connection_pool=pool)
    errors: list[BaseException] = []
    try:
        jobs = queue.add_bulk([{"name": "x", "data": i} for i in range(50)])
        with Worker(queue.name, lambda job: job.data, connection=app, concurrency=16,
                    lock_duration=LOCK, stalled_interval=INTERVAL):
            assert [j.wait_until_finished(timeout=WAIT) for j in jobs] == list(range(50))
            assert pool._created_connections == 0  # type: ignore[attr-defined]

            # and the application's own threads get every connection they need
            with Queue(queue.name, connection=app) as mine:
                def adds() -> None:
                    try:
                        for _ in range(20):
                            mine.add("y", 1)
                    except BaseException as exc:
                        errors.append(exc)

                threads = [threading.Thread(target=adds, name="test-adds") for _ in range(16)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(WAIT)
        assert errors == []
    finally:
        app.close()
        pool.disconnect()


# -- 14. lock renewal never waits behind a timeout ----------------------------------


def test_a_slow_timeout_failure_does_not_hold_back_lock_renewal(
    proxy: Proxy, private_server: RedisServer
) -> None:
    release = threading.Event()

    def handler(job: Job) -> str:
        if job.name == "times-out":
            job.cancelled.wait(WAIT)
            return "late"
        assert release.wait(WAIT)
        return "long"

    with Queue("renewal", connection=private_server.url) as queue:
        queue.obliterate(force=True)
        long = queue.add("long", job_id="long-job")
        held = proxy.delay(_calls(_fcall("fail", private_server), "short-job"), 3 * LOCK)
        short = queue.add("times-out", job_id="short-job", timeout=0.2)
        worker = Worker(queue.name, handler, connection=proxy.url, concurrency=2,
                        lock_duration=LOCK, stalled_interval=INTERVAL, max_stalled_count=0)
        with worker:
            assert held.wait(WAIT)  # the timeout's failure is held back on the network
            with pytest.raises(JobFailedError, match="timed out"):
                short.wait_until_finished(timeout=WAIT)
            release.set()
            # its lock was renewed all along: not failed as stalled
            assert long.wait_until_finished(timeout=WAIT) == "long"


# -- 15. listeners attached before start() hear every later event --------------------


def test_a_drained_listener_attached_before_start_hears_the_first_drain(
    queue_name: str, redis_url: str
) -> None:
    for round_ in range(5):
        name = f"{queue_name}-{round_}"
        with Queue(name, connection=redis_url) as queue:
            jobs = [queue.add("x", i) for i in range(3)]
            worker = make_worker(name, redis_url, lambda job: job.data)
            rec = Recorder().attach(worker, "drained")
            with worker:
                assert [j.wait_until_finished(timeout=WAIT) for j in jobs] == [0, 1, 2]
                assert rec.wait("drained", 1, timeout=WAIT), f"round {round_}: no drained"
            queue.obliterate(force=True)


# -- fork: a running worker is not running in the child -----------------------------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_worker_running_in_the_parent_is_not_running_in_a_forked_child(
    queue: Queue, redis_url: str
) -> None:
    job = queue.add("x", 2)
    with make_worker(queue.name, redis_url, lambda job: job.data * 2) as worker:
        assert job.wait_until_finished(timeout=WAIT) == 4
        worker.pause()  # the child's job is for the child's worker
        pid = os.fork()
        if pid == 0:  # the child: check, run a job of its own, and leave at once
            code = 1
            try:
                if not worker.is_running():
                    worker.resume()
                    worker.start()
                    with Queue(queue.name, connection=redis_url) as mine:
                        child_job = mine.add("x", 5)
                        ok = child_job.wait_until_finished(timeout=WAIT) == 10
                    worker.close(timeout=WAIT)
                    code = 0 if ok else 2
            finally:
                os._exit(code)
        deadline = time.monotonic() + 3 * WAIT
        status = 0
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            threading.Event().wait(0.05)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child did not end")
        assert os.waitstatus_to_exitcode(status) == 0
        assert worker.is_running()  # the parent's worker is untouched
        worker.resume()


# -- issue 12: pause waits for jobs in flight; listeners see finished_on -----------


def test_a_resume_during_a_pause_leaves_the_worker_as_its_flag_says(
    queue: Queue, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pause() set its flag, then closed the take gate outside the worker's
    lock: a resume() in between (flag and gate reopened) was undone by the
    pause's late close, and the worker, not paused by is_paused(), never
    took a job again, whatever resume() was called after. Here the resume
    comes at that moment; it now waits for the pause to finish."""
    from jobq._attempt import TakeGate

    set_paused = TakeGate.set_paused
    resuming: list[threading.Thread] = []

    def late(gate: TakeGate, paused: bool) -> None:
        if paused and not resuming:
            resuming.append(threading.Thread(target=worker.resume, name="test-resume"))
            resuming[0].start()
            resuming[0].join(1.0)  # it ran here before the fix; now it waits for the lock
        set_paused(gate, paused)

    with make_worker(queue.name, redis_url, echo) as worker:
        monkeypatch.setattr(TakeGate, "set_paused", late)
        worker.pause()
        resuming[0].join(WAIT)
        assert not resuming[0].is_alive()
        assert not worker.is_paused()
        assert queue.add("x", 5).wait_until_finished(timeout=WAIT) == 5


def test_pause_waits_for_the_jobs_in_flight(queue: Queue, redis_url: str) -> None:
    started, release = threading.Event(), threading.Event()

    def handler(job: Job) -> str:
        started.set()
        assert release.wait(WAIT)
        return "done"

    job = queue.add("x")
    with make_worker(queue.name, redis_url, handler) as worker:
        assert started.wait(WAIT)
        pausing = threading.Thread(target=worker.pause, name="test-pause")
        pausing.start()
        pausing.join(0.3)
        assert pausing.is_alive(), "pause() returned with a job in flight"
        release.set()
        pausing.join(WAIT)
        assert not pausing.is_alive()
        assert queue.get_job_state(job.id) == "completed"
        assert worker.is_paused()


def test_pause_with_a_timeout_returns_while_a_job_is_still_active(
    queue: Queue, redis_url: str
) -> None:
    started, release = threading.Event(), threading.Event()

    def handler(job: Job) -> str:
        started.set()
        assert release.wait(WAIT)
        return "done"

    job = queue.add("x")
    with make_worker(queue.name, redis_url, handler) as worker:
        assert started.wait(WAIT)
        pausing = threading.Thread(target=worker.pause, kwargs={"timeout": 0.3},
                                   name="test-pause")
        pausing.start()
        pausing.join(WAIT)
        assert not pausing.is_alive(), "pause(timeout=0.3) did not return"
        # it returned while the handler was still held: the job is active
        assert not release.is_set()
        assert queue.get_job_state(job.id) == "active"
        assert worker.is_paused()
        release.set()
        assert job.wait_until_finished(timeout=WAIT) == "done"


def test_a_second_pause_with_wait_waits_for_the_jobs_in_flight(
    queue: Queue, redis_url: str
) -> None:
    started, release = threading.Event(), threading.Event()

    def handler(job: Job) -> str:
        started.set()
        assert release.wait(WAIT)
        return "done"

    job = queue.add("x")
    worker = make_worker(queue.name, redis_url, handler)
    rec = Recorder().attach(worker, "paused")
    with worker:
        assert started.wait(WAIT)
        worker.pause(wait=False)
        assert worker.is_paused() and queue.get_job_state(job.id) == "active"
        pausing = threading.Thread(target=worker.pause, name="test-pause")
        pausing.start()
        pausing.join(0.3)
        assert pausing.is_alive(), "a second pause() returned with a job in flight"
        release.set()
        pausing.join(WAIT)
        assert not pausing.is_alive()
        assert queue.get_job_state(job.id) == "completed"
    assert len(rec.of("paused")) == 1  # emitted by the call that paused it


def test_pause_from_a_handler_waits_for_the_other_jobs_only(
    queue: Queue, redis_url: str
) -> None:
    # the handler's own job cannot end while it waits in pause(): waiting
    # for it was a deadlock (until the timeout)
    other_started, release_other = threading.Event(), threading.Event()
    paused = threading.Event()

    def handler(job: Job) -> str:
        if job.name == "other":
            other_started.set()
            assert release_other.wait(WAIT)
            return "other"
        assert other_started.wait(WAIT)
        worker.pause(timeout=2 * WAIT)  # bounded: the old deadlock ends
        paused.set()
        return "pauser"

    other = queue.add("other")
    worker = make_worker(queue.name, redis_url, handler, concurrency=2)
    with worker:
        assert other_started.wait(WAIT)
        pauser = queue.add("pauser")
        assert not paused.wait(0.3), "pause() returned while another job was in flight"
        release_other.set()
        assert paused.wait(WAIT), "pause() from a handler waited for its own job"
        assert other.wait_until_finished(timeout=WAIT) == "other"
        assert pauser.wait_until_finished(timeout=WAIT) == "pauser"
        assert worker.is_paused()
        later = queue.add("later")
        assert queue.get_job_state(later.id) == "waiting"  # not taken: paused
        worker.resume()
        assert later.wait_until_finished(timeout=WAIT) == "pauser"


def test_handlers_pausing_together_do_not_wait_for_each_other(
    queue: Queue, redis_url: str
) -> None:
    both = threading.Barrier(2, timeout=WAIT)
    returned: list[str] = []
    lock = threading.Lock()

    def handler(job: Job) -> str:
        both.wait()  # both in flight before either pauses
        worker.pause(timeout=2 * WAIT)  # bounded: waiting for each other would end
        with lock:
            returned.append(job.name)
        return job.name

    worker = make_worker(queue.name, redis_url, handler, concurrency=2)
    with worker:
        jobs = queue.add_bulk([{"name": "a"}, {"name": "b"}])
        assert [j.wait_until_finished(timeout=WAIT) for j in jobs] == ["a", "b"]
    assert sorted(returned) == ["a", "b"]


def test_listeners_get_jobs_with_finished_on(queue: Queue, redis_url: str) -> None:
    def handler(job: Job) -> str:
        if job.name == "bad":
            raise ValueError("no")
        return "ok"

    good, bad = queue.add("good"), queue.add("bad")
    worker = make_worker(queue.name, redis_url, handler)
    rec = Recorder().attach(worker, "completed", "failed")
    with worker:
        assert good.wait_until_finished(timeout=WAIT) == "ok"
        with pytest.raises(JobFailedError):
            bad.wait_until_finished(timeout=WAIT)
        assert rec.wait("completed") and rec.wait("failed")
    for event, job in (("completed", good), ("failed", bad)):
        seen = rec.of(event)[0][0]
        assert seen.finished_on is not None
        assert seen.finished_on == pytest.approx(job.refresh().finished_on, abs=0.002)


@pytest.mark.skipif(CLUSTER, reason="cluster clients route each call; threads hold none")
@pytest.mark.parametrize("concurrency", [1, 4])
def test_pool_threads_keep_a_connection_of_the_workers_own_pool(
    queue: Queue, redis_url: str, concurrency: int
) -> None:
    in_use: list[int] = []

    def handler(job: Job) -> int:
        pool = worker._context.client.connection_pool
        in_use.append(len(pool._in_use_connections))
        return int(job.data)

    jobs = queue.add_bulk([{"name": "x", "data": i} for i in range(12)])
    worker = make_worker(queue.name, redis_url, handler, concurrency=concurrency)
    with worker:
        assert [j.wait_until_finished(timeout=WAIT) for j in jobs] == list(range(12))
    # a pool thread keeps the connection it took at its first finished job
    assert min(in_use[1:] if concurrency == 1 else in_use[-1:]) >= 1, in_use
    assert worker._context.client.connection_pool.max_connections == 2 * concurrency + 8


def test_a_worker_started_while_the_server_is_away_runs_jobs_once_it_is_back(
    private_server: RedisServer,
) -> None:
    private_server.shutdown()
    worker = make_worker("away", private_server.url, lambda job: job.data * 2, concurrency=2)
    errors = Recorder().attach(worker, "error")
    try:
        worker.start()
        assert errors.wait("error", timeout=WAIT)  # it noticed, and goes on
        private_server.restart()
        with Queue("away", connection=private_server.url) as queue:
            jobs = [queue.add("x", i) for i in range(4)]
            assert [j.wait_until_finished(timeout=WAIT) for j in jobs] == [0, 2, 4, 6]
        assert all(t.is_alive() for t in worker._roles.runner.threads)  # type: ignore[union-attr]
    finally:
        worker.close(timeout=WAIT)


def test_an_unexpected_reply_to_a_finishing_call_is_retried_not_left_to_stall(
    proxy: Proxy, private_server: RedisServer
) -> None:
    # a client library's failure inside the call (seen with redis-py 5 during
    # a slot migration: a reply out of step, an AttributeError) is retried
    # like a lost connection: the call is idempotent per lock token
    with Queue("odd-reply", connection=private_server.url) as queue:
        queue.obliterate(force=True)
        job = queue.add("x", job_id="odd-job")
        after = queue.add("y", job_id="after-job")  # taken along by the odd call
        replaced = proxy.replace_reply(_calls(_fcall("complete", private_server), "odd-job"),
                                       b"+OK\r\n")
        worker = Worker(queue.name, lambda job: job.name, connection=proxy.url,
                        lock_duration=30, stalled_interval=INTERVAL)
        done = Recorder().attach(worker, "completed")
        with worker:
            assert job.wait_until_finished(timeout=WAIT) == "x"
            # left to stall, it would run only once its 30 s lock expired
            assert after.wait_until_finished(timeout=WAIT) == "y"
            assert done.wait("completed", 2)  # the worker knows it finished both
        assert replaced.is_set()
        assert after.refresh().stalled_counter == 0 and after.attempts_made == 1


@pytest.mark.parametrize("listener", ["subscribed", "subscribing"])
def test_close_leaves_no_thread_behind_on_a_server_that_stopped_answering(
    private_server: RedisServer, queue_name: str, listener: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker closed while the server accepts but does not answer: its
    threads stuck in calls have their connections cut, and none connects
    again (the heartbeat, resent on a new connection, and the cancel
    subscription, which redis-py reconnects, blocked on the new handshake:
    for ever on a client without a socket timeout, redis-py 5's default).
    "subscribing": the cancel listener connects only once the server has
    stopped (a busy machine starts it late); its handshake, out of the
    subscription's reach, was left blocked for the socket timeout (10 s)."""
    import signal

    from jobq._cancel import CancelListener

    client = redis.Redis("127.0.0.1", private_server.port, socket_timeout=None)
    started, go = threading.Event(), threading.Event()
    if listener == "subscribing":
        connect = CancelListener._connect

        def late_connect(self: CancelListener) -> None:
            assert go.wait(WAIT)  # set once the server is stopped
            connect(self)

        monkeypatch.setattr(CancelListener, "_connect", late_connect)

    def handler(job: Job) -> int:
        started.set()
        assert go.wait(WAIT)
        return 1

    queue = Queue(queue_name, connection=client)
    worker = Worker(queue_name, handler, connection=client, concurrency=2,
                    heartbeat_ttl=1, autorun=True)
    try:
        queue.add("x")
        assert started.wait(WAIT)
        private_server.kill(signal.SIGSTOP)
        go.set()  # its completion now waits on the stopped server
        worker.close(timeout=1)
        left = jobq_threads(queue_name)
        assert left == []
    finally:
        private_server.kill(signal.SIGCONT)
        worker.close()
        queue.close()
        client.close()


def test_close_of_an_idle_sharded_worker_keeps_its_time_on_a_server_that_stopped_answering(
    private_server: RedisServer, queue_name: str
) -> None:
    """A sharded worker's threads all end in time when the server stops
    answering (its fetch waits on subscriptions, with client-side timeouts);
    the close's last call, leaving the worker registry, then waited for the
    server's reply: for ever on a client without a socket timeout."""
    from jobq import ShardedQueue

    client = redis.Redis("127.0.0.1", private_server.port, socket_timeout=None)
    sharded = ShardedQueue(queue_name, shards=2, connection=client)
    worker = Worker(sharded.name, lambda job: None, connection=client, shards=2)
    ready = threading.Event()
    worker.on("ready", ready.set)
    try:
        worker.start()
        assert ready.wait(WAIT)
        left, closing = close_while_stopped(
            private_server, lambda: worker.close(timeout=1), queue_name)
        assert left == [] and closing < 5, (left, closing)
    finally:
        worker.close()
        sharded.close()
        client.close()


def test_close_of_a_worker_whose_take_is_stuck_ends_at_its_timeout(
    private_server: RedisServer, queue_name: str
) -> None:
    """The fetcher, stuck in its take on a server that stopped answering,
    had the whole timeout to end; its connection was cut JOIN_GRACE (1.5 s)
    past the timeout all the same: close(timeout=2) took 3.5 s."""
    worker = Worker(queue_name, lambda job: None, connection=private_server.url, concurrency=2)
    queue = Queue(queue_name, connection=private_server.url)
    try:
        worker.start()
        # a job just run, a pool slot free: the fetcher's block carries a take
        # (see _fetcher.py), stuck with it
        assert queue.add("x").wait_until_finished(timeout=WAIT) is None
        left, closing = close_while_stopped(
            private_server, lambda: worker.close(timeout=2), queue_name)
        assert closing < 3.0, closing
        assert not [name for name in left if name.startswith("jobq-fetch")], left
    finally:
        worker.close()
        queue.close()


@pytest.mark.parametrize("listener", [False, True])
def test_close_from_another_thread_ends_a_start_waiting_for_the_server(listener: bool) -> None:
    """start() held the worker's lock while it waited for a server that was
    away (up to 10 s to read whether the queue is sharded, 10 s more for a
    drained listener's channel): a close() from another thread waited all
    that time, whatever its timeout, and the start then returned."""
    from tests.sentinels import free_port

    worker = Worker("away", lambda job: None, connection=f"redis://127.0.0.1:{free_port()}")
    if listener:
        worker.on("drained", lambda: None)
    outcome: list[BaseException | None] = []

    def start() -> None:
        try:
            worker.start()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=start, name="test-start")
    thread.start()
    until(lambda: worker._life.starting, timeout=WAIT)
    began = time.monotonic()
    worker.close(timeout=1)
    closing = time.monotonic() - began
    thread.join(WAIT)
    assert not thread.is_alive()
    assert closing < 5.0, closing  # the start's waits were 10 s (20 s with a listener)
    assert len(outcome) == 1 and isinstance(outcome[0], ClosedError), outcome
    assert not worker.is_running()
    assert jobq_threads("away") == []


def test_a_closed_workers_job_says_whose_worker_is_closed(queue: Queue, redis_url: str) -> None:
    """A handler's thread writing progress after its worker closed got
    "worker '<queue name>' is closed": the queue's name said as a worker's."""
    jobs: list[Job] = []
    worker = Worker(queue.name, jobs.append, connection=redis_url, name="w-1")
    with worker:
        queue.add("x").wait_until_finished(timeout=WAIT)
    with pytest.raises(ClosedError, match=rf"^the worker of queue {queue.name!r} is closed$"):
        jobs[0].update_progress(99)
    with ShardedQueue(queue.name + "-s", shards=2, connection=redis_url) as sharded:
        sharded.count()  # the shard count stored, for the worker
        with Worker(sharded.name, jobs.append, connection=redis_url, name="w-2"):
            sharded.add("x").wait_until_finished(timeout=WAIT)
        with pytest.raises(ClosedError, match=rf"^the worker of queue {sharded.name!r} is closed"):
            jobs[1].update_progress(99)
        sharded.obliterate(force=True)


def test_a_worker_closed_by_its_own_listener_closes_fully(
    queue: Queue, redis_url: str, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """``close()`` called in a worker's listener (on the thread that calls
    the listeners): the close tried to join that thread, raised
    RuntimeError into the listener, and skipped the rest of the close (the
    worker's connections stayed open)."""
    worker = Worker(queue.name, echo, connection=redis_url, name="closes-itself")
    closed = threading.Event()
    worker.on("completed", lambda job, result: worker.close(timeout=WAIT))
    worker.on("closed", closed.set)
    with caplog.at_level("ERROR", logger="jobq"):
        worker.start()
        assert queue.add("x", 1).wait_until_finished(timeout=WAIT) == 1
        assert closed.wait(WAIT)
        # the worker's threads (the queue's events have threads of their own)
        until(lambda: not [t for t in jobq_threads(queue.name)
                           if not t.startswith(("jobq-events-", "jobq-dispatch-", "jobq-wake-"))],
              WAIT)
    assert [r.getMessage() for r in caplog.records] == []
    names = [c["name"] for c in redis_client.client_list()]
    assert not [n for n in names if "closes-itself" in n], names


@pytest.mark.parametrize("event", ["closing", "closed"])
def test_a_close_called_again_by_a_closing_listener_returns_at_once(
    queue: Queue, redis_url: str, event: str
) -> None:
    """A second close() waits for the first to end; called by a `closing`
    or `closed` listener it waited for a close that waited for that
    listener's thread, until the thread's grace (1.5 s) ran out."""
    from jobq.worker import Lifecycle

    worker = Worker(queue.name, echo, connection=redis_url)
    states: list[Lifecycle] = []

    def again() -> None:
        worker.close()
        states.append(worker._life.state)

    worker.on(event, again)
    worker.start()
    worker.close()
    assert states == [Lifecycle.CLOSING]  # it did not wait for the first close to end
    assert worker._roles is not None and worker._roles.dispatcher.thread is not None
    assert not worker._roles.dispatcher.thread.is_alive()


@pytest.mark.parametrize("state", ["completed", "failed", "active", "delayed"])
def test_an_id_in_the_wait_list_whose_record_is_elsewhere_is_not_run_again(
    queue: Queue, redis_url: str, redis_client: redis.Redis, state: str
) -> None:
    """A take ran any listed id whose record existed: an id pushed twice (a
    flow naming one job twice did) ran a finished job again, or one already
    running a second time at once."""
    job = queue.add("once", 1, job_id="once")
    # the record as that state leaves it; its id listed as waiting all the same
    redis_client.hset(queue._context.keys.job(job.id), "state", state)
    queue.add("next", 2)
    ran: list[str] = []
    with make_worker(queue.name, redis_url, lambda j: ran.append(j.name)) as worker:
        worker.start()
        until(lambda: "next" in ran, WAIT)
    assert ran == ["next"]  # the listed id came first
    assert queue.get_job_state(job.id) == state
    assert queue.get_job_counts("waiting")["waiting"] == 0


@pytest.fixture
def on_signal() -> Iterator[Any]:
    """Install a handler of SIGUSR1 for the test (the main thread runs it)."""
    import signal

    previous = signal.getsignal(signal.SIGUSR1)

    def install(handler: Any) -> None:
        signal.signal(signal.SIGUSR1, lambda signum, frame: handler())

    try:
        yield install
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_forcing_close_from_a_signal_handler_on_the_closing_thread_forces(
    queue: Queue, redis_url: str, on_signal: Any
) -> None:
    """An app's second SIGTERM calls close(force=True) while its first
    close() runs on the same (main) thread: the nested call waited for the
    close it interrupted, for ever. It returns at once and the close under
    way abandons its jobs."""
    import signal

    running, release = threading.Event(), threading.Event()

    def processor(job: Job) -> None:
        running.set()
        release.wait(WAIT)

    nested: list[str] = []

    def handler() -> None:
        nested.append("called")
        worker.close(force=True)
        nested.append("returned")

    on_signal(handler)
    worker = make_worker(queue.name, redis_url, processor).start()
    queue.add("x")
    assert running.wait(WAIT)

    def signal_while_closing() -> None:
        if until(lambda: worker.state.value == "closing", timeout=WAIT):
            os.kill(os.getpid(), signal.SIGUSR1)

    sender = threading.Thread(target=signal_while_closing, name="test-signal")
    sender.start()
    try:
        started = time.monotonic()
        worker.close(timeout=WAIT)  # the handler runs in here
        assert time.monotonic() - started < WAIT / 2  # forced: not the job's WAIT
        assert nested == ["called", "returned"]
        assert worker.state.value == "closed"
    finally:
        release.set()
        sender.join(WAIT)


def test_a_close_from_a_signal_handler_during_start_leaves_the_worker_closed(
    private_server: RedisServer, queue_name: str, on_signal: Any
) -> None:
    """start() waits on the server (here held by CLIENT PAUSE) and a signal
    handler closes the worker meanwhile: start() then set the worker
    running, after close() had returned. It raises ClosedError and runs
    nothing."""
    import signal

    ran: list[str] = []
    with Queue(queue_name, connection=private_server.url) as queue:
        queue.add("x")
    worker = Worker(queue_name, lambda job: ran.append(job.id), connection=private_server.url)
    on_signal(worker.close)
    with private_server.client() as admin:
        admin.execute_command("CLIENT", "PAUSE", 1000, "ALL")
    timer = threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGUSR1))
    timer.start()
    try:
        with pytest.raises(ClosedError, match="closed while it started"):
            worker.start()
    finally:
        timer.join(WAIT)
    assert worker.state.value == "closed" and not worker.is_running()
    assert jobq_threads(queue_name) == [] and ran == []
