"""What ``Queue.add`` makes of a job's name, data and options: add.lua's
arguments, every value checked, and the parsed options memoized (the
queue's defaults alone once; the jobs of one ``add_bulk`` by their options
but ``job_id``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from . import serializer
from ._context import QueueContext
from .calls import NewJob
from .keys import SURROGATE, validate_job_id
from .options import NO_DEDUP, JobOptions, refuse_one_job_defaults, stored_form

#: Longest job name, in characters.
MAX_JOB_NAME = 200


def job_name(name: object) -> str:
    if (not isinstance(name, str) or not name or len(name) > MAX_JOB_NAME
            or SURROGATE.search(name)):
        raise ValueError(f"job name must be a non-empty str of at most {MAX_JOB_NAME} "
                         f"characters without lone surrogates, not {name!r}")
    return name


class Parsed(NamedTuple):
    """A job's options as ``Queue._prepare`` uses them."""

    #: the plain form (``Job.opts``)
    plain: dict[str, Any]
    #: add.lua's first argument of the job: its id, '' to generate one
    job_id: str
    #: add.lua's arguments of the job after its name and data (``NewJob``'s
    #: fields from ``opts`` to ``policy``), the same for every job with these options
    rest: tuple[Any, ...]


class Batch:
    """What the jobs of one ``add_bulk`` call share: one msgpack Packer, and
    the options parsed so far."""

    __slots__ = ("encode", "parsed")

    def __init__(self) -> None:
        self.encode = serializer.encoder()
        self.parsed: dict[tuple[Any, ...], Parsed] = {}


def _memo_key(options: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """What options parse alike by, but their ``job_id``; None when a value
    is not a plain scalar (a dict, a subclass of int). Types are part of it,
    since ``1 == 1.0 == True`` and only the first is a valid ``attempts``;
    floats are taken by their exact bits (``-0.0``)."""
    key: list[Any] = []
    for name, value in options.items():
        kind = type(value)
        if name == "job_id":
            key.append(name)  # given (checked apart on each job) or not
        elif kind is float:
            key.append((name, kind, value.hex()))
        elif kind in _MEMO_TYPES:
            key.append((name, kind, value))
        else:
            return None
    return tuple(key)


_MEMO_TYPES = frozenset({int, bool, str, type(None)})


class JobPreparer:
    """A queue's maker of add.lua's job arguments, with its default job
    options (checked when given)."""

    def __init__(self, default_job_options: Mapping[str, Any] | None) -> None:
        if default_job_options is not None and not isinstance(default_job_options, Mapping):
            raise TypeError("default_job_options must be a dict of job options, not "
                            f"{type(default_job_options).__name__}")
        defaults = dict(default_job_options or {})
        refuse_one_job_defaults(defaults, "a queue")
        JobOptions.parse(defaults)  # fail early on bad defaults
        self._defaults = defaults
        self._default_options: Parsed | None = None

    def defaults(self) -> dict[str, Any]:
        """The default job options (a copy)."""
        return dict(self._defaults)

    def prepare(
        self, context: QueueContext, name: Any, data: Any, options: Mapping[str, Any],
        batch: Batch | None = None,
    ) -> tuple[NewJob, dict[str, Any]]:
        """See ``Queue._prepare`` (``context``: the queue's, for its payload limit)."""
        parsed = self._options(options, batch)
        packed = (serializer.encode if batch is None else batch.encode)(data, "job data")
        context.sized(packed, "job data")
        return NewJob(parsed.job_id, job_name(name), packed, *parsed.rest), parsed.plain

    def _options(self, options: Mapping[str, Any], batch: Batch | None = None) -> Parsed:
        """Parsed options and what every job with them shares; the queue's
        defaults alone (the common case) are parsed once, and so are the
        options of a ``batch``'s jobs that differ only in ``job_id``."""
        if not options and self._default_options is not None:
            return self._default_options
        memo = batch.parsed if batch is not None and options else None
        key = _memo_key(options) if memo is not None else None
        known = memo.get(key) if memo is not None and key is not None else None
        if known is not None:
            if "job_id" not in options:
                return known
            # the rest parsed already: only the id can be refused, as a parse would
            job_id = options["job_id"]
            return Parsed(known.plain, "" if job_id is None else validate_job_id(job_id),
                          known.rest)
        opts = JobOptions.parse({**self._defaults, **options})
        plain = opts.to_plain()
        complete_count, complete_age = opts.remove_on_complete.to_script()
        fail_count, fail_age = opts.remove_on_fail.to_script()
        parsed = Parsed(plain, opts.job_id or "", (
            serializer.encode(stored_form(plain), "job options"),
            round(opts.delay * 1000),
            opts.priority,
            opts.lifo,
            opts.attempts,
            complete_count,
            complete_age,
            fail_count,
            fail_age,
            NO_DEDUP if opts.dedup is None else opts.dedup.to_script(),
            opts.on_failure,
        ))
        if not options:
            self._default_options = parsed
        elif memo is not None and key is not None:
            memo[key] = parsed
        return parsed
