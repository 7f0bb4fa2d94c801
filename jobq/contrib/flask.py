"""jobq for Flask: ``jobq_ext = JobQ(app)`` (or ``JobQ()`` then
``jobq_ext.init_app(app)``).

Config: ``JOBQ_URL`` (None: ``$JOBQ_REDIS_URL``, else localhost),
``JOBQ_PREFIX`` (``"jobq"``), ``JOBQ_QUEUES`` (queue name to ``Queue``
options). ``jobq_ext.queue(name)`` is the app's shared Queue of that name in
this process; ``flask jobq worker [QUEUE...]`` runs the tasks of the app's
queues (``--import MODULE`` imports modules that define more)::

    app = Flask(__name__)
    jobq_ext = JobQ(app)

    @jobq_ext.queue().task()
    def send_mail(to): ...
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

import click
from flask import Flask, current_app
from flask.cli import with_appcontext

from jobq import Queue, _fork

__all__ = ["JobQ"]

_EXTENSION = "jobq"


class _AppQueues:
    """The shared queues of one app in this process."""

    def __init__(self, app: Flask) -> None:
        self.app = app
        self.queues: dict[str, Queue] = {}
        self.lock = threading.Lock()
        _fork.track(self)

    def _after_fork(self) -> None:
        """In a forked child (gunicorn --preload): a new lock, in case a
        parent's thread held it at the fork; the queues reset themselves."""
        self.lock = threading.Lock()

    def get(self, name: str) -> Queue:
        with self.lock:
            queue = self.queues.get(name)
            if queue is None:
                config = self.app.config
                options = dict((config.get("JOBQ_QUEUES") or {}).get(name, {}))
                queue = Queue(name, connection=config["JOBQ_URL"],
                              prefix=config["JOBQ_PREFIX"], **options)
                self.queues[name] = queue
            return queue

    def close(self) -> None:
        with self.lock:
            queues, self.queues = self.queues, {}
        for queue in queues.values():
            queue.close()


class JobQ:
    """The Flask extension: configuration, shared queues and ``flask jobq``."""

    def __init__(self, app: Flask | None = None) -> None:
        self.app = app
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Read the config (with its defaults) and add ``flask jobq``."""
        app.config.setdefault("JOBQ_URL", None)
        app.config.setdefault("JOBQ_PREFIX", "jobq")
        app.config.setdefault("JOBQ_QUEUES", {})
        app.extensions[_EXTENSION] = _AppQueues(app)
        app.cli.add_command(jobq_cli)

    def _state(self) -> _AppQueues:
        app = self.app if self.app is not None else current_app
        state: _AppQueues | None = app.extensions.get(_EXTENSION)
        if state is None:
            raise RuntimeError("JobQ is not initialised on this app: call init_app(app)")
        return state

    def queue(self, name: str = "default") -> Queue:
        """The app's shared Queue ``name`` in this process (built on first use,
        no I/O until its first call). Outside an app context, the app given
        to ``JobQ(app)``."""
        return self._state().get(name)

    def close(self) -> None:
        """Close and forget the app's shared queues (tests, shutdown)."""
        self._state().close()


@click.group("jobq", help="jobq workers for this app.")
def jobq_cli() -> None:
    """The ``flask jobq`` command group."""


@jobq_cli.command("worker")
@click.argument("queues", nargs=-1)
@click.option("--concurrency", "-c", default=4, show_default=True, type=click.IntRange(1),
              help="jobs run at once, per queue")
@click.option("--burst", is_flag=True, help="exit once no job is waiting or active")
@click.option("--import", "modules", multiple=True, metavar="MODULE",
              help="import a module that defines tasks (repeatable)")
@click.option("--name", default=None, help="worker name (default: HOST:PID)")
@with_appcontext
def worker_command(
    queues: tuple[str, ...], concurrency: int, burst: bool, modules: tuple[str, ...],
    name: str | None,
) -> None:
    """Run the tasks of the app's queues (every one with tasks, or those named)."""
    from jobq._serve import serve

    for module in modules:
        importlib.import_module(module)
    app: Any = current_app
    state: _AppQueues = app.extensions[_EXTENSION]
    with state.lock:
        with_tasks = {n: q for n, q in state.queues.items() if q.tasks}
    names = list(queues) or sorted(with_tasks)
    if not names:
        raise click.UsageError("no tasks found: decorate functions with jobq_ext.queue().task()")
    missing = [n for n in names if n not in with_tasks]
    if missing:
        raise click.UsageError(f"no tasks for queue(s) {', '.join(missing)}")
    serve(
        [(n, with_tasks[n].tasks) for n in names], connection=app.config["JOBQ_URL"],
        prefix=app.config["JOBQ_PREFIX"], concurrency=concurrency, name=name, burst=burst,
        on_ready=lambda: click.echo(f"jobq worker ready on {', '.join(names)}"),
    )
    click.echo("jobq worker stopped")
