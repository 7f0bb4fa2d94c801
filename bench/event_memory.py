"""Memory per retained event: what a queue's event stream costs the server.

    .venv/bin/python bench/event_memory.py [N]    # N jobs per case, default 2000

Starts a private server (jobq.testing), runs N jobs through a worker for each
case, and prints, per job, the stream's MEMORY USAGE and INFO used_memory
growth, divided by the number of events the stream holds, and the result keys
kept apart (see complete.lua). A job writes about 4 events (added, waiting,
active, completed). Cases: small results (10 bytes); results just under
and just over the 1 KiB a `completed` event carries itself (INLINE_RESULT in
complete.lua; 1,000 and 1,100 characters), 16,000-byte results (which the
events carried up to 0.2.x's 16 KiB limit), and 100 KB results, of jobs
removed on completion (a result over the limit is kept under result:<run>
for result_ttl, not in the stream). The last column scales the stream's
bytes per event to the default max_events (10,000).
"""

from __future__ import annotations

import os
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jobq import Job, Queue, Worker  # noqa: E402
from jobq.queue import DEFAULT_MAX_EVENTS  # noqa: E402
from jobq.testing import RedisServer, find_server_binary  # noqa: E402


def run_case(url: str, client: object, n: int, size: int, remove: bool) -> None:
    name = f"mem-{uuid.uuid4().hex[:8]}"
    result = "r" * size

    def handler(job: Job) -> str:
        return result

    before = client.info("memory")["used_memory"]  # type: ignore[attr-defined]
    with Queue(name, connection=url, max_events=1_000_000) as queue:
        with Worker(name, handler, connection=url, concurrency=8):
            jobs = queue.add_bulk(
                [{"name": "x", "remove_on_complete": remove} for _ in range(n)]
            )
            for job in jobs:
                job.wait_until_finished(timeout=60)
        stream = f"jobq:{{{name}}}:events"
        events = client.xlen(stream)  # type: ignore[attr-defined]
        stream_bytes = client.memory_usage(stream, samples=0)  # type: ignore[attr-defined]
        kept = client.keys(f"jobq:{{{name}}}:result:*")  # type: ignore[attr-defined]
        kept_bytes = sum(client.memory_usage(k) or 0 for k in kept)  # type: ignore[attr-defined]
        after = client.info("memory")["used_memory"]  # type: ignore[attr-defined]
        print(
            f"{n} jobs, result {size} B, remove_on_complete={remove}: {events} events; "
            f"stream {stream_bytes / events:.0f} B/event ({stream_bytes / 1e6:.2f} MB); "
            f"used_memory +{(after - before) / 1e6:.2f} MB; "
            f"{len(kept)} kept results, {kept_bytes / 1e6:.2f} MB (expire after result_ttl); "
            f"at max_events={DEFAULT_MAX_EVENTS:,}: "
            f"{stream_bytes / events * DEFAULT_MAX_EVENTS / 1e6:.1f} MB of stream"
        )
        queue.obliterate(force=True)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    with RedisServer(find_server_binary()) as server:
        client = server.client()
        run_case(server.url, client, n, 10, False)
        run_case(server.url, client, n, 10, True)
        run_case(server.url, client, n, 1_000, True)  # just under the inline limit
        run_case(server.url, client, n, 1_100, True)  # just over: kept apart
        run_case(server.url, client, n // 2, 16_000, True)
        run_case(server.url, client, n // 10, 100_000, True)
        client.close()


if __name__ == "__main__":
    main()
