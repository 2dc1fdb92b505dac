"""Grading through nbgrader itself: solutions score full marks, the untouched release zero,
every fixture (tests/submissions/) exactly the points it declares, and the Chinese edition's
exercises exactly like the English ones (the reference answers, the untouched release and a
wrong answer typed into the Chinese release: only markdown, answer-cell docstrings and
comments are translated, no locked cell, so nbgrader's checksums match).

Fixtures are graded in groups (coursetools/author/fixture_groups.py): one submission carries the
changed answers of several fixtures whose grades cannot mix up, checked from the notebook's
code, so a kernel start and a run of the whole notebook serve several claims. Each fixture
still has its own test, which checks its own `loses` cells and every cell no member loses.

Each assignment's submissions are split into shards of about SHARD_SIZE; a shard is one
scratch nbgrader course (a temporary folder, an SQLite gradebook) autograded once by its
own nbgrader process. `generate_assignment` runs once per assignment (and test run); its
gradebook and release are copied into each shard. Each shard is a test class: under
pytest-xdist (`python3 make.py test` runs `--dist loadscope`) a class goes to one worker,
which grades that shard when its first test asks; in a single process every selected shard
is graded at once, as many nbgrader processes at a time as the machine has cores.
"""

from __future__ import annotations

import ast
import copy
import html
import math
import os
import re
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from coursetools.author import fixture_groups, fixtures
from coursetools import layout, notebooks
from coursetools.author.nbgrader_course import NbgraderCourse
from coursetools.grading import hints
from coursetools.instructor import nbgrader_ext
from coursetools.publish.i18n import testmessages
from coursetools.publish.i18n import build as i18n_build
from coursetools.publish.i18n import markdown as i18n_markdown

ASSIGNMENTS = layout.assignments()
FIXTURES = fixtures.all_fixtures()
GROUPS = {name: fixture_groups.groups(name, FIXTURES, notebooks.read(layout.source_notebook(name)))
          for name in ASSIGNMENTS}
# submissions per nbgrader process: one submission costs 6-10 s of a quiet core (kernel start,
# the tamper checks' setup, the notebook), one nbgrader process about 5 s more
SHARD_SIZE = 8
# The Chinese edition's exercises (zh/exercises/...): a Chinese submission must grade exactly
# like an English one, so three of them join the English ones in the same scratch course:
# the reference answers, the untouched release and a realistic wrong answer.
CHINESE = {src.path.split("/")[1]: layout.ROOT / src.target
           for src in i18n_build.edition(layout.ROOT) if src.kind == "exercise"}
ZH_STUDENTS = ("zh-solution", "zh-untouched-release", "zh-wrong")


def students_of(name: str) -> list[str]:
    chinese = list(ZH_STUDENTS) if name in CHINESE else []
    return ["solution", "untouched-release"] + [group.student_id for group in GROUPS[name]] + chinese


def chinese_wrong_fixture(name: str) -> fixtures.Fixture:
    """The first wrong fixture of the assignment that can share a kernel (not `alone`)."""
    return next(f for f in FIXTURES if f.assignment == name and f.kind == "wrong" and not f.alone)


def group_of(fx: fixtures.Fixture) -> fixture_groups.Group:
    return next(group for group in GROUPS[fx.assignment] if fx in group.members)


def shards_of(name: str) -> list[list[str]]:
    """The assignment's student ids, dealt into shards of about SHARD_SIZE."""
    students = students_of(name)
    k = max(1, math.ceil(len(students) / SHARD_SIZE))
    return [students[i::k] for i in range(k)]


def shard_key(name: str, student: str) -> tuple[str, int]:
    return name, next(i for i, shard in enumerate(shards_of(name)) if student in shard)


def item_shard(item) -> tuple[str, int] | None:
    """(assignment, shard) whose grades a test item of this module reads; None for others."""
    cls = getattr(item, "cls", None)
    return (cls.ASSIGNMENT, cls.SHARD) if hasattr(cls, "SHARD") else None


def submission_of(name: str, student: str):
    if student == "solution":
        return notebooks.read(layout.source_notebook(name))
    if student == "untouched-release":
        return notebooks.read(layout.release_notebook(name))
    if student in ZH_STUDENTS:
        chinese = notebooks.read(CHINESE[name])
        reference = fixtures.reference_answers(notebooks.read(layout.source_notebook(name)))
        if student == "zh-untouched-release":
            return chinese
        answers = reference if student == "zh-solution" else {**reference, **chinese_wrong_fixture(name).answers}
        return fixtures.fill(chinese, answers)
    group = next(group for group in GROUPS[name] if group.student_id == student)
    return fixtures.submission_with(name, group.answers, group.describe())


