"""Build and wrap Redis clients; dedicated clients for blocking reads."""

from __future__ import annotations

import contextlib
import inspect
import os
import select
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry

from . import _fork, _sentinel

# A redis.Redis or a RedisCluster. redis-py types every reply as a union of
# bytes and str (it depends on decode_responses, which jobq refuses), so
# replies are handled as what they are here: bytes.
Client = Any

DEFAULT_URL = "redis://localhost:6379/0"
#: URL schemes that name a Redis Cluster (or Valkey Cluster) by one of its nodes.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}

#: Errors that say "try again later", never "this job failed": a lost or
#: refused connection, a server loading its data, a cluster slot moving or a
#: failover in progress.
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    redis.exceptions.ConnectionError,  # BusyLoadingError included
    redis.exceptions.TimeoutError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.ClusterError,
    redis.exceptions.MasterDownError,
    redis.exceptions.ReadOnlyError,
    OSError,
)

#: Longest single blocking read (s): a blocked read cannot be interrupted from
#: another thread, so this bounds how long ``close()`` may take.
BLOCK_CAP = 1.0
#: Socket timeout of blocking clients: longer than any block, so a healthy
#: blocked read never times out, yet a dead peer is noticed.
BLOCKING_SOCKET_TIMEOUT = BLOCK_CAP + 9.0


_DECODING = (
    "jobq needs a client that does not decode responses (decode_responses=False, "
    "also in a URL): payloads and results are binary msgpack"
)
#: The retry policy of jobq's own bounded calls: none (the caller's loop retries).
NO_RETRY = Retry(NoBackoff(), 0)


def resolve(connection: object, read_timeout: float | None = None) -> tuple[Client, bool]:
    """Return ``(client, owned)`` for a ``connection=`` argument.

    ``owned`` is True when jobq created the client and must close it.
    ``read_timeout``: the socket timeouts of a client made from a URL that
    gives none (``?socket_timeout=``), for a tool serving requests: a
    server that does not answer fails the request then, rather than holding
    it (and its thread) for good.

    Raises:
        TypeError: the argument is of no accepted type.
        ValueError: the client decodes responses (payloads are binary).
        redis.exceptions.AuthenticationError: a cluster URL's login is
            refused (a cluster's client connects as it is made).
    """
    if connection is None:
        connection = os.environ.get("JOBQ_REDIS_URL") or DEFAULT_URL
    if isinstance(connection, str):
        scheme, sep, rest = connection.partition("://")
        client: Client
        timeouts: dict[str, float] = {}
        if read_timeout is not None and "socket_timeout=" not in rest.partition("?")[2]:
            timeouts = {"socket_timeout": read_timeout, "socket_connect_timeout": read_timeout}
        if sep and scheme in CLUSTER_SCHEMES:
            try:  # it connects as it is made
                client = RedisCluster.from_url(f"{CLUSTER_SCHEMES[scheme]}://{rest}", **timeouts)
            except redis.exceptions.RedisClusterException as exc:
                if not login_refused(exc):
                    raise
                raise redis.exceptions.AuthenticationError(  # as one server's is said
                    f"the Redis server at {redact(connection)} refused the login: "
                    f"{_sentinel.brief(exc.__cause__ or exc)}") from exc
        elif sep and scheme in _sentinel.SENTINEL_SCHEMES:
            client = _sentinel.sentinel_client(connection)
        elif sep and scheme in ("redis", "rediss", "unix"):
            client = redis.Redis.from_url(connection, **timeouts)
        else:
            raise ValueError(f"connection URL {redact(connection)!r} is none of {_URLS}")
        if client.get_encoder().decode_responses:  # e.g. ?decode_responses=True
            close_client(client)
            raise ValueError(_DECODING)
        _fork.track_client(client)
        return client, True
    if isinstance(connection, (redis.Redis, RedisCluster)):
        if connection.get_encoder().decode_responses:
            raise ValueError(_DECODING)
        _fork.track_client(connection)  # jobq's threads use its pool too
        return connection, False
    raise TypeError(
        f"connection must be None, {_URLS}, a redis.Redis or a redis.cluster.RedisCluster, "
        f"not {type(connection).__name__}"
    )


_URLS = ("a redis://, rediss://, unix://, redis+cluster://, rediss+cluster://, "
         "redis+sentinel:// or rediss+sentinel:// URL")


def check_shared_pool(client: Client) -> None:
    """Refuse a caller's client whose pool cannot lend jobq two connections:
    the calls of all threads go out on one that jobq keeps (_coalesce.py),
    and loading the scripts takes another (a pool of one failed every call,
    the caller's own included, for as long as the Queue was open)."""
    size = getattr(getattr(client, "connection_pool", None), "max_connections", 2)
    if isinstance(size, int) and size < 2 and getattr(client, "connection", None) is None:
        raise ValueError(
            f"the client's connection pool allows {size} connection; jobq keeps one for its "
            "calls and needs another: give a pool of at least 2 (or a URL)"
        )


