"""F1, F1b, F1c, F2: workers that die or freeze in the middle of a job.

Workers are real child processes (tests/faults/fault_worker.py) with a 1 s
lock and a 0.5 s stalled check; a ledger outside the queue's keys records
every attempt, and :func:`check_delivery` checks every added job.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from jobq import Event, JobFailedError, Queue, QueueEvents, Worker
from tests.faults.harness import (
    INTERVAL,
    LOCK,
    RECOVERY_BOUND,
    WAIT,
    Ledger,
    Proc,
    check_delivery,
    summary,
)

pytestmark = pytest.mark.fault


def _recorder(events: QueueEvents, *names: str) -> tuple[list[Event], threading.Event]:
    """Collect events of ``names``; the Event is set on each ``completed``/``failed``."""
    seen: list[Event] = []
    finished = threading.Event()

    def on_event(event: Event) -> None:
        if event.name in names:
            seen.append(event)
        if event.name in ("completed", "failed"):
            finished.set()

    events.on_all_events(on_event)
    return seen, finished


def test_f1_sigkill_mid_job_reruns_once(
    queue_name: str, redis_url: str, spawn: Callable[..., Proc], ledger: Ledger,
    figure: Callable[[str], None],
) -> None:
    with Queue(queue_name, connection=redis_url) as q, \
            QueueEvents(queue_name, connection=redis_url) as events:
        seen, finished = _recorder(events, "stalled")
        assert events.wait_until_ready(WAIT)
        a = spawn()
        job = q.add("work", {"sleep": 3})
        first = ledger.wait_for(lambda r: r.kind == "start" and r.job == job.id)
        assert first.pid == a.pid
        b = spawn()
        os.kill(a.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        assert job.wait_until_finished(events, timeout=WAIT) == job.id
        assert finished.wait(WAIT)
        starts = ledger.rows("start", job.id)
        assert [r.pid for r in starts] == [a.pid, b.pid]
        assert [r.pid for r in ledger.rows("done", job.id)] == [b.pid]
        latency = starts[1].t - killed_at
        assert latency <= RECOVERY_BOUND, latency
        assert [e.job_id for e in seen] == [job.id]  # `stalled` once
        assert q.get_job(job.id).stalled_counter == 1  # type: ignore[union-attr]
        report = check_delivery(q, [job.id], ledger)
        assert not report.problems, report.problems
        figure(f"F1 recovery latency {latency * 1000:.0f} ms (bound {RECOVERY_BOUND} s)")


@pytest.mark.slow
def test_f1_recovery_latency_over_20_runs(
    queue_name: str, redis_url: str, spawn: Callable[..., Proc], ledger: Ledger,
    figure: Callable[[str], None],
) -> None:
    latencies: list[float] = []
    ids: list[str] = []
    with Queue(queue_name, connection=redis_url) as q:
        procs = {p.pid: p for p in (spawn(), spawn())}
        for _ in range(20):
            job = q.add("work", {"sleep": 5})
            ids.append(job.id)
            first = ledger.wait_for(lambda r, j=job.id: r.kind == "start" and r.job == j)
            os.kill(first.pid, signal.SIGKILL)
            killed_at = time.monotonic()
            procs.pop(first.pid).popen.wait(WAIT)
            second = ledger.wait_for(
                lambda r, j=job.id, p=first.pid: r.kind == "start" and r.job == j and r.pid != p
            )
            latencies.append(second.t - killed_at)
            assert job.wait_until_finished(timeout=WAIT) == job.id
            replacement = spawn()
            procs[replacement.pid] = replacement
        report = check_delivery(q, ids, ledger)
        assert not report.problems, report.problems
        assert report.duplicates == 20 and report.stalled == 20
    assert max(latencies) <= RECOVERY_BOUND, latencies
    figure(f"F1 recovery latency over 20 runs: {summary(latencies)}")


def test_f1b_stalled_past_limit_fails(
    queue_name: str, redis_url: str, spawn: Callable[..., Proc], ledger: Ledger,
) -> None:
    with Queue(queue_name, connection=redis_url) as q:
        a = spawn(max_stalled=0)
        job = q.add("work", {"sleep": 3})
        ledger.wait_for(lambda r: r.kind == "start" and r.job == job.id)
        spawn(max_stalled=0)
        os.kill(a.pid, signal.SIGKILL)
        with pytest.raises(JobFailedError) as failure:
            job.wait_until_finished(timeout=WAIT)
        assert failure.value.failed_reason == "job stalled more than allowable limit"
        assert len(ledger.rows("start", job.id)) == 1
        assert q.get_job_state(job.id) == "failed"


def test_f1c_thousands_stalled_at_once_recovered_in_batches(
    queue_name: str, redis_url: str, figure: Callable[[str], None]
) -> None:
    """8,000 jobs taken by a 'worker' that died at once (their 1 ms locks lapse):
    one stalled check round recovers them all, in batches of at most 1,000."""
    n = 8000
    with Queue(queue_name, connection=redis_url) as q:
        ids = [j.id for j in q.add_bulk({"name": "work", "data": i} for i in range(n))]
        context = q._context  # the real moveToActive script, as a dying worker runs it
        pipe = context.client.pipeline(transaction=False)
        for i in range(n):
            context.scripts.run("moveToActive", context.keys.base, f"dead-{i}", 1, "dead", 0, 0,
                                client=pipe)
        taken = pipe.execute()
        assert sum(1 for reply in taken if reply[0] == 1) == n
        assert q.get_job_counts("active")["active"] == n
        done = threading.Event()
        completed = [0]
        lock = threading.Lock()

        def count(job: Any, result: Any) -> None:
            with lock:
                completed[0] += 1
                if completed[0] == n:
                    done.set()

        started = time.monotonic()
        worker = Worker(queue_name, lambda job: job.data, connection=redis_url, concurrency=8,
                        lock_duration=LOCK, stalled_interval=INTERVAL)
        worker.on("completed", count)
        with worker:
            recovered_at = None
            while recovered_at is None and time.monotonic() - started < 60:
                # polling the server is the only way to see the check's effect
                if q.get_job_counts("active")["active"] <= 8:
                    recovered_at = time.monotonic()
                else:
                    threading.Event().wait(0.01)
            assert recovered_at is not None
            assert done.wait(120), completed
        stalled = [q.get_job(i).stalled_counter for i in ids[:: n // 20]]  # type: ignore[union-attr]
        assert set(stalled) == {1}
        assert q.get_job_counts("completed")["completed"] == n
    figure(
        f"F1c {n} stalled jobs moved back in {(recovered_at - started) * 1000:.0f} ms "
        f"(incl. worker start); all completed in {time.monotonic() - started:.1f} s"
    )


def test_f2_zombie_worker_result_rejected(
    queue_name: str, redis_url: str, spawn: Callable[..., Proc], ledger: Ledger,
    figure: Callable[[str], None],
) -> None:
    with Queue(queue_name, connection=redis_url) as q:
        a = spawn()
        job = q.add("work", {"sleep": 3})
        ledger.wait_for(lambda r: r.kind == "start" and r.job == job.id)
        b = spawn()
        os.kill(a.pid, signal.SIGSTOP)
        try:
            # B re-runs the job and completes it while A is frozen
            assert job.wait_until_finished(timeout=WAIT) == job.id
            ledger.wait_for(lambda r: r.kind == "final" and r.pid == b.pid)
        finally:
            os.kill(a.pid, signal.SIGCONT)
        # A wakes, finishes its handler and is told its lock is gone
        ledger.wait_for(lambda r: r.kind == "done" and r.pid == a.pid)
        lost = ledger.wait_for(lambda r: r.kind == "error" and r.pid == a.pid
                               and r.fields[1] == "LockLostError")
        assert job.id in lost.fields[2]
        assert q.get_job_result(job.id) == job.id
        starts = ledger.rows("start", job.id)
        assert [r.pid for r in starts] == [a.pid, b.pid]
        finals = ledger.rows("final", job.id)
        assert [(r.pid, r.fields[2]) for r in finals] == [(b.pid, "completed")]
        # A is alive and still works: stop B and give A a job
        b.stop()
        assert a.popen.poll() is None
        second = q.add("work", {"value": "second"})
        assert second.wait_until_finished(timeout=WAIT) == "second"
        assert ledger.rows("start", second.id)[0].pid == a.pid
        report = check_delivery(q, [job.id, second.id], ledger)
        assert not report.problems, report.problems
        figure(f"F2 duplicate executions: {report.duplicates} (expected 1)")
