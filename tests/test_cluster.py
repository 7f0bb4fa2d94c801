"""jobq on a real three-master cluster: shards, slot migration, failover.

The cluster is started here from real server binaries on loopback
(``jobq.testing.LocalCluster``). The whole rest of the suite also runs on a
one-node cluster with ``JOBQ_TEST_CLUSTER=1`` (``make test`` does both).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from jobq import Job, Queue, QueueEvents, Worker
from jobq.connection import TRANSIENT_ERRORS
from jobq.testing import LocalCluster, RedisServer
from tests.conftest import echo
from tests.polling import until

pytestmark = pytest.mark.cluster

WAIT = 30.0
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(masters=3) as c:
        yield c


def names_on_distinct_shards(cluster: LocalCluster, tag: str, count: int) -> list[str]:
    """Queue names whose slots are served by ``count`` different masters."""
    found: dict[int, str] = {}
    with cluster.client() as client:
        for i in range(1000):
            name = f"{tag}-{i}"
            port = cluster.server_of_slot(client.keyslot(f"jobq:{{{name}}}:x")).port
            found.setdefault(port, name)
            if len(found) == count:
                return list(found.values())
    raise AssertionError("could not spread queue names over the shards")


def slot_of(client: redis.RedisCluster, queue: str) -> int:
    return int(client.keyslot(f"jobq:{{{queue}}}:x"))


def add_retrying(queue: Queue, job_id: str, data: int, deadline: float) -> None:
    """Add with a custom id, retrying transient errors: an add retried after an
    ambiguous failure makes one job."""
    while True:
        try:
            queue.add("double", data, job_id=job_id)
            return
        except TRANSIENT_ERRORS:
            if time.monotonic() > deadline:
                raise
            threading.Event().wait(0.05)


def completions(node: RedisServer, queue: str) -> Counter[str]:
    """How many ``completed`` events each job has in the queue's stream."""
    with node.client() as client:
        entries = client.xrange(f"jobq:{{{queue}}}:events")
    return Counter(
        fields[b"jid"].decode() for _, fields in entries if fields[b"ev"] == b"completed"
    )


def test_queues_on_different_shards(cluster: LocalCluster) -> None:
    names = names_on_distinct_shards(cluster, "spread", 3)
    with cluster.client() as client:
        queues = [Queue(n, connection=client) for n in names]
        workers = [
            Worker(n, lambda job: job.data * 2, connection=client, concurrency=4).start()
            for n in names
        ]
        try:
            jobs = [(q, q.add("double", i)) for q in queues for i in range(20)]
            assert [j.wait_until_finished(timeout=WAIT) for _, j in jobs] == [
                i * 2 for _ in queues for i in range(20)
            ]
            for q in queues:
                node = cluster.server_of_slot(slot_of(client, q.name))
                with node.client() as direct:
                    assert direct.zcard(f"jobq:{{{q.name}}}:completed") == 20
        finally:
            for w in workers:
                w.close()
            for q in queues:
                q.close()
    ports = {cluster.server_of_slot(slot_of(cluster.client(), n)).port for n in names}
    assert len(ports) == 3


def test_idle_workers_and_pub_sub_readers_on_a_cluster_use_no_cpu(cluster: LocalCluster) -> None:
    """Before redis-py 8, a cluster's subscription read with no node named
    returns at once whatever its timeout: an idle worker (its cancel
    listener; a sharded worker's wake-ups too) and an idle pub/sub reader
    each kept a core busy."""
    from jobq import ShardedQueue

    url = cluster.url
    name = f"idle-{os.getpid()}-{time.monotonic_ns()}"
    with Queue(name, connection=url, event_mode="pubsub") as queue, \
            ShardedQueue(name + "-s", shards=3, connection=url) as sharded, \
            Worker(name, echo, connection=url), \
            Worker(sharded.name, echo, connection=url, shards=3):
        assert queue.add("x", 1).wait_until_finished(timeout=WAIT) == 1
        assert sharded.add("x", 2).wait_until_finished(timeout=WAIT) == 2
        assert queue.events.wait_until_ready(WAIT)
        start = time.process_time()
        threading.Event().wait(2.0)  # idle: every loop blocked in its read
        busy = time.process_time() - start
        assert busy < 1.0, f"{busy:.2f} s of CPU in 2 s idle"
        queue.obliterate(force=True)
        sharded.obliterate(force=True)


