"""Flows: jobs that wait for other jobs (BullMQ's FlowProducer), and the
``depends_on`` of ``Queue.add``.

A tree of jobs, in any queues of one prefix, is written by one script call
(addFlow.lua): parents first, so no child runs before its parent exists. A
parent waits in state ``waiting-children`` until its last child completes;
the child's completion moves it on in the same script call. See docs/guide/flows.md.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from redis.cluster import RedisCluster
from redis.crc import key_slot

from . import _tracing
from ._closing import ClosedOnExit
from ._queues import QueueSet
from ._shards import ShardCountError
from .calls import FlowNode, NewJob
from .errors import JobNotFoundError, JobqError, in_entry
from .job import Job
from .keys import QueueKeys, validate_name, validate_prefix
from .options import NO_DEDUP

if TYPE_CHECKING:

    from .queue import Queue

__all__ = ["CrossSlotFlowError", "FlowProducer", "JobNode"]

#: What addFlow.lua answers for a node naming no job, and for a job that
#: has another parent.
_UNKNOWN, _HAS_PARENT = -1, -6
#: addFlow.lua's "not written: under a node that existed".
_SKIPPED = 4
#: A tree node's keys that are not job options.
_NODE_KEYS = ("name", "queue", "data", "children")


class CrossSlotFlowError(JobqError, ValueError):
    """A flow's queues live in different cluster slots (see FlowProducer)."""


class JobNode(NamedTuple):
    """A job of a flow and the nodes of its children that the add wrote
    (none under a node whose ``job_id`` named an existing job: nothing is
    written there; ``job.get_dependencies()`` names its children)."""

    job: Job
    children: list[JobNode]


class _Pending(NamedTuple):
    """A node on its way to the script: its queue, the job's arguments, its
    plain options and data, its parent's index (1-based; 0 none)."""

    queue: Queue
    new: NewJob
    opts: dict[str, Any]
    data: Any
    parent: int


#: The most levels of one flow (``FlowProducer.add``, ``chain``): the tree
#: is one script call, and so is a failure or a retry going up it (21 ms for
#: a failing chain of 1,000 steps here).
MAX_DEPTH = 1000


def _reference(job_id: str) -> NewJob:
    """An addFlow node naming an existing job (its name '')."""
    return NewJob(job_id, "", b"", b"", 0, 0, False, 1, -1, 0, -1, 0, NO_DEDUP)


def _check_slots(client: Any, bases: Iterable[str]) -> None:
    """On a cluster, the queues of one flow must share a slot: a parent moves
    in the same script call as its last child's transition."""
    if not isinstance(client, RedisCluster):
        return
    slots = {key_slot(b.encode()): b for b in bases}
    if len(slots) > 1:
        names = sorted(b[b.rindex("{") + 1 : -2] for b in slots.values())
        raise CrossSlotFlowError(
            f"the queues of this flow ({', '.join(names)}) are in different cluster slots; "
            "a parent and its children must share one: give their queues one hash tag "
            "with a prefix such as prefix='{flows}' (for every Queue, Worker and "
            "FlowProducer of them), or put the flow in one queue"
        )


#: Where a node is in a flow's tree: None for the root, else (its parent's
#: path, its index among the parent's children); rendered on an error only
#: (a chain of thousands of steps is that deep).
_Path = tuple[Any, int] | None


def _node_path(path: _Path) -> str:
    """A node's path, as ``add``'s errors name it."""
    indices: list[int] = []
    while path is not None:
        path, index = path
        indices.append(index)
    if len(indices) > 8:
        return f"the flow's node {len(indices)} levels below its root"
    return "the flow's root" + "".join(f".children[{i}]" for i in reversed(indices))


def _check_names(children: Iterable[tuple[str, str]]) -> None:
    """A parent knows its children as ``"<queue>:<id>"`` (its dependencies,
    its children's values); refuse two that would read the same, as job
    "b:7" of queue "a" and job "7" of queue "a:b" do. ``children``: (queue,
    job id, '' for one to be generated: all digits, never with a ':')."""
    by_queue: dict[str, list[str]] = {}
    for queue, job_id in children:
        by_queue.setdefault(queue, []).append(job_id)
    for short, short_ids in by_queue.items():
        custom = [i for i in short_ids if ":" in i]  # no other id can read as a longer name's
        if not custom:
            continue
        for long, long_ids in by_queue.items():
            if not long.startswith(short + ":"):
                continue
            rest = long[len(short) + 1 :] + ":"
            known = {rest + i for i in long_ids if i}
            for job_id in custom:
                tail = job_id[len(rest) :] if job_id.startswith(rest) else ""
                if job_id in known or ("" in long_ids and tail.isdigit()):
                    raise ValueError(
                        f"job {job_id!r} of queue {short!r} and a job of queue {long!r} would "
                        f"both be known to their parent as {short + ':' + job_id!r} (its "
                        "dependencies and children's values are keyed by '<queue>:<id>'): "
                        "give one of them another job_id"
                    )


