"""Dramatiq adapter: RedisBroker plus the Results middleware (RedisBackend).
Worker started with Dramatiq's documented CLI:
``dramatiq peer_dramatiq --processes 1 --threads C``."""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
import dramatiq  # noqa: E402
from dramatiq.brokers.redis import RedisBroker  # noqa: E402
from dramatiq.results import ResultMissing, Results  # noqa: E402
from dramatiq.results.backends import RedisBackend  # noqa: E402

URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
broker = RedisBroker(url=URL)
broker.add_middleware(Results(backend=RedisBackend(url=URL)))
dramatiq.set_broker(broker)


@dramatiq.actor(store_results=True, queue_name=_common.QUEUE)
def noop(i: Any) -> dict[str, Any]:
    return _common.noop_result(i)


class DramatiqPeer(_common.Peer):
    name = "dramatiq"

    def __init__(self, url: str, variant: str | None) -> None:
        super().__init__(url, variant)
        self.raw = self.redis()

    def add(self, i: int) -> Any:
        return noop.send(i)

    def wait(self, handle: Any, timeout: float) -> Any:
        return handle.get_result(block=True, timeout=int(timeout * 1000))

    def is_done(self, handle: Any) -> bool:
        try:
            handle.get_result()
            return True
        except ResultMissing:
            return False

    def pending(self) -> int:
        return int(self.raw.llen(f"dramatiq:{_common.QUEUE}"))

    def worker_argv(self, concurrency: int) -> list[str]:
        bin_ = os.path.join(os.path.dirname(sys.executable), "dramatiq")
        return [bin_, "peer_dramatiq", "--processes", "1", "--threads", str(concurrency)]


if __name__ == "__main__":
    args = _common.parse_args()
    os.environ["BENCH_REDIS_URL"] = args.url
    import peer_dramatiq

    sys.exit(_common.main(peer_dramatiq.DramatiqPeer))
