"""Grading several fixture submissions in one notebook, where that proves the same thing.

Every fixture (tests/submissions/) is one student's notebook: the reference answers with one
question answered wrongly (or differently). Autograding costs a kernel start, `import torch`
and the whole notebook's run (5.5-11 CPU-seconds a submission on the CI machine), most of
it for the cells the fixture does not change. A *group* is one submission that carries the
changed answers of several fixtures at once, as a real student's notebook would: one kernel,
one run, and each member's claim checked on its own test cells.

A group is only formed where the grades cannot mix up (checked here, from the notebook's
code, before anything runs):

* the members replace different answer cells, and lose different test cells;
* no test cell that one member loses can see another member's answer: the test does not use,
  directly or through the cells it calls, a name any other member's answer cell defines,
  nor a notebook-level variable that other answer reads or writes (it might change it);
* no member changes state the whole kernel shares (the default device or dtype, a random
  seed, an environment variable, a global, a module's attribute, ...) or can end the kernel;
  such a fixture is graded alone, as is one whose TOML says `alone = "why"`.

Then a group proves, for each member, what its own submission proves: its `loses` test
cells score 0, because nothing but its own answer reaches them; the test cells no member
loses score full marks, so no member costs points elsewhere; and each member's own answer
is, for the cells it reaches, in the notebook a student with only that mistake would have.
`python3 make.py author-check <chapter>` still grades every fixture alone, for an author at work.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from functools import cached_property

from nbformat import NotebookNode

from . import cellcode, notebooks
from .fixtures import Fixture, expected_scores, reference_answers

# Calls that change what every later cell sees (by their last dotted parts).
GLOBAL_CALLS = {
    "set_default_device", "set_default_dtype", "set_default_tensor_type", "manual_seed",
    "manual_seed_all", "seed", "set_rng_state", "set_num_threads", "set_num_interop_threads",
    "set_float32_matmul_precision", "use_deterministic_algorithms", "set_device",
    "init_process_group", "destroy_process_group", "set_grad_enabled", "set_printoptions",
    "chdir", "putenv", "unsetenv", "filterwarnings", "simplefilter", "resetwarnings",
    "setrecursionlimit", "set_flush_denormal", "set_anomaly_enabled", "detect_anomaly",
    "setdefault", "_exit", "exit", "quit", "abort", "kill", "killpg", "signal", "register",
}
# ... and any call of a notebook-level object's (a module's) function named like a setter.
GLOBAL_PREFIXES = ("set_", "register", "add_", "enable", "disable", "reset", "use_", "empty_cache")
# Calls that mean "can end the kernel": grading alone keeps the other fixtures' cells running.
ENDS_KERNEL = {"_exit", "exit", "quit", "abort", "kill", "killpg"}


def _root(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _top_level(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(code names: def, class, import; data names: everything else bound) at notebook level."""
    code, data = set(), set()

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                code.add(node.name)
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                code.update((a.asname or a.name).split(".")[0] for a in node.names)
                continue
            for sub in ast.walk(node):
                if isinstance(sub, ast.Assign):
                    for t in sub.targets:
                        data.update(cellcode.bound_names(t))
                elif isinstance(sub, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
                    data.update(cellcode.bound_names(sub.target))
                elif isinstance(sub, (ast.For, ast.AsyncFor, ast.comprehension)):
                    data.update(cellcode.bound_names(sub.target))
                elif isinstance(sub, ast.withitem) and sub.optional_vars is not None:
                    data.update(cellcode.bound_names(sub.optional_vars))
                elif isinstance(sub, ast.ExceptHandler) and sub.name:
                    data.add(sub.name)
            for inner in ("body", "orelse", "finalbody", "handlers"):
                if isinstance(node, (ast.If, ast.For, ast.While, ast.With, ast.Try)):
                    visit([n for n in getattr(node, inner, []) if isinstance(n, ast.stmt)])

    visit(tree.body)
    return code, data


def _used(tree: ast.Module) -> set[str]:
    """Names the cell reads from the notebook: free in its functions (not their parameters
    or locals), and read at top level but not bound by the cell itself."""
    out: set[str] = set()

    def visit(node: ast.AST, bound: frozenset[str]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            for outer in [*getattr(node, "decorator_list", []), *node.args.defaults,
                          *(d for d in node.args.kw_defaults if d is not None)]:
                visit(outer, bound)
            inner = bound | _locals_of(node)
            for child in (node.body if isinstance(node.body, list) else [node.body]):
                visit(child, inner)
            return
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            bound = bound | {n for g in node.generators for n in cellcode.bound_names(g.target)}
        if isinstance(node, ast.Name) and node.id not in bound:
            out.add(node.id)
        for child in ast.iter_child_nodes(node):
            visit(child, bound)

    code, data = _top_level(tree)
    visit(tree, frozenset(code | data))
    return out


def _locals_of(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> set[str]:
    names = cellcode.params(fn)
    for sub in ast.walk(fn):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
            names.add(sub.id)
        elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and sub is not fn:
            names.add(sub.name)
        elif isinstance(sub, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in sub.names)
        elif isinstance(sub, ast.ExceptHandler) and sub.name:
            names.add(sub.name)
    return names


def global_effects(code: str) -> list[str]:
    """What in an answer's code may change state every later cell shares, or end the kernel."""
    tree = cellcode.parse(code)
    if tree is None:
        return ["its code is not valid Python"]
    own = set().union(*_top_level(tree))
    found: list[str] = []
    scopes: list[tuple[ast.AST, set[str]]] = [(tree, own)]
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            scopes.append((fn, _locals_of(fn)))

    def local_to(node: ast.AST, name: str | None) -> bool:
        # the innermost function (or the cell) that contains node binds name itself
        best = None
        for scope, names in scopes:
            if any(sub is node for sub in ast.walk(scope)):
                if best is None or any(sub is scope for sub in ast.walk(best[0])):
                    best = (scope, names)
        return name is not None and best is not None and name in best[1]

    context_calls = {id(item.context_expr) for n in ast.walk(tree) if isinstance(n, (ast.With, ast.AsyncWith))
                     for item in n.items}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            found.append(f"rebinds {', '.join(node.names)} for the whole notebook (`global`)")
        elif isinstance(node, ast.Call):
            parts = cellcode.dotted(node.func).split(".") if cellcode.dotted(node.func) else []
            name = parts[-1] if parts else None
            setter = name in GLOBAL_CALLS or ((name or "").startswith(GLOBAL_PREFIXES) and len(parts) > 1)
            if setter and id(node) not in context_calls:
                if isinstance(node.func, ast.Attribute) and _root(node.func) is None:
                    continue  # a method of an object made right here (torch.Generator().manual_seed)
                if len(parts) > 1 and local_to(node, parts[0]):
                    continue  # a method of a local object (a dict's setdefault, ...)
                found.append(f"calls {'.'.join(parts)}()" + (" (can end the kernel)" if name in ENDS_KERNEL else ""))
            elif name == "setattr" and node.args and not local_to(node, _root(node.args[0])):
                found.append(f"sets an attribute of the notebook-level {_root(node.args[0])}")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                if isinstance(target, (ast.Attribute, ast.Subscript)):
                    root = _root(target)
                    if root is not None and not local_to(node, root):
                        found.append(f"changes {ast.unparse(target)}, a notebook-level object")
    return list(dict.fromkeys(found))


@dataclass
class Analysis:
    """Which test cells each answer cell can reach, from the source notebook's code."""

    source: NotebookNode
    fixtures: list[Fixture]

    @cached_property
    def _cells(self) -> list[tuple[str, str, list[str]]]:
        """(kind, id, codes) per code cell: an answer cell's codes are its reference answer
        and every fixture's version of it."""
        reference = reference_answers(self.source)
        out = []
        for index, cell in enumerate(self.source.cells):
            if cell.cell_type != "code":
                continue
            gid = notebooks.grade_id(cell) or f"cell-{index}"
            if notebooks.is_solution(cell):
                codes = [reference.get(gid, "")] + [fx.answers[gid] for fx in self.fixtures if gid in fx.answers]
                out.append(("answer", gid, codes))
            else:
                kind = "test" if notebooks.is_test_cell(cell) else "code"
                out.append((kind, gid, [cell.source]))
        return out

    @cached_property
    def _names(self) -> dict[str, tuple[set[str], set[str], set[str]]]:
        """cell id -> (names it defines, data names it binds, names it uses)."""
        out = {}
        for _kind, gid, codes in self._cells:
            defines, data, used = set(), set(), set()
            for code in codes:
                tree = cellcode.parse(code)
                if tree is None:
                    continue
                c, d = _top_level(tree)
                defines |= c | d
                data |= d
                used |= _used(tree)
            out[gid] = (defines, data, used)
        return out

    @cached_property
    def data_names(self) -> set[str]:
        return set().union(*(d for _, d, _ in self._names.values()))

    def reach(self, gid: str) -> tuple[set[str], set[str]]:
        """(cells, notebook-level data names) that cell gid depends on, itself included."""
        definers: dict[str, set[str]] = {}
        for cell, (defines, _, _) in self._names.items():
            for name in defines:
                definers.setdefault(name, set()).add(cell)
        seen, todo, data = {gid}, [gid], set()
        while todo:
            used = self._names[todo.pop()][2]
            data |= used & self.data_names
            for name in used:
                for cell in definers.get(name, ()):
                    if cell not in seen:
                        seen.add(cell)
                        todo.append(cell)
        return seen, data

    def tests_seen_by(self, fixture: Fixture) -> set[str]:
        """Test cells one fixture's answers can reach: by a name those answers define, or by a
        notebook-level variable they use (which they might change)."""
        touched_data = set()
        for gid in fixture.answers:
            tree = cellcode.parse(fixture.answers[gid])
            if tree is not None:
                touched_data |= _used(tree) & self.data_names
        out = set()
        for kind, gid, _ in self._cells:
            if kind != "test":
                continue
            cells, data = self.reach(gid)
            if cells & set(fixture.answers) or data & touched_data:
                out.add(gid)
        return out

    def alone_because(self, fixture: Fixture) -> list[str]:
        declared = getattr(fixture, "alone", "")
        reasons = [f"its TOML says alone: {declared}"] if declared else []
        for gid, code in fixture.answers.items():
            reasons += [f"{gid}: {why}" for why in global_effects(code)]
        return reasons


@dataclass
class Group:
    """One submission carrying the answers of one or more fixtures of an assignment."""

    assignment: str
    index: int
    members: list[Fixture] = field(default_factory=list)

    @property
    def student_id(self) -> str:
        if len(self.members) == 1:
            return self.members[0].student_id
        return f"fixtures-{self.index:02d}"

    @property
    def answers(self) -> dict[str, str]:
        return {gid: code for fx in self.members for gid, code in fx.answers.items()}

    @property
    def loses(self) -> set[str]:
        return {gid for fx in self.members for gid in fx.loses}

    def expected_for(self, fixture: Fixture, source: NotebookNode) -> dict[str, float]:
        """The scores this group must show for one member's claim: its `loses` cells 0, and
        every cell no member loses full marks."""
        solo = expected_scores(fixture, source)
        others = self.loses - set(fixture.loses)
        return {gid: pts for gid, pts in solo.items() if gid not in others}

    def describe(self) -> str:
        if len(self.members) == 1:
            return f"{self.student_id} (graded alone)"
        return f"{self.student_id}, which carries " + "; ".join(
            f"{fx.name} (answers {', '.join(fx.answers)}; loses {', '.join(fx.loses) or 'nothing'})"
            for fx in self.members)


def groups(assignment: str, fixtures: list[Fixture], source: NotebookNode) -> list[Group]:
    """The assignment's fixtures dealt into groups (first fit, in file-name order, so the
    groups stay the same from run to run)."""
    mine = sorted((fx for fx in fixtures if fx.assignment == assignment), key=lambda fx: fx.name)
    analysis = Analysis(source, mine)
    seen = {fx.name: analysis.tests_seen_by(fx) for fx in mine}
    out: list[Group] = []

    def fits(fx: Fixture, group: Group) -> bool:
        for other in group.members:
            if set(fx.answers) & set(other.answers) or set(fx.loses) & set(other.loses):
                return False
            if set(fx.loses) & seen[other.name] or set(other.loses) & seen[fx.name]:
                return False
        return True

    for fx in mine:
        if not analysis.alone_because(fx):
            group = next((g for g in out if g.members and not analysis.alone_because(g.members[0])
                          and fits(fx, g)), None)
            if group is not None:
                group.members.append(fx)
                continue
        out.append(Group(assignment, 0, [fx]))
    for index, group in enumerate(out, start=1):
        group.index = index
    return out
