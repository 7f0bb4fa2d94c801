"""Fork safety (SPEC, "Processes: fork safety"): in a forked child, reset the
threads' state, locks, caches and connection pools of every live jobq object,
so that the child never uses a socket or a thread state of its parent.

The registries below are module-level by necessity: ``os.register_at_fork``
is process-wide. They hold weak references only, so they keep nothing alive.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import traceback
import weakref
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

#: Objects with an ``_after_fork()`` method, which resets them in the child
#: and may return an action to run once every object has been reset.
_objects: weakref.WeakSet[Any] = weakref.WeakSet()
#: Clients jobq made or was given: their pools are reset in the child.
_clients: weakref.WeakSet[Any] = weakref.WeakSet()
#: The process whose objects these are, and the lock type their locks are
#: of: gevent's monkey-patching replaces it (see ``check``).
_pid = os.getpid()
_lock_type = threading.Lock
_check_lock = threading.Lock()
#: Threads jobq started in this process since its objects were last reset.
_threads_started = 0


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
        _reset_single_connection(client)
        manager = getattr(client.connection_pool, "sentinel_manager", None)
        for sentinel in getattr(manager, "sentinels", ()):  # it asks them for the master
            _reset_pool(sentinel.connection_pool)


def _reset_single_connection(client: Any) -> None:
    """A client bound to one connection (``single_connection_client``) kept
    the parent's socket: parent and child wrote on it at once and read each
    other's replies (under gunicorn --preload, a request got another's job
    result). Its socket is let go in the child alone (redis-py shuts a
    socket down only in the process that opened it; here it is closed, the
    parent's stays open) and the connection opens a new one at its next
    call; its lock may have been held by a parent's thread."""
    connection = getattr(client, "connection", None)
    if connection is None:
        return
    if hasattr(client, "single_connection_lock"):  # redis-py >= 5.1
        client.single_connection_lock = threading.RLock()
    connection.disconnect()  # its pid is the parent's: no shutdown
    connection.pid = os.getpid()


def thread_started(thread: threading.Thread) -> None:
    """Count a thread jobq starts (see ``check``), and mark it as started
    in this process (see ``forked_off``)."""
    global _threads_started
    _threads_started += 1
    thread.jobq_pid = os.getpid()  # type: ignore[attr-defined]


def forked_off() -> bool:
    """Whether the calling thread is a jobq thread that a fork carried into
    a child process (a handler or a listener that forked): the child's only
    thread, still in the parent's work. It must finish nothing of the
    parent's and end, raising on what its callback raised (so that a
    ``sys.exit()`` there ends the child, as it would without jobq)."""
    born = getattr(threading.current_thread(), "jobq_pid", None)
    return born is not None and born != os.getpid()


def body(target: Callable[[], object]) -> Callable[[], None]:
    """``target`` as the body of a jobq thread: where a fork carried it
    into a child (a handler or a listener forked, and the child came back),
    its end ends the child (``end_child``)."""

    def run() -> None:
        try:
            target()
        except BaseException as exc:
            if not forked_off():
                raise
            end_child(exc)
        if forked_off():
            end_child(None)

    return run


def end_child(error: BaseException | None) -> None:
    """End a child process whose only thread of the fork, a jobq thread,
    came back from the callback that forked, as a process whose main code
    ended so would end: exit status 0, a ``SystemExit``'s, or 1 with the
    traceback on stderr; exit handlers run, output flushed. Its thread
    ending alone did not end the child when the child had used jobq: the
    threads jobq started there kept it alive, for ever."""
    code: Any = 0
    if isinstance(error, SystemExit):
        code = error.code
    elif error is not None:
        traceback.print_exception(error)
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"), as the interpreter does
        print(code, file=sys.stderr)
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: S110 - a closed stream: nothing to flush
                pass
        os._exit(code)


def check() -> None:
    """Reset every object here, before any of them is used, if this process
    is a child forked without Python's fork hooks, or if ``threading`` was
    monkey-patched since they were reset.

    A C program that embeds Python and calls fork() itself runs the hooks
    only if it calls ``PyOS_AfterFork_Child``; uWSGI's workers do not unless
    started with ``py-call-osafterfork`` (its default is preforking: the
    app is imported in the master, then the workers are forked). Without
    this, a Queue used at import in the master had, in each worker, a
    reader thread that was not there (every wait ran out its timeout) and
    the master's connections.

    gunicorn's gevent workers monkey-patch ``threading`` after the fork,
    after the hooks ran: with ``--preload`` the objects' locks were real
    locks, and a greenlet waiting on one held up every other greenlet of
    the process. The fork hook leaves such a child to this check
    (``_forked``); objects whose locks predate a patching are made again
    too, which is safe while jobq has started no thread since their reset
    (none to abandon)."""
    if os.getpid() != _pid or threading.Lock is not _lock_type:
        with _check_lock:
            if os.getpid() != _pid:
                _warn_of_parents_threads()
                _in_child()
            elif threading.Lock is not _lock_type:
                _after_patching()


def _warn_of_parents_threads() -> None:
    """In a child forked without the hooks, ``threading`` still lists the
    parent's threads: if jobq's were among them, say what that risks."""
    names = sorted({t.name for t in threading.enumerate() if t.name.startswith("jobq-")})
    if names:
        logger.warning(
            "process %d was forked without Python's fork hooks while jobq's threads ran in "
            "its parent (%s); a thread that held the interpreter's lock at that moment would "
            "hold it for ever here. Under uWSGI: py-call-uwsgi-fork-hooks, or no listener and "
            "no wait before the fork", os.getpid(), ", ".join(names))


def _after_patching() -> None:
    global _lock_type
    _lock_type = threading.Lock
    if _threads_started:
        logger.warning(
            "threading was monkey-patched (gevent?) after jobq started threads in this "
            "process: its queues and event readers may block the process; monkey-patch "
            "before using jobq")
        return
    _in_child()


def _in_child() -> None:
    global _pid, _lock_type, _threads_started
    _lock_type = threading.Lock
    _threads_started = 0
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


def _patching_expected() -> bool:
    """Whether gevent is loaded but has not patched ``threading`` yet, as in
    a gunicorn gevent worker just forked: it patches next."""
    monkey = sys.modules.get("gevent.monkey")
    return monkey is not None and not monkey.is_module_patched("threading")


def _forked() -> None:
    global _check_lock
    _check_lock = threading.Lock()  # a parent's thread may have held it
    if _patching_expected():
        return  # reset at the first use instead (check), with gevent's locks
    _in_child()


if hasattr(os, "register_at_fork"):  # not on Windows, which cannot fork
    os.register_at_fork(after_in_child=_forked)
