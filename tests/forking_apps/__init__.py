"""Web apps set up the way forking servers trip over: the Queue is created,
and its shared event reader started, at import time, so that
``gunicorn --preload`` builds them in the master process before it forks
its workers. Used by tests/test_forking_servers.py."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
from types import FrameType

from jobq import Queue

#: Signals a test sends a worker whose requests went unanswered, for its
#: stacks on stderr: every thread's, written from C (it works while a thread
#: blocks the whole process), then every greenlet's (gevent workers).
DUMP_THREADS = signal.SIGRTMIN + 2
DUMP_GREENLETS = signal.SIGRTMIN + 3


def _dump_greenlets(signum: int, frame: FrameType | None) -> None:
    if "gevent" in sys.modules:
        from gevent.util import print_run_info

        print_run_info(file=sys.stderr)


def preload(queue: Queue) -> None:
    """What an app does with its queue at import, in the server's master:
    ``$JOBQ_TEST_PRELOAD`` "reader" (the default) starts its event reader, as
    examples/cron_batch.py does; "add" adds a job (the master then holds a
    connection) and starts no thread. Also sets up the stack dumps
    (inherited by the forked workers)."""
    faulthandler.register(DUMP_THREADS, all_threads=True)
    signal.signal(DUMP_GREENLETS, _dump_greenlets)
    if os.environ.get("JOBQ_TEST_PRELOAD", "reader") == "add":
        queue.add("add", {"a": 0, "b": 0})
    else:
        assert queue.events.wait_until_ready(10)
