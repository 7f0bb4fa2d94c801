"""jobq beside BullMQ on Node.js, run in interleaved pairs on one private
server: the drain at concurrency 8 and W4 (16 callers adding and waiting),
each pair's ratio beside the medians, and for W4 each process's CPU per
round trip; with ``--workload w1``, W1 (single and bulk adds) of jobq,
BullMQ Node, Huey and the redis-py floor in rounds, in turn. On a shared
machine whose speed drifts by the minute, a ratio of runs made seconds
apart says more than two medians taken minutes apart.

    .venv/bin/python bench/vs_node.py                     # both, 4 pairs each (W4: 4 rounds)
    .venv/bin/python bench/vs_node.py --workload w4 --pairs 3 --seconds 10
    .venv/bin/python bench/vs_node.py --workload drain --server /usr/bin/redis-server

``drain``: the harness's own W2 (bench/adapters/peer_*.py ``--workload
w2``, 20,000 jobs, concurrency 8): jobs/s, the worker's CPU per 1,000
jobs and the server's CPU per job, as ``make bench`` reports them.

``w1``: the harness's W1 (``--jobs`` jobs, single adds then bulk adds in
chunks of 1,000) by each peer's adapter, Huey in its bench environment
(bench/install.py), and the floor's SET round trips and pipelined SETs;
each round starts with the next peer, and jobq's ratio to each peer is
taken within a round (not part of ``both``).

``w4``: the worker as ``make bench`` starts it (bench/adapters/peer_jobq.py
``worker``, bench/node ``worker``; concurrency 8) and a caller process: for
jobq 16 threads sharing one ``Queue`` (W4 as the harness runs it), for
BullMQ 16 async loops in one Node process (bench/node ``rr`` with no W3).
A third peer, ``floor``, is W4's shape with no queue in it (FLOOR_CALLER):
16 caller threads of raw redis-py pushing requests and waiting on Events
that one reader thread sets, and a worker process whose fetch thread hands
them to 8 pool threads that push the replies: what the threads, their
wake-ups and their round trips cost, beside what jobq adds to them.
Each caller reports its own round trips per second over its whole window;
the CPU (user + system, from /proc) of the caller, the worker and the
server is taken over the middle of that window and divided by that
window's trips (rate x seconds), so start-up and warm-up stay out.
``busy``: how many cores the three kept busy together (2.0 on a 2-core
machine: the trips are bounded by CPU, and the sum per trip says how many
the cores can serve).

The server is flushed before every run; the first peer of each pair
alternates. Needs Node.js and BullMQ in bench/node (bench/install.py); not
part of ``make bench``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from jobq.testing import RedisServer, find_server_binary  # noqa: E402

NODE_DIR = ROOT / "bench" / "node"
ADAPTERS = ROOT / "bench" / "adapters"
ADAPTER = ADAPTERS / "peer_jobq.py"
PEERS = ("jobq", "bullmq-node")
#: ``--workload w1``: jobq, then the peers it is compared with, in turn
W1_PEERS = ("jobq", "bullmq-node", "huey", "floor")
#: W4: jobq, BullMQ Node, and W4's shape with no queue (FLOOR_CALLER)
W4_PEERS = ("jobq", "bullmq-node", "floor")
CALLERS = 16
CLK_TCK = os.sysconf("SC_CLK_TCK")

# The end of each caller process: run caller(t) on `callers` threads for the
# window, print the round trips per second.
RUN_CALLERS = """
print(json.dumps({"started": True}), flush=True)
threads = [threading.Thread(target=caller, args=(t,)) for t in range(callers)]
t0 = time.perf_counter()
for t in threads:
    t.start()
for t in threads:
    t.join(seconds + 60)
print(json.dumps({"w4_trips_s": sum(counts) / (time.perf_counter() - t0)}), flush=True)
"""

# jobq's caller: W4 as bench/adapters/_common.py runs it (16 threads, one Queue)
JOBQ_CALLER = """
import json, sys, threading, time
from jobq import Queue
url, seconds, callers = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
q = Queue("bench", connection=url)
for i in range(20):
    q.add("noop", -1 - i).wait_until_finished(timeout=30)
