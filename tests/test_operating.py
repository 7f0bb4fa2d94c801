"""Worker registry, per-minute metrics and the Prometheus text, in-process."""

from __future__ import annotations

import logging
import threading
import time

import pytest
import redis

import jobq
from jobq import Job, JobFailedError, Queue, Worker
from jobq.metrics import Metrics, prometheus_text
from tests.polling import until

WAIT = 20.0


def _run_known_jobs(queue: Queue, redis_url: str) -> None:
    """7 completed jobs; 3 jobs failing twice each (2 attempts): 3 terminal failures."""

    def handler(job: Job) -> int:
        if job.name == "bad":
            raise ValueError("bad")
        return int(job.data)

    with Worker(queue.name, handler, connection=redis_url, concurrency=4):
        jobs = [queue.add("ok", n) for n in range(7)] + [
            queue.add("bad", attempts=2) for _ in range(3)
        ]
        for job in jobs:
            try:
                job.wait_until_finished(timeout=WAIT)
            except JobFailedError:
                pass


def test_metrics_count_a_known_number_of_jobs(queue: Queue, redis_url: str) -> None:
    empty = queue.get_metrics("completed")
    assert (empty.count, empty.data, empty.waited_for, empty.ran_for) == (0, [], 0.0, 0.0)
    _run_known_jobs(queue, redis_url)
    completed = queue.get_metrics("completed")
    failed = queue.get_metrics("failed")
    assert completed.count == 7 and failed.count == 3  # retried attempts are not failures
    # all within this minute (or straddling into the next one)
    assert sum(completed.data) == 7 and sum(failed.data) == 3
    assert 1 <= len(completed.data) <= 2
    assert completed.waited_for >= 0 and completed.ran_for >= 0
    assert abs(completed.timestamp - time.time()) < 60  # server clock, epoch seconds
    assert completed.per_minute(5) > 0
    with pytest.raises(ValueError):
        queue.get_metrics("stalled")