class Shard:
    """Some of one assignment's submissions, autograded by nbgrader in a scratch course."""

    def __init__(self, course: NbgraderCourse, name: str, students: list[str]):
        self.course = course
        for student in students:
            course.submit(student, name, submission_of(name, student))
        self.log = course.autograde(name)
        self.grades = course.grades(name, students)


class Generated:
    """`generate_assignment` once per assignment and test run: under pytest-xdist the workers
    share one generated course per assignment (made by the first worker that needs it, under
    a file lock); shards start from a copy of it."""

    def __init__(self, base: Path, shared: Path):
        self.base, self.shared = base, shared
        self.lock = threading.Lock()
        self.locks: dict[str, threading.Lock] = {}
        self.count = 0

    def course(self, name: str) -> NbgraderCourse:
        try:
            import fcntl
        except ImportError:  # Windows: no file locks; each worker generates its own
            fcntl = None
        with self.lock:
            lock = self.locks.setdefault(name, threading.Lock())
            self.count += 1
            folder = self.base / f"shard-{name}-{self.count}"
        shared = self.shared if fcntl else self.base
        generated = shared / f"generated-{name}"
        shared.mkdir(parents=True, exist_ok=True)
        with lock, open(shared / f"generated-{name}.lock", "w") as lockfile:
            if fcntl:
                fcntl.flock(lockfile, fcntl.LOCK_EX)  # other workers wait; other assignments go on
            if not (generated / "generated.ok").exists():
                NbgraderCourse(generated, [name]).generate(name)
                (generated / "generated.ok").write_text("")
        shutil.copytree(generated, folder)
        return NbgraderCourse(folder, [name])  # rewrites nbgrader_config.py for its own root


class Graded:
    """The autograde results of one shard of an assignment."""

    def __init__(self, name: str, shard: Shard | Exception):
        self.name = name
        self.source = notebooks.read(layout.source_notebook(name))
        self.points = {notebooks.grade_id(c): notebooks.points(c) for c in notebooks.test_cells(self.source)}
        self.shard = shard

    def explain(self, student: str, expected: dict[str, float]) -> str:
        """A readable account of what a submission scored, and why, for failure messages."""
        got = self.shard.grades.get(student)
        if got is None:
            log = self.shard.log
            return (f"nbgrader produced no grades for {student!r} (the submission was aborted).\n"
                    f"autograde log:\n{log.stdout[-3000:]}\n{log.stderr[-3000:]}")
        lines = []
        try:
            errors = self.messages(student)
        except Exception:  # noqa: BLE001 - diagnostics only
            errors = {}
        for gid, want in expected.items():
            grade = got.get(gid)
            score = None if grade is None else grade.score
            mark = "  " if score == want else "!!"
            lines.append(f"{mark} {gid}: scored {score}, expected {want}  {errors.get(gid, '')[:300]}")
        return "\n".join(lines)

    def messages(self, student: str) -> dict[str, str]:
        """grade id -> the message nbgrader's feedback shows for that cell: its error
        (`ename: evalue`), else what it wrote to stderr, else ""."""
        graded_nb = self.shard.course.autograded_notebook(student, self.name)
        return {notebooks.grade_id(c): next(
            (f"{o.ename}: {o.evalue}" for o in c.outputs if o.output_type == "error"),
            next((o.text for o in c.outputs if o.output_type == "stream" and o.name == "stderr"), ""))
            for c in graded_nb.cells if notebooks.grade_id(c)}

    def scores(self, student: str) -> dict[str, float | None] | None:
        got = self.shard.grades.get(student)
        if got is None:
            return None
        return {gid: (g.score if not g.needs_manual_grade else None) for gid, g in got.items()}


@pytest.fixture(scope="session")
def shard_results(tmp_path_factory, request) -> dict:
    """(assignment, shard) -> Shard, or the exception that stopped it; filled on demand."""
    base = tmp_path_factory.mktemp("nbgrader")
    run = getattr(request.config, "workerinput", {}).get("testrunuid")
    # xdist workers' temporary folders are siblings: the run's id keeps other runs out
    shared = tmp_path_factory.getbasetemp().parent / f"nbgrader-generated-{run}" if run else base
    return {"results": {}, "generated": Generated(base, shared),
            "lock": threading.Lock(), "session": request.session}


def _grade(state, key) -> Shard | Exception:
    name, index = key
    try:
        return Shard(state["generated"].course(name), name, shards_of(name)[index])
    except Exception as exc:  # noqa: BLE001 - reported by that shard's tests only
        return exc


