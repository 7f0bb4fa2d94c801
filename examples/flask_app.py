"""A Flask app with jobq.contrib.flask: a view enqueues a task and waits for
its result.

``GET /add?a=1&b=2`` calls ``add.delay(a, b)`` and blocks the request thread
until a worker has computed the sum. Every request thread of a process
shares the app's one Queue (``jobq_ext.queue()``: one connection pool, one
event reader, however many requests wait at once).

Serve it with a threaded server, and run workers with ``flask jobq worker``::

    export JOBQ_REDIS_URL=redis://localhost:6379/0
    gunicorn --threads 32 --chdir examples flask_app:app
    flask --app examples/flask_app.py jobq worker --concurrency 8

Run as a script, it starts a server (unless $JOBQ_REDIS_URL names one), a
worker and the app on a free loopback port, makes 20 concurrent requests,
prints the answers and shuts down.
"""

# ci: run

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from flask import Flask, jsonify, request
from werkzeug.serving import make_server

from jobq import JobFailedError, WaitUntilFinishedTimeoutError, Worker
from jobq.contrib.flask import JobQ
from jobq.testing import embedded_url

#: How long a request waits for its job, in seconds.
REQUEST_TIMEOUT = 10.0

app = Flask(__name__)
app.config["JOBQ_URL"] = os.environ.get("JOBQ_REDIS_URL")  # None: localhost
app.config["JOBQ_PREFIX"] = os.environ.get("JOBQ_PREFIX", "jobq")
jobq_ext = JobQ(app)
queue = jobq_ext.queue("flask-add")  # no I/O here: the import works while Redis is down


@queue.task(name="add")
def add(a: int, b: int) -> int:
    """The worker side: add two numbers."""
    return a + b


@app.get("/add")
def add_view() -> Any:
    """Enqueue ``a + b`` and answer with the worker's result."""
    a = request.args.get("a", type=int)
    b = request.args.get("b", type=int)
    if a is None or b is None:
        return jsonify(error="give integers a and b"), 400
    job = add.delay(a, b)
    try:
        result = job.wait_until_finished(timeout=REQUEST_TIMEOUT)
    except WaitUntilFinishedTimeoutError:
        return jsonify(error="timed out", job=job.id), 504
    except JobFailedError as exc:
        return jsonify(error=exc.failed_reason, job=job.id), 500
    return jsonify(a=a, b=b, result=result, job=job.id, pid=os.getpid())


def fetch(url: str) -> dict[str, Any]:
    """GET a URL and decode its JSON answer."""
    with urllib.request.urlopen(url, timeout=REQUEST_TIMEOUT + 5) as response:
        body: dict[str, Any] = json.load(response)
        return body


def demo() -> int:
    """Serve the app with a worker, make concurrent requests, print the answers."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no access log
    try:
        with Worker(queue.name, queue.tasks, connection=app.config["JOBQ_URL"],
                    prefix=queue.prefix, concurrency=4):
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
        jobq_ext.close()
    for answer in answers:
        print(f"{answer['a']} + {answer['b']} = {answer['result']} (job {answer['job']})")
    wrong = [a for a in answers if a["result"] != a["a"] + a["b"]]
    return 1 if wrong else 0


def main() -> int:
    """Run the demo against $JOBQ_REDIS_URL, else against a private server
    (in a child process: the app reads its config at import)."""
    if os.environ.get("JOBQ_REDIS_URL"):
        return demo()
    with embedded_url() as url:
        env = dict(os.environ, JOBQ_REDIS_URL=url, JOBQ_PREFIX=f"demo-{os.getpid()}")
        return subprocess.run([sys.executable, __file__], env=env, check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main())
