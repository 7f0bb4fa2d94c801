"""Tests of job schedulers: every and cron, one job per tick with many
producers and workers, rescheduling on upsert, DST (pure computation with
fixed clocks), missed ticks after downtime, a killed worker, the watchdog,
collisions, limit and end, and the CLI. Real server; bounded waits."""

from __future__ import annotations

import json
import re
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis

from jobq import Job, JobqError, Queue, Scheduler
from jobq._schedulers import next_cron_slot, sync_scheduler
from jobq.calls import TakeArgs, WorkerScripts
from tests.polling import until
from tests.test_worker import WAIT, Proc, ledger_wait, make_worker, started, stream

BERLIN = ZoneInfo("Europe/Berlin")


def _slot(job_id: str) -> int:
    return int(job_id.rsplit(":", 1)[1])


def _server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


#: Stream ids are whole milliseconds of the server's clock, which the take's
#: script read as a fraction: allow for that rounding, no more.
TAKE_MS = 2


def _first_taken_ms(client: redis.Redis, queue_name: str) -> dict[str, int]:
    """When each job was first taken (its first ``active`` event), server ms:
    a tick recovered from a killed worker is taken again later, but the next
    tick was produced at its first take."""
    taken: dict[str, int] = {}
    for event in stream(client, queue_name, "active"):
        taken.setdefault(event["job_id"], round(event["ts"] * 1000))
    return taken


def _assert_every_tick_once(
    queue: Queue, client: redis.Redis, sid: str, seen: list[str], every_ms: int
) -> None:
    """Check the ticks of an ``every`` scheduler whose workers are closed: no
    tick ran twice and none was lost.

    The rule (``every_after`` in lua/_common.lua): the take of a tick produces
    the next one at the first point of the grid after the take, so a gap of
    more than one interval is allowed only when the earlier tick was taken
    late ("ticks missed while no worker ran make one job"). And the
    scheduler counts every job it produced: those seen plus the pending one.
    """
    assert len(seen) == len(set(seen)), "a tick ran twice"
    scheduler = queue.get_scheduler(sid)
    assert scheduler is not None and scheduler.next_run is not None
    pending = round(scheduler.next_run * 1000)
    pending_job = queue.get_job(f"repeat:{sid}:{pending}")
    assert pending_job is not None and pending_job.get_state() in ("waiting", "delayed")
    slots = sorted(_slot(i) for i in seen)
    assert slots and pending > slots[-1]
    assert scheduler.count == len(seen) + 1, (scheduler.count, len(seen))
    _assert_chain(sid, [*slots, pending], _first_taken_ms(client, queue.name), every_ms)


def _assert_chain(sid: str, chain: list[int], taken: dict[str, int], every_ms: int) -> None:
    """Each slot of ``chain`` is the first grid point after the take of the
    one before it (``every_after``): exactly one interval on, unless that take
    was late."""
    for a, b in zip(chain, chain[1:], strict=False):
        assert b > a and (b - a) % every_ms == 0, f"tick {b} is off the grid of {a}"
        at = taken[f"repeat:{sid}:{a}"]
        # b - every <= at < b
        assert b - every_ms - TAKE_MS <= at, f"tick(s) lost: {a} taken at {at}, next {b}"
        assert at < b + TAKE_MS, f"tick {a} taken at {at} produced {b}, which was past"


