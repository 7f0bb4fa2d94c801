"""F3–F8: the server restarts, crashes, stalls, pauses, runs out of memory or
drops connections under jobq. Each test runs on a server of its own."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from jobq import (
    Event,
    Job,
    JobNotFoundError,
    Queue,
    QueueEvents,
    RedisOOMError,
    Worker,
)
from jobq.testing import RedisServer
from tests.faults.harness import (
    ROOT,
    WAIT,
    Ledger,
    Proc,
    check_delivery,
    summary,
)
from tests.polling import until

pytestmark = pytest.mark.fault


def _jobq_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("jobq-") and t.is_alive()}


def _quiesce(q: Queue, timeout: float = 30.0) -> None:
    """Wait until nothing is waiting, delayed or active (polling the server's
    counts is the only way to see that)."""
    deadline = time.monotonic() + timeout
    while True:
        counts = q.get_job_counts("waiting", "delayed", "active")
        if not any(counts.values()):
            return
        assert time.monotonic() < deadline, f"not quiescent after {timeout} s: {counts}"
        threading.Event().wait(0.05)


class _Producer:
    """Adds jobs in a loop in a thread; remembers the ids whose add was acknowledged."""

    def __init__(self, q: Queue, data: dict[str, Any], per_second: float = 0) -> None:
        self.q = q
        self.data = data
        self.acked: list[str] = []
        self.jobs: list[tuple[float, Job]] = []  # (when acknowledged, job)
        self.errors: list[BaseException] = []
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._interval = 1.0 / per_second if per_second else 0.0
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                job = self.q.add("work", self.data)
            except (redis.RedisError, OSError) as exc:
                self.errors.append(exc)
                self._stop.wait(0.02)  # the server is away: do not spin
                continue
            self.latencies.append(time.monotonic() - started)
            self.acked.append(job.id)
            self.jobs.append((time.monotonic(), job))
            if self._interval:
                self._stop.wait(max(0.0, self._interval - (time.monotonic() - started)))

    def __enter__(self) -> _Producer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(WAIT)


# -- F3: restart without persistence ----------------------------------------


def test_f3_restart_without_persistence(
    make_server: Callable[..., RedisServer], spawn: Callable[..., Proc], ledger: Ledger,
    queue_name: str, figure: Callable[[str], None],
) -> None:
    server = make_server()
    url = server.url
    workers = [spawn(url), spawn(url)]
    outcomes: dict[str, tuple[str, float]] = {}
    with Queue(queue_name, connection=url) as q, \
            QueueEvents(queue_name, connection=url) as events:
        assert events.wait_until_ready(WAIT)
        doomed = [q.add("work", {"sleep_all": 3}).id for _ in range(4)]  # 2 active, 2 waiting
        ledger.wait_count(lambda r: r.kind == "start", 2)

        # futures register and check at once, so each is waiting before the outage
        futures = {j: events.future_for(j) for j in doomed}
        for job_id, future in futures.items():
            future.add_done_callback(
                lambda f, j=job_id: outcomes.__setitem__(
                    j, (type(f.exception()).__name__, time.monotonic())))
        threads_before = _jobq_threads()
        server.shutdown(nosave=True)
        down_at = time.monotonic()
        started = time.monotonic()
        with pytest.raises(redis.ConnectionError):
            q.add("work", {})
        add_error_after = time.monotonic() - started
        threading.Event().wait(2.0)  # the outage itself: two seconds without a server
        server.restart()
        up_at = time.monotonic()
        for future in futures.values():
            assert future.exception(WAIT) is not None, "a waiter hangs after the restart"
        # the done-callbacks run on the dispatcher thread, after the futures are set
        until(lambda: len(outcomes) == len(futures), timeout=WAIT)
        assert {o for o, _ in outcomes.values()} == {"JobNotFoundError"}, outcomes
        waiter_latency = max(t for _, t in outcomes.values()) - up_at
        assert waiter_latency <= 6.0  # backoff cap (5 s) + 1 s
        # everything works again: a new job runs through the same objects
        fresh = q.add("work", {"value": "after"})
        assert fresh.wait_until_finished(events, timeout=WAIT) == "after"
        reconnected = time.monotonic() - up_at
        assert _jobq_threads() >= threads_before  # every jobq thread is alive
        for proc in workers:
            assert proc.popen.poll() is None
        with pytest.raises(JobNotFoundError):
            events.wait_for(doomed[-1], timeout=WAIT)  # ids restart at 1: "1" is `fresh`
    figure(
        f"F3 add() raised ConnectionError after {add_error_after * 1000:.0f} ms; waiters got "
        f"JobNotFoundError {waiter_latency * 1000:.0f} ms after restart; first job through "
        f"{reconnected * 1000:.0f} ms after restart (outage {up_at - down_at:.1f} s)"
    )


# -- F4: crash with appendfsync always ---------------------------------------


def test_f4_crash_with_aof_loses_no_acknowledged_add(
    make_server: Callable[..., RedisServer], spawn: Callable[..., Proc], ledger: Ledger,
    queue_name: str, figure: Callable[[str], None],
) -> None:
    server = make_server(appendonly=True)
    url = server.url
    spawn(url, concurrency=4)
    spawn(url, concurrency=4)
    with Queue(queue_name, connection=url) as q:
        with _Producer(q, {"sleep_all": 0.05}, per_second=1000) as producer:
            ledger.wait_count(lambda r: r.kind == "final", 50)
            active = q.get_job_counts("active")["active"]
            server.kill()  # SIGKILL: a crash
            crashed_at = time.monotonic()
            server.restart()
            downtime = time.monotonic() - crashed_at
            acked_at_crash = len(producer.acked)
            ledger.wait_count(lambda r: r.kind == "final", acked_at_crash + 50, timeout=30)
        _quiesce(q)
        # a take whose reply the crash lost leaves a job active that never
        # started: it stalls once more than it ran
        report = check_delivery(q, producer.acked, ledger, stalled_exact=False)
        assert not report.problems, report.problems[:20]
        # duplicates: only jobs active at the crash (plus completions in flight) may re-run
        assert report.duplicates <= active + 8, (report.duplicates, active)
    figure(
        f"F4 acked adds {report.jobs}, lost 0, duplicates {report.duplicates} "
        f"(active at crash {active}), downtime {downtime * 1000:.0f} ms"
    )


# -- F5: the listener's connection is killed ---------------------------------


def test_f5_listener_connection_killed_50_times(
    make_server: Callable[..., RedisServer], queue_name: str, figure: Callable[[str], None],
) -> None:
    server = make_server()
    total, kills = 10_000, 50
    received: list[int] = []
    progress = threading.Condition()
    with Queue(queue_name, connection=server.url, max_events=20_000) as q, \
            QueueEvents(queue_name, connection=server.url) as events, \
            server.client() as admin:

        def on_tick(event: Event) -> None:
            with progress:
                received.append(int(event.fields["n"]))
                progress.notify_all()

        events.on("tick", on_tick)
        assert events.wait_until_ready(WAIT)

        def produce() -> None:
            for n in range(total):
                q.emit("tick", n=n)

        producer = threading.Thread(target=produce, name="producer")
        producer.start()
        killed = 0
        try:
            for k in range(kills):
                with progress:
                    assert progress.wait_for(lambda k=k: len(received) >= k * total // kills,
                                             WAIT)
                deadline = time.monotonic() + WAIT
                while not any(
                    admin.client_kill_filter(_id=client["id"])
                    for client in admin.client_list()
                    if client["name"] == f"jobq-events-{queue_name}"
                ):
                    # the reader is reconnecting: poll the server's client list
                    assert time.monotonic() < deadline, "the reader did not reconnect"
                    threading.Event().wait(0.005)
                killed += 1
        finally:
            producer.join(60)
        with progress:
            assert progress.wait_for(lambda: len(received) >= total, 30), len(received)
        assert received == list(range(total))  # all, in order, none twice
        assert killed == kills
        assert any(t.name.startswith("jobq-dispatch") or t.name.startswith("jobq-events")
                   for t in threading.enumerate())
    figure(f"F5 {total} events over {killed} connection kills: gaps 0, duplicates 0")


def test_f5b_events_trimmed_while_listener_away(
    make_server: Callable[..., RedisServer], ledger: Ledger, queue_name: str, redis_url: str,
    tmp_path: Path, figure: Callable[[str], None],
) -> None:
    server = make_server()
    url = server.url
    with Queue(queue_name, connection=url, max_events=100) as q:
        job = q.add("work", {"value": 42})
        log = tmp_path / "listener.log"
        with log.open("wb") as out:
            listener = subprocess.Popen(
                [sys.executable, "-m", "tests.faults.listener_proc", url, redis_url,
                 queue_name, job.id],
                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
            )
            try:
                ready = ledger.wait_for(lambda r: r.kind == "ready")
                assert ready.pid == listener.pid
                listener.send_signal(19)  # SIGSTOP: the reader is away
                try:
                    q.emit("filler")  # answers the read the reader had in flight
                    with Worker(queue_name, lambda j: j.data["value"], connection=url):
                        assert job.wait_until_finished(timeout=WAIT) == 42
                    for _ in range(400):
                        q.emit("filler")
                    threading.Event().wait(0.5)  # the reader stays away a little longer
                    with server.client() as admin:
                        info = admin.xinfo_stream(f"jobq:{{{queue_name}}}:events")
                        first = info["first-entry"][0].decode()
                    completed_id = q.events.last_event_id  # noqa: F841 - any id works
                finally:
                    listener.send_signal(18)  # SIGCONT
                resumed = time.monotonic()
                outcome = ledger.wait_for(lambda r: r.kind == "outcome", timeout=WAIT)
                latency = outcome.t - resumed
                assert outcome.fields[2] == "42"
                listener.wait(WAIT)
            finally:
                if listener.poll() is None:
                    listener.kill()
                    listener.wait(WAIT)
        output = log.read_text(errors="replace")
        assert "gone before they were read" in output, (output, latency, first)
        assert latency < 3.0, latency  # resynced from the job record, not the 10 s re-check
    figure(f"F5b gap detected (stream now starts at {first}); waiter resolved "
           f"{latency * 1000:.0f} ms after the reader came back")


# -- F6: the server stalls ---------------------------------------------------


def _debug_sleep(server: RedisServer, seconds: float) -> None:
    """Make the server sleep ``seconds`` (DEBUG SLEEP) from a thread of its own."""
    def run() -> None:
        with server.client(socket_timeout=seconds + 5) as admin:
            admin.execute_command("DEBUG", "SLEEP", seconds)

    thread = threading.Thread(target=run, name="debug-sleep", daemon=True)
    thread.start()
    # polling the server is the only way to know it is asleep
    with server.client(socket_timeout=0.05, retry=Retry(NoBackoff(), 0)) as probe:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                probe.ping()
            except redis.TimeoutError:
                return
            threading.Event().wait(0.005)
    raise AssertionError("the server did not go to sleep")


def test_f6_stall_shorter_than_lock(
    make_server: Callable[..., RedisServer], queue_name: str, figure: Callable[[str], None],
) -> None:
    server = make_server()
    url = server.url
    errors: list[BaseException] = []
    with Queue(queue_name, connection=url) as q, \
            Worker(queue_name, lambda j: j.id, connection=url, concurrency=4,
                   lock_duration=1.5, stalled_interval=0.5) as worker:
        worker.on("error", errors.append)
        with _Producer(q, {}, per_second=500) as producer:
            while len(producer.acked) < 200:
                threading.Event().wait(0.01)  # polling the producer's progress
            _debug_sleep(server, 0.5)
            while len(producer.acked) < 600:
                threading.Event().wait(0.01)
        _quiesce(q)
        counts = q.get_job_counts("completed", "failed")
        stalled = sum(q.get_job(j).stalled_counter for j in producer.acked)  # type: ignore[union-attr]
    assert not producer.errors and not errors, (producer.errors, errors)
    assert counts == {"completed": len(producer.acked), "failed": 0}
    assert stalled == 0
    figure(f"F6 DEBUG SLEEP 0.5: add latency {summary(producer.latencies)}, 0 errors, 0 stalls")


def test_f6b_stall_longer_than_lock(
    make_server: Callable[..., RedisServer], spawn: Callable[..., Proc], ledger: Ledger,
    queue_name: str, figure: Callable[[str], None],
) -> None:
    server = make_server()
    url = server.url
    procs = [spawn(url, concurrency=4), spawn(url, concurrency=4)]
    with Queue(queue_name, connection=url) as q:
        ids = [j.id for j in q.add_bulk({"name": "work", "data": {"sleep_all": 0.3}}
                                        for _ in range(100))]
        ledger.wait_count(lambda r: r.kind == "final", 10)
        _debug_sleep(server, 2.0)  # locks (1 s) expire while the server sleeps
        _quiesce(q, 60)
        report = check_delivery(q, ids, ledger)
        assert not report.problems, report.problems[:20]
        for proc in procs:
            assert proc.popen.poll() is None
        # the workers still work
        after = q.add("work", {"value": "after"})
        assert after.wait_until_finished(timeout=WAIT) == "after"
    figure(f"F6b DEBUG SLEEP 2 with 1 s locks: {report.duplicates} re-run(s) "
           f"({report.stalled} stall(s)), lost 0, finalised twice 0")


def test_f6c_ambiguous_add_with_job_id_is_idempotent(
    make_server: Callable[..., RedisServer], queue_name: str,
) -> None:
    server = make_server()
    impatient = server.client(socket_timeout=0.3, retry=Retry(NoBackoff(), 0))
    try:
        with Queue(queue_name, connection=impatient) as q:
            q.add("warm-up")  # loads the add script: the timed-out call will run
            _debug_sleep(server, 1.5)
            with pytest.raises(redis.TimeoutError):
                q.add("work", {"n": 1}, job_id="order-x")
        with Queue(queue_name, connection=server.url) as q:
            job = q.add("work", {"n": 1}, job_id="order-x")  # the caller retries
            assert job.id == "order-x"
            assert q.get_job_counts("waiting")["waiting"] == 2  # warm-up and order-x
            with server.client() as admin:
                names = [f[b"ev"] for _, f in admin.xrange(f"jobq:{{{queue_name}}}:events")]
            assert names.count(b"added") == 2 and names.count(b"duplicated") == 1
    finally:
        impatient.close()


def test_f6d_client_pause_write(
    make_server: Callable[..., RedisServer], spawn: Callable[..., Proc], ledger: Ledger,
    queue_name: str, figure: Callable[[str], None],
) -> None:
    server = make_server()
    url = server.url
    # the pause (2 s) is shorter than the lock (3 s): no lock may lapse. A pause
    # longer than the lock re-runs jobs, as a stall does (F6b): lock deadlines
    # are absolute, and a stalled check may run before a renewal after it.
    spawn(url, concurrency=4, lock=3.0)
    spawn(url, concurrency=4, lock=3.0)
    with Queue(queue_name, connection=url) as q, server.client() as admin:
        with _Producer(q, {"sleep_all": 0.2}, per_second=200) as producer:
            ledger.wait_count(lambda r: r.kind == "final", 20)
            admin.execute_command("CLIENT", "PAUSE", 2000, "WRITE")
            paused_at = time.monotonic()
            ledger.wait_for(lambda r: r.kind == "final" and r.t > paused_at + 2.0, timeout=WAIT)
        _quiesce(q)
        report = check_delivery(q, producer.acked, ledger)
    assert not report.problems, report.problems[:20]
    assert not producer.errors, producer.errors[:3]
    assert report.duplicates == 0 and report.stalled == 0
    assert max(producer.latencies) >= 1.5  # writers did block
    figure(f"F6d CLIENT PAUSE WRITE 2 s: max add latency {max(producer.latencies):.2f} s, "
           f"duplicates 0, {report.jobs} jobs")


# -- F7: out of memory -------------------------------------------------------


def test_f7_out_of_memory(
    make_server: Callable[..., RedisServer], queue_name: str, caplog: pytest.LogCaptureFixture,
) -> None:
    server = make_server()
    url = server.url
    go = threading.Event()
    errors: list[BaseException] = []

    def handler(job: Any) -> Any:
        if job.data == "hold":
            assert go.wait(WAIT)
        return job.data

    with Queue(queue_name, connection=url) as q, server.client() as admin, \
            Worker(queue_name, handler, connection=url, lock_duration=1.0,
                   stalled_interval=0.5) as worker:
        worker.on("error", errors.append)
        held = q.add("work", "hold")
        later = q.add("work", "later")
        deadline = time.monotonic() + WAIT
        while q.get_job_state(held.id) != "active":  # polling the server's state
            assert time.monotonic() < deadline
            threading.Event().wait(0.01)
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", 1)
        try:
            with pytest.raises(RedisOOMError) as refused:
                q.add("work", "refused", job_id="oom-refused")
            assert isinstance(refused.value, redis.exceptions.OutOfMemoryError)
            assert "maxmemory" in str(refused.value)
            assert not admin.exists(f"jobq:{{{queue_name}}}:job:oom-refused")
            # the OOM lasts twice the lock: renewal (allow-oom) keeps the lock
            threading.Event().wait(2.0)  # the fault's duration
            assert q.get_job_state(held.id) == "active"
            assert admin.pttl(f"jobq:{{{queue_name}}}:lock:{held.id}") > 0
            go.set()  # completion is allowed while out of memory
            assert held.wait_until_finished(timeout=WAIT) == "hold"
            # a fetch is refused while out of memory, and so is a completion's
            # take of the next job (the completion alone runs)
            assert q.get_job_state(later.id) == "waiting"
        finally:
            admin.config_set("maxmemory", 0)
        assert later.wait_until_finished(timeout=WAIT) == "later"
        assert q.get_job(held.id).stalled_counter == 0  # type: ignore[union-attr]
    assert not any(isinstance(e, Exception) and "LockLost" in type(e).__name__ for e in errors)


def test_f7_warns_when_eviction_policy_is_not_noeviction(
    make_server: Callable[..., RedisServer], queue_name: str, caplog: pytest.LogCaptureFixture,
) -> None:
    server = make_server(extra_args=("--maxmemory-policy", "allkeys-lru"))
    with caplog.at_level(logging.WARNING, logger="jobq"):
        with Queue(queue_name, connection=server.url) as queue:
            queue.count()  # the check runs on first use (no I/O in the constructor)
        worker = Worker(queue_name, lambda j: None, connection=server.url)
        ready = threading.Event()
        worker.on("ready", ready.set)
        with worker:  # the check runs when its fetch connects
            assert ready.wait(WAIT)
    warnings = [r for r in caplog.records if "allkeys-lru" in r.getMessage()]
    assert len(warnings) >= 2, [r.getMessage() for r in caplog.records]
    assert "noeviction" in warnings[0].getMessage()


# -- F8: a 10 s outage -------------------------------------------------------


def test_f8_outage_idle_cpu_and_bounded_logs(
    make_server: Callable[..., RedisServer], spawn: Callable[..., Proc], ledger: Ledger,
    queue_name: str, figure: Callable[[str], None],
) -> None:
    server = make_server()
    url = server.url
    proc = spawn(url, concurrency=4)
    with Queue(queue_name, connection=url) as q:
        assert q.add("work", {"value": 1}).wait_until_finished(timeout=WAIT) == 1
        lines_before = len(proc.output().splitlines())
        server.shutdown(nosave=True)
        usage = psutil.Process(proc.pid)
        cpu_before = sum(usage.cpu_times()[:2])
        started = time.monotonic()
        threading.Event().wait(10.0)  # the outage itself
        elapsed = time.monotonic() - started
        cpu = (sum(usage.cpu_times()[:2]) - cpu_before) / elapsed
        log_lines = len(proc.output().splitlines()) - lines_before
        server.restart()
        restarted = time.monotonic()
        assert q.add("work", {"value": 2}).wait_until_finished(timeout=WAIT) == 2
        resumed = time.monotonic() - restarted
        assert proc.popen.poll() is None
    assert cpu < 0.05, cpu
    assert log_lines <= 40, proc.output()[-4000:]
    figure(f"F8 10 s outage: worker CPU {cpu * 100:.2f} %, {log_lines} log lines "
           f"({log_lines / elapsed:.1f}/s), job through {resumed * 1000:.0f} ms after restart")
