"""Grade one exercise notebook a learner edited, the way the instructor's autograder would.

    python3 make.py check 01                 chapter 01: your copy in work/ (from `make.py lab`;
                                             of the English and the Chinese one, the one saved last)
    python3 make.py check 01 --lang zh       your copy of the Chinese edition's, in work/zh/
    python3 make.py check PATH.ipynb         any exercise notebook (the course's path: your copy)

A chapter's number or name grades the learner's copy of its exercise in work/, or the course's
release when `make.py lab` made no copy. No nbgrader course, gradebook or database is needed, and the learner's file is only read.
The graded copy is rebuilt from the learner's answers and the course's own cells:

* every test cell and every locked cell comes from `solutions/` (hidden tests included), so
  editing or deleting a test changes nothing;
* every answer cell comes from the learner (an answer cell they deleted is the stub again);
* cells the learner added stay where they were, but can never carry points.

It then runs in a scratch folder, cell by cell; a test cell scores its points when it ran
without an error and without writing to stderr (nbgrader's rule). A test that never ran
(the kernel died or hung first) scores 0.

The static review of grade-class (coursetools.grading.review) reads the learner's cells too, and
the report lists its findings under the score: the lines an instructor's grading would flag
for a human look (frame access, `exec`, patching torch, ...). They change neither the score
nor the exit status: the self-check tells, the instructor decides.
Exit status: 0 full marks, 1 points missing, 2 the input could not be graded.

The report is in Chinese for a notebook of the Chinese edition (or with `--lang zh`): the
self-check's own words come from locale/zh_CN/tools/messages.po, the test descriptions from
the exercise's PO file (coursetools/publish/i18n); each test's own message stays as the test
wrote it (English, for searching), with its Chinese under it, `提示：…`, read from the same PO
file's templates (coursetools/publish/i18n/testmessages.py); with --explain, the English fix
under "How to fix:" and the Chinese one under `修正方法：…`. Every failure has a fix: one the
test gives, or the self-check's own (an unanswered question, an error of the learner's code).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import textwrap
import time
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

from nbformat import NotebookNode, v4

from coursetools.learner import lab
from coursetools import layout, notebooks
from coursetools.grading import hints, review
from coursetools.grading.execute import CELL_TIMEOUT_S, KernelStartError, Outcome, course_helpers, execute_resilient
from coursetools.publish.i18n import N_, describe_test, language, notebook_language, set_language, testmessages, tr
from coursetools.notebooks import NotebookError


@dataclass
class QuestionResult:
    grade_id: str
    what: str
    score: float
    max_score: float
    message: str = ""
    reveal: list[str] = field(default_factory=list)  # a Predict question's "what really happens"


def _strip_hidden(source: str) -> str:
    out, inside = [], False
    for line in source.splitlines():
        text = line.strip()
        if text == notebooks.BEGIN_HIDDEN:
            inside = True
        elif text == notebooks.END_HIDDEN:
            inside = False
        elif not inside:
            out.append(line)
    return "\n".join(out)


def find_assignment(nb: NotebookNode, path: Path, root: Path = layout.ROOT) -> str:
    """The assignment whose cells this notebook carries (by nbgrader grade ids)."""
    ids = {notebooks.grade_id(c) for c in notebooks.nbgrader_cells(nb)}
    if not ids:
        hint = " (lessons in course/ are not graded)" if path.parent.name == "course" else ""
        raise NotebookError(
            f"{path} is not an exercise notebook of this course: it has no graded cells"
            f"{hint}; check a notebook from exercises/, e.g. "
            "exercises/01_device_basics/01_device_basics.ipynb"
        )
    best, overlap = None, 0
    for name in layout.assignments(root):
        src = notebooks.read(layout.source_notebook(name, root))
        common = len(ids & {notebooks.grade_id(c) for c in notebooks.nbgrader_cells(src)})
        # The file name breaks ties ("01_device_basics (1).ipynb" from a download is fine).
        if common > overlap or (common == overlap and common and path.stem.startswith(name)):
            best, overlap = name, common
    if best is None:
        raise NotebookError(
            f"{path} has nbgrader cells, but none of any assignment of this course "
            f"({', '.join(layout.assignments(root))})"
        )
    return best


def rebuild(learner: NotebookNode, source: NotebookNode, visible_only: bool = False) -> NotebookNode:
    """The notebook to grade: the course's cells, with the learner's answers and extra cells."""
    answers: dict[str, NotebookNode] = {}
    extras: dict[str | None, list[NotebookNode]] = {}
    known = {notebooks.grade_id(c) for c in notebooks.nbgrader_cells(source)}
    anchor: str | None = None
    for cell in learner.cells:
        gid = notebooks.grade_id(cell)
        if gid in known:
            anchor = gid
            answers[gid] = cell
        else:
            extra = v4.new_code_cell(cell.source) if cell.cell_type == "code" else None
            if extra is not None:  # learner's own code cells run; their markdown is irrelevant
                extras.setdefault(anchor, []).append(extra)
    cells: list[NotebookNode] = list(extras.get(None, []))
    for cell in source.cells:
        gid = notebooks.grade_id(cell)
        new = NotebookNode(dict(cell))
        new.metadata = NotebookNode(dict(cell.metadata))
        if gid and notebooks.is_solution(cell):
            mine = answers.get(gid)
            new.source = mine.source if mine is not None else notebooks.clear_solution(cell.source)
        elif visible_only and notebooks.is_test_cell(cell):
            new.source = _strip_hidden(cell.source)
        if new.cell_type == "code" and not notebooks.is_solution(cell):
            new.source = notebooks.strip_solutions_only(new.source)  # as the release and gradebook have it
        if new.cell_type == "code":
            new.outputs, new.execution_count = [], None
        cells.append(new)
        if gid:
            cells.extend(extras.get(gid, []))
    graded = v4.new_notebook(metadata=source.metadata)
    graded.cells = cells
    return graded


# The fixes of the failures the tests do not word themselves (every failure gets one):
# English in the message, like a test's own fix; the Chinese report adds their translation.
NOT_ANSWERED_FIX = N_("write your answer in the answer cell above this test, in place of "
                      "`raise NotImplementedError()`, and run that cell before the tests")
RAISED_FIX = N_("the error is your code's own, raised at the line named above: read its message there "
                "(print the .device and .dtype of the tensors on that line), fix your answer, and run "
                "the answer cell again")


def _message(cell: NotebookNode, outcome: Outcome) -> str:
    if outcome is Outcome.NOT_RUN:
        return tr("did not run: the kernel crashed or hung too often before this test")
    for out in cell.outputs:
        if out.output_type == "error":
            if out.ename == "NotImplementedError" and not out.evalue.strip():
                return tr("not answered yet: the answer cell still raises NotImplementedError") + hints.FIX_MARKER + NOT_ANSWERED_FIX
            if out.ename == "NameError":
                return f"NameError: {out.evalue} " + tr("(did the answer cell run without an error?)")
            if out.ename == "AssertionError":
                # The exercises' call_answer(fn, hint) wraps an error of the answer as
                # "<hint>\nYour code raised <Error>: <message>": an unanswered stub is still
                # "not answered yet", and the hint and the error stay two sentences.
                hint, raised, error = out.evalue.partition(ANSWER_RAISED)
                if raised and re.fullmatch(r"NotImplementedError:?\s*", error):
                    return tr("not answered yet: the answer cell still raises NotImplementedError") + hints.FIX_MARKER + NOT_ANSWERED_FIX
                if raised:
                    hint = hint.rstrip()
                    return (f"{out.ename}: {hint}{'' if hint.endswith(('.', ':', ';')) else '.'} "
                            f"Your code raised {error}".strip())
                return f"{out.ename}: {out.evalue}".strip()
            where = _where(out)
            if where:  # not a check that failed: the code under test raised while the test ran
                observed, fix = hints.split(out.evalue)
                return (f"{out.ename}: {observed}".strip() + "  " + tr("[raised by your code, {where}]").format(where=where)
                        + hints.FIX_MARKER + (fix or RAISED_FIX))
            return f"{out.ename}: {out.evalue}".strip()
        if out.output_type == "stream" and out.get("name") == "stderr":
            first = out.text.strip().splitlines()[0] if out.text.strip() else ""
            return tr("wrote to stderr, which scores 0 under nbgrader (a warning?): ") + first
    return ""


def _where(error: NotebookNode) -> str:
    """Where the error was raised: the traceback's last frame, plainly ("" when the error is
    the grader's own, e.g. a time limit, and has no traceback)."""
    frames = [_plain(line).strip().splitlines()[0] for line in error.get("traceback", [])
              if re.match(r"\s*(Cell In\[|File )", _plain(line))]
    cells = [f for f in frames if f.startswith("Cell In[")]  # the notebook's own cells first
    return (cells or frames or [""])[-1]


