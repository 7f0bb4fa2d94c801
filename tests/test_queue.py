"""Tests of Queue: adding jobs, reading them, ordering, and administering the queue.

Every test runs against the session's real server, on a queue of its own.
Waits are bounded ``threading.Event`` waits or ``wait_until_finished``.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

import jobq
from jobq import (
    ClosedError,
    Job,
    JobqError,
    PayloadTooLarge,
    Queue,
    QueueEvents,
    SerializationError,
    ShardedQueue,
    Worker,
)
from tests.polling import until
from tests.streams import stream_events

WAIT = 5.0  # seconds: the bound of every wait for something that should happen
QUIET = 0.3  # seconds: how long something that should not happen is watched for
STATES = ("waiting", "delayed", "active", "completed", "failed", "waiting-children")


# -- helpers ---------------------------------------------------------------


def queue_keys(client: redis.Redis, queue_name: str) -> list[bytes]:
    """Every key of the queue (default prefix)."""
    return sorted(client.keys(f"jobq:{{{queue_name}}}:*"))


#: What obliterate keeps: the settings, the generated-id counter, and the
#: event stream (emptied but for its `obliterated` event).
KEPT_BY_OBLITERATE = ("meta", "id", "events")


def kept_keys(client: redis.Redis, queue_name: str) -> list[bytes]:
    """The queue's keys that are not among those obliterate keeps."""
    kept = {f"jobq:{{{queue_name}}}:{k}".encode() for k in KEPT_BY_OBLITERATE}
    return [k for k in queue_keys(client, queue_name) if k not in kept]


def stream(client: redis.Redis, queue_name: str, job_id: str | None = None) -> list[tuple]:
    """The queue's event stream as (name, job id, fields) tuples, oldest first."""
    return [e for e in stream_events(client, queue_name) if job_id is None or e[1] == job_id]


def names(events: list[tuple]) -> list[str]:
    return [e[0] for e in events]


def worker(queue_name: str, redis_url: str, processor: Callable[[Any], Any], **kw: Any) -> Worker:
    """A Worker with a short idle block, so that close() is quick."""
    kw.setdefault("drain_delay", 0.1)
    return Worker(queue_name, processor, connection=redis_url, **kw)


def run_order(
    queue_name: str, redis_url: str, expected: int,
    handler: Callable[[jobq.Job], None] = lambda job: None,
) -> list[str]:
    """Run the queue's jobs in one worker of concurrency 1, through
    ``handler``; return their names in run order (of each attempt)."""
    seen: list[str] = []
    done = threading.Event()

    def processor(job: jobq.Job) -> None:
        seen.append(job.name)
        if len(seen) >= expected:
            done.set()
        handler(job)

    with worker(queue_name, redis_url, processor, concurrency=1):
        assert done.wait(WAIT), f"only ran {seen}"
    return seen


def run_all(queue: Queue, redis_url: str, processor: Callable[[Any], Any], jobs: list) -> None:
    """Run ``processor`` over the queue until every job of ``jobs`` is finished."""
    with worker(queue.name, redis_url, processor):
        for job in jobs:
            try:
                job.wait_until_finished(timeout=WAIT)
            except (jobq.JobFailedError, jobq.JobNotFoundError):
                pass


def fail(job: jobq.Job) -> None:
    raise RuntimeError(f"boom {job.name}")


# -- add -------------------------------------------------------------------


def test_add_returns_job_with_its_fields(queue: Queue) -> None:
    before = time.time()
    job = queue.add("email", {"to": "a@example.com", "n": [1, 2.5, None, True]})
    assert isinstance(job, jobq.Job)
    assert isinstance(job.id, str) and job.id
    assert job.name == "email"
    assert job.data == {"to": "a@example.com", "n": [1, 2.5, None, True]}
    assert job.opts["attempts"] == 1
    assert job.opts["delay"] == 0
    assert job.opts["priority"] == 0
    assert isinstance(job.timestamp, float)
    assert before - 2 <= job.timestamp <= time.time() + 2
    assert job.attempts_made == 0
    assert job.get_state() == "waiting"

    stored = queue.get_job(job.id)
    assert stored is not None
    assert stored.id == job.id
    assert stored.name == job.name
    assert stored.data == job.data
    assert stored.opts == job.opts
    assert stored.timestamp == job.timestamp


def test_a_job_record_keeps_redis_compact_hash_encoding(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """Only options that differ from the defaults are stored: the full map
    (96 bytes) made every job's hash a hash table, 4x the memory."""
    plain = queue.add("x", 1)
    tuned = queue.add_bulk([{"name": "x", "data": 2, "attempts": 3, "backoff": 2.0,
                             "timeout": 5.0}])[0]
    key = f"jobq:{{{queue.name}}}:job:{plain.id}"
    assert redis_client.object("encoding", key) in (b"listpack", b"ziplist")
    defaults = jobq.options.JobOptions().to_plain()
    assert queue.get_job(plain.id).opts == defaults == plain.opts
    expected = jobq.options.JobOptions.parse({"attempts": 3, "backoff": 2.0, "timeout": 5.0})
    assert queue.get_job(tuned.id).opts == expected.to_plain() == tuned.opts


def test_add_with_no_data_stores_none(queue: Queue) -> None:
    job = queue.add("nothing")
    assert job.data is None
    stored = queue.get_job(job.id)
    assert stored is not None and stored.data is None


def test_generated_ids_increase(queue: Queue) -> None:
    ids = [queue.add("n", i).id for i in range(5)]
    assert len(set(ids)) == 5
    numbers = [int(i) for i in ids]
    assert numbers == sorted(numbers)


def test_custom_job_id_is_idempotent(queue: Queue, redis_client: redis.Redis) -> None:
    first = queue.add("order", {"v": 1}, job_id="order-1")
    assert first.id == "order-1"
    second = queue.add("order", {"v": 2}, job_id="order-1", delay=5)
    assert second.id == "order-1"
    assert second.data == {"v": 1}
    assert queue.get_job_state("order-1") == "waiting"
    stored = queue.get_job("order-1")
    assert stored is not None and stored.data == {"v": 1}
    assert queue.get_job_counts("waiting", "delayed") == {"waiting": 1, "delayed": 0}
    events = names(stream(redis_client, queue.name, "order-1"))
    assert events.count("added") == 1
    assert events[-1] == "duplicated"


@pytest.mark.parametrize(
    "job_id", ["", " ", "a b", "tab\there", "new\nline", "123", "0", 123, 1.5, b"bytes", ["x"],
               "x" * 201],
)
def test_invalid_job_id_raises_before_writing(
    queue: Queue, redis_client: redis.Redis, job_id: Any
) -> None:
    with pytest.raises(ValueError):
        queue.add("n", 1, job_id=job_id)
    assert queue_keys(redis_client, queue.name) == []


@pytest.mark.parametrize(
    "data",
    [object(), {1, 2}, {1: "a"}, {"nested": {2: "b"}}, 2**64, -(2**64),
     datetime.datetime.now(), [datetime.date.today()], {"f": len}],
    ids=["object", "set", "int-key", "nested-int-key", "2**64", "-2**64", "datetime", "date",
         "function"],
)
def test_unencodable_data_raises_before_writing(
    queue: Queue, redis_client: redis.Redis, data: Any
) -> None:
    with pytest.raises(SerializationError):
        queue.add("n", data)
    assert queue_keys(redis_client, queue.name) == []


def test_serialization_error_is_a_jobq_error() -> None:
    assert issubclass(SerializationError, JobqError)


def test_unknown_option_raises_type_error(queue: Queue, redis_client: redis.Redis) -> None:
    with pytest.raises(TypeError, match="colour") as refused:
        queue.add("n", 1, colour="red")
    assert "is" not in str(refused.value).partition("]")[2]  # no spelling to give
    # BullMQ's names: how jobq spells them
    with pytest.raises(TypeError, match=r"\(jobId is job_id, removeOnComplete is "
                                        r"remove_on_complete; times are seconds\)"):
        queue.add("n", 1, jobId="a-1", removeOnComplete=True)
    assert queue_keys(redis_client, queue.name) == []


@pytest.mark.parametrize(
    "options",
    [
        {"delay": -1},
        {"delay": -0.001},
        {"delay": float("nan")},
        {"delay": float("inf")},
        {"delay": 1e308},  # finite, but no ms count of a double
        {"timeout": 1e13},
        {"backoff": 1e300},
        {"remove_on_complete": {"age": 1e20}},
        {"delay": "1"},
        {"delay": True},
        {"attempts": 0},
        {"attempts": -1},
        {"attempts": 1.5},
        {"attempts": "2"},
        {"priority": -1},
        {"priority": 1.5},
        {"priority": "1"},
        {"priority": True},
        {"priority": 2**21 + 1},
        {"backoff": {"type": "linear", "delay": 1}},
        {"backoff": {"delay": -1}},
        {"backoff": {"delay": 1, "bogus": 1}},
        {"backoff": {"delay": 1, "jitter": 2}},
        {"backoff": -1},
        {"backoff": "1"},
        {"lifo": "yes"},
        {"timeout": 0},
        {"timeout": -1},
        {"remove_on_complete": -1},
        {"remove_on_complete": "yes"},
        {"remove_on_complete": 1.5},
        {"remove_on_complete": {"age": -1}},
        {"remove_on_complete": {"count": -1}},
        {"remove_on_complete": {"count": 1.5}},
        {"remove_on_complete": {"bogus": 1}},
        {"remove_on_fail": -2},
        {"remove_on_fail": {"age": "1"}},
        {"attempts": 10**20},  # past the scripts' exact numbers: not a msgpack error
        {"remove_on_fail": 10**20},
        {"remove_on_complete": {"count": 2**53 + 1}},
    ],
    ids=repr,
)
def test_bad_option_value_raises_value_error(
    queue: Queue, redis_client: redis.Redis, options: dict[str, Any]
) -> None:
    with pytest.raises(ValueError):
        queue.add("n", 1, **options)
    assert queue_keys(redis_client, queue.name) == []


@pytest.mark.parametrize("timeout", [0, -1, -0.5])
def test_a_timeout_not_above_zero_is_refused_saying_so(queue: Queue, timeout: float) -> None:
    with pytest.raises(ValueError, match="timeout must be > 0"):  # -1 said ">= 0"
        queue.add("n", 1, timeout=timeout)


@pytest.mark.parametrize("name", ["", 5, None, "x" * 201])
def test_bad_job_name_raises_value_error(
    queue: Queue, redis_client: redis.Redis, name: Any
) -> None:
    with pytest.raises(ValueError):
        queue.add(name, 1)
    assert queue_keys(redis_client, queue.name) == []


@pytest.mark.parametrize(
    "name", ["", "a{b", "a}b", "{x}", "a b", " ", "tab\t", "new\nline", "x" * 101, "a*", "a?",
             "a[1]", 5, None, "lone\udc80"],
)
def test_invalid_queue_name_raises_value_error(redis_url: str, name: Any) -> None:
    with pytest.raises(ValueError):
        Queue(name, connection=redis_url)


def test_arguments_of_the_wrong_kind_are_said_as_such(queue: Queue, redis_url: str) -> None:
    """Each raised a Python error from deep inside ('int' object is not
    iterable, no attribute 'wait_for'), or redis-py's list of URL schemes
    without jobq's cluster and Sentinel ones."""
    for defaults, error in ((5, TypeError), (["attempts"], TypeError)):
        with pytest.raises(error, match="default_job_options must be a dict"):
            Queue(queue.name, connection=redis_url, default_job_options=defaults)
    with pytest.raises(TypeError, match="depends_on takes a list"):
        queue.add("x", depends_on=5)
    job = queue.add("x")
    for reader in (queue, 5, "x"):
        with pytest.raises(TypeError, match="queue_events must be a QueueEvents or None"):
            job.wait_until_finished(reader, timeout=1)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="queue_events must be a QueueEvents or None"):
            job.as_future(reader)  # type: ignore[arg-type]
    # a timeout given as Celery's get(10) takes it: the message says how
    with pytest.raises(TypeError, match=r"the timeout is a keyword: timeout=2\.5"):
        job.wait_until_finished(2.5)  # type: ignore[arg-type]
    for url in ("", "http://127.0.0.1:1/0", "localhost:6379"):
        with pytest.raises(ValueError, match="redis\\+cluster://.*redis\\+sentinel://"):
            Queue(queue.name, connection=url)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 1.0, True, "0", None])