def describe(client: Client) -> str:
    """Where a client connects, as a URL without its password, for messages."""
    try:
        if isinstance(client, RedisCluster):
            nodes = client.get_nodes()  # type: ignore[no-untyped-call]
            first = nodes[0] if nodes else None
            where = f"{first.host}:{first.port}" if first is not None else "?"
            return f"redis+cluster://{where}"
        if _sentinel.is_sentinel(client):
            return _sentinel.describe(client)
        kwargs = client.connection_pool.connection_kwargs
        if "path" in kwargs:
            return f"unix://{kwargs['path']}?db={kwargs.get('db', 0)}"
        scheme = "rediss" if "ssl" in client.connection_pool.connection_class.__name__.lower() \
            else "redis"
        user = kwargs.get("username")
        auth = f"{user}:***@" if user else (":***@" if kwargs.get("password") else "")
        return f"{scheme}://{auth}{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}" \
            f"/{kwargs.get('db', 0)}"
    except Exception:  # a message must not fail
        return repr(client)


def redact(url: str) -> str:
    """``url`` with its password (in the user part or the query) shown as
    ``***``, for messages."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    rest, query_sep, query = rest.partition("?")
    auth, at, hosts = rest.rpartition("@")
    if at:
        user, colon, _ = auth.partition(":")
        rest = f"{user}:***@{hosts}" if colon else f"***@{hosts}"
    if query_sep:
        query = "&".join(
            f"{key}=***" if key.endswith("password") and eq else f"{key}{eq}{value}"
            for key, eq, value in (part.partition("=") for part in query.split("&"))
        )
    return f"{scheme}://{rest}{query_sep}{query}"


def login_refused(exc: BaseException | None) -> bool:
    """Whether ``exc``, or what caused it (a cluster client's "cannot be
    connected"; Sentinels that each refused theirs), is a refusal of the login."""
    while exc is not None:
        if isinstance(exc, redis.exceptions.AuthenticationError):
            return True
        if _sentinel.refused_by_sentinels(exc):
            return True
        exc = exc.__cause__
    return False


def moved(exc: BaseException) -> bool:
    """Whether a plain client met a cluster's MOVED reply: its URL names a
    node of a Redis Cluster (redis-py 5.0 leaves it a plain ResponseError)."""
    return isinstance(exc, redis.exceptions.MovedError) or (
        isinstance(exc, redis.exceptions.ResponseError) and str(exc).startswith("MOVED "))


def answered(exc: BaseException) -> bool:
    """Whether a ConnectionError says more than "unreachable" already: one
    that says so (``unreachable``'s), or a call the server answered but did
    not run for now (``Scripts.run``'s: the slot is moving, TRYAGAIN...)."""
    return str(exc).startswith("cannot reach the Redis server at ") or isinstance(
        exc.__cause__, redis.exceptions.ResponseError)


def first_use_failed(exc: redis.exceptions.RedisError, client: Client) -> Exception:
    """What a queue's first use that failed with ``exc`` raises: a server
    away, or a plain URL of a cluster's node, said as such (``unreachable``);
    anything else (a refusal, a call the server did not run for now) is
    ``exc`` itself."""
    lost = isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError))
    return unreachable(exc, client) if (lost and not answered(exc)) or moved(exc) else exc


def unreachable(exc: Exception, client: Client) -> Exception:
    """The same kind of redis-py error, its message naming the server; a
    MOVED reply to a plain client (see ``moved``) said as such."""
    if moved(exc):
        return redis.exceptions.ResponseError(
            f"the Redis server at {describe(client)} is a node of a Redis Cluster (it answered "
            f"MOVED {str(exc).removeprefix('MOVED ')}): connect with a redis+cluster:// URL")
    if _sentinel.refused_by_sentinels(exc):
        return redis.exceptions.AuthenticationError(
            f"the Sentinels of {describe(client)} refused the login (sentinel_username / "
            "sentinel_password)")
    if login_refused(exc):  # reached: it refused the login
        return redis.exceptions.AuthenticationError(
            f"the Redis server at {describe(client)} refused the login: {_sentinel.brief(exc)}")
    if isinstance(exc, redis.exceptions.NoPermissionError):  # reached: it refused a command
        return redis.exceptions.NoPermissionError(
            f"the Redis server at {describe(client)} refused a command: {exc} (give the "
            "user the ACL lines of its role: docs/guide/security.md)")
    cls = redis.exceptions.TimeoutError if isinstance(exc, redis.exceptions.TimeoutError) \
        else redis.exceptions.ConnectionError
    if pool_full(exc):  # the server was not asked: a pool of the caller's is in use
        size = getattr(getattr(client, "connection_pool", None), "max_connections", "?")
        return cls(f"no connection free in the client's pool for {describe(client)} "
                   f"(max_connections={size}: {exc}): give it more (jobq keeps one of them "
                   "for its calls)")
    return cls(f"cannot reach the Redis server at {describe(client)}: {_sentinel.brief(exc)}")


