"""Where a W3 round trip's time goes: one caller adds a job and waits for it,
1,000 times, with a worker (concurrency 8) already running in another
process; wall-clock stamps split each trip into its serial legs.

    .venv/bin/python bench/w3_breakdown.py [N]

Uses /usr/bin/redis-server when present, else the embedded server. Prints
the median of each leg: the add's round trip; from the add's return to the
handler's start (the worker's wake-up on the marker, its take, the hand-off
to a pool thread); the handler; from its end until this process's event
reader has the `completed` event (the finishing call and the reader's wake
up); and from there until the caller runs again.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import jobq._reader as reader  # noqa: E402
from jobq import Job, Queue, Worker  # noqa: E402
from jobq.testing import RedisServer  # noqa: E402

QUEUE = "w3-breakdown"


def handler(job: Job) -> dict[str, float]:
    started = time.time()
    return {"s": started, "e": time.time()}


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "worker":
        Worker(QUEUE, handler, connection=sys.argv[2], concurrency=8).run()
        return
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    binary = "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None
    seen: dict[str, float] = {}
    original = reader.EventReader._handle

    def handle(self: Any, event: Any, *args: Any) -> None:  # stamp the reader's receipt
        if event.name == "completed":
            seen[event.job_id] = time.time()
        original(self, event, *args)

    reader.EventReader._handle = handle  # type: ignore[method-assign]
    with RedisServer(binary) as server:
        worker = subprocess.Popen([sys.executable, os.path.abspath(__file__), "worker",
                                   server.url])
        try:
            with Queue(QUEUE, connection=server.url) as queue:
                for i in range(50):  # warm-up, the worker's start included
                    queue.add("x", i).wait_until_finished(timeout=60)
                legs: list[tuple[float, ...]] = []
                for i in range(n):
                    t0 = time.time()
                    job = queue.add("x", i)
                    t1 = time.time()
                    stamps = job.wait_until_finished(timeout=30)
                    t2 = time.time()
                    got = seen.pop(job.id)
                    legs.append((t1 - t0, stamps["s"] - t1, stamps["e"] - stamps["s"],
                                 got - stamps["e"], t2 - got, t2 - t0))
        finally:
            worker.terminate()
            worker.wait(30)
    names = ("add round trip", "add -> handler starts", "handler",
             "handler ends -> reader has event", "reader -> caller runs", "whole trip")
    print(f"W3 legs, median of {n} trips (ms):")
    for k, name in enumerate(names):
        print(f"  {name:34s} {statistics.median(leg[k] for leg in legs) * 1000:6.3f}")


if __name__ == "__main__":
    main()
