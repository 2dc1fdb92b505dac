"""Fast checks for an author working on one chapter (the full truth is `make.py test`).

    python3 make.py author-check 01_device_basics

1. regenerates the chapter's release with nbgrader;
2. runs the lesson and the solution notebook: every cell must run cleanly;
3. grades, with the self-check's engine (nbgrader's scoring rule), the release with the
   reference answers typed in (full marks), the untouched release (zero), and every fixture
   under tests/submissions/<chapter>/ (exactly the points it declares lost, and the messages
   its [shows] table declares);
4. prints each notebook's run time (the course's budget is 30 s on a 2-core CPU).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from nbformat import NotebookNode

from coursetools.author import fixtures, release
from coursetools import layout, notebooks
from coursetools.learner import selfcheck
from coursetools.grading.execute import CELL_TIMEOUT_S, Outcome, course_helpers, execute_resilient


def run_clean(path: Path) -> tuple[bool, float, list[str]]:
    """Execute a notebook; return (all cells OK, seconds, problems)."""
    nb = notebooks.read(path)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        report = execute_resilient(nb, cwd=scratch, timeout=CELL_TIMEOUT_S, max_restarts=0)
    seconds = time.perf_counter() - start
    problems = []
    for i, (cell, outcome) in enumerate(zip(nb.cells, report.outcomes)):
        if cell.cell_type == "code" and outcome is not Outcome.OK:
            detail = next((f"{o.ename}: {o.evalue}" for o in cell.outputs if o.output_type == "error"),
                          next((o.text[:300] for o in cell.outputs
                                if o.output_type == "stream" and o.name == "stderr"), ""))
            problems.append(f"cell {i} {outcome.value}: {detail[:500]}")
    return not problems, seconds, problems


def grade(nb: NotebookNode, name: str) -> tuple[dict[str, float], list[selfcheck.QuestionResult], float]:
    source = notebooks.read(layout.source_notebook(name))
    graded = selfcheck.rebuild(nb, source)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        report = execute_resilient(graded, cwd=scratch, timeout=CELL_TIMEOUT_S,
                                   helpers_source=course_helpers(source))
    results = selfcheck.score_cells(graded, report.outcomes)
    return {r.grade_id: r.score for r in results}, results, time.perf_counter() - start


def check_chapter(name: str) -> bool:
    ok = True
    release.release([name])
    print(f"released exercises/{name}/{name}.ipynb")
    lesson = layout.COURSE_DIR / f"{name}.ipynb"
    for path in [lesson, layout.source_notebook(name)]:
        if not path.exists():
            print(f"MISSING {path.relative_to(layout.ROOT)}")
            ok = False
            continue
        clean, seconds, problems = run_clean(path)
        ok &= clean
        print(f"{'ok  ' if clean else 'FAIL'} {path.relative_to(layout.ROOT)} ran in {seconds:.1f} s")
        for p in problems:
            print(f"       {p}")
    source = notebooks.read(layout.source_notebook(name))
    full = {notebooks.grade_id(c): notebooks.points(c) for c in notebooks.test_cells(source)}
    cases: list[tuple[str, NotebookNode, dict[str, float], fixtures.Fixture | None]] = [
        ("reference answers -> full marks", fixtures.solved_release(name), full, None),
        ("untouched release -> zero", notebooks.read(layout.release_notebook(name)),
         {k: 0.0 for k in full}, None),
    ]
    folder = layout.SUBMISSIONS_DIR / name
    for path in sorted(folder.glob("*.toml")) if folder.is_dir() else []:
        fx = fixtures.load(path)
        cases.append((f"{fx.kind} {fx.name}", fixtures.submission(fx), fixtures.expected_scores(fx, source), fx))
    for label, nb, expected, fx in cases:
        got, results, seconds = grade(nb, name)
        wrong = {k: (got.get(k), v) for k, v in expected.items() if got.get(k) != v}
        shown = {r.grade_id: r.message for r in results}
        unsaid = [p for gid in (fx.shows if fx else {}) for p in fixtures.message_problems(fx, gid, shown.get(gid, ""))]
        ok &= not wrong and not unsaid
        print(f"{'ok  ' if not wrong and not unsaid else 'FAIL'} {label} "
              f"({sum(got.values()):g}/{sum(full.values()):g}, {seconds:.1f} s)")
        for gid, (g, e) in wrong.items():
            print(f"       {gid}: got {g}, expected {e}  {shown.get(gid, '')[:300]}")
        for problem in unsaid:
            gid = problem.split(":", 1)[0]
            print(f"       {problem}; it says: {shown.get(gid, '')[:300]}")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 make.py author-check", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+", help="chapters, e.g. 01_device_basics")
    args = parser.parse_args(argv)
    results = [check_chapter(n) for n in args.names]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
