#!/usr/bin/env python
"""A Django project whose view enqueues a job and waits for its result.

    cd examples/django_app
    JOBQ_REDIS_URL=redis://localhost:6379/0 python manage.py jobq_worker --concurrency 4
    JOBQ_REDIS_URL=redis://localhost:6379/0 python manage.py runserver
    curl 'http://127.0.0.1:8000/add/?a=1&b=2'   # {"a": 1, "b": 2, "result": 3, "job": "1"}

- ``djapp/settings.py``: the ``JOBQ`` setting (URL, queue name, wait timeout);
- ``djapp/jobs.py``: the one ``Queue`` shared by every request thread, and
  the processors the worker runs;
- ``djapp/views.py``: ``/add/`` enqueues ``a + b`` and waits for the result;
- ``djapp/management/commands/jobq_worker.py``: ``manage.py jobq_worker``
  runs a worker (SIGINT / SIGTERM stop it gracefully, a second one forces).
"""

import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djapp.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
