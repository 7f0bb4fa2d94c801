"""Where jobq's time goes: Redis commands per job for each workload shape
(INFO commandstats deltas) and a cProfile of single adds. Not part of
`make bench`; run: .venv/bin/python bench/profile_jobq.py"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jobq import Queue, Worker  # noqa: E402
from jobq.testing import RedisServer  # noqa: E402

N = 2000


def stats(r) -> dict[str, int]:
    return {k: v["calls"] for k, v in r.info("commandstats").items()}


def delta(before: dict[str, int], after: dict[str, int], n: int) -> str:
    d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    d = {k: v for k, v in d.items() if v > 0 and k not in ("cmdstat_info",)}
    return ", ".join(f"{k[8:]} {v / n:.2f}" for k, v in sorted(d.items(), key=lambda x: -x[1]))


def main() -> None:
    binary = "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None
    with RedisServer(binary) as server:
        r = server.client()
        q = Queue("prof", connection=server.url)
        b = stats(r)
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        for i in range(N):
            q.add("noop", i)
        prof.disable()
        el = time.perf_counter() - t0
        print(f"single add: {N / el:.0f}/s (under cProfile); commands per add: "
              f"{delta(b, stats(r), N)}")
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(14)
        print(s.getvalue())
        done = threading.Event()
        count = [0]

        def proc(job):
            count[0] += 1
            if count[0] == N:
                done.set()
            return {"ok": True, "i": job.data}

        b = stats(r)
        with Worker("prof", proc, connection=server.url, concurrency=1):
            done.wait(120)
        print(f"drain: commands per job: {delta(b, stats(r), N)}")
        with Worker("prof", proc, connection=server.url, concurrency=1):
            q.add("noop", -1).wait_until_finished(timeout=30)
            b = stats(r)
            for i in range(200):
                q.add("noop", i).wait_until_finished(timeout=30)
            print(f"W3 round trip: commands per trip: {delta(b, stats(r), 200)}")
        q.close()


if __name__ == "__main__":
    main()
