"""What Queue, Worker, QueueEvents and Job share about one queue."""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import redis

from . import _fork
from . import connection as _connection
from ._coalesce import CLOSE_GRACE
from ._threads import start_thread
from .calls import QueueScripts
from .errors import ClosedError, JobqError, PayloadTooLarge
from .keys import QueueKeys, validate_name, validate_prefix
from .scripts import Scripts

if TYPE_CHECKING:
    from .queue_events import QueueEvents


E = TypeVar("E")

#: Connections of a pool left to shared use when threads keep some to themselves.
POOL_RESERVE = 16

#: The default of ``Queue(max_payload_bytes=...)``: 1 MiB.
PAYLOAD_LIMIT = 1024 * 1024


class _Held:
    """What a context lets go of when it closes, kept apart from the context
    so that the context's finalizer can reach it (see ``QueueContext``)."""

    def __init__(self, client: Any, owned: bool, scripts: Scripts, settle: bool) -> None:
        self.client = client
        self.owned = owned
        self.scripts = scripts
        self.settle = settle  # let other threads' calls end before the client is cut
        self.events: Any = None  # a QueueEvents, or a ShardedQueueEvents
        self.bounded: Any = None
        self.deadline_connections: _connection.DeadlineConnections | None = None

    def release(self) -> None:
        """Close the shared reader, give back the connections, and close the
        client if jobq created it."""
        events, self.events = self.events, None
        try:  # interrupted in a wait (a Ctrl-C): the rest, which waits for nothing, still runs
            if events is not None:
                events.close()
        finally:
            self.scripts.close()
            # cut first: a thread still in a call on them (a wait's check,
            # with no deadline) fails at once, where a bare close could make
            # redis-py connect again under it and wait out the socket's timeout
            if self.bounded is not None and self.bounded is not self.client:
                _connection.cut_client(self.bounded)
                _connection.close_client(self.bounded)
            if self.deadline_connections is not None:
                self.deadline_connections.close()
            if self.owned:
                try:
                    if self.settle:
                        _connection.let_calls_end(self.client, CLOSE_GRACE)
                finally:
                    _connection.cut_client(self.client)
                    _connection.close_client(self.client)


def _release_unreachable(held: _Held, name: str) -> None:
    """The finalizer of a context nobody refers to any more (a Queue made
    for one request and never closed): its reader's threads and its
    connections are let go, on a thread of its own (a finalizer runs on
    whichever thread the collector does, maybe inside a lock the release
    takes)."""
    start_thread(f"jobq-release-{name}", held.release)


