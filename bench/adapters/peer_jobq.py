"""jobq adapter (runs in the project's .venv). Worker: ``python peer_jobq.py worker C``."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402

QUEUE = _common.QUEUE


def processor(job: Any) -> dict[str, Any]:
    return _common.noop_result(job.data)


class JobqPeer(_common.Peer):
    name = "jobq"

    def __init__(self, url: str, variant: str | None) -> None:
        super().__init__(url, variant)
        from jobq import Queue

        self.queue_name = QUEUE
        self.queue = Queue(QUEUE, connection=url)
        self.queues = {QUEUE: self.queue}
        self.wait_key = self.queue._context.keys.wait  # for the drain's first-take probe
        self.raw = self.redis()

    def use_queue(self, name: str) -> None:
        from jobq import Queue

        if name not in self.queues:  # kept open: W5 alternates between two queues
            self.queues[name] = Queue(name, connection=self.url)
        self.queue_name = name
        self.queue = self.queues[name]
        self.wait_key = self.queue._context.keys.wait

    def wait_list_key(self) -> str:
        return self.wait_key

    def add(self, i: int) -> Any:
        return self.queue.add("noop", i)

    def add_bulk(self, start: int, count: int) -> list[Any]:
        return self.queue.add_bulk({"name": "noop", "data": i}
                                   for i in range(start, start + count))

    def wait(self, handle: Any, timeout: float) -> Any:
        return handle.wait_until_finished(timeout=timeout)

    def is_done(self, handle: Any) -> bool:
        job_id = handle if isinstance(handle, str) else handle.id
        return self.queue.get_job_state(job_id) == "completed"

    def pending(self) -> int:
        return int(self.raw.llen(self.wait_key))

    def worker_argv(self, concurrency: int) -> list[str]:
        return [sys.executable, os.path.abspath(__file__), "worker", self.url, str(concurrency),
                self.queue_name]

    def events_argv(self) -> list[str]:
        return [sys.executable, os.path.abspath(__file__), "events", self.url]

    def close(self) -> None:
        for queue in self.queues.values():
            queue.close()


def run_worker(url: str, concurrency: int, queue: str = QUEUE) -> None:
    from jobq import Worker

    Worker(queue, processor, connection=url, concurrency=concurrency).run()


def run_events(url: str) -> None:
    import signal

    from jobq import QueueEvents

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with QueueEvents(QUEUE, connection=url) as events:
        events.wait_until_ready(timeout=30)
        stop.wait(600)


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        run_worker(sys.argv[2], int(sys.argv[3]), *sys.argv[4:5])
    elif sys.argv[1:2] == ["events"]:
        run_events(sys.argv[2])
    else:
        sys.exit(_common.main(JobqPeer))
