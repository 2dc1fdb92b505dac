"""What my class misunderstood: the class report of a grade-class run.

    python3 make.py grade-class ...                        # writes it after every run
    python3 make.py class-report                           # again, for a finished run
    python3 make.py class-report 02_to_semantics --lang zh --csv grades.csv

Beside the grades CSV (grades.csv: grades-report.html and grades-report.json; with `--lang zh`
grades-report.zh.html): one HTML page that needs nothing but itself (inline CSS, figures as
inline SVG, no script, nothing loaded from anywhere; readable on a phone), and the same numbers
as JSON for a script. Per assignment:

- each question's (test cell's) score distribution: how many students got full marks, part of
  them, none, and how many submissions were not graded, drawn (matplotlib, the course's
  colours) and as a table;
- per question, the misconceptions the class showed, by count, each with the students in it and
  the lesson section to revisit. A misconception is the rule a failing test's message names: the
  message template of the test's own `assert` or `raise` that reads the message
  (coursetools/publish/i18n/testmessages.py: the same templates that translate it), so "the
  labels became torch.float32 ..." and "the labels became torch.float64 ..." are one rule. A
  hidden test's failure (its observation is not shown) is named by its fix text
  (coursetools/grading/hints.py); a failure with neither (a timeout, a crash, an error the
  learner's code raised in its own words) counts as "other", with what it was;
- the students flagged for a human look and why (grade-class's flags), the submissions not
  graded and why, and the late ones (nbgrader's timestamps against the assignment's due date).

Everything comes from the gradebook and the graded notebooks (autograded/): the report of a
finished run reads what grade-class left, nothing is graded again.
"""

from __future__ import annotations

import argparse
import datetime
import html
import io
import json
import re
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from coursetools import layout, notebooks
from coursetools.grading import hints
from coursetools.publish import i18n
from coursetools.publish.i18n import testmessages, tr

# Okabe-Ito, as the lessons' figures (coursetools/learner/figures.py): told apart in colour blindness
COLOURS = {"full": "#009E73", "partial": "#E69F00", "zero": "#D55E00", "not_graded": "#C8C8C8"}
LESSON = re.compile(r"lesson (\d+) (§\d+(?:, §\d+)*)")
_TEST_LINE = re.compile(r"\s*\(test line \d+\)\s*$")
HIDDEN_FAILED = "a hidden test failed"
OTHER = "other"
YOUR_CODE_RAISED = re.compile(r"Your code raised ([A-Za-z_][\w.]*)")


@dataclass
class Misconception:
    rule: str            # the English template (holes as "…"), or the fix of a hidden test
    rule_zh: str         # its Chinese, "" when there is none
    kind: str            # "message": a test's own message; "fix": a hidden test's fix; "other"
    lesson: str = ""     # "lesson 02 §4", "" when the message names none
    fix: str = ""        # how to fix, as the feedback page says it
    students: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.students)


@dataclass
class Question:
    id: str
    points: float
    full: list[str] = field(default_factory=list)
    partial: list[str] = field(default_factory=list)
    zero: list[str] = field(default_factory=list)
    misconceptions: list[Misconception] = field(default_factory=list)


@dataclass
class AssignmentReport:
    assignment: str
    submissions: int
    graded: int
    max_score: float
    scores: dict[str, float]                    # graded students' totals
    questions: list[Question]
    flagged: dict[str, list[str]]               # student -> flags (the not-graded ones excepted)
    not_graded: dict[str, list[str]]            # student -> why
    late: dict[str, float]                      # student -> seconds late
    due: str = ""


def _holes_as_ellipsis(template: str) -> str:
    return "".join("…" if isinstance(p, testmessages.Hole) else p for p in testmessages.parse(template))


