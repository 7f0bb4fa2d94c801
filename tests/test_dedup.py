"""Tests of deduplication and debounce: add(..., dedup=...), in add_bulk too,
the deduplicated event, get_dedup_job_id / remove_dedup_key, and when a key
is released. Real server; bounded waits."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from jobq import Job, JobFailedError, JobNotFoundError, Queue
from tests.polling import until
from tests.test_worker import WAIT, make_worker, started, stream


def test_fifty_threads_adding_one_key_create_one_job(
    queue: Queue, redis_client: redis.Redis
) -> None:
    barrier = threading.Barrier(50)

    def add(n: int) -> str:
        barrier.wait(WAIT)
        return queue.add("d", {"n": n}, dedup={"id": "k"}).id

    with ThreadPoolExecutor(50) as pool:
        ids = list(pool.map(add, range(50)))
    assert len(set(ids)) == 1
    assert queue.get_job_counts("waiting") == {"waiting": 1}
    assert queue.get_dedup_job_id("k") == ids[0]
    dedups = stream(redis_client, queue.name, "deduplicated")
    assert len(dedups) == 49
    assert {e["fields"]["existing_job_id"].decode() for e in dedups} == {ids[0]}
    assert {e["fields"]["dedup_id"] for e in dedups} == {b"k"}


def test_deduplicated_add_returns_the_existing_job(queue: Queue) -> None:
    first = queue.add("d", {"v": 1}, dedup={"id": "k"})
    second = queue.add("d", {"v": 2}, dedup={"id": "k"})
    assert second.id == first.id
    assert second.data == {"v": 1}
    assert first.refresh().opts["dedup"] == {
        "id": "k", "ttl": None, "extend": False, "replace": False,
    }


def test_a_dedup_key_to_look_up_is_a_str(queue: Queue) -> None:
    # None would name the dedup key "None" (str(None) slips in)
    job = queue.add("x", 1, dedup={"id": "None"})
    for bad in (None, b"None", 7):
        for look in (queue.get_dedup_job_id, queue.remove_dedup_key):
            with pytest.raises(TypeError, match="dedup key must be a str"):
                look(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="invalid dedup key .*lone surrogates"):
            look("key-\udfff")
    assert queue.get_dedup_job_id("None") == job.id
    assert queue.remove_dedup_key("None") and queue.get_dedup_job_id("None") is None


@pytest.mark.parametrize(("dedup", "message"), [
    ({"id": ""}, "dedup id must be a non-empty str"),
    ({"key": "k"}, "unknown dedup keys"),
    ({"id": "k", "ttl": 0}, "dedup ttl"),
    ({"id": "k", "ttl": 5, "replace": 1}, "dedup replace must be a bool"),
    # extend restarts a ttl; with none it did nothing, silently
    ({"id": "k", "extend": True}, "dedup extend restarts a ttl"),
])
def test_a_bad_dedup_is_refused_before_anything_is_written(
    queue: Queue, dedup: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        queue.add("x", 1, dedup=dedup)
    with pytest.raises(ValueError, match=message):
        queue.add_bulk([{"name": "x", "dedup": dedup}])
    assert queue.get_job_counts() == dict.fromkeys(queue.get_job_counts(), 0)


def test_obliterate_lets_go_of_throttle_keys_whose_job_retention_removed(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    """A throttle key outlives its job (retention removed it); obliterate
    deleted only the keys of the jobs it found, so for the rest of the ttl
    an add with the key wrote nothing, and returned a job that was gone."""
    gone = queue.add("t", 1, dedup={"id": "thr", "ttl": 600}, remove_on_complete=True)
    with started(make_worker(queue.name, redis_url, lambda j: j.data)):
        assert gone.wait_until_finished(timeout=WAIT) == 1
    assert queue.get_job(gone.id) is None and queue.get_dedup_job_id("thr") == gone.id
    queue.obliterate()
    assert queue.get_dedup_job_id("thr") is None
    again = queue.add("t", 2, dedup={"id": "thr", "ttl": 600})
    assert again.id != gone.id and queue.count() == 1
    # one an add made since (its job exists) stays, at the next obliterate too
    queue._drop_kept_outcomes()  # (as obliterate's last step does)
    assert queue.get_dedup_job_id("thr") == again.id


def test_add_bulk_deduplicates(queue: Queue) -> None:
    jobs = queue.add_bulk([
        {"name": "a", "data": 1, "dedup": {"id": "x"}},
        {"name": "a", "data": 2, "dedup": {"id": "x"}},
        {"name": "a", "data": 3, "dedup": {"id": "y"}},
        {"name": "a", "data": 4},
    ])
    assert jobs[0].id == jobs[1].id != jobs[2].id
    assert [j.data for j in jobs] == [1, 1, 3, 4]
    assert queue.get_job_counts("waiting") == {"waiting": 3}


@pytest.mark.parametrize("ending", ["complete", "fail"])
def test_simple_key_is_released_when_the_job_finishes(
    queue: Queue, redis_url: str, ending: str
) -> None:
    def processor(job: Job) -> str:
        if ending == "fail":
            raise RuntimeError("no")
        return "ok"

    job = queue.add("d", dedup={"id": "k"})
    with started(make_worker(queue.name, redis_url, processor)):
        if ending == "fail":
            with pytest.raises(Exception, match="no"):
                job.wait_until_finished(timeout=WAIT)
        else:
            assert job.wait_until_finished(timeout=WAIT) == "ok"
    assert queue.get_dedup_job_id("k") is None
    again = queue.add("d", dedup={"id": "k"})
    assert again.id != job.id


def test_adds_while_the_job_runs_are_deduplicated(queue: Queue, redis_url: str) -> None:
    running, release = threading.Event(), threading.Event()

    def processor(job: Job) -> None:
        running.set()
        assert release.wait(WAIT)

    job = queue.add("d", dedup={"id": "k"})
    with started(make_worker(queue.name, redis_url, processor)):
        try:
            assert running.wait(WAIT)
            assert queue.add("d", dedup={"id": "k"}).id == job.id
        finally:
            release.set()
        job.wait_until_finished(timeout=WAIT)


@pytest.mark.parametrize("mode", [{"id": "k"}, {"id": "t", "ttl": 60}])
def test_cancelling_a_running_job_releases_its_key_at_once(
    queue: Queue, redis_url: str, mode: dict[str, object]
) -> None:
    # the cancelled run may go on for a while: an add after the cancel is new work
    running, release = threading.Event(), threading.Event()

    def processor(job: Job) -> object:
        running.set()
        assert release.wait(WAIT)
        return job.data

    first = queue.add("d", 1, dedup=mode)
    with started(make_worker(queue.name, redis_url, processor)):
        try:
            assert running.wait(WAIT)
            assert queue.cancel(first.id) is True
            assert queue.get_dedup_job_id(str(mode["id"])) is None
            second = queue.add("d", 2, dedup=mode)
            assert second.id != first.id
        finally:
            release.set()
        assert second.wait_until_finished(timeout=WAIT) == 2
        # the cancelled run's end leaves the new owner's key alone
        assert queue.get_dedup_job_id(str(mode["id"])) == (second.id if "ttl" in mode else None)


@pytest.mark.parametrize(
    "how", ["remove", "cancel", "remove_dedup_key", "drain", "clean", "obliterate"]
)
def test_key_is_released_by_every_removal(
    queue: Queue, redis_client: redis.Redis, how: str
) -> None:
    """Whatever removes a job releases its key, whatever its mode: no key is
    left behind (it would outlive the queue, and a later job reusing the id
    would inherit it)."""
    for mode in ({"id": "k"}, {"id": "t", "ttl": 60}):
        job = queue.add("d", delay=60, dedup=mode, job_id=f"owner-{mode['id']}")
        if how == "remove":
            assert queue.remove(job.id) is True
        elif how == "cancel":
            assert queue.cancel(job.id) is True
        elif how == "remove_dedup_key":
            assert queue.remove_dedup_key(mode["id"]) is True
        elif how == "drain":
            queue.drain(delayed=True)
        elif how == "clean":
            assert queue.clean(0, state="delayed") == [job.id]
        else:
            queue.obliterate(force=True)
        assert queue.get_dedup_job_id(mode["id"]) is None
        if how != "cancel":  # a cancelled job stays, failed
            assert not redis_client.exists(f"jobq:{{{queue.name}}}:dedup:{mode['id']}")
            # an unrelated job reusing the id does not hold the key
            assert queue.add("d", job_id=job.id).id == job.id
        assert queue.add("d", dedup=mode).id != job.id


def test_removing_an_old_job_keeps_a_newer_owners_key(queue: Queue) -> None:
    old = queue.add("d", dedup={"id": "k"})
    assert queue.remove_dedup_key("k") is True
    new = queue.add("d", dedup={"id": "k"})
    assert queue.remove(old.id) is True
    assert queue.get_dedup_job_id("k") == new.id


def test_throttle_holds_for_the_ttl_even_after_the_job_finished(
    queue: Queue, redis_url: str
) -> None:
    """A throttle key outlives its job, completed or failed, for the whole
    ttl (simple mode would release it at the end), then goes."""
    ttl = 3.0

    def processor(job: Job) -> str:
        if job.name == "fail":
            raise RuntimeError("no")
        return "ok"

    with started(make_worker(queue.name, redis_url, processor)):
        added = time.monotonic()  # before the keys' ttl starts
        done = queue.add("ok", dedup={"id": "done", "ttl": ttl})
        failed = queue.add("fail", dedup={"id": "failed", "ttl": ttl})
        assert done.wait_until_finished(timeout=WAIT) == "ok"
        with pytest.raises(JobFailedError, match="no"):
            failed.wait_until_finished(timeout=WAIT)
        # both finished: the keys still hold, whoever asks
        held = [(queue.get_dedup_job_id(key),
                 queue.add(job.name, dedup={"id": key, "ttl": ttl}).id)
                for key, job in (("done", done), ("failed", failed))]
        checked = time.monotonic() - added
    # the server's cached clock may lag by its idle wait before the add: a
    # ttl counted from there ends up to that much early
    slack = 0.2
    if checked >= ttl - slack:  # the checks may have come after the keys' end: they prove nothing
        pytest.skip(f"too slow to check inside the {ttl} s ttl ({checked:.1f} s)")
    assert held == [(done.id, done.id), (failed.id, failed.id)]
    until(lambda: queue.get_dedup_job_id("done") is None, timeout=WAIT)
    until(lambda: queue.get_dedup_job_id("failed") is None, timeout=WAIT)
    assert time.monotonic() - added >= ttl - slack  # not before the ttl
    assert queue.add("ok", dedup={"id": "done", "ttl": ttl}).id != done.id
    assert queue.add("fail", dedup={"id": "failed", "ttl": ttl}).id != failed.id


def test_a_throttled_add_whose_job_retention_removed_is_ignored(
    queue: Queue, redis_url: str
) -> None:
    """A throttle key outlives its job's record when retention removes the
    job: each add with the key raised JobqError ("removed while it was
    added again"), after three adds that each emitted `deduplicated`, and
    in a bulk after the other jobs were written. The add is ignored, and
    the Job returned is the removed one."""
    with started(make_worker(queue.name, redis_url, lambda job: "ok")):
        first = queue.add("x", dedup={"id": "t", "ttl": 60}, remove_on_complete=True)
        assert first.wait_until_finished(timeout=WAIT) == "ok"
    until(lambda: queue.get_job(first.id) is None, timeout=WAIT)
    again = queue.add("x", {"v": 2}, dedup={"id": "t", "ttl": 60})
    assert (again.id, again.name, again.data) == (first.id, "x", None)
    assert again.get_state() == "unknown"
    with pytest.raises(JobNotFoundError):
        again.wait_until_finished(timeout=WAIT)
    other, throttled = queue.add_bulk([
        {"name": "other", "job_id": "other-1"},
        {"name": "x", "data": 3, "dedup": {"id": "t", "ttl": 60}},
    ])
    assert (other.id, throttled.id) == ("other-1", first.id)
    assert queue.get_job_counts("waiting") == {"waiting": 1}
    assert queue.get_dedup_job_id("t") == first.id


def test_throttle_extend_restarts_the_ttl(queue: Queue, redis_client: redis.Redis) -> None:
    job = queue.add("d", dedup={"id": "t", "ttl": 30})
    key = f"jobq:{{{queue.name}}}:dedup:t"
    redis_client.pexpire(key, 10_000)  # as if 20 s had passed (a slow step stays inside it)
    assert queue.add("d", dedup={"id": "t", "ttl": 30}).id == job.id
    assert redis_client.pttl(key) <= 10_000  # no extend: the window is not moved
    assert queue.add("d", dedup={"id": "t", "ttl": 30, "extend": True}).id == job.id
    assert redis_client.pttl(key) > 20_000


def test_replace_restarts_the_ttl_only_when_it_replaces(
    queue: Queue, redis_client: redis.Redis,
) -> None:
    """`replace` without `extend` restarted the window on every ignored
    add, a job that could not be replaced (waiting, or finished) too, so
    later adds were dropped for as long as they kept coming."""
    key = f"jobq:{{{queue.name}}}:dedup:t"
    mode = {"id": "t", "ttl": 30, "replace": True}
    job = queue.add("d", 1, dedup=mode)  # waiting: not replaceable
    redis_client.pexpire(key, 10_000)
    assert queue.add("d", 2, delay=5, dedup=mode).id == job.id
    assert redis_client.pttl(key) <= 10_000
    assert job.remove()
    delayed = queue.add("d", 3, delay=5, dedup=mode)
    redis_client.pexpire(key, 10_000)
    replaced = queue.add("d", 4, delay=5, dedup=mode)
    assert replaced.id == delayed.id and replaced.data == 4
    assert redis_client.pttl(key) > 20_000  # the key's job is new: its window too


def test_debounce_keeps_only_the_last_data(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    mode = {"id": "deb", "ttl": 30, "extend": True, "replace": True}
    first = queue.add("d", {"v": 0}, delay=30, dedup=mode)
    for v in range(1, 6):
        job = queue.add("d", {"v": v}, delay=0.2 + v * 0.01, dedup=mode, attempts=2)
        assert job.id == first.id
        assert job.data == {"v": v}
    assert queue.get_job_counts("delayed") == {"delayed": 1}
    assert queue.get_job(first.id).opts["attempts"] == 2  # type: ignore[union-attr]
    seen: list[object] = []
    with started(make_worker(queue.name, redis_url, lambda j: seen.append(j.data))):
        first.wait_until_finished(timeout=WAIT)
    assert seen == [{"v": 5}]
    delayed = stream(redis_client, queue.name, "delayed", first.id)
    assert len(delayed) == 6  # the add, then each debounce restarted the delay


def test_debounce_never_touches_an_active_job(queue: Queue, redis_url: str) -> None:
    running, release = threading.Event(), threading.Event()
    mode = {"id": "deb", "replace": True}

    def processor(job: Job) -> object:
        running.set()
        assert release.wait(WAIT)
        return job.data

    job = queue.add("d", {"v": 1}, delay=0.01, dedup=mode)
    with started(make_worker(queue.name, redis_url, processor)):
        try:
            assert running.wait(WAIT)
            later = queue.add("d", {"v": 2}, delay=0.01, dedup=mode)
            assert later.id == job.id
            assert later.data == {"v": 1}
        finally:
            release.set()
        assert job.wait_until_finished(timeout=WAIT) == {"v": 1}


def test_debounce_never_touches_a_job_delayed_for_a_retry(queue: Queue, redis_url: str) -> None:
    """A job waiting out its backoff has been active: a debounce is
    deduplicated, as for an active job, and does not put its data under
    the attempts already made."""
    mode = {"id": "deb", "replace": True}

    def processor(job: Job) -> object:
        raise ValueError(f"fails: {job.data}")

    job = queue.add("d", "old", delay=0.01, dedup=mode, attempts=3, backoff=60)
    with started(make_worker(queue.name, redis_url, processor)):
        assert until(lambda: job.refresh().attempts_made == 1
                     and job.get_state() == "delayed", timeout=WAIT)
    later = queue.add("d", "new", delay=0.01, dedup=mode, attempts=2)
    assert later.id == job.id and later.data == "old"
    stored = queue.get_job(job.id)
    assert stored is not None
    assert stored.data == "old" and stored.opts["attempts"] == 3 and stored.attempts_made == 1


def test_bad_dedup_options(queue: Queue) -> None:
    for bad in ({"ttl": 1}, {"id": ""}, {"id": "k", "ttl": 0}, {"id": "k", "extend": 1},
                {"id": "k", "other": 1}, "k"):
        with pytest.raises(ValueError):
            queue.add("d", dedup=bad)
