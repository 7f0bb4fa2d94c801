"""The ``jobq`` command, end to end: each subcommand in a subprocess against the
session's real server (exit codes, output, signals, the ``--watch`` redraw in
a pseudo-terminal)."""

from __future__ import annotations

import datetime
import json
import os
import pty
import queue as _queue
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis

from jobq import Queue, Worker
from jobq.cli import main
from jobq.connection import redact
from jobq.testing import RedisServer, find_server_binary
from tests.polling import until

ROOT = Path(__file__).resolve().parent.parent
WAIT = 20.0  # seconds any single step of a test may take at most
CLEAR = b"\x1b[H\x1b[2J"


def _env(url: str) -> dict[str, str]:
    env = dict(os.environ, JOBQ_REDIS_URL=url, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _command(url: str, args: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "jobq", "--url", url, *args]


def _reap(proc: subprocess.Popen[Any]) -> None:
    """Kill a command a test left running (its assertions failed first)."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(WAIT)


def jobq(url: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run one ``jobq`` command to its end."""
    return subprocess.run(
        _command(url, args), env=_env(url), cwd=ROOT, capture_output=True, text=True,
        timeout=timeout, check=False,
    )


class Running:
    """A long-running ``jobq`` command whose output lines are read as they come."""

    def __init__(self, url: str, *args: str, sighup: Any = None) -> None:
        # ``sighup``: the SIGHUP disposition the command starts with (kept
        # through exec): SIG_IGN as nohup starts it, SIG_DFL as a terminal
        # does (the tests themselves may run under nohup); None inherits
        self.proc = subprocess.Popen(
            _command(url, args), env=_env(url), cwd=ROOT, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            preexec_fn=None if sighup is None else (
                lambda: signal.signal(signal.SIGHUP, sighup)),
        )
        self.lines: _queue.SimpleQueue[tuple[str, str]] = _queue.SimpleQueue()
        self.seen: list[tuple[str, str]] = []
        self._readers = [
            threading.Thread(target=self._read, args=(name, stream), name=f"test-{name}",
                             daemon=True)
            for name, stream in (("out", self.proc.stdout), ("err", self.proc.stderr))
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, name: str, stream: Any) -> None:
        for line in stream:
            self.lines.put((name, line.rstrip("\n")))

    def expect(self, pattern: str, stream: str | None = None, timeout: float = WAIT) -> str:
        """Return the first new line matching ``pattern``; fail after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no line matching {pattern!r} in {self.seen!r}")
            try:
                name, line = self.lines.get(timeout=left)
            except _queue.Empty:
                continue
            self.seen.append((name, line))
            if (stream is None or stream == name) and re.search(pattern, line):
                return line

    def text(self, stream: str) -> str:
        """Everything read so far from one stream (after the process ended)."""
        for reader in self._readers:
            reader.join(WAIT)
        while True:
            try:
                self.seen.append(self.lines.get_nowait())
            except _queue.Empty:
                break
        return "\n".join(line for name, line in self.seen if name == stream)

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = WAIT) -> int:
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(WAIT)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def running(redis_url: str) -> Iterator[Any]:
    """Start ``jobq`` commands; each is killed at the end of the test."""
    started: list[Running] = []

    def start(*args: str, sighup: Any = None) -> Running:
        process = Running(redis_url, *args, sighup=sighup)
        started.append(process)
        return process

    try:
        yield start
    finally:
        for process in started:
            process.kill()


def _ledger(redis_client: redis.Redis, queue_name: str) -> str:
    item = redis_client.blpop([f"ledger:{{{queue_name}}}"], timeout=WAIT)
    assert item is not None, "the handler never started"
    return str(item[1].decode())


def _go(redis_client: redis.Redis, queue_name: str) -> None:
    redis_client.rpush(f"ledger:{{{queue_name}}}:go", "go")


# -- usage -----------------------------------------------------------------------


def test_help_everywhere_and_usage_errors(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    done = jobq(redis_url, "--help")  # the real entry point, once
    assert done.returncode == 0
    commands = ("worker", "info", "events", "job", "retry", "promote", "clean", "pause", "resume",
                "drain", "obliterate", "wait", "server", "metrics", "functions")
    for command in commands:
        assert command in done.stdout
        with pytest.raises(SystemExit) as exited:  # in-process: 13 interpreters are slow
            main([command, "--help"])
        assert exited.value.code == 0
        out = capsys.readouterr().out
        assert "--url" in out and "--prefix" in out, command
    # no command, no id; a redraw interval that is not > 0 (NaN never ended)
    interval = ["info", "--watch", "--count", "2", "--interval"]
    # and a frame count that is not >= 1 (-1 drew one frame, 0 never ended)
    count = ["info", "--watch", "--count"]
    for argv in ([], ["bogus"], ["wait", "q"], [*interval, "nan"], [*interval, "-1"],
                 [*interval, "0"], [*interval, "inf"], [*count, "-1"], [*count, "0"],
                 [*count, "x"]):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2, argv
    # an invalid prefix, for every command (`info` listed the queues under '')
    for argv in (["--prefix", "", "info"], ["info", "--prefix", "a b"],
                 ["--prefix", "", "add", "q", "n"]):
        assert main(["--url", redis_url, *argv]) == 2, argv
        assert "invalid prefix" in capsys.readouterr().err
    # -q may be left out only when MODULE:CALLABLE names a Queue
    assert main(["--url", redis_url, "worker", "tests.tasks:double"]) == 2
    assert "--queue is required" in capsys.readouterr().err
    assert jobq(redis_url).returncode == 2
    bad = jobq(redis_url, "info", "bad name")
    assert bad.returncode == 2 and "invalid queue name" in bad.stderr


@pytest.mark.parametrize("url", ["redis://127.0.0.1:1/0", "redis+cluster://127.0.0.1:1"])
def test_unreachable_redis_exits_3(queue_name: str, url: str) -> None:
    done = jobq(url, "info", queue_name, timeout=30)
    assert done.returncode == 3, done.stderr
    assert f"cannot reach Redis at {url}" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("command", [["info"], ["worker", "tests.tasks:double", "-q", "q"]])
def test_another_service_at_the_url_is_said_as_such_and_exits_3(command: list[str]) -> None:
    """A URL naming a port where an HTTP server answers: redis-py's protocol
    error exited 1 as a Redis error, where scripts look for 3 (Redis
    unreachable)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def answer() -> None:  # as a web server does to what it cannot parse
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"<html>400 Bad Request</html>\r\n")

    thread = threading.Thread(target=answer, name="test-http", daemon=True)
    thread.start()
    try:
        url = f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
        done = jobq(url, *command, timeout=30)
        assert done.returncode == 3, done.stderr
        assert done.stderr.startswith(f"jobq: cannot reach Redis at {url}: what answered "
                                      "there is not a Redis server"), done.stderr
        assert "Traceback" not in done.stderr
    finally:
        stop.set()
        thread.join(5)
        listener.close()


