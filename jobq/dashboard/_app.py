"""The dashboard as a WSGI application: routing, authentication, CSRF,
security headers, and the actions.

Routes (below wherever the app is mounted; names and ids travel in the
query string, so any queue name or job id works)::

    GET  /                              every queue
    GET  /queue?q=NAME                  one queue
    GET  /jobs?q=NAME&state=S&page=N    a page of one state's jobs
    GET  /job?q=NAME&id=ID              one job
    GET  /raw?q=NAME&id=ID&part=P       a job's whole data/result/progress/opts, as JSON
    GET  /workers?q=NAME, /schedulers?q=NAME
    GET  /static/dashboard.js, /static/dashboard.css
    POST /action                        retry, remove, promote, cancel, pause,
                                        resume, clean, retry_all

A GET with the header ``X-Jobq-Partial: 1`` answers only the page's live
part: the script polls it to update the page in place.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import secrets
from collections.abc import Callable, Iterable
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, parse_qsl, urlencode, urlsplit

import redis

from .._queues import QueueSet
from ..connection import moved
from ..errors import JobqError
from ..job import STATES
from ..keys import validate_prefix
from ..queue import Queue
from ..registry import known_queues
from . import _data, _pages
from ._csrf import AWAY, CSRF_COOKIE, Csrf
from ._html import Ctx, e, layout, pretty

if TYPE_CHECKING:
    from types import TracebackType

logger = logging.getLogger(__name__)

StartResponse = Callable[..., Any]
Auth = Callable[[dict[str, Any]], bool]

#: Largest request body read (forms are small).
MAX_BODY = 64 * 1024
#: Seconds between two refreshes of the live parts by the script (default).
POLL_INTERVAL = 2.0
#: Seconds a read of the server may take (socket timeouts) when the
#: dashboard makes its client from a URL that gives none: a node that does
#: not answer fails its pages (503) rather than holding their requests.
READ_TIMEOUT = 10.0

SECURITY_HEADERS = [
    ("Content-Security-Policy",
     "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
     "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "same-origin"),
    ("Cross-Origin-Opener-Policy", "same-origin"),
]

_STATIC = {"dashboard.js": "text/javascript; charset=utf-8",
           "dashboard.css": "text/css; charset=utf-8"}

#: What a form's ``back`` may hold after its path: printable URL characters
#: only (what ``_back`` writes), so that nothing can end the Location header.
_BACK_QUERY = re.compile(r"[A-Za-z0-9._~%!$&'()*+,;=:@/?-]*")
#: Characters never written raw into a Location header.
_UNSAFE_IN_LOCATION = re.compile(r"[\x00-\x20\x7f]")

_REASONS = {200: "OK", 303: "See Other", 400: "Bad Request", 401: "Unauthorized",
            403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
            409: "Conflict", 502: "Bad Gateway", 503: "Service Unavailable"}


class _Response:
    def __init__(self, status: int, body: str | bytes = b"",
                 content_type: str = "text/html; charset=utf-8") -> None:
        self.status = status
        self.body = body.encode() if isinstance(body, str) else body
        self.headers: list[tuple[str, str]] = [("Content-Type", content_type)]


class _HTTPError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Dashboard:
    """The jobq dashboard, a WSGI application (see :func:`create_app`).

    It starts no thread: reads go through one shared cache refreshed on
    demand. ``close()`` closes the queues it opened and the client it made.
    """

    def __init__(
        self,
        connection: object = None,
        prefix: str = "jobq",
        read_only: bool = False,
        auth: Auth | None = None,
        *,
        cache_ttl: float = 1.0,
        poll_interval: float = POLL_INTERVAL,
        secret: bytes | None = None,
        allowed_hosts: str | Iterable[str] | None = None,
    ) -> None:
        self.prefix = validate_prefix(prefix)  # a hash tag too, as a Queue's
        self.read_only = bool(read_only)
        if auth is not None and not callable(auth):
            raise TypeError("auth must be a callable taking the WSGI environ, or None")
        self.auth = auth
        if cache_ttl < 0 or poll_interval < 0:
            raise ValueError("cache_ttl and poll_interval must be >= 0 seconds")
        self.cache = _data.SharedCache(cache_ttl)
        self.poll_ms = round(poll_interval * 1000)
        self.allowed_hosts = _allowed(allowed_hosts, auth)
        self._set = QueueSet(connection, self.prefix, "the dashboard", stored=True,
                             read_timeout=READ_TIMEOUT)
        self.client = self._set.client
        try:
            self._csrf = Csrf(self.client, self.prefix, secret)
        except TypeError:
            self._set.close()
            raise
        self._static = {
            name: resources.files("jobq.dashboard").joinpath("static").joinpath(name).read_bytes()
            for name in _STATIC
        }

    def __repr__(self) -> str:
        state = "closed" if self._set.closed else "open"
        return f"<Dashboard prefix={self.prefix!r} read_only={self.read_only} {state}>"

    # -- queues ---------------------------------------------------------------

    def queue_names(self) -> list[str]:
        """The queues known under the app's prefix, sorted (the queues made
        that are gone, or now stored as the other kind, are let go)."""
        names = known_queues(self.client, self.prefix)
        self._set.keep(names)
        return names

    def queue(self, name: str) -> Queue:
        """The app's Queue of that name (made on first use, on the app's client)."""
        return self._set.get(name)

    def _known_queue(self, name: str | None) -> Queue:
        if not name:
            raise _HTTPError(400, "no queue named (q=...)")
        known = self.cache.get(("names",), self.queue_names)
        if name not in known:  # a queue made since that read? (once a ttl, whatever is asked)
            known = self.cache.get(("names", "again"), self.queue_names)
            if name not in known:
                raise _HTTPError(404, f"no queue {name!r} under prefix {self.prefix!r}")
        return self.queue(name)

    def close(self) -> None:
        """Close the queues the app opened and the client it made (idempotent)."""
        self._set.close()

    def __enter__(self) -> Dashboard:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- WSGI -------------------------------------------------------------------

    def __call__(self, environ: dict[str, Any], start_response: StartResponse
                 ) -> Iterable[bytes]:
        if not self._host_allowed(environ):
            body = (b"421 Misdirected Request: this dashboard answers "
                    + (b"loopback names only (give create_app auth= or allowed_hosts=)\n"
                       if self.allowed_hosts is LOOPBACK else b"its allowed_hosts only\n"))
            start_response("421 Misdirected Request", [
                ("Content-Type", "text/plain; charset=utf-8"),
                ("Content-Length", str(len(body)))] + SECURITY_HEADERS)
            return [body]
        base = environ.get("SCRIPT_NAME", "").rstrip("/")
        path = environ.get("PATH_INFO", "") or ""
        cookie = Csrf.cookie(environ)
        new_cookie = cookie is None
        if cookie is None:
            cookie = secrets.token_hex(16)
        ctx = Ctx(base, "", self.read_only, self.poll_ms)
        try:
            if self.auth is not None and not self.auth(environ):
                raise _HTTPError(403, "not allowed")
            if not self.read_only:  # its forms' token (a read-only app has none)
                ctx = Ctx(base, self._csrf.sign(cookie), self.read_only, self.poll_ms)
            response = self._route(environ, ctx, path)
        except _HTTPError as exc:
            response = self._error(ctx, exc.status, exc.message)
        except AWAY as exc:  # a cluster down for a moment too (not a RedisError)
            logger.warning("dashboard: Redis unreachable: %s", exc)
            response = self._error(ctx, 503, f"Redis is unreachable: {exc}")
        except redis.exceptions.RedisError as exc:  # NOPERM, OOM, READONLY...
            logger.warning("dashboard: Redis refused %s: %s", path, exc)
            hint = (" (the URL names one node of a Redis Cluster: use a redis+cluster:// "
                    "URL)" if moved(exc) else "")
            response = self._error(ctx, 502, f"Redis refused: {exc}{hint}")
        response.headers += SECURITY_HEADERS
        if not path.startswith("/static/"):
            response.headers.append(("Cache-Control", "no-store"))
        if new_cookie:
            secure = "; Secure" if environ.get("wsgi.url_scheme") == "https" else ""
            response.headers.append((
                "Set-Cookie",
                f"{CSRF_COOKIE}={cookie}; Path={base or '/'}; HttpOnly; SameSite=Strict{secure}",
            ))
        response.headers.append(("Content-Length", str(len(response.body))))
        reason = _REASONS.get(response.status, "Error")
        start_response(f"{response.status} {reason}", response.headers)
        return [response.body]

    def _host_allowed(self, environ: dict[str, Any]) -> bool:
        """Whether the request is addressed (its Host header) to a name the
        app answers: with no auth, loopback names only, so that a page of
        another site whose name an attacker points at 127.0.0.1 (DNS
        rebinding) cannot read or act through it."""
        allowed = self.allowed_hosts
        if allowed is None:
            return True
        try:
            host = (urlsplit("//" + environ.get("HTTP_HOST", "")).hostname or "").lower()
        except ValueError:
            return False
        return is_loopback(host) if allowed is LOOPBACK else _host_matches(host, allowed)

    def _error(self, ctx: Ctx, status: int, message: str) -> _Response:
        body = layout(ctx, _REASONS.get(status, "Error"), [("queues", ctx.url("/"))],
                      f"<h1>{status} {e(_REASONS.get(status, 'Error'))}</h1>"
                      f'<p class="error">{e(message)}</p>', "")
        return _Response(status, body)

    def _route(self, environ: dict[str, Any], ctx: Ctx, path: str) -> _Response:
        method = environ.get("REQUEST_METHOD", "GET").upper()
        if path.startswith("/static/"):
            name = path[len("/static/"):]
            if name not in self._static:
                raise _HTTPError(404, "no such file")
            response = _Response(200, self._static[name], _STATIC[name])
            response.headers.append(("Cache-Control", "max-age=3600"))
            return response
        if path == "":
            return _redirect(ctx.url("/"))
        if path == "/action":
            if method != "POST":
                raise _HTTPError(405, "actions are POST only")
            return self._action(environ, ctx)
        if method not in ("GET", "HEAD"):
            raise _HTTPError(405, "only GET here (actions are POSTs to /action)")
        query = {k: v[-1] for k, v in parse_qs(environ.get("QUERY_STRING", "")).items()}
        partial = environ.get("HTTP_X_JOBQ_PARTIAL") == "1"
        page = self._page(ctx, path, query, _back(path, environ.get("QUERY_STRING", "")),
                          partial)
        if page is None:
            raise _HTTPError(404, f"no page {path!r}")
        if isinstance(page, _Response):
            return page
        if partial:
            return _Response(200, page.live)
        return _Response(200, layout(ctx, page.title, page.crumbs, page.head, page.live,
                                     page.tail, query.get("msg")))

    def _page(self, ctx: Ctx, path: str, query: dict[str, str], back: str,
              partial: bool = False) -> _pages.Page | _Response | None:
        if path == "/":
            return _pages.overview(self, ctx)
        if path not in ("/queue", "/jobs", "/job", "/raw", "/workers", "/schedulers"):
            return None
        queue = self._known_queue(query.get("q"))
        if path == "/queue":
            return _pages.queue_page(self, ctx, queue)
        if path == "/jobs":
            state = query.get("state", "waiting")
            if state not in STATES:
                raise _HTTPError(404, f"no state {state!r}; states are {', '.join(STATES)}")
            try:
                number = int(query.get("page", "1"))
            except ValueError:
                raise _HTTPError(400, "page must be a number") from None
            if not 1 <= number <= 1_000_000:
                raise _HTTPError(400, "page must be from 1")
            return _pages.jobs_page(self, ctx, queue, state, number, back)
        if path in ("/job", "/raw"):
            job_id = query.get("id", "").strip()
            detail = self.cache.get(("job", queue.name, job_id),
                                    lambda: _data.job_detail(queue, job_id) if job_id else None)
            if detail is None:
                if partial and path == "/job":
                    # the open page's job went (removed, cleaned, trimmed):
                    # its live part says so, rather than the poll failing
                    link = ctx.url("/queue", q=queue.name)
                    return _Response(200, f'<p class="gone">Job {e(job_id)} is no longer in '
                                          f'queue <a href="{e(link)}">{e(queue.name)}</a>: '
                                          'removed, cleaned or dropped by its retention.</p>')
                raise _HTTPError(404, f"no job {job_id!r} in queue {queue.name!r}")
            if path == "/raw":
                return _raw(detail, query.get("part", "data"))
            return _pages.job_page(self, ctx, queue, detail, back)
        if path == "/workers":
            return _pages.workers_page(self, ctx, queue)
        return _pages.schedulers_page(self, ctx, queue)

    # -- actions ----------------------------------------------------------------

    def _action(self, environ: dict[str, Any], ctx: Ctx) -> _Response:
        if self.read_only:
            raise _HTTPError(403, "the dashboard is read-only")
        form = _read_form(environ)
        refused = self._csrf.refusal(environ, form)
        if refused is not None:
            raise _HTTPError(403, refused)
        queue = self._known_queue(form.get("q"))
        action = form.get("action", "")
        job_id = form.get("id", "")
        back = form.get("back", "")
        if not _is_back(back):
            back = ("/job?" + _query(q=queue.name, id=job_id)) if job_id else \
                ("/queue?" + _query(q=queue.name))
        try:
            message = self._act(queue, action, job_id, form)
        except JobqError as exc:
            message = f"{action} refused: {exc}"
        except ValueError as exc:
            raise _HTTPError(400, str(exc)) from None
        finally:
            self.cache.clear()
        if action == "remove" and back.startswith("/job?"):
            back = "/queue?" + _query(q=queue.name)
        sep = "&" if "?" in back else "?"
        return _redirect(ctx.base + back + sep + _query(msg=message))

    def _act(self, queue: Queue, action: str, job_id: str, form: dict[str, str]) -> str:
        if action in ("pause", "resume"):
            queue.pause() if action == "pause" else queue.resume()
            return f"queue {queue.name} {action}d"
        if action == "retry_all":
            return f"{queue.retry_jobs('failed')} failed job(s) moved back to waiting"
        if action == "clean":
            state = form.get("state", "completed")
            text = form.get("grace", "")
            try:  # none or empty is refused: read as 0, it deleted every job of the state
                if not text.isascii():  # float() reads other scripts' digits ("٠": 0)
                    raise ValueError(text)
                grace = float(text)
            except ValueError:
                raise ValueError("grace must be a number of seconds") from None
            removed = queue.clean(grace, 0, state)
            return f"{len(removed)} {state} job(s) cleaned"
        if action not in ("retry", "remove", "promote", "cancel"):
            raise ValueError(f"unknown action {action!r}")
        if not job_id:
            raise ValueError(f"{action} needs a job id")
        if action == "remove":
            done = queue.remove(job_id)
            return f"job {job_id} removed" if done else f"no job {job_id}"
        if action == "cancel":
            done = queue.cancel(job_id, "cancelled from the dashboard")
            return f"job {job_id} cancelled" if done else f"job {job_id} is finished or gone"
        job = queue.get_job(job_id)
        if job is None:
            return f"no job {job_id}"
        if action == "promote":
            job.promote()
            return f"job {job_id} promoted"
        state = queue.get_job_state(job_id)
        job.retry("completed" if state == "completed" else "failed")
        return f"job {job_id} retried"


#: ``allowed_hosts`` of an app without auth and without allowed_hosts.
LOOPBACK: frozenset[str] = frozenset({"localhost"})


def _allowed(hosts: str | Iterable[str] | None, auth: Auth | None) -> frozenset[str] | None:
    """The host names an app answers (None: any), from ``allowed_hosts``."""
    if hosts is None:
        return LOOPBACK if auth is None else None
    if hosts == "*":
        return None
    names = [hosts] if isinstance(hosts, str) else list(hosts)
    if not names or not all(isinstance(h, str) and h.strip(".") and "*" not in h
                            and h == h.strip() for h in names):
        raise ValueError("allowed_hosts must be '*' or host names (e.g. ['jobs.example.com'], "
                         f"['.example.com'] for a domain and its subdomains), not {hosts!r}")
    allowed = frozenset(h.lower().rstrip(".").removeprefix("[").removesuffix("]")
                        if not h.startswith(".") else h.lower().rstrip(".") for h in names)
    for given in names:
        if ":" in given and not _is_address(given.removeprefix("[").removesuffix("]")):
            raise ValueError(f"allowed_hosts names hosts, without a port: {given!r} (the "
                             "port a request was sent to is not matched)")
    return allowed


def _host_matches(host: str, allowed: frozenset[str]) -> bool:
    """Whether ``host`` is one of ``allowed``, as Django's ALLOWED_HOSTS
    matches: a name with a leading dot (``.example.com``) stands for that
    domain and every subdomain; a trailing dot is ignored."""
    host = host.rstrip(".")
    if host in allowed:
        return True
    return any(name.startswith(".") and (host.endswith(name) or host == name[1:])
               for name in allowed)


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (``localhost``, with or
    without the root's trailing dot, or a loopback address)."""
    host = host.lower().rstrip(".")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _query(**params: str) -> str:
    return urlencode(params)


