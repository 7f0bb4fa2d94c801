"""``manage.py jobq_worker``: run a jobq worker inside the Django project."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from jobq import Worker

from ...jobs import PROCESSORS


class Command(BaseCommand):
    help = "Run a jobq worker for the project's queue until SIGINT / SIGTERM."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queue", default=None, help="queue (default: JOBQ['QUEUE'])")
        parser.add_argument("--concurrency", type=int, default=4)

    def handle(self, *args: Any, **options: Any) -> None:
        queue = options["queue"] or settings.JOBQ["QUEUE"]
        worker = Worker(queue, PROCESSORS, connection=settings.JOBQ["URL"],
                        concurrency=options["concurrency"])
        worker.once("ready", lambda: self.stdout.write(f"jobq worker ready on {queue}"))
        # run() closes gracefully on SIGINT / SIGTERM (a second signal forces)
        worker.run()
        self.stdout.write("jobq worker stopped")
