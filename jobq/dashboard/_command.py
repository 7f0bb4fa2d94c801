"""The ``jobq dashboard`` command: the dashboard on wsgiref's server.

wsgiref is the standard library's reference server, fine for one team's
operations and for development; behind many users, mount
:func:`jobq.dashboard.create_app` in gunicorn instead.
"""

from __future__ import annotations

import argparse
import logging
import socketserver
import threading
from collections.abc import Callable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from .._signals import StopSignals
from ._app import create_app, is_loopback

logger = logging.getLogger(__name__)


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    """wsgiref's server, a thread per request (a slow client blocks no one)."""

    daemon_threads = True


class _Handler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s - " + format, self.address_string(), *args)


def serve(app: Callable[..., Any], host: str = "127.0.0.1", port: int = 9181) -> WSGIServer:
    """A wsgiref server of ``app`` on ``host:port`` (port 0: a free one).

    Call ``serve_forever()`` on it, and ``shutdown()`` / ``server_close()``
    to stop it.
    """
    try:
        return make_server(host, port, app, server_class=_Server, handler_class=_Handler)
    except OSError as exc:  # named: a port taken, a host unknown
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from exc


def port_number(text: str) -> int:
    """A ``--port`` argument: 0 (a free one) to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535, not {port}")
    return port


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``jobq dashboard``."""
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default: 127.0.0.1); another than "
                             "loopback needs --auth")
    parser.add_argument("--port", type=port_number, default=9181, help="port (default: 9181)")
    parser.add_argument("--read-only", action="store_true",
                        help="show everything, allow no action")
    parser.add_argument("--auth", metavar="MODULE:CALLABLE", default=None,
                        help="auth(environ) -> bool, asked on every request")


def run(args: argparse.Namespace, auth: Callable[[dict[str, Any]], bool] | None) -> int:
    """Serve the dashboard until SIGINT / SIGTERM (``auth``: from --auth,
    loaded by the command line); return the exit code."""
    if auth is None and not is_loopback(args.host):
        raise ValueError(
            f"refusing to serve on {args.host} without --auth: anyone who reaches it could "
            "retry, remove and cancel jobs (use 127.0.0.1, or give --auth MODULE:CALLABLE)"
        )
    with create_app(args.url, args.prefix, args.read_only, auth) as app:
        app.client.ping()
        # without auth, the app answers requests to loopback names alone
        server = serve(app, args.host, args.port)
        thread = threading.Thread(target=server.serve_forever, name="jobq-dashboard-http",
                                  daemon=True)
        try:
            with StopSignals() as stop:
                thread.start()
                mode = " (read-only)" if args.read_only else ""
                print(f"jobq dashboard{mode} at http://{args.host}:{server.server_port}/ "
                      "(wsgiref: for development and operations); Ctrl-C to stop", flush=True)
                while not stop.wait(0.5):
                    pass
        finally:
            if thread.ident is not None:
                server.shutdown()
                thread.join(5)
            server.server_close()
    return 0
