"""Recorded GPU output in the lessons (coursetools/author/gpu_records.py, `gpu-report --record`).

On the course's own notebooks (no GPU needed): no record block may be stale (its code cell
changed since it was recorded), orphaned (not right after a code cell) or unreadable; the
coverage (GPU-dependent cells, with a record, missing) is printed and written to
test-artifacts/gpu-record-coverage.txt.

The mechanism itself, on fixtures: CI has no GPU, so `--record-any-device` records CPU
output, labelled as CPU output, into temporary copies of course/00_start_here.ipynb and of
tests/fixtures_gpu/tiny_lesson.json; a hand-edited recorded cell then fails the same check,
`--prune` removes its block, and the recorded notebook still runs alone as in Colab.
"""

from __future__ import annotations

import base64
import copy
import io
import json
import shutil
from pathlib import Path

import nbformat
import pytest
import torch
from nbformat import v4

from coursetools.author import gpu_records
from coursetools.evidence import gpu_report, standalone
from coursetools.learner import lab
from coursetools import layout, notebooks

ROOT = layout.ROOT
ARTIFACTS = ROOT / "test-artifacts"
TINY = ROOT / "tests" / "fixtures_gpu" / "tiny_lesson.json"
ALL = layout.all_notebooks()
IDS = [p.relative_to(ROOT).as_posix() for p in ALL]
H200 = gpu_records.Device("NVIDIA H200", "2.11.0+cu130", "13.0", "2026-11-29", True)


def record_problems(path: Path) -> list[str]:
    """What the check below reports for one notebook file (the fixture tests use it too)."""
    name = gpu_records.shown(path, ROOT)
    return [p.message for p in gpu_records.problems(notebooks.read(path), name)]


# --------------------------------------------------------------------------------------
# The course's notebooks
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_no_stale_or_orphaned_gpu_record(path):
    """Every GPU record block shows the output of the code cell right above it, as that
    cell is now (its SHA-256 matches); lessons only (exercises are graded, not recorded)."""
    problems = record_problems(path)
    assert not problems, "\n".join(problems)
    if path.parent != layout.COURSE_DIR:
        blocks = [i for i, c in enumerate(notebooks.read(path).cells) if gpu_records.is_block(c)]
        assert not blocks, f"{path.name}: GPU record blocks {blocks} outside a lesson: records belong in course/"


@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_expected_gpu_output_agrees_with_the_record(path):
    """A cell that needs a GPU prints, on a machine without one, the GPU's output labelled
    "expected, not recorded on a GPU" (show_expected). Once `gpu-report --record` has put the real
    output below it, the label must say what the GPU printed."""
    problems = gpu_records.expected_problems(notebooks.read(path), gpu_records.shown(path, ROOT))
    assert not problems, "\n".join(problems)


def test_expected_text_is_checked_against_a_record():
    code = nbformat.v4.new_code_cell(
        'if on_gpu:\n    print(x + y)\nelse:\n    show_expected("Expected all tensors to be on the same device, '
        'but found at least two devices, ... and cpu!", "https://example.org")')
    device = gpu_records.Device("NVIDIA T4", "2.13.0+cu126", "12.6", "2026-12-03", is_gpu=True)
    said = "RuntimeError: Expected all tensors to be on the same device, but found at\nleast two devices, cuda:0 and cpu!"
    executed = copy.deepcopy(code)
    executed.outputs = [nbformat.v4.new_output("stream", name="stdout", text=said)]
    nb = nbformat.v4.new_notebook(cells=[code, gpu_records.make_block(code, executed, device)])
    assert gpu_records.expected_problems(nb) == []          # "..." for cuda:0, line breaks ignored
    executed.outputs = [nbformat.v4.new_output("stream", name="stdout", text="RuntimeError: Placeholder storage")]
    nb = nbformat.v4.new_notebook(cells=[code, gpu_records.make_block(code, executed, device)])
    problems = gpu_records.expected_problems(nb)
    assert len(problems) == 1 and "show_expected says a GPU prints" in problems[0] and "NVIDIA T4" in problems[0]
    # A one-GPU machine in a cell that needs two: it printed the label too, so there is nothing to compare.
    executed.outputs = [nbformat.v4.new_output("stream", name="stdout", text=(
        "On 2 GPUs this cell prints (expected, not recorded on a GPU; source: https://example.org):\n  ..."))]
    nb = nbformat.v4.new_notebook(cells=[code, gpu_records.make_block(code, executed, device)])
    assert gpu_records.expected_problems(nb) == []