def classify(assignment: str, output: dict | None, root: Path = layout.ROOT) -> tuple[str, str, str, str, str]:
    """(kind, rule, its Chinese, lesson, fix) of a failing test cell's first error output."""
    if output is None:
        return OTHER, "no error: the test wrote to stderr or printed nothing it passed with", "", "", ""
    ename = output.get("ename", "")
    observed, fix = hints.split(re.sub(r"\x1b\[[0-9;]*m", "", output.get("evalue", "")))
    observed = _TEST_LINE.sub("", observed.strip())
    fix = " ".join(fix.split())
    if observed.startswith(HIDDEN_FAILED):
        if fix:
            return "fix", fix, testmessages.hint(assignment, fix, root), _lesson(fix), fix
        return OTHER, f"{ename}: {HIDDEN_FAILED}", "", "", ""
    raised = YOUR_CODE_RAISED.search(observed)
    if raised:  # call_answer's: the answer itself raised (a NameError after a SyntaxError, ...)
        english, chinese = _both(lambda: tr("your code raised {ename}"))
        return OTHER, english.format(ename=raised.group(1)), chinese.format(ename=raised.group(1)), "", fix
    found = testmessages.template_of(assignment, observed, root) if ename == "AssertionError" else None
    if found is None and observed and ename not in ("AssertionError",):
        # an error the learner's code raised, or the grader's own (a timeout, a dead kernel)
        grader = testmessages.template_of(None, observed, root)
        return OTHER, f"{ename}" + (f": {_holes_as_ellipsis(grader[0])}" if grader else ""), \
            (f"{ename}: {_holes_as_ellipsis(grader[1])}" if grader else ""), "", fix
    if found is None:
        if fix:
            return "fix", fix, testmessages.hint(assignment, fix, root), _lesson(fix), fix
        return OTHER, f"{ename}: {observed[:120]}".rstrip(": "), "", "", ""
    english, chinese = found
    return ("message", _holes_as_ellipsis(english), _holes_as_ellipsis(chinese),
            _lesson(english) or _lesson(observed), fix)


def _both(said) -> tuple[str, str]:
    """(English, Chinese) of a message of this module: `said` (a `tr(...)` call) in each language."""
    was = i18n.language()
    try:
        i18n.set_language("en")
        english = said()
        i18n.set_language("zh")
        chinese = said()
    finally:
        i18n.set_language(was)
    return english, ("" if chinese == english else chinese)


def _lesson(text: str) -> str:
    """The lesson sections a message names, "lesson 02 §2, §8" (every "(lesson NN §N)" of it)."""
    sections: dict[str, list[str]] = {}
    for lesson, named in LESSON.findall(text):
        for section in named.split(", "):
            if section not in sections.setdefault(lesson, []):
                sections[lesson].append(section)
    return "; ".join(f"lesson {lesson} {', '.join(named)}" for lesson, named in sections.items())


def _failing_output(cell) -> dict | None:
    return next((o for o in cell.get("outputs", []) if o.get("output_type") == "error"), None)


def assignment_report(room, assignment: str, results) -> AssignmentReport:
    """The report of one assignment from the gradebook, the graded notebooks and grade-class's
    results (classroom.Result: score, flags)."""
    from nbgrader.api import Gradebook, MissingEntry

    source = notebooks.read(room.source_dir() / assignment / f"{assignment}.ipynb")
    order = [(notebooks.grade_id(c), notebooks.points(c)) for c in notebooks.test_cells(source)]
    questions = {gid: Question(gid, pts) for gid, pts in order}
    groups: dict[str, dict[tuple[str, str], Misconception]] = defaultdict(dict)
    flagged, not_graded, late, scores = {}, {}, {}, {}
    due = ""
    with Gradebook(room.gradebook_url) as gb:
        try:
            duedate = gb.find_assignment(assignment).duedate
            due = duedate.isoformat(sep=" ", timespec="minutes") if duedate else ""
        except MissingEntry:
            pass
        for result in results:
            student = result.student
            if not result.graded:
                not_graded[student] = [f for f in result.flags if f] or ["not graded"]
                continue
            if result.flags:
                flagged[student] = list(result.flags)
            scores[student] = result.score
            try:
                submission = gb.find_submission(assignment, student)
                nb = gb.find_submission_notebook(assignment, assignment, student)
            except MissingEntry:
                continue
            if submission.total_seconds_late and submission.total_seconds_late > 0:
                late[student] = float(submission.total_seconds_late)
            graded_path = room.course / "autograded" / student / assignment / f"{assignment}.ipynb"
            try:
                cells = {notebooks.grade_id(c): c for c in notebooks.read(graded_path).cells if notebooks.grade_id(c)}
            except notebooks.NotebookError:
                cells = {}
            for grade in nb.grades:
                question = questions.get(grade.name)
                if question is None or grade.max_score == 0:
                    continue
                score = grade.score or 0.0
                if score >= grade.max_score:
                    question.full.append(student)
                    continue
                (question.partial if score > 0 else question.zero).append(student)
                kind, rule, rule_zh, lesson, fix = classify(assignment, _failing_output(cells.get(grade.name, {})),
                                                            room_root(room))
                key = (kind, rule)
                group = groups[grade.name].setdefault(key, Misconception(rule, rule_zh, kind, lesson, fix))
                group.students.append(student)
    for gid, question in questions.items():
        question.misconceptions = sorted(groups[gid].values(),
                                         key=lambda m: (m.kind == OTHER, -m.count, m.rule))
    return AssignmentReport(assignment, len(results), len(scores), sum(p for _, p in order), scores,
                            list(questions.values()), flagged, not_graded, late, due)


