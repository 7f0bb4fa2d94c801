"""The dashboard's Django view: the WSGI app of :mod:`jobq.dashboard` called
with the request's environ, for active staff users only."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBase, HttpResponseRedirect
from django.shortcuts import resolve_url
from django.views.decorators.csrf import csrf_exempt


def _dashboard(request: HttpRequest, path: str = "") -> HttpResponseBase:
    """Serve one request of the dashboard mounted at this URL pattern."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        login = resolve_url(settings.LOGIN_URL)
        return HttpResponseRedirect(f"{login}?{urlencode({'next': request.get_full_path()})}")
    if not (user.is_active and user.is_staff):
        return HttpResponse("jobq dashboard: staff only", status=403,
                            content_type="text/plain; charset=utf-8")
    from django.apps import apps

    app = apps.get_app_config("jobq").dashboard()
    environ = dict(request.META)
    mount = request.path[: len(request.path) - len(path)] if path else request.path
    environ["SCRIPT_NAME"] = mount.rstrip("/")
    environ["PATH_INFO"] = "/" + path
    body = request.body
    environ["wsgi.input"] = io.BytesIO(body)
    environ["CONTENT_LENGTH"] = str(len(body))
    captured: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None
                       ) -> None:
        captured["status"] = int(status.split()[0])
        captured["headers"] = headers

    content = b"".join(app(environ, start_response))
    response = HttpResponse(content, status=captured["status"])
    for name, value in captured["headers"]:
        if name.lower() == "set-cookie":
            response.cookies.load(value)  # Django writes its cookies apart from headers
        elif name.lower() != "content-length":
            response[name] = value
    return response


#: The view (exempt from Django's CSRF check: the dashboard checks its own
#: token on every action).
dashboard: Callable[..., HttpResponseBase] = csrf_exempt(_dashboard)
