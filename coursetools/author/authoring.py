"""Building blocks for course notebooks: the standard header and setup cell, nbgrader cells.

Authors may write notebooks in JupyterLab (nbgrader's "Create Assignment" toolbar sets the
same metadata) or build them from a script with these helpers:

    from coursetools.author import authoring as A
    cells = [
        A.header("solutions/09_topic/09_topic.ipynb", "09 · Topic", goals=[...], minutes=30),
        A.setup_cell(locked=True),
        A.md("## 1. ..."),
        A.answer("my_function", "def my_function(x):\\n    ### BEGIN SOLUTION\\n    ...\\n    ### END SOLUTION"),
        A.tests("test_my_function", 2, '\"\"\"my_function ...\"\"\"\\nassert ...'),
    ]
    A.save(cells, "solutions/09_topic/09_topic.ipynb")

tests/course/test_notebooks_static.py checks the conventions these helpers produce.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat import NotebookNode, v4

from coursetools import layout, notebooks

# The one setup cell every notebook starts with (tests check it is identical everywhere).
SETUP_SOURCE = '''\
# Setup (the same in every notebook of the course): device with CPU fallback, seed, report.
import torch

if hasattr(torch, "accelerator") and torch.accelerator.is_available():  # PyTorch >= 2.6
    device = torch.accelerator.current_accelerator()
elif torch.cuda.is_available():
    device = torch.device("cuda")
elif torch.backends.mps.is_available():
    device = torch.device("mps")
else:
    device = torch.device("cpu")
torch.manual_seed(0)
gpu_name = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
print(f"PyTorch {torch.__version__} | device: {device}{gpu_name}")
if device.type == "cpu":
    print("No GPU found: every cell still runs, on the CPU. For a GPU in Colab: "
          "Runtime > Change runtime type > T4 GPU, then Runtime > Run all.")'''

SETUP_GRADE_ID = "setup"

# Notebook metadata: a plain Python 3 kernel; Colab opens the notebook on a GPU runtime.
NOTEBOOK_METADATA = {
    "accelerator": "GPU",
    "colab": {"gpuType": "T4", "provenance": []},
    "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
    "language_info": {"name": "python"},
}

COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"


def colab_link(relpath: str | Path) -> str:
    """The markdown badge linking a notebook to Colab (built from course.toml)."""
    return f"[![Open In Colab]({COLAB_BADGE})]({layout.config().colab_url(relpath)})"


def header(relpath: str | Path, title: str, *, goals: list[str], minutes: int,
           prerequisites: str = "", intro: str = "") -> NotebookNode:
    """The first cell: Colab link, title, what you will learn, prerequisites and time.

    `relpath` is where a learner opens the notebook: course/NN_topic.ipynb for a lesson,
    exercises/NN_topic/NN_topic.ipynb for an assignment (also in its solutions/ source).
    """
    parts = [colab_link(relpath), "", f"# {title}", ""]
    if intro:
        parts += [intro, ""]
    parts += ["**You will learn to**", ""] + [f"- {g}" for g in goals] + [""]
    meta = f"**Time:** about {minutes} minutes."
    if prerequisites:
        meta = f"**Prerequisites:** {prerequisites} " + meta
    parts.append(meta)
    return v4.new_markdown_cell("\n".join(parts))


def md(text: str) -> NotebookNode:
    return v4.new_markdown_cell(text.strip("\n"))


def code(text: str, tags: list[str] | None = None) -> NotebookNode:
    cell = v4.new_code_cell(text.strip("\n"))
    if tags:
        cell.metadata["tags"] = list(tags)
    return cell


def _nbgrader(cell: NotebookNode, *, grade_id: str, solution: bool, grade: bool, locked: bool,
              points: float | None = None) -> NotebookNode:
    meta = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3,
            "solution": solution, "task": False}
    if points is not None:
        meta["points"] = points
    cell.metadata["nbgrader"] = meta
    return cell


def setup_cell(locked: bool = False) -> NotebookNode:
    """The standard setup cell; `locked=True` in assignments (restored when grading)."""
    cell = code(SETUP_SOURCE)
    if locked:
        _nbgrader(cell, grade_id=SETUP_GRADE_ID, solution=False, grade=False, locked=True)
    return cell


def readonly(grade_id: str, source: str) -> NotebookNode:
    """A locked code cell (e.g. grading helpers): restored from the source when grading."""
    return _nbgrader(code(source), grade_id=grade_id, solution=False, grade=False, locked=True)


def answer(grade_id: str, source: str) -> NotebookNode:
    """An answer cell; the part between ### BEGIN/END SOLUTION becomes the stub."""
    if notebooks.BEGIN_SOLUTION not in source:
        raise ValueError(f"answer cell {grade_id!r} has no {notebooks.BEGIN_SOLUTION} region")
    return _nbgrader(code(source), grade_id=grade_id, solution=True, grade=False, locked=False)


def tests(grade_id: str, points: float, source: str) -> NotebookNode:
    """An autograded test cell worth `points`; hide parts with ### BEGIN/END HIDDEN TESTS."""
    if not grade_id.startswith("test_"):
        raise ValueError(f"test cell ids start with 'test_' (got {grade_id!r})")
    return _nbgrader(code(source), grade_id=grade_id, solution=False, grade=True, locked=True,
                     points=points)


def build(cells: list[NotebookNode]) -> NotebookNode:
    nb = v4.new_notebook(metadata=NotebookNode(NOTEBOOK_METADATA))
    nb.cells = cells
    for cell in nb.cells:  # cell ids are not needed and churn diffs
        cell.pop("id", None)
    nb.nbformat, nb.nbformat_minor = 4, 4
    # JupyterLab logs "Notebook JSON is invalid" for a notebook its schema rejects.
    nbformat.validate(nb)
    return nb


def save(cells: list[NotebookNode], path: str | Path) -> Path:
    path = Path(path)
    notebooks.write(build(cells), path)
    return path
