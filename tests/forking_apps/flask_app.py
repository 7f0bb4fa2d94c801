"""A Flask app whose view enqueues a job and waits for its result, with the
Queue built and its reader started at import (in gunicorn's master with
``--preload``). Configured by $JOBQ_REDIS_URL and $JOBQ_TEST_QUEUE."""

from __future__ import annotations

import os
from typing import Any

from flask import Flask, jsonify, request

from jobq import Queue
from tests.forking_apps import preload

queue = Queue(os.environ["JOBQ_TEST_QUEUE"], connection=os.environ["JOBQ_REDIS_URL"])
# by default what examples/cron_batch.py does, and what left every forked
# child deaf
preload(queue)

app = Flask(__name__)


@app.get("/add")
def add() -> Any:
    """Enqueue ``a + b`` (odd ``a``: removed on completion) and answer with it."""
    a, b = int(request.args["a"]), int(request.args["b"])
    job = queue.add("add", {"a": a, "b": b}, remove_on_complete=bool(a % 2))
    result = job.wait_until_finished(timeout=10)
    return jsonify(a=a, b=b, result=result, pid=os.getpid())
