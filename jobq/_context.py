"""What Queue, Worker, QueueEvents and Job share about one queue."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis

from . import _fork
from . import connection as _connection
from .calls import QueueScripts
from .errors import ClosedError
from .keys import QueueKeys, validate_name, validate_prefix
from .scripts import Scripts

if TYPE_CHECKING:
    from .queue_events import QueueEvents


#: Connections of a pool left to shared use when threads keep some to themselves.
POOL_RESERVE = 16


class QueueContext:
    """One queue on one client: keys, scripts and the shared event reader."""

    def __init__(
        self, name: str, connection: object, prefix: str, kind: str = "queue",
        owned: bool | None = None,
    ) -> None:
        """``owned`` (default: whether jobq made the client from a URL or
        None) says whether ``close()`` closes the client."""
        self.kind = kind
        self.name = validate_name(name)
        self.prefix = validate_prefix(prefix)
        self.client, self._owned = _connection.resolve(connection)
        if owned is not None:
            self._owned = owned
        self.keys = QueueKeys(self.prefix, self.name)
        self.scripts = Scripts(self.client)
        #: the scripts' typed front end, over ``run``
        self.calls = QueueScripts(self.run)
        self._events: QueueEvents | None = None
        #: the name users know the queue by: a shard's is its sharded queue's
        self.queue_name = self.name
        #: where ``shared_events`` comes from instead (a shard's: its part of
        #: the sharded queue's events)
        self.events_source: Callable[[], QueueEvents] | None = None
        self._bounded: Any = None
        self._deadline_connections: _connection.DeadlineConnections | None = None
        self._lock = threading.Lock()
        self._setup: Callable[[], None] | None = None
        self._setup_lock = threading.Lock()
        self.closed = False
        _fork.track(self)

    def on_first_use(self, setup: Callable[[], None]) -> None:
        """Have ``setup`` run before the first command (again on the next
        command while it raises): constructors do no I/O."""
        self._setup = setup

    def ensure_ready(self) -> None:
        """Run the first-use setup if it has not succeeded yet.

        Raises:
            ClosedError: the owner was closed.
        """
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
        if self._bounded is None:
            with self._lock:
                if self._bounded is None:
                    self._bounded = _connection.bounded_client(self.client)
        return self._bounded

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
        if self._deadline_connections is None and _connection.pooled(self.client):
            pool = self.bounded.connection_pool  # its settings: no retries
            with self._lock:
                if self._deadline_connections is None:
                    self._deadline_connections = _connection.DeadlineConnections(pool)
        return self._deadline_connections

    def shared_events(self) -> QueueEvents:
        """The QueueEvents shared by every user of this context, started lazily."""
        if self.events_source is not None:
            return self.events_source()
        with self._lock:
            if self.closed:
                raise ClosedError(f"{self.kind} {self.name!r} is closed")
            if self._events is None or self._events.closed:
                from .queue_events import QueueEvents

                self._events = QueueEvents(
                    self.name, connection=self.client, prefix=self.prefix
                )
            return self._events

    def close(self) -> None:
        """Close the shared reader and, if jobq created it, the client."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            events, self._events = self._events, None
        if events is not None:
            events.close()
        self.scripts.close()
        if self._bounded is not None and self._bounded is not self.client:
            _connection.close_client(self._bounded)
        if self._deadline_connections is not None:
            self._deadline_connections.close()
        if self._owned:
            _connection.close_client(self.client)
