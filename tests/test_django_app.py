"""jobq.contrib.django with the example project (examples/django_app): the
shared queues, tasks added on commit (SQLite, ``transaction.atomic()``),
``manage.py jobq_worker``, the system checks; then the project under
gunicorn with a ``manage.py jobq_worker`` process."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import django
import pytest
import redis

from jobq import Queue, SerializationError
from tests.test_forking_servers import _get, gunicorn_with_worker

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ROOT / "examples" / "django_app"
WAIT = 20.0


@pytest.fixture(scope="module")
def prefix(redis_url: str) -> Iterator[str]:
    """Django set up once for this module on the example's settings, with a
    prefix of its own (settings are read once per process)."""
    prefix = f"dj-{uuid.uuid4().hex[:8]}"
    saved = {k: os.environ.get(k) for k in ("JOBQ_REDIS_URL", "JOBQ_PREFIX",
                                            "DJANGO_SETTINGS_MODULE")}
    os.environ.update(JOBQ_REDIS_URL=redis_url, JOBQ_PREFIX=prefix,
                      DJANGO_SETTINGS_MODULE="mysite.settings")
    sys.path.insert(0, str(PROJECT))
    try:
        django.setup()
        yield prefix
    finally:
        from jobq.contrib.django import close_queues

        close_queues()
        sys.path.remove(str(PROJECT))
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def shop(prefix: str) -> Iterator[Any]:
    from shop import tasks

    tasks.queue.drain(delayed=True)
    yield tasks
    tasks.queue.obliterate(force=True)


def test_get_queue_is_the_shared_queue_of_the_settings(shop: Any, prefix: str) -> None:
    from jobq.contrib.django import get_queue

    queue = get_queue()
    assert queue is get_queue("default") is shop.queue
    assert queue.prefix == prefix and queue.name == "default"
    assert get_queue("other") is get_queue("other") is not queue
    assert sorted(queue.tasks) == ["shop.tasks.add", "shop.tasks.send_welcome"]
    assert shop.add.delay(1, 2).opts["remove_on_complete"]["count"] == 1000  # QUEUES options


def test_delay_on_commit_adds_after_commit_and_nothing_on_rollback(shop: Any) -> None:
    from django.db import transaction

    queue = shop.queue
    with transaction.atomic():
        shop.send_welcome.delay_on_commit("a@example.com")
        queue.add_on_commit("audit", {"who": "a"})
        assert queue.get_job_counts("waiting") == {"waiting": 0}  # not yet
    assert [j.name for j in queue.get_jobs("waiting", asc=True)] == [
        "shop.tasks.send_welcome", "audit"]
    with pytest.raises(RuntimeError), transaction.atomic():
        shop.send_welcome.delay_on_commit("b@example.com")
        queue.add_on_commit("audit", {"who": "b"})
        raise RuntimeError("rolled back")
    assert queue.get_job_counts("waiting") == {"waiting": 2}
    with pytest.raises(TypeError):  # the arguments are checked at once
        shop.send_welcome.delay_on_commit()
    # and encoded at once: after the commit, the job would be lost
    with transaction.atomic():
        with pytest.raises(SerializationError):
            shop.send_welcome.delay_on_commit(object())
        with pytest.raises(SerializationError):
            queue.add_on_commit("audit", {1: "a"})
    assert queue.get_job_counts("waiting") == {"waiting": 2}


def test_an_add_on_commit_takes_its_data_as_it_was_at_the_call(shop: Any) -> None:
    """A batch list cleared and refilled after each call, a dict changed
    after it: each job has the data of its call (they were read at the
    commit), and a change that cannot be encoded no longer fails the
    commit's add."""
    from django.db import transaction

    queue = shop.queue
    with transaction.atomic():
        rows: list[Any] = []
        for batch in (["a", "b"], ["c"]):
            rows.extend(batch)
            shop.send_welcome.delay_on_commit(rows)
            rows.clear()
        payload: dict[str, Any] = {"who": "a"}
        queue.add_on_commit("audit", payload, dedup={"id": "audit-a"})
        payload["who"] = object()  # not encodable: the add at commit does not see it
    jobs = queue.get_jobs("waiting", asc=True)
    assert [j.data for j in jobs] == [{"args": [["a", "b"]], "kwargs": {}},
                                      {"args": [["c"]], "kwargs": {}}, {"who": "a"}]


