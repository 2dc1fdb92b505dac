"""Real Unix users for the tests that need them, and a Python each of them may run.

tests/grading/test_layouts.py grades as `course-grader` (made by .ci/run);
tests/instructor/test_jupyterhub.py makes an instructor and three students of its own and runs
their JupyterHub servers as them. Both need what root's own Python does not give another
user on CI: pyenv's interpreter lies under /root (mode 0700). So a user's virtual
environment is made from a Python 3.<same minor> that user may run (Debian's
/usr/bin/python3.X, which .ci/run installs), and reaches this suite's packages through a
`.pth` file (a hard-linked copy of them where the user cannot read the originals).
tests/ is on sys.path (tests/conftest.py), so each imports it as `unix_users`.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


@contextlib.contextmanager
def crossable_folder(prefix: str):
    """A fresh folder under /tmp itself, which every user may cross (not under a private
    TMPDIR, which Slurm or systemd's PrivateTmp make root's alone); removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(folder, 0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def user(name: str):
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


def make_user(name: str):
    """The user `name`, made with a home folder if missing (needs root); skips the test where
    that cannot be done."""
    if not IS_ROOT:
        pytest.skip(f"making the Unix user {name} needs root (CI runs the suite as root)")
    if user(name) is None:
        proc = subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name],
                              capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            pytest.skip(f"useradd {name} failed: {proc.stderr.strip()}")
    return user(name)


def remove_user(name: str) -> None:
    """Remove `name` and its home (its processes first: a server left running would keep it)."""
    if user(name) is None:
        return
    subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True, timeout=30)
    subprocess.run(["userdel", "--remove", name], capture_output=True, timeout=60)


def as_user(who, cmd: list[str]) -> list[str]:
    """`cmd` run as `who` (None: as this process's own user)."""
    return cmd if who is None else ["runuser", "-u", who.pw_name, "--", *cmd]


def chown_tree(path: Path, who) -> None:
    if who is None:
        return
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            os.lchown(name, who.pw_uid, who.pw_gid)


def can(who, cmd: list[str]) -> bool:
    return subprocess.run(as_user(who, cmd), capture_output=True, timeout=60).returncode == 0


def interpreter(who) -> str:
    """A Python 3.<same minor> that `who` can run."""
    base = getattr(sys, "_base_executable", sys.executable)
    candidates = [base, f"/usr/bin/python3.{sys.version_info.minor}"]
    for exe in candidates:
        if os.path.exists(exe) and can(who, [exe, "-c", "pass"]):
            return exe
    name = who.pw_name if who else "this user"
    pytest.skip(f"no Python 3.{sys.version_info.minor} that {name} may run ({', '.join(candidates)}; "
                f"Debian: apt-get install python3.{sys.version_info.minor})")


def _readable_copy(who, source: str, probe: str, dest: Path) -> str:
    """`source`, or a hard-linked copy of it at `dest` where `who` cannot read `probe` in it."""
    if can(who, ["test", "-r", os.path.join(source, probe)]):
        return source
    if not dest.exists():
        if subprocess.run(["cp", "-al", source, str(dest)], capture_output=True).returncode != 0:
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(source, dest, symlinks=True)
    return str(dest)


def packages(who, base: Path) -> str:
    """This suite's site-packages, or a hard-linked copy of it where `who` cannot read it
    (a checkout under root's private home)."""
    return _readable_copy(who, sysconfig.get_paths()["purelib"], os.path.join("torch", "__init__.py"),
                          base / "site-packages")


def jupyter_data(who, base: Path) -> str:
    """This environment's share/jupyter (JupyterLab's application, the extensions, the kernel
    spec), or a readable copy of it, for a user's JUPYTER_PATH."""
    return _readable_copy(who, os.path.join(sys.prefix, "share", "jupyter"), os.path.join("lab", "static"),
                          base / "share-jupyter")


def venv(who, where: Path, base: Path, copies: bool = False, interpreter_for=None) -> Path:
    """A virtual environment at `where`, made and owned by `who` (None: this process's user),
    whose Python imports this suite's packages; returns its python. `interpreter_for`: the
    user who must be able to run it, where that is not `who` (a system-wide environment that
    root makes for everyone)."""
    runner = interpreter_for or who
    cmd = [interpreter(runner), "-m", "venv", "--without-pip", *(["--copies"] if copies else []), str(where)]
    subprocess.run(as_user(who, cmd), check=True, capture_output=True, timeout=120)
    python = where / "bin" / "python"
    purelib = subprocess.run(as_user(who, [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]),
                             check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    pth = Path(purelib) / "course_suite_packages.pth"
    pth.write_text(packages(runner, base) + "\n")
    # Jupyter's enabled server extensions (jupyterlab, nbgrader, jupyterhub's singleuser), which
    # pip writes into the environment's etc/jupyter.
    etc = Path(sys.prefix) / "etc" / "jupyter"
    if etc.is_dir():
        shutil.copytree(etc, where / "etc" / "jupyter", dirs_exist_ok=True)
        chown_tree(where / "etc", who)
    # The one console script nbgrader runs (to create a gradebook), as pip would install it.
    alembic = where / "bin" / "alembic"
    alembic.write_text(f"#!{python}\nimport sys\nfrom alembic.config import main\nsys.exit(main())\n")
    alembic.chmod(0o755)
    pth.chmod(0o644)
    chown_tree(pth, who)
    chown_tree(alembic, who)
    return python
