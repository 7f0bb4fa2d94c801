"""What the public objects that own a queue context share."""

from __future__ import annotations

from types import TracebackType
from typing import Any, TypeVar

from ._context import QueueContext

_T = TypeVar("_T", bound="ClosedOnExit")


class ClosedOnExit:
    """``with obj:`` closes it when the block ends."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _T) -> _T:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class OfQueue:
    """The queue a ``Queue`` or ``ShardedQueue`` stands for."""

    _context: QueueContext

    @property
    def name(self) -> str:
        """The queue's name."""
        return self._context.name

    @property
    def prefix(self) -> str:
        """The key prefix of the queue."""
        return self._context.prefix

    @property
    def client(self) -> Any:
        """The Redis client this queue uses."""
        return self._context.client