def test_a_worker_given_a_cluster_client_has_room_for_its_handlers(
    cluster: LocalCluster,
) -> None:
    """A worker given a RedisCluster client (not a URL) cloned it with two
    connections per node: its pool threads, loops and handlers' calls
    (progress, logs) shared them, and some jobs failed with redis-py's
    MaxConnectionsError."""
    from jobq._runner import pool_size

    def handler(job: Job) -> int:
        job.update_progress(50)
        job.log("half way")
        return int(job.data)

    with cluster.client() as client, Queue("roomy", connection=client) as queue:
        worker = Worker(queue.name, handler, connection=client, concurrency=4)
        with worker:
            own = worker._context.client
            assert {n.redis_connection.connection_pool.max_connections
                    for n in own.get_nodes()} == {pool_size(4)}
            jobs = queue.add_bulk([{"name": "x", "data": i} for i in range(40)])
            assert [j.wait_until_finished(timeout=WAIT) for j in jobs] == list(range(40))
        queue.obliterate(force=True)


@pytest.mark.parametrize("while_", ["blocked", "idle"])
def test_a_loops_connection_lost_on_a_cluster_is_reported_not_made_again(
    cluster: LocalCluster, while_: str,
) -> None:
    """A cluster client sends a command cut by a lost connection again on a
    new connection, and its pools connect again, silently, a connection
    lost while idle (a worker's fetcher while the worker is paused, with
    the server's idle timeout). The fetcher never learnt of the loss: it
    reported nothing and kept the dead connection's id for close()'s CLIENT
    UNBLOCK (close then waited out the block). The loss is the loop's now:
    an error, and a new connection."""
    errors: list[BaseException] = []
    with cluster.client() as client, Queue(f"cut-{while_}", connection=client) as queue:
        node = cluster.server_of_slot(slot_of(client, queue.name))
        with node.client(decode_responses=True) as admin, \
                Worker(queue.name, lambda job: job.data, connection=client) as worker:
            worker.on("error", errors.append)

            def fetchers(cmd: str | None = None) -> list[dict[str, str]]:
                return [c for c in admin.client_list() if c["name"].startswith("jobq-fetch-")
                        and cmd in (None, c["cmd"])]

            entries = until(lambda: fetchers("bzpopmin"), WAIT)
            if while_ == "idle":  # the fetcher's connections back in its pool, its block over
                worker.pause()
                entries = until(lambda: [c for c in fetchers() if "b" not in c["flags"]], WAIT)
            for entry in entries:
                admin.client_kill_filter(_id=entry["id"])
            assert until(lambda: not fetchers(), WAIT)
            if while_ == "idle":
                assert not errors
                worker.resume()
            assert until(lambda: errors, WAIT)
            assert isinstance(errors[0], redis.ConnectionError)
            (again,) = until(lambda: fetchers("bzpopmin"), WAIT)
            assert again["id"] not in {entry["id"] for entry in entries}
            roles = worker._roles
            assert roles is not None and roles.fetcher._blocked_id is not None
            assert roles.fetcher._blocked_id[2] == int(again["id"])  # close() unblocks it
            assert queue.add("x", 7).wait_until_finished(timeout=WAIT) == 7
        queue.obliterate(force=True)


def test_one_worker_process_serves_several_queues(cluster: LocalCluster, tmp_path: Path) -> None:
    names = names_on_distinct_shards(cluster, "multi", 3)
    log = (tmp_path / "worker.log").open("wb")
    args = [sys.executable, "-m", "jobq", "--url", cluster.url, "worker", "tests.tasks:double"]
    for name in names:
        args += ["--queue", name]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        queues = [Queue(n, connection=cluster.url) for n in names]
        jobs = [q.add("double", i) for i, q in enumerate(queues)]
        assert [j.wait_until_finished(timeout=WAIT) for j in jobs] == [0, 2, 4]
        for q in queues:
            q.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(WAIT)
        log.close()


