"""The layout of a sharded queue: its shards' names, which shard a job id
names, and the shard count stored with the queue.

A sharded queue ``name`` of N shards is N plain sub-queues, each with a hash
tag of its own: shard ``i`` is the queue ``"<name>~<i>"`` (or
``"<name>~<i>.<salt>"``), the salt being the least one that puts the tag's
cluster slot in the i-th N-th of the slot space. A cluster made by
``redis-cli --cluster create`` gives each master an equal run of slots, so N
shards spread evenly over the masters whenever N is a multiple of their
count; on one server they are just N sets of keys. The logical queue's own
base (``<prefix>:{<name>}:``) keeps the shard count (``meta`` field
``shards``), the worker registry and the rate limiter's window.
"""

from __future__ import annotations

import functools
import itertools
import re
import uuid
import zlib
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import redis
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from .errors import JobqError
from .keys import QueueKeys, validate_name

#: Most shards a queue may have.
MAX_SHARDS = 256
#: The meta field of the logical queue holding its shard count, and the one
#: marking each shard (mark_ready in _common.lua publishes a wake-up then).
COUNT_FIELD = "shards"
SHARD_FIELD = "shard"
#: The meta field of the logical queue set by its obliterate (and cleared by
#: the next count stored): its workers still running then do not store the
#: count again, as they do after the server lost it.
GONE_FIELD = "obliterated"

T = TypeVar("T")
R = TypeVar("R")

_GENERATED = re.compile(r"(\d{1,3})-[0-9a-f]{32}")


class ShardCountError(JobqError, ValueError):
    """A queue was opened with a shard count other than the one stored with it.

    The count is fixed for the life of the queue's name (until
    ``obliterate``). To change it, see "Changing the shard count" in
    docs/guide/scaling.md: a new queue name with the new count, producers moved to it, the
    old queue drained by its workers, then obliterated.
    """


def validate_count(shards: object) -> int:
    """Return a valid shard count, else raise ValueError."""
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
        raise ValueError(f"shards must be an int from 1 to {MAX_SHARDS}, not {shards!r}")
    return shards


@functools.lru_cache(maxsize=256)
def shard_names(name: str, count: int) -> tuple[str, ...]:
    """The sub-queue names of queue ``name`` sharded ``count`` ways: each
    shard's hash tag falls in its own ``1/count`` of the cluster's slots."""
    names = []
    for i in range(count):
        low = i * REDIS_CLUSTER_HASH_SLOTS // count
        high = (i + 1) * REDIS_CLUSTER_HASH_SLOTS // count
        for salt in itertools.count():
            tag = f"{name}~{i}" if salt == 0 else f"{name}~{i}.{salt}"
            if low <= key_slot(tag.encode()) < high:
                names.append(validate_name(tag, "queue name (with its shard suffix)"))
                break
    return tuple(names)


def shard_of(job_id: str, count: int) -> int:
    """The shard a job id names: a generated id (``"<shard>-<32 hex>"``) says
    it; any other id is hashed (CRC-32), so the same custom id always lands
    on the same shard, where ``get_job`` and an idempotent add find it."""
    found = _GENERATED.fullmatch(job_id)
    if found is not None and int(found.group(1)) < count:
        return int(found.group(1))
    return zlib.crc32(job_id.encode("utf-8", "surrogatepass")) % count


def generated_id(shard: int) -> str:
    """A new job id that names ``shard`` (unique: 122 random bits)."""
    return f"{shard}-{uuid.uuid4().hex}"


def shard_keys(prefix: str, name: str, count: int) -> tuple[QueueKeys, ...]:
    """The keys of each shard."""
    return tuple(QueueKeys(prefix, shard) for shard in shard_names(name, count))


def stored_count(client: Any, prefix: str, name: str) -> int | None:
    """The shard count stored with queue ``name``, or None for a plain queue."""
    raw = client.hget(QueueKeys(prefix, name).meta, COUNT_FIELD)
    return int(raw) if raw else None


def stored_marks(client: Any, prefix: str, name: str) -> tuple[int | None, bool]:
    """The shard count stored with queue ``name`` (None for a plain queue),
    and whether the name is a shard's of a sharded queue."""
    count, shard = client.hmget(QueueKeys(prefix, name).meta, [COUNT_FIELD, SHARD_FIELD])
    return (int(count) if count else None), bool(shard)


def check_prefix(prefix: str) -> None:
    """Refuse a prefix with a hash tag: every shard would share its slot."""
    if "{" in prefix:
        raise ValueError(
            f"a sharded queue cannot use the prefix {prefix!r}: its hash tag would put "
            "every shard in one cluster slot"
        )


def holds_jobs(name: str) -> ShardCountError:
    """The error for sharding a plain queue that holds jobs."""
    return ShardCountError(
        f"queue {name!r} is a plain queue that holds jobs: sharded, they would be "
        "left where none of its workers looks; drain or obliterate it first (or "
        "shard a queue of another name)"
    )


def shard_opened_plain(shard: str) -> JobqError:
    """The error for a plain Queue opened on a shard's name."""
    return JobqError(
        f"queue {shard!r} is a shard of a sharded queue: a job id names its shard, so "
        "jobs added or removed here would be where the sharded queue does not look for "
        "them; use the ShardedQueue"
    )


def shard_served_plain(shard: str) -> JobqError:
    """The error for a Worker started on a shard's name."""
    return JobqError(
        f"queue {shard!r} is a shard of a sharded queue: start the worker on the "
        "sharded queue's own name (it serves every shard)"
    )


def plain_queue_on_shard(shard: str, name: str) -> ShardCountError:
    """The error for a shard's name that a plain queue with jobs uses."""
    return ShardCountError(
        f"queue {shard!r}, the name of a shard of sharded queue {name!r}, is a plain "
        "queue that holds jobs: the sharded queue would take them over; drain or "
        "obliterate it first, or shard a queue of another name"
    )


def mismatch(name: str, stored: int, asked: int | None) -> ShardCountError:
    """The error for a queue opened with the wrong shard count."""
    if asked is None:
        return ShardCountError(
            f"queue {name!r} is sharded over {stored} shards: open it with "
            f"ShardedQueue({name!r}, shards={stored}) (or jobq.open_queue)"
        )
    return ShardCountError(
        f"queue {name!r} is stored with {stored} shard(s), not {asked}; the count of a "
        "live queue cannot change: use a new queue name with the new count, move the "
        "producers to it, let the old queue drain, then obliterate it"
    )


def on_every_shard(shards: Iterable[T], call: Callable[[T], R]) -> list[R]:
    """``call`` for each of ``shards``, in turn, none held up by another:
    a shard whose call fails (its slot moving, its node away) is passed
    over, and the first such failure is raised once every shard has had
    its call. The replies, in order, when none failed. A call that timed
    out is raised at once: a server that does not answer (all of them, on
    one server) is not waited for again for every shard."""
    replies: list[R] = []
    failure: Exception | None = None
    for shard in shards:
        try:
            replies.append(call(shard))
        except redis.exceptions.TimeoutError:
            raise
        except redis.exceptions.RedisError as exc:
            failure = failure or exc
    if failure is not None:
        raise failure
    return replies
