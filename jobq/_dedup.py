"""Deduplication keys, read and released by hand (a mixin of Queue).

The keys are written and released by the scripts (add.lua; complete.lua,
fail.lua, remove.lua and cancel.lua through release_dedup): see add.lua's
header for the modes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .keys import lookup_key

if TYPE_CHECKING:
    from ._context import QueueContext


class QueueDedup:
    """Deduplication keys of a queue (a mixin of Queue)."""

    _context: QueueContext

    def get_dedup_job_id(self, key: str) -> str | None:
        """The id of the job that owns dedup key ``key``, or None.

        A simple-mode key whose job finished is released by then; a
        throttle key names its job until its ttl ends.
        """
        owner = self._context.redis.get(self._context.keys.dedup(lookup_key(key, "dedup key")))
        return None if owner is None else owner.decode()

    def remove_dedup_key(self, key: str) -> bool:
        """Release dedup key ``key`` now (the next add with it makes a new
        job); True when it existed."""
        name = self._context.keys.dedup(lookup_key(key, "dedup key"))
        return bool(self._context.redis.delete(name))
