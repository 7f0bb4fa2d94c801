"""Cancel latency: from ``Queue.cancel`` returning to the running handler's
``job.cancelled`` being set, in the worker's process.

    python bench/cancel_latency.py [--runs 300]

Uses ``$JOBQ_REDIS_URL`` when set, else starts a private server. The worker
learns of the cancel through its queue's sharded cancel channel (see
jobq/_cancel.py); this measures that path end to end, on one machine.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from jobq import Job, Queue, Worker
from jobq.testing import embedded_url


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    running = threading.Event()
    seen: dict[str, float] = {}

    def handler(job: Job) -> None:
        running.set()
        if job.cancelled.wait(10):
            seen[job.id] = time.perf_counter()

    latencies = []
    with embedded_url() as url:
        name = f"bench-cancel-{time.time_ns()}"
        with Worker(name, handler, connection=url), Queue(name, connection=url) as queue:
            for _ in range(args.runs):
                running.clear()
                job = queue.add("wait")
                if not running.wait(10):
                    raise SystemExit("the job never started")
                sent = time.perf_counter()
                queue.cancel(job.id, "bench")
                deadline = time.monotonic() + 10
                while job.id not in seen:  # the handler's thread writes it
                    if time.monotonic() > deadline:
                        raise SystemExit(f"job {job.id} never saw its cancel")
                    time.sleep(0.0002)
                latencies.append((seen[job.id] - sent) * 1000)
            queue.obliterate(force=True)
    latencies.sort()
    p50 = statistics.median(latencies)
    p99 = latencies[min(len(latencies) - 1, round(len(latencies) * 0.99))]
    print(f"cancel latency over {len(latencies)} runs: p50 {p50:.2f} ms, p99 {p99:.2f} ms, "
          f"max {latencies[-1]:.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
