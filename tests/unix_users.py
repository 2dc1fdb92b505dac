"""Real Unix users for the tests that need them, and a Python each of them may run.

tests/grading/test_layouts.py grades as `course-grader` (made by .ci/run);
tests/instructor/test_jupyterhub.py makes an instructor and three students of its own and runs
their JupyterHub servers as them. Both need what root's own Python does not give another
user on CI: pyenv's interpreter lies under /root (mode 0700).

A user must run the very interpreter this suite's packages were installed for, not merely one
of the same minor version: soupsieve 3 and 4 need Python 3.11.5, and under Debian's 3.11.2
its selector parser breaks nbconvert's HTML export (every feedback page failed). So
where the user cannot run ours, they get a copy of it: its installation, hard-linked (no
site-packages), in a folder every user may cross, with the executable's library search path
(RUNPATH) pointed at the copy's own libpython. `venv()` checks that the user's environment
reports this interpreter's exact version and build, and fails at once naming both otherwise.
The user's virtual environment reaches this suite's packages through a `.pth` file (a
hard-linked copy of them where the user cannot read the originals).
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


def _build() -> str:
    """This interpreter's version and build, as a user's environment must report it."""
    return f"{sys.version} {sys.implementation.cache_tag} {sysconfig.get_config_var('SOABI')}"


BUILD_PROBE = ("import sys, sysconfig; print(f\"{sys.version} {sys.implementation.cache_tag} "
               "{sysconfig.get_config_var('SOABI')}\")")


def _relocated_copy(base: Path) -> Path:
    """A copy of this interpreter's installation (sys.base_prefix) in `base`, hard-linked where
    the file system allows, without its site-packages and its test suite; returns its python.
    A Python built with a shared libpython finds it through the RUNPATH compiled into the
    executable (pyenv: /root/.pyenv/versions/X/lib), which another user cannot reach: the
    loader would then take the system's libpython3.X (Debian's older build). The copy's
    executable (a real copy, not a link) gets `$ORIGIN/../lib` in its place, written over the
    old path inside the ELF string table (the new string is shorter; the rest is NULs)."""
    prefix = Path(sys.base_prefix)
    dest = base / "python-build"
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    exe = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    target = dest / "bin" / exe.name
    if target.exists():
        return target

    def link(src, dst):
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    skip = shutil.ignore_patterns("site-packages", "test", "__pycache__", "idlelib", "tkinter", "turtledemo")
    (dest / "bin").mkdir(parents=True)
    shutil.copytree(prefix / "lib" / version, dest / "lib" / version, ignore=skip, copy_function=link,
                    symlinks=True)
    (dest / "lib" / version / "site-packages").mkdir()
    for lib in (prefix / "lib").glob("libpython*"):
        if lib.is_symlink():
            os.symlink(os.readlink(lib), dest / "lib" / lib.name)
        else:
            link(lib, dest / "lib" / lib.name)
    data = exe.read_bytes()
    old = str(prefix / "lib").encode()
    if old + b"\0" in data:
        new = b"$ORIGIN/../lib"
        if len(new) > len(old):
            raise RuntimeError(f"cannot rewrite the RUNPATH {old!r} of {exe} in place")
        data = data.replace(old + b"\0", new + b"\0" * (len(old) - len(new) + 1))
    target.write_bytes(data)
    target.chmod(0o755)
    for path in [dest, *dest.rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)
    return target


def interpreter(who, base: Path | None = None) -> str:
    """This very interpreter, or (given `base`) a relocated copy of it, that `who` can run."""
    exe = getattr(sys, "_base_executable", sys.executable)
    if can(who, [exe, "-c", "pass"]):
        return exe
    name = who.pw_name if who else "this user"
    if base is None:
        pytest.fail(f"{name} cannot run {exe}, the Python this suite's packages were installed for, "
                    "and no folder was given for a copy of it")
    copy = str(_relocated_copy(base))
    if not can(who, [copy, "-c", "pass"]):
        pytest.fail(f"{name} cannot run {copy}, the copy of {exe} made for them")
    return copy


def check_build(who, python: Path) -> None:
    """Fail at once, naming both, when `python` run as `who` is not this interpreter's build."""
    proc = subprocess.run(as_user(who, ["env", "-i", str(python), "-c", BUILD_PROBE]),
                          capture_output=True, text=True, timeout=60)
    theirs, ours = proc.stdout.strip(), _build()
    if proc.returncode != 0 or theirs != ours:
        name = who.pw_name if who else "this user"
        pytest.fail(f"{name}'s Python {python} is not the build this suite's packages were installed for: "
                    f"it reports {theirs or proc.stderr.strip()[-500:]!r}, this suite runs {ours!r} "
                    "(a package that needs a newer patch release then breaks as that user)")


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
    base_python = interpreter(runner, base)
    cmd = [base_python, "-m", "venv", "--without-pip", *(["--copies"] if copies else []), str(where)]
    subprocess.run(as_user(who, cmd), check=True, capture_output=True, timeout=120)
    python = where / "bin" / "python"
    if copies:  # the copied executable looks for libpython in $ORIGIN/../lib: the venv's lib/
        for lib in Path(base_python).resolve().parent.parent.glob("lib/libpython*"):
            shutil.copy2(lib, where / "lib" / lib.name, follow_symlinks=True)
            chown_tree(where / "lib" / lib.name, who)
    check_build(runner, python)
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
