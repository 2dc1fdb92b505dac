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
* no test cell that one member loses can see another member's answer. A test sees an answer
  when it uses, directly or through the cells it calls, a name the answer cell defines (also
  by a string: `eval("f(x)")`, `%timeit f(x)`, `globals()["f"]`), or a notebook-level object
  the answer could change: a variable the answer, a cell it calls, or a cell that calls it
  (and may hand it over) uses, or a class whose attributes the answer touches. Variables only
  ever bound to constants, strings, dtypes or devices cannot change and do not count;
* no member changes state the whole kernel shares (the default device or dtype, a seed, RNG
  state, `os.environ`, a `global`, a module's or a class's attribute, a name it deletes, a
  setter called through an import alias, a decorator or getattr, names reached by
  globals()/eval/exec) or can end the kernel; such a fixture is graded alone, as is one whose
  TOML says `alone = "why"`.

What static reading cannot see: a wrong answer that hangs or crashes the kernel uses the
submission's time budget and restarts for every member, and code that reaches shared state
by ways not listed above. Mostly that makes cells no member loses score 0, so the tests fail
and name the group (then mark the fixture `alone`); but it could also zero another member's
lost cell for the wrong reason and hide that member's mistake. No fixture of the course does
either today (each passed graded alone before groups existed); `author-check` grades alone.

Then a group proves, for each member, what its own submission proves: its `loses` test
cells score 0, because nothing but its own answer reaches them; the test cells no member
loses score full marks, so no member costs points elsewhere; and each member's own answer
is, for the cells it reaches, in the notebook a student with only that mistake would have.
`python3 make.py author-check <chapter>` still grades every fixture alone, for an author at work.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from functools import cached_property

from nbformat import NotebookNode

from coursetools import cellcode, notebooks
from coursetools.author.fixtures import Fixture, expected_scores, reference_answers

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
# Names that reach the notebook's namespace (or modules) by strings, past any static reading.
DYNAMIC = {"globals", "vars", "locals", "eval", "exec", "compile", "__import__", "importlib", "builtins"}
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


def _root(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _imports(node: ast.Import | ast.ImportFrom) -> dict[str, str]:
    """alias -> what it names: `import torch.nn as nn` {'nn': 'torch.nn'}, `import os.path`
    {'os': 'os'}, `from torch import manual_seed as ms` {'ms': 'torch.manual_seed'}."""
    out = {}
    for alias in node.names:
        if isinstance(node, ast.ImportFrom):
            out[alias.asname or alias.name] = f"{node.module or ''}.{alias.name}".lstrip(".")
        elif alias.asname:
            out[alias.asname] = alias.name
        else:
            out[alias.name.split(".")[0]] = alias.name.split(".")[0]
    return out


def _own_statements(body: list[ast.AST]):
    """Every node of a scope's body, not entering nested functions, lambdas or classes (those
    are yielded themselves: their names, decorators and defaults belong to this scope)."""
    todo = list(reversed(body))
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, _SCOPES):
            outer = [*getattr(node, "decorator_list", []), *getattr(node, "bases", []),
                     *getattr(node, "keywords", [])]
            if not isinstance(node, ast.ClassDef):
                outer += [*node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]
            todo.extend(reversed(outer))
            continue
        todo.extend(reversed(list(ast.iter_child_nodes(node))))


def _bindings(body: list[ast.AST]) -> tuple[set[str], dict[str, str]]:
    """(variables, imports) one scope binds: assignment and loop targets, `with ... as`,
    `except ... as`, walrus, the names of the functions and classes it defines; imports apart,
    alias -> module (a module is shared by the whole kernel, never a scope's own object)."""
    variables: set[str] = set()
    imports: dict[str, str] = {}
    for node in _own_statements(body):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.update(_imports(node))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            variables.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            variables.add(node.id)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            variables.add(node.name)
    return variables, imports


def _scope_body(node: ast.AST) -> list[ast.AST]:
    return node.body if isinstance(getattr(node, "body", None), list) else [node.body]


