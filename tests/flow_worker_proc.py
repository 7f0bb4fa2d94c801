"""Workers of every queue of a flow in a child process, for the randomized
flow test that SIGKILLs them.

Usage: ``python -m tests.flow_worker_proc URL PREFIX LEDGER QUEUE...``

The handler ``RPUSH``es ``start|<queue>:<id>|<pid>`` to LEDGER, works for
``data["work"]`` seconds, fails when ``data["fail"]``, else pushes
``done|<queue>:<id>|<children values as JSON>`` and returns ``data["v"]``
plus the sum of its children's values.
"""

from __future__ import annotations

import json
import os
import sys
import threading

import redis

from jobq import Job, Worker
from tests.worker_proc import plain_url


def main(argv: list[str]) -> int:
    """Run the workers until killed (at most 15 minutes)."""
    url, prefix, ledger_key, *queues = argv
    ledger = redis.Redis.from_url(plain_url(url))
    pid = os.getpid()
    pause = threading.Event()

    def handler(job: Job) -> int:
        me = f"{job.queue_name}:{job.id}"
        ledger.rpush(ledger_key, f"start|{me}|{pid}")
        pause.wait(job.data["work"])
        if job.data["fail"]:
            raise ValueError(f"planned failure of {me}")
        values = job.get_children_values()
        ledger.rpush(ledger_key, f"done|{me}|{json.dumps(values, sort_keys=True)}")
        return int(job.data["v"]) + sum(values.values())

    workers = [
        Worker(q, handler, connection=url, prefix=prefix, concurrency=4, lock_duration=1,
               stalled_interval=0.5, max_stalled_count=1000).start()
        for q in queues
    ]
    threading.Event().wait(900)
    for worker in workers:
        worker.close(timeout=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