counts = [0] * callers
stop_at = time.monotonic() + seconds
def caller(t):
    j = 1_000_000 * (t + 1)
    while time.monotonic() < stop_at:
        result = q.add("noop", j).wait_until_finished(timeout=30)
        assert result["i"] == j, result
        counts[t] += 1
        j += 1
"""
JOBQ_CALLER += RUN_CALLERS + "q.close()\n"


# W4's shape with no queue at all (the thread-per-caller floor): 16 caller
# threads, each pushing its request on a connection of its own and waiting
# on a threading.Event that one reader thread sets (BLMPOP of the replies);
# a worker process whose fetch thread hands the requests to 8 pool threads,
# each pushing its reply on a connection of its own. The least any
# thread-per-caller client and thread-pool worker of redis-py spend per trip.
FLOOR_CALLER = """
import json, sys, threading, time
import redis
url, seconds, callers = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
events = [threading.Event() for _ in range(callers)]
stop = threading.Event()
def reader():
    r = redis.Redis.from_url(url)
    while not stop.is_set():
        got = r.blmpop(1, 1, "floor:rep", direction="RIGHT", count=64)
        for item in (got[1] if got else ()):
            events[int(item.split(b":")[0])].set()
threading.Thread(target=reader, daemon=True).start()
counts = [0] * callers
stop_at = time.monotonic() + seconds
def caller(t):
    r = redis.Redis.from_url(url)
    ev, j = events[t], 0
    while time.monotonic() < stop_at:
        ev.clear()
        r.lpush("floor:req", f"{t}:{j}")
        assert ev.wait(30), "reply lost"
        counts[t] += 1
        j += 1
"""
FLOOR_CALLER += RUN_CALLERS + "stop.set()\n"
FLOOR_WORKER = """
import queue, sys, threading
import redis
url, concurrency = sys.argv[1], int(sys.argv[2])
jobs = queue.SimpleQueue()
slots = threading.Semaphore(concurrency)
def pool():
    r = redis.Redis.from_url(url)
    while True:
        item = jobs.get()
        r.lpush("floor:rep", item)
        slots.release()
for _ in range(concurrency):
    threading.Thread(target=pool, daemon=True).start()
r = redis.Redis.from_url(url)
while True:
    slots.acquire()
    got = r.brpop(["floor:req"], timeout=1)
    if got is None:
        slots.release()
    else:
        jobs.put(got[1])
"""


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def wait_started(proc: subprocess.Popen[str], timeout: float) -> None:
    """Read the caller's lines until it says its W4 window begins."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"caller ended early (rc {proc.wait(10)})")
        if '"started"' in line:
            return
    raise RuntimeError("caller did not start its W4 window in time")


def drain_run(peer: str, url: str, jobs: int) -> dict[str, float]:
    """One W2 drain at concurrency 8 by the harness's adapter of ``peer``."""
    redis.Redis.from_url(url).flushall()
    adapter = ADAPTERS / f"peer_{peer.replace('-', '_')}.py"
    proc = subprocess.run(
        [sys.executable, str(adapter), "--url", url, "--workload", "w2", "--n", str(jobs),
         "--concurrency", "8"],
        capture_output=True, text=True, timeout=900, cwd=str(ROOT),
        env=dict(os.environ, NODE_NO_WARNINGS="1"),
    )
    lines = proc.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if lines else {"error": proc.stderr[-400:]}
    if "w2_c8_jobs_s" not in result:
        raise RuntimeError(f"{peer} drain failed: {result}")
    return {"jobs_s": result["w2_c8_jobs_s"], "worker_ms_1k": 1000 * result["w2_c8_cpu_s_per_1k"],
            "server_us": result["w2_c8_server_us_per_job"]}


