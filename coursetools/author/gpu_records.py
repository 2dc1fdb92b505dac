"""Recorded GPU output in the lessons: what a GPU-dependent cell printed on a real GPU,
shown to a learner without one, right below the cell.

A learner on a CPU sees, where a GPU would measure or raise something, a CPU analogue or the
GPU's output labelled "expected, not recorded on a GPU" (show_expected). `python3 make.py
gpu-report --record`, run on a CUDA machine, runs every lesson alone (Colab-like, as the report does) and writes, after each GPU-dependent code cell,
a *record block*: a markdown cell, collapsed, that says on which GPU, with which PyTorch and
CUDA, and on which day the cell printed what follows (text in a fenced block, figures as
the cell's PNG attachments). The notebook stays self-contained: Colab opens it alone.

A block is a markdown cell tagged `gpu-record` whose first line is an HTML comment holding
its data (rendered by nobody), e.g.

    <!-- gpu-record {"cell_sha256": "3f2a...", "device": "NVIDIA H200", "torch": "2.11.0+cu130",
                     "cuda": "13.0", "recorded": "2026-11-29"} -->
    <details><summary>On an NVIDIA H200 (PyTorch 2.11.0+cu130, CUDA 13.0, recorded
    2026-11-29) the cell above printed:</summary> ... </details>

`cell_sha256` is the SHA-256 of the code cell's source at recording time. A block whose cell
changed since (stale), or that does not follow a code cell (orphan), is a failure of
tests/author/test_gpu_records.py; `python3 make.py gpu-report --prune` removes such blocks (no GPU
needed), so a change made without a GPU removes the record instead of leaving a false one.
(The data is in the text, not in cell metadata, because the course keeps cell metadata to
nbgrader's keys and tags: tests/course/test_notebooks_static.py.)

Which cells are GPU-dependent is decided from their source alone (`gpu_dependent_cells`),
so it follows the notebooks as they change: a cell whose code (and the notebook functions it
calls) calls into the machine's accelerator (`torch.cuda.*`, `torch.mps.*`,
`torch.accelerator.*`, `torch.backends.mps.*`), passes `pin_memory=` or `non_blocking=`
(no-ops without a GPU), branches on a machine fact (an `if`/`while`/conditional expression
testing such a call, or a name set from one, like the setup cell's `device` or a chapter's
`on_cuda`), or uses such a name at all (it computes on or shows the chosen device). A cell
tagged `gpu-output` counts whatever its source; one tagged `no-gpu-record` never does.
"""

from __future__ import annotations

import ast
import base64
import copy
import dataclasses
import datetime
import hashlib
import json
import platform
import re
from pathlib import Path

from nbformat import NotebookNode, v4

from coursetools import cellcode

RECORD_TAG = "gpu-record"        # a record block (markdown)
FORCE_TAG = "gpu-output"         # a code cell that is GPU-dependent whatever its source says
EXCLUDE_TAG = "no-gpu-record"    # a code cell never recorded
MARKER = re.compile(r"\A<!-- gpu-record (\{.*?\}) -->\n", re.DOTALL)
FIX = ("Run `python3 make.py gpu-report --prune` to remove it (no GPU needed), "
       "then re-record on a GPU: `python3 make.py gpu-report --record`")
MAX_LINES = 60      # of text kept per block; the rest is cut, with a note
MAX_CHARS = 6000
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")

# Calls into the machine's accelerator: dotted names starting with one of these.
PROBE_PREFIXES = ("torch.cuda.", "torch.mps.", "torch.xpu.", "torch.accelerator.",
                  "torch.backends.mps.", "torch.backends.cudnn.")
# Keyword arguments that do something only when a GPU is there.
GPU_ONLY_KEYWORDS = {"pin_memory", "non_blocking", "pin_memory_device"}
GPU_ONLY_METHODS = {"pin_memory", "is_pinned", "record_stream"}


# --------------------------------------------------------------------------------------
# Which cells depend on the GPU
# --------------------------------------------------------------------------------------

def _tags(cell: NotebookNode) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []) or [])


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef)


def _top_level(node: ast.AST):
    """`node` and what it contains, except the bodies of the functions it defines (code
    that runs when the cell runs; lambdas and class bodies included)."""
    todo = [node]
    while todo:
        sub = todo.pop()
        yield sub
        if isinstance(sub, _SCOPES):
            todo.extend(sub.decorator_list)
            continue
        todo.extend(reversed(list(ast.iter_child_nodes(sub))))  # in source order


