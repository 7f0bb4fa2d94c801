"""The public API as the docs show it, for ``mypy --strict`` (``make lint``
checks this file with the package): an annotation of jobq's that leaks
``Any`` where users hold a precise type fails here. Never run, only
checked: each ``type: ignore`` below must be needed (strict mode reports
an unused one), so each marks a call that mypy must refuse."""

from __future__ import annotations

from jobq import Event, Job, Queue, QueueEvents, Worker


def listeners(events: QueueEvents, worker: Worker) -> None:
    @events.on("completed")  # an untyped decorator would make `done` untyped
    def done(event: Event) -> None:
        print(event.job_id)

    done("not an event")  # type: ignore[arg-type]

    def failed(job: Job, error: BaseException) -> None:
        print(job.id, error)

    worker.on("failed", failed)(None, None)  # type: ignore[arg-type]
    events.once("drained", done)(1)  # type: ignore[arg-type]


def add_and_wait(queue: Queue, events: QueueEvents) -> object:
    job = queue.add("send", {"to": "a@example.com"}, attempts=3)
    job.wait_until_finished(events, timeout="10")  # type: ignore[arg-type]
    return job.wait_until_finished(events, timeout=10)
