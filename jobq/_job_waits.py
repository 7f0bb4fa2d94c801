"""A job's waits: for its end (``wait_until_finished``) or as a Future,
through its queue's shared reader or a QueueEvents of the caller's."""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from .connection import database

if TYPE_CHECKING:
    from ._context import QueueContext
    from .queue_events import QueueEvents


class JobWaits:
    """The waiting part of a Job (see ``Job``)."""

    _context: QueueContext
    id: str
    # the token of the job's run, and whether this process began it and
    # has not waited on it since (see Job.__init__)
    _run: str | None
    _fresh: bool

    def wait_until_finished(
        self, queue_events: QueueEvents | None = None, *, timeout: float | None = None
    ) -> Any:
        """Block until the job is finished; return its return value.

        The Job's attributes stay as last read (``return_value``,
        ``finished_on``, ``attempts_made``...): the wait reads no more than
        it needs; ``refresh()`` then reads the finished record.

        Args:
            queue_events: the reader to wait through; None uses the queue's
                shared ``events``.
            timeout: seconds to wait at most; None (or infinity): no limit.
                0 asks whether the job has finished: its look at the job's
                record (a round trip) may take up to a second past a
                timeout shorter than that.

        Raises:
            JobFailedError: the job failed for good.
            JobNotFoundError: the job does not exist or was removed.
            WaitUntilFinishedTimeoutError: ``timeout`` elapsed first.
            ClosedError: the QueueEvents was closed during the wait.
            ValueError: ``queue_events`` follows another queue (or prefix),
                or ``timeout`` is not None or a number of seconds >= 0.
            redis.exceptions.ConnectionError: the QueueEvents has never
                reached the server (its last attempt failed); the message
                names the server, password hidden.
        """
        events = _events_for(self, queue_events)
        fresh, self._fresh = self._fresh, False
        return events.wait_for(self.id, timeout, self._run, fresh=fresh)

    def as_future(self, queue_events: QueueEvents | None = None) -> Future[Any]:
        """A Future resolved with the job's result (or its failure) by the
        reader. Its ``cancel()`` gives the future up, not the job."""
        events = _events_for(self, queue_events)
        self._fresh = False
        return events.future_for(self.id, self._run)


def _events_for(job: JobWaits, queue_events: QueueEvents | None) -> QueueEvents:
    """The reader a wait on ``job`` goes through: ``queue_events``, else its
    queue's shared one (of a ShardedQueueEvents: the reader of its shard)."""
    context = job._context
    if queue_events is None:
        return context.shared_events()
    if not hasattr(queue_events, "wait_for"):  # a Queue, say: its `events` is the reader
        hint = " (a Queue's reader is its .events)" if hasattr(queue_events, "events") else ""
        if isinstance(queue_events, (int, float)) and not isinstance(queue_events, bool):
            hint = f" (the timeout is a keyword: timeout={queue_events!r})"
        raise TypeError(f"queue_events must be a QueueEvents or None, not "
                        f"{type(queue_events).__name__}{hint}")
    reader_for = getattr(queue_events, "reader_for", None)
    if reader_for is not None:  # a ShardedQueueEvents: the reader of the job's shard
        queue_events = reader_for(job.id)
    if (queue_events.name, queue_events.prefix) != (context.name, context.prefix):
        # ids are per queue: another queue's reader would answer for its own job
        raise ValueError(
            f"job {job.id!r} of queue {context.name!r} (prefix "
            f"{context.prefix!r}) cannot be waited for through the QueueEvents of "
            f"queue {queue_events.name!r} (prefix {queue_events.prefix!r})"
        )
    mine, theirs = database(context.client), database(queue_events._context.client)
    if mine != theirs:  # and per database
        raise ValueError(
            f"job {job.id!r} of database {mine} cannot be waited for through a "
            f"QueueEvents of database {theirs}"
        )
    return queue_events
