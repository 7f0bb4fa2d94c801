"""Job schedulers: repeatable (``every``) and cron jobs, with no beat process.

A scheduler's next run exists as a delayed job whose id is a pure function
of (scheduler id, slot), so whoever produces a tick twice makes one job. The
script that takes a tick job produces the next one (see advance_scheduler
in lua/_common.lua); a worker's maintenance loop checks the schedulers whose
next run is due and produces a missing tick (schedulerSync.lua). A pending
tick job that is cancelled or removed is skipped, never produced again: the
scheduler goes on with the next tick when its slot comes (a cancelled tick
may leave no record to tell it from a removed one; ``remove_scheduler``
stops a schedule).

``every`` slots are computed in Lua, on the grid of the previous scheduled
slot. Cron slots are computed here, zone-aware (``zoneinfo``, with
croniter), each from the previous *scheduled* slot (or from the server's
clock when none is pending), never from a host clock, and passed to the
scripts: the slot after the pending one is stored with it, so the take of a
tick can produce the next one in the same call.

Why croniter: BullMQ's cron has seconds as the *first* of 6 fields, which
croniter reads with ``second_at_beginning=True`` (its default puts them
last), on ``zoneinfo`` datetimes; jobq needs croniter 6.1 or later, whose
times across daylight-saving changes the tests pin. cronsim's seconds
field has moved between releases: the optional 6th field, *last*, in 0.1.x;
none at all (5 fields only) from 1.0 to 2.6; the optional *first* field,
as BullMQ, since 2.7 (Python >= 3.10). cronsim follows Debian cron across
DST changes by itself; croniter does not, so :func:`next_cron_slot` adds
Debian's rule (a fixed time repeated by the autumn change runs once).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import redis
from croniter import CroniterBadDateError, croniter

from . import _tracing, serializer
from ._context import not_a_shard
from ._job_record import record_number
from .errors import JobqError, ScriptCode
from .keys import lookup_key, validate_job_id
from .options import MAX_SECONDS, JobOptions

if TYPE_CHECKING:
    from ._adding import JobPreparer
    from ._context import QueueContext

logger = logging.getLogger(__name__)

__all__ = ["Scheduler", "next_cron_slot"]

#: Options a scheduler's job template may not set: the scheduler decides them.
_NOT_IN_TEMPLATE = frozenset({"job_id", "delay", "dedup"})
#: Return code of the scheduler scripts: a tick's id collides with a kept job.
_COLLISION = ScriptCode.COLLISION
#: The largest ``limit``: the server's scripts count in doubles, exact to 2**53.
_MAX_LIMIT = 2**53 - 1


@dataclass(frozen=True)
class Scheduler:
    """A job scheduler as stored: its schedule, its job template, its state.

    Times are epoch seconds; ``next_run`` is None once the schedule is over
    (``end`` passed or ``limit`` reached).
    """

    id: str
    every: float | None
    cron: str | None
    tz: str | None
    next_run: float | None
    count: int
    limit: int | None
    start: float | None
    end: float | None
    name: str
    data: Any
    opts: dict[str, Any] = field(default_factory=dict)


#: The nicknames of cron (and of BullMQ's cron-parser) for 5-field expressions.
CRON_MACROS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


def next_cron_slot(cron: str, tz: str | None, after_ms: int) -> int:
    """The first time (epoch ms) matching ``cron`` in zone ``tz`` strictly
    after ``after_ms``. A 6-field expression has seconds first (as BullMQ);
    a nickname (``@daily``...: CRON_MACROS) stands for its 5 fields.

    Local times are computed in the zone, so a daily 02:30 in Europe/Berlin
    stays 02:30 local across DST changes, as Debian's cron does: a fixed
    time (minute and hour fields without ``*``) skipped by the spring change
    runs at the first valid instant after it (03:00), and one the autumn
    change repeats runs once, at its first occurrence; a wildcard schedule
    (``0 */2 * * *``, ``*/20 2 * * *``) runs on the new time at once:
    skipped times are skipped (no extra 03:00 run), and repeated ones run
    in both hours.

    Raises:
        ValueError: ``cron`` never matches (``0 0 30 2 *``), or not before
            the year 10000.
    """
    cron = CRON_MACROS.get(cron, cron)
    zone = ZoneInfo(tz or "UTC")
    start = datetime.fromtimestamp(after_ms / 1000.0, zone)
    fields = cron.split()
    six = len(fields) == 6
    minute, hour = fields[1:3] if six else fields[0:2]
    fixed = not minute.startswith("*") and not hour.startswith("*")
    it = croniter(cron, start, second_at_beginning=six)
    minutes, hours = it.expanded[0], it.expanded[1]
    while True:
        try:
            slot: int = round(float(it.get_next(float)) * 1000)
            local = datetime.fromtimestamp(slot / 1000.0, zone)
        except CroniterBadDateError as exc:  # its message names neither cron nor time
            raise ValueError(f"cron expression {cron!r} never matches") from exc
        except (OverflowError, ValueError) as exc:  # past year 9999 (datetime's bound)
            raise ValueError(f"cron expression {cron!r} has no run after "
                             f"{start.isoformat()} before the year 10000") from exc
        if slot <= after_ms:  # a sub-second start: croniter works in whole seconds
            continue
        if fixed and local.fold == 1:
            continue  # the repeated hour of an autumn change: it ran at fold 0
        if not fixed and not ((hours == ["*"] or local.hour in hours)
                              and (minutes == ["*"] or local.minute in minutes)):
            continue  # a time the spring change skipped, moved past the gap
        return slot


def _ms(seconds: float | None) -> str:
    return "" if seconds is None else str(round(seconds * 1000))


def _number(name: str, value: Any, positive: bool = False) -> float | None:
    if value is None:
        return None
    # NaN and infinity are refused here: both would fail later, converting to ms
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number of seconds, not {value!r}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be > 0, not {value!r}")
    if abs(value) > MAX_SECONDS:  # (start and end: epoch seconds, far below it)
        raise ValueError(f"{name} must be at most {MAX_SECONDS:g} seconds, not {value!r}")
    return float(value)


#: The epoch seconds of 0001-01-01 and 9999-12-31 23:59:59 UTC: the times a
#: schedule can be computed for.
_EPOCH_RANGE = (-62135596800.0, 253402300799.0)


def _epoch(name: str, value: Any) -> float | None:
    seconds = _number(name, value)
    if seconds is not None and not _EPOCH_RANGE[0] <= seconds <= _EPOCH_RANGE[1]:
        raise ValueError(f"{name} must be epoch seconds within years 1 to 9999, not {value!r}")
    return seconds


def _scheduler_id(value: Any) -> str:
    """A scheduler id: at most 150 characters (its jobs' ids are
    ``repeat:<id>:<slot>``), of those a job id may hold; digits alone are
    fine (no generated id starts with ``repeat:``)."""
    if isinstance(value, str) and 0 < len(value) <= 150:
        try:
            validate_job_id("s" + value)  # its characters checked as a job id's
            return value
        except ValueError:
            raise ValueError(f"invalid scheduler_id {value!r}: no whitespace, control "
                             "characters or lone surrogates") from None
    raise ValueError(f"invalid scheduler_id {value!r}: a non-empty str of at most 150 "
                     "characters")


def _validate_cron(cron: Any, tz: Any) -> None:
    fields = CRON_MACROS.get(cron, cron) if isinstance(cron, str) else cron
    if not isinstance(fields, str) or len(fields.split()) not in (5, 6):
        raise ValueError(f"cron must be a 5- or 6-field expression, or one of "
                         f"{', '.join(CRON_MACROS)}, not {cron!r}")
    if not croniter.is_valid(fields, second_at_beginning=len(fields.split()) == 6):
        raise ValueError(f"invalid cron expression {cron!r}")
    if tz is not None:
        if not isinstance(tz, str):
            raise ValueError(f"tz must be an IANA zone name, not {tz!r}")
        try:
            ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown time zone {tz!r}") from exc


def _server_ms(context: QueueContext) -> int:
    seconds, micros = context.redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("utf-8", "replace")


def _from_record(sid: str, record: dict[bytes, bytes]) -> Scheduler:
    def num(key: bytes) -> float | None:
        number = record_number(record.get(key))
        return None if number is None else number / 1000.0

    limit = record_number(record.get(b"limit"))
    opts = serializer.decode(record.get(b"opts"), f"options of scheduler {sid!r}")
    return Scheduler(
        id=sid,
        every=num(b"every"),
        cron=_text(record.get(b"cron")),
        tz=_text(record.get(b"tz")),
        next_run=num(b"next"),
        count=int(record_number(record.get(b"count")) or 0),
        limit=None if limit is None else int(limit),
        start=num(b"start"),
        end=num(b"end"),
        name=_text(record.get(b"name")) or sid,
        data=serializer.decode(record.get(b"data"), f"data of scheduler {sid!r}"),
        opts=dict(opts) if isinstance(opts, dict) else {},
    )


def sync_scheduler(context: QueueContext, sid: str) -> int:
    """Run schedulerSync.lua for one scheduler (the one place that calls it):
    produce its next tick if it is missing, fill in the cron slot after the
    pending one. Returns the script's code.

    Raises:
        JobqError: the scheduler's tick collides with an existing job.
    """
    record = context.redis.hgetall(context.keys.scheduler(sid))
    if not record:
        return 0
    pending = _text(record.get(b"next")) or ""
    cron = _text(record.get(b"cron"))
    after_pending = first = after_first = ""
    if cron and pending:
        tz = _text(record.get(b"tz"))
        after_pending = str(next_cron_slot(cron, tz, int(pending)))
        # from the previous scheduled slot, or from now when that is past:
        # missed ticks make one job, not a burst
        first_ms = next_cron_slot(cron, tz, max(int(pending), _server_ms(context)))
        first, after_first = str(first_ms), str(next_cron_slot(cron, tz, first_ms))
    code = context.calls.scheduler_sync(sid, pending, after_pending, first, after_first)
    if code == _COLLISION:
        error = _text(context.redis.hget(context.keys.scheduler(sid), "err"))
        raise JobqError(error or f"scheduler {sid!r}: its next tick collides with a job")
    return code


def tick_left(context: QueueContext, job_id: str) -> None:
    """After a cancel or remove of job ``job_id``: when it was a scheduler's
    tick, make sure the scheduler has its next tick (cancel.lua and
    remove.lua make it from the slot after, when they know it: not for a
    cron tick made by such a call, whose slot after is computed here) and
    knows the slot after it. A failure is logged: the workers' check
    (at most every 5 s) does the same."""
    if not job_id.startswith("repeat:"):
        return
    sid = job_id[len("repeat:"):].rpartition(":")[0]
    try:
        sync_scheduler(context, sid)
    except (JobqError, redis.exceptions.RedisError) as exc:
        logger.warning("scheduler %r after its job %r left: %s", sid, job_id, exc)


def due_schedulers(context: QueueContext) -> list[str]:
    """Ids of the schedulers whose next run is due (by the server's clock)."""
    ids = context.redis.zrangebyscore(context.keys.schedulers, "-inf", _server_ms(context))
    return [i.decode() for i in ids]


class QueueSchedulers:
    """Job schedulers of a queue (a mixin of Queue)."""

    _context: QueueContext
    _record: Callable[[], None]
    _restores: Callable[[], str]
    _settings_lost: Callable[[float], None]
    _preparer: JobPreparer

    def upsert_scheduler(
        self,
        scheduler_id: str,
        *,
        every: float | None = None,
        cron: str | None = None,
        tz: str | None = None,
        start: float | None = None,
        end: float | None = None,
        limit: int | None = None,
        immediately: bool = False,
        name: str | None = None,
        data: Any = None,
        **job_options: Any,
    ) -> Scheduler:
        """Create or replace a job scheduler; return it.

        Exactly one of ``every`` (seconds) and ``cron`` (5 or 6 fields; with 6,
        seconds first; or a nickname: ``@hourly``, ``@daily``, ``@midnight``,
        ``@weekly``, ``@monthly``, ``@yearly``, ``@annually``) is given;
        ``cron`` is evaluated in ``tz`` (an IANA zone, default UTC).
        ``start`` / ``end`` (epoch seconds) bound the schedule, ``limit``
        caps its jobs. With ``every`` the first job comes
        at once, with ``cron`` at the first matching time (at once when
        ``immediately``); never before ``start``. ``name`` (default: the
        scheduler id), ``data`` and ``job_options`` (those of ``add`` but
        job_id, delay and dedup; over the queue's ``default_job_options``,
        as an ``add``'s) make each job. Upserting the same schedule again
        keeps the pending job (its id and time) and gives it the new template, unless a worker
        took it already (then the next job has the new template); a changed
        schedule replaces the pending job while it is delayed. Cancelling or removing the
        pending job skips that run: the next job comes at the following
        time of the schedule.

        Raises:
            ValueError: a bad argument.  SerializationError: data does not
            encode.  JobqError: the first tick collides with an existing job.
        """
        not_a_shard(self._context, "schedule jobs")
        sid = _scheduler_id(scheduler_id)
        if (every is None) == (cron is None):
            raise ValueError("give exactly one of every= and cron=")
        every_s = _number("every", every, positive=True)
        if every_s is not None and every_s < 0.001:
            raise ValueError(f"every must be at least 0.001 s, not {every!r}")
        if cron is not None:
            _validate_cron(cron, tz)
        elif tz is not None:
            raise ValueError("tz applies to cron schedules only")
        start_s, end_s = _epoch("start", start), _epoch("end", end)
        if start_s is not None and end_s is not None and end_s < start_s:
            raise ValueError(f"end ({end!r}) is before start ({start!r})")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                                  or not 1 <= limit <= _MAX_LIMIT):
            raise ValueError(f"limit must be an int from 1 to 2**53 - 1, not {limit!r}")
        if not isinstance(immediately, bool):
            raise ValueError(f"immediately must be a bool, not {immediately!r}")
        refused = _NOT_IN_TEMPLATE & set(job_options)
        if refused:
            raise TypeError(f"a scheduler's jobs cannot take {sorted(refused)}")
        defaults = {k: v for k, v in self._preparer.defaults().items()
                    if k not in _NOT_IN_TEMPLATE}  # a default delay is not a tick's
        opts = JobOptions.parse({**defaults, **job_options})
        job_name = name if name is not None else sid
        if not isinstance(job_name, str) or not job_name or len(job_name) > 200:
            raise ValueError(f"name must be a non-empty str of at most 200 characters, "
                             f"not {job_name!r}")
        packed_data = self._context.sized(serializer.encode(data, "scheduler data"),
                                          "scheduler data")
        plain = opts.to_plain()
        complete_count, complete_age = opts.remove_on_complete.to_script()
        fail_count, fail_age = opts.remove_on_fail.to_script()

        hook = _tracing.hook

        def setting(value: Any, default: Any) -> str:
            return "" if value == default else str(value)

        template = (
            job_name, packed_data, serializer.encode(plain, "job options"),
            setting(opts.priority, 0), "1" if opts.lifo else "",
            setting(opts.attempts, 1), setting(complete_count, -1), setting(complete_age, 0),
            setting(fail_count, -1), setting(fail_age, 0),
            # each tick job keeps the upsert's trace context: its attempts
            # start traces of their own, linked to it (see _tracing.py)
            "" if hook is None else hook.carrier(),
        )
        schedule = (_ms(every_s), cron or "", (tz or "UTC") if cron else "",
                    _ms(start_s), _ms(end_s), "" if limit is None else str(limit),
                    "1" if immediately else "0")
        spec = json.dumps(schedule)
        first = after = ""
        if cron is not None:
            now = _server_ms(self._context)
            if immediately:  # at once, or at the start when it is ahead (as every)
                first_ms = now if start_s is None else max(now, round(start_s * 1000))
            else:
                begin = now if start_s is None else max(now, round(start_s * 1000) - 1)
                first_ms = next_cron_slot(cron, tz, begin)
            first = str(first_ms)
            after = str(next_cron_slot(cron, tz, first_ms))
        sent = time.monotonic()
        code, tick, record, unset = self._context.calls.upsert_scheduler(
            sid, schedule, spec, first, after, template, self._restores())
        if unset:  # a queue fed by schedulers alone, after the server lost its data
            self._settings_lost(sent)
        if code == _COLLISION:
            raise JobqError(
                f"the first tick of scheduler {sid!r} would be job {tick!r}, which exists "
                "(waiting, running or kept): remove it and upsert again, or use another "
                "scheduler id"
            )
        self._record()  # listed with the known queues (jobq info, the dashboard)
        # as the upsert stored it (a remove just after it is another call's)
        return _from_record(sid, record)

    def remove_scheduler(self, scheduler_id: str) -> bool:
        """Remove a scheduler and its pending delayed job; False when unknown."""
        return self._context.calls.remove_scheduler(lookup_key(scheduler_id, "scheduler_id")) == 1

    def get_scheduler(self, scheduler_id: str) -> Scheduler | None:
        """The scheduler with that id, or None."""
        sid = lookup_key(scheduler_id, "scheduler_id")
        record = self._context.redis.hgetall(self._context.keys.scheduler(sid))
        if not record:
            return None
        return _from_record(sid, record)

    def get_schedulers(self) -> list[Scheduler]:
        """Every scheduler of the queue, soonest next run first."""
        keys = self._context.keys
        ids = [i.decode() for i in self._context.redis.zrange(keys.schedulers, 0, -1)]
        pipe = self._context.redis.pipeline(transaction=False)
        for sid in ids:
            pipe.hgetall(keys.scheduler(sid))
        return [
            _from_record(sid, record)
            for sid, record in zip(ids, pipe.execute(), strict=True) if record
        ]
