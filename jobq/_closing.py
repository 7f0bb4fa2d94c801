"""What the public objects that own a queue context share."""

from __future__ import annotations

from types import TracebackType
from typing import Any, TypeVar

from ._context import QueueContext

_T = TypeVar("_T", bound="ClosedOnExit")


def not_picklable(obj: object) -> TypeError:
    """The error of pickling a jobq object: it holds connections and threads."""
    return TypeError(
        f"a jobq {type(obj).__name__} cannot be pickled (it holds connections and "
        "threads): pass names and ids to the other process instead (a job's queue "
        "name and id, and there Queue(name).get_job(id))"
    )


class ClosedOnExit:
    """``with obj:`` closes it when the block ends."""

    def close(self) -> None:
        raise NotImplementedError

    def __reduce__(self) -> Any:
        raise not_picklable(self)

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
