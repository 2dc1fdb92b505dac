"""The drawing helpers (coursetools/learner/figures.py) draw what the objects hold, and every
lesson's collapsed `figures` cell is the part of that file the lesson calls (`make.py figures`)."""

from __future__ import annotations

import io

import matplotlib
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from coursetools import layout, notebooks  # noqa: E402
from coursetools.author import figures_sync  # noqa: E402
from coursetools.learner import figures  # noqa: E402

LESSONS = sorted(layout.COURSE_DIR.glob("*.ipynb"))


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def chips(fig) -> dict[str, tuple]:
    """Each boxed label of the figure: its text -> (fill colour, edge colour, line style)."""
    found = {}
    for text in fig.axes[0].texts:
        box = text.get_bbox_patch()
        if box is not None:
            found[text.get_text()] = (matplotlib.colors.to_hex(box.get_facecolor()),
                                      matplotlib.colors.to_hex(box.get_edgecolor()), box.get_linestyle())
    return found


def rendered(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


@pytest.mark.parametrize("path", LESSONS, ids=[p.name for p in LESSONS])
def test_each_lessons_figures_cell_is_the_helpers_it_calls(path):
    nb = notebooks.read(path)
    cells = [c for c in nb.cells if figures_sync.TAG in c.metadata.get("tags", [])]
    want = figures_sync.expected(nb)
    assert len(cells) == (1 if want else 0), (
        f"{path.name}: {len(cells)} cells tagged figures; run `python3 make.py figures`")
    if want:
        assert cells[0].source == want, (
            f"{path.name}'s figures cell differs from coursetools/learner/figures.py: run `python3 make.py figures`")
        assert cells[0].metadata.get("jupyter") == {"source_hidden": True}


def test_the_cell_holds_only_the_helpers_called():
    source = figures_sync.cell_source({"show_storage"})
    assert "def show_storage(" in source and "def show_module(" not in source
    assert "def _card(" in source and source.startswith(figures_sync.HEADER)
    namespace: dict = {}
    exec(compile(source, "<figures cell>", "exec"), namespace)     # it runs on its own
    assert callable(namespace["show_storage"])


class Norm(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3))
        self.register_buffer("mean", torch.zeros(3))
        self.register_buffer("cache", torch.zeros(3), persistent=False)
        self.temperature = torch.tensor(2.0)        # plain attribute


def test_show_module_colours_each_tensor_by_its_device_and_flags_the_plain_attribute():
    model = nn.Sequential(nn.Linear(3, 3), Norm()).to("meta")
    optimizer = torch.optim.SGD([model[0].weight], lr=0.1)
    found = chips(figures.show_module(model, optimizer))
    meta, cpu = (figures.DEVICE_COLOURS[d].lower() for d in ("meta", "cpu"))
    assert found["weight (3, 3) float32 meta"][0] == meta
    assert found["mean (3,) float32 meta (buffer)"][2] == "--"
    assert "cache (3,) float32 meta (buffer, not in state_dict)" in found
    plain = found["temperature () float32 cpu (plain attribute: Module.to() skips it)"]
    assert plain[0] == cpu and plain[1] == matplotlib.colors.to_hex(figures.WARNING)
    assert found["in the optimizer, no state yet"][0] == "#ffffff"
    assert found["NOT in the optimizer"][1] == matplotlib.colors.to_hex(figures.WARNING)  # bias, scale
    assert rendered(plt.gcf())


def test_show_module_names_the_optimizer_states_dtype_and_device():
    model = nn.Linear(2, 1)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    model.double()
    found = chips(figures.show_module(model, optimizer))
    assert "weight (1, 2) float64 cpu" in found
    assert "optimizer state: exp_avg, exp_avg_sq float32 cpu" in found