@pytest.mark.parametrize("command", [["info"], ["worker", "tests.tasks:double", "-q", "q"]])
def test_an_unreachable_redis_is_named_without_its_password(command: list[str]) -> None:
    # a URL's query too: the server named in the library's message has none
    for via_env, query in ((False, ""), (True, ""), (False, "?protocol=3")):
        url = "redis://user:hunter2@127.0.0.1:1/0" + query
        argv = [sys.executable, "-m", "jobq", *([] if via_env else ["--url", url]), *command]
        done = subprocess.run(argv, env=_env(url), cwd=ROOT, capture_output=True, text=True,
                              timeout=60, check=False)
        assert done.returncode == 3, done.stderr
        assert done.stderr.startswith(
            f"jobq: cannot reach Redis at redis://user:***@127.0.0.1:1/0{query}: "), done.stderr
        assert "hunter2" not in done.stderr + done.stdout
        assert "Traceback" not in done.stderr
        assert "cannot reach" not in done.stderr.split(": ", 2)[2]  # said once


@pytest.mark.parametrize("command", [["info"], ["worker", "tests.tasks:double", "-q", "q"],
                                     ["obliterate", "q", "--yes"]])
def test_a_refused_login_is_said_as_such(
    command: list[str], redis_url: str, redis_client: redis.Redis
) -> None:
    """A wrong password was "cannot reach Redis at ...: invalid
    username-password pair": the server was reached, and refused the login."""
    redis_client.acl_setuser("jobq-cli-login", enabled=True, passwords=["+right"],
                             commands=["+@all"], keys=["*"], channels=["*"])
    try:
        url = redis_url.replace("://", "://jobq-cli-login:hunter2@", 1)  # any scheme
        done = jobq(url, *command)
        assert done.returncode == 3, done.stderr
        where = redact(url)
        assert done.stderr.startswith(f"jobq: Redis at {where} refused the login: "), done.stderr
        assert "USER:PASSWORD@" in done.stderr and "Traceback" not in done.stderr
        assert "hunter2" not in done.stderr + done.stdout
        assert "refused the login" not in done.stderr.split(": ", 2)[2]  # said once
    finally:
        redis_client.acl_deluser("jobq-cli-login")


def test_a_burst_run_whose_server_goes_away_closes_its_workers_and_raises(
    queue_name: str,
) -> None:
    """A burst run's look at its queues that fails ends the run with the
    error (as `jobq worker` exits 3), after closing its workers: their
    threads do not run on."""
    from jobq._serve import serve

    running, release = threading.Event(), threading.Event()

    def processor(job: Any) -> None:
        running.set()
        release.wait(WAIT)

    with RedisServer(find_server_binary()) as server:
        with Queue(queue_name, connection=server.url) as queue:
            queue.add("x")

        def stop_server() -> None:  # while the job runs
            if running.wait(WAIT):
                server.stop()
            release.set()

        stopper = threading.Thread(target=stop_server, name="stop-server")
        stopper.start()
        try:  # serve() sets signal handlers: the main thread's
            with pytest.raises(redis.exceptions.ConnectionError):
                serve([(queue_name, processor)], connection=server.url, burst=True,
                      lock_duration=2.0)
        finally:
            release.set()
            stopper.join(WAIT)
    assert running.is_set()
    assert [t.name for t in threading.enumerate() if t.name.startswith("jobq-")] == []


