"""Before/after benchmark of jobq itself: two git revisions, one run, one server.

    .venv/bin/python bench/ab.py --base cc5c0c5 --head HEAD
    .venv/bin/python bench/ab.py --base cc5c0c5 --head main --repeats 5 --jobs 10000 \\
        --server /usr/bin/redis-server

Each revision's ``jobq`` package is exported with ``git archive <rev> jobq``
into a temporary directory and measured in a subprocess of this Python with
``PYTHONPATH=<that directory>`` (the subprocess checks where ``jobq`` came
from). Only the ``jobq`` package differs between the two sides: the
measuring code is the head revision's ``bench/adapters`` (``_common.py``,
``peer_jobq.py``), exported once and used for both.

Workloads (as in bench/README.md): W1 single and bulk add (jobs/s); W2 drain
of --jobs pre-loaded jobs at concurrency 1 and 8 (jobs/s, worker CPU s per
1,000 jobs); W3 add + wait_until_finished round trips of one caller against
a worker of concurrency 8 (p50/p99 ms); W4 the same with 16 callers for 5 s
(round trips/s, p50 ms). ``--workloads w3,w4`` runs a subset. Runs are interleaved (each workload
runs base and head back to back, the order alternating per repeat) against
one private loopback server that is flushed before every run. Prints a table
and writes bench/results/ab-<stamp>.json (git-ignored).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
_VENV_PY = ROOT / ".venv" / "bin" / "python"
PYTHON = str(_VENV_PY) if _VENV_PY.exists() else sys.executable

CHILD_TIMEOUT = 300.0  # one workload run of one revision
GIT_TIMEOUT = 60.0
W3_TRIPS = 1000
W3_MAX_SECONDS = 20.0
RR_CONCURRENCY = 8  # the W3 worker, as in bench/run.py

# workload -> extra child arguments
WORKLOADS: dict[str, dict[str, Any]] = {
    "w1": {},
    "w2_c1": {"concurrency": 1},
    "w2_c8": {"concurrency": 8},
    "w3": {"concurrency": RR_CONCURRENCY},
    "w4": {"concurrency": RR_CONCURRENCY},
}
# (label, workload, key, higher is better)
ROWS: list[tuple[str, str, str, bool]] = [
    ("W1 single add, jobs/s ↑", "w1", "w1_single_jobs_s", True),
    ("W1 bulk add (chunks of 1,000), jobs/s ↑", "w1", "w1_bulk_jobs_s", True),
    ("W2 drain c=1, jobs/s ↑", "w2_c1", "w2_c1_jobs_s", True),
    ("W2 drain c=1, worker CPU s / 1k jobs ↓", "w2_c1", "w2_c1_cpu_s_per_1k", False),
    ("W2 drain c=8, jobs/s ↑", "w2_c8", "w2_c8_jobs_s", True),
    ("W2 drain c=8, worker CPU s / 1k jobs ↓", "w2_c8", "w2_c8_cpu_s_per_1k", False),
    ("W3 round trip p50, ms ↓", "w3", "w3_p50_ms", False),
    ("W3 round trip p99, ms ↓", "w3", "w3_p99_ms", False),
    ("W4 16 callers, round trips/s ↑", "w4", "w4_trips_s", True),
    ("W4 16 callers, p50 ms ↓", "w4", "w4_p50_ms", False),
]
W4_SECONDS = 5.0
W4_THREADS = 16


def log(msg: str) -> None:
    print(f"[ab {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- the measuring subprocess (one revision's jobq on PYTHONPATH) ---------------


def _load(jobq_root: str, adapters: str) -> tuple[Any, Any, Any]:
    """Import jobq (checked to come from jobq_root) and the head's adapters."""
    sys.path.insert(0, adapters)
    import jobq

    where = Path(jobq.__file__).resolve()
    if Path(jobq_root).resolve() not in where.parents:
        raise RuntimeError(f"jobq was imported from {where}, not from {jobq_root}")
    import _common
    import peer_jobq

    if Path(adapters).resolve() not in Path(_common.__file__).resolve().parents:
        raise RuntimeError(f"_common was imported from {_common.__file__}, not {adapters}")
    return jobq, _common, peer_jobq


