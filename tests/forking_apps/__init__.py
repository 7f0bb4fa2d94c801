"""Web apps set up the way forking servers trip over: the Queue is created,
and its shared event reader started, at import time, so that
``gunicorn --preload`` builds them in the master process before it forks
its workers. Used by tests/test_forking_servers.py."""

from __future__ import annotations

import os

from jobq import Queue


def preload(queue: Queue) -> None:
    """What an app does with its queue at import, in the server's master:
    ``$JOBQ_TEST_PRELOAD`` "reader" (the default) starts its event reader, as
    examples/cron_batch.py does; "add" adds a job (the master then holds a
    connection) and starts no thread."""
    if os.environ.get("JOBQ_TEST_PRELOAD", "reader") == "add":
        queue.add("add", {"a": 0, "b": 0})
    else:
        assert queue.events.wait_until_ready(10)