class Ledger:
    """Job ids a handler saw, in order; bounded waits for a count."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self._cond = threading.Condition()

    def __call__(self, job: Job) -> str:
        with self._cond:
            self.ids.append(job.id)
            self._cond.notify_all()
        return job.id

    def wait(self, count: int, timeout: float = WAIT) -> list[str]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.ids) >= count, timeout), self.ids
            return list(self.ids)


# -- the schedule computation (fixed clocks) ------------------------------------


def _local(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, BERLIN).isoformat()


def _run(cron: str, start: datetime, n: int) -> list[str]:
    at = round(start.timestamp() * 1000)
    out = []
    for _ in range(n):
        at = next_cron_slot(cron, "Europe/Berlin", at)
        out.append(_local(at))
    return out


def test_dst_spring_forward_in_berlin() -> None:
    start = datetime(2026, 3, 28, 12, 0, tzinfo=BERLIN)
    # 02:30 does not exist on 29 March: it runs once, at 03:00 CEST
    assert _run("30 2 * * *", start, 3) == [
        "2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00", "2026-03-31T02:30:00+02:00",
    ]
    # an hourly schedule: 01:00 CET then 03:00 CEST, one real hour apart
    assert _run("0 * * * *", datetime(2026, 3, 29, 0, 30, tzinfo=BERLIN), 3) == [
        "2026-03-29T01:00:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-29T04:00:00+02:00",
    ]
    # a daily 09:00 stays 09:00 local: 23 hours between the two
    assert _run("0 9 * * *", start, 2) == [
        "2026-03-29T09:00:00+02:00", "2026-03-30T09:00:00+02:00",
    ]
    # wildcards in the hour or minute run on the new time at once (Debian's
    # crontab(5)): no extra 03:00 for a 02:00 skipped (it came one real hour
    # before 04:00), and an hour the change skips is skipped that day
    assert _run("0 */2 * * *", datetime(2026, 3, 29, 0, 30, tzinfo=BERLIN), 2) == [
        "2026-03-29T04:00:00+02:00", "2026-03-29T06:00:00+02:00",
    ]
    assert _run("*/20 2 * * *", start, 2) == [
        "2026-03-30T02:00:00+02:00", "2026-03-30T02:20:00+02:00",
    ]


def test_dst_fall_back_in_berlin() -> None:
    start = datetime(2026, 10, 24, 12, 0, tzinfo=BERLIN)
    # 02:30 happens twice on 25 October: a fixed time runs once
    assert _run("30 2 * * *", start, 3) == [
        "2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00", "2026-10-27T02:30:00+01:00",
    ]
    # an hourly schedule runs in both 02:00 hours (each is a real hour)
    assert _run("0 * * * *", datetime(2026, 10, 25, 0, 30, tzinfo=BERLIN), 4) == [
        "2026-10-25T01:00:00+02:00", "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:00:00+01:00", "2026-10-25T03:00:00+01:00",
    ]


def test_six_field_cron_has_seconds_first() -> None:
    assert next_cron_slot("*/20 * * * * *", None, 1_000) == 20_000
    assert next_cron_slot("*/20 * * * * *", None, 20_000) == 40_000
    assert next_cron_slot("0 0 * * *", "UTC", 0) == 86_400_000
    # cron's nicknames, each its 5 fields (1970-01-01 was a Thursday)
    assert next_cron_slot("@daily", "UTC", 0) == next_cron_slot("@midnight", None, 0) == 86_400_000
    assert next_cron_slot("@hourly", None, 0) == 3_600_000
    assert next_cron_slot("@weekly", None, 0) == 3 * 86_400_000  # Sunday
    assert next_cron_slot("@monthly", None, 0) == 31 * 86_400_000
    assert next_cron_slot("@yearly", None, 0) == next_cron_slot("@annually", None, 0) \
        == 365 * 86_400_000


def test_a_cron_nickname_schedules_as_its_fields(queue: Queue) -> None:
    s = queue.upsert_scheduler("nightly", cron="@daily", tz="Europe/Berlin")
    assert s.cron == "@daily" and s.next_run is not None
    local = datetime.fromtimestamp(s.next_run, BERLIN)
    assert (local.hour, local.minute, local.second) == (0, 0, 0)
    for bad in ("@fortnightly", "@DAILY", "@daily 5"):
        with pytest.raises(ValueError, match="5- or 6-field expression, or one of @yearly"):
            queue.upsert_scheduler("bad", cron=bad)


# -- producing ticks ---------------------------------------------------------------


def test_every_makes_one_job_per_tick_with_many_producers_and_workers(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    ledger = Ledger()
    workers = [make_worker(queue.name, redis_url, ledger) for _ in range(20)]
    stop = threading.Event()
    errors: list[BaseException] = []

    def produce() -> None:
        with Queue(queue.name, connection=redis_url) as q:
            while not stop.is_set():
                try:
                    q.upsert_scheduler("tick", every=0.1, data={"v": 1})
                except BaseException as exc:
                    errors.append(exc)
                    return
                stop.wait(0.01)

    producers = [threading.Thread(target=produce, name=f"producer-{i}") for i in range(5)]
    for w in workers:
        w.start()
    try:
        for p in producers:
            p.start()
        ledger.wait(12, timeout=WAIT)
    finally:
        stop.set()
        for p in producers:
            p.join(WAIT)
        for w in workers:
            w.close()
    assert errors == []
    try:
        _assert_every_tick_once(queue, redis_client, "tick", list(ledger.ids), 100)
    finally:
        queue.remove_scheduler("tick")


def test_upsert_same_schedule_keeps_the_pending_tick_and_changed_one_replaces_it(
    queue: Queue,
) -> None:
    first = queue.upsert_scheduler("s", cron="0 0 1 1 *", data=1)
    pending = queue.get_jobs("delayed")
    assert [j.id for j in pending] == [f"repeat:s:{round(first.next_run * 1000)}"]  # type: ignore[operator]
    again = queue.upsert_scheduler("s", cron="0 0 1 1 *", data=2)
    assert again.next_run == first.next_run and again.count == 1
    assert again.data == 2
    assert [j.id for j in queue.get_jobs("delayed")] == [pending[0].id]
    changed = queue.upsert_scheduler("s", cron="0 0 2 1 *", tz="Europe/Berlin")
    assert changed.next_run != first.next_run
    assert queue.get_job(pending[0].id) is None
    delayed = queue.get_jobs("delayed")
    assert [j.id for j in delayed] == [f"repeat:s:{round(changed.next_run * 1000)}"]  # type: ignore[operator]
    assert delayed[0].name == "s"
    assert queue.remove_scheduler("s") is True
    assert queue.get_jobs("delayed") == []
    assert queue.get_scheduler("s") is None
    assert queue.remove_scheduler("s") is False


def test_upsert_same_schedule_gives_the_pending_tick_the_new_template(
    queue: Queue, redis_client: redis.Redis
) -> None:
    # yearly: a pending tick left with the old template would run a year later with it
    first = queue.upsert_scheduler("y", cron="0 0 1 1 *", data={"v": 1}, priority=5)
    tick = f"repeat:y:{round(first.next_run * 1000)}"  # type: ignore[operator]
    again = queue.upsert_scheduler("y", cron="0 0 1 1 *", name="yearly", data={"v": 2},
                                   priority=7, attempts=3)
    assert again.next_run == first.next_run and again.count == 1
    assert [j.id for j in queue.get_jobs("delayed")] == [tick]  # the same job, its slot kept
    job = queue.get_job(tick)
    assert job is not None and job.get_state() == "delayed"
    assert (job.name, job.data, job.priority, job.opts["attempts"]) == (
        "yearly", {"v": 2}, 7, 3)
    queue.upsert_scheduler("y", cron="0 0 1 1 *", data={"v": 3})  # settings back to defaults
    job = queue.get_job(tick)
    assert job is not None
    assert (job.name, job.data, job.priority, job.opts["attempts"]) == ("y", {"v": 3}, 0, 1)
    # a waiting tick too; a new priority moves it to its place in line
    now = queue.upsert_scheduler("n", cron="0 0 1 1 *", immediately=True, data="old")
    waiting = f"repeat:n:{round(now.next_run * 1000)}"  # type: ignore[operator]
    queue.upsert_scheduler("n", cron="0 0 1 1 *", immediately=True, data="new", priority=4)
    job = queue.get_job(waiting)
    assert job is not None and job.get_state() == "waiting"
    assert (job.data, job.priority) == ("new", 4)
    prioritized = f"jobq:{{{queue.name}}}:prioritized"
    assert redis_client.zscore(prioritized, waiting) is not None
    assert waiting.encode() not in redis_client.lrange(f"jobq:{{{queue.name}}}:wait", 0, -1)


def test_a_schedulers_jobs_take_the_queues_default_job_options(
    queue_name: str, redis_url: str
) -> None:
    """add, add_bulk, flows and tasks applied default_job_options, and
    upsert_scheduler did not: a queue with remove_on_complete=True kept
    every tick job, one with attempts=3 had tick jobs never retried. Its
    options, given, win; a default delay is not a tick's (each has its slot)."""
    defaults = {"attempts": 3, "backoff": 0.5, "remove_on_complete": True, "priority": 2,
                "delay": 60}
    with Queue(queue_name, connection=redis_url, default_job_options=defaults) as queue:
        made = queue.upsert_scheduler("d", cron="0 0 1 1 *", immediately=True)
        tick = queue.get_job(f"repeat:d:{round(made.next_run * 1000)}")  # type: ignore[operator]
        assert tick is not None and tick.get_state() == "waiting"  # not delayed by a minute
        assert (tick.opts["attempts"], tick.opts["remove_on_complete"], tick.priority) == (
            3, True, 2)
        assert (made.opts["attempts"], made.opts["delay"]) == (3, 0)
        own = queue.upsert_scheduler("d", cron="0 0 1 1 *", immediately=True, attempts=1,
                                     priority=0)
        tick = queue.get_job(f"repeat:d:{round(own.next_run * 1000)}")  # type: ignore[operator]
        assert tick is not None and (tick.opts["attempts"], tick.priority) == (1, 0)
        assert tick.opts["remove_on_complete"] is True
        queue.obliterate(force=True)


