"""How long one jobq script call blocks the server, with a million jobs.

Redis runs one script at a time: while a script runs, every other client
waits. This fills a private server (started here, loopback only) with
1,000,000 jobs across states (waiting, prioritized, delayed, completed,
failed), then runs each script of jobq's hot and admin paths and reads the
server's own timing of the calls from SLOWLOG (execution time in
microseconds, without network or client time; every call of 50 us or more is
logged). It prints, per script, the number of calls made and the longest
single call.

    .venv/bin/python bench/server_block.py [--jobs 1000000] [--server PATH]

Heavy: about 0.5 GB of server memory and a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobq import Queue, serializer  # noqa: E402
from jobq.scripts import _SCRIPT_NAMES, _library, function_name  # noqa: E402
from jobq.testing import RedisServer, find_server_binary  # noqa: E402

CHUNK = 1000  # jobs per add_bulk chunk and per pipeline of takes / finishes
LOCK_MS = 3_600_000  # long locks: nothing stalls while the script runs


class Timings:
    """Script calls per label: how many, and the longest, read from SLOWLOG.

    SLOWLOG logs the commands a script runs as well as the script call, and
    building an entry costs the server time: it logs only what takes at
    least THRESHOLD_US, so the longest calls are exact and the log stays
    short. A label with no call that slow shows "< 0.05".
    """

    THRESHOLD_US = 50

    def __init__(self, client: redis.Redis, q: Queue) -> None:
        self.client = client
        self.names = {function_name(name): name for name in _SCRIPT_NAMES}
        self.longest: dict[str, int] = defaultdict(int)
        self.calls: dict[str, int] = defaultdict(int)
        self.pending: dict[str, int] = defaultdict(int)
        scripts = q._context.scripts
        run = scripts.run

        def counted(name: str, *args: Any, **kwargs: Any) -> Any:
            self.pending[name] += 1
            return run(name, *args, **kwargs)

        scripts.run = counted  # type: ignore[method-assign]
        client.config_set("slowlog-log-slower-than", self.THRESHOLD_US)
        client.config_set("slowlog-max-len", 100_000)
        client.slowlog_reset()

    def collect(self, label: Callable[[str], str] | str | None = None) -> None:
        """Fold the script calls made since the last collect into ``label``
        (a name, a function of the script name, or the script name itself)."""

        def key(script: str) -> str:
            return label if isinstance(label, str) else (label or (lambda s: s))(script)

        entries = self.client.execute_command("SLOWLOG", "GET", -1)
        self.client.slowlog_reset()
        for entry in entries:
            duration, args = int(entry[2]), entry[3]
            if args and args[0].upper() == b"FCALL":
                k = key(self.names.get(args[1].decode(), "?"))
                self.longest[k] = max(self.longest[k], duration)
        for script, n in self.pending.items():
            self.calls[key(script)] += n
        self.pending.clear()


def fill(q: Queue, jobs: int, t: Timings, say: Callable[[str], None]) -> dict[str, int]:
    """Add ``jobs`` jobs: 40% waiting, 10% prioritized, 10% delayed, 20%
    completed, 20% failed. Returns the count per state."""
    ctx = q._context
    plan = {"completed": jobs // 5, "failed": jobs // 5, "prioritized": jobs // 10,
            "delayed": jobs // 10}
    plan["waiting"] = jobs - sum(plan.values())
    plain = plan["waiting"] + plan["completed"] + plan["failed"]
    payload = {"user": 12345, "action": "send-mail", "to": "someone@example.com"}

    def add(count: int, **options: Any) -> None:
        for start in range(0, count, CHUNK):
            q.add_bulk([{"name": "job", "data": payload, **options}
                        for _ in range(min(CHUNK, count - start))])
            t.collect(lambda s: "add_bulk chunk (1,000 jobs)" if s == "add" else s)

    started = time.monotonic()
    add(plain)
    say(f"  {plain:,} added in {time.monotonic() - started:.0f} s")
    # take and finish the oldest, 1,000 per pipeline: moveToActive, then complete / fail
    result = serializer.encode("done", "result")
    traces = serializer.encode([], "traces")
    for state, count in (("completed", plan["completed"]), ("failed", plan["failed"])):
        for start in range(0, count, CHUNK):
            n = min(CHUNK, count - start)
            token = uuid.uuid4().hex
            pipe = q.client.pipeline(transaction=False)
            for _ in range(n):
                ctx.scripts.run("moveToActive", ctx.keys.base, token, LOCK_MS, "bench", 0, 0,
                                client=pipe)
            taken = [reply[1].decode() for reply in pipe.execute()]
            pipe = q.client.pipeline(transaction=False)
            for job_id in taken:
                if state == "completed":
                    ctx.scripts.run("complete", ctx.keys.base, job_id, token, result, client=pipe)
                else:
                    ctx.scripts.run("fail", ctx.keys.base, job_id, token, "boom", traces, -1,
                                    client=pipe)
            pipe.execute()
            t.collect()
        say(f"  {count:,} {state} after {time.monotonic() - started:.0f} s")
    add(plan["prioritized"], priority=5)
    add(plan["delayed"], delay=86_400)
    say(f"  filled in {time.monotonic() - started:.0f} s")
    return plan


def measure(q: Queue, t: Timings, say: Callable[[str], None]) -> None:
    ctx = q._context
    client = q.client
    keys = ctx.keys

    def once(label: str, action: Callable[[], Any], repeat: int = 1) -> None:
        for _ in range(repeat):
            action()
        t.collect(label)

    once("add (one job)", lambda: q.add("job", {"n": 1}), repeat=100)
    once("getCounts", q.get_job_counts, repeat=20)
    # lock renewal of 1,000 held jobs, and the stalled check over 10,000 active jobs
    token = uuid.uuid4().hex
    pipe = client.pipeline(transaction=False)
    for _ in range(10 * CHUNK):
        ctx.scripts.run("moveToActive", keys.base, token, LOCK_MS, "bench", 0, 0, client=pipe)
    active = [reply[1].decode() for reply in pipe.execute()]
    t.collect()
    pairs: list[Any] = []
    for job_id in active[:CHUNK]:
        pairs += [job_id, token]
    once("extendLocks (1,000 locks)", lambda: ctx.run("extendLocks", LOCK_MS, *pairs), repeat=10)
    once("stalledCheck (10,000 active, none stalled)",
         lambda: ctx.run("stalledCheck", 1, 0, CHUNK), repeat=5)
    pipe = client.pipeline(transaction=False)
    result = serializer.encode("done", "result")
    for job_id in active:
        ctx.scripts.run("complete", keys.base, job_id, token, result, client=pipe)
    pipe.execute()
    t.collect(lambda s: "complete" if s == "complete" else s)
    delayed = [i.decode() for i in client.zrange(keys.delayed, 0, 99)]
    once("promote", lambda: [ctx.run("promote", i) for i in delayed])
    once("retry (retry_jobs, one call of 1,000 failed)", lambda: ctx.run("retry", "failed", CHUNK))
    # remove: the next waiting job to run, at the far end of the wait list from
    # where LREM starts (the worst case), then a prioritized and a completed one
    def remove_worst() -> None:
        for _ in range(10):
            q.remove(client.lindex(keys.wait, -1).decode())
    once("remove (waiting, worst case)", remove_worst)
    once("remove (prioritized, completed)", lambda: [
        q.remove(client.zrange(keys.prioritized, 0, 0)[0].decode()),
        q.remove(client.zrange(keys.completed, 0, 0)[0].decode())])

    counts = q.get_job_counts()
    say(f"  before the admin calls: {counts}")
    # clean: the wait list with every 10th job old (removals in the middle of
    # the list: LSET + one LREM per call), half the delayed jobs, and
    # 100,000 each of completed and failed
    waiting = client.lrange(keys.wait, 0, -1)
    pipe = client.pipeline(transaction=False)
    for job_id in waiting[::10]:
        pipe.hset(keys.job(job_id.decode()), "ts", 1000)
    for job_id in client.zrange(keys.delayed, 0, -1)[::2]:
        pipe.hset(keys.job(job_id.decode()), "ts", 1000)
    pipe.execute()
    t.collect()
    started = time.monotonic()
    n = len(q.clean(3600, state="waiting"))
    t.collect(f"clean waiting ({len(waiting):,} looked at, {n:,} removed)")
    say(f"  clean waiting: {n:,} removed in {time.monotonic() - started:.1f} s")
    n = len(q.clean(3600, state="delayed"))
    t.collect(f"clean delayed ({n:,} of {counts['delayed']:,} removed)")
    for state in ("completed", "failed"):
        n = len(q.clean(0, limit=counts[state] // 2, state=state))
        t.collect(f"clean {state} ({n:,} removed)")
    counts = q.get_job_counts()
    say(f"  after clean: {counts}")
    started = time.monotonic()
    n = q.drain()
    t.collect(f"drain ({n:,} waiting)")
    say(f"  drain: {n:,} in {time.monotonic() - started:.1f} s")
    left = sum(q.get_job_counts().values())
    q.obliterate()
    t.collect(f"obliterate ({left:,} jobs)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--server", default=os.environ.get("JOBQ_TEST_REDIS_SERVER"),
                        help="server binary (default: as the tests pick one)")
    args = parser.parse_args()

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    binary = args.server or find_server_binary()
    with RedisServer(binary) as server, server.client() as client:
        say(f"{server.server_name} {server.version} ({binary}), {args.jobs:,} jobs")
        client.function_load(_library()[0])  # pipelines below call FCALL only
        with Queue("bench", connection=server.url) as q:
            t = Timings(client, q)
            plan = fill(q, args.jobs, t, say)
            memory = client.info("memory")["used_memory_human"]
            measure(q, t, say)
        print(f"\n{server.server_name} {server.version}; {args.jobs:,} jobs "
              f"({', '.join(f'{v:,} {k}' for k, v in plan.items())}); used_memory {memory}\n")
        print("| script call | calls | longest (ms) |")
        print("|---|---:|---:|")
        for label, calls in t.calls.items():
            longest = t.longest.get(label, 0)
            shown = f"{longest / 1000:.2f}" if longest else "< 0.05"
            print(f"| {label} | {calls:,} | {shown} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
