"""ShardedQueueEvents: the events of every shard of a sharded queue, to one
set of listeners.

Each shard's events are read by that shard's own ``QueueEvents`` (its
stream, its resume-from-last-id, its waiters); this class forwards them all
to one listener registry. Listeners of a per-job channel
(``"completed:<id>"``) and waits go to the reader of the job's shard only.
Events of different shards come in no guaranteed order relative to each
other; each shard's come in order.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from ._closing import ClosedOnExit
from ._reader import ALL
from ._shards import shard_names, shard_of, validate_count
from .connection import close_client, resolve
from .errors import ClosedError
from .events import Event
from .keys import validate_name
from .listeners import Listener, ListenerMethods, ListenerRegistry
from .queue_events import QueueEvents

if TYPE_CHECKING:
    pass

__all__ = ["ShardedQueueEvents"]


class ShardedQueueEvents(ListenerMethods, ClosedOnExit):
    """Read every shard's events of a sharded queue (see ``QueueEvents``).

    Args:
        queue_name: the sharded queue's name.
        shards: its shard count.
        connection: as for Queue (a client of the caller's is shared).
        prefix: the queue's key prefix.
        last_event_id: ``"$"`` (from now on) or ``"0"`` (everything retained),
            for every shard.
        blocking_timeout: as for QueueEvents.
        autorun: start reading at once; else call ``run()``.
    """

    def __init__(
        self,
        queue_name: str,
        *,
        shards: int,
        connection: object = None,
        prefix: str = "jobq",
        last_event_id: str = "$",
        blocking_timeout: float = 10,
        autorun: bool = True,
    ) -> None:
        if last_event_id not in ("$", "0"):
            raise ValueError("a sharded queue's readers start at '$' or '0'")
        self._name = validate_name(queue_name)
        self._prefix = prefix
        self._count = validate_count(shards)
        self._listeners = ListenerRegistry()
        self._lock = threading.Lock()
        self._closed = False
        self._client, self._owned = resolve(connection)
        self._readers = tuple(
            QueueEvents(
                shard, connection=self._client, prefix=prefix, last_event_id=last_event_id,
                blocking_timeout=blocking_timeout, autorun=False,
            )
            for shard in shard_names(self._name, self._count)
        )
        for reader in self._readers:
            reader.on_all_events(self._forward)
        if autorun:
            self.run()

    @property
    def name(self) -> str:
        """The sharded queue's name."""
        return self._name

    @property
    def prefix(self) -> str:
        """The queue's key prefix."""
        return self._prefix

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._closed

    @property
    def readers(self) -> tuple[QueueEvents, ...]:
        """Each shard's reader, in shard order."""
        return self._readers

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<ShardedQueueEvents {self._name!r} shards={self._count} {state}>"

    def reader_for(self, job_id: str) -> QueueEvents:
        """The reader of the shard of a job (``Job.wait_until_finished``
        given this object waits through it)."""
        if self._closed:
            raise ClosedError(f"QueueEvents {self._name!r} is closed")
        return self._readers[shard_of(job_id, self._count)]

    def run(self) -> ShardedQueueEvents:
        """Start every shard's reader; return self."""
        for reader in self._readers:
            reader.run()
        return self

    def wait_until_ready(self, timeout: float | None = None) -> bool:
        """Wait until every shard's reader is ready (see QueueEvents)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in self._readers:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not reader.wait_until_ready(left):
                return False
        return True

    def _forward(self, event: Event) -> None:
        self._listeners.emit(event.name, event)
        if event.job_id is not None:
            self._listeners.emit(f"{event.name}:{event.job_id}", event)
        self._listeners.emit(ALL, event)

    def on_all_events(self, callback: Listener) -> Listener:
        """Call ``callback(event)`` on every event of every shard."""
        return self._listeners.on(ALL, callback)

    def off_all_events(self, callback: Listener) -> bool:
        """Remove an ``on_all_events`` listener."""
        return self._listeners.off(ALL, callback)

    def wait_for(self, job_id: str, timeout: float | None = None, run: str | None = None,
                 **kwargs: Any) -> Any:
        """Wait for a job through its shard's reader (see QueueEvents)."""
        return self.reader_for(job_id).wait_for(job_id, timeout, run, **kwargs)

    def future_for(self, job_id: str, run: str | None = None) -> Future[Any]:
        """A Future of a job's outcome, through its shard's reader (see QueueEvents)."""
        return self.reader_for(job_id).future_for(job_id, run)

    def close(self, timeout: float | None = 5.0) -> None:
        """Close every shard's reader."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in self._readers:
            reader.close(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if self._owned:
            close_client(self._client)

