"""FAULTS S1: a Sentinel failover (the master killed, or a SENTINEL
FAILOVER) while a producer adds, a worker runs and a reader waits, on a
private master, replica and Sentinel (tests/sentinels.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import pytest
import redis

from jobq import JobNotFoundError, Queue, QueueEvents, Worker
from tests.faults.test_server_faults import _jobq_threads, _Producer
from tests.sentinels import SentinelSet, running
from tests.test_sentinel import names_on

pytestmark = [pytest.mark.fault, pytest.mark.sentinel]
WAIT = 20.0


@pytest.fixture
def sentinels() -> Iterator[SentinelSet]:
    """A set of the test's own, to fail over."""
    with running() as group:
        yield group


@pytest.mark.parametrize("kill", [True, False], ids=["master-killed", "sentinel-failover"])
def test_s1_a_failover_moves_producers_workers_and_waiters_to_the_new_master(
    sentinels: SentinelSet, queue_name: str, kill: bool, figure: Callable[[str], None]
) -> None:
    url = sentinels.url
    with Queue(queue_name, connection=url) as q, \
            QueueEvents(queue_name, connection=url) as events, \
            Worker(queue_name, lambda job: job.id, connection=url, concurrency=4) as worker:
        worker.start()
        first = q.add("work", {})
        assert first.wait_until_finished(events, timeout=WAIT) == first.id
        threads = _jobq_threads()
        with _Producer(q, {}, per_second=200) as producer:
            until_acked = time.monotonic() + WAIT
            while len(producer.jobs) < 50 and time.monotonic() < until_acked:
                threading.Event().wait(0.02)
            failed_at = time.monotonic()
            new = sentinels.failover(kill)
            switched_at = time.monotonic()
            # adds go on, to the new master
            until_resumed = time.monotonic() + WAIT
            while not any(t > switched_at for t, _ in producer.jobs[-5:]):
                assert time.monotonic() < until_resumed, producer.errors[-3:]
                threading.Event().wait(0.02)
            resumed_at = next(t for t, _ in producer.jobs if t > switched_at)
            count = len(producer.jobs)
            while len(producer.jobs) < count + 50 and time.monotonic() < until_resumed:
                threading.Event().wait(0.02)
        assert all(isinstance(e, (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError))
                   for e in producer.errors), producer.errors[:3]
        # every job acknowledged once the new master was named (and the old
        # one made a replica) runs, and its waiter hears it; one acknowledged
        # by the old master before that may be gone (replication is
        # asynchronous), but no waiter hangs
        after = [job for t, job in producer.jobs if t > switched_at]
        futures: list[Future[Any]] = [job.as_future(events) for _, job in producer.jobs]
        for job in after:
            assert job.wait_until_finished(events, timeout=WAIT) == job.id
        lost = 0
        for future in futures:
            error = future.exception(WAIT)
            if error is not None:
                assert isinstance(error, JobNotFoundError), error
                lost += 1
        assert _jobq_threads() >= threads  # no jobq thread died
        assert any(name.startswith("jobq-worker") for name in names_on(new.port))
    figure(f"S1 ({'master killed' if kill else 'SENTINEL FAILOVER'}): the switch took "
           f"{switched_at - failed_at:.2f} s; first add on the new master "
           f"{resumed_at - switched_at:.2f} s after it; {len(after)} jobs added after it ran; "
           f"{lost} of {len(producer.jobs)} acknowledged jobs lost (their waiters got "
           "JobNotFoundError)")
