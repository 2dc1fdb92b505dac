"""Grading integrity inside the notebook: tamper checks, compiled tests, hidden tests kept out.

**Tamper checks.** Before grading, the notebook is instrumented in memory (never on disk):

* a first cell (kept out of the kernel's history and `linecache`) records, out of the
  students' reach (in a closure): every public callable of `builtins`, `torch`,
  `torch.nn.functional`, `torch.testing`, `torch.cuda`, ... with its `__code__`; every
  attribute of `torch.Tensor` and `torch.nn.Module`; IPython's and ipykernel's machinery
  (custom exception handler, events, input and AST transformers, display hook and
  publisher, traceback display, compiler, `sys.stdout/stderr`, trace and profile hooks,
  and every attribute of the classes behind them). It installs an audit hook, which cannot
  be removed, that notes `__code__` swaps, attributes set on torch/IPython classes, trace
  hooks and garbage-collector searches made by student code, and blocks further audit hooks;
* around every locked cell (setup, grading helpers) it records the names that cell defines,
  and for helper classes and functions their attributes and code;
* before and after every test cell it checks that none of this changed, and that no student
  class fakes a value's type or comparisons (`__class__`, `__eq__`, ... on a subclass of
  `str`, `torch.Tensor`, ...). A change fails that test cell with a `TamperingDetected`
  error naming it; the grading summary flags the submission for manual review.
* each check answers with an HMAC of a fresh nonce under a key drawn for this run: a check
  that was replaced (through `sys.modules`), disarmed or silenced fails as well.

Test cells may patch things themselves (`unittest.mock`): the checks run between cells,
after such patches are undone.

**Compiled tests.** A test cell reaches the kernel as a code object compiled here, with only
its visible lines in `linecache` (for tracebacks): the hidden tests never arrive as text, so
no history, `linecache` or traceback spy can print them. Their bytecode is still in the
process while they run; see README ("what a determined student can still do").

**Redaction.** As a second layer, every output line containing a line of hidden-test
source is replaced, and traceback frames that show hidden lines are dropped, before the
notebook is saved or turned into feedback.
"""


from __future__ import annotations

import base64
import hashlib
import hmac
import importlib.util
import marshal
import re
import secrets
from dataclasses import dataclass, field

from nbformat import NotebookNode, v4

from . import notebooks

TAMPER_ENAME = "TamperingDetected"
REDACTED = "[hidden test code removed from feedback]"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_IGNORED_GLOBALS = {"In", "Out", "exit", "quit", "get_ipython"}

