"""docs/INSTRUCTORS.md as a newcomer reads it: its first-run section's commands,
run as written in a fresh copy of the repository, reach grades, the class report and feedback
pages; and the numbers it gives about the course (each chapter's points, the simulated class's
size) are the course's own, so they cannot go stale again: the points come from solutions/, the
class from tests/instructor/test_classroom.py."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from coursetools import layout, notebooks
from coursetools.grading import sandbox
from course_copy import checkout_copy

GUIDE = layout.ROOT / "docs" / "INSTRUCTORS.md"
FIRST_RUN = re.compile(r"<!-- first-run:[^>]*-->\s*```bash\n(.*?)```\s*<!-- /first-run -->", re.S)


def _points(name: str) -> float:
    return sum(notebooks.points(c) for c in notebooks.test_cells(notebooks.read(layout.source_notebook(name))))


def _classroom_tests():
    spec = importlib.util.spec_from_file_location("_classroom_for_guide", Path(__file__).with_name("test_classroom.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_guides_numbers_are_the_courses():
    """Every score of the sample summary is out of its chapter's points now; the simulated
    class's size is the test's (STUDENTS_01 and the unreadable file, STUDENTS_02)."""
    text = GUIDE.read_text(encoding="utf-8")
    block = re.search(r"```\n(student +(\d\d_\w+ +)+flags\n.*?)```", text, re.S)
    assert block, "the sample summary table of 'Grading a class' is gone"
    lines = block.group(1).splitlines()
    chapters = lines[0].split()[1:-1]
    seen = 0
    for row in lines[2:]:
        for chapter, cell in zip(chapters, re.findall(r"(?<=\s)(\d+(?:\.\d+)?/\d+(?:\.\d+)?|not graded|—)(?=\s|$)", row)):
            if "/" in cell:
                got, out_of = (float(x) for x in cell.split("/"))
                assert out_of == _points(chapter), f"{row.split()[0]}: {cell} in {chapter}, which is out of {_points(chapter):g}"
                assert 0 <= got <= out_of
                seen += 1
    assert seen >= 10, f"only {seen} scores read from the sample table"
    classroom = _classroom_tests()
    size = len(classroom.STUDENTS_01) + 1 + len(classroom.STUDENTS_02)  # + the unreadable file (invalid-json)
    said = re.findall(r"simulated class of `tests/instructor/test_classroom.py`, (\d+) submissions", text)
    assert said and all(int(n) == size for n in said), f"the guide says {said}; the class has {size} submissions"
    for n in re.findall(r"out of (\d+)", text):
        assert int(n) in {_points(a) for a in layout.assignments()} | {1}, f"'out of {n}' is no chapter's points"


@pytest.mark.timeout(1200)
def test_first_run_section_runs_as_written(tmp_path):
    """The first-run commands, one by one, in a copy of the repository as a fresh clone has it
    (the clone itself is the copy; the course's .venv stands for the one the first make.py
    command would install). As root without bubblewrap, the consent grade-class asks for is
    given through its environment variable (the guide's prerequisite)."""
    text = GUIDE.read_text(encoding="utf-8")
    found = FIRST_RUN.search(text)
    assert found, "INSTRUCTORS.md has no first-run block"
    commands = [line for line in found.group(1).splitlines() if line.strip() and not line.startswith("#")]
    assert len(commands) <= 6, "the first run is about five commands"
    assert commands[0].startswith("git clone ") and commands[0].endswith("&& cd course"), commands[0]
    course = checkout_copy(tmp_path / "course")
    (course / ".venv").symlink_to(layout.ROOT / ".venv")
    env = dict(os.environ)
    if not sandbox.bwrap_works()[0]:
        env[sandbox.ALLOW_ROOT_ENV] = "1"
    for command in commands[1:]:
        proc = subprocess.run(["bash", "-c", command], cwd=course, env=env, capture_output=True, text=True,
                              timeout=1000)
        assert proc.returncode == 0, f"{command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    with open(course / "grades.csv", newline="", encoding="utf-8") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    out_of = _points("02_to_semantics")
    assert float(rows["bob"]["score"]) == out_of and float(rows["alice"]["score"]) == 0
    report = json.loads((course / "grades-report.json").read_text(encoding="utf-8"))["assignments"]["02_to_semantics"]
    assert report["scores"] == {"alice": 0.0, "bob": out_of}
    assert all(q["full"] == ["bob"] and q["zero"] == ["alice"] for q in report["questions"])
    assert (course / "grades-report.html").is_file()
    for student in ("alice", "bob"):
        assert (course / "feedback" / student / "02_to_semantics" / "02_to_semantics.html").is_file()
    assert shlex.split(commands[-1])[:3] == ["python3", "make.py", "grade-class"]