def test_ranges_and_counts_are_refused_unless_ints_before_the_server_sees_them(
    queue: Queue, redis_url: str, bad: Any
) -> None:
    job = queue.add("n", 1)
    job.log("one")
    for call in (
        lambda: queue.get_jobs("waiting", bad, -1),
        lambda: queue.get_jobs("waiting", 0, bad),
        lambda: job.get_logs(bad),
        lambda: job.get_logs(0, bad),
        lambda: job.log("two", keep=bad),
    ):
        with pytest.raises(ValueError, match="must be"):  # not the server's "not an integer"
            call()
    with pytest.raises(ValueError, match="keep must be >= 0"):
        job.log("two", keep=-1)
    # a reader polling every 10 ms, as NaN or a value <= 0 once gave
    for bad_block in (float("nan"), 0, -1.5, True, "1", None):
        with pytest.raises(ValueError, match="blocking_timeout must be"):
            jobq.QueueEvents(queue.name, connection=redis_url, blocking_timeout=bad_block,
                             autorun=False)
    # what stays valid: negative indexes count from the end, as in LRANGE
    assert [j.id for j in queue.get_jobs("waiting", -1, -1)] == [job.id]
    assert job.get_logs(-1) == ["one"] and job.log("two", keep=1) == 1


@pytest.mark.parametrize("prefix", ["", "a b", "a*", "{a}{b}", "{}", "lone\udc80", "{lone\udc80}"])
def test_invalid_prefix_raises_value_error(redis_url: str, prefix: str) -> None:
    with pytest.raises(ValueError, match="invalid prefix"):
        Queue("q", prefix=prefix, connection=redis_url)


def test_queue_name_of_100_characters_is_valid(redis_url: str, queue_name: str) -> None:
    name = (queue_name + "x" * 100)[:100]
    with Queue(name, connection=redis_url) as q:
        job = q.add("n", 1)
        assert q.get_job_state(job.id) == "waiting"
        q.obliterate()


def test_zero_delay_and_zero_priority_mean_none(queue: Queue) -> None:
    job = queue.add("n", 1, delay=0, priority=0)
    assert queue.get_job_state(job.id) == "waiting"


# -- reading -----------------------------------------------------------------


def test_get_job_state(queue: Queue) -> None:
    waiting = queue.add("w")
    prioritized = queue.add("p", priority=3)
    delayed = queue.add("d", delay=60)
    assert queue.get_job_state(waiting.id) == "waiting"
    assert queue.get_job_state(prioritized.id) == "waiting"
    assert queue.get_job_state(delayed.id) == "delayed"
    assert queue.get_job_state("no-such-job") == "unknown"


def test_get_job_missing_returns_none(queue: Queue) -> None:
    assert queue.get_job("no-such-job") is None
    assert queue.get_job("999999") is None


def test_a_job_id_to_look_up_is_a_str_or_a_generated_int(queue: Queue) -> None:
    # None would name the job whose custom id is "None" (str(None) slips in)
    named_none = queue.add("x", 1, job_id="None")
    generated = queue.add("x", 2)
    for bad in (None, b"None", True, -1, 1.0):
        for look in (queue.get_job, queue.get_job_state, queue.get_job_result, queue.remove,
                     queue.cancel, queue.events.future_for):
            with pytest.raises(TypeError, match="job_id must be a str"):
                look(bad)
        with pytest.raises(TypeError, match="job_id must be a str"):
            queue.events.wait_for(bad, timeout=0)
    # no job has a lone surrogate in its id (add refuses it): a clear error,
    # not redis-py's UnicodeEncodeError naming no argument
    for look in (queue.get_job, queue.get_job_state, queue.get_job_result, queue.remove,
                 queue.cancel, queue.events.future_for):
        with pytest.raises(ValueError, match="invalid job_id .*lone surrogates"):
            look("job-\ud800")
    job = queue.get_job(int(generated.id))  # a generated id may be given as an int
    assert job is not None and job.id == generated.id and job.data == 2
    assert queue.get_job_state(int(generated.id)) == "waiting"
    assert queue.get_job_state("None") == "waiting" and named_none.id == "None"


def test_get_job_result(queue: Queue, redis_url: str) -> None:
    sentinel = object()
    job = queue.add("n", 20)
    assert queue.get_job_result(job.id) is None
    assert queue.get_job_result(job.id, sentinel) is sentinel
    assert queue.get_job_result("missing", sentinel) is sentinel
    with worker(queue.name, redis_url, lambda j: {"double": j.data * 2}):
        assert job.wait_until_finished(timeout=WAIT) == {"double": 40}
    assert queue.get_job_result(job.id) == {"double": 40}
    assert queue.get_job_result(job.id, sentinel) == {"double": 40}


def test_get_job_result_of_failed_job_is_default(queue: Queue, redis_url: str) -> None:
    job = queue.add("n", 1)
    run_all(queue, redis_url, fail, [job])
    assert queue.get_job_state(job.id) == "failed"
    assert queue.get_job_result(job.id, "dflt") == "dflt"


def test_get_job_counts(queue: Queue, redis_url: str) -> None:
    assert queue.get_job_counts() == dict.fromkeys(STATES, 0)
    queue.add("w1")
    queue.add("w2", priority=2)
    queue.add("d", delay=60)
    counts = queue.get_job_counts()
    assert list(counts) == list(STATES)
    assert counts == {"waiting": 2, "delayed": 1, "active": 0, "completed": 0, "failed": 0,
                      "waiting-children": 0}
    assert queue.get_job_counts("delayed") == {"delayed": 1}
    assert queue.get_job_counts("failed", "waiting") == {"failed": 0, "waiting": 2}
    with pytest.raises(ValueError):
        queue.get_job_counts("paused")
    with pytest.raises(ValueError):
        queue.get_job_counts("waiting", "bogus")


def test_get_job_counts_after_running(queue: Queue, redis_url: str) -> None:
    ok = queue.add("ok")
    bad = queue.add("bad")

    def processor(job: jobq.Job) -> str:
        if job.name == "bad":
            raise ValueError("no")
        return "yes"

    run_all(queue, redis_url, processor, [ok, bad])
    assert queue.get_job_counts() == {
        "waiting": 0, "delayed": 0, "active": 0, "completed": 1, "failed": 1,
        "waiting-children": 0,
    }
    assert queue.count() == 0


def test_count_is_waiting_plus_delayed(queue: Queue) -> None:
    assert queue.count() == 0
    queue.add("a")
    queue.add("b", priority=1)
    queue.add("c", delay=60)
    assert queue.count() == 3


def test_get_jobs_orders_waiting_and_delayed(queue: Queue) -> None:
    a, b, c = (queue.add(n) for n in "abc")
    assert [j.id for j in queue.get_jobs("waiting")] == [c.id, b.id, a.id]
    assert [j.id for j in queue.get_jobs("waiting", asc=True)] == [a.id, b.id, c.id]
    assert [j.id for j in queue.get_jobs("waiting", 0, 1)] == [c.id, b.id]
    assert [j.id for j in queue.get_jobs("waiting", 1, -1)] == [b.id, a.id]
    assert [j.id for j in queue.get_jobs("waiting", 0, 0, asc=True)] == [a.id]
    assert all(isinstance(j, jobq.Job) for j in queue.get_jobs("waiting"))

    late = queue.add("late", delay=90)
    soon = queue.add("soon", delay=30)
    mid = queue.add("mid", delay=60)
    assert [j.id for j in queue.get_jobs("delayed", asc=True)] == [soon.id, mid.id, late.id]
    assert [j.id for j in queue.get_jobs("delayed")] == [late.id, mid.id, soon.id]
    assert [j.id for j in queue.get_jobs("delayed", 0, 0, asc=True)] == [soon.id]

    both = {j.id for j in queue.get_jobs(["waiting", "delayed"])}
    assert both == {a.id, b.id, c.id, late.id, soon.id, mid.id}
    assert queue.get_jobs("completed") == []
    assert queue.get_jobs([]) == []
    with pytest.raises(ValueError):
        queue.get_jobs("bogus")


