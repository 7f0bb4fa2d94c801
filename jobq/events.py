"""Event objects, and decoding of event stream entries and pub/sub messages."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import serializer
from .errors import SerializationError

__all__ = ["Event", "JobMetrics"]


@dataclass(frozen=True)
class JobMetrics:
    """Timings of a finished attempt, in seconds."""

    waited_for: float
    """From ready to run (added, or due when delayed) to started."""
    ran_for: float
    """From started to finished."""
    attempt: int
    """The attempt's number, 1 for the first."""
    expected_delay: float
    """The delay the job was added with."""


@dataclass(frozen=True)
class Event:
    """One event of a queue; its fields are also readable as attributes.

    Attributes:
        name: the event name, e.g. ``"completed"``.
        job_id: the job it concerns, or None.
        id: the stream entry id (None in pub/sub mode).
        timestamp: when it was written, epoch seconds (server clock).
        prev: the job's previous state, or None.
        fields: every other field, e.g. ``result`` and ``metrics``.
    """

    name: str
    job_id: str | None
    id: str | None
    timestamp: float
    prev: str | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)
    _more: bool = field(default=False, repr=False, compare=False)
    """More events of the same stream entry follow: a reader resuming at
    this id would miss them, so it is not yet a position to resume from."""
    _custom: bool = field(default=False, repr=False, compare=False)
    """Written by ``Queue.emit``: whatever its name, it reaches listeners of
    that name and nothing else (a custom ``obliterated`` is no obliterate)."""

    def __getattr__(self, item: str) -> Any:
        # Only reached when normal lookup fails: expose the event's fields.
        fields = object.__getattribute__(self, "fields")
        try:
            return fields[item]
        except KeyError:
            raise AttributeError(
                f"event {object.__getattribute__(self, 'name')!r} has no field {item!r}"
            ) from None


_SECONDS = frozenset({"delay", "run_at", "waited_for", "ran_for", "expected_delay"})
_INTS = frozenset({"priority", "attempt", "count"})
_PACKED = frozenset({"result", "progress"})
_METRICS = ("waited_for", "ran_for", "attempt", "expected_delay")


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def build(raw: Mapping[str, bytes], entry_id: str | None, timestamp: float) -> Event:
    """Build an Event from raw field values.

    Raises:
        SerializationError: a packed field does not decode.
        ValueError: a number field does not parse.
    """
    name = _text(raw.get("ev", b"?"))
    jid = _text(raw.get("jid", b"")) or None
    prev_raw = raw.get("prev")
    prev = _text(prev_raw) if prev_raw else None
    fields: dict[str, Any] = {}
    if raw.get("c") == b"1":  # a custom event: every field is msgpack
        for key, value in raw.items():
            if key not in ("ev", "jid", "c", "ts"):
                fields[key] = serializer.decode(value, f"event field {key!r}")
        return Event(name, None, entry_id, timestamp, None, fields, _custom=True)
    for key, value in raw.items():
        if key in ("ev", "jid", "prev", "ts", "big"):
            continue
        if key in _SECONDS:
            fields[key] = float(value) / 1000.0
        elif key in _INTS:
            fields[key] = int(float(value))
        elif key in _PACKED:
            fields[key] = serializer.decode(value, f"event field {key!r}")
        else:
            fields[key] = _text(value)
    if name in ("completed", "failed") and "ran_for" in fields:
        fields["metrics"] = JobMetrics(
            waited_for=fields.pop("waited_for"),
            ran_for=fields.pop("ran_for"),
            attempt=fields["attempt"],
            expected_delay=fields.pop("expected_delay"),
        )
    return Event(name, jid, entry_id, timestamp, prev, fields)


def from_stream(entry_id: bytes | str, raw: Mapping[bytes, bytes]) -> list[Event]:
    """Decode one event stream entry into its events, in order: one, or two
    when the entry carries a second event (its fields suffixed ``:2``:
    ``ev:2``, ``jid:2`` when another job's, ...): an add writes ``added``
    and ``waiting`` as one entry."""
    sid = _text(entry_id)
    ts = int(sid.partition("-")[0]) / 1000.0
    fields = {k.decode(): v for k, v in raw.items()}
    if "ev:2" not in fields or fields.get("c") == b"1":
        return [build(fields, sid, ts)]
    second = {k[:-2]: fields.pop(k) for k in [k for k in fields if k.endswith(":2")]}
    second.setdefault("jid", fields.get("jid", b""))
    first = build(fields, sid, ts)
    # not a resume point until the second event is dispatched too
    first = Event(first.name, first.job_id, sid, ts, first.prev, first.fields, True)
    return [first, build(second, sid, ts)]


def to_netstrings(parts: list[str]) -> bytes:
    """Encode strings as netstrings, the form of pub/sub event messages."""
    out = []
    for part in parts:
        data = part.encode()
        out.append(b"%d:%s" % (len(data), data))
    return b"".join(out)


def from_pubsub(message: bytes) -> tuple[Event, str | None]:
    """Decode one pub/sub message: netstrings of alternating fields and
    values; the event, and the number of the database of the queue that
    sent it (field db, see storeSettings.lua; None when it has none)."""
    parts: list[bytes] = []
    pos = 0
    end = len(message)
    while pos < end:
        colon = message.find(b":", pos)
        length = message[pos:colon]
        # ASCII digits alone: int() took "-3" too, and a negative length
        # went back in the message, for ever (a reader's thread spun)
        if colon < 0 or not length.isdigit():
            raise SerializationError("malformed event message (a part's length)")
        size = int(length)
        start = colon + 1
        if start + size > end:
            raise SerializationError("truncated event message")
        parts.append(message[start : start + size])
        pos = start + size
    if len(parts) % 2:
        raise SerializationError("event message has an odd number of parts")
    # the database is the last field (a custom event may have a field db of
    # its own, before it); '' or none at all: not stored, or a 0.1 publisher
    db = None
    if len(parts) >= 2 and parts[-2] == b"db":
        db = _text(parts.pop()) or None
        parts.pop()
    raw = {_text(parts[i]): parts[i + 1] for i in range(0, len(parts), 2)}
    event = build(raw, None, float(raw.get("ts", b"0")) / 1000.0)
    return event, db