def pool_full(exc: BaseException) -> bool:
    """Whether ``exc`` says a connection pool had no connection to lend
    (redis-py's ConnectionPool, BlockingConnectionPool), not that the
    server is away."""
    if isinstance(exc, getattr(redis.exceptions, "MaxConnectionsError", ())):
        return True
    return isinstance(exc, redis.exceptions.ConnectionError) and str(exc) in (
        "Too many connections", "No connection available.")


_KEEP: Any = object()


def client_name(name: str) -> str:
    """``name`` made fit for CLIENT SETNAME, which refuses spaces and
    anything outside printable ASCII: each such character becomes ``_``."""
    return "".join(c if "!" <= c <= "~" else "_" for c in name)


def clone_client(
    client: Client, name: str, *, socket_timeout: Any = _KEEP, max_connections: int = 2,
    connect_once: bool = False,
) -> Client:
    """Return a new client of the same server with a pool of its own.

    It has no client-level retries (the calling loop owns reconnection and
    backoff), at most ``max_connections`` connections (per node on a
    cluster), connections named ``name`` (made fit for CLIENT SETNAME), and
    the given socket timeout (the original's by default). With
    ``connect_once`` the caller learns of every lost connection: a pool
    does not connect again one lost while idle (see ``ConnectOnce``), nor
    does a cluster client send a command again on a new connection.
    """
    name = client_name(name)
    if isinstance(client, RedisCluster):
        # A cluster client of its own, from the nodes the caller's knows: it
        # routes each command to its slot's node, and follows MOVED itself.
        # (db: a URL's /0, which RedisCluster() refuses though from_url keeps it)
        options = {
            k: v for k, v in client.nodes_manager.connection_kwargs.items()
            if k not in ("redis_connect_func", "oss_cluster_maint_notifications_handler", "db")
        }
        options.update(client_name=name, max_connections=max_connections)
        if socket_timeout is not _KEEP:
            options["socket_timeout"] = socket_timeout
        nodes = [
            ClusterNode(node.host, node.port)  # type: ignore[no-untyped-call]
            for node in client.get_nodes()  # type: ignore[no-untyped-call]
        ]
        if connect_once:
            options["redis_connect_func"] = ConnectOnce(_handshaken, cluster=True)
        cluster = RedisCluster(startup_nodes=nodes, **options)
        if connect_once:  # a command cut by a lost connection is not sent again
            cluster.retry = Retry(NoBackoff(), 0)  # redis-py 6 and later
            cluster.cluster_error_retry_attempts = 0  # type: ignore[attr-defined]  # before 6
        return _fork.track_client(cluster)
    kwargs = dict(client.connection_pool.connection_kwargs)
    kwargs.update(retry=Retry(NoBackoff(), 0), client_name=name)
    if connect_once:
        kwargs["redis_connect_func"] = ConnectOnce(kwargs.get("redis_connect_func"))
    if socket_timeout is not _KEEP:
        kwargs["socket_timeout"] = socket_timeout
    kwargs.pop("retry_on_timeout", None)
    kwargs.pop("retry_on_error", None)
    pool: redis.ConnectionPool
    if _sentinel.is_sentinel(client):  # its own pool, finding the master as the caller's does
        pool = _sentinel.clone_pool(client.connection_pool, max_connections, kwargs)
    else:
        pool = redis.ConnectionPool(
            connection_class=client.connection_pool.connection_class,
            max_connections=max_connections, **kwargs,
        )
    return _fork.track_client(redis.Redis(connection_pool=pool))


