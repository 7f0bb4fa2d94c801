"""Fork safety (SPEC, "Processes: fork safety"): in a forked child, reset the
threads' state, locks, caches and connection pools of every live jobq object,
so that the child never uses a socket or a thread state of its parent.

The registries below are module-level by necessity: ``os.register_at_fork``
is process-wide. They hold weak references only, so they keep nothing alive.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

#: Objects with an ``_after_fork()`` method, which resets them in the child
#: and may return an action to run once every object has been reset.
_objects: weakref.WeakSet[Any] = weakref.WeakSet()
#: Clients jobq made or was given: their pools are reset in the child.
_clients: weakref.WeakSet[Any] = weakref.WeakSet()
#: The process whose objects these are (see ``check``).
_pid = os.getpid()
_check_lock = threading.Lock()


def track(obj: Any) -> None:
    """Reset ``obj`` (by its ``_after_fork()``) in every forked child."""
    _objects.add(obj)


def track_client(client: Any) -> Any:
    """Reset the connection pools of ``client`` (one jobq made or uses) in
    every forked child; return it."""
    _clients.add(client)
    return client


def _reset_pool(pool: Any) -> None:
    # A lock held by a parent's thread at the fork stays held for ever in the
    # child: new ones first, then forget the parent's connections (without
    # closing them: their sockets are the parent's).
    pool._fork_lock = threading.RLock()
    pool._lock = threading.RLock()
    pool.reset()


def _reset_client(client: Any) -> None:
    from redis.cluster import RedisCluster

    if isinstance(client, RedisCluster):
        for node in client.get_nodes():  # type: ignore[no-untyped-call]
            if node.redis_connection is not None:
                _reset_pool(node.redis_connection.connection_pool)
    else:
        _reset_pool(client.connection_pool)
        manager = getattr(client.connection_pool, "sentinel_manager", None)
        for sentinel in getattr(manager, "sentinels", ()):  # it asks them for the master
            _reset_pool(sentinel.connection_pool)


def check() -> None:
    """Reset every object here if this process is a child forked without
    Python's fork hooks, before it uses any of them.

    A C program that embeds Python and calls fork() itself runs the hooks
    only if it calls ``PyOS_AfterFork_Child``; uWSGI's workers do not unless
    started with ``py-call-osafterfork`` (its default is preforking: the
    app is imported in the master, then the workers are forked). Without
    this, a Queue used at import in the master had, in each worker, a
    reader thread that was not there (every wait ran out its timeout) and
    the master's connections."""
    if os.getpid() != _pid:
        with _check_lock:
            if os.getpid() != _pid:
                _in_child()


def _in_child() -> None:
    global _pid
    for client in list(_clients):
        try:
            _reset_client(client)
        except Exception:  # one client must not keep the others from working
            logger.exception("resetting %r after fork failed", client)
    restarts: list[Callable[[], None]] = []
    for obj in list(_objects):
        try:
            restart = obj._after_fork()
        except Exception:
            logger.exception("resetting %r after fork failed", obj)
            continue
        if restart is not None:
            restarts.append(restart)
    _pid = os.getpid()  # reset: a restart below may call check()
    for restart in restarts:
        try:
            restart()
        except Exception:
            logger.exception("restarting after fork failed")


def _forked() -> None:
    global _check_lock
    _check_lock = threading.Lock()  # a parent's thread may have held it
    _in_child()


if hasattr(os, "register_at_fork"):  # not on Windows, which cannot fork
    os.register_at_fork(after_in_child=_forked)
