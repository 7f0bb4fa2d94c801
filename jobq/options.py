"""Job options: parsing and validation, and their encodings for the scripts."""

from __future__ import annotations

import math
import random
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .keys import validate_job_id

#: Largest priority (BullMQ's): a priority and an insertion sequence share one
#: sorted-set score, priority * 2**32 + (0 < offset < 2**32), exact only below
#: 2**53; at 2**21 the sequence would be rounded away and FIFO lost.
MAX_PRIORITY = 2**21 - 1
#: Longest wait before a retry, in seconds (a year): exponential backoff stops growing there.
MAX_BACKOFF = 365 * 24 * 3600.0


#: Longest time any argument in seconds may name (some 31,700 years): in ms,
#: added to the clock, it stays an exact whole number of a double; a larger
#: (finite) one, such as 1e308, would overflow only later, converting to ms.
MAX_SECONDS = 1e12


def _number(name: str, value: Any, minimum: float = 0.0) -> float:
    # NaN and infinity are refused: both would fail only later, converting to ms
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a number of seconds, not {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum:g}, not {value!r}")
    if abs(value) > MAX_SECONDS:
        raise ValueError(f"{name} must be at most {MAX_SECONDS:g} seconds, not {value!r}")
    return float(value)


def flag(name: str, value: Any) -> bool:
    """A yes/no argument: a bool (a truthy string such as "no" would say yes)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, not {value!r}")
    return value


def wait_timeout(value: Any, name: str = "timeout") -> float | None:
    """A timeout argument of a blocking call: None (no limit) or seconds >= 0.

    NaN, negative values, bools and non-numbers are refused (NaN would end a
    wait at once, a negative one compares as already past). Infinity, or any
    time over half of what a thread can wait for (``threading.TIMEOUT_MAX``,
    some 146 years here), is no limit, not an OverflowError from deep inside.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ValueError(f"{name} must be None or a number of seconds, not {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be None or >= 0, not {value!r}")
    return None if value >= threading.TIMEOUT_MAX / 2 else float(value)


def blocking_seconds(value: Any) -> float:
    """QueueEvents' ``blocking_timeout``: seconds > 0 (infinity too: every
    read is capped anyway). NaN or a value <= 0 once gave reads of 10 ms,
    a hundred a second for as long as nothing happened."""
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value)
            or value <= 0):
        raise ValueError(f"blocking_timeout must be a number of seconds > 0, not {value!r}")
    return float(value)


def list_index(name: str, value: Any, minimum: int | None = None) -> int:
    """An index into a list (``start``, ``end``; negative counts from the
    end, as LRANGE does) or a count: an int, not a bool, NaN or a float
    that the server would refuse with a bare "value is not an integer"
    (nor one beyond its 64-bit range)."""
    if isinstance(value, bool) or not isinstance(value, int) or not -(2**63) <= value < 2**63:
        raise ValueError(f"{name} must be a 64-bit int, not {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, not {value!r}")
    return value


def byte_limit(name: str, value: Any) -> int | None:
    """A size limit in bytes: None (no limit) or an int >= 1."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be None or an int >= 1, not {value!r}")
    return value


#: The largest count an option may hold: the scripts' numbers are doubles,
#: exact up to 2**53.
MAX_COUNT = 2**53


def _int(name: str, value: Any, minimum: int, maximum: int = MAX_COUNT) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, not {value!r}")
    if not minimum <= value <= maximum:
        raise ValueError(f"{name} must be >= {minimum} and <= {maximum}, not {value!r}")
    return value


@dataclass(frozen=True)
class Backoff:
    """How long to wait before retrying a failed attempt."""

    type: str = "fixed"
    delay: float = 0.0
    jitter: float = 0.0

    @classmethod
    def parse(cls, value: Any) -> Backoff | None:
        """Build from ``None``, a number of seconds, or a dict."""
        if value is None:
            return None
        if isinstance(value, Backoff):
            return value
        if isinstance(value, Mapping):
            unknown = set(value) - {"type", "delay", "jitter"}
            if unknown:
                raise ValueError(f"unknown backoff keys: {sorted(unknown)}")
            kind = value.get("type", "fixed")
            if kind not in ("fixed", "exponential"):
                raise ValueError(f"backoff type must be 'fixed' or 'exponential', not {kind!r}")
            jitter = _number("backoff jitter", value.get("jitter", 0.0))
            if jitter > 1:
                raise ValueError(f"backoff jitter must be between 0 and 1, not {jitter!r}")
            return cls(kind, _number("backoff delay", value.get("delay", 0.0)), jitter)
        return cls("fixed", _number("backoff", value))

    def delay_for(self, attempts_made: int) -> float:
        """Seconds to wait after the ``attempts_made``-th failed attempt."""
        delay = self.delay
        if self.type == "exponential":
            # capped exponent: 2 ** 1024 would overflow a float
            delay = self.delay * 2.0 ** min(max(0, attempts_made - 1), 64)
        if self.jitter:
            delay *= 1 - self.jitter * random.random()
        return min(delay, MAX_BACKOFF)

    def to_dict(self) -> dict[str, Any]:
        """Plain form, as stored in a job's options."""
        return {"type": self.type, "delay": self.delay, "jitter": self.jitter}


