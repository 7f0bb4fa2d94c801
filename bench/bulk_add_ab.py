"""Before/after benchmark of ``Queue.add_bulk`` alone: two git revisions,
interleaved, one private server, wall rate and client CPU per job.

    .venv/bin/python bench/bulk_add_ab.py --base main --head perf-bulk
    .venv/bin/python bench/bulk_add_ab.py --base main --head perf-bulk --repeats 15 \\
        --jobs 20000 --data int --server /usr/bin/redis-server

As bench/ab.py (whose helpers it uses): each revision's ``jobq`` package is
exported with ``git archive`` into a temporary directory and measured in a
subprocess with ``PYTHONPATH=<that directory>`` (the subprocess checks where
``jobq`` came from). Only ``jobq`` differs between the sides.

One run: a new Queue on a flushed server, one chunk of 1,000 untimed (the
library loaded, the connection made), then ``--jobs`` jobs in chunks of
``--chunk`` (W1 bulk of bench/README.md: ``{"name": "noop", "data": i}``;
``--data dict`` adds a small dict instead of an int; ``--data options``
gives each job a ``job_id`` and ``attempts``, so that every job's options
are parsed). Reported per run: jobs/s (wall), client CPU µs per job (the
subprocess's user + system time over the timed part: it excludes the
server), server CPU µs per job (INFO cpu). Runs alternate base/head, the
order swapped every repeat; the table gives median (min–max) and the spread.
Writes bench/results/bulk-ab-<stamp>.json (git-ignored).
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
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
CHILD_TIMEOUT = 300.0
DATA_KINDS = ("int", "dict", "options")

# (label, key, higher is better)
ROWS: list[tuple[str, str, bool]] = [
    ("bulk add, jobs/s ↑", "jobs_s", True),
    ("client CPU µs / job ↓", "client_us", False),
    ("server CPU µs / job ↓", "server_us", False),
]


def log(msg: str) -> None:
    print(f"[bulk-ab {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _spec(kind: str, i: int) -> dict[str, Any]:
    if kind == "int":
        return {"name": "noop", "data": i}
    if kind == "dict":
        return {"name": "mail", "data": {"to": f"user{i}@example.com", "n": i,
                                         "tags": ["a", "b"], "urgent": False}}
    return {"name": "noop", "data": i, "job_id": f"j{i}", "attempts": 3}


def child_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="bulk_add_ab.py child")
    p.add_argument("--jobq-root", required=True)
    p.add_argument("--url", required=True)
    p.add_argument("--jobs", type=int, required=True)
    p.add_argument("--chunk", type=int, required=True)
    p.add_argument("--data", choices=DATA_KINDS, required=True)
    args = p.parse_args(argv)
    out: dict[str, Any] = {}
    try:
        import redis

        import jobq

        where = Path(jobq.__file__).resolve()
        if Path(args.jobq_root).resolve() not in where.parents:
            raise RuntimeError(f"jobq was imported from {where}, not from {args.jobq_root}")
        admin = redis.Redis.from_url(args.url)
        with jobq.Queue("bulkab", connection=args.url) as queue:
            warm = queue.add_bulk(_spec(args.data, -i - 1) for i in range(1000))
            assert len(warm) == 1000
            n, chunk = args.jobs, args.chunk
            info0 = admin.info("cpu")
            cpu0 = time.process_time()
            t0 = time.perf_counter()
            for start in range(0, n, chunk):
                jobs = queue.add_bulk(_spec(args.data, i)
                                      for i in range(start, min(n, start + chunk)))
                assert len(jobs) == min(chunk, n - start)
            wall = time.perf_counter() - t0
            cpu = time.process_time() - cpu0
            info1 = admin.info("cpu")
            waiting = int(admin.llen(queue._context.keys.wait))
            server = sum(float(info1[k]) - float(info0[k])
                         for k in ("used_cpu_user", "used_cpu_sys"))
        admin.close()
        out.update(jobs_s=n / wall, client_us=cpu / n * 1e6, server_us=server / n * 1e6,
                   waiting=waiting, jobq_file=str(where))
        if waiting != n + 1000:
            raise RuntimeError(f"{waiting} jobs waiting, not {n + 1000}")
        rc = 0
    except BaseException as exc:  # reported as one JSON line, never hidden
        out["error"] = f"{type(exc).__name__}: {exc}"
        rc = 1
    print(json.dumps(out), flush=True)
    return rc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="git revision measured as 'base'")
    ap.add_argument("--head", default="HEAD", help="git revision measured as 'head'")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--jobs", type=int, default=20_000, help="timed jobs per run")
    ap.add_argument("--chunk", type=int, default=1000, help="jobs per add_bulk call")
    ap.add_argument("--data", choices=DATA_KINDS, default="int")
    ap.add_argument("--server", help="server binary (default: find_server_binary())")
    ap.add_argument("--repo", default=str(ROOT), help="git repository (default: this one)")
    ap.add_argument("--python", default=sys.executable,
                    help="interpreter of the measuring runs (jobq must not be installed "
                    "in it in editable mode over the exported trees: the run checks)")
    args = ap.parse_args()
    if args.repeats < 1 or args.jobs < 1 or args.chunk < 1:
        ap.error("--repeats, --jobs and --chunk must be >= 1")

    sys.path.insert(0, str(BENCH))
    from ab import Children, cell, export, git, spread, stats

    signal.signal(signal.SIGTERM, lambda signum, _f: sys.exit(128 + signum))
    started = time.monotonic()
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    revs: dict[str, dict[str, str]] = {}
    for side, rev in (("base", args.base), ("head", args.head)):
        sha = git(args.repo, "rev-parse", "--verify", f"{rev}^{{commit}}")
        revs[side] = {"rev": rev, "sha": sha,
                      "subject": git(args.repo, "log", "-1", "--format=%s", sha)}
    labels = {side: r["sha"][:7] for side, r in revs.items()}

    tmp = Path(tempfile.mkdtemp(prefix="jobq-bulk-ab-"))
    children = Children(str(tmp))
    server = admin = None
    runs: dict[str, list[dict[str, Any]]] = {"base": [], "head": []}
    loads: list[float] = []
    try:
        roots = {}
        for side in ("base", "head"):
            roots[side] = tmp / side
            export(args.repo, revs[side]["sha"], "jobq", roots[side])
        sys.path.insert(0, str(ROOT))
        import redis

        from jobq.testing import RedisServer, find_server_binary

        server = RedisServer(args.server or find_server_binary())
        server.start()
        admin = redis.Redis.from_url(server.url, socket_timeout=30)
        server_desc = f"{server.server_name} {server.version} ({server.binary})"
        log(f"server: {server_desc}, {server.url}")
        for side in ("base", "head"):
            log(f"{side} {labels[side]} ({revs[side]['rev']}): {revs[side]['subject'][:70]}")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        for r in range(args.repeats):
            for side in (("base", "head") if r % 2 == 0 else ("head", "base")):
                admin.flushall()
                admin.function_flush()
                argv = [args.python, str(Path(__file__).resolve()), "child",
                        "--jobq-root", str(roots[side]), "--url", server.url,
                        "--jobs", str(args.jobs), "--chunk", str(args.chunk),
                        "--data", args.data]
                out = children.run(argv, {**env, "PYTHONPATH": str(roots[side])}, str(tmp),
                                   CHILD_TIMEOUT)
                out["load1"] = os.getloadavg()[0]
                loads.append(out["load1"])
                runs[side].append(out)
                log(f"{r + 1}/{args.repeats} {side}: load {out['load1']:.2f} " + (
                    f"ERROR {out['error'][:300]}" if "error" in out else
                    " ".join(f"{k}={out[k]:.4g}" for _, k, _ in ROWS)))
        admin.flushall()
    finally:
        children.stop_current()
        children.reap_strays()
        if admin is not None:
            admin.close()
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    agg = {side: {key: stats([o[key] for o in outs if "error" not in o])
                  for _, key, _ in ROWS} for side, outs in runs.items()}
    lines = [f"| Figure | base {labels['base']}: median (min–max) | head {labels['head']}: "
             "median (min–max) | head ÷ base | spread base / head |", "|---|---|---|---|---|"]
    for label, key, _ in ROWS:
        b, h = agg["base"][key], agg["head"][key]
        ratio = f"{h['median'] / b['median']:.2f}×" if b and h and b["median"] else "—"
        lines.append(f"| {label} | {cell(b)} | {cell(h)} | {ratio} | "
                     f"{spread(b)} / {spread(h)} |")
    # the per-repeat ratio: each pair ran back to back, so it shares its noise
    pairs = [h["jobs_s"] / b["jobs_s"] for b, h in zip(runs["base"], runs["head"], strict=True)
             if "error" not in b and "error" not in h]
    table = "\n".join(lines)
    elapsed = round(time.monotonic() - started)
    text = "\n".join([
        f"jobq add_bulk A/B, {dt.datetime.now().astimezone().isoformat(timespec='seconds')}: "
        f"{args.repeats} repeat(s), interleaved; {elapsed} s in all.",
        f"base {labels['base']} ({revs['base']['rev']}): {revs['base']['subject']}",
        f"head {labels['head']} ({revs['head']['rev']}): {revs['head']['subject']}",
        f"Server: {server_desc}. {args.jobs:,} jobs per run in chunks of {args.chunk:,}, "
        f"data {args.data!r}. Machine: {os.cpu_count()} cores, {platform.platform()}, "
        + (f"load average {min(loads):.2f}–{max(loads):.2f}." if loads else ""),
        "Spread: (max − min) ÷ median over the repeats.",
        "", table, "",
        (f"head ÷ base jobs/s per repeat (back-to-back pairs): median "
         f"{statistics.median(pairs):.2f}× ({min(pairs):.2f}–{max(pairs):.2f}×), head faster "
         f"in {sum(p > 1 for p in pairs)} of {len(pairs)}") if pairs else "no complete pair",
    ])
    errors = [f"{side}: {o['error']}" for side, outs in runs.items() for o in outs if "error" in o]
    if errors:
        text += "\n\nErrors:\n" + "\n".join(f"- {e}" for e in errors)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"bulk-ab-{stamp}.json"
    path.write_text(json.dumps({"revisions": revs, "args": vars(args), "server": server_desc,
                                "aggregate": agg, "runs": runs, "table": text},
                               indent=1, default=str))
    log(f"wrote {path}")
    return 1 if errors else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        sys.exit(child_main(sys.argv[2:]))
    sys.exit(main())