def _raise_exit(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)  # so that finally blocks stop the worker process


def child_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="ab.py child")
    p.add_argument("--jobq-root", required=True)
    p.add_argument("--adapters", required=True)
    p.add_argument("--url", required=True)
    p.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--concurrency", type=int, default=1)
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_exit)
    out: dict[str, Any] = {}
    peer = None
    try:
        jobq, common, peer_jobq = _load(args.jobq_root, args.adapters)
        out["jobq_file"] = jobq.__file__
        out["jobq_version"] = getattr(jobq, "__version__", "?")
        me = str(Path(__file__).resolve())

        class Peer(peer_jobq.JobqPeer):
            def worker_argv(self, concurrency: int) -> list[str]:
                # the worker process checks its jobq too, then runs peer_jobq's worker
                return [sys.executable, me, "worker", "--jobq-root", args.jobq_root,
                        "--adapters", args.adapters, self.url, str(concurrency)]

        peer = Peer(args.url, None)
        ns = common.parse_args(["--url", args.url, "--workload", "w1", "--n", str(args.n),
                                "--concurrency", str(args.concurrency)])
        if args.workload == "w1":
            out.update(common.w1(peer, ns))
        elif args.workload.startswith("w2"):
            out.update(common.w2(peer, ns))
            key = f"w2_c{args.concurrency}"
            if out.get(f"{key}_left") or out.get(f"{key}_sampled_missing"):
                raise RuntimeError(f"drain incomplete: {out}")
        elif args.workload == "w3":
            out.update(_w3(common, peer, args.n))
        else:
            out.update(_w4(common, peer))
        rc = 0
    except BaseException as exc:  # reported as one JSON line, never hidden
        out["error"] = f"{type(exc).__name__}: {exc}"
        rc = 1
    print(json.dumps(out), flush=True)
    if peer is not None:
        closer = threading.Thread(target=peer.close, daemon=True)
        closer.start()
        closer.join(15)
        if closer.is_alive():
            os._exit(rc)
    return rc


def _w3(common: Any, peer: Any, trips: int) -> dict[str, Any]:
    """W3 alone (bench's rr also runs W4): one caller, add + wait, sequential."""
    proc = common.start_ready_worker(peer, RR_CONCURRENCY)
    out: dict[str, Any] = {}
    try:
        samples: list[float] = []
        deadline = time.monotonic() + W3_MAX_SECONDS
        for i in range(trips):
            samples.append(common.round_trip(peer, i))
            if time.monotonic() > deadline:
                out["w3_capped"] = f"stopped after {len(samples)} trips"
                break
    finally:
        proc.stop()
    for k, v in common.latency_summary(samples).items():
        out[f"w3_{k}"] = v
    return out


def _w4(common: Any, peer: Any) -> dict[str, Any]:
    """W4 alone: W4_THREADS callers adding and waiting for W4_SECONDS, as
    bench's rr runs it after W3."""
    proc = common.start_ready_worker(peer, RR_CONCURRENCY)
    lat: list[list[float]] = [[] for _ in range(W4_THREADS)]
    errors: list[str] = []
    try:
        stop_at = time.monotonic() + W4_SECONDS

        def caller(t: int) -> None:
            j = 1_000_000 * (t + 1)
            try:
                while time.monotonic() < stop_at:
                    lat[t].append(common.round_trip(peer, j))
                    j += 1
            except Exception as exc:  # reported, not hidden
                errors.append(f"{type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=caller, args=(t,), daemon=True)
                   for t in range(W4_THREADS)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join(W4_SECONDS + common.RESULT_TIMEOUT + 5)
        elapsed = time.perf_counter() - t0
    finally:
        proc.stop()
    if errors:
        raise RuntimeError(f"{len(errors)} caller(s) failed: {errors[0]}")
    samples = [x for row in lat for x in row]
    return {"w4_trips_s": len(samples) / elapsed,
            "w4_p50_ms": common.latency_summary(samples)["p50_ms"]}


def worker_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="ab.py worker")
    p.add_argument("--jobq-root", required=True)
    p.add_argument("--adapters", required=True)
    p.add_argument("url")
    p.add_argument("concurrency", type=int)
    args = p.parse_args(argv)
    _, _, peer_jobq = _load(args.jobq_root, args.adapters)
    peer_jobq.run_worker(args.url, args.concurrency)  # Worker.run(): SIGTERM closes it
    return 0


