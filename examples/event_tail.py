"""Print every event of a queue live while a worker runs a few jobs.

``QueueEvents.on_all_events`` sees every event the queue emits: job
transitions, progress, queue-wide events and custom ones (``Queue.emit``).
The ``jobq events QUEUE`` command does the same from a shell.
"""

# ci: run

from __future__ import annotations

import os
import threading

from jobq import Event, Job, Queue, QueueEvents, Worker
from jobq.testing import embedded_url


def work(job: Job) -> int:
    """Square a number, reporting progress half-way."""
    job.update_progress(50)
    if job.data < 0:
        raise ValueError("negative numbers are not welcome")
    return int(job.data) ** 2


def show(event: Event) -> None:
    """Print one event on one line."""
    fields = " ".join(f"{key}={value!r}" for key, value in event.fields.items())
    job = f" job={event.job_id}" if event.job_id else ""
    print(f"{event.id or '-':>17} {event.name:<10}{job} {fields}".rstrip())


def main() -> int:
    """Tail the events of a short run; return the exit code."""
    with embedded_url() as url:
        name = f"event-tail-{os.getpid()}"
        finished = threading.Event()
        with (
            Queue(name, connection=url) as queue,
            QueueEvents(name, connection=url) as events,
        ):
            events.on_all_events(show)
            events.on("batch-done", lambda event: finished.set())
            events.wait_until_ready(10)
            with Worker(name, work, connection=url):
                jobs = [queue.add("square", n) for n in (2, 3, -1)]
                for job in jobs:
                    try:
                        job.wait_until_finished(events, timeout=10)
                    except Exception as exc:  # the failure is part of the show
                        print(f"   (job {job.id}: {type(exc).__name__}: {exc})")
                queue.emit("batch-done", jobs=len(jobs))
                ok = finished.wait(10)  # bounded: stop even if something went wrong
            queue.obliterate(force=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
