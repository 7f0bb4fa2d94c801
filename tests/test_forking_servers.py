"""Real forking servers: a Flask app and a Django app (tests/forking_apps)
under gunicorn with ``--preload`` (the Queue and its reader are set up in
the master, before it forks two workers), sync, gthread and gevent workers
(the last monkey-patch ``threading`` after the fork), and under uWSGI's
default preforking (the same, but its workers are forked
without Python's fork hooks), served by a jobq worker process and hit with
a few hundred concurrent requests over loopback; every response is checked.

Every wait is bounded; the servers and the worker are stopped (killed at
worst) whatever happens.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.polling import until

ROOT = Path(__file__).resolve().parent.parent
REQUESTS = 240
CONCURRENCY = 16
APPS = {
    "flask": ("tests.forking_apps.flask_app:app", "/add"),
    "django": ("tests.forking_apps.django_app:application", "/add/"),
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _stop(process: subprocess.Popen[str], sig: int = signal.SIGTERM) -> str:
    """Stop a process (killed after 15 s); return its stderr. A server
    started in a session of its own (``start_new_session``) leaves no
    process of its group behind: a worker of a server killed at the
    timeout would live on."""
    if process.poll() is None:
        process.send_signal(sig)
    try:
        _, err = process.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        _, err = process.communicate(timeout=15)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    return err or ""


@pytest.fixture
def env(redis_url: str, queue_name: str) -> dict[str, str]:
    env = dict(os.environ, JOBQ_REDIS_URL=redis_url, JOBQ_TEST_QUEUE=queue_name,
               PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return env


@pytest.fixture
def worker(env: dict[str, str], redis_url: str, queue_name: str) -> Iterator[None]:
    """A jobq worker process serving the test's queue."""
    process = subprocess.Popen(
        [sys.executable, "-m", "jobq", "worker", "tests.forking_apps.tasks:add",
         "--queue", queue_name, "--url", redis_url, "--concurrency", "8"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )
    try:
        yield
    finally:
        err = _stop(process)
        assert process.returncode == 0, err


@contextlib.contextmanager
def gunicorn_with_worker(
    cwd: Path, env: dict[str, str], app: str, worker_argv: list[str]
) -> Iterator[str]:
    """Run a worker process and ``gunicorn --preload --workers 2`` (gthread)
    serving ``app``; yield the server's base URL; stop both and check they
    exited cleanly."""
    worker = subprocess.Popen(
        worker_argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "--preload", "--workers", "2", "--worker-class",
         "gthread", "--threads", "4", "--bind", f"127.0.0.1:{port}", "--timeout", "30",
         "--graceful-timeout", "5", "--log-level", "warning", app],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )
    try:
        until(lambda: server.poll() is not None or _accepts(port), timeout=30)
        assert server.poll() is None, _stop(server)
        yield f"http://127.0.0.1:{port}"
    finally:
        server_err = _stop(server)
        worker_err = _stop(worker)
    assert server.returncode == 0, server_err
    assert worker.returncode == 0, worker_err


def _get(url: str, timeout: float = 20) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, {"error": exc.read().decode("utf-8", "replace")[:500]}
    except OSError as exc:  # no answer in time: reported with the server's log
        return 0, {"error": f"{type(exc).__name__}: {exc}"}


def _dump_stacks(parent: int) -> None:
    """Have the workers of server ``parent`` write their stacks to its
    stderr (tests/forking_apps: ``DUMP_THREADS``, ``DUMP_GREENLETS``)."""
    from tests.forking_apps import DUMP_GREENLETS, DUMP_THREADS

    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rpartition(")")[2].split()
            if int(fields[1]) == parent:  # the field after the state: the parent's pid
                for sig in (DUMP_THREADS, DUMP_GREENLETS):
                    os.kill(int(stat.parent.name), sig)


def _uwsgi() -> str:
    """uWSGI's command (pyuwsgi, installed beside this Python)."""
    path = Path(sys.executable).with_name("uwsgi")
    if not path.exists():
        pytest.skip("uWSGI is not installed (pip install pyuwsgi)")
    return str(path)


def _server_command(server: str, port: int, target: str) -> list[str]:
    if server.startswith("uwsgi"):
        command = [_uwsgi(), "--master", "--die-on-term", "--processes", "2", "--threads", "4",
                   "--http-socket", f"127.0.0.1:{port}", "--module", target,
                   "--need-app", "--disable-logging", "--chdir", str(ROOT)]
        if server == "uwsgi-fork-hooks":
            command.append("--py-call-uwsgi-fork-hooks")  # a fork as Python's
        return command
    worker_class = server.removeprefix("gunicorn-")
    command = [sys.executable, "-m", "gunicorn", "--preload", "--workers", "2",
               "--worker-class", worker_class, "--bind", f"127.0.0.1:{port}",
               "--timeout", "30", "--graceful-timeout", "5", "--log-level", "warning"]
    if worker_class == "gthread":
        command += ["--threads", "8"]
    if worker_class == "gevent":
        command += ["--worker-connections", "100"]
    return [*command, target]


