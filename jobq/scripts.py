"""The Lua scripts of jobq: one library of functions (FUNCTION LOAD once per
server, again when a call finds it missing), each script called by FCALL.

This module runs scripts: ``Scripts.run(name, base, *argv)``; ``calls.py``
gives each script a typed method (its arguments built and its reply decoded
there only). The header of ``lua/<name>.lua`` documents each script's keys,
arguments, return codes and events.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import re
import threading
from collections.abc import Iterator
from importlib import resources
from typing import Any

import redis
from hiredis import pack_command as _pack  # a dependency; redis-py packs with it too
from redis.cluster import RedisCluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    ResponseError,
    TryAgainError,
)

from . import _fork
from ._coalesce import CLOSE_GRACE, Coalescer, shared
from .connection import Client, connected, is_transient, pooled, read_by, take_connection
from .errors import ClosedError, RedisOOMError

_SCRIPT_NAMES = (
    "add",
    "addFlow",
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
    "getLogs",
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
    "storeSettings",
    "storeShardCount",
    "updateJob",
    "upsertScheduler",
)

#: Scripts registered a second time, under another name with other flags:
#: name -> (script, flags). A finishing call that also takes the next job is
#: refused while the server is out of memory (the finish alone runs: see
#: ``WorkerScripts.complete``), so that workers finish what they hold but
#: take nothing new, as a take alone is refused; a running attempt's own
#: progress and log lines are not refused.
VARIANTS = {
    "completeTake": ("complete", ""),
    "failTake": ("fail", ""),
    "updateJobHeld": ("updateJob", "allow-oom"),
}

#: Scripts that may run twice to the same effect, so that a call whose reply
#: was lost may be sent again: the finalising ones are idempotent per lock
#: token, the others read, renew or set. Every other script is sent once.
RESENDABLE = frozenset(
    {
        "complete", "completeTake", "extendLocks", "fail", "failTake", "getCounts",
        "getMetrics", "getOutcome",
        "getWorkers", "heartbeat", "pause", "stalledCheck", "storeSettings", "storeShardCount",
    }
)


def _read(name: str) -> str:
    return (resources.files(__package__) / "lua" / name).read_text(encoding="utf-8")


_LOCAL = re.compile(r"^local ((?:\w+)(?:,\s*\w+)*)\s*=", re.M)
_FLAGS = re.compile(r"flags=(\S+)")
_PER_CALL = re.compile(r"\b(?:KEYS|ARGV|base|K_\w+)\b")
#: The reply of FCALL naming a function the server does not have (a restarted
#: or new server, or FUNCTION FLUSH): the library is loaded, and the call sent
#: again.
_MISSING = "Function not found"
#: The value of a key named after the queue's base alone (``base .. 'wait'``).
_OF_BASE = re.compile(r"\s*base \.\. '[^']*'\s*$")


#: The globals the scripts use, bound to locals of the library on its first
#: call. In a function library every global lookup misses the (empty) global
#: table and goes through its metatable; an upvalue is one step. Measured
#: with bench/server_cost.py: 9k fewer server instructions per job drained
#: (of 395k). While the library loads they are nil: its load-time constants
#: use none of them.
_GLOBALS = "redis, tonumber, ipairs, unpack, string, math, tostring, type, table"


def _units(common: str) -> list[str]:
    """The top-level definitions of _common.lua, in order, each with the
    comment lines just above it (a definition starts at a line "local")."""
    units: list[list[str]] = [[]]
    after_comment = False
    for line in common.splitlines():
        if line.startswith(("local ", "--")) and not after_comment:
            units.append([])
        units[-1].append(line)
        if line.strip():
            after_comment = line.startswith("--") and not line.startswith("--[[")
    return ["\n".join(unit) for unit in units if unit]


def _register(name: str, function: str, flags: str | None = None) -> str:
    """One script as a function of the library: ``lua/<name>.lua``'s body
    run with the call's keys and arguments, its shebang's flags kept unless
    ``flags`` are given (the first call of any binds _GLOBALS)."""
    shebang, _, body = _read(f"{name}.lua").partition("\n")
    if not shebang.startswith("#!lua"):
        raise RuntimeError(f"lua/{name}.lua must start with a #!lua line")
    if flags is None:
        found = _FLAGS.search(shebang)
        flags = found.group(1) if found else ""
    listed = ", ".join(f"'{flag}'" for flag in flags.split(",") if flag)
    return (
        f"_register_function{{function_name = '{function}', flags = {{{listed}}},\n"
        f"callback = function(keys, args)\nKEYS, ARGV = keys, args\n"
        f"if not redis then {_GLOBALS} = _globals() end\n_per_call()\n"
        f"{body}\nend}}\n"
    )


@functools.cache
def _library() -> tuple[str, str]:
    """The library of every script, and its name (from a hash of its text,
    so that two releases of jobq on one server never share a function).

    Loaded once per server (FUNCTION LOAD), it defines the helpers of
    _common.lua once; a call runs only its own function. Each top-level
    value of _common.lua (the keys derived from KEYS[1], the per-call caches)
    is declared at the top of the library and assigned by ``_per_call()`` at
    the start of every call, in the order written: the keys only when
    KEYS[1] differs from the last call's (they depend on it alone), the
    caches always (a helper may call it too: ``in_queue`` runs a step with
    another queue's keys, as flows do for a parent in another queue).
    """
    declared = ["KEYS", "ARGV", "_per_call"]
    per_call: list[str] = []
    of_base: list[str] = []  # base and the keys derived from it alone
    helpers: list[str] = []
    for unit in _units(_read("_common.lua")):
        found = _LOCAL.search(unit)
        if found is None:  # a function, or the header comment
            helpers.append(unit)
            continue
        names = [n.strip() for n in found.group(1).split(",")]
        declared += names
        assignment = unit[: found.start()] + unit[found.start() + len("local "):]
        value = unit[found.end():]
        if all(n.isupper() for n in names) and not _PER_CALL.search(value):
            helpers.append(assignment)  # a constant: set once, when loaded
        elif names == ["base"] or _OF_BASE.match(value):
            of_base.append(assignment)
        else:
            per_call.append(assignment)
    body = "\n".join(
        ["local _register_function = redis.register_function",  # the loading API's
         f"local function _globals() return {_GLOBALS} end",  # the globals of a call
         f"local {_GLOBALS}",
         "local " + ", ".join(declared), *helpers, "_per_call = function()",
         "if base ~= KEYS[1] then", *of_base, "end", *per_call, "end"]
    )
    tag = hashlib.sha1(
        (body + "".join(_read(f"{n}.lua") for n in _SCRIPT_NAMES)).encode("utf-8")
    ).hexdigest()[:12]
    library = f"jobq_{tag}"
    functions = "".join(_register(name, f"{library}_{name}") for name in _SCRIPT_NAMES)
    functions += "".join(_register(script, f"{library}_{name}", flags)
                         for name, (script, flags) in VARIANTS.items())
    return f"#!lua name={library}\n{body}\n{functions}", library


@functools.cache
def function_name(name: str) -> str:
    """The server-side name of script ``name`` (its function in the library)."""
    return f"{_library()[1]}_{name}"


class Scripts:
    """Run the scripts on one client: FCALL, and FUNCTION LOAD when the
    server does not have them."""

    def __init__(self, client: Client) -> None:
        _library()  # a broken script fails here, not on first use
        self._client = client
        self._plain = pooled(client)  # its calls go through the coalescer
        self._coalescer: Coalescer | None = None
        self._coalescer_lock = threading.Lock()
        self._closed = False  # its share of the coalescer given back
        self._refuser: int | None = None
        self._after_fork()
        _fork.track(self)

    def _after_fork(self) -> None:
        """In a forked child: new locks (a parent's thread may have held
        one; the coalescer resets itself)."""
        self._coalescer_lock = threading.Lock()
        self._calls = 0  # run() calls under way (the parent's are not the child's)
        self._calls_done = threading.Condition(threading.Lock())

    def _coalesced(self, pool: Any) -> Coalescer:
        coalescer = self._coalescer
        if coalescer is None:
            with self._coalescer_lock:
                if self._closed:  # a call that raced the close: no share taken again
                    raise ClosedError("closed while the call began: nothing of it was sent")
                if self._coalescer is None:
                    self._coalescer = shared(pool)
                coalescer = self._coalescer
        return coalescer

    def close(self) -> None:
        """Let the calls under way end (CLOSE_GRACE at most: a call cut
        short by the close that follows may have run, an add written, yet
        raise ``ConnectionError``), refuse new ones (``ClosedError``), and
        give back the share of the client's coalescer (the last user to do
        so gives back its connection)."""
        with self._calls_done:
            self._closed = True
            self._calls_done.wait_for(lambda: self._calls == 0, CLOSE_GRACE)
        with self._coalescer_lock:
            coalescer, self._coalescer = self._coalescer, None
        if coalescer is not None:
            coalescer.leave()

    def refuse_calls(self) -> None:
        """Send nothing from now on for any thread but this one: their calls
        raise ConnectionError. A closing worker whose threads are stuck on a
        server that does not answer cuts their connections and calls this,
        so that none of them connects again (a resent call would, and block
        on the new connection's handshake, for ever without a socket
        timeout). The closing thread's own last calls are bounded by it."""
        self._refuser = threading.get_ident()

    def _check_open(self) -> None:
        _fork.check()
        if self._refuser is not None and self._refuser != threading.get_ident():
            raise redis.exceptions.ConnectionError("closing: no more calls are sent")

    def run(self, name: str, base: str, *args: Any, client: Any = None,
            once: bool = False) -> Any:
        """``_run``, with an error reply that says the call was not run for
        now (BUSY: the server runs another client's long script; TRYAGAIN,
        CLUSTERDOWN, MASTERDOWN, READONLY) raised as redis-py's
        ``ConnectionError``, as a server away is: the error callers retry
        on. It is safe to: nothing of the call ran. ``ClosedError`` once
        ``close()`` began: nothing was sent.

        ``once``: on a cluster, a slot that is migrating refuses the call at
        once, without the retries (above a second) that see a short
        migration through: for a round over the shards of a sharded queue,
        which goes on to the others and tries this one again next round."""
        done = self._calls_done
        with done:
            if self._closed:
                raise ClosedError("closed while the call began: nothing of it was sent")
            self._calls += 1
        try:
            with _said_plainly(name):
                return self._run(name, base, *args, client=client, once=once)
        except ResponseError as exc:
            if isinstance(exc, redis.exceptions.NoScriptError) or not is_transient(exc):
                raise
            raise redis.exceptions.ConnectionError(
                f"the server did not run the call: {exc} (nothing of it ran; try again)"
            ) from exc
        finally:
            with done:
                self._calls -= 1
                if self._closed and not self._calls:
                    done.notify_all()

    def _run(self, name: str, base: str, *args: Any, client: Any = None,
             once: bool = False) -> Any:
        """Run script ``name`` with KEYS = [base, guard] and ARGV = args.

        Neither key is ever written: ``base`` routes the call to the queue's
        slot (the scripts derive every key from it), and a second declared
        key makes the call a multi-key one, which a cluster refuses with
        TRYAGAIN while the slot migrates. Without it a script could run on
        the importing node against half-moved keys, and the migration of
        the rest would overwrite what it wrote.

        ``client`` (a client or a pipeline) overrides the default one; for
        ``once``, see ``run``.

        On a plain client the call goes straight to a connection, without
        the client's per-command layers (a sixth of a call's CPU time here):
        the default client's calls share one connection, on which the calls
        of concurrent threads go out in one write (``_coalesce``); a
        ``client`` given goes through its pool. Only scripts that may run
        twice to the same effect (``RESENDABLE``) are resent (through the
        pool, under the connection's retry policy): a reply lost after the
        server ran an ``add`` must not make two jobs.
        """
        self._check_open()
        target = client or self._client
        plain = self._plain if client is None else pooled(client)
        if not plain and isinstance(target, RedisCluster) and (once or name not in RESENDABLE):
            # the slot's node directly, so that the cluster client's own
            # retries cannot resend the script. When nothing was sent (MOVED,
            # ASK, a cluster going down, or no connection to the node) the
            # call goes through the cluster client, which follows the new
            # slot map; a migrating slot (ASK, TRYAGAIN) refuses it at once
            # for ``once``.
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
                    except (MovedError, ClusterDownError):  # (a MovedError is an AskError)
                        pass  # the slot moved: the cluster client follows the new map
                    except (AskError, TryAgainError) as exc:
                        if once:
                            raise _moving(exc) from exc
                        if isinstance(exc, TryAgainError):
                            raise
                    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                        if name not in RESENDABLE:  # it may have run: not sent again
                            raise
                    finally:
                        node_pool.release(node_connection)
        if plain:
            pool = target.connection_pool
            if client is None:
                command = ("FCALL", function_name(name), 2, base, base + "slot-guard", *args)
                try:
                    return self._call_coalesced(pool, _pack(command))
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                    if name not in RESENDABLE:
                        raise
            self._check_open()  # refused while the call above was cut short
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
        command = ("FCALL", function_name(name), 2, base, base + "slot-guard", *args)
        if isinstance(target, RedisCluster):
            return _on_cluster(target, base, command, name in RESENDABLE)
        try:
            return target.execute_command(*command)
        except ResponseError as exc:
            if not function_missing(exc):
                raise
        load_library(target)  # a restarted or new server: load the library once
        with _still_missing():
            return target.execute_command(*command)

    def _call_coalesced(self, pool: Any, packed: bytes) -> Any:
        """A call through the coalescer. On a server without the library (a
        new or restarted one) the first of the calls that found it missing
        loads it, and each goes again: a few hundred concurrent first calls
        each loading it on a connection of its own ran the pool out of
        connections. The count of loads is the pool's (its coalescer's),
        not one queue's: the first calls of several queues at once did the
        same."""
        coalescer = self._coalesced(pool)
        loads = coalescer.loads
        try:
            return coalescer.call(packed)
        except ResponseError as exc:
            if not function_missing(exc):
                raise
        with coalescer.load_lock:
            if coalescer.loads == loads:  # not loaded since this call went out
                load_library(self._client)
                coalescer.loads += 1
        with _still_missing():
            return coalescer.call(packed)

    def run_on(
        self, connection: Any, name: str, base: str, *args: Any, deadline: float | None = None
    ) -> Any:
        """Run script ``name`` on one connection (a pool's, or a thread's
        own), below the client's pool and retry layers.

        An error reply leaves the connection usable; any other failure drops
        it (the next call reconnects) and is raised: the caller retries.
        With ``deadline`` (``time.monotonic``), a reply not come by then
        raises redis-py's TimeoutError (see ``connection.read_by``).
        """
        self._check_open()
        command = ("FCALL", function_name(name), 2, base, base + "slot-guard", *args)
        with _said_plainly(name):
            return self._run_on(connection, command, deadline)

    def _run_on(self, connection: Any, command: tuple[Any, ...], deadline: float | None) -> Any:
        try:
            try:
                # the same bytes as send_command, without its per-argument pass
                connected(connection).send_packed_command([_pack(command)])
                return read_by(connection, deadline)
            except ResponseError as exc:
                if not function_missing(exc):
                    raise
            # a restarted or new server: load the library once
            connection.send_command("FUNCTION", "LOAD", _library()[0])
            try:
                read_by(connection, deadline)
            except redis.exceptions.OutOfMemoryError as exc:
                raise _load_refused() from exc
            except redis.exceptions.NoPermissionError as exc:
                raise _load_not_permitted(exc) from exc
            except ResponseError as exc:
                if "already exists" not in str(exc):  # loaded by another client
                    raise
            connection.send_command(*command)
            with _still_missing():
                return read_by(connection, deadline)
        except ResponseError:
            raise
        except BaseException:
            connection.disconnect()
            raise

    def run_after(
        self, connection: Any, first: tuple[Any, ...], name: str, base: str, *args: Any
    ) -> tuple[Any, Any]:
        """Send command ``first`` and script ``name`` in one write on one
        connection; return both replies. The server runs the script once
        ``first`` has returned: after a blocking ``first`` (BZPOPMIN), as
        soon as its block ends, with no round trip between the two.

        An error reply of the script leaves the connection usable (a script
        missing from the server is loaded and the script run again, as by
        ``run_on``); any other failure drops it and is raised.
        """
        self._check_open()
        with _said_plainly(name):
            return self._run_after(connection, first, name, base, *args)

    def _run_after(
        self, connection: Any, first: tuple[Any, ...], name: str, base: str, *args: Any
    ) -> tuple[Any, Any]:
        command = ("FCALL", function_name(name), 2, base, base + "slot-guard", *args)
        try:
            connected(connection).send_packed_command([_pack(first), _pack(command)],
                                                      check_health=False)
            try:
                reply = connection.read_response()
            except ResponseError:  # the script's reply is left unread
                connection.disconnect()
                raise
        except BaseException:
            connection.disconnect()
            raise
        try:
            return reply, read_by(connection, None)
        except ResponseError as exc:
            if not function_missing(exc):
                raise
        except BaseException:
            connection.disconnect()
            raise
        return reply, self.run_on(connection, name, base, *args)