_GUARD_INIT = r'''
def _make_guard(module_name, key, grader_files):
    import builtins, sys, types, hmac, hashlib, linecache
    import torch, torch.nn, torch.nn.functional, torch.testing

    ip = get_ipython()
    spaces = {"builtins": builtins, "torch": torch, "torch.Tensor": torch.Tensor,
              "torch.nn.Module": torch.nn.Module, "torch.nn.functional": torch.nn.functional,
              "torch.testing": torch.testing, "torch.cuda": torch.cuda,
              "torch.backends.mps": torch.backends.mps, "sys": sys}
    if hasattr(torch, "accelerator"):
        spaces["torch.accelerator"] = torch.accelerator
    for extra in ("marshal", "base64", "linecache", "ast", "codeop", "inspect", "unittest.mock",
                  "warnings", "traceback"):
        if extra in sys.modules:
            spaces[extra] = sys.modules[extra]
    _vars, _callable, _isinstance, _type, _list, _id = vars, callable, isinstance, type, list, id
    _ModuleType, _missing, _sorted, _len, _tuple = types.ModuleType, object(), sorted, len, tuple
    _getattr, _hasattr, _set, _str, _dict = getattr, hasattr, set, str, dict
    _compare, _hexdigest = hmac.compare_digest, None
    _new_hmac, _sha256 = hmac.new, hashlib.sha256
    _getframe = sys._getframe
    _RuntimeError = RuntimeError
    _volatile = {"input", "raw_input", "getpass",  # ipykernel swaps these per request
                 "excepthook",  # IPython swaps it in for each cell
                 "last_type", "last_value", "last_traceback", "last_exc", "exc_info",
                 "ps1", "ps2", "stdin"}
    _class_caches = {"__slotnames__", "_abc_impl", "__weakref__"}

    _Function = types.FunctionType

    def code_of(v):
        return v.__code__ if _isinstance(v, _Function) else None

    def watched(space):
        out = {}
        for k, v in _list(_vars(space).items()):
            if _isinstance(v, _ModuleType):
                continue
            if _isinstance(space, _type) or (not k.startswith("_") and _callable(v)):
                out[k] = (v, code_of(v))
        return out

    def wraps(new, old):
        """torch wraps some of its own functions later (importing torch._dynamo wraps
        torch.manual_seed with functools.wraps): a torch wrapper of the original is fine."""
        seen = 0
        while new is not _missing and seen < 5:
            module = _getattr(new, "__module__", None) or ""
            if not (module == "torch" or module.startswith("torch.")):
                return False
            new, seen = _getattr(new, "__wrapped__", _missing), seen + 1
            if new is old:
                return True
        return False

    # -- IPython and the kernel: what decides, displays and reports a cell's result --------
    def classes_of(obj):
        return [c for c in _type(obj).__mro__ if c is not object]

    machinery_objects = {"shell": ip, "kernel": ip.kernel, "session": ip.kernel.session,
                         "compiler": ip.compile, "displayhook": ip.displayhook,
                         "display_pub": ip.display_pub, "events": ip.events,
                         "input_transformer_manager": ip.input_transformer_manager,
                         "InteractiveTB": ip.InteractiveTB, "SyntaxTB": ip.SyntaxTB,
                         "stdout": sys.stdout, "stderr": sys.stderr}
    machinery_classes = {}
    for label, obj in machinery_objects.items():
        for cls in classes_of(obj):
            machinery_classes[f"{cls.__module__}.{cls.__qualname__}"] = cls

    def class_state(cls):
        return {k: v for k, v in _vars(cls).items() if k not in _class_caches}

    def instance_callables(obj):
        d = _getattr(obj, "__dict__", None) or {}
        return {k: v for k, v in _list(d.items()) if _callable(v) and not _isinstance(v, _type)}

    def machinery():
        m = {f"{label} object": _id(obj) for label, obj in (
            ("shell", get_ipython()), ("kernel", ip.kernel), ("session", ip.kernel.session),
            ("compiler", ip.compile), ("displayhook", ip.displayhook),
            ("display_pub", ip.display_pub), ("events", ip.events),
            ("input_transformer_manager", ip.input_transformer_manager),
            ("InteractiveTB", ip.InteractiveTB), ("SyntaxTB", ip.SyntaxTB),
            ("sys.stdout", sys.stdout), ("sys.stderr", sys.stderr),
            ("sys.displayhook", sys.displayhook),
            ("builtins.compile", builtins.compile), ("builtins.exec", builtins.exec))}
        m["custom exception handler"] = (_tuple(ip.custom_exceptions),
                                         _id(ip.__dict__.get("CustomTB")))
        m["ast transformers"] = _tuple(_id(t) for t in ip.ast_transformers)
        m["input transformers"] = _tuple(_id(t) for t in ip.input_transformers_cleanup)
        m["input transformers (post)"] = _tuple(_id(t) for t in ip.input_transformers_post)
        itm = ip.input_transformer_manager
        for part in ("cleanup_transforms", "line_transforms", "token_transformers"):
            m[f"input_transformer_manager.{part}"] = _tuple(_id(t) for t in _getattr(itm, part, ()))
        for event, callbacks in _list(ip.events.callbacks.items()):
            m[f"events[{event!r}]"] = _tuple(_id(c) for c in callbacks)
        m["trace function"] = _id(sys.gettrace())
        m["profile function"] = _id(sys.getprofile())
        for label, obj in (("shell", ip), ("kernel", ip.kernel), ("session", ip.kernel.session),
                           ("compiler", ip.compile), ("displayhook", ip.displayhook),
                           ("display_pub", ip.display_pub)):
            for k, v in instance_callables(obj).items():
                m[f"{label}.{k}"] = _id(v)
        for name, cls in machinery_classes.items():
            for k, v in class_state(cls).items():
                m[f"{name}.{k}"] = _id(v)
        for mod in ("builtins", "torch", "IPython", "ipykernel", "jupyter_client", "marshal", "base64",
                    "hmac", "linecache"):
            m[f"sys.modules[{mod!r}]"] = _id(sys.modules.get(mod))
        return m

    # -- student classes that fake a value's type or comparisons ----------------------------
    _forgeable = (str, bytes, int, float, complex, tuple, list, dict, set, frozenset, torch.Tensor)
    _forging = {"__class__", "__eq__", "__ne__", "__hash__", "__bool__", "__lt__", "__le__",
                "__gt__", "__ge__", "__getattribute__", "__getattr__", "__instancecheck__",
                "__subclasscheck__", "__torch_function__", "__torch_dispatch__", "__len__",
                "__contains__", "__float__", "__int__", "__index__", "__str__", "__repr__", "__format__"}
    allowed_classes = _set()

    def all_classes():
        seen, todo = _set(), [object]
        out = []
        while todo:
            cls = todo.pop()
            try:
                subs = _type.__subclasses__(cls)
            except TypeError:
                continue
            for sub in subs:
                if _id(sub) not in seen:
                    seen.add(_id(sub))
                    out.append(sub)
                    todo.append(sub)
        return out

    def from_grader(cls):
        for v in _vars(cls).values():
            code = code_of(v)
            if code is not None and code.co_filename not in grader_files:
                return False
        return True

    def candidates():
        found = {}
        for cls in all_classes():
            if _getattr(cls, "__module__", None) != "__main__" or _id(cls) in allowed_classes:
                continue
            own = _set(_vars(cls)) & _forging
            if "__class__" in own or (own and issubclass(cls, _forgeable)) or (
                    issubclass(cls, type) and own & {"__instancecheck__", "__subclasscheck__"}):
                if not from_grader(cls):
                    found[_id(cls)] = f"class {cls.__qualname__} ({', '.join(_sorted(own))})"
        return found

    # -- what else the audit hook sees: changes no snapshot compares -----------------------
    noticed = []
    trusted = ("torch", "IPython", "ipykernel", "jupyter_client", "builtins", "zmq", "traitlets",
               "tornado", "asyncio", "comm", "hmac", "marshal", "base64", "linecache", "numpy")
    roots = _tuple(_set(p for p in (sys.prefix, sys.base_prefix, sys.exec_prefix) if p))

    def student_frame(depth=2):
        try:
            f = _getframe(depth)
        except ValueError:
            return False
        name = f.f_code.co_filename
        return not name.startswith(roots) and name not in grader_files and not name.startswith("<frozen")

    def hook(event, args):
        if event == "sys.addaudithook":
            if student_frame():
                noticed.append("an audit hook added (blocked)")
            raise _RuntimeError("the grader does not allow audit hooks")
        if event in ("object.__setattr__", "object.__delattr__"):
            obj, name = args[0], args[1]
            if name == "__code__" and student_frame():
                noticed.append(f"{_getattr(obj, '__qualname__', '?')}.__code__ replaced")
            elif _isinstance(obj, _type) and student_frame() and (
                    _getattr(obj, "__module__", "") or "").split(".")[0] in trusted:
                noticed.append(f"{obj.__module__}.{obj.__qualname__}.{name} set")
        elif event in ("sys.settrace", "sys.setprofile") and student_frame():
            noticed.append(f"{event} called")
        elif event in ("gc.get_objects", "gc.get_referrers", "gc.get_referents") and student_frame():
            noticed.append(f"{event} called (searching the grader's objects?)")

    sys.addaudithook(hook)

    reference = {name: watched(space) for name, space in spaces.items()}
    fresh_machinery = machinery()
    locked_names, locked_insides, pending = {}, {}, {}
    pending_classes = _set()

    def insides(v):
        """What a helper's behaviour hangs on: a class's attributes, a function's code."""
        if _isinstance(v, _type):
            return {k: x for k, x in _vars(v).items() if k not in _class_caches}
        code = code_of(v)
        if code is not None:
            return (code, _getattr(v, "__defaults__", None), _getattr(v, "__kwdefaults__", None))
        return None

    def before_locked(g):
        pending.clear()
        pending.update(g)
        pending_classes.clear()
        pending_classes.update(candidates())

    def after_locked(g):
        for k, v in _list(g.items()):
            if k.startswith("_") or k in ("In", "Out", "exit", "quit", "get_ipython"):
                continue
            if pending.get(k, _missing) is not v:
                locked_names[k] = v
                locked_insides[k] = insides(v)
        allowed_classes.update(_set(candidates()) - pending_classes)

    def changes(g):
        changed = []
        for name, ref in reference.items():
            space = spaces[name]
            now = _vars(space)
            for k, (v, code) in ref.items():
                if k in _volatile and name == "sys":
                    continue
                if k in ("input", "raw_input", "getpass"):
                    continue
                current = now.get(k, _missing)
                if current is not v and not wraps(current, v):
                    changed.append(f"{name}.{k}")
                elif current is v and code is not None and code_of(v) is not code:
                    changed.append(f"{name}.{k}.__code__")
            if _isinstance(space, _type):  # a class: an added attribute shadows an inherited one
                for k in now:
                    if k not in ref and k not in _class_caches:
                        changed.append(f"{name}.{k} (added)")
        now_m = machinery()
        for k, v in now_m.items():
            if fresh_machinery.get(k, _missing) != v:
                changed.append(f"IPython/kernel: {k}")
        for k in fresh_machinery:
            if k not in now_m:
                changed.append(f"IPython/kernel: {k} (removed)")
        for k, v in locked_names.items():
            if g.get(k, _missing) is not v:
                changed.append(k)
            elif insides(v) != locked_insides[k]:
                changed.append(f"{k} (modified)")
        changed.extend(candidates().values())
        changed.extend(noticed)
        return changed

    def forget_tests():
        for name in _list(linecache.cache):
            entry = linecache.cache.get(name)
            if entry and _len(entry) > 2 and entry[2] and entry[2][0].startswith(__MARK__):
                del linecache.cache[name]

    def verify(g, where, nonce):
        forget_tests()
        changed = changes(g)
        if changed:
            shown = ", ".join(_sorted(_set(changed))[:8]) + (" ..." if _len(_set(changed)) > 8 else "")
            raise _RuntimeError(f"{where}: {shown} changed since the grader's setup "
                                "(monkeypatched?); flagged for manual review")
        return "grader-token:" + _new_hmac(key, nonce.encode(), _sha256).hexdigest()

    def forget_source():
        """The cell that ran this is not kept where student code could read it."""
        for name in _list(linecache.cache):
            if "_make_guard" in "".join(linecache.cache[name][2] if _len(linecache.cache[name]) > 2 else ()):
                del linecache.cache[name]

    forget_source()
    sys.modules[module_name] = types.SimpleNamespace(
        before_locked=before_locked, after_locked=after_locked, verify=verify)

_make_guard(__MODULE__, __KEY__, __FILES__)
del _make_guard
'''


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


