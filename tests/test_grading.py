"""Grading through nbgrader itself: solutions score full marks, the untouched release zero,
and every fixture submission (tests/submissions/) exactly the points it declares.

Each assignment's submissions are split over two scratch nbgrader courses (temporary
folders, SQLite gradebooks), each autograded once by its own nbgrader process; as many
such processes run at a time as the machine has cores (two on CI).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from coursetools import fixtures, layout, notebooks
from coursetools.nbgrader_course import NbgraderCourse

ASSIGNMENTS = layout.assignments()
FIXTURES = fixtures.all_fixtures()


SHARDS = 2  # each assignment's submissions are split over this many scratch courses


def submissions_of(name: str) -> dict[str, object]:
    """student id -> notebook: the solution, the untouched release, every fixture."""
    subs = {
        "solution": notebooks.read(layout.source_notebook(name)),
        "untouched-release": notebooks.read(layout.release_notebook(name)),
    }
    for fx in FIXTURES:
        if fx.assignment == name:
            subs[fx.student_id] = fixtures.submission(fx)
    return subs


class Shard:
    """Some of one assignment's submissions, autograded by nbgrader in a scratch course."""

    def __init__(self, course: NbgraderCourse, name: str, submissions: dict):
        self.course = course
        course.generate(name)
        for student, nb in submissions.items():
            course.submit(student, name, nb)
        self.log = course.autograde(name)
        self.grades = course.grades(name, list(submissions))


class Graded:
    """The autograde results of one assignment, for every submission."""

    def __init__(self, name: str, shards: list[Shard]):
        self.name = name
        self.source = notebooks.read(layout.source_notebook(name))
        self.points = {notebooks.grade_id(c): notebooks.points(c) for c in notebooks.test_cells(self.source)}
        self.shard_of = {student: shard for shard in shards for student in shard.grades}
        self.grades = {student: grade for shard in shards for student, grade in shard.grades.items()}

    def explain(self, student: str, expected: dict[str, float]) -> str:
        """A readable account of what a submission scored, and why, for failure messages."""
        got = self.grades.get(student)
        shard = self.shard_of.get(student)
        if got is None:
            log = shard.log if shard else None
            return (f"nbgrader produced no grades for {student!r} (the submission was aborted).\n"
                    f"autograde log:\n{log.stdout[-3000:] if log else ''}\n{log.stderr[-3000:] if log else ''}")
        lines = []
        try:
            graded_nb = shard.course.autograded_notebook(student, self.name)
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
    """Every selected assignment graded, one nbgrader process per core at a time."""
    jobs = []
    for name in _selected_assignments(request.session):
        subs = list(submissions_of(name).items())
        for k in range(SHARDS):
            # made here, not in the threads: pytest's temporary folders are not thread-safe
            # (two threads creating the base folder at once: FileExistsError)
            jobs.append((name, dict(subs[k::SHARDS]), tmp_path_factory.mktemp(f"nbgrader-{name}")))

    def run(job) -> Shard | Exception:
        name, subs, folder = job
        try:
            return Shard(NbgraderCourse(folder, [name]), name, subs)
        except Exception as exc:  # noqa: BLE001 - reported by that assignment's tests only
            return exc

    workers = max(1, min(len(jobs), os.cpu_count() or 2))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        done = list(pool.map(run, jobs))
    out: dict[str, Graded | Exception] = {}
    for (name, _, _), shard in zip(jobs, done):
        if isinstance(shard, Exception):
            out[name] = shard
        elif not isinstance(out.get(name), Exception):
            out.setdefault(name, [])
            out[name].append(shard)
    return {name: v if isinstance(v, Exception) else Graded(name, v) for name, v in out.items()}


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
