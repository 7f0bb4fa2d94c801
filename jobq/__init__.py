"""jobq: a Redis-backed job queue for synchronous Python.

Queue adds and administers jobs, Worker runs them in a thread pool,
QueueEvents streams every job's life to listeners, and
``Job.wait_until_finished`` blocks until a job is done.
"""

from ._schedulers import Scheduler
from ._sharded_events import ShardedQueueEvents
from .errors import (
    ClosedError,
    JobCancelledError,
    JobFailedError,
    JobNotFoundError,
    JobqError,
    JobTimeoutError,
    LockLostError,
    PayloadTooLarge,
    RedisOOMError,
    SerializationError,
    UnrecoverableError,
    WaitUntilFinishedTimeoutError,
)
from .events import Event, JobMetrics
from .flow import CrossSlotFlowError, FlowProducer, JobNode
from .job import Dependencies, Job
from .metrics import Metrics
from .options import Backoff, JobOptions, KeepJobs
from .queue import Queue
from .queue_events import QueueEvents
from .registry import WorkerInfo
from .sharding import ShardCountError, ShardedQueue, open_queue
from .tasks import Task, current_job
from .worker import Worker

__version__ = "0.2.0.dev0"

__all__ = [
    "Backoff",
    "ClosedError",
    "CrossSlotFlowError",
    "Dependencies",
    "Event",
    "FlowProducer",
    "Job",
    "JobCancelledError",
    "JobFailedError",
    "JobMetrics",
    "JobNode",
    "JobNotFoundError",
    "JobOptions",
    "JobTimeoutError",
    "JobqError",
    "KeepJobs",
    "LockLostError",
    "Metrics",
    "PayloadTooLarge",
    "Queue",
    "QueueEvents",
    "RedisOOMError",
    "Scheduler",
    "SerializationError",
    "ShardCountError",
    "ShardedQueue",
    "ShardedQueueEvents",
    "Task",
    "UnrecoverableError",
    "WaitUntilFinishedTimeoutError",
    "WorkerInfo",
    "Worker",
    "__version__",
    "current_job",
    "open_queue",
]
