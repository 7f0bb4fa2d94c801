"""``settings.JOBQ``: read and checked in one place."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from jobq.keys import validate_prefix

KEYS = ("CONNECTION", "PREFIX", "QUEUES")


def jobq_settings() -> dict[str, Any]:
    """``settings.JOBQ`` with its defaults.

    Raises:
        ImproperlyConfigured: it is not a dict, has unknown keys, a PREFIX
            that is not one (an empty one too), or QUEUES is not a dict of
            dicts.
    """
    raw = getattr(settings, "JOBQ", None)
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ImproperlyConfigured(f"settings.JOBQ must be a dict, not {type(raw).__name__}")
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise ImproperlyConfigured(
            f"settings.JOBQ has unknown keys {unknown}; it takes {', '.join(KEYS)}"
        )
    queues = raw.get("QUEUES") or {}
    if not isinstance(queues, Mapping) or not all(
        isinstance(k, str) and isinstance(v, Mapping) for k, v in queues.items()
    ):
        raise ImproperlyConfigured(
            'settings.JOBQ["QUEUES"] must map queue names to dicts of Queue options'
        )
    prefix = raw.get("PREFIX")
    try:  # checked here: with no QUEUES, no Queue of the check's would
        prefix = "jobq" if prefix is None else validate_prefix(prefix)
    except ValueError as exc:
        raise ImproperlyConfigured(f'settings.JOBQ["PREFIX"]: {exc}') from None
    return {
        "CONNECTION": raw.get("CONNECTION"),
        "PREFIX": prefix,
        "QUEUES": {k: dict(v) for k, v in queues.items()},
    }


def queue_options(name: str) -> dict[str, Any]:
    """The keyword arguments of ``Queue(name, ...)`` from the settings."""
    conf = jobq_settings()
    options = dict(conf["QUEUES"].get(name, {}))
    for reserved in ("connection", "prefix"):
        if reserved in options:
            raise ImproperlyConfigured(
                f'settings.JOBQ["QUEUES"][{name!r}] may not set {reserved!r}: '
                f'use JOBQ["{reserved.upper()}"]'
            )
    return {"connection": conf["CONNECTION"], "prefix": conf["PREFIX"], **options}
