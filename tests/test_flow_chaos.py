"""Randomized flows: random trees (depth, width, queues), random child
failures under random failure policies, worker processes killed with SIGKILL
during the run. Checked: every job ends in the state its policy says; a
parent runs only after its children ended, with exactly the values of its
completed children, and is finalised once; a parent failed by a child never
runs; nothing is left waiting for children.

The default run is a small bounded variant; the large one is ``slow`` and
``fault``. A failing run prints its seed: JOBQ_FLOW_SEED=<seed> replays it.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from jobq import FlowProducer, Queue
from tests.polling import until
from tests.worker_proc import plain_url

ROOT = Path(__file__).resolve().parents[1]
QUEUES = ("fa", "fb", "fc")
POLICIES = ("fail_parent_on_failure", "ignore_dependency_on_failure",
            "remove_dependency_on_failure")


@dataclass
class Node:
    """One planned job: where it runs, whether it fails, its policy."""

    queue: str
    v: int
    fail: bool
    policy: str  # one of POLICIES, or '' (only for jobs that cannot fail)
    work: float
    children: list[Node] = field(default_factory=list)
    member: str = ""  # '<queue>:<id>' once added

    def spec(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": "n", "queue": self.queue,
            "data": {"v": self.v, "fail": self.fail, "work": self.work},
            "children": [c.spec() for c in self.children],
        }
        if self.policy:
            out[self.policy] = True
        return out


def plan(rng: random.Random, depth: int, width: int, counter: list[int]) -> Node:
    counter[0] += 1
    fail = rng.random() < 0.2
    node = Node(rng.choice(QUEUES), counter[0], fail, "", rng.choice((0.0, 0.01, 0.2)))
    if depth > 0:
        for _ in range(rng.randint(0, width)):
            node.children.append(plan(rng, depth - 1, width, counter))
    # the default policy keeps the parent waiting on a failed child for ever
    # (as in BullMQ): only a job that cannot fail, itself or by a child, has it
    can_fail = fail or any(c.policy == "fail_parent_on_failure" for c in node.children)
    node.policy = rng.choice(POLICIES) if can_fail else rng.choice((*POLICIES, ""))
    return node


def expected(node: Node, out: dict[str, tuple[str, Any]]) -> tuple[str, Any]:
    """What must happen to ``node``: ('completed', value, children values),
    ('failed', None) after running, or ('failed-by-child', None): never run."""
    values: dict[str, int] = {}
    by_child = False
    for child in node.children:
        state, value = expected(child, out)[:2]
        if state == "completed":
            values[child.member] = value
        elif child.policy == "fail_parent_on_failure":
            by_child = True
    if by_child:
        result: tuple[str, Any] = ("failed-by-child", None)
    elif node.fail:
        result = ("failed", None)
    else:
        result = ("completed", node.v + sum(values.values()), values)
    out[node.member] = result
    return result


def assign(node: Node, job_node: Any) -> None:
    node.member = f"{job_node.job.queue_name}:{job_node.job.id}"
    for child, cj in zip(node.children, job_node.children, strict=True):
        assign(child, cj)


def walk(node: Node) -> list[Node]:
    return [node] + [n for c in node.children for n in walk(c)]


def spawn(url: str, prefix: str, ledger: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.flow_worker_proc", url, prefix, ledger, *QUEUES],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def run_flow_chaos(redis_url: str, trees: int, depth: int, width: int, kills: int) -> None:
    seed = int(os.environ.get("JOBQ_FLOW_SEED") or random.SystemRandom().randrange(2**32))
    rng = random.Random(seed)
    note = f"(seed {seed}: JOBQ_FLOW_SEED={seed} replays it)"
    prefix = f"c{{{uuid.uuid4().hex[:10]}}}"
    ledger_key = f"ledger:{{{prefix}}}"
    ledger = redis.Redis.from_url(plain_url(redis_url))
    procs: list[subprocess.Popen[bytes]] = []
    counter = [0]
    plans = [plan(rng, depth, width, counter) for _ in range(trees)]
    try:
        with FlowProducer(connection=redis_url, prefix=prefix) as flow:
            for p in plans:
                assign(p, flow.add(p.spec()))
            nodes = [n for p in plans for n in walk(p)]
            want: dict[str, tuple[str, Any]] = {}
            for p in plans:
                expected(p, want)
            procs = [spawn(redis_url, prefix, ledger_key) for _ in range(2)]
            runs = sum(1 for n in nodes if want[n.member][0] != "failed-by-child")
            for k in range(kills if runs else 0):  # kill a worker in the middle of the run
                target = max(1, (k + 1) * runs // (kills + 1))
                until(lambda t=target: ledger.llen(ledger_key) >= t, timeout=60)
                victim = procs.pop(rng.randrange(len(procs)))
                victim.send_signal(signal.SIGKILL)
                victim.wait(30)
                procs.append(spawn(redis_url, prefix, ledger_key))
            queues = {q: flow.queue(q) for q in QUEUES}

            def state(n: Node) -> str:
                q, jid = n.member.split(":", 1)
                return queues[q].get_job_state(jid)

            def all_ended() -> bool:
                return all(state(n) in ("completed", "failed") for n in nodes)

            try:
                until(all_ended, timeout=400)
            except AssertionError:
                stuck = [(n.member, state(n), want[n.member][0], n.policy, n.fail,
                          [(c.member, state(c)) for c in n.children])
                         for n in nodes if state(n) not in ("completed", "failed")]
                raise AssertionError(f"not ended: {stuck[:10]} {note}") from None
            check(nodes, want, queues, ledger, ledger_key, note)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(30)
        ledger.delete(ledger_key)
        ledger.close()


def check(nodes: list[Node], want: dict[str, tuple[str, Any]], queues: dict[str, Queue],
          client: redis.Redis, ledger_key: str, note: str) -> None:
    rows = [r.decode().split("|", 2) for r in client.lrange(ledger_key, 0, -1)]
    starts = Counter(m for kind, m, _ in rows if kind == "start")
    first_start = {}
    last_done: dict[str, int] = {}
    seen_values: dict[str, list[dict[str, int]]] = {}
    for i, (kind, m, rest) in enumerate(rows):
        if kind == "start":
            first_start.setdefault(m, i)
        else:
            last_done[m] = i
            seen_values.setdefault(m, []).append(json.loads(rest))
    for n in nodes:
        q, jid = n.member.split(":", 1)
        job = queues[q].get_job(jid)
        assert job is not None, (n.member, note)
        kind = want[n.member][0]
        if kind == "failed-by-child":
            assert job.get_state() == "failed" and starts[n.member] == 0, (n.member, note)
            assert (job.failed_reason or "").startswith("child "), (job.failed_reason, note)
            continue
        assert starts[n.member] >= 1, (n.member, "never ran", note)
        # it ran only once every child had ended (a child's done is logged first)
        for c in n.children:
            if c.member in last_done and want[c.member][0] == "completed":
                assert last_done[c.member] < first_start[n.member], (n.member, c.member, note)
        if kind == "failed":
            assert job.get_state() == "failed", (n.member, note)
        else:
            value, values = want[n.member][1], want[n.member][2]
            assert job.get_state() == "completed", (n.member, job.failed_reason, note)
            assert job.return_value == value, (n.member, job.return_value, value, note)
            assert job.get_children_values() == values, (n.member, note)
            assert all(v == values for v in seen_values[n.member]), (n.member, note)
    for q in queues.values():
        assert q.get_job_counts("waiting-children") == {"waiting-children": 0}, note
        events = q.client.xrange(q._context.keys.events)
        finals = Counter(f[b"jid"] for _, f in events if f[b"ev"] in (b"completed", b"failed"))
        assert max(finals.values(), default=1) == 1, (q.name, "finalised twice", note)


def test_random_flows_small(redis_url: str) -> None:
    run_flow_chaos(redis_url, trees=3, depth=2, width=3, kills=1)


@pytest.mark.slow
@pytest.mark.fault
@pytest.mark.timeout(600)
def test_random_flows_with_many_kills(redis_url: str) -> None:
    run_flow_chaos(redis_url, trees=10, depth=4, width=4, kills=5)