# -- the orchestrator ------------------------------------------------------------


class Children:
    """The one measuring subprocess at a time, and cleanup of anything it left."""

    def __init__(self, token: str) -> None:
        self.token = token  # the run's temp dir: on every descendant's command line
        self.current: subprocess.Popen[str] | None = None

    def run(self, argv: list[str], env: dict[str, str], cwd: str,
            timeout: float) -> dict[str, Any]:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                start_new_session=True)
        self.current = proc
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop_current()
            return {"error": f"timed out after {timeout:.0f}s"}
        except BaseException:  # Ctrl-C, SIGTERM: the child stops its worker first
            self.stop_current()
            raise
        finally:
            self.current = None
            self.reap_strays()
        lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
        if not lines:
            tail = " | ".join(stderr.strip().splitlines()[-3:])
            return {"error": f"no result (rc {proc.returncode}): {tail}"}
        out: dict[str, Any] = json.loads(lines[-1])
        if "error" in out:
            tail = " | ".join(stderr.strip().splitlines()[-3:])
            out["error"] += f" [{tail}]" if tail else ""
        return out

    def stop_current(self) -> None:
        proc = self.current
        if proc is None or proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                proc.communicate(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def reap_strays(self) -> None:
        """Kill, by pid, any process of this run still alive (a worker whose parent died)."""
        me = os.getpid()
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == me:
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read().decode("utf-8", "replace")
            except OSError:
                continue
            if self.token in cmdline:
                try:
                    os.kill(int(entry), signal.SIGKILL)
                    log(f"killed leftover process {entry}")
                except (ProcessLookupError, PermissionError):
                    pass


def git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True,
                          check=True, timeout=GIT_TIMEOUT).stdout.strip()


def export(repo: str, sha: str, path: str, dest: Path) -> None:
    dest.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", repo, "archive", sha, path],
                               stdout=subprocess.PIPE)
    try:
        subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=True,
                       timeout=GIT_TIMEOUT)
    finally:
        assert archive.stdout is not None
        archive.stdout.close()
        if archive.wait(GIT_TIMEOUT) != 0:
            raise RuntimeError(f"git archive {sha} {path} failed")


