"""The decorator API: @queue.task, delay / enqueue, queue.tasks, current_job."""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import jobq
from jobq import Job, Queue, SerializationError, Worker
from jobq.tasks import Task

WAIT = 20.0


def test_a_task_is_added_run_by_a_worker_and_its_result_awaited(queue: Queue) -> None:
    @queue.task()
    def greet(name: str, *, punctuation: str = "!") -> str:
        return f"hello {name}{punctuation}"

    assert greet.name.startswith(f"{__name__}.test_a_task_is_added")
    assert greet.name.endswith(".<locals>.greet")
    assert greet("here") == "hello here!"  # a plain call runs it locally
    job = greet.delay("you", punctuation="?")
    assert job.name == greet.name
    assert job.data == {"args": ["you"], "kwargs": {"punctuation": "?"}}
    with Worker(queue.name, queue.tasks, connection=queue.client, prefix=queue.prefix):
        assert job.wait_until_finished(timeout=WAIT) == "hello you?"


def test_the_decorator_works_bare_as_in_celery(queue: Queue) -> None:
    @queue.task
    def double(n: int) -> int:
        return 2 * n

    assert isinstance(double, Task)
    assert double(2) == 4
    assert double.name.endswith(".<locals>.double")
    job = double.delay(5)
    with Worker(queue.name, queue.tasks, connection=queue.client, prefix=queue.prefix):
        assert job.wait_until_finished(timeout=WAIT) == 10


def test_enqueue_takes_job_options_over_the_task_defaults(queue: Queue) -> None:
    @queue.task(name="mail.send", priority=5, attempts=3)
    def send(to: str) -> None: ...

    job = send.enqueue(args=["a@example.com"], priority=1, delay=60)
    assert job.name == "mail.send"
    assert job.opts["priority"] == 1 and job.opts["attempts"] == 3
    assert queue.get_job_state(job.id) == "delayed"
    assert send.delay("b@example.com").opts["priority"] == 5


def test_stacked_decorators_make_one_task_on_each_queue(queue: Queue) -> None:
    """The outer task adds to its own queue, under its own name and options
    (it took the inner task's: queue, name and options)."""
    with Queue(f"{queue.name}-high", connection=queue.client, prefix=queue.prefix) as high:

        @high.task(name="send-high", priority=1)
        @queue.task(name="send-low")
        def send(to: str) -> str:
            return f"sent to {to}"

        job = send.delay("a")
        assert (send.queue, send.name, job.name, job.opts["priority"]) == (
            high, "send-high", "send-high", 1)
        assert high.get_job(job.id) is not None and queue.get_job(job.id) is None
        assert send.func("b") == "sent to b" and not isinstance(send.func, Task)
        low = queue.tasks["send-low"]
        with Worker(high.name, high.tasks, connection=queue.client, prefix=queue.prefix):
            assert job.wait_until_finished(timeout=WAIT) == "sent to a"
        assert low is not None and sorted(high.tasks) == ["send-high"]


def test_a_call_that_does_not_fit_the_signature_is_refused_before_any_write(
    queue: Queue,
) -> None:
    @queue.task()
    def two(a: int, b: int) -> int:
        return a + b

    with pytest.raises(TypeError, match="missing a required argument: 'b'"):
        two.delay(1)
    with pytest.raises(TypeError, match="unexpected keyword"):
        two.enqueue(args=[1, 2], kwargs={"c": 3})
    with pytest.raises(SerializationError):
        two.delay(1, object())
    assert queue.get_job_counts()["waiting"] == 0


def test_a_decorated_function_is_checked_and_named_as_the_worker_runs_it(queue: Queue) -> None:
    """Under another decorator, a task's arguments were checked against the
    function below it (inspect followed __wrapped__): a decorator that
    supplies an argument made the right call refused, and the call it
    accepted failed in the worker. And a ``name`` that decorator set on the
    function replaced the task's name, under which no worker ran it."""

    def with_session(func: Any) -> Any:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return func(*args, session="db", **kwargs)
        wrapper.name = "labelled"  # type: ignore[attr-defined]  # as some registries do
        return wrapper

    @queue.task(name="uses-session")
    @with_session
    def lookup(key: str, session: str) -> str:
        return f"{key} in {session}"

    assert lookup.name == "uses-session" and list(queue.tasks) == ["uses-session"]
    job = lookup.delay("k")
    assert job.name == "uses-session"
    with Worker(queue.name, queue.tasks, connection=queue.client, prefix=queue.prefix):
        assert job.wait_until_finished(timeout=WAIT) == "k in db"


