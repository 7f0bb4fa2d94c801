"""B1–B7: bad data, bad names, corrupt records and misbehaving user code.

Each gets a clear, typed error or a failed job with a readable reason,
nothing is written on rejection, and every jobq thread lives on.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from jobq import (
    Event,
    Job,
    JobFailedError,
    PayloadTooLarge,
    Queue,
    QueueEvents,
    SerializationError,
    Worker,
)
from tests.faults.harness import WAIT

pytestmark = pytest.mark.fault


def _keys(client: redis.Redis, queue_name: str) -> set[bytes]:
    return set(client.scan_iter(match=f"jobq:{{{queue_name}}}:*", count=1000))


def _worker(queue_name: str, redis_url: str, processor: Any, **options: Any) -> Worker:
    options.setdefault("lock_duration", 1.0)
    options.setdefault("stalled_interval", 0.5)
    return Worker(queue_name, processor, connection=redis_url, **options)


# -- B1 / B2: rejected before anything is written ------------------------------


@pytest.mark.parametrize(
    "data",
    [object(), {1: "a"}, 2**64, -(2**63) - 1, {"a", "b"}, datetime.datetime(2026, 1, 1),
     {"nested": [{"deep": object()}]}, {(1, 2): "tuple key"}],
    ids=["object", "int-key", "2**64", "below-int64", "set", "datetime", "nested", "tuple-key"],
)
def test_b1_unencodable_data_rejected_and_nothing_written(
    queue: Queue, redis_client: redis.Redis, queue_name: str, data: Any
) -> None:
    before = _keys(redis_client, queue_name)
    with pytest.raises(SerializationError):
        queue.add("work", data)
    with pytest.raises(SerializationError):
        queue.add_bulk([{"name": "ok", "data": 1}, {"name": "bad", "data": data}])
    assert _keys(redis_client, queue_name) == before


@pytest.mark.parametrize(
    "name", ["a b", "{tag}", "q*", "q?", "[q]", "tab\there", "new\nline", "x" * 101, "", 7]
)
def test_b1_invalid_queue_names_rejected(name: Any, redis_url: str) -> None:
    with pytest.raises(ValueError):
        Queue(name, connection=redis_url)


def test_b1_invalid_job_names_and_ids_rejected(
    queue: Queue, redis_client: redis.Redis, queue_name: str
) -> None:
    before = _keys(redis_client, queue_name)
    for name in ("", "x" * 201, None, 5):
        with pytest.raises(ValueError):
            queue.add(name, 1)  # type: ignore[arg-type]
    for job_id in ("has space", "new\nline", "x" * 201, "12345", ""):
        with pytest.raises(ValueError):
            queue.add("work", 1, job_id=job_id)
    assert _keys(redis_client, queue_name) == before


def test_b2_payload_too_large_rejected_and_nothing_written(
    queue: Queue, redis_client: redis.Redis, queue_name: str
) -> None:
    assert queue.max_payload_bytes == 1024 * 1024
    before = _keys(redis_client, queue_name)
    with pytest.raises(PayloadTooLarge) as refused:
        queue.add("work", b"x" * (1024 * 1024))
    assert isinstance(refused.value, ValueError)
    assert "max_payload_bytes=1048576" in str(refused.value)
    with pytest.raises(PayloadTooLarge):
        queue.add_bulk([{"name": "ok"}, {"name": "big", "data": "y" * 2_000_000}])
    assert _keys(redis_client, queue_name) == before
    with pytest.raises(ValueError):
        Queue(queue_name, connection=queue.client, max_payload_bytes=0)


def test_b2_raised_limit_50_mb_round_trips(
    queue_name: str, redis_url: str, figure: Callable[[str], None]
) -> None:
    size = 50 * 1024 * 1024
    data = b"\x01" * size
    with Queue(queue_name, connection=redis_url, max_payload_bytes=64 * 1024 * 1024) as q, \
            _worker(queue_name, redis_url, lambda job: len(job.data)):
        started = time.monotonic()
        job = q.add("big", data)
        added = time.monotonic() - started
        assert job.wait_until_finished(timeout=WAIT) == size
        assert q.get_job(job.id).data == data  # type: ignore[union-attr]
        q.remove(job.id)
    figure(f"B2 50 MB payload: add {added * 1000 / 50:.1f} ms per MB, round trip OK")


def test_b2_result_over_limit_fails_the_attempt(queue: Queue, queue_name: str,
                                                redis_url: str) -> None:
    with _worker(queue_name, redis_url, lambda job: "z" * job.data, max_result_bytes=1000):
        big = queue.add("work", 2000)
        small = queue.add("work", 10)
        with pytest.raises(JobFailedError) as failure:
            big.wait_until_finished(timeout=WAIT)
        assert "max_result_bytes=1000" in str(failure.value.failed_reason)
        assert small.wait_until_finished(timeout=WAIT) == "z" * 10


# -- B3: unknown job name ------------------------------------------------------


def test_b3_unknown_job_name_fails_and_worker_continues(
    queue: Queue, queue_name: str, redis_url: str
) -> None:
    with _worker(queue_name, redis_url, {"known": lambda job: "ok"}):
        unknown = queue.add("nope", 1)
        known = queue.add("known", 2)
        with pytest.raises(JobFailedError) as failure:
            unknown.wait_until_finished(timeout=WAIT)
        assert "no processor for job name 'nope'" in str(failure.value.failed_reason)
        assert known.wait_until_finished(timeout=WAIT) == "ok"


# -- B4: corrupt msgpack planted in a job record -------------------------------


@pytest.mark.parametrize(
    "raw",
    [b"\xc1", b"\x92\x01", b"\x91" * 100_000 + b"\xc0", b"\xdd\xff\xff\xff\xff",
     b"\x81\x01\x02"],
    ids=["reserved-byte", "truncated", "deep-nesting", "huge-array-header", "int-map-key"],
)
def test_b4_corrupt_record_fails_job_and_worker_lives(
    queue: Queue, redis_client: redis.Redis, queue_name: str, redis_url: str, raw: bytes
) -> None:
    job = queue.add("work", {"fine": True})
    redis_client.hset(f"jobq:{{{queue_name}}}:job:{job.id}", "data", raw)
    with _worker(queue_name, redis_url, lambda j: "ran") as worker:
        with pytest.raises(JobFailedError) as failure:
            job.wait_until_finished(timeout=WAIT)
        assert f"({len(raw)} bytes)" in str(failure.value.failed_reason)
        assert "could not be decoded" in str(failure.value.failed_reason)
        after = queue.add("work", 1)
        assert after.wait_until_finished(timeout=WAIT) == "ran"
        assert worker.is_running()


# -- B5: handler raises a BaseException ----------------------------------------


class Custom(BaseException):
    """A BaseException that is none of the usual ones."""


@pytest.mark.parametrize(
    "exc", [KeyboardInterrupt, SystemExit, GeneratorExit, Custom], ids=lambda e: e.__name__
)
def test_b5_handler_raising_base_exception_fails_job_only(
    queue: Queue, redis_client: redis.Redis, queue_name: str, redis_url: str,
    exc: type[BaseException],
) -> None:
    def handler(job: Job) -> str:
        if job.data == "raise":
            raise exc("from the handler")
        return "ok"

    with _worker(queue_name, redis_url, handler) as worker:
        threads = {t.name for t in threading.enumerate() if t.name.startswith("jobq-")}
        bad = queue.add("work", "raise")
        with pytest.raises(JobFailedError) as failure:
            bad.wait_until_finished(timeout=WAIT)
        assert failure.value.failed_reason == f"{exc.__name__}: from the handler"
        assert failure.value.exc_type == exc.__name__
        assert any(exc.__name__ in line for line in failure.value.stacktrace)
        assert not redis_client.exists(f"jobq:{{{queue_name}}}:lock:{bad.id}")
        good = queue.add("work", "fine")
        assert good.wait_until_finished(timeout=WAIT) == "ok"
        alive = {t.name for t in threading.enumerate() if t.name.startswith("jobq-")}
        assert threads <= alive
        assert worker.is_running()


# -- B6: handler never returns -------------------------------------------------


def test_b6_handler_never_returns_times_out(
    queue: Queue, redis_client: redis.Redis, queue_name: str, redis_url: str
) -> None:
    release = threading.Event()

    def handler(job: Job) -> str:
        if job.data == "hang":
            release.wait(60)  # "never" returns within the test
        return "ok"

    worker = _worker(queue_name, redis_url, handler, concurrency=2)
    try:
        worker.start()
        hung = queue.add("work", "hang", timeout=1)
        started = time.monotonic()
        with pytest.raises(JobFailedError) as failure:
            hung.wait_until_finished(timeout=WAIT)
        elapsed = time.monotonic() - started
        assert "timed out after 1 s" in str(failure.value.failed_reason)
        assert elapsed <= 1 + 0.5 + 0.5 + 0.5, elapsed  # timeout + renew + interval + slack
        lock = f"jobq:{{{queue_name}}}:lock:{hung.id}"
        assert not redis_client.exists(lock)  # renewal stopped, lock released
        assert queue.add("work", "next").wait_until_finished(timeout=WAIT) == "ok"
        # the leaked handler thread: one pool thread stays in user code (the
        # other leaves it just after its job's waiter woke; nothing to wait on)
        deadline = time.monotonic() + WAIT
        while len(worker._roles.runner._in_user_code) != 1 and time.monotonic() < deadline:
            threading.Event().wait(0.01)
        assert len(worker._roles.runner._in_user_code) == 1
    finally:
        release.set()
        worker.close()


# -- B7: listeners that raise ------------------------------------------------


def test_b7_raising_listeners_do_not_stop_dispatch(
    queue: Queue, queue_name: str, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[str] = []
    done = threading.Event()

    def raises_exception(event: Event) -> None:
        raise RuntimeError(f"listener bug on {event.job_id}")

    def raises_system_exit(event: Event) -> None:
        raise SystemExit(3)

    def records(event: Event) -> None:
        seen.append(str(event.job_id))
        if len(seen) == 3:
            done.set()

    with caplog.at_level(logging.ERROR, logger="jobq"), \
            QueueEvents(queue_name, connection=redis_url) as events, \
            _worker(queue_name, redis_url, lambda job: job.data) as worker:
        events.on("completed", raises_exception)
        events.on("completed", raises_system_exit)
        events.on("completed", records)
        worker.on("completed", lambda job, result: (_ for _ in ()).throw(SystemExit(4)))
        assert events.wait_until_ready(WAIT)
        jobs = [queue.add("work", i) for i in range(3)]
        assert [j.wait_until_finished(events, timeout=WAIT) for j in jobs] == [0, 1, 2]
        assert done.wait(WAIT)
        assert seen == [j.id for j in jobs]
        assert worker.is_running()
    raised = [r for r in caplog.records if "raised" in r.getMessage()]
    # each raising listener logged once per event: 2 QueueEvents listeners + 1 worker listener
    assert len(raised) == 3 * 3, [r.getMessage() for r in raised]
