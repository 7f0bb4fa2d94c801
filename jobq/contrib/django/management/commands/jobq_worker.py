"""``manage.py jobq_worker [QUEUE...]``: run the tasks of every installed
app's ``tasks`` module until SIGINT / SIGTERM / SIGHUP (or, with ``--burst``,
until the queues are empty).

Each job's database connections are handled as a request's: before and
after it, the connections of its thread that are unusable or past
``CONN_MAX_AGE`` are closed (``close_old_connections``). Without that a
pool thread would keep its connection for ever, through a database restart
or a server's idle timeout, and fail every later job on it."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import redis
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import close_old_connections
from django.utils.module_loading import autodiscover_modules

from jobq._serve import serve
from jobq.errors import JobqError
from jobq.job import Job

from ... import _config
from ...conf import jobq_settings


class Command(BaseCommand):
    help = (
        "Run jobq workers for the tasks of every installed app's tasks module "
        "(every queue that has tasks, or the QUEUEs named)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("queues", nargs="*", metavar="QUEUE",
                            help="queues to serve (default: every queue with tasks)")
        parser.add_argument("--concurrency", "-c", type=int, default=4,
                            help="jobs run at once, per queue (default: 4)")
        parser.add_argument("--burst", action="store_true",
                            help="exit once no job of the queues is waiting or active")
        parser.add_argument("--name", default=None, help="worker name (default: HOST:PID)")

    def handle(self, *args: Any, **options: Any) -> None:
        autodiscover_modules("tasks")
        config = _config()
        with_tasks = {name: q for name, q in config.queues().items() if q.tasks}
        names = options["queues"] or sorted(with_tasks)
        if not names:
            raise CommandError("no tasks found: define them in an installed app's tasks module")
        missing = [n for n in names if n not in with_tasks]
        if missing:
            raise CommandError(f"no tasks for queue(s) {', '.join(missing)}")
        if options["concurrency"] < 1:
            raise CommandError("--concurrency must be at least 1")
        conf = jobq_settings()
        try:
            self._serve(names, with_tasks, conf, options)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            # it names the server, without its password; exit 3 as `jobq worker`
            raise CommandError(f"jobq: {exc}", returncode=3) from None
        except redis.exceptions.RedisError as exc:  # reached, and refused: NOPERM, a db...
            raise CommandError(f"jobq: Redis error: {exc}", returncode=1) from None
        except JobqError as exc:  # e.g. a shard's name, or another shard count
            raise CommandError(f"jobq: {exc}", returncode=1) from None
        self.stdout.write("jobq worker stopped")

    def _serve(self, names: list[str], with_tasks: dict[str, Any], conf: dict[str, Any],
               options: dict[str, Any]) -> None:
        serve(
            [(n, {task: _with_fresh_connections(process)
                  for task, process in with_tasks[n].tasks.items()}) for n in names],
            connection=conf["CONNECTION"],
            prefix=conf["PREFIX"], concurrency=options["concurrency"], name=options["name"],
            burst=options["burst"],
            on_ready=lambda: self.stdout.write(f"jobq worker ready on {', '.join(names)}"),
        )


def _with_fresh_connections(process: Callable[[Job], Any]) -> Callable[[Job], Any]:
    """``process`` between two ``close_old_connections()``, as Django runs a
    request between its signals."""

    @functools.wraps(process)
    def run(job: Job) -> Any:
        close_old_connections()
        try:
            return process(job)
        finally:
            close_old_connections()

    return run
