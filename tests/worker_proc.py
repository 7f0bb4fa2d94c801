"""A Worker in a child process, for tests that must kill or signal a worker.

Usage: ``python -m tests.worker_proc URL QUEUE MODE``

Every handler first ``RPUSH``es ``start|<job id>|<pid>`` to the ledger key
``ledger:<QUEUE>`` (outside the queue's keys), so the test can BLPOP it and
know the job is in flight. Modes:

- ``block``: the handler then blocks (up to 60 s) and never finishes in time;
  the worker runs via ``start()``. The test SIGKILLs the process.
- ``run``: the worker runs via ``run()`` in the main thread (so SIGINT /
  SIGTERM close it gracefully). Its ``closing`` listener pushes ``closing`` to
  the ledger; the handler waits (up to 10 s) for an item on
  ``ledger:<QUEUE>:go`` and returns ``"done"``. ``closed`` pushes ``closed``.
- ``cancel``: the worker has a 30 s lock (so no lock renewal reads a cancel
  mark within the test) and runs via ``start()``; the handler waits (up to
  10 s) for ``job.cancelled``, pushes ``cancelled|<job id>`` (or
  ``not cancelled|<job id>``) and returns. The test SIGKILLs the process.
"""

from __future__ import annotations

import os
import sys
import threading

import redis

from jobq import Job, Worker

LOCK_DURATION = 1.0
STALLED_INTERVAL = 0.5
#: The ``cancel`` mode's lock: renewed only after 15 s, far past the test's bound.
CANCEL_LOCK_DURATION = 30.0


def ledger_key(queue: str) -> str:
    """The key where the child reports what it does (in the go key's slot)."""
    return f"ledger:{{{queue}}}"


def plain_url(url: str) -> str:
    """A plain client's URL for the ledger (a one-node cluster serves it too)."""
    return url.replace("redis+cluster://", "redis://", 1)


def go_key(queue: str) -> str:
    """The key the ``run`` mode's handler waits on before returning."""
    return f"ledger:{{{queue}}}:go"


def main(argv: list[str]) -> int:
    """Run one worker as asked; return the exit code."""
    url, queue, mode = argv
    ledger = redis.Redis.from_url(plain_url(url))
    pid = os.getpid()

    def started(job: Job) -> None:
        ledger.rpush(ledger_key(queue), f"start|{job.id}|{pid}")

    if mode == "block":
        forever = threading.Event()

        def blocking(job: Job) -> str:
            started(job)
            forever.wait(60)
            return "never"

        worker = Worker(
            queue,
            blocking,
            connection=url,
            name=f"proc-{pid}",
            lock_duration=LOCK_DURATION,
            stalled_interval=STALLED_INTERVAL,
        )
        worker.start()
        forever.wait(60)
        return 1
    if mode == "cancel":
        forever = threading.Event()

        def cancellable(job: Job) -> str:
            started(job)
            seen = "cancelled" if job.cancelled.wait(10) else "not cancelled"
            ledger.rpush(ledger_key(queue), f"{seen}|{job.id}")
            return seen

        worker = Worker(
            queue,
            cancellable,
            connection=url,
            name=f"proc-{pid}",
            lock_duration=CANCEL_LOCK_DURATION,
            stalled_interval=STALLED_INTERVAL,
        )
        worker.start()
        forever.wait(60)
        return 1
    if mode == "run":

        def handler(job: Job) -> str:
            started(job)
            # a separate connection: this blocks, the ledger client is shared
            with redis.Redis.from_url(plain_url(url)) as waiter:
                if waiter.blpop([go_key(queue)], timeout=10) is None:
                    return "no go"
            return "done"

        worker = Worker(
            queue,
            handler,
            connection=url,
            name=f"proc-{pid}",
            lock_duration=LOCK_DURATION,
            stalled_interval=STALLED_INTERVAL,
        )
        worker.on("closing", lambda: ledger.rpush(ledger_key(queue), "closing"))
        worker.on("closed", lambda: ledger.rpush(ledger_key(queue), "closed"))
        worker.on("ready", lambda: ledger.rpush(ledger_key(queue), "ready"))
        worker.run()
        ledger.close()
        return 0
    print(f"unknown mode {mode!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