@pytest.mark.parametrize(
    "server_kind",
    ["gunicorn-sync", "gunicorn-gthread", "gunicorn-gevent", "uwsgi", "uwsgi-fork-hooks"])
@pytest.mark.parametrize("app", sorted(APPS))
def test_app_under_a_forking_server(
    app: str, server_kind: str, env: dict[str, str], worker: None
) -> None:
    """uWSGI by default forks its workers from C without Python's fork hooks
    (jobq resets itself at the first call instead). It also leaves the
    interpreter's state as it was, so a thread that held the GIL in the
    master at the fork would hold it for ever in the worker: under uWSGI
    the app starts no thread before the fork (it adds a job, and the
    master keeps that connection); with ``--py-call-uwsgi-fork-hooks`` (a
    fork as Python's own) it starts its reader in the master, as under
    gunicorn. tests/test_fork.py forks without the hooks from
    a thread that holds the GIL, the reader running."""
    target, route = APPS[app]
    if server_kind == "uwsgi":
        env = dict(env, JOBQ_TEST_PRELOAD="add")
    port = _free_port()
    server = subprocess.Popen(_server_command(server_kind, port, target), cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        until(lambda: server.poll() is not None or _accepts(port), timeout=30)
        assert server.poll() is None, _stop(server)
        base = f"http://127.0.0.1:{port}{route}"
        # unanswered requests give up by a common deadline, well within the
        # test's timeout: the workers' stacks are dumped, and reported, then
        deadline = time.monotonic() + 30

        def get(n: int) -> tuple[int, dict[str, Any]]:
            left = min(20.0, deadline - time.monotonic())
            return _get(f"{base}?a={n}&b={2 * n}", max(0.5, left))

        with ThreadPoolExecutor(max_workers=CONCURRENCY) as pool:
            answers = list(pool.map(get, range(REQUESTS)))
        if any(status == 0 for status, _ in answers):  # unanswered: where the workers are
            _dump_stacks(server.pid)
    finally:
        err = _stop(server)
    assert server.returncode == 0, err
    bad = [(n, status, body) for n, (status, body) in enumerate(answers)
           if status != 200 or body.get("result") != 3 * n or body.get("a") != n]
    if bad:
        print(err)  # whole, in the report's captured output (the stacks dumped above)
    assert not bad, (len(bad), bad[:5], err[-3000:])
    pids = {body["pid"] for _, body in answers}
    assert server.pid not in pids  # served by the forked workers, not the master
    assert 1 <= len(pids) <= 2


def test_the_dashboard_under_gunicorn_as_its_docs_run_it(
    env: dict[str, str], queue_name: str, redis_url: str
) -> None:
    """``gunicorn -w 4 'jobq.dashboard:create_app()'``, as docs/guide/dashboard.md
    gives it: a form served by one worker and posted to another got 403
    (each process keyed its CSRF tokens with a random key of its own), and
    any Host was answered (DNS rebinding: a page of another site whose name
    points at 127.0.0.1 could act). Two such servers here: a form of one
    posted to the other is what a busy server's workers do at random."""
    import http.client
    import re

    from jobq import Queue

    with Queue(queue_name, connection=redis_url) as queue:
        jobs = [queue.add("x") for _ in range(6)]
    ports = [_free_port(), _free_port()]
    servers = [subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "--workers", "2", "--bind", f"127.0.0.1:{port}",
         "--log-level", "warning", "jobq.dashboard:create_app()"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True) for port in ports]

    def request(port: int, method: str, path: str, host: str = "127.0.0.1", body: str = "",
                cookie: str = "") -> tuple[int, str, str]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        try:
            headers = {"Host": f"{host}:{port}", "Cookie": cookie,
                       "Content-Type": "application/x-www-form-urlencoded"}
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            return (response.status, response.read().decode(),
                    (response.getheader("Set-Cookie") or "").split(";")[0])
        finally:
            conn.close()

    try:
        for server, port in zip(servers, ports, strict=True):
            until(lambda: server.poll() is not None or _accepts(port), timeout=30)  # noqa: B023
            assert server.poll() is None, _stop(server)
        statuses = []
        for n, job in enumerate(jobs):  # a fresh browser each: a page of one, posted to the other
            served, posted = ports[n % 2], ports[1 - n % 2]
            _, page, cookie = request(served, "GET", f"/queue?q={queue_name}")
            token = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
            assert token and cookie, page[:500]
            form = f"csrf={token.group(1)}&action=remove&q={queue_name}&id={job.id}"
            statuses.append(request(posted, "POST", "/action", body=form, cookie=cookie)[0])
        assert statuses == [303] * len(jobs)
        assert request(ports[0], "GET", "/", host="attacker.example")[0] == 421
    finally:
        errors = [_stop(server) for server in servers]
    assert [server.returncode for server in servers] == [0, 0], errors
    with Queue(queue_name, connection=redis_url) as queue:
        assert queue.get_job_counts("waiting")["waiting"] == 0