@pytest.mark.parametrize("how", ["drain", "clean", "clean-limit"])
def test_a_pending_tick_drained_or_cleaned_skips_that_run_as_a_removal_does(
    queue: Queue, how: str
) -> None:
    """drain(delayed=True) and clean(state="delayed") removed a scheduler's
    pending tick and made no next one: nothing was pending until a worker's
    check, and next_run named the removed run (for a nightly cron, for a
    day). As with remove and cancel, the next tick is made for the
    following slot, once the drain or clean is over."""
    made = queue.upsert_scheduler("y", cron="0 0 1 1 *")
    other = queue.add("plain", delay=3 * 366 * 86400)  # after the tick (clean's order)
    first = round(made.next_run * 1000)  # type: ignore[operator]
    if how == "drain":
        assert queue.drain(delayed=True) == 2
    else:
        removed = queue.clean(0, state="delayed", limit=1 if how == "clean-limit" else 0)
        assert f"repeat:y:{first}" in removed
    after = queue.get_scheduler("y")
    assert after is not None and after.count == 2
    following = next_cron_slot("0 0 1 1 *", "UTC", first)
    assert round(after.next_run * 1000) == following  # type: ignore[operator]
    pending = [j.id for j in queue.get_jobs("delayed")]
    assert f"repeat:y:{following}" in pending and f"repeat:y:{first}" not in pending
    assert (other.id in pending) == (how == "clean-limit")


def test_upsert_same_schedule_leaves_an_active_tick_alone(
    queue: Queue, redis_url: str
) -> None:
    taken, release = threading.Event(), threading.Event()
    held: list[str] = []

    def hold(job: Job) -> object:
        held.append(job.id)
        taken.set()
        release.wait(WAIT)
        return job.data

    with started(make_worker(queue.name, redis_url, hold)):
        queue.upsert_scheduler("a", every=3600, data="old")  # the first tick at once
        assert taken.wait(WAIT)
        active = held[0]
        try:
            s = queue.upsert_scheduler("a", every=3600, data="new")
            job = queue.get_job(active)
            assert job is not None and job.get_state() == "active" and job.data == "old"
            following = queue.get_job(f"repeat:a:{round(s.next_run * 1000)}")  # type: ignore[operator]
            assert following is not None and following.id != active
            assert following.get_state() == "delayed" and following.data == "new"
        finally:
            release.set()
        assert queue.get_job(active).wait_until_finished(timeout=WAIT) == "old"  # type: ignore[union-attr]
    queue.remove_scheduler("a")


def test_an_upsert_racing_a_remove_returns_what_it_stored(
    queue: Queue, redis_url: str
) -> None:
    """The upsert read its scheduler back in a call of its own: a remove in
    between made it raise JobqError ("removed while it was upserted") though
    it had stored the scheduler and produced a tick."""
    stop = threading.Event()

    def remove() -> None:
        with Queue(queue.name, connection=redis_url) as other:
            while not stop.is_set():
                other.remove_scheduler("deploy")

    remover = threading.Thread(target=remove, name="remover")
    remover.start()
    try:
        start = time.time() + 3600  # each first tick a delayed one, at its own time
        for i in range(100):
            made = queue.upsert_scheduler("deploy", every=60, start=start + i, name="tick",
                                          data=i)
            assert (made.id, made.every, made.data) == ("deploy", 60, i)
    finally:
        stop.set()
        remover.join(WAIT)