def _grade_selected(state) -> None:
    """Outside xdist: every shard the selected tests need, graded at once (a core each)."""
    keys = []
    for item in state["session"].items:
        key = item_shard(item)
        if key is not None and key not in keys and key not in state["results"]:
            keys.append(key)
    workers = max(1, min(len(keys), os.cpu_count() or 2))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for key, result in zip(keys, pool.map(lambda k: _grade(state, k), keys)):
            state["results"][key] = result


@pytest.fixture
def graded(shard_results, request):
    under_xdist = hasattr(request.config, "workerinput")

    def get(name: str, student: str) -> Graded:
        key = shard_key(name, student)
        with shard_results["lock"]:
            if key not in shard_results["results"]:
                if under_xdist:  # this worker runs this shard's tests: grade it alone
                    shard_results["results"][key] = _grade(shard_results, key)
                else:
                    _grade_selected(shard_results)
        result = shard_results["results"][key]
        if isinstance(result, Exception):
            raise result
        return Graded(name, result)
    return get


def _log_of(log_text: str, student: str) -> str:
    """The part of an autograde log about one student's submission."""
    marker = "Creating/updating student with ID "
    parts = log_text.split(marker)
    return "".join(marker + p for p in parts[1:] if p.startswith(f"'{student}'"))


def _tests_own_message(source, gid: str, evalue: str) -> bool:
    """Whether an AssertionError's message is one an `assert` or `raise` of the test cell wrote
    (the feedback names the line: "(test line N)"), so that it must have a translation of its
    own; not one the code under test raised in its own words (PyTorch's "Torch not compiled
    with CUDA enabled" is an AssertionError too)."""
    line = re.search(r"\(test line (\d+)\)", evalue)
    cell = next((c for c in notebooks.test_cells(source) if notebooks.grade_id(c) == gid), None)
    if line is None or cell is None:
        return False
    at = int(line.group(1))
    for node in ast.walk(ast.parse(cell.source)):
        wrote = isinstance(node, (ast.Assert, ast.Raise)) or (
            isinstance(node, ast.Call) and getattr(node.func, "id", None) in testmessages.HINTED_CALLS)
        if wrote and node.lineno <= at <= (node.end_lineno or node.lineno):
            return True
    return False


def check_chinese_submission(g: Graded, student: str) -> None:
    """A Chinese submission scores what the English one does; nbgrader restores none of its
    cells but the test cells (their hidden tests come back, as for every submission); the
    graded notebook, and for the reference answers the feedback, keep the Chinese statement."""
    if student == "zh-solution":
        expected = g.points
    elif student == "zh-untouched-release":
        expected = {gid: 0.0 for gid in g.points}
    else:
        wrong = chinese_wrong_fixture(g.name)
        expected = fixtures.expected_scores(wrong, g.source)
    assert g.scores(student) == expected, g.explain(student, expected)
    log = g.shard.log.stdout + g.shard.log.stderr
    mine = _log_of(log, student)
    assert mine, f"no part of the autograde log is about {student}:\n{log[-2000:]}"
    tests_with_hidden = {notebooks.grade_id(c) for c in notebooks.test_cells(g.source)
                         if notebooks.BEGIN_HIDDEN in c.source}
    restored = set(re.findall(r"Attribute '\w+' for cell (\S+) has changed", mine))
    assert restored <= tests_with_hidden, f"nbgrader restored cells of a Chinese submission: {restored - tests_with_hidden}"
    chinese = notebooks.read(CHINESE[g.name])
    statement = [c.source for c in chinese.cells if c.cell_type == "markdown"]
    graded_nb = g.shard.course.autograded_notebook(student, g.name)
    assert [c.source for c in graded_nb.cells if c.cell_type == "markdown"] == statement
    if student == "zh-wrong":  # the page, made by nbgrader, says each failure in Chinese too
        g.shard.course.run("generate_feedback", g.name, "--force", "--student", student)
        page = (g.shard.course.root / "feedback" / student / g.name / f"{g.name}.html").read_text(encoding="utf-8")
        failed = [gid for gid, score in g.scores(student).items() if score != g.points[gid]]
        assert failed and html.unescape(page).count("提示：") >= len(failed), (
            f"{len(failed)} failing tests ({failed}), {html.unescape(page).count('提示：')} Chinese hints on the page")
    if student == "zh-solution":  # nbgrader's feedback page shows the Chinese statement
        g.shard.course.run("generate_feedback", g.name, "--force", "--student", student)
        page = (g.shard.course.root / "feedback" / student / g.name / f"{g.name}.html").read_text(encoding="utf-8")
        text = html.unescape(re.sub(r"<[^>]+>", "", page)).replace("`", "")
        headings = [line[3:].strip() for src in statement for line in src.splitlines()
                    if line.startswith("## ") and i18n_markdown.CJK.search(line)]
        assert headings and all(h.replace("`", "") in text for h in headings[:3]), (
            f"the feedback does not show the Chinese statement ({headings[:3]})")
        # `nbgrader generate_feedback` with the course's configuration: the page loads nothing
        # from elsewhere (nbgrader's template alone would fetch MathJax from a CDN).
        assert not nbgrader_ext.remote_references(page), nbgrader_ext.remote_references(page)[:3]