def _plain(text: str) -> str:
    """Traceback text without the terminal colours IPython adds."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


ANSWER_RAISED = "\nYour code raised "  # call_answer's wrapping, in the exercises' helpers cells
MESSAGE_HEAD, MESSAGE_TAIL = 160, 560  # characters kept of a long message: its start and end


def _shorten(message: str) -> str:
    """One line of at most about 720 characters, keeping the end (an error's last line,
    e.g. which rank raised what, is the part that matters) as well as the start."""
    flat = " ".join(message.split())
    if len(flat) <= MESSAGE_HEAD + MESSAGE_TAIL:
        return flat
    return f"{flat[:MESSAGE_HEAD].rstrip()} [...] {flat[-MESSAGE_TAIL:].lstrip()}"


def score_cells(nb: NotebookNode, outcomes: list[Outcome]) -> list[QuestionResult]:
    """Points per test cell: nbgrader's `determine_grade` rule, plus "never ran" scores 0."""
    results = []
    for i, cell in enumerate(nb.cells):
        if not notebooks.is_test_cell(cell):
            continue
        max_score = notebooks.points(cell)
        ran_clean = outcomes[i] is Outcome.OK
        results.append(QuestionResult(
            grade_id=notebooks.grade_id(cell) or f"cell {i}",
            what=notebooks.first_comment(cell.source),
            score=max_score if ran_clean else 0.0,
            max_score=max_score,
            message="" if ran_clean else _message(cell, outcomes[i]),
            reveal=hints.reveals("".join(out.get("text", "") for out in cell.get("outputs", [])
                                         if out.output_type == "stream" and out.get("name") == "stdout")),
        ))
    return results


