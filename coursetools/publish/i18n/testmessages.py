"""The tests' own messages in Chinese: what a failing test says, and how to fix it.

A test cell's message is English and stays so: the cell is locked, and the English line is
what a learner pastes into a search box. The Chinese edition adds a line under it, translated
from a *template*: the message as the test's source writes it, an f-string whose holes stay
holes. For

    assert got == torch.device("cpu"), f"on a machine without any GPU expected cpu, got {got}"

the exercise's PO file holds (context "test message")

    msgid  "on a machine without any GPU expected cpu, got {got}"
    msgstr "在没有任何 GPU 的机器上应当得到 cpu，实际得到 {got}"

and a run's message "on a machine without any GPU expected cpu, got cuda:0" becomes
"在没有任何 GPU 的机器上应当得到 cpu，实际得到 cuda:0".

Extraction (`templates_of`) reads the course's source notebook (solutions/, hidden tests
included: `make.py check` runs them) and takes the message of every `assert`, every `raise`,
the hint (and fix) of `fix_hint`, `call_answer` and `expect_error`, the prose handed to any
function of the helpers cell ("two passes over one Prefetcher"), and every sentence of the
helpers cell itself (its helpers build messages in pieces). A message joined with `+`, or
choosing between two texts with `... if ... else ...`, gives one template per way it can read;
a name bound to a constant string in the same cell (or the helpers cell) is inlined; anything
else becomes a hole. `symptom + fix_hint(fix)` gives the symptom and the fix as templates of
their own (coursetools/grading/hints.py splits them at run time).

Matching (`translate`): the message's whitespace is collapsed and matched against every
template; a hole's value is translated in turn when it is itself a message (expect_error's
"expected ValueError, got KeyError: ... <hint>" carries the test's hint). Of the readings
found, the one that leaves the least English wins. A message that no template reads, the
learner's code raised in its own words: `failure_hint` says so.
"""

from __future__ import annotations

import ast
import functools
import itertools
import re
from dataclasses import dataclass
from pathlib import Path

from coursetools import layout, notebooks
from coursetools.publish.i18n import N_

CONTEXT = "test message"
GRADER_CONTEXT = "grader message"
GRADER_MODULES = {"coursetools/grading/execute.py": {"error_output": 1},  # module -> call -> message argument
                  "coursetools/instructor/nbgrader_ext.py": {"error_output": 1},
                  "coursetools/grading/guard.py": {},
                  "coursetools/grading/remote.py": {"AnswerTooLarge": 0},
                  "coursetools/grading/agent_kernel.py": {"ForeignTensorError": 0},
                  "coursetools/publish/i18n/testmessages.py": {}}  # and every N_("...") of these
HINTED_CALLS = {"fix_hint": (0,), "call_answer": (1, 2), "expect_error": (2,)}  # function -> its hint (and fix) arguments
MAX_WAYS = 8  # templates one message expression may give (if/else choices multiply)
MIN_LETTERS = 6  # a template with fewer letters of text (e.g. "got {x}") is not worth translating


# --------------------------------------------------------------------------- templates

@dataclass(frozen=True)
class Hole:
    source: str  # the f-string field as written: "got", "type(exc).__name__", "message!r"


Part = "str | Hole"


def _field(node: ast.FormattedValue) -> str:
    text = ast.unparse(node.value)
    if node.conversion != -1:
        text += "!" + chr(node.conversion)
    if node.format_spec is not None:
        spec = "".join(v.value if isinstance(v, ast.Constant) else "{" + ast.unparse(v.value) + "}"
                       for v in node.format_spec.values)
        text += ":" + spec
    return text


class _Reader:
    """Turns one message expression into the ways it can read (lists of str and Hole)."""

    def __init__(self, constants: dict[str, list[list]]):
        self.constants = constants

    def ways(self, node: ast.AST) -> list[list]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [[node.value]]
        if isinstance(node, ast.JoinedStr):
            parts: list = []
            choices = [[]]
            for value in node.values:
                if isinstance(value, ast.Constant):
                    choices = [c + [value.value] for c in choices]
                elif (isinstance(value, ast.FormattedValue) and value.conversion == -1
                      and value.format_spec is None and isinstance(value.value, ast.Name)
                      and value.value.id in self.constants):
                    choices = [c + w for c in choices for w in self.constants[value.value.id]][:MAX_WAYS]
                elif (isinstance(value, ast.FormattedValue) and value.conversion == -1
                      and value.format_spec is None and isinstance(value.value, ast.IfExp)
                      and _is_text(value.value)):  # {'is' if n == 1 else 'are'}: two ways
                    choices = [c + w for c in choices for w in self.ways(value.value)][:MAX_WAYS]
                else:
                    choices = [c + [Hole(_field(value))] for c in choices]
            return choices or [parts]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            if _is_fix_hint(node.right):  # symptom + fix_hint(...): the fix is a template of its own
                return self.ways(node.left)
            left, right = self.ways(node.left), self.ways(node.right)
            return [a + b for a, b in itertools.product(left, right)][:MAX_WAYS]
        if isinstance(node, ast.IfExp):
            return (self.ways(node.body) + self.ways(node.orelse))[:MAX_WAYS]
        if isinstance(node, ast.Name) and node.id in self.constants:
            return self.constants[node.id]
        if _is_fix_hint(node):
            return [[]]
        return [[Hole(ast.unparse(node))]]


