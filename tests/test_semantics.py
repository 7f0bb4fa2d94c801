"""Semantics shared with BullMQ (issue 12): retries keep their counters,
ordering of priorities and of delayed jobs, ``drained``, a paused queue's
delayed jobs, and small record details.

Every test runs against the session's real server, on a queue of its own.
Waits are bounded (``threading.Event.wait``, ``wait_until_finished``,
``tests.polling.until``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import redis

from jobq import Job, JobFailedError, Queue, Worker
from tests.polling import until
from tests.streams import stream_events

WAIT = 10.0  # seconds: the bound of every wait for something that should happen
MAX_PRIORITY = 2_097_151  # BullMQ's: (priority, sequence) stays exact below 2**53


# -- helpers ---------------------------------------------------------------


def make_worker(queue_name: str, redis_url: str, processor: Callable[[Job], Any],
                **options: Any) -> Worker:
    """A Worker with a short idle look unless told otherwise, so close() is quick."""
    options.setdefault("drain_delay", 0.1)
    return Worker(queue_name, processor, connection=redis_url, **options)


def event_names(client: redis.Redis, queue_name: str) -> list[tuple[str, str]]:
    """The queue's stream events as (name, job id), oldest first."""
    return [(name, jid) for name, jid, _ in stream_events(client, queue_name)]


def server_ms(client: redis.Redis) -> float:
    """The server's clock, in epoch milliseconds."""
    seconds, micros = client.time()
    return seconds * 1000 + micros / 1000


class Runs:
    """Records what a processor ran, in order; lets a test wait for a count."""

    def __init__(self) -> None:
        self.seen: list[Any] = []
        self._cond = threading.Condition()

    def add(self, value: Any) -> None:
        with self._cond:
            self.seen.append(value)
            self._cond.notify_all()

    def wait(self, count: int, timeout: float = WAIT) -> list[Any]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.seen) >= count, timeout), (
                f"only ran {self.seen}"
            )
            return list(self.seen)


def always_fails(runs: Runs) -> Callable[[Job], None]:
    def processor(job: Job) -> None:
        runs.add(job.attempts_made)
        raise RuntimeError("broken")

    return processor


# -- 1. retry keeps attempts_made and stalled_counter -------------------------


