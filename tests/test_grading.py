"""Grading through nbgrader itself: solutions score full marks, the untouched release zero,
and every fixture submission (tests/submissions/) exactly the points it declares.

Each assignment gets a scratch nbgrader course of its own (temporary folder, SQLite
gradebook) and is autograded once, for all its submissions; two assignments are graded at
a time (one per core), each in its own nbgrader process.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from coursetools import fixtures, layout, notebooks
from coursetools.nbgrader_course import NbgraderCourse

ASSIGNMENTS = layout.assignments()
FIXTURES = fixtures.all_fixtures()


class Graded:
    """The autograde results of one assignment, for every submission, computed once."""

    def __init__(self, course: NbgraderCourse, name: str):
        self.course, self.name = course, name
        self.source = notebooks.read(layout.source_notebook(name))
        self.points = {notebooks.grade_id(c): notebooks.points(c) for c in notebooks.test_cells(self.source)}
        course.generate(name)
        self.submissions = {
            "solution": self.source,
            "untouched-release": notebooks.read(layout.release_notebook(name)),
        }
        for fx in FIXTURES:
            if fx.assignment == name:
                self.submissions[fx.student_id] = fixtures.submission(fx)
        for student, nb in self.submissions.items():
            course.submit(student, name, nb)
        self.log = course.autograde(name)
        self.grades = course.grades(name, list(self.submissions))

    def explain(self, student: str, expected: dict[str, float]) -> str:
        """A readable account of what a submission scored, and why, for failure messages."""
        got = self.grades.get(student)
        if got is None:
            return (f"nbgrader produced no grades for {student!r} (the submission was aborted).\n"
                    f"autograde log:\n{self.log.stdout[-3000:]}\n{self.log.stderr[-3000:]}")
        lines = []
        try:
            graded_nb = self.course.autograded_notebook(student, self.name)
            errors = {notebooks.grade_id(c): next(
                (f"{o.ename}: {o.evalue}" for o in c.outputs if o.output_type == "error"),
                next((o.text for o in c.outputs if o.output_type == "stream" and o.name == "stderr"), ""))
                for c in graded_nb.cells if notebooks.grade_id(c)}
        except Exception:  # noqa: BLE001 - diagnostics only
            errors = {}
        for gid, want in expected.items():
            grade = got.get(gid)
            score = None if grade is None else grade.score
            mark = "  " if score == want else "!!"
            lines.append(f"{mark} {gid}: scored {score}, expected {want}  {errors.get(gid, '')[:300]}")
        return "\n".join(lines)

    def scores(self, student: str) -> dict[str, float | None] | None:
        got = self.grades.get(student)
        if got is None:
            return None
        return {gid: (g.score if not g.needs_manual_grade else None) for gid, g in got.items()}


def _selected_assignments(session) -> list[str]:
    """The assignments the selected tests of this module need (all, unless -k narrowed it)."""
    names = set()
    for item in session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if getattr(getattr(item, "module", None), "__name__", None) == __name__:
            if "name" in params:
                names.add(params["name"])
            elif "fx" in params:
                names.add(params["fx"].assignment)
    return [n for n in ASSIGNMENTS if n in names]


@pytest.fixture(scope="session")
def graded_all(tmp_path_factory, request) -> dict[str, Graded | Exception]:
    def grade(name: str) -> Graded | Exception:
        try:
            return Graded(NbgraderCourse(tmp_path_factory.mktemp(f"nbgrader-{name}"), [name]), name)
        except Exception as exc:  # noqa: BLE001 - reported by that assignment's tests only
            return exc

    names = _selected_assignments(request.session)
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(names, pool.map(grade, names)))


@pytest.fixture
def graded(graded_all):
    def get(name: str) -> Graded:
        result = graded_all[name]
        if isinstance(result, Exception):
            raise result
        return result
    return get


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_solution_autogrades_to_full_marks(graded, name):
    g = graded(name)
    assert g.scores("solution") == g.points, g.explain("solution", g.points)


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_untouched_release_autogrades_to_zero(graded, name):
    g = graded(name)
    zero = {gid: 0.0 for gid in g.points}
    assert g.scores("untouched-release") == zero, g.explain("untouched-release", zero)


@pytest.mark.parametrize("fx", FIXTURES, ids=[f"{f.assignment}/{f.kind}/{f.name}" for f in FIXTURES])
def test_fixture_submission_scores_as_declared(graded, fx):
    g = graded(fx.assignment)
    expected = fixtures.expected_scores(fx, g.source)
    assert g.scores(fx.student_id) == expected, f"{fx.description}\n" + g.explain(fx.student_id, expected)
