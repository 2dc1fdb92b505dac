"""`make.py trace`: the device tracer names the tensors of a device error and the line of the
learner's code that made or moved each one, on meta and under --pretend-cuda, and changes
nothing in a correct script."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

STATS = '''\
import torch


class Standardize:
    def __init__(self, features):
        self.mean = features.mean(dim=0)           # per column: a tensor with a dimension
        self.temperature = torch.tensor(2.0)       # 0-dim: may stay on the CPU

    def __call__(self, x):
        return (x - self.mean) / self.temperature
'''

TRAIN = '''\
import sys
import torch
import torch.nn as nn
from helpers.stats import Standardize

device = torch.device(sys.argv[1] if len(sys.argv) > 1 else
                      ("cuda" if torch.cuda.is_available() else "cpu"))
torch.manual_seed(0)
features = torch.randn(64, 4)
labels = torch.randint(0, 3, (64,))
model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3)).to(device)
norm = Standardize(features)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x, y = features.to(device), labels.to(device)
    loss = nn.functional.cross_entropy(model(norm(x)), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("finished")
'''


def trace(tmp_path: Path, script: str, *args: str, files: dict[str, str] | None = None):
    """`python3 make.py trace` on a script written into tmp_path (with its other files)."""
    for name, text in (files or {}).items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    (tmp_path / "main.py").write_text(textwrap.dedent(script))
    options = [a for a in args if a.startswith("--")]
    script_args = [a for a in args if not a.startswith("--")]
    return subprocess.run([sys.executable, str(ROOT / "make.py"), "trace", *options, "main.py", *script_args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=240)


def line_of(text: str, needle: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if needle in line)


def test_a_stray_tensor_in_an_imported_module_is_named_with_its_line_on_meta(tmp_path):
    out = trace(tmp_path, TRAIN, "meta", files={"helpers/__init__.py": "", "helpers/stats.py": STATS})
    assert out.returncode == 1, out.stdout + out.stderr
    err = out.stderr
    assert "Tensor on device cpu is not on the expected device meta!" in err, err   # PyTorch's own message
    assert "Traceback (most recent call last)" in err and "main.py" in err          # and traceback, intact
    note = err[err.index("device tracer:"):]
    stats_line = line_of(STATS, "self.mean = features.mean(dim=0)")
    main_line = line_of(TRAIN, "x, y = features.to(device)")
    assert f"helpers/stats.py:{line_of(STATS, 'return (x - self.mean)')}" in note, note  # the failed call
    assert f"cpu, float32 (4,): made by mean at {tmp_path}/helpers/stats.py:{stats_line}" in note, note
    assert f"meta, float32 (64, 4): moved by to at {tmp_path}/main.py:{main_line}" in note, note


def test_pretend_cuda_finds_on_a_laptop_the_bug_only_a_gpu_raises(tmp_path):
    files = {"helpers/__init__.py": "", "helpers/stats.py": STATS}
    plain = trace(tmp_path, TRAIN, files=files)
    assert plain.returncode == 0 and "finished" in plain.stdout, plain.stderr   # the laptop run hides it
    out = trace(tmp_path, TRAIN, "--pretend-cuda", files=files)
    assert out.returncode == 1, out.stdout + out.stderr
    note = out.stderr[out.stderr.index("device tracer:"):]
    assert f"made by mean at {tmp_path}/helpers/stats.py:{line_of(STATS, 'self.mean =')}" in note, note
    assert "cuda:0 (pretend: on meta), float32 (64, 4): moved by to" in note, note
    assert "meta stands for cuda:0" in note


def test_parameters_are_named_by_module_path_and_plain_attributes_are_flagged(tmp_path):
    script = '''\
    import torch
    import torch.nn as nn

    class Scaler(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(3, 3))
            self.scale = torch.ones(3)             # a plain attribute: Module.to() skips it

        def forward(self, x):
            return self.body(x) * self.scale

    model = Scaler().to("meta")
    print(model(torch.ones(2, 3, device="meta")))
    '''
    out = trace(tmp_path, script)
    assert out.returncode == 1, out.stdout + out.stderr
    note = out.stderr[out.stderr.index("device tracer:"):]
    assert "scale (PLAIN ATTRIBUTE, Module.to() skips it): made by ones at" in note, note
    assert f"main.py:{line_of(textwrap.dedent(script), 'self.scale = torch.ones(3)')}" in note, note

    script2 = script.replace("* self.scale", "").replace('torch.ones(2, 3, device="meta")', "torch.ones(2, 3)")
    out = trace(tmp_path, script2)
    note = out.stderr[out.stderr.index("device tracer:"):]
    assert "body.0.weight (parameter): moved by to at" in note and "body.0.bias (parameter)" in note, note
    assert f"main.py:{line_of(textwrap.dedent(script2), 'model = Scaler()')}" in note, note


@pytest.mark.parametrize("bug, needle, expected", [
    # chapter 08 §3.1: token ids left on the CPU, the embedding on the GPU
    ("ids = torch.tensor([1, 2])\nemb = nn.Embedding(5, 2).to(device)\nemb(ids)", "ids = torch.tensor", "cpu, int64 (2,): made by tensor"),
    # §3.2: a loss weight left behind
    ("w = torch.tensor([1.0, 2.0, 3.0])\nlogits = torch.randn(4, 3, device=device)\n"
     "nn.functional.cross_entropy(logits, torch.zeros(4, dtype=torch.long, device=device), weight=w)",
     "w = torch.tensor", "cpu, float32 (3,): made by tensor"),
    # §3.5: .numpy() on a device tensor
    ("t = torch.ones(3).to(device)\nt.numpy()", "t = torch.ones(3).to(device)", "moved by to"),
])
def test_errors_of_the_index_name_the_tensor_and_its_line(tmp_path, bug, needle, expected):
    script = "import torch\nimport torch.nn as nn\ndevice = torch.device('meta')\n" + bug + "\n"
    out = trace(tmp_path, script)
    assert out.returncode == 1, out.stdout + out.stderr
    note = out.stderr[out.stderr.index("device tracer:"):]
    assert f"{expected} at {tmp_path}/main.py:{line_of(script, needle)}" in note, note


def test_a_value_from_the_pretend_gpu_stops_the_run_at_that_line(tmp_path):
    script = '''\
    import torch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.ones(3, device=device)
    total = x.sum()
    print("total:", total.item())
    '''
    out = trace(tmp_path, script, "--pretend-cuda")
    assert out.returncode == 1 and "total:" not in out.stdout, out.stdout
    assert f"the run stopped at {tmp_path}/main.py:5" in out.stderr, out.stderr
    assert "No device error was found before this line" in out.stderr


def test_printing_a_tensor_of_the_pretend_gpu_stops_the_run_at_that_line(tmp_path):
    """print(x) of a pretend-GPU tensor would show meta's `tensor(..., device='meta')`, not values:
    the run stops at the print, as for .item()."""
    script = '''\
    import torch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.ones(3, device=device)
    print("x:", x * 2)
    '''
    out = trace(tmp_path, script, "--pretend-cuda")
    assert out.returncode == 1 and "tensor(" not in out.stdout and "meta" not in out.stdout, out.stdout
    assert f"the run stopped at {tmp_path}/main.py:4" in out.stderr, out.stderr
    assert "printing a tensor needs the values" in out.stderr, out.stderr


def test_a_correct_script_runs_unchanged_inside_the_tracer(tmp_path):
    """No false blame: the same printed losses with and without the tracer (a real CPU run)."""
    script = '''\
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    x, y = torch.randn(64, 4), torch.randint(0, 3, (64,))
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    scale = torch.tensor(0.5)                       # a 0-dim CPU tensor joins any device
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    for xb, yb in loader:
        loss = nn.functional.cross_entropy(model(xb) * scale, yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"{loss.item():.6f}")
    '''
    (tmp_path / "plain.py").write_text(textwrap.dedent(script))
    plain = subprocess.run([sys.executable, "plain.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    traced = trace(tmp_path, script)
    assert plain.returncode == 0 and traced.returncode == 0, traced.stderr
    printed = "".join(line for line in traced.stdout.splitlines(True) if not line.startswith("+ "))  # make.py's echo
    assert printed == plain.stdout and len(plain.stdout.split()) == 4, (plain.stdout, traced.stdout)
    assert traced.stderr == ""


def test_a_missing_script_is_a_clear_error(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "make.py"), "trace", "nowhere.py"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "no such script: nowhere.py" in out.stderr, out.stderr


def test_a_tensor_from_a_dataloader_worker_is_reported_as_received(tmp_path):
    """A worker process runs without the tracer: the note says that the batch came from another
    process, at the loop's line, and does not blame a line inside multiprocessing."""
    script = '''\
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Pairs(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.full((3,), float(i))

    if __name__ == "__main__":
        weight = torch.ones(3, 3, device="meta")
        for batch in DataLoader(Pairs(), batch_size=2, num_workers=1):
            print(batch @ weight)
    '''
    out = trace(tmp_path, script)
    assert out.returncode == 1, out.stdout + out.stderr
    note = out.stderr[out.stderr.index("device tracer:"):]
    assert "the device tracer checked this matmul()" in out.stderr, out.stderr   # meta alone would not raise
    assert (f"cpu, float32 (2, 3): received from another process (a DataLoader worker?), unpickled at "
            f"{tmp_path}/main.py:13") in note, note
    assert f"meta, float32 (3, 3): made by ones at {tmp_path}/main.py:12" in note, note


