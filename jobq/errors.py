"""Exception hierarchy of jobq, and the mapping of script return codes."""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum
from typing import Any

import redis

__all__ = [
    "ClosedError",
    "JobCancelledError",
    "JobFailedError",
    "JobNotFoundError",
    "JobTimeoutError",
    "JobqError",
    "LockLostError",
    "PayloadTooLarge",
    "RedisOOMError",
    "SerializationError",
    "UnrecoverableError",
    "WaitUntilFinishedTimeoutError",
]


class JobqError(Exception):
    """Base class of every error jobq raises."""


class SerializationError(JobqError, ValueError):
    """A value cannot be encoded or decoded with msgpack."""


class PayloadTooLarge(JobqError, ValueError):
    """Job data (or a return value) encodes to more bytes than the limit allows.

    Raised by ``Queue.add`` before anything is written (the limit is the
    queue's ``max_payload_bytes``); a worker whose processor returns a value
    over its ``max_result_bytes`` fails the attempt with it.
    """


class RedisOOMError(JobqError, redis.exceptions.OutOfMemoryError):
    """The server refused a write because it is out of memory.

    Its ``used_memory`` is above ``maxmemory`` and ``maxmemory-policy`` is
    ``noeviction`` (the only policy under which jobq keeps every job). Lock
    renewal and completion of running jobs still work (workers take no new
    job meanwhile), as do a running job's progress and log lines; free
    memory or raise ``maxmemory``. Also a ``redis.exceptions.OutOfMemoryError``.

    Attributes:
        added: of an ``add_bulk`` refused part of the way (its jobs are
            written a chunk of 1000 at a time), the jobs that were added,
            in order; empty when nothing was.
    """

    added: Sequence[Any] = ()


class JobFailedError(JobqError):
    """A waited-on job failed for good (retries exhausted, or unrecoverable).

    Attributes:
        job_id: the job's id.
        failed_reason: ``"<type>: <message>"`` of the exception that failed
            the last attempt (the type alone when it had no message).
        exc_type: the type name of that exception (``"KeyError"``,
            ``"JobTimeoutError"``, ``"UnrecoverableError"``...), or None when
            the job failed without one (e.g. it stalled too often).
        stacktrace: the formatted tracebacks of the attempts, newest last.
    """

    #: how the job ended, in the message
    _ended = "failed"

    def __init__(
        self,
        job_id: str,
        failed_reason: str | None,
        stacktrace: list[str] | None = None,
        exc_type: str | None = None,
    ) -> None:
        super().__init__(f"job {job_id!r} {self._ended}: {failed_reason}")
        self.job_id = job_id
        self.failed_reason = failed_reason
        self.stacktrace = list(stacktrace or [])
        self.exc_type = exc_type or exc_type_of(failed_reason)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.job_id, self.failed_reason, self.stacktrace, self.exc_type))


def exc_type_of(failed_reason: str | None) -> str | None:
    """The exception type name a failed reason starts with (``"KeyError"``
    of ``"KeyError: 'missing'"``), or None when it names none."""
    if not failed_reason:
        return None
    head = failed_reason.split(":", 1)[0]
    return head if head.isidentifier() and head[:1].isupper() and " " not in head else None


class JobCancelledError(JobFailedError):
    """A waited-on job was cancelled (``Queue.cancel`` / ``Job.cancel``): it
    failed for good; ``failed_reason`` is the cancel's reason."""

    _ended = "was cancelled"


class JobNotFoundError(JobqError, LookupError):
    """A job does not exist, or was removed while it was waited on."""

    def __init__(self, job_id: str, message: str | None = None) -> None:
        super().__init__(message or f"job {job_id!r} not found")
        self.job_id = job_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.job_id, str(self)))


class WaitUntilFinishedTimeoutError(JobqError, TimeoutError):
    """``wait_until_finished`` ran out of time before the job finished."""

    def __init__(self, job_id: str, timeout: float, unread: str | None = None) -> None:
        super().__init__(f"job {job_id!r} did not finish within {timeout:g} s" + (
            f", as far as could be told: its record could not be read ({unread})"
            if unread else ""))
        self.job_id = job_id
        self.timeout = timeout
        self.unread = unread

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.job_id, self.timeout, self.unread))


class JobTimeoutError(JobqError, TimeoutError):
    """An attempt ran longer than the job's ``timeout``."""


class UnrecoverableError(JobqError):
    """Raised by a processor to fail its job at once, without retries."""


class LockLostError(JobqError):
    """The worker no longer holds the job's lock, so it may not finalise it."""


class ClosedError(JobqError, RuntimeError):
    """A method was called on a closed object, or it closed under a wait."""


class ScriptCode(IntEnum):
    """Return codes of the Lua scripts (their headers say which each returns)."""

    #: a finalising call retried after a lost reply: this token did it already
    ALREADY_DONE = 0
    #: done (a finalising call: the job completed, or failed for good)
    DONE = 1
    #: fail.lua: the attempt failed and a retry is scheduled
    RETRYING = 2
    #: complete.lua / fail.lua: the job's cancel was requested; it failed for good
    CANCELLED = 3
    JOB_MISSING = -1
    LOCK_LOST = -2
    NOT_IN_STATE = -3
    ACTIVE_JOBS = -4
    #: a scheduler's tick id names an existing job
    COLLISION = -5


JOB_MISSING = ScriptCode.JOB_MISSING
LOCK_LOST = ScriptCode.LOCK_LOST
NOT_IN_STATE = ScriptCode.NOT_IN_STATE
ACTIVE_JOBS = ScriptCode.ACTIVE_JOBS


def in_entry(where: str, exc: BaseException) -> BaseException:
    """``exc`` of one entry of many (a bulk's job, a flow's node), its
    message naming the entry: in a bulk of thousands the message alone does
    not say which one was wrong. Its type is kept; ``exc`` itself when that
    type cannot be made from a message."""
    try:
        named = type(exc)(f"{where}: {exc}")
    except Exception:
        return exc
    named.__cause__ = exc
    return named


def script_error(code: int, job_id: str | None = None, action: str = "") -> JobqError:
    """Return the exception that a script's negative return code stands for."""
    jid = job_id or "?"
    if code == JOB_MISSING:
        return JobNotFoundError(jid)
    if code == LOCK_LOST:
        return LockLostError(f"lock of job {jid!r} is not held by this worker ({action})")
    if code == NOT_IN_STATE:
        return JobqError(f"job {jid!r} is not in a state that allows {action}")
    if code == ACTIVE_JOBS:
        return JobqError(f"cannot {action}: the queue has active jobs (use force=True)")
    return JobqError(f"script error {code} for job {jid!r} ({action})")
