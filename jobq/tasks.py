"""The decorator API: ``@queue.task`` turns a function into a Task.

A Task runs locally when called, and is added to its queue by ``delay`` /
``enqueue``: its arguments travel as msgpack in the job's data,
``{"args": [...], "kwargs": {...}}``, bound against the function's
signature first, so a wrong call fails with TypeError before anything is
written. ``queue.tasks`` (task name to processor) is what a Worker runs.
"""

from __future__ import annotations

import contextvars
import copy
import functools
import inspect
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from . import serializer
from .options import NO_DEDUP, JobOptions, refuse_one_job_defaults

if TYPE_CHECKING:
    from ._context import QueueContext
    from .job import Job
    from .queue import Queue

__all__ = ["Task", "current_job"]

R = TypeVar("R")

_current: contextvars.ContextVar[Job | None] = contextvars.ContextVar(
    "jobq_current_job", default=None
)


def current_job() -> Job | None:
    """The Job whose handler is running on this thread, or None outside a worker."""
    return _current.get()


def run_as_current(job: Job, handler: Callable[[Job], Any]) -> Any:
    """Call ``handler(job)`` with ``current_job()`` returning ``job``.

    Raises:
        TypeError: the handler returned an awaitable (an ``async def``
            handler that ``refuse_async`` could not see, such as an object
            with an async ``__call__``): nothing would ever await it; or a
            generator (of a generator function behind a wrapper).
    """
    token = _current.set(job)
    try:
        result = handler(job)
    finally:
        _current.reset(token)
    if inspect.isawaitable(result):
        close = getattr(result, "close", None)
        if callable(close):
            close()  # a coroutine never started: no "never awaited" warning
        raise TypeError(
            f"the handler of job {job.id!r} returned {type(result).__name__!r}, an awaitable: "
            f"{ASYNC_HINT}"
        )
    if inspect.isgenerator(result):  # a generator function that refuse_async could not see
        result.close()
        raise TypeError(
            f"the handler of job {job.id!r} returned a generator: its body never ran; "
            "return the result instead of yielding it"
        )
    return result


#: What to do instead of an async handler.
ASYNC_HINT = (
    "jobq runs plain functions on worker threads, and never awaits; "
    "wrap the coroutine in a plain function: def handler(job): return asyncio.run(work(job))"
)


def refuse_async(func: Callable[..., Any], what: str) -> None:
    """Raise TypeError when ``func`` is an ``async def`` function or a
    generator function (or an object whose ``__call__`` is one): a worker
    would get a coroutine or a generator back, and the body would never run."""
    call = getattr(func, "__call__", None)  # noqa: B004 (an object's async __call__)
    name = getattr(func, "__qualname__", None) or type(func).__qualname__
    if (inspect.iscoroutinefunction(func) or inspect.isasyncgenfunction(func)
            or (not inspect.isroutine(func) and inspect.iscoroutinefunction(call))):
        raise TypeError(f"{what} is an async function ({name}): {ASYNC_HINT}")
    if inspect.isgeneratorfunction(func) or (
            not inspect.isroutine(func) and inspect.isgeneratorfunction(call)):
        raise TypeError(f"{what} is a generator function ({name}): a worker would get a "
                        "generator back and its body would never run; return the result "
                        "instead of yielding it")


def task_function(func: Callable[..., R]) -> Callable[..., R]:
    """The function a task decorator registers: of a task (decorators
    stacked, one task on each queue), its function; a Task wrapping a Task
    copied the inner one's attributes over its own (its queue, name and
    options) and added to the inner task's queue."""
    while isinstance(func, Task):
        func = func.func
    return func


def _on_commit(action: Callable[[], Any], using: str | None) -> None:
    """Run ``action`` once the current Django transaction commits (at once
    outside a transaction; never when it rolls back)."""
    try:
        from django.core.exceptions import ImproperlyConfigured
        from django.db import transaction
    except ImportError as exc:  # pragma: no cover - needs Django absent
        raise RuntimeError("*_on_commit needs Django (pip install 'jobq[django]')") from exc
    try:
        transaction.on_commit(action, using=using)
    except ImproperlyConfigured as exc:  # Django installed, no project (a Flask app's)
        raise RuntimeError(
            "*_on_commit follows a Django project's transaction, and Django is not set up "
            f"for it ({exc}); outside Django, add the job with delay() / add()"
        ) from exc


def _frozen(
    queue: Any, name: str, data: Any, options: Mapping[str, Any], depends: bool = False
) -> Any:
    """``data`` of an add to be made at commit, as it is now: checked and
    encoded now (bad data fails here, not after the commit, when the job
    would be lost), then decoded again, so that a change the caller makes
    to its objects meanwhile (a list cleared and refilled for the next
    batch) does not reach the job. ``depends``: the add has a depends_on."""
    new, _ = queue._prepare(name, data, options)
    if depends and new.dedup != NO_DEDUP:  # as add refuses it
        raise ValueError("dedup cannot be combined with depends_on")
    return serializer.decode(new.data, "job data")


