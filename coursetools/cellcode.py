"""Reading a notebook code cell as Python: the few AST helpers the course's tools share
(which cells a GPU changes, which fixtures may share a submission, the cheat sheet's proofs)."""

from __future__ import annotations

import ast


def parse(source: str) -> ast.Module | None:
    """The cell as Python, IPython's `%magic` and `!shell` lines turned into calls the way
    IPython runs them (without IPython: blanked); None if it is not Python."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
        source = TransformerManager().transform_cell(source)
    except ImportError:
        source = "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                           for line in source.splitlines())
    except Exception:  # noqa: BLE001 - IPython rejects some broken input: ast says why below
        pass
    try:
        return ast.parse(source)
    except SyntaxError:
        return None


def dotted(node: ast.AST) -> str:
    """'torch.cuda.is_available' for that attribute chain; '' when it does not start at a name
    (`torch.Generator().manual_seed`, `x[0].to`)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def bound_names(target: ast.AST) -> list[str]:
    """The names an assignment target binds (`a`, `a, (b, *c)`), not `a.x` or `a[0]`."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for e in target.elts for n in bound_names(e)]
    if isinstance(target, ast.Starred):
        return bound_names(target.value)
    return []


def params(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> set[str]:
    args = fn.args
    every = args.posonlyargs + args.args + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a]
    return {a.arg for a in every}


def has_assert(source: str) -> bool:
    tree = parse(source)
    return tree is not None and any(isinstance(node, ast.Assert) for node in ast.walk(tree))
