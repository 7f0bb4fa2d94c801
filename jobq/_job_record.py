"""A job's record as stored (a Redis hash), read into a Job: its number
fields as the scripts read them, and its user values (data, result,
progress) decoded when first read."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from . import serializer
from .options import from_stored

if TYPE_CHECKING:
    from .job import Job


def text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("utf-8", "replace")


def record_number(value: bytes | None) -> float | None:
    """A number field of a stored record, read as the scripts read it (Lua's
    ``tonumber``): None when absent, empty or not a finite number. A record
    written by hand or by another version may hold anything there, and one
    such field must not make a whole listing raise."""
    if not value:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _number(record: Mapping[bytes, bytes], key: bytes, bad: list[str]) -> float | None:
    """Field ``key`` of a job's record as a number; one that is not is
    noted in ``bad`` (a worker does not run its job: Runner._prepare)."""
    raw = record.get(key)
    value = record_number(raw)
    if value is None and raw:
        bad.append(f"{key.decode()} {raw[:40]!r} is not a number")
    return value


def _ms(record: Mapping[bytes, bytes], key: bytes, bad: list[str]) -> float | None:
    """A time in ms of a job's record, in seconds (see ``_number``)."""
    value = _number(record, key, bad)
    return None if value is None else value / 1000.0


def _decoded(packed: bytes | None, key: str, bad: list[str]) -> Any:
    """A msgpack field of jobq's own (options, stack traces) of a job's
    record; one that does not decode is noted in ``bad`` (see
    ``_number``): one such record made a whole listing raise."""
    try:
        return serializer.decode(packed, key)
    except Exception as exc:
        bad.append(f"{key} cannot be decoded ({exc})")
        return None


def _queue_of_base(base: str) -> str:
    """The queue name in a queue's base key ``<prefix>:{<queue>}:``."""
    return base[base.rindex("{") + 1 : -2]


class _Stored:
    """A value as stored (msgpack bytes), with what to call it in an error."""

    __slots__ = ("packed", "what")

    def __init__(self, packed: bytes, what: str) -> None:
        self.packed, self.what = packed, what


class UserValue:
    """A user's value of a job (data, result, progress) read from its record
    and decoded when first read: one value this process cannot decode (an
    extension type registered only where it was written) fails that read,
    not the reading of the record, so a listing of jobs or the worker's
    failing of the attempt still reach the job. Decoded, the value is the
    instance's own attribute (as with functools.cached_property): reading
    or setting it costs nothing more."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name, self._stored = name, "_stored_" + name

    def __get__(self, job: Any, owner: type | None = None) -> Any:
        if job is None:
            return self
        stored = job.__dict__.get(self._stored)
        value = None if stored is None else serializer.decode(stored.packed, stored.what)
        job.__dict__[self._name] = value  # kept; a value that raised is decoded again next time
        return value

    def load(self, job: Any, packed: bytes | None, what: str) -> None:
        """Give ``job`` the value as stored, to be decoded when first read."""
        job.__dict__.pop(self._name, None)
        job.__dict__[self._stored] = None if packed is None else _Stored(packed, what)


def load_record(job: Job, record: Mapping[bytes, bytes]) -> None:
    """Set ``job``'s attributes from its record (``Job.refresh``)."""
    get, cls = record.get, type(job)
    job.name = text(get(b"name")) or job.name
    cls.data.load(job, get(b"data"), f"data of job {job.id!r}")
    bad: list[str] = []
    opts = _decoded(get(b"opts"), "opts", bad)
    job.opts = from_stored(opts) if isinstance(opts, dict) else {}
    job.timestamp = _ms(record, b"ts", bad)
    job.delay = _ms(record, b"delay", bad) or 0.0
    job.priority = int(_number(record, b"priority", bad) or 0)
    job.attempts_made = int(_number(record, b"atm", bad) or 0)
    job.stalled_counter = int(_number(record, b"stc", bad) or 0)
    cls.progress.load(job, get(b"prog"), f"progress of job {job.id!r}")
    cls.return_value.load(job, get(b"rv"), f"return value of job {job.id!r}")
    job.failed_reason = text(get(b"fr"))
    job.exc_type = text(get(b"et")) or None
    stacktrace = _decoded(get(b"st"), "st", bad)
    job.stacktrace = [t.decode("utf-8", "replace") if isinstance(t, bytes) else str(t)
                      for t in stacktrace] if isinstance(stacktrace, list) else []
    job.processed_on = _ms(record, b"pon", bad)
    job._ready_at = _ms(record, b"rdy", bad)
    job.finished_on = _ms(record, b"fon", bad)
    job.processed_by = text(get(b"pb"))
    pid, pqb = text(get(b"pid")), text(get(b"pqb"))
    job.parent = None
    if pid is not None and pqb is not None:
        if "{" in pqb and pqb.endswith("}:"):
            job.parent = (_queue_of_base(pqb), pid)
        else:
            bad.append(f"pqb {pqb[:40]!r} is not a queue's base")
    job._run = text(get(b"run")) or job._run
    job._unreadable = tuple(bad)
