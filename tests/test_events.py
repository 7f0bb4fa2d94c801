"""Tests of QueueEvents, Event, Queue.emit / Queue.events and waiting for jobs.

Everything runs against the session's real server. Waits are bounded
(threading.Event / Condition with timeouts whose result is asserted); no
sleep is used to synchronise.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from jobq import (
    ClosedError,
    Event,
    Job,
    JobFailedError,
    JobMetrics,
    JobNotFoundError,
    JobqError,
    Queue,
    QueueEvents,
    UnrecoverableError,
    WaitUntilFinishedTimeoutError,
    Worker,
    queue_events,
)
from jobq.events import to_netstrings
from jobq.keys import QueueKeys
from jobq.testing import RedisServer, find_server_binary
from tests.conftest import echo
from tests.polling import jobq_threads, until

WAIT = 10.0  # the bound of every wait that should succeed quickly
BIG = 16 * 1024 + 100  # a result encoding to more than the 1 KiB an event carries


# -- helpers ---------------------------------------------------------------


class Recorder:
    """A listener that records events and lets a test wait for them."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._cond = threading.Condition()

    def __call__(self, event: Event) -> None:
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()

    def wait(self, predicate: Callable[[list[Event]], bool], timeout: float = WAIT) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self.events), timeout)

    def wait_count(self, n: int, timeout: float = WAIT) -> bool:
        return self.wait(lambda evs: len(evs) >= n, timeout)

    def wait_name(self, name: str, job_id: str | None = None, timeout: float = WAIT) -> bool:
        return self.wait(
            lambda evs: any(e.name == name and (job_id is None or e.job_id == job_id)
                            for e in evs),
            timeout,
        )

    def snapshot(self) -> list[Event]:
        with self._cond:
            return list(self.events)

    def of(self, job_id: str) -> list[Event]:
        return [e for e in self.snapshot() if e.job_id == job_id]

    def names(self, job_id: str) -> list[str]:
        return [e.name for e in self.of(job_id)]

    def first(self, name: str, job_id: str | None = None) -> Event:
        for event in self.snapshot():
            if event.name == name and (job_id is None or event.job_id == job_id):
                return event
        raise AssertionError(f"no {name!r} event for {job_id!r}")


def reader_clients(
    client: redis.Redis, queue_name: str, reading: bool = False
) -> list[dict[str, Any]]:
    """CLIENT LIST entries of the event readers of ``queue_name``.

    With ``reading``, only stream readers whose last command was XREAD: a
    cluster client that reconnects also opens a short-lived connection of
    the same name to learn the slot map.
    """
    name = f"jobq-events-{queue_name}"
    return [c for c in client.client_list() if c.get("name") == name
            and (not reading or c.get("cmd") == "xread")]


def kill_readers(client: redis.Redis, queue_name: str) -> list[str]:
    """Kill the event reader connections of a queue; return the killed ids."""
    killed = []
    for entry in reader_clients(client, queue_name):
        try:
            client.client_kill_filter(_id=entry["id"])
            killed.append(str(entry["id"]))
        except redis.ResponseError:  # already gone
            pass
    return killed




# -- every event of SPEC's table, with typed fields ---------------------------


def test_job_lifecycle_events_in_order_with_typed_fields(
    queue: Queue, qe: QueueEvents, redis_url: str
) -> None:
    rec = Recorder()
    qe.on_all_events(rec)

    def work(job: Job) -> dict[str, int]:
        job.update_progress({"pct": 50})
        return {"sum": job.data["a"] + job.data["b"]}

    before, start = time.time(), time.monotonic()
    with Worker(queue.name, work, connection=redis_url, name="w-life") as worker:
        job = queue.add("adder", {"a": 1, "b": 2})
        assert job.wait_until_finished(qe, timeout=WAIT) == {"sum": 3}
        assert rec.wait_name("completed", job.id)
        assert rec.wait_name("drained")
    took = time.monotonic() - start  # every duration the server measured lies within it
    assert rec.names(job.id) == ["added", "waiting", "active", "progress", "completed"]

    added = rec.first("added", job.id)
    assert added.job_name == "adder" and added.fields["job_name"] == "adder"
    assert added.delay == 0.0 and isinstance(added.delay, float)
    assert added.priority == 0 and isinstance(added.priority, int)
    assert added.prev is None

    waiting = rec.first("waiting", job.id)
    assert waiting.prev is None

    active = rec.first("active", job.id)
    assert active.attempt == 1 and isinstance(active.attempt, int)
    assert active.worker == worker.name == "w-life"
    assert active.prev == "waiting"

    progress = rec.first("progress", job.id)
    assert progress.progress == {"pct": 50}
    assert progress.fields["progress"] == {"pct": 50}

    completed = rec.first("completed", job.id)
    assert completed.result == {"sum": 3}
    assert completed.prev == "active"
    metrics = completed.metrics
    assert isinstance(metrics, JobMetrics)
    assert metrics.attempt == 1
    for value in (metrics.waited_for, metrics.ran_for, metrics.expected_delay):
        assert isinstance(value, float) and 0.0 <= value <= took
    assert metrics.expected_delay == 0.0
    assert completed.fields["metrics"] is metrics

    drained = rec.first("drained")
    assert drained.job_id is None

    ids = [e.id for e in rec.of(job.id)]
    assert all(isinstance(i, str) and "-" in i for i in ids)
    assert ids == sorted(ids, key=lambda s: tuple(int(p) for p in s.split("-")))
    for event in rec.of(job.id):
        assert isinstance(event.timestamp, float)
        assert before - 5 < event.timestamp < time.time() + 5
        assert event.job_id == job.id


def test_delayed_job_events(queue: Queue, qe: QueueEvents, redis_url: str) -> None:
    rec = Recorder()
    qe.on_all_events(rec)
    with Worker(queue.name, echo, connection=redis_url):
        job = queue.add("later", 7, delay=0.2)
        assert job.wait_until_finished(qe, timeout=WAIT) == 7
        assert rec.wait_name("completed", job.id)
    assert rec.names(job.id) == ["added", "delayed", "waiting", "active", "completed"]
    added = rec.first("added", job.id)
    assert added.delay == pytest.approx(0.2)
    delayed = rec.first("delayed", job.id)
    assert delayed.delay == pytest.approx(0.2)
    assert isinstance(delayed.run_at, float)
    assert delayed.run_at == pytest.approx(delayed.timestamp + 0.2, abs=0.05)
    assert rec.first("waiting", job.id).prev == "delayed"
    assert rec.first("completed", job.id).metrics.expected_delay == pytest.approx(0.2)


def test_retrying_then_failed_events(queue: Queue, qe: QueueEvents, redis_url: str) -> None:
    rec = Recorder()
    qe.on_all_events(rec)

    def boom(job: Job) -> None:
        raise ValueError("boom")

    with Worker(queue.name, boom, connection=redis_url):
        job = queue.add("x", attempts=3, backoff=0.05)
        with pytest.raises(JobFailedError):
            job.wait_until_finished(qe, timeout=WAIT)
        assert rec.wait_name("failed", job.id)
    assert rec.names(job.id) == [
        "added", "waiting",
        "active", "retrying", "delayed", "waiting",
        "active", "retrying", "delayed", "waiting",
        "active", "failed",
    ]  # fmt: skip
    retrying = [e for e in rec.of(job.id) if e.name == "retrying"]
    assert [e.attempt for e in retrying] == [1, 2]
    assert all(e.failed_reason == "ValueError: boom" and e.prev == "active" for e in retrying)
    assert all(e.exc_type == "ValueError" for e in retrying)
    assert all(e.delay == pytest.approx(0.05) for e in retrying)
    assert [e.attempt for e in rec.of(job.id) if e.name == "active"] == [1, 2, 3]
    failed = rec.first("failed", job.id)
    assert failed.failed_reason == "ValueError: boom"
    assert failed.exc_type == "ValueError"
    assert failed.attempt == 3
    assert failed.prev == "active"
    assert isinstance(failed.metrics, JobMetrics) and failed.metrics.attempt == 3
    assert isinstance(failed.metrics.ran_for, float)


def test_retry_without_backoff_goes_straight_to_waiting(
    queue: Queue, qe: QueueEvents, redis_url: str
) -> None:
    rec = Recorder()
    qe.on_all_events(rec)
    calls = []

    def flaky(job: Job) -> str:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("first")
        return "ok"

    with Worker(queue.name, flaky, connection=redis_url):
        job = queue.add("x", attempts=2)
        assert job.wait_until_finished(qe, timeout=WAIT) == "ok"
        assert rec.wait_name("completed", job.id)
    assert rec.names(job.id) == [
        "added", "waiting", "active", "retrying", "waiting", "active", "completed"
    ]
    retrying = rec.first("retrying", job.id)
    assert retrying.delay == 0.0 and retrying.attempt == 1
    assert rec.of(job.id)[4].prev == "active"
    assert rec.first("completed", job.id).metrics.attempt == 2


def test_stalled_event(queue: Queue, qe: QueueEvents, redis_url: str,
                       redis_client: redis.Redis) -> None:
    rec = Recorder()
    qe.on_all_events(rec)
    started = threading.Event()
    release = threading.Event()
    calls: list[int] = []

    def handler(job: Job) -> str:
        calls.append(1)
        if len(calls) == 1:
            started.set()
            assert release.wait(WAIT)
            return "late"
        return "second"

    with Worker(queue.name, handler, connection=redis_url, lock_duration=5,
                stalled_interval=0.3) as worker:
        errors: list[BaseException] = []
        worker.on("error", errors.append)
        job = queue.add("x")
        assert started.wait(WAIT)
        assert redis_client.delete(f"jobq:{{{queue.name}}}:lock:{job.id}") == 1
        assert rec.wait_name("stalled", job.id)
        release.set()
        assert job.wait_until_finished(qe, timeout=WAIT) == "second"
        # waiters resolve on the reader thread, listeners run on the dispatcher
        assert rec.wait_name("completed", job.id)
    stalled = rec.first("stalled", job.id)
    assert stalled.attempt == 1
    names = rec.names(job.id)
    i = names.index("stalled")
    assert names[i + 1] == "waiting"
    assert rec.of(job.id)[i + 1].prev == "active"
    assert names[-1] == "completed"
    assert names.count("completed") == 1  # the late result was discarded


def test_removed_duplicated_paused_resumed_cleaned(
    queue: Queue, qe: QueueEvents, redis_url: str
) -> None:
    rec = Recorder()
    qe.on_all_events(rec)
    waiting = queue.add("a", job_id="custom-1")
    again = queue.add("a", job_id="custom-1")
    assert again.id == waiting.id
    assert queue.remove(waiting.id) is True
    delayed = queue.add("b", delay=60)
    assert delayed.remove() is True
    queue.pause()
    queue.resume()
    with Worker(queue.name, echo, connection=redis_url):
        done = queue.add("c", 1)
        assert done.wait_until_finished(qe, timeout=WAIT) == 1
    assert queue.clean(0) == [done.id]
    assert rec.wait_name("cleaned")

    dup = rec.first("duplicated", "custom-1")
    assert dup.fields == {}
    removed = [e for e in rec.snapshot() if e.name == "removed"]
    assert [(e.job_id, e.prev) for e in removed] == [
        ("custom-1", "waiting"), (delayed.id, "delayed"), (done.id, "completed")
    ]
    paused, resumed = rec.first("paused"), rec.first("resumed")
    assert paused.job_id is None and resumed.job_id is None
    assert paused.fields == {} and resumed.fields == {}
    cleaned = rec.first("cleaned")
    assert cleaned.count == 1 and isinstance(cleaned.count, int)
    assert cleaned.job_id is None
    order = [e.name for e in rec.snapshot() if e.name in ("duplicated", "removed", "paused",
                                                          "resumed", "cleaned")]
    # clean writes `removed` for each job it removes, then `cleaned`
    assert order == ["duplicated", "removed", "removed", "paused", "resumed", "removed",
                     "cleaned"]


