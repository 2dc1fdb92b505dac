"""Grading works wherever a newcomer puts things, as root and as an unprivileged user.

A fresh clone under /tmp, run as root with Python under the home folder, once graded no one:
the sandbox made the folders on the way to the interpreter 0700 and the kernel, running as
`nobody`, could not reach its own Python. Each case here lays out a small course (the
course's tools and nbgrader_config.py, a one-assignment course with a data file, a student's
submission) and a virtual environment in a layout of its own, then grades the submission in
the sandbox and asserts the score:

| case | what lies where |
|---|---|
| clone-under-tmp | the course and its .venv under /tmp; graded with `grade-class` itself |
| venv-in-home | the .venv in the grader's home (mode 0700), its interpreter copied in (`venv --copies`) |
| tmpdir-0700 | TMPDIR a folder made by mkdtemp (0700): the scratch and connection folders in it |
| runtime-in-home | TMPDIR and JUPYTER_RUNTIME_DIR inside the grader's home (0700) |

each as root and as `course-grader`, an unprivileged user that `.ci/run` creates with
`useradd`. The base interpreter is this suite's (on CI: pyenv's, under /root), or for the
unprivileged user a relocated copy of that same build where root's is out of its reach
(tests/unix_users.py; never another build: packages installed for 3.11.7 broke under Debian's 3.11.2); the packages are this suite's,
reached through a `.pth` file. A case that grades with
`grade-class` goes through the real command; the others through the step nbgrader's
autograde runs for every submission (ResilientExecute, after the preflight its hook runs).
A last case is a layout the sandbox must refuse: grading stops before the first submission,
with one message naming the path, the cause and the fix.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import textwrap
from pathlib import Path

import pytest
import unix_users

from coursetools.author import authoring as A
from coursetools import layout, notebooks
from coursetools.grading import sandbox

USER = "course-grader"  # .ci/run: useradd --create-home course-grader
ASSIGNMENT = "01_layout_probe"
OK, WHY = sandbox.bwrap_works()
IS_ROOT = os.geteuid() == 0
pytestmark = pytest.mark.skipif(not OK, reason=f"no working bubblewrap: {WHY}")

ANSWER = "def double(t):\n    ### BEGIN SOLUTION\n    return t * 2\n    ### END SOLUTION"
# Two test cells the reference answer passes (one reads a data file shipped beside the
# notebook, so the scratch folder works in this layout) and one it fails: 3 of 4 points
# proves the notebook really ran (nbgrader scores a cell with no output as passed).
TESTS = [
    ("test_double", 2, 'import torch\nassert torch.equal(double(torch.ones(2)), torch.full((2,), 2.0))'),
    ("test_data_file", 1, 'assert open("shipped.txt").read() == "data the assignment ships"'),
    ("test_fails", 1, 'assert double(1) == 3, "this test fails on purpose"'),
]
EXPECTED = (3.0, 4.0)


def _user():
    return unix_users.user(USER)


def _as(who, cmd: list[str]) -> list[str]:
    return unix_users.as_user(who, cmd)


_chown = unix_users.chown_tree


def _venv(who, where: Path, base: Path, copies: bool) -> Path:
    return unix_users.venv(who, where, base, copies)


def _course(root: Path, student: str) -> None:
    """The course's tools and configuration, one assignment, one submission."""
    shutil.copytree(layout.ROOT / "coursetools", root / "coursetools",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(layout.ROOT / "nbgrader_config.py", root / "nbgrader_config.py")
    source = root / "solutions" / ASSIGNMENT
    cells = [A.md(f"# {ASSIGNMENT}"), A.answer("double", ANSWER)]
    cells += [A.tests(gid, points, f'"""{gid}"""\n{src}') for gid, points, src in TESTS]
    A.save(cells, source / f"{ASSIGNMENT}.ipynb")
    (source / "shipped.txt").write_text("data the assignment ships")
    submitted = root / "submitted" / student / ASSIGNMENT
    submitted.mkdir(parents=True)
    shutil.copy(source / f"{ASSIGNMENT}.ipynb", submitted / f"{ASSIGNMENT}.ipynb")
    shutil.copy(source / "shipped.txt", submitted / "shipped.txt")


# What nbgrader's autograde runs for each submission: the course's preflight (its
# pre-convert hook) and the ResilientExecute step, in the sandbox; then nbgrader's own scoring.
DRIVER = textwrap.dedent("""
    import json, os, sys
    from nbgrader.utils import determine_grade, is_grade
    from coursetools import notebooks
    from coursetools.grading import preflight
    from coursetools.instructor.nbgrader_ext import ResilientExecute
    path = sys.argv[1]
    step = ResilientExecute(sandbox="bwrap")
    config = step.sandbox_config({})
    preflight.check(config)
    nb, res = step.preprocess(notebooks.read(path), {"metadata": {"path": os.path.dirname(path)},
                                                     "unique_key": "layout-case"})
    grades = [determine_grade(c) for c in nb.cells if is_grade(c)]
    outputs = {c.metadata["nbgrader"]["grade_id"]: [o.get("text") or f"{o.get('ename')}: {o.get('evalue')}"
                                                  for o in c.get("outputs", [])] for c in nb.cells if is_grade(c)}
    print(json.dumps({"score": [sum(g[0] or 0 for g in grades), sum(g[1] for g in grades)],
                      "sandbox": res["resilient_execute"]["sandbox"], "notes": res["resilient_execute"]["notes"],
                      "outputs": outputs}))
""")

CASES = ["clone-under-tmp", "venv-in-home", "tmpdir-0700", "runtime-in-home"]


@pytest.fixture(params=["root", "user"])
def grader(request):
    """The grader: None for this process's own user (root on CI), or the unprivileged user."""
    if request.param == "root":
        if not IS_ROOT:
            pytest.skip("the root cases need root (CI runs the suite as root)")
        return None
    if not IS_ROOT:
        pytest.skip(f"the unprivileged-user cases start the grading as {USER} with runuser (needs root)")
    who = _user()
    if who is None:
        pytest.skip(f"no user {USER}: `useradd --create-home {USER}` (.ci/run does) to run these cases")
    return who


def _layout(case: str, who, base: Path) -> tuple[Path, Path, dict[str, str]]:
    """(course root, python, environment) for one case."""
    home = base / "home"
    home.mkdir(mode=0o700)
    clone = base / "clone"
    _course(clone, "alice")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8",
           "PYTHONPATH": str(clone), "PYTHONNOUSERSITE": "1"}
    if case == "tmpdir-0700":
        env["TMPDIR"] = tempfile.mkdtemp(prefix="private-tmpdir-")  # 0700, as Slurm or PrivateTmp
        _chown(Path(env["TMPDIR"]), who)
    elif case == "runtime-in-home":
        env["TMPDIR"] = str(home / "tmp")
        env["JUPYTER_RUNTIME_DIR"] = str(home / ".local" / "share" / "jupyter" / "runtime")
        Path(env["TMPDIR"]).mkdir(mode=0o700)
    _chown(base, who)
    python = _venv(who, home / ".venv" if case == "venv-in-home" else clone / ".venv", base,
                   copies=case == "venv-in-home")
    # nbconvert's templates (the feedback page), which pip puts in the environment's
    # share/jupyter: the .pth reaches the packages, this reaches their data.
    env["JUPYTER_PATH"] = unix_users.jupyter_data(who, base)
    env["PATH"] = f"{python.parent}{os.pathsep}{env['PATH']}"  # nbgrader runs alembic from there
    return clone, python, env