#: Calls a cluster client makes for one script when the slot's node answers
#: that nothing ran (MOVED, ASK, TRYAGAIN, CLUSTERDOWN, the library missing).
_CLUSTER_TRIES = 5


def _on_cluster(
    cluster: RedisCluster, base: str, command: tuple[Any, ...], resendable: bool
) -> Any:
    """Send ``command`` to the node serving ``base``'s slot, as the slot map
    says. A cluster client cannot tell FCALL's keys by itself (it would ask
    a node with COMMAND GETKEYS on every call, a node that may be the one
    that died), so the slot is looked up here. A connection error refreshes
    the slot map (redis-py does, for a named node); it is raised unless the
    script may run twice to the same effect (``resendable``)."""
    for attempt in range(_CLUSTER_TRIES):
        node = cluster.get_node_from_key(base)  # type: ignore[no-untyped-call]
        try:
            return cluster.execute_command(*command, target_nodes=node)  # type: ignore[no-untyped-call]
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            if not resendable or attempt == _CLUSTER_TRIES - 1:
                raise
            threading.Event().wait(0.05 * 2**attempt)  # a failover ends
        except (MovedError, AskError, ClusterDownError, TryAgainError,
                redis.exceptions.ClusterError, AttributeError) as exc:
            # redis-py's "TTL exhausted" (ClusterError): its own redirects ran
            # out (TRYAGAIN while the slot migrates); redis-py 8 following a
            # redirect to a node it has not met (one just added) fails with
            # an AttributeError before it sends anything there
            if isinstance(exc, AttributeError) and not _in_redis_py(exc):
                raise
            if type(exc) is redis.exceptions.ClusterError and "TTL exhausted" not in str(exc):
                raise
            if attempt == _CLUSTER_TRIES - 1:
                if isinstance(exc, (MovedError, AskError, ClusterDownError, TryAgainError)):
                    raise
                raise _moving(exc) from exc  # said as a call not run, for now (see run)
            cluster.nodes_manager.initialize()
            threading.Event().wait(0.05 * 2**attempt)  # a migration or failover ends
        except ResponseError as exc:
            if not function_missing(exc):
                raise
            if attempt == _CLUSTER_TRIES - 1:
                raise _replaced(exc) from exc
            load_library(node.redis_connection)  # a new or restarted node
    raise AssertionError("unreachable")