def _module_name(func: Callable[..., Any]) -> str:
    """The module part of a task's default name. A script run as
    ``python nightly.py`` (or ``python -m pkg.nightly``) names its module
    ``__main__``, while a worker imports it as ``nightly``: both must agree.
    A script in a package below the working directory (``python
    app/nightly.py``, ``app/__init__.py`` beside it) is ``app.nightly``, as
    ``python -m app.nightly`` names it and a worker started there imports it
    (it was ``nightly``: every job failed with "no processor"); one run
    from its own folder is ``nightly``, whatever packages hold it."""
    module = str(func.__module__)
    if module != "__main__":
        return module
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        return str(spec.name).removesuffix(".__main__")
    path = getattr(main, "__file__", None)
    if not path:
        return module
    name: str = os.path.splitext(os.path.basename(path))[0]
    try:
        here = os.getcwd()
        parts = os.path.relpath(os.path.abspath(path), here).split(os.sep)
    except (OSError, ValueError):  # no working directory, another drive
        return name
    packages = parts[:-1]
    if packages and all(p.isidentifier() for p in packages) and all(
            os.path.isfile(os.path.join(here, *packages[:i], "__init__.py"))
            for i in range(1, len(packages) + 1)):
        return ".".join([*packages, name])
    return name


def task_name_of(func: Callable[..., Any], name: str | None) -> str:
    """A task's job name: ``name``, else ``"<module>.<qualname>"``; checked."""
    from ._adding import job_name

    if name is None and not (isinstance(getattr(func, "__module__", None), str)
                             and isinstance(getattr(func, "__qualname__", None), str)):
        # a partial, a callable object, a builtin's method
        raise TypeError(f"{func!r} has no module and name to name its task by: pass name=")
    # a name given is checked as given ("" is refused, not the default)
    task_name = f"{_module_name(func)}.{func.__qualname__}" if name is None else name
    job_name(task_name)
    return task_name


