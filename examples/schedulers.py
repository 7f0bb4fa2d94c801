"""Job schedulers: a job every half second, and a cron job in Berlin time.

No beat process: each scheduler's next run is a delayed job, produced when
the previous one is taken (and by the workers' periodic check). Run it with
``python examples/schedulers.py``; it uses ``$JOBQ_REDIS_URL`` when set,
else starts a private server.
"""

# ci: run

from __future__ import annotations

import os
import threading
from datetime import datetime, timezone

from jobq import Job, Queue, Worker
from jobq.testing import embedded_url


def main() -> int:
    """Run three ticks of a scheduler, show a cron one, and clean up."""
    ticks: list[str] = []
    three = threading.Event()

    def heartbeat(job: Job) -> None:
        ticks.append(job.id)
        print(f"tick {len(ticks)}: job {job.id} data={job.data}")
        if len(ticks) == 3:
            three.set()

    with embedded_url() as url:
        name = f"schedulers-{os.getpid()}"
        with Worker(name, heartbeat, connection=url), Queue(name, connection=url) as queue:
            queue.upsert_scheduler("heartbeat", every=0.5, data={"ping": True})
            nightly = queue.upsert_scheduler(
                "nightly-report", cron="30 2 * * *", tz="Europe/Berlin", name="report",
            )
            assert nightly.next_run is not None
            when = datetime.fromtimestamp(nightly.next_run, timezone.utc)
            print(f"nightly-report next runs at {when:%Y-%m-%d %H:%M} UTC (02:30 in Berlin)")
            if not three.wait(10):
                print("the scheduler did not tick three times")
                return 1
            for s in queue.get_schedulers():
                print(f"scheduler {s.id}: {s.count} job(s) so far")
            queue.remove_scheduler("heartbeat")
            queue.remove_scheduler("nightly-report")
            queue.obliterate(force=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
