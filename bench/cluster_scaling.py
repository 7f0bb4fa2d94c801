"""Throughput as queues and shards grow: the same load on a 1-shard and a
3-shard local cluster.

Each run starts a cluster of real server processes on loopback
(``jobq.testing.LocalCluster``), spreads QUEUES queues over it, loads JOBS
no-op jobs into each with ``add_bulk``, then starts one worker process per
queue and times how long the cluster takes to drain every queue.

Usage: ``.venv/bin/python bench/cluster_scaling.py [--queues 1 3 6] [--jobs 3000]``
Prints one table; every wait is bounded.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jobq import Queue, Worker  # noqa: E402
from jobq.testing import LocalCluster  # noqa: E402

DRAIN_TIMEOUT = 300.0


def noop(job: object) -> dict[str, int]:
    """The benchmark's job: return a small dict."""
    return {"ok": 1}


def run_worker(url: str, queue: str, concurrency: int) -> None:
    """Child process: serve one queue until stdin closes."""
    with Worker(queue, noop, connection=url, concurrency=concurrency):
        sys.stdin.read()


def queue_names(cluster: LocalCluster, count: int) -> list[str]:
    """``count`` queue names spread as evenly as possible over the masters."""
    masters = cluster.masters()
    per_master: dict[int, list[str]] = {m.port: [] for m in masters}
    with cluster.client() as client:
        i = 0
        while sum(len(v) for v in per_master.values()) < count:
            name = f"scale-{i}"
            i += 1
            port = cluster.server_of_slot(client.keyslot(f"jobq:{{{name}}}:x")).port
            if len(per_master[port]) < -(-count // len(masters)):
                per_master[port].append(name)
    ordered = [n for names in per_master.values() for n in names]
    return ordered[:count]


def measure(shards: int, queues: int, jobs: int, concurrency: int) -> dict[str, float]:
    with LocalCluster(masters=shards) as cluster:
        names = queue_names(cluster, queues)
        url = cluster.url
        handles = [Queue(name, connection=url) for name in names]
        start = time.perf_counter()
        threads = [
            threading.Thread(
                target=lambda q=q: q.add_bulk({"name": "noop"} for _ in range(jobs))
            )
            for q in handles
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(DRAIN_TIMEOUT)
        enqueue = time.perf_counter() - start
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--worker", url, name, str(concurrency)],
                stdin=subprocess.PIPE, cwd=ROOT,
            )
            for name in names
        ]
        try:
            start = time.perf_counter()
            deadline = time.monotonic() + DRAIN_TIMEOUT
            pending = list(handles)
            while pending:
                if time.monotonic() > deadline:
                    raise TimeoutError("the queues did not drain in time")
                pending = [q for q in pending if q.get_job_counts("completed")["completed"] < jobs]
                threading.Event().wait(0.01)  # polling the counts: nothing to wait on
            drain = time.perf_counter() - start
        finally:
            for p in procs:
                assert p.stdin is not None
                p.stdin.close()
            for p in procs:
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(10)
            for q in handles:
                q.close()
    total = queues * jobs
    return {"enqueue_per_s": total / enqueue, "drain_per_s": total / drain}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, nargs="+", default=[1, 3, 6])
    parser.add_argument("--jobs", type=int, default=3000, help="jobs per queue")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        run_worker(args.worker[0], args.worker[1], int(args.worker[2]))
        return 0
    print(
        f"# cluster scaling: queues x {args.jobs} no-op jobs each, one worker "
        f"process per queue (concurrency {args.concurrency})\n"
        f"# machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}"
    )
    print("| shards | queues | bulk enqueue (jobs/s) | drain (jobs/s) |\n|---:|---:|---:|---:|")
    for queues in args.queues:
        for shards in (1, 3):
            r = measure(shards, queues, args.jobs, args.concurrency)
            print(
                f"| {shards} | {queues} | {r['enqueue_per_s']:,.0f} | {r['drain_per_s']:,.0f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
