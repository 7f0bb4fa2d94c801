"""Celery adapter: Redis broker and Redis result backend, threads pool. Worker
started with Celery's documented CLI:
``celery -A peer_celery worker -P threads -c C -l warning``."""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from celery import Celery  # noqa: E402

URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
app = Celery("peer_celery", broker=URL, backend=URL)


@app.task(name="bench.noop")
def noop(i: Any) -> dict[str, Any]:
    return _common.noop_result(i)


class CeleryPeer(_common.Peer):
    name = "celery"
    bulk_reason = "no bulk add (chunks/group are not a bulk enqueue)"

    def __init__(self, url: str, variant: str | None) -> None:
        super().__init__(url, variant)
        self.raw = self.redis()

    def add(self, i: int) -> Any:
        return noop.delay(i)

    def wait(self, handle: Any, timeout: float) -> Any:
        return handle.get(timeout=timeout)

    def is_done(self, handle: Any) -> bool:
        return bool(handle.ready())

    def pending(self) -> int:
        return int(self.raw.llen("celery"))

    def worker_argv(self, concurrency: int) -> list[str]:
        celery_bin = os.path.join(os.path.dirname(sys.executable), "celery")
        return [celery_bin, "-A", "peer_celery", "worker", "-P", "threads",
                "-c", str(concurrency), "-l", "warning"]


if __name__ == "__main__":
    args = _common.parse_args()
    os.environ["BENCH_REDIS_URL"] = args.url
    sys.modules.pop("peer_celery", None)
    import peer_celery

    sys.exit(_common.main(peer_celery.CeleryPeer))
