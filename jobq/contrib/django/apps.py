"""The Django app of jobq: settings, shared queues and the system checks."""

from __future__ import annotations

import hashlib
import hmac
import threading
from typing import TYPE_CHECKING, Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from jobq import Queue, _fork

from .conf import jobq_settings, queue_options

if TYPE_CHECKING:
    from jobq.dashboard import Dashboard


def _dashboard_secret() -> bytes:
    """The key of the dashboard's CSRF tokens: the same in every process of
    the site (a form served by one is posted to another), from SECRET_KEY."""
    key = str(settings.SECRET_KEY).encode("utf-8", "surrogatepass")
    return hmac.new(key, b"jobq.dashboard.csrf", hashlib.sha256).digest()


class JobqConfig(AppConfig):
    """Holds the process's shared queues (one per name)."""

    name = "jobq.contrib.django"
    label = "jobq"
    verbose_name = "jobq"
    default_auto_field = "django.db.models.AutoField"

    def __init__(self, app_name: str, app_module: Any) -> None:
        super().__init__(app_name, app_module)
        self._queues: dict[str, Queue] = {}
        self._dashboard: Dashboard | None = None
        self._lock = threading.Lock()
        _fork.track(self)

    def _after_fork(self) -> None:
        """In a forked child (gunicorn --preload): a new lock, in case a
        parent's thread held it at the fork; the queues reset themselves."""
        self._lock = threading.Lock()

    def ready(self) -> None:
        from .checks import check_configuration

        checks.register(check_configuration, "jobq")

    def queue(self, name: str) -> Queue:
        """The shared Queue ``name``, built on first use (no I/O)."""
        with self._lock:
            queue = self._queues.get(name)
            if queue is None:
                try:
                    queue = Queue(name, **queue_options(name))
                except (ValueError, TypeError) as exc:  # a bad URL or option
                    raise ImproperlyConfigured(f"settings.JOBQ, queue {name!r}: {exc}") from exc
                self._queues[name] = queue
            return queue

    def queues(self) -> dict[str, Queue]:
        """The shared queues built so far, by name."""
        with self._lock:
            return dict(self._queues)

    def dashboard(self) -> Dashboard:
        """The process's dashboard app (``jobq.contrib.django.urls``), made on first use."""
        with self._lock:
            if self._dashboard is None:
                from jobq.dashboard import create_app

                conf = jobq_settings()
                # behind Django's own ALLOWED_HOSTS check, and its staff check
                self._dashboard = create_app(conf["CONNECTION"], conf["PREFIX"],
                                             secret=_dashboard_secret(), allowed_hosts="*")
            return self._dashboard

    def close_queues(self) -> None:
        """Close and forget the shared queues (and the dashboard app). A
        queue with tasks is built again at once (no I/O), with its tasks:
        they were bound to the closed one."""
        with self._lock:
            queues, self._queues = self._queues, {}
            dashboard, self._dashboard = self._dashboard, None
        for name, queue in queues.items():
            queue.close()
            if queue.tasks:
                self.queue(name)._take_tasks(queue)
        if dashboard is not None:
            dashboard.close()
