"""Grading integrity inside the notebook: tamper checks, compiled tests, hidden tests kept out.

This is the grader's side; coursetools/grading/guard_kernel.py is the kernel's side, sent to the
kernel as source (the kernel never imports it from the course folder, which the sandbox
hides). Before grading, the notebook is instrumented in memory (never on disk):

* a first cell (kept out of the kernel's history and `linecache`) runs guard_kernel's source
  in a namespace of its own, with a private copy of the builtins, and calls its `install`:
  the records it takes, the audit hook it installs and the checks it makes are described
  there;
* around every locked cell of the course (setup, grading helpers: locked *and* known by
  nbgrader's grade id, coursetools.grading.review.is_course_cell) the guard records the names that
  cell defines, and for helper classes and functions their attributes and code;
* before and after every test cell a check compares everything recorded; a change fails
  that test cell with a `TamperingDetected` error naming it, and the grading summary flags
  the submission for manual review. Each check answers with an HMAC of a fresh nonce under a
  key drawn for this run: a check that was replaced, disarmed or silenced fails as well.

The grader's cells reach the guard without looking up any name in the notebook's
namespace (`GUARD_LOOKUP`: a literal expression over `object.__subclasses__()`), so a
function the student defines (`get_ipython`, `globals`, `__import__`, `exec`) never runs
inside a check.

**Compiled tests.** A test cell reaches the kernel as a code object compiled here, run by
the guard's `run`, with only its visible lines in `linecache` (for tracebacks): the hidden
tests never arrive as text, so no history, `linecache` or traceback spy can print them.
Their bytecode is still in the process while they run; see README ("what a determined
student can still do").

**Redaction.** As a second layer, every output line containing a line of hidden-test
source, or one of the hidden tests' string constants (their messages, which a function
called by a hidden test could read from the test's code object), is replaced, and traceback
frames that show hidden lines are dropped, before the notebook is saved or turned into
feedback.
"""


from __future__ import annotations

import ast
import base64
import hashlib
import hmac
import importlib.util
import marshal
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from nbformat import NotebookNode, v4

from coursetools.grading import guard_kernel, review
from coursetools import notebooks

TAMPER_ENAME = "TamperingDetected"
REDACTED = "[hidden test code removed from feedback]"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

GRADER_FILE = "<grader test {}>"
COMPILED_MARK = "# a test cell, compiled by the grader"
TOKEN_PREFIX = "grader-token:"


@dataclass
class Instrumented:
    """A notebook with guard cells added, and where each original cell went."""
    nb: NotebookNode
    positions: list[int]  # original cell index -> index in `nb`
    checks: dict[int, tuple[int, int]]  # original test cell index -> (check before, check after)
    key: bytes = b""
    nonces: dict[int, str] = field(default_factory=dict)  # index in `nb` -> nonce of that check


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


def kernel_source() -> str:
    """guard_kernel.py's source, as the kernel runs it."""
    return Path(guard_kernel.__file__).read_text(encoding="utf-8")


def guard_lookup(name: str) -> str:
    """A Python expression that evaluates to the guard's class (named `name`) without looking
    up any name: only attributes of literals and of builtin types, which no code can patch,
    and `str.__eq__` on the class's name as the type stores it. Of several classes with that
    name it takes the oldest, the guard's (made before any student code ran)."""
    return (f"[c for c in ().__class__.__base__.__subclasses__() "
            f"if {name!r}.__eq__(().__class__.__class__.__dict__['__name__'].__get__(c))][0]")


def _templates(lookup: str) -> dict[str, str]:
    """The grader's cells with placeholder arguments: the kernel compiles them to recognise
    the real ones (same code, other string constants)."""
    return {"verify": f"{lookup}.verify('before x', 'nonce')",
            "run": f"{COMPILED_MARK}\n{lookup}.run('<file>', ('line',), 'blob')"}


def compiled_test_cell(source: str, name: str, lookup: str) -> str | None:
    """The source of a cell that runs test cell `source` without its text reaching the kernel.

    The test is compiled here and sent as a code object (marshal, base64) to the guard's
    `run`: the kernel's history, `linecache` and tracebacks hold its visible lines only; hidden
    lines never arrive as text. None when it does not compile here (the kernel then reports
    the SyntaxError)."""
    filename = GRADER_FILE.format(name)
    try:
        code = compile(source, filename, "exec", dont_inherit=True)
    except SyntaxError:
        return None
    visible, _ = split_hidden(source)
    lines = tuple(line + "\n" for line in visible.split("\n"))
    blob = base64.b64encode(marshal.dumps(code)).decode()
    return f"{COMPILED_MARK}\n{lookup}.run({filename!r}, {lines!r}, {blob!r})"


