"""``/add/?a=1&b=2`` waits for a worker's answer; ``/signup/?email=..``
queues a welcome mail once its transaction commits."""

import os

from django.db import transaction
from django.http import HttpRequest, JsonResponse

from jobq import JobFailedError, WaitUntilFinishedTimeoutError

from .tasks import add as add_task
from .tasks import send_welcome


def add(request: HttpRequest) -> JsonResponse:
    try:
        a, b = int(request.GET["a"]), int(request.GET["b"])
    except (KeyError, ValueError):
        return JsonResponse({"error": "give integers a and b"}, status=400)
    job = add_task.delay(a, b)
    try:
        result = job.wait_until_finished(timeout=10)
    except WaitUntilFinishedTimeoutError:
        return JsonResponse({"error": "timed out", "job": job.id}, status=504)
    except JobFailedError as exc:
        return JsonResponse({"error": exc.failed_reason, "job": job.id}, status=500)
    return JsonResponse({"a": a, "b": b, "result": result, "job": job.id, "pid": os.getpid()})


def signup(request: HttpRequest) -> JsonResponse:
    email = request.GET.get("email", "")
    with transaction.atomic():
        # ... create the user here ...
        send_welcome.delay_on_commit(email)  # only if the transaction commits
        if request.GET.get("fail"):
            transaction.set_rollback(True)
    return JsonResponse({"email": email})
