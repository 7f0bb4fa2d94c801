"""jobq.contrib.flask: JobQ(app) / init_app, its config, one shared Queue per
app and process, ``flask jobq worker``; then examples/flask_app.py under
gunicorn with a ``flask jobq worker`` process."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import flask
import pytest

from jobq import Queue
from jobq.contrib.flask import JobQ
from tests.test_forking_servers import _get, gunicorn_with_worker

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@pytest.fixture
def app(redis_url: str, queue_name: str) -> Iterator[flask.Flask]:
    app = flask.Flask("test_app")
    app.config.update(JOBQ_URL=redis_url, JOBQ_PREFIX=f"fl-{queue_name[-8:]}",
                      JOBQ_QUEUES={"mail": {"default_job_options": {"attempts": 2}}})
    yield app
    with app.app_context():
        JobQ().close()


def test_jobq_app_gives_one_shared_queue_per_name_with_the_config(app: flask.Flask) -> None:
    ext = JobQ(app)
    mail = ext.queue("mail")
    assert mail is ext.queue("mail") and mail is not ext.queue()
    assert mail.prefix == app.config["JOBQ_PREFIX"] and mail.name == "mail"
    assert mail.add("x").opts["attempts"] == 2  # JOBQ_QUEUES options
    assert ext.queue().name == "default"
    mail.obliterate(force=True)


def test_init_app_and_the_app_context(app: flask.Flask) -> None:
    ext = JobQ()
    ext.init_app(app)
    with app.app_context():
        assert ext.queue("mail") is ext.queue("mail")
    with pytest.raises(RuntimeError):
        ext.queue()  # no app given, no app context
    bare = flask.Flask("bare")
    with bare.app_context(), pytest.raises(RuntimeError, match="init_app"):
        ext.queue()


def test_flask_jobq_worker_burst_runs_the_apps_tasks(app: flask.Flask) -> None:
    ext = JobQ(app)
    queue = ext.queue("mail")

    @queue.task()
    def shout(text: str) -> str:
        return text.upper()

    jobs = [shout.delay(w) for w in ("a", "b", "c")]
    result = app.test_cli_runner().invoke(args=["jobq", "worker", "--burst", "-c", "2"])
    assert result.exit_code == 0, result.output
    assert "jobq worker ready on mail" in result.output
    assert [queue.get_job_result(j.id) for j in jobs] == ["A", "B", "C"]
    missing = app.test_cli_runner().invoke(args=["jobq", "worker", "nope", "--burst"])
    assert missing.exit_code == 2 and "no tasks for queue(s) nope" in missing.output
    queue.obliterate(force=True)


def test_the_example_under_gunicorn_with_a_flask_jobq_worker(redis_url: str) -> None:
    prefix = f"flg-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, JOBQ_REDIS_URL=redis_url, JOBQ_PREFIX=prefix, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(EXAMPLES), str(ROOT)])
    worker = [sys.executable, "-m", "flask", "--app", "flask_app", "jobq", "worker", "-c", "4"]
    with gunicorn_with_worker(EXAMPLES, env, "flask_app:app", worker) as base:
        with ThreadPoolExecutor(max_workers=8) as pool:
            answers = list(pool.map(lambda n: _get(f"{base}/add?a={n}&b={n}"), range(40)))
        assert _get(f"{base}/add?a=x")[0] == 400
    bad = [(n, a) for n, a in enumerate(answers) if a[0] != 200 or a[1].get("result") != 2 * n]
    assert not bad, bad[:3]
    assert 1 <= len({body["pid"] for _, body in answers}) <= 2
    with Queue("flask-add", connection=redis_url, prefix=prefix) as queue:
        assert queue.get_job_counts("completed") == {"completed": 40}
        queue.obliterate(force=True)
