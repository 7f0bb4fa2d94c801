"""The Lua scripts of jobq: loaded once, called by EVALSHA (NOSCRIPT reloads).

This module is the only place that runs scripts. Each method takes the
script's ARGV in order; see the header of ``lua/<name>.lua`` for the keys,
arguments, return codes and events of each.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

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


class Scripts:
    """Every script, registered on one client."""

    def __init__(self, client: Client) -> None:
        self._scripts = {name: client.register_script(_source(name)) for name in _SCRIPT_NAMES}
        self._client = client

    def run(self, name: str, base: str, *args: Any, client: Any = None) -> Any:
        """Run script ``name`` with KEYS = [base, guard] and ARGV = args.

        Neither key is ever written: ``base`` routes the call to the queue's
        slot (the scripts derive every key from it), and a second declared
        key makes the call a multi-key one, which a cluster refuses with
        TRYAGAIN while the slot migrates. Without it a script could run on
        the importing node against half-moved keys, and the migration of
        the rest would overwrite what it wrote.
        """
        keys = [base, base + "slot-guard"]
        return self._scripts[name](keys=keys, args=args, client=client or self._client)
