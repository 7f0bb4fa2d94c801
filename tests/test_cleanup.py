"""Tests of the cleanup paths: remove, drain, clean and obliterate.

They free memory, so they work while the server is out of memory; each script
call does bounded work whatever the queue's length; they tell waiters of the
jobs they remove; obliterate keeps the queue's event mode, max_events and
id counter.

Every test runs against a real server (the session's, or a private one for
the out-of-memory test); every wait is bounded.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import redis

import jobq
from jobq import JobNotFoundError, Queue, QueueEvents, RedisOOMError, Worker
from jobq.testing import RedisServer, find_server_binary
from tests.polling import until
from tests.streams import stream_events

WAIT = 5.0  # seconds: the bound of every wait for something that should happen
STATES = ("waiting", "delayed", "active", "completed", "failed", "waiting-children")


def stream(client: redis.Redis, queue_name: str) -> list[tuple[str, str, dict[str, bytes]]]:
    """The queue's event stream as (name, job id, fields), oldest first."""
    return stream_events(client, queue_name)


def removed_events(client: redis.Redis, queue_name: str) -> dict[str, str]:
    """Job id -> `prev` of every `removed` event in the stream."""
    return {jid: f["prev"].decode() for name, jid, f in stream(client, queue_name)
            if name == "removed"}


def wait_list(client: redis.Redis, queue_name: str) -> list[str]:
    return [i.decode() for i in client.lrange(f"jobq:{{{queue_name}}}:wait", 0, -1)]


def age(client: redis.Redis, queue_name: str, job_ids: list[str]) -> None:
    """Make jobs look added long ago (their `ts`, what clean ages them by)."""
    pipe = client.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hset(f"jobq:{{{queue_name}}}:job:{job_id}", "ts", 1000)
    pipe.execute()


def command_calls(client: redis.Redis) -> dict[str, int]:
    """Calls per command so far (commands run by scripts included)."""
    return {name.removeprefix("cmdstat_"): int(v["calls"])
            for name, v in client.info("commandstats").items()}


# -- A: cleanup while the server is out of memory ----------------------------