def test_slot_migration_in_the_middle_of_a_load(cluster: LocalCluster) -> None:
    total = 300
    with cluster.client() as client:
        name = names_on_distinct_shards(cluster, "migrate", 1)[0]
        slot = slot_of(client, name)
        source = cluster.server_of_slot(slot)
        target = next(m for m in cluster.masters() if m is not source)
        deadline = time.monotonic() + WAIT
        half = threading.Event()
        errors: list[BaseException] = []

        with Queue(name, connection=client) as queue, Worker(
            name, lambda job: job.data * 2, connection=client, concurrency=4
        ), Worker(name, lambda job: job.data * 2, connection=cluster.url, concurrency=4):

            def produce() -> None:
                try:
                    for i in range(total):
                        add_retrying(queue, f"m-{i}", i, deadline)
                        if i == total // 3:
                            half.set()
                except BaseException as exc:  # reported by the test
                    errors.append(exc)
                    half.set()

            producer = threading.Thread(target=produce, name="producer")
            producer.start()
            assert half.wait(WAIT)
            moved = cluster.migrate_slot(slot, target, batch=5)  # a long split window
            producer.join(WAIT)
            assert not producer.is_alive() and not errors, errors
            assert moved > 0
            assert cluster.server_of_slot(slot) is target
            for i in range(total):
                job = queue.get_job(f"m-{i}")
                assert job is not None
                assert job.wait_until_finished(timeout=WAIT) == i * 2
            assert queue.get_job_counts("completed")["completed"] == total
    done = completions(target, name)
    assert set(done) == {f"m-{i}" for i in range(total)}
    assert max(done.values()) == 1, "a job was finished twice"


def test_failover_of_the_queues_master(tmp_path: Path) -> None:
    with LocalCluster(masters=3, replicas=1, node_timeout=1000) as cluster:
        with cluster.client() as client:
            name = names_on_distinct_shards(cluster, "failover", 1)[0]
            slot = slot_of(client, name)
            master = cluster.server_of_slot(slot)
        with Queue(name, connection=cluster.url) as queue, Worker(
            name, lambda job: job.data * 2, connection=cluster.url, concurrency=4,
            lock_duration=5, stalled_interval=1,
        ), QueueEvents(name, connection=cluster.url) as events:
            assert events.wait_until_ready(WAIT)
            before = [queue.add("double", i) for i in range(20)]
            assert [j.wait_until_finished(events, timeout=WAIT) for j in before] == [
                i * 2 for i in range(20)
            ]
            master.kill(signal.SIGKILL)
            deadline = time.monotonic() + WAIT
            for i in range(20):  # adds during the failover retry until it is over
                add_retrying(queue, f"f-{i}", i, deadline)
            cluster.wait_ok(WAIT)
            promoted = cluster.server_of_slot(slot)
            assert promoted is not master
            for i in range(20):
                job = queue.get_job(f"f-{i}")
                assert job is not None
                assert job.wait_until_finished(events, timeout=WAIT) == i * 2
        done = completions(promoted, name)
        assert all(count == 1 for count in done.values()), done
        assert {f"f-{i}" for i in range(20)} <= set(done)


