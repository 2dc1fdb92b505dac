"""One machine, the whole nbgrader cycle (issue 28): release -> fetch -> submit -> collect ->
autograde, through the local exchange the course's nbgrader_config.py sets (local-exchange/,
git-ignored), with nbgrader's own commands and then grade-class.

The course is a copy of the checkout's files that grading needs (its own nbgrader_config.py,
so the exchange lies in the copy); nothing is written outside it.
"""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys

import pytest

from coursetools import layout, notebooks
from coursetools.author import fixtures
from coursetools.author.nbgrader_course import nbgrader_env
from coursetools.grading import sandbox
from coursetools.learner import lab

A = "02_to_semantics"


def _copy(dest):
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                             "nbgrader_config.py", "course.toml", "coursetools", f"solutions/{A}", f"exercises/{A}"],
                            cwd=layout.ROOT, capture_output=True, text=True, check=True).stdout
    for rel in filter(None, listed.split("\0")):
        src = layout.ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(src.read_bytes())
    return dest


def test_the_course_config_points_the_exchange_into_the_course(tmp_path):
    from traitlets.config.loader import PyFileConfigLoader

    course = _copy(tmp_path / "course")
    config = PyFileConfigLoader("nbgrader_config.py", path=str(course)).load_config()
    assert config.Exchange.root == str(course / "local-exchange" / "exchange")
    assert config.Exchange.assignment_dir == str(course / "local-exchange" / "student")
    assert config.Exchange.cache == str(course / "local-exchange" / "cache" / "instructor")
    assert (course / "local-exchange" / "exchange").is_dir(), "nbgrader needs the exchange folder to exist"
    ignored = subprocess.run(["git", "check-ignore", "-q", "local-exchange/exchange/x"], cwd=layout.ROOT)
    assert ignored.returncode == 0, "local-exchange/ must be git-ignored"
    # make.py lab --instructor: the Assignments tab (fetch, submit) is on, the course list off
    server = json.loads((layout.ROOT / lab.CONFIG_DIR / "instructor" / "jupyter_server_config.json").read_text())
    page = json.loads((layout.ROOT / lab.CONFIG_DIR / "instructor" / "labconfig" / "page_config.json").read_text())
    assert "nbgrader.server_extensions.assignment_list" not in server["ServerApp"]["jpserver_extensions"]
    assert "@jupyter/nbgrader:assignment-list" not in page["disabledExtensions"]


# Five nbgrader commands (about 5 s each) and one grade-class of one submission.
@pytest.mark.timeout(900, method="thread")
def test_release_fetch_submit_collect_autograde_on_one_machine(tmp_path):
    course = _copy(tmp_path / "course")
    env = {**nbgrader_env(), "JUPYTER_DATA_DIR": str(tmp_path / "jupyter-data"),
           "PYTHONPATH": str(course)}

    def nbgrader(*args, cwd=course):
        proc = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"nbgrader {' '.join(args)}:\n{proc.stdout}\n{proc.stderr[-3000:]}"
        return proc.stdout + proc.stderr

    nbgrader("generate_assignment", A, "--force")
    said = nbgrader("release_assignment", A)
    exchange = course / "local-exchange" / "exchange" / "pytorch-devices"
    assert (exchange / "outbound" / A / f"{A}.ipynb").exists(), said
    # The student's side: fetch into local-exchange/student/, answer, submit.
    nbgrader("fetch_assignment", A)  # from the course folder, as the Assignments tab does
    fetched = course / "local-exchange" / "student" / A / f"{A}.ipynb"
    assert fetched.exists(), "fetch_assignment did not write into the course's local-exchange/student/"
    answered = fixtures.fill(notebooks.read(fetched), fixtures.reference_answers(
        notebooks.read(layout.source_notebook(A))))
    notebooks.write(answered, fetched)
    nbgrader("submit", A)
    assert any((exchange / "inbound").iterdir()), "submit left nothing in the exchange's inbound folder"
    # The instructor's side: collect, then grade.
    nbgrader("collect", A)
    student = getpass.getuser()
    assert (course / "submitted" / student / A / f"{A}.ipynb").exists()
    out = tmp_path / "results.json"
    cmd = [sys.executable, "-m", "coursetools.instructor.classroom", A, "--course", str(course),
           "--json", str(out)]
    if not sandbox.bwrap_works()[0]:
        cmd.append("--unsandboxed-as-root")
    proc = subprocess.run(cmd, cwd=layout.ROOT, env=layout.env_with_course_tools(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-3000:]}"
    result = {r["student"]: r for r in json.loads(out.read_text())[A]}[student]
    total = sum(notebooks.points(c) for c in notebooks.test_cells(notebooks.read(layout.source_notebook(A))))
    assert (result["score"], result["max_score"]) == (total, total), result
    assert not os.path.exists(tmp_path / "jupyter-data" / "nbgrader_cache"), \
        "the student's cache belongs in local-exchange/cache/ on one machine"


def test_a_class_servers_global_config_wins_over_the_local_exchange(tmp_path, monkeypatch):
    """On a hub, /etc/jupyter/nbgrader_config.py (deploy/jupyterhub/etc-jupyter/) sets the shared
    exchange for every user; the course's nbgrader_config.py, read after it, then sets nothing,
    so the same checkout works on a laptop and on the hub (issue 37). The course's own
    jupyter-config/ files and a user's ~/.jupyter do not count as a server's."""
    from coursetools.instructor import exchange
    from traitlets.config import Config

    course = tmp_path / "course"
    own = course / "jupyter-config" / "student"
    own.mkdir(parents=True)
    (own / "nbgrader_config.py").write_text("c = get_config()\n")
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", str(own))
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path / "home-jupyter"))
    (tmp_path / "home-jupyter").mkdir()
    (tmp_path / "home-jupyter" / "nbgrader_config.py").write_text("c = get_config()\n")
    c = Config()
    assert exchange.server_config(str(course)) is None
    exchange.configure(c, str(course))
    assert c.Exchange.root == str(course / "local-exchange" / "exchange")

    hub = tmp_path / "etc-jupyter"
    hub.mkdir()
    (hub / "nbgrader_config.py").write_text("c = get_config()\n")
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", os.pathsep.join([str(own), str(hub)]))
    assert exchange.server_config(str(course)) == str(hub / "nbgrader_config.py")
    c = Config()
    exchange.configure(c, str(course))
    assert "Exchange" not in c and "CourseDirectory" not in c, c
