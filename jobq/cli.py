"""The ``jobq`` command: run workers, inspect queues, follow events, run a server."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any

from .job import STATES

__all__ = ["main"]


def _load(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"jobq: expected MODULE:CALLABLE, not {spec!r}")
    sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise SystemExit(f"jobq: cannot load {spec!r}: {exc}") from exc
    return target


def _stop_on_signals(stop: threading.Event) -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def _cmd_worker(args: argparse.Namespace) -> int:
    from .worker import Worker

    processor = _load(args.processor)
    if len(args.queue) == 1:
        Worker(
            args.queue[0], processor, connection=args.url, prefix=args.prefix,
            concurrency=args.concurrency, name=args.name,
        ).run()
        return 0
    workers = [
        Worker(q, processor, connection=args.url, prefix=args.prefix,
               concurrency=args.concurrency, name=args.name).start()
        for q in args.queue
    ]
    stop = threading.Event()
    _stop_on_signals(stop)
    while not stop.wait(0.5):
        pass
    for worker in workers:
        worker.close()
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    from .queue import Queue

    for i, name in enumerate(args.queues):
        with Queue(name, connection=args.url, prefix=args.prefix) as queue:
            counts = queue.get_job_counts()
            if len(args.queues) > 1:
                print(("\n" if i else "") + f"{name}{' (paused)' if queue.is_paused() else ''}")
            for state in STATES:
                print(f"{state} {counts[state]}")
    return 0


def _cmd_events(args: argparse.Namespace) -> int:
    from .queue_events import QueueEvents

    stop = threading.Event()
    _stop_on_signals(stop)
    lock = threading.Lock()

    def show(event: Any) -> None:
        if args.json:
            line = json.dumps(
                {"id": event.id, "name": event.name, "job_id": event.job_id,
                 "timestamp": event.timestamp, "prev": event.prev, **event.fields},
                default=_jsonable,
            )
        else:
            fields = " ".join(f"{k}={v!r}" for k, v in event.fields.items())
            line = f"{event.id or '-'} {event.name} {event.job_id or '-'} {fields}".rstrip()
        with lock:
            print(line, flush=True)

    with QueueEvents(
        args.queue, connection=args.url, prefix=args.prefix, last_event_id=args.from_id
    ) as events:
        events.on_all_events(show)
        while not stop.wait(0.5):
            pass
    return 0


def _jsonable(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return {name: getattr(value, name) for name in value.__dataclass_fields__}
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return repr(value)


def _cmd_server(args: argparse.Namespace) -> int:
    from .testing import RedisServer

    stop = threading.Event()
    _stop_on_signals(stop)
    server = RedisServer(port=args.port)
    server.start()
    try:
        print(f"jobq server listening at {server.url} (Ctrl-C to stop)", flush=True)
        while not stop.wait(0.5) and server.is_running():
            pass
    finally:
        server.stop()
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``jobq`` command."""
    parser = argparse.ArgumentParser(prog="jobq", description=__doc__)
    parser.add_argument(
        "--url", default=os.environ.get("JOBQ_REDIS_URL") or None,
        help="Redis URL (default: $JOBQ_REDIS_URL, else redis://localhost:6379/0)",
    )
    parser.add_argument("--prefix", default="jobq", help="key prefix (default: jobq)")
    parser.add_argument("--log-level", default="INFO", help="logging level (default: INFO)")
    sub = parser.add_subparsers(dest="command", required=True)

    worker = sub.add_parser("worker", help="run a worker")
    worker.add_argument("processor", help="MODULE:CALLABLE, a callable or a dict of them")
    worker.add_argument("--queue", "-q", action="append", required=True, help="queue name")
    worker.add_argument("--concurrency", "-c", type=int, default=1)
    worker.add_argument("--name", default=None, help="worker name")
    worker.set_defaults(func=_cmd_worker)

    info = sub.add_parser("info", help="print job counts per state")
    info.add_argument("queues", nargs="+", metavar="QUEUE")
    info.set_defaults(func=_cmd_info)

    events = sub.add_parser("events", help="follow a queue's events until interrupted")
    events.add_argument("queue")
    events.add_argument("--from", dest="from_id", default="$",
                        help="'$' from now (default), '0' all retained, or an id")
    events.add_argument("--json", action="store_true", help="one JSON object per line")
    events.set_defaults(func=_cmd_events)

    server = sub.add_parser("server", help="run a local Redis-compatible server")
    server.add_argument("--port", type=int, default=None)
    server.set_defaults(func=_cmd_server)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``jobq`` command; return its exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    code: int = args.func(args)
    return code
