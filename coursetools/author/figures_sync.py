"""Copy the course's drawing helpers into each lesson that draws with them.

    python3 make.py figures            write the `figures` cell of every lesson that calls a helper
    python3 make.py figures --check    only say which lessons are stale (exit 1 if any)

coursetools/learner/figures.py is the one source of the helpers (show_module, show_storage, ...).
Colab opens a notebook alone, so a lesson cannot import it: a lesson that calls `show_x(` holds,
in one collapsed code cell tagged `figures`, the file's shared part (its imports and colours),
each show_ function the lesson calls and the private helpers those use, in the file's order. Nothing else is
copied, so each lesson carries only what it draws. A lesson that calls a helper and has no such
cell gets one right after its setup cell. tests/author/test_figures.py checks every lesson.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import nbformat

from coursetools import layout, notebooks

SOURCE = Path(__file__).resolve().parents[1] / "learner" / "figures.py"
TAG = "figures"
HEADER = ("# Drawing helpers (collapsed): the course's coursetools/learner/figures.py, the part this lesson\n"
          "# uses. Each figure is drawn from this notebook's own objects.")


def _blocks(text: str) -> list[tuple[str | None, str]]:
    """The file's top-level statements as (function name or None, source with its comments)."""
    lines = text.splitlines()
    tree = ast.parse(text)
    docstring = ast.get_docstring(tree, clean=False) is not None
    body = tree.body[1:] if docstring else tree.body
    blocks, previous_end = [], tree.body[0].end_lineno if docstring else 0
    for node in body:
        chunk = "\n".join(lines[previous_end:node.end_lineno]).strip("\n")
        previous_end = node.end_lineno
        name = node.name if isinstance(node, ast.FunctionDef) and node.name.startswith("show_") else None
        blocks.append((name, chunk))
    return blocks


def helpers() -> list[str]:
    """The names of the drawing helpers a lesson may call."""
    return [name for name, _ in _blocks(SOURCE.read_text()) if name]


def cell_source(names: set[str]) -> str:
    """The `figures` cell for a lesson that calls `names`: the shared part, then those helpers."""
    blocks = _blocks(SOURCE.read_text())
    wanted = [chunk for name, chunk in blocks if name in names]
    private = {chunk.split("(")[0][4:]: chunk for name, chunk in blocks if name is None and chunk.startswith("def _")}
    grown = True
    while grown:                                # the private helpers those use, and the ones they use
        text = "\n".join(wanted)
        grown = False
        for helper, chunk in private.items():
            if chunk not in wanted and re.search(rf"\b{helper}\(", text):
                wanted.append(chunk)
                grown = True
    kept = [chunk for name, chunk in blocks if name in names or (name is None and (
        not chunk.startswith("def _") or chunk in wanted))]
    text = HEADER
    for previous, chunk in zip([HEADER, *kept], kept):
        # statements follow each other; a function stands apart, as in the file
        apart = chunk.startswith("def ") or previous.startswith("def ")
        after_imports = previous.startswith(("import ", "from ")) and not chunk.startswith(("import ", "from "))
        text += ("\n\n\n" if apart else "\n\n" if after_imports else "\n") + chunk
    return text


def used(nb) -> set[str]:
    """The helpers the lesson's code calls (its `figures` cell aside)."""
    known = helpers()
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code" and TAG not in c.metadata.get("tags", []))
    return {name for name in known if re.search(rf"\b{name}\(", code)}


def expected(nb) -> str | None:
    names = used(nb)
    return cell_source(names) if names else None


def sync(path: Path, write: bool) -> bool:
    """True when the lesson's `figures` cell is what it should be (after writing it, if `write`)."""
    nb = notebooks.read(path)
    want = expected(nb)
    cells = [c for c in nb.cells if TAG in c.metadata.get("tags", [])]
    have = cells[0].source if len(cells) == 1 else None
    if len(cells) <= 1 and have == want:
        return True
    if not write:
        return False
    for cell in cells:
        nb.cells.remove(cell)
    if want is not None:
        cell = nbformat.v4.new_code_cell(want)
        cell.metadata = {"jupyter": {"source_hidden": True}, "tags": [TAG]}
        cell.pop("id", None)
        setup = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
        nb.cells.insert(setup + 1, cell)
    notebooks.write(nb, path)
    return True


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    check = "--check" in argv
    stale = []
    for path in sorted(layout.COURSE_DIR.glob("*.ipynb")):
        if not sync(path, write=not check):
            stale.append(path.relative_to(layout.ROOT).as_posix())
    if check and stale:
        print("stale figure cells (run `python3 make.py figures`): " + ", ".join(stale))
        return 1
    print("figure cells in step with coursetools/learner/figures.py" if check else
          "figure cells written from coursetools/learner/figures.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