def instrument(nb: NotebookNode, name: str | None = None) -> Instrumented:
    """A copy of `nb` with the tamper checks added (see the module docstring)."""
    name = name or f"_grader_guard_{secrets.token_hex(8)}"
    key = secrets.token_bytes(32)
    lookup = guard_lookup(name)
    files = {GRADER_FILE.format(notebooks.grade_id(c) or i) for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and notebooks.is_test_cell(c)}
    arguments = ", ".join(repr(a) for a in (name, key, frozenset(files), COMPILED_MARK,
                                             importlib.util.MAGIC_NUMBER, _templates(lookup)))
    init = (f"(lambda ns: (exec(compile({kernel_source()!r}, '<grader guard>', 'exec', dont_inherit=True), ns),\n"
            f"             ns['install']({arguments})))(\n"
            "    {'__name__': '<grader guard>', '__builtins__': dict(vars(__import__('builtins')))})\n"
            "pass")
    if any("meta" in c.source for c in nb.cells if c.cell_type == "code"):
        # PyTorch's first operation on the meta device imports hundreds of modules (1.6 s
        # idle, 6-10 s on a loaded machine): done here, under the grader's own time limit,
        # it is not charged to whichever student cell or test happens to come first.
        init += "\n__import__('torch').zeros(1, device='meta').add_(1)"
    cells = [_guard_cell(init, "init")]
    positions, checks, nonces = [], {}, {}

    def check(where: str) -> int:
        nonce = secrets.token_hex(16)
        nonces[len(cells)] = nonce
        cells.append(_guard_cell(f"{lookup}.verify({where!r}, {nonce!r})", "verify"))
        return len(cells) - 1

    for i, cell in enumerate(nb.cells):
        is_code = cell.cell_type == "code"
        is_test = is_code and notebooks.is_test_cell(cell)
        gid = notebooks.grade_id(cell) or str(i)
        before = check(f"before {gid}") if is_test else None
        locked_setup = is_code and review.is_course_cell(cell) and not is_test
        if locked_setup:
            cells.append(_guard_cell(f"{lookup}.before_locked()", "locked"))
        positions.append(len(cells))
        run = NotebookNode(dict(cell))
        if is_test:
            compiled = compiled_test_cell(cell.source, gid, lookup)
            if compiled is not None:
                run.source = compiled
                run.metadata = NotebookNode(dict(cell.metadata, grader_compiled=True))
        cells.append(run)
        if locked_setup:
            cells.append(_guard_cell(f"{lookup}.after_locked()", "locked"))
        if is_test:
            checks[i] = (before, check(f"after {gid}"))
    out = v4.new_notebook(metadata=nb.metadata)
    out.cells = cells
    return Instrumented(out, positions, checks, key, nonces)


def expected_token(inst: Instrumented, index: int) -> str:
    return TOKEN_PREFIX + hmac.new(inst.key, inst.nonces[index].encode(), hashlib.sha256).hexdigest()


def check_result(inst: Instrumented, index: int) -> str | None:
    """None when the check at `index` ran and proved it is the grader's (signed token);
    otherwise what went wrong."""
    cell = inst.nb.cells[index]
    errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
    if errors:
        message = errors[0].get("evalue", "")
        if errors[0].get("ename") == "RuntimeError" and "changed since the grader" in message:
            return message
        return f"the tamper check could not run ({errors[0].get('ename')}: {message[:200]})"
    want = expected_token(inst, index)
    for out in cell.get("outputs", []):
        if out.output_type == "execute_result" and out.get("data", {}).get("text/plain", "").strip("'\"") == want:
            return None
    return "the tamper check did not answer with the grader's signature (disarmed or its output suppressed)"


def collect_outputs(original: NotebookNode, inst: Instrumented, outcomes: list[str] | None = None
                    ) -> dict[int, str]:
    """Copy outputs back from the instrumented run; a failed check fails its test cell.

    `outcomes[j]`: how the run's cell j ended ("ok", "error", "timeout", "crashed", "not run").
    A check never reached is no evidence; one that hung or died is flagged. Returns the tamper message per original test
    cell index (empty when clean)."""
    found: dict[int, str] = {}
    for i, cell in enumerate(original.cells):
        ran = inst.nb.cells[inst.positions[i]]
        if cell.cell_type == "code":
            cell.outputs = ran.get("outputs", [])
            cell.execution_count = ran.get("execution_count")
        if i in inst.checks:
            problems = []
            for index in inst.checks[i]:
                outcome = outcomes[index] if outcomes is not None else "ok"
                if outcome == "not run":
                    continue  # never reached (the kernel died too often, the budget ran out)
                if outcome in ("timeout", "crashed"):
                    problems.append(f"the tamper check {outcome.replace('crashed', 'crashed the kernel')} "
                                    "(something hooked into the kernel?)")
                    continue
                problem = check_result(inst, index)
                if problem:
                    problems.append(problem)
            if problems:
                found[i] = "; ".join(problems)
                cell.outputs = [tamper_output(found[i])] + list(cell.outputs)
    return found


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
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.lineno in hidden_numbers:
                found.add(node.value)
    visible = "\n".join(visible_text)
    out: set[str] = set()
    for text in found:
        for piece in [text, *text.split("\n"), repr(text)[1:-1]]:
            piece = piece.strip()
            if len(piece) >= min_length and piece not in visible:
                out.add(piece)
    return out


def _leaks(text: str, hidden: set[str]) -> bool:
    plain = _ANSI.sub("", text)
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
                    if isinstance(value, str) and (mime.startswith("text/") or mime.endswith("json")
                                                   or mime.endswith("+xml")):
                        out.data[mime] = _redact_text(value, hidden)
            changed += repr(out) != before
    return changed


def hidden_text(nb: NotebookNode) -> set[str]:
    """Everything `redact` removes: hidden-test lines and hidden-test string constants."""
    return hidden_lines(nb) | hidden_strings(nb)