def _is_fix_hint(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "fix_hint"


def _is_text(node: ast.AST) -> bool:
    """A string expression: a literal, an f-string, or texts joined with + or chosen with if."""
    if isinstance(node, (ast.JoinedStr,)) or (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _is_text(node.left) or _is_text(node.right)
    if isinstance(node, ast.IfExp):
        return _is_text(node.body) and _is_text(node.orelse)
    return False


def _constants(tree: ast.Module, reader: _Reader) -> None:
    """Names bound once, at the top of a cell, to a string expression (SCALAR_HINT = "...")."""
    seen: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    seen[target.id] = seen.get(target.id, 0) + 1
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and seen[node.targets[0].id] == 1 and _is_text(node.value)):
            reader.constants[node.targets[0].id] = reader.ways(node.value)


def _is_prose(node: ast.AST) -> bool:
    """Text with words in it, not code: two English words or more outside parentheses and
    quotes ("two passes over one Prefetcher", not "batched_to(tensors, 'meta')" or "Tesla T4")."""
    if not _is_text(node):
        return False
    text = " ".join(p for way in _Reader({}).ways(node)[:1] for p in way if isinstance(p, str))
    while re.search(r"\([^()]*\)", text):
        text = re.sub(r"\([^()]*\)", " ", text)
    text = re.sub(r"'[^']*'|\"[^\"]*\"", " ", text)
    words = [w for w in text.split() if re.fullmatch(r"[A-Za-z][a-z]+[,.;:!?]?", w)]  # not torch.cuda.x
    return len(words) >= 2


def _messages(tree: ast.AST, calls: dict[str, int] | None = None, statements: bool = True,
              helpers: frozenset[str] = frozenset()) -> list[ast.AST]:
    """The message expressions of a cell: assert and raise messages, the hint argument of
    `calls`, and any argument with words in it given to a function of the helpers cell
    (`helpers`: runs_on_meta(fn, "what it checks"))."""
    calls = HINTED_CALLS if calls is None else calls
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _name(node.func) in helpers and _name(node.func) not in calls:
            found += [arg for arg in list(node.args) + [k.value for k in node.keywords] if _is_prose(arg)]
        if (statements and isinstance(node, ast.Call) and _name(node.func) == "print" and node.args
                and _reveal_text(node.args[0])):
            found.append(node.args[0])  # a Predict question's "What really happens ..." (hints.REVEAL_PREFIX)
        if statements and isinstance(node, ast.Assert) and node.msg is not None:
            found.append(node.msg)
        elif statements and isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
            found.append(node.exc.args[0])
        elif isinstance(node, ast.Call) and _name(node.func) in calls:
            wanted = calls[_name(node.func)]
            for index in (wanted if isinstance(wanted, tuple) else (wanted,)):
                if len(node.args) > index:
                    found.append(node.args[index])
            found += [k.value for k in node.keywords if k.arg in ("hint", "text", "fix")]
    return found


def _reveal_text(node: ast.AST) -> bool:
    from coursetools.grading.hints import REVEAL_PREFIX

    first = node.values[0] if isinstance(node, ast.JoinedStr) and node.values else node
    return isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value.startswith(REVEAL_PREFIX)


def _prose_anywhere(tree: ast.AST) -> list[ast.AST]:
    """Every text with words in it, outermost only, docstrings aside: in the helpers cell a
    message is often built in pieces (a return value, a local `hint = ...`)."""
    found: list[ast.AST] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            return  # a docstring
        if isinstance(node, ast.FunctionDef) and node.name == "fix_hint":
            return  # its words are the learner's own kernel's (coursetools/grading/hints.py)
        if _is_text(node):
            literal = "".join(p for way in _Reader({}).ways(node)[:1] for p in way if isinstance(p, str))
            code = "\n" in literal and re.search(r"^\s*(def |import |from \w+ import )", literal, re.M)
            if _is_prose(node) and not code:  # not a script the helpers write to a file
                found.append(node)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)
    visit(tree)
    return found


