"""Grading integrity inside the notebook: tamper checks, and feedback that hides hidden tests.

**Tamper checks.** Before grading, the notebook is instrumented in memory (never on disk):

* a first cell records, out of the students' reach (in a closure), every public callable of
  `builtins`, `torch`, `torch.Tensor`, `torch.nn.Module`, `torch.nn.functional`,
  `torch.testing`, `torch.cuda`, `torch.backends.mps` and `torch.accelerator`;
* around every locked cell (setup, grading helpers) it records the names that cell defines,
  and for helper classes and functions their attributes and code;
* before every test cell it checks that none of these changed. A change — a
  monkeypatched `torch.Tensor.to`, a redefined test helper, a replaced `isinstance` — fails
  that test cell with a `TamperingDetected` error naming what changed; the grading summary
  flags the submission for manual review.

Test cells may patch things themselves (`unittest.mock`): the check runs between cells,
after such patches are undone. The checker lives under a random module name in
`sys.modules` for each run; code written to hunt for it could defeat it — this is a
tripwire for the usual tricks, not a wall (the sandbox is the wall).

**Redaction.** Hidden tests are executed, so their source can reach outputs: in a
traceback's frames, or printed by code that digs through the kernel's history. Every
output line containing a line of hidden-test source is replaced, and traceback frames that
show hidden lines are dropped, before the notebook is saved or turned into feedback.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from nbformat import NotebookNode, v4

from . import notebooks

TAMPER_ENAME = "TamperingDetected"
REDACTED = "[hidden test code removed from feedback]"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_IGNORED_GLOBALS = {"In", "Out", "exit", "quit", "get_ipython"}

_GUARD_INIT = r'''
def _make_guard(module_name):
    import builtins, sys, types
    import torch, torch.nn, torch.nn.functional, torch.testing

    spaces = {"builtins": builtins, "torch": torch, "torch.Tensor": torch.Tensor,
              "torch.nn.Module": torch.nn.Module, "torch.nn.functional": torch.nn.functional,
              "torch.testing": torch.testing, "torch.cuda": torch.cuda,
              "torch.backends.mps": torch.backends.mps}
    if hasattr(torch, "accelerator"):
        spaces["torch.accelerator"] = torch.accelerator
    _vars, _callable, _isinstance, _type, _list = vars, callable, isinstance, type, list
    _ModuleType, _missing, _sorted, _len = types.ModuleType, object(), sorted, len

    def watched(space):
        return {k: v for k, v in _vars(space).items()
                if not k.startswith("_") and _callable(v) and not _isinstance(v, _ModuleType)}

    # ipykernel swaps these per request, to route input() to the front end.
    _VOLATILE = {"input", "raw_input", "getpass"}

    def wraps(new, old):
        """torch wraps some of its own functions later (importing torch._dynamo wraps
        torch.manual_seed with functools.wraps): a torch wrapper of the original is fine."""
        seen = 0
        while new is not _missing and seen < 5:
            module = getattr(new, "__module__", None) or ""
            if not (module == "torch" or module.startswith("torch.")):
                return False
            new, seen = getattr(new, "__wrapped__", _missing), seen + 1
            if new is old:
                return True
        return False

    reference = {name: watched(space) for name, space in spaces.items()}
    locked_names = {}
    pending = {}

    def before_locked(g):
        pending.clear()
        pending.update(g)

    locked_insides = {}

    def insides(v):
        """What a helper's behaviour hangs on: a class's attributes, a function's code."""
        if _isinstance(v, _type):  # minus the caches Python itself adds (copy, pickle, abc)
            return {k: x for k, x in _vars(v).items() if k not in ("__slotnames__", "_abc_impl")}
        code = getattr(v, "__code__", None)
        if code is not None:
            return (code, getattr(v, "__defaults__", None), getattr(v, "__kwdefaults__", None))
        return None

    def after_locked(g):
        for k, v in _list(g.items()):
            if k.startswith("_") or k in ("In", "Out", "exit", "quit", "get_ipython"):
                continue
            if pending.get(k, _missing) is not v:
                locked_names[k] = v
                locked_insides[k] = insides(v)

    def verify(g, before):
        changed = []
        for name, ref in reference.items():
            space = spaces[name]
            now = _vars(space)
            for k, v in ref.items():
                if k in _VOLATILE:
                    continue
                current = now.get(k, _missing)
                if current is not v and not wraps(current, v):
                    changed.append(f"{name}.{k}")
            if _isinstance(space, _type):  # a class: an added method shadows an inherited one
                for k in now:
                    if k not in ref and not k.startswith("_") and _callable(now[k]):
                        changed.append(f"{name}.{k} (added)")
        for k, v in locked_names.items():
            if g.get(k, _missing) is not v:
                changed.append(k)
            elif insides(v) != locked_insides[k]:
                changed.append(f"{k} (modified)")
        if changed:
            shown = ", ".join(_sorted(changed)[:8]) + (" ..." if _len(changed) > 8 else "")
            raise RuntimeError(f"before {before}: {shown} changed since the grader's setup "
                               "(monkeypatched?); flagged for manual review")

    sys.modules[module_name] = types.SimpleNamespace(
        before_locked=before_locked, after_locked=after_locked, verify=verify)