def test_an_add_on_commit_follows_the_transaction_of_the_database_it_names(
    shop: Any, tmp_path: Path
) -> None:
    """In a transaction on another database than the default, the job was
    added at once and kept on its rollback (on_commit followed the default
    database alone, and there was no way to name another)."""
    from django.db import connections, transaction

    connections.settings["orders"] = {**connections.settings["default"],
                                      "NAME": str(tmp_path / "orders.sqlite3")}
    queue = shop.queue
    try:
        with pytest.raises(RuntimeError), transaction.atomic(using="orders"):
            shop.send_welcome.enqueue_on_commit(("x@example.com",), using="orders")
            queue.add_on_commit("audit", {"who": "x"}, using="orders")
            assert queue.get_job_counts("waiting") == {"waiting": 0}
            raise RuntimeError("payment failed: rolled back")
        assert queue.get_job_counts("waiting") == {"waiting": 0}
        with transaction.atomic(using="orders"):
            shop.send_welcome.enqueue_on_commit(kwargs={"email": "y@example.com"},
                                                using="orders", attempts=5)
            queue.add_on_commit("audit", {"who": "y"}, using="orders")
            with pytest.raises(TypeError, match="args must be a list or tuple"):
                shop.send_welcome.enqueue_on_commit("y@example.com", using="orders")
            # as add_on_commit: dependencies taken as ids now (a Job is not copied)
            first = queue.add("audit", {"who": "first"})
            shop.send_welcome.enqueue_on_commit(("z@example.com",), using="orders",
                                                depends_on=[first])
            with pytest.raises(ValueError, match="dedup cannot be combined"):
                shop.send_welcome.enqueue_on_commit(("z@example.com",), using="orders",
                                                    depends_on=[first], dedup={"id": "d"})
            assert queue.get_job_counts("waiting") == {"waiting": 1}  # the first alone
        first_again, sent, audit = queue.get_jobs("waiting", asc=True)
        assert first_again == first
        assert sent.data == {"args": [], "kwargs": {"email": "y@example.com"}}
        assert sent.opts["attempts"] == 5 and audit.data == {"who": "y"}
        (after,) = queue.get_jobs("waiting-children")
        assert after.data == {"args": ["z@example.com"], "kwargs": {}}
    finally:
        connections["orders"].close()
        del connections.settings["orders"]


def test_an_add_on_commit_may_depend_on_jobs(shop: Any) -> None:
    """``add_on_commit(..., depends_on=...)`` raised "unknown job options"
    (and a Job in it cannot be copied): it is checked now, and added with
    its dependencies at the commit."""
    from django.db import transaction

    queue = shop.queue
    first, second = (queue.add("audit", {"who": who}) for who in ("first", "second"))
    with transaction.atomic():
        queue.add_on_commit("audit", {"who": "after"},
                            depends_on=[first, (queue.name, second.id)])
        with pytest.raises(TypeError, match="depends_on takes"):
            queue.add_on_commit("audit", None, depends_on="not a list")
        with pytest.raises(ValueError, match="dedup cannot be combined"):
            queue.add_on_commit("audit", None, depends_on=[first], dedup={"id": "d"})
        assert queue.get_job_counts("waiting-children") == {"waiting-children": 0}
    (after,) = queue.get_jobs("waiting-children")
    assert after.data == {"who": "after"}
    assert sorted(after.get_dependencies().pending) == sorted(
        [f"{queue.name}:{first.id}", f"{queue.name}:{second.id}"])


