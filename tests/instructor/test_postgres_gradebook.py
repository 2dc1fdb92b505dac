"""Large classes keep the gradebook in a database server: grading against a real PostgreSQL.

The suite starts its own PostgreSQL server (Debian's `postgresql` package, which .ci/run
installs) in a temporary folder, on a loopback port, and grades a small class into it with
`grade-class --db-url`. Skipped, with the reason, only where PostgreSQL is not installed.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from coursetools.author import fixtures
from coursetools import layout, notebooks
from coursetools.author.nbgrader_course import NbgraderCourse

NAME = "01_device_basics"


def _pg_bin():
    for pattern in ("/usr/lib/postgresql/*/bin",):
        found = sorted(glob.glob(pattern))
        if found and os.path.exists(os.path.join(found[-1], "pg_ctl")):
            return found[-1]
    pg_ctl = shutil.which("pg_ctl")
    return os.path.dirname(pg_ctl) if pg_ctl else None


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres_url():
    bindir = _pg_bin()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql): cannot test a server gradebook")
    pytest.importorskip("psycopg2", reason="psycopg2-binary (requirements-dev.txt) is not installed")
    # Not under pytest's tmp_path: its parents are private to root, and the server may run
    # as another user.
    data = Path(tempfile.mkdtemp(prefix="course-pg-"))
    run_as = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root: use its own system user
        if shutil.which("runuser") is None or subprocess.run(["id", "postgres"], capture_output=True).returncode:
            shutil.rmtree(data)
            pytest.skip("running as root without a 'postgres' user to start the server as")
        shutil.chown(data, "postgres")
        run_as = ["runuser", "-u", "postgres", "--"]
    port = _free_port()

    def pg(tool, *args, check=True):
        return subprocess.run(run_as + [os.path.join(bindir, tool), *args], capture_output=True, text=True,
                              check=check, timeout=120)

    try:
        pg("initdb", "-D", str(data / "db"), "-U", "postgres", "--auth=trust", "-E", "UTF8")
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"initdb failed: {exc.stdout}\n{exc.stderr}") from None
    pg("pg_ctl", "-D", str(data / "db"), "-l", str(data / "server.log"), "-w", "-t", "60", "start",
       "-o", f"-c listen_addresses=127.0.0.1 -p {port} -k {data}")
    try:
        pg("createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "gradebook")
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/gradebook"
    finally:
        pg("pg_ctl", "-D", str(data / "db"), "-m", "immediate", "stop", check=False)
        shutil.rmtree(data, ignore_errors=True)


def test_a_class_graded_into_a_postgresql_gradebook(tmp_path, postgres_url):
    from nbgrader.api import Gradebook

    course = NbgraderCourse(tmp_path / "course", [NAME])
    wrong = fixtures.load(layout.SUBMISSIONS_DIR / NAME / "pick_device_hardcodes_cpu.toml")
    course.submit("ada", NAME, fixtures.solved_release(NAME))
    course.submit("bob", NAME, fixtures.submission(wrong))
    course.submit("cy", NAME, notebooks.read(layout.release_notebook(NAME)))
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, "-m", "coursetools.instructor.classroom", NAME, "--course", str(course.root),
         "--db-url", postgres_url, "--json", str(out)],
        cwd=layout.ROOT, capture_output=True, text=True, timeout=1200,
        env=layout.env_with_course_tools())
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    full = sum(fixtures.expected_scores(wrong, notebooks.read(layout.source_notebook(NAME))).values())
    total = sum(notebooks.points(c) for c in notebooks.test_cells(notebooks.read(layout.source_notebook(NAME))))
    with Gradebook(postgres_url) as gb:  # the scores live in PostgreSQL ...
        scores = {s: gb.find_submission_notebook(NAME, NAME, s).score for s in ("ada", "bob", "cy")}
    assert scores == {"ada": total, "bob": full, "cy": 0}
    assert not (course.root / "gradebook.db").exists(), "... and nowhere else"
    reported = {r["student"]: r["score"] for r in json.loads(out.read_text())[NAME]}
    assert reported == scores
