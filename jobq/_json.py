"""Strict JSON of whatever jobq shows (the CLI's JSON output, the
dashboard's pages and downloads): job data, results and progress may hold
what JSON cannot (NaN, bytes, keys that are not strings, sets)."""

from __future__ import annotations

import datetime
import json
import math
import re
from collections.abc import Mapping
from typing import Any


def dumps(value: Any, *, indent: int | None = None, sort_keys: bool = False) -> str:
    """``value`` as strict JSON (any parser reads it): a non-finite float
    as a string spelled as JavaScript does (``"NaN"``, ``"Infinity"``),
    bytes decoded (invalid UTF-8 replaced), every key a string (as ``json``
    turns a number into one), a datetime in ISO 8601, a dataclass as the
    object of its fields, a tuple or set as an array, anything else by its
    repr."""
    try:
        return json.dumps(jsonable(value), indent=indent, ensure_ascii=False,
                          sort_keys=sort_keys, allow_nan=False)
    except RecursionError:  # nested deeper than the interpreter recurses
        return json.dumps("(nested too deeply to show)")


def jsonable(value: Any) -> Any:
    """``value`` made of what strict JSON holds (see ``dumps``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if value is None or isinstance(value, (str, int, float)):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (datetime.date, datetime.time)):  # a datetime too
        return value.isoformat()
    if isinstance(value, Mapping):
        return {_key(k): jsonable(v) for k, v in value.items()}
    if hasattr(value, "__dataclass_fields__"):
        return {name: jsonable(getattr(value, name)) for name in value.__dataclass_fields__}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(item) for item in value]
    return repr(value)


def _key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, (int, float)):  # 1 -> "1", True -> "true"
        return json.dumps(jsonable(key)).strip('"')
    converted = jsonable(key)
    return converted if isinstance(converted, str) else json.dumps(converted)


#: Characters that drive a terminal or a log rather than show: C0 and C1
#: controls (ESC starts colour, title and screen sequences), DEL, and the
#: bidirectional overrides that make text read in another order.
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_CONTROLS_BUT_LINES = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str, lines: bool = False) -> str:
    """``text`` as a terminal or a log line may show it: each control
    character written as its escape (``\\x1b``); ``lines`` keeps newlines
    and tabs (a stack trace)."""
    pattern = _CONTROLS_BUT_LINES if lines else _CONTROLS
    return pattern.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)
