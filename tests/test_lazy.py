"""No I/O in constructors: a Queue or QueueEvents made while the server is
down works once it is up; a queue is recorded only when written to; an
unreachable server is reported at the first call, naming it."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import redis

from jobq import JobqError, Queue, QueueEvents

ROOT = Path(__file__).resolve().parent.parent


def _dead_url(password: str | None = None) -> str:
    """A URL where nothing listens (a port just freed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    auth = f"user:{password}@" if password else ""
    return f"redis://{auth}127.0.0.1:{port}/0"


def test_constructors_do_no_io_and_the_first_call_names_the_server() -> None:
    url = _dead_url("s3cret")
    queue = Queue("lazy", connection=url, event_mode="pubsub", max_events=5)
    events = QueueEvents("lazy", connection=url)
    try:
        assert not [t for t in threading.enumerate() if t.name.startswith("jobq-")]
        with pytest.raises(redis.exceptions.ConnectionError) as info:
            queue.add("x")
        message = str(info.value)
        assert "cannot reach the Redis server at redis://user:***@127.0.0.1:" in message
        assert "s3cret" not in message
        with pytest.raises(redis.exceptions.ConnectionError, match="cannot reach"):
            queue.event_mode  # noqa: B018  -- still not set up: tried again
    finally:
        events.close()
        queue.close()


def test_the_shared_events_of_a_queue_can_be_had_while_the_server_is_away() -> None:
    """queue.events ran the queue's first-use setup and raised while the
    server was away: listeners added at an app's start-up failed it. It
    returns the reader now, which connects once the server is there."""
    queue = Queue("lazy", connection=_dead_url())
    try:
        events = queue.events
        heard: list[str] = []
        events.on("ping", lambda event: heard.append(event.name))  # at start-up: no error
        assert not events.wait_until_ready(0.2)
        with pytest.raises(redis.exceptions.ConnectionError, match="cannot reach"):
            queue.add("x")  # a call still says the server is away
    finally:
        queue.close()


def test_a_first_wait_on_an_unreachable_server_raises_naming_it() -> None:
    url = _dead_url("s3cret")
    with QueueEvents("lazy", connection=url) as events:
        # not a timeout: the reader's first attempt to connect failed
        with pytest.raises(redis.exceptions.ConnectionError) as info:
            events.wait_for("1", timeout=30)
        message = str(info.value)
        assert "cannot reach the Redis server at redis://user:***@127.0.0.1:" in message
        assert "s3cret" not in message
        assert not events.wait_until_ready(0)
        with pytest.raises(redis.exceptions.ConnectionError, match="cannot reach"):
            events.wait_for("1", timeout=30)  # still unreachable: the same answer


def test_an_import_while_the_server_is_down_works() -> None:
    code = (
        "from jobq import Queue, QueueEvents\n"
        "q = Queue('mail')\n"
        "@q.task()\n"
        "def send(to): pass\n"
        "e = QueueEvents('mail')\n"
        "print(sorted(q.tasks))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={"JOBQ_REDIS_URL": _dead_url(), "PATH": "/usr/bin:/bin"}, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['__main__.send']"


def test_a_queue_is_recorded_when_first_written_to(
    queue_name: str, redis_url: str, redis_client: redis.Redis
) -> None:
    with Queue(queue_name, connection=redis_url) as queue:
        assert queue.count() == 0 and queue.event_mode == "stream"
        assert queue.name.encode() not in redis_client.smembers("jobq:queues")
        assert not redis_client.exists(f"jobq:{{{queue_name}}}:meta")
        queue.add("x")
        assert queue.name.encode() in redis_client.smembers("jobq:queues")


def test_explicit_settings_are_stored_and_checked_on_first_use(
    queue_name: str, redis_url: str, redis_client: redis.Redis
) -> None:
    with Queue(queue_name, connection=redis_url, max_events=50, result_ttl=5.0) as queue:
        meta = f"jobq:{{{queue_name}}}:meta"
        assert not redis_client.exists(meta)
        assert queue.max_events == 50 and queue.result_ttl == 5.0
        assert redis_client.hmget(meta, ["maxev", "rttl"]) == [b"50", b"5000"]
    with Queue(queue_name, connection=redis_url, event_mode="pubsub") as first:
        first.emit("hello")
        with Queue(queue_name, connection=redis_url, event_mode="stream") as second:
            with pytest.raises(JobqError, match="uses event mode 'pubsub'"):
                second.emit("hello")
        with Queue(queue_name, connection=redis_url) as follower:
            assert follower.event_mode == "pubsub" and follower.max_events == 50


def test_import_jobq_imports_no_framework() -> None:
    code = (
        "import sys, jobq, jobq.cli, jobq.tasks\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'flask')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
