"""A Queue's settings: stored with the queue on its first use (event mode,
``max_events``, result TTL), checked against what is stored, and stored
again when the server lost them."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import redis
from redis.cluster import RedisCluster

from ._checks import warn_if_evicting
from ._context import QueueContext
from ._shards import mismatch, shard_opened_plain
from .connection import database, first_use_failed
from .errors import JobqError

logger = logging.getLogger("jobq.queue")

EVENT_MODES = ("stream", "pubsub")
DEFAULT_MAX_EVENTS = 10_000
#: Seconds a result that may outlive its job's record stays readable (a
#: result over 1 KiB of a job with a retention rule; in pub/sub mode, any
#: result of a job removed on completion): see complete.lua.
DEFAULT_RESULT_TTL = 60.0


def _stored_int(value: bytes | None, default: int) -> int:
    """A whole number stored in the queue's settings, or ``default``."""
    return int(value) if value is not None and value.isdigit() else default


class QueueSettings:
    """The settings part of a Queue (see ``Queue.__init__`` for the attributes)."""

    _context: QueueContext
    _settings: tuple[str | None, int | None, float | None]
    _recorded: bool | None  # None: being listed (see record_queue)
    _owner_lost: Callable[[], None] | None
    _marking: bool
    _marked_at: float
    _event_mode: str
    _max_events: int
    _result_ttl: float

    def _first_use(self) -> None:
        client = self._context.client
        try:
            self._setup_meta()
        except redis.exceptions.RedisError as exc:
            error = first_use_failed(exc, client)
            if error is exc:
                raise
            raise error from exc
        warn_if_evicting(client)

    def _settings_lost(self, sent: float) -> None:
        """An add (sent at ``sent``, monotonic) found no mark of stored
        settings: the queue's first add, or the server lost its data (the
        meta key deleted). Store them again with the mark, and list the
        queue again. A shard has its sharded queue do it, for the count and
        every shard. The replies of a burst of adds sent before the mark was
        written store nothing again. (Only an add marks them: a queue only
        read leaves no key.) A failure is left to the next add: this one
        was written."""
        if self._marking or sent < self._marked_at:
            return
        self._marking = True
        try:
            if self._owner_lost is not None:
                self._owner_lost()
            else:
                self._store_settings("c")
                self._recorded = False
        except redis.exceptions.RedisError as exc:  # out of memory, say
            logger.warning("queue %r: storing its settings again failed: %r",
                           self._context.name, exc)
        finally:
            self._marking = False

    def _restores(self) -> str:
        """The event mode an add asks the script to check is stored: the
        queue's when it is pub/sub (given, or followed since first use), so
        that settings stored again after a loss by a Queue that gave none
        (or first used after the loss) leave it in stream mode for no
        longer than this Queue's next add; '' for stream mode."""
        return "pubsub" if getattr(self, "_event_mode", None) == "pubsub" else ""

    def _store_settings(self, writes: str) -> list[bytes | None]:
        """Store this queue's settings (``writes`` as storeSettings.lua's: 'c'
        their mark too; a shard always writes its shard mark) in one script
        call, through the connection the adds share: several queues set up
        at once took a connection of the pool each, past a small pool's
        size. The settings as stored (see ``QueueScripts.store_settings``)."""
        event_mode, max_events, result_ttl = self._settings
        if "c" in writes:  # stored again after a loss: the mode followed too
            event_mode = event_mode or self._restores() or None
        stored = self._context.setup_calls.store_settings(
            event_mode or "", "" if max_events is None else str(max_events),
            "" if result_ttl is None else str(round(result_ttl * 1000)),
            writes + ("s" if self._owner_lost is not None else "")
            + ("p" if isinstance(self._context.client, RedisCluster) else ""),
            database(self._context.client))
        if "c" in writes:
            self._marked_at = time.monotonic()
            if event_mode == "pubsub" and stored[0] != b"pubsub":
                # a Queue of stream mode stored its settings again first
                # (the first mode stored is kept): follow it, rather than
                # asking on every add
                logger.warning("queue %r: another Queue stored stream mode after the server "
                               "lost the queue's settings; events go to the stream",
                               self._context.name)
                self._event_mode = "stream"
        return stored

    def _setup_meta(self) -> None:
        stored_mode, stored_max, stored_ttl, shards, _, shard = self._store_settings("")
        if shards:  # a ShardedQueue's name: its jobs are on its shards
            raise mismatch(self._context.name, int(shards), None)
        if shard and self._owner_lost is None:  # a shard's name, not through its ShardedQueue
            raise shard_opened_plain(self._context.name)
        event_mode = self._settings[0]
        stored = stored_mode.decode() if stored_mode else "stream"
        if event_mode is not None and stored != event_mode:
            raise JobqError(
                f"queue {self._context.name!r} uses event mode {stored!r}, not {event_mode!r}"
            )
        self._event_mode = stored
        # a value that is no whole number (set by hand) counts as unset, as
        # the scripts take it
        self._max_events = _stored_int(stored_max, DEFAULT_MAX_EVENTS)
        self._result_ttl = _stored_int(stored_ttl, round(DEFAULT_RESULT_TTL * 1000)) / 1000.0

    @property
    def event_mode(self) -> str:
        """The queue's event mode, ``"stream"`` or ``"pubsub"`` (read on first use)."""
        self._context.ensure_ready()
        return self._event_mode

    @property
    def max_events(self) -> int:
        """About how many events the stream retains (read on first use)."""
        self._context.ensure_ready()
        return self._max_events

    @property
    def result_ttl(self) -> float:
        """Seconds a result kept apart from its job stays readable (read on first use)."""
        self._context.ensure_ready()
        return self._result_ttl