class QueueContext:
    """One queue on one client: keys, scripts and the shared event reader.

    A context nobody refers to any more (neither its owner nor a Job of it)
    releases what it held, as ``close()`` does: a Queue made per request and
    never closed leaves no threads or connections behind once collected.
    """

    def __init__(
        self, name: str, connection: object, prefix: str, kind: str = "queue",
        owned: bool | None = None,
    ) -> None:
        """``owned`` (default: whether jobq made the client from a URL or
        None) says whether ``close()`` closes the client."""
        self.kind = kind
        self.name = validate_name(name)
        self.prefix = validate_prefix(prefix)
        self.client, client_owned = _connection.resolve(connection)
        if kind == "queue" and not client_owned:
            _connection.check_shared_pool(self.client)
        if owned is not None:
            client_owned = owned
        self.keys = QueueKeys(self.prefix, self.name)
        self.scripts = Scripts(self.client)
        #: the scripts' typed front end, over ``run``
        self.calls = QueueScripts(self.run)
        #: the same, for the first-use setup itself (``run`` would wait for it)
        self.setup_calls = QueueScripts(
            lambda script, *args: self.scripts.run(script, self.keys.base, *args))
        # a Queue's calls are its users' (a Worker's or a reader's threads
        # are ended or cut before their client is)
        self._held = _Held(self.client, client_owned, self.scripts, kind == "queue")
        self._finalizer = weakref.finalize(self, _release_unreachable, self._held, self.name)
        self._finalizer.atexit = False  # at exit the process ends anyway
        #: the name users know the queue by: a shard's is its sharded queue's
        self.queue_name = self.name
        #: where ``shared_events`` comes from instead (a shard's: its part of
        #: the sharded queue's events)
        self.events_source: Callable[[], QueueEvents] | None = None
        #: the Queue was given pub/sub mode: its reader expects it while no
        #: mode is stored (its first add stores it, see EventMode)
        self.expects_pubsub = False
        #: the largest value (encoded) a job's data, progress or log line,
        #: or a custom event, may be: the Queue's max_payload_bytes
        self.payload_limit: int | None = PAYLOAD_LIMIT
        self._lock = threading.Lock()
        self._setup: Callable[[], None] | None = None
        self._setup_lock = threading.Lock()
        self.closed = False
        _fork.track(self)

    def sized(self, packed: bytes, what: str) -> bytes:
        """``packed``, unless it is over ``payload_limit`` (PayloadTooLarge)."""
        limit = self.payload_limit
        if limit is not None and len(packed) > limit:
            raise PayloadTooLarge(
                f"{what} encodes to {len(packed)} bytes, over the queue's "
                f"max_payload_bytes={limit}; store large data elsewhere and pass a reference, "
                "or raise max_payload_bytes"
            )
        return packed

    def on_first_use(self, setup: Callable[[], None]) -> None:
        """Have ``setup`` run before the first command (again on the next
        command while it raises): constructors do no I/O."""
        self._setup = setup

    def ensure_ready(self) -> None:
        """Run the first-use setup if it has not succeeded yet.

        Raises:
            ClosedError: the owner was closed.
        """
        _fork.check()
        if self.closed:
            raise ClosedError(f"{self.kind} {self.name!r} is closed")
        if self._setup is not None:
            with self._setup_lock:
                setup = self._setup
                if setup is not None:
                    setup()
                    self._setup = None

    @property
    def where(self) -> str:
        """The server's address for messages (its password hidden)."""
        return _connection.describe(self.client)
    def _after_fork(self) -> None:
        """In a forked child: a new lock (a parent's thread may have held
        it). The shared reader resets itself; a client jobq created has its
        pool reset (see _fork), a caller's resets itself (redis-py's pools
        check the process id)."""
        self._lock = threading.Lock()
        self._setup_lock = threading.Lock()

    @property
    def redis(self) -> Any:
        """The client, for a command of the caller's.

        Raises:
            ClosedError: the owner (Queue, Worker, QueueEvents) was closed.
        """
        _fork.check()
        if self.closed or self._setup is not None:
            self.ensure_ready()
        return self.client

    def run(self, script: str, *args: Any) -> Any:
        """Run one of the queue's scripts.

        Raises:
            ClosedError: the owner was closed.
        """
        if self.closed or self._setup is not None:
            self.ensure_ready()
        return self.scripts.run(script, self.keys.base, *args)

    def run_on(self, connection: Any, script: str, *args: Any) -> Any:
        """Run one of the queue's scripts on a connection of the caller's own
        (see ``own_connection``).

        Raises:
            ClosedError: the owner was closed.
        """
        if self.closed or self._setup is not None:
            self.ensure_ready()
        return self.scripts.run_on(connection, script, self.keys.base, *args)

    def can_hold(self, connections: int, reserve: int = POOL_RESERVE) -> bool:
        """Whether threads may keep ``connections`` connections of the
        client's pool to themselves and leave plenty for everything else: a
        plain client (a cluster client's calls need its routing) whose pool
        has room for them and ``reserve`` more."""
        client = self.client
        if not isinstance(client, redis.Redis) or client.connection is not None:
            return False
        limit = getattr(client.connection_pool, "max_connections", None)
        return limit is None or connections + reserve <= limit

    def own_connection(self) -> Any:
        """A connection taken from the client's pool for one thread's calls
        (give it back with ``release``), or None once closed."""
        if self.closed:
            return None
        return _connection.take_connection(self.client.connection_pool)

    def release(self, connection: Any) -> None:
        """Give back a connection from ``own_connection``."""
        if connection is not None:
            self.client.connection_pool.release(connection)

    @property
    def bounded(self) -> Any:
        """A client without retries, for calls that keep to a caller's
        timeout (see ``connection.bounded_client``), made on first use."""
        held = self._held
        if held.bounded is None:
            with self._lock:
                if held.bounded is None:
                    held.bounded = _connection.bounded_client(self.client)
        return held.bounded

    def run_bounded(self, script: str, *args: Any, deadline: float | None = None) -> Any:
        """Run one of the queue's scripts once, without the client's retries;
        with ``deadline`` (``time.monotonic``), raise redis-py's TimeoutError
        when no reply has come by then (on a cluster, the socket timeouts
        bound the call: see ``connection.bounded_client``).

        Raises:
            ClosedError: the owner was closed.
        """
        if self.closed or self._setup is not None:
            self.ensure_ready()
        connections = self.deadline_connections
        if deadline is None or connections is None:
            return self.scripts.run(script, self.keys.base, *args, client=self.bounded)
        with connections.lent(deadline) as connection:
            return self.scripts.run_on(connection, script, self.keys.base, *args,
                                       deadline=deadline)

    def calls_by(self, deadline: float | None) -> QueueScripts:
        """The scripts' front end over ``run_bounded`` with ``deadline``."""
        return QueueScripts(functools.partial(self.run_bounded, deadline=deadline))

    def command_by(self, deadline: float | None, *args: Any) -> Any:
        """Send one command on the bounded client; with ``deadline``
        (``time.monotonic``), raise redis-py's TimeoutError when no reply
        has come by then (on a cluster, the socket timeouts bound it)."""
        connections = self.deadline_connections
        if deadline is None or connections is None:
            return self.bounded.execute_command(*args)
        with connections.lent(deadline) as connection:
            connection.send_command(*args)
            return _connection.read_by(connection, deadline)

    @property
    def deadline_connections(self) -> _connection.DeadlineConnections | None:
        """Connections for calls bounded by a caller's deadline
        (``run_bounded``); None for a cluster or a client bound to one
        connection (their calls are bounded by the client's timeouts)."""
        held = self._held
        if held.deadline_connections is None and _connection.pooled(self.client):
            pool = self.bounded.connection_pool  # its settings: no retries
            with self._lock:
                if held.deadline_connections is None:
                    held.deadline_connections = _connection.DeadlineConnections(pool)
        return held.deadline_connections

    def shared_events(self) -> QueueEvents:
        """The QueueEvents shared by every user of this context, started lazily."""
        if self.events_source is not None:
            return self.events_source()
        return self.held_events(self._make_events)

    def held_events(self, make: Callable[[], E]) -> E:
        """The events reader this context holds (and closes), made by
        ``make`` on first use or once closed (a sharded queue's is sharded)."""
        with self._lock:
            if self.closed:
                raise ClosedError(f"{self.kind} {self.name!r} is closed")
            events = self._held.events
            if events is None or events.closed:
                events = self._held.events = make()
            return events  # type: ignore[no-any-return]

    def _make_events(self) -> QueueEvents:
        from .queue_events import QueueEvents

        events = QueueEvents(self.name, connection=self.client, prefix=self.prefix)
        events._reader.event_mode.expects_pubsub = self.expects_pubsub
        return events

    def close(self) -> None:
        """Close the shared reader and, if jobq created it, the client."""
        _fork.check()
        with self._lock:
            if self.closed:
                return
            self.closed = True
        self._finalizer.detach()
        self._held.release()


def not_a_shard(context: QueueContext, what: str) -> None:
    """Refuse ``what`` on a shard of a sharded queue (``ShardedQueue.shards``):
    a job id names its shard, so a job added to one would live where neither
    the sharded queue nor its workers look for it."""
    if context.queue_name != context.name:
        raise JobqError(f"{context.name!r} is a shard of sharded queue "
                        f"{context.queue_name!r}: {what} through the sharded queue")
