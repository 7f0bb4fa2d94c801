"""Cancel latency: from ``Queue.cancel`` returning to the running handler's
``job.cancelled`` being set, in the worker's process.

    python bench/cancel_latency.py [--runs 300]

Uses ``$JOBQ_REDIS_URL`` when set, else starts a private server. The worker
learns of the cancel through its queue's sharded cancel channel (see
jobq/_cancel.py); this measures that path end to end, on one machine.

The script publishes the hint before it replies, so the worker can see it
before ``cancel()`` returns: such a run counts as 0 ms from the return (how
many did is printed). The time from the call is printed too.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from jobq import Job, Queue, Worker
from jobq.testing import embedded_url


def _percentiles(values: list[float]) -> str:
    values = sorted(values)
    p50 = statistics.median(values)
    p99 = values[min(len(values) - 1, round(len(values) * 0.99))]
    return f"p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {values[-1]:.2f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    running = threading.Event()
    seen: dict[str, float] = {}
    noticed = threading.Event()

    def handler(job: Job) -> None:
        running.set()
        if job.cancelled.wait(10):
            seen[job.id] = time.perf_counter()
            noticed.set()

    from_call, from_return = [], []
    early = 0
    with embedded_url() as url:
        name = f"bench-cancel-{time.time_ns()}"
        with Worker(name, handler, connection=url), Queue(name, connection=url) as queue:
            for _ in range(args.runs):
                running.clear()
                noticed.clear()
                job = queue.add("wait")
                if not running.wait(10):
                    raise SystemExit("the job never started")
                called = time.perf_counter()
                queue.cancel(job.id, "bench")
                returned = time.perf_counter()
                if not noticed.wait(10):
                    raise SystemExit(f"job {job.id} never saw its cancel")
                from_call.append((seen[job.id] - called) * 1000)
                from_return.append(max(0.0, seen[job.id] - returned) * 1000)
                early += seen[job.id] < returned
            queue.obliterate(force=True)
    print(f"cancel latency over {len(from_return)} runs, from cancel() returning: "
          f"{_percentiles(from_return)} ({early} seen before it returned)")
    print(f"from cancel() being called: {_percentiles(from_call)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
