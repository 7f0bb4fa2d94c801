"""System checks: a missing, malformed or unreachable jobq configuration."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from .conf import jobq_settings, queue_options

#: Seconds the reachability check waits for the server at most.
PING_TIMEOUT = 1.0


def check_configuration(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobq.E001 malformed settings, jobq.W001 no settings (defaults used),
    jobq.W002 the server cannot be reached, or refused the login.

    A module that builds a queue as it is imported (``queue = get_queue()``
    at its top, imported by the URLconf, which ``check`` imports) raises
    the same error first, as ImproperlyConfigured: ``check --tag jobq``
    says it as jobq.E001."""
    import redis

    from jobq.connection import close_client, describe, redact, resolve

    if getattr(settings, "JOBQ", None) is None:
        return [checks.Warning(
            "settings.JOBQ is missing: jobq uses $JOBQ_REDIS_URL, else "
            "redis://localhost:6379/0, and the prefix 'jobq'",
            hint='Set JOBQ = {"CONNECTION": "redis://...", "PREFIX": "jobq", "QUEUES": {...}}',
            id="jobq.W001",
        )]
    try:
        conf = jobq_settings()
        from jobq import Queue

        for name in conf["QUEUES"]:
            try:
                Queue(name, **queue_options(name)).close()  # no I/O: checks the options
            except (ValueError, TypeError) as exc:  # named as get_queue names it
                raise ImproperlyConfigured(f"settings.JOBQ, queue {name!r}: {exc}") from exc
    except (ImproperlyConfigured, ValueError, TypeError) as exc:
        said = str(exc)  # the settings' own errors name what they found wrong
        return [checks.Error(said if said.startswith("settings.JOBQ") else
                             f"settings.JOBQ: {said}", id="jobq.E001")]
    connection = conf["CONNECTION"]
    try:
        client, owned = resolve(connection)
    except (ValueError, TypeError) as exc:
        return [checks.Error(f'settings.JOBQ["CONNECTION"]: {exc}', id="jobq.E001")]
    except Exception as exc:  # a cluster's client connects as it is made
        return [_unreachable(redact(connection) if isinstance(connection, str)
                             else type(connection).__name__, exc)]
    try:
        if owned and isinstance(client, redis.Redis):  # our own client: a short wait
            pool = client.connection_pool.connection_kwargs
            pool.update(socket_connect_timeout=PING_TIMEOUT, socket_timeout=PING_TIMEOUT)
        client.ping()
    except Exception as exc:  # whatever stops jobq from talking to the server
        return [_unreachable(describe(client), exc)]
    finally:
        if owned:
            close_client(client)
    return []


def _unreachable(where: str, exc: Exception) -> checks.CheckMessage:
    """The warning of a server that could not be used: it refused the login,
    or it could not be reached."""
    from jobq.connection import login_refused

    if login_refused(exc):
        return checks.Warning(
            f"the Redis server at {where} refused jobq's login: {exc}",
            hint='Give its password in settings.JOBQ["CONNECTION"] '
                 "(redis://:PASSWORD@HOST:PORT/DB, or USER:PASSWORD@ for an ACL user)",
            id="jobq.W002",
        )
    return checks.Warning(
        f"jobq cannot reach the Redis server at {where}: {exc}",
        hint='Start the server, or fix settings.JOBQ["CONNECTION"]',
        id="jobq.W002",
    )
