"""A sharded queue: one logical queue over several sub-queues (shards), each
in its own cluster slot, for a queue that outgrows one Redis node.

- ``ShardedQueue(name, shards=N)`` stores the count with the queue; a plain
  ``Worker(name, ...)`` finds it and takes from every shard, in turn;
- a custom job id always lands on the same shard (idempotent adds work);
- counts are summed, ``shard_counts()`` gives the detail.

The same code runs on one server (shards are then just keys) and on a
cluster (``connection="redis+cluster://host:port"``).

Run it with ``python examples/sharded.py``; it uses ``$JOBQ_REDIS_URL`` when
set, else starts a private server.
"""

# ci: run

from __future__ import annotations

import os

from jobq import Job, ShardedQueue, Worker
from jobq.testing import embedded_url


def send(job: Job) -> str:
    """Pretend to send a mail."""
    return f"sent to {job.data['to']}"


def main() -> int:
    """Fill a queue of 4 shards, drain it with one worker, show the counts."""
    with embedded_url() as url:
        name = f"mail-{os.getpid()}"
        with ShardedQueue(name, shards=4, connection=url) as queue:
            jobs = queue.add_bulk(
                {"name": "send", "data": {"to": f"user{i}@example.com"}} for i in range(20)
            )
            first = queue.add("send", {"to": "vip@example.com"}, job_id="welcome-vip")
            again = queue.add("send", {"to": "vip@example.com"}, job_id="welcome-vip")
            print("idempotent add returns the same job:", again.id == first.id)
            print("waiting per shard:", [c["waiting"] for c in queue.shard_counts("waiting")])
            with Worker(name, send, connection=url, concurrency=4):
                print(first.wait_until_finished(timeout=10))
                for job in jobs:
                    job.wait_until_finished(timeout=10)
            print("completed in all:", queue.get_job_counts("completed")["completed"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