def test_get_jobs_waiting_reads_only_its_window_in_run_order(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """Every window, from either end, is the run order's (the wait list
    from its right end, lifo jobs included, then prioritized ones), and
    only the window's ids cross the network (the whole queue was read)."""
    for i in range(5):
        queue.add("plain", i, lifo=i == 3)
        queue.add("urgent", i, priority=5 - i)
    order = [j.id for j in queue.get_jobs("waiting", asc=True)]
    keys = queue._context.keys
    expected = [i.decode() for i in redis_client.lrange(keys.wait, 0, -1)[::-1]]
    expected += [i.decode() for i in redis_client.zrange(keys.prioritized, 0, -1)]
    assert order == expected and len(order) == 10

    def lrange(items: list[str], start: int, end: int) -> list[str]:
        first = max(0, len(items) + start) if start < 0 else start
        last = len(items) + end if end < 0 else end
        return items[first:last + 1] if last >= 0 else []

    for start in range(-12, 12):
        for end in range(-12, 12):
            got = [j.id for j in queue.get_jobs("waiting", start, end, asc=True)]
            assert got == lrange(order, start, end), (start, end)
            got = [j.id for j in queue.get_jobs("waiting", start, end)]
            assert got == lrange(order[::-1], start, end), (start, end)
    queue.add_bulk([{"name": "more", "data": i} for i in range(3000)])
    redis_client.config_resetstat()
    assert len(queue.get_jobs("waiting", 0, 9, asc=True)) == 10  # the wait list's end
    stats = redis_client.info("commandstats")
    assert "cmdstat_lrange" in stats and "cmdstat_zrange" not in stats


def test_get_jobs_waiting_includes_prioritized(queue: Queue) -> None:
    plain = queue.add("plain")
    urgent = queue.add("urgent", priority=1)
    assert {j.id for j in queue.get_jobs("waiting")} == {plain.id, urgent.id}


def test_get_jobs_waiting_asc_is_the_order_they_will_run(queue: Queue) -> None:
    first = queue.add("first")
    later = queue.add("later", priority=2)
    second = queue.add("second")
    urgent = queue.add("urgent", priority=1)
    run_order = [first.id, second.id, urgent.id, later.id]
    assert [j.id for j in queue.get_jobs("waiting", asc=True)] == run_order
    assert [j.id for j in queue.get_jobs("waiting")] == run_order[::-1]
    assert [j.id for j in queue.get_jobs("waiting", 1, 2, asc=True)] == run_order[1:3]


def test_get_jobs_returns_full_records(queue: Queue) -> None:
    queue.add("n", {"k": "v"}, attempts=3)
    [job] = queue.get_jobs("waiting")
    assert job.name == "n"
    assert job.data == {"k": "v"}
    assert job.opts["attempts"] == 3


def test_a_value_that_cannot_be_decoded_here_hides_no_other_job(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """A value written with an extension type this process does not
    register (or not msgpack at all) made get_jobs raise: no job of the
    list could be reached, the bad one not even to remove it."""
    import msgpack

    foreign = msgpack.packb(msgpack.ExtType(99, b"a type registered elsewhere"))
    good = queue.add("good", {"k": 1})
    bad = queue.add("bad", 2)
    redis_client.hset(queue._context.keys.job(bad.id), mapping={"data": foreign, "prog": b"\xc1"})
    jobs = {job.id: job for job in queue.get_jobs("waiting")}
    assert set(jobs) == {good.id, bad.id}
    assert jobs[good.id].data == {"k": 1}
    for value in ("data", "progress"):
        with pytest.raises(SerializationError, match=f"of job '{bad.id}' could not be decoded"):
            getattr(jobs[bad.id], value)
    assert jobs[bad.id].return_value is None
    found = queue.get_job(bad.id)
    assert found is not None and found.name == "bad"
    found.update_data(3)  # a value set replaces the stored one
    assert found.data == 3 and queue.get_job(bad.id).data == 3  # type: ignore[union-attr]
    found.remove()
    assert [job.id for job in queue.get_jobs("waiting")] == [good.id]


def test_a_number_field_that_is_not_a_number_hides_no_other_job(
    queue: Queue, redis_client: redis.Redis, redis_url: str
) -> None:
    """A number field written by hand or another version ("abc", "nan")
    made get_jobs and get_job raise ValueError. It reads as the scripts
    read it (Lua's tonumber): as absent; a worker still fails the job with
    the reason rather than run it (tests/test_worker_regressions.py)."""
    good = queue.add("good", 1, priority=3)
    bad = queue.add("bad", 2)
    redis_client.hset(queue._context.keys.job(bad.id), mapping={
        "priority": "abc", "atm": "x", "stc": "nan", "ts": "inf", "delay": "1.5.2",
    })
    jobs = {job.id: job for job in queue.get_jobs("waiting")}
    assert set(jobs) == {good.id, bad.id}
    read = jobs[bad.id]
    assert (read.priority, read.attempts_made, read.stalled_counter) == (0, 0, 0)
    assert (read.timestamp, read.delay, read.data) == (None, 0.0, 2)
    assert jobs[good.id].priority == 3 and jobs[good.id].timestamp is not None
    found = queue.get_job(bad.id)
    assert found is not None and found.attempts_made == 0
    with Worker(queue.name, lambda job: job.data * 10, connection=redis_url):
        assert good.wait_until_finished(timeout=WAIT) == 10
        with pytest.raises(jobq.JobFailedError, match="priority b'abc' is not a number"):
            bad.wait_until_finished(timeout=WAIT)
    done = queue.get_job(bad.id)
    assert done is not None and done.get_state() == "failed" and done.finished_on is not None


# -- ordering ------------------------------------------------------------------


def test_fifo_order(queue: Queue, redis_url: str) -> None:
    for i in range(8):
        queue.add(f"j{i}")
    assert run_order(queue.name, redis_url, 8) == [f"j{i}" for i in range(8)]


def test_priority_order(queue: Queue, redis_url: str) -> None:
    queue.add("p3", priority=3)
    queue.add("none-a")
    queue.add("p1-a", priority=1)
    queue.add("p2", priority=2)
    queue.add("none-b")
    queue.add("p1-b", priority=1)
    queue.add("p1-c", priority=1)
    assert run_order(queue.name, redis_url, 7) == [
        "none-a", "none-b", "p1-a", "p1-b", "p1-c", "p2", "p3",
    ]


def test_large_priorities_keep_order(queue: Queue, redis_url: str) -> None:
    queue.add("max", priority=2**21 - 1)
    queue.add("big", priority=2**20)
    queue.add("small", priority=5)
    assert run_order(queue.name, redis_url, 3) == ["small", "big", "max"]


def test_lifo_puts_job_first(queue: Queue, redis_url: str) -> None:
    queue.add("a")
    queue.add("b")
    queue.add("c", lifo=True)
    queue.add("d")
    queue.add("e", lifo=True)
    assert run_order(queue.name, redis_url, 5) == ["e", "c", "a", "b", "d"]


def test_a_lifo_job_retried_at_once_is_first_in_line_again(
    queue: Queue, redis_url: str
) -> None:
    """A lifo job retried at once went to the back of the line, where one
    retried after a backoff (promoted when due) went first."""
    queue.add("a", lifo=True, attempts=2)
    for name in "bcd":
        queue.add(name)

    def processor(job: jobq.Job) -> None:
        if job.name == "a" and job.attempts_made == 0:
            raise RuntimeError("once")

    assert run_order(queue.name, redis_url, 5, processor) == ["a", "a", "b", "c", "d"]


def test_lifo_within_a_priority(queue: Queue, redis_url: str) -> None:
    queue.add("p1-a", priority=1)
    queue.add("p2-a", priority=2)
    queue.add("p2-b", priority=2, lifo=True)
    queue.add("p1-b", priority=1, lifo=True)
    assert run_order(queue.name, redis_url, 4) == ["p1-b", "p1-a", "p2-b", "p2-a"]


# -- delayed jobs ----------------------------------------------------------------


def test_delayed_job_waits_its_delay(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    job = queue.add("later", 1, delay=0.3)
    assert job.delay == pytest.approx(0.3)
    assert queue.get_job_state(job.id) == "delayed"
    assert queue.get_job_counts("waiting", "delayed") == {"waiting": 0, "delayed": 1}
    with worker(queue.name, redis_url, lambda j: "done"):
        assert job.wait_until_finished(timeout=WAIT) == "done"
    job.refresh()
    assert job.processed_on is not None and job.timestamp is not None
    assert job.processed_on - job.timestamp >= 0.3
    assert job.delay == pytest.approx(0.3)
    events = stream(redis_client, queue.name, job.id)
    assert names(events)[:2] == ["added", "delayed"]
    assert float(events[1][2]["delay"]) == pytest.approx(300)
    assert "waiting" in names(events)


def test_delayed_job_runs_after_undelayed_ones(queue: Queue, redis_url: str) -> None:
    queue.add("delayed", delay=0.2)
    queue.add("now")
    assert run_order(queue.name, redis_url, 2) == ["now", "delayed"]


def test_delayed_jobs_run_in_due_order(queue: Queue, redis_url: str) -> None:
    # one add: one server timestamp, so the due order is the delays' order
    # however slowly the adds would have followed each other
    queue.add_bulk([{"name": "third", "delay": 0.3}, {"name": "first", "delay": 0.1},
                    {"name": "second", "delay": 0.2}])
    assert run_order(queue.name, redis_url, 3) == ["first", "second", "third"]


def test_promote_runs_delayed_job_now(queue: Queue, redis_url: str) -> None:
    job = queue.add("later", delay=60)
    job.promote()
    assert queue.get_job_state(job.id) == "waiting"
    with worker(queue.name, redis_url, lambda j: "ran"):
        assert job.wait_until_finished(timeout=WAIT) == "ran"


def test_promote_jobs_makes_the_delayed_jobs_wait_soonest_first(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    """BullMQ's promoteJobs: every delayed job (or the ``count`` due
    soonest) waits now, keeping its priority; none to promote is 0."""
    assert queue.promote_jobs() == 0
    later = [queue.add("later", i, delay=60 + i) for i in range(3)]
    soon = queue.add("soon", delay=30)
    urgent = queue.add("urgent", delay=90, priority=1)
    kept = queue.add("now")
    assert queue.promote_jobs(count=2) == 2  # due in 30 s and 60 s
    assert [queue.get_job_state(j.id) for j in (soon, later[0], later[1])] == [
        "waiting", "waiting", "delayed"]
    assert queue.promote_jobs() == 3
    assert queue.get_job_counts("delayed", "waiting") == {"delayed": 0, "waiting": 6}
    assert [e[2]["prev"] for e in stream(redis_client, queue.name, later[2].id)
            if e[0] == "waiting"] == [b"delayed"]
    # in run order; a priority kept (jobs without one run first, as in BullMQ)
    assert [j.id for j in queue.get_jobs("waiting", asc=True)] == [
        kept.id, soon.id, *(j.id for j in later), urgent.id]
    assert queue.get_job(later[2].id).delay == 0  # type: ignore[union-attr]
    with worker(queue.name, redis_url, lambda j: j.name):
        assert [j.wait_until_finished(timeout=WAIT) for j in (kept, urgent, later[2])] == [
            "now", "urgent", "later"]
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="count must be"):
            queue.promote_jobs(count=bad)  # type: ignore[arg-type]


def test_promote_jobs_goes_past_delayed_ids_whose_records_are_gone(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """A batch of ids whose records were gone (deleted by hand) promoted
    nothing, and the call stopped there, the jobs due after them left
    delayed."""
    jobs = queue.add_bulk([{"name": "x", "data": i, "delay": 60 + i} for i in range(1200)])
    redis_client.delete(*(f"jobq:{{{queue.name}}}:job:{j.id}" for j in jobs[:1000]))
    assert queue.promote_jobs(count=100) == 100  # past the thousand gone
    assert queue.promote_jobs() == 100
    assert queue.get_job_counts("delayed", "waiting") == {"delayed": 0, "waiting": 200}


def test_change_delay_reschedules(queue: Queue, redis_url: str) -> None:
    job = queue.add("later", delay=60)
    with worker(queue.name, redis_url, lambda j: "ran"):
        job.change_delay(0.05)
        assert queue.get_job_state(job.id) in ("delayed", "waiting", "active", "completed")
        assert job.wait_until_finished(timeout=WAIT) == "ran"


def test_change_delay_to_later(queue: Queue) -> None:
    job = queue.add("later", delay=0.5)
    job.change_delay(60)
    assert queue.get_job_state(job.id) == "delayed"
    [delayed] = queue.get_jobs("delayed")
    assert delayed.id == job.id


def test_change_priority_reorders_waiting_jobs(queue: Queue, redis_url: str) -> None:
    queue.add("a", priority=5)
    b = queue.add("b", priority=5)
    queue.add("c", priority=3)
    b.change_priority(1)
    assert run_order(queue.name, redis_url, 3) == ["b", "c", "a"]


# -- add_bulk --------------------------------------------------------------------


def test_add_bulk_ten_thousand_jobs(queue: Queue) -> None:
    jobs = queue.add_bulk({"name": "bulk", "data": i} for i in range(10_000))
    assert len(jobs) == 10_000
    ids = [j.id for j in jobs]
    assert len(set(ids)) == 10_000
    assert [j.data for j in jobs] == list(range(10_000))
    assert queue.get_job_counts("waiting") == {"waiting": 10_000}
    assert queue.count() == 10_000
    numbers = [int(i) for i in ids]
    assert numbers == sorted(numbers)
    last = queue.get_job(ids[-1])
    assert last is not None and last.data == 9_999


def test_add_bulk_mixed_options(queue: Queue, redis_url: str) -> None:
    jobs = queue.add_bulk(
        [
            {"name": "plain", "data": 1},
            {"name": "delayed", "data": 2, "delay": 60},
            {"name": "urgent", "data": 3, "priority": 1},
            {"name": "custom", "data": 4, "job_id": "bulk-custom", "attempts": 3},
            {"name": "nodata"},
        ]
    )
    assert [j.name for j in jobs] == ["plain", "delayed", "urgent", "custom", "nodata"]
    assert jobs[3].id == "bulk-custom"
    assert jobs[3].opts["attempts"] == 3
    assert jobs[4].data is None
    assert [queue.get_job_state(j.id) for j in jobs] == [
        "waiting", "delayed", "waiting", "waiting", "waiting",
    ]
    assert queue.get_job_counts("waiting", "delayed") == {"waiting": 4, "delayed": 1}
    assert run_order(queue.name, redis_url, 4) == ["plain", "custom", "nodata", "urgent"]


def test_add_bulk_of_jobs_alike(queue: Queue, redis_url: str, redis_client: redis.Redis) -> None:
    """Jobs whose settings are all alike go with the settings sent once:
    each record still has them all, and plain jobs run in the order added,
    across the 1000-id pushes of the wait list."""
    alike = queue.add_bulk([{"name": f"p{i}", "data": i, "priority": 2, "attempts": 4,
                             "remove_on_complete": 5, "remove_on_fail": 7, "lifo": True}
                            for i in range(3)])
    for job in alike:
        record = redis_client.hgetall(f"jobq:{{{queue.name}}}:job:{job.id}")
        assert {k: record.get(k) for k in (b"priority", b"lifo", b"atts", b"kc", b"kfc")} == {
            b"priority": b"2", b"lifo": b"1", b"atts": b"4", b"kc": b"5", b"kfc": b"7"}
        stored = queue.get_job(job.id)
        assert stored is not None and stored.opts["attempts"] == 4 and stored.priority == 2
    delayed = queue.add_bulk([{"name": "d", "data": i, "delay": 60} for i in range(3)])
    assert [queue.get_job_state(j.id) for j in delayed] == ["delayed"] * 3
    queue.remove(delayed[0].id), queue.remove(delayed[1].id), queue.remove(delayed[2].id)
    plain = queue.add_bulk([{"name": f"n{i}"} for i in range(2500)])
    assert len({j.id for j in plain}) == 2500
    order = run_order(queue.name, redis_url, 2503)
    assert order[:2500] == [f"n{i}" for i in range(2500)]  # the wait list before priorities
    assert sorted(order[2500:]) == ["p0", "p1", "p2"]


def test_add_bulk_options_shared_by_jobs_stay_each_jobs_own(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """A bulk add parses options alike once: ids, values of other types
    that compare equal (1, 1.0, True) and every check stay per job."""
    jobs = queue.add_bulk(
        [{"name": "a", "data": i, "job_id": f"own-{i}", "attempts": 3, "delay": 0.5}
         for i in range(3)]
        + [{"name": "b", "attempts": 2}, {"name": "c", "delay": 1.0}, {"name": "d", "delay": 1}]
    )
    assert [j.id for j in jobs[:3]] == ["own-0", "own-1", "own-2"]
    for i, job in enumerate(jobs[:3]):
        stored = queue.get_job(f"own-{i}")
        assert stored is not None and stored.data == i and stored.opts["attempts"] == 3
        assert job.opts["delay"] == 0.5
    assert queue.get_job_counts("waiting", "delayed") == {"waiting": 1, "delayed": 5}
    with pytest.raises(ValueError, match="all-digit"):  # the id of a job alike is checked too
        queue.add_bulk([{"name": "a", "job_id": "fine-1", "attempts": 3},
                        {"name": "a", "job_id": "123", "attempts": 3}])
    with pytest.raises((TypeError, ValueError)):  # True == 1, but is no attempts count
        queue.add_bulk([{"name": "a", "attempts": 1}, {"name": "a", "attempts": True}])
    assert queue.get_job("fine-1") is None
    assert queue.get_job_counts("waiting", "delayed") == {"waiting": 1, "delayed": 5}


def test_add_bulk_empty(queue: Queue, redis_client: redis.Redis) -> None:
    assert queue.add_bulk([]) == []
    assert queue_keys(redis_client, queue.name) == []


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ({"name": "x", "data": object()}, SerializationError),
        ({"name": "x", "data": 1, "delay": -1}, ValueError),
        ({"name": "x", "data": 1, "colour": "red"}, TypeError),
        ({"name": "x", "data": 1, "job_id": ""}, ValueError),
        ({"data": 1}, ValueError),
        ("not a dict", TypeError),
        # not encodable as UTF-8: this failed only as its chunk was sent,
        # after the 1500 jobs before it were written
        ({"name": "lone\udc80"}, ValueError),
        ({"name": "x", "job_id": "lone\udc80"}, ValueError),
        ({"name": "x", "depends_on": ["a"]}, TypeError),  # add()'s alone, and it says so
    ],
    ids=["data", "delay", "unknown-option", "job-id", "no-name", "not-a-dict",
         "surrogate-name", "surrogate-job-id", "depends-on"],
)
def test_add_bulk_with_one_bad_job_writes_nothing(
    queue: Queue, redis_client: redis.Redis, bad: Any, error: type[Exception]
) -> None:
    specs: list[Any] = [{"name": "ok", "data": i} for i in range(1500)]
    specs.append(bad)
    with pytest.raises(error, match=r"^jobs\[1500\]") as refused:  # which of the many
        queue.add_bulk(specs)
    if "depends_on" in bad:
        assert "depends_on is add()'s alone" in str(refused.value)
    assert queue_keys(redis_client, queue.name) == []


def test_a_single_adds_error_names_no_bulk_entry(queue: Queue, redis_url: str) -> None:
    """add() went through add_bulk, whose errors name their entry: one job's
    said "jobs[0] (name 'x'): ...", of a bulk its caller never wrote."""
    with ShardedQueue(queue.name + "-sh", shards=2, connection=redis_url) as sharded:
        _single_adds_errors(queue)
        _single_adds_errors(sharded)


def _single_adds_errors(target: Any) -> None:
    with pytest.raises(SerializationError, match=r"^job data is not msgpack-encodable"):
        target.add("x", {1, 2})
    with pytest.raises(ValueError, match=r"^delay must be"):
        target.add("x", 1, delay=-1)
    with pytest.raises(ValueError, match=r"^jobs\[1\] \(name 'x'\): delay must be"):
        target.add_bulk([{"name": "ok"}, {"name": "x", "delay": -1}])


def test_a_bulk_add_failing_after_a_chunk_says_which_jobs_were_added() -> None:
    """A bulk is written a chunk (1,000 jobs) per round trip: a connection
    lost on the second raised a bare ConnectionError, nothing saying the
    first thousand were written; a caller adding the whole bulk again, as
    after any failed add, added those twice."""
    from jobq.testing import RedisServer, find_server_binary
    from tests.proxy import Proxy

    with RedisServer(find_server_binary()) as server, \
            Proxy(("127.0.0.1", server.port)) as proxy, \
            Queue("bulk", connection=proxy.url) as queue:
        queue.add("warm")  # the library loaded, the settings stored
        lost = proxy.drop_reply(lambda chunk: b"second-chunk" in chunk)
        jobs = [{"name": "x", "data": "second-chunk" if i == 1000 else i} for i in range(2000)]
        with pytest.raises(redis.exceptions.ConnectionError,
                           match=r"^1000 of the 2000 jobs were added \(the error's `added`\)") \
                as info:
            queue.add_bulk(jobs)
        assert lost.is_set()
        added = info.value.added  # type: ignore[attr-defined]
        assert [job.data for job in added] == list(range(1000))
        assert all(queue.get_job(job.id) is not None for job in added)


def test_a_bulk_add_whose_existing_job_cannot_be_read_back_returns_every_job() -> None:
    """A job of the bulk found existing by its id is read back; a read that
    failed (the connection lost, its retries too) raised from add_bulk
    after the bulk was written, none of its jobs returned or said added."""
    from jobq.testing import RedisServer, find_server_binary
    from tests.proxy import Proxy

    with RedisServer(find_server_binary()) as server, \
            Proxy(("127.0.0.1", server.port)) as proxy, \
            Queue("bulk", connection=proxy.url) as queue:
        queue.add("x", "first", job_id="dup")
        for _ in range(6):  # every try of the read, and more
            proxy.drop_reply(lambda chunk: b"HGETALL" in chunk and b":dup" in chunk)
        jobs = queue.add_bulk([{"name": "x", "data": 1}, {"name": "x", "data": 2, "job_id": "dup"},
                               {"name": "x", "data": 3}])
        assert [job.id for job in jobs][1] == "dup" and len(jobs) == 3
        with server.client() as client:
            assert client.llen("jobq:{bulk}:wait") == 3


def test_add_bulk_duplicate_custom_ids(queue: Queue, redis_client: redis.Redis) -> None:
    queue.add("pre", "old", job_id="dup-0")
    jobs = queue.add_bulk(
        [
            {"name": "a", "data": 1, "job_id": "dup-1"},
            {"name": "b", "data": 2, "job_id": "dup-1"},
            {"name": "c", "data": 3, "job_id": "dup-0"},
            {"name": "d", "data": 4},
        ]
    )
    assert [j.id for j in jobs[:3]] == ["dup-1", "dup-1", "dup-0"]
    assert [j.data for j in jobs] == [1, 1, "old", 4]
    assert [j.name for j in jobs] == ["a", "a", "pre", "d"]
    assert queue.get_job_counts("waiting") == {"waiting": 3}
    assert names(stream(redis_client, queue.name, "dup-1")).count("duplicated") == 1
    assert names(stream(redis_client, queue.name, "dup-0")).count("duplicated") == 1


class _GoneWhenRead(Queue):
    """A queue whose reads of a job find it gone: as when the job an add
    found existing completed and was removed (retention) before a read
    after the add."""

    def get_job(self, job_id: str) -> Any:
        self.remove(job_id)
        return None


def test_an_add_of_an_existing_id_returns_the_job_it_found(
    queue_name: str, redis_url: str
) -> None:
    """The add read the existing job back in a call of its own: gone by
    then, it added it again, and after three such tries raised "was removed
    while it was added again" (producers reusing an id of jobs removed on
    completion). The add's reply carries the record it found."""
    with _GoneWhenRead(queue_name, connection=redis_url) as queue:
        queue.add("x", "old", job_id="k")
        job = queue.add("x", "new", job_id="k")
        assert (job.id, job.name, job.data, job.get_state()) == ("k", "x", "old", "waiting")
        assert queue.count() == 1


def test_producers_reusing_an_id_of_jobs_removed_on_completion_never_fail(
    queue_name: str, redis_url: str
) -> None:
    """Eight threads adding one id, a worker completing and removing each
    run: every add returns a job that was added (one of theirs), and none
    raises (with the read after the add, one of 8 x 300 adds raised "was
    removed while it was added again" after 50 to 300 adds)."""
    errors: list[BaseException] = []
    results: list[Any] = []
    stop = threading.Event()

    def produce(k: int) -> None:
        for n in range(300):
            if stop.is_set():
                return
            try:
                job = queue.add("t", [k, n], job_id="K", remove_on_complete=True)
                assert job.id == "K"
                results.append(job.data)
            except BaseException as exc:  # noqa: BLE001 (reported below)
                errors.append(exc)
                stop.set()

    with Queue(queue_name, connection=redis_url) as queue, \
            Worker(queue_name, lambda job: job.data, connection=redis_url, concurrency=4):
        threads = [threading.Thread(target=produce, args=(k,)) for k in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    assert len(results) == 2400 and all(isinstance(r, list) and len(r) == 2 for r in results)


# -- pause / resume ------------------------------------------------------------------


def test_pause_is_durable_and_emits_events(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    assert queue.is_paused() is False
    queue.pause()
    assert queue.is_paused() is True
    with Queue(queue.name, connection=redis_url) as other:
        assert other.is_paused() is True
        other.resume()
    assert queue.is_paused() is False
    assert names(stream(redis_client, queue.name)) == ["paused", "resumed"]


def test_paused_queue_counts_waiting_jobs_as_waiting(queue: Queue) -> None:
    queue.add("a")
    queue.add("b", priority=2)
    queue.pause()
    assert queue.get_job_counts("waiting") == {"waiting": 2}
    assert queue.count() == 2
    assert queue.get_job_state(queue.get_jobs("waiting")[0].id) == "waiting"


def test_worker_on_paused_queue_runs_nothing_until_resume(
    queue: Queue, redis_url: str
) -> None:
    ran = threading.Event()
    queue.pause()
    job = queue.add("n")
    with worker(queue.name, redis_url, lambda j: ran.set()):
        assert not ran.wait(QUIET)
        assert queue.get_job_state(job.id) == "waiting"
        queue.resume()
        assert ran.wait(WAIT)
        job.wait_until_finished(timeout=WAIT)


def test_pause_lets_in_flight_job_finish(queue: Queue, redis_url: str) -> None:
    started, release, second = threading.Event(), threading.Event(), threading.Event()

    def processor(job: jobq.Job) -> str:
        if job.name == "first":
            started.set()
            assert release.wait(WAIT)
        else:
            second.set()
        return job.name

    first = queue.add("first")
    queue.add("second")
    with worker(queue.name, redis_url, processor):
        try:
            assert started.wait(WAIT)
            queue.pause()
        finally:
            release.set()
        assert first.wait_until_finished(timeout=WAIT) == "first"
        assert not second.wait(QUIET)
        queue.resume()
        assert second.wait(WAIT)


# -- remove, drain, clean, obliterate, retry, trim ---------------------------------------


def test_remove(queue: Queue, redis_url: str, redis_client: redis.Redis) -> None:
    done = queue.add("c")
    with worker(queue.name, redis_url, lambda j: j.name):
        assert done.wait_until_finished(timeout=WAIT) == "c"
    waiting = queue.add("w")
    urgent = queue.add("u", priority=1)
    delayed = queue.add("d", delay=60)
    for job in (waiting, urgent, delayed, done):
        assert queue.remove(job.id) is True
        assert queue.get_job(job.id) is None
        assert queue.get_job_state(job.id) == "unknown"
        assert queue.remove(job.id) is False
    assert queue.remove("no-such-job") is False
    assert queue.get_job_counts() == dict.fromkeys(STATES, 0)
    removed = {e[1]: e[2]["prev"].decode() for e in stream(redis_client, queue.name)
               if e[0] == "removed"}
    assert removed == {
        waiting.id: "waiting", urgent.id: "waiting", delayed.id: "delayed", done.id: "completed",
    }


def test_remove_waiting_and_prioritized_jobs(queue: Queue, redis_client: redis.Redis) -> None:
    waiting = queue.add("w")
    urgent = queue.add("u", priority=1)
    other = queue.add("o")
    assert queue.remove(waiting.id) is True
    assert urgent.remove() is True
    assert [j.id for j in queue.get_jobs("waiting")] == [other.id]
    assert queue.get_job_counts("waiting") == {"waiting": 1}
    keys = queue_keys(redis_client, queue.name)
    assert f"jobq:{{{queue.name}}}:job:{waiting.id}".encode() not in keys


def test_remove_failed_job_and_its_logs(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    def processor(job: jobq.Job) -> None:
        job.log("about to fail")
        raise RuntimeError("no")

    job = queue.add("f")
    run_all(queue, redis_url, processor, [job])
    assert queue.get_job_state(job.id) == "failed"
    assert redis_client.exists(f"jobq:{{{queue.name}}}:logs:{job.id}") == 1
    assert queue.remove(job.id) is True
    assert redis_client.exists(f"jobq:{{{queue.name}}}:logs:{job.id}") == 0
    assert queue.get_job_counts("failed") == {"failed": 0}


def test_remove_active_job_with_lock_held_raises_naming_cancel(
    queue: Queue, redis_url: str
) -> None:
    started, release = threading.Event(), threading.Event()

    def processor(job: jobq.Job) -> str:
        started.set()
        assert release.wait(WAIT)
        return "finished"

    job = queue.add("busy")
    with worker(queue.name, redis_url, processor):
        try:
            assert started.wait(WAIT)
            assert queue.get_job_state(job.id) == "active"
            with pytest.raises(jobq.JobqError, match="cancel"):
                queue.remove(job.id)
            with pytest.raises(jobq.JobqError, match="cancel"):
                job.remove()
            assert queue.get_job_state(job.id) == "active"
        finally:
            release.set()
        assert job.wait_until_finished(timeout=WAIT) == "finished"


def test_drain_keeps_delayed_by_default(queue: Queue, redis_client: redis.Redis) -> None:
    a = queue.add("a")
    queue.add("b", priority=2)
    delayed = queue.add("d", delay=60)
    assert queue.drain() == 2
    assert queue.get_job_counts("waiting", "delayed") == {"waiting": 0, "delayed": 1}
    assert queue.get_job(a.id) is None
    assert queue.get_job_state(delayed.id) == "delayed"
    assert names(stream(redis_client, queue.name, a.id))[-1] == "removed"


def test_drain_with_delayed(queue: Queue, redis_client: redis.Redis) -> None:
    queue.add_bulk([{"name": "w", "data": i} for i in range(1200)])
    queue.add_bulk([{"name": "d", "data": i, "delay": 60} for i in range(30)])
    queue.add("p", priority=4)
    assert queue.drain(delayed=True) == 1231
    assert queue.get_job_counts() == dict.fromkeys(STATES, 0)
    leftover = [k for k in queue_keys(redis_client, queue.name) if b":job:" in k]
    assert leftover == []


def test_clean_completed_respects_grace(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    old = queue.add("old")
    with worker(queue.name, redis_url, lambda j: j.name):
        assert old.wait_until_finished(timeout=WAIT) == "old"
        # Added after "old" finished and due a second later: the two
        # finish times are at least a second apart however slow the run.
        new = queue.add("new", delay=1.0)
        assert new.wait_until_finished(timeout=WAIT) == "new"
    assert queue.clean(60) == []
    old_done, new_done = (old.refresh().finished_on, new.refresh().finished_on)
    assert old_done is not None and new_done is not None
    assert new_done - old_done >= 1.0
    # A grace that puts the cutoff half-way between the two finish times
    # (the server's clock decides; the call follows within half a second).
    secs, micros = redis_client.time()
    grace = secs + micros / 1e6 - (old_done + new_done) / 2
    assert queue.clean(grace) == [old.id]
    assert queue.get_job(old.id) is None
    assert queue.get_job_state(new.id) == "completed"
    assert queue.get_job_counts("completed") == {"completed": 1}
    cleaned = [e for e in stream(redis_client, queue.name) if e[0] == "cleaned"]
    assert len(cleaned) == 1
    assert int(cleaned[0][2]["count"]) == 1


def test_clean_limit(queue: Queue, redis_url: str) -> None:
    jobs = queue.add_bulk([{"name": "n", "data": i} for i in range(5)])
    run_all(queue, redis_url, lambda j: j.data, jobs)
    assert queue.get_job_counts("completed") == {"completed": 5}
    first = queue.clean(0, limit=2)
    assert len(first) == 2
    assert queue.get_job_counts("completed") == {"completed": 3}
    rest = queue.clean(0)
    assert len(rest) == 3
    assert set(first) | set(rest) == {j.id for j in jobs}
    assert queue.clean(0) == []


def test_clean_failed_delayed_and_waiting(queue: Queue, redis_url: str) -> None:
    failing = queue.add("f")
    run_all(queue, redis_url, fail, [failing])
    assert queue.clean(0, state="completed") == []
    assert queue.clean(0, state="failed") == [failing.id]
    assert queue.get_job(failing.id) is None

    delayed = queue.add("d", delay=60)
    assert queue.clean(60, state="delayed") == []
    assert queue.clean(0, state="delayed") == [delayed.id]
    assert queue.get_job_counts("delayed") == {"delayed": 0}

    w1 = queue.add("w1")
    w2 = queue.add("w2", priority=3)
    assert queue.clean(60, state="waiting") == []
    assert sorted(queue.clean(0, state="waiting")) == sorted([w1.id, w2.id])
    assert queue.get_job_counts() == dict.fromkeys(STATES, 0)


@pytest.mark.parametrize(
    "kwargs",
    [{"state": "active"}, {"state": "bogus"}, {"limit": -1}, {"limit": 1.5},
     {"grace": 1e308}],
)
def test_clean_bad_arguments(queue: Queue, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        queue.clean(**{"grace": 0, **kwargs})


def test_indices_past_64_bits_and_bad_log_text_raise_value_error(queue: Queue) -> None:
    job = queue.add("x", delay=60)
    for call in (lambda: job.get_logs(0, 2**64), lambda: queue.get_jobs("delayed", 0, 2**64),
                 lambda: queue.get_jobs("waiting", -(2**63) - 1), lambda: queue.trim_events(2**64)):
        with pytest.raises(ValueError, match="must be a 64-bit int"):
            call()
    with pytest.raises(ValueError, match="log message is not valid text"):
        job.log("half a pair \udc80")
    assert job.get_logs() == []


def test_every_write_of_a_value_keeps_to_max_payload_bytes(
    queue_name: str, redis_url: str
) -> None:
    """Only add checked the limit: update_data, update_progress, log, emit
    and a scheduler's data wrote megabytes (progress and custom events
    into the event stream)."""
    big = "x" * 200
    with Queue(queue_name, connection=redis_url, max_payload_bytes=100) as q:
        job = q.add("x", "small")
        writes = {
            "job data": lambda: job.update_data(big),
            "progress": lambda: job.update_progress(big),
            "log line": lambda: job.log(big),
            "event 'custom'": lambda: q.emit("custom", v=big),
            "scheduler data": lambda: q.upsert_scheduler("s", every=60, data=big),
        }
        for what, write in writes.items():
            with pytest.raises(PayloadTooLarge, match=f"{what} encodes to .*_bytes=100"):
                write()
        job.update_progress("ok")  # under the limit
        fresh = q.get_job(job.id)
        assert fresh is not None and fresh.data == "small" and fresh.progress == "ok"
        assert job.get_logs() == [] and q.get_schedulers() == []
        # the limit may be changed: an assignment was kept and never applied
        q.max_payload_bytes = 1000
        assert q.max_payload_bytes == 1000 and q.add("x", big).data == big
        q.max_payload_bytes = 10
        with pytest.raises(PayloadTooLarge, match="_bytes=10;"):
            q.add("x", "a bit more than ten")
        with pytest.raises(ValueError, match="max_payload_bytes"):
            q.max_payload_bytes = -1  # type: ignore[assignment]
        assert q.max_payload_bytes == 10


def test_settings_set_by_hand_to_no_number_count_as_unset(
    queue_name: str, redis_url: str, redis_client: redis.Redis
) -> None:
    """A max_events or result TTL that is no whole number (set by hand) broke
    every first use of the queue with int()'s ValueError, where the
    scripts take it for unset."""
    redis_client.hset(f"jobq:{{{queue_name}}}:meta", mapping={"maxev": "abc", "rttl": "x"})
    with Queue(queue_name, connection=redis_url) as q:
        assert q.add("x").get_state() == "waiting"
        assert (q.max_events, q.result_ttl) == (10_000, 60.0)


def test_a_queue_stores_its_settings_again_after_the_server_lost_them(
    queue_name: str, redis_url: str, redis_client: redis.Redis
) -> None:
    """Settings were written on a Queue's first use alone: after the server
    lost its data (FLUSHALL, a restart without persistence), a process ran
    on with the defaults (stream mode, 10,000 events, a 60 s result TTL)
    and its queue unlisted, until it made a new Queue. The first add that
    finds them gone stores them again, and lists the queue."""
    meta = f"jobq:{{{queue_name}}}:meta"
    known = jobq.keys.queues_key("jobq")
    with Queue(queue_name, connection=redis_url, event_mode="pubsub", max_events=500,
               result_ttl=5) as q:
        q.add("x")
        assert redis_client.sismember(known, queue_name)
        stored = redis_client.hgetall(meta)
        # its database (see test_databases.py); sp: in a cluster, its events
        # are published on its own node
        in_cluster = os.environ.get("JOBQ_TEST_CLUSTER") == "1"
        assert stored == {b"em": b"pubsub", b"maxev": b"500", b"rttl": b"5000", b"cfg": b"1",
                          b"db": b"0", **({b"sp": b"1"} if in_cluster else {})}
        redis_client.delete(meta)  # as FLUSHALL leaves them
        redis_client.srem(known, queue_name)
        q.add("x")  # written with the defaults: it finds them gone
        assert redis_client.hgetall(meta) == stored
        assert redis_client.sismember(known, queue_name)
        assert q.get_job_counts("waiting") == {"waiting": 2}
        assert (q.event_mode, q.max_events, q.result_ttl) == ("pubsub", 500, 5.0)


def test_a_client_whose_pool_cannot_lend_two_connections_is_refused(
    queue_name: str, redis_url: str
) -> None:
    """jobq keeps one connection of a caller's pool for its calls, and
    loading its scripts takes another: with a pool of one, every add
    failed, and so did the caller's own commands while the Queue was open."""
    url = redis_url.replace("redis+cluster://", "redis://", 1)
    for pool in (redis.ConnectionPool.from_url(url, max_connections=1),
                 redis.BlockingConnectionPool.from_url(url, max_connections=1, timeout=1)):
        with redis.Redis(connection_pool=pool) as client:
            with pytest.raises(ValueError, match="pool of at least 2"):
                Queue(queue_name, connection=client)
            assert client.ping()  # the caller's own client is left as it was
    if url != redis_url:  # a cluster's node: a plain client reaches one slot range
        return
    with redis.Redis(connection_pool=redis.ConnectionPool.from_url(url, max_connections=2)) \
            as client, Queue(queue_name, connection=client) as q:
        assert q.add("x").get_state() == "waiting"
        assert client.ping()


def test_a_pool_of_the_callers_with_no_connection_free_is_said_so_not_the_server_away(
    queue_name: str, redis_url: str
) -> None:
    """A first call while the caller's threads held every connection of its
    pool said "cannot reach the Redis server", which had just answered."""
    from jobq.connection import take_connection

    url = redis_url.replace("redis+cluster://", "redis://", 1)
    for pool in (redis.ConnectionPool.from_url(url, max_connections=2),
                 redis.BlockingConnectionPool.from_url(url, max_connections=2, timeout=0.2)):
        with redis.Redis(connection_pool=pool) as client:
            held = [take_connection(pool) for _ in range(2)]  # the app's threads'
            try:
                with Queue(queue_name, connection=client) as q, \
                        pytest.raises(redis.ConnectionError) as caught:
                    q.add("x")
                assert str(caught.value).startswith("no connection free in the client's pool")
                assert "max_connections=2" in str(caught.value)
                chain, error = [], caught.value  # redis-py 5's: no failed first try in it
                while error is not None and len(chain) < 10:
                    chain.append(type(error))
                    error = error.__cause__ or error.__context__
                assert TypeError not in chain, chain
            finally:
                for connection in held:
                    pool.release(connection)
                pool.disconnect()  # the caller's pool: its client does not close it


def test_drain_takes_a_bool(queue: Queue) -> None:
    queue.add("d", delay=60)
    with pytest.raises(ValueError, match="delayed must be a bool"):
        queue.drain(delayed="no")  # type: ignore[arg-type]
    assert queue.get_job_counts("delayed") == {"delayed": 1}


def test_every_yes_no_argument_takes_a_bool(queue: Queue, redis_url: str) -> None:
    # "no" is truthy: taken as yes, it would obliterate, retry from scratch...
    job = queue.add("f")
    calls: list[tuple[str, Any]] = [
        ("force", lambda: queue.obliterate(force="no")),
        ("reset_attempts", lambda: queue.retry_jobs(reset_attempts="no")),
        ("reset_attempts", lambda: job.retry(reset_attempts="no")),
        ("asc", lambda: queue.get_jobs("waiting", asc="no")),
        ("autorun", lambda: QueueEvents(queue.name, connection=redis_url, autorun="no")),
        ("autorun", lambda: Worker(queue.name, print, connection=redis_url, autorun=1)),
    ]
    worker = Worker(queue.name, print, connection=redis_url)
    calls += [("force", lambda: worker.close(force="no")),
              ("wait", lambda: worker.pause(wait="no"))]
    for name, call in calls:
        with pytest.raises(ValueError, match=f"{name} must be a bool"):
            call()
    worker.close()
    assert queue.get_job_state(job.id) == "waiting"


def test_the_jobs_of_a_bulk_add_and_the_states_of_a_listing_are_checked(queue: Queue) -> None:
    for jobs in (None, 5, {"name": "x"}, "x"):
        with pytest.raises(TypeError, match="jobs must be an iterable of job dicts"):
            queue.add_bulk(jobs)  # type: ignore[arg-type]
    for states in (None, 5, b"waiting", {"waiting": 1}):
        with pytest.raises(TypeError, match="states must be a state name or a list"):
            queue.get_jobs(states)  # type: ignore[arg-type]
    assert queue.get_job_counts() == {s: 0 for s in queue.get_job_counts()}


def test_clean_negative_grace(queue: Queue) -> None:
    with pytest.raises(ValueError, match="grace must be >= 0"):
        queue.clean(-1)
    with pytest.raises(ValueError, match="grace must be a number of seconds"):
        queue.clean(float("nan"))


def test_obliterate_removes_everything(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    done = queue.add("ok")
    failed = queue.add("bad")

    def processor(job: jobq.Job) -> str:
        job.log("line")
        job.update_progress(50)
        if job.name == "bad":
            raise RuntimeError("no")
        return "ok"

    run_all(queue, redis_url, processor, [done, failed])
    queue.add("w")
    queue.add("p", priority=1)
    queue.add("d", delay=60)
    queue.add("c", job_id="custom-id")
    queue.pause()
    assert queue_keys(redis_client, queue.name) != []
    queue.obliterate()
    assert kept_keys(redis_client, queue.name) == []
    assert queue.get_job_counts() == dict.fromkeys(STATES, 0)
    assert queue.is_paused() is False


def test_obliterate_many_jobs(queue: Queue, redis_client: redis.Redis) -> None:
    queue.add_bulk([{"name": "n", "data": i} for i in range(2500)])
    queue.add_bulk([{"name": "n", "data": i, "delay": 60} for i in range(1100)])
    queue.obliterate()
    assert kept_keys(redis_client, queue.name) == []


def test_obliterate_takes_all_or_nothing_while_a_worker_takes_jobs(
    queue: Queue, redis_url: str
) -> None:
    """A worker taking a job between two of obliterate's batches made the
    next batch refuse, after the first batches were gone: the queue is
    held paused from the first batch, which alone may refuse."""
    limiter = {"max": 1, "duration": 0.01}  # a take now and then, each one brief
    with worker(queue.name, redis_url, lambda job: None, limiter=limiter):
        for _ in range(8):
            queue.add_bulk([{"name": "n", "data": i} for i in range(4000)])
            try:
                queue.obliterate()
            except JobqError:  # refused: nothing deleted (a job taken is completed)
                assert sum(queue.get_job_counts().values()) == 4000
            else:
                assert sum(queue.get_job_counts().values()) == 0
            queue.obliterate(force=True)


def test_obliterate_refuses_with_active_jobs_unless_forced(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    started, release = threading.Event(), threading.Event()

    def processor(job: jobq.Job) -> str:
        started.set()
        assert release.wait(WAIT)
        return "late"

    job = queue.add("busy")
    queue.add("other", delay=60)
    with worker(queue.name, redis_url, processor):
        try:
            assert started.wait(WAIT)
            with pytest.raises(JobqError):
                queue.obliterate()
            assert queue.get_job_state(job.id) == "active"
            assert queue.get_job_counts("delayed") == {"delayed": 1}
            queue.obliterate(force=True)
            assert job_keys(redis_client, queue.name) == []
        finally:
            release.set()
    # the worker's late result was discarded: nothing came back
    assert queue.get_job(job.id) is None
    assert job_keys(redis_client, queue.name) == []


def job_keys(client: redis.Redis, queue_name: str) -> list[bytes]:
    """The queue's keys but those a worker still running on an obliterated
    queue may write again: the guard key of its stalled check, and its entry
    in the worker registry (its first heartbeat may come after obliterate)."""
    return [k for k in kept_keys(client, queue_name)
            if not k.endswith((b":stalled-check", b":workers")) and b":worker:" not in k]


def test_retry_jobs(queue: Queue, redis_url: str, redis_client: redis.Redis) -> None:
    jobs = queue.add_bulk([{"name": "n", "data": i} for i in range(3)])
    first_pass = threading.Event()

    def processor(job: jobq.Job) -> str:
        if not first_pass.is_set():
            raise RuntimeError("first pass")
        return f"ok {job.data}"

    run_all(queue, redis_url, processor, jobs)
    assert queue.get_job_counts("failed") == {"failed": 3}
    first_pass.set()
    assert queue.retry_jobs() == 3
    assert queue.get_job_counts("failed", "waiting") == {"failed": 0, "waiting": 3}
    with worker(queue.name, redis_url, processor):
        results = [job.wait_until_finished(timeout=WAIT) for job in jobs]
    assert results == ["ok 0", "ok 1", "ok 2"]
    for job in jobs:
        job.refresh()
        assert job.attempts_made == 2  # the failed one and the one that completed
        assert job.failed_reason is None
    assert queue.retry_jobs() == 0
    with pytest.raises(ValueError):
        queue.retry_jobs("waiting")
    waiting_events = [e for e in stream(redis_client, queue.name, jobs[0].id) if e[0] == "waiting"]
    assert waiting_events[-1][2]["prev"] == b"failed"


def test_retry_completed_jobs(queue: Queue, redis_url: str) -> None:
    count = []
    job = queue.add("n")
    with worker(queue.name, redis_url, lambda j: count.append(1) or len(count)):
        assert job.wait_until_finished(timeout=WAIT) == 1
        assert queue.retry_jobs("completed") == 1
        assert job.wait_until_finished(timeout=WAIT) == 2
    assert queue.get_job_result(job.id) == 2


def test_trim_events(queue: Queue, redis_client: redis.Redis) -> None:
    queue.add_bulk([{"name": "n", "data": i} for i in range(1000)])
    key = f"jobq:{{{queue.name}}}:events"
    before = redis_client.xlen(key)
    assert before == 1000  # one entry per job: added + waiting
    trimmed = queue.trim_events(100)
    after = redis_client.xlen(key)
    assert trimmed == before - after
    assert 100 <= after <= 300  # trimming is approximate
    with pytest.raises(ValueError):
        queue.trim_events(-1)


def test_max_events_bounds_the_stream(queue_name: str, redis_url: str,
                                      redis_client: redis.Redis) -> None:
    with Queue(queue_name, connection=redis_url, max_events=200) as q:
        q.add_bulk([{"name": "n", "data": i} for i in range(2000)])
    assert redis_client.xlen(f"jobq:{{{queue_name}}}:events") <= 400


# -- retention ----------------------------------------------------------------------


def test_remove_on_complete_true(queue: Queue, redis_url: str, redis_client: redis.Redis) -> None:
    job = queue.add("n", 1, remove_on_complete=True)
    assert job.opts["remove_on_complete"] is True
    assert queue.events.wait_until_ready(WAIT)  # so the waiter reads the completed event
    with worker(queue.name, redis_url, lambda j: j.data + 1):
        assert job.wait_until_finished(timeout=WAIT) == 2
    assert queue.get_job(job.id) is None
    assert queue.get_job_counts("completed") == {"completed": 0}
    completed = [e for e in stream(redis_client, queue.name, job.id) if e[0] == "completed"]
    assert len(completed) == 1


def test_remove_on_fail_true(queue: Queue, redis_url: str) -> None:
    job = queue.add("n", 1, remove_on_fail=True, attempts=2)
    seen = []
    done = threading.Event()

    def processor(j: jobq.Job) -> None:
        seen.append(j.attempts_made)
        if len(seen) == 2:
            done.set()
        raise RuntimeError("no")

    with worker(queue.name, redis_url, processor):
        assert done.wait(WAIT)
        with pytest.raises((jobq.JobFailedError, jobq.JobNotFoundError)):
            job.wait_until_finished(timeout=WAIT)
    assert seen == [0, 1]  # the record survived the first, retried failure
    assert queue.get_job(job.id) is None
    assert queue.get_job_counts("failed") == {"failed": 0}


def test_remove_on_complete_keeps_newest_n(queue: Queue, redis_url: str) -> None:
    jobs = [queue.add("n", i, remove_on_complete=2) for i in range(5)]
    run_order(queue.name, redis_url, 5)
    assert queue.get_job_counts("completed") == {"completed": 2}
    kept = [j.id for j in jobs if queue.get_job(j.id) is not None]
    assert kept == [jobs[3].id, jobs[4].id]


def test_remove_on_fail_keeps_newest_n(queue: Queue, redis_url: str) -> None:
    jobs = [queue.add("f", i, remove_on_fail=1) for i in range(3)]
    run_all(queue, redis_url, fail, jobs)
    assert queue.get_job_counts("failed") == {"failed": 1}
    assert [j.id for j in jobs if queue.get_job(j.id) is not None] == [jobs[2].id]


def test_remove_on_complete_count_dict(queue: Queue, redis_url: str) -> None:
    jobs = [queue.add("n", i, remove_on_complete={"count": 1}) for i in range(3)]
    run_all(queue, redis_url, lambda j: j.data, jobs)
    assert [j.id for j in jobs if queue.get_job(j.id) is not None] == [jobs[2].id]


def test_remove_on_complete_age(queue: Queue, redis_url: str) -> None:
    old = queue.add("old", remove_on_complete={"age": 0.1})
    with worker(queue.name, redis_url, lambda j: j.name):
        assert old.wait_until_finished(timeout=WAIT) == "old"
        assert queue.get_job_state(old.id) == "completed"
        # added after `old` finished and due 0.6 s later, however slow the run
        new = queue.add("new", delay=0.6, remove_on_complete={"age": 0.1})
        assert new.wait_until_finished(timeout=WAIT) == "new"
    # finishing `new` removed `old`, finished at least 0.6 s before
    assert queue.get_job(old.id) is None
    assert queue.get_job_state(new.id) == "completed"


# -- event mode, defaults, close --------------------------------------------------------------


def test_event_mode_is_stored(queue_name: str, redis_url: str) -> None:
    with Queue(queue_name, connection=redis_url, event_mode="pubsub") as q:
        assert q.event_mode == "pubsub"
    with Queue(queue_name, connection=redis_url) as q:
        assert q.event_mode == "pubsub"
    with Queue(queue_name, connection=redis_url, event_mode="pubsub") as q:
        assert q.event_mode == "pubsub"
        job = q.add("n")
        assert q.get_job_state(job.id) == "waiting"
    with Queue(queue_name, connection=redis_url, event_mode="stream") as other:
        with pytest.raises(JobqError):
            other.count()  # checked on first use (no I/O in the constructor)


def test_pubsub_queue_writes_no_event_stream(
    queue_name: str, redis_url: str, redis_client: redis.Redis
) -> None:
    with Queue(queue_name, connection=redis_url, event_mode="pubsub") as q:
        q.add("n")
        q.pause()
    # only the marker that moves readers begun on the stream, gone in a minute
    key = f"jobq:{{{queue_name}}}:events"
    assert [fields for _, fields in redis_client.xrange(key)] == [{b"ev": b"__jobq_mode__"}]
    assert 0 < redis_client.pttl(key) <= 60_000


def test_default_event_mode_is_stream(queue: Queue, queue_name: str, redis_url: str) -> None:
    assert queue.event_mode == "stream"
    with Queue(queue_name, connection=redis_url, event_mode="stream") as q:
        assert q.event_mode == "stream"
    with Queue(queue_name, connection=redis_url, event_mode="pubsub") as other:
        with pytest.raises(JobqError):
            other.count()  # checked on first use (no I/O in the constructor)


def test_bad_event_mode(queue_name: str, redis_url: str) -> None:
    with pytest.raises(ValueError):
        Queue(queue_name, connection=redis_url, event_mode="kafka")


def test_default_job_options(queue_name: str, redis_url: str) -> None:
    defaults = {"attempts": 3, "priority": 2, "remove_on_complete": 5}
    with Queue(queue_name, connection=redis_url, default_job_options=defaults) as q:
        job = q.add("n")
        assert job.opts["attempts"] == 3
        assert job.opts["priority"] == 2
        assert job.priority == 2
        stored = q.get_job(job.id)
        assert stored is not None
        assert stored.opts["attempts"] == 3
        assert stored.opts["remove_on_complete"] == {"count": 5, "age": None}
        override = q.add("m", attempts=1)
        assert override.opts["attempts"] == 1
        assert override.opts["priority"] == 2
        [bulk] = q.add_bulk([{"name": "b"}])
        assert bulk.opts["attempts"] == 3
    assert defaults == {"attempts": 3, "priority": 2, "remove_on_complete": 5}


@pytest.mark.parametrize(
    ("defaults", "error"),
    [({"bogus": 1}, TypeError), ({"attempts": 0}, ValueError), ({"job_id": "one"}, ValueError),
     # every add of the queue was then that one job: adds of other names and data lost
     ({"dedup": {"id": "one"}}, ValueError), ({"dedup": {"id": "one", "ttl": 60}}, ValueError)],
)
def test_bad_default_job_options(
    queue_name: str, redis_url: str, defaults: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        Queue(queue_name, connection=redis_url, default_job_options=defaults)


def test_close_and_context_manager(queue_name: str, redis_url: str) -> None:
    with Queue(queue_name, connection=redis_url) as q:
        assert "open" in repr(q)
        q.add("n")
    assert "closed" in repr(q)
    with pytest.raises(ClosedError):
        q.add("n")
    with pytest.raises(ClosedError):
        q.add_bulk([{"name": "n"}])
    q.close()  # idempotent


def test_every_method_of_a_closed_queue_raises_closed_error(
    queue_name: str, redis_url: str
) -> None:
    with Queue(queue_name, connection=redis_url) as q:
        job = q.add("n")
    calls: list[Callable[[], object]] = [
        q.count, q.get_job_counts, q.pause, q.resume, q.is_paused, q.drain,
        q.obliterate, q.retry_jobs, lambda: q.get_job(job.id),
        lambda: q.get_job_state(job.id), lambda: q.get_jobs("waiting"),
        lambda: q.remove(job.id), lambda: q.clean(0), lambda: q.emit("custom"),
        lambda: q.events, job.get_state, job.refresh, job.promote, job.remove,
    ]
    for call in calls:
        with pytest.raises(ClosedError):
            call()


def test_close_does_not_close_a_callers_client(queue_name: str, redis_client: redis.Redis) -> None:
    with Queue(queue_name, connection=redis_client) as q:
        q.add("n")
    assert redis_client.ping() is True
    with Queue(queue_name, connection=redis_client) as q:
        assert q.count() == 1


def test_decode_responses_client_rejected(queue_name: str, redis_server: Any) -> None:
    client = redis_server.client(decode_responses=True)
    try:
        with pytest.raises(ValueError):
            Queue(queue_name, connection=client)
    finally:
        client.close()


def test_queues_with_different_prefixes_are_separate(
    queue_name: str, redis_url: str, redis_client: redis.Redis
) -> None:
    with Queue(queue_name, connection=redis_url) as a, Queue(
        queue_name, connection=redis_url, prefix="other"
    ) as b:
        a.add("n")
        assert b.count() == 0
        b.add("m")
        b.add("m")
        assert a.count() == 1
        assert b.count() == 2
        assert redis_client.keys(f"other:{{{queue_name}}}:*") != []
        b.obliterate()


@pytest.mark.parametrize(
    "data",
    [
        None, True, 0, -1, 2**63 - 1, -(2**63), 2**64 - 1, 1.5, -0.25, "", "héllo ✓",
        b"\x00\xffbytes", [], [1, [2, [3]]], {}, {"a": {"b": [None, b"x", 1.0]}},
        "x" * 100_000,
    ],
    ids=repr,
)
def test_data_round_trips(queue: Queue, redis_url: str, data: Any) -> None:
    job = queue.add("n", data)
    stored = queue.get_job(job.id)
    assert stored is not None
    assert stored.data == data
    assert type(stored.data) is type(data)
    seen: list[Any] = []
    with worker(queue.name, redis_url, lambda j: seen.append(j.data) or j.data):
        assert job.wait_until_finished(timeout=WAIT) == data
    assert seen == [data]
    assert queue.get_job_result(job.id) == data


def test_get_jobs_of_finished_states(queue: Queue, redis_url: str) -> None:
    jobs = [queue.add(f"j{i}", i) for i in range(3)]
    bad = queue.add("bad")

    def processor(job: jobq.Job) -> int:
        if job.name == "bad":
            raise RuntimeError("no")
        return int(job.data)

    run_all(queue, redis_url, processor, [*jobs, bad])
    completed = queue.get_jobs("completed")
    assert [j.id for j in completed] == [j.id for j in reversed(jobs)]
    assert [j.return_value for j in completed] == [2, 1, 0]
    assert [j.id for j in queue.get_jobs("completed", asc=True)] == [j.id for j in jobs]
    [failed] = queue.get_jobs("failed")
    assert failed.id == bad.id and failed.failed_reason == "RuntimeError: no"
    assert len(queue.get_jobs(["completed", "failed"])) == 4
    assert queue.get_jobs("active") == []


def test_scripts_are_loaded_again_after_a_function_flush(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """A restarted server without persistence, or FUNCTION FLUSH: the next
    call loads the library again, whichever path it takes."""
    queue.add("before")
    redis_client.function_flush()
    job = queue.add("after")  # a script that is never resent
    assert queue.get_job_state(job.id) == "waiting"
    redis_client.function_flush()
    assert queue.get_job_counts("waiting") == {"waiting": 2}  # a resendable one


@pytest.mark.parametrize("shards", [0, 2])
def test_a_queue_never_closed_lets_go_of_its_threads_and_connections_once_dropped(
    queue_name: str, redis_url: str, redis_client: redis.Redis, shards: int
) -> None:
    """A Queue made for one request (as RQ's users make theirs) and never
    closed: each one kept its events reader's three threads and its
    connections for the life of the process."""
    import gc

    from jobq import ShardedQueue
    from tests.conftest import echo
    from tests.polling import jobq_threads, until

    def request(i: int) -> Any:
        queue: Any = (ShardedQueue(queue_name, shards=shards, connection=redis_url)
                      if shards else Queue(queue_name, connection=redis_url))
        return queue.add("x", i).wait_until_finished(timeout=WAIT)

    def readers() -> list[str]:
        return [t for t in jobq_threads(queue_name) if t.startswith(
            ("jobq-events-", "jobq-dispatch-", "jobq-wake-", "jobq-release-"))]

    with Worker(queue_name, echo, connection=redis_url, shards=shards or None):
        assert request(0) == 0  # the worker has all its connections by then
        gc.collect()  # a Queue's references may form cycles
        until(lambda: not readers(), WAIT)
        before = len(redis_client.client_list())
        assert [request(i) for i in range(5)] == list(range(5))
        gc.collect()
        until(lambda: not readers(), WAIT)
        until(lambda: len(redis_client.client_list()) <= before, WAIT)


def test_a_close_interrupted_while_a_listener_runs_still_lets_go_of_the_connections(
    queue_name: str, redis_url: str, redis_client: redis.Redis
) -> None:
    """A Ctrl-C while Queue.close() waited for its events' listener to
    return: the reader closed, but the close stopped there and the queue's
    connections stayed open."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("a SIGINT raises KeyboardInterrupt in the main thread only")
    before = len(redis_client.client_list())
    entered, release = threading.Event(), threading.Event()
    queue = Queue(queue_name, connection=redis_url)

    def listener(event: Any) -> None:
        entered.set()
        release.wait(WAIT)

    queue.events.on("added", listener)
    assert queue.events.wait_until_ready(WAIT)
    queue.add("x")
    assert entered.wait(WAIT)
    timer = threading.Timer(0.3, signal.pthread_kill,
                            (threading.main_thread().ident, signal.SIGINT))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            queue.close()  # waits for the listener
    finally:
        timer.join(WAIT)
        signal.signal(signal.SIGINT, previous)
        release.set()
    until(lambda: len(redis_client.client_list()) <= before, WAIT)
    with pytest.raises(jobq.ClosedError):
        queue.add("y")


def test_a_record_that_may_be_delayed_carries_its_priority_for_workers_of_0_1(
    queue: Queue, redis_client: redis.Redis
) -> None:
    """0.1's take promoted a due delayed job only when its record had a
    priority field, and dropped one without it (the job stayed "delayed",
    in no list, for good). Records left the default priority out: a
    delayed job (or one retried after a backoff) added during a rolling
    upgrade, or kept over a rollback, was lost on a 0.1 worker. A record
    that may be delayed stores it; others stay without (less memory)."""
    lean = [queue.add("plain"), queue.add_bulk([{"name": "bulk"}])[0],
            queue.add("plain2")]
    jobs = [queue.add("later", delay=60), queue.add("retried", attempts=2, backoff=1)]
    jobs += queue.add_bulk([{"name": "bulk", "delay": 60}, {"name": "bulk", "attempts": 3}])
    debounce = {"id": "k", "replace": True}
    jobs.append(queue.add("debounced", 1, delay=60, dedup=debounce))
    assert queue.add("debounced", 2, delay=60, dedup=debounce).id == jobs[-1].id
    jobs.append(queue.add("child", delay=60, depends_on=[lean[0]]))  # addFlow.lua
    queue.upsert_scheduler("tick", every=3600)
    ticks = [j for j in queue.get_jobs("waiting") if j.id.startswith("repeat:")]
    assert len(ticks) == 1

    def priority(job: Job) -> bytes | None:
        value: bytes | None = redis_client.hget(queue._context.keys.job(job.id), "priority")
        return value

    assert [priority(job) for job in [*jobs, *ticks]] == [b"0"] * (len(jobs) + 1)
    assert [priority(job) for job in lean] == [None] * len(lean)