def stats(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def cell(s: dict[str, float] | None) -> str:
    # bench/run.py's number format; imported here, in the parent only: run.py
    # puts this checkout first on sys.path, which a measuring child must not
    from run import fmt

    if s is None:
        return "failed"
    if s["n"] == 1:
        return fmt(s["median"])
    return f"{fmt(s['median'])} ({fmt(s['min'])}–{fmt(s['max'])})"


def spread(s: dict[str, float] | None) -> str:
    if s is None or s["n"] < 2 or not s["median"]:
        return "—"
    return f"{(s['max'] - s['min']) / s['median'] * 100:.0f}%"


def build_table(agg: dict[str, dict[str, Any]], labels: dict[str, str]) -> str:
    head = ["Workload", f"base {labels['base']}: median (min–max)",
            f"head {labels['head']}: median (min–max)", "head ÷ base",
            "spread base / head"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|---|---|---|"]
    for label, _, key, _higher in ROWS:
        b, h = agg["base"].get(key), agg["head"].get(key)
        if b is None and h is None:
            continue  # a workload not chosen
        ratio = f"{h['median'] / b['median']:.2f}×" if b and h and b["median"] else "—"
        lines.append(f"| {label} | {cell(b)} | {cell(h)} | {ratio} | "
                     f"{spread(b)} / {spread(h)} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="git revision measured as 'base'")
    ap.add_argument("--head", default="HEAD", help="git revision measured as 'head'; its "
                    "bench/adapters is the measuring code of both sides")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--workloads", default=",".join(WORKLOADS),
                    help=f"comma-separated subset of {','.join(WORKLOADS)} (default: all)")
    ap.add_argument("--jobs", type=int, default=10_000, help="jobs of W1 and W2")
    ap.add_argument("--server", help="server binary (default: find_server_binary())")
    ap.add_argument("--repo", default=str(ROOT), help="git repository (default: this one)")
    ap.add_argument("--python", default=PYTHON,
                    help="interpreter of the measuring runs: one where jobq is not installed "
                    "in editable mode (an editable install's finder would win over the "
                    "exported trees; the run checks where jobq came from)")
    args = ap.parse_args()
    if args.repeats < 1 or args.jobs < 1000:
        ap.error("--repeats must be >= 1 and --jobs >= 1000")
    chosen = set(args.workloads.split(","))
    if not chosen <= set(WORKLOADS):
        ap.error(f"--workloads: unknown {', '.join(sorted(chosen - set(WORKLOADS)))}")

    signal.signal(signal.SIGTERM, _raise_exit)  # `timeout` and kill clean up as Ctrl-C does
    started = time.monotonic()
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    revs: dict[str, dict[str, str]] = {}
    for side, rev in (("base", args.base), ("head", args.head)):
        sha = git(args.repo, "rev-parse", "--verify", f"{rev}^{{commit}}")
        revs[side] = {"rev": rev, "sha": sha,
                      "subject": git(args.repo, "log", "-1", "--format=%s", sha)}
    labels = {side: r["sha"][:7] for side, r in revs.items()}

    tmp = Path(tempfile.mkdtemp(prefix="jobq-ab-"))
    children = Children(str(tmp))
    server = None
    admin = None
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        "base": {w: [] for w in WORKLOADS}, "head": {w: [] for w in WORKLOADS}}
    loads: list[float] = []
    try:
        roots = {}
        for side in ("base", "head"):
            roots[side] = tmp / side
            export(args.repo, revs[side]["sha"], "jobq", roots[side])
        export(args.repo, revs["head"]["sha"], "bench/adapters", tmp / "measure")
        adapters = tmp / "measure" / "bench" / "adapters"
        for f in ("_common.py", "peer_jobq.py"):
            if not (adapters / f).is_file():
                raise SystemExit(f"{args.head} has no bench/adapters/{f}")

        sys.path.insert(0, str(ROOT))
        import redis

        from jobq.testing import RedisServer, find_server_binary

        server = RedisServer(args.server or find_server_binary())
        server.start()
        admin = redis.Redis.from_url(server.url, socket_timeout=30)
        info = admin.info("server")
        server_desc = (f"{server.server_name} {server.version} ({server.binary}), "
                       f"{server.url}")
        log(f"server: {server_desc}")
        log(f"base {labels['base']} ({revs['base']['rev']}): {revs['base']['subject'][:70]}")
        log(f"head {labels['head']} ({revs['head']['rev']}): {revs['head']['subject'][:70]}")

        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        for r in range(args.repeats):
            order = ("base", "head") if r % 2 == 0 else ("head", "base")
            for workload, params in WORKLOADS.items():
                if workload not in chosen:
                    continue
                for side in order:
                    admin.flushall()
                    admin.script_flush()
                    admin.function_flush()
                    argv = [args.python, str(Path(__file__).resolve()), "child",
                            "--jobq-root", str(roots[side]), "--adapters", str(adapters),
                            "--url", server.url, "--workload", workload,
                            "--n", str(args.jobs if workload != "w3" else W3_TRIPS)]
                    for k, v in params.items():
                        argv += [f"--{k}", str(v)]
                    t0 = time.monotonic()
                    out = children.run(argv, {**env, "PYTHONPATH": str(roots[side])},
                                       str(tmp), CHILD_TIMEOUT)
                    out["load1"] = os.getloadavg()[0]
                    loads.append(out["load1"])
                    runs[side][workload].append(out)
                    log(f"{r + 1}/{args.repeats} {workload:5} {side}: "
                        f"{time.monotonic() - t0:5.1f}s load {out['load1']:.2f} "
                        + (f"ERROR {out['error'][:300]}" if "error" in out else
                           " ".join(f"{k}={v:.4g}" for k, v in out.items()
                                    if k.endswith(("_jobs_s", "_per_1k", "p50_ms",
                                                   "p99_ms")))))
        admin.flushall()
    finally:
        children.stop_current()
        children.reap_strays()
        if admin is not None:
            admin.close()
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    agg: dict[str, dict[str, Any]] = {"base": {}, "head": {}}
    errors: list[str] = []
    for side in ("base", "head"):
        for _, workload, key, _ in ROWS:
            vals = [o[key] for o in runs[side][workload] if key in o and "error" not in o]
            agg[side][key] = stats(vals)
        for workload, outs in runs[side].items():
            errors += [f"{side} {workload}: {o['error']}" for o in outs if "error" in o]
            errors += [f"{side} {workload}: {o['w3_capped']}" for o in outs if "w3_capped" in o]
    table = build_table(agg, labels)
    elapsed = round(time.monotonic() - started)
    header = [
        f"jobq A/B, {dt.datetime.now().astimezone().isoformat(timespec='seconds')}: "
        f"{args.repeats} repeat(s) per figure, interleaved; {elapsed} s in all.",
        f"base {labels['base']} ({revs['base']['rev']}): {revs['base']['subject']}",
        f"head {labels['head']} ({revs['head']['rev']}): {revs['head']['subject']}",
        f"Server: {server_desc}. W1/W2 {args.jobs:,} jobs; W3 {W3_TRIPS:,} trips, one "
        f"caller; W4 {W4_THREADS} callers for {W4_SECONDS:g} s; worker concurrency "
        f"{RR_CONCURRENCY}. Machine: {os.cpu_count()} cores, "
        f"{platform.platform()}, load average during the run "
        f"{min(loads):.2f}–{max(loads):.2f}." if loads else "",
        "Spread: (max − min) ÷ median over the repeats.",
    ]
    text = "\n".join(header) + "\n\n" + table + "\n"
    if errors:
        text += "\nErrors and notes:\n" + "\n".join(f"- {e}" for e in errors) + "\n"
    print(text)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"ab-{stamp}.json"
    path.write_text(json.dumps({
        "info": {"revisions": revs, "repeats": args.repeats, "jobs": args.jobs,
                 "w3_trips": W3_TRIPS, "server": server_desc,
                 "server_info": {k: info.get(k) for k in ("redis_version", "os")},
                 "python": platform.python_version(), "cores": os.cpu_count(),
                 "elapsed_s": elapsed},
        "aggregate": agg, "runs": runs, "table": table}, indent=1, default=str))
    log(f"wrote {path}")
    failed = any("error" in o for per in runs.values() for outs in per.values() for o in outs)
    return 1 if failed else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        sys.exit(child_main(sys.argv[2:]))
    if sys.argv[1:2] == ["worker"]:
        sys.exit(worker_main(sys.argv[2:]))
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        log("interrupted; server and subprocesses stopped")
        sys.exit(130)
