"""Sharded queues on one server (and, in ``make test``'s cluster pass, on a
one-node cluster through a cluster client, where every shard is its own
slot): routing, the stored count, one worker over every shard, fairness,
the limiter, pause, admin calls summed, events and waits.

The three-master tests are in test_sharding_cluster.py.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from jobq import (
    ClosedError,
    FlowProducer,
    Job,
    JobqError,
    Queue,
    QueueEvents,
    ShardCountError,
    ShardedQueue,
    ShardedQueueEvents,
    Worker,
    open_queue,
)
from jobq._shard_worker import CHAIN_LIMIT
from jobq._shards import generated_id, shard_names, shard_of
from jobq.keys import QueueKeys
from tests.conftest import echo
from tests.polling import until
from tests.streams import stream_events

WAIT = 10.0
QUIET = 0.3
SHARDS = 4
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def sharded(queue_name: str, redis_url: str) -> Iterator[ShardedQueue]:
    with ShardedQueue(queue_name, shards=SHARDS, connection=redis_url) as q:
        q.count()  # stored: a worker started now finds the count
        yield q
        q.obliterate(force=True)


class Completed:
    """A ``completed`` listener: the job ids it heard, and a bounded wait
    for a number of them."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self._cond = threading.Condition()

    def __call__(self, event: Any) -> None:
        with self._cond:
            self.ids.append(event.job_id)
            self._cond.notify_all()

    def wait_for(self, count: int) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: len(self.ids) >= count, WAIT)


def ids_on(shard: int, count: int, tag: str = "id") -> list[str]:
    """Custom ids that route to ``shard``."""
    found = []
    for i in range(10_000):
        job_id = f"{tag}-{i}"
        if shard_of(job_id, SHARDS) == shard:
            found.append(job_id)
            if len(found) == count:
                return found
    raise AssertionError("no ids found")