class Task(Generic[R]):
    """A function registered on a queue under a job name.

    Calling the task runs the function here and now; ``delay`` and
    ``enqueue`` add a job that a worker runs with the same arguments.
    """

    def __init__(
        self, queue: Queue | None, func: Callable[..., R], name: str, options: Mapping[str, Any]
    ) -> None:
        # first: it copies the function's __dict__, whose keys (a "name" set
        # by another decorator) must not replace the task's own
        functools.update_wrapper(self, func)
        self._queue = queue
        self.func = func
        self.name = name
        # deep: a backoff dict the caller changes later is not the task's
        self.options = copy.deepcopy(dict(options))
        # the signature of what the worker calls: a decorator's wrapper, not
        # the function under it (its __wrapped__), whose arguments may differ
        self._signature = inspect.signature(func, follow_wrapped=False)

    @property
    def queue(self) -> Queue:
        """The queue that ``delay`` and ``enqueue`` add to."""
        assert self._queue is not None
        return self._queue

    def __repr__(self) -> str:
        return f"<Task {self.name!r} on queue {self.queue.name!r}>"

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        return self.func(*args, **kwargs)

    def _data(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        self._signature.bind(*args, **kwargs)  # TypeError, as a call would raise
        return {"args": list(args), "kwargs": dict(kwargs)}

    def delay(self, *args: Any, **kwargs: Any) -> Job:
        """Add a job that runs the task with these arguments; return it.

        Raises:
            TypeError: the arguments do not fit the function's signature.
            SerializationError: an argument is not msgpack-encodable.
        """
        return self.queue.add(self.name, self._data(args, kwargs), **self.options)

    def enqueue(
        self,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Job:
        """Add a job with these arguments and job options (``delay``,
        ``priority``, ``attempts``, ...: those of ``Queue.add``), which
        override the task's defaults; return it.

        Raises:
            TypeError: ``args`` is not a list or tuple (a lone string, say:
                ``args=("a")`` is not a tuple), ``kwargs`` not a mapping, or
                they do not fit the function's signature.
            SerializationError: an argument is not msgpack-encodable.
        """
        return self.queue.add(self.name, self._enqueued(args, kwargs, options),
                              **{**self.options, **options})

    def _enqueued(self, args: Any, kwargs: Any, options: Mapping[str, Any]) -> dict[str, Any]:
        """``enqueue``'s job data, its arguments checked."""
        if not isinstance(args, (list, tuple)):
            raise TypeError(f"args must be a list or tuple, not {type(args).__name__} "
                            "(one argument: args=(value,))")
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise TypeError(f"kwargs must be a mapping, not {type(kwargs).__name__}")
        if "data" in options:  # the job's data is the task's arguments
            raise TypeError("a task's job data is its arguments: pass args= and kwargs=, "
                            "not data=")
        return self._data(args, kwargs or {})

    def delay_on_commit(self, *args: Any, **kwargs: Any) -> None:
        """As ``delay``, once the current transaction of Django's default
        database commits (nothing is added when it rolls back; for another
        database, ``enqueue_on_commit(..., using=alias)``). The arguments are
        checked now: against the signature, and encoded, so that bad data
        fails here and not after the commit, when the job would be lost; the
        job gets them as they are now (a list changed after the call is
        not)."""
        data = _frozen(self.queue, self.name, self._data(args, kwargs), self.options)
        _on_commit(lambda: self.queue.add(self.name, data, **self.options), None)

    def enqueue_on_commit(
        self,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        using: str | None = None,
        **options: Any,
    ) -> None:
        """As ``enqueue``, once the current transaction of Django's database
        ``using`` commits (None: the default database; nothing is added when
        it rolls back); checked now, as ``delay_on_commit`` is.

        Raises:
            TypeError, SerializationError: as ``enqueue``.
        """
        data = self._enqueued(args, kwargs, options)
        self.queue.add_on_commit(self.name, data, using=using, **{**self.options, **options})

    def process(self, job: Job) -> R:
        """Run the task for a job added by ``delay`` / ``enqueue`` (the
        processor a Worker calls)."""
        data = job.data
        if not isinstance(data, Mapping):
            raise TypeError(f"job {job.id!r} of task {self.name!r} has no args/kwargs data")
        args = data.get("args") or []
        kwargs = data.get("kwargs") or {}
        return self.func(*args, **kwargs)


class QueueTasks:
    """``task`` and ``tasks`` of a Queue (a mixin)."""

    _tasks: dict[str, Task[Any]]
    _context: QueueContext

    @overload
    def task(self, name: Callable[..., R], /) -> Task[R]: ...

    @overload
    def task(
        self, name: str | None = None, **default_options: Any
    ) -> Callable[[Callable[..., R]], Task[R]]: ...

    def task(self, name: Any = None, **default_options: Any) -> Any:
        """Decorate a function as a task of this queue: ``@queue.task``, or
        ``@queue.task(name, **options)``.

        Args:
            name: the job name (default ``"<module>.<qualname>"``; in a
                script run as ``python nightly.py``, the module is
                ``nightly``, as a worker that imports it names it; run as
                ``python app/nightly.py`` in package ``app``, ``app.nightly``).
            default_options: job options of every job of the task (those of
                ``Queue.add``); ``enqueue`` may override them.

        Raises:
            ValueError: the name is taken by another function, or a bad
                option (``job_id`` and ``dedup`` among them: every delay()
                would be one job; give them to ``enqueue``).
        """
        JobOptions.parse(default_options)  # fail at import time, not at delay()
        refuse_one_job_defaults(default_options, "a task")

        def decorate(func: Callable[..., R]) -> Task[R]:
            func = task_function(func)
            refuse_async(func, "task")
            task_name = task_name_of(func, name)
            existing = self._tasks.get(task_name)
            if existing is not None and existing.func is not func:
                raise ValueError(
                    f"queue {self._context.name!r} has a task named {task_name!r} already"
                )
            task = Task(self, func, task_name, default_options)  # type: ignore[arg-type]
            self._tasks[task_name] = task
            return task

        if callable(name):  # used bare: the function itself, named by default
            func, name = name, None
            return decorate(func)
        return decorate

    def _take_tasks(self, old: QueueTasks) -> None:
        """Take the tasks of ``old``, a queue of this name closed by a
        framework's ``close_queues`` and built again as this one: they add
        to this queue from now on (they were bound to the closed one)."""
        for name, task in old._tasks.items():
            if name not in self._tasks:
                task._queue = self  # type: ignore[assignment]
                self._tasks[name] = task

    @property
    def tasks(self) -> dict[str, Callable[[Job], Any]]:
        """The registered tasks: job name to processor, for a ``Worker``."""
        return {name: task.process for name, task in self._tasks.items()}

    def add_on_commit(
        self, name: str, data: Any = None, *, using: str | None = None, **options: Any
    ) -> None:
        """``add`` once the current transaction of Django's database
        ``using`` commits (None: the default database; nothing when it rolls
        back: a job added in a transaction on another database without
        ``using`` was added at once, and kept on its rollback). Data and
        options are checked now, and taken as they are now."""
        queue: Any = self
        depends_on = options.pop("depends_on", None)
        if depends_on is not None:  # checked now, as (queue, id) pairs (a Job is not copied)
            from .flow import dependency_refs
            from .sharding import ShardedQueue, flows_refused

            if isinstance(queue, ShardedQueue):
                raise flows_refused(queue.name)
            depends_on = dependency_refs(queue, depends_on)
        data = _frozen(queue, name, data, options, depends_on is not None)
        options = copy.deepcopy(options)  # a dedup dict changed later is not this add's
        if depends_on is not None:
            options["depends_on"] = depends_on
        _on_commit(lambda: queue.add(name, data, **options), using)