def test_the_lessons_tracer_is_the_commands():
    """One source: lesson 08's tracer cell is coursetools/learner/devtrace.py, byte for byte."""
    from coursetools import notebooks
    lesson = notebooks.read(ROOT / "course" / "08_troubleshooting.ipynb")
    cells = [c for c in lesson.cells if "device-tracer" in c.metadata.get("tags", [])]
    assert len(cells) == 1, "lesson 08 needs one cell tagged device-tracer"
    source = (ROOT / "coursetools" / "learner" / "devtrace.py").read_text().rstrip("\n")
    assert cells[0].source == source, (
        "lesson 08's tracer cell differs from coursetools/learner/devtrace.py: copy the file into the cell")


def test_inside_torch_compile_the_error_is_dynamos_own_without_a_note(tmp_path):
    """What it cannot see: code compiled by torch.compile runs outside the tracer's mode (dynamo
    traces it with its own fake tensors), so its device error comes without the tracer's lines."""
    script = '''\
    import torch

    @torch.compile(backend="eager")
    def scale(x):
        factor = torch.ones(x.shape[-1])       # made inside compiled code, on the CPU
        return x * factor

    print(scale(torch.ones(2, 3, device="meta")))
    '''
    out = trace(tmp_path, script)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Tensor device mismatch" in out.stderr and "device tracer:" not in out.stderr, out.stderr[-2000:]