def test_show_storage_puts_objects_that_share_memory_in_one_block():
    x = torch.arange(6.0)
    arr = np.ones(3)
    fig = figures.show_storage(x=x, noop=x.to("cpu"), view=x[1:3], copy=x.clone(),
                               arr=arr, shared=torch.from_numpy(arr), copied=torch.tensor(arr),
                               moved=x.to("meta"))
    headings = [t.get_text() for t in fig.axes[0].texts if t.get_fontweight() == "bold"]
    assert headings == ["a block of 24 bytes on cpu", "a block of 24 bytes on cpu", "a block of 24 bytes on cpu",
                        "a block of 24 bytes on cpu", "meta: no memory at all (shapes only)"], headings
    labels = [t.get_text() for t in fig.axes[0].texts if t.get_fontweight() != "bold"]
    assert labels == ["x (Tensor)", "noop (Tensor)", "view (Tensor)", "copy (Tensor)", "arr (ndarray)",
                      "shared (Tensor)", "copied (Tensor)", "moved (Tensor)"], labels
    assert "8 objects, 5 blocks" in fig.axes[0].get_title(loc="left")
    view_bar = fig.axes[0].patches[2]          # over bytes 4 to 12 of x's 24
    assert view_bar.get_width() == pytest.approx(0.54 * 8 / 24)


def test_show_checkpoint_reads_the_files_location_tags(tmp_path):
    path = tmp_path / "c.pt"
    torch.save({"model": nn.Linear(2, 2).state_dict(), "step": 3}, path)
    fig = figures.show_checkpoint(path, map_location="meta")
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts.count("cpu") == 2 and texts.count("meta") == 2 and texts.count("int") == 2
    assert "['model']['weight']" in texts
    assert "map_location='meta'" in fig.axes[0].get_title(loc="left")


def test_show_scale_marks_each_skipped_step_of_each_run():
    fig = figures.show_scale({"a": ([2.0 ** 15, 2.0 ** 14, 2.0 ** 14, 2.0 ** 15], [True, False, False, False]),
                              "b": ([4.0, 2.0], [True, True])})
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["a: 1 skipped", "b: 2 skipped"]
    assert ax.collections[0].get_offsets().tolist() == [[1.0, 2.0 ** 15]]
    assert ax.collections[1].get_offsets().tolist() == [[1.0, 4.0], [2.0, 2.0]]


def test_show_timeline_draws_one_lane_per_process():
    fig = figures.show_timeline([("rank 0", 0, 2, "backward", "#56B4E9"), ("rank 1", 1, 3, "", "#009E73"),
                                 ("rank 0", 2, 3, "all-reduce", "#009E73")], "two ranks")
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["rank 0", "rank 1"]
    assert len(fig.axes[0].patches) == 3 and rendered(fig)


def test_show_moves_marks_copies_no_ops_and_pinned_memory():
    from unittest import mock
    x, pinned = torch.ones(2), torch.zeros(2)
    steps = [("made there", None, torch.zeros(2, device="meta")), ("x.to('meta')", x, x.to("meta")),
             ("x.to('cpu')", x, x.to("cpu")), ("x.pin_memory()", x, pinned)]
    with mock.patch.object(torch.Tensor, "is_pinned", lambda self: self is pinned):  # no CUDA here
        fig = figures.show_moves(steps)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts[:3] == ["host memory", "pinned host memory", "meta (the GPU's stand-in)"], texts
    found = chips(fig)
    assert found["same tensor: no copy"][0] == figures.DEVICE_COLOURS["cpu"].lower()
    arrows = [a for a in fig.axes[0].texts if type(a).__name__ == "Annotation"]
    assert len(arrows) == 2                    # x.to('meta') and the pinning copy: a no-op draws none
    assert arrows[1].xy[0] == pytest.approx(0.63 - 0.06)   # into the pinned column


def test_show_flowchart_outlines_the_branches_this_run_took():
    fig = figures.show_flowchart("an error", [("clue one", "fix one", ["bug a"]), ("clue two", "fix two", [])], "t")
    found = chips(fig)
    warn = matplotlib.colors.to_hex(figures.WARNING)
    assert found["clue one"][1] == warn and found["clue two"][1] != warn
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "fix one\nhere: bug a" in texts and "fix two" in texts
