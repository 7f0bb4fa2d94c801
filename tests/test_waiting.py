"""Waits you can trust: runs of reused ids, the quick-start pattern, results
kept apart from the event stream, futures' callbacks off the reader, a wait
through the wrong queue's reader, URLs that decode, removal by any path and
waits under an outage.

Real server, bounded waits, no sleep as synchronisation.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any
from urllib.parse import urlsplit

import msgpack
import pytest
import redis

from jobq import (
    ClosedError,
    Job,
    JobCancelledError,
    JobFailedError,
    JobNotFoundError,
    Queue,
    QueueEvents,
    SerializationError,
    ShardedQueue,
    WaitUntilFinishedTimeoutError,
    Worker,
    _reader,
    queue_events,
)
from jobq.testing import RedisServer, find_server_binary
from tests.conftest import echo
from tests.polling import close_while_stopped, until
from tests.test_events import kill_readers

WAIT = 10.0
#: Longest encoded result a `completed` event carries itself (INLINE_RESULT
#: in complete.lua); a bigger one stays in the record or under result:<run>.
INLINE = 1024
BIG = 16 * 1024 + 100


def waiting_on(qe: QueueEvents, job_id: str) -> bool:
    table = getattr(qe, "_table", None)
    return table.waiting_on(job_id) if table is not None else job_id in qe._waiters  # type: ignore[attr-defined]



class ReaderKiller:
    """Keeps a queue's event reader disconnected while active (it reconnects
    with a backoff, and is killed again), so that it lags behind."""

    def __init__(self, client: redis.Redis, queue_name: str) -> None:
        self._client = client
        self._name = queue_name
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-reader-killer")

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            kill_readers(self._client, self._name)

    def __enter__(self) -> ReaderKiller:
        kill_readers(self._client, self._name)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(WAIT)


def completed_counter(worker: Worker) -> tuple[threading.Condition, list[Any]]:
    cond = threading.Condition()
    done: list[Any] = []

    def on_completed(job: Job, result: Any) -> None:
        with cond:
            done.append(result)
            cond.notify_all()

    worker.on("completed", on_completed)
    return cond, done


# -- 1: a reused custom id -------------------------------------------------


@pytest.mark.parametrize("bad", [float("nan"), -1, -0.5, float("-inf"), True, "1"])
def test_every_blocking_call_refuses_a_timeout_that_is_not_a_number_of_seconds(
    queue: Queue, redis_url: str, bad: Any
) -> None:
    job = queue.add("n", 1)
    qe = queue.events
    with Worker(queue.name, echo, connection=redis_url, autorun=True) as worker:
        calls = {
            "wait_until_finished": lambda: job.wait_until_finished(timeout=bad),
            "wait_for": lambda: qe.wait_for(job.id, bad),
            "wait_until_ready": lambda: qe.wait_until_ready(bad),
            "QueueEvents.close": lambda: qe.close(bad),
            "Worker.pause": lambda: worker.pause(timeout=bad),
            "Worker.close": lambda: worker.close(timeout=bad),
        }
        for name, call in calls.items():
            with pytest.raises(ValueError, match="timeout must be None"):
                call()
            # refused before doing anything: nothing was closed or paused
            assert not worker.is_paused() and worker.is_running(), name
        assert job.wait_until_finished(timeout=WAIT) == 1


def test_a_timeout_beyond_what_a_thread_can_wait_is_no_limit(
    queue: Queue, redis_url: str
) -> None:
    job = queue.add("n", 2)
    qe = QueueEvents(queue.name, connection=redis_url)
    try:
        assert qe.wait_until_ready(float("inf"))
        worker = Worker(queue.name, echo, connection=redis_url)
        ran = threading.Timer(0.2, worker.start)
        ran.start()
        # once an OverflowError from threading's wait; now a wait without limit
        assert job.wait_until_finished(qe, timeout=threading.TIMEOUT_MAX * 2) == 2
        assert queue.add("n", 3).wait_until_finished(qe, timeout=float("inf")) == 3
        ran.join(WAIT)
        worker.pause(timeout=1e300)
        assert worker.is_paused()
        worker.close(timeout=float("inf"))
        assert not worker.is_running()
    finally:
        qe.close(timeout=1e300)


def test_reused_id_never_returns_the_previous_runs_value(
    queue: Queue, qe: QueueEvents, redis_url: str, redis_client: redis.Redis
) -> None:
    worker = Worker(queue.name, echo, connection=redis_url)
    cond, done = completed_counter(worker)  # before it takes a job
    with worker:
        first = queue.add("x", "run-1", job_id="order-1", remove_on_complete=True)
        assert first.wait_until_finished(qe, timeout=WAIT) == "run-1"  # qe remembers run 1
        with ReaderKiller(redis_client, queue.name):
            second = queue.add("x", "run-2", job_id="order-1", remove_on_complete=True)
            with cond:
                assert cond.wait_for(lambda: "run-2" in done, WAIT)
            assert queue.get_job("order-1") is None
            # the reader has not read run 2's end: the wait must not take run 1's
            assert second.wait_until_finished(qe, timeout=WAIT) == "run-2"


@pytest.mark.parametrize("keep", [False, True])
def test_a_wait_on_an_earlier_run_of_a_reused_id_after_the_later_one_ended(
    queue: Queue, qe: QueueEvents, redis_url: str, keep: bool
) -> None:
    """The reader remembers one outcome per id: the later run's took the
    place of the earlier one's, and a wait on the earlier run took that for
    "its end not read yet" and waited for an event read long before (until
    the re-check, about 10 s later)."""
    worker = Worker(queue.name, echo, connection=redis_url)
    cond, done = completed_counter(worker)  # before it takes a job
    with worker:
        first = queue.add("x", "run-1", job_id="order-1", remove_on_complete=not keep)
        with cond:
            assert cond.wait_for(lambda: "run-1" in done, WAIT)
        if keep:
            assert queue.remove("order-1")
        second = queue.add("x", "run-2", job_id="order-1", remove_on_complete=not keep)
        assert second.wait_until_finished(qe, timeout=WAIT) == "run-2"
        # less than the re-check's interval (RECHECK_INTERVAL, 10 s)
        assert first.wait_until_finished(qe, timeout=5.0) == "run-1"


@pytest.mark.parametrize("where", ["job.retry", "retry_jobs elsewhere"])
def test_a_wait_after_a_retry_is_not_answered_by_the_outcome_before_it(
    queue: Queue, qe: QueueEvents, redis_url: str, redis_client: redis.Redis, where: str
) -> None:
    """The reader lags behind the failure that ended the job's first run; a
    wait begun after the retry must take the retried run's outcome: after
    ``job.retry()`` (the Job knows the new generation), and after a retry
    by another process (the wait's record check finds the retried job)."""
    started, release = threading.Event(), threading.Event()
    calls: list[int] = []

    def handler(job: Job) -> str:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("first attempt")
        started.set()
        assert release.wait(WAIT)
        return "second"

    actives: list[Any] = []
    qe.on("active", actives.append)
    with Worker(queue.name, handler, connection=redis_url):
        with ReaderKiller(redis_client, queue.name):
            job = queue.add("x", attempts=1)
            until(lambda: job.get_state() == "failed", WAIT)
            if where == "job.retry":
                job.retry()
            else:
                with Queue(queue.name, connection=redis_url) as elsewhere:
                    assert elsewhere.retry_jobs() == 1
            assert started.wait(WAIT)
            future = job.as_future(qe)
        # the reader reads the failure, then the second run's start
        until(lambda: len([e for e in actives if e.job_id == job.id]) == 2, WAIT)
        assert not future.done()
        release.set()
        assert future.result(WAIT) == "second"
    assert job.wait_until_finished(qe, timeout=WAIT) == "second"


def test_a_second_wait_after_a_retry_elsewhere_reads_the_record(
    queue: Queue, qe: QueueEvents, redis_url: str, redis_client: redis.Redis
) -> None:
    """A Job that has been waited on once may be stale: its next wait reads
    the record (which a retry elsewhere moved on) before trusting the
    reader, which has yet to read the first outcome."""
    started, release = threading.Event(), threading.Event()
    calls: list[int] = []

    def handler(job: Job) -> int:
        calls.append(1)
        if len(calls) == 2:
            started.set()
            assert release.wait(WAIT)
        return len(calls)

    actives: list[Any] = []
    qe.on("active", actives.append)
    results: list[Any] = []
    with Worker(queue.name, handler, connection=redis_url):
        with ReaderKiller(redis_client, queue.name):
            job = queue.add("x")
            until(lambda: job.get_state() == "completed", WAIT)
            assert job.as_future(qe).result(WAIT) == 1  # from the record
            with Queue(queue.name, connection=redis_url) as elsewhere:
                assert elsewhere.retry_jobs("completed") == 1
            assert started.wait(WAIT)
            waiter = threading.Thread(
                target=lambda: results.append(job.wait_until_finished(qe, timeout=WAIT)),
                name="test-second-wait",
            )
            waiter.start()
            until(lambda: waiting_on(qe, job.id), WAIT)
        until(lambda: len([e for e in actives if e.job_id == job.id]) == 2, WAIT)
        assert results == []
        release.set()
        waiter.join(WAIT)
    assert results == [2]


@pytest.mark.parametrize("how", ["wait", "future"])
def test_a_stale_wait_is_not_answered_by_the_run_before_the_retry_read_meanwhile(
    queue: Queue, qe: QueueEvents, redis_url: str, how: str
) -> None:
    """The race behind a rare failure of the test above: a Job from before
    a retry elsewhere is waited on; the reader, behind, reads the first
    run's `completed` after the wait registered and before its record check
    brought its token up to date. That outcome must not answer it.

    The reader is held (without a reconnect, which would re-check every
    waiter first) just before it records that outcome, and let go from
    inside the wait's record check."""
    started, release, go = threading.Event(), threading.Event(), threading.Event()
    calls: list[int] = []

    def handler(job: Job) -> int:
        calls.append(1)
        if len(calls) == 2:
            started.set()
            assert release.wait(WAIT)
        return len(calls)

    record, check = qe._table.record, qe._table.check

    def held_record(job_id: str, run: Any, outcome: Any, at: Any) -> Any:
        if job_id == "stale":
            assert go.wait(WAIT)  # the reader stops before the first run's end
        return record(job_id, run, outcome, at)

    def late_check(waiter: Any, deadline: float | None = None) -> None:
        go.set()  # the reader reads the first run's end now...
        until(lambda: qe._table._recent.get("stale"), WAIT)
        check(waiter, deadline)  # ...before the check brings the token up to date

    actives: list[Any] = []
    qe.on("active", actives.append)
    qe._table.record = held_record  # type: ignore[method-assign]
    outcome: list[Any] = []
    try:
        with Worker(queue.name, handler, connection=redis_url):
            job = queue.add("x", job_id="stale")
            until(lambda: job.get_state() == "completed", WAIT)
            stale = queue.get_job("stale")  # not fresh from add: its token may be stale
            assert stale is not None
            with Queue(queue.name, connection=redis_url) as elsewhere:
                assert elsewhere.retry_jobs("completed") == 1
            assert started.wait(WAIT)
            qe._table.check = late_check  # type: ignore[method-assign]
            capture = _capture if how == "wait" else _capture_future
            thread = threading.Thread(target=lambda: capture(outcome, stale, qe))
            thread.start()
            until(lambda: len([e for e in actives if e.job_id == "stale"]) == 2, WAIT)
            assert outcome == []  # the retried run is still running
            release.set()
            thread.join(WAIT)
    finally:
        go.set()
        release.set()
    assert outcome == [2]


def _failing_first() -> Callable[[Job], str]:
    """A handler whose first call raises, and whose next ones return "second"."""
    calls: list[int] = []

    def handler(job: Job) -> str:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("first attempt")
        return "second"

    return handler


def test_a_retried_job_removed_on_completion_is_found_in_the_stream(
    queue: Queue, redis_url: str
) -> None:
    """The record is gone: a reader begun afterwards scans the run's events
    and must skip the failure before the retry."""
    handler = _failing_first()
    job = queue.add("x", attempts=1, remove_on_complete=True)
    worker = Worker(queue.name, handler, connection=redis_url)
    cond, done = completed_counter(worker)  # before it takes a job
    with worker:
        until(lambda: job.get_state() == "failed", WAIT)
        job.retry()
        with cond:
            assert cond.wait_for(lambda: done == ["second"], WAIT)
    assert queue.get_job(job.id) is None
    with QueueEvents(queue.name, connection=redis_url) as late:
        assert job.wait_until_finished(late, timeout=WAIT) == "second"


@pytest.mark.parametrize("how", ["wait", "future"])
def test_a_job_retried_elsewhere_and_removed_on_completion_answers_with_its_last_run(
    queue: Queue, redis_url: str, how: str
) -> None:
    """A Job waited on once, its job then retried through another Job (the
    CLI, the dashboard, another process) and removed as it completed: the
    scan of the run's events answered with the first end it met, the
    failure before the retry."""
    handler = _failing_first()
    job = queue.add("x", job_id="again-1", remove_on_complete=True)
    with Worker(queue.name, handler, connection=redis_url) as worker:
        with pytest.raises(JobFailedError, match="first attempt"):
            job.wait_until_finished(timeout=WAIT)
        cond, done = completed_counter(worker)
        elsewhere = queue.get_job(job.id)
        assert elsewhere is not None
        elsewhere.retry()
        with cond:
            assert cond.wait_for(lambda: done == ["second"], WAIT)
    assert queue.get_job(job.id) is None
    with QueueEvents(queue.name, connection=redis_url) as late:
        if how == "wait":
            assert job.wait_until_finished(late, timeout=WAIT) == "second"
        else:
            assert job.as_future(late).result(WAIT) == "second"


class lower_case_error(Exception):  # noqa: N801 - a name the reason alone cannot tell
    pass


class _BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message")


def _raise_by_data(job: Job) -> None:
    raise lower_case_error("x") if job.data == "lower" else _BrokenStr()


@pytest.mark.parametrize("remove_on_fail", [False, True])
def test_a_failed_jobs_exception_type_is_the_same_whoever_answers_the_wait(
    remove_on_fail: bool, queue: Queue, redis_url: str
) -> None:
    """The record (or, removed, the run's failed event in the stream) gives
    exc_type as the live event does; guessed from the reason, it was None."""
    jobs = [queue.add("x", data, remove_on_fail=remove_on_fail) for data in ("lower", "broken")]
    with Worker(queue.name, _raise_by_data, connection=redis_url):
        for job in jobs:
            with pytest.raises(JobFailedError):
                job.wait_until_finished(timeout=WAIT)
    for job, name in zip(jobs, ("lower_case_error", "_BrokenStr"), strict=True):
        with QueueEvents(queue.name, connection=redis_url) as late:
            with pytest.raises(JobFailedError) as info:
                job.wait_until_finished(late, timeout=WAIT)
        assert info.value.exc_type == name


def _done_or_broken(job: Job) -> str:
    if job.data == "fail":
        raise ValueError("broke")
    return f"done {job.data}"


@pytest.mark.parametrize("mode", [None, "stream", "pubsub"])
def test_a_job_removed_as_it_ended_answers_waits_once_its_events_are_trimmed(
    mode: str | None, queue_name: str, redis_url: str, redis_client: redis.Redis
) -> None:
    """A small result of a job removed on completion, and the failure of
    one removed on failure, were in their events alone (pub/sub: nowhere):
    once trimmed (a reader that fell behind a busy queue), every wait, one
    registered before the job ran too, raised JobNotFoundError. They are
    kept for the queue's result TTL."""
    with Queue(queue_name, connection=redis_url, event_mode=mode) as queue:
        kept = queue.add("x", "kept")
        done = queue.add("x", "ok", remove_on_complete=True)
        failed = queue.add("x", "fail", remove_on_fail=True)
        cancelled = queue.add("x", "c", remove_on_fail=True, delay=60)
        assert cancelled.cancel("not wanted")
        with Worker(queue_name, _done_or_broken, connection=redis_url):
            assert done.wait_until_finished(timeout=WAIT) == "done ok"
            with pytest.raises(JobFailedError):
                failed.wait_until_finished(timeout=WAIT)
        assert all(queue.get_job(j.id) is None for j in (done, failed, cancelled))
        redis_client.xtrim(f"jobq:{{{queue_name}}}:events", maxlen=0)
        # (a reader on the emptied stream took the runs before as followed,
        # with no mode stored too: their waits ran out their timeouts)
        with QueueEvents(queue_name, connection=redis_url) as late:
            assert kept.wait_until_finished(late, timeout=WAIT) == "done kept"
            assert done.wait_until_finished(late, timeout=WAIT) == "done ok"
            with pytest.raises(JobFailedError) as info:
                failed.wait_until_finished(late, timeout=WAIT)
            assert info.value.failed_reason == "ValueError: broke"
            assert info.value.exc_type == "ValueError"
            with pytest.raises(JobCancelledError) as stopped:
                cancelled.wait_until_finished(late, timeout=WAIT)
            assert stopped.value.failed_reason == "not wanted"
        # an obliterate left them for the whole result_ttl (up to 30 days)
        assert redis_client.keys(f"jobq:{{{queue_name}}}:result:*")
        queue.obliterate(force=True)
        for kind in ("result", "failure"):
            assert not redis_client.keys(f"jobq:{{{queue_name}}}:{kind}:*")


def test_reused_ids_under_load_each_wait_gets_its_own_run(
    queue: Queue, qe: QueueEvents, redis_url: str
) -> None:
    with Worker(queue.name, echo, connection=redis_url, concurrency=4):
        for i in range(60):
            job = queue.add("x", i, job_id=f"key-{i % 3}", remove_on_complete=True)
            assert job.wait_until_finished(qe, timeout=WAIT) == i


def test_big_result_of_an_earlier_run_is_not_read_from_a_later_runs_record(
    queue: Queue, qe: QueueEvents, redis_url: str, redis_client: redis.Redis
) -> None:
    """Run 1 completes with a big result (kept in its record only), is
    removed, and run 2 of the same id completes, all before the reader reads
    run 1's `completed`: run 1's waiter must not get run 2's result."""
    go = threading.Event()

    def handler(job: Job) -> str:
        if job.data == "1":
            assert go.wait(WAIT)
        return job.data * BIG

    outcome: list[Any] = []
    worker = Worker(queue.name, handler, connection=redis_url)
    cond, done = completed_counter(worker)  # before it takes a job
    with worker:
        first = queue.add("x", "1", job_id="same")
        thread = threading.Thread(target=lambda: _capture(outcome, first, qe))
        thread.start()
        try:
            assert until(lambda: waiting_on(qe, "same"))
            with ReaderKiller(redis_client, queue.name):
                go.set()
                with cond:
                    assert cond.wait_for(lambda: len(done) == 1, WAIT)
                assert queue.remove("same")
                queue.add("x", "2", job_id="same")
                with cond:
                    assert cond.wait_for(lambda: len(done) == 2, WAIT)
            thread.join(WAIT)
        finally:
            go.set()
            thread.join(WAIT)
    assert len(outcome) == 1
    assert outcome[0] == "1" * BIG or isinstance(outcome[0], JobNotFoundError), outcome[0]


def test_the_reader_never_reads_a_later_runs_big_result_for_an_earlier_run(
    queue: Queue, qe: QueueEvents, redis_url: str
) -> None:
    """The reader itself, with no reconnect (whose re-check of every waiter
    would settle the wait first, as in the test above), reads run A's
    `completed` (a `big` marker: the result is in the record) only once the
    id was reused and run B completed: the record is B's, and A's waiter
    must never get B's result.

    The reader is held at an earlier job's end while A and B run."""
    held, go = threading.Event(), threading.Event()
    record = qe._table.record

    def held_record(job_id: str, run: Any, outcome: Any, at: Any) -> Any:
        if job_id == "before":
            held.set()
            assert go.wait(WAIT)  # the reader stops here, its connection open
        return record(job_id, run, outcome, at)

    qe._table.record = held_record  # type: ignore[method-assign]
    outcome: list[Any] = []
    thread = None
    try:
        worker = Worker(queue.name, lambda job: job.data * BIG, connection=redis_url)
        cond, done = completed_counter(worker)  # before it takes a job
        with worker:
            queue.add("x", "0", job_id="before")
            assert held.wait(WAIT)
            first = queue.add("x", "1", job_id="same")  # kept: no result:<run> copy
            thread = threading.Thread(target=lambda: _capture(outcome, first, qe))
            thread.start()
            until(lambda: waiting_on(qe, "same"), WAIT)
            with cond:
                assert cond.wait_for(lambda: len(done) == 2, WAIT)
            assert queue.remove("same")
            queue.add("x", "2", job_id="same")
            with cond:
                assert cond.wait_for(lambda: len(done) == 3, WAIT)
            assert queue.get_job_result("same") == "2" * BIG  # the record is run B's
            assert outcome == []
            go.set()
            thread.join(WAIT)
    finally:
        go.set()
        if thread is not None:
            thread.join(WAIT)
    assert len(outcome) == 1
    assert outcome[0] != "2" * BIG, "run A's waiter got run B's result"
    assert isinstance(outcome[0], JobNotFoundError), outcome[0]


def _capture(outcome: list[Any], job: Job, qe: QueueEvents | None) -> None:
    try:
        outcome.append(job.wait_until_finished(qe, timeout=WAIT))
    except BaseException as exc:
        outcome.append(exc)


def _capture_future(outcome: list[Any], job: Job, qe: QueueEvents | None) -> None:
    try:
        outcome.append(job.as_future(qe).result(WAIT))
    except BaseException as exc:
        outcome.append(exc)


# -- 8: the quick-start pattern ---------------------------------------------


@pytest.mark.parametrize("mode", ["stream", "pubsub"])
@pytest.mark.parametrize("size", [10, BIG], ids=["small", "big"])
def test_fresh_queue_add_remove_on_complete_then_wait_returns_the_result(
    queue_name: str, redis_url: str, mode: str, size: int
) -> None:
    with (
        Queue(queue_name, connection=redis_url, event_mode=mode) as queue,
        Worker(queue_name, lambda job: "v" * size, connection=redis_url) as worker,
    ):
        cond, done = completed_counter(worker)
        job = queue.add("x", remove_on_complete=True)
        with cond:  # done and gone before the shared reader starts
            assert cond.wait_for(lambda: len(done) == 1, WAIT)
        assert queue.get_job(job.id) is None
        assert job.wait_until_finished(timeout=WAIT) == "v" * size
        again = queue.add("x", remove_on_complete=True)
        assert again.wait_until_finished(timeout=WAIT) == "v" * size


@pytest.mark.parametrize("mode", ["stream", "pubsub"])
def test_a_wait_without_a_run_is_not_answered_by_an_end_read_before_it(
    queue_name: str, redis_url: str, mode: str
) -> None:
    """``wait_for(id)`` (no run: a Job built by hand, or the one an add
    ignored for its dedup key returns) of a job removed as it completed
    before the wait: a process whose reader had read the end returned the
    result, any other raised JobNotFoundError (the run is unknown, so its
    kept result is out of reach). Both raise."""
    with (
        Queue(queue_name, connection=redis_url, event_mode=mode) as queue,
        QueueEvents(queue_name, connection=redis_url) as other,
    ):
        assert queue.events.wait_until_ready(WAIT) and other.wait_until_ready(WAIT)
        job = queue.add("x", "v", remove_on_complete=True)
        with Worker(queue_name, echo, connection=redis_url):
            assert job.wait_until_finished(timeout=WAIT) == "v"
        assert queue.get_job(job.id) is None
        for events in (queue.events, other):
            with pytest.raises(JobNotFoundError):
                events.wait_for(job.id, timeout=WAIT)
            with pytest.raises(JobNotFoundError):
                events.future_for(job.id).result(WAIT)
        assert job.wait_until_finished(timeout=WAIT) == "v"  # its run's kept result


def test_bulk_add_remove_on_complete_then_waits_return_the_results(
    queue_name: str, redis_url: str
) -> None:
    """Thousands of events lie between a job's `added` event and its
    `completed`: the check scans them in several calls."""
    n = 3000
    with (
        Queue(queue_name, connection=redis_url) as queue,
        Worker(queue_name, echo, connection=redis_url, concurrency=8) as worker,
    ):
        cond, done = completed_counter(worker)
        jobs = queue.add_bulk([{"name": "x", "data": i, "remove_on_complete": True}
                               for i in range(n)])
        with cond:
            assert cond.wait_for(lambda: len(done) == n, 60)
        for i in (0, 1, n // 2, n - 1):
            assert jobs[i].wait_until_finished(timeout=WAIT) == i


# -- 9: results kept apart from the stream ------------------------------------


def test_big_results_of_removed_jobs_stay_out_of_the_stream(
    queue_name: str, redis_url: str, redis_client: redis.Redis
) -> None:
    size = 100_000
    with (
        Queue(queue_name, connection=redis_url, result_ttl=30) as queue,
        Worker(queue_name, lambda job: "r" * size, connection=redis_url, concurrency=4),
    ):
        assert queue.events.wait_until_ready(WAIT)
        jobs = queue.add_bulk([{"name": "x", "remove_on_complete": True} for _ in range(20)])
        for job in jobs:
            assert job.wait_until_finished(timeout=WAIT) == "r" * size
        late = queue.add("x", remove_on_complete=True)
        until(lambda: queue.get_job_counts("completed", "active", "waiting")["waiting"] == 0
              and queue.get_job(late.id) is None)
        assert late.wait_until_finished(timeout=WAIT) == "r" * size
        stream = f"jobq:{{{queue_name}}}:events"
        entries = redis_client.xrange(stream)
        assert max(sum(len(v) for v in fields.values()) for _, fields in entries) < 4096
        assert redis_client.memory_usage(stream) < 200_000  # 21 results of 100 KB: 2 MB
        kept = redis_client.keys(f"jobq:{{{queue_name}}}:result:*")
        assert len(kept) == 21
        assert 0 < redis_client.pttl(kept[0]) <= 30_000


def _of_length(encoded: int) -> str:
    """A string whose msgpack encoding (what complete.lua measures) is
    ``encoded`` bytes long."""
    from jobq import serializer

    text = "r" * (encoded - 3)  # str 16: a 3-byte header
    assert len(serializer.encode(text)) == encoded
    return text


def test_a_result_just_over_the_inline_limit_stays_out_of_its_event(
    queue_name: str, redis_url: str, redis_client: redis.Redis
) -> None:
    """At the default max_events, 10,000 events of 16,000-byte results
    took 55 MB of stream: a `completed` event carries a result of at most
    1 KiB; a bigger one is kept under its own key for waiters."""
    under, over = _of_length(INLINE), _of_length(INLINE + 1)
    with (
        Queue(queue_name, connection=redis_url, result_ttl=30) as queue,
        Worker(queue_name, lambda job: job.data, connection=redis_url),
    ):
        assert queue.events.wait_until_ready(WAIT)
        inline = queue.add("x", under, remove_on_complete=True)
        kept = queue.add("x", over, remove_on_complete=True)
        assert inline.wait_until_finished(timeout=WAIT) == under
        assert kept.wait_until_finished(timeout=WAIT) == over  # read by the reader
        entries = redis_client.xrange(f"jobq:{{{queue_name}}}:events")
        completed = {fields[b"jid"].decode(): fields for _, fields in entries
                     if fields.get(b"ev") == b"completed"}
        assert b"result" in completed[inline.id]
        assert len(completed[inline.id][b"result"]) == INLINE
        assert b"result" not in completed[kept.id]
        assert completed[kept.id][b"big"] == b"1"
        assert sum(len(k) + len(v) for k, v in completed[kept.id].items()) < 200
        assert queue.get_job(kept.id) is None
        assert redis_client.exists(f"jobq:{{{queue_name}}}:result:{kept._run}")
        # a wait that begins afterwards, on a reader of its own, reads the kept copy
        with QueueEvents(queue_name, connection=redis_url) as late:
            assert kept.wait_until_finished(late, timeout=WAIT) == over


def test_result_ttl_is_validated(queue_name: str, redis_url: str) -> None:
    for bad in (0, -1, "60", True):
        with pytest.raises(ValueError, match="result_ttl"):
            Queue(queue_name, connection=redis_url, result_ttl=bad)


# -- 4: futures' callbacks never run on the reader ------------------------------


def test_as_future_callbacks_run_off_the_reader_and_never_delay_a_wait(
    queue: Queue, qe: QueueEvents, redis_url: str
) -> None:
    """The callback is attached while the job is held in its handler, so it
    runs when the reader resolves the future: on the dispatcher, never on
    the reader, and while it runs (slowly) another job's wait, answered by
    the reader, is not delayed."""
    hold, release = threading.Event(), threading.Event()
    called = threading.Event()
    threads: list[str] = []

    def slow_callback(future: Future[Any]) -> None:
        threads.append(threading.current_thread().name)
        called.set()
        release.wait(WAIT)

    def handler(job: Job) -> Any:
        if job.data == "first":
            assert hold.wait(WAIT)
        return job.data

    try:
        with Worker(queue.name, handler, connection=redis_url, concurrency=2):
            slow = queue.add("x", "first").as_future(qe)
            assert not slow.done()  # held in its handler: the callback cannot run yet
            slow.add_done_callback(slow_callback)
            assert threads == []
            hold.set()
            assert called.wait(WAIT)  # the slow callback is running (and stays so)
            assert threads == [f"jobq-dispatch-{queue.name}"], threads
            # the reader must not be stuck in that callback (held 10 s)
            start = time.monotonic()
            assert queue.add("x", "second").wait_until_finished(qe, timeout=5) == "second"
            assert time.monotonic() - start < 5
            assert not release.is_set()  # the callback was still running meanwhile
    finally:
        release.set()
        hold.set()
    assert slow.result(WAIT) == "first"


# -- 10: a wait through another queue's reader --------------------------------


def test_job_refuses_a_queue_events_of_another_queue_or_prefix(
    queue: Queue, queue_name: str, redis_url: str
) -> None:
    job = queue.add("x")
    with (
        Queue(queue_name + "-b", connection=redis_url) as other,
        QueueEvents(queue_name, connection=redis_url, prefix="other", autorun=False) as foreign,
    ):
        other.add("x")  # job "1" of queue B
        for events in (other.events, foreign):
            with pytest.raises(ValueError, match="cannot be waited for"):
                job.wait_until_finished(events, timeout=1)
            with pytest.raises(ValueError, match="cannot be waited for"):
                job.as_future(events)


# -- 7: URLs that decode responses ------------------------------------------


def test_url_with_decode_responses_is_refused_before_anything_is_written(
    queue_name: str, redis_url: str, redis_client: redis.Redis
) -> None:
    if "+cluster" in redis_url:
        url = redis_url + "/?decode_responses=True"
    else:
        url = redis_url + ("&" if "?" in redis_url else "?") + "decode_responses=True"
    with pytest.raises(ValueError, match="decode"):
        Queue(queue_name, connection=url)
    assert not redis_client.keys(f"jobq:{{{queue_name}}}:*")
    assert not redis_client.sismember("jobq:queues", queue_name)


# -- 5: removal by any path ---------------------------------------------------


def _waiting_thread(job: Job, qe: QueueEvents, outcome: list[Any]) -> threading.Thread:
    thread = threading.Thread(target=lambda: _capture(outcome, job, qe))
    thread.start()
    assert until(lambda: waiting_on(qe, job.id))
    return thread


def test_remove_ends_a_wait_promptly(queue: Queue, qe: QueueEvents) -> None:
    job = queue.add("x")
    outcome: list[Any] = []
    thread = _waiting_thread(job, qe, outcome)
    start = time.monotonic()
    assert queue.remove(job.id)
    thread.join(WAIT)
    assert isinstance(outcome[0], JobNotFoundError)
    assert time.monotonic() - start < 5  # the periodic re-check comes after 10 s


def test_clean_ends_a_wait_promptly(queue: Queue, qe: QueueEvents) -> None:
    job = queue.add("x", delay=60)
    outcome: list[Any] = []
    thread = _waiting_thread(job, qe, outcome)
    start = time.monotonic()
    assert queue.clean(0, state="delayed") == [job.id]
    thread.join(WAIT)
    assert isinstance(outcome[0], JobNotFoundError)
    assert time.monotonic() - start < 5


def test_obliterate_ends_waits_promptly(queue: Queue, qe: QueueEvents) -> None:
    jobs = [queue.add("x"), queue.add("x", delay=60)]
    outcomes: list[list[Any]] = [[], []]
    threads = [_waiting_thread(job, qe, out) for job, out in zip(jobs, outcomes, strict=True)]
    start = time.monotonic()
    queue.obliterate()
    for thread in threads:
        thread.join(WAIT)
    assert all(isinstance(out[0], JobNotFoundError) for out in outcomes), outcomes
    assert time.monotonic() - start < 5


def test_obliterate_is_no_loss_of_events_to_warn_of(
    queue: Queue, qe: QueueEvents, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the obliterate empties the stream (unread events go with the queue)
    # and writes `obliterated` first in it: the reader re-checks its waiters
    # for that event, and warns of no events trimmed before it read them
    monkeypatch.setattr(_reader, "GAP_CHECK_INTERVAL", 0.0)  # a look after every read
    added: list[str] = []
    qe.on("added", lambda event: added.append(event.job_name))
    queue.add("read")
    until(lambda: added, timeout=WAIT)  # the reader has a position in the stream
    for _ in range(3):
        queue.add("unread")
    with caplog.at_level(logging.WARNING, logger="jobq.queue_events"):
        queue.obliterate()
        queue.add("after")
        until(lambda: "after" in added, timeout=WAIT)  # read after `obliterated`
    assert "gone before they were read" not in caplog.text


def test_a_reader_learns_of_a_max_events_lowered_while_it_reads(
    queue: Queue, qe: QueueEvents, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A Queue that lowers max_events after the reader connected: reads
    long enough to follow a trimmed gap went unchecked (the reader knew the
    old length), and waiters whose events were trimmed waited for the next
    re-check of every waiter. The reader reads the length again at its
    timed look, and re-checks its waiters when it was lowered."""
    with caplog.at_level(logging.WARNING, logger="jobq.queue_events"):
        with Queue(queue.name, connection=redis_url, max_events=10) as small:
            jobs = small.add_bulk([{"name": "x", "data": i} for i in range(300)])
            with Worker(queue.name, echo, connection=redis_url, concurrency=8):
                assert [job.wait_until_finished(qe, timeout=WAIT) for job in jobs] == \
                    list(range(300))
    assert "gone before they were read" in caplog.text


def test_a_gap_in_a_read_too_short_for_the_old_length_is_found_at_the_timed_look(
    queue: Queue, qe: QueueEvents, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """max_events lowered just after the reader's timed look, then a burst
    trimmed in one call: the read after it is shorter than the old length's
    threshold, so no look follows it; the next timed look reads the length
    again and takes that read as a possible gap."""
    seen = threading.Event()
    qe.on("tick", lambda event: seen.set())
    queue.emit("tick")  # read: the timed look is behind the reader now
    assert seen.wait(WAIT)
    with caplog.at_level(logging.WARNING, logger="jobq.queue_events"):
        with Queue(queue.name, connection=redis_url, max_events=10) as small:
            small.add_bulk([{"name": "x"} for _ in range(500)])  # one call, trimmed in it
            assert until(lambda: bool(small.emit("tick")) or  # events: the next look comes
                         "gone before they were read" in caplog.text, timeout=WAIT)


def test_a_wait_begun_after_its_jobs_events_were_trimmed_unread_looks_at_the_record(
    queue_name: str, redis_url: str
) -> None:
    """The reader found events trimmed before it read them; a wait begun
    afterwards on a job added before then took the reader to follow that
    job's run (it began before the job was added), skipped its look at the
    record, and waited for the next re-check of every waiter (10 s) for an
    event long gone. Runs added before a loss are no longer followed."""
    with Queue(queue_name, connection=redis_url, max_events=10) as small, \
            QueueEvents(queue_name, connection=redis_url) as events:
        assert events.wait_until_ready(WAIT)
        jobs = small.add_bulk([{"name": "x", "data": i} for i in range(300)])
        with Worker(queue_name, echo, connection=redis_url, concurrency=8):
            for i, job in enumerate(jobs):  # one at a time: most begin after the loss
                assert job.wait_until_finished(events, timeout=5) == i


@pytest.mark.parametrize("size", [10, 2000])  # in the event, or read from the record
def test_a_result_the_reader_cannot_decode_fails_its_wait_not_the_reader(
    queue: Queue, qe: QueueEvents, redis_url: str, size: int
) -> None:
    """A result of an extension type registered in the worker's process
    alone: read from the record (over 1 KiB), it failed the reader's whole
    read, which it retried for ever, and no listener heard of any later
    event; in the event, the wait waited for the next re-check (10 s)."""
    heard: list[str] = []
    qe.on("completed", lambda event: heard.append(event.job_id))
    release = threading.Event()

    def handler(job: Job) -> Any:
        if job.name == "odd":
            assert release.wait(WAIT)
            return msgpack.ExtType(7, b"x" * size)
        return job.data

    odd = queue.add("odd")
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            odd.wait_until_finished(qe, timeout=5)  # under the 10 s re-check
        except BaseException as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=wait)
    with Worker(queue.name, handler, connection=redis_url):
        waiter.start()
        until(lambda: waiting_on(qe, odd.id), timeout=WAIT)
        release.set()
        waiter.join(WAIT)
        assert [type(e) for e in outcome] == [SerializationError]
        assert "extension type 7" in str(outcome[0])
        later = queue.add("ok", 5)
        assert later.wait_until_finished(qe, timeout=WAIT) == 5
        until(lambda: later.id in heard, timeout=WAIT)


def test_a_wait_begun_after_an_obliterate_was_read_raises_not_found(
    queue: Queue, qe: QueueEvents
) -> None:
    obliterated = threading.Event()
    qe.on("obliterated", lambda event: obliterated.set())
    job = queue.add("x")  # a run the reader saw added
    queue.obliterate()
    assert obliterated.wait(WAIT)
    with pytest.raises(JobNotFoundError):
        job.wait_until_finished(qe, timeout=5)  # not the next re-check of all (10 s)


# -- waits and close under an outage, whatever the client's retries -------------


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    try:
        binary = find_server_binary()
    except RuntimeError:
        pytest.skip("no server binary to start a private server")
    with RedisServer(binary) as server:
        yield server


@pytest.mark.parametrize("mode", ["stream", "pubsub"])
def test_wait_and_close_keep_their_own_time_with_a_retrying_client(
    own_server: RedisServer, queue_name: str, mode: str
) -> None:
    """A wait that must read the record (a Job from ``get_job``: its token
    may be stale) and ``close()`` (in pub/sub mode it publishes a wake-up
    to its reader) keep to their time under an outage, although the
    caller's client retries 10 times with backoff."""
    from redis.backoff import ExponentialBackoff
    from redis.retry import Retry

    host, port = "127.0.0.1", own_server.port
    # retries as redis-py 6+ makes them by default (redis-py 5 made none)
    client = redis.Redis(
        host, port, retry=Retry(ExponentialBackoff(cap=1.0, base=0.1), 10),
        retry_on_error=[redis.exceptions.ConnectionError, redis.exceptions.TimeoutError],
    )
    try:
        queue = Queue(queue_name, connection=client, event_mode=mode)
        try:
            job = queue.get_job(queue.add("x").id)  # not fresh: the wait checks the record
            assert job is not None  # and the mode stored, before the reader starts
            assert queue.events.wait_until_ready(WAIT)
            assert queue.events._reader.mode == mode
            own_server.stop()
            start = time.monotonic()
            with pytest.raises(WaitUntilFinishedTimeoutError):
                job.wait_until_finished(timeout=1)
            waited = time.monotonic() - start
        finally:
            start = time.monotonic()
            queue.close()
            closing = time.monotonic() - start
        # a 1 s wait and a prompt close; redis-py's retries alone took 4.5 s
        # (8 s with redis-py 8) for each
        assert waited < 3.0 and closing < 3.0, (waited, closing)
    finally:
        client.close()


def test_waits_keep_their_time_on_a_server_that_stopped_answering(
    own_server: RedisServer, queue_name: str
) -> None:
    """A server that accepts but does not answer (stopped, or stuck in a
    long script): each wait that must read its record keeps to its timeout,
    however many threads wait, even on a client without a socket timeout
    (redis-py 5's default), where the read of the record once blocked until
    the server answered. A run of jobq before this fix: every wait here
    ended only when the server was let go."""
    client = redis.Redis("127.0.0.1", own_server.port, socket_timeout=None)
    queue = Queue(queue_name, connection=client)
    outcomes: list[str] = []
    lock = threading.Lock()

    def wait_for(job: Job) -> None:
        start = time.monotonic()
        try:
            job.wait_until_finished(timeout=0.5)
            kind = "finished"
        except WaitUntilFinishedTimeoutError:
            kind = "timeout"
        except Exception as exc:
            kind = type(exc).__name__
        with lock:
            outcomes.append(f"{kind} {time.monotonic() - start:.1f}")

    try:
        assert queue.events.wait_until_ready(WAIT)
        # a connection kept from a check already (a finished job's, in a
        # wait of 10 s: its socket has no shorter timeout): the stop meets
        # one check in its read, the others in their connect
        done = queue.add("x", "done")
        with Worker(queue.name, echo, connection=client, autorun=True):
            done.wait_until_finished(timeout=WAIT)
        finished = queue.get_job(done.id)
        assert finished is not None and finished.wait_until_finished(timeout=WAIT) == "done"
        # not fresh: each wait must read the record before it relies on events
        jobs = [queue.get_job(queue.add("x", i).id) for i in range(40)]
        own_server.kill(signal.SIGSTOP)
        threads = [threading.Thread(target=wait_for, args=(job,)) for job in jobs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(5.0)  # all 40 by then: each waits 0.5 s
        with lock:
            ended = list(outcomes)
        own_server.kill(signal.SIGCONT)
        for thread in threads:
            thread.join(WAIT)
        assert len(ended) == 40, ended
        assert all(outcome.startswith("timeout") for outcome in ended), ended
        assert max(float(o.split()[1]) for o in ended) < 3.0, ended
    finally:
        own_server.kill(signal.SIGCONT)
        queue.close()
        client.close()


def test_a_future_asked_for_while_the_server_does_not_answer_stays_pending(
    own_server: RedisServer, queue_name: str
) -> None:
    """``as_future()`` read the job's record on the caller's thread with no
    deadline: on a stopped server it blocked for the socket timeout, then
    settled the future with the TimeoutError (a ConnectionError on a server
    away) for good, although the job then completed."""
    with Queue(queue_name, connection=own_server.url) as queue:
        assert queue.events.wait_until_ready(WAIT)
        jobs = [queue.get_job(queue.add("x", i).id) for i in range(10)]  # not fresh
        own_server.kill(signal.SIGSTOP)
        try:
            start = time.monotonic()
            futures = [job.as_future() for job in jobs]  # type: ignore[union-attr]
            asked = time.monotonic() - start
            assert not any(future.done() for future in futures)
        finally:
            own_server.kill(signal.SIGCONT)
        # FIRST_LOOK (1 s) for the first, not the socket timeout; the others
        # leave their look to the waker (ten took ten seconds)
        assert asked < 3.0, asked
        with Worker(queue_name, echo, connection=own_server.url):
            # looked at again within a second or two
            assert [future.result(timeout=30) for future in futures] == list(range(10))


def test_a_queue_closed_on_a_server_that_does_not_answer_cuts_its_reader_early(
    own_server: RedisServer, queue_name: str
) -> None:
    """Queue.close() (its reader's close, with the default 5 s) waited out
    the whole 5 s for a reader stuck in a read the server never answers,
    though a read lasts at most about a second: the reader is cut once that
    is past (READ_GRACE), and the close is over within about two seconds."""
    from jobq.queue_events import CUT_GRACE, READ_GRACE

    client = redis.Redis("127.0.0.1", own_server.port, socket_timeout=None)
    try:
        queue = Queue(queue_name, connection=client)
        assert queue.events.wait_until_ready(WAIT)
        left, closing = close_while_stopped(own_server, queue.close, queue_name)
        assert left == [] and closing < READ_GRACE + CUT_GRACE + 2.0, (left, closing)
    finally:
        own_server.kill(signal.SIGCONT)
        client.close()


def test_close_cuts_short_a_wait_whose_check_the_server_does_not_answer(
    own_server: RedisServer, queue_name: str
) -> None:
    client = redis.Redis("127.0.0.1", own_server.port, socket_timeout=None)
    qe = QueueEvents(queue_name, connection=client)
    outcome: list[str] = []
    try:
        with Queue(queue_name, connection=client) as queue:
            job = queue.get_job(queue.add("x").id)  # not fresh: the wait reads the record
        assert job is not None and qe.wait_until_ready(WAIT)
        own_server.kill(signal.SIGSTOP)

        def wait() -> None:
            try:
                job.wait_until_finished(qe, timeout=60)
            except Exception as exc:
                outcome.append(type(exc).__name__)

        thread = threading.Thread(target=wait)
        thread.start()
        connections = qe._context.deadline_connections
        assert connections is not None
        until(lambda: connections._busy, WAIT)  # the check waits for its reply
        qe.close(timeout=0.5)  # the reader, stuck too, is cut after 0.5 s
        thread.join(WAIT)  # not the wait's 60 s
        assert outcome == ["ClosedError"]
    finally:
        own_server.kill(signal.SIGCONT)
        qe.close()
        client.close()


@pytest.mark.parametrize("mode", ["stream", "pubsub"])
@pytest.mark.parametrize("shards", [0, 2])
def test_close_leaves_no_reader_behind_on_a_server_that_stopped_answering(
    own_server: RedisServer, queue_name: str, mode: str, shards: int
) -> None:
    """A QueueEvents closed while the server accepts but does not answer:
    the reader, stuck in its read (its wake-up is not answered either), has
    its connection cut once the close's timeout is over. It was left behind
    for its socket timeout (10 s)."""
    client = redis.Redis("127.0.0.1", own_server.port, socket_timeout=None)
    queue: Any = (ShardedQueue(queue_name, shards=shards, connection=client, event_mode=mode)
                  if shards else Queue(queue_name, connection=client, event_mode=mode))
    qe = queue.events
    try:
        assert qe.wait_until_ready(WAIT)
        left, closing = close_while_stopped(own_server, lambda: qe.close(timeout=0.5), queue_name)
        assert left == [] and closing < 3.0, (left, closing)
    finally:
        queue.close()
        client.close()


@pytest.mark.parametrize("shards", [0, 2])
def test_a_close_on_a_server_that_stopped_answering_keeps_its_timeout(
    own_server: RedisServer, queue_name: str, shards: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wake-up of the reader (CLIENT UNBLOCK, on a connection of its
    own that waits UNBLOCK_TIMEOUT, made longer here) came before the
    close's timeout began: close(timeout=0.3) took 0.65-0.8 s."""
    from jobq import connection

    monkeypatch.setattr(connection, "UNBLOCK_TIMEOUT", 3.0)
    client = redis.Redis("127.0.0.1", own_server.port)
    queue: Any = (ShardedQueue(queue_name, shards=shards, connection=client)
                  if shards else Queue(queue_name, connection=client))
    try:
        assert queue.events.wait_until_ready(WAIT)
        _, closing = close_while_stopped(own_server, lambda: queue.events.close(timeout=0.3),
                                         queue_name)
        assert closing < 2.0, closing  # 3.3 s before
    finally:
        queue.close()
        client.close()


def test_a_queue_first_used_while_the_server_does_not_answer_has_its_events_at_once(
    own_server: RedisServer, queue_name: str
) -> None:
    """``Queue.events`` ran the queue's first-use setup while the server
    accepted connections and answered nothing: every use blocked for about
    10 s, and a wait through it (``timeout=0.5``) ended 10.5 s later."""
    with Queue(queue_name, connection=own_server.url) as writer:
        job_id = writer.add("x", 1).id
    queue = Queue(queue_name, connection=own_server.url)  # a process starting while it hangs
    own_server.kill(signal.SIGSTOP)
    try:
        for _ in range(2):
            start = time.monotonic()
            events = queue.events
            assert time.monotonic() - start < 0.5
        start = time.monotonic()
        with pytest.raises(WaitUntilFinishedTimeoutError):
            events.wait_for(job_id, timeout=0.5)
        # within the wait's first look (FIRST_LOOK, 1 s), as any wait
        assert time.monotonic() - start < 2.5
    finally:
        own_server.kill(signal.SIGCONT)
        queue.close()


def test_the_first_wait_of_a_sharded_queue_keeps_its_timeout_on_a_server_that_does_not_answer(
    own_server: RedisServer, queue_name: str
) -> None:
    """The first wait starts the sharded reader, which read the queue's
    shard count with no deadline: 5 s on a server that accepts connections
    and answers nothing, for a wait of 0.5 s."""
    with ShardedQueue(queue_name, shards=2, connection=own_server.url) as queue:
        job = queue.add("x", 1)
        own_server.kill(signal.SIGSTOP)
        try:
            start = time.monotonic()
            with pytest.raises(WaitUntilFinishedTimeoutError):
                job.wait_until_finished(timeout=0.5)
            assert time.monotonic() - start < 2.5
        finally:
            own_server.kill(signal.SIGCONT)


# -- many waiters re-checked at once -----------------------------------------


def _fail_on_boom(job: Job) -> Any:
    if job.data == "boom":
        raise ValueError("boom")
    return job.data


def test_a_batched_check_decides_every_kind_of_run_as_a_check_of_its_own_does(
    queue: Queue, qe: QueueEvents, redis_url: str
) -> None:
    from jobq._waiters import Completed, Failed, Waiter

    worker = Worker(queue.name, _fail_on_boom, connection=redis_url)
    cond, done = completed_counter(worker)  # before it takes a job
    with worker:
        failed = threading.Event()
        worker.on("failed", lambda job, exc: failed.set())
        completed = queue.add("x", "value")
        removed_on_completion = queue.add("x", "gone", remove_on_complete=True)
        boom = queue.add("x", "boom")
        with cond:
            assert cond.wait_for(lambda: len(done) == 2, WAIT)
        assert failed.wait(WAIT)
    removed = queue.add("x", "removed")
    assert queue.remove(removed.id)
    waiting = queue.add("x", "waiting")  # no worker any more
    jobs = [completed, removed_on_completion, boom, removed, waiting]
    alone = [Waiter(job.id, job._run) for job in jobs] + [Waiter("never-added")]
    together = [Waiter(job.id, job._run) for job in jobs] + [Waiter("never-added")]
    for waiter in alone:
        qe._table.check(waiter)
    assert qe._table.check_many(together) == []  # every one decided in the batch
    # a missing record is decided once the reader passes the check's checkpoint
    for waiter in alone[3:4] + alone[5:] + together[3:4] + together[5:]:
        assert waiter.event.wait(WAIT)
    outcomes = [(type(w.outcome), getattr(w.outcome, "value", None),
                 getattr(w.outcome, "reason", None)) for w in together]
    assert outcomes == [(type(w.outcome), getattr(w.outcome, "value", None),
                         getattr(w.outcome, "reason", None)) for w in alone]
    assert isinstance(together[0].outcome, Completed) and together[0].outcome.value == "value"
    assert isinstance(together[1].outcome, Completed) and together[1].outcome.value == "gone"
    assert isinstance(together[2].outcome, Failed)
    assert together[2].outcome.reason == "ValueError: boom"
    assert together[4].outcome is None  # still waiting: nothing decided


def test_after_a_gap_waiting_threads_are_rechecked_in_batches_not_each_on_its_own(
    queue_name: str, redis_url: str, redis_client: redis.Redis
) -> None:
    """10,000 threads each checking its own job after a trimmed gap was the
    cause of L1's seconds-long wake-ups (bench/load/README.md)."""
    with Queue(queue_name, connection=redis_url, max_events=100) as q, QueueEvents(
        queue_name, connection=redis_url, blocking_timeout=0.1
    ) as qe:
        assert qe.wait_until_ready(WAIT)
        qe._dispatcher.interval = 3600.0  # no periodic re-check within the test
        own_checks: list[str] = []
        check = qe._table.check

        def counted(waiter: Any, deadline: float | None = None) -> None:
            own_checks.append(waiter.job_id)
            check(waiter, deadline)

        qe._table.check = counted  # type: ignore[method-assign]
        jobs = q.add_bulk({"name": "x", "data": i} for i in range(40))
        results: dict[str, Any] = {}

        def wait(job: Job) -> None:
            results[job.id] = job.wait_until_finished(qe, timeout=WAIT * 3)

        threads = [threading.Thread(target=wait, args=(job,)) for job in jobs]
        for thread in threads:
            thread.start()
        until(lambda: qe._table.jobs() == len(jobs), WAIT)
        with ReaderKiller(redis_client, queue_name):
            worker = Worker(queue_name, echo, connection=redis_url)
            cond, done = completed_counter(worker)  # before it takes a job
            with worker:
                with cond:
                    assert cond.wait_for(lambda: len(done) == len(jobs), WAIT)
            for _ in range(300):  # the jobs' events are trimmed before the reader reads them
                q.emit("filler")
        for thread in threads:
            thread.join(WAIT * 3)
        assert results == {job.id: job.data for job in jobs}
        assert own_checks == []


class CountedChecks:
    """Counts a QueueEvents' record checks: each thread's own (``own``) and
    the batched looks at some waiters (``looks``, how many each)."""

    def __init__(self, qe: QueueEvents) -> None:
        self.own: list[str] = []
        self.looks: list[int] = []
        check, check_many = qe._table.check, qe._table.check_many

        def counted(waiter: Any, deadline: float | None = None) -> None:
            self.own.append(waiter.job_id)
            check(waiter, deadline)

        def counted_many(waiters: list[Any], unreached: bool = True) -> list[Any]:
            if waiters:  # the futures' look (none here) comes with none
                self.looks.append(len(waiters))
            return check_many(waiters, unreached)

        qe._table.check = counted  # type: ignore[method-assign]
        qe._table.check_many = counted_many  # type: ignore[method-assign]


def start_waits(qe: QueueEvents, jobs: list[Job]) -> tuple[list[threading.Thread],
                                                           dict[str, BaseException]]:
    """A thread waiting on each job; what each wait raised, by job id."""
    failures: dict[str, BaseException] = {}

    def wait(job: Job) -> None:
        try:
            job.wait_until_finished(qe, timeout=WAIT * 3)
        except BaseException as exc:
            failures[job.id] = exc

    threads = [threading.Thread(target=wait, args=(job,)) for job in jobs]
    for thread in threads:
        thread.start()
    return threads, failures


def waits_on_delayed_jobs(q: Queue, qe: QueueEvents) -> tuple[
        CountedChecks, list[Job], list[threading.Thread], dict[str, BaseException]]:
    """Ten delayed jobs, a thread waiting on each, once ``qe`` is ready,
    its checks counted from the start: see CountedChecks, start_waits."""
    assert qe.wait_until_ready(WAIT)
    checks = CountedChecks(qe)
    jobs = q.add_bulk({"name": "x", "data": i, "delay": 600_000} for i in range(10))
    return (checks, jobs, *start_waits(qe, jobs))


def test_the_periodic_look_at_waited_records_is_batched_not_one_wake_up_per_thread(
    queue_name: str, redis_url: str, redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A record gone without an event (deleted by hand, FLUSHDB, evicted)
    ends the waits on it at the next periodic look at the records, made for
    every waiting thread in pipelined batches: no thread wakes to check its
    own (10,000 threads each waking every 10 s to check kept a process
    busy with wake-ups: bench/load/README.md, L1). A listener that holds
    the dispatcher up does not hold that look up."""
    monkeypatch.setattr(queue_events, "RECHECK_INTERVAL", 0.5)
    with Queue(queue_name, connection=redis_url) as q, QueueEvents(
        queue_name, connection=redis_url, blocking_timeout=0.1
    ) as qe:
        assert qe.wait_until_ready(WAIT)
        checks = CountedChecks(qe)
        held, release = threading.Event(), threading.Event()

        def hold(event: Any) -> None:
            held.set()
            release.wait(WAIT * 4)

        qe.on("hold", hold)
        q.emit("hold")
        assert held.wait(WAIT)
        jobs = q.add_bulk({"name": "x", "data": i, "delay": 600_000} for i in range(20))
        threads, failures = start_waits(qe, jobs)
        try:
            assert until(lambda: qe._table.jobs() == len(jobs), WAIT)
            # two looks with every thread waiting: nothing to decide yet
            seen = len(checks.looks)
            assert until(lambda: checks.looks[seen + 1:] and checks.looks[-1] == len(jobs), WAIT)
            assert all(t.is_alive() for t in threads)
            # behind jobq's back: no event tells the reader
            redis_client.delete(*(f"jobq:{{{queue_name}}}:job:{job.id}" for job in jobs))
        finally:
            for thread in threads:
                thread.join(WAIT * 3)
            release.set()
        assert sorted(failures) == sorted(job.id for job in jobs)
        assert all(isinstance(exc, JobNotFoundError) for exc in failures.values()), failures
        assert checks.own == []


def test_the_periodic_look_leaves_threads_alone_while_the_server_is_away(
    own_server: RedisServer, queue_name: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A periodic look that cannot reach the server does not send every
    waiting thread to try its own check (ten thousand threads retrying every
    0.25 s through an outage); the reader's re-check once it reconnects
    answers them, in batches, though the restarted server lacks the
    scripts."""
    monkeypatch.setattr(queue_events, "RECHECK_INTERVAL", 0.3)
    url = own_server.url
    with Queue(queue_name, connection=url) as q, QueueEvents(
        queue_name, connection=url, blocking_timeout=0.1
    ) as qe:
        checks, jobs, threads, failures = waits_on_delayed_jobs(q, qe)
        try:
            assert until(lambda: qe._table.jobs() == len(jobs), WAIT)
            own_server.shutdown(nosave=True)  # the records go with it
            seen = len(checks.looks)
            assert until(lambda: len(checks.looks) >= seen + 3, WAIT)  # looks that failed
            assert checks.own == []
            assert all(t.is_alive() for t in threads)
        finally:
            if not own_server.is_running():
                own_server.restart()
            for thread in threads:
                thread.join(WAIT * 3)
        assert sorted(failures) == sorted(job.id for job in jobs)
        assert all(isinstance(exc, JobNotFoundError) for exc in failures.values()), failures
        assert checks.own == []


def test_a_batched_look_cut_once_on_a_server_without_the_functions_still_answers_the_waits(
    queue_name: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The periodic look's first try lost its connection and the server had
    lost jobq's functions meanwhile (a restart): the second try found them
    missing and, being the last, did not load them, so every waiting thread
    was sent to check its own record (seen once after a restart)."""
    from tests.proxy import Proxy

    monkeypatch.setattr(queue_events, "RECHECK_INTERVAL", 0.3)
    with RedisServer(find_server_binary()) as server, \
            Proxy(("127.0.0.1", server.port)) as proxy, \
            Queue(queue_name, connection=server.url) as q, \
            QueueEvents(queue_name, connection=proxy.url, blocking_timeout=0.1) as qe, \
            server.client() as admin:
        checks, jobs, threads, failures = waits_on_delayed_jobs(q, qe)
        try:
            assert until(lambda: qe._table.jobs() == len(jobs), WAIT)

            def lose_everything() -> None:  # after the look's first try reached the server
                admin.function_flush()
                admin.delete(*(f"jobq:{{{queue_name}}}:job:{job.id}" for job in jobs))

            cut = proxy.drop_reply(lambda chunk: b"FCALL" in chunk and b"getOutcome" in chunk,
                                   then=lose_everything)
            assert cut.wait(WAIT)
        finally:
            for thread in threads:
                thread.join(WAIT * 3)
        assert sorted(failures) == sorted(job.id for job in jobs)
        assert all(isinstance(exc, JobNotFoundError) for exc in failures.values()), failures
        assert checks.own == []


def test_the_reader_wakes_waiting_threads_a_batch_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jobq import _waiters
    from jobq._waiters import Completed, Waiter, WakeGate

    # only the woken threads' progress lets the gate wake more
    monkeypatch.setattr(_waiters, "WAKE_STALE", WAIT)
    gate = WakeGate()
    # a few answered by one read: the reader wakes them itself
    few = [Waiter(f"few-{i}") for i in range(_waiters.DIRECT_WAKES)]
    gate.add([(w, Completed(i)) for i, w in enumerate(few)])
    assert all(w.event.is_set() for w in few) and gate.idle()
    for waiter in few:
        waiter.resumed()  # what each woken thread does when done
    # a burst: queued for the waker thread, which wakes a batch at a time
    waiters = [Waiter(f"job-{i}") for i in range(_waiters.WAKE_BATCH + 1)]
    future = Waiter("a-future", callback=lambda waiter, outcome: None)
    gate.add([(w, Completed(i)) for i, w in enumerate(waiters)] + [(future, Completed("f"))])
    assert future.outcome == Completed("f")  # no thread waits on a future: at once
    assert all(w.outcome is None for w in waiters)  # threads: woken between reads
    pumping = threading.Thread(target=gate.pump, args=(WAIT,))
    pumping.start()
    try:
        until(lambda: all(w.event.is_set() for w in waiters[:-1]), WAIT)  # the first batch
        # the next once half of that batch has run
        for waiter in waiters[: _waiters.WAKE_BATCH // 2 - 1]:
            waiter.resumed()
        assert waiters[-1].outcome is None
        waiters[_waiters.WAKE_BATCH // 2 - 1].resumed()
        until(lambda: waiters[-1].event.is_set(), WAIT)
    finally:
        for waiter in waiters[_waiters.WAKE_BATCH // 2:]:
            waiter.resumed()
        pumping.join(WAIT)
    assert not pumping.is_alive()
    assert [w.outcome for w in waiters] == [Completed(i) for i in range(len(waiters))]
    assert gate.idle()


def test_a_gate_wakes_no_thread_that_stopped_waiting() -> None:
    """A thread whose wait ended (timed out) before the gate woke it was
    still counted as woken and yet to run, for ever: each batch of such
    waiters held the next up for a quarter of a second (WAKE_STALE), and a
    burst of waits timing out as their jobs finished woke the threads
    queued behind them seconds late."""
    from jobq import _waiters
    from jobq._waiters import Completed, Waiter, WakeGate

    gate = WakeGate()
    gone = [Waiter(f"gone-{i}") for i in range(4 * _waiters.WAKE_BATCH)]
    for waiter in gone:
        waiter.resumed()  # what a thread does as its wait ends
    live = [Waiter(f"live-{i}") for i in range(_waiters.WAKE_BATCH)]
    gate.add([(w, Completed(0)) for w in gone + live])
    gate.pump(WAIT)
    assert gate.idle()
    assert all(w.outcome is None for w in gone)
    assert all(w.event.is_set() for w in live)
    assert gate._outstanding == len(live)  # the live ones only, until they run
    for waiter in live:
        waiter.resumed()
    assert gate._outstanding == 0


def test_a_thread_the_reader_woke_itself_leaves_the_waker_asleep() -> None:
    """Each ended wait used to wake the waker thread for nothing as its
    thread ran (a third thread switching in every wait): the waker is told
    only of queued waiters, or of woken ones running while it waits for
    them (the batch test above)."""
    from jobq._waiters import Completed, Waiter, WakeGate

    class Counted(threading.Condition):
        told = 0

        def notify(self, n: int = 1) -> None:
            Counted.told += 1
            super().notify(n)

    gate = WakeGate()
    gate._cond = Counted(threading.Lock())
    for i in range(20):  # one job at a time: the reader wakes its thread
        waiter = Waiter(f"job-{i}")
        gate.add([(waiter, Completed(i))])
        assert waiter.event.is_set()
        waiter.resumed()  # what the woken thread does as it runs
    assert Counted.told == 0
    assert gate.idle()


def test_deadline_connections_lend_nothing_once_closed(redis_client: redis.Redis) -> None:
    """A record check that took its connection after the close had cut the
    others waited, on a loaded machine, for its whole timeout (its socket
    closed under it, the poll left on a reused file descriptor): after
    close() nothing is lent, and a cut connection ends the read at once."""
    from jobq.connection import DeadlineConnections, read_by

    connections = DeadlineConnections(redis_client.connection_pool)
    with connections.lent(time.monotonic() + WAIT) as connection:
        connection.send_command("PING")
        connection.disconnect()  # as close() does from another thread
        start = time.monotonic()
        with pytest.raises(redis.exceptions.ConnectionError):
            read_by(connection, time.monotonic() + 30)
        assert time.monotonic() - start < 1.0
    connections.close()
    with pytest.raises(redis.exceptions.ConnectionError):
        connections.take(time.monotonic() + WAIT)


def test_deadline_connections_cut_a_handshake_between_its_pipelined_commands(
    redis_url: str,
) -> None:
    """A close() that met a record check's connect between two commands of
    the handshake (redis-py 8 writes CLIENT SETINFO LIB-NAME and LIB-VER,
    then reads both replies) held the waiting thread for its socket
    timeout: the closing thread's disconnect() made the next write connect
    again, and the handshake then waited on the new socket for the reply to
    a command sent on the old one (5 s in a close test in CI).
    The connect now fails at once, and nothing is lent after the close."""
    from jobq.connection import DeadlineConnections
    from tests.held import Held

    held = Held("handshake")
    pool = held.pool(redis_url)
    connections = DeadlineConnections(pool)
    outcome: list[str] = []

    def check() -> None:
        try:
            with connections.lent(time.monotonic() + 60):
                outcome.append("lent")
        except redis.exceptions.ConnectionError:
            outcome.append("ConnectionError")

    thread, _ = held.meet(check, connections.close)  # joined for WAIT, not the socket's 60 s
    try:
        assert not thread.is_alive()
        assert outcome == ["ConnectionError"]
    finally:
        pool.disconnect()
        thread.join(60)


def test_a_connect_for_a_deadline_keeps_to_it_over_a_slow_handshake(redis_url: str) -> None:
    """Each round trip of a record check's connect (HELLO, CLIENT SETNAME,
    SETINFO...: two at least) was bounded by the time left, not all of them
    together: on a slow link, waits with a second to go took two."""
    from jobq.connection import DeadlineConnections
    from tests.proxy import Proxy

    parts = urlsplit(redis_url)
    with Proxy((parts.hostname or "127.0.0.1", parts.port or 6379)) as proxy:
        pool = redis.ConnectionPool.from_url(proxy.url, client_name="jobq-slow-link")
        connections = DeadlineConnections(pool)
        try:
            for _ in range(8):  # every write of the client held back 0.6 s
                proxy.delay(lambda chunk: True, 0.6)
            start = time.monotonic()
            with pytest.raises(redis.exceptions.TimeoutError, match="no time left to connect"):
                connections.take(time.monotonic() + 1.0)
            # before: connected after 1.2 s at least (0.6 s a round trip)
            assert time.monotonic() - start < 2.0
        finally:
            connections.close()
            pool.disconnect()


def test_close_cuts_a_wait_without_timeout_whose_check_is_connecting(redis_url: str,
                                                                       queue_name: str) -> None:
    """The same cut handshake in a wait with no timeout (its record check
    runs on the bounded client's pool): the close's disconnect() of that
    pool made the handshake connect again and wait for a lost reply, for the
    socket's timeout (for ever with redis-py 5's default of none)."""
    from tests.held import Held

    held = Held("handshake")
    client = redis.Redis(connection_pool=held.pool(redis_url))
    with Queue(queue_name, connection=redis_url) as queue:
        added = queue.add("x")
    outcome: list[str] = []
    qe = QueueEvents(queue_name, connection=client)
    try:
        assert qe.wait_until_ready(WAIT)
        with Queue(queue_name, connection=client) as queue:
            job = queue.get_job(added.id)  # not fresh: the wait reads the record
        assert job is not None

        def wait() -> None:
            try:
                job.wait_until_finished(qe, timeout=None)
            except Exception as exc:
                outcome.append(type(exc).__name__)

        thread, _ = held.meet(wait, qe.close)  # joined for WAIT, not the socket's 60 s
        assert not thread.is_alive()
        assert outcome == ["ClosedError"]
    finally:
        held.released.set()
        qe.close()
        client.close()


def test_a_first_wait_on_a_reader_closed_before_it_connected_raises_closed_error(
    own_server: RedisServer, queue_name: str
) -> None:
    """A first wait waits for the reader's first connect. A close before
    that connect ended left it waiting: for ever when the reader had not
    yet taken its first step, else raising the ConnectionError of the
    connect the close cut, as if the server were away. It raises
    ClosedError, as a wait whose QueueEvents is closed under it does."""
    events = QueueEvents(queue_name, connection=own_server.url)
    ended: list[BaseException] = []

    def wait() -> None:
        try:
            events.wait_for("a-job", timeout=None)
        except BaseException as exc:  # reported below
            ended.append(exc)

    own_server.kill(signal.SIGSTOP)  # the reader's connect gets no answer
    waiter = threading.Thread(target=wait)
    try:
        waiter.start()
        until(lambda: events._started, WAIT)  # the wait started the reader
        events.close()
        waiter.join(WAIT)
    finally:
        own_server.kill(signal.SIGCONT)
        events.close()
        waiter.join(WAIT)
    assert not waiter.is_alive()
    assert len(ended) == 1 and isinstance(ended[0], ClosedError), ended


def test_a_wait_of_no_time_on_a_finished_job_returns_its_value(
    queue: Queue, redis_url: str
) -> None:
    """``timeout=0`` asks whether the job has finished. It raised
    WaitUntilFinishedTimeoutError even for a job finished long before: its
    look at the job's record had no time for the round trip."""
    big = "x" * 5000  # more than an event carries: read with the record
    assert queue.events.wait_until_ready(WAIT)
    jobs = [queue.add("x", "small"), queue.add("x", big)]
    with Worker(queue.name, echo, connection=redis_url, autorun=True):
        for job in jobs:
            job.wait_until_finished(timeout=WAIT)
    for job in jobs:
        again = queue.get_job(job.id)
        assert again is not None
        for waited in (job, again):  # known finished by this process, and not
            assert waited.wait_until_finished(timeout=0) == job.data
    pending = queue.add("x", "later", delay=60_000)
    with pytest.raises(WaitUntilFinishedTimeoutError):
        pending.wait_until_finished(timeout=0)


@pytest.mark.parametrize("timeout", [0, 0.001])
def test_a_wait_of_no_time_before_the_reader_is_ready_still_looks(
    queue: Queue, redis_url: str, timeout: float
) -> None:
    """The wait gave up when the reader (started by the wait itself) was
    not ready within the timeout, before any look at the record: a job
    finished long before timed out in a process that had not waited yet."""
    job = queue.add("x", "done")
    with Worker(queue.name, echo, connection=redis_url, autorun=True):
        assert job.wait_until_finished(timeout=WAIT) == "done"
    for _ in range(3):
        with Queue(queue.name, connection=redis_url) as fresh:  # its reader not started
            again = fresh.get_job(job.id)
            assert again is not None
            assert again.wait_until_finished(timeout=timeout) == "done"
        with Queue(queue.name, connection=redis_url) as fresh:
            pending = fresh.add("x", "later", delay=60_000)
            with pytest.raises(WaitUntilFinishedTimeoutError):
                pending.wait_until_finished(timeout=timeout)


@contextlib.contextmanager
def _reader_through_proxy(queue_name: str) -> Iterator[tuple[Any, ...]]:
    """A private server, a Queue on it, a ready QueueEvents whose reader goes
    through a Proxy (to hold its reconnect), and an admin client."""
    from tests.proxy import Proxy

    with RedisServer(find_server_binary()) as server, \
            Proxy(("127.0.0.1", server.port)) as proxy, \
            Queue(queue_name, connection=server.url) as queue, \
            QueueEvents(queue_name, connection=proxy.url) as events, \
            server.client() as admin:
        assert events.wait_until_ready(WAIT)
        yield server, proxy, queue, events, admin


@pytest.mark.parametrize("kept", [True, False])
def test_a_wait_for_an_id_is_not_answered_by_a_later_run_of_it_after_a_gap(
    queue_name: str, kept: bool
) -> None:
    """``wait_for(id)`` (no run) registered during a run; the id removed and
    added again, the new run finished, and the events trimmed while the
    reader was away: the record's check answered it with the new run's
    result (the new run kept) or, the stream emptied, only the 10 s look
    did (the reader found no gap in an empty stream). It raises
    JobNotFoundError, as a wait that read the removal does."""
    with _reader_through_proxy(queue_name) as (server, proxy, queue, events, admin):
        queue.add("x", "run 1", job_id="k", delay=60)
        outcome: list[Any] = []

        def wait() -> None:
            try:
                outcome.append(events.wait_for("k", timeout=WAIT / 2))
            except Exception as exc:
                outcome.append(exc)

        waiting = threading.Thread(target=wait, name="test-wait-for")
        waiting.start()
        release = threading.Event()
        try:  # its first look done: it follows the run the record held
            until(lambda: [w for w in events._table.snapshot() if w.run], WAIT)
            proxy.hold(lambda chunk: b"jobq-events-" in chunk, release, WAIT)
            assert kill_readers(admin, queue_name)
            queue.remove("k")
            second = queue.add("x", "run 2", job_id="k", remove_on_complete=not kept)
            with Worker(queue_name, echo, connection=server.url):
                assert second.wait_until_finished(timeout=WAIT) == "run 2"
            queue.trim_events(0)
            release.set()  # the reader connects again
        finally:
            release.set()
            waiting.join(WAIT)
        assert len(outcome) == 1 and isinstance(outcome[0], JobNotFoundError), outcome


def test_a_run_whose_events_were_trimmed_away_while_the_reader_was_away_is_looked_at(
    queue_name: str,
) -> None:
    """The reader away while a job ran and the stream was emptied
    (``trim_events(0)``): it found no gap in an empty stream, took the run
    for one it follows, and a wait started then looked at no record and
    waited for events gone (until the 10 s look)."""
    with _reader_through_proxy(queue_name) as (server, proxy, queue, events, admin):
        queue.add("before")  # the reader has read an event: it resumes after it
        until(lambda: events._reader.read_id != (0, 0), WAIT)
        release = threading.Event()
        try:
            reconnected = proxy.hold(lambda chunk: b"jobq-events-" in chunk, release, WAIT)
            assert kill_readers(admin, queue_name)
            assert reconnected.wait(WAIT)
            job = queue.add("x", "done")  # a handle not waited on yet: its run is new
            with Worker(queue_name, echo, connection=server.url):
                until(lambda: queue.get_job_state(job.id) == "completed", WAIT)
            queue.trim_events(0)
        finally:
            release.set()  # the reader connects again
        # connected again and past the stream's last id (nothing is left to read)
        info = admin.xinfo_stream(f"jobq:{{{queue_name}}}:events")
        assert info["length"] == 0
        last = tuple(int(part) for part in info["last-generated-id"].split(b"-"))
        until(lambda: (events._reader.read_id or (0, 0)) >= last, WAIT)
        assert job.wait_until_finished(events, timeout=WAIT / 2) == "done"