def test_an_operations_result_keeps_where_its_data_came_from(tmp_path):
    """A mask made in a collate function, then inverted at the failing line: the note names both
    lines, the operation's and the creation's (a script the tracer was not written for)."""
    script = '''\
    import torch
    import torch.nn as nn

    def collate(lengths):
        mask = torch.zeros(len(lengths), max(lengths), dtype=torch.bool)
        for i, n in enumerate(lengths):
            mask[i, :n] = True
        return mask

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    h = nn.Embedding(10, 4).to(device)(torch.zeros(2, 3, dtype=torch.long, device=device))
    mask = collate([3, 2])
    print(h.masked_fill(~mask.unsqueeze(-1), 0.0).shape)
    '''
    out = trace(tmp_path, script, "--pretend-cuda")
    assert out.returncode == 1, out.stdout + out.stderr
    note = out.stderr[out.stderr.index("device tracer:"):]
    text = textwrap.dedent(script)
    assert f"cpu, bool (2, 3, 1): made by __invert__ at {tmp_path}/main.py:{line_of(text, '~mask')}" in note, note
    assert f"from a tensor made by zeros at {tmp_path}/main.py:{line_of(text, 'mask = torch.zeros')}" in note, note


def test_a_stray_tensor_in_a_spawned_rank_comes_back_with_the_note(tmp_path):
    """A process started with torch.multiprocessing.spawn (as a DDP script does) runs under the
    tracer too (rank_hook/sitecustomize.py): the rank's error comes back to the launcher with the
    note naming the rank's line."""
    script = '''\
    import torch
    import torch.multiprocessing as mp


    def worker(rank):
        weights = torch.ones(3, device="meta")
        bias = torch.zeros(3)                  # the stray tensor, made in the rank
        print(weights + bias)


    if __name__ == "__main__":
        mp.spawn(worker, nprocs=1)
    '''
    out = trace(tmp_path, script)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "ProcessRaisedException" in out.stderr and "Process 0 terminated with the following error" in out.stderr
    assert "line 8, in worker" in out.stderr, out.stderr        # the rank's own traceback
    note = out.stderr[out.stderr.index("device tracer:"):]
    assert f"cpu, float32 (3,): made by zeros at {tmp_path}/main.py:7" in note, note
    assert f"meta, float32 (3,): made by ones at {tmp_path}/main.py:6" in note, note


