"""The worker registry: live workers announce themselves with a heartbeat.

Each worker keeps a hash ``worker:<name>`` under its queue's hash tag,
refreshed by a heartbeat every third of its TTL (on the worker's lock-renewal
thread) and deleted when it closes; a worker that dies stops beating and its
hash expires after the TTL. ``Queue.get_workers()`` lists the live ones.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import serializer
from ._job_record import record_number
from .keys import is_valid_name, queues_key

if TYPE_CHECKING:
    from ._context import QueueContext

__all__ = ["WorkerInfo"]

#: Default time to live of a worker's announcement, in seconds.
DEFAULT_HEARTBEAT_TTL = 30.0


@dataclass(frozen=True)
class WorkerInfo:
    """A live worker, as it last announced itself.

    Attributes:
        name: the worker's name (``processed_by`` of its jobs).
        host: the host it runs on.  pid: its process id.
        queues: the queues its process serves.
        concurrency: its pool size.
        started: when it started, epoch seconds (server clock).
        last_heartbeat: its last heartbeat, epoch seconds (server clock).
        jobs_done: jobs it completed.  jobs_failed: attempts that failed.
        jobs_active: jobs in flight at the last heartbeat.
        paused: whether the worker itself is paused (``Worker.pause()``).
        version: the jobq version it runs ('' for 0.1, which did not say:
            in a rolling upgrade, which hosts are done).
    """

    name: str
    host: str
    pid: int
    queues: tuple[str, ...]
    concurrency: int
    started: float
    last_heartbeat: float
    jobs_done: int
    jobs_failed: int
    jobs_active: int
    paused: bool
    version: str = ""


def announce(
    context: QueueContext,
    name: str,
    token: str,
    ttl: float,
    *,
    queues: Sequence[str],
    concurrency: int,
    done: int,
    failed: int,
    active: int,
    paused: bool,
    first: bool = False,
) -> bool:
    """Write one heartbeat of a worker (one script call); the first one also
    records the queue's name in the list of known queues. Whether the
    announcement held another worker's (``token``: of the Worker object)."""
    from . import __version__  # here: the package imports this module first

    if first:
        context.redis.sadd(queues_key(context.prefix), context.name)
    return context.calls.heartbeat(name, max(1, round(ttl * 1000)), token, (
        "host", socket.gethostname(), "pid", os.getpid(),
        "queues", serializer.encode(list(queues), "queue names"),
        "concurrency", concurrency, "done", done, "failed", failed,
        "active", active, "paused", 1 if paused else 0, "ver", __version__,
    ))


def withdraw(context: QueueContext, name: str, token: str, deadline: float) -> None:
    """Remove a worker from the registry (it is closing; not another's of
    its name); redis-py's TimeoutError when the server has not answered by
    ``deadline`` (``time.monotonic``)."""
    context.calls_by(deadline).heartbeat(name, 0, token)


def live_workers(context: QueueContext) -> list[WorkerInfo]:
    """The workers of a queue whose heartbeat has not expired, by name."""
    workers = [_info(name, flat) for name, flat in context.calls.get_workers()]
    return sorted(workers, key=lambda w: w.name)


def _info(name: str, flat: list[bytes]) -> WorkerInfo:
    record: Mapping[bytes, bytes] = dict(zip(flat[::2], flat[1::2], strict=True))

    def text(key: bytes) -> str:
        return record.get(key, b"").decode("utf-8", "replace")

    def number(key: bytes) -> float:
        return record_number(record.get(key)) or 0.0

    try:
        queues = serializer.decode(record.get(b"queues"), "queue names")
    except Exception:  # a record written by another version: show what is readable
        queues = []
    if not isinstance(queues, (list, tuple)):  # (an int written by hand was not iterable)
        queues = []
    return WorkerInfo(
        name=name,
        host=text(b"host"),
        pid=int(number(b"pid")),
        queues=tuple(str(q) for q in queues or ()),
        concurrency=int(number(b"concurrency")),
        started=number(b"started") / 1000.0,
        last_heartbeat=number(b"hb") / 1000.0,
        jobs_done=int(number(b"done")),
        jobs_failed=int(number(b"failed")),
        jobs_active=int(number(b"active")),
        paused=record.get(b"paused") == b"1",
        version=text(b"ver"),
    )


def known_queues(client: Any, prefix: str) -> list[str]:
    """Names of the queues seen under ``prefix`` (by a Queue or a Worker),
    sorted; a member that is no valid queue name (written by hand, or by
    another program) is left out, not fatal to every listing."""
    names = (name.decode("utf-8", "replace") for name in client.smembers(queues_key(prefix)))
    return sorted(name for name in names if is_valid_name(name))
