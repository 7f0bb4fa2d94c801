"""Flows: trees of jobs (FlowProducer), depends_on, waiting-children, the
failure policies, children values, the cleanup paths and waits, against a
real server. Queues of one flow share a hash-tagged prefix, so the same tests
run on the one-node cluster pass."""

from __future__ import annotations

import os
import re
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from jobq import (
    CrossSlotFlowError,
    FlowProducer,
    Job,
    JobFailedError,
    JobNotFoundError,
    JobqError,
    Queue,
    QueueEvents,
    Worker,
)
from jobq.keys import QueueKeys, queues_key
from tests.polling import until

WAIT = 20.0


def work(job: Job) -> Any:
    """Data-driven processor: {"v": n, "fail": reason, "fail_once": reason}.
    Returns n plus the sum of its children's values."""
    d = job.data if isinstance(job.data, dict) else {}
    if d.get("fail"):
        raise ValueError(d["fail"])
    if d.get("fail_once") and job.attempts_made == 0:
        raise ValueError(d["fail_once"])
    values = job.get_children_values()
    return d.get("v", 0) + sum(v for v in values.values() if isinstance(v, int))


@pytest.fixture
def prefix() -> str:
    """A prefix of this test alone with a hash tag: the flow's queues share a slot."""
    return f"t{{{uuid.uuid4().hex[:10]}}}"


@pytest.fixture
def flow(redis_url: str, prefix: str) -> Iterator[FlowProducer]:
    with FlowProducer(connection=redis_url, prefix=prefix) as producer:
        yield producer


class Workers:
    """Workers on several queues of one prefix, closed at the end."""

    def __init__(self, redis_url: str, prefix: str) -> None:
        self.url, self.prefix = redis_url, prefix
        self.workers: list[Worker] = []

    def start(self, *queues: str, processor: Any = work, concurrency: int = 1) -> None:
        for name in queues:
            worker = Worker(name, processor, connection=self.url, prefix=self.prefix,
                            concurrency=concurrency, lock_duration=5, stalled_interval=1)
            self.workers.append(worker.start())

    def close(self) -> None:
        for worker in self.workers:
            worker.close(timeout=10)


@pytest.fixture
def workers(redis_url: str, prefix: str) -> Iterator[Workers]:
    w = Workers(redis_url, prefix)
    try:
        yield w
    finally:
        w.close()


def state_is(job: Job, state: str) -> bool:
    return job.get_state() == state


def test_a_parent_runs_after_its_children_with_their_values(
    flow: FlowProducer, workers: Workers
) -> None:
    node = flow.add({
        "name": "report", "queue": "reports", "data": {"v": 1000},
        "children": [
            {"name": "page", "queue": "render", "data": {"v": 1}},
            {"name": "page", "queue": "render", "data": {"v": 2}},
            {"name": "page", "queue": "reports", "data": {"v": 3}},
        ],
    })
    parent = node.job
    assert parent.get_state() == "waiting-children"
    with pytest.raises(AttributeError):  # it was taken, and changed nothing
        flow.prefix = "other"  # type: ignore[misc]
    reports = flow.queue("reports")
    assert reports.get_job_counts("waiting-children") == {"waiting-children": 1}
    assert [j.id for j in reports.get_jobs("waiting-children")] == [parent.id]
    assert all(c.job.parent == ("reports", parent.id) for c in node.children)
    assert flow.queue("render").get_job(node.children[0].job.id).parent == ("reports", parent.id)
    deps = parent.get_dependencies()
    assert len(deps.pending) == 3 and not deps.processed
    workers.start("render", "reports")
    assert parent.wait_until_finished(timeout=WAIT) == 1006
    values = parent.get_children_values()
    assert sorted(values.values()) == [1, 2, 3]
    assert set(values) == {f"{c.job.queue_name}:{c.job.id}" for c in node.children}
    assert reports.get_job_counts("waiting-children") == {"waiting-children": 0}


def test_the_parent_moves_on_once_when_children_finish_together(
    flow: FlowProducer, workers: Workers, redis_url: str, prefix: str
) -> None:
    runs: list[str] = []
    lock = threading.Lock()

    def counting(job: Job) -> Any:
        if job.name == "parent":
            with lock:
                runs.append(job.id)
        return work(job)

    children = [{"name": "c", "queue": "kids", "data": {"v": 1}} for _ in range(200)]
    moved: list[Any] = []
    with QueueEvents("top", connection=redis_url, prefix=prefix, blocking_timeout=0.1) as events:
        assert events.wait_until_ready(10)
        events.on("waiting", lambda e: moved.append(e) if e.prev == "waiting-children" else None)
        node = flow.add({"name": "parent", "queue": "top", "children": children})
        workers.start("kids", processor=counting, concurrency=8)
        workers.start("kids", processor=counting, concurrency=8)
        workers.start("top", processor=counting)
        assert node.job.wait_until_finished(timeout=WAIT) == 200
        assert until(lambda: len(moved) >= 1, timeout=WAIT)
    assert runs == [node.job.id]
    assert len(moved) == 1 and moved[0].job_id == node.job.id


def test_nested_trees_and_a_parent_delay_counted_from_its_last_child(
    flow: FlowProducer, workers: Workers
) -> None:
    node = flow.add({
        "name": "l0", "queue": "a", "data": {"v": 100}, "delay": 0.3,
        "children": [{
            "name": "l1", "queue": "b", "data": {"v": 10},
            "children": [{
                "name": "l2", "queue": "c", "data": {"v": 1},
                "children": [{"name": "l3", "queue": "a", "data": {"v": 1}}],
            }],
        }],
    })
    l1 = node.children[0].job
    assert l1.get_state() == "waiting-children"
    workers.start("a", "b", "c")
    assert node.job.wait_until_finished(timeout=WAIT) == 112
    root = flow.queue("a").get_job(node.job.id)
    b = flow.queue("b").get_job(l1.id)
    assert root is not None and b is not None and root.processed_on and b.finished_on
    assert root.processed_on - b.finished_on >= 0.29  # its delay began then


