"""Reading, writing and inspecting course notebooks, nbgrader cells included.

The predicates mirror `nbgrader.utils` (`is_grade`, `is_solution`, `is_locked`), which they
are tested against; they are re-stated here because importing nbgrader costs ~2 s, and the
learner's self-check should not pay it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import nbformat
from nbformat import NotebookNode

BEGIN_SOLUTION = "### BEGIN SOLUTION"
END_SOLUTION = "### END SOLUTION"
BEGIN_HIDDEN = "### BEGIN HIDDEN TESTS"
END_HIDDEN = "### END HIDDEN TESTS"
# A region of a locked cell that only the course's source holds (solutions/): the release, its
# gradebook and a learner's self-check never see it (nbgrader_ext.StripSolutionsOnly).
# A Predict question's "run this after you've answered" cell keeps there its proof that the
# reference answers are what this PyTorch does: nbval runs it in solutions/, test-torch on every
# release (fixtures.solved_release_with_proofs).
BEGIN_SOLUTIONS_ONLY = "### BEGIN SOLUTIONS ONLY"
END_SOLUTIONS_ONLY = "### END SOLUTIONS ONLY"
# The stub nbgrader writes in place of a solution (nbgrader_config.py sets the same one).
CODE_STUB = "# YOUR CODE HERE\nraise NotImplementedError()"
# nbval permits (does not require) an exception in a cell with this tag.
RAISES_TAG = "raises-exception"


class NotebookError(Exception):
    """A file that cannot be used as a notebook of this course; the message says why."""


def read(path: str | Path) -> NotebookNode:
    """Read a notebook, turning every kind of failure into a one-line `NotebookError`."""
    path = Path(path)
    if not path.exists():
        raise NotebookError(f"no such file: {path}")
    if path.is_dir():
        raise NotebookError(f"{path} is a folder; give the path of an .ipynb file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise NotebookError(f"{path} is not a notebook: it is not UTF-8 text") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NotebookError(
            f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
            "was it saved completely? Re-download it or restore it from git"
        ) from None
    if not isinstance(data, dict) or "cells" not in data:
        raise NotebookError(f"{path} is JSON but not a Jupyter notebook (no 'cells')")
    try:
        return nbformat.reads(text, as_version=4)
    except Exception as exc:  # nbformat raises several types for malformed notebooks
        raise NotebookError(f"{path} is not a readable notebook: {exc}") from None


def write(nb: NotebookNode, path: str | Path) -> None:
    """Write a notebook the way nbgrader and JupyterLab do (indent 1, sorted keys)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))


def nbgrader_meta(cell: NotebookNode) -> dict[str, Any]:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def grade_id(cell: NotebookNode) -> str | None:
    return nbgrader_meta(cell).get("grade_id")


def is_solution(cell: NotebookNode) -> bool:
    return bool(nbgrader_meta(cell).get("solution", False))


def is_grade(cell: NotebookNode) -> bool:
    return bool(nbgrader_meta(cell).get("grade", False))


def is_locked(cell: NotebookNode) -> bool:
    meta = nbgrader_meta(cell)
    if is_solution(cell):
        return False
    return bool(is_grade(cell) or meta.get("locked", False))


def is_test_cell(cell: NotebookNode) -> bool:
    """An autograded test: a code cell with points that is not an answer cell."""
    return cell.cell_type == "code" and is_grade(cell) and not is_solution(cell)


def points(cell: NotebookNode) -> float:
    return float(nbgrader_meta(cell).get("points", 0))


def nbgrader_cells(nb: NotebookNode) -> Iterator[NotebookNode]:
    for cell in nb.cells:
        if grade_id(cell):
            yield cell


def test_cells(nb: NotebookNode) -> list[NotebookNode]:
    return [c for c in nb.cells if is_test_cell(c)]


def has_outputs(nb: NotebookNode) -> bool:
    return any(
        c.cell_type == "code" and (c.get("outputs") or c.get("execution_count") is not None)
        for c in nb.cells
    )


def clear_outputs(nb: NotebookNode) -> NotebookNode:
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    return nb


def strip_solution_markers(source: str) -> str:
    """A solution cell's code with the `### BEGIN/END SOLUTION` lines removed."""
    keep = [
        line for line in source.splitlines()
        if line.strip() not in (BEGIN_SOLUTION, END_SOLUTION)
    ]
    return "\n".join(keep)