def _moving(exc: BaseException) -> TryAgainError:
    return TryAgainError(
        f"the queue's slot is moving between nodes (resharding; {type(exc).__name__}: {exc})")


def _in_redis_py(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside redis-py's cluster client."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_filename.replace("\\", "/").endswith(
        "redis/cluster.py")


def function_missing(reply: object) -> bool:
    """Whether a call's reply (or error) says the server lacks the library."""
    return isinstance(reply, ResponseError) and _MISSING in str(reply)


def load_library(client: Any, replace: bool = False) -> None:
    """Load the library on ``client``'s server (another client may have; a
    cluster client's: on every primary). With ``replace``, a library of
    the same name already there is replaced (``jobq functions load``: one
    loaded by a user who should not have, restored).

    Raises:
        RedisOOMError: the server is out of memory (FUNCTION LOAD is refused then).
        FunctionsNotLoaded: the user may not load functions, and they are
            not there.
    """
    try:
        client.function_load(_library()[0], replace=replace)
    except redis.exceptions.OutOfMemoryError as exc:
        raise _load_refused() from exc
    except redis.exceptions.NoPermissionError as exc:
        raise _load_not_permitted(exc) from exc
    except ResponseError as exc:
        if "already exists" not in str(exc):
            raise


def library_name() -> str:
    """The name of the library of this version of jobq (one per version)."""
    return _library()[1]


