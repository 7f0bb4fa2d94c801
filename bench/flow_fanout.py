"""A fan-out of N children under one parent, jobq's FlowProducer beside
BullMQ's (Node.js) on one private server: the time to add the tree and the
fan-in rate (children finished per second by one worker at concurrency 8,
until the parent has run with every child's value).

    .venv/bin/python bench/flow_fanout.py [N] [--repeats 3] [--server PATH]

N defaults to 10,000. BullMQ Node needs `python bench/install.py bullmq-node`
(skipped with a note when missing). Runs alternate between the peers; each
figure is the median of the repeats. jobq writes the whole tree in one script
call; BullMQ in one MULTI of one script call per job.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from jobq import FlowProducer, Job, Worker  # noqa: E402
from jobq.testing import RedisServer, find_server_binary  # noqa: E402

NODE_DIR = ROOT / "bench" / "node"


def run_jobq(url: str, n: int) -> tuple[float, float]:
    name = f"fan-{os.getpid()}"
    with FlowProducer(connection=url, prefix="{bench}") as flow:
        tree = {"name": "parent", "queue": name,
                "children": [{"name": "child", "queue": name, "data": i} for i in range(n)]}
        start = time.perf_counter()
        node = flow.add(tree)
        added = time.perf_counter() - start

        def handler(job: Job) -> int:
            return len(job.get_children_values()) if job.name == "parent" else job.data

        start = time.perf_counter()
        with Worker(name, handler, connection=url, prefix="{bench}", concurrency=8):
            if node.job.wait_until_finished(timeout=600) != n:
                raise RuntimeError("the parent did not see every child")
        ran = time.perf_counter() - start
    return added, ran


def run_bullmq(url: str, n: int) -> tuple[float, float] | str:
    node = shutil.which("node")
    if not node or not (NODE_DIR / "node_modules" / "bullmq").is_dir():
        return "not installed (python bench/install.py bullmq-node)"
    out = subprocess.run([node, "bench.js", "flow", url, str(n)], cwd=NODE_DIR,
                         capture_output=True, text=True, timeout=900)
    line = (out.stdout.strip().splitlines() or ["{}"])[-1]
    reply = json.loads(line)
    if "error" in reply or out.returncode:
        return f"failed: {reply.get('error') or out.stderr[-300:]}"
    return float(reply["add_s"]), float(reply["fanin_s"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("n", nargs="?", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--server", help="server binary (default: the embedded one)")
    args = parser.parse_args()
    n = args.n
    results: dict[str, list[tuple[float, float]]] = {"jobq": [], "BullMQ (Node)": []}
    notes: dict[str, str] = {}
    with RedisServer(args.server or find_server_binary()) as server:
        admin = redis.Redis.from_url(server.url)
        print(f"{server.server_name} {server.version}; {n:,} children, "
              f"{args.repeats} repeats", file=sys.stderr)
        for r in range(args.repeats):
            order = ["jobq", "BullMQ (Node)"] if r % 2 == 0 else ["BullMQ (Node)", "jobq"]
            for peer in order:
                admin.flushall()
                got = run_jobq(server.url, n) if peer == "jobq" else run_bullmq(server.url, n)
                if isinstance(got, str):
                    notes[peer] = got
                else:
                    results[peer].append(got)
        admin.close()
    print(f"{'peer':16s} {'add jobs/s':>12s} {'add s':>8s} {'fan-in children/s':>18s}")
    for peer, runs in results.items():
        if not runs:
            print(f"{peer:16s} {notes.get(peer, 'no run')}")
            continue
        add = statistics.median(a for a, _ in runs)
        fan = statistics.median(f for _, f in runs)
        print(f"{peer:16s} {n / add:12,.0f} {add:8.2f} {n / fan:18,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
