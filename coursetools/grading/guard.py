"""What stays of the in-kernel guard once the tests left the kernel (issue 32).

Tests run in the grader's process (coursetools.grading.remote); nothing here runs in the kernel
any more, and nothing here fails a test. What is left:

* the grader's own cells (`_guard_cell`, `guard_role`): the first cell that installs the
  kernel's agent, replayed after a kernel restart;
* **redaction**, a second layer behind "hidden tests never enter the kernel": every output line
  that still shows a line of hidden-test source, or one of the hidden tests' string constants,
  read as a reader sees it (tags removed, character references decoded, zero-width characters
  dropped), is replaced before the notebook is saved or turned into feedback.
"""


from __future__ import annotations

import ast
import re

from nbformat import NotebookNode, v4

from coursetools import notebooks
from coursetools.publish.i18n import N_

TAMPER_ENAME = "TamperingDetected"
REDACTED = N_("[hidden test code removed from feedback]")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

GRADER_FILE = "<grader test {}>"


def _guard_cell(source: str, role: str) -> NotebookNode:
    cell = v4.new_code_cell(source)
    cell.metadata["grader_guard"] = role
    return cell


def guard_role(cell: NotebookNode) -> str | None:
    return cell.get("metadata", {}).get("grader_guard")


def keeps_history(cell: NotebookNode) -> bool:
    """Guard cells and compiled tests stay out of the kernel's history (`In`, `_ih`)."""
    meta = cell.get("metadata", {})
    return not (meta.get("grader_guard") or meta.get("grader_compiled"))


def split_hidden(source: str) -> tuple[str, bool]:
    """`source` with hidden-test lines blanked (same line numbers), and whether it had any."""
    out, inside, had = [], False, False
    for line in source.split("\n"):
        text = line.strip()
        if text == notebooks.BEGIN_HIDDEN:
            inside, had = True, True
            out.append("")
        elif text == notebooks.END_HIDDEN:
            inside = False
            out.append("")
        else:
            out.append("" if inside else line)
    return "\n".join(out), had


def tamper_output(message: str) -> NotebookNode:
    return v4.new_output("error", ename=TAMPER_ENAME, evalue=message, traceback=[f"{TAMPER_ENAME}: {message}"])


def hidden_lines(nb: NotebookNode, min_length: int = 12) -> set[str]:
    """The lines of hidden-test source worth hiding: long enough to say something, and not
    also visible elsewhere in the notebook, even as part of a line (`got = pick_device()` in
    a visible test is no secret)."""
    hidden: set[str] = set()
    visible: set[str] = set()
    for cell in nb.cells:
        inside = False
        for line in cell.source.splitlines():
            text = line.strip()
            if text == notebooks.BEGIN_HIDDEN:
                inside = True
            elif text == notebooks.END_HIDDEN:
                inside = False
            elif inside and notebooks.is_test_cell(cell):
                if len(text) >= min_length and not text.startswith("#"):
                    hidden.add(text)
            else:
                visible.add(text)
    return {h for h in hidden - visible if not any(h in v for v in visible)}


PREDICT_ASSERT = "assert not wrong"  # a Predict question's hidden check: how many answers are wrong


def shown_after_grading(tree: ast.AST) -> set[int]:
    """ids of the string constants of a hidden region meant for the learner once graded:
    a Predict question's `print("What really happens ...")` (hints.REVEAL_PREFIX), the
    message of its `assert not wrong, ...` (how many answers are wrong, and under "How to fix"
    which ones and the rule), and every fix (a `fix_hint(...)` argument: a feedback page gives
    a failed hidden test its fix). Only this text leaves a hidden region."""
    from coursetools.grading.hints import REVEAL_PREFIX

    ids: set[int] = set()
    for node in ast.walk(tree):
        parts = None
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"
                and node.args):
            first = node.args[0]
            text = first.value if isinstance(first, ast.Constant) else (
                first.values[0].value if isinstance(first, ast.JoinedStr) and first.values
                and isinstance(first.values[0], ast.Constant) else "")
            if isinstance(text, str) and text.startswith(REVEAL_PREFIX):
                parts = node.args
        elif (isinstance(node, ast.Assert) and node.msg is not None
              and ast.unparse(node.test) == PREDICT_ASSERT.removeprefix("assert ")):
            parts = [node.msg]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "fix_hint":
            parts = node.args
        for part in parts or []:
            ids.update(id(n) for n in ast.walk(part) if isinstance(n, ast.Constant))
    return ids