def test_delayed_children_due_together_run_in_insertion_order(
    flow: FlowProducer, workers: Workers
) -> None:
    # issue 12 item 3 for flows: a tie in due time keeps the order of the
    # tree, not the order of the ids as strings ("1", "10", "11", ..., "2")
    count = 20
    node = flow.add({
        "name": "parent", "queue": "top",
        "children": [
            {"name": "c", "queue": "kids", "data": {"v": i}, "delay": 0.2} for i in range(count)
        ],
    })
    kids = flow.queue("kids")
    ids = [child.job.id for child in node.children]
    assert [j.id for j in kids.get_jobs("delayed", asc=True)] == ids
    ran: list[int] = []
    lock = threading.Lock()

    def record(job: Job) -> Any:
        with lock:
            ran.append(job.data["v"])
        return work(job)

    workers.start("kids", processor=record)
    workers.start("top")
    assert node.job.wait_until_finished(timeout=WAIT) == sum(range(count))
    assert ran == list(range(count))


def test_depends_on_existing_jobs(redis_url: str, prefix: str, workers: Workers) -> None:
    with Queue("deps", connection=redis_url, prefix=prefix) as q, \
            Queue("other", connection=redis_url, prefix=prefix) as other:
        done = q.add("x", {"v": 5})
        workers.start("deps")
        assert done.wait_until_finished(timeout=WAIT) == 5
        workers.close()
        pending = other.add("y", {"v": 7})
        before = q.get_job_counts()
        with pytest.raises(JobNotFoundError):
            q.add("merge", {"v": 0}, depends_on=[done, "no-such-job"])
        assert q.get_job_counts() == before  # nothing written
        merge = q.add("merge", {"v": 0}, depends_on=[done.id, ("other", pending.id)])
        assert merge.get_state() == "waiting-children"
        deps = merge.get_dependencies()
        assert deps.processed == {f"deps:{done.id}": 5}
        assert deps.pending == [f"other:{pending.id}"]
        with pytest.raises(JobqError, match="another parent"):
            q.add("again", depends_on=[("other", pending.id)])
        w2 = Workers(redis_url, prefix)
        try:
            w2.start("deps", "other")
            assert merge.wait_until_finished(timeout=WAIT) == 12
        finally:
            w2.close()
        # a dependency that completed already, alone: the job is ready at once
        assert q.add("late", {"v": 1}, depends_on=[done.id]).get_state() == "waiting"


def test_depends_on_a_failed_job_follows_its_policy(redis_url: str, prefix: str) -> None:
    with Queue("fd", connection=redis_url, prefix=prefix) as q:
        bad = q.add("x", {"fail": "boom"}, fail_parent_on_failure=True)
        meh = q.add("y", {"fail": "meh"})
        with Worker("fd", work, connection=redis_url, prefix=prefix):
            for job in (bad, meh):
                with pytest.raises(JobFailedError):
                    job.wait_until_finished(timeout=WAIT)
        failed_at_once = q.add("p1", depends_on=[bad.id])
        assert failed_at_once.get_state() == "failed"
        assert failed_at_once.refresh().failed_reason == (
            f"child fd:{bad.id} failed: ValueError: boom")
        waits = q.add("p2", depends_on=[meh.id])
        assert waits.get_state() == "waiting-children"
        assert waits.get_dependencies().failed == {f"fd:{meh.id}": "ValueError: meh"}


@pytest.mark.parametrize("given", ["add_bulk", "default_job_options"])
def test_a_policy_given_in_a_bulk_or_as_a_default_is_kept(
    redis_url: str, prefix: str, given: str
) -> None:
    defaults = {"fail_parent_on_failure": True} if given == "default_job_options" else None
    with Queue("fk", connection=redis_url, prefix=prefix, default_job_options=defaults) as q:
        if given == "add_bulk":
            bad = q.add_bulk([{"name": "x", "data": {"fail": "boom"},
                               "fail_parent_on_failure": True}])[0]
        else:
            bad = q.add("x", {"fail": "boom"})
        parent = q.add("p", depends_on=[bad.id])  # waits on bad, which has not run
        assert parent.get_state() == "waiting-children"
        with Worker("fk", work, connection=redis_url, prefix=prefix):
            with pytest.raises(JobFailedError):
                parent.wait_until_finished(timeout=WAIT)
        assert parent.refresh().failed_reason == f"child fk:{bad.id} failed: ValueError: boom"


@pytest.mark.parametrize("where", ["root", "child", "grandchild"])
def test_a_flow_on_a_sharded_queue_is_refused_saying_why(redis_url: str, where: str) -> None:
    """It said "open it with ShardedQueue(...)", which no flow can do. A
    child (not the root) in a sharded queue was accepted: written under
    keys its workers never serve, and its parent waited for ever."""
    from jobq import ShardCountError, ShardedQueue

    name = f"fsh-{uuid.uuid4().hex[:8]}"  # the default prefix: a sharded queue's has no tag
    plain = f"fpl-{uuid.uuid4().hex[:8]}"
    tree: dict[str, Any] = {"name": "c", "queue": name}
    if where != "root":
        tree = {"name": "p", "queue": plain, "children": [tree]}
    if where == "grandchild":
        tree = {"name": "g", "queue": plain, "children": [tree]}
    if where == "root":
        tree["children"] = [{"name": "c", "queue": name}]
    refused: tuple[type[Exception], ...] = (ShardCountError,)
    if os.environ.get("JOBQ_TEST_CLUSTER") == "1" and where != "root":
        refused += (CrossSlotFlowError,)  # (its queues' slots are looked at first)
    with ShardedQueue(name, shards=2, connection=redis_url) as sharded, \
            FlowProducer(connection=redis_url) as flow, \
            Queue(plain, connection=redis_url) as parents:
        sharded.add("x")
        try:
            with pytest.raises(refused) as raised:
                flow.add(tree)
            if raised.type is ShardCountError:
                assert re.search("a flow cannot use it .*plain queue", str(raised.value))
            assert sharded.count() == 1 and parents.count() == 0
        finally:
            sharded.obliterate()
            parents.obliterate()