_make_guard(__MODULE__)
del _make_guard
'''


@dataclass
class Instrumented:
    """A notebook with guard cells added, and where each original cell went."""
    nb: NotebookNode
    positions: list[int]  # original cell index -> index in `nb`
    verify_before: dict[int, int]  # original test cell index -> index of its verify cell


def _guard_cell(source: str) -> NotebookNode:
    cell = v4.new_code_cell(source)
    cell.metadata["grader_guard"] = True
    return cell


def instrument(nb: NotebookNode, module: str | None = None) -> Instrumented:
    """A copy of `nb` with the tamper checks added (see the module docstring)."""
    module = module or f"_grader_guard_{secrets.token_hex(8)}"
    ref = f"__import__('sys').modules[{module!r}]"
    cells = [_guard_cell(_GUARD_INIT.replace("__MODULE__", repr(module)).strip())]
    positions, verify_before = [], {}
    for i, cell in enumerate(nb.cells):
        is_code = cell.cell_type == "code"
        if is_code and notebooks.is_test_cell(cell):
            verify_before[i] = len(cells)
            cells.append(_guard_cell(f"{ref}.verify(globals(), {notebooks.grade_id(cell)!r})"))
        locked_setup = is_code and notebooks.is_locked(cell) and not notebooks.is_test_cell(cell)
        if locked_setup:
            cells.append(_guard_cell(f"{ref}.before_locked(globals())"))
        positions.append(len(cells))
        cells.append(NotebookNode(dict(cell)))
        if locked_setup:
            cells.append(_guard_cell(f"{ref}.after_locked(globals())"))
    out = v4.new_notebook(metadata=nb.metadata)
    out.cells = cells
    return Instrumented(out, positions, verify_before)


def collect_outputs(original: NotebookNode, inst: Instrumented) -> list[str]:
    """Copy outputs back from the instrumented run; a failed check fails its test cell.

    Returns the tamper messages found (empty when clean).
    """
    found = []
    for i, cell in enumerate(original.cells):
        ran = inst.nb.cells[inst.positions[i]]
        if cell.cell_type == "code":
            cell.outputs = ran.get("outputs", [])
            cell.execution_count = ran.get("execution_count")
        if i in inst.verify_before:
            check = inst.nb.cells[inst.verify_before[i]]
            errors = [o for o in check.get("outputs", []) if o.output_type == "error"]
            if errors:
                message = errors[0].get("evalue", "")
                if errors[0].get("ename") != "RuntimeError" or "changed since the grader" not in message:
                    message = f"the tamper check could not run ({errors[0].get('ename')}: {message})"
                found.append(message)
                cell.outputs = [v4.new_output("error", ename=TAMPER_ENAME, evalue=message,
                                              traceback=[f"{TAMPER_ENAME}: {message}"])] + list(cell.outputs)
    return found


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


def _leaks(text: str, hidden: set[str]) -> bool:
    plain = _ANSI.sub("", text)
    return any(h in plain for h in hidden)


def _redact_text(text: str, hidden: set[str]) -> str:
    return "\n".join(REDACTED if _leaks(line, hidden) else line for line in text.split("\n"))


def redact(nb: NotebookNode, hidden: set[str]) -> int:
    """Remove hidden-test source from every output of `nb`; returns how many were changed."""
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
            elif out.output_type in ("execute_result", "display_data"):
                for mime, value in list(out.get("data", {}).items()):
                    if isinstance(value, str) and (mime.startswith("text/") or mime.endswith("json")):
                        out.data[mime] = _redact_text(value, hidden)
            changed += repr(out) != before
    return changed
