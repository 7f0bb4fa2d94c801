"""Quickstart: add a few jobs, process them with a worker, print their results.

Run it with ``make demo`` or ``python examples/quickstart.py``. It uses the
server at ``$JOBQ_REDIS_URL`` when that is set; otherwise it starts a private
one for the demo (``pip install 'jobq[server]'`` provides it).
"""

# ci: run

from __future__ import annotations

from typing import TYPE_CHECKING

from jobq import Queue, Worker
from jobq.testing import embedded_url

if TYPE_CHECKING:
    from jobq import Job


def add(job: Job) -> int:
    """Add the two numbers in the job's data."""
    a: int = job.data["a"]
    b: int = job.data["b"]
    return a + b


def main() -> int:
    """Run the demo and return the process exit code."""
    with embedded_url() as url:
        with (
            Worker("quickstart", add, connection=url, concurrency=4),
            Queue("quickstart", connection=url) as queue,
        ):
            jobs = [queue.add("add", {"a": n, "b": n * n}) for n in range(1, 6)]
            for job in jobs:
                result = job.wait_until_finished(timeout=10)
                print(f"job {job.id}: {job.data['a']} + {job.data['b']} = {result}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
