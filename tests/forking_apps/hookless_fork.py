"""Run as ``python -m tests.forking_apps.hookless_fork URL QUEUE``: build a
Queue, a ShardedQueue and a Worker, start the queues' readers (a listener
on each), then fork the way a C host such as uWSGI does, without Python's
fork hooks (``fork()`` through ctypes, the GIL held), and in the child add
and wait on both queues and start the parent's Worker. Prints one JSON
line: the child's answers, or its error. Every wait is bounded.

It runs in a process of its own: a fork that bypasses the interpreter's
hooks is safe only in a process with no thread of its own but the readers
(each blocked in its read), not in pytest's.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import sys
from typing import Any

from jobq import Event, Job, Queue, ShardedQueue, Worker
from tests.polling import until

WAIT = 10.0


def echo(job: Job) -> Any:
    return job.data


def child(queue: Queue, sharded: ShardedQueue, workers: list[Worker],
          heard: list[Event]) -> dict[str, Any]:
    with workers[0], workers[1]:  # Workers built in the parent, started here
        results = [queue.add("x", f"child-{i}").wait_until_finished(timeout=5) for i in range(3)]
        results.append(sharded.add("x", "sharded").wait_until_finished(timeout=5))
        # the listener registered in the parent runs on the child's dispatcher
        until(lambda: any(e.result == "child-0" for e in heard), timeout=5)
    return {"results": results, "heard": sorted(str(e.result) for e in heard)}


def round_trips(url: str, queue: Queue, sharded: ShardedQueue, data: str) -> list[Any]:
    """A job through each queue, each run by a Worker made for it."""
    with (
        Worker(queue.name, echo, connection=url, autorun=True),
        Worker(sharded.name, echo, connection=url, shards=2, autorun=True),
    ):
        return [queue.add("x", data).wait_until_finished(timeout=WAIT),
                sharded.add("x", data).wait_until_finished(timeout=WAIT)]


def main(url: str, name: str) -> int:
    heard: list[Event] = []
    with (
        Queue(name, connection=url) as queue,
        ShardedQueue(f"{name}-s", shards=2, connection=url) as sharded,
    ):
        workers = [Worker(name, echo, connection=url),
                   Worker(sharded.name, echo, connection=url, shards=2)]
        queue.events.on("completed", heard.append)
        assert queue.events.wait_until_ready(WAIT) and sharded.events.wait_until_ready(WAIT)
        # the readers have read jobs' events before the fork; the workers
        # that ran them are closed (their threads would want the GIL)
        assert round_trips(url, queue, sharded, "parent") == ["parent", "parent"]
        read_fd, write_fd = os.pipe()
        pid = ctypes.PyDLL(None).fork()
        if pid == 0:
            code = 0
            try:
                payload = {"ok": child(queue, sharded, workers, heard)}
            except BaseException as exc:
                payload, code = {"error": f"{type(exc).__name__}: {exc}"}, 1
            os.write(write_fd, json.dumps(payload).encode())
            os._exit(code)
        os.close(write_fd)
        data = b""
        while select.select([read_fd], [], [], WAIT * 3)[0]:
            chunk = os.read(read_fd, 65536)
            if not chunk:
                break
            data += chunk
        os.close(read_fd)
        if not data:
            os.kill(pid, 9)
        _, status = os.waitpid(pid, 0)
        answer = json.loads(data) if data else {"error": "the child did not answer"}
        if os.WIFSIGNALED(status):  # SIGKILL: it hung; SIGSEGV: it crashed
            answer["child_signal"] = os.WTERMSIG(status)
        answer["parent_after"] = round_trips(url, queue, sharded, "after")
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