def check(path: Path, *, timeout: int = CELL_TIMEOUT_S, visible_only: bool = False,
          root: Path = layout.ROOT, findings: list[review.Finding] | None = None
          ) -> tuple[str, list[QuestionResult]]:
    """Grade `path`; the static review's findings are appended to `findings` when given."""
    learner = notebooks.read(path)
    name = find_assignment(learner, path, root)
    source = notebooks.read(layout.source_notebook(name, root))
    graded = rebuild(learner, source, visible_only=visible_only)
    if findings is not None:
        findings.extend(review.review_notebook(rebuild(learner, source)))
    with tempfile.TemporaryDirectory(prefix="selfcheck-") as scratch:
        report = execute_resilient(graded, cwd=scratch, timeout=timeout, helpers_source=course_helpers(source))
    return name, score_cells(graded, report.outcomes)


def format_findings(findings: list[review.Finding]) -> str:
    if not findings:
        return ""
    lines = ["Flagged for review: an instructor's grading flags these lines for a human look "
             "(code no answer needs); the score above is not changed."]
    lines += [f"  {finding}" for finding in findings]
    return "\n\n" + "\n".join(lines)


def format_report(path: Path, name: str, results: list[QuestionResult], seconds: float,
                  visible_only: bool, findings: list[review.Finding] | None = None,
                  explain: bool = False, again: str | None = None) -> str:
    """The learner's report (`again`: what to type to check it again, default `path`). A failing test's message says what was observed and which rule
    that breaks; how to fix it (the part after hints.FIX_MARKER) is shown with `explain`."""
    which = tr("visible tests only") if visible_only else tr("visible and hidden tests")
    lines = [tr("Self-check of {path} (assignment {name}; {which}; your file is not modified)").format(
        path=path, name=name, which=which), ""]
    width = max((len(r.grade_id) for r in results), default=10)
    for r in results:
        mark = "ok  " if r.score == r.max_score else "FAIL"
        lines.append(f"  {mark} {r.score:g}/{r.max_score:g}  {r.grade_id:<{width}}  {describe_test(name, r.what)}")
        observed, fix = hints.split(r.message)
        if observed:
            lines.append(textwrap.indent(textwrap.fill(_shorten(observed), width=96), " " * 12))
            lines += _chinese_lines(name, observed, 12)
        if fix and explain:  # the English fix under its English label; the Chinese one under 修正方法
            lines.append(textwrap.indent(textwrap.fill("How to fix: " + _shorten(fix), width=96), " " * 14))
            lines += _chinese_lines(name, fix, 14, fix=True, label=tr("How to fix: "))
        for reveal in r.reveal:  # after the learner's answer was graded, right or wrong
            lines.append(textwrap.indent(textwrap.fill(reveal, width=96), " " * 12))
            lines += _chinese_lines(name, reveal, 12, fix=True)
    total = sum(r.score for r in results)
    possible = sum(r.max_score for r in results)
    lines += ["", tr("Score: {total}/{possible}   ({seconds} s)").format(
        total=f"{total:g}", possible=f"{possible:g}", seconds=f"{seconds:.1f}")]
    if not explain and any(hints.split(r.message)[1] for r in results):
        lines.append(tr("Stuck on one? `python3 make.py check --explain {path}` also says how to fix each failure.").format(
            path=again or path))
    return "\n".join(lines) + format_findings(findings or [])


