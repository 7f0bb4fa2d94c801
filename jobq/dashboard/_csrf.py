"""The dashboard's CSRF tokens: double submit, each form carrying an HMAC
of the browser's cookie under a key every process of the app shares."""

from __future__ import annotations

import hashlib
import hmac
import http.cookies
import logging
import secrets
import threading
from typing import Any

import redis

logger = logging.getLogger(__name__)

#: The cookie holding the browser's CSRF secret (double submit: each form
#: carries an HMAC of it under the app's key).
CSRF_COOKIE = "jobq_csrf"
#: The key of the CSRF tokens when no ``secret`` is given, below the prefix:
#: stored once, shared by every process of the app (gunicorn -w 4).
CSRF_KEY = "dashboard:csrf-key"


class Csrf:
    """The tokens of one app: keyed by ``secret``, else by the key stored in
    Redis (read, or stored, on first use)."""

    def __init__(self, client: Any, prefix: str, secret: bytes | None) -> None:
        if secret is not None and not isinstance(secret, bytes):
            raise TypeError(f"secret must be bytes, not {type(secret).__name__}")
        self._client = client
        self._prefix = prefix
        self._key = secret
        self._key_lock = threading.Lock()

    def sign(self, value: str) -> str:
        """The token of the forms of the browser whose cookie is ``value``."""
        key = self._key
        if key is None:
            with self._key_lock:
                if self._key is None:
                    self._key = self._shared_key()
                key = self._key
        return hmac.new(key, value.encode(), hashlib.sha256).hexdigest()

    def _shared_key(self) -> bytes:
        """The CSRF key every process of the app shares, stored once under
        the prefix: with a key of each process's own, a form served by one
        gunicorn worker and posted to another got 403. An ACL that refuses
        the key (a tenant's narrower pattern) leaves a key of this process's
        own, said in the log. A server away raises (the request gets 503)."""
        name = f"{self._prefix}:{CSRF_KEY}"
        try:
            self._client.set(name, secrets.token_hex(32), nx=True)
            stored = self._client.get(name)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            raise
        except redis.exceptions.RedisError as exc:
            stored = None
            logger.warning("dashboard: cannot share its CSRF key in %r (%s): it uses a key of "
                           "this process's own, so forms posted to another process of the "
                           "site get 403; give create_app(secret=...) to share one", name, exc)
        return bytes(stored) if stored else secrets.token_bytes(32)

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
        if cookie is None or not hmac.compare_digest(token, self.sign(cookie)):
            return "missing or wrong CSRF token: reload the page and try again"
        return None
