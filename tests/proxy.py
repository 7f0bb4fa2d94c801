"""A TCP proxy on loopback between jobq and a real server, for tests that
need the network to misbehave for one chosen command: its reply lost (the
server ran it; the client sees the connection drop), or the command held
back for a while. Everything else passes through untouched."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

Match = Callable[[bytes], bool]


class Proxy:
    """Forward 127.0.0.1:<port> to ``upstream``; ``drop_reply`` / ``delay`` /
    ``hold`` / ``replace_reply`` arm one-shot rules matched against each
    chunk a client sends."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._rules: list[tuple[Match, str, float, threading.Event]] = []
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = []
        self._replace: dict[socket.socket, bytes] = {}  # client -> its next reply
        self._then: dict[threading.Event, Callable[[], None]] = {}  # drop_reply's
        self._released: dict[threading.Event, threading.Event] = {}  # hold's
        self._dropping: set[socket.socket] = set()  # clients whose replies are dropped
        self._threads: list[threading.Thread] = []
        self._start(self._accept)

    @property
    def url(self) -> str:
        """A redis:// URL through the proxy."""
        return f"redis://127.0.0.1:{self.port}/0"

    def drop_reply(self, match: Match, then: Callable[[], None] | None = None) -> threading.Event:
        """The next chunk that matches goes to the server, but its client's
        connection is closed at once and the reply thrown away (after
        ``then()``, when given: its client cannot send again before). The
        Event is set when that happened."""
        hit = self._arm(match, "drop", 0.0)
        if then is not None:
            self._then[hit] = then
        return hit

    def replace_reply(self, match: Match, reply: bytes) -> threading.Event:
        """The next chunk that matches goes to the server, and its client
        gets ``reply`` (raw RESP) instead of the server's answer."""
        return self._arm(match, "replace:" + reply.decode(), 0.0)

    def delay(self, match: Match, seconds: float) -> threading.Event:
        """The next chunk that matches is held back ``seconds`` (bounded)
        before it goes on; the Event is set when it was caught."""
        return self._arm(match, "delay", seconds)

    def hold(self, match: Match, release: threading.Event, bound: float) -> threading.Event:
        """The next chunk that matches is held back until ``release`` is set
        (``bound`` seconds at most) before it goes on; the Event returned is
        set when it was caught."""
        hit = self._arm(match, "hold", bound)
        self._released[hit] = release
        return hit

    def _arm(self, match: Match, kind: str, seconds: float) -> threading.Event:
        hit = threading.Event()
        with self._lock:
            self._rules.append((match, kind, seconds, hit))
        return hit

    def _rule_for(self, chunk: bytes) -> tuple[str, float, threading.Event] | None:
        with self._lock:
            for i, (match, kind, seconds, hit) in enumerate(self._rules):
                if match(chunk):
                    del self._rules[i]
                    return kind, seconds, hit
        return None

    def _start(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name="test-proxy", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = socket.create_connection(self._upstream, timeout=5)
            upstream.settimeout(None)
            client.settimeout(None)
            self._sockets += (client, upstream)
            self._start(self._pump_up, client, upstream)
            self._start(self._pump_down, upstream, client)

    def _pump_up(self, client: socket.socket, upstream: socket.socket) -> None:
        dropped = False
        try:
            while chunk := client.recv(65536):
                rule = self._rule_for(chunk)
                if rule is not None:
                    kind, seconds, hit = rule
                    if kind == "delay":
                        hit.set()
                        self._stop.wait(seconds)
                    elif kind == "hold":
                        hit.set()
                        self._released.pop(hit).wait(seconds)
                    elif kind.startswith("replace:"):
                        self._replace[client] = kind.removeprefix("replace:").encode()
                        hit.set()
                    else:
                        self._dropping.add(client)  # no reply reaches it from now on
                        upstream.sendall(chunk)
                        then = self._then.pop(hit, None)
                        if then is not None:
                            then()
                        # Set before the client can see its connection lost,
                        # so that whoever it tells finds the Event set.
                        hit.set()
                        client.shutdown(socket.SHUT_RDWR)  # the reply never reaches it
                        client.close()
                        dropped = True  # the server's side stays open: it runs the command
                        return
                upstream.sendall(chunk)
        except OSError:
            pass
        finally:
            if not dropped:
                _close(upstream)

    def _pump_down(self, upstream: socket.socket, client: socket.socket) -> None:
        try:
            while chunk := upstream.recv(65536):
                if client in self._dropping:
                    continue  # read the server's reply, throw it away
                chunk = self._replace.pop(client, chunk)  # a reply to replace is whole
                try:
                    client.sendall(chunk)
                except OSError:
                    continue  # client gone: read the server's reply, throw it away
        except OSError:
            pass
        finally:
            _close(client)

    def close(self) -> None:
        """Stop accepting, close every connection, end every thread."""
        self._stop.set()
        self._listener.close()
        for sock in self._sockets:
            _close(sock)
        for thread in self._threads:
            thread.join(5)

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass
