"""The Lua scripts of jobq: loaded once, called by EVALSHA (NOSCRIPT reloads).

This module runs scripts: ``Scripts.run(name, base, *argv)``; ``calls.py``
gives each script a typed method (its arguments built and its reply decoded
there only). The header of ``lua/<name>.lua`` documents each script's keys,
arguments, return codes and events.
"""

from __future__ import annotations

import functools
import hashlib
import re
from importlib import resources
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.exceptions import AskError, ClusterDownError, MovedError, NoScriptError, ResponseError

from .connection import Client, take_connection

_SCRIPT_NAMES = (
    "add",
    "cancel",
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
    "removeScheduler",
    "retry",
    "schedulerSync",
    "stalledCheck",
    "updateJob",
    "upsertScheduler",
)

#: Scripts that may run twice to the same effect, so that a call whose reply
#: was lost may be sent again: the finalising ones are idempotent per lock
#: token, the others read, renew or set. Every other script is sent once.
RESENDABLE = frozenset(
    {
        "complete", "extendLocks", "fail", "getCounts", "getMetrics", "getOutcome",
        "getWorkers", "heartbeat", "pause", "stalledCheck",
    }
)


def _read(name: str) -> str:
    return (resources.files(__package__) / "lua" / name).read_text(encoding="utf-8")


_DEFINES = re.compile(r"^local (?:function )?(\w+)", re.M)
_WORD = re.compile(r"\w+")


def _units(common: str) -> list[tuple[set[str], str]]:
    """The top-level definitions of _common.lua, in order: the names each
    defines and its text (with the comment lines just above it)."""
    units: list[list[str]] = [[]]
    after_comment = False
    for line in common.splitlines():
        if line.startswith(("local ", "--")) and not after_comment:
            units.append([])
        units[-1].append(line)
        if line.strip():
            after_comment = line.startswith("--") and not line.startswith("--[[")
    texts = ["\n".join(unit) for unit in units if unit]
    return [(set(_DEFINES.findall(text)), text) for text in texts]


def _source(name: str) -> str:
    """A script with the helpers of _common.lua it uses, directly or not:
    each call runs the whole chunk, so unused helpers would cost every call."""
    body = _read(f"{name}.lua")
    shebang, _, rest = body.partition("\n")
    if not shebang.startswith("#!lua"):
        raise RuntimeError(f"lua/{name}.lua must start with a #!lua line")
    units = [unit for unit in _units(_read("_common.lua")) if unit[0]]
    used = set(_WORD.findall(rest))
    keep = [False] * len(units)
    changed = True
    while changed:  # a helper may use earlier ones
        changed = False
        for i in reversed(range(len(units))):
            names, text = units[i]
            if not keep[i] and names & used:
                keep[i] = changed = True
                used |= set(_WORD.findall(text))
    helpers = "\n".join(text for (_, text), kept in zip(units, keep, strict=True) if kept)
    return f"{shebang}\n{helpers}\n{rest}"


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

        ``client`` (a client or a pipeline) overrides the default one.

        On a plain client the call goes straight to a connection of its pool,
        without the client's per-command layers (a sixth of a call's CPU
        time here). Only scripts that may run twice to the same effect
        (``RESENDABLE``) are resent under the connection's retry policy: a
        reply lost after the server ran an ``add`` must not make two jobs.
        """
        target = client or self._client
        if isinstance(target, RedisCluster) and name not in RESENDABLE:
            # the slot's node directly, so that the cluster client's own
            # retries cannot resend the script. When nothing was sent (MOVED,
            # ASK, a cluster going down, or no connection to the node) the
            # call goes through the cluster client, which follows the new
            # slot map.
            node = target.get_node_from_key(base)  # type: ignore[no-untyped-call]
            node_pool = getattr(node and node.redis_connection, "connection_pool", None)
            if node_pool is not None:
                node_connection: Any = None
                try:
                    node_connection = take_connection(node_pool)  # connects: nothing sent yet
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
                    pass
                if node_connection is not None:
                    try:
                        return self.run_on(node_connection, name, base, *args)
                    except (MovedError, AskError, ClusterDownError):
                        pass
                    finally:
                        node_pool.release(node_connection)
        if (
            isinstance(target, redis.Redis)
            and not isinstance(target, redis.client.Pipeline)
            and target.connection is None
        ):
            pool = target.connection_pool
            connection: Any = take_connection(pool)
            try:
                if name not in RESENDABLE:
                    return self.run_on(connection, name, base, *args)
                return connection.retry.call_with_retry(
                    lambda: self.run_on(connection, name, base, *args),
                    lambda error: connection.disconnect(),
                )
            finally:
                pool.release(connection)
        source, sha = _compiled(name)
        guard = base + "slot-guard"
        try:
            return target.evalsha(sha, 2, base, guard, *args)
        except NoScriptError:  # a restarted or new server: load it once
            target.script_load(source)
            return target.evalsha(sha, 2, base, guard, *args)

    def run_on(self, connection: Any, name: str, base: str, *args: Any) -> Any:
        """Run script ``name`` on one connection (a pool's, or a thread's
        own), below the client's pool and retry layers.

        An error reply leaves the connection usable; any other failure drops
        it (the next call reconnects) and is raised: the caller retries.
        """
        source, sha = _compiled(name)
        command = ("EVALSHA", sha, 2, base, base + "slot-guard", *args)
        try:
            try:
                connection.send_command(*command)
                return connection.read_response()
            except NoScriptError:  # a restarted or new server: load it once
                connection.send_command("SCRIPT", "LOAD", source)
                connection.read_response()
                connection.send_command(*command)
                return connection.read_response()
        except ResponseError:
            raise
        except BaseException:
            connection.disconnect()
            raise