class CoverageSummary:
    """Prints the coverage table at the end of the run (a plugin registered by the fixture;
    under pytest-xdist a worker has no terminal: the table is in the file)."""

    table = ""

    def pytest_terminal_summary(self, terminalreporter):
        if self.table:
            terminalreporter.section("GPU records in the lessons (tests/author/test_gpu_records.py)")
            terminalreporter.write_line(self.table)


@pytest.fixture(scope="module")
def coverage_summary(request) -> CoverageSummary:
    summary = CoverageSummary()
    request.config.pluginmanager.register(summary, "course-gpu-record-coverage")
    return summary


def test_gpu_record_coverage_is_reported(coverage_summary):
    """How many GPU-dependent cells of each lesson have a record: a table printed at the end
    of the run and written to test-artifacts/gpu-record-coverage.txt; every GPU-dependent
    cell, with why it counts and whether it has a record, in test-artifacts/gpu-record-cells.txt."""
    lessons = layout.lessons()
    text = gpu_report.coverage_report(lessons)
    table = gpu_report.coverage_report(lessons, cells=False)
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "gpu-record-cells.txt").write_text(text + "\n")
    coverage_summary.table = (table + "\n(each GPU-dependent cell and why: test-artifacts/gpu-record-cells.txt; "
                              "record on a GPU: python3 make.py gpu-report --record)")
    (ARTIFACTS / "gpu-record-coverage.txt").write_text(coverage_summary.table + "\n")
    print("\n" + text)
    for path in lessons:
        nb = notebooks.read(path)
        setup = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
        # The setup cell picks the GPU: a heuristic that misses it finds nothing.
        assert setup in gpu_records.gpu_dependent_cells(nb), f"{path.name}: the setup cell is not found GPU-dependent"


# --------------------------------------------------------------------------------------
# Which cells are GPU-dependent
# --------------------------------------------------------------------------------------

def _nb(*sources: str, tags: dict[int, list[str]] | None = None):
    cells = [v4.new_code_cell(s) for s in sources]
    for i, t in (tags or {}).items():
        cells[i].metadata["tags"] = t
    return v4.new_notebook(cells=cells)


SETUP = ('if torch.cuda.is_available():\n    device = torch.device("cuda")\n'
         'else:\n    device = torch.device("cpu")')


def test_heuristic_finds_branches_probes_and_gpu_only_arguments():
    nb = _nb(
        SETUP,                                                          # 0 probe
        "x = torch.ones(3)\nprint(x.sum())",                           # 1 plain
        'if device.type == "cuda":\n    print(1)\nelse:\n    print("skipped: no GPU")',  # 2 branch
        'on_cuda = device.type == "cuda"',                             # 3 derives a fact, shows nothing
        'label = "GPU" if on_cuda else "CPU"',                         # 4 branch on a derived fact
        "y = x.to(device)\nprint(y.shape)",                            # 5 computes on the device
        "loader = DataLoader(ds, pin_memory=True)",                    # 6 GPU-only keyword
        "print(torch.cuda.memory_allocated())",                        # 7 probe
        "def safe_to(x, device):\n    if x.device == device:\n        return x\n    return x.to(device)",  # 8 param shadows
        "print(safe_to(x, 'cpu'))",                                    # 9 not machine-dependent
        'def best():\n    return "cuda" if torch.cuda.is_available() else "cpu"',  # 10 defines only
        "print(best())",                                               # 11 calls a machine-dependent function
        'on_cuda = False\nif on_cuda:\n    print("never")',             # 12 the name is plain again
        'print("measured")',                                           # 13 tagged gpu-output
        'if device.type == "cuda":\n    pass',                         # 14 tagged no-gpu-record
        tags={13: [gpu_records.FORCE_TAG], 14: [gpu_records.EXCLUDE_TAG]})
    found = gpu_records.gpu_dependent_cells(nb)
    assert sorted(found) == [0, 2, 4, 5, 6, 7, 11, 13], found
    assert found[5].startswith("uses `device`")
    assert found[2].startswith("branches on `device.type == 'cuda'`")
    assert found[4] == "branches on `on_cuda`"
    assert "pin_memory=" in found[6] and "torch.cuda.memory_allocated" in found[7]
    assert found[11] == "calls best(), which depends on the device"


