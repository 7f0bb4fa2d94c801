"""Tests of Job: its attributes, its methods, and the events of its life.

Every test runs against the session's real server, on a queue of its own.
Waits are bounded ``threading.Event`` waits or ``wait_until_finished``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
import redis

import jobq
from jobq import (
    Job,
    JobFailedError,
    JobNotFoundError,
    JobqError,
    Queue,
    SerializationError,
    WaitUntilFinishedTimeoutError,
    Worker,
)
from tests.streams import stream_events

WAIT = 5.0  # seconds: the bound of every wait for something that should happen


# -- helpers ---------------------------------------------------------------


def worker(queue_name: str, redis_url: str, processor: Callable[[Any], Any], **kw: Any) -> Worker:
    """A Worker with a short idle block, so that close() is quick."""
    kw.setdefault("drain_delay", 0.1)
    return Worker(queue_name, processor, connection=redis_url, **kw)


def stream(client: redis.Redis, queue_name: str, job_id: str) -> list[tuple[str, dict]]:
    """The events of one job in the queue's stream as (name, fields), oldest first."""
    return [(name, fields) for name, jid, fields in stream_events(client, queue_name)
            if jid == job_id]


def finish(job: Job) -> Any:
    """Wait for a job's end; return its value or the JobFailedError."""
    try:
        return job.wait_until_finished(timeout=WAIT)
    except JobFailedError as exc:
        return exc


def failing_times(n: int, result: Any = "ok") -> Callable[[Job], Any]:
    """A processor failing the first ``n`` attempts of each job, then returning ``result``."""

    def processor(job: Job) -> Any:
        if job.attempts_made < n:
            raise RuntimeError(f"attempt {job.attempts_made + 1} failed")
        return result

    return processor


# -- reading ---------------------------------------------------------------


def test_get_state_follows_the_job(queue: Queue, redis_url: str) -> None:
    started, release = threading.Event(), threading.Event()

    def processor(job: Job) -> str:
        started.set()
        assert release.wait(WAIT)
        return "x"

    delayed = queue.add("d", delay=60)
    assert delayed.get_state() == "delayed"
    job = queue.add("n")
    assert job.get_state() == "waiting"
    with worker(queue.name, redis_url, processor):
        try:
            assert started.wait(WAIT)
            assert job.get_state() == "active"
        finally:
            release.set()
        assert job.wait_until_finished(timeout=WAIT) == "x"
    assert job.get_state() == "completed"
    assert job.remove() is True
    assert job.get_state() == "unknown"


def test_two_reads_of_one_job_are_equal(queue: Queue, redis_url: str) -> None:
    """As RQ's jobs are: two Job objects of one job compared unequal, so
    ``job in queue.get_jobs(...)`` was always False."""
    job, other = queue.add("x", 1, job_id="one"), queue.add("x", 2)
    read = queue.get_job(job.id)
    assert read == job and hash(read) == hash(job) and read is not job
    assert job in queue.get_jobs("waiting") and len({job, read, other}) == 2
    assert job != other and job != job.id
    with Queue(queue.name + "-b", connection=redis_url, prefix=queue.prefix) as elsewhere:
        assert elsewhere.add("x", job_id=job.id) != job  # the same id in another queue
    with Queue(queue.name, connection=redis_url, prefix=queue.prefix + "b") as prefixed:
        assert prefixed.add("x", job_id=job.id) != job  # and under another prefix


def test_refresh_reads_the_record(queue: Queue, redis_url: str) -> None:
    job = queue.add("n", {"a": 1}, attempts=2)
    assert job.refresh() is job
    assert job.return_value is None and job.finished_on is None
    with worker(queue.name, redis_url, failing_times(1, {"r": [1, 2]}), name="w-refresh"):
        assert job.wait_until_finished(timeout=WAIT) == {"r": [1, 2]}
    assert job.attempts_made == 0  # not refreshed yet
    job.refresh()
    assert job.return_value == {"r": [1, 2]}
    assert job.attempts_made == 2
    assert job.failed_reason == "RuntimeError: attempt 1 failed"  # kept from the failed attempt
    assert job.processed_by == "w-refresh"
    assert job.finished_on is not None
    assert job.data == {"a": 1}