def test_dedup_with_depends_on_is_refused(redis_url: str, prefix: str) -> None:
    with Queue("fdd", connection=redis_url, prefix=prefix) as q:
        dep = q.add("d")
        with pytest.raises(ValueError, match="dedup cannot be combined with depends_on"):
            q.add("p", depends_on=[dep.id], dedup={"id": "k"})
        assert q.get_job_counts("waiting-children")["waiting-children"] == 0
    with pytest.raises(ValueError, match="dedup cannot be a default job option"):
        Queue("fdd", connection=redis_url, prefix=prefix,
              default_job_options={"dedup": {"id": "k"}})


@pytest.mark.parametrize("policy", ["default", "fail_parent", "ignore", "remove"])
def test_failure_policies(policy: str, flow: FlowProducer, workers: Workers) -> None:
    options = {} if policy == "default" else {
        "fail_parent": {"fail_parent_on_failure": True},
        "ignore": {"ignore_dependency_on_failure": True},
        "remove": {"remove_dependency_on_failure": True},
    }[policy]
    node = flow.add({
        "name": "p", "queue": "pol", "data": {"v": 100},
        "children": [
            {"name": "ok", "queue": "pol-kids", "data": {"v": 1}},
            {"name": "bad", "queue": "pol-kids", "data": {"fail": "boom"}, **options},
        ],
    })
    parent, bad = node.job, node.children[1].job
    member = f"pol-kids:{bad.id}"
    workers.start("pol", "pol-kids")
    if policy == "default":
        assert until(lambda: bad.get_state() == "failed", timeout=WAIT)
        assert until(lambda: member in parent.get_dependencies().failed, timeout=WAIT)
        assert parent.get_state() == "waiting-children"
        deps = parent.get_dependencies()
        assert deps.failed == {member: "ValueError: boom"} and member in deps.pending
    elif policy == "fail_parent":
        with pytest.raises(JobFailedError) as info:
            parent.wait_until_finished(timeout=WAIT)
        assert info.value.failed_reason == f"child {member} failed: ValueError: boom"
    elif policy == "ignore":
        assert parent.wait_until_finished(timeout=WAIT) == 101
        assert parent.get_ignored_children_failures() == {member: "ValueError: boom"}
    else:
        assert parent.wait_until_finished(timeout=WAIT) == 101
        assert member not in parent.get_dependencies().pending
        assert list(parent.get_children_values()) == [f"pol-kids:{node.children[0].job.id}"]


@pytest.mark.parametrize("fail_parent", [False, True])
def test_retrying_a_failed_child_resumes_the_parents_wait(
    fail_parent: bool, flow: FlowProducer, workers: Workers
) -> None:
    node = flow.add({
        "name": "p", "queue": "rp", "data": {"v": 100},
        "children": [{"name": "c", "queue": "rp", "data": {"v": 1, "fail_once": "first"},
                      "fail_parent_on_failure": fail_parent}],
    })
    parent, child = node.job, node.children[0].job
    workers.start("rp")
    assert until(lambda: child.get_state() == "failed", timeout=WAIT)
    expected = "failed" if fail_parent else "waiting-children"
    assert until(lambda: parent.get_state() == expected, timeout=WAIT)
    child.retry()
    assert until(lambda: parent.get_state() == "completed", timeout=WAIT)
    assert parent.refresh().return_value == 101
    assert parent.get_dependencies().failed == {}


@pytest.mark.parametrize("how", ["job", "queue"])
def test_a_parent_retried_while_a_child_is_pending_waits_for_it(
    how: str, flow: FlowProducer, workers: Workers
) -> None:
    """A parent failed by one child, while another has not run yet: retried
    while the child that failed it is still failed, it fails again by it;
    once that child is gone, retried, it waits for the other (never runs
    without it)."""
    node = flow.add({
        "name": "p", "queue": "rtp", "data": {"v": 100},
        "children": [
            {"name": "c", "queue": "rtp-bad", "data": {"fail": "broke"},
             "fail_parent_on_failure": True},
            {"name": "c", "queue": "rtp-later", "data": {"v": 5}},
        ],
    })
    parent = node.job
    bad, later = (f"{c.job.queue_name}:{c.job.id}" for c in node.children)
    workers.start("rtp", "rtp-bad")
    with pytest.raises(JobFailedError, match="broke"):
        parent.wait_until_finished(timeout=WAIT)

    def retry() -> None:
        if how == "job":
            parent.retry()
        else:
            assert flow.queue("rtp").retry_jobs("failed") == 1

    retry()
    assert parent.get_state() == "failed"
    assert parent.refresh().failed_reason == f"child {bad} failed: ValueError: broke"
    deps = parent.get_dependencies()
    assert sorted(deps.pending) == sorted([bad, later])
    assert deps.failed == {bad: "ValueError: broke"}
    assert node.children[0].job.remove()
    retry()
    assert parent.get_state() == "waiting-children"
    assert parent.get_dependencies().pending == [later]
    workers.start("rtp-later")
    assert parent.wait_until_finished(timeout=WAIT) == 105


@pytest.mark.parametrize("order", ["parent first", "child first", "retry_jobs"])
def test_a_parent_and_the_child_that_failed_it_retried_in_any_order(
    order: str, flow: FlowProducer, workers: Workers
) -> None:
    """The parent runs once the retried child has completed, with its value,
    whichever is retried first (retry_jobs("failed") takes the parent, id 1,
    first)."""
    node = flow.add({
        "name": "p", "queue": "rany", "data": {"v": 100},
        "children": [{"name": "c", "queue": "rany", "data": {"v": 1, "fail_once": "first"},
                      "fail_parent_on_failure": True}],
    })
    parent, child = node.job, node.children[0].job
    workers.start("rany")
    with pytest.raises(JobFailedError, match="first"):
        parent.wait_until_finished(timeout=WAIT)
    if order == "parent first":
        parent.retry()
        assert parent.get_state() == "failed"  # its child still failed: failed again
        child.retry()
    elif order == "child first":
        child.retry()
        # reopened by its child (which the worker may have run already)
        assert parent.get_state() != "failed"
        with pytest.raises(JobqError):  # no longer failed
            parent.retry()
    else:
        assert flow.queue("rany").retry_jobs("failed") == 2
    assert parent.wait_until_finished(timeout=WAIT) == 101
    assert child.get_state() == "completed"