class ConnectOnce:
    """``redis_connect_func`` of a loop's own client: each connection
    connects once; connecting it again raises ConnectionError. On a cluster
    (whose client closes connections on purpose, the ones it asked for the
    cluster's layout, and connects them again) only a connection its pool
    found closed by the server is refused.

    A connection the server closed while it sat in the pool is connected
    again, silently, when the pool lends it next. The loop never learns
    that its connection was lost, and skips what it does on a reconnect:
    the events reader's look for events trimmed meanwhile and its re-check
    of the waiters (a wait then ran out its timeout), the fetcher's new
    connection id for CLIENT UNBLOCK (``close()`` then waited for the
    block to end). Refused, the loss reaches the loop, which reconnects
    with a new client."""

    def __init__(self, then: Callable[[Any], None] | None = None, *, cluster: bool = False) -> None:
        self._then = then  # a connect function of the caller's client
        self._cluster = cluster
        self._made: weakref.WeakSet[Any] = weakref.WeakSet()

    def __call__(self, connection: Any) -> None:
        if connection in self._made or getattr(connection, "_jobq_lost", False):
            raise redis.exceptions.ConnectionError("Connection lost while idle.")
        if self._then is not None:
            self._then(connection)
        else:
            connection.on_connect()
        if not self._cluster:
            self._made.add(connection)
        elif "can_read" not in vars(connection):  # its first connect
            connection.can_read = _noting_loss(connection, connection.can_read)


def _noting_loss(connection: Any, can_read: Callable[..., bool]) -> Callable[..., bool]:
    """``can_read`` of ``connection`` that marks it lost when its socket is
    found closed."""
    def checked(timeout: float | None = 0) -> bool:
        try:
            return can_read(timeout)
        except (redis.exceptions.ConnectionError, OSError):
            connection._jobq_lost = True
            raise
    return checked


def _handshaken(connection: Any) -> None:
    """The connect function after a cluster client's own, which did the
    handshake: nothing more to do."""


def blocking_client(client: Client, name: str) -> Client:
    """Return a new client for one thread's blocking reads.

    It has its own connection, a socket timeout longer than any block and no
    client-level retries: the calling loop owns reconnection and backoff,
    and learns of every lost connection (see ``ConnectOnce``).
    """
    return clone_client(client, name, socket_timeout=BLOCKING_SOCKET_TIMEOUT, connect_once=True)


#: First words of error replies that say "try again": the server is busy
#: with a script, loading, failing over or moving a slot.
_TRANSIENT_REPLIES = frozenset(
    {"BUSY", "LOADING", "MASTERDOWN", "READONLY", "TRYAGAIN", "CLUSTERDOWN", "NOSCRIPT"}
)


def is_transient(exc: BaseException) -> bool:
    """Whether an error from a call means "try again later", never "this
    call is wrong": a lost connection, or an error reply such as BUSY,
    LOADING, MASTERDOWN, READONLY, TRYAGAIN, CLUSTERDOWN or NOSCRIPT."""
    if isinstance(exc, (*TRANSIENT_ERRORS, redis.exceptions.NoScriptError)):
        return True
    if isinstance(exc, redis.exceptions.ResponseError):
        status = getattr(exc, "status_code", None) or str(exc).split(" ", 1)[0]
        return status in _TRANSIENT_REPLIES
    return False


#: Seconds a subscription's confirmations may take to come.
SUBSCRIBE_TIMEOUT = 10.0

#: Whether a cluster's subscription waits for its timeout when read with no
#: node named: before redis-py 8 it returns at once, and a loop reading it
#: spun a core while idle (see ``next_message``).
_CLUSTER_READS_WAIT = int(redis.__version__.split(".")[0]) >= 8


def next_message(pubsub: Any, timeout: float) -> Any:
    """The next message of a (sharded) subscription within ``timeout``
    seconds; None when none came. A cluster's subscription before redis-py
    8 is read on its node by name (one node), else polled on every node
    and waited on by their sockets."""
    mapping = getattr(pubsub, "node_pubsub_mapping", None)
    if not mapping or _CLUSTER_READS_WAIT:
        return pubsub.get_sharded_message(timeout=timeout)
    if len(mapping) == 1:
        node = pubsub.cluster.get_node(node_name=next(iter(mapping)))
        if node is not None:
            return pubsub.get_sharded_message(timeout=timeout, target_node=node)
    for _ in range(len(mapping)):  # round robin: each node's buffered messages first
        message = pubsub.get_sharded_message(timeout=0)
        if message is not None:
            return message
    sockets = [sock for sock in (getattr(sub.connection, "_sock", None)
                                 for sub in list(mapping.values())) if sock is not None]
    if timeout > 0 and sockets:
        select.select(sockets, [], [], timeout)
    return pubsub.get_sharded_message(timeout=0)


