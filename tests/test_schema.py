"""The key schema and the job record's fields (jobq/keys.py) against the
scripts and the code that read them: every key a script builds and every
field it reads or writes is listed once there, and ``obliterate`` leaves
exactly the keys the schema keeps."""

from __future__ import annotations

import re
from pathlib import Path

import redis

from jobq import Queue, Worker
from jobq.job import STATES
from jobq.keys import ITEM_KEYS, JOB_FIELDS, KEPT_BY_OBLITERATE, QUEUE_KEYS, QueueKeys

ROOT = Path(__file__).resolve().parent.parent
LUA = sorted((ROOT / "jobq" / "lua").glob("*.lua"))
WAIT = 10.0


def test_every_key_a_script_builds_is_in_the_schema() -> None:
    for path in LUA:
        for name in re.findall(r"base \.\. '([^']+)'", path.read_text()):
            if name.endswith(":") or name == "metrics:":
                assert name in ITEM_KEYS or any(k.startswith(name) for k in QUEUE_KEYS), (
                    path.name, name)
            else:
                assert name in QUEUE_KEYS, (path.name, name)


def test_queue_keys_attributes_are_schema_keys() -> None:
    keys = QueueKeys("p", "q")
    for attr in ("wait", "prioritized", "delayed", "active", "completed", "failed", "meta",
                 "events", "marker", "workers"):
        assert getattr(keys, attr) == keys.base + attr and attr in QUEUE_KEYS
    assert keys.job("1") == keys.base + "job:1" and "job:" in ITEM_KEYS
    assert keys.lock("1").startswith(keys.base + "lock:") and "lock:" in ITEM_KEYS
    assert keys.logs("1").startswith(keys.base + "logs:") and "logs:" in ITEM_KEYS
    assert keys.worker("w").startswith(keys.base + "worker:") and "worker:" in ITEM_KEYS


def test_every_job_field_is_in_the_schema() -> None:
    allowed = set(JOB_FIELDS) | set(STATES) | {"added"}  # fields, and the states set
    lines = 0
    for path in LUA:
        for line in path.read_text().splitlines():
            if re.search(r"'H(SET|MGET|GET|INCRBY|DEL|SETNX)', (jk|job_key\()", line):
                lines += 1
                for name in re.findall(r"'([a-z_]+)'", line):
                    assert name in allowed, (path.name, name, line.strip())
    assert lines > 20  # the scripts' record commands were found
    job_py = (ROOT / "jobq" / "job.py").read_text()
    for field in re.findall(r'get\(b"(\w+)"\)', job_py):
        assert field in JOB_FIELDS, field


def test_obliterate_leaves_only_the_keys_the_schema_keeps(
    queue: Queue, redis_url: str, redis_client: redis.Redis
) -> None:
    def handler(job: object) -> str:
        if getattr(job, "name", "") == "bad":
            raise ValueError("no")
        job.log("a line")  # type: ignore[attr-defined]
        return "ok"

    done = queue.add("good", priority=2)
    bad = queue.add("bad")
    queue.add("later", delay=60)
    with Worker(queue.name, handler, connection=redis_url, limiter={"max": 100, "duration": 10},
                lock_duration=1, stalled_interval=0.5):
        assert done.wait_until_finished(timeout=WAIT) == "ok"
        try:
            bad.wait_until_finished(timeout=WAIT)
        except Exception:
            pass
    queue.add("waiting")
    queue.obliterate(force=True)
    base = queue._context.keys.base
    left = {k.decode()[len(base):] for k in redis_client.scan_iter(match=base + "*")}
    assert left <= KEPT_BY_OBLITERATE, left - KEPT_BY_OBLITERATE