def test_refresh_of_removed_job_raises(queue: Queue) -> None:
    job = queue.add("n")
    queue.remove(job.id)
    with pytest.raises(JobNotFoundError) as info:
        job.refresh()
    assert info.value.job_id == job.id
    assert isinstance(info.value, LookupError)


def test_timestamps_are_epoch_seconds(queue: Queue, redis_url: str) -> None:
    before = time.time()
    job = queue.add("n")
    with worker(queue.name, redis_url, lambda j: None):
        job.wait_until_finished(timeout=WAIT)
    after = time.time()
    job.refresh()
    for value in (job.timestamp, job.processed_on, job.finished_on):
        assert isinstance(value, float)
        assert before - 2 <= value <= after + 2
    assert job.timestamp <= job.processed_on <= job.finished_on  # type: ignore[operator]


# -- changing ------------------------------------------------------------------


def test_remove(queue: Queue, redis_client: redis.Redis) -> None:
    job = queue.add("n", job_id="to-remove")
    job.log("a line")
    assert job.remove() is True
    assert job.remove() is False
    assert queue.get_job(job.id) is None
    assert redis_client.exists(f"jobq:{{{queue.name}}}:logs:{job.id}") == 0
    assert queue.count() == 0
    events = [name for name, _ in stream(redis_client, queue.name, job.id)]
    assert events == ["added", "waiting", "removed"]


def test_retry_failed_job(queue: Queue, redis_url: str, redis_client: redis.Redis) -> None:
    fixed = threading.Event()

    def processor(job: Job) -> str:
        if not fixed.is_set():
            raise RuntimeError("broken")
        return "fixed"

    job = queue.add("n")
    with worker(queue.name, redis_url, processor):
        with pytest.raises(JobFailedError):
            job.wait_until_finished(timeout=WAIT)
        fixed.set()
        job.retry()
        assert job.wait_until_finished(timeout=WAIT) == "fixed"
    job.refresh()
    assert job.get_state() == "completed"
    assert job.attempts_made == 2  # a retry keeps the attempts made (BullMQ)
    assert job.failed_reason is None
    assert len(job.stacktrace) == 1  # the failed attempt's, kept with its count
    waiting = [f for name, f in stream(redis_client, queue.name, job.id) if name == "waiting"]
    assert waiting[-1]["prev"] == b"failed"


def test_retry_of_job_not_failed_raises(queue: Queue) -> None:
    job = queue.add("n")
    with pytest.raises(JobqError):
        job.retry()
    assert job.get_state() == "waiting"
    with pytest.raises(ValueError):
        job.retry("waiting")


def test_retry_completed_job(queue: Queue, redis_url: str) -> None:
    runs: list[int] = []
    job = queue.add("n")
    with worker(queue.name, redis_url, lambda j: runs.append(1) or len(runs)):
        assert job.wait_until_finished(timeout=WAIT) == 1
        job.retry("completed")
        assert job.wait_until_finished(timeout=WAIT) == 2


def test_promote(queue: Queue, redis_client: redis.Redis) -> None:
    job = queue.add("n", delay=60)
    job.promote()
    assert job.get_state() == "waiting"
    assert queue.get_job_counts("waiting", "delayed") == {"waiting": 1, "delayed": 0}
    events = stream(redis_client, queue.name, job.id)
    assert events[-1][0] == "waiting"
    assert events[-1][1]["prev"] == b"delayed"
    with pytest.raises(JobqError):
        job.promote()  # not delayed any more


def test_promote_missing_job(queue: Queue) -> None:
    job = queue.add("n", delay=60)
    job.remove()
    with pytest.raises(JobNotFoundError):
        job.promote()


