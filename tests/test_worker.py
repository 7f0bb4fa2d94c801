"""Tests of Worker: running jobs, retries, timeouts, locks, stalls, closing, listeners.

Every test runs against the real server of tests/conftest.py. Waits are bounded
(threading.Event / Condition with a timeout, ``wait_until_finished(timeout=)``)
and their results asserted; timings are short (lock 1 s, stalled check 0.5 s).
Tests that need a worker to die run it in a child process (tests/worker_proc.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from jobq import (
    ClosedError,
    Job,
    JobFailedError,
    JobqError,
    JobTimeoutError,
    LockLostError,
    Queue,
    QueueEvents,
    UnrecoverableError,
    Worker,
)
from jobq.calls import TakeArgs, WorkerScripts
from jobq.keys import QueueKeys
from tests import worker_proc
from tests.polling import until

ROOT = Path(__file__).resolve().parent.parent
#: Bound for waits that should end much sooner; a hang fails, it does not stall the suite.
WAIT = 10.0
LOCK = 1.0
INTERVAL = 0.5
CLUSTER = os.environ.get("JOBQ_TEST_CLUSTER") == "1"
#: Server timestamps are whole milliseconds in stream ids: allow for rounding.
MS = 0.0015


# -- helpers ----------------------------------------------------------------


def make_worker(queue_name: str, redis_url: str, processor: Any, **options: Any) -> Worker:
    """A Worker with the short test timings unless overridden."""
    options.setdefault("lock_duration", LOCK)
    options.setdefault("stalled_interval", INTERVAL)
    return Worker(queue_name, processor, connection=redis_url, **options)


class Recorder:
    """Records listener calls; lets a test wait (bounded) for them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self._cond = threading.Condition()

    def listener(self, name: str) -> Callable[..., None]:
        def callback(*args: Any) -> None:
            with self._cond:
                self.calls.append((name, args))
                self._cond.notify_all()

        return callback

    def attach(self, worker: Worker, *names: str) -> Recorder:
        for name in names:
            worker.on(name, self.listener(name))
        return self

    def of(self, name: str) -> list[tuple[Any, ...]]:
        with self._cond:
            return [args for n, args in self.calls if n == name]

    def wait(self, name: str, count: int = 1, timeout: float = WAIT) -> bool:
        with self._cond:
            return self._cond.wait_for(
                lambda: sum(1 for n, _ in self.calls if n == name) >= count, timeout
            )

    def names(self) -> list[str]:
        with self._cond:
            return [n for n, _ in self.calls]


def events_key(queue_name: str) -> str:
    return f"jobq:{{{queue_name}}}:events"


def lock_key(queue_name: str, job_id: str) -> str:
    return f"jobq:{{{queue_name}}}:lock:{job_id}"


def job_key(queue_name: str, job_id: str) -> str:
    return f"jobq:{{{queue_name}}}:job:{job_id}"


def stream(
    client: redis.Redis, queue_name: str, name: str | None = None, job_id: str | None = None
) -> list[dict[str, Any]]:
    """The queue's stream events, oldest first: name, job_id, ts (s) and raw fields."""
    out = []
    for entry_id, raw in client.xrange(events_key(queue_name)):
        fields = {k.decode(): v for k, v in raw.items()}
        event = {
            "name": fields["ev"].decode(),
            "job_id": fields["jid"].decode() or None,
            "ts": int(entry_id.split(b"-")[0]) / 1000.0,
            "fields": fields,
        }
        if (name is None or event["name"] == name) and (
            job_id is None or event["job_id"] == job_id
        ):
            out.append(event)
    return out


def stream_names(client: redis.Redis, queue_name: str, job_id: str) -> list[str]:
    return [e["name"] for e in stream(client, queue_name, job_id=job_id)]


def jobq_threads(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix) and t.is_alive()]


def wait_ready(worker: Worker) -> None:
    """Start ``worker`` and wait until its first fetch happened."""
    ready = threading.Event()
    worker.once("ready", ready.set)
    worker.start()
    assert ready.wait(WAIT), "worker never became ready"


@contextlib.contextmanager
def started(worker: Worker) -> Iterator[Worker]:
    """Run ``worker`` (closing it at the end) once its first fetch happened."""
    ready = threading.Event()
    worker.once("ready", ready.set)
    with worker:
        assert ready.wait(WAIT), "worker never became ready"
        yield worker


# -- processor, results -----------------------------------------------------


def test_processor_gets_job_and_result_is_stored(queue: Queue, redis_url: str) -> None:
    seen: dict[str, Any] = {}

    def handler(job: Job) -> Any:
        seen.update(
            job=job, id=job.id, name=job.name, data=job.data, attempts_made=job.attempts_made
        )
        return {"sum": job.data["a"] + job.data["b"], "list": [1, "two"]}

    with make_worker(queue.name, redis_url, handler, name="w-custom") as worker:
        job = queue.add("add", {"a": 1, "b": 2})
        assert job.wait_until_finished(timeout=WAIT) == {"sum": 3, "list": [1, "two"]}
    assert isinstance(seen["job"], Job)
    assert seen["id"] == job.id
    assert seen["name"] == "add"
    assert seen["data"] == {"a": 1, "b": 2}
    assert seen["attempts_made"] == 0
    stored = queue.get_job(job.id)
    assert stored is not None
    assert stored.get_state() == "completed"
    assert stored.return_value == {"sum": 3, "list": [1, "two"]}
    assert queue.get_job_result(job.id) == {"sum": 3, "list": [1, "two"]}
    assert stored.attempts_made == 1
    assert stored.processed_by == worker.name == "w-custom"
    assert stored.processed_on is not None and stored.finished_on is not None
    assert stored.finished_on >= stored.processed_on >= (stored.timestamp or 0)


def test_default_worker_name_is_recorded_as_processed_by(queue: Queue, redis_url: str) -> None:
    with make_worker(queue.name, redis_url, lambda job: job.id) as worker:
        job = queue.add("x")
        assert job.wait_until_finished(timeout=WAIT) == job.id
    assert worker.name
    stored = queue.get_job(job.id)
    assert stored is not None and stored.processed_by == worker.name


def test_none_result(queue: Queue, redis_url: str) -> None:
    rec = Recorder()
    with make_worker(queue.name, redis_url, lambda job: None) as worker:
        rec.attach(worker, "completed")
        job = queue.add("nothing")
        assert job.wait_until_finished(timeout=WAIT) is None
        assert rec.wait("completed")
    assert queue.get_job_state(job.id) == "completed"
    assert queue.get_job_result(job.id, default="missing") is None
    ((done_job, result),) = rec.of("completed")
    assert done_job.id == job.id and result is None


