"""A module-level queue with tasks, as an application writes it; loaded by
``jobq worker tests.task_app:queue`` (the queue's name from
``$JOBQ_TEST_TASK_QUEUE``)."""

from __future__ import annotations

import os

from jobq import Queue

queue = Queue(os.environ.get("JOBQ_TEST_TASK_QUEUE", "task-app"))


@queue.task()
def add(a: int, b: int) -> int:
    """Return the sum."""
    return a + b