def _chinese_lines(assignment: str, message: str, indent: int, fix: bool = False,
                   label: str | None = None) -> list[str]:
    """The Chinese line under an English one (an observation, a fix, a reveal), after its
    label: 提示 for what was observed, 修正方法 for a fix."""
    if language() != "zh":
        return []
    ename = re.match(r"([A-Za-z_][\w.]*): ", message)
    chinese = (testmessages.hint(assignment, message) if fix
               else testmessages.failure_hint(assignment, ename.group(1) if ename else "AssertionError", message))
    if not chinese and fix and tr(" ".join(message.split())) != " ".join(message.split()):
        chinese = tr(" ".join(message.split()))  # a fix of the self-check's own (NOT_ANSWERED_FIX)
    if not chinese:
        return []
    label = tr("Hint: ") if label is None else label
    return [" " * indent + line for line in wrap_columns(label + _shorten(chinese), 96 - indent)]


_NO_BREAK_BEFORE = set("，。；：、）》」』”’！？,.;:)]}")


def _columns(ch: str) -> int:
    return 2 if unicodedata.east_asian_width(ch) in "WF" else 1


def wrap_columns(text: str, width: int) -> list[str]:
    """`text` in lines of at most `width` terminal columns (a CJK character takes two), broken
    at spaces or beside a CJK character, never before closing punctuation."""
    lines, line, last_break = [], "", -1
    for ch in text:
        if line and ch != " " and ch not in _NO_BREAK_BEFORE and (_columns(ch) == 2 or _columns(line[-1]) == 2):
            last_break = len(line)
        if line and sum(map(_columns, line)) + _columns(ch) > width:
            cut = last_break if last_break > 0 else len(line)
            lines.append(line[:cut].rstrip())
            line, last_break = line[cut:].lstrip(), -1
        line += ch
        if ch == " ":
            last_break = len(line)
    if line.strip():
        lines.append(line.rstrip())
    return lines


def chapter_named(arg: str, root: Path = layout.ROOT) -> str | None:
    """The assignment `arg` names by its number or its whole name ("01", "1", "01_device_basics"),
    or None when it names none (then it is a path)."""
    names = layout.assignments(root)
    if arg in names:
        return arg
    if arg.isdigit():
        found = [n for n in names if int(n.split("_", 1)[0]) == int(arg)]
        return found[0] if len(found) == 1 else None
    return None