def _traced(
    root: Queue, client: Any, nodes: Sequence[_Pending], refs: Sequence[tuple[str, str]] = ()
) -> list[Job | None]:
    """``_write``, inside the producer span of a traced process (see
    _tracing.py): every job of the flow carries that span's context."""
    hook = _tracing.hook
    if hook is None:
        return _write(root, client, nodes, refs)
    written: list[Job | None] = []

    def write(trace: str) -> list[Job]:
        traced = [n._replace(new=n.new._replace(trace=trace)) for n in nodes] if trace else nodes
        written[:] = _write(root, client, traced, refs)
        return [job for job in written if job is not None]

    hook.send(root.name, [n.new.name for n in nodes], write)
    return written


def _write(
    root: Queue, client: Any, nodes: Sequence[_Pending], refs: Sequence[tuple[str, str]] = ()
) -> list[Job | None]:
    """Run addFlow.lua for ``nodes`` and then the existing jobs ``refs``
    ((queue, id) each, children of the first node); the Job of each node
    (None for one under a node that existed)."""
    prefix = root.prefix
    flow = [
        FlowNode(n.queue._context.keys.base, n.parent, n.new) for n in nodes
    ] + [FlowNode(QueueKeys(prefix, q).base, 1, _reference(i)) for q, i in refs]
    _check_slots(client, (node.base for node in flow))
    for queue in {id(n.queue): n.queue for n in nodes}.values():
        # each queue's first use, as the root's: a sharded queue's name is
        # refused (its workers serve its shards' keys, never these)
        queue._context.ensure_ready()
    sent = time.monotonic()
    modes = "".join("1" if n.queue._restores() else "0" for n in nodes)
    timestamp, added, code, index, unset = root._context.calls.add_flow(flow, modes)
    if code < 0:
        where, job_id = (
            (refs[index - len(nodes) - 1]) if index > len(nodes)
            else (nodes[index - 1].queue.name, nodes[index - 1].new.job_id)
        )
        if code == _UNKNOWN:
            raise JobNotFoundError(job_id, f"no job {where}:{job_id} to depend on")
        raise JobqError(
            f"job {where}:{job_id} has another parent already: a job has one parent"
        )
    for queue in {id(nodes[i].queue): nodes[i].queue for i in unset}.values():
        queue._settings_lost(sent)  # the server lost them: stored again, as an add does
    jobs: list[Job | None] = []
    recorded: set[str] = set()
    for node, (job_id, duplicated, run, _) in zip(nodes, added, strict=False):
        if duplicated == _SKIPPED:
            jobs.append(None)
            continue
        queue = node.queue
        if queue.name not in recorded:
            queue._record()
            recorded.add(queue.name)
        if duplicated:  # an existing id, removed since if its record is gone
            jobs.append(queue.get_job(job_id) or Job(queue._context, job_id, node.new.name))
            continue
        job = Job(queue._context, job_id, node.new.name, node.data, node.opts, timestamp)
        job._run, job._fresh = run, True
        if node.parent:
            parent = nodes[node.parent - 1]
            parent_job = jobs[node.parent - 1]
            if parent_job is not None:
                job.parent = (parent.queue.name, parent_job.id)
        jobs.append(job)
    return jobs


def add_with_dependencies(
    queue: Queue, name: str, data: Any, options: dict[str, Any], depends_on: Iterable[Any]
) -> Job:
    """``Queue.add(..., depends_on=...)``: one job that waits for existing
    jobs (a bare id: of the same queue; ``(queue, id)``; a Job)."""
    refs = dependency_refs(queue, depends_on)
    new, plain = queue._prepare(name, data, options)
    if new.dedup != NO_DEDUP:  # given, or one of the queue's default options
        raise ValueError("dedup cannot be combined with depends_on")
    job = _traced(queue, queue.client, [_Pending(queue, new, plain, data, 0)], refs)[0]
    assert job is not None
    return job


