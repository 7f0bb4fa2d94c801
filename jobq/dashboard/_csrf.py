"""The dashboard's CSRF tokens: double submit, each form carrying an HMAC
of the browser's cookie under a key every process of the app shares."""

from __future__ import annotations

import hashlib
import hmac
import http.cookies
import logging
import math
import secrets
import threading
import time
from typing import Any

import redis

logger = logging.getLogger(__name__)

#: The cookie holding the browser's CSRF secret (double submit: each form
#: carries an HMAC of it under the app's key).
CSRF_COOKIE = "jobq_csrf"
#: The key of the CSRF tokens when no ``secret`` is given, below the prefix:
#: stored once, shared by every process of the app (gunicorn -w 4).
CSRF_KEY = "dashboard:csrf-key"
#: Seconds between two reads of the stored key by one process.
KEY_RECHECK = 10.0
#: Errors of a server (or cluster) away for now: the key is read again later.
AWAY = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
         redis.exceptions.ClusterError, redis.exceptions.TryAgainError,
         redis.exceptions.RedisClusterException)


class Csrf:
    """The tokens of one app: keyed by ``secret``, else by the key stored in
    Redis (read, or stored, on first use, and read again every
    ``KEY_RECHECK`` seconds)."""

    def __init__(self, client: Any, prefix: str, secret: bytes | None) -> None:
        if secret is not None and not isinstance(secret, bytes):
            raise TypeError(f"secret must be bytes, not {type(secret).__name__}")
        self._client = client
        self._prefix = prefix
        self._key = secret
        self._previous: bytes | None = None  # the key before the last change
        self._check_at = math.inf if secret is not None else 0.0  # when the key is read again
        self._refused = False  # the last read was refused (said in the log once)
        self._key_lock = threading.Lock()

    def sign(self, value: str) -> str:
        """The token of the forms of the browser whose cookie is ``value``."""
        return self._signed(self._current(), value)

    @staticmethod
    def _signed(key: bytes, value: str) -> str:
        return hmac.new(key, value.encode(), hashlib.sha256).hexdigest()

    def _current(self) -> bytes:
        """The key, read again from Redis when its time has come: the stored
        key goes with a server restarted without persistence (or a flush),
        and the next process to start stores another; a process that kept
        the old one forever signed forms no other process accepted."""
        key = self._key
        if key is not None and time.monotonic() < self._check_at:
            return key
        with self._key_lock:
            if self._key is None or time.monotonic() >= self._check_at:
                try:
                    stored = self._shared_key(self._key)
                except AWAY:
                    if self._key is None:
                        raise  # no key at all: the request gets 503
                    stored = self._key  # kept until the server is back
                if stored is None:  # refused: a key of this process's own, until a read is not
                    stored = self._key or secrets.token_bytes(32)
                self._check_at = time.monotonic() + KEY_RECHECK
                if stored != self._key:
                    self._previous, self._key = self._key, stored
            return self._key

    def _shared_key(self, mine: bytes | None) -> bytes | None:
        """The CSRF key every process of the app shares, stored once under
        the prefix: with a key of each process's own, a form served by one
        gunicorn worker and posted to another got 403. Found missing, it is
        stored again: ``mine`` (the key this process had: the forms it
        served stay good), else a new one. None when an ACL
        refuses the key (a tenant's narrower pattern): the process then
        keys its tokens with a key of its own, said in the log, until a
        later read is not refused (an error of any kind kept a process from
        ever reading the key again: a cluster down or a server out of memory
        for a moment). A server (or cluster) away raises."""
        name = f"{self._prefix}:{CSRF_KEY}"
        try:
            stored = self._client.get(name)
            if stored is None:
                self._client.set(name, mine or secrets.token_hex(32), nx=True)
                stored = self._client.get(name)
        except AWAY:
            raise
        except redis.exceptions.RedisError as exc:
            if not self._refused:
                logger.warning("dashboard: cannot share its CSRF key in %r (%s): it uses a key "
                               "of this process's own until it can, so forms posted to another "
                               "process of the site get 403; give create_app(secret=...) to "
                               "share one", name, exc)
            self._refused = True
            return None
        self._refused = False
        return bytes(stored) if stored else None

    @staticmethod
    def cookie(environ: dict[str, Any]) -> str | None:
        """The request's CSRF cookie, if it has a well-formed one."""
        jar = http.cookies.SimpleCookie()
        try:
            jar.load(environ.get("HTTP_COOKIE", ""))
        except http.cookies.CookieError:
            return None
        morsel = jar.get(CSRF_COOKIE)
        value = morsel.value if morsel is not None else ""
        return value if len(value) == 32 and value.isalnum() else None

    def refusal(self, environ: dict[str, Any], form: dict[str, str]) -> str | None:
        """Why a POST is refused (403), or None: a cross-site request, or a
        token that is not its cookie's."""
        if environ.get("HTTP_SEC_FETCH_SITE", "same-origin") not in ("same-origin", "none"):
            return "cross-site request refused"
        cookie = self.cookie(environ)
        token = form.get("csrf", "")
        if cookie is None:
            return "missing or wrong CSRF token: reload the page and try again"
        # a form served before this process took the new key: the old one's
        keys = [self._current(), self._previous]
        # compared as bytes: a str of non-ASCII characters raised TypeError (500)
        sent = token.encode("utf-8", "replace")
        if not any(key is not None
                   and hmac.compare_digest(sent, self._signed(key, cookie).encode())
                   for key in keys):
            return "missing or wrong CSRF token: reload the page and try again"
        return None