@dataclass(frozen=True)
class KeepJobs:
    """Retention of finished jobs: how many and for how long to keep them."""

    count: int | None = None  # None: no limit; 0: remove at once
    age: float | None = None  # seconds; None: no limit

    @classmethod
    def parse(cls, name: str, value: Any) -> KeepJobs:
        """Build from ``True``, ``False``, an int, or ``{"age": s, "count": n}``."""
        if value is True:
            return cls(count=0)
        if value is False or value is None:
            return cls()
        if isinstance(value, int):
            return cls(count=_int(name, value, 0))
        if isinstance(value, Mapping):
            unknown = set(value) - {"age", "count"}
            if unknown:
                raise ValueError(f"unknown {name} keys: {sorted(unknown)}")
            count = value.get("count")
            age = value.get("age")
            return cls(
                count=None if count is None else _int(f"{name} count", count, 0),
                age=None if age is None else _number(f"{name} age", age),
            )
        raise ValueError(f"{name} must be a bool, an int or a dict, not {value!r}")

    def to_script(self) -> tuple[int, int]:
        """(count, age in ms) as the scripts take them; -1 / 0 mean no limit."""
        count = -1 if self.count is None else self.count
        age = 0 if self.age is None else max(1, round(self.age * 1000))
        return count, age

    def to_plain(self) -> Any:
        """Plain form, as stored in a job's options."""
        if self.count == 0 and self.age is None:
            return True
        if self.count is None and self.age is None:
            return False
        return {"count": self.count, "age": self.age}


@dataclass(frozen=True)
class Dedup:
    """Deduplication of adds: one job per key (see SPEC "Deduplication").

    ``ttl`` None: the key holds until its job is finished (simple mode);
    seconds: for that long after the first add, finished or not (throttle),
    restarted by each ignored add when ``extend``. ``replace`` (with a
    ``delay``): a later add replaces the still-delayed job (debounce).
    """

    id: str
    ttl: float | None = None
    extend: bool = False
    replace: bool = False

    @classmethod
    def parse(cls, value: Any) -> Dedup | None:
        """Build from None or ``{"id", "ttl", "extend", "replace"}``."""
        if value is None or isinstance(value, Dedup):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(f"dedup must be a dict with an 'id', not {value!r}")
        unknown = set(value) - {"id", "ttl", "extend", "replace"}
        if unknown:
            raise ValueError(f"unknown dedup keys: {sorted(unknown)}")
        key = value.get("id")
        if not isinstance(key, str) or not key or len(key) > 500:
            raise ValueError(f"dedup id must be a non-empty str of at most 500 characters, "
                             f"not {key!r}")
        ttl = value.get("ttl")
        flags = {name: value.get(name, False) for name in ("extend", "replace")}
        for name, flag in flags.items():
            if not isinstance(flag, bool):
                raise ValueError(f"dedup {name} must be a bool, not {flag!r}")
        if flags["extend"] and ttl is None:
            raise ValueError("dedup extend restarts a ttl: give the key a ttl too")
        return cls(key, None if ttl is None else _positive("dedup ttl", ttl), **flags)

    def to_script(self) -> tuple[str, int, str, str]:
        """(id, ttl ms or 0, extend, replace) as add.lua takes them."""
        ttl = 0 if self.ttl is None else max(1, round(self.ttl * 1000))
        return self.id, ttl, "1" if self.extend else "0", "1" if self.replace else "0"

    def to_dict(self) -> dict[str, Any]:
        """Plain form, as stored in a job's options."""
        return {"id": self.id, "ttl": self.ttl, "extend": self.extend, "replace": self.replace}


def refuse_one_job_defaults(defaults: Mapping[str, Any], what: str) -> None:
    """Refuse ``job_id`` and ``dedup`` among default options (of a queue,
    of a task): every add they apply to would be one job."""
    for key in ("job_id", "dedup"):
        if defaults.get(key) is not None:
            raise ValueError(f"{key} cannot be a default job option of {what}: every add "
                             "would be one job (give it to the adds it is for: "
                             f"add(..., {key}=...), a task's enqueue(..., {key}=...))")


def _spelt(unknown: set[Any]) -> str:
    """How jobq spells BullMQ's camelCase option names among ``unknown``."""
    hints = []
    for name in sorted(n for n in unknown if isinstance(n, str)):
        snake = re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()
        if snake != name and snake in OPTION_NAMES:
            hints.append(f"{name} is {snake}")
    return f" ({', '.join(hints)}; times are seconds)" if hints else ""


