"""A one-module Django project whose view enqueues a job and waits for its
result, with the Queue built and its reader started at import (in
gunicorn's master with ``--preload``). Configured by $JOBQ_REDIS_URL and
$JOBQ_TEST_QUEUE."""

from __future__ import annotations

import os

import django
from django.conf import settings

settings.configure(
    DEBUG=False,
    SECRET_KEY="test-only-not-a-secret",
    ALLOWED_HOSTS=["127.0.0.1", "localhost"],
    ROOT_URLCONF=__name__,
    MIDDLEWARE=[],
    INSTALLED_APPS=[],
    DATABASES={},
    USE_TZ=True,
)
django.setup()

from django.core.wsgi import get_wsgi_application  # noqa: E402 (after settings)
from django.http import HttpRequest, JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402

from jobq import Queue  # noqa: E402
from tests.forking_apps import preload  # noqa: E402

queue = Queue(os.environ["JOBQ_TEST_QUEUE"], connection=os.environ["JOBQ_REDIS_URL"])
preload(queue)


def add(request: HttpRequest) -> JsonResponse:
    """Enqueue ``a + b`` (odd ``a``: removed on completion) and answer with it."""
    a, b = int(request.GET["a"]), int(request.GET["b"])
    job = queue.add("add", {"a": a, "b": b}, remove_on_complete=bool(a % 2))
    result = job.wait_until_finished(timeout=10)
    return JsonResponse({"a": a, "b": b, "result": result, "pid": os.getpid()})


urlpatterns = [path("add/", add)]
application = get_wsgi_application()
