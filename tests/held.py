"""A redis-py connection class that holds a thread at one point of its
work, so that a test can close things under it there: the window a race
needs, made as wide as the test wants, on a real server."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import redis

WAIT = 10.0
T = TypeVar("T")


class Held:
    """Holds the first thread that reaches ``at`` once ``armed`` is set (by
    ``meet``), until ``released`` is: ``"handshake"``, between the CLIENT
    SETINFO LIB-NAME and LIB-VER of a connect (redis-py 8 writes both, then
    reads both replies); ``"write"``, before any write of commands. With
    ``thread``, only a thread whose name starts with it is held."""

    def __init__(self, at: str, thread: str = "") -> None:
        self.armed, self.reached, self.released = (threading.Event() for _ in range(3))
        self._thread = thread
        held = self

        class Connection(redis.Connection):
            def send_command(self, *args: Any, **kwargs: Any) -> None:
                if at == "handshake" and args[:3] == ("CLIENT", "SETINFO", "LIB-VER"):
                    held.hold()
                super().send_command(*args, **kwargs)

            def send_packed_command(self, command: Any, check_health: bool = True) -> None:
                if at == "write":
                    held.hold()
                super().send_packed_command(command, check_health)

        self.connection_class = Connection

    def hold(self) -> None:
        if (self.armed.is_set() and not self.reached.is_set()
                and threading.current_thread().name.startswith(self._thread)):
            self.reached.set()
            self.released.wait(WAIT)

    def meet(self, target: Callable[[], object],
             action: Callable[[], T]) -> tuple[threading.Thread, T]:
        """Arm, run ``target`` on a thread of its own until it is held, do
        ``action`` there (a close), let it go and join it for WAIT seconds;
        return the thread (alive if it is still stuck) and what ``action``
        returned."""
        self.armed.set()
        thread = threading.Thread(target=target)
        thread.start()
        try:
            assert self.reached.wait(WAIT)
            value = action()
        finally:
            self.released.set()
            thread.join(WAIT)
        return thread, value

    def pool(self, url: str) -> redis.ConnectionPool:
        """A pool of such connections to ``url``, whose sockets time out after
        60 s (longer than a test's joins; redis-py 8's default is 5 s). In
        the cluster pass, a plain pool to the one node that owns every slot."""
        url = url.replace("redis+cluster://", "redis://", 1)
        return redis.ConnectionPool.from_url(url, connection_class=self.connection_class,
                                             socket_timeout=60)