def _name(func: ast.AST) -> str | None:
    """f for f(...) and x.f(...)."""
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def render(parts: list) -> str:
    """A template as its msgid: f-string syntax (literal braces doubled, holes in braces)."""
    out = []
    for part in parts:
        if isinstance(part, Hole):  # a hole that is itself in braces (a dict) keeps a space
            out.append("{ " + part.source + " }" if part.source.startswith("{") else "{" + part.source + "}")
        else:
            out.append(part.replace("{", "{{").replace("}", "}}"))
    return "".join(out)


def _merge(parts: list) -> list:
    merged: list = []
    for part in parts:
        if isinstance(part, str) and merged and isinstance(merged[-1], str):
            merged[-1] += part
        elif part != "":
            merged.append(part)
    return merged


def templates_of(sources: list[str], calls: dict[str, int] | None = None, statements: bool = True,
                 helpers: frozenset[str] = frozenset(), shared_cells: int = 1, prose_cells: int = 0) -> list[str]:
    """The message templates (msgids) of cells' sources, in order, each once. The first
    `shared_cells` sources are the helper cells, whose constants every other cell may use."""
    found: dict[str, None] = {}
    shared = _Reader({})
    for index, source in enumerate(sources):
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        reader = _Reader(dict(shared.constants))
        _constants(tree, reader)
        if index < shared_cells:
            shared.constants.update(reader.constants)
        nodes = _messages(tree, calls, statements, helpers)
        if index < prose_cells:  # the helpers cell: its prose, wherever it is
            nodes += _prose_anywhere(tree)
        for node in nodes:
            if not _is_text(node) and not (isinstance(node, ast.Name) and node.id in reader.constants):
                continue
            for way in reader.ways(node):
                parts = _merge(way)
                text = "".join(p for p in parts if isinstance(p, str))
                if len(re.findall(r"[A-Za-z]", text)) >= MIN_LETTERS:
                    found.setdefault(" ".join(render(parts).split()), None)
    return list(found)


def exercise_templates(assignment: str, root: Path = layout.ROOT) -> list[tuple[str, str]]:
    """(msgid, where) for every message of an exercise: its locked helpers cell and its test
    cells, hidden tests included, from the course's source notebook."""
    nb = notebooks.read(layout.source_notebook(assignment, root))
    cells = [c for c in nb.cells if c.cell_type == "code"
             and (notebooks.is_test_cell(c) or (notebooks.is_locked(c) and not notebooks.is_solution(c)))]
    helpers = [c for c in cells if not notebooks.is_test_cell(c)]
    # the helpers cell first: its prose is read wherever it is; the other locked cells (setup,
    # a cell that prints a question's answers) print to the notebook, not to a test's message
    helpers.sort(key=lambda c: notebooks.grade_id(c) != "helpers")
    tests = [c for c in cells if notebooks.is_test_cell(c)]
    functions: set[str] = set()
    for cell in helpers:
        try:
            functions |= {n.name for n in ast.parse(cell.source).body if isinstance(n, ast.FunctionDef)}
        except SyntaxError:
            pass
    out: dict[str, str] = {}
    # A Predict proof (### BEGIN/END SOLUTIONS ONLY) never reaches a learner: nothing to translate.
    sources = {id(c): notebooks.strip_solutions_only(c.source) for c in cells}
    for cell in helpers + tests:
        where = notebooks.grade_id(cell) or "helpers"
        for msgid in templates_of([sources[id(c)] for c in helpers] + ([sources[id(cell)]] if cell in tests else []),
                                  helpers=frozenset(functions), shared_cells=len(helpers),
                                  prose_cells=sum(notebooks.grade_id(c) == "helpers" for c in helpers)):
            out.setdefault(msgid, where)
    return list(out.items())


