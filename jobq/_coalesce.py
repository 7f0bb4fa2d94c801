"""One connection that carries the script calls of many threads, written
together and read together (what ioredis calls auto-pipelining).

Sixteen threads that each send a call and wait for its reply spend their
time in system calls and in handing the interpreter lock to one another:
on 2 cores here, 16 threads doing SET round trips on a pool reached about
5,500 calls/s at 215 us of client CPU each, and about 17,000-20,000 calls/s
at 56-63 us each when the calls of all waiting threads went out in one
write and came back in one read (bench/README.md, "Coalescing").

No thread of its own: the first caller that finds no batch in flight leads.
It takes every call queued so far (its own included), writes them in one
``sendall``, reads the replies in order, and wakes their callers. Calls
that arrived meanwhile wait for the next batch, led by the first of them,
whom the leader wakes. A caller alone is its own leader at once: its call
costs what a call on a pooled connection costs.

A failure of the connection fails every call of the batch in flight
(the server may have run any of them: the callers decide, as for a call
of their own); the connection reconnects on the next batch. A close lets
the batch in flight end (CLOSE_GRACE at most); a call that has not gone
out by then raises ``ClosedError``: nothing of it was sent.

Every queue of one client shares its client's coalescer (``shared``): one
connection for all of them, not one each (a dashboard of a hundred queues
ran out of its pool's connections), and their concurrent calls batched
together.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import weakref
from typing import Any

from redis.exceptions import ConnectionError, ResponseError, TimeoutError

from . import _fork
from ._threads import wait_event
from .connection import cut_connection, take_connection
from .errors import ClosedError

#: Longest wait of a caller for its batch, beyond the connection's socket
#: timeout: a leader's read ends by then (with its reply or an error).
FOLLOWER_MARGIN = 30.0

#: Longest wait of a close for the batch in flight: its calls may have run
#: (an add written), so they get their replies unless the server holds them
#: longer; then the connection is cut under them.
CLOSE_GRACE = 2.0


class _Call:
    __slots__ = ("packed", "done", "finished", "value", "error")

    def __init__(self, packed: bytes, done: threading.Event | None) -> None:
        self.packed = packed
        self.done = done  # a follower's; a leader needs none
        self.finished = False  # else, once done is set: lead the next batch
        self.value: Any = None
        self.error: BaseException | None = None


class _Idle:
    """Whether a connection is still as its last batch left it: nothing to
    read, not closed by the server. One ``poll`` of a plain socket, on a
    poller kept for it, answers; redis-py's ``can_read``, which builds its
    error text and a poller (or peeks at the socket) on every call, was
    about 8% of a lone caller's add (py-spy). A TLS socket (it may hold
    decrypted bytes above the OS socket), or a socket that has something
    to read, gets ``can_read``'s full look."""

    __slots__ = ("_sock", "_poller")

    def __init__(self) -> None:
        self._sock: Any = None
        self._poller: Any = None

    def ready(self, connection: Any) -> None:
        """Connect, or reconnect a connection the server closed while it was
        idle (what a pool checks before it lends one): a call must not be
        sent on a socket that cannot answer, or a call that never ran would
        fail."""
        try:
            sock = connection._sock
            if sock is None:  # redis-py's connect() costs a retry wrapper even then
                connection.connect()
                return
            if type(sock) is socket.socket and _POLL:  # not TLS: no bytes buffered above it
                if sock is not self._sock:
                    self._poller = select.poll()
                    self._poller.register(sock, select.POLLIN)
                    self._sock = sock
                if not self._poller.poll(0):
                    return
            if connection.can_read():  # bytes nobody asked for, or closed by the server
                raise ConnectionError("the connection has unread data")
        except (ConnectionError, TimeoutError, OSError):  # or closed by the server
            connection.disconnect()
            connection.connect()


_POLL = hasattr(select, "poll")


#: The coalescer of each connection pool (by its id: a coalescer keeps its
#: pool alive), for as long as a user holds it.
_by_pool: weakref.WeakValueDictionary[int, Coalescer] = weakref.WeakValueDictionary()
_by_pool_lock = threading.Lock()


def _new_lock_after_fork() -> None:
    global _by_pool_lock
    _by_pool_lock = threading.Lock()  # a parent's thread may have held it


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_after_fork)


def shared(pool: Any) -> Coalescer:
    """The coalescer of ``pool``, shared by all its users: each one that
    takes it gives it back with ``leave()``; the last one to leave gives
    its connection back to the pool."""
    with _by_pool_lock:
        coalescer = _by_pool.get(id(pool))
        if coalescer is None:
            coalescer = _by_pool[id(pool)] = Coalescer(pool)
        coalescer.users += 1
        return coalescer