def test_a_parent_failed_by_a_child_under_an_earlier_release_reopens_on_its_retry(
    flow: FlowProducer, workers: Workers, redis_client: redis.Redis, prefix: str
) -> None:
    """Before failed children stayed pending, a child failing its parent
    left the parent's pending set: such data, after an upgrade, still
    reopens the parent when the child is retried."""
    node = flow.add({
        "name": "p", "queue": "rold", "data": {"v": 100},
        "children": [{"name": "c", "queue": "rold", "data": {"v": 1, "fail_once": "first"},
                      "fail_parent_on_failure": True}],
    })
    parent, child = node.job, node.children[0].job
    workers.start("rold")
    with pytest.raises(JobFailedError):
        parent.wait_until_finished(timeout=WAIT)
    base = f"{prefix}:{{rold}}:"  # as the earlier release left it
    redis_client.srem(f"{base}deps:{parent.id}", f"rold:{child.id}")
    redis_client.hdel(f"{base}dfailed:{parent.id}", f"rold:{child.id}")
    redis_client.hdel(f"{base}job:{parent.id}", "ffs")
    child.retry()
    assert parent.wait_until_finished(timeout=WAIT) == 101


def test_a_sibling_retried_while_the_parent_is_failed_is_waited_for(
    flow: FlowProducer, workers: Workers
) -> None:
    """Two children that fail the parent: the one that failed second, retried
    first (while the parent is failed by the other), still counts."""
    node = flow.add({
        "name": "p", "queue": "rsib", "data": {"v": 100},
        "children": [{"name": "c", "queue": "rsib", "data": {"v": v, "fail_once": "first"},
                      "fail_parent_on_failure": True} for v in (1, 2)],
    })
    parent = node.job
    workers.start("rsib")
    with pytest.raises(JobFailedError):
        parent.wait_until_finished(timeout=WAIT)
    kids = [c.job for c in node.children]
    assert until(lambda: all(k.get_state() == "failed" for k in kids), timeout=WAIT)
    culprit = parent.refresh().failed_reason.split()[1]  # "child <queue>:<id> failed: ..."
    first, other = kids if culprit == f"rsib:{kids[0].id}" else kids[::-1]
    other.retry()
    assert other.wait_until_finished(timeout=WAIT) in (1, 2)
    assert parent.get_state() == "failed"
    first.retry()
    assert parent.wait_until_finished(timeout=WAIT) == 103


def test_a_parent_reopened_by_one_child_stays_failed_by_another_still_failed(
    flow: FlowProducer, workers: Workers
) -> None:
    node = flow.add({
        "name": "p", "queue": "rtwo", "data": {"v": 100},
        "children": [{"name": "c", "queue": "rtwo", "data": {"v": v, "fail_once": "first"},
                      "fail_parent_on_failure": True} for v in (1, 2)],
    })
    parent = node.job
    workers.start("rtwo")
    kids = [c.job for c in node.children]
    assert until(lambda: all(k.get_state() == "failed" for k in kids), timeout=WAIT)
    assert parent.get_state() == "failed"
    culprit = parent.refresh().failed_reason.split()[1]
    first, other = kids if culprit == f"rtwo:{kids[0].id}" else kids[::-1]
    first.retry()  # the other still failed: the parent stays failed, by it now
    assert parent.get_state() == "failed"
    assert parent.refresh().failed_reason.startswith(f"child rtwo:{other.id} failed: ")
    assert first.wait_until_finished(timeout=WAIT) in (1, 2)
    other.retry()
    assert parent.wait_until_finished(timeout=WAIT) == 103


def test_retrying_a_failed_step_of_a_chain_reopens_the_steps_after_it(
    flow: FlowProducer, workers: Workers
) -> None:
    def step(job: Job) -> Any:
        if job.data == "b" and job.attempts_made == 0:
            raise ValueError("b broke")
        return job.get_child_value(default="") + job.data

    node = flow.chain([{"name": "s", "queue": "chr", "data": letter} for letter in "abcd"])
    workers.start("chr", processor=step)
    with pytest.raises(JobFailedError, match="b broke"):
        node.job.wait_until_finished(timeout=WAIT)
    b = flow.queue("chr").get_jobs("failed")
    culprit = [j for j in b if j.data == "b"]
    assert len(culprit) == 1
    culprit[0].retry()
    assert node.job.wait_until_finished(timeout=WAIT) == "abcd"


def test_a_completed_child_retried_no_longer_counts_its_old_result(
    flow: FlowProducer, workers: Workers
) -> None:
    node = flow.add({"name": "p", "queue": "rcc", "data": {"v": 100},
                     "children": [{"name": "c", "queue": "rcc-a", "data": {"v": 1}},
                                  {"name": "c", "queue": "rcc-b", "data": {"v": 2}}]})
    parent, a = node.job, node.children[0].job
    member = f"rcc-a:{a.id}"
    workers.start("rcc-a")
    assert a.wait_until_finished(timeout=WAIT) == 1
    a.update_data({"v": 1, "fail": "second run broke"})
    a.retry("completed")
    assert until(lambda: a.get_state() == "failed", timeout=WAIT)
    deps = parent.get_dependencies()
    assert member not in deps.processed and member in deps.pending and member in deps.failed
    assert a.remove()  # the failed child goes: the parent runs without its old result
    workers.start("rcc-b", "rcc")
    assert parent.wait_until_finished(timeout=WAIT) == 102
    assert member not in parent.get_children_values()


