"""Add and drain rates of one sharded queue on 1, 2, 4 and 8 masters, each
master CPU-throttled the same way, so that the servers, not the clients,
are the limit (bench/README.md, "Sharded queue scaling").

Each run starts a cluster of real server processes on loopback
(``jobq.testing.LocalCluster``) and puts every master in a cgroup (v1 ``cpu``
controller: ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``) of its own that
allows QUOTA of one core. One ``ShardedQueue`` of SHARDS shards (a multiple
of every master count, so that each master serves as many shards) is filled
by PRODUCERS processes with ``add_bulk`` (JOBS_PER_MASTER jobs per master, so
that a phase lasts about as long on any cluster; timed from a common start
to the last reply), then drained by WORKERS processes (timed from their
start to the last completion). Each cgroup's ``cpu.stat`` shows how often the node was
throttled during a phase (the share of periods in which it hit its quota).

Needs root (it writes /sys/fs/cgroup/cpu). Every cgroup and server it makes
is removed at the end, also on error or Ctrl-C; it stops only the processes
it started, by their pid.

Usage: ``.venv/bin/python bench/shard_scaling.py [--masters 1 2 4 8] [--quota 0.05]``
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jobq import ShardedQueue, Worker  # noqa: E402
from jobq.testing import LocalCluster, RedisServer  # noqa: E402

CGROUP_ROOT = Path("/sys/fs/cgroup/cpu")
PHASE_TIMEOUT = 600.0


def noop(job: object) -> dict[str, int]:
    """The benchmark's job: return a small dict."""
    return {"ok": 1}


# -- child processes ------------------------------------------------------------------


def run_producer(url: str, queue: str, shards: int, jobs: int, chunk: int) -> None:
    """Child: wait for a line on stdin, add ``jobs`` jobs, print the seconds taken."""
    with ShardedQueue(queue, shards=shards, connection=url) as q:
        q.count()  # connected and checked before the clock starts
        print("ready", flush=True)
        sys.stdin.readline()
        start = time.perf_counter()
        for first in range(0, jobs, chunk):
            q.add_bulk({"name": "noop", "data": i} for i in range(first, min(jobs, first + chunk)))
        print(time.perf_counter() - start, flush=True)


def run_worker(url: str, queue: str, concurrency: int) -> None:
    """Child: wait for a line on stdin, serve the queue until stdin closes."""
    print("ready", flush=True)
    sys.stdin.readline()
    with Worker(queue, noop, connection=url, concurrency=concurrency):
        sys.stdin.read()


def _child(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, cwd=ROOT,
    )