def grader_templates(root: Path = layout.ROOT) -> list[tuple[str, str]]:
    """(msgid, module) for the messages the grader itself writes into a test's output (a
    time limit, a dead kernel, a hidden test that failed): GRADER_MODULES."""
    out: dict[str, str] = {}
    for module, calls in GRADER_MODULES.items():
        source = (root / module).read_text(encoding="utf-8")
        for msgid in templates_of([source], calls, statements=False):
            out.setdefault(msgid, module)
        for node in ast.walk(ast.parse(source)):  # N_("... {name} ..."): a str.format template
            if (isinstance(node, ast.Call) and _name(node.func) == "N_" and node.args
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                out.setdefault(" ".join(node.args[0].value.split()), module)
    return list(out.items())


# --------------------------------------------------------------------------- matching

_FIELD = re.compile(r"\{\{|\}\}|\{((?:[^{}]|\{[^{}]*\})*)\}")


def parse(template: str) -> list:
    """A msgid or msgstr back into text and holes."""
    parts: list = []
    pos = 0
    for match in _FIELD.finditer(template):
        parts.append(template[pos:match.start()])
        token = match.group(0)
        parts.append(token[0] if token in ("{{", "}}") else Hole(match.group(1)))
        pos = match.end()
    parts.append(template[pos:])
    return _merge(parts)


def holes(template: str) -> list[str]:
    return [p.source for p in parse(template) if isinstance(p, Hole)]


@dataclass
class _Compiled:
    msgid: str
    msgstr: str
    pattern: re.Pattern
    literals: list[str]
    names: list[str]
    weight: int
    ends_in_hole: bool = False


def _compile(msgid: str, msgstr: str) -> _Compiled:
    """The template as a regular expression over a message whose whitespace is collapsed.
    Its spaces must be there (". " is not the dot of "torch.float16"), except the one after
    an empty hole ("got {a} and" reads "got and" when a is empty) and one before an empty
    last hole ("raised {name}: {exc}" reads "raised NotImplementedError:")."""
    regex, literals, names = [], [], []
    after_space = False
    for part in parse(msgid):
        if isinstance(part, Hole):
            regex.append(f"(?P<h{len(names)}>.*?)")
            names.append(part.source)
        else:
            text = re.sub(r"\s+", " ", part)
            body = text[1:] if after_space and names and text.startswith(" ") else text
            tail = body.endswith(" ") and len(body) > 1
            pattern = re.escape(body[:-1] if tail else body)
            if body is not text:  # the space after an empty hole: "got {a} and" reads "got and"
                pattern = " ?" + pattern
            if tail:  # before a hole: the space, or the end (an empty last hole: "raised X:")
                pattern += "(?: |$)"
            regex.append(pattern)
            after_space = text.endswith(" ")
            if text.strip():
                literals.append(text.strip())
    pattern = re.compile("".join(regex), re.DOTALL)
    parts = parse(msgid)
    return _Compiled(msgid, msgstr, pattern, literals, names, sum(len(l) for l in literals),
                     bool(parts) and isinstance(parts[-1], Hole))


def _compiled(path: Path, context: str) -> list[_Compiled]:
    if not path.exists():
        return []
    try:
        import polib
    except ImportError:  # requirements.txt installs it; without it, English only
        return []
    return [_compile(e.msgid, e.msgstr) for e in polib.pofile(str(path))
            if e.msgctxt == context and e.msgstr and not e.fuzzy and not e.obsolete]


@functools.cache
def catalog(assignment: str | None, root: Path = layout.ROOT) -> tuple[_Compiled, ...]:
    """The translated templates of an exercise and the grader's own messages (a time limit, a
    dead kernel: GRADER_CONTEXT in the tools' PO file), longest literal text first."""
    entries = _compiled(root / "locale" / "zh_CN" / "tools" / "messages.po", GRADER_CONTEXT)
    if assignment:
        entries += _compiled(root / "locale" / "zh_CN" / "exercises" / f"{assignment}.po", CONTEXT)
    return tuple(sorted(entries, key=lambda c: -c.weight))


def translate(assignment: str | None, message: str, root: Path = layout.ROOT, depth: int = 2) -> str | None:
    """`message` (one a test of `assignment` raised, without its fix) in Chinese, or None
    when no template of the exercise reads it."""
    found = _translate(assignment, message, root, depth)
    return found[0] if found else None


def _english_left(text: str) -> int:
    return len(re.findall(r"[A-Za-z]", text))


def template_of(assignment: str | None, message: str, root: Path = layout.ROOT) -> tuple[str, str] | None:
    """(the English template, its Chinese) of the test message that reads `message` (one a
    test of `assignment` raised, without its fix), or None: the rule the failing test names,
    the same for every learner whatever values the message shows (the class report groups by
    it: coursetools/instructor/classreport.py)."""
    found = _best(assignment, message, root, 2)
    return (found[2].msgid, found[2].msgstr) if found else None


def _translate(assignment: str | None, message: str, root: Path, depth: int) -> tuple[str, int] | None:
    found = _best(assignment, message, root, depth)
    return (found[0], found[1]) if found else None


def _best(assignment: str | None, message: str, root: Path, depth: int) -> tuple[str, int, _Compiled] | None:
    """(the Chinese, how many English letters it still carries in its holes, the template). Of the
    templates that read the message, the one that leaves the least English wins (then the one
    with the most text of its own): "{where}: ... {why}" over "amp_settings({dev!r}) with
    PyTorch {version}", whose last hole would swallow the rest of the message."""
    text = " ".join(message.split())
    if not text:
        return None
    best: tuple[tuple[int, int, int], str, _Compiled] | None = None
    for entry in catalog(assignment, root):
        if best is not None and best[0][:2] == (0, 0) and entry.weight < -best[0][2]:
            break  # sorted by weight: nothing later can beat a reading that left no English
        if not all(literal in text for literal in entry.literals):
            continue
        match = entry.pattern.fullmatch(text)
        if match is None:
            continue
        values: dict[str, str] = {}
        left = 0
        for i, name in enumerate(entry.names):
            value = match.group(f"h{i}")
            inner = _inner(assignment, value, root, depth - 1) if depth > 0 and _worth(value) else None
            if name not in values:
                left += inner[1] if inner else _english_left(value)
            values.setdefault(name, inner[0] if inner else value)
        said = "".join(values.get(p.source, "{" + p.source + "}") if isinstance(p, Hole) else p
                       for p in parse(entry.msgstr))
        said = re.sub(r"(?<=\S) {2,}(?=\S)", " ", said)  # an empty hole leaves no double space
        # a last hole that took a sentence of its own ("2.9.0: the dict lacks ...") most
        # likely swallowed the rest of another template's message
        swallowed = int(bool(entry.names) and entry.ends_in_hole
                        and re.search(r"[:;.] \S", match.group(f"h{len(entry.names) - 1}")) is not None)
        score = (left, swallowed, -entry.weight)
        if best is None or score < best[0]:
            best = (score, said, entry)
    return (best[1], best[0][0], best[2]) if best else None


def _worth(value: str) -> bool:
    """A hole's value that may be a message of its own (a hint, a description of what ran)."""
    return len(value.strip()) >= 6 and re.search(r"[A-Za-z]{2,}", value) is not None


def _inner(assignment: str | None, value: str, root: Path, depth: int) -> tuple[str, int] | None:
    """A hole's value in Chinese when it is itself a message (a hint inside another message;
    call_answer's hint may have gained a full stop)."""
    found = _translate(assignment, value, root, depth)
    if found is None and value.rstrip().endswith("."):
        found = _translate(assignment, value.rstrip()[:-1], root, depth)
        found = found and (found[0].rstrip("。.") + "。", found[1])
    return found


_ENAME = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Warning)\b: ")
_TEST_LINE = re.compile(r"\s*\(test line \d+\)$")  # what feedback pages add (nbgrader_ext)
# A feedback page's "a hidden test failed: " before what a hidden test observed
# (coursetools/instructor/nbgrader_ext.py: HIDDEN_FAILED_SAID): not part of a template.
_HIDDEN_SAID = re.compile(r"^a hidden test failed: ")