# One test class per shard: pytest-xdist's `--dist loadscope` (what `make.py test` uses) sends
# a class to one worker as a unit, so each shard is autograded once, by the worker that runs
# its tests.
def _shard_class(name: str, index: int, students: list[str]) -> type:
    fixtures_here = [fx for group in GROUPS[name] if group.student_id in students for fx in group.members]

    class Shard:
        ASSIGNMENT, SHARD = name, index

        if "solution" in students:
            def test_solution_autogrades_to_full_marks(self, graded):
                g = graded(name, "solution")
                assert g.scores("solution") == g.points, g.explain("solution", g.points)

        if "untouched-release" in students:
            def test_untouched_release_autogrades_to_zero(self, graded):
                g = graded(name, "untouched-release")
                zero = {gid: 0.0 for gid in g.points}
                assert g.scores("untouched-release") == zero, g.explain("untouched-release", zero)

        if fixtures_here:
            @pytest.mark.parametrize("fx", fixtures_here, ids=[f"{f.assignment}/{f.kind}/{f.name}" for f in fixtures_here])
            def test_fixture_submission_scores_as_declared(self, graded, fx):
                group = group_of(fx)
                g = graded(fx.assignment, group.student_id)
                expected = group.expected_for(fx, g.source)
                got = g.scores(group.student_id)
                got = got if got is None else {gid: got.get(gid) for gid in expected}
                assert got == expected, (f"{fx.description}\ngraded in {group.describe()}\n"
                                         + g.explain(group.student_id, expected))
                if fx.shows:  # the feedback must name what this answer did
                    shown = g.messages(group.student_id)
                    problems = [p for gid in fx.shows for p in fixtures.message_problems(fx, gid, shown.get(gid, ""))]
                    assert not problems, (f"{fx.description}\n" + "\n".join(problems) + "\nthe messages shown:\n"
                                          + "\n".join(f"{gid}: {shown.get(gid, '')[:600]}" for gid in fx.shows))

        def test_every_failure_has_its_chinese(self, graded):
            """Every test that failed, for every submission of this shard (the realistic
            wrong answers), gets its Chinese line on a Chinese edition's feedback page, and
            its fix too (issue 38): the same fold_fixes the page is made with."""
            missing = []
            for student in students:
                g = graded(name, student)
                scores = g.scores(student) or {}
                graded_nb = g.shard.course.autograded_notebook(student, name)
                for cell in graded_nb.cells:
                    gid = notebooks.grade_id(cell)
                    if not notebooks.is_test_cell(cell) or scores.get(gid) in (None, g.points.get(gid)):
                        continue
                    folded = copy.deepcopy(cell)
                    nbgrader_ext.fold_fixes(folded, name, chinese=True)
                    shown = [o.get("data", {}).get("text/plain", "") for o in folded.outputs
                             if o.output_type == "display_data"]
                    error = next((o for o in folded.outputs if o.output_type == "error"), None)
                    said = error is not None and any(text.startswith("提示：") for text in shown)
                    fix_said = all("修正方法：" in text for text in shown if text.startswith("How to fix"))
                    own = (error is not None and error.ename == "AssertionError"
                           and _tests_own_message(g.source, gid, error.evalue))
                    translated = error is not None and testmessages.hint(name, hints.split(error.evalue)[0])
                    if not (said and fix_said) or (own and not translated):
                        message = f"{error.ename}: {error.evalue}" if error is not None else "(no error)"
                        missing.append(f"{student} {gid}: {' '.join(message.split())[:300]}")
            assert not missing, ("failing tests without their Chinese (translate the entries with msgctxt "
                                 "'test message' in the exercise's PO file):\n" + "\n".join(missing))

        chinese_here = [st for st in students if st in ZH_STUDENTS]
        if chinese_here:
            @pytest.mark.parametrize("student", chinese_here)
            def test_chinese_submission_grades_like_an_english_one(self, graded, student):
                check_chinese_submission(graded(name, student), student)

    Shard.__name__ = Shard.__qualname__ = f"TestGrading_{name}_shard{index}"
    return Shard


for _name in ASSIGNMENTS:
    for _index, _students in enumerate(shards_of(_name)):
        _cls = _shard_class(_name, _index, _students)
        globals()[_cls.__name__] = _cls
