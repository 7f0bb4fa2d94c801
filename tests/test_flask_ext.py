"""jobq.contrib.flask: JobQ(app) / init_app, its config, one shared Queue per
app and process, ``flask jobq worker``; then examples/flask_app.py under
gunicorn with a ``flask jobq worker`` process."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import flask
import pytest

from jobq import Queue
from jobq.contrib.flask import JobQ
from tests.test_forking_servers import _get, gunicorn_with_worker

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
WAIT = 60.0  # seconds a subprocess (an interpreter starting, a burst worker) may take


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


def test_after_close_the_tasks_of_a_queue_add_to_the_queue_built_again(
    app: flask.Flask,
) -> None:
    """A task made with ``@ext.queue(name).task()`` stayed bound to the queue
    that ``close()`` closed: its next ``delay`` raised ClosedError, and the
    queue built again had no tasks for a worker."""
    ext = JobQ(app)
    first = ext.queue("mail")

    @first.task(name="notify")
    def notify(to: str) -> str:
        return f"to {to}"

    ext.close()
    job = notify.delay("a")
    again = ext.queue("mail")
    assert again is not first and notify.queue is again and list(again.tasks) == ["notify"]
    assert again.get_job(job.id) is not None
    again.obliterate(force=True)


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


def test_flask_jobq_worker_with_redis_down_says_so_in_one_line(app: flask.Flask) -> None:
    """As `jobq worker`: exit 3 and one line naming the server without its
    password, not "ready" and a traceback."""
    app.config["JOBQ_URL"] = "redis://:hunter2@127.0.0.1:1/0"
    queue = JobQ(app).queue("mail")

    @queue.task()
    def shout(text: str) -> str:
        return text.upper()

    for burst in ([], ["--burst"]):
        result = app.test_cli_runner().invoke(args=["jobq", "worker", *burst])
        assert result.exit_code == 3, result.output
        assert result.output.strip().splitlines() == [
            "jobq: cannot reach the Redis server at redis://:***@127.0.0.1:1/0: "
            "Error 111 connecting to 127.0.0.1:1. Connection refused."]


def test_flask_jobq_worker_refused_by_redis_says_so_in_one_line(
    app: flask.Flask, redis_url: str
) -> None:
    """A database the server does not have (or an ACL's NOPERM) was a
    thirty-line traceback; `jobq worker` says it in one line, exit 1."""
    app.config["JOBQ_URL"] = f"redis://127.0.0.1:{urlsplit(redis_url).port}/999"
    queue = JobQ(app).queue("mail")

    @queue.task()
    def shout(text: str) -> str:
        return text.upper()

    result = app.test_cli_runner().invoke(args=["jobq", "worker", "--burst"])
    assert result.exit_code == 1, result.output
    [line] = result.output.strip().splitlines()  # of a cluster's node: SELECT is not allowed
    assert line.startswith("jobq: Redis error: ") and "Traceback" not in result.output


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


# -- an application factory: tasks declared on the extension, before any app --

_FACTORY_FILES = {
    "fapp/__init__.py": "",
    "fapp/extensions.py": "from jobq.contrib.flask import JobQ\n\njobq_ext = JobQ()\n",
    "fapp/tasks.py": (
        "from .extensions import jobq_ext\n\n\n"
        "@jobq_ext.task(queue='mail', attempts=2)\n"
        "def shout(text):\n    return text.upper()\n\n\n"
        "@jobq_ext.task()\n"
        "def add(a, b):\n    return a + b\n\n\n"
        "@jobq_ext.task()\n"
        "def context():\n"
        "    from flask import current_app, g\n"
        "    fresh = 'seen' not in g  # a context of its own per job\n"
        "    g.seen = True\n"
        "    return [current_app.name, current_app.config['JOBQ_PREFIX'], fresh]\n"
    ),
    "fapp/app.py": (
        "import os\n\nfrom flask import Flask\n\nfrom .extensions import jobq_ext\n\n\n"
        "def create_app():\n"
        "    app = Flask(__name__)\n"
        "    app.config.update(JOBQ_URL=os.environ['JOBQ_REDIS_URL'],\n"
        "                      JOBQ_PREFIX=os.environ['JOBQ_PREFIX'])\n"
        "    jobq_ext.init_app(app)\n"
        "    from . import tasks  # noqa: F401\n"
        "    return app\n"
    ),
}


def test_tasks_declared_before_the_app_run_in_a_factory_apps_worker(
    tmp_path: Path, redis_url: str, queue_name: str,
) -> None:
    for name, text in _FACTORY_FILES.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    prefix = f"ff-{queue_name[-8:]}"
    env = dict(os.environ, JOBQ_REDIS_URL=redis_url, JOBQ_PREFIX=prefix)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    # the app adds through the factory's app, as a view would
    adder = (
        "from fapp.app import create_app\nfrom fapp.tasks import add, context, shout\n"
        "app = create_app()\n"
        "with app.app_context():\n"
        "    print(shout.delay('hi').id, add.delay(2, 3).id, shout.queue.prefix,\n"
        "          context.delay().id, context.delay().id)\n"
        "try:\n    add.delay(1, 1)\nexcept RuntimeError as exc:\n    print('outside:', exc)\n"
    )
    added = subprocess.run([sys.executable, "-c", adder], env=env, capture_output=True,
                           text=True, timeout=WAIT, check=True).stdout.split("\n")
    mail_id, default_id, used_prefix, *context_ids = added[0].split()
    assert used_prefix == prefix
    assert added[1].startswith("outside:")  # no app context, no app given: an error
    worker = subprocess.run(
        [sys.executable, "-m", "flask", "--app", "fapp.app:create_app", "jobq", "worker",
         "--burst", "-c", "2"],
        env=env, capture_output=True, text=True, timeout=WAIT)
    assert worker.returncode == 0, worker.stdout + worker.stderr
    assert "jobq worker ready on default, mail" in worker.stdout
    with Queue("mail", connection=redis_url, prefix=prefix) as mail, \
            Queue("default", connection=redis_url, prefix=prefix) as default:
        assert mail.get_job_result(mail_id) == "HI"
        assert mail.get_job(mail_id).opts["attempts"] == 2  # type: ignore[union-attr]
        assert default.get_job_result(default_id) == 5
        # each job ran inside an application context of the worker's app
        assert [default.get_job_result(j) for j in context_ids] == [
            ["fapp.app", prefix, True], ["fapp.app", prefix, True]]
        mail.obliterate(force=True)
        default.obliterate(force=True)


def test_extension_tasks_follow_the_current_app(redis_url: str, queue_name: str) -> None:
    ext = JobQ()

    @ext.task(queue="mail")
    def shout(text: str) -> str:
        return text.upper()

    @ext.task  # bare: the default queue
    def whisper(text: str) -> str:
        return text.lower()

    assert shout("here") == "HERE"  # a plain call runs here
    assert whisper("HERE") == "here" and whisper.queue_name == "default"
    with pytest.raises(RuntimeError, match="no Flask app: use the task or queue in an app"):
        shout.delay("x")  # no app yet
    apps = []
    for n in range(2):
        app = flask.Flask(f"app{n}")
        app.config.update(JOBQ_URL=redis_url, JOBQ_PREFIX=f"fx{n}-{queue_name[-8:]}")
        ext.init_app(app)
        apps.append(app)
    try:
        for app in apps:
            with app.app_context():
                job = shout.delay("x")
                assert shout.queue is ext.queue("mail")
                assert shout.queue.prefix == app.config["JOBQ_PREFIX"]
                assert shout.queue.get_job(job.id) is not None
                with pytest.raises(TypeError):
                    shout.delay("x", "too many")  # checked against the signature
        with apps[0].app_context():
            # declared after the app's queue was built: the worker finds it too
            @ext.task(queue="mail")
            def late() -> str:
                return "late"

            result = apps[0].test_cli_runner().invoke(args=["jobq", "worker", "--burst"])
            assert result.exit_code == 0, result.output
            assert set(ext.queue("mail").tasks) == {shout.name, late.name}
            assert ext.queue("mail").get_job_counts("completed") == {"completed": 1}
        with pytest.raises(ValueError, match="already"):
            ext.task(queue="mail", name=shout.name)(lambda: None)
        with pytest.raises(ValueError):
            ext.task(priority=-1)
        with pytest.raises(ValueError, match="cannot be a default job option of a task"):
            ext.task(job_id="one")  # every delay() would be one job
    finally:
        for app in apps:
            with app.app_context():
                ext.queue("mail").obliterate(force=True)
                ext.close()


def test_a_name_taken_by_a_task_of_a_built_queue_is_refused_at_declaration(
    app: flask.Flask,
) -> None:
    """``@ext.queue().task(name=...)`` and then ``@ext.task(name=...)`` of
    another function: the second was accepted (web processes added its
    jobs), and ``flask jobq worker`` died on it at start."""
    ext = JobQ(app)

    @ext.queue().task(name="send")
    def send_a(x: int) -> int:
        return x

    with pytest.raises(ValueError, match="queue 'default' has a task named 'send' already"):
        @ext.task(name="send")
        def send_b(x: int) -> int:
            return -x

    @ext.task(name="send", queue="mail")  # another queue: free
    def send_mail(x: int) -> int:
        return x

    assert ext.task(name="send")(send_a.func).func is send_a.func  # the same function: fine
    result = app.test_cli_runner().invoke(args=["jobq", "worker", "--burst"])
    assert result.exit_code == 0, result.output


def test_a_task_declared_on_the_extension_is_given_to_its_built_queue_at_once(
    app: flask.Flask,
) -> None:
    """The queue built first, ``@ext.task(name=...)`` and then
    ``@queue.task(name=...)`` of another function: both were accepted (the
    extension's task reached the built queue only when a worker started),
    ``flask jobq worker`` died on it, and a worker of the queue alone ran
    the second function for the first one's jobs."""
    ext = JobQ(app)
    queue = ext.queue()

    @ext.task(name="send")
    def send_a(x: int) -> int:
        return x

    assert queue._tasks["send"].func is send_a.func  # given at once
    with pytest.raises(ValueError, match="queue 'default' has a task named 'send' already"):
        @queue.task(name="send")
        def send_b(x: int) -> int:
            return -x


def test_a_second_app_set_up_by_init_app_gets_its_own_queues(
    redis_url: str, queue_name: str
) -> None:
    """JobQ(app1) then init_app(app2): in app2's context, app2's queue (it
    was app1's, whose prefix a worker of app2 never reads)."""
    apps = [flask.Flask(f"two{n}") for n in range(2)]
    for n, app in enumerate(apps):
        app.config.update(JOBQ_URL=redis_url, JOBQ_PREFIX=f"two{n}-{queue_name[-8:]}")
    ext = JobQ(apps[0])
    ext.init_app(apps[1])
    try:
        for app in apps:
            with app.app_context():
                assert ext.queue().prefix == app.config["JOBQ_PREFIX"]
        assert ext.queue().prefix == apps[0].config["JOBQ_PREFIX"]  # no context: JobQ(app)'s
    finally:
        for app in apps:
            with app.app_context():
                ext.close()


@pytest.mark.parametrize(("config", "error", "match"), [
    ({"JOBQ_QUEUES": ["default"]}, TypeError, "JOBQ_QUEUES must map"),
    ({"JOBQ_QUEUES": {"q": {"connection": "redis://x"}}}, ValueError, "may not set 'connection'"),
    ({"JOBQ_QUEUES": {"q": {"bogus": 1}}}, TypeError, "queue 'q'.*bogus"),
    ({"JOBQ_URL": "htp://127.0.0.1:1/0"}, ValueError, "queue 'default'"),
    ({"JOBQ_PREFIX": "a b"}, ValueError, "queue 'default'"),
])
def test_a_bad_config_fails_init_app_not_the_first_request(
    config: dict[str, object], error: type[Exception], match: str
) -> None:
    app = flask.Flask("bad")
    app.config.update(config)
    with pytest.raises(error, match=match):
        JobQ(app)
