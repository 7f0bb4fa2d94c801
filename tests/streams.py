"""Reading a queue's event stream directly, as tests check what scripts wrote."""

from __future__ import annotations

import redis


def stream_events(client: redis.Redis, queue_name: str) -> list[tuple[str, str, dict[str, bytes]]]:
    """The queue's events as (name, job id, other fields), oldest first: an
    entry carrying two events (the second's fields suffixed ``:2``) gives
    both, in order."""
    out = []
    for _, raw in client.xrange(f"jobq:{{{queue_name}}}:events"):
        fields = {k.decode(): v for k, v in raw.items()}
        second = {k[:-2]: fields.pop(k) for k in [k for k in fields if k.endswith(":2")]}
        jid = fields.pop("jid").decode()
        out.append((fields.pop("ev").decode(), jid, fields))
        if second:
            other = second.pop("jid").decode() if "jid" in second else jid
            out.append((second.pop("ev").decode(), other, second))
    return out