def test_heuristic_scopes_names_like_python():
    """Names set inside a branch on the machine are facts; attribute targets, comprehension
    variables and later plain assignments are not."""
    nb = _nb(
        SETUP,                                                          # 0
        'if device.type == "cuda":\n    torch.backends.cuda.matmul.allow_tf32 = True\n    a = torch.randn(9, device=device)',  # 1
        "print(torch.ones(2))",                                        # 2 `torch` did not become a fact
        "print(a.shape)",                                              # 3 `a` was set in the GPU branch
        "c = device",                                                  # 4 derives a fact, shows nothing
        'tools = [c for c in ("g++", "clang++") if shutil.which(c)]',   # 5 a local `c`, not the fact
        "a = torch.zeros(3)\nprint(a.shape)",                          # 6 `a` is plain again
    )
    found = gpu_records.gpu_dependent_cells(nb)
    assert sorted(found) == [0, 1, 3], found
    assert found[3].startswith("uses `a`")


def test_heuristic_on_the_lessons_finds_the_gpu_measurements_of_07():
    """Chapter 07's key GPU measurements are in the list: synchronisation timing, pinned vs
    pageable copies, stream overlap, the allocator's memory counters (07 is a lesson in parts:
    all of them)."""
    sources = []
    for path in (p for p in layout.lessons() if p.name.startswith("07_")):
        nb = notebooks.read(path)
        sources += [nb.cells[i].source for i in gpu_records.gpu_dependent_cells(nb)]
    for needle in ("synchronize", "pin_memory", "stream", "memory_allocated"):
        assert any(needle in s for s in sources), f"no GPU-dependent cell of 07 mentions {needle}"


# --------------------------------------------------------------------------------------
# Blocks
# --------------------------------------------------------------------------------------

def _png() -> bytes:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(2, 1.5))
    ax.plot([0, 1], [1, 0])
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def test_block_label_text_figures_and_truncation():
    code = v4.new_code_cell('if device.type == "cuda":\n    print("x")')
    executed = v4.new_code_cell(code.source, execution_count=3, outputs=[
        v4.new_output("stream", name="stdout", text="pinned  54.5 GB/s\n```fence```\n"),
        v4.new_output("stream", name="stdout", text="progress 10%\rprogress 100%\r\n"),
        v4.new_output("display_data", data={"image/png": base64.b64encode(_png()).decode(), "text/plain": "<Figure>"}),
        v4.new_output("stream", name="stdout", text="".join(f"line {i}\n" for i in range(200))),
        v4.new_output("error", ename="RuntimeError", evalue="boom", traceback=["\x1b[31mRuntimeError\x1b[0m: boom"]),
    ])
    block = gpu_records.make_block(code, executed, H200)
    assert gpu_records.is_block(block) and block.metadata["tags"] == [gpu_records.RECORD_TAG]
    assert ("<details><summary>On an NVIDIA H200 (PyTorch 2.11.0+cu130, CUDA 13.0, recorded 2026-11-29) "
            "the cell above printed and drew:</summary>") in block.source
    data = gpu_records.block_data(block)
    assert data == {"cell_sha256": gpu_records.fingerprint(code.source), "device": "NVIDIA H200",
                    "torch": "2.11.0+cu130", "cuda": "13.0", "recorded": "2026-11-29"}
    assert "````text\npinned  54.5 GB/s\n```fence```\nprogress 100%\n````" in block.source  # a longer fence
    assert "progress 10%" not in block.source and "\r" not in block.source
    assert list(block.attachments) == ["gpu-record-1.png"] and "](attachment:gpu-record-1.png)" in block.source
    assert base64.b64decode(block.attachments["gpu-record-1.png"]["image/png"]).startswith(b"\x89PNG")
    assert "lines not shown here" in block.source and "line 100\n" not in block.source
    assert "line 0\n" in block.source and "line 199\n" in block.source  # the beginning and the end
    assert "RuntimeError: boom" in block.source and "\x1b" not in block.source
    assert block.source.rstrip().endswith("</details>") and "id" not in block
    # Articles: the label reads as English for other devices too.
    for name, article in [("Tesla T4", "a"), ("NVIDIA A100-SXM4-80GB", "an"), ("x86_64 CPU with no GPU", "an"),
                          ("AMD Instinct MI300X", "an"), ("GeForce RTX 4090", "a")]:
        assert gpu_records._article(name) == article, name


