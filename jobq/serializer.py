"""msgpack encoding of payloads, results and event fields.

What round-trips: None, bool, int (64-bit), float, str, bytes, lists, dicts
with str keys, and timezone-aware ``datetime`` (msgpack's Timestamp
extension; it comes back in UTC). Tuples come back as lists, and values
of subclasses of these types (an IntEnum, a namedtuple, an OrderedDict) as
their base type, unless the subclass is registered. Naive
datetimes are refused: their meaning depends on the zone of the host that
reads them. An application adds its own types with ``register``; data can
only ever name a registered decoder by its code, never run code of its own.
"""

from __future__ import annotations

import datetime as _dt
import threading
from collections.abc import Callable
from typing import Any

import msgpack

from .errors import SerializationError

__all__ = ["decode", "encode", "register"]

class _Registry:
    """Application types registered for msgpack's extension types."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_type: dict[type, tuple[int, Callable[[Any], bytes]]] = {}
        self.by_code: dict[int, tuple[type, Callable[[bytes], Any]]] = {}


_registry = _Registry()


def register(
    cls: type,
    code: int,
    encode: Callable[[Any], bytes],
    decode: Callable[[bytes], Any],
) -> None:
    """Let values of ``cls`` travel in job data, results and event fields.

    A value of ``cls`` (or a subclass) is packed as msgpack extension type
    ``code`` holding ``encode(value)``; reading it back calls
    ``decode(bytes)``. Register the same types with the same codes in every
    process that adds jobs and every worker.

    Args:
        cls: the type.
        code: its extension code, 0 to 127 (unique per application).
        encode: value to bytes.
        decode: bytes to value.

    Raises:
        ValueError: the code is out of range or taken by another type.
        TypeError: ``cls`` is not a type, or one msgpack packs itself (a
            ``dict``, ``list``, ``str``, an aware ``datetime``...: its
            encoder would never be called; register a subclass), or a
            function is not callable.
    """
    if not isinstance(cls, type):
        raise TypeError(f"cls must be a type, not {cls!r}")
    if cls in _PACKED_NATIVELY:
        raise TypeError(f"{cls.__qualname__} is packed by msgpack itself: its encoder would "
                        "never be called (register a subclass of it instead)")
    if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= 127:
        raise ValueError(f"code must be an int from 0 to 127, not {code!r}")
    if not callable(encode) or not callable(decode):
        raise TypeError("encode and decode must be callables")
    with _registry.lock:
        taken = _registry.by_code.get(code)
        if taken is not None and taken[0] is not cls:
            raise ValueError(f"ext code {code} is registered for {taken[0].__qualname__}")
        _registry.by_type[cls] = (code, encode)
        _registry.by_code[code] = (cls, decode)


def _default(value: Any) -> Any:
    """msgpack's hook for a value it cannot pack: a registered type's first,
    then a datetime (of a subclass, or naive), then a subclass of a native
    type or a tuple."""
    found = _registry.by_type.get(type(value))
    if found is None:
        for cls, entry in list(_registry.by_type.items()):
            if isinstance(value, cls):
                found = entry
                break
    if found is None and isinstance(value, _dt.datetime):
        if value.tzinfo is not None and value.utcoffset() is not None:
            # a subclass (freezegun's FakeDatetime, pendulum's DateTime):
            # msgpack packs only datetime itself before this hook
            return msgpack.Timestamp.from_datetime(value)
        raise SerializationError(
            f"naive datetime {value.isoformat()} is refused: without a timezone it "
            "means different instants on different hosts; pass an aware one "
            "(e.g. datetime.now(timezone.utc))"
        )
    if found is None:
        for native, convert in _NATIVE:
            if isinstance(value, native):
                return convert(value)
        raise TypeError(
            f"can not serialize {type(value).__name__!r} object (register it with "
            "jobq.serializer.register)"
        )
    code, encode_value = found
    try:
        packed = encode_value(value)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # a registered encoder's bug: this value's refusal
        raise TypeError(f"the encoder of {type(value).__name__} raised "
                        f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(packed, bytes):
        raise TypeError(f"the encoder of {type(value).__name__} returned "
                        f"{type(packed).__name__}, not bytes")
    return msgpack.ExtType(code, packed)


def _ext_hook(code: int, data: bytes) -> Any:
    found = _registry.by_code.get(code)
    if found is None:
        raise SerializationError(
            f"extension type {code} is not registered in this process "
            "(jobq.serializer.register)"
        )
    try:
        return found[1](data)
    except KeyboardInterrupt:  # Ctrl-C while the main thread decodes
        raise
    except BaseException as exc:
        # a decoder's SystemExit or own BaseException must not end the
        # thread that decodes (a QueueEvents reader, a worker's pool
        # thread): it is this value's failure to decode, as any other
        raise SerializationError(
            f"the decoder of extension type {code} raised {type(exc).__name__}: {exc}"
        ) from exc


#: What msgpack packs natively, for a value of a subclass (an IntEnum, a
#: namedtuple, an OrderedDict) or a tuple that no registered type claims:
#: packed as its base type, as msgpack itself would. The packer checks exact
#: types (strict_types), so that a registered subclass of a native type
#: reaches ``_default`` (a str Enum, say, is not packed as a plain str).
_NATIVE: tuple[tuple[type, Callable[[Any], Any]], ...] = (
    (int, int.__int__), (float, float.__float__), (str, str.__str__),
    (bytes, bytes), (bytearray, bytes), (dict, lambda d: dict(d.items())), (list, list),
    (tuple, list),
)

#: Types whose values msgpack packs itself, never through ``_default``
#: (a naive datetime does reach it, only to be refused).
_PACKED_NATIVELY = frozenset(
    {type(None), bool, int, float, str, bytes, bytearray, memoryview, dict, list, _dt.datetime}
)

_packer_kwargs: dict[str, Any] = {
    "use_bin_type": True, "datetime": True, "default": _default, "strict_types": True,
}


def encode(value: Any, what: str = "value") -> bytes:
    """Encode ``value`` with msgpack, refusing what would not round-trip.

    Raises:
        SerializationError: the value (or a map key in it) is not msgpack data.
    """
    try:
        packed: bytes = msgpack.packb(value, **_packer_kwargs)
    except Exception as exc:  # msgpack's refusal, or a value's own code failing (a
        raise _refused(value, what, exc) from exc  # dict subclass's items(), a tzinfo)
    _check(packed, what)
    return packed


def _refused(value: Any, what: str, exc: Exception) -> SerializationError:
    """The error for a value msgpack refused: an integer out of its range is
    named by its size."""
    reason = str(exc)
    if isinstance(exc, OverflowError):
        stack = [value]
        while stack:
            item = stack.pop()
            if isinstance(item, dict):
                stack.extend(item.values())
            elif isinstance(item, (list, tuple)):
                stack.extend(item)
            elif (isinstance(item, int) and not isinstance(item, bool)
                  and not -(2**63) <= item < 2**64):
                reason = (f"an integer of {item.bit_length()} bits is out of msgpack's "
                          "range (-2**63 to 2**64-1): send it as a str")
                break
    return SerializationError(f"{what} is not msgpack-encodable: {reason}")


def encoder() -> Callable[[Any, str], bytes]:
    """``encode`` for many values in a row on one thread (a bulk add's
    jobs), with one msgpack Packer for all of them: making a Packer, as
    ``packb`` does on every call, costs several times the packing of a
    small value (1.1 us against 0.16 us for an int, measured here).

    The function is the caller's alone: a Packer is not thread-safe. After
    an error it starts afresh, so a refused value leaves nothing behind.
    """
    pack = msgpack.Packer(**_packer_kwargs).pack

    def encode_one(value: Any, what: str = "value") -> bytes:
        try:
            packed: bytes = pack(value)
        except Exception as exc:  # as in encode
            raise _refused(value, what, exc) from exc
        _check(packed, what)
        return packed

    return encode_one


def _check(packed: bytes, what: str) -> None:
    """Refuse data which packs but could never be read back (non-string map
    keys, which strict_map_key refuses; an aware datetime whose UTC time is
    outside years 1 to 9999) by decoding it once, as ``decode`` does.
    Extension types are left packed here: no application decoder runs."""
    try:
        msgpack.unpackb(packed, raw=False, strict_map_key=True, timestamp=3)
    except OverflowError as exc:  # the only one: a timestamp out of datetime's range
        raise SerializationError(
            f"{what} is not msgpack-encodable: it has a datetime outside years 1 to 9999 "
            f"in UTC, which could not be read back ({exc})") from exc
    except (TypeError, ValueError) as exc:
        reason = str(exc)
        if "map key" in reason:  # msgpack: "int is not allowed for map key when ..."
            read = msgpack.unpackb(packed, raw=False, strict_map_key=False, use_list=False)
            reason = (f"a dict has the key {_bad_key(read)!r}; keys must be str or bytes "
                      "(convert them, e.g. {str(k): v for k, v in d.items()})")
        raise SerializationError(f"{what} is not msgpack-encodable: {reason}") from exc


def _bad_key(value: Any) -> Any:
    """The first map key in ``value`` (as read back) that is not str or bytes."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key in item:
                if not isinstance(key, (str, bytes)):
                    return key
            stack.extend(item.values())
        elif isinstance(item, tuple):  # arrays, read back as tuples
            stack.extend(item)
    return None


def decode(data: bytes | None, what: str = "value") -> Any:
    """Decode msgpack bytes (``None`` stays ``None``).

    Raises:
        SerializationError: the bytes are not valid msgpack, or hold an
            extension type not registered here.
    """
    if data is None:
        return None
    try:
        return msgpack.unpackb(
            data, raw=False, strict_map_key=True, timestamp=3, ext_hook=_ext_hook
        )
    except Exception as exc:  # msgpack raises several unrelated types
        raise SerializationError(
            f"{what} could not be decoded ({len(data)} bytes): {exc}"
        ) from exc
