"""Run workers in the foreground until a signal (or, in burst mode, until
their queues are empty): what ``jobq worker``, ``manage.py jobq_worker`` and
``flask jobq worker`` share."""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import redis

from ._signals import StopSignals

logger = logging.getLogger("jobq.cli")

#: Seconds between two looks at the queues in burst mode.
BURST_POLL = 0.2

Processor = Callable[..., Any] | Mapping[str, Callable[..., Any]]


def default_name() -> str:
    """A worker name: ``HOST:PID``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def serve(
    queues: Sequence[tuple[str, Processor]],
    *,
    connection: object = None,
    prefix: str = "jobq",
    concurrency: int = 1,
    name: str | None = None,
    burst: bool = False,
    on_ready: Callable[[], None] | None = None,
    **worker_options: Any,
) -> bool:
    """Run one Worker per ``(queue name, processor)`` until SIGINT / SIGTERM
    (a second signal abandons the jobs in flight), or with ``burst`` until
    no job of those queues is waiting (or the queue is paused) or active.
    Return whether the close was forced.

    Raises:
        redis.exceptions.ConnectionError: the server cannot be reached at
            the start (nothing has run), or a burst run's look at its queues
            failed (the workers are closed first); its message names the
            server without its password.
    """
    from .sharding import open_queue
    from .worker import Worker

    ping(connection)
    name = name or default_name()
    names = tuple(q for q, _ in queues)
    options: dict[str, Any] = {
        "connection": connection, "prefix": prefix, "concurrency": concurrency, "name": name,
        **worker_options,
    }
    workers = [Worker(q, processor, **options) for q, processor in queues]
    for worker in workers:
        worker._announced_queues = names
    # a burst run looks at each queue as it is stored (plain or sharded)
    lookers = [open_queue(q, connection=connection, prefix=prefix) for q in names] if burst else []
    try:
        with StopSignals("%s: finishing jobs in flight (send it again to stop at once)",
                         "%s again: abandoning jobs in flight") as stop:
            for worker in workers:
                worker.start()
            logger.info("worker %s (pid %d) serving %s with concurrency %d%s", name,
                        os.getpid(), ", ".join(names), concurrency, " (burst)" if burst else "")
            if on_ready is not None:
                on_ready()
            poll = BURST_POLL if burst else 0.5
            try:
                while not stop.wait(poll):
                    if burst and all(_done(q) for q in lookers):
                        paused = [q.name for q in lookers if q.count()]
                        logger.info("worker %s: %s, stopping (burst)", name,
                                    f"nothing to run (paused with jobs waiting: "
                                    f"{', '.join(paused)})" if paused else "queues empty")
                        break
            finally:  # a failed look too: the jobs in flight finish first
                forced = _close_all(workers, stop)
    finally:
        for looker in lookers:
            looker.close()
    logger.info("worker %s stopped%s", name, " (forced)" if forced else "")
    return forced


def ping(connection: object) -> None:
    """Fail fast when the server cannot be reached: a
    ``redis.exceptions.ConnectionError`` (or ``TimeoutError``) whose message
    names the server without its password."""
    from .connection import close_client, resolve, unreachable

    client, owned = resolve(connection)
    try:
        client.ping()
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        raise unreachable(exc, client) from None
    finally:
        if owned:
            close_client(client)


def _done(queue: Any) -> bool:
    """Nothing of ``queue`` for a burst run to do: no job active, and none
    waiting, or the queue paused (its jobs wait for a resume: a burst run
    waited for it, for good, as a cron job that never ended)."""
    counts = queue.get_job_counts("waiting", "active")
    if counts["active"]:
        return False
    return bool(counts["waiting"] == 0 or queue.is_paused())


def _close_all(workers: Sequence[Any], stop: StopSignals) -> bool:
    closers = [
        threading.Thread(target=w.close, name=f"close-{w.queue_name}", daemon=True)
        for w in workers
    ]
    for closer in closers:
        closer.start()
    forced = False
    while any(c.is_alive() for c in closers):
        if stop.forced and not forced:
            forced = True
            for worker in workers:
                worker.close(force=True, timeout=0)
        for closer in closers:
            closer.join(0.1)
    return forced
