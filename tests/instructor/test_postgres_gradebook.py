"""Large classes keep the gradebook in a database server: grading against a real PostgreSQL.

The suite starts its own PostgreSQL server (Debian's `postgresql` package, which .ci/run
installs) in a temporary folder, on a loopback port (the `postgres_url` fixture, in
tests/instructor/conftest.py), and grades a small class into it with `grade-class --db-url`.
Skipped, with the reason, only where PostgreSQL is not installed.
"""

from __future__ import annotations

import json
import subprocess
import sys

from coursetools.author import fixtures
from coursetools import layout, notebooks
from coursetools.author.nbgrader_course import NbgraderCourse

NAME = "01_device_basics"


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
