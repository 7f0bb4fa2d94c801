"""System calls per add-and-wait in the waiting process, by thread: a count
that does not move with the machine's speed, where timings here do
(bench/README.md, "Spreads without steal").

    .venv/bin/python bench/wait_syscalls.py                  # 1 and 16 callers
    .venv/bin/python bench/wait_syscalls.py --callers 16 --jobq /tmp/old   # another revision

Callers in this process add a job and wait for it (``wait_until_finished``)
in a loop against a worker process of concurrency 8 (the harness's jobq
worker), on a private server, while ``strace -f`` counts this process's
``futex``, ``poll``, ``sendto``, ``recvfrom`` and ``getpid`` calls (strace
slows the process several times over: the counts per trip are the figure,
not the rate). ``--jobq DIR`` measures the ``jobq`` package found in DIR
(``git archive REV jobq | tar -x -C DIR``) in this process and the worker.
Needs strace; not part of ``make bench``.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "bench" / "adapters" / "peer_jobq.py"
CALLS = "futex,poll,sendto,recvfrom,getpid"


def measure(callers: int, seconds: float, jobq_dir: Path) -> None:
    from jobq import Queue
    from jobq.testing import RedisServer, find_server_binary

    with RedisServer(find_server_binary()) as server, tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PYTHONPATH=str(jobq_dir))
        worker = subprocess.Popen([sys.executable, str(WORKER), "worker", server.url, "8", "bench"],
                                  env=env)
        queue = Queue("bench", connection=server.url)
        try:
            queue.add("noop", 0).wait_until_finished(timeout=30)
            out = Path(tmp) / "strace.out"
            tracer = subprocess.Popen(["strace", "-f", "-e", f"trace={CALLS}", "-o", str(out),
                                       "-p", str(os.getpid())], stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 10
            while not out.exists() or out.stat().st_size == 0:  # attached once it writes
                if time.monotonic() > deadline:
                    sys.exit("strace did not attach")
                queue.get_job_counts()  # a few calls for it to see
            stop = time.monotonic() + seconds
            trips: list[int] = []

            def caller() -> None:
                n = 0
                while time.monotonic() < stop:
                    queue.add("noop", n).wait_until_finished(timeout=30)
                    n += 1
                trips.append(n)

            threads = [threading.Thread(target=caller, name=f"caller-{i}") for i in range(callers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(seconds + 60)
            names = {t.native_id: t.name for t in threading.enumerate()}
            tracer.terminate()
            tracer.wait(10)
            counts: collections.Counter[tuple[str, str]] = collections.Counter()
            for line in out.read_text().splitlines():
                m = re.match(r"(\d+)\s+(\w+)\(", line)
                if m:
                    name = names.get(int(m.group(1)), "caller")
                    if name.startswith("caller") or name == "MainThread":
                        name = "callers"
                    counts[(re.sub(r"-bench$", "", name), m.group(2))] += 1
        finally:
            queue.close()
            worker.terminate()
            worker.wait(30)
    n = sum(trips)
    total = sum(counts.values())
    print(f"{jobq_dir}: {callers} caller(s), {n} trips under strace: "
          f"{total / n:.1f} system calls per trip")
    for (thread, call), v in sorted(counts.items(), key=lambda x: -x[1]):
        if v / n >= 0.05:
            print(f"  {thread:16} {call:9} {v / n:6.2f}")


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--callers", type=int, action="append",
                   help="threads adding and waiting (repeatable; default 1 and 16)")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--jobq", type=Path, default=ROOT, help="directory holding the jobq package")
    args = p.parse_args()
    if shutil.which("strace") is None:
        sys.exit("needs strace")
    sys.path.insert(0, str(args.jobq.resolve()))
    for callers in args.callers or [1, 16]:
        measure(callers, args.seconds, args.jobq.resolve())


if __name__ == "__main__":
    main()
