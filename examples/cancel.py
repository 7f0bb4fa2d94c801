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
            delayed_cancelled = queue.cancel(later.id, reason="not needed")
            print("cancel a delayed job:", delayed_cancelled)
            raised = False
            with Worker(name, export, connection=url):
                job = queue.add("export", attempts=3)
                if not running.wait(10):
                    print("the job never started")
                    return 1
                job.cancel(reason="user pressed stop")
                try:
                    job.wait_until_finished(timeout=10)
                except JobCancelledError as exc:
                    raised = True
                    print(f"waiter: {exc}")
            state, attempts = job.get_state(), job.refresh().attempts_made
            print("state:", state, "attempts made:", attempts)
            later_state = later.get_state()
    # both failed for good; the running one after its one attempt (no retry)
    worked = (delayed_cancelled and later_state == "failed"
              and raised and state == "failed" and attempts == 1)
    return 0 if worked else 1


if __name__ == "__main__":
    raise SystemExit(main())
