"""The Django app of jobq: settings, shared queues and the system checks."""

from __future__ import annotations

import threading
from typing import Any

from django.apps import AppConfig
from django.core import checks

from jobq import Queue

from .conf import queue_options


class JobqConfig(AppConfig):
    """Holds the process's shared queues (one per name)."""

    name = "jobq.contrib.django"
    label = "jobq"
    verbose_name = "jobq"
    default_auto_field = "django.db.models.AutoField"

    def __init__(self, app_name: str, app_module: Any) -> None:
        super().__init__(app_name, app_module)
        self._queues: dict[str, Queue] = {}
        self._lock = threading.Lock()

    def ready(self) -> None:
        from .checks import check_configuration

        checks.register(check_configuration, "jobq")

    def queue(self, name: str) -> Queue:
        """The shared Queue ``name``, built on first use (no I/O)."""
        with self._lock:
            queue = self._queues.get(name)
            if queue is None:
                queue = Queue(name, **queue_options(name))
                self._queues[name] = queue
            return queue

    def queues(self) -> dict[str, Queue]:
        """The shared queues built so far, by name."""
        with self._lock:
            return dict(self._queues)

    def close_queues(self) -> None:
        """Close and forget the shared queues."""
        with self._lock:
            queues, self._queues = self._queues, {}
        for queue in queues.values():
            queue.close()
