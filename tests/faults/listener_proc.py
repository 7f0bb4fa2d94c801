"""A QueueEvents waiter in a child process, so a test can SIGSTOP the reader.

Usage: ``python -m tests.faults.listener_proc URL LEDGER_URL QUEUE JOB_ID``

Writes ``ready|<pid>`` once the reader is ready and the wait registered, then
``outcome|<job>|<pid>|<result or exception type>|<monotonic>``.
"""

from __future__ import annotations

import logging
import os
import sys
import time

import redis

from jobq import QueueEvents
from tests.faults.fault_worker import ledger_key, notify_key


def main(argv: list[str]) -> int:
    """Wait for one job and report its outcome to the ledger."""
    url, ledger_url, queue, job_id = argv
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    ledger = redis.Redis.from_url(ledger_url.replace("redis+cluster://", "redis://", 1))
    pid = os.getpid()

    def record(row: str) -> None:
        ledger.rpush(ledger_key(queue), row)
        ledger.rpush(notify_key(queue), row)

    with QueueEvents(queue, connection=url) as events:
        if not events.wait_until_ready(10):
            return 1
        future = events.future_for(job_id)  # registered and checked once on return
        record(f"ready|{pid}")
        try:
            outcome = repr(future.result(timeout=60))
        except Exception as exc:
            outcome = type(exc).__name__
        record(f"outcome|{job_id}|{pid}|{outcome}|{time.monotonic()!r}")
    ledger.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
