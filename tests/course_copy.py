"""A copy of the repository as a fresh clone has it, and a free loopback port: shared by the
tests that start servers over a course (tests/learner/test_browser.py,
tests/instructor/test_jupyterhub.py). tests/ is on sys.path (tests/conftest.py)."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=test", "-c", "user.email=test@example.org", *args],
                          cwd=cwd, check=True, capture_output=True, text=True).stdout


def checkout_copy(dest: Path) -> Path:
    """The repository as a fresh clone of the working tree would be: every file git tracks
    or would add (not the ignored ones: no .venv, no work/), committed in a new repository."""
    listed = git(ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "course")
    assert git(dest, "status", "--porcelain") == ""
    return dest