def test_manage_py_jobq_worker_burst_runs_the_discovered_tasks(
    shop: Any, prefix: str, redis_url: str
) -> None:
    jobs = [shop.add.delay(n, 1) for n in range(4)] + [shop.send_welcome.delay("c@d.e")]
    # a process of its own, where only the app's discovery imports shop.tasks
    env = dict(os.environ, JOBQ_REDIS_URL=redis_url, JOBQ_PREFIX=prefix,
               DJANGO_SETTINGS_MODULE="mysite.settings",
               PYTHONPATH=os.pathsep.join([str(PROJECT), str(ROOT)]))
    done = subprocess.run(
        [sys.executable, "manage.py", "jobq_worker", "--burst", "--concurrency", "2",
         "--skip-checks"],  # the URL checks would import shop.views, hence its tasks
        cwd=PROJECT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    queue = shop.queue
    assert [queue.get_job_result(j.id) for j in jobs] == [
        1, 2, 3, 4, "welcome mail sent to c@d.e"]


def test_manage_py_jobq_worker_with_redis_down_says_so_in_one_line(prefix: str) -> None:
    """As `jobq worker`: exit 3 and the server named without its password,
    not "ready" and a traceback."""
    env = dict(os.environ, JOBQ_REDIS_URL="redis://:hunter2@127.0.0.1:1/0", JOBQ_PREFIX=prefix,
               DJANGO_SETTINGS_MODULE="mysite.settings",
               PYTHONPATH=os.pathsep.join([str(PROJECT), str(ROOT)]))
    done = subprocess.run(
        [sys.executable, "manage.py", "jobq_worker", "--burst", "--skip-checks"],
        cwd=PROJECT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 3, done.stderr
    assert done.stderr.strip().splitlines() == [
        "CommandError: jobq: cannot reach the Redis server at redis://:***@127.0.0.1:1/0: "
        "Error 111 connecting to 127.0.0.1:1. Connection refused."]
    assert "ready" not in done.stdout


def test_manage_py_jobq_worker_refused_by_redis_says_so_in_one_line(
    prefix: str, redis_url: str
) -> None:
    """A database the server does not have (or an ACL's NOPERM) was a
    thirty-line traceback; `jobq worker` says it in one line, exit 1."""
    env = dict(os.environ, JOBQ_REDIS_URL=f"redis://127.0.0.1:{urlsplit(redis_url).port}/999",
               JOBQ_PREFIX=prefix, DJANGO_SETTINGS_MODULE="mysite.settings",
               PYTHONPATH=os.pathsep.join([str(PROJECT), str(ROOT)]))
    done = subprocess.run(
        [sys.executable, "manage.py", "jobq_worker", "--burst", "--skip-checks"],
        cwd=PROJECT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.strip().splitlines()  # of a cluster's node: SELECT is not allowed
    assert line.startswith("CommandError: jobq: Redis error: ")


def test_manage_py_jobq_worker_refuses_a_queue_without_tasks(shop: Any) -> None:
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="no tasks for queue"):
        call_command("jobq_worker", "nothing-here", "--burst")


def test_system_checks_report_missing_malformed_and_unreachable(shop: Any) -> None:
    from django.test.utils import override_settings

    from jobq.contrib.django.checks import check_configuration

    assert check_configuration() == []
    with override_settings():
        from django.conf import settings

        del settings.JOBQ
        [missing] = check_configuration()
        assert missing.id == "jobq.W001" and "settings.JOBQ is missing" in missing.msg
    with override_settings(JOBQ={"URL": "redis://x"}):
        [bad] = check_configuration()
        assert bad.id == "jobq.E001" and "unknown keys ['URL']" in bad.msg
    with override_settings(JOBQ={"QUEUES": {"q": {"event_mode": "carrier pigeon"}}}):
        [bad] = check_configuration()
        assert bad.id == "jobq.E001" and "event_mode" in bad.msg
        assert bad.msg.startswith("settings.JOBQ, queue 'q': "), bad.msg  # as get_queue says
    # a prefix with no QUEUES to build a Queue from; an empty one was taken for 'jobq'
    for prefix in ("a b", "", 5):
        with override_settings(JOBQ={"PREFIX": prefix}):
            [bad] = check_configuration()
            assert bad.id == "jobq.E001", prefix
            assert bad.msg.startswith('settings.JOBQ["PREFIX"]: invalid prefix'), bad.msg
    with override_settings(JOBQ={"CONNECTION": "redis://:hunter2@127.0.0.1:1/0"}):
        [down] = check_configuration()
        assert down.id == "jobq.W002"
        assert "redis://:***@127.0.0.1:1/0" in down.msg and "hunter2" not in down.msg


def test_system_checks_say_a_refused_login(
    shop: Any, redis_url: str, redis_client: redis.Redis
) -> None:
    """A wrong password was "jobq cannot reach the Redis server"."""
    from django.test.utils import override_settings

    from jobq.contrib.django.checks import check_configuration

    redis_client.acl_setuser("jobq-django-login", enabled=True, passwords=["+right"],
                             commands=["+@all"], keys=["*"], channels=["*"])
    try:
        url = redis_url.replace("://", "://jobq-django-login:hunter2@", 1)  # any scheme
        with override_settings(JOBQ={"CONNECTION": url}):
            [refused] = check_configuration()
        assert refused.id == "jobq.W002" and "refused jobq's login" in refused.msg
        assert "PASSWORD@" in refused.hint and "hunter2" not in refused.msg
    finally:
        redis_client.acl_deluser("jobq-django-login")


@pytest.mark.parametrize("jobq", [
    {"QUEUES": {"q-bad": {"bogus": 1}}},
    {"QUEUES": {"q-bad": {"max_payload_bytes": "1MB"}}},
    {"CONNECTION": "htp://127.0.0.1:1/0"},
    {"CONNECTION": 6379},
])
def test_get_queue_of_malformed_settings_is_improperly_configured(
    jobq: dict[str, Any], shop: Any
) -> None:
    """As get_queue's docstring says (the Queue's own ValueError or
    TypeError came through, or redis-py's about URL schemes)."""
    from django.core.exceptions import ImproperlyConfigured
    from django.test.utils import override_settings

    from jobq.contrib.django import get_queue

    with override_settings(JOBQ=jobq):
        with pytest.raises(ImproperlyConfigured, match=r"settings\.JOBQ, queue 'q-bad'"):
            get_queue("q-bad")


def test_the_checks_run_with_manage_py_check(shop: Any) -> None:
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError
    from django.test.utils import override_settings

    call_command("check", "--tag", "jobq")  # configured and reachable: silent
    with override_settings(JOBQ={"URL": "redis://x"}):
        with pytest.raises(SystemCheckError, match=r"jobq\.E001"):
            call_command("check", "--tag", "jobq")


def test_the_example_project_under_gunicorn_with_a_manage_py_worker(
    redis_url: str, queue_name: str
) -> None:
    prefix = f"djg-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, JOBQ_REDIS_URL=redis_url, JOBQ_PREFIX=prefix, PYTHONUNBUFFERED="1",
               DJANGO_SETTINGS_MODULE="mysite.settings")
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT), str(ROOT)])
    worker = [sys.executable, "manage.py", "jobq_worker", "--concurrency", "4"]
    with gunicorn_with_worker(PROJECT, env, "mysite.wsgi:application", worker) as base:
        with ThreadPoolExecutor(max_workers=8) as pool:
            answers = list(pool.map(lambda n: _get(f"{base}/add/?a={n}&b={n}"), range(40)))
        assert _get(f"{base}/signup/?email=yes@example.com")[0] == 200
        assert _get(f"{base}/signup/?email=no@example.com&fail=1")[0] == 200
    bad = [(n, a) for n, a in enumerate(answers) if a[0] != 200 or a[1].get("result") != 2 * n]
    assert not bad, bad[:3]
    assert 1 <= len({body["pid"] for _, body in answers}) <= 2
    with Queue("default", connection=redis_url, prefix=prefix) as queue:
        welcomes = [j for j in queue.get_jobs(["waiting", "active", "completed"])
                    if j.name == "shop.tasks.send_welcome"]
        assert [j.data["args"] for j in welcomes] == [["yes@example.com"]]
        queue.obliterate(force=True)


