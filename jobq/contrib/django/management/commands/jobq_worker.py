"""``manage.py jobq_worker [QUEUE...]``: run the tasks of every installed
app's ``tasks`` module until SIGINT / SIGTERM (or, with ``--burst``, until
the queues are empty)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.module_loading import autodiscover_modules

from jobq._serve import serve

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
        serve(
            [(n, with_tasks[n].tasks) for n in names], connection=conf["CONNECTION"],
            prefix=conf["PREFIX"], concurrency=options["concurrency"], name=options["name"],
            burst=options["burst"],
            on_ready=lambda: self.stdout.write(f"jobq worker ready on {', '.join(names)}"),
        )
        self.stdout.write("jobq worker stopped")
