"""Run the examples: every examples/*.py marked ``# ci: run``, and the Flask app
behind a real threaded HTTP server."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from jobq import Worker

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
RUNNABLE = sorted(
    path for path in EXAMPLES.glob("*.py")
    if any(line.strip() == "# ci: run" for line in path.read_text().splitlines())
)


def test_the_examples_are_found() -> None:
    names = {path.name for path in RUNNABLE}
    assert {"quickstart.py", "flask_app.py", "cron_batch.py", "event_tail.py",
            "listeners.py", "schedulers.py", "dedup.py", "cancel.py"} <= names


@pytest.mark.parametrize("script", RUNNABLE, ids=[p.name for p in RUNNABLE])
def test_example_runs(script: Path, redis_url: str) -> None:
    env = dict(os.environ, JOBQ_REDIS_URL=redis_url)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(EXAMPLES.parent), *filter(None, [env.get("PYTHONPATH")])]
    )
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert done.stdout.strip(), "the example printed nothing"


@pytest.fixture
def flask_app(queue_name: str, redis_url: str) -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("jobq_example_flask_app",
                                                  EXAMPLES / "flask_app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.configure(redis_url, queue_name)
    try:
        yield module
    finally:
        module.shutdown()


def _get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=20) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def test_flask_app_answers_concurrent_requests(flask_app: ModuleType, queue_name: str,
                                               redis_url: str) -> None:
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", 0, flask_app.app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="test-http")
    release = threading.Event()
    inside = threading.Semaphore(0)

    def add(job: Any) -> int:
        inside.release()
        # hold the first jobs so that many requests wait at the same time
        assert release.wait(20)
        return int(flask_app.add(job))

    with Worker(queue_name, add, connection=redis_url, concurrency=8):
        thread.start()
        try:
            base = f"http://127.0.0.1:{server.server_port}"
            with ThreadPoolExecutor(max_workers=30) as pool:
                futures = [pool.submit(_get, f"{base}/add?a={n}&b={2 * n}") for n in range(30)]
                for _ in range(8):  # 8 jobs running, the other requests queued behind
                    assert inside.acquire(timeout=20)
                release.set()
                answers = [f.result(timeout=30) for f in futures]
            assert [status for status, _ in answers] == [200] * 30
            assert [body["result"] for _, body in answers] == [3 * n for n in range(30)]
            assert len({body["job"] for _, body in answers}) == 30
            status, body = _get(f"{base}/add?a=x")
            assert status == 400
        finally:
            release.set()
            server.shutdown()
            thread.join(10)
            server.server_close()
    # one shared Queue: one event reader for all request threads
    queue = flask_app.get_queue()
    assert queue is flask_app.get_queue()
    assert sum(t.name == f"jobq-events-{queue_name}" for t in threading.enumerate()) == 1