def chapter_notebook(name: str, lang: str | None = None, root: Path = layout.ROOT) -> Path:
    """What `make.py check NAME` grades: the learner's copy of the chapter's exercise in work/,
    the English one (lang="en") or the Chinese edition's in work/zh/ (lang="zh"); with no
    lang, whichever of the two was saved last. The course's own release when `make.py lab`
    made no copy."""
    release = layout.release_notebook(name, root)
    chinese = root / lab.ZH / release.relative_to(root)
    courses = {"en": release, "zh": chinese if chinese.exists() else release}
    wanted = [lang] if lang else ["en", "zh"]
    mine = [c for c in (lab.learner_copy(courses[w], root) for w in wanted) if c is not None]
    found = max(mine, key=lambda c: c.stat().st_mtime) if mine else courses[lang or "en"]
    return found.relative_to(root) if found.is_relative_to(root) else found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 make.py check",
        description="Grade one exercise notebook you edited, with the course's own tests.",
    )
    parser.add_argument("notebook", type=Path,
                        help="the chapter (01, or 01_device_basics): your copy in work/ from `make.py lab`, "
                             "or the course's exercise when you have none; or any exercise notebook's path")
    parser.add_argument("--timeout", type=int, default=CELL_TIMEOUT_S,
                        help=f"seconds allowed per cell (default {CELL_TIMEOUT_S}, as grade-class)")
    parser.add_argument("--visible-only", action="store_true",
                        help="run only the tests you can see in the notebook (as in Colab)")
    parser.add_argument("--as-given", action="store_true",
                        help="grade exactly the file given, even where `make.py lab` made you a copy")
    parser.add_argument("--explain", action="store_true",
                        help="also say how to fix each failing test (by default: what was observed, and the rule)")
    parser.add_argument("--lang", choices=("en", "zh"), default=None,
                        help="the report's language (default: Chinese for a notebook of the Chinese "
                             "edition); with a chapter, also which of your copies to check")
    parser.add_argument("--no-daemon", action="store_true",
                        help="check in this process only (by default a check after the first is run by a "
                             "warm background daemon: coursetools/learner/checkd.py)")
    args = parser.parse_args(argv)
    given = str(args.notebook)
    chapter = None if args.notebook.exists() else chapter_named(str(args.notebook))
    if chapter is not None:
        args.notebook = chapter_notebook(chapter, args.lang)
    set_language(args.lang or notebook_language(args.notebook))
    notebook = args.notebook
    # make.py lab (learner mode) works on copies in work/
    mine = None if args.as_given else lab.learner_copy(notebook)
    if mine is not None:
        notebook = mine.relative_to(layout.ROOT) if mine.is_relative_to(layout.ROOT) else mine
        print(tr("{given} is the course's original; checking your copy, {copy}").format(
            given=args.notebook, copy=notebook) + "\n")
    start = time.perf_counter()
    findings: list[review.Finding] = []
    try:
        name, results = check(notebook, timeout=args.timeout, visible_only=args.visible_only,
                              findings=findings)
    except NotebookError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KernelStartError as exc:
        # Not your answers' fault: no Python kernel starts here (nothing was graded).
        print(f"error: cannot check {notebook}: {exc}\n(the kernel is {sys.executable} -m ipykernel; "
              "`python3 make.py lab` once reinstalls .venv if it is broken)", file=sys.stderr)
        return 2
    # the footer's command checks the same copy again: a chapter checked in Chinese keeps --lang zh
    # (without it `make.py check 01` takes whichever copy was saved last, and answers in its language)
    again = f"{given} --lang zh" if chapter is not None and language() == "zh" else given
    print(format_report(notebook, name, results, time.perf_counter() - start, args.visible_only,
                        findings, explain=args.explain, again=again))
    if not results:
        return 2
    return 0 if all(r.score == r.max_score for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