def test_promote_keeps_priority(queue: Queue, redis_url: str) -> None:
    seen: list[str] = []
    done = threading.Event()
    queue.add("p3", priority=3)
    delayed = queue.add("p1", delay=60, priority=1)
    delayed.promote()

    def processor(job: Job) -> None:
        seen.append(job.name)
        if len(seen) == 2:
            done.set()

    with worker(queue.name, redis_url, processor):
        assert done.wait(WAIT)
    assert seen == ["p1", "p3"]


def test_change_delay(queue: Queue, redis_client: redis.Redis) -> None:
    job = queue.add("n", delay=60)
    job.change_delay(120)
    assert job.delay == 120
    assert job.get_state() == "delayed"
    [(_, score)] = redis_client.zrange(
        f"jobq:{{{queue.name}}}:delayed", 0, -1, withscores=True
    )
    assert score / 1000 == pytest.approx(time.time() + 120, abs=5)
    assert job.refresh().delay == pytest.approx(120)
    events = stream(redis_client, queue.name, job.id)
    assert events[-1][0] == "delayed"


def test_change_delay_errors(queue: Queue) -> None:
    waiting = queue.add("n")
    with pytest.raises(JobqError):
        waiting.change_delay(5)
    delayed = queue.add("d", delay=60)
    with pytest.raises(ValueError):
        delayed.change_delay(-1)
    delayed.remove()
    with pytest.raises(JobNotFoundError):
        delayed.change_delay(5)


def test_change_priority(queue: Queue, redis_url: str) -> None:
    seen: list[str] = []
    done = threading.Event()
    a = queue.add("a")
    b = queue.add("b", priority=4)
    c = queue.add("c", priority=2)
    a.change_priority(9)  # from the wait list to last in line
    b.change_priority(1)
    c.change_priority(0)  # no priority: runs first
    assert b.priority == 1
    assert b.refresh().priority == 1
    assert {j.get_state() for j in (a, b, c)} == {"waiting"}

    def processor(job: Job) -> None:
        seen.append(job.name)
        if len(seen) == 3:
            done.set()

    with worker(queue.name, redis_url, processor):
        assert done.wait(WAIT)
    assert seen == ["c", "b", "a"]


def test_change_priority_errors(queue: Queue) -> None:
    job = queue.add("n")
    for bad in (-1, 1.5, "1", 2**21 + 1):
        with pytest.raises(ValueError):
            job.change_priority(bad)
    job.remove()
    with pytest.raises(JobNotFoundError):
        job.change_priority(1)


def test_update_data(queue: Queue, redis_url: str) -> None:
    job = queue.add("n", {"v": 1})
    job.update_data({"v": 2, "more": [1, 2]})
    assert job.data == {"v": 2, "more": [1, 2]}
    stored = queue.get_job(job.id)
    assert stored is not None and stored.data == {"v": 2, "more": [1, 2]}
    with worker(queue.name, redis_url, lambda j: j.data["v"]):
        assert job.wait_until_finished(timeout=WAIT) == 2


def test_update_data_errors(queue: Queue) -> None:
    job = queue.add("n", {"v": 1})
    with pytest.raises(SerializationError):
        job.update_data({1: object()})
    assert job.refresh().data == {"v": 1}
    job.remove()
    with pytest.raises(JobNotFoundError):
        job.update_data({"v": 3})


