"""The ``jobq`` command: run workers, inspect and administer queues, serve metrics.

Exit codes: 0 success; 1 the operation failed (a waited job failed or does
not exist, ``job`` found nothing, ``obliterate`` refused or found no such
queue, the server refused a
command: NOPERM, WRONGTYPE); 2 usage error (bad arguments, an unloadable
``MODULE:CALLABLE``, ``obliterate`` without ``--yes``); 3 Redis unreachable
(or it refused the login);
4 ``wait --timeout`` elapsed;
130 ``wait`` interrupted. Long-running commands (``worker``, ``info --watch``,
``events``, ``server``, ``metrics``, ``dashboard``) exit 0 when stopped by SIGINT,
SIGTERM or SIGHUP.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import importlib
import json
import logging
import os
import re
import shutil
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TextIO, cast

import redis

from ._json import dumps, printable
from ._sentinel import brief
from ._signals import StopSignals
from .connection import CLUSTER_SCHEMES, login_refused, moved, redact
from .errors import JobFailedError, JobNotFoundError, JobqError
from .job import STATES
from .keys import validate_prefix

if TYPE_CHECKING:
    from ._queues import QueueSet
    from .queue import Queue

__all__ = ["main", "build_parser"]

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_REDIS = 3
EXIT_TIMEOUT = 4
EXIT_INTERRUPTED = 130

#: Minutes over which ``info`` reports jobs per minute.
RATE_MINUTES = 5
_CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear screen: a frame redrawn in place


class _UsageError(Exception):
    """A bad argument found after parsing: message to stderr, exit 2."""


# -- helpers ---------------------------------------------------------------------


def _queue(args: argparse.Namespace, name: str) -> Queue:
    """Open a queue as it is stored (the caller closes it): a ShardedQueue
    when a shard count is stored with it (it answers the calls the commands
    make), else a Queue."""
    from .sharding import open_queue

    return cast("Queue", open_queue(name, connection=args.url, prefix=args.prefix))


#: The socket timeouts of the clients of the commands that read and watch
#: (``info``, ``metrics``) when the URL gives none: a server that stops
#: answering is said in the watch's frame (a scrape fails) after this many
#: seconds, rather than holding the command for good.
READ_TIMEOUT = 10.0


def _opened(args: argparse.Namespace, command: str) -> QueueSet:
    """The queues a command reads, opened as stored, on one client of its
    own (a client per queue held two connections each: a thousand queues,
    two thousand connections, past a process's file limit)."""
    from ._queues import QueueSet

    return QueueSet(args.url, args.prefix, command, stored=True, read_timeout=READ_TIMEOUT)


def _ping(url: str | None) -> None:
    """Fail fast (exit 3) when Redis cannot be reached."""
    from ._serve import ping

    ping(url)


def _load(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise _UsageError(f"expected MODULE:CALLABLE, not {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except Exception as exc:  # whatever the import raised: a clear message, no traceback
        logger.debug("loading %r failed", spec, exc_info=True)
        where = ""
        if not isinstance(exc, (ImportError, AttributeError)):
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            where = f" ({frame.filename}:{frame.lineno})"
        raise _UsageError(
            f"cannot load {spec!r}: {type(exc).__name__}: {exc}{where}"
        ) from exc
    from .queue import Queue
    from .sharding import ShardedQueue

    if isinstance(target, (Queue, ShardedQueue)):
        if not target.tasks:
            raise _UsageError(f"{spec!r} is a {type(target).__name__} without tasks (decorate "
                              "functions with @queue.task)")
        return target
    if isinstance(target, Mapping):
        if not target or not all(isinstance(k, str) and callable(v) for k, v in target.items()):
            raise _UsageError(f"{spec!r} is a dict, but not of job names to callables")
    elif not callable(target):
        raise _UsageError(f"{spec!r} is a {type(target).__name__}, not a callable or a dict")
    return target


def _timeout(text: str) -> float:
    """``wait --timeout``: seconds >= 0 (NaN waited for ever; a negative one
    passed as at once)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"a number of seconds >= 0, not {text!r}")
    return value


def _frames(text: str) -> int:
    """``--count``: frames >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"a whole number of frames >= 1, not {text!r}")
    return value


def _every(text: str) -> float:
    """``--interval``: seconds > 0 (NaN waited for ever, 0 redrew without
    a pause)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"a number of seconds > 0, not {text!r}")
    return value


def _json(value: Any) -> str:
    return dumps(value)


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    try:
        return datetime.fromtimestamp(seconds).isoformat(sep=" ", timespec="milliseconds")
    except (OverflowError, OSError, ValueError):  # a record's number out of any date's range
        return f"{seconds!r} (not a valid time)"


# -- worker ------------------------------------------------------------------------


def _cmd_worker(args: argparse.Namespace) -> int:
    from ._serve import default_name, serve
    from .queue import Queue
    from .sharding import ShardedQueue

    processor = _load(args.processor)
    if args.concurrency < 1:
        raise _UsageError("--concurrency must be at least 1")
    names = args.queue
    connection, prefix = args.url, args.prefix
    if isinstance(processor, (Queue, ShardedQueue)):
        # its tasks, on its own queue, server and prefix unless told: the
        # defaults served another server's (or prefix's) queue of its name,
        # where nothing waited, and a burst exited 0
        names = names or [processor.name]
        if "url" not in args.given:
            connection = processor.client
        if "prefix" not in args.given:
            prefix = processor.prefix
        processor = processor.tasks
    if not names:
        raise _UsageError("--queue is required unless MODULE:CALLABLE names a Queue")
    options: dict[str, Any] = {"heartbeat_ttl": args.heartbeat_ttl}
    for key in ("lock_duration", "stalled_interval", "max_stalled_count", "drain_delay"):
        if getattr(args, key) is not None:  # else the Worker's default
            options[key] = getattr(args, key)
    serve(
        [(q, processor) for q in dict.fromkeys(names)], connection=connection,
        prefix=prefix, concurrency=args.concurrency, name=args.name or default_name(),
        burst=args.burst, **options,
    )
    return EXIT_OK


# -- add -----------------------------------------------------------------------------


def _cmd_add(args: argparse.Namespace) -> int:
    try:
        data = json.loads(args.data) if args.data is not None else None
    except ValueError as exc:
        raise _UsageError(f"--data is not JSON: {exc}") from exc
    options: dict[str, Any] = {}
    for key in ("delay", "priority", "attempts", "job_id"):
        value = getattr(args, key)
        if value is not None:
            options[key] = value
    with _queue(args, args.queue) as queue:
        job = queue.add(args.name, data, **options)
    print(job.id)
    return EXIT_OK


# -- info ----------------------------------------------------------------------------


def _snapshot(queue: Queue) -> dict[str, Any]:
    completed = queue.get_metrics("completed", 0, RATE_MINUTES - 1)
    failed = queue.get_metrics("failed", 0, RATE_MINUTES - 1)
    return {
        "queue": queue.name,
        "counts": queue.get_job_counts(),
        "paused": queue.is_paused(),
        "workers": queue.get_workers(),
        "completed_per_min": completed.per_minute(RATE_MINUTES),
        "failed_per_min": failed.per_minute(RATE_MINUTES),
        "timestamp": completed.timestamp,
        # a sharded queue's counts per shard (summed in "counts")
        **({"shards": queue.shard_counts()} if hasattr(queue, "shard_counts") else {}),
    }


def _print_info(snapshots: list[dict[str, Any]], out: TextIO) -> None:
    """One table, a row per queue; then one line per live worker."""
    print(_table(snapshots), file=out)
    lines = [
        f"{snap['queue']}: worker {w.name} host={w.host} pid={w.pid} "
        f"concurrency={w.concurrency} active={w.jobs_active} done={w.jobs_done} "
        f"failed={w.jobs_failed} version={w.version or 'unknown'} "
        f"heartbeat={max(0.0, snap['timestamp'] - w.last_heartbeat):.1f}s"
        for snap in snapshots for w in snap["workers"]
    ]
    if lines:
        print("", *lines, sep="\n", file=out)


#: The states of the table's columns (parents waiting for children are in
#: ``jobq info --json`` and the plain lines).
_TABLE_STATES = STATES  # waiting, delayed, active, completed, failed, waiting-children

_COLUMNS = (
    ("QUEUE", "<"), ("WAITING", ">"), ("DELAYED", ">"), ("ACTIVE", ">"), ("COMPLETED", ">"),
    ("FAILED", ">"), ("WAITING-CHILDREN", ">"), ("PAUSED", "<"), ("WORKERS", ">"),
    ("DONE/MIN", ">"), ("FAIL/MIN", ">"),
)


def _table(snapshots: list[dict[str, Any]]) -> str:
    rows = [[title for title, _ in _COLUMNS]]
    for snap in snapshots:
        counts = snap["counts"]
        rows.append([
            snap["queue"], *(str(counts[s]) for s in _TABLE_STATES),
            "yes" if snap["paused"] else "no", str(len(snap["workers"])),
            f"{snap['completed_per_min']:.1f}", f"{snap['failed_per_min']:.1f}",
        ])
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    return "\n".join(
        "  ".join(f"{cell:{align}{width}}" for cell, (_, align), width
                  in zip(row, _COLUMNS, widths, strict=True)).rstrip()
        for row in rows
    )


def _snapshots(
    args: argparse.Namespace, names: Iterable[str], opened: QueueSet
) -> tuple[list[dict[str, Any]], list[str]]:
    """The snapshot of each queue (opened on first use, kept in ``opened``),
    and a line for each that could not be read: one the server refused (a
    key of the wrong type), one on a cluster's node that is away, or a
    name given that is no queue. One such queue hides none of the others;
    a lone server away raises."""
    snapshots, refused = [], []
    names = list(dict.fromkeys(names))  # a name given twice: one row
    opened.keep(names)
    for name in names:
        try:
            snapshot = _snapshot(opened.get(name))
            # a name given that is no queue (a typo): said so, not a row of zeros
            if args.queues and not _known(args, name, snapshot["counts"]):
                refused.append(f"jobq info: {_no_queue(args, name)}")
                continue
            snapshots.append(snapshot)
        except redis.exceptions.ResponseError as exc:
            if moved(exc):
                raise  # a plain URL of a cluster's node: said once, for all
            refused.append(f"jobq info: queue {printable(name)}: Redis refused: {exc}")
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            url = args.url or os.environ.get("JOBQ_REDIS_URL") or ""
            if url.partition("://")[0] not in CLUSTER_SCHEMES:
                raise  # the one server is away: none can be read
            refused.append(f"jobq info: queue {printable(name)}: unreachable: {exc}")
    return snapshots, refused


def _cmd_info(args: argparse.Namespace) -> int:
    from .registry import known_queues

    def names() -> list[str]:
        if args.queues:
            return list(args.queues)
        from .connection import close_client, resolve

        client, _ = resolve(args.url, READ_TIMEOUT)
        try:
            return known_queues(client, args.prefix)
        finally:
            close_client(client)

    opened = _opened(args, "jobq info")
    try:
        if not args.watch:
            current = names()
            if not current:
                if args.json:
                    print("[]")
                print(f"no queues known under prefix {args.prefix!r}", file=sys.stderr)
                return EXIT_OK
            snapshots, refused = _snapshots(args, current, opened)
            if args.json:
                print(_json(snapshots))
            elif snapshots:  # not a header alone over the lines saying why
                _print_info(snapshots, sys.stdout)
            for line in refused:
                print(line, file=sys.stderr)
            return EXIT_FAILED if refused else EXIT_OK
        plain = args.plain or not sys.stdout.isatty()
        frames = 0
        with StopSignals() as stop:
            while True:
                try:
                    snapshots, refused = _snapshots(args, names(), opened)
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                    if not frames:
                        raise  # a wrong URL: said at once (exit 3)
                    # an outage while watching: said in the frame, and watched through
                    snapshots, refused = [], [f"jobq info: unreachable: {exc}"]
                if args.json:  # one line per frame: a JSON object
                    sys.stdout.write(_json({"at": time.time(), "queues": snapshots,
                                            "errors": refused}) + "\n")
                else:
                    header = (f"jobq info, every {args.interval:g} s, "
                              f"{_when(time.time())[:19]} (Ctrl-C to quit)")
                    body = _table(snapshots) if snapshots else "(no queues)"
                    body += "".join("\n" + line for line in refused)
                    frame = f"{header}\n\n{body}\n"
                    if plain:
                        sys.stdout.write(("\n" if frames else "") + frame)
                    else:
                        sys.stdout.write(_CLEAR + frame)
                sys.stdout.flush()
                frames += 1
                if args.count and frames >= args.count:
                    break
                if stop.wait(args.interval):
                    break
    finally:
        opened.close()
    return EXIT_OK


# -- events ----------------------------------------------------------------------


def _event_record(event: Any) -> dict[str, Any]:
    """An event as ``events --json`` writes it: its own keys, then its
    fields; a field named as one of its own keys (a custom event's) goes
    under ``fields`` instead, so that ``id`` and ``name`` stay the event's."""
    record = {"id": event.id, "name": event.name, "job_id": event.job_id,
              "timestamp": event.timestamp, "prev": event.prev}
    clashes = {k: v for k, v in event.fields.items() if k in record or k == "fields"}
    record.update((k, v) for k, v in event.fields.items() if k not in clashes)
    if clashes:
        record["fields"] = clashes
    return record


def _cmd_events(args: argparse.Namespace) -> int:
    from .queue_events import QueueEvents

    _ping(args.url)
    lock = threading.Lock()
    stop = StopSignals()

    def show(event: Any) -> None:
        if args.json:
            line = _json(_event_record(event))
        else:
            fields = " ".join(f"{printable(k)}={v!r}" for k, v in event.fields.items())
            line = printable(f"{event.id or '-'} {event.name} {event.job_id or '-'}")
            line = f"{line} {fields}".rstrip()
        with lock:
            if stop.stopped:
                return
            try:
                print(line, flush=True)
            except BrokenPipeError:  # e.g. `jobq events Q | head`: stop quietly
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                stop.set()

    from ._sharded_events import ShardedQueueEvents
    from ._shards import stored_count
    from .connection import close_client, resolve

    client, _ = resolve(args.url)
    try:
        shards = stored_count(client, args.prefix, args.queue)
    finally:
        close_client(client)
    # a sharded queue's events: every shard's ("$" or "0" only)
    reader: Any = QueueEvents
    if shards is not None:
        reader = functools.partial(ShardedQueueEvents, shards=shards)
    with stop, reader(
        args.queue, connection=args.url, prefix=args.prefix, last_event_id=args.from_id,
        autorun=False,
    ) as events:
        events.on_all_events(show)  # before the reader starts: a replay loses nothing
        events.run()
        while not stop.wait(0.5):
            pass
    return EXIT_OK


# -- one job, administration ---------------------------------------------------------


def _cmd_job(args: argparse.Namespace) -> int:
    with _queue(args, args.queue) as queue:
        job = queue.get_job(args.id)
        if job is None:
            print(f"jobq: no job {args.id!r} in queue {args.queue!r}", file=sys.stderr)
            return EXIT_FAILED
        record: dict[str, Any] = {
            "id": job.id, "name": job.name, "state": job.get_state(), "data": job.data,
            "opts": job.opts, "timestamp": job.timestamp, "delay": job.delay,
            "priority": job.priority, "attempts_made": job.attempts_made,
            "stalled_counter": job.stalled_counter, "progress": job.progress,
            "return_value": job.return_value, "failed_reason": job.failed_reason,
            "processed_on": job.processed_on, "finished_on": job.finished_on,
            "processed_by": job.processed_by, "logs": job.get_logs(),
            "stacktrace": job.stacktrace,
        }
    if args.json:
        print(_json(record))
        return EXIT_OK
    for key, value in record.items():
        if key in ("stacktrace", "logs"):
            continue
        if key in ("timestamp", "processed_on", "finished_on"):
            shown = _when(value)
        elif isinstance(value, str):
            shown = printable(value)
        else:
            shown = "-" if value is None else printable(_json(value))
        print(f"{key:<16}{shown}")
    for line in record["logs"]:
        print(f"{'log':<16}{printable(line)}")
    if record["stacktrace"]:
        print("last stack trace:")
        print(printable(record["stacktrace"][-1].rstrip(), lines=True))
    return EXIT_OK


def _unknown(args: argparse.Namespace, queue: Queue) -> bool:
    """Whether ``queue`` is no queue under its prefix (not listed, no stored
    settings, no job: a typo's name), said on stderr. A command that writes
    (pause, drain...) would make it one, and say it did."""
    if _known(args, queue.name, queue.get_job_counts()):  # reads write nothing
        return False
    print(f"jobq {args.command}: {_no_queue(args, queue.name)}", file=sys.stderr)
    return True


def _known(args: argparse.Namespace, name: str, counts: Mapping[str, int]) -> bool:
    """Whether queue ``name`` is listed, has stored settings, or any job
    (by reads the monitor's ACL line grants: EXISTS, SMEMBERS)."""
    from .connection import close_client, resolve
    from .keys import QueueKeys
    from .registry import known_queues

    if any(counts.values()):
        return True
    client, _ = resolve(args.url, READ_TIMEOUT)
    try:
        return bool(client.exists(QueueKeys(args.prefix, name).meta)
                    or name in known_queues(client, args.prefix))
    finally:
        close_client(client)


def _no_queue(args: argparse.Namespace, name: str) -> str:
    return f"no queue {name!r} under prefix {args.prefix!r}"


def _on_queue(args: argparse.Namespace, act: Callable[[Any], object], said: str) -> int:
    """Run ``act(queue)`` on the command's queue (exit 1 when it is unknown)
    and print ``said``, formatted with what it returned and the queue's name."""
    with _queue(args, args.queue) as queue:
        if _unknown(args, queue):
            return EXIT_FAILED
        done = act(queue)
    print(said.format(done=done, queue=args.queue))
    return EXIT_OK


def _cmd_retry(args: argparse.Namespace) -> int:
    return _on_queue(args, lambda queue: queue.retry_jobs(args.state),
                     f"retried {{done}} {args.state} job(s) of {{queue}}")


def _cmd_promote(args: argparse.Namespace) -> int:
    return _on_queue(args, lambda queue: queue.promote_jobs(args.count),
                     "promoted {done} delayed job(s) of {queue}")


def _cmd_clean(args: argparse.Namespace) -> int:
    return _on_queue(args, lambda queue: len(queue.clean(args.grace, args.limit, args.state)),
                     f"removed {{done}} {args.state} job(s) of {{queue}}")


def _cmd_pause(args: argparse.Namespace) -> int:
    pause = args.command == "pause"
    return _on_queue(args, lambda queue: queue.pause() if pause else queue.resume(),
                     f"{args.command}d {{queue}}")  # paused / resumed


def _cmd_drain(args: argparse.Namespace) -> int:
    what = "waiting and delayed" if args.delayed else "waiting"
    return _on_queue(args, lambda queue: queue.drain(delayed=args.delayed),
                     f"removed {{done}} {what} job(s) of {{queue}}")


def _cmd_obliterate(args: argparse.Namespace) -> int:
    if not args.yes:
        raise _UsageError(
            f"obliterate deletes queue {args.queue!r} and all its jobs: add --yes to confirm"
        )
    with _queue(args, args.queue) as queue:
        if _unknown(args, queue):
            return EXIT_FAILED
        try:
            queue.obliterate(force=args.force)
        except JobqError as exc:
            print(f"jobq: {exc} (add --force to delete it anyway)", file=sys.stderr)
            return EXIT_FAILED
    print(f"obliterated {args.queue}")
    return EXIT_OK


def _cmd_cancel(args: argparse.Namespace) -> int:
    with _queue(args, args.queue) as queue:
        done = queue.cancel(args.id, reason=args.reason)
    if not done:
        print(f"jobq: job {args.id!r} of {args.queue} is finished or unknown", file=sys.stderr)
        return EXIT_FAILED
    print(f"cancelled {args.id} of {args.queue}")
    return EXIT_OK


def _cmd_schedulers(args: argparse.Namespace) -> int:
    with _queue(args, args.queue) as queue:
        if args.remove is not None:
            if not queue.remove_scheduler(args.remove):
                print(f"jobq: no scheduler {args.remove!r} in {args.queue}", file=sys.stderr)
                return EXIT_FAILED
            print(f"removed scheduler {args.remove} of {args.queue}")
            return EXIT_OK
        schedulers = queue.get_schedulers()
    if args.json:  # times in epoch seconds, as Queue.get_schedulers gives them
        print(_json(schedulers))
        return EXIT_OK
    if not schedulers:  # a name mistyped would say nothing at all
        print(f"no schedulers in queue {args.queue!r}", file=sys.stderr)
    for s in schedulers:
        schedule = f"every {s.every:g}s" if s.every is not None else f"cron {s.cron} ({s.tz})"
        limit = f"/{s.limit}" if s.limit is not None else ""
        print(f"{printable(s.id)}\t{printable(schedule)}\tnext {_when_in(s.next_run, s.tz)}\t"
              f"jobs {s.count}{limit}")
    return EXIT_OK


def _when_in(seconds: float | None, tz: str | None) -> str:
    """A time in zone ``tz`` (local time when None), with its UTC offset:
    after a cron's zone, a time without one read as that zone's."""
    if seconds is None:
        return "-"
    from zoneinfo import ZoneInfo

    try:
        zone = ZoneInfo(tz) if tz else None
        return datetime.fromtimestamp(seconds, zone).astimezone(zone).isoformat(
            sep=" ", timespec="seconds")
    except (OverflowError, OSError, ValueError, KeyError):  # out of range, or an unknown zone
        return _when(seconds)


# -- wait ----------------------------------------------------------------------------


def _bar(done: int, total: int, failed: int, width: int) -> str:
    filled = round(width * done / total) if total else width
    return (f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} finished"
            f"{f', {failed} failed' if failed else ''}")


def _cmd_wait(args: argparse.Namespace) -> int:
    ids = list(dict.fromkeys(args.ids))
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    show_bar = sys.stderr.isatty() and not args.quiet
    width = max(10, min(40, shutil.get_terminal_size().columns - 40))
    failed = 0
    with _queue(args, args.queue) as queue, StopSignals() as stop:
        events = queue.events
        if not events.wait_until_ready(timeout=10):
            raise redis.exceptions.ConnectionError("the event reader did not start")
        pending: dict[concurrent.futures.Future[Any], str] = {
            events.future_for(job_id): job_id for job_id in ids
        }
        finished = 0
        while pending:
            if show_bar:
                sys.stderr.write(_bar(finished, len(ids), failed, width))
                sys.stderr.flush()
            left = None if deadline is None else deadline - time.monotonic()
            if stop.stopped:
                break
            # the jobs finished already are told even when the time is up
            # (--timeout 0: which of them have finished)
            done, _ = concurrent.futures.wait(
                pending, timeout=0.2 if left is None else max(0.0, min(0.2, left)),
                return_when=concurrent.futures.FIRST_COMPLETED,
            )
            if not done and left is not None and left <= 0:
                break
            for future in done:
                job_id = pending.pop(future)
                finished += 1
                try:
                    result = future.result()
                except JobFailedError as exc:
                    failed += 1
                    line = f"{job_id} failed {printable(exc.failed_reason or '')}"
                except JobNotFoundError:
                    failed += 1
                    line = f"{job_id} not-found"
                else:
                    line = f"{job_id} completed {printable(_json(result))}"
                if show_bar:
                    sys.stderr.write("\r\x1b[K")
                print(line, flush=True)
        if show_bar:
            sys.stderr.write(_bar(finished, len(ids), failed, width) + "\n")
            sys.stderr.flush()
        for job_id in pending.values():
            print(f"{job_id} {queue.get_job_state(job_id)}", flush=True)
    if pending:
        if stop.stopped:
            return EXIT_INTERRUPTED
        print(f"jobq: {len(pending)} job(s) not finished after {args.timeout:g} s",
              file=sys.stderr)
        return EXIT_TIMEOUT
    return EXIT_FAILED if failed else EXIT_OK


# -- server, metrics ---------------------------------------------------------------


def _cmd_server(args: argparse.Namespace) -> int:
    from .testing import RedisServer

    extra: list[str] = []
    if args.dir:
        directory = os.path.abspath(args.dir)
        os.makedirs(directory, exist_ok=True)
        # later arguments win: keep the data in that directory, in an append-only file
        extra = ["--dir", directory, "--appendonly", "yes", "--appendfsync", "everysec"]
    server = RedisServer(port=args.port, extra_args=extra)
    with StopSignals() as stop:
        try:
            server.start()
        except RuntimeError as exc:
            print(f"jobq: cannot start the server: {exc}", file=sys.stderr)
            return EXIT_FAILED
        try:
            print(f"jobq server listening at {server.url}", flush=True)
            print(f"  {server.server_name} {server.version}, data in "
                  f"{args.dir or 'a temporary directory (not kept)'}; Ctrl-C to stop",
                  flush=True)
            while not stop.wait(0.5) and server.is_running():
                pass
        finally:
            server.stop()
    return EXIT_OK


def _cmd_functions(args: argparse.Namespace) -> int:
    from .connection import close_client, resolve
    from .scripts import library_name, load_library

    client, _ = resolve(args.url)
    try:
        load_library(client, replace=True)
    except redis.exceptions.NoPermissionError as exc:
        cause = exc.__cause__ or exc  # the server's own words
        print(f"jobq functions load: this user may not load functions ({cause}): run it "
              "as a user who may (+function|load), an admin", file=sys.stderr)
        return EXIT_FAILED
    finally:
        close_client(client)
    print(f"loaded jobq's functions ({library_name()})")
    return EXIT_OK


def _cmd_metrics(args: argparse.Namespace) -> int:
    from .metrics import serve
    from .registry import known_queues

    _ping(args.url)
    opened = _opened(args, "jobq metrics")
    lock = threading.Lock()

    def queues() -> list[Queue]:
        with lock:
            names = list(args.queues or []) or known_queues(opened.client, args.prefix)
            opened.keep(names)
            return [opened.get(n) for n in names]

    server = serve(queues, port=args.port, host=args.host)
    thread = threading.Thread(target=server.serve_forever, name="jobq-metrics-http",
                              daemon=True)
    try:
        with StopSignals() as stop:
            thread.start()
            print(f"serving Prometheus metrics at http://{args.host}:{server.server_port}/metrics",
                  flush=True)
            while not stop.wait(0.5):
                pass
    finally:
        server.shutdown()
        thread.join(5)
        server.server_close()
        opened.close()
    return EXIT_OK


def _cmd_dashboard(args: argparse.Namespace) -> int:
    from .dashboard._command import run

    auth = _load(args.auth) if args.auth else None
    if auth is not None and not callable(auth):
        raise _UsageError(f"--auth {args.auth!r} is not callable")
    return run(args, auth)


# -- parser ------------------------------------------------------------------------


def _common() -> argparse.ArgumentParser:
    """--url, --prefix and --log-level, accepted before or after the command."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url", default=argparse.SUPPRESS,
        help="Redis URL (default: $JOBQ_REDIS_URL, else redis://localhost:6379/0)",
    )
    common.add_argument("--prefix", default=argparse.SUPPRESS, help="key prefix (default: jobq)")
    common.add_argument("--log-level", default=argparse.SUPPRESS,
                        help="logging level: DEBUG, INFO (default), WARNING, ERROR")
    return common


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``jobq`` command."""
    common = _common()
    parser = argparse.ArgumentParser(
        prog="jobq", parents=[common],
        description="Run jobq workers, inspect and administer queues, serve metrics.",
        epilog=(__doc__ or "").split("\n\n", 1)[1].strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"jobq {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, func: Callable[[argparse.Namespace], int], text: str
                ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[common], help=text, description=text)
        p.set_defaults(func=func)
        return p

    worker = command("worker", _cmd_worker,
                     "run a worker until SIGINT / SIGTERM / SIGHUP (a second signal forces)")
    worker.add_argument("processor", metavar="MODULE:CALLABLE",
                        help="a callable taking a Job, a dict of job names to callables, "
                             "or a Queue or ShardedQueue (its @queue.task functions, on its "
                             "server and prefix unless --url / --prefix say otherwise)")
    worker.add_argument("--queue", "-q", action="append", default=None,
                        help="queue to serve (repeat for several; default: the Queue's own "
                             "when MODULE:CALLABLE names one)")
    worker.add_argument("--concurrency", "-c", type=int, default=1,
                        help="jobs run at once, per queue (default: 1)")
    worker.add_argument("--name", default=None, help="worker name (default: HOST:PID)")
    worker.add_argument("--lock-duration", type=float, default=None,
                        help="seconds a job's lock lasts before renewal (default: 30)")
    worker.add_argument("--stalled-interval", type=float, default=None,
                        help="seconds between checks for jobs whose worker died (default: 30)")
    worker.add_argument("--max-stalled-count", type=int, default=None,
                        help="times a job may stall and be run again before it fails "
                             "(default: 1)")
    worker.add_argument("--drain-delay", type=float, default=None,
                        help="longest idle time between two looks at a queue (default: 5)")
    worker.add_argument("--heartbeat-ttl", type=float, default=30.0,
                        help="seconds a dead worker stays listed (default: 30)")
    worker.add_argument("--burst", action="store_true",
                        help="exit 0 once no job of the queues is waiting (or the queue "
                             "is paused) or active (for cron and CI)")

    add = command("add", _cmd_add, "add one job; print its id")
    add.add_argument("queue", metavar="QUEUE")
    add.add_argument("name", metavar="NAME", help="the job's name")
    add.add_argument("--data", default=None, help="the job's data, as JSON (default: null)")
    add.add_argument("--delay", type=float, default=None, help="seconds before it may run")
    add.add_argument("--priority", type=int, default=None,
                     help="1 most urgent, larger later (default: none)")
    add.add_argument("--attempts", type=int, default=None, help="attempts (default: 1)")
    add.add_argument("--job-id", default=None, help="a custom id (idempotent add)")

    info = command("info", _cmd_info,
                   "job counts, paused flag, live workers and jobs/min per queue")
    info.add_argument("queues", nargs="*", metavar="QUEUE",
                      help="queues to show (default: every known queue)")
    info.add_argument("--json", action="store_true",
                      help="print a JSON list, one object per queue (with --watch: a line "
                           "per frame, an object of at, queues and errors)")
    info.add_argument("--watch", "-w", action="store_true",
                      help="redraw a live table every second until interrupted")
    info.add_argument("--interval", type=_every, default=1.0,
                      help="seconds between redraws with --watch (default: 1)")
    info.add_argument("--plain", action="store_true",
                      help="with --watch, append frames instead of redrawing (the default "
                           "when the output is not a terminal)")
    info.add_argument("--count", type=_frames, default=None,
                      help="with --watch, stop after this many frames (default: never)")

    events = command("events", _cmd_events, "follow a queue's events until interrupted")
    events.add_argument("queue", metavar="QUEUE")
    events.add_argument("--from", dest="from_id", default="$",
                        help="'$' from now (default), '0' every retained event, or an id")
    events.add_argument("--json", action="store_true", help="one JSON object per line")

    job = command("job", _cmd_job, "show one job (exit 1 when there is none)")
    job.add_argument("queue", metavar="QUEUE")
    job.add_argument("id", metavar="ID")
    job.add_argument("--json", action="store_true", help="print one JSON object")

    retry = command("retry", _cmd_retry,
                    "move failed (cancelled ones too) or completed jobs back to waiting")
    retry.add_argument("queue", metavar="QUEUE")
    retry.add_argument("--state", choices=("failed", "completed"), default="failed")

    promote = command("promote", _cmd_promote, "make delayed jobs wait now, due soonest first")
    promote.add_argument("queue", metavar="QUEUE")
    promote.add_argument("--count", type=int, default=None,
                         help="promote at most this many (default: all)")

    clean = command("clean", _cmd_clean, "remove old finished (or waiting, delayed) jobs")
    clean.add_argument("queue", metavar="QUEUE")
    clean.add_argument("--state", choices=("completed", "failed", "delayed", "waiting",
                                           "waiting-children"), default="completed")
    clean.add_argument("--grace", type=float, default=0.0,
                       help="keep jobs younger than this many seconds (default: 0)")
    clean.add_argument("--limit", type=int, default=0, help="remove at most this many")

    for name, text in (("pause", "pause a queue for every worker"),
                       ("resume", "resume a paused queue")):
        command(name, _cmd_pause, text).add_argument("queue", metavar="QUEUE")

    drain = command("drain", _cmd_drain, "remove every waiting job")
    drain.add_argument("queue", metavar="QUEUE")
    drain.add_argument("--delayed", action="store_true", help="remove delayed jobs too")

    obliterate = command("obliterate", _cmd_obliterate,
                         "delete a queue with all its jobs, events and metrics")
    obliterate.add_argument("queue", metavar="QUEUE")
    obliterate.add_argument("--yes", action="store_true", help="confirm the deletion")
    obliterate.add_argument("--force", action="store_true",
                            help="delete even while jobs are active")

    cancel = command("cancel", _cmd_cancel,
                     "cancel a job: a queued one fails now, a running one is told to "
                     "stop (exit 1 when it is finished or unknown)")
    cancel.add_argument("queue", metavar="QUEUE")
    cancel.add_argument("id", metavar="ID")
    cancel.add_argument("--reason", default=None, help="the failed reason (default: cancelled)")

    schedulers = command("schedulers", _cmd_schedulers,
                         "list a queue's job schedulers, or remove one")
    schedulers.add_argument("queue", metavar="QUEUE")
    # --json with --remove printed text: the two are refused together
    either = schedulers.add_mutually_exclusive_group()
    either.add_argument("--remove", metavar="ID", default=None,
                        help="remove this scheduler and its pending job")
    either.add_argument("--json", action="store_true",
                        help="print a JSON list, one object per scheduler (as "
                             "Queue.get_schedulers: times in epoch seconds)")

    functions = command("functions", _cmd_functions,
                        "load jobq's functions (FUNCTION LOAD REPLACE) on the server, or "
                        "every primary of a cluster: as an admin, where the users jobq runs "
                        "as may not load them (docs/guide/security.md)")
    functions.add_argument("action", choices=("load",))

    wait = command("wait", _cmd_wait,
                   "wait for jobs to finish; exit 1 if any failed, 4 on timeout")
    wait.add_argument("queue", metavar="QUEUE")
    wait.add_argument("ids", nargs="+", metavar="ID")
    wait.add_argument("--timeout", type=_timeout, default=None, help="seconds to wait at most")
    wait.add_argument("--quiet", action="store_true", help="no progress bar")

    from .dashboard._command import add_arguments, port_number

    server = command("server", _cmd_server,
                     "run a local Redis-compatible server for development")
    server.add_argument("--port", type=port_number, default=None,
                        help="port (default: a free one)")
    server.add_argument("--dir", default=None,
                        help="keep the data in this directory (default: a temporary one)")

    metrics = command("metrics", _cmd_metrics,
                      "serve Prometheus metrics at http://HOST:PORT/metrics")
    metrics.add_argument("queues", nargs="*", metavar="QUEUE",
                         help="queues to report (default: every known queue)")
    metrics.add_argument("--port", type=port_number, default=9090, help="port (default: 9090)")
    metrics.add_argument("--host", default="127.0.0.1",
                         help="address to listen on (default: 127.0.0.1)")

    add_arguments(command("dashboard", _cmd_dashboard,
                          "serve the web dashboard at http://HOST:PORT/"))
    return parser


def _where(args: argparse.Namespace) -> str:
    """The server a command talked to, for its error message (no password)."""
    return redact(args.url or "redis://localhost:6379/0")  # args.url: --url, or JOBQ_REDIS_URL


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``jobq`` command; return its exit code."""
    args = build_parser().parse_args(argv)
    args.given = {key for key in ("url", "prefix") if getattr(args, key, None) is not None}
    # defaults filled here: set_defaults() would reach the subcommands' shared
    # actions and override a --url given before the command
    for key, default in (("url", os.environ.get("JOBQ_REDIS_URL") or None),
                         ("prefix", "jobq"), ("log_level", "INFO")):
        if getattr(args, key, None) is None:
            setattr(args, key, default)
    try:
        validate_prefix(args.prefix)  # every command: `info` lists what is under it
    except ValueError as exc:
        print(f"jobq: {exc}", file=sys.stderr)
        return EXIT_USAGE
    level = getattr(logging, str(args.log_level).upper(), None)
    if not isinstance(level, int):
        print(f"jobq: unknown log level {args.log_level!r}", file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        code: int = args.func(args)
        sys.stdout.flush()  # here, where a reader gone is caught (below)
    except _UsageError as exc:
        print(f"jobq {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
            redis.exceptions.RedisClusterException) as exc:  # a cluster none of whose nodes answers
        where = _where(args)
        if login_refused(exc):  # no password, or a wrong one
            cause = exc
            while not isinstance(cause, redis.exceptions.AuthenticationError):
                cause = cause.__cause__  # type: ignore[assignment]
            # the library's message names the server as its client does (a
            # URL's query left out): the reason alone
            why = re.sub(r"^the Redis server at .* refused the login: ", "",
                         str(cause)).rstrip(".")
            print(f"jobq: Redis at {where} refused the login: {why} (give "
                  "the password in the URL: redis://:PASSWORD@HOST:PORT/DB, an ACL user's as "
                  "USER:PASSWORD@)", file=sys.stderr)
            return EXIT_REDIS
        # no Sentinel named a master: without the repr of each Sentinel's
        # client that redis-py appends (over a thousand characters)
        reason = re.sub(r"^cannot reach the Redis server at \S+: ", "", brief(exc))
        print(f"jobq: cannot reach Redis at {where}: {reason}", file=sys.stderr)
        return EXIT_REDIS
    except redis.exceptions.InvalidResponse as exc:  # another service on that port
        where = _where(args)
        print(f"jobq: cannot reach Redis at {where}: what answered there is not a Redis "
              f"server ({exc})", file=sys.stderr)
        return EXIT_REDIS
    except redis.exceptions.RedisError as exc:  # reached, and refused: NOPERM, WRONGTYPE...
        if moved(exc):  # a plain URL of a cluster's node
            print("jobq: the server is a node of a Redis Cluster (it answered MOVED): give a "
                  "redis+cluster:// URL", file=sys.stderr)
            return EXIT_USAGE
        print(f"jobq: Redis error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except (ValueError, TypeError) as exc:  # e.g. an invalid queue name
        print(f"jobq {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except JobqError as exc:
        print(f"jobq {args.command}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the output's reader left (`jobq job Q ID | head -1`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except OSError as exc:  # a port taken, a host unknown, a --dir that is a file
        print(f"jobq {args.command}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return code
