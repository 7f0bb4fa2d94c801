"""Create one virtualenv per peer under bench/.venvs/ and install Node BullMQ.

Idempotent: a venv whose requirements did not change since its last
successful install (stamp file) is left alone. Prints one JSON object
{peer: {"ok": bool, "reason": str}} on the last line of stdout.

Usage: python bench/install.py [peer ...]
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
VENVS = BENCH / ".venvs"
NODE_DIR = BENCH / "node"

# Every Python peer gets hiredis too, as jobq does, so parsing costs are equal.
PY_PEERS: dict[str, list[str]] = {
    "rq": ["rq", "hiredis"],
    "celery": ["celery[redis]", "hiredis"],
    "dramatiq": ["dramatiq[redis]", "hiredis"],
    "huey": ["huey", "redis", "hiredis"],
    "bullmq-py": ["bullmq"],
}
# BullMQ 6 made ioredis an optional peer dependency: its default connection
# options need it installed beside it.
NODE_PACKAGES = ["bullmq", "ioredis"]
INSTALL_TIMEOUT = 600


def venv_python(peer: str) -> Path:
    return VENVS / peer / "bin" / "python"


def _run(cmd: list[str], cwd: Path | None = None) -> tuple[bool, str]:
    try:
        proc = subprocess.run(
            cmd, cwd=cwd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        return False, f"timed out after {INSTALL_TIMEOUT}s: {' '.join(cmd)}"
    except OSError as exc:
        return False, f"{exc}"
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return False, f"{' '.join(cmd[:4])} failed: {' | '.join(tail)}"
    return True, ""


def install_python_peer(peer: str) -> tuple[bool, str]:
    reqs = PY_PEERS[peer]
    venv = VENVS / peer
    stamp = venv / ".bench-installed"
    want = "\n".join(reqs)
    if stamp.exists() and stamp.read_text() == want and venv_python(peer).exists():
        return True, "already installed"
    if venv.exists():
        shutil.rmtree(venv)
    ok, err = _run([sys.executable, "-m", "venv", str(venv)])
    if not ok:
        return False, err
    py = str(venv_python(peer))
    ok, err = _run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", *reqs])
    if not ok:
        return False, err
    stamp.write_text(want)
    return True, "installed"


def install_node() -> tuple[bool, str]:
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        return False, "node/npm not found on PATH"
    pkg = NODE_DIR / "package.json"
    if not pkg.exists():
        pkg.write_text(json.dumps({"name": "jobq-bench-node", "private": True,
                                   "type": "commonjs"}, indent=2) + "\n")
    mods = NODE_DIR / "node_modules"
    if all((mods / m / "package.json").exists() for m in NODE_PACKAGES):
        return True, "already installed"
    ok, err = _run([npm, "install", "--no-audit", "--no-fund", "--save", *NODE_PACKAGES],
                   cwd=NODE_DIR)
    return (True, "installed") if ok else (False, err)


def main(argv: list[str]) -> int:
    wanted = argv or [*PY_PEERS, "bullmq-node"]
    VENVS.mkdir(exist_ok=True)
    status: dict[str, dict[str, object]] = {}
    for peer in wanted:
        if peer == "bullmq-node":
            ok, reason = install_node()
        elif peer in PY_PEERS:
            ok, reason = install_python_peer(peer)
        else:
            ok, reason = False, "unknown peer"
        print(f"[install] {peer}: {'ok' if ok else 'FAILED'} {reason}", file=sys.stderr)
        status[peer] = {"ok": ok, "reason": reason}
    print(json.dumps(status))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