def test_update_progress_in_processor(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    def processor(job: Job) -> str:
        job.update_progress(10)
        job.update_progress({"done": 5, "of": 10})
        assert job.progress == {"done": 5, "of": 10}
        return "ok"

    job = queue.add("n")
    with worker(queue.name, redis_url, processor):
        assert job.wait_until_finished(timeout=WAIT) == "ok"
    assert job.refresh().progress == {"done": 5, "of": 10}
    progress = [f for name, f in stream(redis_client, queue.name, job.id) if name == "progress"]
    assert [msgpack.unpackb(f["progress"]) for f in progress] == [10, {"done": 5, "of": 10}]


def test_update_progress_errors(queue: Queue) -> None:
    job = queue.add("n")
    with pytest.raises(SerializationError):
        job.update_progress(object())
    job.remove()
    with pytest.raises(JobNotFoundError):
        job.update_progress(1)


def test_log_and_get_logs(queue: Queue, redis_url: str) -> None:
    def processor(job: Job) -> int:
        job.log("first")
        return job.log("second ✓")

    job = queue.add("n")
    with worker(queue.name, redis_url, processor):
        assert job.wait_until_finished(timeout=WAIT) == 2
    assert job.get_logs() == ["first", "second ✓"]
    assert job.get_logs(1) == ["second ✓"]
    assert job.get_logs(0, 0) == ["first"]
    assert job.log("third") == 3
    assert job.get_logs(-1) == ["third"]


def test_log_keep(queue: Queue) -> None:
    job = queue.add("n")
    for i in range(5):
        job.log(f"line {i}", keep=3)
    assert job.get_logs() == ["line 2", "line 3", "line 4"]


def test_log_errors(queue: Queue) -> None:
    job = queue.add("n")
    with pytest.raises(TypeError):
        job.log(42)  # type: ignore[arg-type]
    assert job.get_logs() == []
    job.remove()
    with pytest.raises(JobNotFoundError):
        job.log("gone")
    assert job.get_logs() == []


# -- attempts, failures, stack traces ------------------------------------------------


def test_attempts_made_counts_every_ended_attempt(queue: Queue, redis_url: str) -> None:
    seen: list[int] = []

    def processor(job: Job) -> str:
        seen.append(job.attempts_made)
        return failing_times(2, "third time")(job)

    job = queue.add("n", attempts=3)
    with worker(queue.name, redis_url, processor):
        assert job.wait_until_finished(timeout=WAIT) == "third time"
    assert seen == [0, 1, 2]
    job.refresh()
    assert job.attempts_made == 3
    assert len(job.stacktrace) == 2
    assert job.get_state() == "completed"


def test_failed_job_attributes(queue: Queue, redis_url: str) -> None:
    job = queue.add("n", attempts=3)
    with worker(queue.name, redis_url, failing_times(99), name="w-fail"):
        error = finish(job)
    assert isinstance(error, JobFailedError)
    assert error.job_id == job.id
    assert error.failed_reason == "RuntimeError: attempt 3 failed"
    assert error.exc_type == "RuntimeError"
    assert len(error.stacktrace) == 3
    job.refresh()
    assert job.get_state() == "failed"
    assert job.attempts_made == 3
    assert job.failed_reason == "RuntimeError: attempt 3 failed"  # the type, then str(exc)
    assert job.exc_type == "RuntimeError"
    assert job.processed_by == "w-fail"
    assert job.finished_on is not None
    assert len(job.stacktrace) == 3
    for i, trace in enumerate(job.stacktrace, 1):
        assert "Traceback" in trace
        assert f"RuntimeError: attempt {i} failed" in trace  # newest last


def test_stacktrace_keeps_the_newest_ten(queue: Queue, redis_url: str) -> None:
    job = queue.add("n", attempts=12)
    with worker(queue.name, redis_url, failing_times(99)):
        assert isinstance(finish(job), JobFailedError)
    job.refresh()
    assert job.attempts_made == 12
    assert len(job.stacktrace) == 10
    assert "attempt 3 failed" in job.stacktrace[0]
    assert "attempt 12 failed" in job.stacktrace[-1]


class Quiet(Exception):
    """An exception whose str() is empty."""


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (ValueError("bad value"), "ValueError: bad value"),
        (KeyError("missing"), "KeyError: 'missing'"),
        (Quiet(), "Quiet"),
        (RuntimeError(), "RuntimeError"),
        (jobq.UnrecoverableError("give up"), "UnrecoverableError: give up"),
    ],
    ids=["value", "key", "empty-custom", "empty-builtin", "unrecoverable"],
)
def test_failed_reason(queue: Queue, redis_url: str, exc: Exception, reason: str) -> None:
    def processor(job: Job) -> None:
        raise exc

    job = queue.add("n")
    with worker(queue.name, redis_url, processor):
        error = finish(job)
    assert isinstance(error, JobFailedError)
    assert error.failed_reason == reason
    assert error.exc_type == type(exc).__name__
    assert job.refresh().failed_reason == reason
    assert job.exc_type == type(exc).__name__


