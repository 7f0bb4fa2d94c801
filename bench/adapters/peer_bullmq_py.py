"""BullMQ's Python package (asyncio). The producer/caller side is native
asyncio (W4's 16 callers are 16 coroutines on one event loop); W2's preload
and the drain/idle probes reuse the shared synchronous harness. The Python
package has no ``waitUntilFinished``: a caller waits on QueueEvents' per-job
``completed:<id>`` channel and re-checks the job hash after subscribing (what
Node's ``Job.waitUntilFinished`` does). Worker: ``python peer_bullmq_py.py worker URL C``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

Q = _common.QUEUE


async def process(job: Any, token: str) -> dict[str, Any]:
    return _common.noop_result(job.data)


class Caller:
    """Async producer + result waiter on one event loop."""

    def __init__(self, url: str) -> None:
        from bullmq import Queue, QueueEvents

        self.queue = Queue(Q, {"connection": url})
        self.events = QueueEvents(Q, {"connection": url})
        self.url = url

    async def ready(self) -> None:
        # QueueEvents starts from "$" once its first XREAD is issued
        for _ in range(100):
            if self.events.running:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)

    async def wait(self, job: Any, timeout: float) -> Any:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        channel = f"completed:{job.id}"

        def on_done(args: Any, *_: Any) -> None:
            if not fut.done():
                fut.set_result(args.get("returnvalue"))

        self.events.on(channel, on_done)
        try:
            raw = await self.queue.client.hmget(f"bull:{Q}:{job.id}", "finishedOn",
                                                "returnvalue")
            if raw[0] is not None and not fut.done():
                fut.set_result(json.loads(raw[1]))
            return await asyncio.wait_for(fut, timeout)
        finally:
            self.events.off(channel, on_done)

    async def close(self) -> None:
        await self.events.close()
        await self.queue.close()


class BullmqPyPeer(_common.Peer):
    name = "bullmq-py"

    def __init__(self, url: str, variant: str | None) -> None:
        super().__init__(url, variant)
        self.loop = asyncio.new_event_loop()
        self.caller = self.loop.run_until_complete(self._make())
        self.raw = self.redis()

    async def _make(self) -> Caller:
        c = Caller(self.url)
        await c.ready()
        return c

    def add(self, i: int) -> Any:
        return self.loop.run_until_complete(self.caller.queue.add("noop", i))

    def add_bulk(self, start: int, count: int) -> list[Any]:
        return self.loop.run_until_complete(self.caller.queue.addBulk(
            [{"name": "noop", "data": i} for i in range(start, start + count)]))

    def wait(self, handle: Any, timeout: float) -> Any:
        return self.loop.run_until_complete(self.caller.wait(handle, timeout))

    def is_done(self, handle: Any) -> bool:
        return self.raw.hexists(f"bull:{Q}:{handle.id}", "finishedOn")

    def pending(self) -> int:
        return int(self.raw.llen(f"bull:{Q}:wait"))

    def worker_argv(self, concurrency: int) -> list[str]:
        return [sys.executable, os.path.abspath(__file__), "worker", self.url, str(concurrency)]

    def events_argv(self) -> list[str]:
        return [sys.executable, os.path.abspath(__file__), "events", self.url]

    def close(self) -> None:
        if not self.loop.is_closed():
            self.loop.run_until_complete(asyncio.wait_for(self.caller.close(), 10))
            self.loop.close()


def w1(peer: BullmqPyPeer, args: Any) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        q = peer.caller.queue
        t0 = time.perf_counter()
        for i in range(args.n):
            await q.add("noop", i)
        out = {"w1_single_jobs_s": args.n / (time.perf_counter() - t0)}
        await q.client.flushdb()
        t0 = time.perf_counter()
        for start in range(0, args.n, 1000):
            await q.addBulk([{"name": "noop", "data": i}
                             for i in range(start, min(args.n, start + 1000))])
        out["w1_bulk_jobs_s"] = args.n / (time.perf_counter() - t0)
        return out

    return peer.loop.run_until_complete(go())


def rr(peer: BullmqPyPeer, args: Any) -> dict[str, Any]:
    proc = _common.start_ready_worker(peer, args.concurrency)
    caller = peer.caller

    async def trip(i: int) -> float:
        t0 = time.perf_counter()
        job = await caller.queue.add("noop", i)
        res = await caller.wait(job, _common.RESULT_TIMEOUT)
        dt = time.perf_counter() - t0
        if not isinstance(res, dict) or res.get("i") != i:
            raise RuntimeError(f"wrong result {res!r} for {i}")
        return dt

    async def go() -> dict[str, Any]:
        out: dict[str, Any] = {"rr_worker_concurrency": args.concurrency}
        samples = []
        deadline = time.monotonic() + args.w3_max_seconds
        for i in range(args.w3_n):
            samples.append(await trip(i))
            if time.monotonic() > deadline:
                out["w3_capped"] = f"stopped after {len(samples)} trips"
                break
        for k, v in _common.latency_summary(samples).items():
            out[f"w3_{k}"] = v
        stop_at = time.monotonic() + args.w4_seconds
        lat: list[float] = []

        async def caller_loop(t: int) -> None:
            j = 1_000_000 * (t + 1)
            while time.monotonic() < stop_at:
                lat.append(await trip(j))
                j += 1

        t0 = time.perf_counter()
        await asyncio.wait_for(
            asyncio.gather(*(caller_loop(t) for t in range(args.w4_threads))),
            args.w4_seconds + _common.RESULT_TIMEOUT + 5)
        out["w4_trips_s"] = len(lat) / (time.perf_counter() - t0)
        s = _common.latency_summary(lat)
        out["w4_p50_ms"], out["w4_p99_ms"] = s["p50_ms"], s["p99_ms"]
        return out

    try:
        return peer.loop.run_until_complete(go())
    finally:
        proc.stop()


async def run_worker(url: str, concurrency: int) -> None:
    from bullmq import Worker

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    worker = Worker(Q, process, {"connection": url, "concurrency": concurrency})
    await stop.wait()
    await worker.close()


async def run_events(url: str) -> None:
    from bullmq import QueueEvents

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    events = QueueEvents(Q, {"connection": url})
    await stop.wait()
    await events.close()


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        asyncio.run(run_worker(sys.argv[2], int(sys.argv[3])))
    elif sys.argv[1:2] == ["events"]:
        asyncio.run(run_events(sys.argv[2]))
    else:
        _common.WORKLOADS["w1"] = w1
        _common.WORKLOADS["rr"] = rr
        sys.exit(_common.main(BullmqPyPeer))
