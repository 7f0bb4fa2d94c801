"""Best-effort checks of the server's configuration, reported through logging."""

from __future__ import annotations

import logging
import weakref
from typing import Any

logger = logging.getLogger("jobq")

#: The clients already checked: once each (every Queue's first use asked,
#: a connection of the pool each).
_checked: weakref.WeakSet[Any] = weakref.WeakSet()


def warn_if_evicting(client: Any) -> None:
    """Log a warning when the server may evict keys (``maxmemory-policy``
    other than ``noeviction``): an evicted job, lock or marker is a lost job.

    Best effort: a server that refuses ``CONFIG GET`` (ACL, managed services)
    or is unreachable is not checked. Once per client.
    """
    try:
        if client in _checked:
            return
        _checked.add(client)
    except TypeError:  # a client that cannot be weakly referenced: checked each time
        pass
    try:
        reply = client.config_get("maxmemory-policy")
    except Exception as exc:  # NOPERM, a cluster without the command, a dead server
        logger.debug("cannot read maxmemory-policy: %s", exc)
        return
    policies = set()
    for key, value in _pairs(reply):
        if _text(key) == "maxmemory-policy":
            policies.add(_text(value))
    for policy in sorted(policies - {"noeviction"}):
        logger.warning(
            "the Redis server's maxmemory-policy is %r: under memory pressure it may "
            "evict jobq's keys and lose jobs; set maxmemory-policy noeviction",
            policy,
        )


def _pairs(reply: Any) -> list[tuple[Any, Any]]:
    """(key, value) pairs of a CONFIG GET reply, also one per node of a cluster."""
    if not isinstance(reply, dict):
        return []
    pairs: list[tuple[Any, Any]] = []
    for key, value in reply.items():
        if isinstance(value, dict):  # {node: {key: value}}
            pairs.extend(value.items())
        else:
            pairs.append((key, value))
    return pairs


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