def w1_run(peer: str, url: str, jobs: int) -> dict[str, float]:
    """The harness's W1 by ``peer``'s adapter (single adds, then bulk adds in
    chunks of 1,000: jobs/s), in the peer's own environment; for ``floor``,
    redis-py's SET round trips and pipelined SETs (bench/adapters/floor.py,
    its ping-pong rows cut short)."""
    redis.Redis.from_url(url).flushall()
    python = sys.executable
    if peer == "huey":
        python = str(ROOT / "bench" / ".venvs" / "huey" / "bin" / "python")
    if peer == "floor":
        command = [python, str(ADAPTERS / "floor.py"), "--url", url, "--workload", "w1",
                   "--n", str(jobs), "--w3-n", "50", "--w4-seconds", "0.5"]
    else:
        command = [python, str(ADAPTERS / f"peer_{peer.replace('-', '_')}.py"), "--url", url,
                   "--workload", "w1", "--n", str(jobs)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=str(ROOT),
                          env=dict(os.environ, NODE_NO_WARNINGS="1"))
    lines = proc.stdout.strip().splitlines()
    result = json.loads(lines[-1]) if lines else {"error": proc.stderr[-400:]}
    if peer == "floor":
        # a SET/GET loop: each command one round trip, as each add is
        return {"single": result["floor_single_ops_s"], "bulk": result["floor_pipeline_ops_s"]}
    if "w1_single_jobs_s" not in result:
        raise RuntimeError(f"{peer} W1 failed: {result}")
    return {"single": result["w1_single_jobs_s"], "bulk": result.get("w1_bulk_jobs_s", 0.0)}


def w4_run(peer: str, url: str, server_pid: int, seconds: float) -> dict[str, float]:
    """One W4 run of ``peer``: its rate and each process's CPU per trip."""
    redis.Redis.from_url(url).flushall()
    env = dict(os.environ, PYTHONPATH=str(ROOT), BENCH_QUEUE="bench", NODE_NO_WARNINGS="1")
    if peer == "jobq":
        worker_argv = [sys.executable, str(ADAPTER), "worker", url, "8", "bench"]
        caller_argv = [sys.executable, "-c", JOBQ_CALLER, url, str(seconds), str(CALLERS)]
        cwd = str(ROOT)
    elif peer == "floor":
        worker_argv = [sys.executable, "-c", FLOOR_WORKER, url, "8"]
        caller_argv = [sys.executable, "-c", FLOOR_CALLER, url, str(seconds), str(CALLERS)]
        cwd = str(ROOT)
    else:
        node = shutil.which("node")
        assert node is not None
        worker_argv = [node, "bench.js", "worker", url, "8"]
        caller_argv = [node, "bench.js", "rr", url, "0", "0", str(seconds), str(CALLERS)]
        cwd = str(NODE_DIR)
    worker = subprocess.Popen(worker_argv, cwd=cwd, env=env)
    try:
        caller = subprocess.Popen(caller_argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                  text=True)
        try:
            if peer != "bullmq-node":
                wait_started(caller, 60)
                lead = 0.2 * seconds
            else:  # Node prints only at the end: leave its start-up and warm-up out
                lead = 0.2 * seconds + 1.5
            time.sleep(lead)  # into the window (a measurement interval, not a synchronisation)
            window = 0.6 * seconds
            pids = (caller.pid, worker.pid, server_pid)
            before = [cpu_seconds(p) for p in pids]
            t0 = time.monotonic()
            time.sleep(window)
            after = [cpu_seconds(p) for p in pids]
            elapsed = time.monotonic() - t0
            out, _ = caller.communicate(timeout=seconds + 120)
        finally:
            if caller.poll() is None:
                caller.kill()
                caller.wait(10)
    finally:
        worker.terminate()
        try:
            worker.wait(15)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(10)
    if caller.returncode != 0:
        raise RuntimeError(f"{peer} caller failed (rc {caller.returncode})")
    rate = json.loads(out.strip().splitlines()[-1])["w4_trips_s"]
    trips = rate * elapsed
    used = [(b - a) for a, b in zip(before, after, strict=True)]
    return {"trips_s": rate, "caller": 1e6 * used[0] / trips, "worker": 1e6 * used[1] / trips,
            "server": 1e6 * used[2] / trips, "total": 1e6 * sum(used) / trips,
            "busy": sum(used) / elapsed}