@contextlib.contextmanager
def _said_plainly(name: str) -> Iterator[None]:
    """Script ``name``'s call refused for lack of memory, raised as
    RedisOOMError, or by the user's ACL (inside the script), as a
    NoPermissionError (see ``_not_permitted``)."""
    try:
        yield
    except ResponseError as exc:
        if _script_not_permitted(exc):
            raise _not_permitted(name, exc) from exc
        if not isinstance(exc, redis.exceptions.OutOfMemoryError):
            raise
        if isinstance(exc, RedisOOMError):
            raise
        raise RedisOOMError(
            f"Redis is out of memory and refused the call ({name}): used_memory > "
            "maxmemory, maxmemory-policy noeviction; nothing of it ran"
        ) from exc


class FunctionsRefused(RedisOOMError):
    """The server, out of memory, refused to load jobq's functions."""


@contextlib.contextmanager
def _still_missing() -> Iterator[None]:
    """A call sent again once the library was loaded: a function still
    missing means a library of jobq's name that is not jobq's."""
    try:
        yield
    except ResponseError as exc:
        if function_missing(exc):
            raise _replaced(exc) from exc
        raise


def _replaced(exc: BaseException) -> ResponseError:
    return ResponseError(
        f"the library {_library()[1]} on this server is not jobq's ({exc}): a library was "
        "loaded under its name; `jobq functions load`, as a user who may load functions, "
        "restores it"
    )


