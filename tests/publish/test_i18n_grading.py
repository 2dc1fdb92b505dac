"""A Chinese submission grades exactly like an English one, through nbgrader itself.

For every exercise of the Chinese edition, a scratch nbgrader course is generated from the
*English* source (solutions/), as an instructor's is, and three Chinese submissions are
autograded: the Chinese release with the reference answers typed in, the untouched Chinese
release, and the Chinese release with a realistic wrong answer (the first wrong fixture of
tests/submissions/ that is graded alone-safe). They must score exactly what the English ones
score (full marks, zero, the fixture's declared points), nbgrader must report no changed cell
(the locked cells are byte for byte the English ones, so their checksums match), and the
feedback must show the Chinese statement. Why it holds is in coursetools/publish/i18n/build.py: only
markdown, answer-cell docstrings and comments are translated, none of them locked.
"""

from __future__ import annotations

import copy
import html
import re

from coursetools.author import fixtures
from coursetools import layout, notebooks
from coursetools.publish.i18n import build, markdown
from coursetools.author.nbgrader_course import NbgraderCourse

ROOT = layout.ROOT
EXERCISES = [s for s in build.edition(ROOT) if s.kind == "exercise"]


def _name(src) -> str:
    return src.path.split("/")[1]


def _wrong_fixture(name: str) -> fixtures.Fixture:
    return next(f for f in fixtures.all_fixtures(ROOT) if f.assignment == name and f.kind == "wrong" and not f.alone)


def check_chinese_submissions(src, tmp_path) -> None:
    name = _name(src)
    source = notebooks.read(layout.source_notebook(name, ROOT))
    chinese = notebooks.read(ROOT / src.target)
    reference = fixtures.reference_answers(source)
    points = {notebooks.grade_id(c): notebooks.points(c) for c in notebooks.test_cells(source)}
    wrong = _wrong_fixture(name)
    course = NbgraderCourse(tmp_path / "course", [name])
    course.generate(name)
    # (fixtures.fill changes the cells of the notebook it is given: a copy each)
    course.submit("zh-solution", name, fixtures.fill(copy.deepcopy(chinese), reference))
    course.submit("zh-untouched", name, copy.deepcopy(chinese))
    course.submit("zh-wrong", name, fixtures.fill(copy.deepcopy(chinese), {**reference, **wrong.answers}))
    log = course.autograde(name)
    grades = course.grades(name, ["zh-solution", "zh-untouched", "zh-wrong"])
    where = f"\nautograde log:\n{log.stdout[-2000:]}\n{log.stderr[-3000:]}"

    def scores(student):
        got = grades[student]
        assert got is not None, f"nbgrader did not grade {student}{where}"
        return {gid: g.score for gid, g in got.items()}

    assert scores("zh-solution") == points, where
    assert scores("zh-untouched") == {gid: 0.0 for gid in points}, where
    assert scores("zh-wrong") == fixtures.expected_scores(wrong, source), f"{wrong.description}{where}"
    # nbgrader puts the hidden tests back into every locked test cell (their checksum is the
    # source's, with the hidden tests): that restore is the only one it may report, as for an
    # English submission; a Chinese statement or answer cell must never be restored.
    tests_with_hidden = {notebooks.grade_id(c) for c in notebooks.test_cells(source)
                         if notebooks.BEGIN_HIDDEN in c.source}
    restored = set(re.findall(r"Attribute '\w+' for cell (\S+) has changed", log.stdout + log.stderr))
    assert restored <= tests_with_hidden, (
        f"nbgrader restored cells of a Chinese submission: {restored - tests_with_hidden}")

    # The graded notebook and the feedback keep the Chinese statement.
    graded = course.autograded_notebook("zh-solution", name)
    statement = [c.source for c in chinese.cells if c.cell_type == "markdown"]
    assert [c.source for c in graded.cells if c.cell_type == "markdown"] == statement
    course.run("generate_feedback", name, "--force")
    page = (course.root / "feedback" / "zh-solution" / name / f"{name}.html").read_text(encoding="utf-8")
    text = html.unescape(re.sub(r"<[^>]+>", "", page))
    headings = [line[3:].strip() for s in statement for line in s.splitlines()
                if line.startswith("## ") and markdown.CJK.search(line)]
    assert headings and all(h.replace("`", "") in text.replace("`", "") for h in headings[:3]), (
        f"the feedback does not show the Chinese statement ({headings[:3]})")


# One test class per exercise: pytest-xdist's `--dist loadscope` (what `make.py test` uses)
# then grades the chapters on different workers (each costs a generate, three autogrades and
# the feedback: about 2 minutes of one worker on a loaded 2-core machine).
def _chapter_class(src) -> type:
    class Chapter:
        def test_chinese_submissions_grade_like_english_ones(self, tmp_path):
            check_chinese_submissions(src, tmp_path)

    Chapter.__name__ = Chapter.__qualname__ = f"TestChineseGrading_{_name(src)}"
    return Chapter


for _src in EXERCISES:
    _cls = _chapter_class(_src)
    globals()[_cls.__name__] = _cls