def test_a_detached_child_is_not_taken_in_by_a_new_parent_of_the_same_id(
    flow: FlowProducer, workers: Workers
) -> None:
    old = flow.add({"name": "p", "queue": "det", "job_id": "report", "data": {"v": 100},
                    "children": [{"name": "c", "queue": "det", "data": {"v": 1, "fail": "x"}}]})
    old_child = old.children[0].job
    workers.start("det")
    assert until(lambda: old_child.get_state() == "failed", timeout=WAIT)
    assert old.job.remove(remove_children=False)  # detaches the failed child
    new = flow.add({"name": "p", "queue": "det", "job_id": "report", "data": {"v": 100},
                    "children": [{"name": "c", "queue": "det", "data": {"v": 2},
                                  "job_id": "new-kid"}]})
    old_child.retry()
    assert new.job.wait_until_finished(timeout=WAIT) == 102
    assert new.job.get_children_values() == {"det:new-kid": 2}


def test_removing_a_child_moves_the_parent_on(flow: FlowProducer, workers: Workers) -> None:
    node = flow.add({
        "name": "p", "queue": "rm", "data": {"v": 100},
        "children": [{"name": "c", "queue": "rm-kids", "data": {"v": 1}},
                     {"name": "c", "queue": "rm-kids", "data": {"v": 2}}],
    })
    assert flow.queue("rm-kids").remove(node.children[0].job.id)
    assert node.job.get_state() == "waiting-children"
    assert node.children[1].job.remove()
    assert node.job.get_state() == "waiting"
    workers.start("rm")
    assert node.job.wait_until_finished(timeout=WAIT) == 100


@pytest.mark.parametrize("others", [10, 1500])
def test_a_parent_a_drain_releases_is_left_waiting(
    others: int, flow: FlowProducer, workers: Workers
) -> None:
    """However many batches the drain takes (1000 jobs each), the parent
    its removals released stays and runs."""
    queue = flow.queue("drp")
    queue.add_bulk([{"name": "other", "data": {"v": i}} for i in range(others)])
    node = flow.add({"name": "p", "queue": "drp", "data": {"v": 100},
                     "children": [{"name": "c", "queue": "drp"} for _ in range(3)]})
    assert queue.drain() == others + 3
    assert node.job.get_state() == "waiting"
    workers.start("drp")
    assert node.job.wait_until_finished(timeout=WAIT) == 100


def test_a_parent_a_drain_releases_into_delayed_stays_with_delayed_drained(
    flow: FlowProducer,
) -> None:
    queue = flow.queue("drd")
    other = queue.add("other", delay=60)
    node = flow.add({"name": "p", "queue": "drd", "delay": 30,
                     "children": [{"name": "c", "queue": "drd"}]})
    assert queue.drain(delayed=True) == 2  # the child and the other delayed job
    assert node.job.get_state() == "delayed" and queue.get_job(other.id) is None


def test_obliterate_leaves_no_parent_its_children_released(
    flow: FlowProducer, redis_client: redis.Redis, prefix: str
) -> None:
    queue = flow.queue("obp")
    node = flow.add({"name": "p", "queue": "obp", "children": [{"name": "c", "queue": "obp"}]})
    queue.obliterate()
    assert queue.get_job(node.job.id) is None
    left = sorted(k.decode() for k in redis_client.scan_iter(match=f"{prefix}:{{obp}}:*"))
    # what stays: the settings (their mark), the id counter, the obliterated event
    assert left == [f"{prefix}:{{obp}}:{key}" for key in ("events", "id", "meta")]


def test_removing_a_parent_removes_its_whole_tree(
    flow: FlowProducer, workers: Workers, redis_url: str, prefix: str
) -> None:
    """BullMQ's default: the parent goes with its children at every depth,
    whatever their state (completed, failed, ignored, pending) or queue, each
    with a `removed` event, children first; queue names and ids with ':'."""
    node = flow.add({
        "name": "p", "queue": "rmt:top", "job_id": "p:1", "children": [
            {"name": "done", "queue": "rmt:kids", "job_id": "k:done", "data": {"v": 1}},
            {"name": "bad", "queue": "rmt:kids", "job_id": "k:bad",
             "data": {"fail": "x"}, "ignore_dependency_on_failure": True},
            {"name": "stuck", "queue": "rmt:kids", "job_id": "k:stuck", "data": {"fail": "y"}},
            {"name": "mid", "queue": "rmt", "job_id": "kids:mid", "children": [
                {"name": "leaf", "queue": "rmt:kids", "job_id": "leaf", "delay": 60},
            ]},
        ],
    })
    kids = flow.queue("rmt:kids")
    with QueueEvents("rmt:kids", connection=redis_url, prefix=prefix) as events:
        assert events.wait_until_ready(timeout=WAIT)
        removed: list[str] = []
        events.on("removed", lambda e: removed.append(e.job_id))
        workers.start("rmt:kids")
        assert until(lambda: kids.get_job_counts("completed", "failed") == {
            "completed": 1, "failed": 2}, timeout=WAIT)
        workers.close()
        assert node.job.remove()
        assert until(lambda: len(removed) == 4, timeout=WAIT)
    assert sorted(removed) == ["k:bad", "k:done", "k:stuck", "leaf"]
    for queue in ("rmt:top", "rmt:kids", "rmt"):
        counts = flow.queue(queue).get_job_counts()
        assert sum(counts.values()) == 0, (queue, counts)
    client = flow.client
    assert not client.keys(f"{prefix}:*deps:*") and not client.keys(f"{prefix}:*processed:*")


def test_removing_a_child_with_its_own_children_tells_its_parent(
    flow: FlowProducer, workers: Workers
) -> None:
    node = flow.add({"name": "p", "queue": "rmc", "data": {"v": 7}, "children": [
        {"name": "mid", "queue": "rmc", "children": [{"name": "leaf", "queue": "rmc"}]},
    ]})
    mid, leaf = node.children[0].job, node.children[0].children[0].job
    assert mid.remove()
    assert flow.queue("rmc").get_job(leaf.id) is None
    assert node.job.get_state() == "waiting"
    workers.start("rmc")
    assert node.job.wait_until_finished(timeout=WAIT) == 7