class Coalescer:
    """Script calls of many threads over one connection of ``pool``."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self.users = 0
        timeout = pool.connection_kwargs.get("socket_timeout")
        self._wait = (timeout or 0) * 2 + FOLLOWER_MARGIN
        self._after_fork()
        _fork.track(self)

    def _after_fork(self) -> None:
        """Start afresh (in a forked child the connection is the parent's)."""
        self._lock = threading.Lock()
        self._idle_now = threading.Condition(self._lock)  # no batch in flight
        self._queued: list[_Call] = []
        self._leading = False
        self._connection: Any = None
        self._closed = False
        self._idle = _Idle()
        #: FUNCTION LOADs sent by its users, and the lock they take to send
        #: one (see ``Scripts._call_coalesced``)
        self.loads = 0
        self.load_lock = threading.Lock()

    def call(self, packed: bytes) -> Any:
        """Send one packed command; return its reply (raise its error)."""
        # an Event only for a call that will wait (a lone caller makes none)
        call = _Call(packed, threading.Event() if self._leading else None)
        with self._lock:
            self._queued.append(call)
            lead = not self._leading
            self._leading = True
            if not lead and call.done is None:
                call.done = threading.Event()
        if not lead and call.done is not None:  # a follower: woken by its batch's leader
            try:
                woken = wait_event(call.done, self._wait)
            except BaseException:  # interrupted: a gevent.Timeout, a killed greenlet
                self._leave(call)
                raise
            if not woken and not self._leave(call):
                raise TimeoutError("no reply from the server within the batch's time")
            lead = not call.finished  # woken to lead the next batch
        if lead:
            self._flush(call)
        if call.error is not None:
            raise call.error
        return call.value

    def _flush(self, own: _Call) -> None:
        """Lead one batch: every call queued now (``own``, the leader's, among them)."""
        with self._lock:
            batch, self._queued = self._queued, []
            connection, closed = self._connection, self._closed
        try:
            if closed:  # calls that raced the last user's close
                raise ClosedError("closed while the call waited to be sent: nothing of it "
                                  "was sent")
            if connection is None:
                connection = take_connection(self._pool)
                with self._lock:
                    if not self._closed:  # else given back below
                        self._connection = connection
            else:
                self._idle.ready(connection)
            connection.send_packed_command([call.packed for call in batch], check_health=False)
            for call in batch:
                try:
                    call.value = connection.read_response()
                except ResponseError as exc:  # that call's error; the rest follow
                    call.error = exc
                call.finished = True
        except BaseException as exc:
            if connection is not None:
                connection.disconnect()  # replies may be left unread
            # an interruption of the leader's (a gevent.Timeout, a kill,
            # KeyboardInterrupt) is its own: the others' calls lost their
            # connection
            lost = exc if isinstance(exc, Exception) else \
                ConnectionError(f"the call's batch was cut short: {exc!r}")
            for call in batch:
                if not call.finished:
                    call.error, call.finished = exc if call is own else lost, True
        finally:
            for call in batch:
                if call.done is not None:
                    call.done.set()
            with self._lock:
                self._hand_on()
                orphaned = connection is not None and connection is not self._connection
            if orphaned:  # close() left it to this batch to give back
                connection.disconnect()
                self._pool.release(connection)

    def _hand_on(self) -> None:
        """Under the lock: the first call queued leads the next batch (it
        is woken to), or no batch is led."""
        if not self._queued:
            self._leading = False
            self._idle_now.notify_all()
        elif self._queued[0].done is not None:
            self._queued[0].done.set()

    def _leave(self, call: _Call) -> bool:
        """A follower stops waiting (its time ran out, or it was
        interrupted): its call leaves the queue, and the lead of the next
        batch, if it was just given it, goes to the next call in line (left
        with a caller that is gone, every later call waited out its time).
        Return whether the call has its reply after all."""
        with self._lock:
            if call.finished:
                return True
            try:
                self._queued.remove(call)
            except ValueError:  # in the batch in flight: its reply comes to nobody
                return False
            if call.done is not None and call.done.is_set():
                self._hand_on()
        return False

    def leave(self) -> None:
        """A user is done with it: the last one closes it."""
        with _by_pool_lock:
            self.users -= 1
            if self.users > 0:
                return
            if _by_pool.get(id(self._pool)) is self:
                del _by_pool[id(self._pool)]
        self.close()

    def close(self) -> None:
        """Give the connection back to its pool, once the batch in flight
        has its replies (its calls may have run: an add cut short here was
        written, yet raised ``ConnectionError``, and a retry on it made a
        second job); the calls still queued raise ``ClosedError``. A batch
        still in flight after CLOSE_GRACE fails: its connection is cut, and
        its leader gives it back (in the pool it could be lent while the
        leader still used it)."""
        with self._lock:
            self._closed = True
            self._idle_now.wait_for(lambda: not self._leading, CLOSE_GRACE)
            connection, self._connection = self._connection, None
            in_flight = self._leading
        if connection is None:
            return
        if in_flight:
            cut_connection(connection)
        else:
            connection.disconnect()
            self._pool.release(connection)
