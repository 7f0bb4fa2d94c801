"""The command line of 0.2: ``worker`` with a Queue of tasks and ``--burst``,
``add``, ``info`` as one table (and ``--json``), ``--version``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

import jobq
from jobq import Queue, ShardedQueue
from tests.test_cli import ROOT, _env
from tests.test_cli import jobq as run_jobq

WAIT = 20.0


def test_worker_burst_runs_a_queues_tasks_until_empty_then_exits_0(
    queue: Queue, redis_url: str, queue_name: str
) -> None:
    from tests import task_app

    jobs = [queue.add(task_app.add.name, {"args": [n, n], "kwargs": {}}) for n in range(5)]
    env = dict(_env(redis_url), JOBQ_TEST_TASK_QUEUE=queue_name)
    done = subprocess.run(
        [sys.executable, "-m", "jobq", "worker", "tests.task_app:queue", "--burst"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "(burst)" in done.stderr
    assert [j.wait_until_finished(timeout=WAIT) for j in jobs] == [0, 2, 4, 6, 8]


def test_a_worker_of_a_queue_serves_it_on_its_own_server_and_prefix(
    redis_url: str, queue_name: str
) -> None:
    """``jobq worker MODULE:queue`` took the Queue's name and tasks, but
    served them on --url's server (or $JOBQ_REDIS_URL, or localhost) and
    --prefix's prefix: a queue of another database or prefix was left
    waiting, and a burst exited 0. A ShardedQueue was refused."""
    from tests import task_app

    cluster = os.environ.get("JOBQ_TEST_CLUSTER") == "1"  # one database only
    own = redis_url if cluster else urlunsplit(urlsplit(redis_url)._replace(path="/3"))
    prefix = f"app-{queue_name[-8:]}"
    env = dict(_env(redis_url), JOBQ_TEST_TASK_QUEUE=queue_name, JOBQ_TEST_TASK_URL=own,
               JOBQ_TEST_TASK_PREFIX=prefix)
    with Queue(queue_name, connection=own, prefix=prefix) as queue, \
            ShardedQueue(f"{queue_name}-sharded", shards=2, connection=own,
                         prefix=prefix) as sharded:
        jobs = [queue.add(task_app.add.name, {"args": [n, 1], "kwargs": {}}) for n in range(3)]
        products = [sharded.add(task_app.mul.name, {"args": [n, 2], "kwargs": {}})
                    for n in range(3)]
        for target in ("tests.task_app:queue", "tests.task_app:sharded"):
            done = subprocess.run(
                [sys.executable, "-m", "jobq", "worker", target, "--burst"],
                env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
            )
            assert done.returncode == 0, done.stderr
        assert [j.wait_until_finished(timeout=WAIT) for j in jobs] == [1, 2, 3]
        assert [j.wait_until_finished(timeout=WAIT) for j in products] == [0, 2, 4]
        queue.obliterate(force=True)
        sharded.obliterate(force=True)


def test_worker_burst_on_an_empty_queue_exits_at_once(redis_url: str, queue_name: str) -> None:
    done = run_jobq(redis_url, "worker", "tests.tasks:double", "-q", queue_name, "--burst",
                    timeout=30)
    assert done.returncode == 0, done.stderr


def test_worker_burst_on_a_paused_queue_exits_leaving_its_jobs(
    redis_url: str, queue_name: str
) -> None:
    """A paused queue's jobs wait for a resume: a burst run waited for it,
    for good (a cron job that never ended). It exits, saying why."""
    with Queue(queue_name, connection=redis_url) as queue:
        queue.add("double", 2)
        queue.pause()
        done = run_jobq(redis_url, "--log-level", "info", "worker", "tests.tasks:double",
                        "-q", queue_name, "--burst", timeout=30)
        assert done.returncode == 0, done.stderr
        assert f"paused with jobs waiting: {queue_name}" in done.stderr
        assert queue.get_job_counts("waiting") == {"waiting": 1}
        queue.obliterate(force=True)


@pytest.mark.parametrize(("flag", "option"), [
    ("--stalled-interval", "stalled_interval"), ("--max-stalled-count", "max_stalled_count"),
    ("--drain-delay", "drain_delay"), ("--lock-duration", "lock_duration"),
])
def test_worker_timing_flags_reach_the_worker(
    redis_url: str, queue_name: str, flag: str, option: str
) -> None:
    """Each flag is handed to the Worker: a bad value is its error (exit 2),
    a good one runs."""
    bad = run_jobq(redis_url, "worker", "tests.tasks:double", "-q", queue_name, "--burst",
                   flag, "-1", timeout=30)
    assert bad.returncode == 2 and option in bad.stderr, bad.stderr
    good = run_jobq(redis_url, "worker", "tests.tasks:double", "-q", queue_name, "--burst",
                    flag, "2", timeout=30)
    assert good.returncode == 0, good.stderr


def test_version(redis_url: str) -> None:
    done = run_jobq(redis_url, "--version")
    assert done.returncode == 0 and done.stdout.strip() == f"jobq {jobq.__version__}"


def test_add_with_options(queue: Queue, redis_url: str) -> None:
    done = run_jobq(redis_url, "add", queue.name, "mail.send", "--data", '{"to": "a@b.c"}',
                    "--priority", "3", "--attempts", "2", "--job-id", "m-1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "m-1"
    job = queue.get_job("m-1")
    assert job is not None and job.name == "mail.send" and job.data == {"to": "a@b.c"}
    assert job.opts["priority"] == 3 and job.opts["attempts"] == 2
    done = run_jobq(redis_url, "add", queue.name, "later", "--delay", "60")
    assert done.returncode == 0, done.stderr
    assert queue.get_job_state(done.stdout.strip()) == "delayed"
    bad = run_jobq(redis_url, "add", queue.name, "x", "--data", "{not json")
    assert bad.returncode == 2 and "--data" in bad.stderr


def test_info_is_one_table_with_a_row_per_queue_and_json(
    queue: Queue, redis_url: str, queue_name: str, redis_client: redis.Redis
) -> None:
    other = f"{queue_name}-b"
    queue.add("x")
    with Queue(other, connection=redis_url) as second:
        second.add("y", delay=60)
        second.pause()
        done = run_jobq(redis_url, "info", queue_name, other)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0].split()[:3] == ["QUEUE", "WAITING", "DELAYED"]
        rows = {line.split()[0]: line.split() for line in lines[1:]}
        assert set(rows) == {queue_name, other}
        assert rows[queue_name][1] == "1"
        done = run_jobq(redis_url, "info", queue_name, other, "--json")
        assert done.returncode == 0, done.stderr
        data = json.loads(done.stdout)
        by_name = {row["queue"]: row for row in data}
        assert by_name[queue_name]["counts"]["waiting"] == 1
        assert by_name[other]["counts"]["delayed"] == 1 and by_name[other]["paused"] is True


def test_worker_counts_are_current_not_a_heartbeat_late(queue: Queue, redis_url: str) -> None:
    from jobq import Worker
    from tests.polling import until

    with Worker(queue.name, lambda job: job.data, connection=redis_url,
                heartbeat_ttl=300) as worker:  # a regular beat every 100 s
        assert until(lambda: [w.name for w in queue.get_workers()] == [worker.name],
                     timeout=WAIT)
        for n in range(3):
            assert queue.add("x", n).wait_until_finished(timeout=WAIT) == n
        # announced within about a second of the change, not at the next beat
        assert until(lambda: queue.get_workers()[0].jobs_done == 3, timeout=5)


def test_worker_burst_on_a_sharded_queue_runs_its_jobs_then_exits_0(
    redis_url: str, queue_name: str
) -> None:
    """Its look at the queue opened a plain Queue, which a sharded one
    refuses: exit 2 after a few jobs, the rest left waiting."""
    from jobq import ShardedQueue

    with ShardedQueue(queue_name, shards=3, connection=redis_url) as sharded:
        jobs = [sharded.add("double", n) for n in range(30)]
        done = run_jobq(redis_url, "worker", "tests.tasks:double", "-q", queue_name, "--burst",
                        timeout=60)
        assert done.returncode == 0, done.stderr
        assert [j.wait_until_finished(timeout=WAIT) for j in jobs] == [2 * n for n in range(30)]
        sharded.obliterate(force=True)
