"""Queues of one name in several databases of one server. Keys are per
database, but a pub/sub channel's name is not: the cancel hints and the
events of pub/sub mode reach the subscribers of every database, so each
message says whose it is. (A cluster has database 0 alone.)"""

from __future__ import annotations

import os
import threading
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from jobq import Job, JobCancelledError, Queue, QueueEvents, Worker
from tests.polling import until

pytestmark = pytest.mark.skipif(
    os.environ.get("JOBQ_TEST_CLUSTER") == "1", reason="a cluster has one database"
)

WAIT = 20.0


def in_database(url: str, db: int) -> str:
    """``url`` with database ``db``."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{db}"))


@pytest.fixture
def urls(redis_url: str) -> tuple[str, str]:
    """Two databases of the session's server (each test obliterates its queues)."""
    return in_database(redis_url, 1), in_database(redis_url, 2)


def test_a_cancel_in_one_database_leaves_a_running_namesake_in_another_alone(
    urls: tuple[str, str], queue_name: str
) -> None:
    """The cancel channel has no database in its name, and a worker cancelled
    every attempt of the job id it heard: cancelling job "daily" of one
    database stopped the running "daily" of another, whose handler then
    returned early and completed."""
    started = {1: threading.Event(), 2: threading.Event(), "barrier": threading.Event()}
    release = threading.Event()
    seen: dict[Any, bool] = {}

    def handler(db: Any) -> Any:
        def run(job: Job) -> Any:
            key = "barrier" if job.id == "barrier" else db
            started[key].set()
            if key == 2 or key == "barrier":  # runs until cancelled
                if not job.cancelled.wait(WAIT):
                    raise AssertionError("never told of its cancel")
                return None
            release.wait(WAIT)
            seen[db] = job.is_cancelled()
            return "ran"
        return run

    first, second = urls
    with Queue(queue_name, connection=first) as q1, Queue(queue_name, connection=second) as q2, \
            Worker(queue_name, handler(1), connection=first, concurrency=2), \
            Worker(queue_name, handler(2), connection=second):
        mine = q1.add("build", None, job_id="daily")
        theirs = q2.add("build", None, job_id="daily")
        barrier = q1.add("build", None, job_id="barrier")
        assert all(e.wait(WAIT) for e in started.values())
        assert q2.cancel("daily", reason="only the second database's") is True
        with pytest.raises(JobCancelledError):
            theirs.wait_until_finished(timeout=WAIT)
        # the first database's worker hears its own cancel after the other's,
        # on the same channel and connection: once it has, it has heard both
        assert q1.cancel("barrier") is True
        with pytest.raises(JobCancelledError):
            barrier.wait_until_finished(timeout=WAIT)
        release.set()
        assert mine.wait_until_finished(timeout=WAIT) == "ran"
        assert seen == {1: False}
        q1.obliterate(force=True)
        q2.obliterate(force=True)


def test_pubsub_events_of_one_database_reach_neither_waits_nor_listeners_of_another(
    urls: tuple[str, str], queue_name: str
) -> None:
    """In pub/sub mode the events channel has no database in its name, and a
    run's token ('p' and a counter) is per database: a wait on job 1 of one
    database returned job 1's result of another, and listeners got the
    other database's events."""
    first, second = urls
    heard: list[tuple[str, Any]] = []
    with Queue(queue_name, connection=first, event_mode="pubsub") as q1, \
            Queue(queue_name, connection=second, event_mode="pubsub") as q2, \
            QueueEvents(queue_name, connection=first) as events:
        events.on_all_events(lambda event: heard.append((event.name, event.fields.get("job_name"))))
        assert events.wait_until_ready(WAIT)
        mine = q1.add("mine", None)
        theirs = q2.add("theirs", None)
        assert mine.id == theirs.id  # each database numbers its jobs from 1
        results: list[Any] = []
        waiting = threading.Thread(target=lambda: results.append(
            mine.wait_until_finished(events, timeout=WAIT)))
        waiting.start()
        try:
            until(lambda: len(events._table.snapshot()) == 1, timeout=WAIT)  # registered
            with Worker(queue_name, lambda job: "second", connection=second):
                assert theirs.wait_until_finished(timeout=WAIT) == "second"
            with Worker(queue_name, lambda job: "first", connection=first):
                waiting.join(WAIT)
        finally:
            waiting.join(WAIT)
        assert results == ["first"]
        until(lambda: ("completed", None) in heard, timeout=WAIT)
        assert ("added", "mine") in heard and ("added", "theirs") not in heard
        assert [name for name, _ in heard].count("completed") == 1
        q1.obliterate(force=True)
        q2.obliterate(force=True)


def test_a_job_of_one_database_is_not_waited_for_through_the_events_of_another(
    urls: tuple[str, str], queue_name: str
) -> None:
    first, second = urls
    with Queue(queue_name, connection=first) as queue, \
            QueueEvents(queue_name, connection=second, autorun=False) as events:
        job = queue.add("x", None)
        with pytest.raises(ValueError, match="database 1 cannot be waited for through a "
                                             "QueueEvents of database 2"):
            job.wait_until_finished(events, timeout=0)
        queue.obliterate(force=True)