def test_every_spec_event_name_is_observed(queue: Queue, qe: QueueEvents,
                                           redis_url: str) -> None:
    """A summary check: every name of SPEC's table is delivered for real jobs."""
    rec = Recorder()
    qe.on_all_events(rec)
    seen: set[str] = set()

    def handler(job: Job) -> str:
        job.update_progress(1)
        if job.data == "fail":
            raise ValueError("no")
        return "ok"

    with Worker(queue.name, handler, connection=redis_url, lock_duration=5,
                stalled_interval=0.3):
        a = queue.add("ok", "ok", delay=0.05, job_id="job-a")
        b = queue.add("fail", "fail", attempts=2)
        assert a.wait_until_finished(qe, timeout=WAIT) == "ok"
        with pytest.raises(JobFailedError):
            b.wait_until_finished(qe, timeout=WAIT)
        queue.add("d", job_id=a.id)
        queue.pause()
        queue.resume()
        queue.remove(b.id)
        queue.clean(0)
        assert rec.wait_name("cleaned")
    seen = {e.name for e in rec.snapshot()}
    expected = {"added", "waiting", "delayed", "active", "progress", "completed",
                "retrying", "failed", "removed", "duplicated", "drained", "paused",
                "resumed", "cleaned"}
    assert expected <= seen  # stalled: see test_stalled_event


# -- listeners ----------------------------------------------------------------


def test_per_job_channel(queue: Queue, qe: QueueEvents, redis_url: str) -> None:
    mine = Recorder()
    everything = Recorder()
    with Worker(queue.name, echo, connection=redis_url):
        other = queue.add("x", "other")
        job = queue.add("x", "mine", delay=0.1)
        qe.on(f"completed:{job.id}", mine)
        qe.on("completed", everything)
        assert job.wait_until_finished(qe, timeout=WAIT) == "mine"
        assert other.wait_until_finished(qe, timeout=WAIT) == "other"
        assert mine.wait_count(1)
        assert everything.wait_name("completed", job.id)
    assert [(e.name, e.job_id, e.result) for e in mine.snapshot()] == [
        ("completed", job.id, "mine")
    ]
    assert qe.listener_count(f"completed:{job.id}") == 1
    assert qe.off(f"completed:{job.id}", mine) is True
    assert qe.listener_count(f"completed:{job.id}") == 0


def test_on_as_decorator_once_off_listener_count(queue: Queue, qe: QueueEvents) -> None:
    calls: list[str] = []
    assert qe.listener_count() == 0

    @qe.on("ping")
    def on_ping(event: Event) -> None:
        calls.append(f"on:{event.n}")

    assert callable(on_ping) and on_ping.__name__ == "on_ping"  # returns the function

    def once_cb(event: Event) -> None:
        calls.append(f"once:{event.n}")

    assert qe.once("ping", once_cb) is once_cb
    assert qe.on("pong", calls.append) == calls.append
    assert qe.listener_count("ping") == 2
    assert qe.listener_count("pong") == 1
    assert qe.listener_count() == 3

    rec = Recorder()
    qe.on("ping", rec)
    queue.emit("ping", n=1)
    queue.emit("ping", n=2)
    assert rec.wait_count(2)
    assert calls == ["on:1", "once:1", "on:2"]
    assert qe.listener_count("ping") == 2  # the once listener removed itself

    assert qe.off("ping", on_ping) is True
    assert qe.off("ping", on_ping) is False
    assert qe.off("ping", once_cb) is False
    assert qe.off("nothing", on_ping) is False
    queue.emit("ping", n=3)
    assert rec.wait_count(3)
    assert calls == ["on:1", "once:1", "on:2"]


def test_listeners_run_in_registration_order(queue: Queue, qe: QueueEvents) -> None:
    order: list[int] = []
    done = threading.Event()
    for i in range(5):
        qe.on("go", lambda e, i=i: order.append(i))
    qe.on("go", lambda e: done.set())
    queue.emit("go")
    assert done.wait(WAIT)
    assert order == [0, 1, 2, 3, 4]


def test_on_all_events_and_off_all_events(queue: Queue, qe: QueueEvents) -> None:
    rec = Recorder()
    assert qe.on_all_events(rec) is rec
    assert qe.listener_count() == 1
    queue.emit("one")
    queue.emit("two", x=1)
    assert rec.wait_count(2)
    assert [e.name for e in rec.snapshot()] == ["one", "two"]
    assert qe.off_all_events(rec) is True
    assert qe.off_all_events(rec) is False
    assert qe.listener_count() == 0
    marker = Recorder()
    qe.on("three", marker)
    queue.emit("three")
    assert marker.wait_count(1)
    assert len(rec.snapshot()) == 2


@pytest.mark.parametrize("exc", [RuntimeError("listener bug"), SystemExit(3)],
                         ids=["exception", "systemexit"])
def test_raising_listener_disturbs_nothing(queue: Queue, qe: QueueEvents,
                                           exc: BaseException) -> None:
    def bad(event: Event) -> None:
        raise exc

    rec = Recorder()
    qe.on("tick", bad)
    qe.on("tick", rec)
    qe.on_all_events(bad)
    for i in range(5):
        queue.emit("tick", i=i)
    assert rec.wait_count(5)
    assert [e.i for e in rec.snapshot()] == [0, 1, 2, 3, 4]
    assert not qe.closed
    # the reader and dispatcher are still alive
    queue.emit("tick", i=5)
    assert rec.wait_count(6)


def test_slow_listener_does_not_delay_waiter(queue: Queue, qe: QueueEvents,
                                             redis_url: str) -> None:
    entered = threading.Event()
    release = threading.Event()
    seen: list[str] = []

    def slow(event: Event) -> None:
        seen.append(str(event.job_id))
        entered.set()
        assert release.wait(WAIT)

    qe.on("completed", slow)
    try:
        with Worker(queue.name, echo, connection=redis_url):
            first = queue.add("x", 1)
            assert first.wait_until_finished(qe, timeout=WAIT) == 1
            assert entered.wait(WAIT)  # the dispatcher is now stuck in `slow`
            second = queue.add("x", 2)
            start = time.monotonic()
            assert second.wait_until_finished(qe, timeout=WAIT) == 2
            # far less than the 10 s the dispatcher stays held in `slow`
            assert time.monotonic() - start < 5.0
            assert not release.is_set() and seen == [first.id]
    finally:
        release.set()
    assert until(lambda: len(seen) == 2)
    assert seen == [first.id, second.id]


# -- replay, resume, last_event_id ------------------------------------------


def _stream_ids(client: redis.Redis, queue_name: str) -> list[str]:
    """The id of each event in the queue's stream, oldest first: an entry
    that carries two events (an add's ``added`` + ``waiting``) gives two."""
    entries = client.xrange(f"jobq:{{{queue_name}}}:events")
    return [i.decode() for i, raw in entries for _ in range(2 if b"ev:2" in raw else 1)]


def test_replay_from_zero_and_resume_from_id(queue: Queue, redis_url: str,
                                             redis_client: redis.Redis) -> None:
    for i in range(10):
        queue.emit("old", i=i)
    queue.add("job", 1)
    ids = _stream_ids(redis_client, queue.name)
    assert len(ids) == 12  # 10 custom events, added, waiting (no worker)
    assert redis_client.xlen(f"jobq:{{{queue.name}}}:events") == 11  # one entry for the add

    rec = Recorder()
    with QueueEvents(queue.name, connection=redis_url, last_event_id="0",
                     blocking_timeout=0.1, autorun=False) as replay:
        replay.on_all_events(rec)
        replay.run()
        assert rec.wait_count(len(ids))
        assert [e.id for e in rec.snapshot()] == ids
        assert [e.i for e in rec.snapshot()[:10]] == list(range(10))
        assert until(lambda: replay.last_event_id == ids[-1])
        queue.emit("new", i=10)
        assert rec.wait_count(len(ids) + 1)
        assert until(lambda: replay.last_event_id == rec.snapshot()[-1].id)

    all_ids = _stream_ids(redis_client, queue.name)
    resumed = Recorder()
    with QueueEvents(queue.name, connection=redis_url, last_event_id=ids[4],
                     blocking_timeout=0.1, autorun=False) as qe2:
        assert qe2.last_event_id is None
        qe2.on_all_events(resumed)
        qe2.run()
        assert resumed.wait_count(len(all_ids) - 5)
        assert until(lambda: qe2.last_event_id == all_ids[-1])
        # no duplicates, no gaps
        assert [e.id for e in resumed.snapshot()] == all_ids[5:]
        for i in range(11, 15):
            queue.emit("more", i=i)
        assert resumed.wait_count(len(all_ids) - 5 + 4)
        got = [e.id for e in resumed.snapshot()]
        assert got == _stream_ids(redis_client, queue.name)[5:]  # each event once, in order