def _back(path: str, query_string: str) -> str:
    """The page to come back to after an action taken on it (its message dropped)."""
    params = [(k, v) for k, v in parse_qsl(query_string) if k != "msg"]
    return path + ("?" + urlencode(params) if params else "")


def _is_back(value: str) -> bool:
    """Whether a form's ``back`` is a page of this app (never another site)
    with a query of printable URL characters (never a header of its own)."""
    path, _, query = value.partition("?")
    return path in ("/", "/queue", "/jobs", "/job") and _BACK_QUERY.fullmatch(query) is not None


def _read_form(environ: dict[str, Any]) -> dict[str, str]:
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise _HTTPError(400, "bad Content-Length") from None
    if length > MAX_BODY:
        raise _HTTPError(400, "request body too large")
    body = environ["wsgi.input"].read(length) if length > 0 else b""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise _HTTPError(400, "the form is not UTF-8") from None
    return {k: v[-1] for k, v in parse_qs(text, keep_blank_values=True).items()}


def _redirect(location: str) -> _Response:
    # control characters (CR, LF) would end the header: percent-encoded,
    # whatever a caller let through
    location = _UNSAFE_IN_LOCATION.sub(lambda m: f"%{ord(m.group()):02X}", location)
    response = _Response(303, f'<a href="{e(location)}">continue</a>')
    response.headers.append(("Location", location))
    return response


