"""The Lua scripts of jobq: loaded once, called by EVALSHA (NOSCRIPT reloads).

This module is the only place that runs scripts: ``Scripts.run(name, base,
*argv)``. The header of ``lua/<name>.lua`` documents each script's keys,
arguments, return codes and events.
"""

from __future__ import annotations

import functools
import hashlib
from importlib import resources
from typing import Any

from redis.exceptions import NoScriptError

from .connection import Client

_SCRIPT_NAMES = (
    "add",
    "changeDelay",
    "changePriority",
    "clean",
    "complete",
    "drain",
    "emit",
    "extendLocks",
    "fail",
    "getCounts",
    "getMetrics",
    "getOutcome",
    "getWorkers",
    "heartbeat",
    "moveToActive",
    "obliterate",
    "pause",
    "promote",
    "remove",
    "retry",
    "stalledCheck",
    "updateJob",
)


def _read(name: str) -> str:
    return (resources.files(__package__) / "lua" / name).read_text(encoding="utf-8")


def _source(name: str) -> str:
    body = _read(f"{name}.lua")
    shebang, _, rest = body.partition("\n")
    if not shebang.startswith("#!lua"):
        raise RuntimeError(f"lua/{name}.lua must start with a #!lua line")
    return f"{shebang}\n{_read('_common.lua')}\n{rest}"


@functools.cache
def _compiled(name: str) -> tuple[str, str]:
    """The full source of a script and its SHA1 (constant for a release)."""
    source = _source(name)
    return source, hashlib.sha1(source.encode("utf-8")).hexdigest()


class Scripts:
    """Run the scripts on one client: EVALSHA, and SCRIPT LOAD on NOSCRIPT."""

    def __init__(self, client: Client) -> None:
        for name in _SCRIPT_NAMES:
            _compiled(name)  # a broken script fails here, not on first use
        self._client = client

    def run(self, name: str, base: str, *args: Any, client: Any = None) -> Any:
        """Run script ``name`` with KEYS = [base, guard] and ARGV = args.

        Neither key is ever written: ``base`` routes the call to the queue's
        slot (the scripts derive every key from it), and a second declared
        key makes the call a multi-key one, which a cluster refuses with
        TRYAGAIN while the slot migrates. Without it a script could run on
        the importing node against half-moved keys, and the migration of
        the rest would overwrite what it wrote.

        ``client`` (a client, not a pipeline) overrides the default one.
        """
        target = client or self._client
        source, sha = _compiled(name)
        guard = base + "slot-guard"
        try:
            return target.evalsha(sha, 2, base, guard, *args)
        except NoScriptError:  # a restarted or new server: load it once
            target.script_load(source)
            return target.evalsha(sha, 2, base, guard, *args)