def ssubscribe(pubsub: Any, channels: Iterable[Any], stopping: Callable[[], bool],
               what: str, sharded: bool = True) -> None:
    """SSUBSCRIBE ``pubsub`` to each channel (one slot per command; SUBSCRIBE
    when not ``sharded``) and wait for every confirmation: from then on no
    message published there is missed. ConnectionError naming ``what`` when
    they do not all come within SUBSCRIBE_TIMEOUT, or once ``stopping()``."""
    channels = list(channels)
    for channel in channels:
        if sharded:
            pubsub.ssubscribe(channel)
        else:
            pubsub.subscribe(channel)
    confirmed = 0
    kinds = ("ssubscribe", b"ssubscribe") if sharded else ("subscribe", b"subscribe")
    deadline = time.monotonic() + SUBSCRIBE_TIMEOUT
    while confirmed < len(channels):
        message = next_message(pubsub, BLOCK_CAP)
        if message is not None and message["type"] in kinds:
            confirmed += 1
        elif stopping() or time.monotonic() > deadline:
            raise ConnectionError(f"no subscribe confirmation on {what}")


def close_subscription(client: Client | None, pubsub: Any) -> None:
    """Close a (sharded) subscription and its client, ignoring errors: on a
    cluster each node's subscription holds a connection of its own."""
    if pubsub is not None:
        mapping = getattr(pubsub, "node_pubsub_mapping", None) or {}
        for sub in (*mapping.values(), pubsub):
            try:
                sub.close()
            except Exception:  # closing is best effort
                pass
    if client is not None:
        close_client(client)


def close_client(client: Client) -> None:
    """Close a client and disconnect its pool, ignoring errors."""
    try:
        if isinstance(client, RedisCluster):
            # close() of a cluster client can leave node connections open
            for node in client.get_nodes():  # type: ignore[no-untyped-call]
                if node.redis_connection is not None:
                    node.redis_connection.connection_pool.disconnect()
            client.close()
        else:
            client.close()
            client.connection_pool.disconnect()
            _sentinel.close_own(client)
    except Exception:  # closing is best effort
        pass


#: Socket timeouts (s) of any connection a cut client makes (see ``cut_client``).
CUT_TIMEOUT = 0.01


def cut_client(client: Client | None) -> None:
    """Cut every connection of a client jobq is about to throw away, those
    other threads are using included (a shut-down socket wakes a blocked
    read, or a handshake), and make any connection it makes from now on
    give up within ``CUT_TIMEOUT``: redis-py reconnects a subscription, and
    a resent call, before giving up, and on a server that accepts but does
    not answer the new handshake would block for the socket timeout (for
    ever without one)."""
    if client is None:
        return
    timeouts = {"socket_timeout": CUT_TIMEOUT, "socket_connect_timeout": CUT_TIMEOUT}
    if isinstance(client, RedisCluster):
        client.nodes_manager.connection_kwargs.update(timeouts)  # nodes found from now on
    for pool in _pools(client, sentinels=True):
        pool.connection_kwargs.update(timeouts)
        with getattr(pool, "_lock", None) or contextlib.nullcontext():
            connections = [  # a BlockingConnectionPool keeps them in _connections
                *getattr(pool, "_connections", ()),
                *getattr(pool, "_available_connections", ()),
                *getattr(pool, "_in_use_connections", ()),
            ]
        for connection in connections:
            connection.socket_timeout = connection.socket_connect_timeout = CUT_TIMEOUT
        try:
            pool.disconnect()
        except Exception:  # cutting is best effort
            pass


def _pools(client: Client, sentinels: bool = False) -> list[Any]:
    """The connection pools of ``client`` (of each cluster node it knows;
    with ``sentinels``, of the Sentinels jobq made for it too)."""
    if isinstance(client, RedisCluster):
        return [node.redis_connection.connection_pool
                for node in client.get_nodes()  # type: ignore[no-untyped-call]
                if node.redis_connection is not None]
    pools = [client.connection_pool]
    if sentinels:
        pools.extend(s.connection_pool for s in _sentinel.own_sentinels(client))
    return pools


def let_calls_end(client: Client, timeout: float) -> None:
    """Wait, ``timeout`` at most, for the calls other threads make on
    ``client``'s connections to end (before it is cut: a call cut after the
    server ran it raised ConnectionError, and a caller that retried on it
    did it twice). redis-py tells no one when a connection comes back to
    its pool: its pools are looked at every few milliseconds."""
    deadline = time.monotonic() + timeout
    idle = threading.Event()  # never set: a bounded pause between looks
    while time.monotonic() < deadline:
        try:
            if not any(getattr(pool, "_in_use_connections", ()) for pool in _pools(client)):
                return
        except Exception:  # a client closing under the look: nothing to wait for
            return
        idle.wait(0.005)


def cut_connection(connection: Any) -> None:
    """End, from another thread, whatever call runs on ``connection``: shut
    its socket down, so that the owner's read or write fails at once (the
    owner then disconnects it), and make any reconnect give up within
    ``CUT_TIMEOUT``. Never ``disconnect()`` it from here: redis-py would
    connect again under its owner's next write, and a handshake cut
    between two of its pipelined commands then waits, on the new socket,
    for the reply of one sent on the old (for the socket timeout)."""
    connection.socket_timeout = connection.socket_connect_timeout = CUT_TIMEOUT
    sock = connection._sock
    if sock is not None and getattr(connection, "pid", None) == os.getpid():  # not a parent's
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # closed by its owner meanwhile
            pass