def test_removing_a_tree_of_one_queue_with_colons_and_no_prefix_tag(redis_url: str) -> None:
    """Of the ways to split '<queue>:<id>' in a queue of its own slot, those
    in other slots are never read (a cluster refuses them)."""
    with FlowProducer(connection=redis_url, prefix=f"t{uuid.uuid4().hex[:8]}") as own:
        node = own.add({"name": "p", "queue": "a:b", "job_id": "c:d", "children": [
            {"name": "c", "queue": "a:b", "job_id": "c:d:e",
             "children": [{"name": "c", "queue": "a:b", "job_id": "f"}]},
        ]})
        assert node.job.remove()
        assert sum(own.queue("a:b").get_job_counts().values()) == 0


def test_a_locked_child_keeps_the_whole_tree(
    flow: FlowProducer, workers: Workers
) -> None:
    started, release = threading.Event(), threading.Event()

    def slow(job: Job) -> int:
        started.set()
        assert release.wait(WAIT)
        return 1

    node = flow.add({"name": "p", "queue": "rml", "children": [
        {"name": "mid", "queue": "rml", "children": [{"name": "leaf", "queue": "rml-kids"}]},
    ]})
    workers.start("rml-kids", processor=slow)
    assert started.wait(WAIT)
    leaf = node.children[0].children[0].job
    try:
        with pytest.raises(JobqError, match=f"child rml-kids:{leaf.id} is active"):
            node.job.remove()
        assert node.job.get_state() == "waiting-children"
        assert node.children[0].job.get_state() == "waiting-children"
    finally:
        release.set()
    assert leaf.wait_until_finished(timeout=WAIT) == 1
    assert node.job.remove()
    assert flow.queue("rml-kids").get_job(leaf.id) is None


def test_removing_a_parent_alone_detaches_its_children(
    flow: FlowProducer, workers: Workers
) -> None:
    node = flow.add({
        "name": "p", "queue": "rmp", "children": [{"name": "c", "queue": "rmp-kids"}],
    })
    with pytest.raises(ValueError, match="remove_children must be a bool"):
        node.job.remove(remove_children=0)  # type: ignore[arg-type]
    assert node.job.remove(remove_children=False)
    keys = flow.queue("rmp")._context.keys
    client = flow.client
    assert not client.exists(keys.parent_key("deps", node.job.id))
    workers.start("rmp-kids")
    assert node.children[0].job.wait_until_finished(timeout=WAIT) == 0
    assert flow.queue("rmp").get_job_counts()["waiting"] == 0


def test_a_parent_by_depends_on_is_removed_with_its_dependencies(
    flow: FlowProducer,
) -> None:
    queue = flow.queue("rmd")
    a, b = queue.add("a"), queue.add("b")
    merge = queue.add("merge", depends_on=[a, b.id])
    assert queue.remove(merge.id)
    assert queue.get_job_counts() == dict.fromkeys(queue.get_job_counts(), 0)


@pytest.mark.parametrize("how", ["clean", "drain", "obliterate", "remove_on_fail"])
def test_cleanup_paths_never_leave_a_parent_waiting(
    how: str, flow: FlowProducer, workers: Workers
) -> None:
    kids = flow.queue("cl-kids")
    child: dict[str, Any] = {"name": "c", "queue": "cl-kids", "data": {"fail": "x"}}
    if how == "remove_on_fail":
        child["remove_on_fail"] = True
    node = flow.add({"name": "p", "queue": "cl", "data": {"v": 9}, "children": [child]})
    if how in ("clean", "remove_on_fail"):
        workers.start("cl-kids")
        if how == "clean":
            assert until(lambda: kids.get_job_counts("failed")["failed"] == 1, timeout=WAIT)
            assert kids.clean(0, state="failed") == [node.children[0].job.id]
    elif how == "drain":
        assert kids.drain() == 1
    else:
        kids.obliterate(force=True)
    assert until(lambda: node.job.get_state() == "waiting", timeout=WAIT)
    workers.start("cl")
    assert node.job.wait_until_finished(timeout=WAIT) == 9


def test_clean_waiting_children_removes_parents(flow: FlowProducer) -> None:
    node = flow.add({"name": "p", "queue": "cwc", "children": [{"name": "c", "queue": "cwc"}]})
    q = flow.queue("cwc")
    assert q.clean(0, state="waiting-children") == [node.job.id]
    assert q.get_job_counts("waiting-children", "waiting") == {
        "waiting-children": 0, "waiting": 1}
    assert q.get_job(node.children[0].job.id) is not None


def test_a_node_with_an_existing_id_adopts_that_job(
    flow: FlowProducer, workers: Workers
) -> None:
    q = flow.queue("adopt")
    existing = q.add("c", {"v": 5}, job_id="shared-c")
    node = flow.add({"name": "p", "queue": "adopt", "job_id": "the-parent",
                     "children": [{"name": "c", "queue": "adopt", "job_id": "shared-c"}]})
    assert node.children[0].job.id == existing.id
    assert q.get_job("shared-c").parent == ("adopt", "the-parent")
    # the same flow again writes nothing new
    again = flow.add({"name": "p", "queue": "adopt", "job_id": "the-parent",
                      "children": [{"name": "c", "queue": "adopt", "job_id": "other"}]})
    assert again.job.id == "the-parent" and again.children == []
    assert q.get_job("other") is None
    workers.start("adopt")
    assert node.job.wait_until_finished(timeout=WAIT) == 5


