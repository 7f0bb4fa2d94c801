"""msgpack encoding of payloads, results and event fields."""

from __future__ import annotations

from typing import Any

import msgpack

from .errors import SerializationError

_packer_kwargs: dict[str, Any] = {"use_bin_type": True, "datetime": False}


def encode(value: Any, what: str = "value") -> bytes:
    """Encode ``value`` with msgpack, refusing what would not round-trip.

    Raises:
        SerializationError: the value (or a map key in it) is not msgpack data.
    """
    try:
        packed: bytes = msgpack.packb(value, **_packer_kwargs)
    except (TypeError, ValueError, OverflowError) as exc:
        raise SerializationError(f"{what} is not msgpack-encodable: {exc}") from exc
    # Round-trip once so that data which packs but could never be read back
    # (non-string map keys, which strict_map_key refuses) is refused up front.
    try:
        msgpack.unpackb(packed, raw=False, strict_map_key=True)
    except (TypeError, ValueError) as exc:
        raise SerializationError(f"{what} is not msgpack-encodable: {exc}") from exc
    return packed


def decode(data: bytes | None, what: str = "value") -> Any:
    """Decode msgpack bytes (``None`` stays ``None``).

    Raises:
        SerializationError: the bytes are not valid msgpack.
    """
    if data is None:
        return None
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise SerializationError(
            f"{what} could not be decoded ({len(data)} bytes): {exc}"
        ) from exc