def _end(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        if p.stdin is not None and not p.stdin.closed:
            p.stdin.close()
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()  # our own child, by its Popen handle
            p.wait(10)


# -- cgroups --------------------------------------------------------------------------


class Throttle:
    """One cgroup per server process, each allowed ``quota`` of one core."""

    def __init__(self, quota: float, period_us: int) -> None:
        self.quota = quota
        self.period_us = period_us
        self.groups: list[Path] = []

    def add(self, server: RedisServer) -> Path:
        pid = server.pid
        if pid is None:
            raise RuntimeError(f"{server} has no process")
        group = CGROUP_ROOT / f"jobq-shard-bench-{pid}"
        group.mkdir()
        self.groups.append(group)
        (group / "cpu.cfs_period_us").write_text(str(self.period_us))
        (group / "cpu.cfs_quota_us").write_text(str(max(1000, round(self.quota * self.period_us))))
        (group / "cgroup.procs").write_text(str(pid))
        return group

    def stats(self) -> list[dict[str, int]]:
        out = []
        for group in self.groups:
            fields = dict(line.split() for line in (group / "cpu.stat").read_text().splitlines())
            out.append({k: int(v) for k, v in fields.items()})
        return out

    def release(self) -> None:
        """Move what is left back to the root group and remove each cgroup."""
        for group in self.groups:
            try:
                for pid in (group / "cgroup.procs").read_text().split():
                    (CGROUP_ROOT / "cgroup.procs").write_text(pid)
                group.rmdir()
            except OSError as exc:
                print(f"# could not remove {group}: {exc}", file=sys.stderr)
        self.groups = []


def _throttled_share(before: list[dict[str, int]], after: list[dict[str, int]]) -> float:
    """Mean share of periods in which a node was throttled."""
    shares = []
    for b, a in zip(before, after, strict=True):
        periods = a["nr_periods"] - b["nr_periods"]
        shares.append((a["nr_throttled"] - b["nr_throttled"]) / periods if periods else 0.0)
    return sum(shares) / len(shares)


# -- one measurement ------------------------------------------------------------------


def _phase(
    procs: list[subprocess.Popen[str]], throttle: Throttle, finished: Callable[[], None]
) -> tuple[float, float]:
    """Start the children together once each says it is ready, wait for
    ``finished()``; (seconds, share of periods the nodes were throttled)."""
    try:
        for p in procs:
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError("a child process failed to start")
        before = throttle.stats()
        start = time.perf_counter()
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        finished()
        return time.perf_counter() - start, _throttled_share(before, throttle.stats())
    finally:
        _end(procs)


def measure(masters: int, args: argparse.Namespace) -> dict[str, Any]:
    throttle = Throttle(args.quota, args.period_us)
    with LocalCluster(masters=masters) as cluster:
        try:
            for server in cluster.masters():
                throttle.add(server)
            url = cluster.url
            name = f"scale-{masters}"
            per = args.jobs_per_master * masters // args.producers
            total = per * args.producers
            with ShardedQueue(name, shards=args.shards, connection=url) as queue:
                queue.get_job_counts()  # a script on every shard: each node loads the library
                producers = [
                    _child("--producer", url, name, str(args.shards), str(per), str(args.chunk))
                    for _ in range(args.producers)
                ]

                def added() -> None:
                    for p in producers:
                        assert p.stdout is not None
                        p.stdout.readline()  # the child's time: it is done

                add_s, add_throttled = _phase(producers, throttle, added)
                assert queue.get_job_counts("waiting")["waiting"] == total
                workers = [
                    _child("--worker", url, name, str(args.concurrency))
                    for _ in range(args.workers)
                ]

                def drained() -> None:
                    deadline = time.monotonic() + PHASE_TIMEOUT
                    while queue.get_job_counts("completed")["completed"] < total:
                        if time.monotonic() > deadline:
                            raise TimeoutError("the queue did not drain in time")
                        threading.Event().wait(0.05)  # polling the counts: nothing to wait on

                drain_s, drain_throttled = _phase(workers, throttle, drained)
        finally:
            throttle.release()
    return {
        "add": total / add_s, "drain": total / drain_s,
        "add_throttled": add_throttled, "drain_throttled": drain_throttled,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--masters", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--quota", type=float, default=0.05,
                        help="share of one core each master may use")
    parser.add_argument("--period-us", type=int, default=10_000)
    parser.add_argument("--jobs-per-master", type=int, default=16_000,
                        help="jobs per master: each phase lasts about as long on any size")
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=1600)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs per master count (the median is shown, and the range)")
    parser.add_argument("--producer", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.producer:
        url, queue, shards, jobs, chunk = args.producer
        run_producer(url, queue, int(shards), int(jobs), int(chunk))
        return 0
    if args.worker:
        run_worker(args.worker[0], args.worker[1], int(args.worker[2]))
        return 0
    print(
        f"# sharded queue scaling: one queue of {args.shards} shards, {args.jobs_per_master} "
        f"no-op jobs per master; "
        f"each master throttled to {args.quota:.0%} of a core (cgroup v1, period "
        f"{args.period_us} us); {args.producers} producer processes (add_bulk of "
        f"{args.chunk}), {args.workers} worker processes (concurrency {args.concurrency}); "
        f"median of {args.repeats} runs (range)\n"
        f"# machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}"
    )
    print("| masters | add (jobs/s) | x 1 master | drain (jobs/s) | x 1 master "
          "| throttled periods (add / drain) |\n|---:|---:|---:|---:|---:|---:|")
    runs: dict[int, list[dict[str, Any]]] = {m: [] for m in args.masters}
    for _ in range(args.repeats):  # interleaved, so that a drift of the machine is shared
        for masters in args.masters:
            runs[masters].append(measure(masters, args))
    base = {k: statistics.median(r[k] for r in runs[args.masters[0]]) for k in ("add", "drain")}
    for masters in args.masters:
        rs = runs[masters]
        cells = []
        for key in ("add", "drain"):
            values = sorted(r[key] for r in rs)
            median = statistics.median(values)
            spread = f" ({values[0]:,.0f}-{values[-1]:,.0f})" if len(values) > 1 else ""
            cells.append(f"{median:,.0f}{spread} | {median / base[key]:.2f}")
        throttled = (f"{statistics.median(r['add_throttled'] for r in rs):.0%} / "
                     f"{statistics.median(r['drain_throttled'] for r in rs):.0%}")
        print(f"| {masters} | {cells[0]} | {cells[1]} | {throttled} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