def test_listening_and_directory_errors_are_one_line(redis_url: str, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        for command in ("dashboard", "metrics"):
            done = jobq(redis_url, command, "--port", port)
            assert done.returncode == 1, done.stderr
            assert done.stderr == (f"jobq {command}: [Errno 98] cannot listen on "
                                   f"127.0.0.1:{port}: Address already in use\n")
    for command in ("dashboard", "metrics", "server"):
        done = jobq(redis_url, command, "--port", "70000")
        assert done.returncode == 2 and "a port is 0 to 65535, not 70000" in done.stderr
    a_file = tmp_path / "file"
    a_file.write_text("")
    done = jobq(redis_url, "server", "--dir", str(a_file))
    assert done.returncode == 1 and done.stderr.startswith("jobq server: [Errno 17] File exists")


def test_output_to_a_reader_that_left_ends_quietly(queue: Queue, redis_url: str) -> None:
    """`jobq job Q ID | head -1`: no BrokenPipeError traceback."""
    job = queue.add("x", {"text": "y" * 100_000})
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write
    try:
        done = subprocess.run(_command(redis_url, ["job", queue.name, job.id]),
                              env=_env(redis_url), cwd=ROOT, stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    finally:
        os.close(write)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_redact_hides_every_password_of_a_url() -> None:
    assert redact("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert redact("redis://:pw@h:1/0") == "redis://:***@h:1/0"
    assert redact("rediss://me:p@w@h:1/0?ssl_cert_reqs=none") == \
        "rediss://me:***@h:1/0?ssl_cert_reqs=none"
    assert redact("redis://token@h:1") == "redis://***@h:1"
    assert redact("redis+sentinel://:pw@a:1,b:2/svc?sentinel_password=s&db=1") == \
        "redis+sentinel://:***@a:1,b:2/svc?sentinel_password=***&db=1"
    assert redact("unix:///tmp/r.sock?password=pw") == "unix:///tmp/r.sock?password=***"


# -- worker ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("tests.no_such_module:double", "No module named 'tests.no_such_module'"),
        ("tests.cli_tasks:missing", "has no attribute 'missing'"),
        ("tests.cli_tasks:NOT_CALLABLE", "is a int, not a callable"),
        ("no-colon", "expected MODULE:CALLABLE"),
    ],
)
def test_worker_import_error_exits_2_with_a_clear_message(
    redis_url: str, queue_name: str, spec: str, message: str
) -> None:
    done = jobq(redis_url, "worker", spec, "--queue", queue_name)
    assert done.returncode == 2
    assert "jobq worker:" in done.stderr and message in done.stderr
    assert "Traceback" not in done.stderr


def test_worker_logs_each_job_and_stops_gracefully_on_sigterm(
    running: Any, queue: Queue, redis_client: redis.Redis
) -> None:
    worker = running("worker", "tests.cli_tasks:ROUTES", "-q", queue.name, "-c", "2",
                     "--name", "cli-w", "--heartbeat-ttl", "3")
    worker.expect("serving", "err")
    jobs = [queue.add("double", n) for n in range(3)]
    assert [job.wait_until_finished(timeout=WAIT) for job in jobs] == [0, 2, 4]
    logged = {
        worker.expect(rf"jobq\.jobs\.{re.escape(queue.name)}: job \S+ \(double\) completed in",
                      "err").split(": job ")[1].split()[0]
        for _ in jobs
    }  # one INFO line per job, in whatever order the 2 threads finish them
    assert logged == {job.id for job in jobs}
    failing = queue.add("double", "fail")
    worker.expect(rf"WARNING .*job {failing.id} \(double\) failed .*asked to fail", "err")
    (info,) = until(queue.get_workers)
    assert (info.name, info.pid, info.queues, info.concurrency) == (
        "cli-w", worker.proc.pid, (queue.name,), 2)

    gated = queue.add("gated")
    assert _ledger(redis_client, queue.name) == f"start|{gated.id}"
    worker.signal(signal.SIGTERM)
    worker.expect("SIGTERM: finishing jobs in flight", "err")
    assert worker.proc.poll() is None  # waits for the job in flight
    _go(redis_client, queue.name)
    assert worker.wait() == 0
    assert gated.wait_until_finished(timeout=WAIT) == "done"
    assert queue.get_workers() == []  # it left the registry on its way out


def test_worker_stops_gracefully_on_sighup_unless_started_under_nohup(
    running: Any, queue: Queue, redis_client: redis.Redis
) -> None:
    """SIGHUP (a closed terminal, a supervisor's reload) ended the process
    at once, its job left active until the stall check: it now finishes
    the jobs in flight as SIGTERM does. A process started with SIGHUP
    ignored (nohup) keeps ignoring it."""
    ignoring = running("worker", "tests.cli_tasks:gated", "-q", queue.name,
                       sighup=signal.SIG_IGN)
    ignoring.expect("serving", "err")
    ignoring.signal(signal.SIGHUP)
    job = queue.add("gated")
    _ledger(redis_client, queue.name)  # the nohup worker took it: it is alive
    worker = running("worker", "tests.cli_tasks:gated", "-q", queue.name,
                     sighup=signal.SIG_DFL)
    worker.expect("serving", "err")
    ignoring.signal(signal.SIGTERM)  # the job in flight holds it until the gate opens
    ignoring.expect("SIGTERM: finishing jobs in flight", "err")
    gated = queue.add("gated")
    assert _ledger(redis_client, queue.name) == f"start|{gated.id}"
    worker.signal(signal.SIGHUP)
    worker.expect("SIGHUP: finishing jobs in flight", "err")
    assert worker.proc.poll() is None  # waits for its job in flight
    _go(redis_client, queue.name)
    _go(redis_client, queue.name)
    assert worker.wait() == 0 and ignoring.wait() == 0
    assert job.wait_until_finished(timeout=WAIT) == "done"
    assert gated.wait_until_finished(timeout=WAIT) == "done"
    assert "SIGHUP" not in ignoring.text("err")


def test_sighup_is_taken_only_where_nothing_else_handles_it() -> None:
    """SIGHUP stops Worker.run() and the commands only where its handler is
    the default: nohup's ignore and an application's own handler (a log
    reopen) stay in place."""
    from jobq._signals import StopSignals

    def own(signum: int, frame: Any) -> None:
        pass

    before = signal.getsignal(signal.SIGHUP)
    try:
        for handler, taken in ((signal.SIG_DFL, True), (signal.SIG_IGN, False), (own, False)):
            signal.signal(signal.SIGHUP, handler)
            with StopSignals() as stop:
                assert (signal.getsignal(signal.SIGHUP) == stop._handle) is taken, handler
            assert signal.getsignal(signal.SIGHUP) == handler  # put back on exit
    finally:
        signal.signal(signal.SIGHUP, before)


def test_worker_second_signal_abandons_jobs_in_flight(
    running: Any, queue: Queue, redis_client: redis.Redis
) -> None:
    worker = running("worker", "tests.cli_tasks:gated", "-q", queue.name, "--lock-duration", "2")
    worker.expect("serving", "err")
    job = queue.add("gated")
    _ledger(redis_client, queue.name)
    worker.signal(signal.SIGINT)
    worker.expect("SIGINT: finishing jobs in flight", "err")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    assert "abandoning jobs in flight" in worker.text("err")
    assert queue.get_job_state(job.id) == "active"  # recovered later as stalled


def test_worker_serves_several_queues(
    running: Any, queue: Queue, redis_url: str, queue_name: str
) -> None:
    other_name = f"{queue_name}-b"
    worker = running("worker", "tests.cli_tasks:double", "-q", queue.name, "-q", other_name)
    worker.expect("serving", "err")
    with Queue(other_name, connection=redis_url) as other:
        assert other.add("double", 5).wait_until_finished(timeout=WAIT) == 10
        assert queue.add("double", 1).wait_until_finished(timeout=WAIT) == 2
        (info,) = until(other.get_workers)
        assert info.queues == (queue.name, other_name)
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0
        assert other.get_workers() == []
        other.obliterate()


def test_registry_forgets_a_sigkilled_worker_after_its_heartbeat_ttl(
    running: Any, queue: Queue
) -> None:
    worker = running("worker", "tests.cli_tasks:double", "-q", queue.name,
                     "--heartbeat-ttl", "1")
    worker.expect("serving", "err")
    (info,) = until(queue.get_workers)
    assert info.pid == worker.proc.pid
    beat = info.last_heartbeat
    # it keeps beating (every third of the TTL)
    until(lambda: [w for w in queue.get_workers() if w.last_heartbeat > beat])
    worker.signal(signal.SIGKILL)
    worker.wait()
    killed_at = time.monotonic()
    until(lambda: queue.get_workers() == [], timeout=5)
    assert time.monotonic() - killed_at < 5


# -- info --------------------------------------------------------------------------


def _fill(queue: Queue, redis_url: str) -> None:
    """2 completed, 1 failed, 1 delayed, 3 waiting, and a paused queue."""
    with Worker(queue.name, lambda job: job.data, connection=redis_url):
        for job in [queue.add("ok", 1), queue.add("ok", 2)]:
            job.wait_until_finished(timeout=WAIT)
    with Worker(queue.name, lambda job: 1 / 0, connection=redis_url):
        job = queue.add("bad")
        with pytest.raises(Exception, match="division"):
            job.wait_until_finished(timeout=WAIT)
    queue.add("later", delay=3600)
    queue.pause()
    for n in range(3):
        queue.add("w", n)


def test_info_prints_counts_paused_workers_and_rates(queue: Queue, redis_url: str) -> None:
    _fill(queue, redis_url)
    # a flow's parent, waiting for a child (the table left these out)
    queue.add("parent", depends_on=[queue.get_jobs("waiting")[0]])
    done = jobq(redis_url, "info", queue.name)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["QUEUE", "WAITING", "DELAYED", "ACTIVE", "COMPLETED", "FAILED",
                                "WAITING-CHILDREN", "PAUSED", "WORKERS", "DONE/MIN", "FAIL/MIN"]
    row = lines[1].split()
    assert row[:9] == [queue.name, "3", "1", "0", "2", "1", "1", "yes", "0"]
    assert re.fullmatch(r"\d+\.\d", row[9]) and float(row[9]) > 0
    assert re.fullmatch(r"\d+\.\d", row[10])
    # with no queue named: every known queue, this one included, a row each
    every = jobq(redis_url, "info")
    assert every.returncode == 0
    assert any(line.split()[0] == queue.name for line in every.stdout.splitlines()[1:])
    # a name that is no queue (a typo) was a row of zeros, exit 0
    typo = jobq(redis_url, "info", queue.name, queue.name + "-typo", queue.name,
                queue.name + "-typo", "--json")  # each named twice: said once
    assert typo.returncode == 1
    assert [snap["queue"] for snap in json.loads(typo.stdout)] == [queue.name]
    assert typo.stderr.count(f"no queue {queue.name + '-typo'!r} under prefix 'jobq'") == 1
    assert "-typo" not in jobq(redis_url, "info").stdout  # reading it made it no queue
    alone = jobq(redis_url, "info", queue.name + "-typo")  # no table, only what is wrong
    assert (alone.returncode, alone.stdout) == (1, "")
    assert alone.stderr == f"jobq info: no queue {queue.name + '-typo'!r} under prefix 'jobq'\n"
    for extra in ([], ["--json"]):  # watched: said in the frame (it may come later)
        watched = jobq(redis_url, "info", queue.name + "-typo", "--watch", "--count", "1",
                       "--interval", "0.1", *extra)
        assert watched.returncode == 0, watched.stderr
        assert f"no queue {queue.name + '-typo'!r}" in watched.stdout
        assert f"\n{queue.name}-typo " not in watched.stdout  # no row


def test_info_watch_plain_when_piped(queue: Queue, redis_url: str) -> None:
    queue.add("w")
    done = jobq(redis_url, "info", queue.name, "--watch", "--interval", "0.1", "--count", "2")
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout
    assert done.stdout.count("QUEUE") == 2
    row = [line for line in done.stdout.splitlines() if line.startswith(queue.name)]
    assert len(row) == 2 and row[0].split()[1:3] == ["1", "0"]


def test_info_watch_json_writes_a_line_per_frame_and_watches_through_an_outage(
    queue_name: str,
) -> None:
    """`info --watch --json` printed the table (--json was ignored), and a
    server away while watching ended the watch with exit 3: now each frame
    is a JSON line, and an outage is one with an error, watched through."""
    with RedisServer(find_server_binary()) as server:
        with Queue(queue_name, connection=server.url) as queue:
            queue.add("x")
        proc = subprocess.Popen(
            _command(server.url, ["info", queue_name, "--watch", "--json", "--interval", "0.1"]),
            env=_env(server.url), cwd=ROOT, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True,
        )
        lines: _queue.Queue[str] = _queue.Queue()
        reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout or ()],
                                  name="watch-reader")
        reader.start()
        try:
            first = json.loads(lines.get(timeout=WAIT))
            assert first["errors"] == [] and isinstance(first["at"], float)
            assert [(q["queue"], q["counts"]["waiting"]) for q in first["queues"]] == [
                (queue_name, 1)]
            server.stop()
            deadline = time.monotonic() + WAIT
            while True:
                frame = json.loads(lines.get(timeout=max(0.0, deadline - time.monotonic())))
                if frame["errors"]:
                    break
            assert frame["queues"] == [] and "unreachable" in frame["errors"][0]
            assert proc.poll() is None  # still watching
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(WAIT) == 0
        finally:
            _reap(proc)
            reader.join(WAIT)
            if proc.stdout is not None:
                proc.stdout.close()


