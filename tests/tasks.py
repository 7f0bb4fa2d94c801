"""Small job handlers that command-line tests import by ``MODULE:CALLABLE``."""

from __future__ import annotations

from typing import Any

from jobq import Job


def double(job: Job) -> Any:
    """Return twice the job's data."""
    return job.data * 2