#: Longest single poll (s) of a read bounded by a deadline (see ``read_by``).
READ_SLICE = 0.1


def read_by(connection: Any, deadline: float | None) -> Any:
    """``connection.read_response()``, or redis-py's TimeoutError once
    ``deadline`` (``time.monotonic``) passes with no reply: a server that
    accepted the call but does not answer (stopped, or busy with a long
    script) cannot hold a caller past its own time, whatever the socket
    timeout (none by default in redis-py 5). The caller drops the
    connection: its reply may still come."""
    if deadline is not None:
        while True:
            # in slices: a connection cut by a close from another thread ends
            # the wait (its socket closed, the poll could be left on a file
            # descriptor reused meanwhile by another connection)
            if getattr(connection, "_sock", True) is None:
                raise redis.exceptions.ConnectionError("the connection was closed")
            left = deadline - time.monotonic()
            if left <= 0:
                raise redis.exceptions.TimeoutError("no reply within the caller's time")
            if connection.can_read(timeout=min(left, READ_SLICE)):
                break
    return connection.read_response()


class _ConnectWatch:
    """Cut a connection whose connect outlasts ``seconds``: each round trip
    of its handshake (the login, CLIENT SETNAME, SETINFO, SELECT) is bounded
    by the socket timeout, not all of them together; on a slow link a check
    with one second left took two."""

    def __init__(self, connection: Any, seconds: float) -> None:
        self._connection = connection
        self._lock = threading.Lock()
        self._ended = threading.Event()
        self._cut = False
        self._thread = threading.Thread(target=self._watch, args=(seconds,),
                                        name="jobq-connect-watch", daemon=True)
        self._thread.start()

    def _watch(self, seconds: float) -> None:
        if self._ended.wait(seconds):
            return
        with self._lock:
            if self._ended.is_set():
                return
            self._cut = True
        cut_connection(self._connection)  # never disconnect(): see there

    def end(self) -> bool:
        """Stop watching; whether the connection was cut."""
        with self._lock:
            self._ended.set()
            cut = self._cut
        self._thread.join()
        return cut


class DeadlineConnections:
    """Connections of ``pool``'s server for calls that must end by a caller's
    deadline (a wait's record checks): each is connected, handshake
    included, within the deadline of the call that needs it, where the
    pool's own would connect under the client's socket timeouts (none by
    default in redis-py 5: a server that accepts but does not answer would
    hold the caller for ever). Kept for reuse, at most IDLE of them; not
    one connected in less than KEEP_AFTER seconds (the socket keeps the
    timeout it was connected under, and a later call may have more time)."""

    IDLE = 16
    KEEP_AFTER = 1.0

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self._after_fork()
        _fork.track(self)

    def _after_fork(self) -> None:
        """Forget the parent's connections (their sockets are the parent's)."""
        self._lock = threading.Lock()
        self._idle: list[Any] = []
        self._busy: set[Any] = set()  # lent out: close() cuts their calls short
        self._closed = False

    @contextlib.contextmanager
    def lent(self, deadline: float) -> Iterator[Any]:
        """A connection for one call, connected by ``deadline`` (else
        redis-py's TimeoutError); kept afterwards, or closed if the call
        failed (its reply may still come)."""
        connection, keep = self.take(deadline)
        try:
            yield connection
        except BaseException:
            keep = False
            raise
        finally:
            self.give(connection, keep)

    def take(self, deadline: float) -> tuple[Any, bool]:
        """A connection, connected by ``deadline`` (else redis-py's
        TimeoutError), and whether to keep it after the call (``give``)."""
        with self._lock:
            connection = self._idle.pop() if self._idle else None
        if connection is not None:
            try:  # closed by the server meanwhile (bytes nobody asked for, or EOF)?
                stale = connection.can_read(timeout=0)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
                stale = True
            if not stale:
                return self._lent(connection), True
            connection.disconnect()
        pool = self._pool
        connection = pool.connection_class(**pool.connection_kwargs)
        left = deadline - time.monotonic()
        if left <= 0:
            raise redis.exceptions.TimeoutError("no time left to connect")
        saved = connection.socket_timeout, connection.socket_connect_timeout
        connection.socket_timeout = min(saved[0] or left, left)
        connection.socket_connect_timeout = min(saved[1] or left, left)
        self._lent(connection)  # from now on: close() cuts its connect short too
        watch = _ConnectWatch(connection, left)
        try:
            try:
                connection.connect()
            except BaseException as exc:
                if watch.end():
                    raise redis.exceptions.TimeoutError("no time left to connect") from exc
                raise
            if watch.end():  # connected as the deadline cut it: of no use now
                raise redis.exceptions.TimeoutError("no time left to connect")
            with self._lock:
                if self._closed:  # cut before it had a socket to shut down
                    raise redis.exceptions.ConnectionError("the connections were closed")
                connection.socket_timeout, connection.socket_connect_timeout = saved
        except BaseException:
            self.give(connection, False)
            raise
        return connection, left >= self.KEEP_AFTER

    def _lent(self, connection: Any) -> Any:
        with self._lock:
            if self._closed:  # close() has cut the others: this one too
                connection.disconnect()
                raise redis.exceptions.ConnectionError("the connections were closed")
            self._busy.add(connection)
        return connection

    def give(self, connection: Any, keep: bool) -> None:
        """Keep a connection for the next call, unless ``keep`` is False (a
        short connect, or a failed call) or IDLE are kept already: then it
        is closed."""
        with self._lock:
            self._busy.discard(connection)
            if keep and not self._closed and len(self._idle) < self.IDLE:
                self._idle.append(connection)
                return
        connection.disconnect()

    def close(self) -> None:
        """Close the connections kept, and those given back from now on; cut
        those lent out (their calls, or connects, end with an error, as on a
        closed client; their threads close them)."""
        with self._lock:
            idle, busy, self._idle, self._closed = self._idle, list(self._busy), [], True
            for connection in busy:  # under the lock: not restored by take() now
                cut_connection(connection)
        for connection in idle:
            connection.disconnect()


