"""`make.py check` through its warm per-user daemon (coursetools/learner/checkd.py).

The learner's command is run as they run it; the first check is cold and starts the
daemon, later ones are answered by it and print the same report. The daemon stops by itself
when idle, and nobody but its user can reach it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from coursetools import layout
from coursetools.learner import checkd
from tests.learner.test_selfcheck import write_variant


def _env(runtime, **extra):
    env = dict(os.environ, XDG_RUNTIME_DIR=str(runtime), COURSE_CHECK_DAEMON="1", **extra)
    return env


def _make_check(path, env, *args):
    return subprocess.run([sys.executable, "make.py", "check", str(path), "--as-given", *args],
                          cwd=layout.ROOT, env=env, capture_output=True, text=True, timeout=400)


def _report(out: str) -> str:
    """The report without its timing, and without make.py's echo of the command."""
    lines = [line for line in out.splitlines() if not line.startswith("+ ")]
    return re.sub(r"\(\d+\.\d s\)", "(T s)", "\n".join(lines))


def _wait_for(predicate, attempts=600, pause=0.5):
    for _ in range(attempts):  # bounded: 5 minutes at most
        if predicate():
            return True
        time.sleep(pause)
    return False


@pytest.fixture
def runtime(monkeypatch):
    # Short, as XDG_RUNTIME_DIR is (/run/user/UID): a socket's path holds 108 bytes at most.
    folder = Path(tempfile.mkdtemp(prefix="xdg-", dir="/tmp"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(folder))
    yield folder
    checkd.stop()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.timeout(900)
def test_later_checks_are_answered_warm_with_the_same_report(tmp_path, runtime, monkeypatch):
    right = write_variant(tmp_path, "right.ipynb")
    wrong = write_variant(tmp_path, "wrong.ipynb", answers={"pick_device": "def pick_device(preferred=None):\n    return 'cpu'\n"})
    env = _env(runtime, COURSE_CHECK_IDLE_S="300")
    cold_right = _make_check(right, env)
    assert cold_right.returncode == 0, cold_right.stderr
    path = checkd.socket_path()
    assert _wait_for(path.exists), "the first check did not start the daemon"
    assert oct(os.stat(runtime / "course-check").st_mode & 0o777) == "0o700"
    # The daemon answers (ask() returns None where it did not), with the cold report.
    for nb, cold_code in ((right, 0), (wrong, None)):
        cold = subprocess.run([sys.executable, "-m", "coursetools.learner.selfcheck", str(nb), "--as-given",
                               "--explain"], cwd=layout.ROOT, capture_output=True, text=True, timeout=400)
        warm = _make_check(nb, env, "--explain")
        assert warm.returncode == cold.returncode and (cold_code is None or cold.returncode == cold_code)
        assert _report(warm.stdout) == _report(cold.stdout)
    monkeypatch.chdir(layout.ROOT)
    import io
    import contextlib
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert checkd.ask([str(wrong), "--as-given"]) == 1, "the daemon did not answer"
    assert "Score: " in out.getvalue() and "FAIL" in out.getvalue()
    assert checkd.stop() and _wait_for(lambda: not path.exists(), attempts=60)


@pytest.mark.timeout(600)
def test_the_daemon_stops_by_itself_when_idle(runtime):
    env = _env(runtime, COURSE_CHECK_IDLE_S="2")
    daemon = subprocess.Popen([sys.executable, "-m", "coursetools.learner.checkd", "--serve"],
                              cwd=layout.ROOT, env=env)
    try:
        assert daemon.wait(timeout=300) == 0
    finally:
        daemon.kill()
    assert not checkd.socket_path().exists()


def test_a_folder_others_can_open_is_never_used(runtime, monkeypatch):
    (runtime / "course-check").mkdir()
    os.chmod(runtime / "course-check", 0o755)
    assert checkd.socket_path() is None
    assert checkd.ask(["01"]) is None  # no daemon: the check runs in the learner's process
    monkeypatch.setenv("COURSE_CHECK_DAEMON", "0")
    assert not checkd.enabled(["01"])
    monkeypatch.setenv("COURSE_CHECK_DAEMON", "1")
    assert not checkd.enabled(["01", "--no-daemon"]) and checkd.enabled(["01"])