@pytest.mark.parametrize("where", ["siblings", "parent and child", "other queue"])
def test_a_tree_naming_one_id_twice_is_refused(flow: FlowProducer, where: str) -> None:
    q = flow.queue("twice")
    child = {"name": "c", "queue": "twice", "job_id": "dup"}
    if where == "siblings":
        tree = {"name": "p", "queue": "twice", "children": [child, {**child, "data": 2}]}
    elif where == "parent and child":
        tree = {"name": "p", "queue": "twice", "job_id": "dup", "children": [child]}
    else:  # the same id in two queues is two jobs
        tree = {"name": "p", "queue": "twice", "children": [child, {**child, "queue": "else"}]}
        node = flow.add(tree)
        assert [c.job.id for c in node.children] == ["dup", "dup"]
        assert q.get_job_counts()["waiting"] == 1
        return
    at = "children[1]" if where == "siblings" else "children[0]"
    with pytest.raises(ValueError, match=rf"^the flow's root\.{re.escape(at)} \(name 'c'\): "
                       "job id 'dup' of queue 'twice' is named twice"):
        flow.add(tree)
    assert q.get_job("dup") is None  # nothing written
    assert sum(q.get_job_counts().values()) == 0


@pytest.mark.parametrize("long_id", ["x", None], ids=["custom", "generated"])
def test_two_children_a_parent_would_know_by_one_name_are_refused(
    flow: FlowProducer, redis_url: str, prefix: str, long_id: str | None
) -> None:
    """A parent keeps its children as "<queue>:<id>": job "b:x" of queue "a"
    and job "x" of queue "a:b" were one dependency, and the parent ran once
    either had completed. A generated id (all digits) could be the "1" of
    "b:1"."""
    short_id = "b:x" if long_id else "b:1"
    long_child: dict[str, Any] = {"name": "c", "queue": "a:b"}
    if long_id:
        long_child["job_id"] = long_id
    tree = {"name": "p", "queue": "parent", "children": [
        {"name": "c", "queue": "a", "job_id": short_id}, long_child]}
    with pytest.raises(ValueError, match="would both be known to their parent as 'a:b:"):
        flow.add(tree)
    assert [sum(flow.queue(q).get_job_counts().values()) for q in ("parent", "a", "a:b")] == [
        0, 0, 0]
    with Queue("a", connection=redis_url, prefix=prefix) as a, \
         Queue("a:b", connection=redis_url, prefix=prefix) as ab:
        long_ref = ab.add("c", job_id=long_id) if long_id else ab.add("c")
        refs = [a.add("c", job_id="b:" + long_ref.id), long_ref]
        with pytest.raises(ValueError, match="would both be known"):
            a.add("p", depends_on=refs)
        # told apart: another id, or no ':' to read across
        node = flow.add({"name": "p", "queue": "parent", "children": [
            {"name": "c", "queue": "a", "job_id": "b:y"}, long_child]})
        assert sorted(node.job.get_dependencies().pending) == sorted(
            ["a:b:y", f"a:b:{node.children[1].job.id}"])


def test_depends_on_a_bare_string_is_a_type_error(redis_url: str, prefix: str) -> None:
    with Queue("deps", connection=redis_url, prefix=prefix) as q:
        done = q.add("x")
        for wrong in (done.id, done):
            with pytest.raises(TypeError, match="a list of job ids"):
                q.add("y", depends_on=wrong)
        assert q.get_job_counts()["waiting"] == 1


def test_the_waiting_children_event(flow: FlowProducer, redis_url: str, prefix: str) -> None:
    seen = threading.Event()
    with QueueEvents("ev", connection=redis_url, prefix=prefix, blocking_timeout=0.1) as events:
        assert events.wait_until_ready(10)
        events.on("waiting-children", lambda e: seen.set())
        flow.add({"name": "p", "queue": "ev", "children": [{"name": "c", "queue": "ev"}]})
        assert seen.wait(WAIT)


def test_chain_passes_each_result_on(flow: FlowProducer, workers: Workers) -> None:
    def step(job: Job) -> Any:
        return job.get_child_value(default="") + job.data

    node = flow.chain([{"name": "s", "queue": "ch", "data": letter} for letter in "abc"])
    workers.start("ch", processor=step)
    assert node.job.wait_until_finished(timeout=WAIT) == "abc"


def test_chain_fails_the_steps_after_a_failed_one(flow: FlowProducer, workers: Workers) -> None:
    node = flow.chain([{"name": "s", "queue": "chf", "data": {"fail": "no"}},
                       {"name": "s", "queue": "chf", "data": {"v": 1}}])
    workers.start("chf")
    with pytest.raises(JobFailedError, match="no"):
        node.job.wait_until_finished(timeout=WAIT)


def test_a_chain_of_the_most_levels_is_added_whole_and_fails_step_by_step(
    flow: FlowProducer, workers: Workers
) -> None:
    """MAX_DEPTH steps: the Jobs come back (their nodes were built by a
    recursion that raised RecursionError past about 600 levels, after the
    whole flow was written), and a first step's failure fails the last."""
    from jobq.flow import MAX_DEPTH

    node = flow.chain([{"name": "s", "queue": "deep", "data": {"fail": "first"}}]
                      + [{"name": "s", "queue": "deep", "data": {"v": 1}}] * (MAX_DEPTH - 1))
    levels, first = 1, node
    while first.children:
        (first,) = first.children
        levels += 1
    assert levels == MAX_DEPTH
    workers.start("deep")
    with pytest.raises(JobFailedError, match="first"):
        node.job.wait_until_finished(timeout=WAIT)
    counts = flow.queue("deep").get_job_counts("failed", "waiting-children")
    assert counts == {"failed": MAX_DEPTH, "waiting-children": 0}


def test_a_flow_deeper_than_the_most_levels_is_refused_with_nothing_written(
    flow: FlowProducer,
) -> None:
    from jobq.flow import MAX_DEPTH

    with pytest.raises(ValueError, match=f"at most {MAX_DEPTH} levels"):
        flow.chain([{"name": "s", "queue": "deeper"}] * (MAX_DEPTH + 1))
    assert sum(flow.queue("deeper").get_job_counts().values()) == 0