class _User:
    """A request's user as the auth middleware sets it (this example project
    has no auth app: the view reads only these attributes)."""

    def __init__(self, staff: bool, authenticated: bool = True) -> None:
        self.is_authenticated = authenticated
        self.is_active = True
        self.is_staff = staff


def _dashboard_request(method: str, url: str, user: _User | None, **extra: Any) -> Any:
    from django.test import RequestFactory
    from django.urls import resolve

    factory = RequestFactory()
    request = getattr(factory, method)(url, **extra)
    if user is not None:
        request.user = user
    match = resolve(request.path)
    return match.func(request, *match.args, **match.kwargs)


def test_the_dashboard_mount_is_for_staff_only(shop: Any) -> None:
    import re
    from urllib.parse import urlencode

    shop.queue.add("audit", {"who": "<b>a</b>"})
    anonymous = _dashboard_request("get", "/jobq/", None)
    assert anonymous.status_code == 302 and "login" in anonymous["Location"]
    assert _dashboard_request("get", "/jobq/", _User(staff=False)).status_code == 403
    page = _dashboard_request("get", "/jobq/queue?q=default", _User(staff=True))
    assert page.status_code == 200
    body = page.content.decode()
    assert 'href="/jobq/jobs?q=default&amp;state=waiting"' in body
    assert page["Content-Security-Policy"].startswith("default-src 'none'")
    cookie = page.cookies["jobq_csrf"].value
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', body)
    assert token
    # an action, POSTed with the cookie and token of that page
    done = _dashboard_request(
        "post", "/jobq/action", _User(staff=True),
        data=urlencode({"csrf": token.group(1), "action": "pause", "q": "default"}),
        content_type="application/x-www-form-urlencoded", HTTP_COOKIE=f"jobq_csrf={cookie}",
    )
    assert done.status_code == 303 and done["Location"].startswith("/jobq/queue?q=default")
    assert shop.queue.is_paused()
    # another process of the site, with a dashboard app of its own, takes
    # the same form (its key was random per app: 403 at random under gunicorn)
    from django.apps import apps

    config = apps.get_app_config("jobq")
    first, config._dashboard = config._dashboard, None
    first.close()
    again = _dashboard_request(
        "post", "/jobq/action", _User(staff=True),
        data=urlencode({"csrf": token.group(1), "action": "resume", "q": "default"}),
        content_type="application/x-www-form-urlencoded", HTTP_COOKIE=f"jobq_csrf={cookie}",
    )
    assert again.status_code == 303 and config._dashboard is not first
    assert not shop.queue.is_paused()
    shop.queue.pause()
    refused = _dashboard_request("post", "/jobq/action", _User(staff=True),
                                 data=urlencode({"action": "resume", "q": "default"}),
                                 content_type="application/x-www-form-urlencoded",
                                 HTTP_COOKIE=f"jobq_csrf={cookie}")
    assert refused.status_code == 403 and shop.queue.is_paused()
    shop.queue.resume()


