"""Deduplication and debounce: adds that collapse into one job.

- simple: while the first job with a key is not finished, adds with the key
  return it (a `deduplicated` event each);
- debounce (``replace=True`` with a delay): each add replaces the data of the
  still-delayed job and restarts its delay, so only the last one runs.

Run it with ``python examples/dedup.py``; it uses ``$JOBQ_REDIS_URL`` when
set, else starts a private server.
"""

# ci: run

from __future__ import annotations

import os

from jobq import Job, Queue, Worker
from jobq.testing import embedded_url


def save(job: Job) -> object:
    """Pretend to save a document."""
    return job.data


def main() -> int:
    """Show both modes and return the exit code."""
    autosaved: list[object] = []

    def recording_save(job: Job) -> object:
        if job.name == "autosave":
            autosaved.append(job.data)
        return save(job)

    with embedded_url() as url:
        name = f"dedup-{os.getpid()}"
        with Queue(name, connection=url) as queue:
            first = queue.add("reindex", {"doc": 1}, dedup={"id": "reindex-1"})
            again = queue.add("reindex", {"doc": 1}, dedup={"id": "reindex-1"})
            print(f"simple: both adds return job {first.id}: {again.id == first.id}")

            debounce = {"id": "autosave-7", "ttl": 30, "extend": True, "replace": True}
            ids: set[str] = set()
            for text in ("H", "He", "Hel", "Hello"):
                job = queue.add("autosave", {"text": text}, delay=0.3, dedup=debounce)
                ids.add(job.id)
            print(f"debounce: job {job.id} will save {job.data['text']!r}")
            with Worker(name, recording_save, connection=url):
                result = job.wait_until_finished(timeout=10)
                print("saved:", result)
                first.wait_until_finished(timeout=10)
            released = queue.get_dedup_job_id("reindex-1") is None
            print("key released after completion:", released)
    # one debounced job, run once, with the last data
    debounced = len(ids) == 1 and autosaved == [{"text": "Hello"}] == [result]
    return 0 if again.id == first.id and debounced and released else 1


if __name__ == "__main__":
    raise SystemExit(main())
