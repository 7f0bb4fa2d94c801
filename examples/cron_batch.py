"""A nightly batch: add many jobs at once, wait for all of them, report failures.

``add_bulk`` writes the whole batch in one round trip; ``Job.as_future()``
turns each job into a ``concurrent.futures.Future`` resolved by the queue's
event reader, so ``concurrent.futures.wait`` waits for the batch.
"""

# ci: run

from __future__ import annotations

import concurrent.futures
import os

from jobq import Job, JobFailedError, Queue, Worker
from jobq.testing import embedded_url


def resize(job: Job) -> str:
    """Pretend to resize an image; image 7 is corrupt."""
    number = job.data["image"]
    if number == 7:
        raise ValueError(f"image {number} is corrupt")
    return f"thumb-{number}.png"


def main() -> int:
    """Run one batch and return the process exit code."""
    with embedded_url() as url:
        name = f"cron-batch-{os.getpid()}"
        with (
            Queue(name, connection=url) as queue,
            Worker(name, resize, connection=url, concurrency=4),
        ):
            # be ready for events before the batch can finish
            queue.events.wait_until_ready(10)
            jobs = queue.add_bulk(
                {"name": "resize", "data": {"image": n}, "attempts": 2} for n in range(25)
            )
            futures = {job.as_future(): job for job in jobs}
            done, not_done = concurrent.futures.wait(futures, timeout=30)
            failed = []
            for future in done:
                error = future.exception()
                if isinstance(error, JobFailedError):
                    failed.append((futures[future].id, error.failed_reason))
            print(f"batch of {len(jobs)}: {len(done) - len(failed)} done, "
                  f"{len(failed)} failed, {len(not_done)} unfinished")
            for job_id, reason in sorted(failed):
                print(f"  job {job_id} failed: {reason}")
            queue.obliterate(force=True)
    return 0 if not not_done and len(failed) == 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())