def hidden_strings(nb: NotebookNode, min_length: int = 8) -> set[str]:
    """The string constants of the hidden tests (their messages, f-string parts included)
    worth hiding: a function a hidden test calls can read them from the test's code object.
    Each is returned line by line (a printed message spans lines), with its escaped form
    (as a printed tuple of constants shows it); those also visible in the notebook are left out."""
    visible_text = []
    found: set[str] = set()
    for cell in nb.cells:
        if not notebooks.is_test_cell(cell):
            visible_text.append(cell.source)
            continue
        shown, had = split_hidden(cell.source)
        visible_text.append(shown)
        if not had:
            continue
        hidden_numbers = {n for n, (a, b) in enumerate(zip(cell.source.split("\n"), shown.split("\n")), start=1)
                          if a != b}
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        shown = shown_after_grading(tree)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.lineno in hidden_numbers
                    and id(node) not in shown):
                found.add(node.value)
    visible = "\n".join(visible_text)
    out: set[str] = set()
    for text in found:
        for piece in [text, *text.split("\n"), repr(text)[1:-1]]:
            piece = piece.strip()
            if len(piece) >= min_length and piece not in visible:
                out.add(piece)
    return out


_TAG = re.compile(r"<[^>]*>")


def plain_text(text: str) -> str:
    """What a reader sees of `text`: no terminal colours, no tags, character references
    decoded (twice: `&amp;#115;` is an `s` too), no zero-width or other format characters."""
    import html
    import unicodedata

    plain = _ANSI.sub("", text)
    for _ in range(2):
        plain = html.unescape(_TAG.sub("", plain))
    return "".join(c for c in plain if unicodedata.category(c) != "Cf")


def _leaks(text: str, hidden: set[str]) -> bool:
    plain = plain_text(text)
    return any(h in plain for h in hidden)


def _redact_text(text: str, hidden: set[str]) -> str:
    return "\n".join(REDACTED if _leaks(line, hidden) else line for line in text.split("\n"))


def redact(nb: NotebookNode, hidden: set[str]) -> int:
    """Remove hidden-test source (lines, or string constants) from every output of `nb`;
    returns how many outputs were changed."""
    if not hidden:
        return 0
    changed = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            before = repr(out)
            if out.output_type == "stream":
                out.text = _redact_text(out.text, hidden)
            elif out.output_type == "error":
                frames = [f for f in out.get("traceback", []) if not _leaks(f, hidden)]
                if len(frames) != len(out.get("traceback", [])):
                    frames.insert(max(len(frames) - 1, 0), REDACTED)
                out.traceback = frames
                out.evalue = _redact_text(out.get("evalue", ""), hidden)
                if _leaks(out.get("ename", ""), hidden):
                    out.ename = "Error"
            elif out.output_type in ("execute_result", "display_data"):
                for mime, value in list(out.get("data", {}).items()):
                    if isinstance(value, str) and mime in ("text/html", "text/markdown", "image/svg+xml"):
                        # Markup is judged whole, as a reader sees it (a message can be spread
                        # over lines, tags and character references).
                        if _leaks(value, hidden):
                            out.data[mime] = REDACTED
                    elif isinstance(value, str) and (mime.startswith("text/") or mime.endswith("json")
                                                     or mime.endswith("+xml")):
                        out.data[mime] = _redact_text(value, hidden)
            changed += repr(out) != before
    return changed


def hidden_text(nb: NotebookNode) -> set[str]:
    """Everything `redact` removes: hidden-test lines and hidden-test string constants."""
    return hidden_lines(nb) | hidden_strings(nb)