def test_last_event_id_moves_on_without_listeners(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    """A reader nobody listens to skips decoding events no waiter needs;
    its last_event_id stood still there (it moved only on the events that
    end a run), so a reader resumed from it replayed them."""
    with QueueEvents(queue.name, connection=redis_url, blocking_timeout=0.1) as qe:
        assert qe.wait_until_ready(WAIT)
        for i in range(3):
            queue.emit("tick", i=i)
        queue.add("job")  # added + waiting: no run ends
        last = _stream_ids(redis_client, queue.name)[-1]
        assert until(lambda: qe.last_event_id == last)


@pytest.mark.parametrize("start", ["0", "1-0"])
def test_a_replay_waits_on_a_job_whose_events_were_trimmed_by_its_record(
    queue_name: str, redis_url: str, start: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A reader told to start before the stream's first entry took every
    run after its start id as one it would read: a wait on a job whose
    events had been trimmed did not look at its record, and waited until
    the re-check of every 10 s (or timed out). A start id of its own that
    the stream has trimmed past is said once; "0" (all there is) is not."""
    with (
        Queue(queue_name, connection=redis_url, max_events=20) as queue,
        Worker(queue_name, echo, connection=redis_url),
    ):
        job = queue.add("x", 4)  # its first wait comes below
        for i in range(40):  # the job's events leave the stream
            assert queue.add("y", i).wait_until_finished(timeout=WAIT) == i
        assert queue.get_job_state(job.id) == "completed"
    caplog.clear()
    with QueueEvents(queue_name, connection=redis_url, last_event_id=start) as replay:
        assert replay.wait_until_ready(WAIT)
        # long before the re-check of every 10 s
        assert job.wait_until_finished(replay, timeout=2) == 4
        later = Recorder()
        replay.on_all_events(later)
        with Queue(queue_name, connection=redis_url) as queue:
            queue.emit("after")
        assert later.wait_name("after")
    said = caplog.text.count("gone before they were read")
    assert said == (0 if start == "0" else 1)


def test_dollar_means_from_now(queue: Queue, redis_url: str) -> None:
    for i in range(3):
        queue.emit("before", i=i)
    rec = Recorder()
    with QueueEvents(queue.name, connection=redis_url, blocking_timeout=0.1) as qe:
        qe.on_all_events(rec)
        assert qe.wait_until_ready(WAIT)
        queue.emit("after", i=0)
        assert rec.wait_count(1)
        assert [e.name for e in rec.snapshot()] == ["after"]


def test_last_event_id_property_tracks_dispatch(queue: Queue, qe: QueueEvents) -> None:
    assert qe.last_event_id is None
    seen_during: list[str | None] = []
    rec = Recorder()

    def look(event: Event) -> None:
        seen_during.append(qe.last_event_id)

    qe.on_all_events(look)
    qe.on_all_events(rec)
    for i in range(3):
        queue.emit("e", i=i)
    assert rec.wait_count(3)
    ids = [e.id for e in rec.snapshot()]
    # while an event's listeners run, last_event_id is the previous event's id
    assert seen_during == [None, ids[0], ids[1]]
    assert until(lambda: qe.last_event_id == ids[2])


def test_an_entry_of_two_events_is_a_resume_point_only_after_both(
    queue: Queue, qe: QueueEvents
) -> None:
    # an add is one stream entry carrying `added` and `waiting`: a reader
    # resumed at last_event_id must not skip the second of them
    seen_during: dict[str, str | None] = {}
    rec = Recorder()
    qe.on("waiting", lambda event: seen_during.setdefault("waiting", qe.last_event_id))
    qe.on_all_events(rec)
    queue.emit("before")
    assert rec.wait_count(1)
    assert until(lambda: qe.last_event_id == rec.snapshot()[0].id)
    queue.add("job", 1)
    assert rec.wait_count(3)
    before, added, waiting = rec.snapshot()
    assert (added.name, waiting.name) == ("added", "waiting")
    assert added.id == waiting.id  # one entry
    assert seen_during["waiting"] == before.id  # not the entry's id yet
    assert until(lambda: qe.last_event_id == waiting.id)


def test_a_resume_after_an_entry_of_two_events_loses_neither(
    queue: Queue, redis_url: str
) -> None:
    """`added` and `waiting` share their entry's id: a consumer that saved
    it after `added` and stopped resumed after `waiting` too, never hearing
    it. A resume after such an id reads that entry again (its events may
    come twice; none is lost)."""
    job = queue.add("job", 1)
    queue.emit("after")
    with QueueEvents(queue.name, connection=redis_url, last_event_id="0",
                     blocking_timeout=0.1) as replay:
        rec = Recorder()
        replay.on_all_events(rec)
        assert rec.wait_count(3)
    added, waiting, after = rec.snapshot()
    assert (added.name, waiting.name, added.id) == ("added", "waiting", waiting.id)
    with QueueEvents(queue.name, connection=redis_url, last_event_id=added.id,
                     blocking_timeout=0.1) as resumed:
        again = Recorder()
        resumed.on_all_events(again)
        assert again.wait_count(3)
        assert [(e.name, e.job_id) for e in again.snapshot()] == [
            ("added", job.id), ("waiting", job.id), ("after", None)]
    with QueueEvents(queue.name, connection=redis_url, last_event_id=after.id,
                     blocking_timeout=0.1) as later:  # an entry of one: after it
        tail = Recorder()
        later.on_all_events(tail)
        queue.emit("last")
        assert tail.wait_count(1)
        assert [e.name for e in tail.snapshot()] == ["last"]


def test_no_event_lost_across_empty_block_timeouts(queue: Queue, redis_url: str) -> None:
    rec = Recorder()
    pause = threading.Event()  # never set: paces the producer between reads
    with QueueEvents(queue.name, connection=redis_url, blocking_timeout=0.05) as qe:
        qe.on_all_events(rec)
        assert qe.wait_until_ready(WAIT)
        n = 0
        for round_ in range(12):
            assert not pause.wait(0.07 * (1 + round_ % 3))  # several empty reads pass
            burst = 1 + round_ % 4
            for _ in range(burst):
                queue.emit("tick", seq=n)
                n += 1
            assert rec.wait_count(n)
        assert [e.seq for e in rec.snapshot()] == list(range(n))


def test_a_slow_error_listener_holds_up_neither_the_reader_nor_a_wait(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    """The reader told its `error` listeners itself, on its own thread: one
    that took its time stopped every event and wait behind it."""
    told, release = threading.Event(), threading.Event()
    threads: list[str] = []

    def on_error(exc: BaseException) -> None:
        threads.append(threading.current_thread().name)
        told.set()
        release.wait(WAIT)

    queue.emit("warm")  # the stream exists: one connection reads it (no standby)
    with QueueEvents(queue.name, connection=redis_url, blocking_timeout=0.1) as qe:
        qe.on("error", on_error)
        assert qe.wait_until_ready(WAIT)
        try:
            live: list[dict[str, Any]] = []

            def one_reader() -> bool:  # its stream reader, reading
                live[:] = reader_clients(redis_client, queue.name, reading=True)
                return len(live) == 1

            assert until(one_reader)
            assert redis_client.client_kill_filter(_id=live[0]["id"]) == 1
            assert told.wait(WAIT)  # the listener holds on...
            job = queue.add("x")
            with Worker(queue.name, echo, connection=redis_url):
                assert job.wait_until_finished(qe, timeout=WAIT) is None  # ...the wait does not
        finally:
            release.set()
    assert threads and not threads[0].startswith("jobq-events")


def test_reader_connection_killed_loses_and_duplicates_nothing(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    rec = Recorder()
    errors: list[BaseException] = []
    total = 200
    with QueueEvents(queue.name, connection=redis_url, blocking_timeout=0.1) as qe:
        qe.on_all_events(rec)
        qe.on("error", errors.append)
        assert qe.wait_until_ready(WAIT)
        kills = 0
        live: list[dict[str, Any]] = []

        def one_reader() -> bool:
            live[:] = reader_clients(redis_client, queue.name, reading=True)
            return len(live) == 1

        for seq in range(total):
            queue.emit("tick", seq=seq)
            if seq % 40 == 20:
                # the previous kill's reconnection has completed
                assert until(one_reader)
                before = {live[0]["id"]}
                assert redis_client.client_kill_filter(_id=live[0]["id"]) == 1
                kills += 1
                if seq % 80 == 20:  # sometimes emit more at once while it reconnects
                    continue
                assert until(lambda before=before: any(
                    c["id"] not in before for c in reader_clients(redis_client, queue.name)))
        assert kills == 5
        assert rec.wait_count(total)
        assert not rec.wait_count(total + 1, timeout=0.3)  # nothing duplicated
        events = rec.snapshot()
        assert [e.seq for e in events] == list(range(total))
        assert len({e.id for e in events}) == total
        assert [e.id for e in events] == _stream_ids(redis_client, queue.name)
        assert len(reader_clients(redis_client, queue.name)) == 1


def test_wait_until_ready_then_every_event_is_delivered(queue: Queue, redis_url: str) -> None:
    for i in range(15):
        rec = Recorder()
        with QueueEvents(queue.name, connection=redis_url, blocking_timeout=0.05,
                         autorun=False) as qe:
            qe.on_all_events(rec)
            assert qe.wait_until_ready(WAIT) is True  # starts the reader too
            queue.emit("hello", i=i)
            assert rec.wait_count(1), f"event lost on round {i}"
            assert rec.snapshot()[0].i == i


def test_autorun_false_and_run(queue: Queue, redis_url: str) -> None:
    def readers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == f"jobq-events-{queue.name}"]

    rec = Recorder()
    qe = QueueEvents(queue.name, connection=redis_url, blocking_timeout=0.1, autorun=False)
    with qe:
        qe.on_all_events(rec)
        queue.emit("before-run")
        assert readers() == []
        assert qe.run() is qe
        assert qe.run() is qe  # a second call does nothing
        assert len(readers()) == 1
        assert qe.wait_until_ready(WAIT)
        queue.emit("after-run")
        assert rec.wait_count(1)
        assert [e.name for e in rec.snapshot()] == ["after-run"]
    assert readers() == []
    with pytest.raises(ClosedError):
        qe.run()


def test_close_is_prompt_and_idempotent(queue: Queue, redis_url: str) -> None:
    qe = QueueEvents(queue.name, connection=redis_url, blocking_timeout=10)
    assert qe.wait_until_ready(WAIT)
    start = time.monotonic()
    qe.close()
    assert time.monotonic() - start < 5.0  # not the end of the 10 s block
    assert qe.closed
    qe.close()  # idempotent
    assert not [t for t in threading.enumerate() if t.name.endswith(queue.name)
                and t.name.startswith("jobq-") and t.is_alive()]


def test_close_releases_blocked_waiter_with_closed_error(queue: Queue, redis_url: str) -> None:
    job = queue.add("never-run")
    qe = QueueEvents(queue.name, connection=redis_url, blocking_timeout=10)
    outcome: list[BaseException] = []
    registered = threading.Event()

    def waiter() -> None:
        registered.set()
        try:
            job.wait_until_finished(qe, timeout=30)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=waiter)
    try:
        assert qe.wait_until_ready(WAIT)
        thread.start()
        assert registered.wait(WAIT)
        assert until(lambda: qe._table.waiting_on(job.id))  # it is blocked in the wait
        start = time.monotonic()
        qe.close()
        thread.join(WAIT)
        assert not thread.is_alive()
        assert time.monotonic() - start < 5.0  # not the end of the 10 s block, nor the 30 s wait
    finally:
        qe.close()
        thread.join(5)
    assert len(outcome) == 1 and isinstance(outcome[0], ClosedError)
    with pytest.raises(ClosedError):
        job.wait_until_finished(qe, timeout=1)


def test_no_listener_is_added_to_a_closed_object(queue: Queue, redis_url: str) -> None:
    """A listener added after close() is never called: ClosedError, as any
    other method of a closed object (it was taken in silence)."""
    qe = QueueEvents(queue.name, connection=redis_url)
    worker = Worker(queue.name, echo, connection=redis_url)
    kept = qe.on("completed", print), worker.on("completed", print)
    qe.close()
    worker.close()
    for obj in (qe, worker):
        with pytest.raises(ClosedError, match="is closed"):
            obj.on("completed", print)
        with pytest.raises(ClosedError, match="is closed"):
            obj.once("completed", print)
        with pytest.raises(ClosedError, match="is closed"):
            obj.on("failed")(print)
    with pytest.raises(ClosedError, match="is closed"):
        qe.on_all_events(print)
    # taking listeners off, and counting them, still work
    assert qe.listener_count("completed") == worker.listener_count("completed") == 1
    assert qe.off("completed", kept[0]) and worker.off("completed", kept[1])


# -- custom events ---------------------------------------------------------


def test_emit_custom_event_with_msgpack_fields(queue: Queue, qe: QueueEvents,
                                               redis_url: str, queue_name: str) -> None:
    rec = Recorder()
    qe.on("report", rec)
    queue.emit("report", n=1, data={"a": [1, 2.5, None]}, blob=b"\x00\xff", text="é")
    with Queue(queue_name, connection=redis_url) as other:
        other.emit("report", n=2)
    assert rec.wait_count(2)
    first, second = rec.snapshot()
    assert first.name == "report" and first.job_id is None and first.prev is None
    assert dict(first.fields) == {"n": 1, "data": {"a": [1, 2.5, None]}, "blob": b"\x00\xff",
                                  "text": "é"}
    assert first.n == 1 and first.data == {"a": [1, 2.5, None]} and first.blob == b"\x00\xff"
    assert isinstance(first.id, str) and isinstance(first.timestamp, float)
    assert abs(first.timestamp - time.time()) < 60
    assert dict(second.fields) == {"n": 2}
    with pytest.raises(AttributeError):
        _ = first.missing_field


def test_emit_fields_colliding_with_event_attributes(queue: Queue, qe: QueueEvents) -> None:
    rec = Recorder()
    qe.on("clash", rec)
    queue.emit("clash", name="other", id=5, job_id="j", timestamp="t", prev="p",
               fields=[1])
    assert rec.wait_count(1)
    event = rec.snapshot()[0]
    assert event.name == "clash"
    assert isinstance(event.id, str) and event.id != 5
    assert event.job_id is None
    assert isinstance(event.timestamp, float)
    assert event.prev is None
    assert dict(event.fields) == {"name": "other", "id": 5, "job_id": "j",
                                  "timestamp": "t", "prev": "p", "fields": [1]}


@pytest.mark.parametrize("mode", ["pubsub", "stream"])
def test_a_custom_events_field_named_db_reaches_its_listeners(
    queue_name: str, redis_url: str, mode: str
) -> None:
    """In pub/sub mode a message names its queue's database in a field db,
    after the event's own: a custom event's field db was dropped (the
    last one was kept and taken for the database)."""
    rec = Recorder()
    with Queue(queue_name, connection=redis_url, event_mode=mode) as queue:
        queue.add("warm-up")  # the mode stored before the reader connects
        with QueueEvents(queue_name, connection=redis_url) as qe:
            qe.on("report", rec)
            assert qe.wait_until_ready(WAIT)
            queue.emit("report", db=5, other=1)
            queue.emit("report", db="0", n=2)  # another database's number, as a value
            assert rec.wait_count(2)
        queue.obliterate(force=True)
    assert [dict(event.fields) for event in rec.snapshot()] == [
        {"db": 5, "other": 1}, {"db": "0", "n": 2}]


def test_a_custom_event_named_star_is_refused_and_a_raw_one_reaches_each_listener_once(
    queue: Queue, qe: QueueEvents, redis_client: redis.Redis
) -> None:
    """'*' is the channel of every event: an event of that name reached each
    all-events listener twice."""
    with pytest.raises(ValueError, match="not '\\*'"):
        queue.emit("*", n=1)
    rec = Recorder()
    qe.on_all_events(rec)
    assert qe.wait_until_ready(WAIT)
    redis_client.xadd(queue._context.keys.events, {"ev": "*", "jid": ""})  # another client's
    queue.emit("after")
    assert rec.wait_count(2)
    assert [e.name for e in rec.snapshot()] == ["*", "after"]


def test_custom_event_named_like_a_job_event(queue: Queue, qe: QueueEvents,
                                             redis_url: str) -> None:
    """A custom 'completed' without a job must not resolve or break anything."""
    rec = Recorder()
    qe.on("completed", rec)
    queue.emit("completed", result="fake")
    with Worker(queue.name, echo, connection=redis_url):
        job = queue.add("x", "real")
        assert job.wait_until_finished(qe, timeout=WAIT) == "real"
    assert rec.wait_count(2)
    assert [(e.job_id, e.result) for e in rec.snapshot()] == [(None, "fake"), (job.id, "real")]


def test_the_channel_of_a_job_named_none_hears_only_its_job(
    queue: Queue, qe: QueueEvents, redis_url: str
) -> None:
    # an event without a job (custom, drained) has no per-job channel: it
    # is not the job "None"'s (a custom id made of str(None))
    mine = Recorder()
    qe.on("completed:None", mine)
    qe.on("drained:None", mine)
    queue.emit("completed", result="fake")
    with Worker(queue.name, echo, connection=redis_url):
        job = queue.add("x", "real", job_id="None")
        assert job.wait_until_finished(qe, timeout=WAIT) == "real"
    done = threading.Event()
    qe.on("after", lambda event: done.set())
    queue.emit("after")  # read after the job's events and the drain
    assert done.wait(WAIT)
    assert [(e.name, e.job_id, e.result) for e in mine.snapshot()] == [
        ("completed", "None", "real")]


def test_a_custom_obliterated_event_is_no_obliterate(
    queue: Queue, qe: QueueEvents, redis_client: redis.Redis
) -> None:
    # an obliterate makes the reader re-check every waiter (their jobs are
    # gone); a custom event of that name reaches its listeners, nothing more
    rec = Recorder()
    qe.on("obliterated", rec)
    job = queue.add("x")
    waiter = job.as_future(qe)
    redis_client.delete(f"jobq:{{{queue.name}}}:job:{job.id}")  # gone, with no event
    queue.emit("obliterated", by="me")
    assert rec.wait_count(1)
    assert [(e.job_id, e.by) for e in rec.snapshot()] == [(None, "me")]
    # the waiter was not re-checked: it waits on (a real obliterate would
    # have answered it with JobNotFoundError at once)
    with pytest.raises(concurrent.futures.TimeoutError):
        waiter.result(timeout=1.0)


# -- pub/sub mode ------------------------------------------------------------


def test_a_pubsub_reader_follows_the_queue_to_its_stream_when_the_mode_is_lost(
    queue_name: str, redis_url: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server lost the queue's settings (FLUSHALL, a restart without
    persistence: here its mode alone): the scripts write the events to the
    stream again, and a reader subscribed to the channel got none, for good."""
    from jobq import _reader

    monkeypatch.setattr(_reader, "MODE_CHECK_INTERVAL", 0.2)
    with Queue(queue_name, connection=redis_url, event_mode="pubsub") as queue, \
            QueueEvents(queue_name, connection=redis_url, blocking_timeout=0.1) as qe, \
            Worker(queue_name, echo, connection=redis_url):
        rec = Recorder()
        qe.on("completed", rec)
        assert qe.wait_until_ready(WAIT)
        assert queue.add("x", 0).wait_until_finished(qe, timeout=WAIT) == 0
        redis_client.hdel(queue._context.keys.meta, "em")
        # added by a Queue first used since, of no mode (the pub/sub
        # Queue's add would store its mode again)
        with Queue(queue_name, connection=redis_url) as plain:
            jobs = [plain.add("x", i) for i in range(1, 4)]
            assert [job.wait_until_finished(qe, timeout=WAIT) for job in jobs] == [1, 2, 3]
        assert rec.wait_count(4)
        assert sorted(e.result for e in rec.snapshot()) == [0, 1, 2, 3]
        assert qe._reader.mode == "stream"


def test_a_pubsub_queue_that_lost_its_data_is_heard_whole_once_it_stores_its_mode_again(
    queue_name: str, redis_url: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a restart without persistence (here: the queue's keys deleted),
    the reader listens to the stream with a subscription kept aside. The
    next add writes to the stream, then its Queue stores pub/sub mode again:
    the subscription had been closed at the add's events, and what was
    published until the reader subscribed again was lost (the first job's
    `completed`, every event of the second)."""
    from jobq import _reader

    monkeypatch.setattr(_reader, "MODE_CHECK_INTERVAL", 0.5)
    with Queue(queue_name, connection=redis_url, event_mode="pubsub") as queue, \
            QueueEvents(queue_name, connection=redis_url, blocking_timeout=0.1) as qe, \
            Worker(queue_name, echo, connection=redis_url):
        rec = Recorder()
        qe.on("completed", rec)
        assert qe.wait_until_ready(WAIT)
        assert queue.add("x", 0).wait_until_finished(qe, timeout=WAIT) == 0
        redis_client.delete(*redis_client.keys(f"jobq:{{{queue_name}}}:*"))
        reader = qe._reader
        assert until(lambda: reader.mode == "stream" and reader.event_mode.standby is not None)
        jobs = [queue.add("x", i) for i in range(1, 6)]
        assert [job.wait_until_finished(qe, timeout=WAIT) for job in jobs] == [1, 2, 3, 4, 5]
        assert rec.wait_count(6)
        assert sorted(e.result for e in rec.snapshot()) == [0, 1, 2, 3, 4, 5]
        assert reader.mode == "pubsub"


def test_a_reader_that_lost_pub_sub_mode_hears_the_queue_store_it_again_after_stream_events(
    queue_name: str, redis_url: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After its queue lost pub/sub mode, a reader reads the stream. A Queue
    that gave no mode adds there; later the pub/sub Queue stores the mode
    again. The reader had closed the subscription it kept aside once the
    stream's events came, and subscribed anew at the switch: what was
    published while it did (here a bulk right after the switch) was lost
    to its listeners. It keeps the subscription aside while no mode is
    stored."""
    from jobq import _reader

    monkeypatch.setattr(_reader, "MODE_CHECK_INTERVAL", 0.2)
    rec = Recorder()
    with Queue(queue_name, connection=redis_url, event_mode="pubsub") as queue, \
            QueueEvents(queue_name, connection=redis_url, blocking_timeout=0.1) as qe, \
            Worker(queue_name, echo, connection=redis_url, concurrency=4):
        qe.on("added", rec)
        reader, loop = qe._reader, qe._loop
        assert qe.wait_until_ready(WAIT)
        assert queue.add("x", 0).wait_until_finished(qe, timeout=WAIT) == 0
        redis_client.hdel(queue._context.keys.meta, "em")  # the mode lost
        assert until(lambda: reader.mode == "stream")
        with Queue(queue_name, connection=redis_url) as plain:  # gives no mode
            assert plain.add("x", 1).wait_until_finished(qe, timeout=WAIT) == 1
        mode = reader.event_mode
        for _ in range(3):  # a few looks at the stored mode later (or its close)
            due = loop._next_mode_check
            until(lambda: loop._next_mode_check > due or mode.standby is None,  # noqa: B023
                  timeout=WAIT)
        assert mode.standby is not None  # kept aside: no mode stored
        queue.add("x", 2)  # stores pub/sub mode again
        jobs = queue.add_bulk([{"name": "x", "data": i} for i in range(3, 23)])
        assert [job.wait_until_finished(qe, timeout=WAIT) for job in jobs] == list(range(3, 23))
        assert rec.wait_count(23)
        assert sorted(int(e.job_id in {j.id for j in jobs}) for e in rec.snapshot()) \
            == [0] * 3 + [1] * 20
        assert reader.mode == "pubsub" and mode.standby is None and not mode.expects_pubsub


def test_the_reader_of_a_pub_sub_queue_not_yet_set_up_misses_nothing_when_it_stores_its_mode(
    queue_name: str, redis_url: str
) -> None:
    """``Queue.events`` of a Queue given pub/sub mode and not yet used (no
    I/O: the mode not stored) on a queue whose stream holds events already:
    the reader followed the stream, and when the Queue's first add stored
    pub/sub mode it subscribed anew, losing what was published meanwhile.
    It keeps a subscription aside while no mode is stored."""
    rec = Recorder()
    with Queue(queue_name, connection=redis_url) as plain:
        plain.add("x", 0)  # events in the stream, no mode stored
    with Queue(queue_name, connection=redis_url, event_mode="pubsub") as queue, \
            Worker(queue_name, echo, connection=redis_url, concurrency=4):
        qe = queue.events
        qe.on("added", rec)
        assert qe.wait_until_ready(WAIT)
        assert qe._reader.event_mode.standby is not None
        queue.add("x", 1)  # stores pub/sub mode
        jobs = queue.add_bulk([{"name": "x", "data": i} for i in range(2, 22)])
        assert [job.wait_until_finished(timeout=WAIT) for job in jobs] == list(range(2, 22))
        assert rec.wait_count(21)
        assert qe._reader.mode == "pubsub"


def test_a_reader_that_lost_pub_sub_mode_lets_its_spare_subscription_go_once_stream_is_stored(
    queue_name: str, redis_url: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The subscription a reader keeps aside after its queue lost pub/sub
    mode goes once a Queue stores stream mode: one connection, as ever."""
    from jobq import _reader

    monkeypatch.setattr(_reader, "MODE_CHECK_INTERVAL", 0.2)
    rec = Recorder()
    name = f"jobq-events-{queue_name}"
    with Queue(queue_name, connection=redis_url, event_mode="pubsub") as queue, \
            QueueEvents(queue_name, connection=redis_url, blocking_timeout=0.1) as qe, \
            Worker(queue_name, echo, connection=redis_url):
        qe.on("completed", rec)
        mode = qe._reader.event_mode
        assert qe.wait_until_ready(WAIT)
        assert queue.add("x", 0).wait_until_finished(qe, timeout=WAIT) == 0
        redis_client.delete(*redis_client.keys(f"jobq:{{{queue_name}}}:*"))
        assert until(lambda: mode.expects_pubsub and mode.standby is not None)
        with Queue(queue_name, connection=redis_url, event_mode="stream") as stream:
            assert stream.add("x", 1).wait_until_finished(qe, timeout=WAIT) == 1
            until(lambda: mode.standby is None and not mode.expects_pubsub
                  and sum(c.get("name") == name for c in redis_client.client_list()) == 1,
                  timeout=WAIT)
            assert stream.add("x", 2).wait_until_finished(qe, timeout=WAIT) == 2
        assert rec.wait_count(3), [(e.name, e.job_id, e.result) for e in rec.snapshot()]


@pytest.mark.parametrize("first_after", ["follower", "new", "new-then-depends-on"])
def test_a_pubsub_queue_stores_its_mode_again_after_another_queue_stored_settings_first(
    queue_name: str, redis_url: str, redis_client: redis.Redis, first_after: str
) -> None:
    """After the server lost the queue's settings, a Queue that gave no mode
    (one that followed pub/sub mode, or one first used after the loss)
    added first and stored the settings without a mode: the long-lived
    `Queue(event_mode="pubsub")` found them stored and never put its mode
    back (events went to the stream for good), its `event_mode` still
    saying pub/sub. Now either add of a pub/sub Queue stores it again."""
    meta = f"jobq:{{{queue_name}}}:meta"
    with Queue(queue_name, connection=redis_url, event_mode="pubsub") as pubsub, \
            Queue(queue_name, connection=redis_url) as follower:
        pubsub.add("x", 0)
        assert follower.event_mode == "pubsub"
        redis_client.delete(meta)  # the server lost the queue's settings
        if first_after == "follower":  # it restores the mode it followed
            follower.add("x", 1)
        else:
            with Queue(queue_name, connection=redis_url) as new:
                assert new.event_mode == "stream"
                new.add("x", 1)
                assert redis_client.hget(meta, "cfg") == b"1"
                assert redis_client.hget(meta, "em") is None
                if first_after == "new":
                    pubsub.add("x", 2)  # its add finds another mode stored: stores its own
                else:  # an add with dependencies (addFlow.lua) too
                    pubsub.add("x", 2, depends_on=[new.add("dep").id])
        assert redis_client.hget(meta, "em") == b"pubsub"
        with Queue(queue_name, connection=redis_url) as later:
            assert later.event_mode == "pubsub"
        # a Queue of stream mode that stored its mode first is followed
        redis_client.delete(meta)
        with Queue(queue_name, connection=redis_url, event_mode="stream") as stream:
            stream.add("x", 3)
        for _ in range(3):
            pubsub.add("x", 4)
        assert redis_client.hget(meta, "em") == b"stream"
        assert pubsub.event_mode == "stream"


def test_a_reader_started_after_an_obliterate_follows_pubsub_mode_stored_then(
    queue_name: str, redis_url: str
) -> None:
    """An obliterate keeps the stream (with its `obliterated` event) and no
    mode: a reader started then took the queue for a stream one, kept no
    subscription aside, and lost the events published once a Queue stored
    pub/sub mode, until it subscribed again."""
    with Queue(queue_name, connection=redis_url) as first:
        first.obliterate(force=True)
    with QueueEvents(queue_name, connection=redis_url) as qe:
        rec, every = Recorder(), Recorder()
        qe.on("completed", rec)
        qe.on_all_events(every)
        assert qe.wait_until_ready(WAIT)
        with Queue(queue_name, connection=redis_url, event_mode="pubsub") as queue, \
                Worker(queue_name, echo, connection=redis_url):
            jobs = [queue.add("x", i) for i in range(5)]
            assert [job.wait_until_finished(qe, timeout=WAIT) for job in jobs] == list(range(5))
            assert rec.wait_count(5)
        assert sorted(e.result for e in rec.snapshot()) == list(range(5))
        # it starts after the obliterate's event, as a reader of a stream does
        assert "obliterated" not in [e.name for e in every.snapshot()]


def test_pubsub_mode_end_to_end(queue_name: str, redis_url: str,
                                redis_client: redis.Redis) -> None:
    with Queue(queue_name, connection=redis_url, event_mode="pubsub") as queue:
        assert queue.event_mode == "pubsub"
        rec = Recorder()
        with (
            QueueEvents(queue_name, connection=redis_url, blocking_timeout=0.1) as qe,
            Worker(queue_name, echo, connection=redis_url),
        ):
            qe.on_all_events(rec)
            assert qe.wait_until_ready(WAIT)
            job = queue.add("x", {"v": 1})
            assert job.wait_until_finished(qe, timeout=WAIT) == {"v": 1}
            assert rec.wait_name("completed", job.id)
            assert rec.names(job.id) == ["added", "waiting", "active", "completed"]
            completed = rec.first("completed", job.id)
            assert completed.id is None
            assert completed.result == {"v": 1}
            assert isinstance(completed.metrics, JobMetrics)
            assert isinstance(completed.timestamp, float)
            assert abs(completed.timestamp - time.time()) < 60
            assert rec.first("active", job.id).prev == "waiting"
            assert all(e.id is None for e in rec.snapshot())
            assert qe.last_event_id is None

            queue.emit("custom", x=[1, 2])
            assert rec.wait_name("custom")
            assert rec.first("custom").x == [1, 2]

            # missing jobs
            with pytest.raises(JobNotFoundError):
                qe.wait_for("never-existed", timeout=WAIT)
            gone = queue.add("y", delay=60)
            assert gone.remove()
            with pytest.raises(JobNotFoundError):
                gone.wait_until_finished(qe, timeout=WAIT)

            # the reader resubscribes after its connection is killed
            assert len(kill_readers(redis_client, queue_name)) >= 1
            n = len(rec.snapshot())
            for seq in range(200):
                queue.emit("probe", seq=seq)
                if rec.wait(lambda evs: len(evs) > n, timeout=0.05):
                    break
            assert rec.wait(lambda evs: len(evs) > n, timeout=1)
            job2 = queue.add("x", 2)
            assert job2.wait_until_finished(qe, timeout=WAIT) == 2
            # timed-out and failed waits also work in pub/sub mode
            never = queue.add("z", delay=60)
            with pytest.raises(WaitUntilFinishedTimeoutError):
                never.wait_until_finished(qe, timeout=0.2)


@pytest.mark.skipif(os.environ.get("JOBQ_TEST_CLUSTER") == "1",
                    reason="in a cluster, a queue's events are published on its own node")
def test_pubsub_events_on_one_server_reach_the_readers_of_0_1_and_theirs_reach_0_2(
    queue_name: str, redis_url: str, redis_client: redis.Redis
) -> None:
    """0.2 published pub/sub events with SPUBLISH, which 0.1's readers
    (SUBSCRIBE) never hear, and heard none of a 0.1 worker's (PUBLISH):
    in a rolling upgrade every wait across the two versions timed out. On
    one server they are published with PUBLISH again."""
    old = redis_client.pubsub()  # a 0.1 reader's subscription
    rec = Recorder()
    with Queue(queue_name, connection=redis_url, event_mode="pubsub") as queue, \
            QueueEvents(queue_name, connection=redis_url) as qe:
        channel = queue._context.keys.events
        old.subscribe(channel)
        assert old.get_message(timeout=WAIT)["type"] == "subscribe"
        qe.on_all_events(rec)
        assert qe.wait_until_ready(WAIT)
        job = queue.add("x", 1)
        with Worker(queue_name, echo, connection=redis_url):
            assert job.wait_until_finished(qe, timeout=WAIT) == 1
        heard: list[bytes] = []
        until(lambda: (m := old.get_message(timeout=0.1)) is not None
              and heard.append(m["data"]) is None and b"9:completed" in heard[-1], timeout=WAIT)
        # a 0.1 worker's event: PUBLISH, no db field
        redis_client.publish(channel, to_netstrings(["ev", "waiting", "jid", "old-1", "ts", "1"]))
        assert rec.wait_name("waiting", "old-1")
    old.close()


@pytest.mark.parametrize("garbage", [b"-3:", b"+3:abc", b"3", b" 1:a1:b", b"\xd9:", b"99:ab"])
def test_a_malformed_pub_sub_message_is_skipped(garbage: bytes) -> None:
    """A negative length went back in the message, for ever: one PUBLISH
    of b"-3:" spun every reader of the queue, its memory growing."""
    from jobq.errors import SerializationError
    from jobq.events import from_pubsub

    with pytest.raises(SerializationError):
        from_pubsub(garbage)


def test_a_reader_goes_on_past_a_malformed_pub_sub_message(
    queue_name: str, redis_url: str, redis_client: redis.Redis
) -> None:
    rec = Recorder()
    with Queue(queue_name, connection=redis_url, event_mode="pubsub") as queue:
        queue.add("warm-up")  # the mode stored before the reader connects
        with QueueEvents(queue_name, connection=redis_url) as qe:
            qe.on("completed", rec)
            assert qe.wait_until_ready(WAIT)
            redis_client.publish(queue._context.keys.events, b"-3:")
            with Worker(queue_name, echo, connection=redis_url):
                job = queue.add("x", 1)
                assert rec.wait_name("completed", job.id)
        queue.obliterate(force=True)


@pytest.mark.skipif(os.environ.get("JOBQ_TEST_CLUSTER") == "1",
                    reason="in a cluster, 0.1 and 0.2 pub/sub events do not reach each other")
def test_a_reader_of_a_new_queue_hears_a_0_1_process_that_stores_pub_sub_mode(
    queue_name: str, redis_url: str, redis_client: redis.Redis
) -> None:
    """A reader started before the queue had a mode waits on its stream,
    with a subscription kept aside. 0.2 writes a stream entry when it stores
    pub/sub mode; 0.1 writes none, so the reader stayed deaf to every event
    after it. It reads the mode again every MODE_CHECK_INTERVAL now, and
    then reads the subscription kept aside, which missed nothing."""
    rec = Recorder()
    with QueueEvents(queue_name, connection=redis_url) as qe:
        qe.on_all_events(rec)
        assert qe.wait_until_ready(WAIT)
        keys = QueueKeys("jobq", queue_name)
        redis_client.hset(keys.meta, "em", "pubsub")  # a 0.1 Queue's first use
        for i in range(3):  # a 0.1 worker's events: PUBLISH, no db field
            redis_client.publish(keys.events,
                                 to_netstrings(["ev", "waiting", "jid", f"old-{i}", "ts", "1"]))
        assert rec.wait_count(3)  # within MODE_CHECK_INTERVAL (5 s)
        assert [e.job_id for e in rec.snapshot()] == ["old-0", "old-1", "old-2"]


@pytest.mark.skipif(os.environ.get("JOBQ_TEST_CLUSTER") == "1",
                    reason="in a cluster, a queue's events are published on its own node")
def test_an_event_naming_no_database_answers_no_wait_by_itself(
    queue_name: str, redis_url: str, redis_client: redis.Redis
) -> None:
    """A 0.1 process's pub/sub events name no database, and its namesake
    queue's in another database share the channel: a wait in db 0 took a
    namesake's outcome for its own job's. Such an event now makes the job's
    waiters read their record instead."""
    with Queue(queue_name, connection=redis_url, event_mode="pubsub") as queue, \
            QueueEvents(queue_name, connection=redis_url) as qe:
        assert qe.wait_until_ready(WAIT)
        job = queue.add("x", 5)
        results: list[Any] = []
        waiting = threading.Thread(target=lambda: results.append(
            job.wait_until_finished(qe, timeout=WAIT)))
        waiting.start()
        try:
            until(lambda: len(qe._table.snapshot()) == 1, timeout=WAIT)  # registered
            future = job.as_future(qe)
            # the namesake's (its job of the same id failed), as 0.1 publishes it
            redis_client.publish(queue._context.keys.events, to_netstrings(
                ["ev", "failed", "jid", job.id, "ts", "1", "failed_reason", "namesake's"]))
            with Worker(queue_name, echo, connection=redis_url):
                waiting.join(WAIT)
                assert future.result(WAIT) == 5
        finally:
            waiting.join(WAIT)
        assert results == [5]


@pytest.mark.skipif(os.environ.get("JOBQ_TEST_CLUSTER") != "1",
                    reason="a one-node cluster reached by both kinds of client")
@pytest.mark.parametrize("writer_kind", ["plain", "cluster"])
def test_pubsub_events_of_a_one_node_cluster_reach_both_kinds_of_client(
    queue_name: str, redis_url: str, writer_kind: str
) -> None:
    """A queue written through redis:// on a one-node cluster published with
    PUBLISH, which a redis+cluster:// reader (SSUBSCRIBE) never heard; and
    the other way round. Its writer now asks the server."""
    plain = redis_url.replace("redis+cluster://", "redis://", 1)
    writer, reader = (plain, redis_url) if writer_kind == "plain" else (redis_url, plain)
    rec = Recorder()
    with Queue(queue_name, connection=writer, event_mode="pubsub") as queue:
        queue.add("warm-up")  # the mode stored before the reader connects
        with QueueEvents(queue_name, connection=reader) as qe:
            qe.on_all_events(rec)
            assert qe.wait_until_ready(WAIT)
            with Worker(queue_name, echo, connection=writer):
                job = queue.add("x", 1)
                assert rec.wait_name("completed", job.id, timeout=5)
        queue.obliterate(force=True)


@pytest.mark.parametrize("mode", ["pubsub", "stream"])
def test_a_reader_started_before_the_queue_stores_its_mode_misses_nothing(
    queue_name: str, redis_url: str, redis_client: redis.Redis, mode: str,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """The reader finds no mode stored and no event yet: whichever mode the
    queue's first use stores, every event after wait_until_ready comes.
    In pub/sub mode its periodic look at the stored mode ran on the client
    of the stream, closed at the switch: it failed ("Connection lost while
    idle"), and the reconnect lost what was published meanwhile."""
    from jobq import _reader

    monkeypatch.setattr(_reader, "MODE_CHECK_INTERVAL", 0.2)
    rec = Recorder()
    with caplog.at_level(logging.WARNING, logger="jobq"), \
            QueueEvents(queue_name, connection=redis_url) as qe:
        qe.on_all_events(rec)
        assert qe.wait_until_ready(WAIT)
        with (
            Queue(queue_name, connection=redis_url, event_mode=mode) as queue,
            Worker(queue_name, echo, connection=redis_url),
        ):
            jobs = [queue.add("x", i) for i in range(3)]
            assert [j.wait_until_finished(qe, timeout=WAIT) for j in jobs] == [0, 1, 2]
            for job in jobs:
                assert rec.wait_name("completed", job.id)
                assert rec.names(job.id) == ["added", "waiting", "active", "completed"]
            assert rec.first("added", jobs[0].id).id is None if mode == "pubsub" else True
            # once the mode is known, none kept aside: its one connection (in
            # pub/sub mode, the subscription's, and the looks at the mode
            # on another of that client, as a reader begun in that mode)
            name = f"jobq-events-{queue_name}"
            most = 2 if mode == "pubsub" else 1
            until(lambda: qe._reader.event_mode.standby is None
                  and sum(c.get("name") == name for c in redis_client.client_list()) <= most,
                  timeout=WAIT)
            # two looks at the stored mode later (pub/sub mode's), every
            # event still comes
            loop = qe._loop
            for _ in range(2 if mode == "pubsub" else 0):
                due = loop._next_mode_check
                until(lambda: loop._next_mode_check > due, timeout=WAIT)  # noqa: B023
            later = [queue.add("x", i) for i in range(3, 6)]
            assert [j.wait_until_finished(qe, timeout=WAIT) for j in later] == [3, 4, 5]
            for job in later:
                assert rec.wait_name("completed", job.id)
    assert not [r.getMessage() for r in caplog.records
                if r.levelno >= logging.WARNING and r.name.startswith("jobq")]


def test_pubsub_waiter_through_queue_events_shared(queue_name: str, redis_url: str) -> None:
    with (
        Queue(queue_name, connection=redis_url, event_mode="pubsub") as queue,
        Worker(queue_name, echo, connection=redis_url, concurrency=4),
    ):
        jobs = [queue.add("x", i) for i in range(20)]
        assert [j.wait_until_finished(timeout=WAIT) for j in jobs] == list(range(20))
        futures = [j.as_future() for j in jobs]
        done, not_done = concurrent.futures.wait(futures, timeout=WAIT)
        assert not not_done
        assert [f.result() for f in futures] == list(range(20))


def test_event_mode_mismatch_raises(queue_name: str, redis_url: str) -> None:
    with Queue(queue_name, connection=redis_url, event_mode="pubsub") as first:
        assert first.event_mode == "pubsub"  # stored on first use
        # no I/O in the constructor: the mismatch shows at the first use
        with Queue(queue_name, connection=redis_url, event_mode="stream") as second:
            with pytest.raises(JobqError, match="uses event mode 'pubsub', not 'stream'"):
                second.add("x")
            with pytest.raises(JobqError, match="uses event mode"):
                second.event_mode  # noqa: B018
        assert first.count() == 0


# -- waiting -----------------------------------------------------------------


def test_wait_returns_result_and_none(queue: Queue, qe: QueueEvents, redis_url: str) -> None:
    def handler(job: Job) -> Any:
        return None if job.data is None else [job.data, {"k": b"v"}]

    with Worker(queue.name, handler, connection=redis_url):
        job = queue.add("x", 5)
        assert job.wait_until_finished(qe, timeout=WAIT) == [5, {"k": b"v"}]
        nothing = queue.add("x", None)
        assert nothing.wait_until_finished(qe, timeout=WAIT) is None


def test_job_finished_before_the_wait_returns_at_once(queue: Queue, qe: QueueEvents,
                                                      redis_url: str) -> None:
    done = threading.Event()
    with Worker(queue.name, echo, connection=redis_url) as worker:
        worker.on("completed", lambda job, result: done.set())
        job = queue.add("x", "early")
        assert done.wait(WAIT)
    start = time.monotonic()
    assert job.wait_until_finished(qe, timeout=WAIT) == "early"
    assert time.monotonic() - start < 5.0  # the periodic re-check comes after 10 s
    # also through a brand-new reader that never saw the event
    with QueueEvents(queue.name, connection=redis_url) as fresh:
        assert job.wait_until_finished(fresh, timeout=WAIT) == "early"


def test_retried_then_succeeded_is_not_a_failure(queue: Queue, qe: QueueEvents,
                                                 redis_url: str) -> None:
    def flaky(job: Job) -> str:
        if job.attempts_made < 2:
            raise RuntimeError(f"try {job.attempts_made}")
        return "finally"

    with Worker(queue.name, flaky, connection=redis_url):
        job = queue.add("x", attempts=3)
        assert job.wait_until_finished(qe, timeout=WAIT) == "finally"
    assert job.refresh().attempts_made == 3


def test_a_job_run_again_is_waited_for_anew(queue: Queue, qe: QueueEvents,
                                           redis_url: str) -> None:
    """The reader began before the add, so the first wait needs no record
    check; after a retry the reader's remembered outcome is of the first run
    and must not answer the second wait."""
    runs: list[int] = []

    def count(job: Job) -> int:
        runs.append(1)
        return len(runs)

    with Worker(queue.name, count, connection=redis_url):
        job = queue.add("x")
        assert job.wait_until_finished(qe, timeout=WAIT) == 1
        job.retry("completed")
        assert job.wait_until_finished(qe, timeout=WAIT) == 2


def test_terminal_failure_raises_job_failed_error(queue: Queue, qe: QueueEvents,
                                                  redis_url: str) -> None:
    def boom(job: Job) -> None:
        raise ValueError(f"bad {job.data}")

    with Worker(queue.name, boom, connection=redis_url):
        job = queue.add("x", 7, attempts=2)
        with pytest.raises(JobFailedError) as info:
            job.wait_until_finished(qe, timeout=WAIT)
        err = info.value
        assert err.job_id == job.id
        assert err.failed_reason == "ValueError: bad 7"
        assert err.exc_type == "ValueError"
        assert isinstance(err.stacktrace, list) and len(err.stacktrace) == 2
        assert all("ValueError: bad 7" in t for t in err.stacktrace)
        # a wait started after the failure gives the same answer
        with pytest.raises(JobFailedError) as later:
            job.wait_until_finished(qe, timeout=WAIT)
        assert later.value.failed_reason == "ValueError: bad 7" and len(later.value.stacktrace) == 2
        assert later.value.exc_type == "ValueError"


def test_unrecoverable_error_fails_at_once(queue: Queue, qe: QueueEvents,
                                           redis_url: str) -> None:
    rec = Recorder()
    qe.on_all_events(rec)

    def fatal(job: Job) -> None:
        raise UnrecoverableError("nope")

    with Worker(queue.name, fatal, connection=redis_url):
        job = queue.add("x", attempts=5)
        with pytest.raises(JobFailedError) as info:
            job.wait_until_finished(qe, timeout=WAIT)
    assert info.value.failed_reason == "UnrecoverableError: nope"
    assert info.value.exc_type == "UnrecoverableError"
    assert "UnrecoverableError" in info.value.stacktrace[-1]
    assert rec.wait_name("failed", job.id)
    assert "retrying" not in rec.names(job.id)
    assert job.refresh().attempts_made == 1


def test_removed_while_waited_raises_not_found(queue: Queue, qe: QueueEvents) -> None:
    job = queue.add("x", delay=60)
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            job.wait_until_finished(qe, timeout=WAIT)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    try:
        assert until(lambda: qe._table.waiting_on(job.id))
        assert job.remove() is True
        thread.join(WAIT)
        assert not thread.is_alive()
    finally:
        thread.join(WAIT)
    assert len(outcome) == 1 and isinstance(outcome[0], JobNotFoundError)
    assert outcome[0].job_id == job.id


def test_never_existing_and_already_removed_job_raise_not_found(
    queue: Queue, qe: QueueEvents
) -> None:
    start = time.monotonic()
    with pytest.raises(JobNotFoundError) as info:
        qe.wait_for("does-not-exist", timeout=WAIT)
    assert info.value.job_id == "does-not-exist"
    job = queue.add("x")
    assert queue.remove(job.id)
    with pytest.raises(JobNotFoundError):
        job.wait_until_finished(qe, timeout=WAIT)
    assert time.monotonic() - start < 5.0  # the periodic re-check comes after 10 s


def test_not_found_on_an_empty_stream(queue: Queue, redis_url: str) -> None:
    """A queue whose event stream does not exist yet."""
    with QueueEvents(queue.name, connection=redis_url, blocking_timeout=0.1) as qe:
        with pytest.raises(JobNotFoundError):
            qe.wait_for("42", timeout=WAIT)


def test_timeout_raises_wait_until_finished_timeout_error(queue: Queue,
                                                          qe: QueueEvents) -> None:
    job = queue.add("x")
    start = time.monotonic()
    with pytest.raises(WaitUntilFinishedTimeoutError) as info:
        job.wait_until_finished(qe, timeout=0.3)
    elapsed = time.monotonic() - start
    assert 0.25 <= elapsed < 5.0  # the periodic re-check comes after 10 s
    assert isinstance(info.value, TimeoutError)
    assert isinstance(info.value, JobqError)
    assert job.id in str(info.value) and "0.3" in str(info.value)
    with pytest.raises(WaitUntilFinishedTimeoutError):
        job.wait_until_finished(qe, timeout=0)
    assert qe._table.empty()


@pytest.mark.parametrize("size", [10, BIG], ids=["small", "big"])
def test_remove_on_complete_returns_value(queue: Queue, qe: QueueEvents, redis_url: str,
                                          size: int) -> None:
    release = threading.Event()

    def handler(job: Job) -> str:
        assert release.wait(WAIT)
        return "x" * size

    rec = Recorder()
    qe.on("completed", rec)
    with Worker(queue.name, handler, connection=redis_url, concurrency=2):
        job = queue.add("x", remove_on_complete=True)
        late = queue.add("y", remove_on_complete=True)
        result: list[Any] = []
        thread = threading.Thread(target=lambda: result.append(
            job.wait_until_finished(qe, timeout=WAIT)))
        thread.start()
        try:
            assert until(lambda: qe._table.waiting_on(job.id))
            release.set()
            thread.join(WAIT)
        finally:
            release.set()
            thread.join(WAIT)
        assert result == ["x" * size]
        # a wait that starts after the job was completed and removed
        assert rec.wait_name("completed", late.id)
        assert queue.get_job(late.id) is None
        assert late.wait_until_finished(qe, timeout=WAIT) == "x" * size
    assert queue.get_job(job.id) is None
    assert rec.first("completed", job.id).result == "x" * size


def test_big_result_without_removal_is_read_from_record(
    queue: Queue, qe: QueueEvents, redis_url: str, redis_client: redis.Redis
) -> None:
    rec = Recorder()
    qe.on("completed", rec)
    with Worker(queue.name, lambda job: "y" * BIG, connection=redis_url):
        job = queue.add("x")
        assert job.wait_until_finished(qe, timeout=WAIT) == "y" * BIG
    assert rec.wait_count(1)
    assert rec.snapshot()[0].result == "y" * BIG
    # the stream itself stays small
    entries = redis_client.xrange(f"jobq:{{{queue.name}}}:events")
    assert max(sum(len(v) for v in fields.values()) for _, fields in entries) < 4096


def test_thousand_threads_wait_on_one_reader(queue: Queue, redis_url: str,
                                             redis_client: redis.Redis) -> None:
    n = 1000
    jobs = queue.add_bulk([{"name": "x", "data": i} for i in range(n)])
    results: dict[int, Any] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()
    with QueueEvents(queue.name, connection=redis_url, blocking_timeout=0.1) as qe:
        assert qe.wait_until_ready(WAIT)

        def wait(i: int) -> None:
            try:
                value = jobs[i].wait_until_finished(qe, timeout=30)
            except BaseException as exc:
                with lock:
                    errors.append(exc)
                return
            with lock:
                results[i] = value

        threads = [threading.Thread(target=wait, args=(i,)) for i in range(n)]
        for thread in threads:
            thread.start()
        assert until(lambda: qe._table.jobs() == n, timeout=20)
        assert len(reader_clients(redis_client, queue.name)) == 1
        with Worker(queue.name, echo, connection=redis_url, concurrency=8):
            for thread in threads:
                thread.join(30)
        assert not any(t.is_alive() for t in threads)
        assert errors == []
        assert results == {i: i for i in range(n)}
        assert qe._table.empty()


def test_as_future_with_wait_and_as_completed(queue: Queue, qe: QueueEvents,
                                              redis_url: str) -> None:
    def handler(job: Job) -> int:
        if job.data == 13:
            raise ValueError("unlucky")
        return int(job.data) * 2

    with Worker(queue.name, handler, connection=redis_url, concurrency=4):
        jobs = queue.add_bulk([{"name": "x", "data": i} for i in range(50)])
        futures = [job.as_future(qe) for job in jobs]
        assert all(isinstance(f, concurrent.futures.Future) for f in futures)
        done, not_done = concurrent.futures.wait(futures, timeout=WAIT)
        assert not not_done and len(done) == 50
        seen = 0
        for future in concurrent.futures.as_completed(futures, timeout=WAIT):
            seen += 1
            assert future.done()
        assert seen == 50
        for i, future in enumerate(futures):
            if i == 13:
                exc = future.exception(0)
                assert isinstance(exc, JobFailedError)
                assert exc.job_id == jobs[13].id and exc.failed_reason == "ValueError: unlucky"
            else:
                assert future.result(0) == i * 2
        # futures of finished, missing, and first-wait-pending jobs
        assert jobs[0].as_future(qe).result(WAIT) == 0
        with pytest.raises(JobFailedError):
            jobs[13].as_future(qe).result(WAIT)
    with pytest.raises(JobNotFoundError):
        qe.future_for("missing-job").result(WAIT)
    assert until(lambda: qe._table.empty())


def test_a_listener_waits_on_the_future_of_a_finished_job(
    queue: Queue, qe: QueueEvents, redis_url: str
) -> None:
    """On the listeners' thread (a listener, a future's done-callback), the
    future of a job that had finished was settled by a call queued behind
    the caller itself: its result() waited out its whole timeout. It is
    settled at once there now; and one of a job still running is settled
    on the waker thread, so a listener can wait for it too (it raised
    RuntimeError)."""
    answers: dict[str, Any] = {}
    answered = threading.Event()

    def ask(tag: str, job: Job) -> None:
        try:
            answers[tag] = job.as_future(qe).result(WAIT)
        except Exception as exc:
            answers[tag] = exc
        if len(answers) == 3:
            answered.set()

    release = threading.Event()

    def handler(job: Job) -> Any:
        if job.name == "slow":
            assert release.wait(WAIT)
        return job.data

    with Worker(queue.name, handler, connection=redis_url, concurrency=2):
        finished = queue.add("x", 7)
        assert finished.wait_until_finished(qe, timeout=WAIT) == 7
        qe.once("completed", lambda event: ask("listener", finished))
        # settled on the waker, its callback run on the dispatcher
        later = queue.add("y", 1, delay=0.2).as_future(qe)
        later.add_done_callback(lambda f: ask("callback", finished))
        until(lambda: len(answers) == 2, timeout=WAIT)
        # its listener holds the dispatcher, waiting for it to finish
        qe.once("active:slow-1", lambda event: ask("running", queue.get_job("slow-1")))
        slow = queue.add("slow", 8, job_id="slow-1")
        until(lambda: slow.get_state() == "active", timeout=WAIT)
        release.set()
        assert answered.wait(WAIT)
    assert answers == {"listener": 7, "callback": 7, "running": 8}


@pytest.mark.parametrize("blocked", [False, True], ids=["slow-listener", "blocked-listener"])
def test_a_slow_listener_holds_up_no_future(
    queue: Queue, qe: QueueEvents, redis_url: str, blocked: bool
) -> None:
    """A future's result was set on the listeners' dispatcher thread, behind
    every event queued for the listeners: with a 2 s listener on "active",
    five 0.2 s jobs' futures took 10 s; with a listener blocked, a finished
    job's future.result(timeout) timed out. They are settled on the waker
    thread now; only their done-callbacks run on the dispatcher."""
    gate = threading.Event()
    qe.on("active", lambda event: gate.wait(WAIT if blocked else 1.0))
    assert qe.wait_until_ready(WAIT)
    jobs = [queue.add("x", i) for i in range(5)]
    futures = [job.as_future(qe) for job in jobs]  # before a worker runs them
    with Worker(queue.name, lambda job: job.data, connection=redis_url, concurrency=5):
        for job in jobs:  # threads' waits were never held up
            job.wait_until_finished(qe, timeout=WAIT)
        done, _ = concurrent.futures.wait(futures, timeout=WAIT / 4)
        assert len(done) == 5, "a future waited behind the listeners"
        assert [f.result(0) for f in futures] == list(range(5))
        called = threading.Event()
        futures[0].add_done_callback(lambda f: called.set())  # done: on this thread
        assert called.is_set()
        gate.set()


@pytest.mark.parametrize("closing", ["main", "listener"])
def test_a_futures_callbacks_run_when_the_events_close_behind_a_slow_listener(
    queue: Queue, redis_url: str, closing: str
) -> None:
    """A done-callback queued on the dispatcher behind a slow listener was
    lost when the QueueEvents closed meanwhile (the future was done, its
    callback never ran); closed from a listener, another future's callback
    ran on jobq's waker thread. Left ones run on the closing thread now."""
    gate = threading.Event()
    ran: list[str] = []
    events = QueueEvents(queue.name, connection=redis_url)
    try:
        events.on("completed", lambda event: gate.wait(WAIT))  # holds the dispatcher
        assert events.wait_until_ready(WAIT)
        job = queue.add("x", 21)
        future = events.future_for(job.id)
        future.add_done_callback(lambda f: ran.append(threading.current_thread().name))
        with Worker(queue.name, lambda j: j.data * 2, connection=redis_url):
            assert future.result(WAIT) == 42
        if closing == "listener":
            events.on("custom", lambda event: events.close(WAIT))
            queue.emit("custom")
            gate.set()
            until(lambda: events.closed and ran, timeout=WAIT)
        else:
            threading.Timer(0.5, gate.set).start()
            events.close(WAIT)
        until(lambda: ran, timeout=WAIT)
        assert not ran[0].startswith("jobq-wake"), ran
    finally:
        gate.set()
        events.close(WAIT)


def test_a_future_given_up_is_cancelled_and_forgotten(
    queue: Queue, qe: QueueEvents, redis_url: str
) -> None:
    """A future was set running at once: cancel() could not give it up, and
    each one given up on a job that never ends stayed in the waiter table."""
    job = queue.add("later", "value", delay=3600)
    futures = [job.as_future(qe) for _ in range(50)]
    done, pending = concurrent.futures.wait(futures, timeout=0.01)
    assert not done and not any(f.running() for f in pending)
    assert all(f.cancel() for f in pending)
    assert all(f.cancelled() for f in futures)
    assert not qe._table.waiting_on(job.id)  # forgotten: nothing left to settle
    kept = job.as_future(qe)  # the job itself was not touched: it still runs
    assert qe._table.waiting_on(job.id) and not kept.done()
    job.promote()
    with Worker(queue.name, echo, connection=redis_url):
        assert kept.result(timeout=WAIT) == "value"
    assert all(f.cancelled() for f in futures)


def test_as_future_on_lazily_started_events(queue_name: str, redis_url: str) -> None:
    with (
        Queue(queue_name, connection=redis_url) as queue,
        Worker(queue_name, echo, connection=redis_url, concurrency=2),
    ):
        jobs = [queue.add("x", i) for i in range(10)]
        futures = [j.as_future() for j in jobs]  # the first one starts the reader
        done, not_done = concurrent.futures.wait(futures, timeout=WAIT)
        assert not not_done
        assert [f.result() for f in futures] == list(range(10))


def test_waiters_are_deregistered(queue: Queue, qe: QueueEvents, redis_url: str) -> None:
    with Worker(queue.name, echo, connection=redis_url, concurrency=4):
        jobs = queue.add_bulk([{"name": "x", "data": i} for i in range(200)])
        for job in jobs[:20]:  # some waits that block until the event
            assert job.wait_until_finished(qe, timeout=WAIT) == job.data
        done, not_done = concurrent.futures.wait([j.as_future(qe) for j in jobs], timeout=WAIT)
        assert not not_done
    for i in range(2000):
        job = jobs[i % len(jobs)]
        assert job.wait_until_finished(qe, timeout=WAIT) == job.data
    for _ in range(5):
        with pytest.raises(JobNotFoundError):
            qe.wait_for("nope", timeout=WAIT)
        with pytest.raises(WaitUntilFinishedTimeoutError):
            queue.add("pending", delay=60).wait_until_finished(qe, timeout=0.01)
    assert qe._table.empty()
    assert qe._table.settled()


def test_queue_events_is_shared_and_lazy(queue_name: str, redis_url: str,
                                         redis_client: redis.Redis) -> None:
    def readers() -> list[threading.Thread]:
        return [t for t in threading.enumerate()
                if t.name == f"jobq-events-{queue_name}" and t.is_alive()]

    with Queue(queue_name, connection=redis_url) as queue:
        queue.add("x", 1)
        assert readers() == []
        events = queue.events
        assert queue.events is events
        assert isinstance(events, QueueEvents)
        assert events.wait_until_ready(WAIT)
        seen: list[QueueEvents] = []
        threads = [threading.Thread(target=lambda: seen.append(queue.events)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
        assert all(e is events for e in seen) and len(seen) == 8
        assert len(readers()) == 1
        assert len(reader_clients(redis_client, queue_name)) == 1
        with Worker(queue_name, echo, connection=redis_url):
            job = queue.add("x", 2)
            assert job.wait_until_finished(timeout=WAIT) == 2
        assert len(readers()) == 1
    assert events.closed
    assert until(lambda: readers() == [])


def test_wait_on_lazily_started_events_with_remove_on_complete(queue_name: str,
                                                               redis_url: str) -> None:
    with (
        Queue(queue_name, connection=redis_url) as queue,
        Worker(queue_name, echo, connection=redis_url),
    ):
        # SPEC: the value is returned when the reader was ready before completion
        assert queue.events.wait_until_ready(WAIT)
        for i in range(5):
            job = queue.add("x", i, remove_on_complete=True)
            assert job.wait_until_finished(timeout=WAIT) in (i,)


# -- a server restart ----------------------------------------------------------


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    try:
        binary = find_server_binary()
    except RuntimeError:
        pytest.skip("no server binary to start a private server")
    with RedisServer(binary) as server:
        yield server


def test_reader_recovers_after_server_restart(own_server: RedisServer, queue_name: str) -> None:
    url = own_server.url
    rec = Recorder()
    with (
        Queue(queue_name, connection=url) as queue,
        QueueEvents(queue_name, connection=url, blocking_timeout=0.1) as qe,
        Worker(queue_name, echo, connection=url),
    ):
        qe.on_all_events(rec)
        assert qe.wait_until_ready(WAIT)
        # no periodic re-check (every 10 s, at any moment of the restart):
        # only the reader's re-check after its reconnect can end the wait
        qe._dispatcher.interval = 3600.0
        assert queue.add("x", "before").wait_until_finished(qe, timeout=WAIT) == "before"
        doomed = queue.add("x", "doomed", delay=60)
        outcome: list[BaseException] = []
        registered = threading.Event()

        def wait() -> None:
            registered.set()
            try:
                doomed.wait_until_finished(qe, timeout=30)
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=wait)
        thread.start()
        try:
            assert registered.wait(WAIT)
            assert until(lambda: qe._table.waiting_on(doomed.id))
            own_server.restart()
            # the reconnect comes within its backoff (capped at 5 s), well
            # before the wait's own 30 s timeout
            thread.join(20)
            assert not thread.is_alive(), "waiter on a vanished job hangs after a restart"
        finally:
            thread.join(30)
        assert len(outcome) == 1 and isinstance(outcome[0], JobNotFoundError), outcome
        # the reader and the worker recovered: a new job's wait works
        n = len(rec.snapshot())
        job = queue.add("x", "after")
        assert job.wait_until_finished(qe, timeout=WAIT) == "after"
        assert rec.wait_name("completed", job.id)
        assert len(rec.snapshot()) > n


def test_big_result_of_a_job_removed_by_retention_before_its_event_is_read(
    queue: Queue, qe: QueueEvents, redis_url: str, redis_client: redis.Redis
) -> None:
    """A completed job must never be reported as not found.

    Job A keeps only the newest completed job (``remove_on_complete=1``) and
    returns a result too big to travel in the event; job B completes right
    after it and so deletes A's record. The reader, disconnected meanwhile,
    reads A's ``completed`` event only after that.
    """
    go = threading.Event()

    def handler(job: Job) -> str:
        if job.data == "a":
            assert go.wait(WAIT)
        return job.data * BIG

    outcome: list[Any] = []
    with Worker(queue.name, handler, connection=redis_url) as worker:
        done = threading.Event()
        worker.on("completed", lambda job, result: job.data == "b" and done.set())
        a = queue.add("x", "a", remove_on_complete=1)
        b = queue.add("x", "b", remove_on_complete=1)

        def wait() -> None:
            try:
                outcome.append(a.wait_until_finished(qe, timeout=WAIT))
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=wait)
        thread.start()
        try:
            assert until(lambda: qe._table.waiting_on(a.id))
            # (a new queue's reader keeps a subscription aside a while: two)
            assert kill_readers(redis_client, queue.name)
            go.set()
            # keep the reader away until B has completed (and so deleted A)
            deadline = time.monotonic() + WAIT
            while not done.wait(0.002):
                assert time.monotonic() < deadline
                kill_readers(redis_client, queue.name)
            thread.join(WAIT)
        finally:
            go.set()
            thread.join(WAIT)
    assert queue.get_job(a.id) is None and queue.get_job(b.id) is not None
    assert outcome == ["a" * BIG]


def test_close_from_inside_a_listener(queue: Queue, redis_url: str) -> None:
    closed = threading.Event()
    qe = QueueEvents(queue.name, connection=redis_url, blocking_timeout=0.1)
    try:
        assert qe.wait_until_ready(WAIT)

        def stop(event: Event) -> None:
            qe.close()
            closed.set()

        qe.on("stop", stop)
        queue.emit("stop")
        assert closed.wait(WAIT)
        assert qe.closed
    finally:
        qe.close()


def test_close_keeps_its_timeout_while_a_listener_runs_on(
    queue: Queue, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close(timeout=1) took the timeout plus the grace of cut connections
    (CUT_GRACE, made longer here): the grace is now part of the timeout.
    The listener's thread ends when the listener returns."""
    monkeypatch.setattr(queue_events, "CUT_GRACE", 5.0)
    release, entered = threading.Event(), threading.Event()
    qe = QueueEvents(queue.name, connection=redis_url, blocking_timeout=0.1)
    try:
        assert qe.wait_until_ready(WAIT)
        qe.on("hold", lambda event: (entered.set(), release.wait(WAIT)))
        queue.emit("hold")
        assert entered.wait(WAIT)
        start = time.monotonic()
        qe.close(timeout=1.0)
        took = time.monotonic() - start
        assert took < 3.0, took  # 6 s with the grace on top
    finally:
        release.set()
        qe.close()
    assert until(lambda: not jobq_threads(queue.name))


def test_close_fails_pending_futures(queue: Queue, redis_url: str) -> None:
    job = queue.add("never")
    qe = QueueEvents(queue.name, connection=redis_url, blocking_timeout=0.1)
    with qe:
        assert qe.wait_until_ready(WAIT)
        future = job.as_future(qe)
        assert not future.done()
    with pytest.raises(ClosedError):
        future.result(WAIT)
    closed_future = job.as_future(qe)
    with pytest.raises(ClosedError):
        closed_future.result(0)
