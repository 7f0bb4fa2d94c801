"""Shared harness of the synchronous Python adapters (stdlib + redis-py only).

Each adapter defines a ``Peer`` subclass with a few hooks (add, bulk add,
wait for a result, ...) and calls :func:`main`; the workloads themselves
are implemented once, here, so every peer is measured the same way.

Command line of every adapter::

    python peer_x.py --url URL --workload {w1,w2,rr,idle,w5} [--n N]
                     [--concurrency C] [--w3-n N] [--w4-seconds S]
                     [--variant V]

It prints exactly one JSON line (its last line of stdout) with the figures,
or ``{"error": "..."}``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

ADAPTERS = os.path.dirname(os.path.abspath(__file__))
CLK_TCK = os.sysconf("SC_CLK_TCK")
QUEUE = "bench"
RESULT = {"ok": True}  # the no-op job returns a small dict (plus its argument)
POLL = 0.005
DRAIN_TIMEOUT = 180.0
READY_TIMEOUT = 60.0
RESULT_TIMEOUT = 30.0
IDLE_SECONDS = 5.0


def noop_result(i: Any) -> dict[str, Any]:
    return {"ok": True, "i": i}


# -- measurement helpers ---------------------------------------------------


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def latency_summary(samples_s: list[float]) -> dict[str, float]:
    ms = [s * 1000.0 for s in samples_s]
    return {
        "n": len(ms),
        "p50_ms": percentile(ms, 50),
        "p95_ms": percentile(ms, 95),
        "p99_ms": percentile(ms, 99),
        "mean_ms": statistics.fmean(ms) if ms else float("nan"),
    }


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def process_tree(pid: int) -> list[int]:
    children = _children_map()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def tree_cpu_seconds(pid: int) -> float:
    """utime+stime of the process and its live descendants, plus the
    cutime+cstime of reaped children (RQ's forked work horses)."""
    total = 0
    for p in process_tree(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        # fields[11..14] are utime stime cutime cstime (stat fields 14..17)
        total += sum(int(x) for x in fields[11:15])
    return total / CLK_TCK


def tree_local_ports(pid: int) -> set[int]:
    """Local TCP ports of every socket open in the process tree."""
    inodes: set[str] = set()
    for p in process_tree(pid):
        try:
            fds = os.listdir(f"/proc/{p}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{p}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    cols = line.split()
                    if cols[9] in inodes:
                        ports.add(int(cols[1].rsplit(":", 1)[1], 16))
        except OSError:
            continue
    return ports


def clients_of(redis_client: Any, pid: int) -> list[dict[str, str]]:
    ports = tree_local_ports(pid)
    out = []
    for c in redis_client.client_list():
        addr = c.get("addr", "")
        try:
            port = int(addr.rsplit(":", 1)[1])
        except (IndexError, ValueError):
            continue
        if port in ports:
            out.append(c)
    return out


def total_commands(redis_client: Any) -> int:
    return int(redis_client.info("stats")["total_commands_processed"])


class Proc:
    """A worker (or reader) subprocess in its own session, always reaped."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None,
                 cwd: str | None = None) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="bench-worker-", suffix=".log",
                                               delete=False)
        full_env = dict(os.environ)
        full_env["PYTHONPATH"] = ADAPTERS + os.pathsep + full_env.get("PYTHONPATH", "")
        full_env.update(env or {})
        self.argv = argv
        self.popen = subprocess.Popen(argv, env=full_env, cwd=cwd or ADAPTERS,
                                      stdout=self.log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            raise RuntimeError(f"worker exited with {self.popen.returncode}: {self.tail()}")

    def tail(self, n: int = 600) -> str:
        try:
            with open(self.log.name, "rb") as f:
                data = f.read()
        except OSError:
            return ""
        return data[-n:].decode("utf-8", "replace").replace("\n", " | ")

    def stop(self) -> None:
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.popen.wait(10)
        else:
            # the session may still hold grandchildren
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            os.unlink(self.log.name)
        except OSError:
            pass


def wait_for(predicate: Callable[[], bool], timeout: float, what: str,
             proc: Proc | None = None, interval: float = POLL) -> float:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return time.perf_counter()
        if proc is not None:
            proc.check_alive()
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


# -- the peer interface ------------------------------------------------------


class Peer:
    """Hooks an adapter implements. ``handle`` is whatever ``add`` returns."""

    name = "?"
    bulk_reason = "no bulk add API"
    #: concurrency the peer's single worker process supports (None: any)
    max_concurrency: int | None = None
    concurrency_reason = ""
    events_reason = "no standalone event reader"

    def __init__(self, url: str, variant: str | None) -> None:
        self.url = url
        self.variant = variant

    def add(self, i: int) -> Any:
        raise NotImplementedError

    def add_bulk(self, start: int, count: int) -> list[Any]:
        raise NotImplementedError

    def has_bulk(self) -> bool:
        return type(self).add_bulk is not Peer.add_bulk

    def wait(self, handle: Any, timeout: float) -> Any:
        raise NotImplementedError

    def is_done(self, handle: Any) -> bool:
        raise NotImplementedError

    def pending(self) -> int:
        raise NotImplementedError

    def worker_argv(self, concurrency: int) -> list[str]:
        raise NotImplementedError

    def worker_env(self) -> dict[str, str]:
        return {"BENCH_REDIS_URL": self.url}

    def events_argv(self) -> list[str] | None:
        return None

    def redis(self) -> Any:
        import redis

        return redis.Redis.from_url(self.url)

    # W5 (scale) hooks: a peer that can switch queues measures it
    scale_reason = "not measured (W5 covers jobq and BullMQ on Node.js)"

    def use_queue(self, name: str) -> None:
        """Make every later call (adds, probes, workers) use queue ``name``."""
        raise NotImplementedError

    def has_scale(self) -> bool:
        return type(self).use_queue is not Peer.use_queue

    def wait_list_key(self) -> str:
        """The Redis list of waiting jobs (LPUSHed, taken from the right)."""
        raise NotImplementedError

    def nth_waiting(self, k: int) -> Any:
        """A handle of the job ``k``-th in line (1: the next one taken)."""
        raw = self.redis().lindex(self.wait_list_key(), -k)
        if raw is None:
            raise RuntimeError(f"fewer than {k} jobs waiting")
        return raw.decode()

    def load(self, n: int) -> None:
        """Add ``n`` jobs as fast as the peer's bulk API allows (no handles kept)."""
        for start in range(0, n, 1000):
            self.add_bulk(start, min(1000, n - start))

    def pair_rates(self, kind: str, n: int, chunk: int,
                   queues: tuple[str, str]) -> tuple[float, float, float, float]:
        """W1's single adds (``kind`` "single") or bulk adds of 1,000 ("bulk")
        to two queues alternately, ``chunk`` jobs at a time, ``n`` per queue
        (the first queue first in every other chunk): each queue's jobs/s
        over its own time, and the server's µs in scripts per job of each
        (read between chunks, untimed). Alternating in small chunks keeps
        the machine's drifts out of the comparison."""
        r = self.redis()
        spent, usec = [0.0, 0.0], [0.0, 0.0]
        for c, start in enumerate(range(0, n, chunk)):
            count = min(chunk, n - start)
            for side in (0, 1) if c % 2 == 0 else (1, 0):
                self.use_queue(queues[side])
                u0 = script_usec(r)
                t0 = time.perf_counter()
                if kind == "single":
                    for i in range(start, start + count):
                        self.add(i)
                else:
                    for s in range(start, start + count, 1000):
                        self.add_bulk(s, min(1000, start + count - s))
                spent[side] += time.perf_counter() - t0
                usec[side] += script_usec(r) - u0
        return n / spent[0], n / spent[1], usec[0] / n, usec[1] / n

    def close(self) -> None:
        pass


# -- workloads -----------------------------------------------------------------


def preload(peer: Peer, n: int) -> list[Any]:
    handles: list[Any] = []
    if hasattr(peer, "preload_all"):
        return peer.preload_all(n)
    if peer.has_bulk():
        for start in range(0, n, 1000):
            handles.extend(peer.add_bulk(start, min(1000, n - start)))
    else:
        handles = [peer.add(i) for i in range(n)]
    return handles


def w1(peer: Peer, args: argparse.Namespace) -> dict[str, Any]:
    n = args.n
    t0 = time.perf_counter()
    for i in range(n):
        peer.add(i)
    single = n / (time.perf_counter() - t0)
    out: dict[str, Any] = {"w1_single_jobs_s": single}
    if peer.has_bulk():
        r = peer.redis()
        r.flushdb()
        t0 = time.perf_counter()
        for start in range(0, n, 1000):
            peer.add_bulk(start, min(1000, n - start))
        out["w1_bulk_jobs_s"] = n / (time.perf_counter() - t0)
    else:
        out["w1_bulk_na"] = peer.bulk_reason
    return out


def server_cpu_seconds(r: Any) -> float:
    """The server's CPU time so far (INFO cpu: user + system, all its
    threads), seconds."""
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def w2(peer: Peer, args: argparse.Namespace) -> dict[str, Any]:
    c = args.concurrency
    key = f"w2_c{c}"
    if peer.max_concurrency is not None and c > peer.max_concurrency:
        return {f"{key}_na": peer.concurrency_reason}
    n = args.n
    handles = preload(peer, n)
    assert peer.pending() == n, f"pending {peer.pending()} != {n} after preload"
    proc = Proc(peer.worker_argv(c), peer.worker_env())
    try:
        # The clock starts when the worker takes its first job (so its start-up
        # is not counted) and stops when the last job's result is stored.
        t0 = wait_for(lambda: peer.pending() < n, READY_TIMEOUT, "the first take", proc,
                      interval=0.001)
        cpu0 = tree_cpu_seconds(proc.pid)
        server0 = server_cpu_seconds(peer.redis())
        t1 = wait_for(lambda: peer.is_done(handles[-1]), DRAIN_TIMEOUT, "the drain", proc)
        cpu1 = tree_cpu_seconds(proc.pid)
        server1 = server_cpu_seconds(peer.redis())
        left = peer.pending()
        # confirm every job ran (untimed)
        missing = sum(1 for h in handles[:: max(1, n // 200)] if not peer.is_done(h))
    finally:
        proc.stop()
    return {
        f"{key}_jobs_s": n / (t1 - t0),
        f"{key}_cpu_s_per_1k": (cpu1 - cpu0) / n * 1000.0,
        f"{key}_server_us_per_job": (server1 - server0) / n * 1e6,
        f"{key}_n": n,
        f"{key}_left": left,
        f"{key}_sampled_missing": missing,
    }


def start_ready_worker(peer: Peer, concurrency: int) -> Proc:
    proc = Proc(peer.worker_argv(concurrency), peer.worker_env())
    try:
        h = peer.add(-1)
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            proc.check_alive()
            try:
                peer.wait(h, 1.0)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"worker not ready after {READY_TIMEOUT:.0f}s: "
                                       f"{proc.tail()}") from None
        for i in range(getattr(peer, "warmup", 20)):  # warm up connections and caches
            peer.wait(peer.add(i), RESULT_TIMEOUT)
    except BaseException:
        proc.stop()
        raise
    return proc


def round_trip(peer: Peer, i: int) -> float:
    t0 = time.perf_counter()
    result = peer.wait(peer.add(i), RESULT_TIMEOUT)
    elapsed = time.perf_counter() - t0
    if not isinstance(result, dict) or result.get("i") != i:
        raise RuntimeError(f"wrong result {result!r} for {i}")
    return elapsed


def rr(peer: Peer, args: argparse.Namespace) -> dict[str, Any]:
    """W3 then W4 against one already-running worker process."""
    c = args.concurrency if peer.max_concurrency is None else min(
        args.concurrency, peer.max_concurrency)
    proc = start_ready_worker(peer, c)
    out: dict[str, Any] = {"rr_worker_concurrency": c}
    try:
        samples: list[float] = []
        deadline = time.monotonic() + args.w3_max_seconds
        for i in range(args.w3_n):
            samples.append(round_trip(peer, i))
            if time.monotonic() > deadline:
                out["w3_capped"] = (f"stopped after {len(samples)} trips "
                                    f"({args.w3_max_seconds:.0f}s cap)")
                break
        for k, v in latency_summary(samples).items():
            out[f"w3_{k}"] = v
        # W4: 16 caller threads for a fixed time
        stop_at = time.monotonic() + args.w4_seconds
        lat: list[list[float]] = [[] for _ in range(args.w4_threads)]
        errors: list[str] = []

        def caller(t: int) -> None:
            j = 1_000_000 * (t + 1)
            try:
                while time.monotonic() < stop_at:
                    lat[t].append(round_trip(peer, j))
                    j += 1
            except Exception as exc:  # reported, not hidden
                errors.append(f"{type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=caller, args=(t,), daemon=True)
                   for t in range(args.w4_threads)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join(args.w4_seconds + RESULT_TIMEOUT + 5)
        elapsed = time.perf_counter() - t0
        allv = [x for row in lat for x in row]
        out["w4_trips_s"] = len(allv) / elapsed
        s = latency_summary(allv)
        out["w4_p50_ms"], out["w4_p99_ms"] = s["p50_ms"], s["p99_ms"]
        if errors:
            out["w4_errors"] = f"{len(errors)} caller(s) failed: {errors[0]}"
    finally:
        proc.stop()
    return out


def measure_idle(pid: int, proc: Proc, r: Any, prefix: str) -> dict[str, Any]:
    clients = clients_of(r, pid)
    cpu0, cmd0, t0 = tree_cpu_seconds(pid), total_commands(r), time.perf_counter()
    time.sleep(IDLE_SECONDS)
    proc.check_alive()
    cpu1, cmd1, t1 = tree_cpu_seconds(pid), total_commands(r), time.perf_counter()
    clients2 = clients_of(r, pid)
    # our own INFO call between the two counters is counted once
    cmds = (cmd1 - cmd0 - 1) / (t1 - t0)
    return {
        f"{prefix}_cpu_pct": (cpu1 - cpu0) / (t1 - t0) * 100.0,
        f"{prefix}_connections": max(len(clients), len(clients2)),
        f"{prefix}_cmds_s": cmds,
        f"{prefix}_last_cmds": sorted({c.get("cmd", "?") for c in clients2}),
    }


def idle(peer: Peer, args: argparse.Namespace) -> dict[str, Any]:
    r = peer.redis()
    out: dict[str, Any] = {}
    proc = start_ready_worker(peer, 1)
    try:
        peer.close()  # the adapter's own connections go quiet before measuring
        time.sleep(2.0)
        out.update(measure_idle(proc.pid, proc, r, "idle_worker"))
    finally:
        proc.stop()
    argv = peer.events_argv()
    if argv is None:
        out["idle_events_na"] = peer.events_reason
        return out
    ev = Proc(argv, peer.worker_env())
    try:
        wait_for(lambda: bool(clients_of(r, ev.pid)), READY_TIMEOUT, "the event reader", ev,
                 interval=0.05)
        time.sleep(2.0)
        out.update(measure_idle(ev.pid, ev, r, "idle_events"))
    finally:
        ev.stop()
    return out


def used_memory(r: Any) -> int:
    return int(r.info("memory")["used_memory"])


def script_usec(r: Any) -> float:
    """Server microseconds spent in script calls so far (EVALSHA, EVAL,
    FCALL: jobq runs functions, BullMQ scripts; the commands a script calls
    are counted inside its call's time)."""
    stats = r.info("commandstats")
    return float(sum(stats.get(f"cmdstat_{c}", {}).get("usec", 0)
                     for c in ("evalsha", "eval", "fcall", "fcall_ro")))


def drain_first(peer: Peer, n: int, concurrency: int) -> dict[str, float]:
    """W2's drain of the ``n`` jobs next in line, whatever waits behind them:
    the clock starts at the worker's first take and stops when the ``n``-th
    job is finished."""
    last = peer.nth_waiting(n)
    before = peer.pending()
    proc = Proc(peer.worker_argv(concurrency), peer.worker_env())
    try:
        t0 = wait_for(lambda: peer.pending() < before, READY_TIMEOUT, "the first take", proc,
                      interval=0.001)
        cpu0 = tree_cpu_seconds(proc.pid)
        t1 = wait_for(lambda: peer.is_done(last), DRAIN_TIMEOUT, "the drain", proc)
        cpu1 = tree_cpu_seconds(proc.pid)
    finally:
        proc.stop()
    return {"jobs_s": n / (t1 - t0), "cpu_s_per_1k": (cpu1 - cpu0) / n * 1000.0}


def w5(peer: Peer, args: argparse.Namespace) -> dict[str, Any]:
    """W5 (scale): single add, bulk add and drain c=8 on a queue with
    ``--w5-backlog`` jobs waiting, beside the same on a new, empty queue of
    the same server (adds alternating between the two in small chunks, the
    drains' order swapped every repeat); and
    Redis memory (INFO used_memory) per waiting and per completed job kept,
    over ``--w5-mem-n`` jobs. Repeats are inside this one run (the backlog is
    loaded once): lists of figures, one per repeat."""
    if not peer.has_scale():
        return {"w5_na": peer.scale_reason}
    r = peer.redis()
    out: dict[str, Any] = {}
    # memory, on a queue of its own, before anything else is stored
    r.flushdb()
    peer.use_queue("bench-mem")
    m = args.w5_mem_n
    base = used_memory(r)
    peer.load(m)
    out["w5_mem_waiting_b"] = (used_memory(r) - base) / m
    drain_first(peer, m, args.concurrency)  # every job completed, all kept
    out["w5_mem_completed_b"] = (used_memory(r) - base) / m
    r.flushdb()
    # the backlog, loaded once
    peer.use_queue("bench-big")
    t0 = time.perf_counter()
    peer.load(args.w5_backlog)
    out["w5_load_jobs_s"] = args.w5_backlog / (time.perf_counter() - t0)
    out["w5_backlog"] = args.w5_backlog
    series: dict[str, list[float]] = {}

    def keep(key: str, empty: float, full: float) -> None:
        series.setdefault(f"w5_{key}_empty", []).append(empty)
        series.setdefault(f"w5_{key}_full", []).append(full)

    for rep in range(args.w5_repeats):
        pair = (f"bench-e{rep}", "bench-big")  # a new, empty queue and the backlog
        # adds alternate between the two queues in small chunks; beside each
        # rate, the server's time in scripts per job: what grows with the
        # backlog shows there without the machine's noise
        for kind, n, chunk in (("single", args.w5_single, 500), ("bulk", args.w5_bulk, 1000)):
            e_rate, f_rate, e_us, f_us = peer.pair_rates(kind, n, chunk, pair)
            keep(kind, e_rate, f_rate)
            keep(f"{kind}_server_us", e_us, f_us)
        drains: dict[str, dict[str, float]] = {}
        for side, queue in (("empty", pair[0]), ("full", pair[1]))[:: 1 if rep % 2 == 0 else -1]:
            peer.use_queue(queue)
            u0 = script_usec(r)
            drains[side] = drain_first(peer, args.w5_drain, args.concurrency)
            # the worker may take a few jobs past the n-th before it stops
            drains[side]["server_us"] = (script_usec(r) - u0) / args.w5_drain
        keep("drain", drains["empty"]["jobs_s"], drains["full"]["jobs_s"])
        keep("drain_cpu", drains["empty"]["cpu_s_per_1k"], drains["full"]["cpu_s_per_1k"])
        keep("drain_server_us", drains["empty"]["server_us"], drains["full"]["server_us"])
        for k in ("single", "bulk", "drain"):
            series.setdefault(f"w5_{k}_ratio", []).append(
                series[f"w5_{k}_full"][-1] / series[f"w5_{k}_empty"][-1])
    out.update(series)
    peer.use_queue("bench-big")
    out["w5_full_waiting_at_end"] = peer.pending()
    return out


WORKLOADS = {"w1": w1, "w2": w2, "rr": rr, "idle": idle, "w5": w5}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--w3-n", type=int, default=1000)
    p.add_argument("--w3-max-seconds", type=float, default=30.0)
    p.add_argument("--w4-seconds", type=float, default=10.0)
    p.add_argument("--w4-threads", type=int, default=16)
    p.add_argument("--variant", default=None)
    p.add_argument("--w5-backlog", type=int, default=1_000_000)
    p.add_argument("--w5-single", type=int, default=10_000)
    p.add_argument("--w5-bulk", type=int, default=20_000)
    p.add_argument("--w5-drain", type=int, default=10_000)
    p.add_argument("--w5-mem-n", type=int, default=100_000)
    p.add_argument("--w5-repeats", type=int, default=3)
    return p.parse_args(argv)


def emit(result: dict[str, Any]) -> None:
    sys.stdout.flush()
    print(json.dumps(result), flush=True)


def main(peer_cls: type[Peer], argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        peer = peer_cls(args.url, args.variant)
    except Exception as exc:
        emit({"error": f"setup failed: {type(exc).__name__}: {exc}"})
        return 1
    try:
        result = WORKLOADS[args.workload](peer, args)
        rc = 0
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        result, rc = {"error": f"{type(exc).__name__}: {exc}"}, 1
    emit(result)  # before closing: a peer whose close() hangs must not lose the figures

    def _close() -> None:
        try:
            peer.close()
        except Exception:
            traceback.print_exc(file=sys.stderr)

    closer = threading.Thread(target=_close, daemon=True)
    closer.start()
    closer.join(15)
    if closer.is_alive():
        print(f"[{peer.name}] close() still blocked after 15 s; exiting anyway",
              file=sys.stderr, flush=True)
        os._exit(rc)
    return rc