YOUR_CODE_RAISED = N_("your code raised {ename} while this test ran: the message above is your code's own, "
                      "not the test's")
NOT_THE_TESTS = N_("this message is not one of the test's own: the code the test ran (yours, or PyTorch "
                   "under it) raised it, in its own words")


def failure_hint(assignment: str | None, ename: str, message: str, root: Path = layout.ROOT) -> str:
    """The Chinese line for a failing test's message: its translation, or, for a message no
    template reads, what it is: an error of the learner's code, or an AssertionError that
    code raised (PyTorch's "Torch not compiled with CUDA enabled"), in its own words.
    tests/course/test_grading.py holds the second case to messages no assert of a test wrote."""
    from coursetools.publish.i18n import CJK

    said = hint(assignment, message, root)
    if said or not message.strip() or CJK.search(message):  # Chinese already: the self-check's words
        return said
    fallback = NOT_THE_TESTS if ename == "AssertionError" else YOUR_CODE_RAISED.format(ename=ename or "Error")
    return translate(None, fallback, root) or ""


def hint(assignment: str | None, message: str, root: Path = layout.ROOT) -> str:
    """The Chinese line for a failing test's English message (its observation, or its fix):
    "" when the message is Chinese already (the self-check's own words) or no template reads
    it. An exception name in front ("AssertionError: ") and the feedback page's "(test line
    N)" are not part of a template."""
    from coursetools.publish.i18n import CJK

    if not message.strip() or CJK.search(message):
        return ""
    text = _HIDDEN_SAID.sub("", _TEST_LINE.sub("", message.strip()))
    return translate(assignment, _ENAME.sub("", text, count=1), root) or translate(assignment, text, root) or ""