class FunctionsNotLoaded(redis.exceptions.NoPermissionError):
    """jobq's functions are not on the server, and the user may not load
    them (no ``+function|load``): an admin loads them."""


def _script_not_permitted(exc: BaseException) -> bool:
    """Whether a script's call failed on a command, key or channel its
    user may not use (Redis: "The user executing the script can't run this
    command...", "... can't access at least one of the keys...", "... can't
    publish to the channel..."; Valkey: "ACL failure in script: ...")."""
    text = str(exc)
    return isinstance(exc, ResponseError) and (
        text.startswith(("ACL failure in script", "The user executing the script can't")))


def _not_permitted(name: str, exc: BaseException) -> redis.exceptions.NoPermissionError:
    """A script's refused command said as a NoPermissionError (the server
    replies a bare error, which ``except NoPermissionError`` missed)."""
    return redis.exceptions.NoPermissionError(
        f"this user's ACL refused a command, key or channel that jobq's {name!r} call "
        f"uses ({exc}); a script is not rolled back: what it wrote before that stays. "
        "Give the user the ACL line of its role (docs/guide/security.md)")


def _load_not_permitted(exc: BaseException) -> FunctionsNotLoaded:
    return FunctionsNotLoaded(
        f"jobq's functions ({_library()[1]}) are missing on this server (never loaded for "
        "this jobq version, lost, or replaced by another library of that name), and this "
        f"user may not load them ({exc}): an admin loads them: "
        "`jobq --url redis://ADMIN:PASSWORD@HOST:PORT functions load`"
    )


def _load_refused() -> RedisOOMError:
    return FunctionsRefused(
        f"Redis is out of memory and refused to load jobq's functions ({_library()[1]}: a "
        "new jobq version, or a server that lost them); nothing of jobq runs there until "
        "they are loaded: free memory, or raise maxmemory for a moment"
    )
