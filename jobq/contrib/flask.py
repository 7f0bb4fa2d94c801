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

With an application factory, declare tasks on the extension, before any app
exists: ``@jobq_ext.task(queue="mail")``. Such a task adds to the queue of
the current app (or of the app given to ``JobQ(app)``), and every app that
``init_app`` set up runs it in ``flask jobq worker``, each job inside an
application context of the app (``current_app``, ``g`` and whatever else
needs one work in a task; its teardown runs after each job)::

    jobq_ext = JobQ()                      # extensions.py

    @jobq_ext.task()                       # tasks.py
    def send_mail(to): ...

    def create_app():                      # app.py
        app = Flask(__name__)
        jobq_ext.init_app(app)
        return app
"""

from __future__ import annotations

import functools
import importlib
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any, overload

import click
import redis
from flask import Flask, current_app, has_app_context
from flask.cli import with_appcontext

from jobq import Queue, _fork
from jobq.errors import JobqError
from jobq.job import Job
from jobq.options import JobOptions, refuse_one_job_defaults
from jobq.tasks import R, Task, refuse_async, task_function, task_name_of

__all__ = ["JobQ", "AppTask"]

_EXTENSION = "jobq"


def _check_config(config: Mapping[str, Any]) -> None:
    """Build (no I/O) and close each configured queue, and the default one:
    a bad value fails ``init_app``."""
    queues = config.get("JOBQ_QUEUES") or {}
    if not isinstance(queues, Mapping) or not all(
        isinstance(k, str) and isinstance(v, Mapping) for k, v in queues.items()
    ):
        raise TypeError("JOBQ_QUEUES must map queue names to dicts of Queue options, "
                        f"not {queues!r}")
    for name in {"default", *queues}:
        options = dict(queues.get(name, {}))
        for reserved, setting in (("connection", "JOBQ_URL"), ("prefix", "JOBQ_PREFIX")):
            if reserved in options:
                raise ValueError(f"JOBQ_QUEUES[{name!r}] may not set {reserved!r}: "
                                 f"use {setting}")
        try:
            Queue(name, connection=config["JOBQ_URL"], prefix=config["JOBQ_PREFIX"],
                  **options).close()
        except (ValueError, TypeError) as exc:
            error = TypeError if isinstance(exc, TypeError) else ValueError
            raise error(f"jobq config, queue {name!r}: {exc}") from exc


class _AppQueues:
    """The shared queues of one app in this process."""

    def __init__(self, app: Flask, declared: list[AppTask[Any]]) -> None:
        self.app = app
        self.declared = declared  # the extension's tasks (JobQ.task), shared
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
                self._register(queue)
            return queue

    def _register(self, queue: Queue) -> None:
        """Give ``queue`` the extension's tasks declared for its name."""
        for task in list(self.declared):
            if task.queue_name == queue.name:
                queue.task(task.name, **task.options)(task.func)

    def adopt(self, task: AppTask[Any]) -> None:
        """Give an extension's task to this app's queue of its name at once
        when that queue is built already (else ``get`` does when it builds
        it). Raises ValueError when the queue has a task of that name of
        another function; given later, a task of the queue's own
        (``queue.task``) of that name was taken, and a worker of the queue
        ran one function for the other's jobs."""
        with self.lock:
            queue = self.queues.get(task.queue_name)
        if queue is not None:
            queue.task(task.name, **task.options)(task.func)

    def with_tasks(self) -> dict[str, Queue]:
        """The app's queues that have tasks, those of the extension's
        declared tasks included (built now if need be)."""
        for name in {task.queue_name for task in self.declared}:
            self._register(self.get(name))  # declared after the queue was built
        with self.lock:
            return {n: q for n, q in self.queues.items() if q.tasks}

    def close(self) -> None:
        with self.lock:
            queues, self.queues = self.queues, {}
        for name, queue in queues.items():
            queue.close()
            if queue.tasks:  # built again at once (no I/O): its tasks were bound to it
                self.get(name)._take_tasks(queue)


