"""The floor: the workload shapes done with raw redis-py (+hiredis) on the same
server. Runs in the project's .venv. Prints one JSON line.

- single: a SET/GET loop, one round trip per command (ops/s);
- pipeline: batches of 1,000 SETs in one pipeline (ops/s);
- pingpong: LPUSH/BRPOP ping-pong between two threads (p50/p95/p99 ms);
- pingpong16: the same with 16 thread pairs for a fixed time (trips/s, p50/p99).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
import redis  # noqa: E402


def pong(url: str, req: str, resp: str, stop: threading.Event) -> None:
    r = redis.Redis.from_url(url, socket_timeout=5)
    while not stop.is_set():
        got = r.brpop([req], timeout=1)
        if got is not None:
            r.lpush(resp, got[1])
    r.close()


def ping(url: str, req: str, resp: str, n: int, until: float | None) -> list[float]:
    r = redis.Redis.from_url(url, socket_timeout=5)
    out = []
    i = 0
    while (i < n) if until is None else (time.monotonic() < until):
        t0 = time.perf_counter()
        r.lpush(req, i)
        if r.brpop([resp], timeout=5) is None:
            raise TimeoutError("ping-pong reply lost")
        out.append(time.perf_counter() - t0)
        i += 1
    r.close()
    return out


def pingpong(url: str, pairs: int, n: int, seconds: float | None) -> tuple[list[float], float]:
    stop = threading.Event()
    servers = [threading.Thread(target=pong, args=(url, f"pp:req:{k}", f"pp:resp:{k}", stop),
                                daemon=True) for k in range(pairs)]
    for t in servers:
        t.start()
    results: list[list[float]] = [[] for _ in range(pairs)]
    until = None if seconds is None else time.monotonic() + seconds

    def run(k: int) -> None:
        results[k] = ping(url, f"pp:req:{k}", f"pp:resp:{k}", n, until)

    ping(url, "pp:req:0", "pp:resp:0", 50, None)  # warm-up
    callers = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(pairs)]
    t0 = time.perf_counter()
    for t in callers:
        t.start()
    for t in callers:
        t.join((seconds or 60) + 30)
    elapsed = time.perf_counter() - t0
    stop.set()
    for t in servers:
        t.join(5)
    return [x for row in results for x in row], elapsed


def main() -> int:
    args = _common.parse_args()
    url, n = args.url, args.n
    r = redis.Redis.from_url(url)
    out: dict[str, Any] = {}
    for i in range(100):
        r.set("warm", i)
    t0 = time.perf_counter()
    for i in range(n // 2):
        r.set(f"k{i}", i)
        r.get(f"k{i}")
    out["floor_single_ops_s"] = (n // 2) * 2 / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for start in range(0, n, 1000):
        p = r.pipeline(transaction=False)
        for i in range(start, min(n, start + 1000)):
            p.set(f"p{i}", i)
        p.execute()
    out["floor_pipeline_ops_s"] = n / (time.perf_counter() - t0)
    samples, _ = pingpong(url, 1, args.w3_n, None)
    for k, v in _common.latency_summary(samples).items():
        out[f"floor_pingpong_{k}"] = v
    samples, elapsed = pingpong(url, args.w4_threads, 0, args.w4_seconds)
    out["floor_pingpong16_trips_s"] = len(samples) / elapsed
    s = _common.latency_summary(samples)
    out["floor_pingpong16_p50_ms"], out["floor_pingpong16_p99_ms"] = s["p50_ms"], s["p99_ms"]
    _common.emit(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
