"""Tests of cancellation: Queue.cancel / Job.cancel of waiting, prioritized,
delayed and running jobs, the events, waiters, no retry, and Queue.remove of
a running job. Real server; bounded waits."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from jobq import Job, JobCancelledError, JobFailedError, JobqError, Queue
from tests import worker_proc
from tests.polling import until
from tests.test_worker import (
    WAIT,
    Proc,
    Recorder,
    job_key,
    ledger_wait,
    make_worker,
    started,
    stream,
)

#: How soon a running job must learn of its cancel, seconds: far less than
#: the first lock renewal (half of CANCEL_LOCK: 15 s), so only the hint can
#: do it, with room for a slow machine.
HINT_BOUND = 5.0
#: A lock long enough that no renewal reads the cancel mark within HINT_BOUND.
CANCEL_LOCK = worker_proc.CANCEL_LOCK_DURATION


def _names(client: redis.Redis, queue_name: str, job_id: str) -> list[str]:
    return [e["name"] for e in stream(client, queue_name, job_id=job_id)]


def _wait_cancel_subscription(client: redis.Redis, queue_name: str) -> None:
    """Wait (bounded) until a worker listens on the queue's cancel channel:
    from then on a hint is delivered, and no mark check at (re)subscription
    can stand in for it."""
    channel = f"jobq:{{{queue_name}}}:cancels"
    until(lambda: client.pubsub_shardnumsub(channel)[0][1] >= 1, timeout=WAIT)


@pytest.mark.parametrize("kind", ["waiting", "prioritized", "delayed"])
def test_cancel_a_job_not_running_fails_it_for_good(
    queue: Queue, redis_client: redis.Redis, kind: str
) -> None:
    options: dict[str, Any] = {"attempts": 3}
    if kind == "prioritized":
        options["priority"] = 2
    elif kind == "delayed":
        options["delay"] = 60
    job = queue.add("c", {"n": 1}, **options)
    other = queue.add("other")
    assert queue.cancel(job.id, reason="not needed") is True
    assert queue.get_job_state(job.id) == "failed"
    assert job.refresh().failed_reason == "not needed"
    assert queue.get_job_counts("waiting", "delayed", "failed") == {
        "waiting": 1, "delayed": 0, "failed": 1,
    }
    assert [j.id for j in queue.get_jobs("waiting")] == [other.id]
    with pytest.raises(JobCancelledError) as info:
        job.wait_until_finished(timeout=WAIT)
    assert isinstance(info.value, JobFailedError)
    assert info.value.failed_reason == "not needed"
    events = stream(redis_client, queue.name, job_id=job.id)
    assert [e["name"] for e in events][-2:] == ["cancelled", "failed"]
    prev = "delayed" if kind == "delayed" else "waiting"
    assert events[-2]["fields"]["prev"].decode() == prev
    assert events[-2]["fields"]["reason"] == b"not needed"
    assert events[-1]["fields"]["prev"].decode() == prev
    # finished: a second cancel does nothing
    assert queue.cancel(job.id) is False
    assert _names(redis_client, queue.name, job.id).count("cancelled") == 1


def test_cancel_unknown_or_finished_job_returns_false(queue: Queue, redis_url: str) -> None:
    assert queue.cancel("no-such-job") is False
    job = queue.add("x")
    with started(make_worker(queue.name, redis_url, lambda j: "ok")):
        assert job.wait_until_finished(timeout=WAIT) == "ok"
    assert job.cancel() is False
    assert queue.get_job_state(job.id) == "completed"


def test_cancel_default_reason(queue: Queue) -> None:
    job = queue.add("x")
    assert job.cancel() is True
    with pytest.raises(JobCancelledError, match="cancelled"):
        job.wait_until_finished(timeout=WAIT)
    assert job.refresh().failed_reason == "cancelled"


@pytest.mark.parametrize("ending", ["returns", "raises"])
def test_cancel_a_running_job_sets_cancelled_and_fails_it_without_retry(
    queue: Queue, redis_url: str, redis_client: redis.Redis, ending: str
) -> None:
    running, release = threading.Event(), threading.Event()
    seen: list[bool] = []

    def processor(job: Job) -> str:
        running.set()
        seen.append(job.cancelled.wait(WAIT))
        assert release.wait(WAIT)  # still running when the second cancel comes
        if ending == "raises":
            raise RuntimeError("stopped")
        return "late result"

    job = queue.add("long", attempts=3, backoff=0)
    worker = make_worker(queue.name, redis_url, processor)
    recorder = Recorder().attach(worker, "failed", "completed")
    with started(worker):
        assert running.wait(WAIT)
        assert queue.cancel(job.id, reason="user asked") is True
        # cancelling again while it is being cancelled: True, nothing new written
        assert job.cancel("again") is True
        release.set()
        with pytest.raises(JobCancelledError) as info:
            job.wait_until_finished(timeout=WAIT)
        assert info.value.failed_reason == "user asked"
        assert recorder.wait("failed")
    assert seen == [True]
    assert recorder.of("completed") == []
    failed = recorder.of("failed")
    assert len(failed) == 1
    assert isinstance(failed[0][1], JobCancelledError)
    job.refresh()
    assert job.get_state() == "failed"
    assert job.attempts_made == 1
    assert job.failed_reason == "user asked"
    assert job.return_value is None
    names = _names(redis_client, queue.name, job.id)
    assert names.count("active") == 1  # no retry
    assert names.count("cancelled") == 1
    assert names.index("cancelled") < names.index("failed")
    assert "retrying" not in names and "completed" not in names
    cancelled = stream(redis_client, queue.name, "cancelled", job.id)[0]
    assert cancelled["fields"]["prev"] == b"active"


@pytest.mark.parametrize("ending", ["returns", "raises"])
def test_a_cancelled_job_removed_on_fail_tells_its_listeners_the_reason(
    queue: Queue, redis_url: str, ending: str
) -> None:
    """The worker's `failed` listeners get the canceller's reason even when
    the job's record is gone by then (remove_on_fail): the finishing call
    returns it."""
    running = threading.Event()

    def processor(job: Job) -> str:
        running.set()
        assert job.cancelled.wait(WAIT)
        if ending == "raises":
            raise RuntimeError("stopped")
        return "late result"

    job = queue.add("long", remove_on_fail=True)
    worker = make_worker(queue.name, redis_url, processor)
    recorder = Recorder().attach(worker, "failed")
    with started(worker):
        assert running.wait(WAIT)
        assert queue.cancel(job.id, reason="user asked") is True
        assert recorder.wait("failed")
    [(failed_job, error)] = recorder.of("failed")
    assert failed_job.failed_reason == "user asked"
    assert isinstance(error, JobCancelledError)
    assert error.failed_reason == "user asked"
    assert queue.get_job(job.id) is None


@pytest.mark.parametrize("when", ["waiting", "running"])
def test_a_cancelled_job_retried_runs_again(queue: Queue, redis_url: str, when: str) -> None:
    # a cancel ends the run it cancelled; a retry begins one that runs
    runs: list[str] = []
    running, release = threading.Event(), threading.Event()

    def processor(job: Job) -> str:
        runs.append(job.id)
        running.set()
        assert release.wait(WAIT)
        return f"run {len(runs)}"

    job = queue.add("c")
    if when == "waiting":
        assert queue.cancel(job.id, reason="not now") is True
    with started(make_worker(queue.name, redis_url, processor)):
        if when == "running":
            assert running.wait(WAIT)
            assert queue.cancel(job.id, reason="not now") is True
        release.set()
        with pytest.raises(JobCancelledError):
            job.wait_until_finished(timeout=WAIT)
        if when == "running":
            assert queue.retry_jobs("failed") == 1
        else:
            job.retry()
        assert job.wait_until_finished(timeout=WAIT) == f"run {len(runs)}"
    assert runs == [job.id] * (2 if when == "running" else 1)
    job.refresh()
    assert job.get_state() == "completed"
    assert job.failed_reason is None


def test_cancel_mark_is_seen_at_lock_renewal_without_the_hint(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    """A hint lost (here: never sent) is made up for by the durable mark,
    which every lock renewal reads."""
    running = threading.Event()
    seen: list[bool] = []

    def processor(job: Job) -> None:
        running.set()
        seen.append(job.cancelled.wait(WAIT))

    job = queue.add("long")
    with started(make_worker(queue.name, redis_url, processor)):
        assert running.wait(WAIT)
        redis_client.hset(job_key(queue.name, job.id), "cx", "marked only")
        with pytest.raises(JobCancelledError, match="marked only"):
            job.wait_until_finished(timeout=WAIT)
    assert seen == [True]


def test_a_running_job_learns_of_its_cancel_from_the_hint_not_the_lock(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    """With a 30 s lock no renewal reads the mark in time: ``job.cancelled``
    is set within HINT_BOUND of the cancel only through the published hint."""
    running, noticed = threading.Event(), threading.Event()

    def processor(job: Job) -> None:
        running.set()
        if job.cancelled.wait(WAIT):
            noticed.set()

    job = queue.add("long", attempts=3)
    with started(make_worker(queue.name, redis_url, processor, lock_duration=CANCEL_LOCK)):
        _wait_cancel_subscription(redis_client, queue.name)
        assert running.wait(WAIT)
        sent = time.monotonic()
        assert queue.cancel(job.id, reason="hint") is True
        assert noticed.wait(HINT_BOUND), "job.cancelled not set: the hint was not acted on"
        assert time.monotonic() - sent < HINT_BOUND
        with pytest.raises(JobCancelledError, match="hint"):
            job.wait_until_finished(timeout=WAIT)
    assert job.refresh().attempts_made == 1


def test_a_worker_in_another_process_learns_of_a_cancel_from_the_hint(
    queue: Queue, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    job = queue.add("long", attempts=3)
    proc = Proc(redis_url, queue.name, "cancel", tmp_path / "child.log")
    try:
        assert ledger_wait(redis_client, queue.name, "start|", proc).split("|")[1] == job.id
        _wait_cancel_subscription(redis_client, queue.name)
        sent = time.monotonic()
        assert queue.cancel(job.id, reason="from afar") is True
        item = redis_client.blpop([worker_proc.ledger_key(queue.name)], timeout=HINT_BOUND)
        took = time.monotonic() - sent
        assert item is not None, f"no cancel seen within {HINT_BOUND} s: {proc.output()}"
        assert item[1] == f"cancelled|{job.id}".encode()
        assert took < HINT_BOUND
        with pytest.raises(JobCancelledError, match="from afar"):
            job.wait_until_finished(timeout=WAIT)
    finally:
        proc.stop()
    job.refresh()
    assert (job.get_state(), job.attempts_made) == ("failed", 1)


def test_cancel_mark_is_seen_at_take(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    """A job whose mark is set when it is taken (a cancelled job recovered
    from a dead worker) fails at once, its handler not run."""
    ran: list[str] = []
    job = queue.add("x", attempts=3)
    redis_client.hset(job_key(queue.name, job.id), "cx", "too late")
    with started(make_worker(queue.name, redis_url, lambda j: ran.append(j.id))):
        with pytest.raises(JobCancelledError, match="too late"):
            job.wait_until_finished(timeout=WAIT)
    assert ran == []
    assert job.refresh().attempts_made == 1


def test_remove_of_a_running_job_raises_naming_cancel(queue: Queue, redis_url: str) -> None:
    running, release = threading.Event(), threading.Event()

    def processor(job: Job) -> str:
        running.set()
        assert release.wait(WAIT)
        return "done"

    job = queue.add("x")
    with started(make_worker(queue.name, redis_url, processor)):
        try:
            assert running.wait(WAIT)
            with pytest.raises(JobqError, match="cancel"):
                queue.remove(job.id)
        finally:
            release.set()
        assert job.wait_until_finished(timeout=WAIT) == "done"


def test_cancel_future_raises_cancelled_error(queue: Queue) -> None:
    job = queue.add("x", delay=60)
    future = job.as_future()
    assert queue.cancel(job.id, "gone") is True
    with pytest.raises(JobCancelledError, match="gone"):
        future.result(timeout=WAIT)


def test_cli_cancel(queue: Queue, redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from jobq.cli import main

    job = queue.add("x", delay=60)
    assert main(["--url", redis_url, "cancel", queue.name, job.id, "--reason", "from cli"]) == 0
    assert "cancelled" in capsys.readouterr().out
    assert job.refresh().failed_reason == "from cli"
    assert main(["--url", redis_url, "cancel", queue.name, job.id]) == 1


def test_a_cancelled_job_of_a_killed_worker_ends_cancelled(
    queue: Queue, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    job = queue.add("work", attempts=3)
    proc = Proc(redis_url, queue.name, "block", tmp_path / "child.log")
    try:
        ledger_wait(redis_client, queue.name, "start|", proc)
        proc.popen.kill()
        proc.popen.wait(WAIT)
        assert queue.cancel(job.id, "owner died") is True  # the mark, with nobody to see it
        with started(make_worker(queue.name, redis_url, lambda j: "ran")):
            with pytest.raises(JobCancelledError, match="owner died"):
                job.wait_until_finished(timeout=WAIT)
    finally:
        proc.stop()
    assert "completed" not in _names(redis_client, queue.name, job.id)
