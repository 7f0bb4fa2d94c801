"""BullMQ on Node.js. This driver runs in the project's .venv (it needs only
redis-py, for the drain/idle probes); every BullMQ call is made by Node
(bench/node/bench.js): W1 and W3/W4 run entirely in one Node process against a
worker in another (``node bench.js worker URL C``), W4's 16 callers being 16
concurrent async loops, as is idiomatic in Node."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

NODE_DIR = os.path.join(os.path.dirname(_common.ADAPTERS), "node")
SCRIPT = os.path.join(NODE_DIR, "bench.js")
Q = _common.QUEUE


class NodePeer(_common.Peer):
    name = "bullmq-node"
    warmup = 0

    def __init__(self, url: str, variant: str | None) -> None:
        super().__init__(url, variant)
        self.node = shutil.which("node")
        if not self.node:
            raise RuntimeError("node not found on PATH")
        if not os.path.isdir(os.path.join(NODE_DIR, "node_modules", "bullmq")):
            raise RuntimeError("bullmq is not installed in bench/node (run bench/install.py)")
        self.raw = self.redis()
        self.queue_name = Q

    def use_queue(self, name: str) -> None:
        self.queue_name = name

    def wait_list_key(self) -> str:
        return f"bull:{self.queue_name}:wait"

    def load(self, n: int) -> None:
        self.client("load", self.url, n, timeout=600)

    def pair_rates(self, kind: str, n: int, chunk: int,
                   queues: tuple[str, str]) -> tuple[float, float, float, float]:
        out = self.client("pair", self.url, kind, n, chunk, *queues)
        return out["a_jobs_s"], out["b_jobs_s"], out["a_server_us"], out["b_server_us"]

    def worker_env(self) -> dict[str, str]:
        return {**super().worker_env(), "BENCH_QUEUE": self.queue_name}

    def client(self, *args: Any, timeout: float = 300) -> dict[str, Any]:
        proc = subprocess.run([self.node, SCRIPT, *map(str, args)], cwd=NODE_DIR,
                              capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "BENCH_QUEUE": self.queue_name})
        lines = proc.stdout.strip().splitlines()
        if not lines:
            raise RuntimeError(f"node printed nothing (rc {proc.returncode}): {proc.stderr[-400:]}")
        out = json.loads(lines[-1])
        if "error" in out:
            raise RuntimeError(out["error"][:400])
        return out

    def add(self, i: int) -> Any:
        return self.client("add", self.url, i)["id"]

    def preload_all(self, n: int) -> list[Any]:
        return self.client("preload", self.url, n)["ids"]

    def wait(self, handle: Any, timeout: float) -> Any:
        key = f"bull:{self.queue_name}:{handle}"
        _common.wait_for(lambda: self.raw.hexists(key, "finishedOn"), timeout, "a result",
                         interval=0.002)
        return json.loads(self.raw.hget(key, "returnvalue"))

    def is_done(self, handle: Any) -> bool:
        return bool(self.raw.hexists(f"bull:{self.queue_name}:{handle}", "finishedOn"))

    def pending(self) -> int:
        return int(self.raw.llen(self.wait_list_key()))

    def worker_argv(self, concurrency: int) -> list[str]:
        return [self.node, SCRIPT, "worker", self.url, str(concurrency)]

    def events_argv(self) -> list[str]:
        return [self.node, SCRIPT, "events", self.url]


def w1(peer: NodePeer, args: Any) -> dict[str, Any]:
    return peer.client("w1", peer.url, args.n)


def rr(peer: NodePeer, args: Any) -> dict[str, Any]:
    proc = _common.start_ready_worker(peer, args.concurrency)
    try:
        out = peer.client("rr", peer.url, args.w3_n, args.w3_max_seconds, args.w4_seconds,
                          args.w4_threads, timeout=args.w3_max_seconds + args.w4_seconds + 120)
        out["rr_worker_concurrency"] = args.concurrency
        return out
    finally:
        proc.stop()


if __name__ == "__main__":
    _common.WORKLOADS["w1"] = w1
    _common.WORKLOADS["rr"] = rr
    sys.exit(_common.main(NodePeer))
