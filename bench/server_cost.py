"""Server-side cost of jobq's scripts, counted in instructions (deterministic,
unlike timings on a shared machine): a private redis-server runs under
valgrind's callgrind with instrumentation off, switched on around each phase.

    .venv/bin/python bench/server_cost.py [N]    # N jobs per phase, default 1000
    .venv/bin/python bench/server_cost.py --bullmq   # BullMQ on Node.js beside it

Needs valgrind (``apt-get install valgrind``) and /usr/bin/redis-server (or
``--server PATH``). Prints instructions per job for: a plain SET (the floor
of one round trip), a single add, a bulk add (chunks of 1,000), and a drain at
concurrency 1 (finish one job and take the next, one script call per job).
Not part of ``make bench``: valgrind slows the server some 50-fold. With
``--keep DIR`` the dumps stay there: ``callgrind_annotate`` on the newest
shows where a phase's instructions go.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import redis  # noqa: E402

from jobq import Job, Queue, Worker  # noqa: E402

WAIT = 600.0


class Callgrind:
    """A redis-server under callgrind; ``count(fn)`` gives fn's instructions."""

    def __init__(self, server: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="jobq-cg-")
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        self.proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no",
             f"--callgrind-out-file={self.dir}/cg.out", server, "--port", str(port),
             "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.url = f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 60
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("redis-server under valgrind did not start") from None
                time.sleep(0.1)
        client.close()

    def _control(self, *args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(self.proc.pid)], check=True,
                       stdout=subprocess.DEVNULL, timeout=60)

    def _dump_total(self) -> int:
        before = set(os.listdir(self.dir))
        self._control("-d")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for name in set(os.listdir(self.dir)) - before:
                with open(os.path.join(self.dir, name)) as f:
                    found = re.search(r"^totals: (\d+)", f.read(), re.M)
                if found:
                    return int(found.group(1))
            time.sleep(0.2)
        raise RuntimeError("callgrind wrote no dump")

    def count(self, fn: Callable[[], None]) -> int:
        self._dump_total()  # start from a fresh counter
        self._control("-i", "on")
        try:
            fn()
        finally:
            self._control("-i", "off")
        return self._dump_total()

    def close(self, keep: str | None = None) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
        if keep:  # each phase's dump, for callgrind_annotate
            shutil.copytree(self.dir, keep, dirs_exist_ok=True)
        shutil.rmtree(self.dir, ignore_errors=True)


def drain_cost(cg: Callgrind, q: Queue, n: int, concurrency: int) -> float:
    """Instructions per job of a worker draining ``n`` jobs (finish one and
    take the next in one call)."""
    q.obliterate(force=True)
    q.add_bulk([{"name": "noop", "data": i} for i in range(n + 10)])
    done = threading.Event()
    count = [0]
    lock = threading.Lock()

    def handler(job: Job) -> dict[str, Any]:
        with lock:
            count[0] += 1
            if count[0] in (10, n + 10):
                done.set()
        return {"ok": True}

    with Worker("cost", handler, connection=cg.url, concurrency=concurrency):
        if not done.wait(WAIT):  # the first jobs warm the worker up
            raise RuntimeError("the worker did not start")
        done.clear()
        first = [0]

        def drain() -> None:
            first[0] = count[0]  # jobs finished before counting began
            if not done.wait(WAIT):
                raise RuntimeError("the drain did not finish")

        total = cg.count(drain)
    return total / (n + 10 - first[0])


NODE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "node")


def node(mode: str, url: str, *args: Any) -> subprocess.Popen[bytes]:
    """bench/node/bench.js (BullMQ on Node.js) in ``mode``."""
    return subprocess.Popen(["node", "bench.js", mode, url, *map(str, args)], cwd=NODE_DIR,
                            stdout=subprocess.DEVNULL)


def node_run(mode: str, url: str, *args: Any) -> None:
    proc = node(mode, url, *args)
    if proc.wait(WAIT) != 0:
        raise RuntimeError(f"node bench.js {mode} failed")