class JobQ:
    """The Flask extension: configuration, shared queues and ``flask jobq``."""

    def __init__(self, app: Flask | None = None) -> None:
        self.app = app
        self._declared: list[AppTask[Any]] = []
        self._states: weakref.WeakSet[_AppQueues] = weakref.WeakSet()  # of init_app's apps
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Read the config (with its defaults), check it, and add ``flask jobq``.

        Raises:
            ValueError, TypeError: ``JOBQ_QUEUES`` is not a dict of dicts of
                ``Queue`` options (without ``connection`` or ``prefix``), or
                a URL, prefix or option is bad: at start, not at the first
                request.
        """
        app.config.setdefault("JOBQ_URL", None)
        app.config.setdefault("JOBQ_PREFIX", "jobq")
        app.config.setdefault("JOBQ_QUEUES", {})
        _check_config(app.config)
        state = app.extensions[_EXTENSION] = _AppQueues(app, self._declared)
        self._states.add(state)
        app.cli.add_command(jobq_cli)

    def _state(self) -> _AppQueues:
        # the current app's (set up by init_app), else the app of JobQ(app)
        if not has_app_context() and self.app is None:
            raise RuntimeError("no Flask app: use the task or queue in an app context (a "
                               "factory's app), or give the app to JobQ(app)")
        app: Any = current_app if has_app_context() else self.app
        state: _AppQueues | None = app.extensions.get(_EXTENSION)
        if state is None:
            raise RuntimeError("JobQ is not initialised on this app: call init_app(app)")
        return state

    def queue(self, name: str = "default") -> Queue:
        """The app's shared Queue ``name`` in this process (built on first use,
        no I/O until its first call). Outside an app context, the app given
        to ``JobQ(app)``."""
        return self._state().get(name)

    @overload
    def task(self, name: Callable[..., R], /) -> AppTask[R]: ...

    @overload
    def task(
        self, name: str | None = None, *, queue: str = "default", **default_options: Any
    ) -> Callable[[Callable[..., R]], AppTask[R]]: ...

    def task(self, name: Any = None, *, queue: str = "default", **default_options: Any) -> Any:
        """Decorate a function as a task of the app's queue ``queue``, with no
        app needed yet (an application factory calls ``init_app`` later):
        ``@jobq_ext.task``, or ``@jobq_ext.task(name, queue=..., **options)``.

        As ``Queue.task`` (``name``, job options), but the task adds to the
        queue of the current app, or of the app given to ``JobQ(app)``;
        ``flask jobq worker`` runs it for every app set up by ``init_app``.

        Raises:
            ValueError: the name is taken on that queue by another
                function, or a bad option.
        """
        JobOptions.parse(default_options)  # fail at import time, not at delay()
        refuse_one_job_defaults(default_options, "a task")

        def decorate(func: Callable[..., R]) -> AppTask[R]:
            func = task_function(func)
            refuse_async(func, "task")
            task_name = task_name_of(func, name)
            for task in self._declared:
                if task.queue_name == queue and task.name == task_name and task.func is not func:
                    raise ValueError(f"queue {queue!r} has a task named {task_name!r} already")
            declared = AppTask(self, queue, func, task_name, default_options)
            for state in list(self._states):  # the apps whose queue is built already
                state.adopt(declared)
            self._declared.append(declared)
            return declared

        if callable(name):  # used bare: the function itself, named by default
            func, name = name, None
            return decorate(func)
        return decorate

    def close(self) -> None:
        """Close and forget the app's shared queues (tests, shutdown). A
        queue with tasks is built again at once (no I/O), with the closed
        one's tasks (``@jobq_ext.queue(name).task()`` ones included: their
        ``delay`` adds to it); a Queue kept from before is closed."""
        self._state().close()


class AppTask(Task[R]):
    """A task declared on the extension (``JobQ.task``): its queue is the
    current app's queue of that name, looked up at each ``delay``."""

    def __init__(
        self, ext: JobQ, queue_name: str, func: Callable[..., R], name: str,
        options: Mapping[str, Any],
    ) -> None:
        super().__init__(None, func, name, options)
        self.queue_name = queue_name
        self._ext = ext

    @property
    def queue(self) -> Queue:
        """The current app's queue of this task (outside an app context, the
        app given to ``JobQ(app)``).

        Raises:
            RuntimeError: no app (outside an app context of a factory's app),
                or ``init_app`` was not called on it.
        """
        return self._ext.queue(self.queue_name)

    def __repr__(self) -> str:
        return f"<AppTask {self.name!r} on the app's queue {self.queue_name!r}>"


def _in_app_context(app: Flask, process: Callable[[Job], Any]) -> Callable[[Job], Any]:
    """``process`` run inside an application context of ``app``: a worker's
    pool threads have none of their own, and its teardown (a database
    session's removal, say) runs after each job, as after a request."""

    @functools.wraps(process)
    def run(job: Job) -> Any:
        with app.app_context():
            return process(job)

    return run


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
    with_tasks = state.with_tasks()
    names = list(queues) or sorted(with_tasks)
    if not names:
        raise click.UsageError(
            "no tasks found: decorate functions with jobq_ext.task() or jobq_ext.queue().task()")
    missing = [n for n in names if n not in with_tasks]
    if missing:
        raise click.UsageError(f"no tasks for queue(s) {', '.join(missing)}")
    real_app = app._get_current_object()
    try:
        serve(
            [(n, {task: _in_app_context(real_app, process)
                  for task, process in with_tasks[n].tasks.items()}) for n in names],
            connection=app.config["JOBQ_URL"],
            prefix=app.config["JOBQ_PREFIX"], concurrency=concurrency, name=name, burst=burst,
            on_ready=lambda: click.echo(f"jobq worker ready on {', '.join(names)}"),
        )
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        click.echo(f"jobq: {exc}", err=True)  # it names the server, without its password
        raise SystemExit(3) from None  # as `jobq worker`
    except redis.exceptions.RedisError as exc:  # reached, and refused: NOPERM, a db...
        click.echo(f"jobq: Redis error: {exc}", err=True)
        raise SystemExit(1) from None
    except JobqError as exc:  # e.g. a shard's name, or another shard count
        click.echo(f"jobq: {exc}", err=True)
        raise SystemExit(1) from None
    click.echo("jobq worker stopped")