@pytest.fixture
def base():
    """A folder under /tmp itself (not under a private TMPDIR), removed afterwards."""
    with unix_users.crossable_folder("course-layout-") as folder:
        yield folder


@pytest.mark.parametrize("case", CASES)
def test_grading_works_in_layout(case, grader, base):
    clone, python, env = _layout(case, grader, base)
    try:
        if case == "clone-under-tmp":
            out = base / "result.json"
            proc = subprocess.run(
                _as(grader, ["env", "-i", *[f"{k}={v}" for k, v in env.items()],
                             str(python), "-m", "coursetools.instructor.classroom", ASSIGNMENT, "--course", str(clone),
                             "--sandbox", "bwrap", "--json", str(out)]),
                cwd=clone, capture_output=True, text=True, timeout=900)
            assert proc.returncode == 0, f"grade-class failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}"
            assert "preflight: a kernel started" in proc.stderr, proc.stderr[-2000:]
            result = json.loads(out.read_text())[ASSIGNMENT][0]
            assert (result["score"], result["max_score"]) == EXPECTED, (result, proc.stdout)
        else:
            driver = base / "driver.py"
            driver.write_text(DRIVER)
            _chown(driver, grader)
            submission = clone / "submitted" / "alice" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
            proc = subprocess.run(
                _as(grader, ["env", "-i", *[f"{k}={v}" for k, v in env.items()], str(python), str(driver),
                             str(submission)]),
                cwd=clone, capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, f"grading failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}"
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            assert result["sandbox"] == "bwrap", result
            assert tuple(result["score"]) == EXPECTED, result
    finally:
        if "TMPDIR" in env and env["TMPDIR"].startswith(tempfile.gettempdir() + "/private-tmpdir-"):
            shutil.rmtree(env["TMPDIR"], ignore_errors=True)


@pytest.mark.skipif(not IS_ROOT, reason="a folder closed to others is what stops a kernel running as nobody")
def test_a_layout_the_sandbox_cannot_serve_stops_before_the_first_submission(base):
    """A venv whose lib/ only root may enter: the kernel (nobody) cannot import anything.
    grade-class stops before grading anyone, with one message naming the folder, its mode and
    the fix; nbgrader's own autograde stops the same way (the course's pre-convert hook),
    leaving nothing behind for the student."""
    clone, python, env = _layout("clone-under-tmp", None, base)
    closed = clone / ".venv" / "lib"
    os.chmod(closed, 0o700)
    run_env = ["env", "-i", *[f"{k}={v}" for k, v in env.items()]]
    proc = subprocess.run([*run_env, str(python), "-m", "coursetools.instructor.classroom", ASSIGNMENT, "--course", str(clone),
                           "--sandbox", "bwrap"], cwd=clone, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr[-3000:])
    assert "grading cannot start" in proc.stderr and f"cannot enter {closed}" in proc.stderr, proc.stderr[-3000:]
    assert "mode 0700, owner root" in proc.stderr and f"chmod o+x {closed}" in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.count("grading cannot start") == 1 and "not graded" not in proc.stdout, proc.stdout
    assert not (clone / "autograded").exists(), "nothing may be graded"

    subprocess.run([*run_env, str(python), "-m", "nbgrader", "generate_assignment", ASSIGNMENT, "--force"],
                   cwd=clone, capture_output=True, text=True, timeout=600, check=True)
    proc = subprocess.run([*run_env, str(python), "-m", "nbgrader", "autograde", ASSIGNMENT, "--force"],
                          cwd=clone, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0, proc.stderr[-3000:]
    assert f"cannot enter {closed}" in proc.stderr, proc.stderr[-3000:]
    assert not (clone / "autograded" / "alice").exists(), "a failed preflight leaves no half-graded submission"
