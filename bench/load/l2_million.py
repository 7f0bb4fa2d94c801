"""L2 (FAULTS.md): a million jobs through with ``remove_on_complete``.

Starts a private server, two worker processes (``--procs``) of ``--concurrency``
threads each, and a producer that adds jobs with ``add_bulk`` while keeping
the backlog under ``--backlog``. Prints, every ``--every`` seconds and at the
end: jobs done, jobs/s, the server's ``used_memory``, the events stream's
length, and each worker's RSS. Passing: every job completed, ``used_memory``
after the drain close to the baseline, ``XLEN events <= max_events + 100``,
worker RSS flat (its slope over the second half of the run about 0).

    .venv/bin/python bench/load/l2_million.py             # 1,000,000 jobs
    .venv/bin/python bench/load/l2_million.py --jobs 100000
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

import psutil
import redis

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from jobq import Queue, Worker  # noqa: E402
from jobq.testing import RedisServer  # noqa: E402

QUEUE = "l2"
DONE_KEY = "l2-done"


def worker_main(url: str, concurrency: int) -> None:
    """A worker process: no-op jobs; adds its completions to DONE_KEY each 0.5 s."""
    counter = [0]
    lock = threading.Lock()

    def count(job: object, result: object) -> None:
        with lock:
            counter[0] += 1

    stop = threading.Event()

    def flush() -> None:
        with redis.Redis.from_url(url) as client:
            while not stop.wait(0.5):
                with lock:
                    n, counter[0] = counter[0], 0
                if n:
                    client.incrby(DONE_KEY, n)

    flusher = threading.Thread(target=flush, daemon=True)
    flusher.start()
    worker = Worker(QUEUE, lambda job: None, connection=url, concurrency=concurrency)
    worker.on("completed", count)
    worker.run()  # until SIGTERM
    stop.set()
    flusher.join(2)


def mib(n: float) -> str:
    return f"{n / 1024 / 1024:.1f} MiB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--backlog", type=int, default=20_000)
    parser.add_argument("--every", type=float, default=10.0)
    parser.add_argument("--max-seconds", type=float, default=3600.0,
                        help="stop adding after this long, drain and report what was done")
    parser.add_argument("--worker", nargs=2, metavar=("URL", "CONCURRENCY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker_main(args.worker[0], int(args.worker[1]))
        return 0
    with RedisServer() as server:
        client = server.client()
        client.config_set("maxmemory-policy", "noeviction")
        queue = Queue(QUEUE, connection=server.url)
        baseline = int(client.info("memory")["used_memory"])
        procs = [
            subprocess.Popen([sys.executable, __file__, "--worker", server.url,
                              str(args.concurrency)], cwd=ROOT)
            for _ in range(args.procs)
        ]
        rss: list[list[tuple[float, int]]] = [[] for _ in procs]
        peak = baseline
        started = time.monotonic()
        last_print = started
        added = 0
        done = 0
        try:
            target = args.jobs
            while done < target:
                backlog = added - done
                if target == args.jobs and time.monotonic() - started > args.max_seconds:
                    target = added  # out of time: drain what was added, then report
                    print(f"time budget reached: draining the {added - done} jobs left")
                if added < target and backlog < args.backlog:
                    n = min(1000, target - added)
                    queue.add_bulk({"name": "noop", "data": i, "remove_on_complete": True}
                                   for i in range(n))
                    added += n
                else:
                    threading.Event().wait(0.05)  # backlog full: let the workers catch up
                done = int(client.get(DONE_KEY) or 0)
                now = time.monotonic()
                peak = max(peak, int(client.info("memory")["used_memory"]))
                if now - last_print >= args.every:
                    last_print = now
                    for i, proc in enumerate(procs):
                        rss[i].append((now - started, psutil.Process(proc.pid).memory_info().rss))
                    print(f"{now - started:7.1f} s  done {done:>8}  "
                          f"{done / (now - started):7.0f} jobs/s  used_memory "
                          f"{mib(int(client.info('memory')['used_memory']))}  xlen "
                          f"{client.xlen(f'jobq:{{{QUEUE}}}:events')}  rss "
                          + " ".join(mib(r[-1][1]) for r in rss), flush=True)
            elapsed = time.monotonic() - started
            # let the workers go idle, then measure what is left
            threading.Event().wait(2.0)
            after = int(client.info("memory")["used_memory"])
            xlen = client.xlen(f"jobq:{{{QUEUE}}}:events")
            keys = client.dbsize()
            for i, proc in enumerate(procs):
                memory = psutil.Process(proc.pid).memory_info().rss
                rss[i].append((time.monotonic() - started, memory))
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
            queue.close()
            client.close()
    print(f"\nL2 result: {done} jobs in {elapsed:.1f} s = {done / elapsed:.0f} jobs/s "
          f"({args.procs} worker processes x {args.concurrency} threads)")
    print(f"used_memory: baseline {mib(baseline)}, peak {mib(peak)}, after drain {mib(after)} "
          f"(+{(after - baseline) / 1024:.0f} KiB); keys left {keys}")
    print(f"events stream length {xlen} (max_events 10000)")
    for i, samples in enumerate(rss):
        half = [s for s in samples if s[0] >= samples[-1][0] / 2] or samples
        slope = (half[-1][1] - half[0][1]) / max(1e-9, half[-1][0] - half[0][0])
        print(f"worker {i} RSS: first {mib(samples[0][1])}, last {mib(samples[-1][1])}, "
              f"slope over the second half {slope / 1024:.1f} KiB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