def test_retry_keeps_attempts_made_and_gives_one_more_attempt(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    runs = Runs()
    job = queue.add("n", attempts=2)
    with make_worker(queue.name, redis_url, always_fails(runs)):
        with pytest.raises(JobFailedError):
            job.wait_until_finished(timeout=WAIT)
    assert job.refresh().attempts_made == 2
    redis_client.hset(f"jobq:{{{queue.name}}}:job:{job.id}", "stc", 1)  # one stall
    job.retry()
    job.refresh()
    assert job.get_state() == "waiting"
    assert (job.attempts_made, job.stalled_counter) == (2, 1)
    assert len(job.stacktrace) == 2  # the traces of the attempts it counts
    assert job.failed_reason is None
    # the retried job used up its attempts: it gets one more, not two
    with make_worker(queue.name, redis_url, always_fails(runs)):
        with pytest.raises(JobFailedError):
            job.wait_until_finished(timeout=WAIT)
    assert runs.seen == [0, 1, 2]
    job.refresh()
    assert (job.attempts_made, job.stalled_counter) == (3, 1)
    assert len(job.stacktrace) == 3


def test_retry_with_reset_attempts_starts_afresh(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    runs = Runs()
    job = queue.add("n", attempts=2)
    with make_worker(queue.name, redis_url, always_fails(runs)):
        with pytest.raises(JobFailedError):
            job.wait_until_finished(timeout=WAIT)
    redis_client.hset(f"jobq:{{{queue.name}}}:job:{job.id}", "stc", 1)
    job.retry(reset_attempts=True)
    job.refresh()
    assert (job.attempts_made, job.stalled_counter, job.stacktrace) == (0, 0, [])
    with make_worker(queue.name, redis_url, always_fails(runs)):
        with pytest.raises(JobFailedError):
            job.wait_until_finished(timeout=WAIT)
    assert runs.seen == [0, 1, 0, 1]


def test_retry_jobs_keeps_attempts_unless_reset(queue: Queue, redis_url: str) -> None:
    runs = Runs()
    jobs = queue.add_bulk([{"name": "n", "data": i, "attempts": 2} for i in range(3)])
    with make_worker(queue.name, redis_url, always_fails(runs)):
        for job in jobs:
            with pytest.raises(JobFailedError):
                job.wait_until_finished(timeout=WAIT)
    assert queue.retry_jobs() == 3
    assert [j.refresh().attempts_made for j in jobs] == [2, 2, 2]
    with make_worker(queue.name, redis_url, always_fails(runs)):
        for job in jobs:
            with pytest.raises(JobFailedError):
                job.wait_until_finished(timeout=WAIT)
    assert [j.refresh().attempts_made for j in jobs] == [3, 3, 3]
    assert queue.retry_jobs(reset_attempts=True) == 3
    assert [j.refresh().attempts_made for j in jobs] == [0, 0, 0]
    assert [j.stacktrace for j in jobs] == [[], [], []]


# -- 2. FIFO at the maximum priority -------------------------------------------


def run_names(queue: Queue, redis_url: str, count: int) -> list[str]:
    """Run ``count`` jobs in one worker of concurrency 1; return their names in run order."""
    runs = Runs()
    with make_worker(queue.name, redis_url, lambda job: runs.add(job.name)):
        return runs.wait(count)


def test_equal_priorities_keep_fifo_at_the_maximum_priority(
    queue: Queue, redis_url: str
) -> None:
    queue.add_bulk([{"name": f"max-{i}", "priority": MAX_PRIORITY} for i in range(5)])
    queue.add("max-lifo", priority=MAX_PRIORITY, lifo=True)
    queue.add("max-5", priority=MAX_PRIORITY)
    queue.add("one", priority=1)
    assert run_names(queue, redis_url, 8) == [
        "one", "max-lifo", "max-0", "max-1", "max-2", "max-3", "max-4", "max-5",
    ]


def test_priority_above_the_maximum_is_refused(queue: Queue) -> None:
    with pytest.raises(ValueError, match="priority must be >= 0 and <= 2097151"):
        queue.add("n", priority=MAX_PRIORITY + 1)
    with pytest.raises(ValueError, match="2097151"):
        queue.add_bulk([{"name": "n", "priority": MAX_PRIORITY + 1}])
    job = queue.add("n", priority=MAX_PRIORITY)
    with pytest.raises(ValueError, match="2097151"):
        job.change_priority(MAX_PRIORITY + 1)
    assert job.refresh().priority == MAX_PRIORITY
    assert queue.get_job_counts("waiting") == {"waiting": 1}


# -- 3. delayed jobs due together run in insertion order -----------------------


def test_delayed_jobs_due_together_run_in_insertion_order(
    queue: Queue, redis_url: str
) -> None:
    jobs = queue.add_bulk([{"name": "n", "data": i, "delay": 0.2} for i in range(25)])
    assert [j.id for j in queue.get_jobs("delayed", asc=True)] == [j.id for j in jobs]
    runs = Runs()
    with make_worker(queue.name, redis_url, lambda job: runs.add(job.data)):
        assert runs.wait(25) == list(range(25))


def test_delayed_priority_jobs_due_together_keep_insertion_order(
    queue: Queue, redis_url: str
) -> None:
    queue.add_bulk([{"name": "n", "data": i, "delay": 0.2, "priority": 3} for i in range(12)])
    runs = Runs()
    with make_worker(queue.name, redis_url, lambda job: runs.add(job.data)):
        assert runs.wait(12) == list(range(12))


# -- 4. due delayed jobs run before a job retried at once -----------------------


def test_due_delayed_jobs_run_before_a_job_retried_at_once(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    runs = Runs()
    started, fail_now = threading.Event(), threading.Event()

    def processor(job: Job) -> None:
        runs.add(job.name)
        if job.name == "first" and job.attempts_made == 0:
            started.set()
            assert fail_now.wait(WAIT)
            raise RuntimeError("first attempt fails; retried at once")

    with make_worker(queue.name, redis_url, processor, concurrency=1):
        queue.add("first", attempts=2)
        assert started.wait(WAIT)
        # added while "first" runs, and due before its attempt fails
        delayed = queue.add_bulk([{"name": f"d{i}", "delay": 0.1} for i in range(1, 4)])
        due_ms = max(j.timestamp or 0 for j in delayed) * 1000 + 100
        until(lambda: server_ms(redis_client) > due_ms, timeout=WAIT)
        fail_now.set()
        assert runs.wait(5) == ["first", "d1", "d2", "d3", "first"]


# -- 6. drained: nothing waiting and nothing active -----------------------------


def test_drained_waits_until_no_job_is_waiting_or_active(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    release = threading.Event()
    running = Runs()
    seen_drained = threading.Event()
    queue.events.on("drained", lambda event: seen_drained.set())
    assert queue.events.wait_until_ready(WAIT)
    local_drained = threading.Event()

    def processor(job: Job) -> int:
        running.add(job.id)
        assert release.wait(WAIT)
        return int(job.data)

    worker = make_worker(queue.name, redis_url, processor, concurrency=4)
    worker.on("drained", local_drained.set)
    with worker:
        jobs = queue.add_bulk([{"name": "n", "data": i} for i in range(6)])
        running.wait(4)  # four active, two waiting
        assert queue.get_job_counts("active", "waiting") == {"active": 4, "waiting": 2}
        assert not local_drained.is_set()
        release.set()
        assert [job.wait_until_finished(timeout=WAIT) for job in jobs] == list(range(6))
        assert seen_drained.wait(WAIT)
        events = event_names(redis_client, queue.name)
        names = [name for name, _ in events]
        assert names.count("drained") == 1
        last_completed = max(i for i, (name, _) in enumerate(events) if name == "completed")
        assert names.index("drained") > last_completed
        # the worker's own listeners hear it too; its reader becomes ready
        # asynchronously, so a drain it missed is followed by another one
        for _ in range(5):
            if local_drained.wait(1.0):
                break
            queue.add("again", 6).wait_until_finished(timeout=WAIT)
        assert local_drained.is_set()


def test_drained_is_not_written_while_the_last_jobs_are_active(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    release = threading.Event()
    running = Runs()
    local_drained = threading.Event()

    def processor(job: Job) -> None:
        running.add(job.id)
        assert release.wait(WAIT)

    worker = make_worker(queue.name, redis_url, processor, concurrency=4)
    worker.on("drained", local_drained.set)  # before start: its reader is ready then
    with worker:
        jobs = queue.add_bulk([{"name": "n"} for _ in range(4)])
        running.wait(4)
        # every job taken, none finished: the work is not done
        events = stream_events(redis_client, queue.name)
        assert "drained" not in [name for name, _, _ in events]
        # the worker's reader has passed every event written so far (the
        # `active` of each job), and none was a drained for its listeners
        reader = worker._channel._events
        assert reader is not None
        last_id = redis_client.xrevrange(f"jobq:{{{queue.name}}}:events", count=1)[0][0]
        until(lambda: reader.last_event_id == last_id.decode(), timeout=WAIT)
        assert not local_drained.is_set()
        release.set()
        for job in jobs:
            job.wait_until_finished(timeout=WAIT)
        until(lambda: "drained" in [n for n, _ in event_names(redis_client, queue.name)])
        assert local_drained.wait(WAIT)


# -- 7. a paused queue promotes due delayed jobs on time --------------------------


def test_take_on_a_paused_queue_tells_when_the_next_delayed_job_is_due(
    queue: Queue, redis_client: redis.Redis
) -> None:
    queue.pause()
    due = queue.add("later", delay=60)
    reply = queue._context.run("moveToActive", "tok", 30_000, "w", 0, 0)
    assert reply[0] == 0
    assert 59_000 < int(reply[1]) <= 60_000
    assert due.get_state() == "delayed"


def test_paused_queue_promotes_due_delayed_jobs_on_time(
    queue: Queue, redis_url: str
) -> None:
    queue.pause()
    ready = threading.Event()
    worker = make_worker(queue.name, redis_url, lambda job: "ran", drain_delay=60)
    worker.on("ready", ready.set)
    with worker:
        assert ready.wait(WAIT)
        job = queue.add("soon", delay=0.2)
        # promoted when due (well before the worker's 60 s idle look), then held by the pause
        until(lambda: job.get_state() == "waiting", timeout=5)
        assert queue.get_job_counts("waiting", "delayed", "active") == {
            "waiting": 1, "delayed": 0, "active": 0,
        }
        queue.resume()
        assert job.wait_until_finished(timeout=WAIT) == "ran"


# -- 8. small ones ------------------------------------------------------------------


def test_promote_sets_the_stored_delay_to_zero(queue: Queue) -> None:
    job = queue.add("n", delay=60)
    job.promote()
    assert job.delay == 0
    stored = queue.get_job(job.id)
    assert stored is not None
    assert stored.delay == 0
    assert stored.get_state() == "waiting"


def test_get_jobs_lists_a_state_named_twice_once(queue: Queue, redis_url: str) -> None:
    jobs = queue.add_bulk([{"name": "n", "data": i} for i in range(3)])
    queue.add("later", delay=60)
    listed = queue.get_jobs(["waiting", "waiting"], asc=True)
    assert [j.id for j in listed] == [j.id for j in jobs]
    both = queue.get_jobs(["delayed", "waiting", "delayed"], asc=True)
    assert len(both) == 4