def test_check_names_stale_orphaned_and_unreadable_blocks():
    code = v4.new_code_cell('if device.type == "cuda":\n    print("x")')
    executed = v4.new_code_cell(code.source, execution_count=1,
                                outputs=[v4.new_output("stream", name="stdout", text="x\n")])
    block = gpu_records.make_block(code, executed, H200)
    nb = v4.new_notebook()
    nb.cells = [v4.new_markdown_cell("intro"), code, block]
    assert gpu_records.problems(nb, "demo.ipynb") == []
    nb.cells[1].source += "\nprint('changed')"
    (stale,) = gpu_records.problems(nb, "demo.ipynb")
    assert stale.kind == "stale" and stale.index == 2
    assert "demo.ipynb, cell 2 (a GPU record block) is stale" in stale.message
    assert "python3 make.py gpu-report --prune" in stale.message and "gpu-report --record" in stale.message
    nb.cells = [nb.cells[0], block, code]  # the block after a markdown cell
    (orphan,) = gpu_records.problems(nb, "demo.ipynb")
    assert orphan.kind == "orphan" and "does not follow a code cell" in orphan.message
    unreadable = v4.new_markdown_cell("<details>no data line</details>")
    unreadable.metadata["tags"] = [gpu_records.RECORD_TAG]
    nb.cells = [code, unreadable]
    assert [p.kind for p in gpu_records.problems(nb, "demo.ipynb")] == ["unreadable"]
    pruned, found = gpu_records.prune(nb, "demo.ipynb")
    assert len(found) == 1 and len(pruned.cells) == 1 and not gpu_records.problems(pruned)


# --------------------------------------------------------------------------------------
# Recording for real (on this machine's device), checking, pruning, running alone
# --------------------------------------------------------------------------------------

@pytest.fixture
def lesson_copies(tmp_path, monkeypatch):
    """Temporary copies of course/00_start_here.ipynb and the tiny fixture lesson, which
    gpu-report takes for the course's lessons."""
    folder = tmp_path / "course"
    folder.mkdir()
    paths = [folder / "00_start_here.ipynb", folder / "tiny_lesson.ipynb"]
    shutil.copy(layout.COURSE_DIR / "00_start_here.ipynb", paths[0])
    shutil.copy(TINY, paths[1])
    monkeypatch.setattr(gpu_report, "notebook_jobs", lambda: [
        (str(p), "lesson", lambda p=p: notebooks.read(p)) for p in paths])
    monkeypatch.setattr(gpu_report.layout, "lessons", lambda root=ROOT: list(paths))
    return paths


@pytest.mark.skipif(torch.cuda.is_available(), reason="there is a CUDA device: --record would record for real")
def test_record_refuses_without_cuda(tmp_path, monkeypatch, capsys):
    def never(*args, **kwargs):
        raise AssertionError("--record ran notebooks without a CUDA device")
    monkeypatch.setattr(gpu_report, "run_notebooks", never)
    assert gpu_report.main(["--record", "--no-tests", "--out", str(tmp_path)]) == 2
    assert "--record needs a CUDA device" in capsys.readouterr().err