@pytest.fixture
def oom_server() -> Iterator[RedisServer]:
    """A private server that refuses writes when full (noeviction)."""
    server = RedisServer(find_server_binary(), extra_args=("--maxmemory-policy", "noeviction"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_out_of_memory_workers_finish_what_they_hold_and_take_nothing_new(
    oom_server: RedisServer, queue_name: str
) -> None:
    """A finishing call that also took the next job ran when the server was
    out of memory (its script may: it finishes): workers went on taking and
    running jobs, to 6.5 times maxmemory. A running job's progress and log
    line were refused (a raw OutOfMemoryError, failing the job for good),
    and the other writes raised redis-py's error, not RedisOOMError."""
    url = oom_server.url
    go, held = threading.Event(), threading.Semaphore(0)
    refused_data: list[BaseException] = []
    errors: list[BaseException] = []

    def handler(job: jobq.Job) -> str:
        if job.name == "hold":
            held.release()
            assert go.wait(WAIT)
            job.update_progress(50)  # while out of memory
            job.log("still here")
            try:  # its data is not a running job's to grow
                job.update_data("x" * 1000)
            except RedisOOMError as exc:
                refused_data.append(exc)
        return str(job.data)

    with Queue(queue_name, connection=url) as q, oom_server.client() as admin, \
            Worker(queue_name, handler, connection=url, concurrency=2, drain_delay=0.1,
                   heartbeat_ttl=0.6) as w:  # a beat every 0.2 s
        w.on("error", errors.append)
        first = q.add_bulk([{"name": "hold", "data": i} for i in range(2)])
        later = q.add_bulk([{"name": "later", "data": i} for i in range(5)])
        for _ in first:
            assert held.acquire(timeout=WAIT)
        admin.config_set("maxmemory", 1)
        try:
            go.set()
            assert [j.wait_until_finished(timeout=WAIT) for j in first] == ["0", "1"]
            for job in first:
                job.refresh()
                assert job.progress == 50 and job.get_logs() == ["still here"]
            quiet = threading.Event()
            for _ in range(3):  # nothing new is taken meanwhile
                assert q.get_job_counts("waiting", "active") == {"waiting": 5, "active": 0}
                quiet.wait(0.1)
            for refused in (q.pause, lambda: later[0].update_data("new"),
                            lambda: later[0].change_priority(3), lambda: q.emit("custom")):
                with pytest.raises(RedisOOMError, match="out of memory"):
                    refused()
            # the worker's own refused calls (its fetch's take) are said the same way
            until(lambda: errors, timeout=WAIT)
            assert all(isinstance(e, RedisOOMError) for e in errors), errors
            assert len(refused_data) == 2
            # its announcement is kept up (a heartbeat runs out of memory)
            (info,) = q.get_workers()
            until(lambda: q.get_workers()[0].last_heartbeat > info.last_heartbeat, timeout=WAIT)
        finally:
            admin.config_set("maxmemory", 0)
        assert [j.wait_until_finished(timeout=WAIT) for j in later] == ["0", "1", "2", "3", "4"]


def test_an_add_bulk_refused_part_of_the_way_says_what_was_added(
    oom_server: RedisServer, queue_name: str
) -> None:
    """Its chunks of 1000 are written one by one: one refused after others
    were written said "refused the add", and a retry added them twice."""
    with Queue(queue_name, connection=oom_server.url) as q, oom_server.client() as admin:
        q.add("warm")
        admin.config_set("maxmemory", int(admin.info("memory")["used_memory"]) + 1_500_000)
        try:
            with pytest.raises(RedisOOMError) as refused:  # the first chunk fills it
                q.add_bulk([{"name": "x", "data": "y" * 500} for _ in range(5000)])
        finally:
            admin.config_set("maxmemory", 0)
        added = refused.value.added
        assert 1000 <= len(added) < 5000 and len(added) % 1000 == 0
        assert f"{len(added)} of the 5000 jobs were added" in str(refused.value)
        assert q.get_job_counts("waiting") == {"waiting": len(added) + 1}
        assert [j.id for j in added] == [j.id for j in q.get_jobs("waiting", asc=True)][1:]


def test_functions_refused_for_memory_say_so(oom_server: RedisServer, queue_name: str) -> None:
    """A server out of memory refuses FUNCTION LOAD: a server without jobq's
    functions (a new jobq version, a restart that lost them) runs none of
    its calls until memory frees. Said as such, not as a refused call."""
    with oom_server.client() as admin, Queue(queue_name, connection=oom_server.url) as q:
        admin.function_flush()
        admin.config_set("maxmemory", 1)
        try:
            with pytest.raises(RedisOOMError, match="refused to load jobq's functions"):
                q.get_job_counts()
            with pytest.raises(RedisOOMError, match="refused to load jobq's functions"):
                q.add("x")  # said as such by an add too, not "refused the add"
        finally:
            admin.config_set("maxmemory", 0)
        assert q.get_job_counts("waiting") == {"waiting": 0}


def test_cleanup_works_while_out_of_memory(oom_server: RedisServer, queue_name: str) -> None:
    url = oom_server.url
    with Queue(queue_name, connection=url, max_events=100) as q, oom_server.client() as admin:
        # a job in every state: 20 completed, 20 failed, delayed, prioritized
        finished = q.add_bulk([{"name": "bad" if i % 2 else "ok", "data": i} for i in range(40)])

        def processor(job: jobq.Job) -> int:
            if job.name == "bad":
                raise RuntimeError("no")
            return 1

        assert len(finished) == 40
        with Worker(queue_name, processor, connection=url, drain_delay=0.1):
            until(lambda: q.get_job_counts("completed", "failed")
                  == {"completed": 20, "failed": 20})
        q.add_bulk([{"name": "d", "data": i, "delay": 3600} for i in range(30)])
        q.add_bulk([{"name": "p", "data": i, "priority": 3} for i in range(30)])
        doomed = q.add("w", "x")

        # fill the server until an add is refused
        used = int(admin.info("memory")["used_memory"])
        admin.config_set("maxmemory", used + 1024 * 1024)
        payload = "x" * 4096
        with pytest.raises(RedisOOMError):
            for _ in range(10_000):
                q.add_bulk([{"name": "fill", "data": payload} for _ in range(20)])
        full = int(admin.info("memory")["used_memory"])
        # and keep it out of memory whatever the cleanup frees
        admin.config_set("maxmemory", 1)
        try:
            counts = q.get_job_counts()
            assert counts["completed"] == 20 and counts["failed"] == 20
            assert counts["delayed"] == 30 and counts["waiting"] > 31

            assert q.remove(doomed.id) is True
            assert len(q.clean(0, state="completed")) == 20
            assert len(q.clean(0, state="failed")) == 20
            assert len(q.clean(0, limit=10, state="delayed")) == 10
            assert len(q.clean(0, limit=50, state="waiting")) == 50
            assert q.drain(delayed=True) == counts["waiting"] - 51 + 20
            with pytest.raises(RedisOOMError):  # still out of memory
                q.add("refused")
            # the events they wrote were trimmed (MAXLEN ~ 100: whole nodes of 100)
            assert admin.xlen(f"jobq:{{{queue_name}}}:events") <= 200
            assert q.get_job_counts() == dict.fromkeys(STATES, 0)
            q.add_bulk([])  # nothing to write: no error
            q.obliterate()
            assert int(admin.info("memory")["used_memory"]) < full
        finally:
            admin.config_set("maxmemory", 0)
        assert q.add("after").get_state() == "waiting"


# -- B: bounded work per call --------------------------------------------------


def test_clean_waiting_one_call_looks_at_one_batch(
    queue: Queue, redis_client: redis.Redis
) -> None:
    jobs = queue.add_bulk([{"name": "w", "data": i} for i in range(3000)])
    # the next 500 to run are recent; every other older job is old
    old = [j.id for j in jobs[500:] if int(j.id) % 2]
    age(redis_client, queue.name, old)
    before = command_calls(redis_client)
    ids, cursor = queue._context.run("clean", "waiting", 60_000, 100, "")
    after = command_calls(redis_client)
    # 100 looked at, all kept; the last of them, 100th from the end, is job 100
    assert ids == [] and cursor == b"w100:100"
    ids, cursor = queue._context.run("clean", "waiting", 60_000, 100, "w500:500")
    after2 = command_calls(redis_client)
    assert len(ids) == 50 and cursor == b"w550:600"
    # bounded work: one LRANGE, one HMGET per job looked at (and one for the
    # queue's settings when it writes events), one more per job removed (its
    # run token, dedup key and a flow's parent or children), one LREM per call
    assert after.get("hmget", 0) - before.get("hmget", 0) <= 101
    assert after2.get("hmget", 0) - after.get("hmget", 0) <= 101 + len(ids)
    assert after2.get("lrange", 0) - before.get("lrange", 0) == 2
    assert after2.get("lrem", 0) - after.get("lrem", 0) == 1
    assert after2.get("lset", 0) - after.get("lset", 0) == 50


def test_clean_waiting_removes_without_one_lrem_per_job(
    queue: Queue, redis_client: redis.Redis
) -> None:
    jobs = queue.add_bulk([{"name": "w", "data": i} for i in range(3000)])
    old = [j.id for j in jobs[500:] if int(j.id) % 2]
    age(redis_client, queue.name, old)
    before = command_calls(redis_client)
    assert sorted(queue.clean(60, state="waiting")) == sorted(old)
    after = command_calls(redis_client)
    calls = {c: after.get(c, 0) - before.get(c, 0) for c in ("lrem", "lrange", "fcall")}
    # one slice per call: 3 of the wait list, 1 more to find its end, 1 of prioritized
    assert calls["fcall"] <= 5
    assert calls["lrem"] <= calls["fcall"] and calls["lrange"] <= calls["fcall"]


def test_clean_waiting_keeps_order_and_removes_exactly_the_old(
    queue: Queue, redis_client: redis.Redis
) -> None:
    jobs = queue.add_bulk([{"name": "w", "data": i} for i in range(2500)])
    urgent = queue.add_bulk([{"name": "p", "data": i, "priority": 2} for i in range(1200)])
    lifo = queue.add("l", lifo=True)
    # old: the 300 next in line (a run at the list's end), then every third
    # job, and half the prioritized ones
    old = {j.id for j in jobs[:300]} | {j.id for j in jobs[300:] if int(j.id) % 3 == 0}
    old |= {j.id for j in urgent[::2]}
    age(redis_client, queue.name, sorted(old))
    before = wait_list(redis_client, queue.name)
    removed = queue.clean(60, state="waiting")
    assert sorted(removed) == sorted(old)
    assert len(removed) == len(set(removed))
    assert wait_list(redis_client, queue.name) == [i for i in before if i not in old]
    assert queue.get_job_counts("waiting") == {"waiting": 3701 - len(old)}
    assert queue.get_job_state(lifo.id) == "waiting"
    assert all(queue.get_job(i) is None for i in old)
    assert queue.clean(60, state="waiting") == []


@pytest.mark.parametrize("leave", [4, 1])
@pytest.mark.parametrize("state", ["delayed", "waiting", "prioritized"])
def test_clean_goes_on_from_where_it_was_when_jobs_leave_between_calls(
    queue: Queue, redis_client: redis.Redis, state: str, leave: int
) -> None:
    """Jobs looked at and kept by one call that leave before the next
    (taken, promoted, removed) made the next call skip as many jobs never
    looked at: old jobs outlived the clean."""
    options: dict[str, object] = {"delayed": {"delay": 50}, "waiting": {},
                                  "prioritized": {"priority": 3}}[state]
    young = queue.add_bulk([{"name": "y", **options} for _ in range(4)])  # first in line
    later = {"delay": 100} if state == "delayed" else options
    old = queue.add_bulk([{"name": "o", **later} for _ in range(6)])
    age(redis_client, queue.name, [j.id for j in old])
    removed: list[str] = []
    ids, cursor = queue._context.run("clean", state.replace("prioritized", "waiting"), 60_000, 2,
                                     "p" if state == "prioritized" else "")
    removed += [i.decode() for i in ids]
    for job in young[:leave]:  # they leave: the first looked at, or all four
        assert queue.remove(job.id)
    while cursor:
        ids, cursor = queue._context.run("clean", "waiting" if state != "delayed" else state,
                                         60_000, 2, cursor)
        removed += [i.decode() for i in ids]
    assert sorted(removed) == sorted(j.id for j in old)


def test_clean_limit_with_young_jobs_first(queue: Queue, redis_client: redis.Redis) -> None:
    jobs = queue.add_bulk([{"name": "w", "data": i} for i in range(1500)])
    age(redis_client, queue.name, [j.id for j in jobs[1200:]])
    assert len(queue.clean(60, limit=250, state="waiting")) == 250
    assert len(queue.clean(60, state="waiting")) == 50
    delayed = queue.add_bulk([{"name": "d", "data": i, "delay": 60} for i in range(1500)])
    age(redis_client, queue.name, [j.id for j in delayed[::3]])
    assert sorted(queue.clean(60, state="delayed")) == sorted(j.id for j in delayed[::3])
    assert queue.get_job_counts("delayed") == {"delayed": 1000}


# -- C: waiters learn of removal by clean and drain ------------------------------


@pytest.mark.parametrize("how", ["clean-waiting", "clean-delayed", "drain", "drain-delayed"])
def test_waiter_learns_of_removal_at_once(
    queue: Queue, redis_url: str, redis_client: redis.Redis, how: str
) -> None:
    delayed = how.endswith("delayed")
    job = queue.add("w", delay=60 if delayed else 0)
    with QueueEvents(queue.name, connection=redis_url) as events:
        assert events.wait_until_ready(WAIT)
        future = job.as_future(events)
        if how.startswith("clean"):
            assert queue.clean(0, state="delayed" if delayed else "waiting") == [job.id]
        else:
            assert queue.drain(delayed=delayed) == 1
        # the periodic re-check comes after ~10 s: this is the event's doing
        assert isinstance(future.exception(timeout=WAIT), JobNotFoundError)
    assert removed_events(redis_client, queue.name) == {
        job.id: "delayed" if delayed else "waiting"
    }


def test_clean_emits_removed_per_job_and_cleaned(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    done = queue.add_bulk([{"name": "ok" if i % 2 else "bad", "data": i} for i in range(6)])

    def processor(job: jobq.Job) -> int:
        if job.name == "bad":
            raise RuntimeError("no")
        return 1

    with Worker(queue.name, processor, connection=redis_url, drain_delay=0.1):
        until(lambda: queue.get_job_counts("completed", "failed") == {"completed": 3, "failed": 3})
    completed = queue.clean(0, state="completed")
    failed = queue.clean(0, state="failed")
    events = stream(redis_client, queue.name)
    prev = removed_events(redis_client, queue.name)
    assert prev == {**dict.fromkeys(completed, "completed"), **dict.fromkeys(failed, "failed")}
    assert {j.id for j in done} == set(prev)
    cleaned = [f for name, _, f in events if name == "cleaned"]
    assert [(int(f["count"]), f["state"]) for f in cleaned] == [(3, b"completed"), (3, b"failed")]


# -- C, D, E: obliterate ------------------------------------------------------------


@pytest.mark.parametrize("mode", ["stream", "pubsub"])
def test_obliterate_emits_obliterated_and_keeps_mode(
    queue_name: str, redis_url: str, redis_client: redis.Redis, mode: str
) -> None:
    with Queue(queue_name, connection=redis_url, event_mode=mode, max_events=500) as q, \
            QueueEvents(queue_name, connection=redis_url) as events:
        seen: list[jobq.Event] = []
        got = threading.Event()
        added = threading.Event()

        def on_event(event: jobq.Event) -> None:
            seen.append(event)
            got.set()

        # the mode is stored on the queue's first use: before the reader
        # starts, or the reader follows the default (stream) mode
        assert q.event_mode == mode
        events.on("obliterated", on_event)
        events.on("added", lambda e: added.set())
        assert events.wait_until_ready(WAIT)
        q.add_bulk([{"name": "n", "data": i} for i in range(1500)])
        q.add("d", delay=60)
        q.obliterate()
        assert got.wait(WAIT), "no obliterated event"
        assert len(seen) == 1 and seen[0].job_id is None
        assert q.get_job_counts() == dict.fromkeys(STATES, 0)
        # D: the stored mode and max_events stay, so live readers still hear the queue
        meta = redis_client.hgetall(f"jobq:{{{queue_name}}}:meta")
        assert meta.get(b"em", b"stream") == mode.encode() and meta[b"maxev"] == b"500"
        with Queue(queue_name, connection=redis_url, event_mode=mode, max_events=500) as same:
            same.count()  # asking for the same mode does not raise
        added.clear()
        q.add("again")
        assert added.wait(WAIT), "the live reader went deaf after obliterate"
    if mode == "stream":
        names = [name for name, _, _ in stream(redis_client, queue_name)]
        assert names == ["obliterated", "added", "waiting"]


def test_obliterate_keeps_a_pubsub_queue_in_pubsub_mode(
    queue_name: str, redis_url: str
) -> None:
    with Queue(queue_name, connection=redis_url, event_mode="pubsub", max_events=77) as q:
        q.add("n")
        q.obliterate()
    with Queue(queue_name, connection=redis_url) as again:
        assert again.event_mode == "pubsub"
        with QueueEvents(queue_name, connection=redis_url) as events:
            got = threading.Event()
            events.on("added", lambda e: got.set())
            assert events.wait_until_ready(WAIT)
            again.add("n")
            assert got.wait(WAIT)
        again.obliterate()


def test_obliterate_keeps_generated_ids_unique(queue: Queue) -> None:
    first = {j.id for j in queue.add_bulk([{"name": "n"} for _ in range(3)])}
    queue.obliterate()
    second = {j.id for j in queue.add_bulk([{"name": "n"} for _ in range(3)])}
    assert not first & second, (first, second)


def test_obliterate_clears_paused(queue: Queue) -> None:
    queue.pause()
    queue.obliterate()
    assert queue.is_paused() is False


def test_remove_waiting_and_prioritized_emit_removed(
    queue: Queue, redis_client: redis.Redis
) -> None:
    jobs = queue.add_bulk([{"name": "w", "data": i} for i in range(50)])
    urgent = queue.add("u", priority=1)
    assert queue.remove(jobs[0].id) and queue.remove(jobs[-1].id) and queue.remove(urgent.id)
    assert wait_list(redis_client, queue.name) == [j.id for j in reversed(jobs[1:-1])]
    assert removed_events(redis_client, queue.name) == dict.fromkeys(
        [jobs[0].id, jobs[-1].id, urgent.id], "waiting")
