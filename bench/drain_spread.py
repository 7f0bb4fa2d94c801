"""Why W2's drain at concurrency 8 spreads from run to run: the same drain
repeated with the server and the worker process placed on the machine's
cores three ways, beside a calibration of the machine itself.

    .venv/bin/python bench/drain_spread.py                  # 5 drains per placement
    .venv/bin/python bench/drain_spread.py --repeats 8 --jobs 20000

Placements (``os.sched_setaffinity``; the worker process inherits its
parent's): ``free`` (the scheduler decides, as ``make bench`` runs), ``split``
(server on the first core, the drain and its worker on the second) and
``same`` (all on the first core). Every drain is the harness's own W2
(bench/adapters/peer_jobq.py ``--workload w2``) against one private loopback
server, flushed and with its command statistics reset before each run;
beside each rate: the server's CPU per job and its ``FCALL`` time per call
(INFO commandstats), and the number of commands per job (the same in every
run when the work is the same). The calibration times a fixed pure-Python
loop (CPU time of one process, nothing else running) to show how much the
machine's own speed moves between runs. Needs at least 2 cores; not part
of ``make bench``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from jobq.testing import RedisServer, find_server_binary  # noqa: E402

ADAPTER = ROOT / "bench" / "adapters" / "peer_jobq.py"


def calibrate(rounds: int) -> list[float]:
    """CPU milliseconds of one fixed pure-Python loop, ``rounds`` times."""
    out = []
    for _ in range(rounds):
        t = time.process_time()
        s = 0
        for i in range(6_000_000):
            s += i * i
        out.append((time.process_time() - t) * 1000.0)
    return out


def commands(r: redis.Redis) -> tuple[int, float]:
    """All commands run since the last reset, and FCALL's microseconds per call."""
    stats = r.info("commandstats")
    total = sum(v["calls"] for k, v in stats.items() if k != "cmdstat_info")
    fcall = stats.get("cmdstat_fcall", {}).get("usec_per_call", 0.0)
    return total, fcall


def drain(server: RedisServer, jobs: int, cpus: set[int] | None) -> dict[str, float]:
    r = server.client()
    r.flushdb()
    r.config_resetstat()
    preexec = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    proc = subprocess.run(
        [sys.executable, str(ADAPTER), "--url", server.url, "--workload", "w2",
         "--n", str(jobs), "--concurrency", "8"],
        capture_output=True, text=True, timeout=600, preexec_fn=preexec, check=True,
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    total, fcall = commands(r)
    return {
        "jobs_s": result["w2_c8_jobs_s"],
        "server_us": result["w2_c8_server_us_per_job"],
        "fcall_us": fcall,
        "commands_per_job": total / jobs,
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--server", default=None, help="server binary (default: as the tests find one)")
    args = p.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        sys.exit("needs at least 2 cores")
    first, second = {cores[0]}, {cores[1]}
    placements = {"free": (None, None), "split": (first, second), "same": (first, first)}
    print(f"calibration, ms of CPU for one fixed loop: "
          f"{', '.join(f'{x:.0f}' for x in calibrate(args.repeats * 2))}")
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in placements}
    with RedisServer(args.server or find_server_binary()) as server:
        assert server.pid is not None
        for _ in range(args.repeats):
            for name, (server_cpus, client_cpus) in placements.items():
                os.sched_setaffinity(server.pid, server_cpus or set(cores))
                rows[name].append(drain(server, args.jobs, client_cpus))
        version = server.version
    print(f"W2 drain c=8 of {args.jobs} jobs, {server.server_name} {version}, "
          f"{args.repeats} runs per placement, interleaved")
    print(f"{'placement':9} {'jobs/s median (min-max)':>26} {'server us/job':>15} "
          f"{'FCALL us':>11} {'commands/job':>13}")
    for name, runs in rows.items():
        def span(key: str, width: int, places: int, runs=runs) -> str:
            low, high = min(r[key] for r in runs), max(r[key] for r in runs)
            return f"{low:>{width}.{places}f}-{high:<{width - 1}.{places}f}"

        rates = [r["jobs_s"] for r in runs]
        print(f"{name:9} {statistics.median(rates):>10,.0f} ({min(rates):,.0f}-{max(rates):,.0f})"
              f" {span('server_us', 7, 1)} {span('fcall_us', 5, 1)}"
              f" {span('commands_per_job', 6, 2)}")

if __name__ == "__main__":
    main()
