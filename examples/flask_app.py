"""A Flask app whose view enqueues a job and waits for its result.

``GET /add?a=1&b=2`` adds a job to the ``flask-add`` queue and blocks the
request thread until a worker has computed the sum. Every request thread
shares one module-level :class:`jobq.Queue` (and so one event reader, however
many requests wait at once).

Serve it with a threaded server so that many requests can wait at once::

    JOBQ_REDIS_URL=redis://localhost:6379/0 flask --app examples.flask_app run --with-threads
    JOBQ_REDIS_URL=redis://localhost:6379/0 gunicorn --threads 32 examples.flask_app:app

and run workers elsewhere (``jobq worker examples.flask_app:add --queue flask-add``).
Run as a script, it starts a worker and a threaded server on a free loopback
port, makes 20 concurrent requests, prints the answers and shuts down.
"""

# ci: run

from __future__ import annotations

import json
import logging
import os
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from flask import Flask, jsonify, request
from werkzeug.serving import make_server

from jobq import Job, JobFailedError, Queue, WaitUntilFinishedTimeoutError, Worker
from jobq.testing import embedded_url

QUEUE_NAME = "flask-add"
#: How long a request waits for its job, in seconds.
REQUEST_TIMEOUT = 10.0

app = Flask(__name__)

_queue: Queue | None = None
_queue_lock = threading.Lock()


def configure(connection: str | None = None, queue_name: str = QUEUE_NAME) -> Queue:
    """Create the module's shared Queue (``connection=None``: ``$JOBQ_REDIS_URL``)."""
    global _queue
    with _queue_lock:
        if _queue is None:
            _queue = Queue(queue_name, connection=connection)
        return _queue


def get_queue() -> Queue:
    """The Queue shared by every request thread, created on first use."""
    return _queue if _queue is not None else configure()


def shutdown() -> None:
    """Close the shared Queue (and its event reader)."""
    global _queue
    with _queue_lock:
        queue, _queue = _queue, None
    if queue is not None:
        queue.close()


def add(job: Job) -> int:
    """The worker side: add two numbers."""
    return int(job.data["a"]) + int(job.data["b"])


@app.get("/add")
def add_view() -> Any:
    """Enqueue ``a + b`` and answer with the worker's result."""
    a = request.args.get("a", type=int)
    b = request.args.get("b", type=int)
    if a is None or b is None:
        return jsonify(error="give integers a and b"), 400
    job = get_queue().add("add", {"a": a, "b": b})
    try:
        result = job.wait_until_finished(timeout=REQUEST_TIMEOUT)
    except WaitUntilFinishedTimeoutError:
        return jsonify(error="timed out", job=job.id), 504
    except JobFailedError as exc:
        return jsonify(error=exc.failed_reason, job=job.id), 500
    return jsonify(a=a, b=b, result=result, job=job.id)


def fetch(url: str) -> dict[str, Any]:
    """GET a URL and decode its JSON answer."""
    with urllib.request.urlopen(url, timeout=REQUEST_TIMEOUT + 5) as response:
        body: dict[str, Any] = json.load(response)
        return body


def main() -> int:
    """Serve the app, make concurrent requests, print the answers."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no access log
    with embedded_url() as url:
        queue = configure(url, f"{QUEUE_NAME}-{os.getpid()}")
        try:
            with Worker(queue.name, add, connection=url, concurrency=4):
                server = make_server("127.0.0.1", 0, app, threaded=True)
                thread = threading.Thread(target=server.serve_forever, name="http")
                thread.start()
                try:
                    base = f"http://127.0.0.1:{server.server_port}"
                    urls = [f"{base}/add?a={n}&b={n * 10}" for n in range(20)]
                    with ThreadPoolExecutor(max_workers=10) as pool:
                        answers = list(pool.map(fetch, urls))
                finally:
                    server.shutdown()
                    thread.join(10)
                    server.server_close()
        finally:
            shutdown()
    for answer in answers:
        print(f"{answer['a']} + {answer['b']} = {answer['result']} (job {answer['job']})")
    wrong = [a for a in answers if a["result"] != a["a"] + a["b"]]
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