def _raw(detail: _data.JobDetail, part: str) -> _Response:
    job = detail.job
    if isinstance(job, _data.UnreadableJob):
        raise _HTTPError(409, f"job {job.id!r}'s record cannot be read: {job.error}")
    values = {"data": job.data, "result": job.return_value, "progress": job.progress,
              "opts": job.opts}
    if part not in values:
        raise _HTTPError(404, f"no part {part!r}; parts are {', '.join(values)}")
    return _Response(200, pretty(values[part]), "application/json; charset=utf-8")


def create_app(
    connection: object = None,
    prefix: str = "jobq",
    read_only: bool = False,
    auth: Auth | None = None,
    **options: Any,
) -> Dashboard:
    """Return the dashboard as a WSGI application.

    Mount it anywhere a WSGI app goes: under a path of a Flask app
    (``werkzeug.middleware.dispatcher.DispatcherMiddleware``), in Django
    (``path("jobq/", include("jobq.contrib.django.urls"))``, staff only), or
    alone under gunicorn (``gunicorn 'jobq.dashboard:create_app()'``).

    Args:
        connection: as ``Queue``'s: None (``$JOBQ_REDIS_URL``, else
            localhost), a URL, or a client (left open by ``close()``).
        prefix: the key prefix of the queues shown.
        read_only: refuse every action (403) and show no action buttons.
        auth: ``auth(environ) -> bool``, asked on every request; False
            answers 403.
        options: ``cache_ttl`` (seconds a read from Redis is shared by every
            request, default 1), ``poll_interval`` (seconds between live
            refreshes in the browser, default 2; 0 turns them off),
            ``secret`` (bytes keying the CSRF tokens; by default a random
            key stored once in Redis, under the prefix, which every process
            of the app shares), ``allowed_hosts`` (the names, in the Host
            header, that requests must be addressed to, without a port;
            ``".example.com"`` for that domain and its subdomains, as
            Django's ``ALLOWED_HOSTS``; ``"*"`` for any; by
            default loopback names alone without ``auth``, so that a page of
            another site whose name points at 127.0.0.1, DNS rebinding,
            cannot act through it, and any name with ``auth``). A request
            to another name gets 421.

    The app starts no thread; call its ``close()`` when done with it.
    """
    return Dashboard(connection, prefix, read_only, auth, **options)
