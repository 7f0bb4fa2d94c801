"""Queue metrics: per-minute counts kept in Redis, and the Prometheus text format.

The complete and fail scripts count every finished job in the same step that
finishes it (see ``record_metric`` in ``lua/_common.lua``): per kind
(``"completed"``, ``"failed"``, terminal failures only) a total, the sums of
wait and run times, and one count per minute for the last
:data:`METRICS_MINUTES` minutes. :meth:`jobq.Queue.get_metrics` reads them;
:func:`prometheus_text` renders them, with job counts and live workers, for a
Prometheus scrape, and :func:`serve` answers ``GET /metrics`` with it::

    from jobq.metrics import prometheus_text
    print(prometheus_text([Queue("mail"), Queue("reports")]))
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import redis

from ._sentinel import brief

if TYPE_CHECKING:
    from ._context import QueueContext
    from .queue import Queue

__all__ = ["METRICS_MINUTES", "KINDS", "Metrics", "prometheus_text", "serve"]

logger = logging.getLogger(__name__)

#: How many minutes of per-minute counts are kept (one day).
METRICS_MINUTES = 1440
#: The kinds of metrics kept: completed jobs and terminally failed jobs.
KINDS = ("completed", "failed")
#: The content type of the Prometheus text exposition format.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class Metrics:
    """Counts of finished jobs of one kind, as ``Queue.get_metrics`` returns them.

    Attributes:
        count: jobs counted since the queue was created (or obliterated).
        data: jobs per minute, newest first: ``data[0]`` is the minute in
            progress at ``timestamp``, ``data[1]`` the minute before, and so
            on, sliced by ``get_metrics``'s ``start`` and ``end``.
        timestamp: when the metrics were read, epoch seconds (server clock).
        waited_for: seconds these ``count`` jobs waited in all (ready to started).
        ran_for: seconds their last attempts ran in all (started to finished).
    """

    count: int
    data: list[int] = field(default_factory=list)
    timestamp: float = 0.0
    waited_for: float = 0.0
    ran_for: float = 0.0

    def per_minute(self, minutes: int = 5) -> float:
        """The mean jobs per minute over the last ``minutes`` minutes, the one in
        progress counted for the part of it that has passed.

        Only meaningful on metrics read with the default ``start=0``.
        """
        if minutes < 1:
            raise ValueError("minutes must be >= 1")
        window = self.data[:minutes]
        if not window:
            return 0.0
        elapsed = (len(window) - 1) + (self.timestamp % 60.0) / 60.0
        return sum(window) / max(elapsed, 1.0 / 60.0)


def read_metrics(context: QueueContext, kind: str, start: int = 0, end: int = -1) -> Metrics:
    """Read one kind of metrics of a queue (``Queue.get_metrics``)."""
    if kind not in KINDS:
        raise ValueError(f"metrics kind must be 'completed' or 'failed', not {kind!r}")
    for name, value in (("start", start), ("end", end)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    now_ms, count, wait_ms, run_ms, minute, mbase, finished = context.calls.get_metrics(kind)
    now_minute = now_ms // 60_000
    data: list[int] = []
    if minute is not None:
        gap = max(0, now_minute - int(minute))
        # minutes without any finished job since the last one counted are zeros
        data = [0] * min(gap, METRICS_MINUTES)
        if gap < METRICS_MINUTES:
            data.append(int(count) - int(mbase))
        data.extend(int(c) for c in finished)
        del data[METRICS_MINUTES:]
    stop = None if end == -1 else end + 1  # inclusive, like LRANGE
    return Metrics(
        count=int(count),
        data=data[start:stop],
        timestamp=int(now_ms) / 1000.0,
        waited_for=int(wait_ms) / 1000.0,
        ran_for=int(run_ms) / 1000.0,
    )


# -- Prometheus ----------------------------------------------------------------


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


class _Family:
    def __init__(self, name: str, kind: str, help_text: str) -> None:
        self.name, self.kind, self.help = name, kind, help_text
        self.samples: list[str] = []

    def add(self, value: float, suffix: str = "", **labels: str) -> None:
        text = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
        self.samples.append(f"{self.name}{suffix}{{{text}}} {_number(value)}")

    def render(self) -> str:
        return "\n".join(
            [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}", *self.samples]
        )


def prometheus_text(queues: Iterable[Queue]) -> str:
    """Render the queues' state in the Prometheus text exposition format (0.0.4).

    Families, each labelled by ``queue`` (and by ``prefix`` too when the
    queues given have several prefixes):

    - ``jobq_jobs`` (gauge, also by ``state``): jobs per state;
    - ``jobq_queue_paused`` (gauge): 1 when the queue is paused;
    - ``jobq_workers`` (gauge): live workers;
    - ``jobq_jobs_completed_total`` / ``jobq_jobs_failed_total`` (counters):
      finished jobs (terminal failures only);
    - ``jobq_job_wait_seconds`` / ``jobq_job_run_seconds`` (summaries, also
      by ``status``): sum and count of the finished jobs' wait and run times.

    A queue the server refuses to read (a key of another type, an ACL), or
    that cannot be read now (a cluster node away, a slot moving), is left
    out, and logged; when no queue could be read for that (a server away),
    the error is raised.
    """
    jobs = _Family("jobq_jobs", "gauge", "Jobs of the queue per state.")
    paused = _Family("jobq_queue_paused", "gauge", "1 when the queue is paused.")
    workers = _Family("jobq_workers", "gauge", "Live workers of the queue.")
    # the classic text format names a counter with its _total (OpenMetrics drops it)
    totals = {
        "completed": _Family("jobq_jobs_completed_total", "counter", "Jobs completed."),
        "failed": _Family("jobq_jobs_failed_total", "counter", "Jobs failed for good."),
    }
    waited = _Family("jobq_job_wait_seconds", "summary",
                     "Time finished jobs waited, from ready to started.")
    ran = _Family("jobq_job_run_seconds", "summary",
                  "Time the last attempt of finished jobs ran.")
    seen: set[tuple[str, str]] = set()
    away: list[tuple[str, Exception]] = []
    queues = list(queues)
    # queues of several prefixes may share a name: a label prefix tells
    # their series apart (else two series had the same labels)
    by_prefix = len({queue.prefix for queue in queues}) > 1
    for queue in queues:
        name = queue.name
        where = {"queue": name, "prefix": queue.prefix} if by_prefix else {"queue": name}
        if (queue.prefix, name) in seen:  # a queue named twice: its series once
            continue
        seen.add((queue.prefix, name))
        try:  # all of a queue's reads first: its series whole, or none
            counts = queue.get_job_counts()
            is_paused, live = queue.is_paused(), len(queue.get_workers())
            finished = {kind: queue.get_metrics(kind, 0, 0) for kind in KINDS}
        except redis.exceptions.ResponseError as exc:
            # the server refused it (a key of another type, an ACL): the
            # other queues are still served, as `jobq info` shows them
            logger.warning("metrics: queue %r left out: Redis refused: %s", name, exc)
            continue
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                redis.exceptions.RedisClusterException) as exc:
            away.append((name, exc))  # one queue's node or slot: the others are served
            continue
        except Exception as exc:  # what it holds cannot be read (keys written by hand)
            logger.warning("metrics: queue %r left out: cannot read it: %s: %s", name,
                           type(exc).__name__, exc)
            continue
        for state, count in counts.items():
            jobs.add(count, **where, state=state)
        paused.add(1 if is_paused else 0, **where)
        workers.add(live, **where)
        for kind, metrics in finished.items():
            totals[kind].add(metrics.count, **where)
            waited.add(metrics.waited_for, "_sum", **where, status=kind)
            waited.add(metrics.count, "_count", **where, status=kind)
            ran.add(metrics.ran_for, "_sum", **where, status=kind)
            ran.add(metrics.count, "_count", **where, status=kind)
    if away and len(away) == len(seen):  # none read: the server is away
        raise away[0][1]
    for left_out, error in away:
        logger.warning("metrics: queue %r left out: %s", left_out, error)
    families = [jobs, paused, workers, *totals.values(), waited, ran]
    return "\n".join(f.render() for f in families) + "\n"


class _Handler(BaseHTTPRequestHandler):
    render: Callable[[], str]

    def do_GET(self) -> None:  # noqa: N802 (the http.server name)
        self._answer(with_body=True)

    def do_HEAD(self) -> None:  # noqa: N802 (a health check's HEAD: the GET's headers)
        self._answer(with_body=False)

    def _answer(self, with_body: bool) -> None:
        if self.path.split("?", 1)[0] not in ("/metrics", "/metrics/"):
            self.send_error(404, "only /metrics is served here")
            return
        try:
            body = self.render().encode()
        except (redis.exceptions.RedisError,  # a server away: a line per scrape
                redis.exceptions.RedisClusterException) as exc:  # (a cluster's is no RedisError)
            logger.warning("/metrics: cannot read the queues: %s: %s", type(exc).__name__,
                           brief(exc))
            self.send_error(503, f"cannot read the queues: {type(exc).__name__}")
            return
        except Exception as exc:
            logger.exception("rendering /metrics failed")
            self.send_error(503, f"cannot read the queues: {type(exc).__name__}")
            return
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s - " + format, self.address_string(), *args)


def serve(
    queues: Sequence[Queue] | Callable[[], Sequence[Queue]],
    port: int = 9090,
    host: str = "127.0.0.1",
) -> ThreadingHTTPServer:
    """Return an HTTP server answering ``GET /metrics`` (and ``HEAD``) with
    :func:`prometheus_text`.

    Call ``serve_forever()`` on it (and ``shutdown()`` / ``server_close()``
    to stop it). ``queues`` is a list of queues, or a callable returning the
    queues to report at each scrape. Port 0 picks a free port
    (``server.server_port``).
    """

    def render() -> str:
        return prometheus_text(queues() if callable(queues) else queues)

    handler = type("MetricsHandler", (_Handler,), {"render": staticmethod(render)})
    try:
        return ThreadingHTTPServer((host, port), handler)
    except OSError as exc:  # named: a port taken, a host unknown
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from exc
