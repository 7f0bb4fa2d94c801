"""Settings of the example project: the jobq app, one app with tasks."""

import os

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-a-secret")
DEBUG = False
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]
INSTALLED_APPS = ["jobq.contrib.django", "shop"]
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "mysite.urls"
WSGI_APPLICATION = "mysite.wsgi.application"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("DJANGO_SQLITE", ":memory:"),
    }
}
USE_TZ = True

JOBQ = {
    "CONNECTION": os.environ.get("JOBQ_REDIS_URL"),  # None: redis://localhost:6379/0
    "PREFIX": os.environ.get("JOBQ_PREFIX", "jobq"),
    "QUEUES": {"default": {"default_job_options": {"remove_on_complete": 1000}}},
}
