"""jobq for Django: ``INSTALLED_APPS += ["jobq.contrib.django"]``.

Settings (all optional)::

    JOBQ = {
        "CONNECTION": "redis://localhost:6379/0",  # None: $JOBQ_REDIS_URL, else localhost
        "PREFIX": "jobq",
        "QUEUES": {"default": {}, "mail": {"default_job_options": {"attempts": 3}}},
    }

``get_queue(name)`` is the process's shared Queue of that name (built on
first use from the settings; Queue options from ``QUEUES[name]``). Tasks
live in each app's ``tasks`` module, which ``manage.py jobq_worker``
imports::

    from jobq.contrib.django import get_queue

    @get_queue().task()
    def send_welcome(user_id): ...

    send_welcome.delay_on_commit(user.id)   # added once the transaction commits
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jobq import Queue

__all__ = ["close_queues", "get_queue", "task"]


def _config() -> Any:
    from django.apps import apps
    from django.core.exceptions import ImproperlyConfigured

    if not apps.is_installed("jobq.contrib.django"):
        raise ImproperlyConfigured(
            "jobq.contrib.django is not in INSTALLED_APPS: add it to use get_queue()"
        )
    return apps.get_app_config("jobq")


def get_queue(name: str = "default") -> Queue:
    """The shared Queue ``name`` of this process (one connection pool and one
    event reader for every thread), built on first use from ``settings.JOBQ``.

    Raises:
        django.core.exceptions.ImproperlyConfigured: the app is not
            installed, or ``settings.JOBQ`` is malformed.
    """
    queue: Queue = _config().queue(name)
    return queue


def close_queues() -> None:
    """Close and forget this process's shared queues (tests; a process
    shutting down). The next ``get_queue`` builds them again; a queue with
    tasks is built again at once (no I/O), with the closed one's tasks,
    whose ``delay`` adds to it. A Queue kept from before (``queue =
    get_queue()`` in a module) is closed: call ``get_queue()`` again."""
    _config().close_queues()


def task(name: Any = None, *, queue: str = "default", **default_options: Any) -> Any:
    """``get_queue(queue).task(name, **default_options)``; bare, ``@task``
    makes the function a task of the default queue."""
    return get_queue(queue).task(name, **default_options)
