"""Processors for the ``jobq worker`` tests (loaded as ``tests.cli_tasks:...``).

``gated`` reports ``start|<job id>`` on the ledger ``ledger:{<queue>}``, then
waits (up to 20 s) for an item on ``ledger:{<queue>}:go`` before returning.
"""

from __future__ import annotations

import os

import redis

from jobq import Job, UnrecoverableError


def _plain(url: str) -> str:
    return url.replace("redis+cluster://", "redis://", 1)


def double(job: Job) -> object:
    """Return twice the data; data "fail" fails the job for good."""
    if job.data == "fail":
        raise UnrecoverableError("asked to fail")
    return job.data * 2


def gated(job: Job) -> str:
    """Report the start, then wait for a go before returning "done"."""
    with redis.Redis.from_url(_plain(os.environ["JOBQ_REDIS_URL"]), socket_timeout=30) as client:
        client.rpush(f"ledger:{{{job.queue_name}}}", f"start|{job.id}")
        if client.blpop([f"ledger:{{{job.queue_name}}}:go"], timeout=20) is None:
            return "no go"
    return "done"


ROUTES = {"double": double, "gated": gated}
NOT_CALLABLE = 42
