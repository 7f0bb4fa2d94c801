"""Key names of a queue, all under one cluster hash tag."""

from __future__ import annotations

import re

_NAME_RE = re.compile(r"[^{}*?\[\]\s\x00-\x1f\x7f]{1,100}")
_JOB_ID_RE = re.compile(r"[^\s\x00-\x1f\x7f]{1,200}")


def validate_name(value: object, what: str = "queue name") -> str:
    """Return ``value`` if it is a valid queue name or prefix, else raise ValueError."""
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
        raise ValueError(
            f"invalid {what} {value!r}: 1 to 100 characters, without braces, "
            "'*', '?', '[', ']', whitespace or control characters"
        )
    return value


def validate_job_id(value: object) -> str:
    """Return a custom job id if it is valid, else raise ValueError."""
    if not isinstance(value, str) or not _JOB_ID_RE.fullmatch(value):
        raise ValueError(
            f"invalid job_id {value!r}: a non-empty string of at most 200 characters "
            "without whitespace or control characters"
        )
    if value.isdigit():
        raise ValueError(
            f"invalid job_id {value!r}: an all-digit id could collide with generated ids; "
            "give it a non-digit part (e.g. 'order-123')"
        )
    return value


class QueueKeys:
    """Every key of one queue; ``base`` carries the hash tag ``{queue}``.

    Scripts take ``base`` as KEYS[1] and derive the other keys from it, which
    keeps every key of a queue in one cluster slot.
    """

    __slots__ = (
        "prefix", "queue", "base", "wait", "prioritized", "delayed", "active",
        "completed", "failed", "meta", "events", "marker", "workers", "schedulers",
    )

    def __init__(self, prefix: str, queue: str) -> None:
        self.prefix = prefix
        self.queue = queue
        self.base = f"{prefix}:{{{queue}}}:"
        self.wait = self.base + "wait"
        self.prioritized = self.base + "prioritized"
        self.delayed = self.base + "delayed"
        self.active = self.base + "active"
        self.completed = self.base + "completed"
        self.failed = self.base + "failed"
        self.meta = self.base + "meta"
        self.events = self.base + "events"
        self.marker = self.base + "marker"
        self.workers = self.base + "workers"
        self.schedulers = self.base + "schedulers"

    def job(self, job_id: str) -> str:
        """The hash that holds one job's record."""
        return f"{self.base}job:{job_id}"

    def logs(self, job_id: str) -> str:
        """The list of a job's log lines."""
        return f"{self.base}logs:{job_id}"

    def lock(self, job_id: str) -> str:
        """The string holding the lock token of an active job."""
        return f"{self.base}lock:{job_id}"

    def scheduler(self, scheduler_id: str) -> str:
        """The hash of one job scheduler (its schedule, template and state)."""
        return f"{self.base}scheduler:{scheduler_id}"

    def dedup(self, key: str) -> str:
        """The string holding the id of the job that owns a dedup key."""
        return f"{self.base}dedup:{key}"

    def worker(self, name: str) -> str:
        """The hash a live worker announces itself in (it expires with its heartbeat)."""
        return f"{self.base}worker:{name}"


def queues_key(prefix: str) -> str:
    """The set of queue names known under ``prefix``, for listing queues.

    Deliberately outside every queue's hash tag: it lists queues, it belongs
    to none (written with single-key commands only, so clusters serve it).
    """
    return f"{prefix}:queues"