def dependency_refs(queue: Any, depends_on: Iterable[Any]) -> list[tuple[str, str]]:
    """The jobs of a ``depends_on`` for a job of ``queue``, checked: (queue,
    id) each.

    Raises:
        TypeError: not a list of job ids, (queue, id) pairs or Jobs.
        ValueError: a Job of another prefix or of a sharded queue, or two
            jobs their parent would know by one name.
    """
    if isinstance(depends_on, (str, bytes, Job)) or not isinstance(depends_on, Iterable):
        raise TypeError(
            f"depends_on takes a list of job ids, (queue, id) pairs or Jobs, not {depends_on!r}"
        )
    refs: list[tuple[str, str]] = []
    for dep in depends_on:
        if isinstance(dep, Job):
            context = dep._context
            if context.prefix != queue.prefix:  # its (queue, id) would name another job
                raise ValueError(f"job {dep.id!r} is of prefix {context.prefix!r}, not "
                                 f"{queue.prefix!r}: a dependency is a job of the same prefix")
            if context.name != context.queue_name:
                raise ValueError(f"job {dep.id!r} is of sharded queue {dep.queue_name!r}: "
                                 "a job of a sharded queue cannot be a dependency")
            refs.append((dep.queue_name, dep.id))
        elif isinstance(dep, str):
            refs.append((queue.name, dep))
        elif isinstance(dep, tuple) and len(dep) == 2 and all(isinstance(p, str) for p in dep):
            refs.append((validate_name(dep[0]), dep[1]))
        else:
            raise TypeError(
                f"depends_on takes job ids, (queue, id) pairs or Jobs, not {dep!r}"
            )
    _check_names(refs)
    return refs