def test_metrics_roll_over_minutes_with_zeros_for_idle_ones(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    _run_known_jobs(queue, redis_url)
    # pretend the jobs so far finished 3 minutes ago: the next job rolls over
    key = f"jobq:{{{queue.name}}}:metrics:completed"
    minute = int(redis_client.hget(key, "min") or 0)
    redis_client.hset(key, "min", minute - 3)
    before = queue.get_metrics("completed")
    assert before.data[:4] == [0, 0, 0, 7]
    with Worker(queue.name, lambda job: 1, connection=redis_url):
        queue.add("ok").wait_until_finished(timeout=WAIT)
    after = queue.get_metrics("completed")
    assert after.count == 8
    assert after.data[:4] in ([1, 0, 0, 7], [0, 1, 0, 0])  # the minute may turn meanwhile
    assert queue.get_metrics("completed", 1, 2).data == after.data[1:3]
    assert queue.get_metrics("completed", 0, -2).data == after.data[:-1]
    assert redis_client.llen(key + ":data") == 3  # finished minutes only, bounded


def test_metrics_are_bounded(queue: Queue, redis_url: str, redis_client: redis.Redis) -> None:
    with Worker(queue.name, lambda job: 1, connection=redis_url):
        queue.add("ok").wait_until_finished(timeout=WAIT)
    key = f"jobq:{{{queue.name}}}:metrics:completed"
    minute = int(redis_client.hget(key, "min") or 0)
    redis_client.hset(key, "min", minute - 100_000)  # idle for ~70 days
    with Worker(queue.name, lambda job: 1, connection=redis_url):
        queue.add("ok").wait_until_finished(timeout=WAIT)
    assert redis_client.llen(key + ":data") == 1440
    metrics = queue.get_metrics("completed")
    assert len(metrics.data) == 1440 and sum(metrics.data) in (1, 2)


def test_registry_lists_live_workers_and_forgets_closed_ones(
    queue: Queue, redis_url: str
) -> None:
    assert queue.get_workers() == []
    release = threading.Event()

    def handler(job: Job) -> str:
        assert release.wait(WAIT)
        return "ok"

    # a beat every second: one late by up to two seconds keeps the entry (a
    # lapsed one would come back with a new `started`); a change of counts
    # is announced within a second whatever the ttl
    worker = Worker(queue.name, handler, connection=redis_url, concurrency=3, name="reg-w",
                    heartbeat_ttl=3.0)
    with worker:
        (info,) = until(queue.get_workers)
        assert (info.name, info.concurrency, info.queues) == ("reg-w", 3, (queue.name,))
        assert info.pid > 0 and info.host
        assert info.started <= info.last_heartbeat
        assert info.version == jobq.__version__  # which hosts an upgrade is done on
        job = queue.add("x")
        busy = until(lambda: [w for w in queue.get_workers() if w.jobs_active == 1])
        assert busy[0].jobs_done == 0
        release.set()
        job.wait_until_finished(timeout=WAIT)
        done = until(lambda: [w for w in queue.get_workers() if w.jobs_done == 1])
        assert done[0].jobs_active == 0 and done[0].started == info.started
    assert queue.get_workers() == []


def test_two_workers_given_one_name_are_told_and_one_leaving_keeps_the_other(
    queue: Queue, redis_url: str, redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Two processes started with one --name showed as one worker, and said
    nothing; the first to close removed the other's announcement too."""
    first = Worker(queue.name, lambda job: 1, connection=redis_url, name="twin",
                   heartbeat_ttl=0.6)  # a beat every 0.2 s
    second = Worker(queue.name, lambda job: 2, connection=redis_url, name="twin",
                    heartbeat_ttl=0.6)
    with caplog.at_level(logging.WARNING, logger="jobq"):
        with first, second:
            until(lambda: [r for r in caplog.records
                           if "another live worker is named 'twin'" in r.getMessage()],
                  timeout=WAIT)
            second.close()  # leaves the announcement if the last beat was the first's
            # the first is listed again at its next beat, and stays (its own beats)
            (info,) = until(queue.get_workers, timeout=WAIT)
            assert info.name == "twin"
            until(lambda: queue.get_workers()[0].last_heartbeat > info.last_heartbeat + 0.1,
                  timeout=WAIT)
        assert queue.get_workers() == []
    # a worker restarted after it was killed (its announcement left behind)
    # replaces that announcement, and is not told
    caplog.clear()
    key = queue._context.keys.worker("alone")
    redis_client.hset(key, mapping={"inst": "killed-before", "hb": 1, "host": "h"})
    redis_client.pexpire(key, 5000)
    with caplog.at_level(logging.WARNING, logger="jobq"):
        with Worker(queue.name, lambda job: 1, connection=redis_url, name="alone",
                    heartbeat_ttl=0.6):
            (info,) = until(queue.get_workers)
            until(lambda: queue.get_workers()[0].last_heartbeat > info.last_heartbeat + 0.3,
                  timeout=WAIT)  # beats after the first
    assert not [r for r in caplog.records if "another live worker" in r.getMessage()]


def test_a_close_whose_threads_use_up_their_grace_still_leaves_the_registry(
    queue: Queue, redis_url: str
) -> None:
    """A close with no timeout left the registry only while its threads'
    grace lasted, and not at all once it had cut a thread that did not end
    (its calls were refused from then on): on a busy machine the worker
    stayed listed until its heartbeat expired. Here the fetch thread is held
    before a write, as a thread slow to end would be."""
    from tests.held import Held

    held = Held("write", thread="jobq-fetch")
    client = redis.Redis(connection_pool=held.pool(redis_url))
    worker = Worker(queue.name, lambda job: 1, connection=client, name="slow-to-close")
    try:
        worker.start()
        until(queue.get_workers)
        held.armed.set()
        assert held.reached.wait(WAIT)
        worker.close()
        assert queue.get_workers() == []
    finally:
        held.released.set()
        for thread in threading.enumerate():
            if thread.name.startswith("jobq-fetch"):
                thread.join(WAIT)
        worker.close()
        client.close()


def test_a_worker_record_with_a_field_that_is_not_a_number_is_still_listed(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    """get_workers (and the dashboard's and CLI's lists) raised ValueError
    on one such field; it reads as 0, as the scripts read it."""
    with Worker(queue.name, lambda job: 1, connection=redis_url, name="odd-w"):
        until(queue.get_workers)
        # written at the first beat only: the next ones leave it as it is
        redis_client.hset(queue._context.keys.worker("odd-w"), "started", "yesterday")
        (info,) = queue.get_workers()
        assert (info.name, info.started) == ("odd-w", 0.0) and info.last_heartbeat > 0


def test_obliterate_removes_metrics_and_registry(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    _run_known_jobs(queue, redis_url)
    with Worker(queue.name, lambda job: 1, connection=redis_url, heartbeat_ttl=60):
        until(queue.get_workers)
        queue.obliterate(force=True)
        assert redis_client.keys(f"jobq:{{{queue.name}}}:worker*") == []
        assert redis_client.keys(f"jobq:{{{queue.name}}}:metrics*") == []
    # obliterate keeps the settings, the id counter and the (emptied) event
    # stream; the worker, still running after it, may have run its stalled
    # check once more (its guard key)
    kept = {f"jobq:{{{queue.name}}}:{k}".encode()
            for k in ("meta", "id", "events", "stalled-check")}
    assert set(redis_client.keys(f"jobq:{{{queue.name}}}:*")) <= kept
    assert queue.name.encode() not in redis_client.smembers("jobq:queues")


def test_a_member_of_the_queue_list_that_is_no_queue_name_is_left_out(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    """Written by another program (or by hand), it must not break every
    listing: the dashboard's overview, `jobq info`, `jobq metrics`."""
    from werkzeug import test as werkzeug_test

    from jobq.cli import main
    from jobq.dashboard import create_app
    from jobq.registry import known_queues

    queue.add("x")
    redis_client.sadd("jobq:queues", "bad name", "{tagged}")
    try:
        names = known_queues(redis_client, "jobq")
        assert queue.name in names and "bad name" not in names and "{tagged}" not in names
        with create_app(queue.client, cache_ttl=0) as dashboard:
            assert werkzeug_test.Client(dashboard).get("/").status_code == 200
        assert main(["--url", redis_url, "info"]) == 0
    finally:
        redis_client.srem("jobq:queues", "bad name", "{tagged}")


def test_one_queue_the_server_refuses_to_read_hides_no_other(
    queue: Queue, redis_url: str, redis_client: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    """A key of the wrong type in one queue (set by hand) made the overview
    502 and `jobq info` fail for every queue, with the exit code of Redis
    unreachable (3)."""
    from werkzeug import test as werkzeug_test

    from jobq.cli import main
    from jobq.dashboard import create_app

    queue.add("x")
    with Queue(f"{queue.name}-bad", connection=redis_url) as bad:
        bad.add("x")
        redis_client.set(f"jobq:{{{bad.name}}}:workers", "not a sorted set")
        try:
            with create_app(queue.client, cache_ttl=0) as dashboard:
                page = werkzeug_test.Client(dashboard).get("/")
                assert page.status_code == 200
                body = page.get_data(as_text=True)
                assert f'href="/queue?q={queue.name}"' in body and "Redis refused" in body
            capsys.readouterr()
            assert main(["--url", redis_url, "info", queue.name, bad.name]) == 1
            out, err = capsys.readouterr()
            assert queue.name in out and f"queue {bad.name}: Redis refused: WRONGTYPE" in err
        finally:
            redis_client.delete(f"jobq:{{{bad.name}}}:workers")
            bad.obliterate(force=True)


def test_prometheus_text_parses_back(queue: Queue, redis_url: str, queue_name: str,
                                     redis_client: redis.Redis) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    _run_known_jobs(queue, redis_url)
    queue.add("waiting")
    with Queue(f'{queue_name}-"odd"\\', connection=redis_url) as odd:
        odd.pause()
        # paused before any job, it is a known queue (`jobq metrics` with no
        # names serves it); a queue named twice has its series once
        assert odd.name.encode() in redis_client.smembers("jobq:queues")
        text = prometheus_text([queue, odd, queue])
        assert text.count(f'jobq_queue_paused{{queue="{queue.name}"}}') == 1
        families = {f.name: f for f in text_string_to_metric_families(text)}
        odd.obliterate()
    assert families["jobq_jobs"].type == "gauge"
    assert families["jobq_jobs_completed"].type == "counter"  # the parser drops _total
    assert families["jobq_job_run_seconds"].type == "summary"
    samples = {
        (s.name, s.labels.get("queue"), s.labels.get("state") or s.labels.get("status")): s.value
        for family in families.values() for s in family.samples
    }
    name = queue.name
    assert samples[("jobq_jobs", name, "waiting")] == 1
    assert samples[("jobq_jobs", name, "completed")] == 7
    assert samples[("jobq_jobs", name, "failed")] == 3
    assert samples[("jobq_jobs_completed_total", name, None)] == 7
    assert samples[("jobq_jobs_failed_total", name, None)] == 3
    assert samples[("jobq_job_wait_seconds_count", name, "completed")] == 7
    assert samples[("jobq_job_run_seconds_sum", name, "failed")] >= 0
    assert samples[("jobq_queue_paused", name, None)] == 0
    assert samples[("jobq_queue_paused", f'{queue_name}-"odd"\\', None)] == 1
    assert samples[("jobq_workers", name, None)] == 0


def test_queues_of_one_name_under_two_prefixes_are_told_apart(
    queue_name: str, redis_url: str
) -> None:
    """Two queues of one name under two prefixes made two series with the
    same labels (a scrape Prometheus refuses)."""
    from prometheus_client.parser import text_string_to_metric_families

    with Queue(queue_name, connection=redis_url, prefix="app1") as one, \
            Queue(queue_name, connection=redis_url, prefix="app2") as two:
        one.add("x")
        two.add_bulk([{"name": "x"}, {"name": "x"}])
        text = prometheus_text([one, two])
        lines = [line for line in text.splitlines() if not line.startswith("#")]
        assert len(lines) == len(set(line.rsplit(" ", 1)[0] for line in lines))
        waiting = {s.labels["prefix"]: s.value
                   for family in text_string_to_metric_families(text) for s in family.samples
                   if s.name == "jobq_jobs" and s.labels["state"] == "waiting"}
        assert waiting == {"app1": 1, "app2": 2}
        assert "prefix=" not in prometheus_text([one])  # one prefix: the labels as before
        one.obliterate(force=True)
        two.obliterate(force=True)


def test_records_written_by_hand_fail_no_listing(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    """One record or member written by hand made whole reads raise: the
    listings of a state, get_job, get_job_state, get_workers (and so
    `jobq info`), get_metrics (and so every scrape of /metrics)."""
    from jobq.cli import main

    keys = queue._context.keys
    good = queue.add("good", 1)
    odd = {name: queue.add(name, 0) for name in ("opts", "parent", "trace", "state")}
    redis_client.hset(keys.job(odd["opts"].id), "opts", b"\xc1")  # no msgpack
    redis_client.hset(keys.job(odd["parent"].id), mapping={"pid": "7", "pqb": "no-brace"})
    redis_client.hset(keys.job(odd["trace"].id), "st", b"\xc1")
    redis_client.hset(keys.job(odd["state"].id), "state", b"\xff")
    redis_client.zadd(keys.failed, {b"\xff": 1})  # an id that is no text, with no record
    redis_client.hset(keys.base + "worker:evil", mapping={"queues": b"\x05", "pid": "x"})
    redis_client.zadd(keys.workers, {"evil": time.time() * 1000 + 60_000})
    redis_client.rpush(keys.base + "metrics:completed:data", "abc", "2")
    redis_client.hset(keys.base + "metrics:completed",
                      mapping={"min": int(time.time() // 60), "count": 2})
    try:
        listed = {job.id: job for job in queue.get_jobs("waiting")}
        assert set(listed) == {good.id, *(job.id for job in odd.values())}
        assert listed[good.id].data == 1
        assert listed[odd["parent"].id].parent is None
        assert listed[odd["opts"].id]._unreadable and listed[odd["trace"].id]._unreadable
        assert queue.get_jobs("failed") == []
        assert queue.get_job_state(odd["state"].id) == "\ufffd"
        assert [w.name for w in queue.get_workers()] == ["evil"]
        assert queue.get_workers()[0].queues == ()
        assert queue.get_metrics("completed").data[-2:] == [0, 2]
        assert f'jobq_jobs{{queue="{queue.name}",state="waiting"}} 5' in prometheus_text([queue])
        assert main(["--url", redis_url, "info", queue.name]) == 0
        assert main(["--url", redis_url, "job", queue.name, odd["parent"].id]) == 0
        # a worker fails such a job, saying why, and runs the others
        with Worker(queue.name, lambda job: job.data, connection=redis_url):
            assert good.wait_until_finished(timeout=10) == 1
            with pytest.raises(JobFailedError, match="opts cannot be decoded"):
                odd["opts"].wait_until_finished(timeout=10)
    finally:
        redis_client.delete(keys.base + "worker:evil", keys.base + "metrics:completed:data",
                            keys.base + "metrics:completed")
        redis_client.zrem(keys.workers, "evil")
        redis_client.zrem(keys.failed, b"\xff")
        redis_client.hdel(keys.job(odd["parent"].id), "pid", "pqb")  # (a cluster's slot: no)
        queue.obliterate(force=True)


def test_metrics_per_minute() -> None:
    assert Metrics(count=0).per_minute() == 0.0
    # 30 s into the current minute: 6 jobs over 2.5 minutes
    metrics = Metrics(count=9, data=[1, 2, 3], timestamp=1_800_000_030.0)
    assert metrics.per_minute(3) == pytest.approx(6 / 2.5)
    with pytest.raises(ValueError):
        metrics.per_minute(0)


def test_metrics_leave_out_a_queue_the_server_refuses_and_serve_the_others(
    queue: Queue, queue_name: str, redis_url: str, redis_client: redis.Redis
) -> None:
    """One queue with a key of another type made every scrape answer 503;
    `jobq info` shows the others and names it. Its series are left out."""
    queue.add("x")
    with Queue(f"{queue_name}-bad", connection=redis_url) as bad:
        bad.add("x")
        redis_client.delete(bad._context.keys.wait)
        redis_client.set(bad._context.keys.wait, "not a list")
        text = prometheus_text([bad, queue])
        assert f'queue="{queue.name}"' in text and f'queue="{bad.name}"' not in text
        redis_client.delete(bad._context.keys.wait)
        bad.obliterate(force=True)


def test_a_scrape_while_the_server_is_away_logs_one_line(
    queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Each scrape during an outage logged a 40-line traceback (every 15 s
    of a Prometheus scrape); it is one warning line, and the answer 503."""
    import urllib.error
    import urllib.request

    from jobq.metrics import serve
    from jobq.testing import RedisServer, find_server_binary

    with RedisServer(find_server_binary()) as server, \
            Queue(queue_name, connection=server.url) as queue:
        queue.add("x")
        http = serve([queue], port=0)
        thread = threading.Thread(target=http.serve_forever, name="test-metrics-http")
        thread.start()
        try:
            url = f"http://127.0.0.1:{http.server_port}/metrics"
            with urllib.request.urlopen(url, timeout=10) as response:
                assert response.status == 200
                length = response.headers["Content-Length"]
            # a health check's HEAD: the GET's headers, no body (it was 501)
            head = urllib.request.Request(url, method="HEAD")
            with urllib.request.urlopen(head, timeout=10) as response:
                assert response.status == 200 and response.read() == b""
                assert response.headers["Content-Length"] == length
            server.shutdown()
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="jobq.metrics"), \
                    pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(url, timeout=10)
            assert refused.value.code == 503
            refused.value.close()
            [record] = [r for r in caplog.records if r.name == "jobq.metrics"]
            assert record.levelno == logging.WARNING and record.exc_info is None
            assert "cannot read the queues: ConnectionError" in record.getMessage()
        finally:
            http.shutdown()
            thread.join(10)
            http.server_close()
    # a cluster client's "cannot be connected" is no RedisError: one line too

    def unreachable() -> list[Queue]:
        raise redis.exceptions.RedisClusterException("Redis Cluster cannot be connected")

    http = serve(unreachable, port=0)
    thread = threading.Thread(target=http.serve_forever, name="test-metrics-http")
    thread.start()
    try:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="jobq.metrics"), \
                pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{http.server_port}/metrics", timeout=10)
        refused.value.close()
        [record] = [r for r in caplog.records if r.name == "jobq.metrics"]
        assert record.levelno == logging.WARNING and record.exc_info is None
    finally:
        http.shutdown()
        thread.join(10)
        http.server_close()
