"""No answer in a release: find a Predict question's key wherever a learner could read it.

A Predict answer cell is one whose reference answer (its solution region) is only dict literals
assigned to names: answers as data. Its key is what the reference answer, run, maps each item
to, written as the tests compare it (`f"{value}"`). `scan` looks through every code cell of a notebook a
learner opens (a release, English or Chinese) for:

* a dict literal that gives at least `MATCHES` of a key's items their true value (an
  `assert answers == {...}`, a `TRUE_SYNCS = {...}` table, a comment-free copy of the key);
* a 12-hex-digit string (a digest of "NN:item=value": with two or three choices per item, a
  digest is the key), anywhere in code;
* a `# BEGIN/END SOLUTIONS ONLY` marker (a proof that escaped the release step).

tests/course/test_no_answer_in_release.py runs it over every release, with a positive control:
a key planted in a copy of a release is found.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from nbformat import NotebookNode

from coursetools import notebooks

MATCHES = 3   # items of a key a dict must give right to count as a copy of it
DIGEST = re.compile(r"\b[0-9a-f]{12}\b")


@dataclass(frozen=True)
class Leak:
    cell: int
    what: str

    def __str__(self) -> str:
        return f"cell {self.cell}: {self.what}"


def _solution_region(source: str) -> str:
    lines, inside, out = source.split("\n"), False, []
    for line in lines:
        if line.strip() == notebooks.BEGIN_SOLUTION:
            inside = True
        elif line.strip() == notebooks.END_SOLUTION:
            inside = False
        elif inside:
            out.append(line)
    return "\n".join(out)


def is_predict_answer(cell: NotebookNode) -> bool:
    """An answer cell whose reference answer is only `NAME = {...}` dict literals: answers as data."""
    if not notebooks.is_solution(cell) or cell.cell_type != "code":
        return False
    try:
        body = ast.parse(_solution_region(cell.source)).body
    except SyntaxError:
        return False
    return bool(body) and all(isinstance(node, ast.Assign) and len(node.targets) == 1
                              and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Dict)
                              for node in body)


def _formatted(value) -> str:
    return f"{value}"


def keys(source: NotebookNode) -> dict[str, dict[str, str]]:
    """Answer grade id -> {item: the true answer as the tests compare it}, for every Predict
    question of a course source notebook (solutions/). Each dict the reference answer defines
    counts (a question may ask for several, e.g. AFTER_A and AFTER_B); its items are prefixed
    with the dict's name where several share items."""
    import torch
    from torch import nn

    out: dict[str, dict[str, str]] = {}
    for cell in source.cells:
        if not is_predict_answer(cell):
            continue
        ns: dict = {"torch": torch, "nn": nn}
        exec(compile(_solution_region(cell.source), "<reference answer>", "exec"), ns)
        found = {}
        for name, value in ns.items():
            if name.startswith("_") or not isinstance(value, dict) or name in ("torch", "nn"):
                continue
            for item, answer in value.items():
                found[f"{name}[{item!r}]"] = _formatted(answer)
        out[notebooks.grade_id(cell)] = found
    return out


def _item(key: str) -> tuple[str, str]:
    name, _, rest = key.partition("[")
    return name, ast.literal_eval(rest[:-1])


def _dict_items(node: ast.Dict) -> dict[str, str]:
    items = {}
    for k, v in zip(node.keys, node.values):
        if not isinstance(k, ast.Constant) or not isinstance(k.value, (str, int)):
            continue
        if isinstance(v, ast.Constant):
            items[k.value] = _formatted(v.value)
        elif isinstance(v, ast.Attribute):  # torch.float16
            items[k.value] = ast.unparse(v)
    return items


def scan(nb: NotebookNode, answer_keys: dict[str, dict[str, str]]) -> list[Leak]:
    """Every place in `nb`'s code cells where a learner can read a key (module docstring)."""
    leaks: list[Leak] = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        source = cell.source
        for marker in (notebooks.BEGIN_SOLUTIONS_ONLY, notebooks.END_SOLUTIONS_ONLY):
            if marker in source:
                leaks.append(Leak(index, f"a solutions-only marker ({marker!r}) reached the release"))
        for digest in DIGEST.findall(source):
            leaks.append(Leak(index, f"a 12-hex-digit digest {digest!r} (a digest of a few choices is a key)"))
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Dict):
                continue
            items = _dict_items(node)
            for grade_id, key in answer_keys.items():
                names = {_item(full)[0] for full in key}
                for name in names:
                    mine = {str(_item(full)[1]): answer for full, answer in key.items() if _item(full)[0] == name}
                    right = [item for item, value in items.items()
                             if str(item) in mine and _norm(value) == _norm(mine[str(item)])]
                    if len(right) >= min(MATCHES, len(mine)):
                        leaks.append(Leak(index, f"a dict on line {node.lineno} gives {len(right)} of "
                                                 f"{name}'s items ({grade_id}) their true answer: {sorted(right)}"))
    return leaks


def _norm(value: str) -> str:
    return value.removeprefix("torch.")
