"""The tutorials of README.md, run as written.

A fenced block right after ``<!-- tutorial: NAME ACTION [PATH] -->`` belongs
to tutorial NAME: ``write PATH`` writes it to a file of the tutorial's
directory, ``append PATH`` appends it to one, ``run`` runs it with bash
(``pip install`` lines left out: the test environment has the extras). The
blocks of a tutorial run in order, in a new directory, against the test
server; then the test checks what the workers did.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobq import Queue

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(
    r"<!-- tutorial: (?P<name>[\w-]+) (?P<action>write|append|run)(?: (?P<path>\S+))? -->\n"
    r"```\w*\n(?P<code>.*?)```", re.S,
)


def tutorial_steps(text: str, name: str) -> list[tuple[str, str | None, str]]:
    """(action, path, code) of tutorial ``name``'s marked blocks, in order."""
    return [(m["action"], m["path"], m["code"]) for m in MARKER.finditer(text)
            if m["name"] == name]


def run_tutorial(source: Path, name: str, where: Path, redis_url: str) -> str:
    """Play tutorial ``name`` of ``source`` in ``where``; return the output."""
    steps = tutorial_steps(source.read_text(), name)
    assert steps, f"no tutorial {name!r} in {source}"
    env = dict(os.environ, JOBQ_REDIS_URL=redis_url, PYTHONUNBUFFERED="1",
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    env.pop("DJANGO_SETTINGS_MODULE", None)
    env.pop("PYTHONPATH", None)
    output = []
    for action, path, code in steps:
        if action == "run":
            script = "\n".join(line for line in code.splitlines()
                               if not line.startswith("pip install"))
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=where,
                                  env=env, capture_output=True, text=True, timeout=120,
                                  check=False)
            output.append(done.stdout + done.stderr)
            assert done.returncode == 0, f"{script}\n---\n{done.stdout}\n{done.stderr}"
        else:
            assert path is not None
            target = where / path
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("a" if action == "append" else "w") as out:
                out.write(("\n" if action == "append" else "") + code)
    return "\n".join(output)


@pytest.fixture
def default_queue(redis_url: str) -> Iterator[Queue]:
    """The tutorials' queue ("default", prefix "jobq"), emptied before and after."""
    queue = Queue("default", connection=redis_url)
    queue.obliterate(force=True)
    yield queue
    queue.obliterate(force=True)
    queue.close()


def test_the_readme_django_tutorial(tmp_path: Path, redis_url: str,
                                    default_queue: Queue) -> None:
    out = run_tutorial(ROOT / "README.md", "django", tmp_path, redis_url)
    assert "jobq worker ready on default" in out
    done = {j.return_value for j in default_queue.get_jobs("completed")}
    assert done == {"welcome mail sent to a@example.com", "welcome mail sent to b@example.com"}


def test_the_readme_flask_tutorial(tmp_path: Path, redis_url: str,
                                   default_queue: Queue) -> None:
    out = run_tutorial(ROOT / "README.md", "flask", tmp_path, redis_url)
    assert "{'job': '" in out and "jobq worker ready on default" in out
    [job] = default_queue.get_jobs("completed")
    assert job.return_value == "cat.png resized to 200px"
