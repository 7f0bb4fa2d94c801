"""The Lua scripts of jobq: loaded once, called by EVALSHA (NOSCRIPT reloads).

This module is the only place that runs scripts: ``Scripts.run(name, base,
*argv)``. The header of ``lua/<name>.lua`` documents each script's keys,
arguments, return codes and events.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable
from importlib import resources
from typing import Any, NamedTuple

import redis
from redis.cluster import RedisCluster
from redis.exceptions import AskError, ClusterDownError, MovedError, NoScriptError, ResponseError

from .connection import Client, take_connection
from .errors import ScriptCode

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


# -- the worker's scripts, typed ------------------------------------------------


class TakeArgs(NamedTuple):
    """What a take needs: moveToActive's arguments (and the tail of a
    finalising call that takes the next job along)."""

    token: str
    lock_ms: int
    worker: str
    limit_max: int
    limit_ms: int


class Taken(NamedTuple):
    """A job a take locked for the worker: its id, the lock token, and its
    record as a flat field/value list."""

    job_id: str
    token: str
    record: list[bytes]


class TakeReply(NamedTuple):
    """moveToActive's reply: a job, or how long to wait for one."""

    taken: Taken | None = None
    #: nothing taken: ms until the next delayed job is due (-1: none)
    next_delay_ms: int = -1
    #: > 0: the rate limiter allows no take for this many ms
    limited_ms: int = 0


class FinishReply(NamedTuple):
    """complete's or fail's reply."""

    code: ScriptCode
    #: server time of the call (epoch seconds); None when refused
    finished_on: float | None = None
    #: the next job, when the call was asked to take one
    next: TakeReply | None = None


def _decode_take(reply: Any, token: str) -> TakeReply:
    code = int(reply[0])
    if code == 1:
        return TakeReply(Taken(reply[1].decode(), token, reply[2]))
    if code == 2:
        return TakeReply(limited_ms=max(1, int(reply[1])))
    return TakeReply(next_delay_ms=int(reply[1]))


def _decode_finish(reply: Any, take: TakeArgs | None) -> FinishReply:
    if not isinstance(reply, list):
        return FinishReply(ScriptCode(int(reply)))
    taken = None
    if take is not None and len(reply) > 2:
        taken = _decode_take(reply[2], take.token)
    return FinishReply(ScriptCode(int(reply[0])), float(reply[1]) / 1000.0, taken)


class WorkerScripts:
    """The scripts a worker runs, one typed method each (arguments built and
    replies decoded here only), over ``run(script, *argv)``: the caller picks
    the connection."""

    __slots__ = ("_run",)

    def __init__(self, run: Callable[..., Any]) -> None:
        self._run = run

    def take(self, take: TakeArgs, *, retried: bool = False) -> TakeReply:
        """moveToActive.lua: promote due delayed jobs, take the next job.
        ``retried``: this take's token was sent before and its reply lost."""
        reply = self._run("moveToActive", *take, "1" if retried else "0")
        return _decode_take(reply, take.token)

    def complete(
        self, job_id: str, token: str, result: bytes, take: TakeArgs | None
    ) -> FinishReply:
        """complete.lua: finish an attempt successfully (and take the next job)."""
        reply = self._run("complete", job_id, token, result, *(take or ()))
        return _decode_finish(reply, take)

    def fail(
        self, job_id: str, token: str, reason: str, stacktrace: bytes, delay_ms: int,
        take: TakeArgs | None, exc_type: str = "",
    ) -> FinishReply:
        """fail.lua: end a failed attempt; ``delay_ms`` -1 forbids a retry."""
        reply = self._run(
            "fail", job_id, token, reason, stacktrace, delay_ms, exc_type, *(take or ())
        )
        return _decode_finish(reply, take)

    def extend_locks(self, lock_ms: int, held: list[tuple[str, str]]) -> set[str]:
        """extendLocks.lua: renew (job id, token) locks; the tokens lost."""
        argv: list[Any] = [lock_ms]
        for job_id, token in held:
            argv += (job_id, token)
        return {t.decode() for t in self._run("extendLocks", *argv)}

    def stalled_check(self, max_stalled: int, guard_ms: int, batch: int) -> list[str]:
        """stalledCheck.lua: recover jobs of dead workers; the ids recovered."""
        return [i.decode() for i in self._run("stalledCheck", max_stalled, guard_ms, batch)]
