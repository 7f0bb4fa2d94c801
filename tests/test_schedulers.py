"""Tests of job schedulers: every and cron, one job per tick with many
producers and workers, rescheduling on upsert, DST (pure computation with
fixed clocks), missed ticks after downtime, a killed worker, the watchdog,
collisions, limit and end, and the CLI. Real server; bounded waits."""

from __future__ import annotations

import threading
import time
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
import redis

from jobq import Job, JobqError, Queue, Scheduler
from jobq._schedulers import next_cron_slot
from tests.polling import until
from tests.test_worker import WAIT, Proc, ledger_wait, make_worker, started

BERLIN = ZoneInfo("Europe/Berlin")


def _slot(job_id: str) -> int:
    return int(job_id.rsplit(":", 1)[1])


def _server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


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


# -- producing ticks ---------------------------------------------------------------


def test_every_makes_one_job_per_tick_with_many_producers_and_workers(
    queue: Queue, redis_url: str
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
        ids = ledger.wait(12, timeout=WAIT)
    finally:
        stop.set()
        for p in producers:
            p.join(WAIT)
        queue.remove_scheduler("tick")
        for w in workers:
            w.close()
    assert errors == []
    ids = list(ledger.ids)
    assert len(ids) == len(set(ids)), "a tick ran twice"
    slots = sorted(_slot(i) for i in ids)
    gaps = {b - a for a, b in zip(slots, slots[1:], strict=False)}
    assert all(gap % 100 == 0 and gap > 0 for gap in gaps), gaps
    scheduler_jobs = [j for j in queue.get_jobs(["completed", "waiting", "active"])
                      if j.id.startswith("repeat:tick:")]
    assert len(scheduler_jobs) == len({j.id for j in scheduler_jobs})


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


def test_bad_scheduler_arguments(queue: Queue) -> None:
    for kwargs in ({}, {"every": 1, "cron": "* * * * *"}, {"every": 0}, {"cron": "* * *"},
                   {"cron": "61 * * * *"}, {"cron": "* * * * *", "tz": "Mars/Base"},
                   {"every": 1, "limit": 0}, {"every": 1, "tz": "UTC"}):
        with pytest.raises(ValueError):
            queue.upsert_scheduler("bad", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        queue.upsert_scheduler("bad", every=1, delay=3)


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
    # no worker: the pending tick is due, then ten more intervals pass
    pending = until(lambda: queue.get_jobs("delayed") or queue.get_jobs("waiting"))
    slot = _slot(pending[0].id)
    until(lambda: _server_ms(redis_client) > slot + 500, timeout=WAIT)
    restart = _server_ms(redis_client)
    with started(make_worker(queue.name, redis_url, ledger)):
        ids = ledger.wait(3)
    queue.remove_scheduler("m")
    assert ids[1] == pending[0].id  # the due tick runs once
    # the next tick is the first grid point after the due tick was taken
    # (whenever that was): no burst of the ticks missed while down
    taken = queue.get_job(ids[1])
    assert taken is not None and taken.processed_on is not None
    assert restart < _slot(ids[2])
    assert _slot(ids[2]) - 50 <= taken.processed_on * 1000 < _slot(ids[2])
    assert (_slot(ids[2]) - slot) % 50 == 0


def test_a_removed_pending_tick_is_recreated_by_the_workers_check(
    queue: Queue, redis_url: str
) -> None:
    ledger = Ledger()
    s = queue.upsert_scheduler("w", every=0.3, start=time.time() + 0.3)
    tick = f"repeat:w:{round(s.next_run * 1000)}"  # type: ignore[operator]
    assert queue.remove(tick) is True
    with started(make_worker(queue.name, redis_url, ledger)):
        ids = ledger.wait(2)
    queue.remove_scheduler("w")
    assert ids[0] == tick  # the same tick, produced again when due
    # the next one on the grid (a later point if the machine was slow to take it)
    gap = _slot(ids[1]) - _slot(ids[0])
    assert gap > 0 and gap % 300 == 0


def test_a_tick_colliding_with_a_kept_job_is_a_loud_error(queue: Queue) -> None:
    start = 4_102_444_800  # 2100-01-01 00:00 UTC: the first daily tick
    queue.add("kept", job_id=f"repeat:c:{start * 1000}")
    with pytest.raises(JobqError, match="collides|exists"):
        queue.upsert_scheduler("c", cron="0 0 * * *", start=start)


def test_cron_with_a_worker(queue: Queue, redis_url: str) -> None:
    ledger = Ledger()
    with started(make_worker(queue.name, redis_url, ledger)):
        queue.upsert_scheduler("c", cron="* * * * * *")
        ids = ledger.wait(2, timeout=WAIT)
    queue.remove_scheduler("c")
    assert _slot(ids[1]) - _slot(ids[0]) == 1000


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
    finally:
        proc.stop()
        queue.remove_scheduler("k")
    ids = ledger.ids
    assert len(ids) == len(set(ids))
    # the tick the killed worker held was recovered and ran; the schedule went on
    assert held in ids
    slots = sorted(_slot(i) for i in ids)
    assert all((b - a) % 200 == 0 and b > a for a, b in zip(slots, slots[1:], strict=False))


def test_cli_schedulers(queue: Queue, redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from jobq.cli import main

    queue.upsert_scheduler("nightly", cron="0 3 * * *", tz="Europe/Berlin")
    assert main(["--url", redis_url, "schedulers", queue.name]) == 0
    out = capsys.readouterr().out
    assert "nightly" in out and "0 3 * * *" in out and "Europe/Berlin" in out
    assert main(["--url", redis_url, "schedulers", queue.name, "--remove", "nightly"]) == 0
    assert queue.get_scheduler("nightly") is None
    assert main(["--url", redis_url, "schedulers", queue.name, "--remove", "nightly"]) == 1
