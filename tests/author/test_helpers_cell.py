"""An exercise's grading helpers, as a learner meets them (coursetools/author/helpers_cell.py):
a short, generated list of the helpers they may use, and the locked machinery collapsed, in
JupyterLab and in Colab. Grading itself is unchanged: the release in sync, nbgrader's
checksums and the tamper checks are tested where they always were (tests/course/)."""

from __future__ import annotations

import copy

import pytest
from nbformat import v4

from coursetools import layout, notebooks
from coursetools.author import helpers_cell as H

ASSIGNMENTS = layout.assignments()
# Lines a learner scrolls past before question 1 (header, setup cell, what the helpers are);
# before this change: 67 (03) to 845 (06).
SCROLL_BUDGET = 100


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_helpers_listing_is_in_step_with_the_code(name):
    """`make.py links` wrote the listing from the code as it is now (a renamed helper or a
    changed docstring shows up here until it is run again)."""
    nb = notebooks.read(layout.source_notebook(name))
    assert not H.apply(copy.deepcopy(nb)), f"run `python3 make.py links`: {name}'s helpers listing is stale"
    i = H.helpers_index(nb)
    above = nb.cells[i - 1].source
    names = H.named(above, H.definitions(nb.cells[i].source))
    assert names, f"{name}: the text above the helpers cell names no helper a learner may use"
    for helper in names:
        assert f"| `{H.definitions(nb.cells[i].source)[helper][0].replace('|', chr(92) + '|')}` |" in above


@pytest.mark.parametrize("where", ["source", "release"])
@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_the_helpers_cell_is_collapsed_and_still_locked(name, where):
    path = layout.source_notebook(name) if where == "source" else layout.release_notebook(name)
    nb = notebooks.read(path)
    cell = nb.cells[H.helpers_index(nb)]
    assert cell.metadata["jupyter"] == {"source_hidden": True}, "JupyterLab shows it collapsed"
    assert cell.metadata["cellView"] == "form" and cell.source.startswith("#@title "), "Colab's form view"
    assert notebooks.is_locked(cell), "still locked: nbgrader restores it from the gradebook if edited"


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_a_learner_reaches_question_1_after_a_short_scroll(name):
    lines = H.scroll_lines(notebooks.read(layout.release_notebook(name)))
    assert lines <= SCROLL_BUDGET, f"{name}: {lines} lines before question 1 (budget {SCROLL_BUDGET})"


def _tiny() -> object:
    helpers = v4.new_code_cell(
        "# Grading helpers (locked). The tests below use them, and you may use them too.\n"
        "def expect_error(kind, fn, hint=''):\n"
        "    \"\"\"Call fn(); it must raise `kind`, e.g. `ValueError`. Returns the message.\n\n    More.\"\"\"\n"
        "def _private():\n    pass\n"
        "class Probe:\n    \"\"\"A probe | with a bar.\"\"\"\n    def __init__(self, a, b: int | None = None):\n        pass\n"
        "def unnamed():\n    \"\"\"Not named above.\"\"\"\n")
    helpers.metadata["nbgrader"] = {"grade_id": "helpers", "locked": True, "grade": False, "solution": False,
                                    "schema_version": 3, "task": False}
    return v4.new_notebook(cells=[v4.new_markdown_cell("Use `expect_error(kind, fn)` and `Probe`."), helpers,
                                  v4.new_markdown_cell("## Question 1 · x (1 point)")])


def test_apply_lists_the_named_helpers_and_collapses_the_cell_once():
    nb = _tiny()
    assert H.apply(nb) and not H.apply(nb), "a second run changes nothing"
    text = nb.cells[0].source
    assert text.startswith("Use `expect_error(kind, fn)` and `Probe`.")
    assert "| `expect_error(kind, fn, hint='')` | Call fn(); it must raise `kind`, e.g. `ValueError`. |" in text
    assert "| `Probe(a, b: int \\| None=None)` | A probe \\| with a bar. |" in text
    assert "unnamed" not in text and "_private" not in text
    code = nb.cells[1]
    assert code.source.startswith(H.TITLE + "\ndef expect_error")
    assert "# Grading helpers (locked)" not in code.source
    assert H.scroll_lines(nb) == len(text.splitlines()) + 1
    nb.cells[0].source = nb.cells[0].source.replace("and `Probe`", "and `unnamed()`")
    assert H.apply(nb) and "| `unnamed()` | Not named above. |" in nb.cells[0].source
    assert "Probe" not in nb.cells[0].source.split(H.LISTING_START)[1]