#: add.lua's dedup arguments of a job without a dedup key.
NO_DEDUP = ("", 0, "0", "0")


OPTION_NAMES = frozenset(
    {
        "job_id",
        "dedup",
        "delay",
        "priority",
        "attempts",
        "backoff",
        "lifo",
        "timeout",
        "remove_on_complete",
        "remove_on_fail",
        "fail_parent_on_failure",
        "ignore_dependency_on_failure",
        "remove_dependency_on_failure",
    }
)

#: The failure policies of a child (BullMQ's option names), as the scripts
#: store them (field fpol): what its terminal failure does to its parent.
FAILURE_POLICIES = {
    "fail_parent_on_failure": "f",
    "ignore_dependency_on_failure": "i",
    "remove_dependency_on_failure": "r",
}


@dataclass(frozen=True)
class JobOptions:
    """The validated options of one job."""

    job_id: str | None = None
    delay: float = 0.0
    priority: int = 0
    attempts: int = 1
    backoff: Backoff | None = None
    lifo: bool = False
    timeout: float | None = None
    remove_on_complete: KeepJobs = KeepJobs()
    remove_on_fail: KeepJobs = KeepJobs()
    dedup: Dedup | None = None
    #: what the job's terminal failure does to its parent: '' the parent
    #: waits on it, or a FAILURE_POLICIES value
    on_failure: str = ""

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> JobOptions:
        """Validate a mapping of option names to values.

        Raises:
            TypeError: an unknown option name.
            ValueError: a value out of range or of the wrong type.
        """
        unknown = set(options) - OPTION_NAMES
        if unknown:
            raise TypeError(f"unknown job options: {sorted(unknown, key=str)}"
                            + _spelt(unknown))
        job_id = options.get("job_id")
        timeout = options.get("timeout")
        lifo = options.get("lifo", False)
        if not isinstance(lifo, bool):
            raise ValueError(f"lifo must be a bool, not {lifo!r}")
        policies = []
        for option, code in FAILURE_POLICIES.items():
            flag = options.get(option, False)
            if not isinstance(flag, bool):
                raise ValueError(f"{option} must be a bool, not {flag!r}")
            if flag:
                policies.append(code)
        if len(policies) > 1:
            raise ValueError(f"give at most one of {', '.join(FAILURE_POLICIES)}")
        return cls(
            job_id=None if job_id is None else validate_job_id(job_id),
            delay=_number("delay", options.get("delay", 0)),
            priority=_int("priority", options.get("priority", 0), 0, MAX_PRIORITY),
            attempts=_int("attempts", options.get("attempts", 1), 1),
            backoff=Backoff.parse(options.get("backoff")),
            lifo=lifo,
            timeout=None if timeout is None else _positive("timeout", timeout),
            remove_on_complete=KeepJobs.parse(
                "remove_on_complete", options.get("remove_on_complete", False)
            ),
            remove_on_fail=KeepJobs.parse("remove_on_fail", options.get("remove_on_fail", False)),
            dedup=Dedup.parse(options.get("dedup")),
            on_failure=policies[0] if policies else "",
        )

    def to_plain(self) -> dict[str, Any]:
        """The options as a plain dict (``Job.opts``), stored with the job."""
        return {
            "delay": self.delay,
            "priority": self.priority,
            "attempts": self.attempts,
            "backoff": None if self.backoff is None else self.backoff.to_dict(),
            "lifo": self.lifo,
            "timeout": self.timeout,
            "remove_on_complete": self.remove_on_complete.to_plain(),
            "remove_on_fail": self.remove_on_fail.to_plain(),
            **({} if self.dedup is None else {"dedup": self.dedup.to_dict()}),
            **{
                option: True
                for option, code in FAILURE_POLICIES.items()
                if code == self.on_failure
            },
        }


def stored_form(plain: Mapping[str, Any]) -> dict[str, Any]:
    """The options as a job's record keeps them: only those that differ
    from the defaults. A record's fields of 64 bytes or less keep its hash
    in Redis's compact encoding (hash-max-listpack-value): the full map of
    options (96 bytes) made every job's hash a hash table, 680 bytes
    against 176 for a job waiting (bench/README.md, W5)."""
    return {k: v for k, v in plain.items() if k not in _DEFAULTS or _DEFAULTS[k] != v}


def from_stored(stored: Mapping[str, Any]) -> dict[str, Any]:
    """The options of a job's record, the defaults filled in (``Job.opts``)."""
    return {**_DEFAULTS, **stored}


def seconds(name: str, value: Any) -> float:
    """Argument ``name``: a finite number of seconds >= 0, else ValueError."""
    return _number(name, value)


def _positive(name: str, value: Any) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0:
        raise ValueError(f"{name} must be > 0, not {value!r}")
    return _number(name, value)


#: The plain options of a job added with none (stored_form leaves them out).
_DEFAULTS = JobOptions().to_plain()