def test_jobq_info_with_a_master_down_shows_the_queues_it_can_read() -> None:
    """With one master away (no replica, full coverage not required), `jobq
    info` printed nothing and exited 3 ("unreachable"), though the queues
    of the other masters could be read."""
    with LocalCluster(masters=3) as cluster:
        for server in cluster.servers:
            with server.client() as client:
                client.config_set("cluster-require-full-coverage", "no")
        names = names_on_distinct_shards(cluster, "info-down", 3)
        for name in names:
            with Queue(name, connection=cluster.url) as queue:
                queue.add("x")
        with cluster.client() as client:
            gone = cluster.server_of_slot(slot_of(client, names[0]))
        gone.kill(signal.SIGKILL)
        url = cluster.url
        done = subprocess.run([sys.executable, "-m", "jobq", "--url", url, "info", *names],
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 1, done.stderr
        assert names[1] in done.stdout and names[2] in done.stdout
        assert f"queue {names[0]}: unreachable" in done.stderr and names[0] not in done.stdout


def test_jobq_given_a_plain_url_of_a_cluster_node_says_to_name_the_cluster(
    cluster: LocalCluster,
) -> None:
    names = names_on_distinct_shards(cluster, "plain-url", 2)
    node = cluster.servers[0].port
    with cluster.client() as client:
        other = next(n for n in names if cluster.server_of_slot(slot_of(client, n)).port != node)
    done = subprocess.run(
        [sys.executable, "-m", "jobq", "--url", f"redis://127.0.0.1:{node}", "info", other],
        capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert "give a redis+cluster:// URL" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.skipif(os.environ.get("JOBQ_TEST_CLUSTER") == "1", reason="cluster run")
def test_cluster_url_form(cluster: LocalCluster) -> None:
    with Queue("url-form", connection=cluster.url) as queue:
        assert isinstance(queue.client, redis.RedisCluster)
        assert queue.add("n").get_state() == "waiting"
        queue.obliterate()


@pytest.mark.skipif(os.environ.get("JOBQ_TEST_CLUSTER") == "1", reason="cluster run")
def test_a_cluster_url_naming_db_0_serves_a_worker(cluster: LocalCluster) -> None:
    """redis-py takes a cluster URL's /0 (the one db a cluster has), but a
    cluster client made with db=0 is refused: the worker's own clients
    (fetch, events, cancel) failed over and over, and no job ran."""
    url = cluster.url.rstrip("/") + "/0"
    with Queue("db-zero", connection=url) as queue, \
            Worker("db-zero", lambda job: "ran", connection=url).start():
        assert queue.add("n").wait_until_finished(timeout=WAIT) == "ran"
        queue.obliterate()
    with pytest.raises(redis.exceptions.RedisClusterException, match="can only be 0"):
        Queue("db-one", connection=cluster.url.rstrip("/") + "/1")


def test_a_plain_url_of_a_cluster_node_says_to_give_a_cluster_url(cluster: LocalCluster) -> None:
    """A redis:// URL naming one node of a cluster served the queues whose
    slot that node holds, and for every other raised redis-py's bare
    "MOVED 15495 127.0.0.1:30643" (a Queue's first add, a Worker's start),
    or retried it for ever (a QueueEvents)."""
    node = cluster.masters()[0]
    url = f"redis://127.0.0.1:{node.port}"
    elsewhere = next(name for name in names_on_distinct_shards(cluster, "plain", 3)
                     if not _served_by(cluster, name, node))
    said = r"is a node of a Redis Cluster \(it answered MOVED \d+ [\d.:]+\): connect with a " \
           r"redis\+cluster:// URL"
    with Queue(elsewhere, connection=url) as queue, \
            pytest.raises(redis.exceptions.ResponseError, match=said):
        queue.add("x")
    worker = Worker(elsewhere, lambda job: None, connection=url)
    with pytest.raises(redis.exceptions.ResponseError, match=said):
        worker.start()
    worker.close()
    with QueueEvents(elsewhere, connection=url) as events, \
            pytest.raises(redis.exceptions.ResponseError, match=said):
        events.wait_for("any", timeout=WAIT)


def _served_by(cluster: LocalCluster, name: str, node: RedisServer) -> bool:
    with cluster.client() as client:
        return cluster.server_of_slot(slot_of(client, name)).port == node.port


def test_a_flow_across_shards_is_refused_and_a_hash_tag_prefix_serves_it(
    cluster: LocalCluster,
) -> None:
    from jobq import CrossSlotFlowError, FlowProducer

    names = names_on_distinct_shards(cluster, "flow", 3)
    with FlowProducer(connection=cluster.url) as flow:
        with pytest.raises(CrossSlotFlowError, match="hash tag"):
            flow.add({"name": "p", "queue": names[0],
                      "children": [{"name": "c", "queue": names[1]}]})
        with Queue(names[2], connection=cluster.url) as q:
            child = q.add("c", 1)
            with pytest.raises(CrossSlotFlowError):
                flow.queue(names[0]).add("p", depends_on=[(names[2], child.id)])
            assert flow.queue(names[0]).get_job_counts("waiting-children") == {
                "waiting-children": 0}
    # one hash tag per flow: flows on different shards, each in one slot
    tags = names_on_distinct_shards(cluster, "tag", 2)
    for tag in tags:
        prefix = "{" + tag + "}"
        with FlowProducer(connection=cluster.url, prefix=prefix) as flow:
            workers = [
                Worker(n, lambda job: (job.data or 0) + sum(job.get_children_values().values()),
                       connection=cluster.url, prefix=prefix, concurrency=4).start()
                for n in names
            ]
            try:
                node = flow.add({"name": "p", "queue": names[0], "data": 100, "children": [
                    {"name": "c", "queue": names[1], "data": 1,
                     "children": [{"name": "g", "queue": names[2], "data": 10}]},
                    {"name": "c", "queue": names[2], "data": 2},
                ]})
                assert node.job.wait_until_finished(timeout=WAIT) == 113
            finally:
                for w in workers:
                    w.close()


def test_jobq_functions_load_loads_every_primary(
    cluster: LocalCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """The admin's step of docs/guide/security.md on a cluster: one command,
    every primary (each serves its own slots' calls)."""
    from jobq.cli import main as cli_main
    from jobq.scripts import library_name

    for server in cluster.masters():
        with server.client() as node:
            node.function_flush()
    assert cli_main(["--url", cluster.url, "functions", "load"]) == 0
    assert library_name() in capsys.readouterr().out
    for server in cluster.masters():
        with server.client() as node:
            names = [dict(zip(lib[::2], lib[1::2], strict=True))[b"library_name"]
                     for lib in node.function_list()]
            assert names == [library_name().encode()], server.port


def test_the_dashboard_answers_for_other_nodes_queues_while_one_node_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node that stopped answering (hung, cut off) held up every page: the
    request for a queue of that node opened the queue under the app's one
    lock of queues (and read under its one read lock), so requests for
    queues of the other nodes waited for it too, and its own waited for
    good (no socket timeout): it fails now (503) after READ_TIMEOUT.

    A cluster of its own, whose nodes wait long before marking one failing:
    a node stopped past the node timeout takes the shared cluster down for
    the tests after."""
    import werkzeug.test as werkzeug_test

    from jobq.dashboard import _app, create_app
    from jobq.keys import queues_key

    monkeypatch.setattr(_app, "READ_TIMEOUT", 0.5)
    with LocalCluster(masters=3, node_timeout=60_000) as cluster:
        with cluster.client() as client:
            listed_on = cluster.server_of_slot(client.keyslot(queues_key("jobq"))).port
            names = names_on_distinct_shards(cluster, "dash", 3)
            on = {cluster.server_of_slot(slot_of(client, n)).port: n for n in names}
        stuck = next(name for port, name in on.items() if port != listed_on)
        other = next(name for name in names if name != stuck)
        for name in names:
            with Queue(name, connection=cluster.url) as queue:
                queue.add("x")
        stopped = next(s for s in cluster.servers if on.get(s.port) == stuck)
        with create_app(cluster.url, cache_ttl=60) as dashboard:
            # the names read, the other queue opened
            assert werkzeug_test.Client(dashboard).get(f"/queue?q={other}").status_code == 200
            opening = threading.Event()
            opened = dashboard.queue

            def queue_of(name: str) -> Queue:
                if name == stuck:
                    opening.set()
                return opened(name)

            dashboard.queue = queue_of  # type: ignore[method-assign]
            answers: dict[str, int] = {}

            def get(name: str) -> None:  # another page than the one cached
                page = f"/jobs?q={name}&state=waiting"
                answers[name] = werkzeug_test.Client(dashboard).get(page).status_code

            hung = threading.Thread(target=get, args=(stuck,), name="test-dashboard-stuck")
            stopped.kill(signal.SIGSTOP)
            try:
                hung.start()
                assert opening.wait(WAIT)
                served = threading.Thread(target=get, args=(other,), name="test-dashboard-other")
                served.start()
                served.join(WAIT)
                assert answers.get(other) == 200 and hung.is_alive()
                hung.join(WAIT)  # its read times out, the node still stopped
                assert answers.get(stuck) == 503
            finally:
                stopped.kill(signal.SIGCONT)
                hung.join(WAIT)
            assert not hung.is_alive()


def test_the_dashboard_on_a_plain_url_of_a_node_says_to_use_a_cluster_url(
    cluster: LocalCluster,
) -> None:
    import werkzeug.test as werkzeug_test

    from jobq.dashboard import create_app

    with cluster.client() as client:
        name = names_on_distinct_shards(cluster, "plain", 2)[0]
        owner = cluster.server_of_slot(slot_of(client, name)).port
    node = next(s for s in cluster.servers if s.port != owner)
    with Queue(name, connection=cluster.url) as queue:
        queue.add("x")  # listed: its page reads it (MOVED), or the list does
    with create_app(f"redis://127.0.0.1:{node.port}/0") as dashboard:
        response = werkzeug_test.Client(dashboard).get(f"/queue?q={name}")
        assert response.status_code == 502
        assert "use a redis+cluster:// URL" in response.get_data(as_text=True)