@pytest.mark.parametrize("collides", [False, True])
def test_an_upsert_stores_the_queues_settings_again_after_the_server_lost_them(
    queue_name: str, redis_url: str, redis_client: redis.Redis, collides: bool
) -> None:
    """A queue fed by schedulers alone (its app upserts them as it starts)
    had its settings stored on its Queue's first use only: after the server
    lost its data, the upserts left it in stream mode with the defaults,
    and unlisted, until an add. An upsert that finds the settings gone
    stores them again, and lists the queue, as an add does (its first tick
    colliding with a job too)."""
    import jobq.keys

    meta = f"jobq:{{{queue_name}}}:meta"
    known = jobq.keys.queues_key("jobq")
    with Queue(queue_name, connection=redis_url, event_mode="pubsub", max_events=500) as q:
        q.upsert_scheduler("nightly", every=3600)
        assert redis_client.sismember(known, queue_name)
        stored = redis_client.hgetall(meta)
        assert stored[b"em"] == b"pubsub" and stored[b"cfg"] == b"1"
        # as FLUSHALL leaves them (the scheduler too)
        redis_client.delete(*redis_client.keys(f"jobq:{{{queue_name}}}:*"))
        redis_client.srem(known, queue_name)
        if collides:
            start = 4_000_000_000  # epoch seconds: its first tick's slot
            with Queue(queue_name, connection=redis_url) as other:
                # a Queue of no mode stores the settings first
                other.add("x", job_id=f"repeat:nightly:{start * 1000}")
            with pytest.raises(JobqError, match="would be job"):
                q.upsert_scheduler("nightly", every=3600, start=float(start))
        else:
            q.upsert_scheduler("nightly", every=3600)
        assert redis_client.hgetall(meta) == stored
        assert redis_client.sismember(known, queue_name)


def test_scheduler_fields_and_listing(queue: Queue) -> None:
    s = queue.upsert_scheduler(
        "report", cron="0 6 * * 1", tz="Europe/Berlin", name="weekly", data={"k": 1},
        attempts=3, priority=2, limit=10, end=4_102_444_800.0,
    )
    assert isinstance(s, Scheduler)
    assert (s.id, s.cron, s.tz, s.every, s.name, s.data) == (
        "report", "0 6 * * 1", "Europe/Berlin", None, "weekly", {"k": 1},
    )
    assert s.count == 1 and s.limit == 10 and s.end == 4_102_444_800.0
    assert s.opts["attempts"] == 3
    assert s.next_run is not None
    local = datetime.fromtimestamp(s.next_run, BERLIN)
    assert (local.hour, local.minute, local.weekday()) == (6, 0, 0)
    job = queue.get_jobs("delayed")[0]
    assert job.priority == 2 and job.opts["attempts"] == 3 and job.data == {"k": 1}
    queue.upsert_scheduler("a", every=3600)
    assert [x.id for x in queue.get_schedulers()] == ["a", "report"]


def test_a_scheduler_record_with_a_field_that_is_not_a_number_is_still_listed(
    queue: Queue,
) -> None:
    """A hand-edited count or limit made get_schedulers raise ValueError."""
    queue.upsert_scheduler("a", every=3600, limit=5)
    queue.upsert_scheduler("b", every=60)
    key = queue._context.keys.scheduler("a")
    client = queue._context.redis
    assert client.exists(key)
    client.hset(key, mapping={"count": "many", "limit": "x", "end": "soon"})
    listed = {s.id: s for s in queue.get_schedulers()}
    assert set(listed) == {"a", "b"}
    assert (listed["a"].count, listed["a"].limit, listed["a"].end) == (0, None, None)
    assert listed["a"].every == 3600