def database(client: Client) -> str:
    """The number of the database a client uses, as text ("0" on a cluster,
    which has no other)."""
    if isinstance(client, RedisCluster):
        return "0"
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None) or {}
    return str(int(kwargs.get("db") or 0))


def pooled(client: Any) -> bool:
    """Whether ``client`` is a plain client with a pool to lend connections
    (not a cluster client, a pipeline or a client bound to one connection)."""
    return (isinstance(client, redis.Redis) and not isinstance(client, redis.client.Pipeline)
            and client.connection is None)


# redis-py 5's ``get_connection`` wants a command name; later versions warn
# when given one. Decided once, so that no failed first try is chained into
# the traceback of an error the pool raises.
_NAME = (inspect.signature(redis.ConnectionPool.get_connection)
         .parameters.get("command_name"))
_WANTS_NAME = _NAME is not None and _NAME.default is inspect.Parameter.empty


def take_connection(pool: Any) -> Any:
    """A connection from a client's pool (give it back with ``pool.release``)."""
    if _WANTS_NAME:
        return pool.get_connection("EVALSHA")
    return pool.get_connection()


def connected(connection: Any) -> Any:
    """``connection``, connected. A connection that a thread keeps is
    connected again by redis-py's send methods to the address it had last,
    where ``connect()`` asks a Sentinel-managed connection's Sentinels for
    the master's: after a failover, the new master's."""
    if connection._sock is None:
        connection.connect()
    return connection


def call_on(connection: Any, *args: Any, check_health: bool = True) -> Any:
    """Send one command on ``connection`` and read its reply. Any failure
    disconnects it (a reply may be left unread: it is never reused)."""
    try:
        connected(connection).send_command(*args, check_health=check_health)
        return connection.read_response()
    except BaseException:
        connection.disconnect()
        raise


def xread(client: Client, key: str, last: str, count: int, block_ms: int,
          connection: Any = None) -> Any:
    """XREAD one stream. A cluster client is told the node: left to itself,
    it asks the server for XREAD's keys (COMMAND GETKEYS) before every read.
    A plain client's read goes straight to a connection of its pool (the
    client's per-command layers cost an event reader about half its time)
    and is returned as redis-py's RESP2 parsing would: ``[[key, [(id,
    {field: value})]]]``, or None when the block ended with nothing.
    ``connection``: a connection of the plain client's pool that the caller
    keeps between reads (it is neither lent nor given back here; an error
    disconnects it)."""
    if isinstance(client, RedisCluster):
        node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
        return client.execute_command(  # type: ignore[no-untyped-call]
            "XREAD", "COUNT", count, "BLOCK", block_ms, "STREAMS", key, last, target_nodes=node
        )
    if not isinstance(client, redis.Redis) or client.connection is not None:
        return client.xread({key: last}, count=count, block=block_ms)
    pool = client.connection_pool
    held = connection is not None
    if not held:
        connection = take_connection(pool)
    try:
        reply = call_on(connection, "XREAD", "COUNT", count, "BLOCK", block_ms, "STREAMS", key,
                        last, check_health=not held)
    finally:
        if not held:
            pool.release(connection)
    if not reply:
        return None
    # one stream: RESP2 [[key, entries]], RESP3 {key: entries}; an entry is
    # [id, [field, value, ...]] in both
    entries = next(iter(reply.values())) if isinstance(reply, dict) else reply[0][1]
    return [[key, [(eid, dict(zip(flat[::2], flat[1::2], strict=True))) for eid, flat in entries]]]


