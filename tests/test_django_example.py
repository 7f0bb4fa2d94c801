"""The Django example (examples/django_app): its view through Django's test
client, its ``manage.py jobq_worker`` command in a subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

PROJECT = Path(__file__).resolve().parent.parent / "examples" / "django_app"
WAIT = 20.0


@pytest.fixture
def django_project(redis_url: str, queue_name: str) -> Iterator[ModuleType]:
    """Django set up on the example's settings, pointed at this test's queue."""
    pytest.importorskip("django")
    import django
    from django.test.utils import override_settings

    sys.path.insert(0, str(PROJECT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djapp.settings")
    try:
        django.setup()
        from djapp import jobs

        setting = {"URL": redis_url, "QUEUE": queue_name, "WAIT_TIMEOUT": WAIT}
        with override_settings(JOBQ=setting):
            try:
                yield jobs
            finally:
                jobs.close_queue()
    finally:
        sys.path.remove(str(PROJECT))


def test_view_enqueues_and_waits_for_the_management_command_worker(
    django_project: ModuleType, redis_url: str, queue_name: str
) -> None:
    from django.test import Client

    env = dict(os.environ, JOBQ_REDIS_URL=redis_url, JOBQ_QUEUE=queue_name,
               PYTHONUNBUFFERED="1")
    env.pop("DJANGO_SETTINGS_MODULE", None)
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "jobq_worker", "--concurrency", "2"], cwd=PROJECT,
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        client = Client()
        for a, b in [(1, 2), (20, 22)]:
            response = client.get("/add/", {"a": a, "b": b})
            assert response.status_code == 200, response.content
            body = response.json()
            assert (body["a"], body["b"], body["result"]) == (a, b, a + b)
        assert client.get("/add/", {"a": "x"}).status_code == 400
        queue = django_project.get_queue()
        assert queue is django_project.get_queue()  # one shared Queue
        assert queue.get_job_counts("completed") == {"completed": 2}
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=WAIT)
        assert worker.returncode == 0, err
        assert f"jobq worker ready on {queue_name}" in out
        assert "jobq worker stopped" in out
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate(timeout=WAIT)
