"""Many threads adding jobs to one Queue: adds/s and client CPU per add, with
the script calls of concurrent threads coalesced on one connection (jobq's
default, jobq/_coalesce.py) and, beside it in the same run, each call on a
pooled connection of its own (the path a ``client=`` override takes).

    .venv/bin/python bench/concurrent_adds.py [--threads 16] [--adds 1500] [--rounds 3]

Starts its own server (/usr/bin/redis-server when present, else the
embedded one); the two ways alternate, so that the machine's drift touches
both. Prints each round and the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from jobq import Queue  # noqa: E402
from jobq.testing import RedisServer  # noqa: E402

WAIT = 300.0


def measure(url: str, threads: int, adds: int, pooled: bool) -> tuple[float, float]:
    """Adds/s and client CPU (us) per add of ``threads`` threads adding ``adds`` each."""
    with Queue("concurrent-adds", connection=url) as queue:
        queue.add("warm", 0)
        scripts = queue._context.scripts
        run = scripts.run
        if pooled:  # each call through the pool: what a given client does
            own = queue.client

            def through_pool(name: str, base: str, *args: Any, client: Any = None) -> Any:
                return run(name, base, *args, client=client or own)

            scripts.run = through_pool  # type: ignore[method-assign]
        start = threading.Barrier(threads + 1)

        def produce() -> None:
            start.wait(WAIT)
            for i in range(adds):
                queue.add("x", i)

        workers = [threading.Thread(target=produce) for _ in range(threads)]
        for worker in workers:
            worker.start()
        start.wait(WAIT)
        t0, c0 = time.perf_counter(), time.process_time()
        for worker in workers:
            worker.join(WAIT)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
        queue.obliterate(force=True)
    total = threads * adds
    return total / elapsed, cpu / total * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--adds", type=int, default=1500, help="adds per thread")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    binary = "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None
    figures: dict[str, list[tuple[float, float]]] = {"pooled": [], "coalesced": []}
    with RedisServer(binary) as server:
        for round_ in range(args.rounds):
            for way in ("pooled", "coalesced"):
                rate, cpu = measure(server.url, args.threads, args.adds, way == "pooled")
                figures[way].append((rate, cpu))
                print(f"round {round_ + 1} {way:9s} {rate:8.0f} adds/s  {cpu:6.1f} us CPU/add",
                      flush=True)
    print(f"medians of {args.rounds}, {args.threads} threads x {args.adds} adds:")
    for way, rows in figures.items():
        rate = statistics.median(r for r, _ in rows)
        cpu = statistics.median(c for _, c in rows)
        print(f"  {way:9s} {rate:8.0f} adds/s  {cpu:6.1f} us client CPU per add")


if __name__ == "__main__":
    main()
