"""The committed release (exercises/) is exactly what nbgrader generates from solutions/."""

from __future__ import annotations

import filecmp
import subprocess
import sys

import pytest

from coursetools import layout, notebooks
from coursetools.author import release


@pytest.fixture(scope="module")
def fresh_release(tmp_path_factory):
    dest = tmp_path_factory.mktemp("release")
    release.release(dest=dest)
    return dest


def test_nbgrader_config_loads_and_points_at_solutions_and_exercises():
    # nbgrader only logs an exception in nbgrader_config.py and carries on with its defaults,
    # so ask nbgrader itself which directories it uses.
    code = (
        "from nbgrader.apps import NbGraderAPI\n"
        "from nbgrader.coursedir import CourseDirectory\n"
        "from traitlets.config.loader import PyFileConfigLoader\n"
        "cfg = PyFileConfigLoader('nbgrader_config.py', path='.').load_config()\n"
        "cd = CourseDirectory(config=cfg)\n"
        "print(cd.root, cd.source_directory, cd.release_directory, sep='|')\n"
        "names = [getattr(p, '__name__', str(p)) for p in cfg.GenerateAssignment.preprocessors]\n"
        "print(','.join(names))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=layout.ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.strip().splitlines()[-2:]
    assert first == f"{layout.ROOT}|solutions|exercises"
    assert second.endswith("TagStubCells") and "ClearSolutions" in second and "ClearHiddenTests" in second


@pytest.mark.parametrize("name", layout.assignments())
def test_release_in_sync_with_solutions(fresh_release, name):
    """exercises/NAME is byte-for-byte a fresh `nbgrader generate_assignment NAME`."""
    committed = layout.EXERCISES_DIR / name
    fresh = fresh_release / name
    assert committed.is_dir(), f"exercises/{name} is missing: run `python3 make.py release {name}`"
    cmp = filecmp.dircmp(fresh, committed)
    assert not cmp.left_only and not cmp.right_only, (
        f"files differ: only in a fresh release {cmp.left_only}, only committed {cmp.right_only}; "
        f"run `python3 make.py release {name}`")
    for fname in cmp.common_files:
        assert (fresh / fname).read_bytes() == (committed / fname).read_bytes(), (
            f"exercises/{name}/{fname} differs from a fresh release of solutions/{name}: never edit "
            f"exercises/ by hand; run `python3 make.py release {name}` and commit the result")


def test_no_release_without_source():
    extra = sorted(p.name for p in layout.EXERCISES_DIR.iterdir() if p.is_dir()) if layout.EXERCISES_DIR.exists() else []
    assert extra == layout.assignments(), "exercises/ must hold exactly one release per solutions/ assignment"


@pytest.mark.parametrize("name", layout.assignments())
def test_release_tags_only_stub_cells_for_nbval(name):
    """In the release, exactly the answer and test cells may raise (nbval's raises-exception tag);
    in the source, no cell may."""
    source = notebooks.read(layout.source_notebook(name))
    assert not any(notebooks.RAISES_TAG in c.metadata.get("tags", []) for c in source.cells), (
        f"solutions/{name} must run cleanly under nbval: remove the {notebooks.RAISES_TAG} tags")
    rel = notebooks.read(layout.release_notebook(name))
    for cell in rel.cells:
        tagged = notebooks.RAISES_TAG in cell.metadata.get("tags", [])
        stub = cell.cell_type == "code" and (notebooks.is_solution(cell) or notebooks.is_grade(cell))
        assert tagged == stub, f"cell {notebooks.grade_id(cell) or cell.source[:40]!r}: tagged={tagged}, stub={stub}"
