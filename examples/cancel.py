"""Cancellation: stop a queued job, and a running one, from anywhere.

A queued job leaves the queue and fails at once; a running job's
``job.cancelled`` event is set in the worker within about a millisecond, and
its attempt ends failed (no retry) when the handler returns. Waiters raise
``JobCancelledError``. Run it with ``python examples/cancel.py``; it uses
``$JOBQ_REDIS_URL`` when set, else starts a private server.
"""

# ci: run

from __future__ import annotations

import os
import threading

from jobq import Job, JobCancelledError, Queue, Worker
from jobq.testing import embedded_url


def main() -> int:
    """Cancel a delayed job and a running one; return the exit code."""
    running = threading.Event()

    def export(job: Job) -> str:
        running.set()
        for chunk in range(100):  # a long job that checks for a cancel between chunks
            if job.cancelled.wait(0.1):
                print(f"handler: stopping after {chunk} chunk(s)")
                break
        return "partial"  # discarded: the attempt ends cancelled

    with embedded_url() as url:
        name = f"cancel-{os.getpid()}"
        with Queue(name, connection=url) as queue:
            later = queue.add("export", delay=60)
            print("cancel a delayed job:", queue.cancel(later.id, reason="not needed"))
            with Worker(name, export, connection=url):
                job = queue.add("export", attempts=3)
                running.wait(10)
                job.cancel(reason="user pressed stop")
                try:
                    job.wait_until_finished(timeout=10)
                except JobCancelledError as exc:
                    print(f"waiter: {exc}")
            print("state:", job.get_state(), "attempts made:", job.refresh().attempts_made)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
