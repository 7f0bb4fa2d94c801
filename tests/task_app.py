"""Module-level queues with tasks, as an application writes them; loaded by
``jobq worker tests.task_app:queue`` (or ``:sharded``). Their name, server
and prefix come from ``$JOBQ_TEST_TASK_QUEUE``, ``$JOBQ_TEST_TASK_URL`` and
``$JOBQ_TEST_TASK_PREFIX`` (else the defaults)."""

from __future__ import annotations

import os

from jobq import Queue, ShardedQueue

_NAME = os.environ.get("JOBQ_TEST_TASK_QUEUE", "task-app")
_WHERE = {"connection": os.environ.get("JOBQ_TEST_TASK_URL"),
          "prefix": os.environ.get("JOBQ_TEST_TASK_PREFIX", "jobq")}

queue = Queue(_NAME, **_WHERE)
sharded = ShardedQueue(f"{_NAME}-sharded", shards=2, **_WHERE)


@queue.task()
def add(a: int, b: int) -> int:
    """Return the sum."""
    return a + b


@sharded.task()
def mul(a: int, b: int) -> int:
    """Return the product."""
    return a * b
