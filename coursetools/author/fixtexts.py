"""No fix in a release, and a fix for every failure.

Feedback comes in two steps (coursetools/grading/hints.py): a failing test says what it
observed and which rule that breaks; how to fix it comes from the grader's side only
(`make.py check --explain`, the feedback page's "How to fix"). Three rules hold it:

* `rules(source)`: in the course's own notebook (solutions/), every fix text is the literal
  argument of a `fix_hint(...)` call (a string, an f-string, or a sum of them), so the release
  step can take it out (notebooks.strip_fix_texts); and every failure a test cell can raise
  (each `assert`, each `raise AssertionError(...)`) carries a fix: its message calls
  fix_hint, or adds a name the notebook assigns from a fix_hint call (`HINT =
  fix_hint("...")`). In the locked helpers cell, a raised message carries either a fix_hint
  call or a fix the test passed in (a parameter whose name holds "fix" or "hint").
* `fragments(source)`: the words of every fix text (its literal parts, whitespace
  normalised), what `scan` looks for.
* `scan(release, fragments)`: a release (English or Chinese) has no `fix_hint` call with an
  argument and no fix text anywhere a learner reads it: code, comments, markdown.

tests/course/test_no_answer_in_release.py runs them, with positive controls: a fix planted in
a copy of a release (as a fix_hint argument, as a plain string) is found.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from nbformat import NotebookNode

from coursetools import notebooks

MIN_FRAGMENT = 24   # characters of a fix text's literal part worth looking for (shorter: common words)


@dataclass(frozen=True)
class Problem:
    cell: int
    line: int
    what: str

    def __str__(self) -> str:
        return f"cell {self.cell}, line {self.line}: {self.what}"


def _is_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _is_literal(node.left) and _is_literal(node.right)
    return False


def _literal_parts(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return [v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
    if isinstance(node, ast.BinOp):
        return _literal_parts(node.left) + _literal_parts(node.right)
    return []


def _calls_fix_hint(node: ast.AST | None) -> bool:
    return node is not None and any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == notebooks.FIX_HELPER
        for n in ast.walk(node))


def _names_a_passed_fix(node: ast.AST | None, params: set[str]) -> bool:
    return node is not None and any(isinstance(n, ast.Name) and n.id in params for n in ast.walk(node))


def _parse(source: str):
    try:
        return ast.parse(source)  # nbgrader's marker lines are comments
    except SyntaxError:
        return None


def _raised_messages(tree: ast.AST):
    """(line, message node or None, enclosing function or None) of every `assert` and every
    `raise AssertionError(...)` in `tree`."""
    def walk(node, func):
        for child in ast.iter_child_nodes(node):
            inner = child if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) else func
            if isinstance(child, ast.Assert):
                yield child.lineno, child.msg, func
            elif isinstance(child, ast.Raise) and child.exc is not None:
                exc = child.exc
                if isinstance(exc, ast.Call) and isinstance(exc.func, ast.Name) and exc.func.id == "AssertionError":
                    yield child.lineno, (exc.args[0] if exc.args else None), func
            yield from walk(child, inner)
    yield from walk(tree, None)


def _fix_params(func) -> set[str]:
    if func is None or isinstance(func, ast.Lambda):
        return set()
    args = func.args
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    return {a.arg for a in every if "fix" in a.arg.lower() or "hint" in a.arg.lower()}


def _fix_names(source: NotebookNode) -> set[str]:
    """Names a code cell of the notebook assigns a value that calls fix_hint (`HINT =
    fix_hint("...")`, `HINT = "rule" + fix_hint("...")`): a message that adds one has a fix."""
    names: set[str] = set()
    for cell in source.cells:
        if cell.cell_type != "code" or notebooks.FIX_HELPER + "(" not in cell.source:
            continue
        tree = _parse(cell.source)
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.Assign) and _calls_fix_hint(node.value):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def rules(source: NotebookNode, every_failure: bool = True) -> list[Problem]:
    """What breaks the rules of the module docstring in a course notebook (solutions/); with
    `every_failure` False, only the first (fix texts as fix_hint's literal argument)."""
    problems: list[Problem] = []
    fix_names = _fix_names(source)
    for index, cell in enumerate(source.cells):
        if cell.cell_type != "code" or notebooks.is_solution(cell):
            continue
        test = notebooks.is_grade(cell)
        helpers = notebooks.is_locked(cell) and not test and "def " in cell.source
        if not (test or helpers or notebooks.FIX_HELPER + "(" in cell.source):
            continue
        tree = _parse(cell.source)
        if tree is None:
            if test:
                problems.append(Problem(index, 0, "a test cell that does not parse as Python"))
            continue
        for call in notebooks.fix_hint_calls(cell.source):
            if len(call.args) != 1 or call.keywords or not _is_literal(call.args[0]):
                problems.append(Problem(index, call.lineno, (
                    f"{ast.unparse(call)[:80]}: a fix is the one literal argument of fix_hint (a string, an "
                    "f-string, or a sum of them), so that the release step can take it out")))
        if not every_failure or not (test or helpers):
            continue
        for line, message, func in _raised_messages(tree):
            if _calls_fix_hint(message) or _names_a_passed_fix(message, fix_names):
                continue
            if helpers and _names_a_passed_fix(message, _fix_params(func)):
                continue
            problems.append(Problem(index, line, (
                "a failure whose message has no fix_hint(...): `--explain` and the feedback page owe a fix "
                "for every failure" if message is not None else
                "an assert without a message: say what was observed, the rule, and a fix_hint(...)")))
    return problems


def _normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def fragments(source: NotebookNode) -> set[str]:
    """The literal parts of every fix text of a course notebook, whitespace normalised, that are
    long enough to be the fix's own words."""
    found: set[str] = set()
    for cell in source.cells:
        if cell.cell_type != "code":
            continue
        try:
            calls = notebooks.fix_hint_calls(cell.source)
        except ValueError:
            continue
        for call in calls:
            for arg in call.args:
                for part in _literal_parts(arg):
                    part = _normalise(part)
                    if len(part) >= MIN_FRAGMENT:
                        found.add(part)
    return found


def _strings(tree: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def scan(release: NotebookNode, fix_fragments: set[str]) -> list[Problem]:
    """Every place in a release where a learner can read a fix (module docstring)."""
    problems: list[Problem] = []
    for index, cell in enumerate(release.cells):
        text = _normalise(cell.source)
        if cell.cell_type == "code":
            try:
                calls = notebooks.fix_hint_calls(cell.source)
            except ValueError as exc:
                problems.append(Problem(index, 0, str(exc)))
                calls = []
            for call in calls:
                if call.args or call.keywords:
                    problems.append(Problem(index, call.lineno, f"{ast.unparse(call)[:80]}: a fix text in the release"))
            tree = _parse(cell.source)
            if tree is not None:  # string literals joined as Python joins them, comments as written
                text = text + " " + _normalise(" ".join(_strings(tree)))
        for fragment in fix_fragments:
            if fragment in text:
                problems.append(Problem(index, 0, f"a fix's words: {fragment[:70]!r}"))
    return problems