def test_shard_names_are_spread_over_the_slot_space() -> None:
    from redis.crc import key_slot

    for count in (1, 2, 3, 4, 8, 256):
        names = shard_names("mail", count)
        slots = [key_slot(n.encode()) for n in names]
        assert [s * count // 16384 for s in slots] == list(range(count))
    assert shard_of(generated_id(3), 4) == 3
    assert shard_of("order-17", 4) == shard_of("order-17", 4)


def test_adds_route_by_id_and_spread_generated_ids(sharded: ShardedQueue) -> None:
    jobs = sharded.add_bulk([{"name": "x", "data": i} for i in range(40)])
    assert [j.data for j in jobs] == list(range(40))
    assert len({j.id for j in jobs}) == 40
    assert [c["waiting"] for c in sharded.shard_counts("waiting")] == [10] * SHARDS
    for job in jobs:  # a generated id names its shard
        shard = sharded.shards[shard_of(job.id, SHARDS)]
        assert shard.get_job_state(job.id) == "waiting"
        assert sharded.get_job(job.id).data == job.data  # type: ignore[union-attr]
    first = sharded.add("x", "a", job_id="order-1")
    again = sharded.add("x", "b", job_id="order-1")  # idempotent: the same job
    assert again.id == first.id and again.data == "a"
    assert sharded.get_job_counts("waiting") == {"waiting": 41}
    assert sharded.shard_for("order-1").get_job("order-1") is not None
    # a bulk over every shard with custom ids, some already there
    bulk = sharded.add_bulk(
        [{"name": "x", "data": i, "job_id": f"b-{i}"} for i in range(20)]
        + [{"name": "x", "data": "dup", "job_id": "order-1"}]
    )
    assert [j.id for j in bulk] == [f"b-{i}" for i in range(20)] + ["order-1"]
    assert bulk[-1].data == "a"
    assert sharded.count() == 61


def test_promote_jobs_promotes_the_delayed_jobs_of_every_shard(sharded: ShardedQueue) -> None:
    sharded.add_bulk([{"name": "x", "data": i, "delay": 60} for i in range(12)])
    assert sharded.promote_jobs(count=5) == 5
    assert sharded.get_job_counts("delayed", "waiting") == {"delayed": 7, "waiting": 5}
    assert sharded.promote_jobs() == 7
    assert [c["waiting"] for c in sharded.shard_counts("waiting")] == [3] * SHARDS
    assert sharded.promote_jobs() == 0


def test_the_shard_count_is_stored_and_checked(
    sharded: ShardedQueue, redis_url: str, redis_client: redis.Redis
) -> None:
    sharded.add("x")
    assert redis_client.hget(f"jobq:{{{sharded.name}}}:meta", "shards") == str(SHARDS).encode()
    with ShardedQueue(sharded.name, shards=2, connection=redis_url) as other:
        with pytest.raises(ShardCountError, match="stored with 4 shard"):
            other.add("x")
    with Queue(sharded.name, connection=redis_url) as plain:
        with pytest.raises(ShardCountError, match=r"ShardedQueue\(.*shards=4\)"):
            plain.add("x")
    opened = open_queue(sharded.name, connection=redis_url)
    try:
        assert isinstance(opened, ShardedQueue) and opened.shard_count == SHARDS
        assert opened.count() == 1
    finally:
        opened.close()
    with pytest.raises(ValueError, match="hash tag"):
        ShardedQueue("x", shards=2, prefix="{app}")
    with pytest.raises(ValueError, match="shards"):
        ShardedQueue("x", shards=0)
    # a worker or a reader of another count served or read nothing, silently
    # (the worker retried the error for ever, the reader's waits ended in
    # JobNotFoundError)
    with pytest.raises(ShardCountError, match="stored with 4 shard"):
        Worker(sharded.name, lambda job: None, connection=redis_url, shards=5).start()
    with ShardedQueueEvents(sharded.name, shards=5, connection=redis_url) as events:
        with pytest.raises(ShardCountError, match="stored with 4 shard"):
            events.on("completed", lambda event: None)
    with ShardedQueueEvents(sharded.name, shards=SHARDS, connection=redis_url) as events:
        events.on("completed", lambda event: None)  # the right count reads


def test_long_running_tools_open_a_queue_made_again_as_the_other_kind(
    queue_name: str, redis_url: str
) -> None:
    """`jobq metrics` and the dashboard kept the kind of queue they first
    saw: a queue obliterated and made again sharded showed 0 jobs for as
    long as they ran. What they hold is let go when the stored kind changes
    (or the queue is gone), and opened again as stored."""
    from jobq._queues import QueueSet

    held = QueueSet(redis_url, "jobq", "the test", stored=True)
    try:
        plain = held.get(queue_name)
        plain.add("x")
        assert plain.count() == 1
        plain.obliterate()
        with ShardedQueue(queue_name, shards=SHARDS, connection=redis_url) as sharded:
            sharded.add("x")
            sharded.add("y")
            held.keep([queue_name])
            again = held.get(queue_name)
            assert isinstance(again, ShardedQueue) and again.count() == 2
            assert plain._context.closed
            sharded.obliterate(force=True)
            held.keep([])  # gone: let go
            assert held.get(queue_name) is not again
    finally:
        held.close()


def test_a_plain_queue_opened_on_a_shards_name_is_refused(
    sharded: ShardedQueue, redis_url: str
) -> None:
    """Queue("<name>~0") wrote into the sharded queue's shard (its jobs where
    the sharded queue does not look for them by id), and its obliterate
    wiped the shard: `jobq add mail~0.2` and `jobq obliterate mail~0.2`
    did. A plain Queue is refused a shard's name now."""
    job = sharded.add("x", 1)
    for shard in shard_names(sharded.name, SHARDS):
        with Queue(shard, connection=redis_url) as plain:
            with pytest.raises(JobqError, match="is a shard of a sharded queue"):
                plain.add("y")
            with pytest.raises(JobqError, match="is a shard of a sharded queue"):
                plain.obliterate(force=True)
    assert sharded.get_job(job.id) is not None
    assert sharded.count() == 1


def test_a_worker_started_on_a_shards_name_is_refused(
    sharded: ShardedQueue, redis_url: str
) -> None:
    """Worker("<name>~0") served the shard as a plain queue, beside the
    sharded queue's own workers; it is refused as a plain Queue is, and
    leaves no thread behind."""
    job = sharded.add("x", 1)
    shard = shard_names(sharded.name, SHARDS)[shard_of(job.id, SHARDS)]
    worker = Worker(shard, echo, connection=redis_url)
    with pytest.raises(JobqError, match="is a shard of a sharded queue"):
        worker.start()
    worker.close()
    assert sharded.get_job_state(job.id) == "waiting"  # nothing took it
    with Worker(sharded.name, echo, connection=redis_url):
        assert job.wait_until_finished(timeout=WAIT) == 1


def test_a_plain_queue_named_as_a_shard_is_not_taken_over(
    queue_name: str, redis_url: str
) -> None:
    """A plain queue may be named as a shard of a sharded queue made later
    (names may hold '~'): the sharded queue counted its jobs and its worker
    ran one, which it could then not finish (it stayed active), and the
    sharded queue's obliterate deleted them. Both refuse such a shard now,
    as they refuse a plain queue of the sharded queue's own name."""
    shard = shard_names(queue_name, SHARDS)[1]
    with Queue(shard, connection=redis_url) as plain:
        job = plain.add("x", 1)
        with ShardedQueue(queue_name, shards=SHARDS, connection=redis_url) as sharded:
            with pytest.raises(ShardCountError, match=f"{shard!r}, the name of a shard"):
                sharded.add("x")
            errors: list[Exception] = []
            worker = Worker(queue_name, echo, connection=redis_url, shards=SHARDS)
            worker.on("error", errors.append)
            with worker:
                until(lambda: errors, timeout=WAIT)
            assert isinstance(errors[0], ShardCountError)
            assert plain.get_job_state(job.id) == "waiting"  # nothing took it
            with Worker(shard, echo, connection=redis_url):
                assert job.wait_until_finished(timeout=WAIT) == 1
            plain.obliterate()
            assert sharded.add("x", 2).get_state() == "waiting"  # the name is free now
            sharded.obliterate(force=True)


def test_a_plain_queue_that_holds_jobs_is_not_sharded_over_them(
    queue_name: str, redis_url: str
) -> None:
    """ShardedQueue(name) and Worker(name, shards=N) of a plain queue with
    jobs stored a count over it: its jobs were left where no worker looked,
    and Queue(name) refused the name from then on."""
    with Queue(queue_name, connection=redis_url) as plain:
        jobs = [plain.add("x", i) for i in range(3)]
        with ShardedQueue(queue_name, shards=SHARDS, connection=redis_url) as sharded:
            with pytest.raises(ShardCountError, match="plain queue that holds jobs"):
                sharded.add("x")
        errors: list[Exception] = []
        worker = Worker(queue_name, echo, connection=redis_url, shards=SHARDS)
        worker.on("error", errors.append)
        with worker:
            until(lambda: errors)
        assert isinstance(errors[0], ShardCountError)
        assert plain.count() == 3  # still a plain queue, its jobs where they were
        with Worker(queue_name, echo, connection=redis_url):
            assert [j.wait_until_finished(timeout=WAIT) for j in jobs] == [0, 1, 2]
        plain.obliterate()
    with ShardedQueue(queue_name, shards=SHARDS, connection=redis_url) as sharded:
        sharded.add("x")  # emptied, the name can be sharded
        assert sharded.count() == 1
        sharded.obliterate()


def test_one_worker_serves_every_shard_through_one_fetch_thread(
    sharded: ShardedQueue, redis_client: redis.Redis, redis_url: str
) -> None:
    jobs = sharded.add_bulk([{"name": "x", "data": i} for i in range(60)])
    with Worker(sharded.name, lambda job: job.data * 2, connection=redis_url, concurrency=4,
                name="w-one") as worker:
        assert [j.wait_until_finished(timeout=WAIT) for j in jobs] == [i * 2 for i in range(60)]
        fetchers = [t for t in threading.enumerate() if t.name.startswith("jobq-fetch-")]
        assert len(fetchers) == 1
        # one subscribed connection for the node (one server here), not one per shard
        named = [c for c in redis_client.client_list() if c["name"] == "jobq-fetch-w-one"]
        assert len(named) == 1
        assert [w.name for w in sharded.get_workers()] == [worker.name]
    counts = sharded.get_job_counts()
    assert counts["completed"] == 60 and counts["waiting"] == counts["active"] == 0


def test_an_idle_worker_is_woken_by_any_shard(sharded: ShardedQueue, redis_url: str) -> None:
    # drain_delay is long: only the shards' wake-ups can make the worker look
    with Worker(sharded.name, lambda job: job.data, connection=redis_url, drain_delay=60,
                concurrency=2) as worker:
        ready = threading.Event()
        worker.on("ready", ready.set)
        assert ready.wait(WAIT)
        for shard in range(SHARDS):
            job = sharded.add("x", shard, job_id=ids_on(shard, 1, "wake")[0])
            started = time.monotonic()
            assert job.wait_until_finished(timeout=WAIT) == shard
            assert time.monotonic() - started < 5.0  # woken, not the 60 s idle look
        # a delayed job is taken when due, without a wake-up
        job = sharded.add("x", "late", delay=0.3)
        assert job.wait_until_finished(timeout=WAIT) == "late"


def test_a_worker_told_the_count_serves_a_queue_not_yet_written(
    queue_name: str, redis_url: str
) -> None:
    with Worker(queue_name, lambda job: job.data, connection=redis_url, shards=SHARDS), \
         ShardedQueue(queue_name, shards=SHARDS, connection=redis_url) as sharded:
        jobs = sharded.add_bulk([{"name": "x", "data": i} for i in range(8)])
        assert [j.wait_until_finished(timeout=WAIT) for j in jobs] == list(range(8))
        sharded.obliterate(force=True)


def test_a_refused_obliterate_leaves_every_shard_as_it_was(
    queue_name: str, redis_url: str
) -> None:
    """Every shard is held paused while obliterate looks for active jobs
    (a worker taking one on a shard already looked at would see it
    deleted); a refusal lets go of them, their jobs untouched."""
    started, release = threading.Event(), threading.Event()

    def handler(job: Job) -> None:
        started.set()
        assert release.wait(WAIT)

    with ShardedQueue(queue_name, shards=SHARDS, connection=redis_url) as sharded:
        sharded.add("busy", job_id=ids_on(0, 1)[0])
        with Worker(queue_name, handler, connection=redis_url, shards=SHARDS):
            try:
                assert started.wait(WAIT)
                sharded.add_bulk([{"name": "x", "job_id": i} for i in ids_on(1, 3, "wait")])
                with pytest.raises(JobqError, match="active jobs"):
                    sharded.obliterate()
                assert not any(shard.is_paused() for shard in sharded.shards)
                assert sharded.get_job_counts("active", "waiting") == {"active": 1, "waiting": 3}
            finally:
                release.set()
        sharded.obliterate(force=True)


def test_an_obliterate_cut_short_leaves_no_shard_paused(
    queue_name: str, redis_url: str, redis_client: Any
) -> None:
    """An error while obliterate held the shards paused (a node away) left
    those it had paused paused for good, and is_paused() said False."""
    with ShardedQueue(queue_name, shards=SHARDS, connection=redis_url) as sharded:
        sharded.add_bulk([{"name": "x", "job_id": i} for i in ids_on(0, 2) + ids_on(1, 2)])
        broken = sharded.shards[2]._context.keys.meta
        redis_client.delete(broken)
        redis_client.set(broken, "not a hash")  # the pause of shard 2 fails
        try:
            with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
                sharded.obliterate()
            assert not any(shard.is_paused() for shard in sharded.shards[:2])
            assert sharded.shards[0].get_job_counts("waiting") == {"waiting": 2}
        finally:
            redis_client.delete(broken)
        sharded.obliterate(force=True)


def check_no_shard_starves(sharded: ShardedQueue, url: str, first: int, others: int) -> None:
    """Shard 0 holds ``first`` jobs, every other shard ``others``; one slot,
    so takes are sequential: while every shard has jobs the takes go round,
    and each shard's oldest job waits at most ``(shards - 1)`` visits of
    other shards."""
    count = sharded.shard_count
    specs: list[dict[str, Any]] = []
    for shard in range(count):
        ids = [f"f-{i}" for i in range(20_000) if shard_of(f"f-{i}", count) == shard]
        specs += [{"name": "x", "data": shard, "job_id": j}
                  for j in ids[: first if shard == 0 else others]]
    sharded.add_bulk(specs)
    order: list[int] = []
    done = threading.Event()

    def handler(job: Job) -> None:
        order.append(job.data)
        if len(order) == len(specs):
            done.set()

    with Worker(sharded.name, handler, connection=url, concurrency=1):
        assert done.wait(WAIT)
    # a visit of a shard is one take of the fetcher and at most CHAIN_LIMIT
    # taken along by the finishing calls
    visit = CHAIN_LIMIT + 1
    assert all(order.index(shard) < (count - 1) * visit + 1 for shard in range(count))
    assert set(order[: count * visit]) == set(range(count))


def test_no_shard_starves(sharded: ShardedQueue, redis_url: str) -> None:
    check_no_shard_starves(sharded, redis_url, 100, 5)


def check_the_limiter(sharded: ShardedQueue, url: str) -> None:
    """Two workers of limiter 4 per second: 12 jobs take at least 3 windows."""
    jobs = sharded.add_bulk([{"name": "x", "data": i} for i in range(12)])
    limiter = {"max": 4, "duration": 1.0}
    with Worker(sharded.name, lambda job: None, connection=url, concurrency=4,
                limiter=limiter), \
         Worker(sharded.name, lambda job: None, connection=url, concurrency=4,
                limiter=limiter):
        for job in jobs:
            job.wait_until_finished(timeout=WAIT)
    started = sorted(sharded.get_job(j.id).processed_on for j in jobs)  # type: ignore[union-attr,misc]
    # per-shard limits would let all 12 (4 shards x 4) start in the first
    # window. Three windows put the last start about 2 s after the first,
    # less the time a take comes after its window was counted (one round
    # trip before it; a busy CI host once made that 0.1 s: 1.898 s)
    assert started[-1] - started[0] >= 1.5


def test_the_limiter_holds_across_shards(sharded: ShardedQueue, redis_url: str) -> None:
    check_the_limiter(sharded, redis_url)


def test_a_record_with_a_field_that_is_not_a_number_hides_no_job_of_the_listing(
    sharded: ShardedQueue,
) -> None:
    """One such record made the sharded listing (and the dashboard's page
    built on it) raise ValueError: every shard's jobs hidden."""
    jobs = sharded.add_bulk([{"name": "x", "data": i} for i in range(8)])
    shard = sharded.shard_for(jobs[2].id)._context
    shard.redis.hset(shard.keys.job(jobs[2].id), mapping={"priority": "abc", "atm": "-"})
    listed = {job.id: job for job in sharded.get_jobs("waiting")}
    assert set(listed) == {job.id for job in jobs}
    assert (listed[jobs[2].id].priority, listed[jobs[2].id].attempts_made) == (0, 0)


def test_waiting_and_delayed_jobs_are_listed_as_a_plain_queue_lists_them(
    sharded: ShardedQueue, redis_url: str, queue_name: str
) -> None:
    """Waiting jobs in run order, delayed ones by when due: the shards'
    lists were merged by when each job was added, which neither is."""
    with Queue(f"{queue_name}-plain", connection=redis_url) as plain:
        for queue in (plain, sharded):
            for i in range(12):
                queue.add("w", i, job_id=f"w{i}", priority=i % 3, lifo=i % 5 == 0)
            queue.add("d", job_id="due-in-10", delay=10)
            queue.add("d", job_id="moved-to-120", delay=5).change_delay(120)
            queue.add("d", job_id="due-in-60", delay=60)
        # jobs of two shards that became ready in one ms have no order: the
        # run order's classes and times are compared, not the ids
        def run_order(jobs: list[Job]) -> list[tuple[int, bool, float]]:
            return [(j.priority, not j.opts["lifo"], j._ready_at or 0.0) for j in jobs]

        for asc in (True, False):
            ours, theirs = sharded.get_jobs("waiting", asc=asc), plain.get_jobs("waiting", asc=asc)
            assert [(p, fifo) for p, fifo, _ in run_order(ours)] == [
                (p, fifo) for p, fifo, _ in run_order(theirs)]
            for (p1, fifo1, at1), (p2, fifo2, at2) in itertools.pairwise(run_order(ours)):
                assert (p1, fifo1) != (p2, fifo2) or (at1 <= at2) == (fifo1 == asc) or at1 == at2
            assert [j.id for j in sharded.get_jobs("delayed", asc=asc)] == [
                j.id for j in plain.get_jobs("delayed", asc=asc)]
        assert [j.id for j in sharded.get_jobs("delayed", asc=True)] == [
            "due-in-10", "due-in-60", "moved-to-120"]
        # every window, negative indexes too, as LRANGE takes them (as a
        # plain queue's): a negative start was counted from the end of a
        # list cut at end + 1, an end below -n wrapped around
        def lrange(items: list[str], start: int, end: int) -> list[str]:
            first = max(0, len(items) + start) if start < 0 else start
            last = len(items) + end if end < 0 else end
            return items[first:last + 1] if last >= 0 else []

        whole = [j.id for j in sharded.get_jobs("waiting", asc=True)]
        both = [j.id for j in sharded.get_jobs(["waiting", "delayed"], asc=True)]
        delayed = both[len(whole):]
        for start in range(-16, 16, 3):
            for end in range(-16, 16, 3):
                assert [j.id for j in sharded.get_jobs("waiting", start, end, asc=True)] == \
                    lrange(whole, start, end), (start, end)
                assert len(plain.get_jobs("waiting", start, end)) == \
                    len(lrange(whole, start, end)), (start, end)
                # each state's own window, as a plain queue's
                assert [j.id for j in sharded.get_jobs(["waiting", "delayed"], start, end,
                                                       asc=True)] == \
                    lrange(whole, start, end) + lrange(delayed, start, end), (start, end)
        plain.obliterate(force=True)


def test_a_shard_refuses_adds_of_its_own(sharded: ShardedQueue) -> None:
    """A job added to a shard got an id that names another shard: the
    sharded queue did not find it, its worker's finish went to the other
    shard, and it stalled until it failed."""
    shard = sharded.shards[1]
    for add in (lambda: shard.add("x"), lambda: shard.add_bulk([{"name": "x"}]),
                lambda: shard.add("x", depends_on=["1"]),
                lambda: shard.upsert_scheduler("s", every=60)):
        with pytest.raises(JobqError, match="through the sharded queue"):
            add()
    assert sharded.count() == 0
    assert shard.get_job_counts("waiting") == {"waiting": 0}  # its reads are fine


def test_pause_and_resume_the_whole_queue(sharded: ShardedQueue, redis_url: str) -> None:
    ran = threading.Event()
    sharded.pause()
    assert sharded.is_paused()
    with Worker(sharded.name, lambda job: ran.set(), connection=redis_url, concurrency=2):
        jobs = sharded.add_bulk([{"name": "x"} for _ in range(8)])
        assert not ran.wait(QUIET)
        assert sharded.get_job_counts("waiting") == {"waiting": 8}
        sharded.resume()
        assert not sharded.is_paused()
        for job in jobs:
            job.wait_until_finished(timeout=WAIT)


def test_per_minute_metrics_of_shards_read_across_a_minutes_start_line_up() -> None:
    """Each shard's list counts back from its own read: a shard read just
    before a minute began had its minutes added to the next ones'."""
    from jobq._sharded_ops import summed_metrics
    from jobq.metrics import Metrics

    before = Metrics(count=6, data=[1, 2, 3], timestamp=1_800_000_059.9)  # minute m-1 first
    after = Metrics(count=60, data=[10, 20, 30], timestamp=1_800_000_060.1)  # minute m first
    summed = summed_metrics([before, after])
    assert summed.data == [10, 21, 32]  # m: after's 10; m-1: 20 + 1; m-2: 30 + 2
    assert summed.count == 66 and summed.timestamp == after.timestamp
    assert summed_metrics([after, before]).data == [10, 21, 32]
    assert summed_metrics([before, before]).data == [2, 4, 6]  # one minute: as before


def test_reads_and_admin_are_summed(sharded: ShardedQueue, redis_url: str,
                                    redis_client: redis.Redis) -> None:
    def handler(job: Job) -> int:
        if job.data % 5 == 0:
            raise ValueError("five")
        return int(job.data)

    jobs = sharded.add_bulk([{"name": "x", "data": i} for i in range(20)])
    with Worker(sharded.name, handler, connection=redis_url, concurrency=4):
        for job in jobs:
            try:
                job.wait_until_finished(timeout=WAIT)
            except Exception:
                pass
    assert sharded.get_job_counts("completed", "failed") == {"completed": 16, "failed": 4}
    assert sharded.get_metrics("completed").count == 16
    assert sharded.get_metrics("failed").count == 4
    listed = sharded.get_jobs("completed", 0, 9)
    assert len(listed) == 10  # as a plain queue lists them: by when they finished (ms)
    finished = [int((j.finished_on or 0) * 1000) for j in listed]
    assert finished == sorted(finished, reverse=True)
    # a page is a slice of the whole list (the pages were merged by when
    # the jobs were added, each shard's first jobs by when they finished)
    whole = [j.id for j in sharded.get_jobs("completed")]
    paged = [j.id for start in range(0, 16, 3)
             for j in sharded.get_jobs("completed", start, start + 2)]
    assert paged == whole and [j.id for j in listed] == whole[:10]
    assert {j.id for j in sharded.get_jobs(["completed", "failed"])} == {j.id for j in jobs}
    assert sharded.retry_jobs("failed") == 4
    assert sharded.get_job_counts("waiting")["waiting"] == 4
    assert sharded.drain() == 4
    sharded.add_bulk([{"name": "x", "data": i, "delay": 60} for i in range(8)])
    assert sharded.get_job_counts("delayed")["delayed"] == 8
    assert len(sharded.clean(0, 5, "completed")) == 5
    assert len(sharded.clean(0, 0, "completed")) == 11
    assert sharded.remove(jobs[0].id) in (True, False)
    assert sharded.drain(delayed=True) == 8
    sharded.obliterate()
    assert redis_client.hget(f"jobq:{{{sharded.name}}}:meta", "shards") is None
    for shard in sharded.shards:
        assert not redis_client.exists(f"jobq:{{{shard.name}}}:completed")
    assert sharded.name.encode() not in redis_client.smembers("jobq:queues")
    sharded.add("x")  # usable again: the count is stored again
    assert redis_client.hget(f"jobq:{{{sharded.name}}}:meta", "shards") == b"4"


def test_events_and_waits_over_every_shard(sharded: ShardedQueue, redis_url: str) -> None:
    events = sharded.events
    assert isinstance(events, ShardedQueueEvents)
    assert events.wait_until_ready(WAIT)
    completed: list[str] = []
    got = threading.Condition()
    one: list[Any] = []

    def on_completed(event: Any) -> None:
        with got:
            completed.append(event.job_id)
            got.notify_all()

    events.on("completed", on_completed)
    events.on("completed:order-9", one.append)
    jobs = sharded.add_bulk([{"name": "x", "data": i} for i in range(16)])
    jobs.append(sharded.add("x", 99, job_id="order-9"))
    with Worker(sharded.name, lambda job: job.data, connection=redis_url, concurrency=4):
        assert [j.wait_until_finished(events, timeout=WAIT) for j in jobs] == [
            *range(16), 99
        ]
        with got:
            assert got.wait_for(lambda: len(completed) == 17, WAIT)
    assert set(completed) == {j.id for j in jobs}
    assert [e.job_id for e in one] == ["order-9"]
    # a plain QueueEvents of the logical name is not how a sharded queue is read
    assert sharded.get_job("order-9").wait_until_finished(timeout=WAIT) == 99  # type: ignore[union-attr]


def test_drained_is_heard_only_when_every_shard_is_drained(
    sharded: ShardedQueue, redis_url: str, redis_client: redis.Redis
) -> None:
    # a shard with nothing waiting or active writes drained; the sharded
    # queue's listeners (of its events, and a worker's own) hear it only
    # when no shard has a job waiting or active
    events = sharded.events
    assert events.wait_until_ready(WAIT)
    heard, local = threading.Event(), threading.Event()
    events.on("drained", lambda event: heard.set())
    (first, marker_id), (second,) = ids_on(0, 2, "a"), ids_on(1, 1, "b")
    started = {first: threading.Event(), second: threading.Event()}
    release = {first: threading.Event(), second: threading.Event()}

    def handler(job: Job) -> str:
        started[job.id].set()
        assert release[job.id].wait(WAIT)
        return job.id

    worker = Worker(sharded.name, handler, connection=redis_url, concurrency=2)
    worker.on("drained", local.set)  # before start: its reader is ready then
    with worker:
        one, two = sharded.add("x", job_id=first), sharded.add("x", job_id=second)
        assert started[first].wait(WAIT) and started[second].wait(WAIT)
        release[first].set()
        assert one.wait_until_finished(events, timeout=WAIT) == first
        shard0 = shard_names(sharded.name, SHARDS)[0]
        assert "drained" in [name for name, _, _ in stream_events(redis_client, shard0)]
        # both readers have passed shard 0's drained once they hear an event
        # written on shard 0 after it (a shard's events come in order)
        seen = [threading.Event(), threading.Event()]
        reader = worker._channel._events
        assert reader is not None
        for target, done in zip((events, reader), seen, strict=True):
            target.on("delayed", lambda event, done=done: done.set())
        sharded.add("x", job_id=marker_id, delay=60)  # delayed: not waiting, not counted
        assert seen[0].wait(WAIT) and seen[1].wait(WAIT)
        assert not heard.is_set(), "drained was heard while a job of shard 1 was active"
        assert not local.is_set(), "the worker heard drained while its job of shard 1 ran"
        release[second].set()
        assert two.wait_until_finished(events, timeout=WAIT) == second
        assert heard.wait(WAIT) and local.wait(WAIT)


def test_a_sharded_queues_payload_limit_may_be_changed_for_every_shard(
    sharded: ShardedQueue,
) -> None:
    """``sharded.max_payload_bytes = n`` was a plain attribute, kept and
    never applied (the shards kept theirs)."""
    from jobq import PayloadTooLarge

    sharded.max_payload_bytes = 20
    assert sharded.max_payload_bytes == 20
    assert [s.max_payload_bytes for s in sharded.shards] == [20] * SHARDS
    for i in range(SHARDS * 2):  # whichever shard takes the add
        with pytest.raises(PayloadTooLarge):
            sharded.add("x", "y" * 100, job_id=f"big-{i}")
    with pytest.raises(ValueError, match="max_payload_bytes"):
        sharded.max_payload_bytes = 0
    sharded.max_payload_bytes = None
    assert sharded.add("x", "y" * 100).data == "y" * 100


def test_a_closed_sharded_queue_or_flow_producer_raises_closed_error(
    queue_name: str, redis_url: str
) -> None:
    """They raised a bare JobqError where every other closed object raises
    ClosedError (SPEC, Errors)."""
    sharded = ShardedQueue(queue_name, shards=SHARDS, connection=redis_url)
    sharded.close()
    for call in (lambda: sharded.add("x"), lambda: sharded.add_bulk([{"name": "x"}] * 8)):
        with pytest.raises(ClosedError, match="is closed"):
            call()
    producer = FlowProducer(connection=redis_url)
    producer.close()
    with pytest.raises(ClosedError, match="FlowProducer is closed"):
        producer.add({"name": "x", "queue": queue_name})


def test_no_listener_is_added_to_a_closed_sharded_queue_events(
    sharded: ShardedQueue, redis_url: str
) -> None:
    events = ShardedQueueEvents(sharded.name, shards=SHARDS, connection=redis_url)
    events.close()
    with pytest.raises(ClosedError, match="is closed"):
        events.on("completed", print)
    with pytest.raises(ClosedError, match="is closed"):
        events.on_all_events(print)


def test_a_job_id_to_look_up_on_a_sharded_queue_is_a_str(sharded: ShardedQueue) -> None:
    job = sharded.add("x", 1, job_id="None")
    for look in (sharded.get_job, sharded.get_job_state, sharded.remove, sharded.cancel,
                 sharded.shard_for, sharded.events.future_for):
        with pytest.raises(TypeError, match="job_id must be a str"):
            look(None)
    assert sharded.get_job_state("None") == "waiting" and job.id == "None"
    keyed = sharded.add("x", 2, dedup={"id": "None"})
    for by_key in (sharded.get_dedup_job_id, sharded.remove_dedup_key):
        with pytest.raises(TypeError, match="dedup key must be a str"):
            by_key(None)  # type: ignore[arg-type]
    for by_id in (sharded.get_scheduler, sharded.remove_scheduler):
        with pytest.raises(TypeError, match="scheduler_id must be a str"):
            by_id(None)  # type: ignore[arg-type]
    assert sharded.get_dedup_job_id("None") == keyed.id


def test_a_custom_drained_event_is_passed_on_as_is(sharded: ShardedQueue) -> None:
    # the sharded queue's own drained is heard only when every shard is
    # drained; a custom event of that name (Queue.emit) is no drain
    events = sharded.events
    assert events.wait_until_ready(WAIT)
    heard: list[Any] = []
    events.on("drained", heard.append)
    sharded.add("x")  # waiting: the queue is not drained
    sharded.emit("drained", by="me")
    until(lambda: heard, timeout=WAIT)
    assert [(e.job_id, e.by) for e in heard] == [(None, "me")]


def test_shards_drained_together_are_heard_once(
    sharded: ShardedQueue, redis_url: str, redis_client: redis.Redis
) -> None:
    events = sharded.events
    assert events.wait_until_ready(WAIT)
    drained: list[Any] = []
    events.on("drained", drained.append)
    hold = threading.Event()
    # listeners run on one thread: held here, it comes to both shards'
    # drained only once both jobs are finished
    events.once("completed", lambda event: hold.wait(WAIT))
    (first,), (second,) = ids_on(0, 1, "a"), ids_on(1, 1, "b")
    with Worker(sharded.name, lambda job: job.id, connection=redis_url, concurrency=2):
        jobs = [sharded.add("x", job_id=first), sharded.add("x", job_id=second)]
        assert [j.wait_until_finished(events, timeout=WAIT) for j in jobs] == [first, second]
        for shard in (0, 1):  # each shard wrote drained last; the reader read it
            name = shard_names(sharded.name, SHARDS)[shard]
            assert stream_events(redis_client, name)[-1][0] == "drained"
            last = redis_client.xrevrange(f"jobq:{{{name}}}:events", count=1)[0][0].decode()
            part = events.readers[shard]._reader
            until(lambda part=part, last=last: part.position() == last, timeout=WAIT)
        dispatched = threading.Event()
        events._dispatcher.call_soon(dispatched.set)  # after both drained
        hold.set()
        assert dispatched.wait(WAIT)
    assert len(drained) == 1


@pytest.mark.parametrize("mode", ["stream", "pubsub"])
def test_a_reader_started_before_the_shards_store_their_mode_misses_nothing(
    queue_name: str, redis_url: str, mode: str
) -> None:
    completed = Completed()
    with ShardedQueueEvents(queue_name, shards=SHARDS, connection=redis_url) as events:
        events.on("completed", completed)
        assert events.wait_until_ready(WAIT)
        with (
            ShardedQueue(queue_name, shards=SHARDS, connection=redis_url, event_mode=mode) as q,
            Worker(queue_name, lambda job: job.data, connection=redis_url, shards=SHARDS),
        ):
            jobs = [q.add("x", i, job_id=ids_on(i % SHARDS, 1, f"m{i}")[0]) for i in range(8)]
            assert [job.wait_until_finished(timeout=WAIT) for job in jobs] == list(range(8))
            assert completed.wait_for(8)
            assert sorted(completed.ids) == sorted(job.id for job in jobs)
            q.obliterate(force=True)


def test_a_sharded_worker_stores_the_shard_marks_again_when_the_server_lost_them(
    sharded: ShardedQueue, redis_url: str, redis_client: redis.Redis
) -> None:
    """The count and each shard's mark (its scripts then publish the
    wake-ups the fetchers wait for) were written once: after a FLUSHALL
    every job waited a drain_delay (5 s) to be taken, for good."""
    metas = [QueueKeys("jobq", name).meta for name in shard_names(sharded.name, SHARDS)]
    logical = QueueKeys("jobq", sharded.name).meta

    def marks() -> list[Any]:
        return [redis_client.hget(logical, "shards")] + [redis_client.hget(m, "shard")
                                                         for m in metas]

    with Worker(sharded.name, lambda job: job.data, connection=redis_url, shards=SHARDS,
                stalled_interval=0.2):
        assert sharded.add("x", 1).wait_until_finished(timeout=WAIT) == 1
        assert all(marks())
        redis_client.hdel(logical, "shards")  # as FLUSHALL leaves them
        for meta in metas:
            redis_client.hdel(meta, "shard")
        until(lambda: all(marks()), timeout=WAIT)
        assert marks() == [str(SHARDS).encode()] + [b"1"] * SHARDS
        assert sharded.add("x", 2).wait_until_finished(timeout=WAIT) == 2


def test_a_call_over_the_shards_waits_for_a_server_that_does_not_answer_once(
    queue_name: str,
) -> None:
    """A call over every shard passes over one that fails (its slot moving)
    and goes on with the others; against a server that did not answer, it
    waited out the socket timeout for each shard in turn (4 shards: 8 to 11
    s for a timeout of 1 s). A timeout is raised at once."""
    import signal

    from jobq.testing import RedisServer, find_server_binary

    with RedisServer(find_server_binary()) as server, ShardedQueue(
        queue_name, shards=6, connection=f"{server.url}?socket_timeout=1"
    ) as queue:
        queue.count()  # set up while the server answers
        server.kill(signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(redis.exceptions.TimeoutError):
                queue.pause()
            took = time.monotonic() - started
        finally:
            server.kill(signal.SIGCONT)
        assert took < 5.0, took  # one shard's wait (and its client's retry), not six


@pytest.mark.parametrize("mode", ["pubsub", None])
def test_a_sharded_reader_in_a_call_to_a_server_that_stopped_answering_ends_with_its_close(
    queue_name: str, monkeypatch: pytest.MonkeyPatch, mode: str | None
) -> None:
    """The reader of the shards' channels (pub/sub mode, or shards with no
    mode stored yet) made its other calls (the modes, on connecting and
    every few seconds in pub/sub mode; the streams' reads) on the caller's
    client: closed while one of them waited for a server that had stopped
    answering, it cut only its subscription, and its thread lived on past
    the close (for ever, with a client of no socket timeout)."""
    import signal
    import sys

    from jobq import _reader
    from jobq.testing import RedisServer, find_server_binary
    from tests.polling import jobq_threads

    monkeypatch.setattr(_reader, "MODE_CHECK_INTERVAL", 0.2)

    def in_a_call(thread: threading.Thread) -> bool:
        frame = sys._current_frames().get(thread.ident or 0)
        while frame is not None:
            if frame.f_code.co_name == "read_mode":
                return True
            frame = frame.f_back
        return False

    with RedisServer(find_server_binary()) as server:
        if mode is not None:
            with ShardedQueue(queue_name, shards=SHARDS, connection=server.url,
                              event_mode=mode) as queue:
                queue.add("x")  # stores the mode
        client = redis.Redis.from_url(server.url)  # no socket timeout
        events = ShardedQueueEvents(queue_name, shards=SHARDS, connection=client,
                                    autorun=False)
        try:
            if mode is not None:  # its reads of the modes every 0.2 s
                events.run()
                assert events.wait_until_ready(WAIT)
            server.kill(signal.SIGSTOP)
            try:
                if mode is None:  # its reads of the modes as it connects
                    events.run()
                reader = next(t for t in threading.enumerate()
                              if t.name == f"jobq-events-{queue_name}")
                until(lambda: in_a_call(reader), timeout=WAIT, interval=0.005)
                events.close(timeout=1)
                left = jobq_threads(queue_name)
            finally:
                server.kill(signal.SIGCONT)
        finally:
            events.close()
            client.close()
        assert left == []


def test_a_sharded_queue_stores_its_count_again_when_the_server_lost_it(
    sharded: ShardedQueue, redis_url: str, redis_client: redis.Redis
) -> None:
    """With no sharded worker running to store the count again, a worker
    started after the loss served the sharded queue as a plain one: the
    jobs its producer added to the shards never ran. The producer's first
    add that finds a shard's settings gone stores them again."""
    metas = [QueueKeys("jobq", name).meta for name in shard_names(sharded.name, SHARDS)]
    logical = QueueKeys("jobq", sharded.name).meta
    first = sharded.add("x", 1)
    for key in (logical, *metas):  # as FLUSHALL leaves them (one slot each)
        redis_client.delete(key)
    second = sharded.add("x", 2)
    assert redis_client.hget(logical, "shards") == str(SHARDS).encode()
    assert [redis_client.hget(m, "shard") for m in metas] == [b"1"] * SHARDS
    with Worker(sharded.name, lambda job: job.data, connection=redis_url):  # count read
        assert first.wait_until_finished(timeout=WAIT) == 1
        assert second.wait_until_finished(timeout=WAIT) == 2


def test_a_pubsub_sharded_reader_follows_its_shards_to_their_streams_when_the_mode_is_lost(
    queue_name: str, redis_url: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobq import _reader

    monkeypatch.setattr(_reader, "MODE_CHECK_INTERVAL", 0.2)
    completed = Completed()
    with (
        ShardedQueue(queue_name, shards=SHARDS, connection=redis_url, event_mode="pubsub") as q,
        ShardedQueueEvents(queue_name, shards=SHARDS, connection=redis_url) as events,
        Worker(queue_name, lambda job: job.data, connection=redis_url, shards=SHARDS),
    ):
        events.on("completed", completed)
        assert events.wait_until_ready(WAIT)
        assert q.add("x", 0).wait_until_finished(events, timeout=WAIT) == 0
        for name in shard_names(queue_name, SHARDS):  # as FLUSHALL leaves them
            redis_client.hdel(QueueKeys("jobq", name).meta, "em")
        # added by a ShardedQueue first used since, of no mode (the pub/sub
        # one's add would store the mode again)
        with ShardedQueue(queue_name, shards=SHARDS, connection=redis_url) as plain:
            jobs = [plain.add("x", i, job_id=ids_on(i % SHARDS, 1, f"m{i}")[0])
                    for i in range(1, 5)]
            assert [job.wait_until_finished(events, timeout=WAIT) for job in jobs] == [1, 2, 3, 4]
        assert completed.wait_for(5)
        # the pub/sub queue's add stores its mode again: in a stream read by
        # one XREAD over all shards, the reader read that and went on reading
        # the streams alone, deaf to every event published from then on
        reader = events._reader
        one_xread = os.environ.get("JOBQ_TEST_CLUSTER") != "1"  # (a cluster's reader listens)
        assert until(lambda: reader.connections == (1 if one_xread else 2)
                     and (reader._multi is not None) == one_xread)
        assert q.add("x", 5, job_id=ids_on(0, 1, "m5")[0]).wait_until_finished(
            events, timeout=WAIT) == 5
        assert until(lambda: reader._nodes and reader._readers[0].mode == "pubsub")
        jobs = [q.add("x", i, job_id=ids_on(i % SHARDS, 1, f"m{i}")[0]) for i in range(6, 9)]
        assert [job.wait_until_finished(events, timeout=WAIT) for job in jobs] == [6, 7, 8]
        assert until(lambda: {j.id for j in jobs} <= set(completed.ids))  # (5's may be lost)
        q.obliterate(force=True)


def test_a_sharded_reader_reads_that_pub_sub_mode_was_stored_with_no_event_after(
    queue_name: str, redis_url: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Storing pub/sub mode on a shard writes an entry saying so to its
    stream, and published no wake-up for it: a reader of the shards'
    channels read it only with the next entries a wake-up told of, and none
    comes once the mode is stored (the events are published). A worker
    that finished the add's job before its Queue stored the mode again left
    the reader on the stream for good (a rare failure of the test below)."""
    from jobq import _reader

    monkeypatch.setattr(_reader, "MODE_CHECK_INTERVAL", 0.2)
    with ShardedQueueEvents(queue_name, shards=SHARDS, connection=redis_url) as events:
        assert events.wait_until_ready(WAIT)
        readers = events._reader._readers
        with ShardedQueue(queue_name, shards=SHARDS, connection=redis_url,
                          event_mode="pubsub") as queue:
            queue.get_job_counts()  # its first use stores the settings: no event
            for name in shard_names(queue_name, SHARDS):
                assert redis_client.hget(QueueKeys("jobq", name).meta, "em") == b"pubsub"
            assert until(lambda: all(reader.mode == "pubsub" for reader in readers))


def test_a_sharded_reader_hears_an_event_published_before_a_data_loss_it_reads_after(
    queue_name: str, redis_url: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader of the shards' channels that took an event message for a
    sign that the mode was stored asked for the mode, and dropped the event
    when the answer was stream: so every event published before the server
    lost the mode, and read after (a reader behind), was lost to its
    listeners (a rare failure of the test below). An event published is in
    no stream: it is taken whatever the mode stored now."""
    from jobq._shard_reader import ShardReader

    go = threading.Event()
    handle = ShardReader._handle

    def held(self: ShardReader, node: Any, message: dict[str, Any]) -> None:
        go.wait(WAIT)  # the reader falls behind
        handle(self, node, message)

    added = Completed()
    with ShardedQueueEvents(queue_name, shards=SHARDS, connection=redis_url) as events:
        events.on("added", added)
        assert events.wait_until_ready(WAIT)
        monkeypatch.setattr(ShardReader, "_handle", held)
        with ShardedQueue(queue_name, shards=SHARDS, connection=redis_url,
                          event_mode="pubsub") as queue:
            job = queue.add("x", 1)
            for name in shard_names(queue_name, SHARDS):  # as FLUSHALL leaves them
                redis_client.hdel(QueueKeys("jobq", name).meta, "em")
            go.set()
            assert added.wait_for(1) and added.ids == [job.id]


def test_a_sharded_reader_hears_the_add_that_stores_pub_sub_mode_again_after_a_data_loss(
    queue_name: str, redis_url: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the server lost the queue's keys, the next add of the pub/sub
    ShardedQueue writes its events to the shard's stream (no mode stored),
    then stores pub/sub mode again. With the shard marks gone too, its
    scripts published no wake-up for those entries: a reader listening to
    the shards' channels took the first published event for the switch and
    never read them (that add's `added` was lost to its listeners). It reads
    the stream to its end before it goes on by the channel."""
    from jobq import _reader
    from jobq._shard_reader import ShardReader

    monkeypatch.setattr(_reader, "MODE_CHECK_INTERVAL", 0.2)
    connected = threading.Semaphore(0)
    modes: list[list[str]] = []  # the shards' modes as each connect ended
    connect = ShardReader._connect

    def counted(self: ShardReader) -> None:
        connect(self)
        modes.append([reader.mode for reader in self._readers])
        connected.release()

    monkeypatch.setattr(ShardReader, "_connect", counted)
    added = Completed()
    names = [queue_name, *shard_names(queue_name, SHARDS)]
    with (
        ShardedQueue(queue_name, shards=SHARDS, connection=redis_url, event_mode="pubsub") as q,
        ShardedQueueEvents(queue_name, shards=SHARDS, connection=redis_url) as events,
    ):
        events.on("added", added)
        assert events.wait_until_ready(WAIT) and connected.acquire(timeout=WAIT)
        first = q.add("x", 0, job_id=ids_on(0, 1, "first")[0])
        assert added.wait_for(1) and added.ids == [first.id]
        for name in names:  # as FLUSHALL leaves them
            for key in list(redis_client.scan_iter(match=f"jobq:{{{name}}}:*")):
                redis_client.delete(key)
        # the reader saw the mode go and listens again, reading the streams
        # (of every shard: the keys went one by one, a shard's mode may have
        # been there yet at a connect, and gone at its next look)
        assert connected.acquire(timeout=WAIT)
        while "pubsub" in modes[-1]:
            assert connected.acquire(timeout=WAIT)
        jobs = [q.add("x", i, job_id=ids_on(i % SHARDS, 1, f"after{i}")[0])
                for i in range(1, 2 * SHARDS + 1)]
        assert added.wait_for(1 + len(jobs)), sorted(set(j.id for j in jobs) - set(added.ids))
        assert sorted(added.ids) == sorted([first.id, *(j.id for j in jobs)])
        assert all(reader.mode == "pubsub" for reader in events._reader._readers)


def test_a_sharded_reader_follows_a_mode_stored_after_it_began_without_connecting_again(
    queue_name: str, redis_url: str, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ShardedQueueEvents begun before its queue's first write reads the
    shards' streams (no mode stored yet) and listens to their channels. The
    first write stored pub/sub mode and said so in each stream: on reading
    that, the reader connected again, and what was published meanwhile was
    lost to its listeners (a rare failure of the test above, in the cluster
    pass). It goes on, on the subscriptions it has."""
    from jobq._shard_reader import ShardReader

    first_read = threading.Event()  # the reader's first read waits for the first write
    read_signalled = ShardReader._read_signalled

    def held_back(reader: ShardReader) -> None:
        first_read.wait(WAIT)
        read_signalled(reader)

    monkeypatch.setattr(ShardReader, "_read_signalled", held_back)
    completed = Completed()
    with ShardedQueueEvents(queue_name, shards=SHARDS, connection=redis_url) as events:
        events.on("completed", completed)
        assert events.wait_until_ready(WAIT)
        with (
            ShardedQueue(queue_name, shards=SHARDS, connection=redis_url,
                         event_mode="pubsub") as queue,
            Worker(queue_name, lambda job: job.data, connection=redis_url, shards=SHARDS),
        ):
            queue.count()  # its first use stores pub/sub mode, and says so in each stream
            first_read.set()
            jobs = [queue.add("x", i, job_id=ids_on(i, 1, "p")[0]) for i in range(SHARDS)]
            assert [job.wait_until_finished(events, timeout=WAIT) for job in jobs] == [
                *range(SHARDS)]
            assert completed.wait_for(SHARDS), completed.ids
            queue.obliterate(force=True)
    again = [r.getMessage() for r in caplog.records if r.name == "jobq.queue_events"]
    assert not again, again


@pytest.mark.parametrize("mode", ["stream", "pubsub"])
def test_one_thread_and_connection_read_every_shard(
    queue_name: str, redis_url: str, redis_client: redis.Redis, mode: str
) -> None:
    """One reader thread for all the shards, whatever the shard count, with
    one connection of its own on one server (or node) in stream mode; in
    pub/sub mode one subscribed, and one for its other calls."""
    with ShardedQueue(queue_name, shards=8, connection=redis_url, event_mode=mode) as queue:
        events = queue.events
        before = {t.name for t in threading.enumerate()}
        assert events.wait_until_ready(WAIT)
        started = sorted(t.name for t in threading.enumerate()
                         if t.name not in before and t.name.startswith("jobq-"))
        assert started == [f"jobq-{role}-{queue_name}" for role in ("dispatch", "events", "wake")]
        one_xread = mode == "stream" and os.environ.get("JOBQ_TEST_CLUSTER") != "1"
        assert events.connections == (1 if one_xread else 2)
        named = [c for c in redis_client.client_list() if c["name"] == f"jobq-events-{queue_name}"]
        assert 1 <= len(named) <= events.connections  # the second one once used
        completed = Completed()
        events.on("completed", completed)
        jobs = [queue.add("x", i, job_id=f"order-{i}") for i in range(8)]
        jobs += queue.add_bulk([{"name": "x", "data": 10 + i} for i in range(16)])
        def handler(job: Job) -> Any:  # a worker's job names the sharded queue too
            return job.data if job.queue_name == queue_name else job.queue_name

        with Worker(queue_name, handler, connection=redis_url, concurrency=4):
            assert [j.wait_until_finished(timeout=WAIT) for j in jobs] == [
                *range(8), *range(10, 26)
            ]
            assert completed.wait_for(len(jobs))
        assert sorted(completed.ids) == sorted(j.id for j in jobs)
        assert {shard_of(j.id, 8) for j in jobs} == set(range(8))
        # the waits went through it too: no reader of a shard was started
        now = sorted(t.name for t in threading.enumerate() if t.name not in before)
        # (add_bulk's pool; redis-py 8's cluster subscriptions start threads of their own)
        assert [n for n in now if n.startswith("jobq-") and "-add-" not in n] == started
        assert {j.queue_name for j in jobs} == {queue_name}
        assert queue.get_job("order-1").queue_name == queue_name  # type: ignore[union-attr]
        queue.obliterate(force=True)


def test_a_reader_of_every_shard_resumes_after_its_connection_is_killed(
    sharded: ShardedQueue, redis_url: str, redis_client: redis.Redis
) -> None:
    events = sharded.events
    assert events.wait_until_ready(WAIT)
    errors: list[BaseException] = []
    events.on("error", errors.append)
    seen: set[str] = set()
    got = threading.Condition()

    def on_completed(event: Any) -> None:
        with got:
            seen.add(event.job_id)
            got.notify_all()

    events.on("completed", on_completed)

    def blocked_reader() -> list[dict[str, Any]]:
        # blocked in its XREAD (on a cluster: subscribed, flag P): killed
        # between two reads, its pool would reconnect without an error to
        # report (a loaded machine saw it)
        return [c for c in redis_client.client_list()
                if c["name"] == f"jobq-events-{sharded.name}"
                and ("b" in c["flags"] or "P" in c["flags"])]

    until(blocked_reader, WAIT)
    killed = 0
    for client in blocked_reader():
        redis_client.client_kill_filter(_id=client["id"])
        killed += 1
    assert killed == 1
    jobs = sharded.add_bulk([{"name": "x", "data": i} for i in range(12)])
    with Worker(sharded.name, lambda job: job.data, connection=redis_url, concurrency=4):
        with got:  # every shard's events still come, on a new connection
            assert got.wait_for(lambda: seen == {j.id for j in jobs}, WAIT)
        assert [j.wait_until_finished(timeout=WAIT) for j in jobs] == list(range(12))
    assert errors  # the lost connection was reported


def test_a_running_job_is_cancelled_at_once(sharded: ShardedQueue, redis_url: str) -> None:
    started = threading.Event()
    stopped = threading.Event()

    def handler(job: Job) -> None:
        started.set()
        if job.cancelled.wait(WAIT):
            stopped.set()

    # a long lock: the renewal would see the cancel only after 15 s
    with Worker(sharded.name, handler, connection=redis_url, lock_duration=30):
        job = sharded.add("x", job_id="cancel-me")
        assert started.wait(WAIT)
        assert sharded.cancel(job.id, "enough")
        assert stopped.wait(5.0)  # the hint, far sooner than the renewal at 15 s
    assert sharded.get_job_state(job.id) == "failed"


def test_a_stalled_job_of_a_shard_is_recovered(sharded: ShardedQueue, redis_url: str) -> None:
    started = threading.Event()
    release = threading.Event()

    def stuck(job: Job) -> None:
        started.set()
        release.wait(WAIT)

    first = Worker(sharded.name, stuck, connection=redis_url, lock_duration=1,
                   stalled_interval=0.5)
    first.start()
    job = sharded.add("x", "again", job_id="stall-me")
    try:
        assert started.wait(WAIT)
        first.close(force=True)  # abandoned: its lock runs out
    finally:
        release.set()
    second = Worker(sharded.name, lambda j: j.data, connection=redis_url, lock_duration=1,
                    stalled_interval=0.5)
    stalled: list[str] = []
    heard = threading.Event()
    second.on("stalled", lambda job_id: (stalled.append(job_id), heard.set()))
    with second:  # its `stalled` listeners hear every shard's events
        assert job.wait_until_finished(timeout=WAIT) == "again"
        assert heard.wait(WAIT)
    assert stalled == ["stall-me"]
    assert sharded.get_job("stall-me").stalled_counter == 1  # type: ignore[union-attr]


def test_dedup_keys_route_with_their_job(sharded: ShardedQueue) -> None:
    first = sharded.add("x", 1, dedup={"id": "mail-7"})
    second = sharded.add("x", 2, dedup={"id": "mail-7"})
    assert second.id == first.id
    assert sharded.get_dedup_job_id("mail-7") == first.id
    assert sharded.count() == 1


def test_a_custom_id_with_a_dedup_key_is_refused(sharded: ShardedQueue) -> None:
    """Each names the job's shard: the job went to its id's shard, and the
    key, looked for on its own shard, deduplicated nothing."""
    for add in (lambda: sharded.add("x", job_id="id-0", dedup={"id": "k1"}),
                lambda: sharded.add_bulk([{"name": "x"},
                                          {"name": "x", "job_id": "id-0", "dedup": {"id": "k1"}}])):
        with pytest.raises(ValueError, match="custom job_id or a dedup key, not both"):
            add()
    assert sharded.count() == 0


def test_a_scheduler_is_refused_with_a_clear_error(sharded: ShardedQueue) -> None:
    """upsert_scheduler raised AttributeError (a plain queue's method the
    sharded queue lacked)."""
    with pytest.raises(JobqError, match="job schedulers are not supported on a sharded"):
        sharded.upsert_scheduler("nightly", every=60, name="x")
    assert sharded.get_schedulers() == [] and sharded.count() == 0


def test_flows_are_refused(sharded: ShardedQueue) -> None:
    with pytest.raises(Exception, match="sharded"):
        sharded.add("x", depends_on=["a"])


@pytest.mark.skipif(
    __import__("os").environ.get("JOBQ_TEST_CLUSTER") == "1", reason="the CLI's own URL"
)
def test_jobq_info_shows_one_queue(sharded: ShardedQueue, redis_url: str) -> None:
    sharded.add_bulk([{"name": "x"} for _ in range(6)])
    done = subprocess.run(
        [sys.executable, "-m", "jobq", "--url", redis_url, "info", sharded.name, "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr
    (snap,) = json.loads(done.stdout)
    assert snap["queue"] == sharded.name and snap["counts"]["waiting"] == 6
    assert sum(c["waiting"] for c in snap["shards"]) == 6 and len(snap["shards"]) == SHARDS


def test_a_plain_queue_events_is_not_confused(queue_name: str, redis_url: str) -> None:
    # the names of shards never collide with the logical queue's keys
    with QueueEvents(queue_name, connection=redis_url) as events:
        assert events.wait_until_ready(WAIT)


def test_tasks_of_a_sharded_queue(sharded: ShardedQueue, redis_url: str) -> None:
    @sharded.task(name="double")
    def double(x: int) -> int:
        return x * 2

    jobs = [double.delay(i) for i in range(8)]
    assert len({shard_of(j.id, SHARDS) for j in jobs}) == SHARDS
    with Worker(sharded.name, sharded.tasks, connection=redis_url, concurrency=2):
        assert [j.wait_until_finished(timeout=WAIT) for j in jobs] == [i * 2 for i in range(8)]


def test_a_plain_worker_of_a_name_that_became_sharded_says_so(queue_name: str,
                                                               redis_url: str) -> None:
    # a worker started before the queue's first write serves the name as a
    # plain queue: once a shard count is stored it reports that, not silence
    errors: list[BaseException] = []
    told = threading.Event()

    def on_error(exc: BaseException) -> None:
        errors.append(exc)
        told.set()

    worker = Worker(queue_name, lambda job: None, connection=redis_url, stalled_interval=0.2)
    worker.on("error", on_error)
    with worker.start(), ShardedQueue(queue_name, shards=SHARDS, connection=redis_url) as q:
        q.add("n", 1)
        assert told.wait(WAIT)
        assert f"shards={SHARDS}" in str(errors[0])
        q.obliterate(force=True)


def test_a_worker_running_through_an_obliterate_keeps_the_queue_gone_and_says_so(
    queue_name: str, redis_url: str, redis_client: redis.Redis
) -> None:
    """A worker's look for a shard count the server lost stored it again
    after an obliterate (the queue came back, and refused another count);
    a worker of the old count beside a queue made again with another one
    served a shard or two of it, saying nothing."""
    errors: list[BaseException] = []
    told = threading.Semaphore(0)

    def on_error(exc: BaseException) -> None:
        errors.append(exc)
        told.release()

    with ShardedQueue(queue_name, shards=4, connection=redis_url) as q:
        q.add("n", 1)
        worker = Worker(queue_name, lambda job: job.data, connection=redis_url,
                        stalled_interval=0.2)
        worker.on("error", on_error)
        with worker:
            q.obliterate(force=True)
            assert told.acquire(timeout=WAIT)
            assert "was obliterated while this worker ran" in str(errors[-1])
            meta = f"jobq:{{{queue_name}}}:meta"
            assert redis_client.hget(meta, "shards") is None  # not stored again
            with ShardedQueue(queue_name, shards=2, connection=redis_url) as again:
                again.add("n", 2)  # made again, with another count: no ShardCountError
                assert redis_client.hget(meta, "shards") == b"2"
                assert redis_client.hget(meta, "obliterated") is None
                assert told.acquire(timeout=WAIT)
                assert "has 2 shards now, but this worker serves 4" in str(errors[-1])
                again.obliterate(force=True)
    assert len(errors) == 2


def test_a_plain_queue_events_of_a_sharded_queue_warns(
    sharded: ShardedQueue, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="jobq"), \
            QueueEvents(sharded.name, connection=redis_url) as events:
        assert events.wait_until_ready(WAIT)
    assert any("use ShardedQueueEvents" in r.getMessage() for r in caplog.records)
