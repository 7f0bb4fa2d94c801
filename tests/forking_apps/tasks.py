"""What the worker process runs for the forking-server apps."""

from __future__ import annotations

from jobq import Job


def add(job: Job) -> int:
    """Add two numbers."""
    return int(job.data["a"]) + int(job.data["b"])
