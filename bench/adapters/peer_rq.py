"""RQ adapter. ``--variant simple`` runs rq.worker.SimpleWorker (no fork per job),
otherwise the regular rq.worker.Worker (forks a work horse per job). Started with
RQ's documented CLI: ``rq worker -u URL -w CLASS --quiet bench``."""

from __future__ import annotations

import math
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402


def noop(i: Any) -> dict[str, Any]:
    return _common.noop_result(i)


class RQPeer(_common.Peer):
    name = "rq"
    max_concurrency = 1
    concurrency_reason = "an RQ worker runs one job at a time (rq worker-pool is many processes)"

    def __init__(self, url: str, variant: str | None) -> None:
        super().__init__(url, variant)
        from redis import Redis
        from rq import Queue

        self.conn = Redis.from_url(url)
        self.queue = Queue(_common.QUEUE, connection=self.conn)

    def add(self, i: int) -> Any:
        return self.queue.enqueue("peer_rq.noop", i)

    def add_bulk(self, start: int, count: int) -> list[Any]:
        from rq import Queue

        return self.queue.enqueue_many(
            [Queue.prepare_data("peer_rq.noop", args=(i,)) for i in range(start, start + count)]
        )

    def wait(self, handle: Any, timeout: float) -> Any:
        from rq.results import Result

        res = handle.latest_result(timeout=max(1, math.ceil(timeout)))
        if res is None:
            raise TimeoutError(f"no result for {handle.id}")
        if res.type != Result.Type.SUCCESSFUL:
            raise RuntimeError(f"job {handle.id} failed: {res.exc_string}")
        return res.return_value

    def is_done(self, handle: Any) -> bool:
        return handle.get_status(refresh=True) == "finished"

    def pending(self) -> int:
        return int(self.conn.llen(f"rq:queue:{_common.QUEUE}"))

    def worker_argv(self, concurrency: int) -> list[str]:
        cls = "rq.worker.SimpleWorker" if self.variant == "simple" else "rq.worker.Worker"
        rq_bin = os.path.join(os.path.dirname(sys.executable), "rq")
        return [rq_bin, "worker", "-u", self.url, "-w", cls, "--quiet", _common.QUEUE]

    def close(self) -> None:
        self.conn.close()


if __name__ == "__main__":
    import peer_rq

    sys.exit(_common.main(peer_rq.RQPeer))
