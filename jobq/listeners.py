"""A thread-safe registry of event listeners: on / off / once."""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar, overload

from . import _fork

logger = logging.getLogger(__name__)

Listener = Callable[..., Any]
#: A listener's own type, kept by ``on`` and ``once`` (they return it).
L = TypeVar("L", bound=Listener)

#: How often a stop with no timeout looks whether its caller gave up (a
#: forced close) while a listener runs.
STOP_POLL = 0.1


class _Entry:
    __slots__ = ("callback", "once", "seq")

    def __init__(self, callback: Listener, once: bool, seq: int) -> None:
        self.callback = callback
        self.once = once
        self.seq = seq


class ListenerRegistry:
    """Callbacks by event name; per-job channels are just names like ``completed:42``.

    Callbacks run outside the lock, in registration order; one that raises is
    logged and does not stop the others.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, list[_Entry]] = {}
        self._seq = itertools.count()

    def after_fork(self) -> None:
        """In a forked child: a new lock (another thread may have held the
        parent's at the fork)."""
        self._lock = threading.Lock()

    def on(self, event: str, callback: Listener) -> Listener:
        """Call ``callback`` on every ``event``; return it."""
        return self._add(event, callback, once=False)

    def once(self, event: str, callback: Listener) -> Listener:
        """Call ``callback`` on the next ``event`` only; return it."""
        return self._add(event, callback, once=True)

    def _add(self, event: str, callback: Listener, once: bool) -> Listener:
        if not isinstance(event, str) or not event:
            raise ValueError(f"event must be a non-empty string, not {event!r}")
        if not callable(callback):
            raise TypeError(f"listener must be callable, not {callback!r}")
        with self._lock:
            self._entries.setdefault(event, []).append(_Entry(callback, once, next(self._seq)))
        return callback

    def off(self, event: str, callback: Listener) -> bool:
        """Remove one registration of ``callback``; False when there was none."""
        with self._lock:
            entries = self._entries.get(event)
            if not entries:
                return False
            for i, entry in enumerate(entries):
                if entry.callback == callback:
                    del entries[i]
                    if not entries:
                        del self._entries[event]
                    return True
        return False

    def count(self, event: str | None = None) -> int:
        """Listeners of ``event``, or of every event when None."""
        with self._lock:
            if event is None:
                return sum(len(entries) for entries in self._entries.values())
            return len(self._entries.get(event, ()))

    def has_any(self) -> bool:
        """Whether any listener is registered at all (cheap, no lock)."""
        return bool(self._entries)

    def has(self, event: str) -> bool:
        """Whether ``event`` has any listener (cheap, no copy)."""
        return event in self._entries

    def take(self, event: str) -> list[Listener]:
        """The callbacks to run for one ``event``; ``once`` entries are removed."""
        return [callback for _, callback in self.take_many((event,))]

    def take_many(self, events: tuple[str, ...]) -> list[tuple[str, Listener]]:
        """(event, callback) pairs of several events, in registration order;
        ``once`` entries are removed."""
        with self._lock:
            found: list[tuple[int, str, Listener]] = []
            for event in events:
                entries = self._entries.get(event)
                if not entries:
                    continue
                found.extend((entry.seq, event, entry.callback) for entry in entries)
                if any(entry.once for entry in entries):
                    kept = [entry for entry in entries if not entry.once]
                    if kept:
                        self._entries[event] = kept
                    else:
                        del self._entries[event]
        if len(events) > 1:
            found.sort(key=lambda item: item[0])
        return [(event, callback) for _, event, callback in found]

    def emit(self, event: str, *args: Any) -> None:
        """Call every listener of ``event`` with ``args``."""
        for callback in self.take(event):
            call_safely(callback, event, *args)


class ListenerMethods:
    """``on`` / ``once`` / ``off`` / ``listener_count`` over ``self._listeners``,
    for a class whose events go to local listeners (see SPEC for the events
    and their arguments)."""

    _listeners: ListenerRegistry

    def _listener_added(self, event: str) -> None:
        """Called after a listener of ``event`` was added."""

    def _check_listenable(self, event: str) -> None:
        """Raise ClosedError when no listener added now could ever be called
        (ValueError when ``event`` is none of the class's)."""

    @overload
    def on(self, event: str, callback: L) -> L: ...

    @overload
    def on(self, event: str, callback: None = None) -> Callable[[L], L]: ...

    def on(self, event: str, callback: L | None = None) -> L | Callable[[L], L]:
        """Call ``callback`` on each ``event``; return it. Without
        ``callback``, return a decorator that registers the function."""
        if callback is None:
            return lambda cb: self.on(event, cb)
        _fork.check()
        self._check_listenable(event)
        self._listeners.on(event, callback)
        self._listener_added(event)
        return callback

    def once(self, event: str, callback: L) -> L:
        """Call ``callback`` on the next ``event`` only; return it."""
        _fork.check()
        self._check_listenable(event)
        self._listeners.once(event, callback)
        self._listener_added(event)
        return callback

    def off(self, event: str, callback: Listener) -> bool:
        """Remove a listener; False if it was not registered."""
        return self._listeners.off(event, callback)

    def listener_count(self, event: str | None = None) -> int:
        """Listeners of ``event`` (every listener when None)."""
        return self._listeners.count(event)


def call_safely(callback: Listener, event: str, *args: Any) -> None:
    """Call a listener; log whatever it raises (BaseException included)."""
    try:
        callback(*args)
    except BaseException:  # a listener must never kill the thread that calls it
        if _fork.forked_off():  # ...but in a child it forked, it ends it (sys.exit())
            raise
        logger.exception("listener %r of %r raised", callback, event)


class ListenerDispatcher:
    """Call a registry's listeners on a thread of their own, in emit order,
    so that a slow listener never delays the thread that emits.

    Before ``start()`` and after ``stop()``, ``emit`` calls the listeners
    itself.
    """

    def __init__(self, registry: ListenerRegistry, name: str) -> None:
        self._registry = registry
        self._name = name
        self._queue: queue.SimpleQueue[tuple[str, tuple[Any, ...]] | None] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self._stopping = False

    def start(self) -> None:
        """Start the dispatching thread."""
        self._stopping = False
        self.thread = threading.Thread(target=_fork.body(self._run), name=self._name,
                                       daemon=True)
        _fork.thread_started(self.thread)
        self.thread.start()

    def emit(self, event: str, *args: Any) -> None:
        """Have every listener of ``event`` called with ``args``."""
        if not self._registry.has(event):
            return
        thread = self.thread
        if thread is None or not thread.is_alive():
            self._registry.emit(event, *args)
        else:
            self._queue.put((event, args))

    def stop(self, timeout: float | None, give_up: Callable[[], bool] | None = None) -> bool:
        """Deliver what was emitted, then end the thread; False if a listener
        was still running after ``timeout`` (None: for as long as it takes,
        or until ``give_up()``). Called by a listener (a worker closed from
        its own ``completed`` listener, say), the thread ends once that
        listener returns and the rest is delivered."""
        thread = self.thread
        if thread is None:
            return True
        if not self._stopping:
            self._stopping = True
            self._queue.put(None)
        if thread is threading.current_thread():
            return False
        if timeout is not None or give_up is None:
            thread.join(timeout)
        else:
            while thread.is_alive() and not give_up():
                thread.join(STOP_POLL)
        return not thread.is_alive()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            event, args = item
            self._registry.emit(event, *args)
            if _fork.forked_off():  # a listener forked: none of the parent's work here
                return
