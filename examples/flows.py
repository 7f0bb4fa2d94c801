"""Flows: jobs that wait for other jobs.

- a tree: render pages (in their own queue), then merge them into a report;
- depends_on: a job added later that waits for jobs that exist already;
- a chain (a -> b -> c, each step reading the one before's result) and a
  chord (a fan-out, then one job with every result).

Run it with ``python examples/flows.py``; it uses ``$JOBQ_REDIS_URL`` when
set, else starts a private server. The prefix carries a hash tag, so the
same code runs on a Redis Cluster (the queues of a flow share one slot).
"""

# ci: run

from __future__ import annotations

import os

from jobq import FlowProducer, Job, Worker
from jobq.testing import embedded_url

PREFIX = "{flows-example}"


def render(job: Job) -> str:
    """A child: render one page."""
    return f"<page {job.data}>"


def merge(job: Job) -> str:
    """A parent: runs once every page is rendered, with their results."""
    pages = job.get_children_values()  # {"<queue>:<id>": result}
    return " ".join(pages[key] for key in sorted(pages))


def step(job: Job) -> str:
    """A chain's step: the previous step's result, then this one's letter."""
    return job.get_child_value(default="") + job.data


def total(job: Job) -> int:
    """A chord's callback: the sum of every result of the fan-out."""
    return sum(job.get_children_values().values())


def main() -> int:
    """Run each shape and return the exit code."""
    with embedded_url() as url, FlowProducer(connection=url, prefix=PREFIX) as flow:
        pages, reports = f"render-{os.getpid()}", f"reports-{os.getpid()}"
        node = flow.add({
            "name": "report", "queue": reports, "data": "q3",
            "children": [{"name": "page", "queue": pages, "data": n} for n in (1, 2, 3)],
        })
        print("report is", node.job.get_state(), "until its", len(node.children), "pages are done")

        workers = [
            Worker(pages, {"page": render, "double": lambda job: job.data * 2},
                   connection=url, prefix=PREFIX).start(),
            Worker(reports, {"report": merge, "step": step, "sum": total, "notify": merge},
                   connection=url, prefix=PREFIX).start(),
        ]
        try:
            print("report:", node.job.wait_until_finished(timeout=30))

            # depends_on: wait for jobs that exist already (of any queue of the prefix)
            extra = flow.queue(pages).add("page", 4)
            notify = flow.queue(reports).add("notify", depends_on=[(pages, extra.id)])
            print("notify:", notify.wait_until_finished(timeout=30))

            chain = flow.chain([{"name": "step", "queue": reports, "data": c} for c in "abc"])
            print("chain:", chain.job.wait_until_finished(timeout=30))

            chord = flow.chord([{"name": "double", "queue": pages, "data": i} for i in range(10)],
                               {"name": "sum", "queue": reports})
            print("chord:", chord.job.wait_until_finished(timeout=30))
        finally:
            for worker in workers:
                worker.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
