"""``GET /add/?a=1&b=2``: enqueue the sum, wait for a worker, answer with it."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, JsonResponse

from jobq import JobFailedError, WaitUntilFinishedTimeoutError

from .jobs import get_queue


def add(request: HttpRequest) -> JsonResponse:
    """Enqueue ``a + b`` and answer with the worker's result."""
    try:
        a, b = int(request.GET["a"]), int(request.GET["b"])
    except (KeyError, ValueError):
        return JsonResponse({"error": "give integers a and b"}, status=400)
    job = get_queue().add("add", {"a": a, "b": b})
    try:
        result = job.wait_until_finished(timeout=settings.JOBQ["WAIT_TIMEOUT"])
    except WaitUntilFinishedTimeoutError:
        return JsonResponse({"error": "timed out", "job": job.id}, status=504)
    except JobFailedError as exc:
        return JsonResponse({"error": exc.failed_reason, "job": job.id}, status=500)
    return JsonResponse({"a": a, "b": b, "result": result, "job": job.id})