def _locals(nodes: list[ast.AST]) -> frozenset[str]:
    """Comprehension variables and lambda parameters among `nodes`: local names."""
    found: set[str] = set()
    for sub in nodes:
        if isinstance(sub, ast.comprehension):
            found |= {n.id for n in ast.walk(sub.target) if isinstance(n, ast.Name)}
        elif isinstance(sub, ast.Lambda):
            found |= cellcode.params(sub)
    return frozenset(found)


class _Facts:
    """What the notebook's cells so far taught: names that hold a machine fact (`device`,
    `on_cuda`, ...) and functions whose behaviour depends on the machine."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.functions: set[str] = set()

    # -- expressions ------------------------------------------------------------------
    def probe(self, nodes, shadow: frozenset[str] = frozenset()) -> str | None:
        """Why one of `nodes` touches the machine, or None."""
        for sub in nodes:
            if isinstance(sub, ast.Call):
                name = cellcode.dotted(sub.func)
                if name.startswith(PROBE_PREFIXES):
                    return f"calls {name}()"
                if name in self.functions and name not in shadow:
                    return f"calls {name}(), which depends on the device"
                for kw in sub.keywords:
                    if kw.arg in GPU_ONLY_KEYWORDS:
                        return f"passes {kw.arg}= (it acts only with a GPU)"
                if isinstance(sub.func, ast.Attribute) and sub.func.attr in GPU_ONLY_METHODS:
                    return f"calls .{sub.func.attr}() (it acts only with a GPU)"
        return None

    def machine_fact(self, node: ast.AST, shadow: frozenset[str] = frozenset()) -> bool:
        """Does the value of the expression `node` depend on the machine?"""
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and sub.id in self.names and sub.id not in shadow:
                return True
            if isinstance(sub, ast.Call) and cellcode.dotted(sub.func).startswith(PROBE_PREFIXES):
                return True
        return False

    def device_valued(self, node: ast.AST) -> bool:
        """Is `node` a machine fact itself (a device, a flag, a name or count of devices),
        rather than something computed with one (a tensor on the device)?"""
        if isinstance(node, ast.Call):
            name = cellcode.dotted(node.func)
            if name.startswith(PROBE_PREFIXES):
                return True
            return name == "torch.device" and any(
                self.machine_fact(a) for a in [*node.args, *(k.value for k in node.keywords)])
        if isinstance(node, (ast.Compare, ast.BoolOp, ast.UnaryOp)):
            return self.machine_fact(node)
        if isinstance(node, ast.IfExp):
            return self.machine_fact(node.test) or self.device_valued(node.body) or self.device_valued(node.orelse)
        if isinstance(node, ast.Name):
            return node.id in self.names
        if isinstance(node, ast.Attribute):
            return self.device_valued(node.value)
        if isinstance(node, (ast.Tuple, ast.List)):
            return any(self.device_valued(e) for e in node.elts)
        return False

    def uses(self, nodes) -> str | None:
        """Why one of `nodes` runs on, or shows, the chosen device: it names a machine fact
        (other than to derive another one, as in `on_cuda = device.type == "cuda"`)."""
        nodes = list(nodes)
        deriving = {id(n) for sub in nodes
                    if isinstance(sub, (ast.Assign, ast.AnnAssign)) and sub.value is not None
                    and self.device_valued(sub.value) for n in ast.walk(sub.value)}
        local = _locals(nodes)
        for sub in nodes:
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load) and sub.id in self.names \
                    and sub.id not in local and id(sub) not in deriving:
                return f"uses `{sub.id}` (set by the machine: it computes on or shows the chosen device)"
        return None

    def branches(self, nodes, shadow: frozenset[str] = frozenset()) -> str | None:
        """Why one of `nodes` takes a different path on a GPU: a test on a machine fact.
        (Comprehension variables and lambda parameters are local: they shadow the notebook's
        names, so `[c for c in tools if shutil.which(c)]` is no test on a global `c`.)"""
        nodes = list(nodes)
        shadow = shadow | _locals(nodes)
        for sub in nodes:
            tests = []
            if isinstance(sub, (ast.If, ast.While, ast.IfExp)):
                tests = [sub.test]
            elif isinstance(sub, ast.comprehension):
                tests = list(sub.ifs)
            elif isinstance(sub, ast.Match):
                tests = [sub.subject]
            for test in tests:
                if self.machine_fact(test, shadow):
                    return f"branches on `{ast.unparse(test)[:60]}`"
        return None

    def depends(self, tree: ast.AST) -> str | None:
        """Why the code that runs when this cell runs behaves differently on a GPU."""
        return (self.probe(_top_level(tree)) or self.branches(_top_level(tree))
                or self.uses(_top_level(tree)))

    def learn(self, tree: ast.Module) -> None:
        """Walk the cell's statements in order: a name assigned a machine fact (or assigned
        inside a branch on one) becomes a fact, one assigned anything else stops being one;
        a function that branches on the machine or calls into it becomes machine-dependent
        (its parameters shadow the notebook's names)."""
        self._statements(tree.body, under_fact=False)

    def _statements(self, body: list[ast.stmt], under_fact: bool) -> None:
        for node in body:
            if isinstance(node, _SCOPES):
                shadow = frozenset(cellcode.params(node))
                inside = [n for stmt in node.body for n in ast.walk(stmt)]
                if self.probe(inside, shadow) or self.branches(inside, shadow):
                    self.functions.add(node.name)
                else:
                    self.functions.discard(node.name)
                continue
            if isinstance(node, ast.ClassDef):
                continue
            value = getattr(node, "value", None)
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and value is not None:
                fact = under_fact or self.device_valued(value) or (
                    isinstance(node, ast.AugAssign) and self.device_valued(node.target))
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for name in (n for t in targets for n in cellcode.bound_names(t)):
                    (self.names.add if fact else self.names.discard)(name)
            for sub in _top_level(node):  # walrus assignments anywhere in the statement
                if isinstance(sub, ast.NamedExpr) and (under_fact or self.device_valued(sub.value)):
                    self.names.add(sub.target.id)
            if isinstance(node, (ast.If, ast.While)):
                fact = under_fact or self.machine_fact(node.test)
                self._statements(node.body, fact)
                self._statements(node.orelse, fact)
            elif isinstance(node, (ast.For, ast.AsyncFor)):
                fact = under_fact or self.machine_fact(node.iter)  # (loop variables stay plain)
                self._statements(node.body, fact)
                self._statements(node.orelse, fact)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                self._statements(node.body, under_fact)
            elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
                self._statements(node.body, under_fact)
                for handler in node.handlers:
                    self._statements(handler.body, under_fact)
                self._statements(node.orelse, under_fact)
                self._statements(node.finalbody, under_fact)
            elif isinstance(node, ast.Match):
                fact = under_fact or self.machine_fact(node.subject)
                for case in node.cases:
                    self._statements(case.body, fact)


def gpu_dependent_cells(nb: NotebookNode) -> dict[int, str]:
    """{cell index: why} for every code cell whose behaviour or output differs on a GPU,
    decided from the sources (module docstring), in notebook order."""
    facts = _Facts()
    found: dict[int, str] = {}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        tags = _tags(cell)
        tree = cellcode.parse(cell.source)
        why = None
        if tree is not None:
            facts.learn(tree)
            why = facts.depends(tree)
        if FORCE_TAG in tags:
            why = f"tagged {FORCE_TAG}"
        if EXCLUDE_TAG in tags:
            why = None
        if why:
            found[index] = why
    return found


# --------------------------------------------------------------------------------------
# Blocks
# --------------------------------------------------------------------------------------

def fingerprint(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


def is_block(cell: NotebookNode) -> bool:
    return cell.cell_type == "markdown" and (RECORD_TAG in _tags(cell)
                                            or cell.source.startswith("<!-- gpu-record "))


def block_data(cell: NotebookNode) -> dict | None:
    """The block's data (cell_sha256, device, torch, cuda, recorded), None if unreadable."""
    match = MARKER.match(cell.source)
    if not match:
        return None
    try:
        data = json.loads(match.group(1))
    except ValueError:
        return None
    return data if isinstance(data, dict) and isinstance(data.get("cell_sha256"), str) else None


@dataclasses.dataclass(frozen=True)
class Device:
    """Where a record was made, as its label says it."""

    name: str            # "NVIDIA H200", or "x86_64 CPU with no GPU"
    torch: str           # torch.__version__
    cuda: str | None     # torch.version.cuda when a CUDA device ran it
    recorded: str        # YYYY-MM-DD
    is_gpu: bool

    def where(self) -> str:
        """e.g. "an NVIDIA H200 (PyTorch 2.11.0+cu130, CUDA 13.0, recorded 2026-11-29)"."""
        versions = f"PyTorch {self.torch}" + (f", CUDA {self.cuda}" if self.cuda else "")
        return f"{_article(self.name)} {self.name} ({versions}, recorded {self.recorded})"

    def label(self, verb: str = "printed") -> str:
        return f"On {self.where()} the cell above {verb}:"

    def data(self) -> dict:
        return {"device": self.name, "torch": self.torch, "cuda": self.cuda, "recorded": self.recorded}


def _article(name: str) -> str:
    first = name.split()[0] if name.split() else name
    acronym = first.isupper() or any(ch.isdigit() for ch in first)
    vowel_sound = first[:1].upper() in ("AEFHILMNORSX" if acronym else "AEIOU")
    return "an" if vowel_sound else "a"


def device_from(info: dict, today: datetime.date | None = None) -> Device:
    """The Device of `gpu_report.machine()`'s info: the first CUDA device, else the CPU."""
    day = (today or datetime.date.today()).isoformat()
    if info.get("devices"):
        return Device(info["devices"][0]["name"], info["torch"], info.get("torch_cuda"), day, True)
    return Device(f"{platform.machine() or 'unknown'} CPU with no GPU", info["torch"], None, day, False)


def _fence(text: str) -> str:
    longest = max((len(m) for m in re.findall(r"`{3,}", text)), default=2)
    return "`" * max(3, longest + 1)


def _clip(text: str) -> str:
    """At most MAX_LINES lines and about MAX_CHARS characters: the beginning and the end
    (where an error's message is), with a note on what was cut in between."""
    lines = [line if len(line) <= 1000 else line[:1000] + " ..." for line in text.splitlines()]
    if len(lines) <= MAX_LINES and sum(len(line) + 1 for line in lines) <= MAX_CHARS:
        return "\n".join(lines)
    head, tail = [], []
    budget = MAX_CHARS
    for line in lines[:MAX_LINES * 3 // 4]:
        if budget - len(line) < MAX_CHARS // 4:
            break
        head.append(line)
        budget -= len(line) + 1
    for line in reversed(lines[len(head):][-(MAX_LINES - len(head)):]):
        if budget - len(line) < 0:
            break
        tail.insert(0, line)
        budget -= len(line) + 1
    cut = len(lines) - len(head) - len(tail)
    return "\n".join([*head, f"... ({cut} lines not shown here; run the cell on a GPU to see them all) ...", *tail])


def _output_parts(cell: NotebookNode) -> list[tuple[str, object]]:
    """The cell's outputs as ("text", str) and ("image", (mime, bytes)) in order, texts merged."""
    parts: list[tuple[str, object]] = []

    def text(value: str, merge: bool = True) -> None:
        value = ANSI.sub("", value)
        if merge and parts and parts[-1][0] == "text":
            parts[-1] = ("text", str(parts[-1][1]) + value)
        else:
            parts.append(("text", value))

    for out in cell.get("outputs", []):
        kind = out.get("output_type")
        if kind == "stream":
            text(out.get("text", ""))
        elif kind in ("display_data", "execute_result"):
            data = out.get("data", {})
            if "image/png" in data:
                parts.append(("image", ("image/png", base64.b64decode(data["image/png"]))))
            elif "text/plain" in data:
                plain = data["text/plain"]
                text(("".join(plain) if isinstance(plain, list) else plain).rstrip("\n") + "\n")
        elif kind == "error":
            text("\n".join(out.get("traceback", [])) or f"{out.get('ename')}: {out.get('evalue')}", merge=False)
    return parts


def make_block(code: NotebookNode, executed: NotebookNode, device: Device) -> NotebookNode:
    """The record block for the code cell `code`, from its executed copy `executed`."""
    data = {"cell_sha256": fingerprint(code.source), **device.data()}
    body: list[str] = []
    attachments: dict[str, dict[str, str]] = {}
    for kind, value in _output_parts(executed):
        if kind == "text":
            # What a terminal shows of a line rewritten with "\r" (a progress bar): its last state.
            shown = "\n".join(line.rstrip("\r").rsplit("\r", 1)[-1] for line in str(value).split("\n"))
            clipped = _clip(shown.rstrip("\n"))
            if clipped.strip():
                fence = _fence(clipped)
                body.append(f"{fence}text\n{clipped}\n{fence}")
        else:
            mime, raw = value  # type: ignore[misc]
            name = f"gpu-record-{len(attachments) + 1}.png"
            attachments[name] = {mime: base64.b64encode(raw).decode("ascii")}
            body.append(f"![figure {len(attachments)} the cell drew](attachment:{name})")
    if not body:
        body.append("*(nothing: no output, no figure)*")
    texts = any(kind == "text" for kind, _ in _output_parts(executed))
    verb = "printed and drew" if texts and attachments else "drew" if attachments else "printed"
    comment = json.dumps(data, sort_keys=True).replace("--", "- -")
    source = (f"<!-- gpu-record {comment} -->\n"
              f"<details><summary>{device.label(verb)}</summary>\n\n"
              + "\n\n".join(body) + "\n\n</details>")
    cell = v4.new_markdown_cell(source)
    cell.pop("id", None)
    cell.metadata["tags"] = [RECORD_TAG]
    if attachments:
        cell["attachments"] = attachments
    return cell


def strip_blocks(nb: NotebookNode) -> NotebookNode:
    out = copy.deepcopy(nb)
    out.cells = [c for c in out.cells if not is_block(c)]
    return out


def write_blocks(nb: NotebookNode, executed_cells: list[NotebookNode], device: Device) -> tuple[NotebookNode, list[str]]:
    """`nb` with a fresh block after each GPU-dependent code cell (its old blocks replaced),
    made from `executed_cells`: the notebook's cells as they ran, in order (harness cells
    removed; blocks present at run time are skipped). A code cell whose source differs from
    the one that ran gets no block. Returns the notebook and notes on what was skipped."""
    notes: list[str] = []
    clean = strip_blocks(nb)
    ran = [c for c in executed_cells if c.cell_type == "code" and not is_block(c)]
    code = [(i, c) for i, c in enumerate(clean.cells) if c.cell_type == "code"]
    if len(ran) != len(code):
        notes.append(f"the notebook has {len(code)} code cells, the run had {len(ran)}: nothing recorded")
        return nb, notes
    dependent = gpu_dependent_cells(clean)
    after: dict[int, NotebookNode] = {}
    for (index, cell), executed in zip(code, ran):
        if index not in dependent:
            continue
        if executed.source != cell.source:
            notes.append(f"cell {index} changed since the run: not recorded")
            continue
        if executed.get("execution_count") is None:
            notes.append(f"cell {index} did not run: not recorded")
            continue
        after[index] = make_block(cell, executed, device)
    cells = []
    for index, cell in enumerate(clean.cells):
        cells.append(cell)
        if index in after:
            cells.append(after[index])
    clean.cells = cells
    return clean, notes


# --------------------------------------------------------------------------------------
# Checking, pruning, coverage
# --------------------------------------------------------------------------------------

@dataclasses.dataclass
class Problem:
    index: int      # the block's cell index
    kind: str       # stale, orphan, unreadable
    message: str


def problems(nb: NotebookNode, name: str = "the notebook") -> list[Problem]:
    """Blocks that must not stay: stale (their code cell changed since the recording),
    orphans (not right after a code cell) and unreadable ones (no data line)."""
    found = []
    for index, cell in enumerate(nb.cells):
        if not is_block(cell):
            continue
        data = block_data(cell)
        before = nb.cells[index - 1] if index else None
        where = f"{name}, cell {index} (a GPU record block)"
        if data is None:
            found.append(Problem(index, "unreadable", (
                f"{where} has no readable '<!-- gpu-record {{...}} -->' first line, so nothing says "
                f"which cell it was recorded from. {FIX}")))
        elif before is None or before.cell_type != "code":
            found.append(Problem(index, "orphan", (
                f"{where} does not follow a code cell (the cell before it is "
                f"{'a ' + before.cell_type + ' cell' if before is not None else 'missing'}): it shows output of "
                f"a cell that is not above it. {FIX}")))
        elif data["cell_sha256"] != fingerprint(before.source):
            first = next((line.strip() for line in before.source.splitlines() if line.strip()), "")[:60]
            found.append(Problem(index, "stale", (
                f"{where} is stale: it was recorded on {data.get('device')} ({data.get('recorded')}) "
                f"from another version of code cell {index - 1} ({first!r}); the cell changed since "
                f"(recorded sha256 {data['cell_sha256'][:12]}, now {fingerprint(before.source)[:12]}), "
                f"so the output shown may be false. {FIX}")))
        elif EXCLUDE_TAG in _tags(before):
            found.append(Problem(index, "excluded", (
                f"{where} records code cell {index - 1}, which is tagged {EXCLUDE_TAG!r}. {FIX}")))
    return found


EXPECTED_LABEL = "expected, not recorded on a GPU"  # what show_expected prints
EXPECTED_CALL = "show_expected"   # coursetools/learner/figures.py: a GPU's output, as expected text


def expected_texts(source: str) -> list[str]:
    """The literal texts a code cell passes to show_expected(...): what it says a GPU prints."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return [node.args[0].value for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == EXPECTED_CALL
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)]


def recorded_text(block: NotebookNode) -> str:
    """The text a record block holds (its fenced blocks, joined)."""
    return "\n".join(body for _, body in re.findall(r"(`{3,})text\n(.*?)\n\1", block.source, re.DOTALL))


def _matches(expected: str, recorded: str) -> bool:
    """Whether `recorded` holds `expected`, whitespace-insensitive, `...` standing for anything."""
    pattern = r"\s+".join(".*?".join(re.escape(part) for part in word.split("..."))
                          for word in expected.split())
    return re.search(pattern, recorded, re.DOTALL) is not None


def expected_problems(nb: NotebookNode, name: str = "the notebook") -> list[str]:
    """Each show_expected text whose cell has a GPU record that does not hold it: the label said
    one thing, a real GPU printed another."""
    found = []
    for index, cell in enumerate(nb.cells[:-1]):
        after = nb.cells[index + 1]
        if cell.cell_type != "code" or not is_block(after):
            continue
        recorded = recorded_text(after)
        if EXPECTED_LABEL in recorded:  # that GPU lacked what the cell needs (2 GPUs): nothing to compare
            continue
        for text in expected_texts(cell.source):
            if not _matches(text, recorded):
                found.append(f"{name}, code cell {index}: show_expected says a GPU prints {text!r}, but the "
                             f"GPU record below it ({(block_data(after) or {}).get('device')}) shows "
                             f"{recorded[:300]!r}: correct the expected text from the record")
    return found


def prune(nb: NotebookNode, name: str = "the notebook") -> tuple[NotebookNode, list[Problem]]:
    """`nb` without the blocks `problems` finds; and those problems."""
    found = problems(nb, name)
    drop = {p.index for p in found}
    out = copy.deepcopy(nb)
    out.cells = [c for i, c in enumerate(out.cells) if i not in drop]
    return out, found


@dataclasses.dataclass
class Coverage:
    notebook: str
    dependent: dict[int, str]   # code cell index -> why
    recorded: list[int]         # dependent cells followed by a valid block

    @property
    def missing(self) -> list[int]:
        return [i for i in self.dependent if i not in self.recorded]


def coverage(nb: NotebookNode, name: str) -> Coverage:
    dependent = gpu_dependent_cells(nb)
    bad = {p.index for p in problems(nb, name)}
    recorded = [i for i in dependent
                if i + 1 < len(nb.cells) and is_block(nb.cells[i + 1]) and i + 1 not in bad]
    return Coverage(name, dependent, recorded)


def coverage_text(rows: list[Coverage], nbs: dict[str, NotebookNode] | None = None, cells: bool = True) -> str:
    """A table per notebook (GPU-dependent cells, with a record, missing), then (`cells`)
    every GPU-dependent cell with why it counts, for a maintainer to review."""
    lines = [f"{'notebook':40} {'GPU-dependent':>13} {'recorded':>8} {'missing':>7}"]
    for row in rows:
        lines.append(f"{row.notebook:40} {len(row.dependent):13d} {len(row.recorded):8d} {len(row.missing):7d}")
    total = sum(len(r.dependent) for r in rows)
    done = sum(len(r.recorded) for r in rows)
    lines.append(f"{'total':40} {total:13d} {done:8d} {total - done:7d}")
    if not cells:
        return "\n".join(lines)
    lines += ["", ("GPU-dependent cells (index counted from 0, markdown included; "
                   f"tag a code cell '{FORCE_TAG}' to add it, '{EXCLUDE_TAG}' to leave it out):")]
    for row in rows:
        for index, why in row.dependent.items():
            first = ""
            if nbs and row.notebook in nbs:
                source = nbs[row.notebook].cells[index].source
                first = next((line.strip() for line in source.splitlines() if line.strip()), "")[:60]
            state = "recorded" if index in row.recorded else "MISSING"
            lines.append(f"  {row.notebook} cell {index:>2}: {state:8} {why}" + (f"  | {first}" if first else ""))
    return "\n".join(lines)


def shown(path: Path, root: Path) -> str:
    path = Path(path)
    return path.relative_to(root).as_posix() if path.is_absolute() and path.is_relative_to(root) else str(path)