def test_each_step_a_failure_goes_up_names_its_child_and_the_first_cause(
    flow: FlowProducer, workers: Workers
) -> None:
    """The reasons nested: a chain of n steps wrote reasons of n levels
    each (4,000 steps: 779 MB, one call of 3.2 s)."""
    node = flow.chain([{"name": "s", "queue": "why", "data": {"fail": "boom"}},
                       {"name": "s", "queue": "why"}, {"name": "s", "queue": "why"}])
    last, middle = node.job, node.children[0].job
    workers.start("why")
    with pytest.raises(JobFailedError) as info:
        last.wait_until_finished(timeout=WAIT)
    assert info.value.failed_reason == f"child why:{middle.id} failed: ValueError: boom"
    first = node.children[0].children[0].job
    assert middle.refresh().failed_reason == f"child why:{first.id} failed: ValueError: boom"
    assert last.get_dependencies().failed == {f"why:{middle.id}": "ValueError: boom"}


def test_a_failure_goes_up_a_depends_on_chain_deeper_than_the_lua_stack(
    flow: FlowProducer, workers: Workers
) -> None:
    """6,000 jobs, each depending on the one before (fail_parent_on_failure):
    the failure of the first fails all in one call. Told parent by parent in
    nested calls, it overflowed the Lua stack at about 5,400 levels and
    left the rest waiting for ever, half written."""
    queue = flow.queue("dchain")
    job = queue.add("s", {"fail": "first"}, fail_parent_on_failure=True)
    for _ in range(5999):
        job = queue.add("s", {"v": 1}, depends_on=[job], fail_parent_on_failure=True)
    workers.start("dchain")
    with pytest.raises(JobFailedError, match="first"):
        job.wait_until_finished(timeout=50)
    assert queue.get_job_counts("failed", "waiting-children") == {
        "failed": 6000, "waiting-children": 0}


def test_a_job_of_another_prefix_or_a_sharded_queue_is_refused_as_a_dependency(
    flow: FlowProducer, redis_url: str, prefix: str
) -> None:
    """Only (queue, id) went to the script: a Job of another prefix named the
    job of that id in this prefix, which took the new job as its parent."""
    from jobq import ShardedQueue

    mine = flow.queue("pfx")
    namesake = mine.add("n", 1)  # same queue name and id as the other prefix's job
    with Queue("pfx", connection=redis_url, prefix=f"{prefix}-other") as other:
        theirs = other.add("n", 2)
        assert theirs.id == namesake.id
        with pytest.raises(ValueError, match="same prefix"):
            mine.add("p", depends_on=[theirs])
    if os.environ.get("JOBQ_TEST_CLUSTER") != "1":  # (a tagged prefix; shards need none)
        with FlowProducer(connection=redis_url) as plain:
            with ShardedQueue("pfx-sh", shards=2, connection=redis_url) as sharded:
                with pytest.raises(ValueError, match="sharded queue"):
                    plain.queue("pfx").add("p", depends_on=[sharded.add("n", 3)])
                sharded.obliterate(force=True)
    assert mine.get_job(namesake.id).parent is None  # type: ignore[union-attr]
    assert mine.get_job_counts("waiting-children") == {"waiting-children": 0}


def test_chord_gathers_every_result(flow: FlowProducer, workers: Workers) -> None:
    def job_fn(job: Job) -> Any:
        if job.name == "sum":
            return sum(job.get_children_values().values())
        return job.data * 2

    node = flow.chord([{"name": "x2", "queue": "fan", "data": i} for i in range(10)],
                      {"name": "sum", "queue": "fan-in"})
    workers.start("fan", "fan-in", processor=job_fn)
    assert node.job.wait_until_finished(timeout=WAIT) == 90


def test_a_cancelled_child_fails_its_parent_by_policy(flow: FlowProducer) -> None:
    node = flow.add({"name": "p", "queue": "cx", "children": [
        {"name": "c", "queue": "cx", "fail_parent_on_failure": True}]})
    assert node.children[0].job.cancel("stop")
    assert node.job.get_state() == "failed"
    assert node.job.refresh().failed_reason == f"child cx:{node.children[0].job.id} failed: stop"


@pytest.mark.skipif(os.environ.get("JOBQ_TEST_CLUSTER") != "1", reason="cluster pass only")
def test_on_a_cluster_queues_in_two_slots_are_refused(redis_url: str) -> None:
    with FlowProducer(connection=redis_url) as producer, pytest.raises(
        CrossSlotFlowError, match="prefix='{flows}'"
    ):
        producer.add({"name": "p", "queue": "slot-a", "children": [
            {"name": "c", "queue": "slot-b"}]})


def test_a_flow_stores_its_queues_settings_again_after_the_server_lost_them(
    flow: FlowProducer, prefix: str, redis_url: str, redis_client: redis.Redis
) -> None:
    """A process that only added flows never stored its queues' settings
    again once the server lost them (FLUSHALL, a restart without
    persistence): its queues went unlisted, and a depends_on add ran on
    with the defaults. addFlow.lua reports the queues it found unmarked, as
    add.lua does, and each is stored again."""
    known = queues_key(prefix)
    metas = [QueueKeys(prefix, name).meta for name in ("fa", "fb")]
    tree = {"name": "p", "queue": "fa", "children": [{"name": "c", "queue": "fb"}]}
    flow.add(tree)
    assert [redis_client.hget(meta, "cfg") for meta in metas] == [b"1", b"1"]
    for meta in metas:  # as FLUSHALL leaves them (one key a call: a cluster's slots)
        redis_client.delete(meta)
    redis_client.delete(known)
    flow.add(tree)
    assert [redis_client.hget(meta, "cfg") for meta in metas] == [b"1", b"1"]
    assert redis_client.smembers(known) == {b"fa", b"fb"}
    with Queue("fc", connection=redis_url, prefix=prefix, event_mode="pubsub",
               max_events=500) as q:
        first = q.add("n")
        meta = QueueKeys(prefix, "fc").meta
        stored = redis_client.hgetall(meta)
        in_cluster = os.environ.get("JOBQ_TEST_CLUSTER") == "1"  # sp: see test_queue.py
        assert stored == {b"em": b"pubsub", b"maxev": b"500", b"cfg": b"1", b"db": b"0",
                          **({b"sp": b"1"} if in_cluster else {})}
        redis_client.delete(meta)
        q.add("p", depends_on=[first])
        assert redis_client.hgetall(meta) == stored