def _await_completed(raw: Any, n: int, deadline: float, first: list[int]) -> None:
    """Until BullMQ's completed set holds ``n`` jobs; ``first[0]``: how many
    it held at the start."""
    first[0] = raw.zcard("bull:bench:completed")
    while raw.zcard("bull:bench:completed") < n:
        if time.monotonic() > deadline:
            raise RuntimeError("the BullMQ drain did not finish")
        time.sleep(0.05)  # a probe every 50 ms: a few dozen commands in all


def bullmq_rows(cg: Callgrind, n: int, concurrencies: list[int]) -> list[float]:
    """BullMQ Node's instructions per job for the same rows (bench.js; the
    scripts are loaded and each client connects before counting starts, as
    far as a process per phase allows: its connection set-up is counted)."""
    raw = redis.Redis.from_url(cg.url)
    node_run("adds", cg.url, 10)  # its scripts loaded before counting
    rows = [
        cg.count(lambda: node_run("adds", cg.url, n)) / n,
        cg.count(lambda: node_run("bulk", cg.url, max(1, n // 1000) * 1000))
        / (max(1, n // 1000) * 1000),
    ]
    for concurrency in concurrencies:
        raw.flushdb()
        node_run("preload", cg.url, n + 10)
        worker = node("worker", cg.url, concurrency)
        try:
            deadline = time.monotonic() + WAIT
            while raw.zcard("bull:bench:completed") < 10:  # warmed up
                if time.monotonic() > deadline or worker.poll() is not None:
                    raise RuntimeError("the BullMQ worker did not start")
                time.sleep(0.05)
            first = [0]
            total = cg.count(functools.partial(_await_completed, raw, n + 10, deadline, first))
            rows.append(total / (n + 10 - first[0]))
        finally:
            worker.terminate()
            worker.wait(WAIT)
    raw.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("n", nargs="?", type=int, default=1000)
    parser.add_argument("--server", default="/usr/bin/redis-server")
    parser.add_argument("--keep", metavar="DIR",
                        help="keep the dumps there (the last one is the drain's)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8],
                        help="the drains' worker concurrencies (default: 1 8)")
    parser.add_argument("--bullmq", action="store_true",
                        help="also count BullMQ on Node.js (bench/node, `python bench/install.py "
                             "bullmq-node` first) on its own server under callgrind")
    args = parser.parse_args()
    if not shutil.which("valgrind") or not shutil.which("callgrind_control"):
        sys.exit("valgrind is needed: apt-get install valgrind")
    n = args.n
    cg = Callgrind(args.server)
    try:
        raw = redis.Redis.from_url(cg.url)
        q = Queue("cost", connection=cg.url)
        q.add("warm", 0)  # scripts loaded before counting
        rows: list[tuple[str, float]] = []
        rows.append(("SET (one round trip)", cg.count(
            lambda: [raw.set("k", i) for i in range(n)]) / n))
        rows.append(("add", cg.count(lambda: [q.add("noop", i) for i in range(n)]) / n))
        rows.append(("add_bulk, chunks of 1,000", cg.count(lambda: [
            q.add_bulk([{"name": "noop", "data": i} for i in range(s, s + 1000)])
            for s in range(0, n, 1000)]) / (max(1, n // 1000) * 1000)))
        for concurrency in args.concurrency:
            rows.append((f"drain, c={concurrency} (finish + take next)",
                          drain_cost(cg, q, n, concurrency)))
        q.close()
        raw.close()
    finally:
        cg.close(args.keep)
    peer: list[float] = []
    if args.bullmq:
        cg = Callgrind(args.server)
        try:
            peer = bullmq_rows(cg, n, args.concurrency)
        finally:
            cg.close(None)
    print(f"Server instructions per job (callgrind, {n} jobs per row):")
    print(f"  {'':34s} {'jobq':>9s}" + (f" {'BullMQ Node':>12s} {'ratio':>6s}" if peer else ""))
    for i, (label, value) in enumerate(rows):
        line = f"  {label:34s} {value / 1000:8.1f}k"
        if peer and i > 0:
            line += f" {peer[i - 1] / 1000:11.1f}k {value / peer[i - 1]:5.2f}x"
        print(line)


if __name__ == "__main__":
    main()