def _top_level(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(code names: def, class, import; data names: the other names bound) of a cell."""
    variables, imports = _bindings(tree.body)
    code = set(imports)
    for node in _own_statements(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            code.add(node.name)
    return code, variables - code


def _class_names(tree: ast.Module) -> set[str]:
    return {n.name for n in _own_statements(tree.body) if isinstance(n, ast.ClassDef)}


def _strings_read_as_code(tree: ast.AST) -> set[str]:
    """Identifiers in the strings a cell hands to eval/exec/compile or to an IPython magic
    (`%timeit f(x)` becomes run_line_magic('timeit', 'f(x)')): names read past the syntax tree."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in {"eval", "exec", "compile", "run_line_magic", "run_cell_magic"}:
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        found |= set(_IDENTIFIER.findall(arg.value))
    return found


def _name_strings(tree: ast.AST) -> set[str]:
    """Strings that are one identifier (`globals()["f"]`, `getattr(module, "f")`): a way to
    reach a function by its name."""
    return {node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier()}


def _immutable(value: ast.AST) -> bool:
    """A value no cell can change in place: a constant, a string built from constants, a
    tuple of such, a dtype or other attribute of a module, torch.device(...)."""
    if isinstance(value, (ast.Constant, ast.JoinedStr)):
        return True
    if isinstance(value, ast.Tuple):
        return all(_immutable(e) for e in value.elts)
    if isinstance(value, ast.BinOp):
        return _immutable(value.left) and _immutable(value.right)
    if isinstance(value, ast.Attribute):
        return bool(cellcode.dotted(value))  # torch.float32, math.pi
    if isinstance(value, ast.Call):
        name = cellcode.dotted(value.func)
        return name in {"torch.device", "torch.Size", "textwrap.dedent", "str", "int", "float", "bool",
                        "tuple", "frozenset", "len", "repr", "dedent"}
    return False


def _immutable_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(names the cell binds only to immutable values, names it binds otherwise), at top level."""
    fixed, other = set(), set()
    for node in _own_statements(tree.body):
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            (fixed if _immutable(node.value) else other).update(t.id for t in node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.With, ast.NamedExpr, ast.Assign)):
            targets = [node.target] if hasattr(node, "target") else getattr(node, "targets", [])
            for item in getattr(node, "items", []):
                targets.append(item.optional_vars)
            other.update(n for t in targets if t is not None for n in cellcode.bound_names(t))
    return fixed, other


def _used(tree: ast.Module) -> set[str]:
    """Names the cell reads from the notebook: free in its functions (not their parameters or
    locals), read at top level but not bound by the cell itself, and named in strings read as
    code (see _strings_read_as_code)."""
    out: set[str] = set()

    in_comprehension = set()  # Name nodes that read a comprehension's own variable
    for comp in ast.walk(tree):
        if isinstance(comp, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            own = {n for g in comp.generators for n in cellcode.bound_names(g.target)}
            in_comprehension |= {id(n) for n in ast.walk(comp) if isinstance(n, ast.Name) and n.id in own}

    def visit(body: list[ast.AST], bound: frozenset[str]) -> None:
        for node in _own_statements(body):
            if isinstance(node, ast.Name) and node.id not in bound and id(node) not in in_comprehension:
                out.add(node.id)
            if isinstance(node, _SCOPES):
                variables, imports = _bindings(_scope_body(node))
                inner = bound | variables | set(imports)
                if not isinstance(node, ast.ClassDef):
                    inner |= cellcode.params(node)
                visit(_scope_body(node), frozenset(inner))

    code, data = _top_level(tree)
    visit(tree.body, frozenset(code | data))
    return out | (_strings_read_as_code(tree) - code - data)


def global_effects(code: str) -> list[str]:
    """What in an answer's code may change state every later cell shares, or end the kernel."""
    tree = cellcode.parse(code)
    if tree is None:
        return ["its code is not valid Python"]
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    top_variables, imports = _bindings(tree.body)
    scopes: dict[ast.AST, set[str]] = {tree: top_variables}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            variables, local_imports = _bindings(_scope_body(node))
            scopes[node] = (variables | cellcode.params(node)) - set(local_imports)
            imports.update(local_imports)

    def local_to(node: ast.AST, name: str | None) -> bool:
        """name is a variable of a function around node (or of the cell), not a module."""
        while name is not None and node is not None:
            if node in scopes and name in scopes[node]:
                return True
            node = parents.get(node)
        return False

    def resolved(func: ast.AST) -> list[str]:
        parts = cellcode.dotted(func).split(".") if cellcode.dotted(func) else []
        if parts and parts[0] in imports and not local_to(func, parts[0]):
            parts = imports[parts[0]].split(".") + parts[1:]
        return parts

    def setter(func: ast.AST, node: ast.AST) -> str | None:
        parts = resolved(func)
        name = parts[-1] if parts else None
        if not (name in GLOBAL_CALLS or ((name or "").startswith(GLOBAL_PREFIXES) and len(parts) > 1)):
            return None
        if isinstance(func, ast.Attribute) and _root(func) is None:
            return None  # a method of an object made right here (torch.Generator().manual_seed)
        if local_to(node, cellcode.dotted(func).split(".")[0]) and isinstance(func, ast.Attribute):
            return None  # a method of a local object (a dict's setdefault, ...)
        return f"calls {'.'.join(parts)}()" + (" (can end the kernel)" if name in ENDS_KERNEL else "")

    context_calls = {id(item.context_expr) for n in ast.walk(tree) if isinstance(n, (ast.With, ast.AsyncWith))
                     for item in n.items}
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            found.append(f"rebinds {', '.join(node.names)} for the whole notebook (`global`)")
        elif isinstance(node, ast.Call) and id(node) not in context_calls:
            why = setter(node.func, node)
            if why:
                found.append(why)
            elif isinstance(node.func, ast.Call) and cellcode.dotted(node.func.func) == "getattr":
                found.append("calls a function it looked up by name (getattr(...)(...))")
            elif cellcode.dotted(node.func) == "setattr" and node.args and not local_to(node, _root(node.args[0])):
                found.append(f"sets an attribute of {ast.unparse(node.args[0])}, which is not its own")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for decorator in node.decorator_list:  # @atexit.register runs register(f)
                why = None if isinstance(decorator, ast.Call) else setter(decorator, node)
                if why:
                    found.append(f"{why} as a decorator")
        elif isinstance(node, ast.Name) and node.id in DYNAMIC and not local_to(node, node.id):
            found.append(f"uses {node.id}: names reached by strings cannot be followed")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                root = _root(target)
                if isinstance(target, (ast.Attribute, ast.Subscript)) and not local_to(node, root):
                    found.append(f"changes {ast.unparse(target)}, an object that is not its own")
                elif isinstance(node, ast.Delete) and isinstance(target, ast.Name) and not local_to(node, target.id):
                    found.append(f"deletes {target.id}, a name of the notebook")
    return list(dict.fromkeys(found))


@dataclass
class Analysis:
    """Which test cells each answer cell can reach, from the source notebook's code."""

    source: NotebookNode
    fixtures: list[Fixture]
    _reached: dict = field(default_factory=dict, init=False, repr=False)
    _strings: dict = field(default_factory=dict, init=False, repr=False)
    _fixed: set = field(default_factory=set, init=False, repr=False)
    _changing: set = field(default_factory=set, init=False, repr=False)
    _classes: set = field(default_factory=set, init=False, repr=False)
    _alone: dict = field(default_factory=dict, init=False, repr=False)

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
        """cell id -> (names it defines, variables it binds, names it uses)."""
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
                self._strings[gid] = self._strings.get(gid, set()) | _name_strings(tree)
                fixed, other = _immutable_names(tree)
                self._fixed |= fixed
                self._changing |= other | (d - fixed)
                self._classes |= _class_names(tree)
            out[gid] = (defines, data, used)
        return out

    @cached_property
    def shared_names(self) -> set[str]:
        """Notebook-level variables that may hold an object a cell can change in place for the
        cells after it (not those only ever bound to a constant, a string, a dtype, a device)."""
        names = set().union(*(d for _, d, _ in self._names.values()))
        return names - (self._fixed - self._changing)

    @cached_property
    def _answer_names(self) -> set[str]:
        return set().union(*(self._names[gid][0] for kind, gid, _ in self._cells if kind == "answer"))

    @cached_property
    def _definers(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for cell, (defines, _, _) in self._names.items():
            for name in defines:
                out.setdefault(name, set()).add(cell)
        return out

    def reach(self, gid: str, used: set[str] | None = None,
              opaque: frozenset[str] = frozenset()) -> tuple[frozenset[str], frozenset[str]]:
        """(cells, shared names) that cell gid depends on, itself included: the cells defining
        the names it uses (or `used`, for one fixture's version of an answer cell), theirs, and
        so on; `opaque` cells are reached but not read (a fixture's own cells: their code is
        the fixture's, read apart)."""
        if used is None and not opaque and gid in self._reached:
            return self._reached[gid]
        seen, todo, shared, first = {gid}, [gid], set(), used
        while todo:
            cell = todo.pop()
            if cell in opaque and first is None:
                continue
            names = first if first is not None else (
                self._names[cell][2] | (self._strings.get(cell, set()) & self._answer_names))
            first = None
            shared |= names & self.shared_names
            for name in names:
                for other in self._definers.get(name, ()):
                    if other not in seen:
                        seen.add(other)
                        todo.append(other)
        if used is not None or opaque:
            return frozenset(seen), frozenset(shared)
        self._reached[gid] = frozenset(seen), frozenset(shared)
        return self._reached[gid]

    def tests_seen_by(self, fixture: Fixture) -> set[str]:
        """Test cells one fixture's answers can reach: through the names its answer cells
        define, or through a shared object (a notebook-level variable or class) it can get hold
        of and change: one its answers use, directly or through the cells they call, or one a
        cell calling its answers uses (it may hand it over as an argument)."""
        mine = set(fixture.answers)
        callers = [gid for _kind, gid, _ in self._cells if gid not in mine and self.reach(gid)[0] & mine]
        touched = set().union(*(self.reach(gid, opaque=frozenset(mine))[1] for gid in callers))
        for gid, code in fixture.answers.items():  # its own code, and the cells that code calls
            tree = cellcode.parse(code)
            used = (_used(tree) | (_name_strings(tree) & self._answer_names)) if tree is not None else set()
            cells, shared = self.reach(gid, used)
            touched |= shared  # ... and their variables (a helper may change them)
            touched |= set().union(*(self._names[c][1] for c in cells - mine)) & self.shared_names
        touched_classes = set()  # `Registry.items.append(x)`: a notebook class's own state
        for code in fixture.answers.values():
            tree = cellcode.parse(code)
            if tree is not None:
                touched_classes |= {n.value.id for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                                    and isinstance(n.value, ast.Name)} & self._classes
        return {gid for kind, gid, _ in self._cells if kind == "test"
                and (self.reach(gid)[0] & mine or self.reach(gid)[1] & touched
                     or any(self._names[c][2] & touched_classes for c in self.reach(gid)[0]))}

    def alone_because(self, fixture: Fixture) -> list[str]:
        """Why a fixture must be graded in a submission of its own; [] if it need not."""
        if fixture.name not in self._alone:
            reasons = [f"its TOML says alone: {fixture.alone}"] if fixture.alone else []
            for gid, code in fixture.answers.items():
                reasons += [f"{gid}: {why}" for why in global_effects(code)]
            self._alone[fixture.name] = reasons
        return list(self._alone[fixture.name])


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
