"""The queue shared by the whole process, and what the worker runs."""

from __future__ import annotations

import threading

from django.conf import settings

from jobq import Job, Queue

_queue: Queue | None = None
_lock = threading.Lock()


def get_queue() -> Queue:
    """The one Queue of this process (one connection pool, one event reader),
    created on first use from ``settings.JOBQ``."""
    global _queue
    with _lock:
        if _queue is None:
            _queue = Queue(settings.JOBQ["QUEUE"], connection=settings.JOBQ["URL"])
        return _queue


def close_queue() -> None:
    """Close the shared Queue (tests, or a process shutting down)."""
    global _queue
    with _lock:
        queue, _queue = _queue, None
    if queue is not None:
        queue.close()


def add(job: Job) -> int:
    """Add two numbers (the worker side)."""
    return int(job.data["a"]) + int(job.data["b"])


#: Job name -> processor, as ``manage.py jobq_worker`` runs them.
PROCESSORS = {"add": add}