def test_unrecoverable_error_skips_retries(queue: Queue, redis_url: str) -> None:
    runs: list[int] = []

    def processor(job: Job) -> None:
        runs.append(job.attempts_made)
        raise jobq.UnrecoverableError("stop")

    job = queue.add("n", attempts=5)
    with worker(queue.name, redis_url, processor):
        assert isinstance(finish(job), JobFailedError)
    assert runs == [0]
    assert job.refresh().attempts_made == 1


def test_processed_by_is_the_worker_name(queue: Queue, redis_url: str) -> None:
    names: list[str | None] = []

    def processor(job: Job) -> None:
        names.append(job.processed_by)

    job = queue.add("n")
    with worker(queue.name, redis_url, processor, name="worker-seven"):
        job.wait_until_finished(timeout=WAIT)
    assert names == ["worker-seven"]
    assert job.refresh().processed_by == "worker-seven"


def test_processor_sees_the_job(queue: Queue, redis_url: str) -> None:
    seen: list[tuple] = []

    def processor(job: Job) -> None:
        seen.append((job.id, job.name, job.data, job.opts["attempts"], job.queue_name))

    job = queue.add("mail", {"to": "x"}, attempts=2)
    with worker(queue.name, redis_url, processor):
        job.wait_until_finished(timeout=WAIT)
    assert seen == [(job.id, "mail", {"to": "x"}, 2, queue.name)]


def test_backoff_delays_the_retry(queue: Queue, redis_url: str, redis_client: redis.Redis) -> None:
    job = queue.add("n", attempts=2, backoff=0.2)
    starts: list[float] = []

    def processor(j: Job) -> str:
        starts.append(time.monotonic())
        return failing_times(1)(j)

    with worker(queue.name, redis_url, processor):
        assert job.wait_until_finished(timeout=WAIT) == "ok"
    assert len(starts) == 2
    assert starts[1] - starts[0] >= 0.15
    events = [name for name, _ in stream(redis_client, queue.name, job.id)]
    assert events == [
        "added", "waiting", "active", "retrying", "delayed", "waiting", "active", "completed",
    ]


# -- the event stream of a job's life -------------------------------------------------------


