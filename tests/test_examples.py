"""Run the examples: every examples/*.py marked ``# ci: run`` (the Flask app
under gunicorn: tests/test_flask_ext.py; the Django project: tests/test_django_app.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
RUNNABLE = sorted(
    path for path in EXAMPLES.glob("*.py")
    if any(line.strip() == "# ci: run" for line in path.read_text().splitlines())
)


def test_the_examples_are_found() -> None:
    names = {path.name for path in RUNNABLE}
    assert {"quickstart.py", "flask_app.py", "cron_batch.py", "event_tail.py",
            "listeners.py", "schedulers.py", "dedup.py", "cancel.py", "tracing.py",
            "sharded.py"} <= names


@pytest.mark.parametrize("script", RUNNABLE, ids=[p.name for p in RUNNABLE])
def test_example_runs(script: Path, redis_url: str) -> None:
    env = dict(os.environ, JOBQ_REDIS_URL=redis_url)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(EXAMPLES.parent), *filter(None, [env.get("PYTHONPATH")])]
    )
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert done.stdout.strip(), "the example printed nothing"
