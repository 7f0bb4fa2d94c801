"""Drains of the same 10,000 jobs, one after another on one private server,
each printed with the CPU steal the machine saw meanwhile: is a spread of a
drain's rate the code's, or the hypervisor's?

    .venv/bin/python bench/drain_steal.py [RUNS] [CONCURRENCY]   # default 8 8

Each run: flush, bulk-add 10,000 jobs, start one worker process (``Worker``
of the given concurrency, a handler returning a small dict), wait until all
completed. Rate is by the jobs' own finish times (first to last); server CPU
per job from INFO; steal and idle from /proc/stat over the run (steal: the
share of this machine's CPU time its hypervisor gave to other machines).
The work per job is the same every run (bench/server_cost.py counts its
instructions).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from jobq import Queue  # noqa: E402
from jobq.testing import RedisServer, find_server_binary  # noqa: E402

JOBS = 10_000
WORKER = """
import sys
sys.path.insert(0, sys.argv[3])
from jobq import Worker
Worker("d", lambda job: {"ok": job.data}, connection=sys.argv[1],
       concurrency=int(sys.argv[2])).run()
"""


def stat() -> list[int]:
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:9]]


def server_cpu(client: object) -> float:
    info = client.info("cpu")  # type: ignore[attr-defined]
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    concurrency = sys.argv[2] if len(sys.argv) > 2 else "8"
    binary = "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None
    with RedisServer(binary or find_server_binary()) as server, server.client() as admin:
        for run in range(runs):
            admin.flushall()
            with Queue("d", connection=server.url) as queue:
                for first in range(0, JOBS, 1000):
                    queue.add_bulk({"name": "x", "data": i} for i in range(first, first + 1000))
            before, cpu_before = stat(), server_cpu(admin)
            worker = subprocess.Popen([sys.executable, "-c", WORKER, server.url, concurrency,
                                       ROOT])
            deadline = time.monotonic() + 300
            try:
                while admin.zcard("jobq:{d}:completed") < JOBS:
                    if time.monotonic() > deadline:
                        print(f"run {run}: not drained within 300 s")
                        return 1
                    threading.Event().wait(0.01)
            finally:
                worker.terminate()
                worker.wait(15)
            spent = [b - a for a, b in zip(before, stat(), strict=True)]
            cpu = (server_cpu(admin) - cpu_before) / JOBS * 1e6
            pipe = admin.pipeline(transaction=False)
            for i in range(1, JOBS + 1):
                pipe.hget(f"jobq:{{d}}:job:{i}", "fon")
            finished = sorted(float(f) for f in pipe.execute() if f)
            span = (finished[-1] - finished[0]) / 1000
            total = sum(spent) or 1
            steal, idle = 100 * spent[7] / total, 100 * (spent[3] + spent[4]) / total
            print(f"run {run}: {JOBS / span:7,.0f} jobs/s; server CPU {cpu:5.1f} us/job; "
                  f"steal {steal:4.1f}%, idle {idle:4.1f}%", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