def strip_solutions_only(source: str) -> str:
    """`source` without its `### BEGIN/END SOLUTIONS ONLY` regions (the marker lines included);
    unchanged when it has none. An unclosed region is an error, not a silent cut to the end."""
    if BEGIN_SOLUTIONS_ONLY not in source:
        return source
    out: list[str] = []
    inside = False
    for line in source.split("\n"):
        stripped = line.strip()
        if stripped == BEGIN_SOLUTIONS_ONLY:
            if inside:
                raise ValueError(f"nested {BEGIN_SOLUTIONS_ONLY}")
            inside = True
        elif stripped == END_SOLUTIONS_ONLY:
            if not inside:
                raise ValueError(f"{END_SOLUTIONS_ONLY} without {BEGIN_SOLUTIONS_ONLY}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{BEGIN_SOLUTIONS_ONLY} without {END_SOLUTIONS_ONLY}")
    return "\n".join(out).rstrip("\n")


FIX_HELPER = "fix_hint"


def fix_hint_calls(source: str) -> list:
    """The `fix_hint(...)` calls of a cell's code (ast.Call nodes), outermost first; [] when
    the code has none. Code that does not parse as Python but mentions fix_hint is an error:
    its fixes could not be taken out of a release."""
    import ast

    if FIX_HELPER + "(" not in source:
        return []
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ValueError(f"a cell that calls {FIX_HELPER} does not parse as Python ({exc.msg}, line "
                         f"{exc.lineno}): its fix texts cannot be left out of the release") from None
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Name) and node.func.id == FIX_HELPER]
    return sorted(calls, key=lambda n: (n.lineno, n.col_offset))


def strip_fix_texts(source: str) -> str:
    """`source` with every `fix_hint(<fix text>)` call turned into `fix_hint()`: what a release
    cell holds (the gradebook and the course's side keep the text). Offsets are ast's, which
    count UTF-8 bytes within a line."""
    calls = [c for c in fix_hint_calls(source) if c.args or c.keywords]
    if not calls:
        return source
    lines = source.encode("utf-8").split(b"\n")
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    data = source.encode("utf-8")
    spans, last_end = [], -1
    for call in calls:
        start = starts[call.lineno - 1] + call.col_offset
        end = starts[call.end_lineno - 1] + call.end_col_offset
        if start < last_end:  # a fix_hint call inside another one's text goes with it
            continue
        spans.append((start, end))
        last_end = end
    for start, end in reversed(spans):
        data = data[:start] + FIX_HELPER.encode() + b"()" + data[end:]
    return data.decode("utf-8")


def clear_solution(source: str, stub: str = CODE_STUB) -> str:
    """What nbgrader's ClearSolutions leaves of an answer cell: the stub in place of the
    marked region, at the region's indentation (or the whole cell when unmarked). Lines are
    split on "\n" as nbgrader splits them, so a trailing newline survives as it does there."""
    lines = source.split("\n")
    if not any(line.strip() == BEGIN_SOLUTION for line in lines):
        return stub
    out: list[str] = []
    inside = False
    for line in lines:
        stripped = line.strip()
        if stripped == BEGIN_SOLUTION:
            indent = line[: len(line) - len(line.lstrip())]
            out.extend(indent + stub_line for stub_line in stub.splitlines())
            inside = True
        elif stripped == END_SOLUTION:
            inside = False
        elif not inside:
            out.append(line)
    return "\n".join(out)


def first_comment(source: str) -> str:
    """What a test cell says it checks: its docstring's first paragraph (joined into one
    line, however many lines it spans), or else its first comment line."""
    lines = source.splitlines()
    for n, line in enumerate(lines):
        text = line.strip()
        if not text:
            continue
        for quote in ('"""', "'''"):
            if text.startswith(quote):
                parts = [text[len(quote):]]
                for more in lines[n + 1:]:
                    if quote in parts[-1] or not more.strip():
                        break
                    parts.append(more.strip())
                return " ".join(parts).split(quote)[0].strip()
        if text.startswith("#"):
            return text.lstrip("# ").strip()
        return ""
    return ""