Blocked = tuple[str, int, int]  # host, port and id of a blocked connection


def client_id(client: Client, key: str) -> Blocked | None:
    """Where a blocking client's reads of ``key`` run: its node and the
    server-side id of its connection, for ``unblock``."""
    if isinstance(client, RedisCluster):
        node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
        return node.host, node.port, int(node.redis_connection.client_id())
    kwargs = client.connection_pool.connection_kwargs
    return kwargs.get("host", ""), kwargs.get("port", 0), int(client.client_id())


#: Socket timeout of the one-off connection that sends CLIENT UNBLOCK: a
#: close must not hang on a server that does not answer.
UNBLOCK_TIMEOUT = 0.5


def unblock(client: Client, blocked: Blocked | None, timeout: float = UNBLOCK_TIMEOUT) -> None:
    """Wake a connection blocked in BZPOPMIN / XREAD (it returns as if timed
    out), so that a close need not wait for the block to end. Best effort,
    on a connection of its own that waits at most ``timeout``."""
    if blocked is None:
        return
    host, port, blocked_id = blocked
    try:
        if isinstance(client, RedisCluster):
            node = client.get_node(host=host, port=port)  # type: ignore[no-untyped-call]
            if node is None or node.redis_connection is None:
                return
            client = node.redis_connection
        kwargs = dict(client.connection_pool.connection_kwargs)
        kwargs.update(socket_timeout=timeout, socket_connect_timeout=timeout,
                      retry=Retry(NoBackoff(), 0), client_name=None)
        kwargs.pop("retry_on_timeout", None)
        kwargs.pop("retry_on_error", None)
        connection = client.connection_pool.connection_class(**kwargs)
        try:
            connected(connection).send_command("CLIENT", "UNBLOCK", blocked_id)
            connection.read_response()
        finally:
            connection.disconnect()
    except Exception:  # e.g. no permission, or no answer: the block ends by itself
        pass


def bounded_client(client: Client) -> Client:
    """A client for jobq's own short calls that must keep to a caller's
    timeout (a wait's record checks, the stack traces of a failed run, the
    pub/sub checkpoint, waking and unblocking a reader): the same server and
    settings as ``client`` but no retries, whose backoff (redis-py's
    default: 10 attempts) would outlast those timeouts.

    Returned as it is (excluded, their calls keep the caller's retry
    policy): a client bound to a single connection, and a ``RedisCluster``.
    redis-py gives a cluster's node connections no retries of their own;
    the cluster client's ``retry`` (3 retries by default) re-reads the
    topology between attempts, without backoff (0.25 s pauses on
    CLUSTERDOWN), so a call on a cluster may outlast a caller's timeout by
    those attempts, each bounded by the client's socket timeouts. A second
    cluster client without retries is not built: it would connect to the
    cluster when made, and hold connections to every node."""
    if not isinstance(client, redis.Redis) or client.connection is not None:
        return client
    kwargs = dict(client.connection_pool.connection_kwargs)
    kwargs["retry"] = NO_RETRY
    kwargs.pop("retry_on_timeout", None)
    kwargs.pop("retry_on_error", None)
    pool = redis.ConnectionPool(connection_class=client.connection_pool.connection_class, **kwargs)
    bounded = redis.Redis(connection_pool=pool)
    _fork.track_client(bounded)
    return bounded


def stream_entries(reply: Any) -> list[Any]:
    """The entries of an XREAD reply for one stream (see ``streams_entries``)."""
    streams = streams_entries(reply)
    return streams[0][1] if streams else []


def streams_entries(reply: Any) -> list[tuple[str, list[Any]]]:
    """Each stream's key and entries in an XREAD reply: a list of
    ``[key, entries]`` pairs in RESP2, a map of key to entries in RESP3."""
    if not reply:
        return []
    resp3 = isinstance(reply, dict)
    pairs = reply.items() if resp3 else ((item[0], item[1]) for item in reply)
    streams = []
    for key, value in pairs:
        # redis-py wraps RESP3's entries in one more list
        if resp3 and value and isinstance(value[0], list):
            value = value[0]
        streams.append((key.decode() if isinstance(key, bytes) else str(key), list(value)))
    return streams