def compiled_test_cell(source: str, name: str) -> str | None:
    """The source of a cell that runs test cell `source` without its text reaching the kernel.

    The test is compiled here and sent as a code object (marshal): the kernel's history,
    `linecache` and tracebacks hold its visible lines only; hidden lines never arrive as
    text. None when it does not compile here (the kernel then reports the SyntaxError)."""
    filename = GRADER_FILE.format(name)
    try:
        code = compile(source, filename, "exec", dont_inherit=True)
    except SyntaxError:
        return None
    visible, _ = split_hidden(source)
    lines = [line + "\n" for line in visible.split("\n")]
    blob = base64.b64encode(marshal.dumps(code)).decode()
    magic = importlib.util.MAGIC_NUMBER
    return (
        f"{COMPILED_MARK}\n"
        f"if __import__('importlib.util').util.MAGIC_NUMBER != {magic!r}:\n"
        "    raise RuntimeError('the grader and the kernel run different Python versions')\n"
        f"__import__('linecache').cache[{filename!r}] = (0, None, {lines!r}, {filename!r})\n"
        f"exec(__import__('marshal').loads(__import__('base64').b64decode({blob!r})))"
    )


def instrument(nb: NotebookNode, module: str | None = None) -> Instrumented:
    """A copy of `nb` with the tamper checks added (see the module docstring)."""
    module = module or f"_grader_guard_{secrets.token_hex(8)}"
    key = secrets.token_bytes(32)
    ref = f"__import__('sys').modules[{module!r}]"
    files = {GRADER_FILE.format(notebooks.grade_id(c) or i) for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and notebooks.is_test_cell(c)}
    init = (_GUARD_INIT.replace("__MODULE__", repr(module)).replace("__KEY__", repr(key))
            .replace("__FILES__", repr(frozenset(files))).replace("__MARK__", repr(COMPILED_MARK)).strip())
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
        cells.append(_guard_cell(f"{ref}.verify(globals(), {where!r}, {nonce!r})", "verify"))
        return len(cells) - 1

    for i, cell in enumerate(nb.cells):
        is_code = cell.cell_type == "code"
        is_test = is_code and notebooks.is_test_cell(cell)
        gid = notebooks.grade_id(cell) or str(i)
        before = check(f"before {gid}") if is_test else None
        locked_setup = is_code and notebooks.is_locked(cell) and not is_test
        if locked_setup:
            cells.append(_guard_cell(f"{ref}.before_locked(globals())", "locked"))
        positions.append(len(cells))
        run = NotebookNode(dict(cell))
        if is_test:
            compiled = compiled_test_cell(cell.source, gid)
            if compiled is not None:
                run.source = compiled
                run.metadata = NotebookNode(dict(cell.metadata, grader_compiled=True))
        cells.append(run)
        if locked_setup:
            cells.append(_guard_cell(f"{ref}.after_locked(globals())", "locked"))
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
