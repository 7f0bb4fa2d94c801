"""A Worker in a child process for the fault suite, reporting to a ledger.

Usage: ``python -m tests.faults.fault_worker QUEUE_URL LEDGER_URL QUEUE [options]``

The ledger is a list on another server (or outside the queue's keys) that
survives queue cleanup and server restarts. Every row is ``|``-separated:

- ``ready|<pid>``: the worker is fetching;
- ``start|<job>|<pid>|<token>|<monotonic>``: an attempt began (written by the
  handler before any work);
- ``done|<job>|<pid>|<token>|<monotonic>``: the handler is about to return;
- ``final|<job>|<pid>|<completed or failed>|<monotonic>``: this process
  finalised the job (its complete/fail script took effect);
- ``error|<pid>|<exception type>|<message>``: an ``error`` event.

``time.monotonic()`` is system-wide on Linux (CLOCK_MONOTONIC), so the test
compares it with its own clock. A job's data steers the handler:
``{"sleep": s}`` sleeps s seconds on the first attempt only (later attempts
return at once), ``{"sleep_all": s}`` on every attempt, ``{"value": v}`` is
returned (default: the job id).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from typing import Any

import redis

from jobq import Job, Worker


def ledger_key(queue: str) -> str:
    """The ledger list of a queue (outside the queue's keys, in its hash slot)."""
    return f"ledger:{{{queue}}}"


def notify_key(queue: str) -> str:
    """The list a test BLPOPs to be told of new ledger rows."""
    return f"ledger:{{{queue}}}:n"


def main(argv: list[str]) -> int:
    """Run one worker until SIGTERM / SIGINT; return the exit code."""
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("ledger_url")
    parser.add_argument("queue")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--lock", type=float, default=1.0)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--max-stalled", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr,
        format="%(asctime)s %(process)d %(threadName)s %(name)s %(levelname)s %(message)s",
    )
    ledger = redis.Redis.from_url(args.ledger_url.replace("redis+cluster://", "redis://", 1))
    pid = os.getpid()
    queue = args.queue

    def record(row: str) -> None:
        try:
            pipe = ledger.pipeline(transaction=False)
            pipe.rpush(ledger_key(queue), row)
            pipe.rpush(notify_key(queue), row)
            pipe.execute()
        except redis.RedisError:
            logging.getLogger("fault_worker").exception("ledger write failed: %s", row)

    def handler(job: Job) -> Any:
        token = job._token  # noqa: SLF001 - the test ledger tells attempts apart
        record(f"start|{job.id}|{pid}|{token}|{time.monotonic()!r}")
        data = job.data if isinstance(job.data, dict) else {}
        pause = data.get("sleep_all") or (data.get("sleep") if job.stalled_counter == 0 else 0)
        if pause:
            threading.Event().wait(float(pause))  # the job's own work
        record(f"done|{job.id}|{pid}|{token}|{time.monotonic()!r}")
        return data.get("value", job.id)

    worker = Worker(
        queue,
        handler,
        connection=args.url,
        name=f"proc-{pid}",
        concurrency=args.concurrency,
        lock_duration=args.lock,
        stalled_interval=args.interval,
        max_stalled_count=args.max_stalled,
    )
    worker.on("ready", lambda: record(f"ready|{pid}"))
    worker.on("completed", lambda job, _r: record(
        f"final|{job.id}|{pid}|completed|{time.monotonic()!r}"))
    worker.on("failed", lambda job, _e: record(
        f"final|{job.id}|{pid}|failed|{time.monotonic()!r}"))
    worker.on("error", lambda exc: record(
        f"error|{pid}|{type(exc).__name__}|{exc}".replace("\n", " ")))
    worker.run()
    ledger.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