class FlowProducer(ClosedOnExit):
    """Adds flows: trees of jobs in which a parent runs once its children
    have completed (BullMQ's FlowProducer).

    Args:
        connection: as for Queue.
        prefix: the key prefix of the flow's queues. On a cluster, the
            queues of one flow must share a slot: use a prefix with a hash
            tag (``"{flows}"``) for every Queue, Worker and FlowProducer of
            them; ``add`` raises ``CrossSlotFlowError`` otherwise.

    The Jobs returned wait (``wait_until_finished``) through readers this
    producer owns: ``close()`` (or the ``with`` block's end) closes them.
    """

    def __init__(self, connection: object = None, prefix: str = "jobq") -> None:
        self._set = QueueSet(connection, validate_prefix(prefix), "FlowProducer")

    @property
    def prefix(self) -> str:
        """The key prefix of the queues this producer adds to."""
        return self._set.prefix

    @property
    def client(self) -> Any:
        """The client this producer's queues share."""
        return self._set.client

    def queue(self, name: str) -> Queue:
        """The Queue this producer uses for queue ``name`` (made on first use)."""
        return self._set.get(name)

    def add(self, tree: Mapping[str, Any]) -> JobNode:
        """Add a tree of jobs atomically; return its root's JobNode.

        A node is ``{"name", "queue", "data", "children": [...], **options}``
        with the options of ``Queue.add`` plus a child's failure policy
        (``fail_parent_on_failure``, ``ignore_dependency_on_failure``,
        ``remove_dependency_on_failure``; none: the parent waits on a failed
        child until it is retried or removed). A node whose ``job_id`` names
        an existing job adopts it (it keeps its own children, if any).

        Raises:
            CrossSlotFlowError: on a cluster, the queues are in different slots.
            JobqError: an existing job named as a child has another parent.
            ValueError: two nodes name the same job id of one queue (a job
                can be neither its own parent nor two children), two
                children of one parent would both be ``"<queue>:<id>"``, or
                the tree is more than ``MAX_DEPTH`` (1000) levels deep.
            SerializationError, PayloadTooLarge, TypeError, ValueError: as
                ``Queue.add``; nothing is written.
        """
        nodes: list[_Pending] = []
        shape: list[list[int]] = []  # the indices of each node's children
        named: set[tuple[str, str]] = set()  # (queue, job_id) of the nodes that name one

        # depth first, parents before their children (the order addFlow.lua
        # takes), on a stack of our own: a chain of thousands of steps is
        # deeper than Python's recursion limit
        stack: list[tuple[Any, int, int, _Path]] = [(tree, 0, 1, None)]
        while stack:
            spec, parent, depth, where = stack.pop()
            if depth > MAX_DEPTH:
                raise ValueError(f"a flow may be at most {MAX_DEPTH} levels deep (a chain "
                                 f"of {MAX_DEPTH} steps): for more, add the steps with "
                                 "depends_on")
            try:
                self._check_node(spec, parent, depth, where, nodes, shape, named, stack)
            except (TypeError, ValueError) as exc:
                name = spec.get("name") if isinstance(spec, Mapping) else None
                node = _node_path(where)
                raise in_entry(node if name is None else f"{node} (name {name!r})",
                               exc) from exc

        for kids in shape:
            _check_names((nodes[k - 1].queue.name, nodes[k - 1].new.job_id) for k in kids)
        try:
            jobs = _traced(nodes[0].queue, self.client, nodes)
        except ShardCountError as exc:  # its advice (open a ShardedQueue) is no flow's
            if "is sharded over" not in str(exc):
                raise
            raise ShardCountError(f"{exc.args[0].split(':')[0]}: a flow cannot use it (its "
                                  "jobs live in several slots, a flow's in one); give the "
                                  "flow a plain queue") from exc
        built: dict[int, JobNode] = {}
        for index in range(len(nodes), 0, -1):  # children come after their parent
            job = jobs[index - 1]
            if job is not None:
                built[index] = JobNode(job, [built[k] for k in shape[index - 1] if k in built])
        return built[1]

    def _check_node(
        self, spec: Any, parent: int, depth: int, where: _Path, nodes: list[_Pending],
        shape: list[list[int]], named: set[tuple[str, str]],
        stack: list[tuple[Any, int, int, _Path]],
    ) -> None:
        """Check and prepare one node of ``add`` (``where`` names it in an
        error), and put its children on the stack."""
        if not isinstance(spec, Mapping):
            raise TypeError(f"a flow node must be a dict, not {type(spec).__name__}")
        for key in ("name", "queue"):
            if key not in spec:
                raise ValueError(f"each flow node needs a {key!r}")
        options = {k: v for k, v in spec.items() if k not in _NODE_KEYS}
        queue = self.queue(validate_name(spec["queue"]))
        new, plain = queue._prepare(spec["name"], spec.get("data"), options)
        if new.dedup != NO_DEDUP:
            raise ValueError("dedup cannot be used in a flow")
        if new.job_id:  # one job per id: a tree naming one twice is refused
            if (queue.name, new.job_id) in named:
                raise ValueError(
                    f"job id {new.job_id!r} of queue {queue.name!r} is named twice in "
                    "the flow: each node is a job of its own"
                )
            named.add((queue.name, new.job_id))
        nodes.append(_Pending(queue, new, plain, spec.get("data"), parent))
        shape.append([])
        index = len(nodes)
        if parent:
            shape[parent - 1].append(index)
        children = spec.get("children") or []
        if not isinstance(children, Sequence) or isinstance(children, (str, bytes)):
            raise TypeError("a node's children must be a list of nodes")
        stack.extend((child, index, depth + 1, (where, i))
                     for i, child in reversed(list(enumerate(children))))

    def chain(self, steps: Sequence[Mapping[str, Any]]) -> JobNode:
        """Add ``a -> b -> c``: each step runs after the one before it has
        completed, and reads its result with ``job.get_child_value()``.

        ``steps`` are flow nodes without children. Returns the last step's
        JobNode (waiting on it waits for the whole chain); a step that fails
        for good fails the steps after it (``fail_parent_on_failure``).
        """
        if not steps:
            raise ValueError("a chain needs at least one step")
        tree: dict[str, Any] | None = None
        for step in steps:
            if "children" in step:
                raise ValueError("a chain's steps take no children")
            node = dict(step)
            if tree is not None:
                node["children"] = [{"fail_parent_on_failure": True, **tree}]
            tree = node
        assert tree is not None
        return self.add(tree)

    def chord(
        self, header: Sequence[Mapping[str, Any]], callback: Mapping[str, Any]
    ) -> JobNode:
        """Add a fan-out and its fan-in: the jobs of ``header`` run, then
        ``callback`` runs once with all their results
        (``job.get_children_values()``).

        Children of ``header`` keep their own failure policies (default: the
        callback waits on a failed one until it is retried or removed).
        """
        return self.add({**callback, "children": list(header)})

    def close(self) -> None:
        """Close the queues this producer made (their event readers) and
        the client it created."""
        self._set.close()


    def __repr__(self) -> str:
        return f"<FlowProducer prefix={self.prefix!r} {'closed' if self._set.closed else 'open'}>"