def room_root(room) -> Path:
    """Where the PO files (the templates of the tests' messages) are: this repository's."""
    return layout.ROOT


# ------------------------------------------------------------------------------- JSON

def to_json(reports: list[AssignmentReport]) -> dict:
    out = {"generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "assignments": {}}
    for r in reports:
        data = asdict(r)
        for q, qd in zip(r.questions, data["questions"]):
            for m, md in zip(q.misconceptions, qd["misconceptions"]):
                md["count"] = m.count
        out["assignments"][r.assignment] = data
    return out


# ---------------------------------------------------------------------------- figures

def distribution_svg(report: AssignmentReport) -> str:
    """Per question, how many students got full marks, part, none, or were not graded: one
    horizontal stacked bar each, as inline SVG (its text stays text: a browser draws it)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [q.id.removeprefix("test_") for q in report.questions]
    parts = [("full", tr("full marks")), ("partial", tr("part of the points")), ("zero", tr("no points")),
             ("not_graded", tr("not graded"))]
    counts = {"full": [len(q.full) for q in report.questions],
              "partial": [len(q.partial) for q in report.questions],
              "zero": [len(q.zero) for q in report.questions],
              "not_graded": [len(report.not_graded)] * len(report.questions)}
    import warnings

    with matplotlib.rc_context({"svg.fonttype": "none", "font.size": 10}), warnings.catch_warnings():
        # svg.fonttype none: the text stays text, which the browser draws in its own fonts
        # (Chinese included); matplotlib's DejaVu, which only measures it, has no CJK glyphs
        warnings.filterwarnings("ignore", message="Glyph .* missing from font")
        # 4.5 inches: on a phone (about 360 px) the text is drawn at about its own size
        fig, ax = plt.subplots(figsize=(4.5, 1.2 + 0.3 * max(len(labels), 1)), facecolor="white")
        left = [0] * len(labels)
        rows = list(range(len(labels)))
        for key, label in parts:
            ax.barh(rows, counts[key], left=left, color=COLOURS[key], label=label, edgecolor="white", height=0.7)
            left = [a + b for a, b in zip(left, counts[key])]
        ax.set_yticks(rows, labels)
        ax.invert_yaxis()
        ax.set_xlabel(tr("students"))
        ax.xaxis.get_major_locator().set_params(integer=True)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
        ax.legend(loc="lower center", bbox_to_anchor=(0.4, 1.0), ncol=2, frameon=False, fontsize=9)
        fig.tight_layout()
        buffer = io.StringIO()
        fig.savefig(buffer, format="svg")
        plt.close(fig)
    svg = buffer.getvalue()
    svg = svg[svg.index("<svg"):]  # no XML prologue or DOCTYPE inside HTML
    svg = re.sub(r"\s*<metadata>.*?</metadata>", "", svg, flags=re.DOTALL)  # RDF: a date, a licence URL
    svg = re.sub(r'(<svg[^>]*?) width="[^"]*" height="[^"]*"', r'\1 role="img"', svg, count=1)
    return svg


# ------------------------------------------------------------------------------- HTML

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"Noto Sans","Noto Sans CJK SC",
"PingFang SC","Microsoft YaHei","WenQuanYi Micro Hei",sans-serif;
margin:0;padding:0 1rem 2rem;color:#1a1a1a;background:#fff;line-height:1.5;font-size:16px}
main{max-width:60rem;margin:0 auto}
h1{font-size:1.5rem;margin:1rem 0 .25rem}h2{font-size:1.25rem;margin:2rem 0 .5rem;border-bottom:2px solid #ddd}
h3{font-size:1.05rem;margin:1.25rem 0 .25rem;overflow-wrap:anywhere}
code{font-size:.9em}h3 code{overflow-wrap:anywhere}
.figure{max-width:36rem}.figure svg{width:100%;height:auto;display:block}
.scroll{overflow-x:auto}
table{border-collapse:collapse;margin:.5rem 0;font-size:.85rem}
th,td{border-bottom:1px solid #ddd;padding:.25rem .4rem;text-align:left;vertical-align:top}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
ol.mis{padding-left:1.25rem}ol.mis li{margin:.5rem 0}
.count{font-weight:600}.lesson{background:#eef6fb;border-radius:.25rem;padding:0 .3rem;white-space:nowrap}
.students{color:#444;font-size:.9rem;overflow-wrap:anywhere}
.other{color:#555}.zh{color:#333}
.summary{color:#333}
details summary{cursor:pointer}
ul.flags{padding-left:1.25rem;font-size:.9rem;overflow-wrap:anywhere}
"""


def _e(text) -> str:
    return html.escape(str(text))


def render_html(reports: list[AssignmentReport], lang: str = "en", title_note: str = "") -> str:
    i18n.set_language(lang)
    zh = i18n.language() == "zh"
    parts = [f'<!DOCTYPE html>\n<html lang="{"zh-CN" if zh else "en"}">\n<head>\n<meta charset="utf-8">\n'
             '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
             f"<title>{_e(tr('What the class misunderstood'))}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<main>\n"
             f"<h1>{_e(tr('What the class misunderstood'))}</h1>\n"]
    if title_note:
        parts.append(f'<p class="summary">{_e(title_note)}</p>\n')
    for r in reports:
        parts.append(_assignment_html(r, zh))
    parts.append("</main>\n</body>\n</html>\n")
    i18n.set_language("en")
    return "".join(parts)


def _short(gid: str) -> str:
    """A test's grade id as the figure names it (no "test_"), breakable after each "_"."""
    return "_<wbr>".join(_e(part) for part in gid.removeprefix("test_").split("_"))


def _students(names: list[str]) -> str:
    return ", ".join(_e(n) for n in names)


def _assignment_html(r: AssignmentReport, zh: bool) -> str:
    out = [f'<section id="{_e(r.assignment)}">\n<h2>{_e(r.assignment)}</h2>\n']
    mean = sum(r.scores.values()) / len(r.scores) if r.scores else 0.0
    out.append('<p class="summary">' + _e(tr("{submissions} submission(s), {graded} graded; mean score {mean} of {max}.").format(
        submissions=r.submissions, graded=r.graded, mean=f"{mean:.1f}", max=f"{r.max_score:g}"))
        + (" " + _e(tr("Due {due}.").format(due=r.due)) if r.due else "") + "</p>\n")
    out.append(f"<h3>{_e(tr('Score per question'))}</h3>\n")
    out.append(f'<div class="figure">{distribution_svg(r)}</div>\n')
    out.append('<div class="scroll"><table class="dist">\n<thead><tr>'
               f"<th>{_e(tr('question'))}</th><th class=\"n\">{_e(tr('points'))}</th>"
               f"<th class=\"n\">{_e(tr('full marks'))}</th><th class=\"n\">{_e(tr('part of the points'))}</th>"
               f"<th class=\"n\">{_e(tr('no points'))}</th></tr></thead>\n<tbody>\n")
    for q in r.questions:
        out.append(f'<tr data-question="{_e(q.id)}"><td><code>{_short(q.id)}</code></td><td class="n">{q.points:g}</td>'
                   f'<td class="n full">{len(q.full)}</td><td class="n partial">{len(q.partial)}</td>'
                   f'<td class="n zero">{len(q.zero)}</td></tr>\n')
    out.append("</tbody></table></div>\n")
    out.append(f"<h3>{_e(tr('Misconceptions, per question'))}</h3>\n")
    missed = [q for q in r.questions if q.misconceptions]
    if not missed:
        out.append(f"<p>{_e(tr('Every graded submission passed every test.'))}</p>\n")
    for q in missed:
        lost = len(q.partial) + len(q.zero)
        out.append(f'<h3 data-question="{_e(q.id)}"><code>{_e(q.id)}</code>: '
                   + _e(tr("{lost} of {graded} lost points").format(lost=lost, graded=r.graded)) + "</h3>\n<ol class=\"mis\">\n")
        for m in q.misconceptions:
            rule = m.rule_zh if zh and m.rule_zh else m.rule
            if m.kind == "fix":
                said = tr("a hidden test failed; the fix it names: {fix}").format(fix=rule)
            elif m.kind == "other":
                said = tr("other: {what}").format(what=rule)
            else:
                said = rule
            lesson = ""
            if m.lesson:
                lesson = f' <span class="lesson">{_e(tr("revisit {section}").format(section=_lesson_label(m.lesson, zh)))}</span>'
            fix = ""
            if m.fix and m.kind == "message":
                fix_text = (testmessages.hint(r.assignment, m.fix) or m.fix) if zh else m.fix
                fix = f"<details><summary>{_e(tr('How to fix'))}</summary><p>{_e(fix_text)}</p></details>"
            out.append(f'<li class="{ "other" if m.kind == "other" else "rule"}" data-count="{m.count}">'
                       f'<span class="count">{_e(tr("{count} of {graded}").format(count=m.count, graded=r.graded))}</span>'
                       + ("：" if zh else ": ") +
                       f"{_e(said)}{lesson}"
                       f'<div class="students">{_students(m.students)}</div>{fix}</li>\n')
        out.append("</ol>\n")
    out.append(f"<h3>{_e(tr('Flagged for a human look'))}</h3>\n")
    out.append(_people(r.flagged))
    out.append(f"<h3>{_e(tr('Not graded'))}</h3>\n")
    out.append(_people(r.not_graded))
    out.append(f"<h3>{_e(tr('Late'))}</h3>\n")
    if r.late:
        out.append('<ul class="flags">' + "".join(
            f"<li><b>{_e(s)}</b>: {_e(_late(seconds))}</li>" for s, seconds in sorted(r.late.items())) + "</ul>\n")
    else:
        out.append(f"<p>{_e(tr('none'))}</p>\n")
    out.append("</section>\n")
    return "".join(out)


def _lesson_label(lesson: str, zh: bool) -> str:
    return LESSON.sub(lambda m: f"第 {m.group(1)} 课 {m.group(2)}", lesson) if zh else lesson


def _late(seconds: float) -> str:
    hours = seconds / 3600
    return tr("{hours} h late").format(hours=f"{hours:.1f}") if hours >= 1 else \
        tr("{minutes} min late").format(minutes=f"{seconds / 60:.0f}")


def _people(people: dict[str, list[str]]) -> str:
    if not people:
        return f"<p>{_e(tr('none'))}</p>\n"
    return '<ul class="flags">' + "".join(
        f"<li><b>{_e(s)}</b>: {'; '.join(_e(f) for f in flags)}</li>" for s, flags in sorted(people.items())) + "</ul>\n"


# ------------------------------------------------------------------------------ files

def paths_for(csv_path: Path, lang: str = "en") -> tuple[Path, Path]:
    """(the HTML page, the JSON file) beside the grades CSV."""
    stem = csv_path.with_suffix("")
    suffix = ".zh.html" if lang == "zh" else ".html"
    return Path(f"{stem}-report{suffix}"), Path(f"{stem}-report.json")


def write(room, results: dict, csv_path: Path, lang: str = "en") -> tuple[Path, Path]:
    """The report of `results` (assignment -> [classroom.Result]), beside `csv_path`."""
    reports = [assignment_report(room, a, rs) for a, rs in results.items()]
    html_path, json_path = paths_for(csv_path, lang)
    html_path.write_text(render_html(reports, lang), encoding="utf-8")
    json_path.write_text(json.dumps(to_json(reports), indent=1, ensure_ascii=False), encoding="utf-8")
    return html_path, json_path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python3 make.py class-report", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("assignments", nargs="*", help="default: every assignment graded in the course")
    parser.add_argument("--course", type=Path, default=layout.ROOT,
                        help="the course folder, holding nbgrader_config.py (default: this repository)")
    parser.add_argument("--csv", type=Path, default=None,
                        help="the grades CSV the report goes beside (default: <course>/grades.csv)")
    parser.add_argument("--db-url", default=None, help="gradebook database, e.g. postgresql://user@host/db")
    parser.add_argument("--lang", choices=i18n.LANGUAGES, default="en", help="the page's language")
    return parser


def main(argv: list[str] | None = None) -> int:
    from coursetools.instructor.classroom import Classroom

    args = build_parser().parse_args(argv)
    room = Classroom(args.course, db_url=args.db_url)
    names = args.assignments or [a for a in room.assignments() if room.students(a)]
    unknown = sorted(set(names) - set(room.assignments()))
    if unknown:
        print(f"error: no assignment {', '.join(unknown)} in {room.source_dir()}", file=sys.stderr)
        return 2
    csv_path = (args.csv or room.course / "grades.csv").resolve()
    results = {a: room.results(a) for a in names}
    html_path, json_path = write(room, results, csv_path, args.lang)
    print(f"class report: {html_path}   data: {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