DDP = '''\
import os
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
target_device = torch.device("meta" if rank == 1 else "cpu")   # rank 1 stands for a GPU rank
model = DDP(nn.Linear(4, 2))
features = torch.randn(8, 4)
out = model(features)
labels = torch.zeros(8, 2, device=target_device)     # the stray tensor, on rank 1 only
loss = nn.functional.mse_loss(out, labels)
loss.backward()
dist.destroy_process_group()
'''


def test_torchrun_ranks_run_under_the_tracer(tmp_path):
    """`make.py trace torchrun ...` starts the launcher; each rank runs under the tracer, and the
    failing rank's traceback (torch's frames folded) ends with the note naming its lines."""
    (tmp_path / "ddp.py").write_text(DDP)
    out = subprocess.run([sys.executable, str(ROOT / "make.py"), "trace", "torchrun", "--standalone",
                          "--nproc-per-node", "2", "ddp.py"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 1, out.stdout + out.stderr
    assert "ChildFailedError" in out.stderr, out.stderr[-3000:]
    note = out.stderr[out.stderr.index("device tracer:"):]
    assert f"meta, float32 (8, 2): made by zeros at {tmp_path}/ddp.py:{line_of(DDP, 'labels = ')}" in note, note
    assert f"made by linear at {tmp_path}/ddp.py:{line_of(DDP, 'out = model')}" in note, note
    assert "frame(s) inside torch" in out.stderr, out.stderr[-3000:]


def test_a_module_runs_as_python_dash_m_and_a_missing_one_is_a_clear_error(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "job.py").write_text(textwrap.dedent('''\
        import sys
        import torch
        w = torch.ones(2, device="meta")
        print(w + torch.ones(2), sys.argv[1:])
        '''))
    run = lambda *a: subprocess.run([sys.executable, str(ROOT / "make.py"), "trace", *a], cwd=tmp_path,
                                    capture_output=True, text=True, timeout=120)
    out = run("-m", "pkg.job", "--flag")
    assert out.returncode == 1, out.stdout + out.stderr
    note = out.stderr[out.stderr.index("device tracer:"):]
    assert f"cpu, float32 (2,): made by ones at {tmp_path}/pkg/job.py:4" in note, note
    assert "runpy" not in out.stderr, out.stderr     # the traceback starts at the module
    missing = run("-m", "pkg.nowhere")
    assert missing.returncode == 2 and "no such module: pkg.nowhere" in missing.stderr, missing.stderr


def test_a_library_in_site_packages_is_user_code_not_the_standard_library():
    """site-packages may lie inside the standard library's folder (a venv's lib/python3.X): code
    there is a library the learner called, and its line is reported; the stdlib's own is skipped."""
    import os as os_module

    import torch
    from coursetools.learner import devtrace
    lib = os_module.path.dirname(os_module.__file__)
    fake = lambda name: compile("pass", name, "exec")
    assert devtrace._skipped(fake(os_module.path.join(lib, "json", "decoder.py")))
    assert not devtrace._skipped(fake(os_module.path.join(lib, "site-packages", "timm", "layers.py")))
    assert devtrace._skipped(fake(os_module.path.join(os_module.path.dirname(torch.__file__), "nn", "x.py")))
