"""A job's place in a flow: the results and states of its children (or of
the jobs it depends on), read from the keys a parent keeps (see keys.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import serializer
from ._closing import not_picklable

if TYPE_CHECKING:
    from ._context import QueueContext


@dataclass(frozen=True)
class Dependencies:
    """A parent's children (or dependencies), each named ``"<queue>:<id>"``."""

    #: completed ones and their results
    processed: dict[str, Any] = field(default_factory=dict)
    #: those not finished yet (failed ones the parent still waits on included)
    pending: list[str] = field(default_factory=list)
    #: failed ones the parent waits on until they are retried or removed (the
    #: default policy and ``fail_parent_on_failure``), and their reasons
    failed: dict[str, str] = field(default_factory=dict)
    #: failed ones counted as done (``ignore_dependency_on_failure``), and their reasons
    ignored: dict[str, str] = field(default_factory=dict)


def _results(raw: dict[bytes, bytes]) -> dict[str, Any]:
    return {k.decode(): serializer.decode(v, f"result of child {k.decode()!r}")
            for k, v in raw.items()}


def _reasons(raw: dict[bytes, bytes]) -> dict[str, str]:
    return {k.decode(): v.decode("utf-8", "replace") for k, v in raw.items()}


class JobFlow:
    """The flow methods of ``Job``."""

    _context: QueueContext
    id: str

    def __reduce__(self) -> Any:
        raise not_picklable(self)

    def get_children_values(self) -> dict[str, Any]:
        """The results of the job's completed children (or dependencies), by
        ``"<queue>:<id>"``; read in a parent's handler. A child's result is
        copied to its parent when it completes, so it is there even when the
        child was removed since."""
        return _results(self._context.redis.hgetall(
            self._context.keys.parent_key("processed", self.id)))

    def get_child_value(self, default: Any = None) -> Any:
        """The result of the job's one completed child (the previous step of
        a chain), else ``default``; with several children, the first by name."""
        values = self.get_children_values()
        return values[min(values)] if values else default

    def get_ignored_children_failures(self) -> dict[str, str]:
        """The failed reasons of children whose failure was ignored
        (``ignore_dependency_on_failure``), by ``"<queue>:<id>"``."""
        return _reasons(self._context.redis.hgetall(
            self._context.keys.parent_key("ignored", self.id)))

    def get_dependencies(self) -> Dependencies:
        """The job's children: processed (with results), pending, failed
        (those it still waits on), ignored (see ``Dependencies``)."""
        keys = self._context.keys
        pipe = self._context.redis.pipeline(transaction=False)
        pipe.hgetall(keys.parent_key("processed", self.id))
        pipe.smembers(keys.parent_key("deps", self.id))
        pipe.hgetall(keys.parent_key("dfailed", self.id))
        pipe.hgetall(keys.parent_key("ignored", self.id))
        processed, pending, failed, ignored = pipe.execute()
        return Dependencies(processed=_results(processed),
                            pending=sorted(m.decode() for m in pending),
                            failed=_reasons(failed), ignored=_reasons(ignored))
