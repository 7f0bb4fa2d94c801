"""L1 (FAULTS.md): 10,000 threads each waiting on a distinct job through one
QueueEvents.

Adds ``--jobs`` jobs (no worker yet), starts one waiting thread per job
(``job.wait_until_finished(events)``), then counts the server's event-reader
connections of the queue (by CLIENT LIST name: passing is exactly 1), then
starts worker processes (``jobq worker builtins:id``) and measures, per
waiter, the wake latency (woken - the job's finished_on, both epoch
seconds on this host) and the memory per waiting thread (RSS growth / waiters),
and the waiting process's CPU time while the jobs run.

``--floor`` measures what any library with one thread per waiter pays on
this machine, with no server or worker: ``--jobs`` threads blocked on plain
``threading.Event``s are woken 64 at a time, each batch once the one before
has run (the pacing jobq's waker uses); then the same through jobq's own
wake path (its ``WakeGate`` and waker thread, handed every waiter at once
as a reader would). It prints the time until the last ran and the
process's CPU time for each.

    .venv/bin/python bench/load/l1_waiters.py             # 10,000 waiters
    .venv/bin/python bench/load/l1_waiters.py --floor     # the floor, no jobq
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from jobq import Queue, QueueEvents  # noqa: E402
from jobq._waiters import Completed, Waiter, WakeGate  # noqa: E402
from jobq.testing import RedisServer  # noqa: E402

QUEUE = "l1"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--stack-kib", type=int, default=256,
                        help="thread stack size (threading.stack_size); 0 keeps the default")
    parser.add_argument("--floor", action="store_true",
                        help="wake plain Events instead (no server, no jobq)")
    args = parser.parse_args()
    if args.stack_kib:
        threading.stack_size(args.stack_kib * 1024)
    if args.floor:
        return floor(args.jobs) or gate_path(args.jobs)
    me = psutil.Process()
    with RedisServer() as server, server.client() as admin:
        queue = Queue(QUEUE, connection=server.url)
        events = QueueEvents(QUEUE, connection=server.url)
        assert events.wait_until_ready(10)
        jobs = queue.add_bulk({"name": "w", "data": i} for i in range(args.jobs))
        rss_before = me.memory_info().rss
        woken: dict[str, float] = {}
        errors: list[BaseException] = []
        lock = threading.Lock()

        def wait(job: object) -> None:
            try:
                job.wait_until_finished(events, timeout=600)  # type: ignore[attr-defined]
                at = time.time()
                with lock:
                    woken[job.id] = at  # type: ignore[attr-defined]
            except BaseException as exc:
                with lock:
                    errors.append(exc)

        started = time.monotonic()
        threads = [threading.Thread(target=wait, args=(j,), daemon=True) for j in jobs]
        for thread in threads:
            thread.start()
        spawn_s = time.monotonic() - started
        # every waiter registered (the reader holds them in a dict)
        deadline = time.monotonic() + 120
        while len(events._table.snapshot()) < args.jobs:
            if time.monotonic() > deadline:
                break
            threading.Event().wait(0.05)
        registered = len(events._table.snapshot())
        rss_waiting = me.memory_info().rss
        readers = [c for c in admin.client_list() if c["name"] == f"jobq-events-{QUEUE}"]
        env = dict(os.environ, JOBQ_REDIS_URL=server.url)
        work_started = time.monotonic()
        cpu_before = me.cpu_times()
        procs = [
            subprocess.Popen([sys.executable, "-m", "jobq", "worker", "builtins:id", "--queue",
                              QUEUE, "--concurrency", str(args.concurrency), "--log-level",
                              "WARNING"], cwd=ROOT, env=env)
            for _ in range(args.procs)
        ]
        try:
            for thread in threads:
                thread.join(max(0.0, 600 - (time.monotonic() - work_started)))
            all_woken = time.monotonic() - work_started
            cpu = me.cpu_times()
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(15)
        pipe = admin.pipeline(transaction=False)
        for job in jobs:
            pipe.hget(f"jobq:{{{QUEUE}}}:job:{job.id}", "fon")
        fons = pipe.execute()
        finished = {j.id: float(f) / 1000 for j, f in zip(jobs, fons, strict=True) if f}
        latencies = sorted(woken[i] - finished[i] for i in woken if i in finished)
        span = (max(finished.values()) - min(finished.values())) if finished else 0.0
        after_last = (max(woken.values()) - max(finished.values())) if finished and woken else 0.0
        events.close()
        queue.close()
    per_waiter = (rss_waiting - rss_before) / max(1, args.jobs)
    print(f"L1: {args.jobs} waiting threads ({args.stack_kib or 'default'} KiB stacks), "
          f"started in {spawn_s:.1f} s, {registered} registered")
    print(f"event-reader connections of the queue: {len(readers)}")
    print(f"woken {len(woken)}, errors {len(errors)} {errors[:3]}; all woken "
          f"{all_woken:.1f} s after the workers started")
    print(f"jobs finished over {span:.2f} s; the last waiter woke {after_last:.2f} s after "
          f"the last job finished; the waiting process's CPU meanwhile: user "
          f"{cpu.user - cpu_before.user:.2f} s, system {cpu.system - cpu_before.system:.2f} s")
    if latencies:
        print(f"wake latency (woken - finished_on): p50 {statistics.median(latencies) * 1000:.1f} "
              f"ms, p99 {latencies[int(len(latencies) * 0.99) - 1] * 1000:.1f} ms, "
              f"max {latencies[-1] * 1000:.1f} ms")
    print(f"RSS: before {rss_before / 2**20:.1f} MiB, with waiters "
          f"{rss_waiting / 2**20:.1f} MiB: {per_waiter / 1024:.1f} KiB per waiter")
    return 0 if len(woken) == args.jobs and len(readers) == 1 and not errors else 1


def floor(count: int, batch: int = 64) -> int:
    """Wake ``count`` threads blocked on plain Events, ``batch`` at a time."""
    events = [threading.Event() for _ in range(count)]
    ran = threading.Semaphore(0)
    release = threading.Event()
    last = [0.0]

    def wait(event: threading.Event) -> None:
        if event.wait(600):
            last[0] = time.monotonic()
            ran.release()
            release.wait(600)  # stays alive, as a pool's thread would

    threads = [threading.Thread(target=wait, args=(e,), daemon=True) for e in events]
    for thread in threads:
        thread.start()
    me = psutil.Process()
    cpu_before, started = me.cpu_times(), time.monotonic()
    for first in range(0, count, batch):
        for event in events[first:first + batch]:
            event.set()
        for _ in range(len(events[first:first + batch])):
            if not ran.acquire(timeout=60):
                print("a woken thread did not run within 60 s")
                return 1
    cpu = me.cpu_times()
    release.set()
    for thread in threads:
        thread.join(60)
    print(f"floor: {count} threads blocked on Events woken {batch} at a time: the last ran "
          f"{last[0] - started:.2f} s after the first was woken; CPU user "
          f"{cpu.user - cpu_before.user:.2f} s, system {cpu.system - cpu_before.system:.2f} s")
    return 0


def gate_path(count: int) -> int:
    """Wake ``count`` threads blocked on jobq's Waiters through its WakeGate."""
    gate, stop, release = WakeGate(), threading.Event(), threading.Event()
    waiters = [Waiter(str(i)) for i in range(count)]
    ran = threading.Semaphore(0)
    last = [0.0]

    def wait(waiter: Waiter) -> None:
        if waiter.event.wait(600):
            waiter.resumed()  # as QueueEvents.wait_for does once woken
            last[0] = time.monotonic()
            ran.release()
            release.wait(600)

    def waker() -> None:
        while not stop.is_set():
            gate.work(stop)

    threads = [threading.Thread(target=wait, args=(w,), daemon=True) for w in waiters]
    for thread in threads:
        thread.start()
    waker_thread = threading.Thread(target=waker, daemon=True)
    waker_thread.start()
    me = psutil.Process()
    cpu_before, started = me.cpu_times(), time.monotonic()
    gate.add([(waiter, Completed(None)) for waiter in waiters])
    for _ in range(count):
        if not ran.acquire(timeout=60):
            print("a woken thread did not run within 60 s")
            return 1
    cpu = me.cpu_times()
    stop.set()
    gate.stop()
    release.set()
    for thread in (*threads, waker_thread):
        thread.join(60)
    print(f"jobq's wake path: {count} threads blocked on Waiters woken through a WakeGate: the "
          f"last ran {last[0] - started:.2f} s after they were handed over; CPU user "
          f"{cpu.user - cpu_before.user:.2f} s, system {cpu.system - cpu_before.system:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