def test_record_check_edit_prune_and_run_alone(lesson_copies, tmp_path, capsys):
    start_here, tiny = lesson_copies
    before = {p: notebooks.read(p) for p in lesson_copies}
    code = gpu_report.main(["--record", "--record-any-device", "--no-tests", "--out", str(tmp_path / "out")])
    assert code == 0, capsys.readouterr().out[-3000:]
    info = gpu_report.machine()
    device = gpu_records.device_from(info)

    # Each GPU-dependent code cell, and only those, is followed by its block, labelled
    # with the device it really ran on (here the CPU: the label says so).
    for path in lesson_copies:
        nb = notebooks.read(path)
        dependent = gpu_records.gpu_dependent_cells(before[path])
        assert dependent, path
        recorded = [i - 1 for i, c in enumerate(nb.cells) if gpu_records.is_block(c)]
        clean = gpu_records.strip_blocks(nb)
        assert [c.source for c in clean.cells] == [c.source for c in before[path].cells], "only blocks were added"
        assert len(recorded) == len(dependent)
        for i in recorded:
            block = nb.cells[i + 1]
            assert nb.cells[i].cell_type == "code" and gpu_records.block_data(block)["cell_sha256"] == \
                gpu_records.fingerprint(nb.cells[i].source)
            assert f"<summary>On {device.where()} the cell above " in block.source
            if not info["devices"]:
                assert "CPU with no GPU" in block.source and "NVIDIA" not in block.source
        assert record_problems(path) == []
        # ... and stays a course notebook: nbformat 4.4 as stored, no cell ids, cell metadata
        # only tags (tests/course/test_notebooks_static.py), no new relative link.
        raw = json.loads(path.read_text(encoding="utf-8"))
        nbformat.validate(nbformat.from_dict(raw))
        assert raw["nbformat_minor"] == 4 and not any("id" in c for c in raw["cells"])
        blocks = [c for c in raw["cells"] if gpu_records.RECORD_TAG in c["metadata"].get("tags", [])]
        assert len(blocks) == len(recorded) and all(c["metadata"] == {"tags": [gpu_records.RECORD_TAG]} for c in blocks)
        assert lab.relative_links(raw) == lab.relative_links(json.loads(nbformat.writes(before[path])))
    nb = notebooks.read(start_here)
    texts = [c.source for c in nb.cells if gpu_records.is_block(c)]
    assert any(f"PyTorch {torch.__version__} | device: " in t for t in texts)  # the setup cell's report
    if not info["devices"]:
        assert any("expected, not recorded on a GPU" in t for t in texts)   # show_expected in 00
    tiny_nb = notebooks.read(tiny)
    figure_blocks = [c for c in tiny_nb.cells if gpu_records.is_block(c) and c.get("attachments")]
    assert len(figure_blocks) == 1
    png = base64.b64decode(figure_blocks[0].attachments["gpu-record-1.png"]["image/png"])
    assert standalone.image_problem(standalone.Figure(0, "image/png", png)) is None
    excluded = next(i for i, c in enumerate(tiny_nb.cells) if gpu_records.EXCLUDE_TAG in c.metadata.get("tags", []))
    assert excluded + 1 == len(tiny_nb.cells) or not gpu_records.is_block(tiny_nb.cells[excluded + 1])
    report = (tmp_path / "out" / "gpu-report.md").read_text()
    assert "## GPU records written into the lessons" in report and "4 of 4 GPU-dependent cells recorded" in report

    # A recorded lesson still runs alone, as in Colab (the blocks are markdown).
    with_blocks = notebooks.read(tiny)
    assert sum(map(gpu_records.is_block, with_blocks.cells)) == 4
    env = standalone.make_colab_like_env(tmp_path / "colab-env")
    result = standalone.run_notebook(with_blocks, tmp_path / "alone", filename=tiny.name, timeout=180,
                                     client_kwargs=env.client_kwargs(), kernel_env=env.kernel_env())
    assert not result.problems and result.executed == result.code_cells > 0, result.problems

    # A recorded cell edited by hand: the check fails and names the block, the cell and the fix.
    edited = notebooks.read(start_here)
    target = next(i for i, c in enumerate(edited.cells)
                  if c.cell_type == "code" and "show_expected(" in c.source and "cuda + cpu ->" in c.source)
    assert gpu_records.is_block(edited.cells[target + 1])
    edited.cells[target].source = edited.cells[target].source.replace("cuda + cpu ->", "cuda plus cpu ->")
    notebooks.write(edited, start_here)
    problems = record_problems(start_here)
    with capsys.disabled():
        print("\nthe check on a hand-edited recorded cell:\n" + "\n".join(problems))
    assert len(problems) == 1 and "is stale" in problems[0] and f"cell {target + 1}" in problems[0]
    assert f"code cell {target}" in problems[0] and "python3 make.py gpu-report --prune" in problems[0]
    with pytest.raises(AssertionError, match="is stale"):
        test_no_stale_or_orphaned_gpu_record(start_here)

    # --prune (no GPU needed) removes exactly that block; --coverage counts the cell as missing.
    assert gpu_report.main(["--prune"]) == 0
    assert record_problems(start_here) == []
    pruned = notebooks.read(start_here)
    assert len(pruned.cells) == len(edited.cells) - 1 and not gpu_records.is_block(pruned.cells[target + 1])
    capsys.readouterr()
    assert gpu_report.main(["--coverage"]) == 0
    shown = capsys.readouterr().out
    assert f"{start_here} cell {target:>2}: MISSING" in shown
    cov = gpu_records.coverage(pruned, "00")
    assert cov.missing == [target] and len(cov.recorded) == len(cov.dependent) - 1