def test_info_watch_says_a_server_that_stops_answering_in_its_frame(
    queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that stopped answering (hung, cut off by a firewall) held
    `info --watch` (and `metrics`' scrapes) for good: its clients had no
    socket timeout. The frame says the server unreachable after
    READ_TIMEOUT, and the watch goes on."""
    import contextlib

    from jobq import cli

    monkeypatch.setattr(cli, "READ_TIMEOUT", 0.3)
    first = threading.Event()
    lines: list[str] = []

    class Out:
        def write(self, text: str) -> int:
            lines.extend(line for line in text.splitlines() if line)
            if lines:
                first.set()
            return len(text)

        def flush(self) -> None:
            pass

        def isatty(self) -> bool:
            return False

    with RedisServer(find_server_binary()) as server:
        with Queue(queue_name, connection=server.url) as queue:
            queue.add("x")

        def stop_after_the_first_frame() -> None:
            if first.wait(WAIT):
                server.kill(signal.SIGSTOP)

        stopper = threading.Thread(target=stop_after_the_first_frame, name="test-stopper")
        stopper.start()
        try:
            with contextlib.redirect_stdout(Out()):  # type: ignore[type-var]
                code = main(["--url", server.url, "info", queue_name, "--watch", "--json",
                             "--interval", "1", "--count", "2"])
        finally:
            first.set()
            stopper.join(WAIT)
            server.kill(signal.SIGCONT)
    assert code == 0
    frames = [json.loads(line) for line in lines]
    assert len(frames) == 2 and frames[0]["errors"] == []
    assert frames[1]["queues"] == [] and "unreachable" in frames[1]["errors"][0]


def test_info_watch_redraws_in_place_on_a_terminal(queue: Queue, redis_url: str) -> None:
    queue.add("w")
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        _command(redis_url, ["info", queue.name, "--watch", "--interval", "0.2"]),
        env=_env(redis_url), cwd=ROOT, stdin=slave, stdout=slave, stderr=slave,
    )
    os.close(slave)
    output = b""
    try:
        deadline = time.monotonic() + WAIT
        while output.count(CLEAR) < 2 and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                output += os.read(master, 65536)
        queue.add("w")  # the next frames show 2 waiting
        while not re.search(rb"\n" + re.escape(queue.name.encode()) + rb" +2 ",
                            output.rsplit(CLEAR, 1)[-1]) and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                output += os.read(master, 65536)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT) == 0
    finally:
        _reap(proc)
        os.close(master)
    frames = output.split(CLEAR)[1:]
    assert len(frames) >= 3
    assert all(b"QUEUE" in frame and queue.name.encode() in frame for frame in frames)
    assert re.search(rb"\n" + re.escape(queue.name.encode()) + rb" +2 ", frames[-1])


# -- events, job, administration -------------------------------------------------


def test_events_replays_as_json_and_exits_0_on_sigterm(running: Any, queue: Queue) -> None:
    job = queue.add("first", {"n": 1})
    events = running("events", queue.name, "--from", "0", "--json")
    added = json.loads(events.expect(r'"name": "added"', "out"))
    assert added["job_id"] == job.id and added["job_name"] == "first"
    assert re.fullmatch(r"\d+-\d+", added["id"])
    later = queue.add("second")
    assert json.loads(events.expect(rf'"job_id": "{later.id}"', "out"))["name"] == "added"
    # a custom event's fields named as the event's own keys do not replace them
    queue.emit("custom", id="mine", name="x", job_id="j", extra=1)
    custom = json.loads(events.expect(r'"name": "custom"', "out"))
    assert re.fullmatch(r"\d+-\d+", custom["id"]) and custom["job_id"] is None
    assert custom["extra"] == 1
    assert custom["fields"] == {"id": "mine", "name": "x", "job_id": "j"}
    events.signal(signal.SIGTERM)
    assert events.wait() == 0


def test_job_shows_a_job_and_exits_1_when_missing(queue: Queue, redis_url: str) -> None:
    job = queue.add("report", {"month": "2026-11"}, attempts=3)
    done = jobq(redis_url, "job", queue.name, job.id)
    assert done.returncode == 0, done.stderr
    assert re.search(r"^state +waiting$", done.stdout, re.M)
    assert re.search(r'^data +\{"month": "2026-11"\}$', done.stdout, re.M)
    as_json = json.loads(jobq(redis_url, "job", queue.name, job.id, "--json").stdout)
    assert (as_json["name"], as_json["opts"]["attempts"]) == ("report", 3)
    missing = jobq(redis_url, "job", queue.name, "nope")
    assert missing.returncode == 1 and "no job 'nope'" in missing.stderr


def test_job_shows_what_a_terminal_would_obey_as_escapes(
    queue: Queue, redis_url: str, redis_client: Any
) -> None:
    """A job's name, data, log lines, reason and stack trace came out raw:
    one with ESC sequences retitled the terminal or cleared the screen, a
    newline forged an output line. A time out of any date's range (a
    record's `ts` of 1e300) raised OverflowError with a traceback."""
    evil = "x\x1b]0;title\x07\x1b[2J\nstate           completed\u202e"
    job = queue.add(evil, {"v": evil})
    job.log(evil)
    redis_client.hset(f"jobq:{{{queue.name}}}:job:{job.id}", "ts", "1e300")
    done = jobq(redis_url, "job", queue.name, job.id)
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout and "\u202e" not in done.stdout
    assert re.search(r"^name +x\\x1b\]0;title\\x07\\x1b\[2J\\nstate", done.stdout, re.M)
    assert len(re.findall(r"^state ", done.stdout, re.M)) == 1  # no forged line
    assert re.search(r"^timestamp +1e\+297 \(not a valid time\)$", done.stdout, re.M)


def _strict(text: str) -> Any:
    """JSON as a strict parser reads it: NaN and Infinity are not JSON."""
    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_json_output_is_strict_json_whatever_the_job_holds(queue: Queue, redis_url: str) -> None:
    """Job data may hold what JSON cannot: NaN and infinities were written
    as NaN / Infinity (which jq and JavaScript refuse)."""
    at = datetime.datetime(2020, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
    data = {"nan": float("nan"), "inf": float("-inf"), b"raw": b"\xff", "pair": (1, 2),
            "at": at}
    job = queue.add("odd", data)
    shown = jobq(redis_url, "job", queue.name, job.id, "--json")
    assert shown.returncode == 0, shown.stderr
    assert _strict(shown.stdout)["data"] == {
        "nan": "NaN", "inf": "-Infinity", "raw": "\ufffd", "pair": [1, 2],
        "at": "2020-01-02T03:04:05+00:00"}


def test_admin_commands(queue: Queue, redis_url: str) -> None:
    _fill(queue, redis_url)
    name = queue.name
    assert jobq(redis_url, "resume", name).stdout.strip() == f"resumed {name}"
    assert not queue.is_paused()
    assert jobq(redis_url, "pause", name).stdout.strip() == f"paused {name}"
    assert queue.is_paused()
    retried = jobq(redis_url, "retry", name)
    assert retried.returncode == 0 and retried.stdout.startswith("retried 1 failed job(s)")
    assert queue.get_job_counts("failed", "waiting") == {"failed": 0, "waiting": 4}
    cleaned = jobq(redis_url, "clean", name, "--state", "completed", "--grace", "0")
    assert cleaned.stdout.startswith("removed 2 completed job(s)")
    drained = jobq(redis_url, "drain", name)
    assert drained.stdout.startswith("removed 4 waiting job(s)")
    assert queue.get_job_counts("waiting", "delayed") == {"waiting": 0, "delayed": 1}
    queue.add("parent", depends_on=[queue.get_jobs("delayed")[0]])
    cleaned = jobq(redis_url, "clean", name, "--state", "waiting-children")
    assert cleaned.stdout.startswith("removed 1 waiting-children job(s)"), cleaned.stderr
    assert jobq(redis_url, "promote", name, "--count", "0").stdout.startswith("promoted 0 ")
    promoted = jobq(redis_url, "promote", name)
    assert promoted.stdout.strip() == f"promoted 1 delayed job(s) of {name}", promoted.stderr
    assert queue.get_job_counts("waiting", "delayed") == {"waiting": 1, "delayed": 0}
    refused = jobq(redis_url, "obliterate", name)
    assert refused.returncode == 2 and "--yes" in refused.stderr
    assert queue.count() == 1
    done = jobq(redis_url, "obliterate", name, "--yes")
    assert done.returncode == 0 and done.stdout.strip() == f"obliterated {name}"
    assert queue.count() == 0 and not queue.is_paused()
    again = jobq(redis_url, "obliterate", name, "--yes")  # its settings stay: it is known
    assert again.returncode == 0, again.stderr
    typo = jobq(redis_url, "obliterate", name + "-typo", "--yes")  # said "obliterated"
    assert typo.returncode == 1 and typo.stdout == ""
    assert f"no queue {name + '-typo'!r} under prefix 'jobq'" in typo.stderr
    # the others that write said "paused", and made the typo a queue (listed, in info)
    for command in (["pause"], ["resume"], ["drain"], ["clean", "--grace", "0"],
                    ["retry"], ["promote"]):
        typo = jobq(redis_url, command[0], name + "-typo", *command[1:])
        assert typo.returncode == 1 and typo.stdout == "", (command, typo.stderr)
        assert f"jobq {command[0]}: no queue {name + '-typo'!r}" in typo.stderr
    with Queue(name + "-typo", connection=redis_url) as typo_queue:
        assert not typo_queue.is_paused()
    assert f"{name}-typo" not in jobq(redis_url, "info").stdout


def test_obliterate_refuses_active_jobs_without_force(
    running: Any, queue: Queue, redis_client: redis.Redis, redis_url: str
) -> None:
    worker = running("worker", "tests.cli_tasks:gated", "-q", queue.name)
    queue.add("gated")
    _ledger(redis_client, queue.name)
    refused = jobq(redis_url, "obliterate", queue.name, "--yes")
    assert refused.returncode == 1 and "--force" in refused.stderr
    assert jobq(redis_url, "obliterate", queue.name, "--yes", "--force").returncode == 0
    _go(redis_client, queue.name)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


# -- wait ------------------------------------------------------------------------


def test_wait_exit_codes(queue: Queue, redis_url: str) -> None:
    with Worker(queue.name, lambda job: job.data * 2, connection=redis_url):
        ok = [queue.add("ok", n) for n in range(3)]
        done = jobq(redis_url, "wait", queue.name, *(j.id for j in ok), "--timeout", "20")
        assert done.returncode == 0, done.stderr
        assert sorted(done.stdout.splitlines()) == sorted(
            f"{j.id} completed {2 * n}" for n, j in enumerate(ok))
        bad = queue.add("bad", None)  # None * 2 raises TypeError
        done = jobq(redis_url, "wait", queue.name, ok[0].id, bad.id, "missing-id")
        assert done.returncode == 1
        lines = set(done.stdout.splitlines())
        assert f"{ok[0].id} completed 0" in lines and "missing-id not-found" in lines
        assert any(line.startswith(f"{bad.id} failed ") for line in lines)
    never = queue.add("never")
    done = jobq(redis_url, "wait", queue.name, never.id, "--timeout", "0.3")
    assert done.returncode == 4
    assert done.stdout.strip() == f"{never.id} waiting"
    assert "not finished after 0.3 s" in done.stderr
    # --timeout 0: which have finished, now (a finished one was said twice,
    # "completed" then "not finished", exit 4)
    done = jobq(redis_url, "wait", queue.name, ok[1].id, "--timeout", "0")
    assert (done.returncode, done.stdout.strip()) == (0, f"{ok[1].id} completed 2")
    for bad_timeout in ("-1", "nan", "inf"):
        done = jobq(redis_url, "wait", queue.name, ok[1].id, "--timeout", bad_timeout)
        assert done.returncode == 2 and "seconds >= 0" in done.stderr, bad_timeout


def test_wait_shows_a_progress_bar_on_a_terminal(queue: Queue, redis_url: str) -> None:
    jobs = [queue.add("ok", n) for n in range(4)]
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        _command(redis_url, ["wait", queue.name, *(j.id for j in jobs), "--timeout", "20"]),
        env=_env(redis_url), cwd=ROOT, stdout=subprocess.PIPE, stderr=slave, text=True,
    )
    os.close(slave)
    bar = b""
    try:
        deadline = time.monotonic() + WAIT
        while b"0/4 finished" not in bar and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                bar += os.read(master, 65536)
        with Worker(queue.name, lambda job: job.data, connection=redis_url):
            out, _ = proc.communicate(timeout=WAIT)
        while True:
            ready, _, _ = select.select([master], [], [], 0.2)
            if not ready:
                break
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            bar += chunk
    finally:
        _reap(proc)
        os.close(master)
    assert proc.returncode == 0
    assert len(out.splitlines()) == 4
    assert re.search(rb"\[\.+\] 0/4 finished", bar)
    assert re.search(rb"\[#+\] 4/4 finished", bar)


# -- server, metrics ---------------------------------------------------------------


def test_server_prints_its_url_and_stops_on_sigterm(running: Any, tmp_path: Path) -> None:
    try:
        find_server_binary()
    except RuntimeError:
        pytest.skip("no server binary")
    server = running("server", "--dir", str(tmp_path / "data"))
    url = server.expect(r"listening at redis://", "out").rsplit(" ", 1)[-1]
    with redis.Redis.from_url(url, socket_timeout=5) as client:
        assert client.ping() is True
        client.set("kept", "1")
        assert client.config_get("dir")["dir"] == str(tmp_path / "data")
    server.signal(signal.SIGTERM)
    assert server.wait() == 0
    assert (tmp_path / "data").is_dir() and any((tmp_path / "data").iterdir())


def test_metrics_command_serves_prometheus_text(running: Any, queue: Queue,
                                                redis_url: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    _fill(queue, redis_url)
    server = running("metrics", queue.name, "--port", "0")
    url = server.expect(r"serving Prometheus metrics at http://", "out").rsplit(" ", 1)[-1]
    with urllib.request.urlopen(url, timeout=WAIT) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = response.read().decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text) for s in family.samples
    }
    q = ("queue", queue.name)
    assert samples[("jobq_jobs", (q, ("state", "waiting")))] == 3
    assert samples[("jobq_jobs_completed_total", (q,))] == 2
    assert samples[("jobq_jobs_failed_total", (q,))] == 1
    assert samples[("jobq_queue_paused", (q,))] == 1
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(url.replace("/metrics", "/other"), timeout=WAIT)
    server.signal(signal.SIGTERM)
    assert server.wait() == 0


def test_metrics_command_leaves_out_a_queue_whose_settings_are_refused(
    running: Any, queue: Queue, queue_name: str, redis_url: str, redis_client: redis.Redis
) -> None:
    """A queue whose settings key the server refused (a key of another
    type, an ACL) made every scrape 503: the command opens each queue as
    stored, reading its shard count, and that read's error escaped. The
    queue is left out; the others are served."""
    queue.add("x")
    with Queue(f"{queue_name}-bad", connection=redis_url) as bad:
        bad.add("x")
    meta = f"jobq:{{{queue_name}-bad}}:meta"
    redis_client.delete(meta)
    redis_client.set(meta, "not a hash")
    try:
        for names in ([], [queue.name, f"{queue_name}-bad"]):  # known queues, or named ones
            server = running("metrics", *names, "--port", "0")
            url = server.expect(r"serving Prometheus metrics at http://", "out").rsplit(" ", 1)[-1]
            for _ in range(2):  # the first scrape opens the queues; the next re-reads them
                with urllib.request.urlopen(url, timeout=WAIT) as response:
                    assert response.status == 200
                    text = response.read().decode()
                assert f'queue="{queue.name}"' in text and f"{queue_name}-bad" not in text
            server.signal(signal.SIGTERM)
            assert server.wait() == 0
    finally:
        redis_client.delete(meta)
        with Queue(f"{queue_name}-bad", connection=redis_url) as bad:
            bad.obliterate(force=True)


def test_metrics_of_many_queues_share_a_few_connections(
    running: Any, queue_name: str, redis_url: str, redis_client: redis.Redis
) -> None:
    """Each queue a scrape read had a client of its own, two connections
    each, never given back: a thousand queues held two thousand, past a
    process's file limit (every scrape then failed, as did `jobq info`).
    The command's queues now share one client."""
    names = [f"{queue_name}-{i}" for i in range(40)]
    for name in names:
        with Queue(name, connection=redis_url) as q:
            q.add("x")
    before = len(redis_client.client_list())
    server = running("metrics", *names, "--port", "0")
    url = server.expect(r"serving Prometheus metrics at http://", "out").rsplit(" ", 1)[-1]
    for _ in range(2):
        with urllib.request.urlopen(url, timeout=WAIT) as response:
            assert response.status == 200
    assert len(redis_client.client_list()) - before <= 6  # 80 before: 2 per queue
    server.signal(signal.SIGTERM)
    assert server.wait() == 0
    for name in names:
        with Queue(name, connection=redis_url) as q:
            q.obliterate(force=True)


def test_commands_open_a_sharded_queue_as_stored(
    running: Any, queue_name: str, redis_url: str
) -> None:
    from jobq import ShardedQueue

    with ShardedQueue(queue_name, shards=3, connection=redis_url) as sharded:
        events = running("events", queue_name, "--from", "0", "--json")
        jobs = [sharded.add("report", i, job_id=f"r-{i}") for i in range(3)]
        for job in jobs:  # every shard's events, through one command
            events.expect(rf'"job_id": "{job.id}"', "out")
        shown = jobq(redis_url, "job", queue_name, "r-1")
        assert shown.returncode == 0 and re.search(r"^state +waiting$", shown.stdout, re.M)
        assert jobq(redis_url, "pause", queue_name).returncode == 0
        assert sharded.is_paused()
        assert jobq(redis_url, "resume", queue_name).returncode == 0
        with Worker(queue_name, lambda job: job.data, connection=redis_url):
            waited = jobq(redis_url, "wait", queue_name, *(j.id for j in jobs), "--timeout", "30")
            assert waited.returncode == 0, waited.stderr
        events.signal(signal.SIGTERM)
        assert events.wait() == 0
        sharded.obliterate()