def report(title: str, runs: dict[str, list[dict[str, float]]], ratio_keys: list[str]) -> None:
    """Medians (min-max) per peer, and the median of the pairs' ratios."""
    print(f"\n{title}: medians (min-max) of {len(runs['jobq'])} interleaved pairs")
    keys = list(runs["jobq"][0])
    print("| peer | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for peer in runs:
        cells = []
        for key in keys:
            values = [run[key] for run in runs[peer]]
            places = 2 if key == "busy" else 0
            cells.append(f"{statistics.median(values):,.{places}f} "
                         f"({min(values):,.{places}f}-{max(values):,.{places}f})")
        print(f"| {peer} | " + " | ".join(cells) + " |")
    for other in list(runs)[1:]:
        for key in ratio_keys:
            if not all(run[key] for run in runs[other]):
                continue  # not measured for that peer (Huey has no bulk add)
            ratios = [a[key] / b[key] for a, b in zip(runs["jobq"], runs[other], strict=True)]
            print(f"jobq / {other}, {key}, pair by pair: "
                  + ", ".join(f"{r:.2f}" for r in ratios)
                  + f" (median {statistics.median(ratios):.2f})")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=("drain", "w4", "both", "w1"), default="both")
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per drain (per W1 run)")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per W4 run")
    parser.add_argument("--server", default=None, help="redis-server or valkey-server binary")
    args = parser.parse_args()
    if not shutil.which("node") or not (NODE_DIR / "node_modules" / "bullmq").is_dir():
        print("needs Node.js and BullMQ in bench/node (run bench/install.py)", file=sys.stderr)
        return 2
    workloads = ["drain", "w4"] if args.workload == "both" else [args.workload]
    binary = args.server or find_server_binary()
    with RedisServer(binary) as server:
        assert server.pid is not None
        print(f"{server.server_name} {server.version} ({binary}); {os.cpu_count()} cores; "
              f"drain: {args.jobs:,} jobs at concurrency 8; W4: {CALLERS} callers, "
              f"worker concurrency 8, {args.seconds:g} s per run")
        for workload in workloads:
            peers = {"w1": W1_PEERS, "w4": W4_PEERS}.get(workload, PEERS)
            runs: dict[str, list[dict[str, float]]] = {peer: [] for peer in peers}
            for pair in range(args.pairs):
                for peer in peers[pair % len(peers):] + peers[:pair % len(peers)]:
                    if workload == "w1":
                        figures = w1_run(peer, server.url, args.jobs)
                    elif workload == "drain":
                        figures = drain_run(peer, server.url, args.jobs)
                    else:
                        figures = w4_run(peer, server.url, server.pid, args.seconds)
                    runs[peer].append(figures)
                    print(f"  {workload} {peer:12s} " + "  ".join(
                        f"{k} {v:.2f}" if k == "busy" else f"{k} {v:,.0f}"
                        for k, v in figures.items()), flush=True)
            if workload == "w1":
                for other in peers[1:]:
                    report(f"W1 (jobs/s: single adds, bulk adds), jobq beside {other}",
                           {"jobq": runs["jobq"], other: runs[other]}, ["single", "bulk"])
            elif workload == "drain":
                report("drain c=8 (jobs/s; worker CPU ms per 1,000 jobs; server CPU µs per job)",
                       runs, ["jobs_s", "server_us"])
            else:
                report("W4 (round trips/s; CPU µs per round trip by process)", runs,
                       ["trips_s", "total"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
