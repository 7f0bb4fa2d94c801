"""Listener patterns: per-job channels, once, decorators, worker listeners.

- ``events.on("completed:<job id>", cb)`` hears one job only (O(1) per event
  however many such listeners exist);
- ``events.once(name, cb)`` fires for the next event only;
- ``@events.on("failed")`` registers a function as it is defined;
- ``worker.on("completed", cb)`` runs in the worker's own process, with the
  Job and its result (no Redis round trip).
"""

# ci: run

from __future__ import annotations

import os
import threading

from jobq import Event, Job, Queue, QueueEvents, Worker
from jobq.testing import embedded_url


def greet(job: Job) -> str:
    """Greet someone; refuse nobody."""
    if not job.data:
        raise ValueError("nobody to greet")
    return f"hello {job.data}"


def main() -> int:
    """Show each listener kind once; return the exit code."""
    with embedded_url() as url:
        name = f"listeners-{os.getpid()}"
        lines: list[str] = []
        all_failed = threading.Event()
        with (
            Queue(name, connection=url) as queue,
            QueueEvents(name, connection=url) as events,
        ):
            events.wait_until_ready(10)

            @events.on("failed")
            def on_failed(event: Event) -> None:
                lines.append(f"[events] job {event.job_id} failed: {event.failed_reason}")
                all_failed.set()

            events.once("active", lambda e: lines.append(f"[once] first active: job {e.job_id}"))

            worker = Worker(name, greet, connection=url)
            worker.on("completed", lambda job, result: lines.append(
                f"[worker] job {job.id} completed with {result!r}"))
            worker.on("failed", lambda job, exc: lines.append(
                f"[worker] job {job.id} failed: {exc}"))
            with worker:
                alice = queue.add("greet", "alice", delay=0.05)
                mine = threading.Event()
                events.on(f"completed:{alice.id}", lambda e: (
                    lines.append(f"[channel] alice's job said {e.result!r}"), mine.set()))
                queue.add("greet", "bob")
                nobody = queue.add("greet", "")
                ok = mine.wait(10) and all_failed.wait(10)
                alice.wait_until_finished(events, timeout=10)
                try:
                    nobody.wait_until_finished(events, timeout=10)
                except Exception as exc:  # expected: JobFailedError
                    lines.append(f"[wait] {type(exc).__name__}: {exc}")
            queue.obliterate(force=True)
        for line in lines:
            print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