def test_enqueue_refuses_args_that_are_not_a_list_or_tuple(queue: Queue) -> None:
    @queue.task()
    def greet(*names: Any) -> str:
        return " ".join(names)

    for args in ("ab", b"xy", {"a": 1}, 5):
        with pytest.raises(TypeError, match="args must be a list or tuple"):
            greet.enqueue(args=args)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="kwargs must be a mapping"):
        greet.enqueue(args=(), kwargs=[("a", 1)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="pass args= and kwargs=, not data="):
        greet.enqueue(args=(1,), data=5)  # Queue.add() got multiple values for 'data'
    assert queue.get_job_counts("waiting") == {"waiting": 0}
    assert greet.enqueue(args=["ab"]).data == {"args": ["ab"], "kwargs": {}}


def test_a_task_needs_a_name_when_its_function_has_none(queue: Queue) -> None:
    for func in (functools.partial(print, "x"), str.upper):
        with pytest.raises(TypeError, match="pass name="):
            queue.task()(func)
    assert queue.task(name="shout")(str.upper)("a") == "A"
    with pytest.raises(ValueError, match="job name must be a non-empty str"):
        queue.task(name="")(str.lower)  # refused, not the default name in silence


def test_bad_default_options_and_a_taken_name_fail_at_decoration(queue: Queue) -> None:
    with pytest.raises(ValueError):
        queue.task(priority=-1)
    with pytest.raises(TypeError):
        queue.task(colour="red")
    # every delay() was then the one job (as a queue's default job_id or dedup)
    for one_job in ({"job_id": "same"}, {"dedup": {"id": "same"}}):
        with pytest.raises(ValueError, match="cannot be a default job option of a task"):
            queue.task(**one_job)  # type: ignore[arg-type]

    @queue.task(name="same")
    def first() -> None: ...

    with pytest.raises(ValueError, match="has a task named 'same'"):
        @queue.task(name="same")
        def second() -> None: ...


def test_a_tasks_options_are_taken_as_they_were_at_declaration(queue: Queue) -> None:
    """The options were copied shallowly: a backoff dict the caller changed
    later changed the task's, past the declaration's check."""
    backoff = {"type": "exponential", "delay": 1}

    @queue.task(attempts=3, backoff=backoff)
    def flaky() -> None: ...

    backoff["type"] = "bogus"
    job = flaky.delay()
    assert job.opts["backoff"]["type"] == "exponential"


def test_current_job_is_the_running_job_inside_a_task_and_none_outside(queue: Queue) -> None:
    seen: list[Any] = []

    @queue.task()
    def which() -> str | None:
        current = jobq.current_job()
        seen.append(current)
        return None if current is None else current.id

    assert jobq.current_job() is None
    which()  # a local call: no job
    assert seen == [None]
    job = which.delay()
    with Worker(queue.name, queue.tasks, connection=queue.client, prefix=queue.prefix):
        assert job.wait_until_finished(timeout=WAIT) == job.id
    assert isinstance(seen[1], Job) and seen[1].id == job.id
    assert jobq.current_job() is None


def test_current_job_is_per_thread(queue: Queue) -> None:
    both = threading.Barrier(2, timeout=WAIT)

    @queue.task()
    def meet() -> str:
        both.wait()  # two jobs in flight at once, one per pool thread
        current = jobq.current_job()
        assert current is not None
        return current.id

    jobs = [meet.delay(), meet.delay()]
    with Worker(queue.name, queue.tasks, connection=queue.client, prefix=queue.prefix,
                concurrency=2):
        assert [j.wait_until_finished(timeout=WAIT) for j in jobs] == [j.id for j in jobs]


def test_tuples_come_back_as_lists(queue: Queue) -> None:
    @queue.task()
    def echo(value: Any) -> Any:
        return value

    job = echo.delay((1, (2, 3)))
    with Worker(queue.name, queue.tasks, connection=queue.client, prefix=queue.prefix):
        assert job.wait_until_finished(timeout=WAIT) == [1, [2, 3]]


def test_a_job_failed_for_good_logs_a_warning_with_info_off(
    queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    @queue.task(attempts=2)
    def lookup(key: str) -> Any:
        return {}[key]

    job = lookup.delay("missing")
    logger_name = f"jobq.jobs.{queue.name}"
    with caplog.at_level(logging.WARNING, logger=logger_name):
        with Worker(queue.name, queue.tasks, connection=queue.client, prefix=queue.prefix):
            with pytest.raises(jobq.JobFailedError) as info:
                job.wait_until_finished(timeout=WAIT)
    assert info.value.failed_reason == "KeyError: 'missing'"
    assert info.value.exc_type == "KeyError"
    records = [r for r in caplog.records if r.name == logger_name]
    # the retried attempt logs at INFO (off); the last one at WARNING
    assert [r.levelno for r in records] == [logging.WARNING]
    assert "KeyError: 'missing'" in records[0].getMessage()


def test_a_script_names_its_tasks_as_a_worker_importing_it_does(tmp_path: Any) -> None:
    import subprocess
    import sys

    script = tmp_path / "nightly.py"
    script.write_text(
        "from jobq import Queue\n"
        "queue = Queue('reports')\n"
        "@queue.task()\n"
        "def build(day): pass\n"
        "print(build.name)\n"
    )
    for argv in ([str(script)], ["-m", "nightly"]):
        done = subprocess.run([sys.executable, *argv], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "nightly.build", argv
    # in a package, run by its path: named as `jobq worker app.nightly:queue`
    # imports it (it was "nightly.build": no worker had a processor for it)
    package = tmp_path / "app"
    package.mkdir()
    (package / "__init__.py").write_text("")
    script.rename(package / "nightly.py")
    for argv in (["app/nightly.py"], ["-m", "app.nightly"]):
        done = subprocess.run([sys.executable, *argv], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "app.nightly.build", argv
    # run from its own folder, as `jobq worker nightly:queue` there imports it
    done = subprocess.run([sys.executable, "nightly.py"], cwd=package, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "nightly.build"


def test_async_handlers_are_refused_up_front_and_an_awaitable_result_fails_the_job(
    queue: Queue,
) -> None:
    async def work(job: Job) -> int:
        return 1

    class AsyncCall:
        async def __call__(self, job: Job) -> int:
            return 1

    for processor in (work, {"a": work}, AsyncCall(), {"b": AsyncCall()}):
        with pytest.raises(TypeError, match="async function.*asyncio.run"):
            Worker(queue.name, processor, connection=queue.client)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="async function"):
        queue.task()(work)
    assert queue.tasks == {}

    # a generator function: accepted, its body never ran, and every attempt
    # failed with "return value is not msgpack-encodable: ... 'generator'"
    def steps(job: Job) -> Iterator[int]:
        yield 1

    class Steps:
        def __call__(self, job: Job) -> Iterator[int]:
            yield 1

    for processor in (steps, {"c": steps}, Steps()):
        with pytest.raises(TypeError, match="generator function.*return the result"):
            Worker(queue.name, processor, connection=queue.client)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="generator function"):
        queue.task()(steps)
    assert queue.tasks == {}
    # one behind a wrapper: the job fails saying so (it said "not msgpack-encodable")
    hidden = queue.add("x")
    with Worker(queue.name, lambda job: steps(job), connection=queue.client,
                prefix=queue.prefix):
        with pytest.raises(jobq.JobFailedError, match="returned a generator: its body never ran"):
            hidden.wait_until_finished(timeout=WAIT)

    # an awaitable made by a plain function: the job fails, saying why
    job = queue.add("x")
    with Worker(queue.name, lambda job: work(job), connection=queue.client,
                prefix=queue.prefix):
        with pytest.raises(jobq.JobFailedError, match="returned 'coroutine', an awaitable"):
            job.wait_until_finished(timeout=WAIT)
    assert job.refresh().exc_type == "TypeError"


def test_an_add_on_commit_outside_a_django_project_says_so(redis_url: str) -> None:
    """A Flask app in an environment where Django is installed (no project
    configured) got Django's "Requested setting DATABASES, but settings are
    not configured" from `delay_on_commit`; it says what the call needs and
    what to use instead. In a process of its own: the suite's Django tests
    configure settings."""
    import subprocess
    import sys

    pytest.importorskip("django")
    script = (
        "import os, sys\n"
        "os.environ.pop('DJANGO_SETTINGS_MODULE', None)\n"
        "from jobq import Queue\n"
        "with Queue('t-commit', connection=sys.argv[1]) as queue:\n"
        "    @queue.task\n"
        "    def ping(): return 1\n"
        "    for call in (ping.delay_on_commit, lambda: queue.add_on_commit('x')):\n"
        "        try:\n"
        "            call()\n"
        "        except RuntimeError as exc:\n"
        "            print('refused:', exc)\n"
        "    print('waiting:', queue.count())\n"
    )
    done = subprocess.run([sys.executable, "-c", script, redis_url], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and lines[2] == "waiting: 0", done.stdout
    for line in lines[:2]:
        assert line.startswith("refused: *_on_commit follows a Django project's transaction")
        assert "add the job with delay() / add()" in line
