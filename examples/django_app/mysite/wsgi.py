"""WSGI entry point: ``gunicorn mysite.wsgi`` (``--preload`` is fine: jobq's
queues are fork-safe)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
application = get_wsgi_application()
