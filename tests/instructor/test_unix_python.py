"""The Python another Unix user runs in the tests is this suite's own build.

The hub test's users and the unprivileged grader of the layout matrix import this suite's
packages, installed by root's Python (pyenv's 3.11.7 under /root on CI). Debian's 3.11.2 ran
them once, and soupsieve 4 (which needs 3.11.5) broke nbconvert's HTML export: every feedback
page failed. tests/unix_users.py now gives such a user a relocated copy of this very build,
and fails at once, naming both builds, when a user's environment reports another one.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import unix_users

USER = "course-grader"  # .ci/run makes it; made here where missing (root only)
# What nbconvert's HTML exporter runs on every feedback page (the call that failed when Debian's 3.11.2 ran the suite's packages).
SELECT = ("import bs4; soup = bs4.BeautifulSoup('<img src=x><img alt=y src=z>', 'html.parser'); "
          "print(len(soup.select('img:not([alt])')))")


@pytest.fixture
def who():
    if not unix_users.IS_ROOT:
        pytest.skip("running Python as another user needs root (CI runs the suite as root)")
    return unix_users.user(USER) or unix_users.make_user(USER)


@pytest.fixture
def base():
    with unix_users.crossable_folder("course-unix-python-") as folder:
        yield folder


@pytest.mark.parametrize("copies", [False, True], ids=["symlinked-venv", "copied-venv"])
def test_another_user_runs_this_very_build(who, base, copies):
    where = base / "venv"
    where.mkdir()
    unix_users.chown_tree(base, who)
    python = unix_users.venv(who, where, base, copies=copies)  # checks the build itself
    proc = subprocess.run(unix_users.as_user(who, ["env", "-i", str(python), "-c",
                                                   f"import sys; print(sys.version); {SELECT}"]),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    version, selected = proc.stdout.strip().splitlines()
    assert version == sys.version, (version, sys.version)
    assert selected == "1", proc.stdout


def test_another_build_fails_at_once_naming_both(who, base):
    """A user's environment made from another build of the same minor version (Debian's
    python3.X here) is refused by check_build with both versions in the message: the positive
    control of the check the hub and layout tests rely on."""
    other = Path(f"/usr/bin/python3.{sys.version_info.minor}")
    if not other.exists():
        pytest.skip(f"no {other} to stand for another build")
    theirs = subprocess.run([str(other), "-c", "import sys; print(sys.version)"], capture_output=True,
                            text=True, timeout=60).stdout.strip()
    if theirs == sys.version:
        pytest.skip(f"{other} is this very build")
    where = base / "venv"
    where.mkdir()
    unix_users.chown_tree(base, who)
    subprocess.run(unix_users.as_user(who, [str(other), "-m", "venv", "--without-pip", str(where)]),
                   check=True, capture_output=True, timeout=120)
    with pytest.raises(pytest.fail.Exception) as failed:
        unix_users.check_build(who, where / "bin" / "python")
    message = str(failed.value)
    assert theirs.split()[0] in message and sys.version.split()[0] in message, message