def test_events_of_a_completed_job(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    job = queue.add("n", {"x": 1})
    with worker(queue.name, redis_url, lambda j: {"y": 2}, name="w-events"):
        assert job.wait_until_finished(timeout=WAIT) == {"y": 2}
    events = stream(redis_client, queue.name, job.id)
    assert [name for name, _ in events] == ["added", "waiting", "active", "completed"]
    added, _, active, completed = (f for _, f in events)
    assert added["job_name"] == b"n"
    assert active["attempt"] == b"1"
    assert active["worker"] == b"w-events"
    assert msgpack.unpackb(completed["result"]) == {"y": 2}
    for field in ("attempt", "waited_for", "ran_for", "expected_delay"):
        assert field in completed
    assert completed["attempt"] == b"1"


def test_events_of_a_completed_job_through_queue_events(
    queue: Queue, redis_url: str
) -> None:
    got: list[jobq.Event] = []
    done = threading.Event()
    job = queue.add("n", 1)
    with worker(queue.name, redis_url, lambda j: j.data + 1):
        assert job.wait_until_finished(timeout=WAIT) == 2

    def listener(event: jobq.Event) -> None:
        if event.job_id == job.id:
            got.append(event)
            if event.name == "completed":
                done.set()

    # listeners first, then run(): a replay may start dispatching at once
    with jobq.QueueEvents(
        queue.name, connection=redis_url, last_event_id="0", autorun=False
    ) as events:
        events.on_all_events(listener)
        events.run()
        assert done.wait(WAIT)
    assert [e.name for e in got] == ["added", "waiting", "active", "completed"]
    completed = got[-1]
    assert completed.result == 2
    assert isinstance(completed.metrics, jobq.JobMetrics)
    assert completed.metrics.attempt == 1
    assert completed.metrics.ran_for >= 0
    assert completed.metrics.waited_for >= 0
    assert got[0].job_name == "n"
    assert got[2].attempt == 1


def test_events_of_a_retried_job(queue: Queue, redis_url: str, redis_client: redis.Redis) -> None:
    job = queue.add("n", attempts=3)
    with worker(queue.name, redis_url, failing_times(99)):
        assert isinstance(finish(job), JobFailedError)
    events = stream(redis_client, queue.name, job.id)
    assert [name for name, _ in events] == [
        "added", "waiting",
        "active", "retrying", "waiting",
        "active", "retrying", "waiting",
        "active", "failed",
    ]
    retrying = [f for name, f in events if name == "retrying"]
    assert [f["attempt"] for f in retrying] == [b"1", b"2"]
    assert retrying[0]["failed_reason"] == b"RuntimeError: attempt 1 failed"
    assert retrying[0]["exc_type"] == b"RuntimeError"
    [failed] = [f for name, f in events if name == "failed"]
    assert failed["failed_reason"] == b"RuntimeError: attempt 3 failed"
    assert failed["exc_type"] == b"RuntimeError"
    assert failed["attempt"] == b"3"
    actives = [f["attempt"] for name, f in events if name == "active"]
    assert actives == [b"1", b"2", b"3"]


def test_retried_job_that_succeeds_has_no_failed_event(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    job = queue.add("n", attempts=2)
    with worker(queue.name, redis_url, failing_times(1)):
        assert job.wait_until_finished(timeout=WAIT) == "ok"
    names = [name for name, _ in stream(redis_client, queue.name, job.id)]
    assert "failed" not in names
    assert names[-1] == "completed"
    assert names.count("retrying") == 1


# -- waiting ------------------------------------------------------------------------


def test_wait_until_finished_of_finished_job_returns_at_once(
    queue: Queue, redis_url: str
) -> None:
    job = queue.add("n", 5)
    with worker(queue.name, redis_url, lambda j: j.data * 3):
        assert job.wait_until_finished(timeout=WAIT) == 15
    assert job.wait_until_finished(timeout=WAIT) == 15
    again = queue.get_job(job.id)
    assert again is not None and again.wait_until_finished(timeout=WAIT) == 15


def test_wait_until_finished_times_out(queue: Queue) -> None:
    job = queue.add("n")
    with pytest.raises(WaitUntilFinishedTimeoutError) as info:
        job.wait_until_finished(timeout=0.2)
    assert isinstance(info.value, TimeoutError)
    assert job.id in str(info.value)


def test_wait_until_finished_of_missing_job(queue: Queue) -> None:
    job = queue.add("n")
    job.remove()
    with pytest.raises(JobNotFoundError):
        job.wait_until_finished(timeout=WAIT)


def test_as_future(queue: Queue, redis_url: str) -> None:
    jobs = [queue.add("n", i) for i in range(3)]
    futures = [job.as_future() for job in jobs]
    with worker(queue.name, redis_url, lambda j: j.data * 10):
        assert [f.result(timeout=WAIT) for f in futures] == [0, 10, 20]


def test_retry_of_missing_job_raises(queue: Queue) -> None:
    job = queue.add("n")
    job.remove()
    with pytest.raises(JobNotFoundError):
        job.retry()