def test_bad_scheduler_arguments(queue: Queue) -> None:
    for kwargs in ({}, {"every": 1, "cron": "* * * * *"}, {"every": 0}, {"cron": "* * *"},
                   {"cron": "61 * * * *"}, {"cron": "* * * * *", "tz": "Mars/Base"},
                   {"every": 1, "limit": 0}, {"every": 1, "tz": "UTC"}):
        with pytest.raises(ValueError):
            queue.upsert_scheduler("bad", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        queue.upsert_scheduler("bad", every=1, delay=3)
    # each error names what is wrong (they spoke of job_id and 200 characters,
    # refused digits alone, and of a year out of range)
    for sid, match in (("daily report", "invalid scheduler_id 'daily report': no whitespace"),
                       ("x" * 151, "at most 150 characters"), ("", "at most 150"),
                       (None, "at most 150")):
        with pytest.raises(ValueError, match=match):
            queue.upsert_scheduler(sid, every=60)  # type: ignore[arg-type]
    for kwargs, match in (({"start": 1e12}, "start must be epoch seconds within years 1"),
                          ({"end": -1e12}, "end must be epoch seconds"),
                          ({"start": 2e9, "end": 1e9}, "end .* is before start")):
        with pytest.raises(ValueError, match=match):
            queue.upsert_scheduler("bad", cron="* * * * *", **kwargs)  # type: ignore[arg-type]
    # a limit past 2**53 was stored rounded (10**30 read back as 1000...019884624838656)
    with pytest.raises(ValueError, match=r"limit must be an int from 1 to 2\*\*53 - 1"):
        queue.upsert_scheduler("bad", every=60, limit=10**30)
    assert queue.upsert_scheduler("big", every=60, limit=2**53 - 1).limit == 2**53 - 1
    assert queue.upsert_scheduler("2024", every=60).id == "2024"  # digits alone: no job id
    assert queue.upsert_scheduler("x" * 150, every=60).id == "x" * 150


def test_a_scheduler_id_to_look_up_is_a_str(queue: Queue) -> None:
    # None would name the scheduler whose id is "None" (str(None) slips in)
    queue.upsert_scheduler("None", every=60)
    for bad in (None, b"None", 7):
        for look in (queue.get_scheduler, queue.remove_scheduler):
            with pytest.raises(TypeError, match="scheduler_id must be a str"):
                look(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="invalid scheduler_id .*lone surrogates"):
            look("sched-\ud800")
    found = queue.get_scheduler("None")
    assert found is not None and found.id == "None"
    assert queue.remove_scheduler("None") and queue.get_scheduler("None") is None


def test_infinite_times_and_a_cron_that_never_matches_are_value_errors(
    queue: Queue, redis_client: redis.Redis
) -> None:
    inf = float("inf")
    for kwargs, named in (({"every": inf}, "every"), ({"every": 1, "start": inf}, "start"),
                          ({"every": 1, "end": -inf}, "end"),
                          ({"cron": "0 0 30 2 *"}, "'0 0 30 2 \\*'"),
                          ({"cron": "0 0 31 4 *", "tz": "Europe/Berlin"}, "'0 0 31 4 \\*'"),
                          # no run before the year 10000 (an OverflowError, or
                          # datetime's "year 10000 is out of range")
                          ({"cron": "0 0 1 1 *", "start": 253370764800.0}, "year 10000"),
                          ({"cron": "0 0 1 1 *", "start": 253402300799.0}, "year 10000")):
        with pytest.raises(ValueError, match=named):
            queue.upsert_scheduler("bad", **kwargs)  # type: ignore[arg-type]
    assert queue.get_scheduler("bad") is None
    assert redis_client.keys(f"jobq:{{{queue.name}}}:*") == []  # nothing written


def test_limit_caps_the_jobs(queue: Queue, redis_url: str) -> None:
    ledger = Ledger()
    with started(make_worker(queue.name, redis_url, ledger)):
        queue.upsert_scheduler("few", every=0.05, limit=3)
        ledger.wait(3)
        until(lambda: queue.get_scheduler("few").next_run is None, timeout=WAIT)  # type: ignore[union-attr]
    assert len(ledger.ids) == 3
    assert queue.get_scheduler("few").count == 3  # type: ignore[union-attr]


def test_missed_ticks_after_downtime_make_one_job(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    ledger = Ledger()
    with started(make_worker(queue.name, redis_url, ledger)):
        queue.upsert_scheduler("m", every=0.05)
        ledger.wait(1)
    # one tick ran, or more when the close came later than the next tick
    ran = len(ledger.ids)
    # no worker: the pending tick is due, then ten more intervals pass
    pending = until(lambda: queue.get_jobs("delayed") or queue.get_jobs("waiting"))
    slot = _slot(pending[0].id)
    until(lambda: _server_ms(redis_client) > slot + 500, timeout=WAIT)
    restart = _server_ms(redis_client)
    with started(make_worker(queue.name, redis_url, ledger)):
        ids = ledger.wait(ran + 2)
    queue.remove_scheduler("m")
    due, following = ids[ran], ids[ran + 1]
    assert due == pending[0].id  # the due tick runs once
    # the next tick is the first grid point after the due tick was taken
    # (whenever that was): no burst of the ticks missed while down
    taken = queue.get_job(due)
    assert taken is not None and taken.processed_on is not None
    assert restart < _slot(following)
    assert _slot(following) - 50 <= taken.processed_on * 1000 < _slot(following)
    assert (_slot(following) - slot) % 50 == 0


def test_cron_ticks_missed_while_no_worker_ran_make_one_job(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    """A 6-field cron (seconds first) every second: ~3 s with no worker miss
    two or more ticks; a worker then runs one job for the missed period (the
    pending tick), and the schedule goes on from the next second."""
    s = queue.upsert_scheduler("c", cron="* * * * * *")
    assert s.next_run is not None
    first = round(s.next_run * 1000)
    assert first % 1000 == 0
    threading.Event().wait(3.0)  # no worker runs: time passes, on purpose
    assert _server_ms(redis_client) > first + 2000  # ticks first+1000 and +2000 missed
    ledger = Ledger()
    with started(make_worker(queue.name, redis_url, ledger)):
        ledger.wait(3)
    try:
        ids = list(ledger.ids)
        slots = [_slot(i) for i in ids]
        assert ids[0] == f"repeat:c:{first}"  # the missed period: its one job
        taken_ms = _first_taken_ms(redis_client, queue.name)
        taken = taken_ms[ids[0]]
        assert slots[1] > taken - TAKE_MS, "a tick missed while down was produced"
        assert (slots[1] - first) % 1000 == 0
        scheduler = queue.get_scheduler("c")
        assert scheduler is not None and scheduler.next_run is not None
        # from then on every second: each tick the first second after the
        # take of the one before (the next second, unless that take was late)
        _assert_chain("c", [*slots[1:], round(scheduler.next_run * 1000)], taken_ms, 1000)
        assert scheduler.count == len(ids) + 1  # nothing else was produced
    finally:
        queue.remove_scheduler("c")


@pytest.mark.parametrize("schedule", [{"cron": "0 0 1 1 *"}, {"every": 600}])
def test_immediately_with_a_start_ahead_makes_the_first_tick_at_the_start(
    queue: Queue, redis_client: redis.Redis, schedule: dict[str, Any]
) -> None:
    """No tick before the schedule's start, immediately or not."""
    start = _server_ms(redis_client) / 1000 + 3600
    s = queue.upsert_scheduler("ahead", immediately=True, start=start, **schedule)
    assert s.next_run is not None and round(s.next_run * 1000) == round(start * 1000)
    tick = queue.get_job(f"repeat:ahead:{round(start * 1000)}")
    assert tick is not None and tick.get_state() == "delayed"


def test_cron_immediately_makes_the_first_tick_now(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    cron = "0 0 1 1 *"  # yearly: without immediately, the first tick is next 1 January
    before = _server_ms(redis_client)
    s = queue.upsert_scheduler("now", cron=cron, immediately=True)
    after = _server_ms(redis_client)
    assert s.next_run is not None
    first = round(s.next_run * 1000)
    assert before <= first <= after
    tick = queue.get_job(f"repeat:now:{first}")
    assert tick is not None and tick.get_state() == "waiting"
    later = queue.upsert_scheduler("later", cron=cron)
    assert later.next_run is not None
    assert round(later.next_run * 1000) == next_cron_slot(cron, None, after)
    ledger = Ledger()
    with started(make_worker(queue.name, redis_url, ledger)):
        assert ledger.wait(1) == [tick.id]
        # then the cron times: its take produced the next one
        until(lambda: queue.get_scheduler("now").next_run != s.next_run,  # type: ignore[union-attr]
              timeout=WAIT)
    following = queue.get_scheduler("now")
    assert following is not None and following.next_run is not None
    assert round(following.next_run * 1000) == next_cron_slot(cron, None, first)
    assert following.count == 2
    assert ledger.ids == [tick.id]


def test_end_stops_the_schedule(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    ledger = Ledger()
    with started(make_worker(queue.name, redis_url, ledger)):
        start = _server_ms(redis_client)
        end = start + 1000  # ticks come even if the upsert is late by half a second
        s = queue.upsert_scheduler("e", every=0.1, end=end / 1000)
        assert s.end is not None and round(s.end * 1000) == end
        until(lambda: queue.get_scheduler("e").next_run is None, timeout=WAIT)  # type: ignore[union-attr]
        # the worker goes on for three more intervals past the end: nothing comes
        until(lambda: _server_ms(redis_client) > end + 300, timeout=WAIT)
    over = queue.get_scheduler("e")
    assert over is not None and over.next_run is None
    slots = sorted(_slot(i) for i in ledger.ids)
    assert slots and start <= slots[0] and slots[-1] <= end
    assert over.count == len(slots)  # every job it made ran; none pending
    # no tick lost before the end: the chain holds, and the tick the last
    # take would have made (the first grid point after it) is past the end
    taken = _first_taken_ms(redis_client, queue.name)
    _assert_chain("e", slots, taken, 100)
    last = slots[-1]
    after_last = last + 100 * max(1, (taken[f"repeat:e:{last}"] + TAKE_MS - last) // 100 + 1)
    assert after_last > end, (slots, end)
    assert queue.get_jobs(["waiting", "delayed", "active"]) == []
    assert redis_client.zscore(f"jobq:{{{queue.name}}}:schedulers", "e") == float("inf")
    queue.remove_scheduler("e")


def test_changing_every_reschedules_the_pending_tick_one_new_interval_from_now(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    ledger = Ledger()
    with started(make_worker(queue.name, redis_url, ledger)):
        queue.upsert_scheduler("r", every=0.1)
        ledger.wait(2)
        before = _server_ms(redis_client)
        s = queue.upsert_scheduler("r", every=5)
        after = _server_ms(redis_client)
        assert s.every == 5 and s.next_run is not None
        new = round(s.next_run * 1000)
        assert before + 5000 <= new <= after + 5000  # not now: one new interval on
        ran = len(ledger.ids)
        threading.Event().wait(0.5)  # five old intervals pass, on purpose
    try:
        # at most the old tick already waiting or active at the upsert ran
        assert len(ledger.ids) <= ran + 1
        assert all(_slot(i) <= after for i in ledger.ids)
        left = {j.id for j in queue.get_jobs(["waiting", "delayed", "active"])}
        assert left == {f"repeat:r:{new}"}  # the old pending tick was replaced
        assert queue.get_jobs("delayed")[0].id == f"repeat:r:{new}"
    finally:
        queue.remove_scheduler("r")


@pytest.mark.parametrize("how", ["cancel", "cancel-no-record", "remove"])
def test_a_cancelled_or_removed_pending_tick_is_skipped(
    queue: Queue, redis_url: str, how: str
) -> None:
    """The tick does not run, even when its record is gone (a cancelled tick
    with remove_on_fail, a removed one): the schedule goes on at its next slot."""
    ledger = Ledger()
    s = queue.upsert_scheduler("w", every=0.3, start=time.time() + 0.3,
                               remove_on_fail=how == "cancel-no-record")
    tick = f"repeat:w:{round(s.next_run * 1000)}"  # type: ignore[operator]
    if how == "remove":
        assert queue.remove(tick) is True
    else:
        assert queue.cancel(tick, "skip this one") is True
        job = queue.get_job(tick)
        assert (job is None) == (how == "cancel-no-record")
    with started(make_worker(queue.name, redis_url, ledger)):
        ids = ledger.wait(2)
    queue.remove_scheduler("w")
    assert tick not in ids
    # the next ones on the grid (a later point if the machine was slow to take it)
    assert len(ids) == len(set(ids))
    gap = _slot(ids[0]) - _slot(tick)
    assert gap > 0 and gap % 300 == 0


@pytest.mark.parametrize("how", ["cancel", "remove"])
@pytest.mark.parametrize("schedule", ["every", "cron"])
def test_the_tick_after_a_cancelled_or_removed_one_is_made_at_once_for_its_slot(
    queue: Queue, how: str, schedule: str
) -> None:
    """It waited for a worker's periodic check (5 s), which made it for the
    slot after that check: with every=0.5, seven runs skipped, not one."""
    if schedule == "every":
        s = queue.upsert_scheduler("f", every=60, start=time.time() + 60)
        step = 60_000
    else:
        s = queue.upsert_scheduler("f", cron="0 0 * * *")  # midnight UTC, then the next
        step = 86_400_000
    assert s.next_run is not None
    slot = round(s.next_run * 1000)
    for _ in range(3):  # again and again: a cron tick made so knew no slot after it
        assert (queue.cancel if how == "cancel" else queue.remove)(f"repeat:f:{slot}")
        after = queue.get_scheduler("f")
        assert after is not None and after.next_run is not None
        assert round(after.next_run * 1000) == slot + step
        slot += step
        following = queue.get_job(f"repeat:f:{slot}")
        assert following is not None and following.get_state() == "delayed"
    queue.remove_scheduler("f")


def test_a_pending_tick_a_changed_schedule_replaces_does_not_count_against_the_limit(
    queue: Queue,
) -> None:
    """Two changes of `every` before the first tick ran: with limit=3, the
    scheduler ended (count 3) having run one job or none."""
    start = time.time() + 60
    for every in (60, 90, 120):
        s = queue.upsert_scheduler("lim", every=every, start=start, limit=3)
    assert s.count == 1 and s.next_run is not None
    assert queue.get_job_counts("delayed") == {"delayed": 1}
    queue.remove_scheduler("lim")


def test_a_changed_schedule_after_a_cancelled_run_starts_after_that_run(queue: Queue) -> None:
    """The upsert's first slot was the cancelled run's, whose kept record
    made it a collision: an error, and the scheduler left with no tick."""
    schedule = {"cron": "0 * * * *"}
    s = queue.upsert_scheduler("cu", start=time.time() + 3600, **schedule)
    assert s.next_run is not None
    cancelled = round(s.next_run * 1000)
    assert queue.cancel(f"repeat:cu:{cancelled}")
    changed = queue.upsert_scheduler("cu", start=time.time() + 3600, limit=10, **schedule)
    assert changed.next_run is not None and round(changed.next_run * 1000) > cancelled
    assert [j.id for j in queue.get_jobs("delayed")] == [
        f"repeat:cu:{round(changed.next_run * 1000)}"]
    queue.remove_scheduler("cu")


def test_a_changed_schedule_after_a_promoted_run_starts_after_that_run(
    queue: Queue, redis_url: str,
) -> None:
    """A nightly tick promoted ("run it now") and run: the changed
    schedule's first slot was that run's, whose kept record made it a
    collision: an error, and the scheduler left with no tick for good (an
    upsert of the same schedule then did nothing)."""
    s = queue.upsert_scheduler("nightly", cron="30 2 * * *", tz="Europe/Berlin")
    assert s.next_run is not None
    tonight = round(s.next_run * 1000)
    job = queue.get_job(f"repeat:nightly:{tonight}")
    assert job is not None
    job.promote()
    with make_worker(queue.name, redis_url, lambda j: "ran"):
        assert job.wait_until_finished(timeout=WAIT) == "ran"
    changed = queue.upsert_scheduler("nightly", cron="30 2 * * *", tz="Europe/Berlin", limit=100)
    assert changed.next_run is not None and round(changed.next_run * 1000) > tonight
    assert [j.id for j in queue.get_jobs("delayed")] == [
        f"repeat:nightly:{round(changed.next_run * 1000)}"]
    queue.remove_scheduler("nightly")


def test_a_tick_colliding_with_a_kept_job_is_a_loud_error(
    queue: Queue, caplog: pytest.LogCaptureFixture,
) -> None:
    """The scheduler stays listed, with no next run; once the job is
    removed, an upsert of the same schedule makes its first tick (it did
    nothing: no tick, and no worker's check ever made one)."""
    start = 4_102_444_800  # 2100-01-01 00:00 UTC: the first daily tick
    kept = queue.add("kept", job_id=f"repeat:c:{start * 1000}")
    with pytest.raises(JobqError, match="collides|exists"):
        queue.upsert_scheduler("c", cron="0 0 * * *", start=start)
    assert [(s.id, s.next_run) for s in queue.get_schedulers()] == [("c", None)]
    assert kept.remove()
    assert not [r for r in caplog.records if r.levelname == "WARNING"]  # no longer collides
    s = queue.upsert_scheduler("c", cron="0 0 * * *", start=start)
    assert s.next_run == start
    assert [j.id for j in queue.get_jobs("delayed")] == [f"repeat:c:{start * 1000}"]
    queue.remove_scheduler("c")


def _second_tick_failed_into_backoff(queue: Queue) -> str:
    """Scheduler "c" (every second, 60 s backoff): its first two ticks taken,
    the second failed at once into its backoff, no workers' check run: the
    scheduler still names that tick as its next. Returns its id."""
    queue.upsert_scheduler("c", cron="* * * * * *", attempts=3, backoff=60.0)
    scripts = WorkerScripts(queue._context.run)
    until(lambda: scripts.take(TakeArgs("t1", 30_000, "w", 0, 0)).taken, timeout=WAIT)
    second = until(lambda: scripts.take(TakeArgs("t2", 30_000, "w", 0, 0)).taken,
                   timeout=WAIT)
    scripts.fail(second[0], "t2", "boom", b"\x90", 60_000, None)
    return str(second[0])


def test_a_cron_tick_failed_into_backoff_before_the_check_holds_no_run_back(
    queue: Queue,
) -> None:
    # the take of a tick whose slot after is known makes the next; that
    # one's slot after is the workers' check's to compute, so its take makes
    # none, and the check (woken by the take) makes it. A handler that fails
    # at once, into a backoff, may end the attempt before the check runs:
    # the tick is delayed again, but taken, and the next run is due still
    tick = _second_tick_failed_into_backoff(queue)
    assert queue.get_job_state(tick) == "delayed"
    sync_scheduler(queue._context, "c")
    pending = sorted((j.id for j in queue.get_jobs(["waiting", "delayed"])), key=_slot)
    assert len(pending) == 2 and pending[0] == tick, pending
    assert pending[1].startswith("repeat:c:") and _slot(pending[1]) > _slot(tick)
    queue.remove_scheduler("c")


@pytest.mark.parametrize("how", ["remove", "change"])
def test_a_taken_tick_waiting_for_its_retry_outlives_its_schedule(
    queue: Queue, how: str
) -> None:
    # a run under way, not the pending tick: removing or changing the
    # schedule leaves it to its retries, even while the scheduler still
    # names it (its next tick not made yet)
    tick = _second_tick_failed_into_backoff(queue)
    scheduler = queue.get_scheduler("c")
    assert scheduler is not None and scheduler.next_run == _slot(tick) / 1000
    if how == "remove":
        assert queue.remove_scheduler("c")
    else:
        queue.upsert_scheduler("c", cron="*/2 * * * * *", attempts=3, backoff=60.0)
    job = queue.get_job(tick)
    assert job is not None and job.get_state() == "delayed" and job.attempts_made == 1
    queue.remove_scheduler("c")


def test_cron_with_a_worker(queue: Queue, redis_url: str, redis_client: redis.Redis) -> None:
    ledger = Ledger()
    with started(make_worker(queue.name, redis_url, ledger)):
        queue.upsert_scheduler("c", cron="* * * * * *")
        ids = ledger.wait(2, timeout=WAIT)
    queue.remove_scheduler("c")
    # the second after the first tick's take: the next one, unless that take was late
    _assert_chain("c", [_slot(i) for i in ids[:2]], _first_taken_ms(redis_client, queue.name),
                  1000)


def test_a_killed_worker_loses_and_doubles_no_tick(
    queue: Queue, redis_url: str, redis_client: redis.Redis, tmp_path: Path
) -> None:
    queue.upsert_scheduler("k", every=0.2)
    proc = Proc(redis_url, queue.name, "block", tmp_path / "child.log")
    ledger = Ledger()
    try:
        entry = ledger_wait(redis_client, queue.name, "start|", proc)
        held = entry.split("|")[1]
        proc.popen.kill()
        proc.popen.wait(WAIT)
        with started(make_worker(queue.name, redis_url, ledger)):
            until(lambda: held in ledger.ids and len(ledger.ids) >= 5, timeout=WAIT)
        # the tick the killed worker held was recovered and ran; the schedule
        # went on, no tick lost or doubled (the held one's first take counts)
        _assert_every_tick_once(queue, redis_client, "k", list(ledger.ids), 200)
    finally:
        proc.stop()
        queue.remove_scheduler("k")
    assert held in ledger.ids


def test_cli_schedulers(queue: Queue, redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from jobq.cli import main

    queue.upsert_scheduler("nightly", cron="0 3 * * *", tz="Europe/Berlin")
    assert main(["--url", redis_url, "schedulers", queue.name]) == 0
    out = capsys.readouterr().out
    assert "nightly" in out and "0 3 * * *" in out and "Europe/Berlin" in out
    # the next run in the cron's zone, with its offset (the host's local
    # time without one read as Berlin's)
    assert re.search(r"next \d{4}-\d\d-\d\d 03:00:00\+0[12]:00\t", out), out
    # --json, as `info` and `job` have (it did not exist)
    assert main(["--url", redis_url, "schedulers", queue.name, "--json"]) == 0
    [listed] = json.loads(capsys.readouterr().out)
    stored = queue.get_scheduler("nightly")
    assert stored is not None
    assert listed["id"] == "nightly" and listed["cron"] == "0 3 * * *"
    assert listed["next_run"] == stored.next_run and listed["tz"] == "Europe/Berlin"
    # --json with --remove printed text where a script expected JSON: refused
    with pytest.raises(SystemExit) as refused:  # argparse's usage error
        main(["--url", redis_url, "schedulers", queue.name, "--json", "--remove", "nightly"])
    assert refused.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
    assert queue.get_scheduler("nightly") is not None
    assert main(["--url", redis_url, "schedulers", queue.name, "--remove", "nightly"]) == 0
    assert queue.get_scheduler("nightly") is None
    assert main(["--url", redis_url, "schedulers", queue.name, "--remove", "nightly"]) == 1
    capsys.readouterr()
    assert main(["--url", redis_url, "schedulers", queue.name]) == 0  # none: said so
    assert capsys.readouterr() == ("", f"no schedulers in queue {queue.name!r}\n")