def test_dict_processor_routes_by_name_and_unknown_name_fails(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    routes = {"upper": lambda job: job.data.upper(), "double": lambda job: job.data * 2}
    with make_worker(queue.name, redis_url, routes) as worker:
        rec = Recorder().attach(worker, "failed")
        up = queue.add("upper", "abc")
        nope = queue.add("nope", "x", attempts=3)
        dbl = queue.add("double", 21)
        assert up.wait_until_finished(timeout=WAIT) == "ABC"
        with pytest.raises(JobFailedError) as info:
            nope.wait_until_finished(timeout=WAIT)
        assert dbl.wait_until_finished(timeout=WAIT) == 42
        assert worker.is_running()
    # an ordinary failed attempt, retried per attempts, naming the known names
    reason = info.value.failed_reason or ""
    assert reason.startswith("JobqError: no processor for job name 'nope'")
    assert reason.endswith("it handles 'double', 'upper'")
    assert info.value.exc_type == "JobqError"
    stored = queue.get_job(nope.id)
    assert stored is not None and stored.get_state() == "failed"
    assert stored.attempts_made == 3 and stored.failed_reason == reason
    assert stream(redis_client, queue.name, "failed", nope.id)
    assert [f[0].id for f in rec.of("failed")] == [nope.id] * 3
    assert all("nope" in str(exc) for _, exc in rec.of("failed"))


def test_corrupt_job_data_fails_the_job_and_the_worker_goes_on(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    bad = queue.add("bad", {"ok": True})
    redis_client.hset(job_key(queue.name, bad.id), "data", b"\xc1")  # never valid msgpack
    good = queue.add("good", 1)
    with make_worker(queue.name, redis_url, lambda job: job.data + 1):
        with pytest.raises(JobFailedError) as info:
            bad.wait_until_finished(timeout=WAIT)
        assert good.wait_until_finished(timeout=WAIT) == 2
    assert info.value.failed_reason


def test_corrupt_job_data_is_retried_under_its_backoff_keeping_each_stack_trace(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    """Data a worker cannot decode (a type another process registered, say)
    fails each attempt like any failure: the job's backoff between them,
    one stack trace each (they were retried at once, each trace replacing
    the one before)."""
    bad = queue.add("bad", {"ok": True}, attempts=3, backoff=0.05)
    redis_client.hset(job_key(queue.name, bad.id), "data", b"\xc1")  # never valid msgpack
    delays: list[float] = []
    with QueueEvents(queue.name, connection=redis_url) as events:
        events.on("retrying", lambda e: delays.append(e.fields["delay"]))
        assert events.wait_until_ready(WAIT)  # it reads from "$": the first one too
        with make_worker(queue.name, redis_url, lambda job: None):
            with pytest.raises(JobFailedError):
                bad.wait_until_finished(events, timeout=WAIT)
        assert until(lambda: len(delays) == 2, timeout=WAIT)
    assert delays == [0.05, 0.05]
    assert len(bad.refresh().stacktrace) == 3


# -- concurrency -------------------------------------------------------------


def test_concurrency_four_runs_four_handlers_at_once(queue: Queue, redis_url: str) -> None:
    barrier = threading.Barrier(4, timeout=5)

    def handler(job: Job) -> int:
        barrier.wait()
        return int(job.data)

    with make_worker(queue.name, redis_url, handler, concurrency=4):
        jobs = [queue.add("meet", i) for i in range(4)]
        assert [job.wait_until_finished(timeout=WAIT) for job in jobs] == [0, 1, 2, 3]


def test_concurrency_one_runs_one_job_at_a_time(queue: Queue, redis_url: str) -> None:
    lock = threading.Lock()
    running = [0]
    most = [0]
    started: dict[int, threading.Event] = {i: threading.Event() for i in range(3)}
    release = threading.Event()

    def handler(job: Job) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            started[job.data].set()
            if job.data == 0:
                assert release.wait(5)
            return int(job.data)
        finally:
            with lock:
                running[0] -= 1

    with make_worker(queue.name, redis_url, handler, concurrency=1):
        jobs = [queue.add("one", i) for i in range(3)]
        assert started[0].wait(WAIT)
        assert not started[1].wait(0.3), "a second job started while the first ran"
        release.set()
        assert [job.wait_until_finished(timeout=WAIT) for job in jobs] == [0, 1, 2]
    assert most[0] == 1


# -- retries and backoff -------------------------------------------------------


def _flaky(failures: int) -> tuple[Callable[[Job], str], list[int]]:
    """A handler that fails its first ``failures`` calls, then returns "ok"."""
    calls: list[int] = []

    def handler(job: Job) -> str:
        calls.append(job.attempts_made)
        if len(calls) <= failures:
            raise ValueError(f"boom {len(calls)}")
        return "ok"

    return handler, calls


def test_retries_then_success(queue: Queue, redis_url: str, redis_client: redis.Redis) -> None:
    handler, calls = _flaky(2)
    with make_worker(queue.name, redis_url, handler) as worker:
        rec = Recorder().attach(worker, "failed", "completed")
        job = queue.add("flaky", attempts=3)
        assert job.wait_until_finished(timeout=WAIT) == "ok"
        assert rec.wait("completed")
    assert calls == [0, 1, 2]
    failed = rec.of("failed")
    assert len(failed) == 2
    for n, (failed_job, exc) in enumerate(failed, start=1):
        assert failed_job.id == job.id
        assert isinstance(exc, ValueError) and str(exc) == f"boom {n}"
    stored = queue.get_job(job.id)
    assert stored is not None
    assert stored.attempts_made == 3
    assert stored.return_value == "ok"
    assert len(stored.stacktrace) == 2
    assert "boom 1" in stored.stacktrace[0] and "boom 2" in stored.stacktrace[1]
    names = stream_names(redis_client, queue.name, job.id)
    assert names.count("retrying") == 2
    assert "failed" not in names
    assert names.count("completed") == 1
    attempts = [int(e["fields"]["attempt"]) for e in stream(redis_client, queue.name, "active")]
    assert attempts == [1, 2, 3]


def test_retries_exhausted_fail_with_last_reason(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    handler, calls = _flaky(99)
    with make_worker(queue.name, redis_url, handler) as worker:
        rec = Recorder().attach(worker, "failed")
        job = queue.add("doomed", attempts=3)
        with pytest.raises(JobFailedError) as info:
            job.wait_until_finished(timeout=WAIT)
        assert rec.wait("failed", 3)
    assert info.value.failed_reason == "ValueError: boom 3"
    assert info.value.exc_type == "ValueError"
    assert info.value.job_id == job.id
    assert len(calls) == 3
    stored = queue.get_job(job.id)
    assert stored is not None
    assert stored.get_state() == "failed"
    assert stored.failed_reason == "ValueError: boom 3"
    assert stored.attempts_made == 3
    assert len(stored.stacktrace) == 3
    names = stream_names(redis_client, queue.name, job.id)
    assert names.count("failed") == 1
    assert names.count("retrying") == 2
    assert len(rec.of("failed")) == 3


def _retry_gaps(client: redis.Redis, queue_name: str, job_id: str) -> list[tuple[float, float]]:
    """(announced delay, time from the retrying event to the next active) per retry."""
    gaps = []
    pending: dict[str, Any] | None = None
    for event in stream(client, queue_name, job_id=job_id):
        if event["name"] == "retrying":
            pending = event
        elif event["name"] == "active" and pending is not None:
            delay = float(pending["fields"]["delay"]) / 1000.0
            gaps.append((delay, event["ts"] - pending["ts"]))
            pending = None
    return gaps


@pytest.mark.parametrize(
    ("backoff", "delays"),
    [(0.2, [0.2, 0.2]), ({"type": "exponential", "delay": 0.1}, [0.1, 0.2])],
    ids=["fixed", "exponential"],
)
def test_backoff_spaces_attempts(
    queue: Queue, redis_url: str, redis_client: redis.Redis, backoff: Any, delays: list[float]
) -> None:
    handler, _ = _flaky(2)
    with make_worker(queue.name, redis_url, handler):
        job = queue.add("flaky", attempts=3, backoff=backoff)
        assert job.wait_until_finished(timeout=WAIT) == "ok"
    gaps = _retry_gaps(redis_client, queue.name, job.id)
    assert [d for d, _ in gaps] == delays
    for delay, gap in gaps:
        assert gap >= delay - MS, gaps


def test_backoff_jitter_stays_within_bounds(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    handler, _ = _flaky(3)
    with make_worker(queue.name, redis_url, handler):
        job = queue.add("flaky", attempts=4, backoff={"type": "fixed", "delay": 0.2, "jitter": 0.5})
        assert job.wait_until_finished(timeout=WAIT) == "ok"
    gaps = _retry_gaps(redis_client, queue.name, job.id)
    assert len(gaps) == 3
    for delay, gap in gaps:
        assert 0.1 - MS <= delay <= 0.2 + MS, gaps
        assert gap >= delay - MS, gaps


def test_unrecoverable_error_fails_at_once(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    calls = []

    def handler(job: Job) -> None:
        calls.append(job.id)
        raise UnrecoverableError("give up")

    with make_worker(queue.name, redis_url, handler) as worker:
        rec = Recorder().attach(worker, "failed")
        job = queue.add("hopeless", attempts=5, backoff=0.05)
        with pytest.raises(JobFailedError) as info:
            job.wait_until_finished(timeout=WAIT)
        assert rec.wait("failed")
    assert info.value.failed_reason == "UnrecoverableError: give up"
    assert info.value.exc_type == "UnrecoverableError"
    assert calls == [job.id]
    stored = queue.get_job(job.id)
    assert stored is not None and stored.attempts_made == 1
    names = stream_names(redis_client, queue.name, job.id)
    assert "retrying" not in names and names.count("failed") == 1
    ((_, exc),) = rec.of("failed")
    assert isinstance(exc, UnrecoverableError)


class CustomBaseError(BaseException):
    """Not an Exception: handlers may still raise it."""


def test_base_exceptions_fail_the_attempt_and_the_worker_goes_on(
    queue: Queue, redis_url: str
) -> None:
    raised: list[BaseException] = [
        KeyboardInterrupt(),
        SystemExit(3),
        GeneratorExit(),
        CustomBaseError("custom"),
    ]
    expected = ["KeyboardInterrupt", "SystemExit: 3", "GeneratorExit", "CustomBaseError: custom"]

    def handler(job: Job) -> str:
        if job.data < len(raised):
            raise raised[job.data]
        return "fine"

    with make_worker(queue.name, redis_url, handler) as worker:
        rec = Recorder().attach(worker, "failed")
        jobs = [queue.add("b", i) for i in range(len(raised))]
        after = queue.add("b", len(raised))
        for job, reason in zip(jobs, expected, strict=True):
            with pytest.raises(JobFailedError) as info:
                job.wait_until_finished(timeout=WAIT)
            assert info.value.failed_reason == reason
        assert after.wait_until_finished(timeout=WAIT) == "fine"
        assert worker.is_running()
        assert rec.wait("failed", len(raised))
    assert [type(exc) for _, exc in rec.of("failed")] == [type(e) for e in raised]


# -- per-attempt timeout ------------------------------------------------------


def test_timeout_fails_attempt_cancels_and_discards_late_result(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    handed: list[Job] = []
    returned = threading.Event()
    saw_cancel: list[bool] = []

    def handler(job: Job) -> str:
        if job.name == "next":
            return "next"
        handed.append(job)
        saw_cancel.append(job.cancelled.wait(5))
        returned.set()
        return "late"

    with make_worker(queue.name, redis_url, handler) as worker:
        rec = Recorder().attach(worker, "failed", "completed")
        job = queue.add("slow", timeout=0.3)
        with pytest.raises(JobFailedError) as info:
            job.wait_until_finished(timeout=WAIT)
        assert returned.wait(WAIT)
        # concurrency=1: "next" runs only once the late return was handled
        after = queue.add("next")
        assert after.wait_until_finished(timeout=WAIT) == "next"
    reason = info.value.failed_reason or ""
    assert "timed out" in reason and "0.3" in reason
    assert saw_cancel == [True]
    assert handed[0].is_cancelled() and handed[0].cancelled.is_set()
    ((failed_job, exc),) = rec.of("failed")
    assert failed_job.id == job.id
    assert isinstance(exc, JobTimeoutError) and reason == f"JobTimeoutError: {exc}"
    assert info.value.exc_type == "JobTimeoutError"
    stored = queue.get_job(job.id)
    assert stored is not None
    assert stored.get_state() == "failed"
    assert stored.return_value is None
    assert stored.failed_reason == reason
    names = stream_names(redis_client, queue.name, job.id)
    assert "completed" not in names and names.count("failed") == 1
    assert [args[0].id for args in rec.of("completed")] == [after.id]


def test_an_attempt_that_no_longer_owns_its_job_cannot_change_it(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    """A timed-out attempt's handler, still running once its job failed for
    good, overwrote the job's data (a later retry() ran with it), wrote a
    log line, and emitted progress after `failed`. Each now raises
    LockLostError and writes nothing; the job's own attempt writes as
    before."""
    late: dict[str, Any] = {}
    done = threading.Event()

    def handler(job: Job) -> str:
        if job.name == "next":
            job.update_progress(50)  # the owner writes
            job.log("mine")
            return "next"
        assert job.cancelled.wait(5)
        assert until(lambda: queue.get_job_state(job.id) == "failed", timeout=WAIT)
        for call, args in ((job.update_data, ("late",)), (job.update_progress, (99,)),
                           (job.log, ("late line",))):
            try:
                call(*args)
                late[call.__name__] = None
            except Exception as exc:
                late[call.__name__] = exc
        done.set()
        return "late"

    with make_worker(queue.name, redis_url, handler) as worker:
        # once its handler returned, the Job writes as any other
        worker.on("completed", lambda job, result: job.log("from a listener"))
        job = queue.add("slow", "original", timeout=0.2)
        with pytest.raises(JobFailedError):
            job.wait_until_finished(timeout=WAIT)
        assert done.wait(WAIT)
        after = queue.add("next")
        assert after.wait_until_finished(timeout=WAIT) == "next"
    assert set(late) == {"update_data", "update_progress", "log"}
    assert all(isinstance(exc, LockLostError) for exc in late.values()), late
    stored = queue.get_job(job.id)
    assert stored is not None and stored.data == "original" and stored.progress is None
    assert stored.get_logs() == []
    assert "progress" not in stream_names(redis_client, queue.name, job.id)
    kept = queue.get_job(after.id)
    assert kept is not None and kept.progress == 50
    assert until(lambda: kept.get_logs() == ["mine", "from a listener"], timeout=WAIT)


def test_timed_out_handler_raising_later_does_not_fail_the_job_again(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    raised = threading.Event()

    def handler(job: Job) -> str:
        if job.name == "next":
            return "next"
        assert job.cancelled.wait(5)
        raised.set()
        raise RuntimeError("too late")

    with make_worker(queue.name, redis_url, handler) as worker:
        rec = Recorder().attach(worker, "failed")
        job = queue.add("slow", timeout=0.2, attempts=1)
        with pytest.raises(JobFailedError) as info:
            job.wait_until_finished(timeout=WAIT)
        assert raised.wait(WAIT)
        assert queue.add("next").wait_until_finished(timeout=WAIT) == "next"
    assert "timed out" in (info.value.failed_reason or "")
    assert len(rec.of("failed")) == 1
    stored = queue.get_job(job.id)
    assert stored is not None and stored.failed_reason == info.value.failed_reason
    assert stored.attempts_made == 1
    assert stream_names(redis_client, queue.name, job.id).count("failed") == 1


def test_timed_out_attempt_keeps_its_pool_slot(queue: Queue, redis_url: str) -> None:
    release = threading.Event()
    order: list[str] = []

    def handler(job: Job) -> str:
        if job.name == "stuck":
            assert job.cancelled.wait(5)
            assert release.wait(5)
            order.append("stuck returned")
            return "late"
        order.append("second started")
        return "second"

    with make_worker(queue.name, redis_url, handler, concurrency=1) as worker:
        started = Recorder().attach(worker, "active")
        stuck = queue.add("stuck", timeout=0.3)
        second = queue.add("second")
        with pytest.raises(JobFailedError):
            stuck.wait_until_finished(timeout=WAIT)
        assert not started.wait("active", 2, timeout=0.4), "next job took the stuck slot"
        assert queue.get_job_state(second.id) == "waiting"
        release.set()
        assert second.wait_until_finished(timeout=WAIT) == "second"
    assert order == ["stuck returned", "second started"]


def test_close_without_a_timeout_waits_for_the_handler_of_a_timed_out_attempt(
    queue: Queue, redis_url: str
) -> None:
    """Its thread was left running user code after close() returned (and a
    process exiting then killed the handler half-way)."""
    release = threading.Event()
    order: list[str] = []

    def handler(job: Job) -> None:
        assert job.cancelled.wait(5)
        assert release.wait(10)
        order.append("handler returned")

    worker = make_worker(queue.name, redis_url, handler).start()
    job = queue.add("stuck", timeout=0.2)
    with pytest.raises(JobFailedError):
        job.wait_until_finished(timeout=WAIT)

    def close() -> None:
        worker.close()
        order.append("closed")

    closer = threading.Thread(target=close)
    closer.start()
    closer.join(1.0)  # a close that does not wait returns within this
    release.set()
    closer.join(WAIT)
    assert not closer.is_alive()
    assert order == ["handler returned", "closed"]


# -- limiter -------------------------------------------------------------------


def test_limiter_is_shared_by_workers_of_a_queue(queue: Queue, redis_url: str) -> None:
    limiter = {"max": 2, "duration": 0.5}
    jobs = [queue.add("limited", i) for i in range(6)]
    with (
        make_worker(queue.name, redis_url, lambda job: job.data, concurrency=2, limiter=limiter),
        make_worker(queue.name, redis_url, lambda job: job.data, concurrency=2, limiter=limiter),
    ):
        assert [job.wait_until_finished(timeout=WAIT) for job in jobs] == list(range(6))
    starts = []
    for job in jobs:
        stored = queue.get_job(job.id)
        assert stored is not None and stored.processed_on is not None
        starts.append(stored.processed_on)
    starts.sort()
    t0 = starts[0]
    assert sum(1 for t in starts if t < t0 + 0.5 - MS) <= 2, starts
    # windows of 0.5 s each allow 2 starts: any 5 starts span more than a window
    for i in range(len(starts) - 4):
        assert starts[i + 4] - starts[i] >= 0.5 - MS, starts
    assert starts[-1] - t0 >= 1.0 - MS, starts


def test_a_limiter_key_that_holds_no_count_is_started_afresh(
    queue: Queue, redis_url: str, redis_client: Any
) -> None:
    """A limiter key set by hand to no number made every take fail (a Lua
    comparison with nil), with no ttl to end it: the worker took nothing."""
    redis_client.set(queue._context.keys.base + "limiter", "abc")
    job = queue.add("limited", 1)
    with make_worker(queue.name, redis_url, lambda job: job.data,
                     limiter={"max": 2, "duration": 0.5}):
        assert job.wait_until_finished(timeout=WAIT) == 1


# -- locks, stalls ---------------------------------------------------------------


def test_lock_is_renewed_for_a_job_longer_than_its_lock(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    def handler(job: Job) -> bool:
        return job.cancelled.wait(3 * LOCK)  # runs 3 lock durations, unless cancelled

    with (
        # the suite's lock (1 s, renewed every 0.5 s): a renewal late by up
        # to half a second on a busy machine still keeps it
        make_worker(queue.name, redis_url, handler) as worker,
        # a second worker checking for stalls often: a lapsed lock would be seen
        make_worker(queue.name, redis_url, handler, stalled_interval=0.2) as other,
    ):
        rec = Recorder().attach(worker, "error")
        rec.attach(other, "error")
        job = queue.add("long")
        assert job.wait_until_finished(timeout=WAIT) is False
    stored = queue.get_job(job.id)
    assert stored is not None
    assert stored.stalled_counter == 0
    assert stored.attempts_made == 1
    names = stream_names(redis_client, queue.name, job.id)
    assert "stalled" not in names
    assert names.count("active") == 1
    assert rec.of("error") == []


class Proc:
    """A tests/worker_proc.py child process, killed and reaped on exit."""

    def __init__(self, redis_url: str, queue_name: str, mode: str, log: Path) -> None:
        self.log = log
        self._out = log.open("wb")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "tests.worker_proc", redis_url, queue_name, mode],
            cwd=ROOT,
            stdout=self._out,
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        self._out.flush()
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        try:
            if self.popen.poll() is None:
                self.popen.kill()
            self.popen.wait(10)
        finally:
            self._out.close()


def ledger_wait(client: redis.Redis, queue_name: str, prefix: str, proc: Proc) -> str:
    """Pop the child's ledger until an entry starting with ``prefix`` (bounded)."""
    deadline = time.monotonic() + 20
    while True:
        left = deadline - time.monotonic()
        item = None
        if left > 0:
            item = client.blpop([worker_proc.ledger_key(queue_name)], timeout=min(left, 1))
        if item is not None:
            entry = item[1].decode()
            if entry.startswith(prefix):
                return entry
            continue
        if left <= 0 or proc.popen.poll() is not None:
            raise AssertionError(
                f"no {prefix!r} in the ledger (exit {proc.popen.poll()}): {proc.output()}"
            )


def test_stalled_job_of_a_killed_worker_runs_again_once(
    queue: Queue, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    job = queue.add("work", "payload")
    proc = Proc(redis_url, queue.name, "block", tmp_path / "child.log")
    try:
        entry = ledger_wait(redis_client, queue.name, "start|", proc)
        assert entry == f"start|{job.id}|{proc.popen.pid}"
        worker = make_worker(queue.name, redis_url, lambda job: f"recovered {job.data}")
        rec = Recorder().attach(worker, "stalled", "active")
        with started(worker):
            proc.popen.kill()
            assert proc.popen.wait(10) == -signal.SIGKILL
            killed = time.monotonic()
            assert job.wait_until_finished(timeout=WAIT) == "recovered payload"
            recovery = time.monotonic() - killed
            assert rec.wait("stalled")
    finally:
        proc.stop()
        redis_client.delete(worker_proc.ledger_key(queue.name))
    # the lock's end and two stall checks, with room for a slow machine; far
    # less than the default lock and stall interval (30 s each)
    assert recovery <= LOCK + 2 * INTERVAL + 3.0
    assert rec.of("stalled") == [(job.id,)]
    stored = queue.get_job(job.id)
    assert stored is not None
    assert stored.stalled_counter == 1
    assert stored.attempts_made == 1
    assert stored.processed_by == worker.name
    names = stream_names(redis_client, queue.name, job.id)
    assert names.count("stalled") == 1
    assert names.count("completed") == 1
    assert names.count("active") == 2
    assert "failed" not in names


@pytest.mark.parametrize("guard_ms", [60_000, None])
def test_a_dead_workers_longer_stall_guard_holds_its_replacement_back_no_longer(
    queue: Queue, redis_url: str, redis_client: redis.Redis, tmp_path: Path,
    guard_ms: int | None,
) -> None:
    """The guard between two stall checks is queue-wide, set for the checking
    worker's own interval: a dead worker's (30 s by default) held back a
    replacement started with a short interval for the rest of it. A guard
    without a TTL (a key copied without it, a PERSIST) held it back for
    ever."""
    job = queue.add("work", "payload")
    proc = Proc(redis_url, queue.name, "block", tmp_path / "child.log")
    try:
        ledger_wait(redis_client, queue.name, "start|", proc)
        proc.popen.kill()
        assert proc.popen.wait(10) == -signal.SIGKILL
        # the dead worker's last check, at a 60 s interval (or none)
        redis_client.set(f"jobq:{{{queue.name}}}:stalled-check", "1", px=guard_ms)
        worker = make_worker(queue.name, redis_url, lambda job: f"recovered {job.data}")
        with started(worker):
            assert job.wait_until_finished(timeout=WAIT) == "recovered payload"
    finally:
        proc.stop()
        redis_client.delete(worker_proc.ledger_key(queue.name))


def test_stalled_job_fails_past_max_stalled_count(
    queue: Queue, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    job = queue.add("work")
    ran: list[str] = []
    proc = Proc(redis_url, queue.name, "block", tmp_path / "child.log")
    try:
        ledger_wait(redis_client, queue.name, "start|", proc)
        proc.popen.kill()
        proc.popen.wait(10)
        with make_worker(queue.name, redis_url, ran.append, max_stalled_count=0):
            with pytest.raises(JobFailedError) as info:
                job.wait_until_finished(timeout=WAIT)
    finally:
        proc.stop()
        redis_client.delete(worker_proc.ledger_key(queue.name))
    assert info.value.failed_reason == "job stalled more than allowable limit"
    assert info.value.exc_type is None
    assert ran == []
    stored = queue.get_job(job.id)
    assert stored is not None
    assert stored.get_state() == "failed"
    assert stored.stalled_counter == 1
    assert stored.attempts_made == 0  # a stall is no attempt made
    events = stream(redis_client, queue.name, job_id=job.id)
    assert [e["name"] for e in events].count("stalled") == 1
    # the failure names the attempt that stalled, as its `active` did
    attempts = {e["name"]: e["fields"].get("attempt") for e in events}
    assert attempts["failed"] == attempts["stalled"] == attempts["active"] == b"1"


def test_worker_that_lost_its_lock_cannot_finalise(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    started = threading.Event()
    saw_cancel: list[bool] = []

    def handler(job: Job) -> str:
        if job.name == "next":
            return "next"
        started.set()
        saw_cancel.append(job.cancelled.wait(5))  # set once renewal finds the lock gone
        return "old worker's result"

    with make_worker(queue.name, redis_url, handler) as worker:
        rec = Recorder().attach(worker, "error", "completed")
        job = queue.add("taken")
        assert started.wait(WAIT)
        # another worker took the job over: its lock now holds another token
        redis_client.set(lock_key(queue.name, job.id), "someone-else", px=60_000)
        assert rec.wait("error")
        # concurrency=1: "next" runs only after the old attempt tried to complete
        after = queue.add("next")
        assert after.wait_until_finished(timeout=WAIT) == "next"
    assert saw_cancel == [True]
    errors = [args[0] for args in rec.of("error")]
    assert errors and all(isinstance(e, LockLostError) for e in errors), errors
    assert [args[0].id for args in rec.of("completed")] == [after.id]
    assert queue.get_job_state(job.id) == "active"
    assert queue.get_job_result(job.id) is None
    assert "completed" not in stream_names(redis_client, queue.name, job.id)
    assert redis_client.get(lock_key(queue.name, job.id)) == b"someone-else"


def test_a_lost_lock_is_reported_once(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    started = threading.Event()
    release = threading.Event()

    def handler(job: Job) -> str:
        started.set()
        assert release.wait(WAIT)
        return "late"

    with make_worker(queue.name, redis_url, handler, lock_duration=0.4) as worker:
        rec = Recorder().attach(worker, "error")
        job = queue.add("taken")
        assert started.wait(WAIT)
        redis_client.hset(job_key(queue.name, job.id), "tok", "token-of-x")
        redis_client.set(lock_key(queue.name, job.id), "token-of-x", px=60_000)
        assert rec.wait("error")
        # several renewal periods (0.2 s each) pass while the handler still runs
        assert not rec.wait("error", count=2, timeout=1.0)
        release.set()
        assert rec.wait("error", count=2)  # the refused completion, reported once too
    errors = [args[0] for args in rec.of("error")]
    assert len(errors) == 2 and all(isinstance(e, LockLostError) for e in errors), errors


def test_close_from_a_handler_finishes_that_job_and_stops(
    queue: Queue, redis_url: str
) -> None:
    worker_box: list[Worker] = []

    def handler(job: Job) -> str:
        worker_box[0].close()  # returns at once; the close goes on in the background
        return "done"

    worker = make_worker(queue.name, redis_url, handler)
    worker_box.append(worker)
    closed = threading.Event()
    worker.on("closed", lambda: closed.set())
    with worker:
        job = queue.add("stopper")
        assert job.wait_until_finished(timeout=WAIT) == "done"
        assert closed.wait(WAIT)
        late = queue.add("late")
        assert queue.get_job_state(late.id) == "waiting"
    assert not worker.is_running()


def test_lost_attempt_does_not_cancel_a_new_attempt_of_the_same_job(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    """In-flight state is keyed by job id *and* lock token.

    Attempt 1 loses the job (a worker X takes it over, then dies); the job is
    recovered as stalled and this same worker runs it again (attempt 2) while
    attempt 1's handler is still running. Renewing the locks must flag only
    attempt 1, and attempt 2's result is the one stored.
    """
    first_started = threading.Event()
    release_first = threading.Event()
    calls: list[int] = []
    second_cancelled: list[bool] = []

    def handler(job: Job) -> str:
        calls.append(len(calls) + 1)
        if len(calls) == 1:
            first_started.set()
            assert release_first.wait(WAIT)
            return "first"
        # two lock renewals happen while this runs
        second_cancelled.append(job.cancelled.wait(1.2))
        return "second"

    with make_worker(queue.name, redis_url, handler, concurrency=2) as worker:
        rec = Recorder().attach(worker, "completed")
        job = queue.add("twice")
        try:
            assert first_started.wait(WAIT)
            # worker X takes the job over (lock and token), then dies: its lock lapses
            redis_client.hset(job_key(queue.name, job.id), "tok", "token-of-x")
            redis_client.set(lock_key(queue.name, job.id), "token-of-x", px=200)
            assert job.wait_until_finished(timeout=WAIT) == "second"
        finally:
            release_first.set()
        # attempt 1 returns now; close() waits for it to try to finalise
    assert calls == [1, 2]
    assert second_cancelled == [False], "the live attempt was cancelled by the lost one"
    assert [args[1] for args in rec.of("completed")] == ["second"]
    assert queue.get_job_result(job.id) == "second"
    stored = queue.get_job(job.id)
    assert stored is not None and stored.stalled_counter == 1
    assert stream_names(redis_client, queue.name, job.id).count("completed") == 1


def test_result_that_cannot_be_encoded_fails_the_job(queue: Queue, redis_url: str) -> None:
    with make_worker(
        queue.name, redis_url, {"bad": lambda job: object(), "good": lambda job: "ok"}
    ) as worker:
        rec = Recorder().attach(worker, "failed", "completed")
        bad = queue.add("bad")
        good = queue.add("good")
        with pytest.raises(JobFailedError) as info:
            bad.wait_until_finished(timeout=WAIT)
        assert good.wait_until_finished(timeout=WAIT) == "ok"
    assert info.value.failed_reason
    assert queue.get_job_state(bad.id) == "failed"
    assert [args[0].id for args in rec.of("failed")] == [bad.id]
    assert [args[0].id for args in rec.of("completed")] == [good.id]


# -- closing ---------------------------------------------------------------------


def test_close_waits_for_jobs_in_flight_and_takes_no_more(queue: Queue, redis_url: str) -> None:
    started = threading.Event()
    release = threading.Event()

    def handler(job: Job) -> str:
        started.set()
        assert release.wait(5)
        return f"done {job.data}"

    worker = make_worker(queue.name, redis_url, handler)
    rec = Recorder().attach(worker, "closing", "closed", "completed", "active")
    first = queue.add("first", 1)
    second = queue.add("second", 2)
    worker.start()
    try:
        assert started.wait(WAIT)
        closer = threading.Thread(target=worker.close, name="test-closer")
        closer.start()
        assert rec.wait("closing")
        assert not rec.wait("closed", timeout=0.3), "close() did not wait for the job"
        assert not worker.is_running()
        release.set()
        closer.join(WAIT)
        assert not closer.is_alive()
    finally:
        release.set()
        worker.close()
    assert rec.of("closed") == [()]
    assert queue.get_job_result(first.id) == "done 1"
    assert [args[0].id for args in rec.of("active")] == [first.id]
    assert queue.get_job_state(second.id) == "waiting"


def _handler_thread_joined(threads: list[threading.Thread]) -> None:
    assert len(threads) == 1
    threads[0].join(WAIT)
    assert not threads[0].is_alive()


def test_close_with_timeout_abandons_job_which_is_then_recovered_as_stalled(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    started = threading.Event()
    release = threading.Event()
    threads: list[threading.Thread] = []
    handed: list[Job] = []

    def handler(job: Job) -> str:
        threads.append(threading.current_thread())
        handed.append(job)
        started.set()
        assert release.wait(WAIT)
        return "A"

    a = make_worker(queue.name, redis_url, handler)
    rec = Recorder().attach(a, "failed", "completed", "closed")
    job = queue.add("abandoned")
    a.start()
    try:
        assert started.wait(WAIT)
        began = time.monotonic()
        a.close(timeout=0.2)
        assert time.monotonic() - began < 5.0  # not the handler's 10 s
        assert rec.of("closed") == [()]
        assert handed[0].is_cancelled()
        assert queue.get_job_state(job.id) == "active"
        with make_worker(queue.name, redis_url, lambda job: "B") as b:
            assert job.wait_until_finished(timeout=WAIT) == "B"
        release.set()
        _handler_thread_joined(threads)
    finally:
        release.set()
    assert rec.of("failed") == [] and rec.of("completed") == []
    stored = queue.get_job(job.id)
    assert stored is not None
    assert stored.return_value == "B"
    assert stored.processed_by == b.name
    assert stored.stalled_counter == 1
    names = stream_names(redis_client, queue.name, job.id)
    assert "failed" not in names
    assert names.count("completed") == 1 and names.count("stalled") == 1


def test_forced_close_abandons_job_and_discards_its_late_result(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    started = threading.Event()
    threads: list[threading.Thread] = []
    saw_cancel: list[bool] = []

    def handler(job: Job) -> str:
        threads.append(threading.current_thread())
        started.set()
        saw_cancel.append(job.cancelled.wait(WAIT))
        return "A"

    a = make_worker(queue.name, redis_url, handler)
    rec = Recorder().attach(a, "failed", "completed")
    job = queue.add("abandoned")
    a.start()
    assert started.wait(WAIT)
    began = time.monotonic()
    a.close(force=True)
    assert time.monotonic() - began < 5.0  # not the handler's 10 s
    _handler_thread_joined(threads)  # it returned "A", after the close
    assert saw_cancel == [True]
    assert rec.of("failed") == [] and rec.of("completed") == []
    assert queue.get_job_state(job.id) == "active"
    assert queue.get_job_result(job.id) is None
    assert stream_names(redis_client, queue.name, job.id).count("completed") == 0
    with make_worker(queue.name, redis_url, lambda job: "B"):
        assert job.wait_until_finished(timeout=WAIT) == "B"
    stored = queue.get_job(job.id)
    assert stored is not None and stored.stalled_counter == 1
    names = stream_names(redis_client, queue.name, job.id)
    assert "failed" not in names and names.count("completed") == 1


def _ctrl_c() -> None:
    signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)


@contextlib.contextmanager
def _ctrl_c_after(*delays: float) -> Iterator[None]:
    """Ctrl-C (SIGINT, Python's own handler) in the main thread ``delays``
    seconds from now."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("a SIGINT raises KeyboardInterrupt in the main thread only")
    timers = [threading.Timer(delay, _ctrl_c) for delay in delays]
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for timer in timers:
            timer.start()
        yield
    finally:
        for timer in timers:
            timer.join(WAIT)
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("interrupts", [1, 2, 12])
def test_a_close_interrupted_by_ctrl_c_abandons_its_jobs_and_ends_its_threads(
    queue: Queue, redis_url: str, redis_client: redis.Redis, interrupts: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A second Ctrl-C while a `with` block's exit waits for a job: the
    close goes on at once as a forced one (no thread, lock renewal or
    heartbeat outlives it; the job is recovered as stalled), and the
    KeyboardInterrupt goes on up. A third, while that forced close waits
    for threads stuck in calls to a paused server, starts it again: it had
    left them running for good; and so did the eleventh of a key held down."""
    started, release = threading.Event(), threading.Event()
    threads: list[threading.Thread] = []

    def handler(job: Job) -> str:
        threads.append(threading.current_thread())
        started.set()
        release.wait(WAIT)
        return "late"

    # a short announcement: one the paused server kept from being withdrawn expires
    worker = make_worker(queue.name, redis_url, handler, heartbeat_ttl=1.5)
    rec = Recorder().attach(worker, "closing", "closed", "completed")
    job = queue.add("slow")
    worker.start()
    try:
        assert started.wait(WAIT)
        if interrupts > 1:  # the forced close then waits for its fetcher, stuck
            redis_client.client_pause(3000)
        with _ctrl_c_after(*[0.3 + 0.05 * i for i in range(interrupts)]), \
                pytest.raises(KeyboardInterrupt):
            worker.close()  # waits for the job: interrupted
        assert rec.of("closing") == [()] and rec.of("closed") == [()]
        handed_out = [t for t in threads if t.is_alive()]
        assert handed_out  # the handler's thread: still in user code
        until(lambda: [t.name for t in threading.enumerate() if t.name.startswith("jobq-")
                       and t.is_alive() and t not in handed_out] == [], timeout=WAIT)
        until(lambda: queue.get_workers() == [], timeout=WAIT)  # no heartbeat
        worker.close(force=True)  # nothing left to do
        assert sum("closed with 1 job(s) in flight" in r.getMessage()
                   for r in caplog.records) == 1
    finally:
        release.set()
    _handler_thread_joined(threads)
    assert rec.of("completed") == [] and rec.of("closed") == [()]
    assert queue.get_job_state(job.id) == "active"  # abandoned, its late result discarded
    with make_worker(queue.name, redis_url, lambda job: "again"):
        assert job.wait_until_finished(timeout=WAIT) == "again"


def test_a_close_interrupted_while_its_closed_listener_runs_delivers_closed_once(
    queue: Queue, redis_url: str
) -> None:
    """A Ctrl-C while the close waits for a `closed` listener: the close
    going on (forced) delivered `closed` again."""
    listening, closed = threading.Event(), threading.Event()
    worker = make_worker(queue.name, redis_url, lambda job: "done")
    rec = Recorder().attach(worker, "closing", "closed")
    worker.on("closed", lambda: (listening.set(), _ctrl_c(), closed.wait(WAIT)))
    worker.start()
    assert queue.add("x").wait_until_finished(timeout=WAIT) == "done"
    try:
        with _ctrl_c_after(), pytest.raises(KeyboardInterrupt):
            worker.close()
    finally:
        closed.set()
    assert listening.is_set()
    assert rec.of("closing") == [()] and rec.of("closed") == [()]


@pytest.mark.parametrize("forced", [False, True])
def test_a_close_with_no_timeout_waits_for_a_listener_still_running(
    queue: Queue, redis_url: str, monkeypatch: pytest.MonkeyPatch, forced: bool
) -> None:
    """``close()`` with no timeout gave a listener still running (a slow
    `completed` listener writing to a database, say) a fixed grace of
    about 1.5 s, then returned with it running and `closed` not delivered:
    at the process's exit both were cut off. It waits for the listener (as
    for a handler), until a forced close gives up."""
    from jobq import _lifecycle, _roles

    # the graces the close gave: cut short, a close that stopped waiting
    # returns at once
    monkeypatch.setattr(_roles, "JOIN_GRACE", 0.05)
    monkeypatch.setattr(_lifecycle, "LISTENER_GRACE", 0.05)
    inside, release = threading.Event(), threading.Event()
    worker = make_worker(queue.name, redis_url, lambda job: "done")
    rec = Recorder().attach(worker, "closed")
    worker.on("completed", lambda job, result: (inside.set(), release.wait(WAIT)))
    worker.start()
    try:
        assert queue.add("x").wait_until_finished(timeout=WAIT) == "done"
        assert inside.wait(WAIT)
        closer = threading.Thread(target=worker.close, name="test-closer")
        closer.start()
        closer.join(0.5)
        assert closer.is_alive() and rec.of("closed") == []
        if forced:
            worker.close(force=True)
            closer.join(WAIT)
            assert not closer.is_alive() and not release.is_set()
        release.set()
        closer.join(WAIT)
        assert not closer.is_alive()
        if not forced:  # delivered before the close returned
            assert rec.of("closed") == [()]
    finally:
        release.set()
        worker.close()
    assert until(lambda: rec.of("closed") == [()])


def test_close_is_idempotent_and_safe_from_other_threads(queue: Queue, redis_url: str) -> None:
    worker = make_worker(queue.name, redis_url, lambda job: None)
    rec = Recorder().attach(worker, "closing", "closed", "paused", "resumed")
    wait_ready(worker)
    closers = [threading.Thread(target=worker.close, name=f"test-closer-{i}") for i in range(3)]
    for closer in closers:
        closer.start()
    worker.close()
    for closer in closers:
        closer.join(WAIT)
        assert not closer.is_alive()
    worker.close()
    assert rec.of("closing") == [()]
    assert rec.of("closed") == [()]
    assert not worker.is_running()
    with pytest.raises(ClosedError):
        worker.start()
    # pause() and resume() ran their listeners after `closed`, for nothing
    for call in (worker.pause, worker.resume):
        with pytest.raises(ClosedError, match="is closed: it cannot"):
            call()
    assert rec.of("paused") == rec.of("resumed") == [] and not worker.is_paused()


def test_a_workers_settings_cannot_be_changed_once_it_is_made(
    queue: Queue, redis_url: str
) -> None:
    """``worker.concurrency = 4`` (BullMQ's setter) was taken silently: the
    pool kept its size while the registry reported 4; a value that does not
    encode dropped the worker from the registry (every heartbeat failed)."""
    worker = make_worker(queue.name, redis_url, lambda job: None, concurrency=2,
                         name="fixed-w")
    try:
        for field, value in (("concurrency", 4), ("concurrency", {1, 2}), ("name", "other"),
                             ("max_stalled_count", 5), ("max_result_bytes", None)):
            with pytest.raises(AttributeError, match=f"{field} is set when it is made"):
                setattr(worker, field, value)
        assert (worker.concurrency, worker.name, worker.max_stalled_count) == (2, "fixed-w", 1)
        assert worker.max_result_bytes == 1024 * 1024
        wait_ready(worker)
        until(lambda: [(w.name, w.concurrency) for w in queue.get_workers()]
              == [("fixed-w", 2)], WAIT)
    finally:
        worker.close()


def test_close_from_a_completed_listener(queue: Queue, redis_url: str) -> None:
    worker = make_worker(queue.name, redis_url, lambda job: "only one")
    closed = threading.Event()
    worker.on("closed", closed.set)
    worker.once("completed", lambda job, result: worker.close())
    first = queue.add("x")
    second = queue.add("x")
    worker.start()
    try:
        assert first.wait_until_finished(timeout=WAIT) == "only one"
        assert closed.wait(WAIT)
    finally:
        worker.close()
    assert not worker.is_running()
    # finishing the first job took the second in the same call, before the
    # listener ran: that job was in flight, so the graceful close ran it
    assert second.wait_until_finished(timeout=WAIT) == "only one"


def test_close_of_a_worker_never_started(queue: Queue, redis_url: str) -> None:
    worker = make_worker(queue.name, redis_url, lambda job: None)
    worker.close()
    worker.close()
    assert not worker.is_running()


# -- lifecycle: start, run, pause ----------------------------------------------------


def test_start_returns_self_is_running_and_context_manager(queue: Queue, redis_url: str) -> None:
    worker = make_worker(queue.name, redis_url, lambda job: "x")
    try:
        assert not worker.is_running()
        assert worker.start() is worker
        assert worker.start() is worker  # a second start does nothing
        assert worker.is_running()
    finally:
        worker.close()
    assert not worker.is_running()
    with make_worker(queue.name, redis_url, lambda job: "y") as managed:
        assert isinstance(managed, Worker)
        assert managed.is_running()
        assert queue.add("y").wait_until_finished(timeout=WAIT) == "y"
    assert not managed.is_running()


def test_autorun_and_a_callers_client_left_open(queue: Queue, redis_client: redis.Redis) -> None:
    worker = Worker(
        queue.name,
        lambda job: "auto",
        connection=redis_client,
        autorun=True,
        lock_duration=LOCK,
        stalled_interval=INTERVAL,
    )
    try:
        assert worker.is_running()
        assert queue.add("x").wait_until_finished(timeout=WAIT) == "auto"
    finally:
        worker.close()
    assert redis_client.ping()  # the caller's client is the caller's to close


def test_run_blocks_until_close_from_another_thread(queue: Queue, redis_url: str) -> None:
    worker = make_worker(queue.name, redis_url, lambda job: job.data * 2)
    ready = threading.Event()
    worker.on("ready", ready.set)
    runner = threading.Thread(target=worker.run, name="test-runner")
    runner.start()
    try:
        assert ready.wait(WAIT)
        assert queue.add("x", 4).wait_until_finished(timeout=WAIT) == 8
        assert runner.is_alive()
        assert worker.is_running()
    finally:
        worker.close()
        runner.join(WAIT)
    assert not runner.is_alive()


def test_run_in_a_process_closes_gracefully_on_sigterm(
    queue: Queue, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    job = queue.add("work")
    proc = Proc(redis_url, queue.name, "run", tmp_path / "child.log")
    try:
        ledger_wait(redis_client, queue.name, "start|", proc)
        proc.popen.send_signal(signal.SIGTERM)
        ledger_wait(redis_client, queue.name, "closing", proc)
        redis_client.rpush(worker_proc.go_key(queue.name), "go")
        assert proc.popen.wait(WAIT) == 0, proc.output()
        ledger_wait(redis_client, queue.name, "closed", proc)
    finally:
        proc.stop()
        redis_client.delete(worker_proc.ledger_key(queue.name), worker_proc.go_key(queue.name))
    assert job.wait_until_finished(timeout=WAIT) == "done"
    assert queue.get_job_state(job.id) == "completed"


def test_pause_and_resume_a_worker(queue: Queue, redis_url: str) -> None:
    # paused at once after start: a first fetch may be under way, pause() waits for it
    with make_worker(queue.name, redis_url, lambda job: "ran") as worker:
        rec = Recorder().attach(worker, "paused", "resumed", "active")
        assert not worker.is_paused()
        worker.pause()
        assert worker.is_paused()
        assert rec.of("paused") == [()]
        job = queue.add("later")
        assert not rec.wait("active", timeout=0.5), "a paused worker took a job"
        assert queue.get_job_state(job.id) == "waiting"
        worker.resume()
        assert not worker.is_paused()
        assert rec.of("resumed") == [()]
        assert job.wait_until_finished(timeout=WAIT) == "ran"
    assert not queue.is_paused()  # a worker's pause is local


def test_pause_during_a_job_takes_no_next_job(queue: Queue, redis_url: str) -> None:
    started = threading.Event()
    release = threading.Event()

    def handler(job: Job) -> str:
        if job.name == "first":
            started.set()
            assert release.wait(5)
        return job.name

    with make_worker(queue.name, redis_url, handler, concurrency=1) as worker:
        rec = Recorder().attach(worker, "active")
        first = queue.add("first")
        second = queue.add("second")
        assert started.wait(WAIT)
        worker.pause(wait=False)  # returns with the first job still running
        assert queue.get_job_state(first.id) == "active"
        release.set()
        assert first.wait_until_finished(timeout=WAIT) == "first"
        takes_only_once_resumed(worker, queue, rec, second, 2)


def takes_only_once_resumed(
    worker: Worker, queue: Queue, rec: Recorder, job: Job, nth_active: int
) -> None:
    """``job``, added to the paused ``worker``'s queue, is not taken (no
    ``nth_active`` active event) until the worker resumes; then it runs."""
    assert not rec.wait("active", nth_active, timeout=0.5), "a paused worker took a job"
    assert queue.get_job_state(job.id) == "waiting"
    worker.resume()
    assert job.wait_until_finished(timeout=WAIT) == job.name


@pytest.mark.skipif(CLUSTER, reason="with a cluster client the fetcher blocks on the marker alone")
def test_a_busy_worker_sends_its_next_take_with_its_block(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    # While jobs come, the fetcher's take waits in the server behind its
    # BZPOPMIN (the FCALL's bytes in its query buffer): the next job comes
    # back with the marker, no round trip between them.
    with make_worker(queue.name, redis_url, lambda job: job.name, concurrency=2) as worker:
        rec = Recorder().attach(worker, "active")
        name = f"jobq-fetch-{worker.name}"

        def blocked_with_a_take() -> bool:
            return any(c["name"] == name and c["cmd"] == "bzpopmin" and "b" in c["flags"]
                       and int(c["qbuf"]) > 0 for c in redis_client.client_list())

        assert queue.add("first").wait_until_finished(timeout=WAIT) == "first"
        until(blocked_with_a_take, timeout=WAIT)
        assert queue.add("second").wait_until_finished(timeout=WAIT) == "second"
        until(blocked_with_a_take, timeout=WAIT)
        # pause() ends the block; the take sent with it is over when it returns
        worker.pause()
        assert not blocked_with_a_take()
        takes_only_once_resumed(worker, queue, rec, queue.add("third"), 3)


@pytest.mark.skipif(CLUSTER, reason="with a cluster client the fetcher blocks on the marker alone")
def test_a_busy_worker_whose_server_lost_the_scripts_loads_them_again(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    # the take sent with a block finds the library gone (a restarted server,
    # FUNCTION FLUSH): it is loaded again and the take made, as by any call
    with make_worker(queue.name, redis_url, lambda job: job.name) as worker:
        errors = Recorder().attach(worker, "error")
        name = f"jobq-fetch-{worker.name}"
        assert queue.add("first").wait_until_finished(timeout=WAIT) == "first"
        until(lambda: any(c["name"] == name and int(c["qbuf"]) > 0
                          for c in redis_client.client_list()), timeout=WAIT)
        redis_client.function_flush()
        # a marker alone (no add, which would load the library first) ends the block
        redis_client.zadd(QueueKeys("jobq", queue.name).marker, {"0": 0})
        until(redis_client.function_list, timeout=WAIT)  # loaded by the take
        assert queue.add("second").wait_until_finished(timeout=WAIT) == "second"
        assert errors.of("error") == []


# -- listeners -------------------------------------------------------------------


def test_local_listeners_get_their_arguments(queue: Queue, redis_url: str) -> None:
    def handler(job: Job) -> str:
        if job.name == "bad":
            raise ValueError("bad input")
        job.update_progress({"pct": 50})
        return "result"

    worker = make_worker(queue.name, redis_url, handler)
    names = ("ready", "active", "progress", "completed", "failed", "closing", "closed")
    rec = Recorder().attach(worker, *names)
    try:
        worker.start()
        assert rec.wait("ready")
        good = queue.add("good")
        assert good.wait_until_finished(timeout=WAIT) == "result"
        bad = queue.add("bad")
        with pytest.raises(JobFailedError):
            bad.wait_until_finished(timeout=WAIT)
        assert rec.wait("failed")
    finally:
        worker.close()
    assert rec.of("ready") == [()]
    assert [(a[0].id,) for a in rec.of("active")] == [(good.id,), (bad.id,)]
    assert all(isinstance(a[0], Job) and len(a) == 1 for a in rec.of("active"))
    ((progress_job, value),) = rec.of("progress")
    assert progress_job.id == good.id and value == {"pct": 50}
    ((done_job, result),) = rec.of("completed")
    assert done_job.id == good.id and result == "result"
    assert done_job.return_value == "result"
    ((failed_job, exc),) = rec.of("failed")
    assert failed_job.id == bad.id
    assert isinstance(exc, ValueError) and str(exc) == "bad input"
    assert failed_job.failed_reason == "ValueError: bad input"
    assert rec.of("closing") == [()] and rec.of("closed") == [()]
    order = rec.names()
    assert order.index("closing") < order.index("closed") == len(order) - 1


def test_a_progress_listener_added_during_a_job_hears_its_later_progress(
    queue: Queue, redis_url: str
) -> None:
    """A job's progress reached the worker's listeners only if one was
    there when the job started."""
    started, attached = threading.Event(), threading.Event()

    def handler(job: Job) -> str:
        started.set()
        assert attached.wait(WAIT)
        job.update_progress(50)
        return "done"

    rec = Recorder()
    with make_worker(queue.name, redis_url, handler) as worker:
        job = queue.add("x")
        assert started.wait(WAIT)
        worker.on("progress", rec.listener("progress"))
        attached.set()
        assert job.wait_until_finished(timeout=WAIT) == "done"
        assert rec.wait("progress")
    ((progress_job, value),) = rec.of("progress")
    assert (progress_job.id, value) == (job.id, 50)


def test_a_start_that_cannot_start_its_threads_closes_what_it_started(
    queue: Queue, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker(concurrency=10**6).start() ran out of threads part of the way
    ("can't start new thread"): the worker said it was running, and its
    close left the 22,000 threads started before behind. The process's
    thread limit is stood in for here by the third pool thread's start."""
    from jobq import _runner

    real, calls = _runner.start_thread, []

    def limited(name: str, target: Any) -> threading.Thread:
        calls.append(name)
        if len(calls) == 3:
            raise RuntimeError("can't start new thread")
        return real(name, target)

    monkeypatch.setattr(_runner, "start_thread", limited)
    worker = make_worker(queue.name, redis_url, lambda job: job.data, concurrency=5)
    with pytest.raises(JobqError, match="could not start: can't start new thread"):
        worker.start()
    assert not worker.is_running() and worker.state.value == "closed"
    assert not [t for t in threading.enumerate() if t.name.startswith("jobq-worker-")]
    with pytest.raises(ValueError, match="concurrency must be at most 4096"):
        make_worker(queue.name, redis_url, lambda job: job.data, concurrency=10**6)


def test_a_misspelt_worker_event_is_refused(queue: Queue, redis_url: str) -> None:
    """worker.on("complete", cb) was accepted and never called: a typo
    silently turned off what the listener did."""
    worker = make_worker(queue.name, redis_url, lambda job: job.data)
    try:
        for name in ("complete", "Completed", "completed ", "completed:1", ""):
            with pytest.raises(ValueError, match="has no event"):
                worker.on(name, print)
            with pytest.raises(ValueError, match="has no event"):
                worker.once(name, print)
        assert worker.listener_count() == 0
        for name in ("ready", "active", "progress", "completed", "failed", "stalled", "drained",
                     "paused", "resumed", "error", "closing", "closed"):
            worker.on(name, print)
        assert worker.listener_count() == 12
    finally:
        worker.close()


def test_once_off_and_listener_count(queue: Queue, redis_url: str) -> None:
    once_calls: list[Any] = []
    off_calls: list[Any] = []
    on_calls: list[Any] = []

    def once_cb(job: Job, result: Any) -> None:
        once_calls.append(result)

    def off_cb(job: Job, result: Any) -> None:
        off_calls.append(result)

    def on_cb(job: Job, result: Any) -> None:
        on_calls.append(result)

    worker = make_worker(queue.name, redis_url, lambda job: job.data)
    assert worker.listener_count() == 0
    assert worker.on("completed", on_cb) is on_cb
    worker.once("completed", once_cb)
    worker.on("completed", off_cb)
    worker.on("failed", off_cb)
    assert worker.listener_count("completed") == 3
    assert worker.listener_count() == 4
    assert worker.off("completed", off_cb) is True
    assert worker.off("completed", off_cb) is False
    assert worker.listener_count("completed") == 2
    assert worker.listener_count("nothing") == 0
    with worker:
        for i in range(2):
            assert queue.add("x", i).wait_until_finished(timeout=WAIT) == i
        done = threading.Event()
        # wait_until_finished may return before the worker's listeners ran for
        # job 1, so wait for job 2's completion by its result
        worker.on("completed", lambda job, result: result == 2 and done.set())
        queue.add("x", 2)
        assert done.wait(WAIT)
    assert once_calls == [0]
    assert off_calls == []
    assert on_calls == [0, 1, 2]
    assert worker.listener_count("completed") == 2


def _events_threads(queue_name: str) -> list[threading.Thread]:
    return jobq_threads(f"jobq-events-{queue_name}")


def test_worker_without_channel_listeners_opens_no_queue_events(
    queue: Queue, redis_url: str
) -> None:
    with make_worker(queue.name, redis_url, lambda job: "x") as worker:
        rec = Recorder().attach(worker, "completed", "failed", "active", "error")
        queue.add("x")
        assert rec.wait("completed")
        assert _events_threads(queue.name) == []


def test_drained_listener_opens_queue_events_and_is_called(queue: Queue, redis_url: str) -> None:
    drained = threading.Event()
    worker = make_worker(queue.name, redis_url, lambda job: "x")
    worker.on("drained", drained.set)
    done = Recorder().attach(worker, "completed")
    with worker:
        assert len(_events_threads(queue.name)) == 1
        # the worker's reader becomes ready asynchronously: a drain it missed
        # is followed by another one, a bounded number of times
        for n in range(1, 6):
            queue.add("x")
            assert done.wait("completed", n)
            if drained.wait(1.0):
                break
        assert drained.is_set()


def test_custom_events_named_drained_or_stalled_are_not_the_workers(
    queue: Queue, redis_url: str
) -> None:
    # Queue.emit's events reach QueueEvents listeners of their name; a
    # worker's `drained` and `stalled` are the queue's own only
    drained: list[tuple[Any, ...]] = []
    stalled: list[tuple[Any, ...]] = []
    worker = make_worker(queue.name, redis_url, lambda job: "x")
    worker.on("drained", lambda *args: drained.append(args))
    worker.on("stalled", lambda *args: stalled.append(args))
    done = Recorder().attach(worker, "completed")
    with worker:
        # the worker's reader becomes ready asynchronously: a drain it missed
        # is followed by another one, a bounded number of times
        for n in range(1, 6):
            queue.add("x")
            assert done.wait("completed", n)
            with contextlib.suppress(AssertionError):
                until(lambda: drained, timeout=1.0)
                break
        assert drained
        drained.clear()
        queue.emit("stalled", job_id="fake")
        queue.emit("drained", by="me")
        queue.add("x")  # its drain is read after the custom events
        assert done.wait("completed", n + 1)
        until(lambda: drained, timeout=WAIT)
        # the custom `stalled` was read first: forwarded, it would be here now
        assert stalled == [] and drained == [()]


def test_stalled_listener_added_after_start_opens_queue_events(
    queue: Queue, redis_url: str
) -> None:
    with started(make_worker(queue.name, redis_url, lambda job: "x")) as worker:
        assert _events_threads(queue.name) == []
        worker.on("stalled", lambda job_id: None)
        assert len(_events_threads(queue.name)) == 1


# -- idle worker, delayed jobs --------------------------------------------------------


def test_idle_worker_picks_up_new_jobs_promptly(queue: Queue, redis_url: str) -> None:
    # drain_delay is long: only the add's wake-up can make the worker look soon
    with started(make_worker(queue.name, redis_url, lambda job: job.data, drain_delay=30)):
        for i in range(3):
            job = queue.add("x", i)
            assert job.wait_until_finished(timeout=WAIT) == i
            stored = queue.get_job(job.id)
            assert stored is not None and stored.processed_on is not None
            # woken by the add, not by the 30 s idle look
            assert stored.processed_on - (stored.timestamp or 0) < 5.0


def test_ids_of_deleted_records_are_skipped_promptly(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    """Records deleted behind jobq's back leave their ids in the wait list: a
    take skips them (at most 100 per call, then the worker looks again at
    once) and never makes a job of them."""
    jobs = queue.add_bulk([{"name": "x", "data": i} for i in range(260)])
    gone, kept = jobs[:250], jobs[250:]  # the first 250 are taken first (FIFO)
    redis_client.delete(*(queue._context.keys.job(job.id) for job in gone))
    with started(make_worker(queue.name, redis_url, lambda job: job.data, drain_delay=30)):
        # well within the 30 s drain_delay: no wait for the periodic look
        assert [job.wait_until_finished(timeout=5) for job in kept] == list(range(250, 260))
    # no half-made record of a deleted job was taken and failed
    assert queue.get_job_counts() == {
        "waiting": 0, "delayed": 0, "active": 0, "completed": 10, "failed": 0,
        "waiting-children": 0,
    }


def test_delayed_job_runs_after_its_delay_without_another_add(queue: Queue, redis_url: str) -> None:
    # drain_delay is long: only the worker's own look at the due time runs it soon
    with started(make_worker(queue.name, redis_url, lambda job: "late", drain_delay=30)):
        job = queue.add("x", delay=0.3)
        assert job.wait_until_finished(timeout=WAIT) == "late"
    stored = queue.get_job(job.id)
    assert stored is not None and stored.processed_on is not None
    waited = stored.processed_on - (stored.timestamp or 0)
    assert 0.3 - MS <= waited < 5.0, waited  # not before its delay, nor at the 30 s look


def test_worker_validates_its_arguments(queue_name: str, redis_url: str) -> None:
    with pytest.raises(TypeError):
        Worker(queue_name, "not callable", connection=redis_url)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Worker(queue_name, {}, connection=redis_url)
    with pytest.raises(ValueError):
        Worker(queue_name, lambda job: None, connection=redis_url, concurrency=0)
    for seconds in ({"lock_duration": 0}, {"lock_duration": float("inf")},
                    {"lock_duration": 0.0004}, {"heartbeat_ttl": 0.0001},
                    {"heartbeat_ttl": 1e308}, {"stalled_interval": float("nan")},
                    {"limiter": {"max": 1, "duration": 1e308}}, {"limiter": {"max": 0}}):
        with pytest.raises(ValueError):
            Worker(queue_name, lambda job: None, connection=redis_url, **seconds)
    for limiter in (5, 2.5, "1/s"):  # a TypeError of iterating it, the limiter not named
        with pytest.raises(ValueError, match="limiter must be"):
            Worker(queue_name, lambda job: None, connection=redis_url,
                   limiter=limiter)  # type: ignore[arg-type]


def test_a_take_says_whether_more_jobs_wait(queue: Queue) -> None:
    queue.add_bulk([{"name": "n", "data": i} for i in range(2)])
    scripts = WorkerScripts(queue._context.run)
    first = scripts.take(TakeArgs("t1", 30_000, "w", 0, 0))
    second = scripts.take(TakeArgs("t2", 30_000, "w", 0, 0))
    assert first.taken is not None and first.more
    assert second.taken is not None and not second.more


#: the scripts of a job's way through add and worker (not the worker's
#: periodic calls, whose number depends on how long the test runs, nor a
#: waiter's reads of the record)
_JOB_PATH = {"add", "moveToActive", "complete", "fail", "extendLocks"}


@pytest.mark.skipif(os.environ.get("JOBQ_TEST_CLUSTER") == "1",
                    reason="MONITOR of a cluster node: its connection is closed under it")
def test_a_lone_job_costs_three_script_calls(queue_name: str, redis_url: str,
                                             redis_client: redis.Redis) -> None:
    # add, take, complete: the fetcher does not look again when its take
    # said that nothing else waits (it blocks on the marker instead)
    from jobq.scripts import function_name

    path = {function_name(n).encode() for n in _JOB_PATH}
    seen: list[bytes] = []
    with Queue(queue_name, connection=redis_url) as queue, \
            make_worker(queue_name, redis_url, lambda job: job.data, concurrency=4,
                        lock_duration=30, stalled_interval=30):
        assert queue.add("warm", 0).wait_until_finished(timeout=WAIT) == 0
        with redis_client.monitor() as monitor:
            marker = f"end-{queue_name}"

            def watch() -> None:  # every FCALL until the marker
                while True:
                    command = monitor.next_command()["command"]
                    if marker in command:
                        return
                    if command.startswith("FCALL "):
                        seen.append(command.split()[1].encode())

            watcher = threading.Thread(target=watch, name="test-monitor")
            watcher.start()
            for i in range(20):
                assert queue.add("n", i).wait_until_finished(timeout=WAIT) == i
            queue.client.echo(marker)
            watcher.join(WAIT)
            assert not watcher.is_alive()
    calls = [name for name in seen if name in path]
    assert len(calls) <= 3 * 20, sorted(calls)
