"""Every tutorial marked runnable in docs/ (``<!-- tutorial: NAME ... -->``,
see tests/test_tutorials.py) runs as written. The README's tutorials, which
docs/ includes, run in tests/test_tutorials.py."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobq import Queue
from tests.test_tutorials import run_tutorial

DOCS = Path(__file__).resolve().parent.parent / "docs"
MARKED = sorted(
    {(path, name) for path in DOCS.rglob("*.md")
     for name in re.findall(r"<!-- tutorial: ([\w-]+) ", path.read_text())}
)


def test_the_marked_tutorials_are_found() -> None:
    assert {(p.relative_to(DOCS).as_posix(), n) for p, n in MARKED} >= {
        ("tutorials/cron.md", "cron")}


@pytest.fixture
def reports(redis_url: str) -> Iterator[Queue]:
    queue = Queue("reports", connection=redis_url)
    queue.obliterate(force=True)
    yield queue
    queue.obliterate(force=True)
    queue.close()


@pytest.mark.parametrize(("path", "name"), MARKED,
                         ids=[f"{p.relative_to(DOCS)}:{n}" for p, n in MARKED])
def test_a_docs_tutorial_runs(path: Path, name: str, tmp_path: Path, redis_url: str,
                              reports: Queue) -> None:
    out = run_tutorial(path, name, tmp_path, redis_url)
    if name == "cron":
        assert sorted(j.return_value for j in reports.get_jobs("completed")) == [
            "report for 2026-11-29", "report for 2026-11-30"]
        assert '"queue": "reports"' in out
