"""Settings of the example project: no database, one jobq queue."""

import os

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-a-secret")
DEBUG = False
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]
INSTALLED_APPS = ["djapp"]  # an app, so that manage.py finds jobq_worker
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "djapp.urls"
DATABASES: dict[str, dict[str, str]] = {}
USE_TZ = True

#: jobq: where Redis is (None: $JOBQ_REDIS_URL, else localhost), the queue,
#: and how long a request waits for its job.
JOBQ = {
    "URL": os.environ.get("JOBQ_REDIS_URL"),
    "QUEUE": os.environ.get("JOBQ_QUEUE", "django-add"),
    "WAIT_TIMEOUT": 10.0,
}