_DB_PROJECT = {
    "manage.py": (
        "import os\nimport sys\n\n"
        "os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'dbproj.settings')\n"
        "from django.core.management import execute_from_command_line\n\n"
        "execute_from_command_line(sys.argv)\n"
    ),
    "dbproj/__init__.py": "",
    "dbproj/settings.py": (
        "import os\n\n"
        "SECRET_KEY = 'test-only'\n"
        "INSTALLED_APPS = ['jobq.contrib.django', 'probe']\n"
        "DATABASES = {'default': {'ENGINE': 'django.db.backends.sqlite3',\n"
        "                         'NAME': os.environ['PROBE_DB']}}  # CONN_MAX_AGE 0\n"
        "USE_TZ = True\n"
        "JOBQ = {'CONNECTION': os.environ['JOBQ_REDIS_URL'],\n"
        "        'PREFIX': os.environ['JOBQ_PREFIX']}\n"
    ),
    "probe/__init__.py": "",
    "probe/tasks.py": (
        "from django.db import connection\n\n"
        "from jobq.contrib.django import get_queue\n\n"
        "queue = get_queue()\n\n\n"
        "@queue.task()\n"
        "def probe():\n"
        "    inherited = connection.connection is not None  # left open by a job before\n"
        "    with connection.cursor() as cursor:\n"
        "        cursor.execute('SELECT 1')\n"
        "    return inherited\n"
    ),
}


def test_manage_py_jobq_worker_handles_db_connections_as_requests(
    tmp_path: Path, redis_url: str, queue_name: str
) -> None:
    """A pool thread runs job after job: with CONN_MAX_AGE 0 (Django's
    default) each job gets a connection of its own, closed after it, as a
    request does; a connection kept for ever would outlive a database
    restart or idle timeout and fail the thread's later jobs."""
    for name, text in _DB_PROJECT.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    prefix = f"djdb-{queue_name[-8:]}"
    env = dict(os.environ, JOBQ_REDIS_URL=redis_url, JOBQ_PREFIX=prefix,
               PROBE_DB=str(tmp_path / "db.sqlite3"),
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    env.pop("DJANGO_SETTINGS_MODULE", None)
    with Queue("default", connection=redis_url, prefix=prefix) as queue:
        jobs = [queue.add("probe.tasks.probe", {"args": [], "kwargs": {}}) for _ in range(4)]
        done = subprocess.run(
            [sys.executable, "manage.py", "jobq_worker", "--burst", "--concurrency", "1",
             "--skip-checks"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
        )
        assert done.returncode == 0, done.stderr
        assert [queue.get_job_result(j.id) for j in jobs] == [False] * 4
        queue.obliterate(force=True)


def test_after_close_queues_the_tasks_add_to_the_queue_built_again(shop: Any) -> None:
    """close_queues() left every ``@get_queue().task()`` task bound to the
    queue it closed: the next ``delay`` raised ClosedError, and the queue
    built again had no tasks (``manage.py jobq_worker`` found none). (Last
    in this module: the example's ``tasks.queue``, kept from before, is set
    to the new queue here.)"""
    from jobq.contrib.django import close_queues, get_queue

    closed = shop.queue
    close_queues()
    job = shop.add.delay(2, 3)
    queue = get_queue()
    shop.queue = queue  # a Queue kept from before is closed, as documented
    assert queue is not closed and shop.add.queue is queue
    assert sorted(queue.tasks) == ["shop.tasks.add", "shop.tasks.send_welcome"]
    assert queue.get_job(job.id) is not None
    queue.drain()
