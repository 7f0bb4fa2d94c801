"""A fan-out of N children under one parent (FlowProducer): the time to add
the tree (one script call) and the fan-in rate (children finished per second
by one worker at concurrency 8, until the parent has run).

    .venv/bin/python bench/flow_fanout.py [N]     # default 10,000

Uses $JOBQ_REDIS_URL when set, else a private server.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jobq import FlowProducer, Worker  # noqa: E402
from jobq.testing import embedded_url  # noqa: E402


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    with embedded_url() as url, FlowProducer(connection=url, prefix="{bench}") as flow:
        name = f"fan-{os.getpid()}"
        tree = {"name": "parent", "queue": name,
                "children": [{"name": "child", "queue": name, "data": i} for i in range(n)]}
        start = time.perf_counter()
        node = flow.add(tree)
        added = time.perf_counter() - start
        start = time.perf_counter()
        with Worker(name, lambda job: len(job.get_children_values()) if job.name == "parent"
                    else job.data, connection=url, prefix="{bench}", concurrency=8):
            assert node.job.wait_until_finished(timeout=600) == n
        ran = time.perf_counter() - start
    print(f"add a tree of {n:,} children: {added:.2f} s ({n / added:,.0f} jobs/s)")
    print(f"fan-in: {n:,} children and the parent in {ran:.2f} s ({n / ran:,.0f} children/s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
