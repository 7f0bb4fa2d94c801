"""The shop's tasks: ``manage.py jobq_worker`` finds this module by its name."""

from jobq.contrib.django import get_queue

queue = get_queue()  # the process's shared "default" queue, from settings.JOBQ


@queue.task()
def add(a: int, b: int) -> int:
    return a + b


@queue.task(attempts=3, backoff=1.0)
def send_welcome(email: str) -> str:
    return f"welcome mail sent to {email}"
