"""Huey adapter: RedisHuey. Consumer started with Huey's documented CLI:
``huey_consumer peer_huey.huey -k thread -w C -n -q`` (thread workers, no
periodic tasks, quiet logging)."""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from huey import RedisHuey  # noqa: E402

URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
huey = RedisHuey(_common.QUEUE, url=URL)


@huey.task()
def noop(i: Any) -> dict[str, Any]:
    return _common.noop_result(i)


class HueyPeer(_common.Peer):
    name = "huey"

    def __init__(self, url: str, variant: str | None) -> None:
        super().__init__(url, variant)
        self.raw = self.redis()

    def add(self, i: int) -> Any:
        return noop(i)

    def wait(self, handle: Any, timeout: float) -> Any:
        return handle.get(blocking=True, timeout=timeout)

    def is_done(self, handle: Any) -> bool:
        return handle.get(preserve=True) is not None

    def pending(self) -> int:
        return int(self.raw.llen(f"huey.redis.{_common.QUEUE}"))

    def worker_argv(self, concurrency: int) -> list[str]:
        bin_ = os.path.join(os.path.dirname(sys.executable), "huey_consumer")
        return [bin_, "peer_huey.huey", "-k", "thread", "-w", str(concurrency), "-n", "-q"]


if __name__ == "__main__":
    args = _common.parse_args()
    os.environ["BENCH_REDIS_URL"] = args.url
    import peer_huey

    sys.exit(_common.main(peer_huey.HueyPeer))
