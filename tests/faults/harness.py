"""The fault suite's harness: worker processes, the ledger and the checker.

See FAULTS.md §3.1. A *ledger* (rows written by tests/faults/fault_worker.py
to a list outside the queue's keys) records every attempt's start and end and
every finalisation; :func:`check_delivery` then proves, for every id ``add``
returned, that nothing was lost and nothing was finalised twice.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from jobq import Queue
from tests.faults.fault_worker import ledger_key, notify_key

ROOT = Path(__file__).resolve().parents[2]
LOCK = 1.0
INTERVAL = 0.5
#: Longest time a dead worker's job may wait before another worker starts it.
RECOVERY_BOUND = LOCK + 2 * INTERVAL + 0.5
#: Bound for waits that should end much sooner.
WAIT = 15.0


@dataclass(frozen=True)
class Row:
    """One ledger row."""

    kind: str
    fields: tuple[str, ...]

    @property
    def job(self) -> str:
        return self.fields[0]

    @property
    def pid(self) -> int:
        return int(self.fields[0] if self.kind in ("ready", "error") else self.fields[1])

    @property
    def t(self) -> float:
        return float(self.fields[-1])

    @classmethod
    def parse(cls, raw: bytes) -> Row:
        kind, *rest = raw.decode().split("|")
        return cls(kind, tuple(rest))


class Ledger:
    """Reads the rows the worker processes of one queue write."""

    def __init__(self, client: redis.Redis, queue: str) -> None:
        self.client = client
        self.queue = queue
        self.key = ledger_key(queue)
        self._notify = notify_key(queue)
        self._seen: list[Row] = []

    def rows(self, kind: str | None = None, job: str | None = None) -> list[Row]:
        """Every row written so far (of a kind, of a job)."""
        self._seen = [Row.parse(r) for r in self.client.lrange(self.key, 0, -1)]
        return [
            r for r in self._seen
            if (kind is None or r.kind == kind)
            and (job is None or (r.kind not in ("ready", "error") and r.job == job))
        ]

    def wait_for(self, predicate: Callable[[Row], bool], timeout: float = WAIT) -> Row:
        """Block until a row of the whole ledger matches; return the first one."""
        return self.wait_count(predicate, 1, timeout)[0]

    def wait_count(self, predicate: Callable[[Row], bool], count: int,
                   timeout: float = WAIT) -> list[Row]:
        """Block until ``count`` rows in the whole ledger match."""
        deadline = time.monotonic() + timeout
        while True:
            matching = [r for r in self.rows() if predicate(r)]
            if len(matching) >= count:
                return matching
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"{len(matching)} of {count} ledger rows within {timeout} s"
                )
            if self.client.blpop([self._notify], timeout=max(0.01, min(left, 1.0))):
                self.client.delete(self._notify)  # one wake-up for all rows written so far

    def clear(self) -> None:
        self.client.delete(self.key, self._notify)


class Proc:
    """A fault_worker child process; ``stop()`` kills and reaps it."""

    def __init__(self, url: str, ledger_url: str, queue: str, log: Path, **options: Any) -> None:
        args = [sys.executable, "-m", "tests.faults.fault_worker", url, ledger_url, queue]
        for key, value in options.items():
            args += [f"--{key.replace('_', '-')}", str(value)]
        self.log = log
        self._out = log.open("wb")
        self.popen = subprocess.Popen(args, cwd=ROOT, stdout=self._out, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        self._out.flush()
        return self.log.read_text(errors="replace")

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (graceful), then SIGKILL; always reaps."""
        try:
            if self.popen.poll() is None:
                self.popen.send_signal(18)  # SIGCONT: a stopped process ignores SIGTERM
                self.popen.terminate()
                try:
                    self.popen.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.popen.kill()
                    self.popen.wait(timeout)
        finally:
            self._out.close()


@dataclass
class Report:
    """What the checker found, for the figures of a scenario."""

    jobs: int = 0
    starts: int = 0
    duplicates: int = 0  # attempts beyond the first
    stalled: int = 0
    problems: list[str] = field(default_factory=list)


def check_delivery(queue: Queue, ids: Iterable[str], ledger: Ledger, *,
                   stalled_exact: bool = True) -> Report:
    """Check the delivery contract for every id ``add`` returned.

    - the job is terminal (completed or failed) exactly once: its final
      ledger rows hold one ``completed`` (or, if it failed, no completion);
    - it was started at least once, and every re-run is accounted for by a
      stall: ``starts - 1 <= stalled_counter``, with equality when
      ``stalled_exact`` (a crash may lose the reply of a take, and the job
      then stalls without having started);
    - no job is left in ``active``.
    """
    report = Report()
    ids = list(ids)
    # a waiter may wake before the worker's `completed` listener wrote its row
    completed = {
        j for j in ids
        if queue.get_job_state(j) == "completed"
    }
    if completed:
        try:
            ledger.wait_count(lambda r: r.kind == "final" and r.job in completed,
                              len(completed), timeout=5)
        except AssertionError:
            pass  # reported below, job by job
    rows = ledger.rows()
    starts: dict[str, int] = {}
    finals: dict[str, list[str]] = {}
    for row in rows:
        if row.kind == "start":
            starts[row.job] = starts.get(row.job, 0) + 1
        elif row.kind == "final":
            finals.setdefault(row.job, []).append(row.fields[2])
    for job_id in ids:
        report.jobs += 1
        job = queue.get_job(job_id)
        if job is None:
            report.problems.append(f"{job_id}: lost (no record)")
            continue
        state = job.get_state()
        n = starts.get(job_id, 0)
        report.starts += n
        report.duplicates += max(0, n - 1)
        report.stalled += job.stalled_counter
        if state not in ("completed", "failed"):
            report.problems.append(f"{job_id}: not terminal ({state})")
        if n < 1 and state == "completed":
            report.problems.append(f"{job_id}: completed but never started in the ledger")
        completions = finals.get(job_id, []).count("completed")
        if completions > 1:
            report.problems.append(f"{job_id}: finalised {completions} times")
        if state == "completed" and completions != 1:
            report.problems.append(f"{job_id}: completed but {completions} completions recorded")
        if n >= 1 and (n - 1 > job.stalled_counter
                       or (stalled_exact and n - 1 != job.stalled_counter)):
            report.problems.append(
                f"{job_id}: {n} starts but stalled_counter={job.stalled_counter}"
            )
    active = queue.get_job_counts("active")["active"]
    if active:
        report.problems.append(f"{active} job(s) still active")
    return report


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile (0..100) of values, nearest rank."""
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def summary(values: list[float]) -> str:
    """p50 / p99 / max of durations in seconds, as milliseconds."""
    if not values:
        return "n/a"
    return (
        f"p50 {statistics.median(values) * 1000:.1f} ms, p99 {percentile(values, 99) * 1000:.1f}"
        f" ms, max {max(values) * 1000:.1f} ms (n={len(values)})"
    )
