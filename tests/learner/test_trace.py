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


IDENTITY = '''\
import torch
import torch.nn as nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
x = torch.randn(4, 3).to(device)

model = nn.Linear(3, 2)
bias = model.bias                               # a reference taken before .to()
model.to(device)
print("reference kept:", bias is model.bias, (model(x) - bias).shape)

a, b = nn.Linear(3, 3), nn.Linear(3, 3)
b.weight = a.weight                             # tied weights
net = nn.Sequential(a, b).to(device)
print("tied:", a.weight is b.weight, len(list(net.parameters())))

mlp = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))
opt = torch.optim.Adam(mlp.parameters(), lr=0.1)   # built before the move
mlp.to(device)
loss = mlp(x).pow(2).mean()
opt.zero_grad()
loss.backward()
opt.step()
print("optimizer holds the model's:", all(p is q for p, q in zip(opt.param_groups[0]["params"], mlp.parameters())),
      len(opt.state))

one = nn.Linear(3, 2)
w = one.weight
one.cuda() if torch.cuda.is_available() else one.cpu()
one.to(device)                                  # already there
one.to(device, torch.float16)
one.half()
print("kept through cuda(), to(dtype), half():", w is one.weight, w.dtype)
print("finished")
'''


def test_correct_programs_keep_their_parameters_under_pretend_cuda(tmp_path):
    """A GPU's Module.to() keeps each Parameter object (it replaces .data); pretend-CUDA must too:
    a reference taken before .to(), tied weights and an optimizer built before the move run as on a
    GPU, with the same identities and counts as the plain run prints (no invented error)."""
    (tmp_path / "plain.py").write_text(IDENTITY)
    plain = subprocess.run([sys.executable, "plain.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    out = trace(tmp_path, IDENTITY, "--pretend-cuda")
    assert plain.returncode == 0 and out.returncode == 0, out.stderr[-3000:]
    printed = [line for line in out.stdout.splitlines() if not line.startswith("+ ")]
    assert printed == plain.stdout.splitlines(), (printed, plain.stdout)
    assert "reference kept: True torch.Size([4, 2])" in printed
    assert "tied: True 3" in printed and "optimizer holds the model's: True 6" in printed
    assert "kept through cuda(), to(dtype), half(): True torch.float16" in printed
    import torch
    assert not torch.__future__.get_swap_module_params_on_conversion()     # the flag is back


def test_a_parameter_pretend_cuda_cannot_swap_stops_the_run_without_blame(tmp_path):
    """A view of a parameter holds it, so it cannot be swapped onto meta: the run stops at the
    .to() line and says so; it does not go on with a new Parameter and invent an error later."""
    script = '''\
    import torch
    import torch.nn as nn
    m = nn.Linear(3, 2)
    flat = m.weight.view(-1)
    m.to("cuda")
    print(m(torch.ones(1, 3, device="cuda")).shape)
    '''
    out = trace(tmp_path, script, "--pretend-cuda")
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"the run stopped at {tmp_path}/main.py:5" in out.stderr, out.stderr
    assert "cannot be swapped" in out.stderr and "No device error was found before this line" in out.stderr
    assert "device tracer:" not in out.stderr


def test_a_stale_reference_is_labelled_stale_not_moved():
    """On meta (not pretending) Module.to() makes new Parameters, as it does for buffers on a GPU:
    the old object is a stale reference, and the note says so instead of 'moved by to'."""
    import torch
    import torch.nn as nn
    from coursetools.learner.devtrace import trace_devices
    with trace_devices() as tracer:
        model = nn.Linear(3, 2)
        tracer.name_module(model)
        old = model.weight
        model.to("meta")
        try:
            torch.ones(2, 3, device="meta") + old
        except RuntimeError as exc:
            note = exc.__notes__[-1]
    line = next(line for line in note.splitlines() if "2. cpu" in line)
    assert "weight (parameter), a STALE reference" in line and "moved by" not in line, note


def test_the_note_says_a_gpu_raises_only_where_one_does():
    import torch
    from coursetools.learner import devtrace
    meta, cpu, scalar = torch.ones(3, device="meta"), torch.ones(3), torch.tensor(1.0)
    assert devtrace._gpu_raises_too("add", [meta, cpu])
    assert not devtrace._gpu_raises_too("add", [meta, scalar])          # a 0-dim CPU operand joins
    assert devtrace._gpu_raises_too("nextafter", [meta, scalar])        # ... except where CUDA checks all
    assert not devtrace._gpu_raises_too("__getitem__", [meta, torch.tensor([0])])   # CPU indices are taken
    assert devtrace._gpu_raises_too("__getitem__", [cpu, torch.tensor([0], device="meta")])


def _mixed_calls(gpu):
    """name -> a call mixing a CPU tensor with one on `gpu`, for the operations whose meta kernels
    might not check devices (and some that do: mv, dot, addmm, 1-D matmul)."""
    import torch
    import torch.nn.functional as F
    t = lambda *s, on="cpu": torch.ones(*s).to(on)
    i = lambda *s, on="cpu": torch.zeros(*s, dtype=torch.long).to(on)
    return {
        "gather": lambda: torch.gather(t(3, 4, on=gpu), 1, i(3, 2)),
        "scatter": lambda: torch.scatter(t(3, 4, on=gpu), 1, i(3, 2), t(3, 2, on=gpu)),
        "scatter_": lambda: t(3, 4, on=gpu).scatter_(1, i(3, 2), t(3, 2, on=gpu)),
        "scatter_add": lambda: torch.scatter_add(t(3, 4, on=gpu), 1, i(3, 2), t(3, 2, on=gpu)),
        "scatter_add_": lambda: t(3, 4, on=gpu).scatter_add_(1, i(3, 2), t(3, 2, on=gpu)),
        "scatter_reduce": lambda: torch.scatter_reduce(t(3, 4, on=gpu), 1, i(3, 2), t(3, 2, on=gpu), "sum"),
        "baddbmm": lambda: torch.baddbmm(t(2, 3, 5, on=gpu), t(2, 3, 4), t(2, 4, 5, on=gpu)),
        "addbmm": lambda: torch.addbmm(t(3, 5, on=gpu), t(2, 3, 4), t(2, 4, 5, on=gpu)),
        "einsum": lambda: torch.einsum("ij,jk->ik", t(3, 4), t(4, 5, on=gpu)),
        "tensordot": lambda: torch.tensordot(t(3, 4), t(4, 5, on=gpu), dims=1),
        "__getitem__": lambda: t(5)[i(3, on=gpu)],
        "__setitem__": lambda: t(5).__setitem__(i(3, on=gpu), 1.0),
        "index_select": lambda: torch.index_select(t(5, 3, on=gpu), 0, i(2)),
        "take": lambda: torch.take(t(5, on=gpu), i(2)),
        "put_": lambda: t(5, on=gpu).put_(i(2), t(2, on=gpu)),
        "embedding": lambda: F.embedding(i(3), t(5, 2, on=gpu)),
        "embedding_bag": lambda: F.embedding_bag(i(2, 3), t(5, 2, on=gpu)),
        "matmul": lambda: torch.matmul(t(3, 4), t(4, 5, on=gpu)),
        "__matmul__": lambda: t(2, 3, 4) @ t(4, 5, on=gpu),
        "mm": lambda: torch.mm(t(3, 4), t(4, 5, on=gpu)),
        "bmm": lambda: torch.bmm(t(2, 3, 4), t(2, 4, 5, on=gpu)),
        "linear": lambda: F.linear(t(3, 4), t(5, 4, on=gpu)),
        "bilinear": lambda: F.bilinear(t(3, 4), t(3, 4, on=gpu), t(2, 4, 4, on=gpu)),
        "conv1d": lambda: F.conv1d(t(1, 2, 8), t(3, 2, 3, on=gpu)),
        "conv2d": lambda: F.conv2d(t(1, 2, 8, 8), t(3, 2, 3, 3, on=gpu)),
        "conv3d": lambda: F.conv3d(t(1, 2, 4, 4, 4), t(3, 2, 3, 3, 3, on=gpu)),
        "conv_transpose1d": lambda: F.conv_transpose1d(t(1, 2, 8), t(2, 3, 3, on=gpu)),
        "conv_transpose2d": lambda: F.conv_transpose2d(t(1, 2, 8, 8), t(2, 3, 3, 3, on=gpu)),
        "conv_transpose3d": lambda: F.conv_transpose3d(t(1, 2, 4, 4, 4), t(2, 3, 3, 3, 3, on=gpu)),
        "masked_scatter": lambda: t(3, on=gpu).masked_scatter(torch.tensor([True, False, True]).to(gpu), t(3)),
        "cdist": lambda: torch.cdist(t(3, 4), t(5, 4, on=gpu)),
        "searchsorted": lambda: torch.searchsorted(t(5, on=gpu), t(3)),
        "bucketize": lambda: torch.bucketize(t(3, on=gpu), t(5)),
        "linalg_cross": lambda: torch.linalg.cross(t(3), t(3, on=gpu)),
        "linalg_solve_triangular": lambda: torch.linalg.solve_triangular(t(3, 3), t(3, 1, on=gpu), upper=True),
        # checked on meta: the tracer leaves them to PyTorch
        "mv": lambda: torch.mv(t(3, 4), t(4, on=gpu)),
        "dot": lambda: torch.dot(t(4), t(4, on=gpu)),
        "addmm": lambda: torch.addmm(t(3, 5), t(3, 4, on=gpu), t(4, 5, on=gpu)),
        "1-D matmul": lambda: torch.matmul(t(4), t(4, on=gpu)),
        "index_add": lambda: t(5, 3, on=gpu).index_add(0, i(2), t(2, 3, on=gpu)),
        "take_along_dim": lambda: torch.take_along_dim(t(3, 4, on=gpu), i(3, 2), 1),
        "add": lambda: t(3) + t(3, on=gpu),
        "cat": lambda: torch.cat([t(3), t(3, on=gpu)]),
        "layer_norm": lambda: F.layer_norm(t(2, 3, on=gpu), (3,), t(3), t(3)),
        "cross_entropy": lambda: F.cross_entropy(t(4, 3, on=gpu), i(4)),
    }


def _unchecked_on_meta():
    names = set()
    for name, call in _mixed_calls("meta").items():
        try:
            call()
        except (RuntimeError, NotImplementedError):
            continue
        names.add(name)
    return names


def test_the_list_of_ops_meta_does_not_check_is_measured():
    """UNCHECKED_ON_META is what this torch does: every listed op measured here lets cpu and meta
    mix, every other one measured raises (so the list cannot go stale across releases)."""
    from coursetools.learner.devtrace import UNCHECKED_ON_META
    calls = _mixed_calls("meta")
    same_kernel = {"__rmatmul__", "scatter_reduce_", "masked_scatter_", "index_put_", "index_put"}
    assert UNCHECKED_ON_META - same_kernel <= set(calls), "every listed op has a measured call"
    listed = {name for name in calls if name in UNCHECKED_ON_META}
    unchecked = _unchecked_on_meta()
    assert unchecked == listed, f"listed but checked: {sorted(listed - unchecked)}; unlisted but unchecked: " \
                                f"{sorted(unchecked - listed)}"
    assert {"mv", "dot", "addmm", "1-D matmul", "add"} <= set(calls) - listed     # these do check on meta


@pytest.mark.parametrize("name", sorted(n for n in _mixed_calls("meta") if " " not in n))
def test_each_op_meta_does_not_check_is_caught_under_pretend_cuda(name):
    """Each op of the list, written as a program does (a GPU tensor from .to('cuda') and a CPU one),
    raises under pretend-CUDA, as on a GPU; an op meta checks raises there by itself."""
    import torch
    from coursetools.learner.devtrace import trace_devices
    with trace_devices(pretend=True):
        with pytest.raises(RuntimeError) as raised:
            _mixed_calls("cuda")[name]()
    assert "device tracer:" in raised.value.__notes__[-1], raised.value
    assert "on a GPU this call raises the same error" in raised.value.__notes__[-1], raised.value.__notes__
    assert not torch.ones(1).is_meta


ZERO_DIM = {   # a 0-dim CPU tensor with a GPU tensor, and the ATen op whose CUDA kernel decides
    "embedding": ("index_select", lambda gpu, torch, F: torch.nn.Embedding(5, 2).to(gpu)(torch.tensor(3))),
    "index_select": ("index_select", lambda gpu, torch, F: torch.index_select(torch.ones(5, 3).to(gpu), 0, torch.tensor(1))),
    "gather": ("gather", lambda gpu, torch, F: torch.ones(3).to(gpu).gather(0, torch.tensor(1))),
    "nextafter": ("nextafter", lambda gpu, torch, F: torch.nextafter(torch.ones(3).to(gpu), torch.tensor(1.0))),
    "logaddexp": ("logaddexp", lambda gpu, torch, F: torch.logaddexp(torch.ones(3).to(gpu), torch.tensor(1.0))),
    "clamp": ("clamp.Tensor", lambda gpu, torch, F: torch.ones(3).to(gpu).clamp(min=torch.tensor(0.0))),
    "cross_entropy": ("nll_loss_forward", lambda gpu, torch, F: F.cross_entropy(torch.ones(3).to(gpu), torch.tensor(1))),
    "addmm": ("addmm", lambda gpu, torch, F: torch.addmm(torch.tensor(1.0), torch.ones(2, 3).to(gpu), torch.ones(3, 4).to(gpu))),
}
ZERO_DIM_JOINS = {   # element-wise: the CUDA kernel skips the device check, TensorIterator takes the CPU scalar
    "mul": ("mul.Tensor", lambda gpu, torch, F: torch.ones(3).to(gpu) * torch.tensor(2.0)),
    "where": ("where.self", lambda gpu, torch, F: torch.where(torch.ones(3).to(gpu) > 0, torch.tensor(0.0), torch.ones(3).to(gpu))),
    "lerp": ("lerp.Tensor", lambda gpu, torch, F: torch.lerp(torch.ones(3).to(gpu), torch.zeros(3).to(gpu), torch.tensor(0.5))),
    "mse_loss": ("mse_loss", lambda gpu, torch, F: F.mse_loss(torch.ones(()).to(gpu), torch.tensor(1.0))),
    "masked_fill": ("masked_fill.Tensor", lambda gpu, torch, F: torch.ones(3).to(gpu).masked_fill(torch.ones(3).to(gpu) > 0, torch.tensor(0.0))),
}


def _native_functions():
    yaml = pytest.importorskip("yaml")
    import torchgen
    path = Path(torchgen.__file__).parent / "packaged" / "ATen" / "native" / "native_functions.yaml"
    if not path.exists():
        pytest.skip("this torch ships no native_functions.yaml")
    return {f["func"].split("(")[0]: f for f in yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))}


def test_a_0_dim_cpu_tensor_is_exempt_only_where_cudas_kernel_skips_the_check():
    """CUDA's generated wrapper checks every tensor argument unless native_functions.yaml says
    `device_check: NoCheck` (c10/core adaption.h: check_and_update_common_device). Meta exempts a
    0-dim CPU tensor everywhere; the tracer refuses it where CUDA does, and only there."""
    import torch
    import torch.nn.functional as F
    from coursetools.learner.devtrace import CPU_SCALARS_REFUSED, trace_devices
    native = _native_functions()
    for name, (op, call) in ZERO_DIM.items():
        assert native[op].get("device_check", "ExactSame") == "ExactSame", op
        assert name in CPU_SCALARS_REFUSED, name
        call("meta", torch, F)                                  # meta lets it through ...
        with trace_devices(pretend=True), pytest.raises(RuntimeError) as raised:
            call("cuda", torch, F)                              # ... the tracer does not
        assert "on a GPU this call raises the same error" in raised.value.__notes__[-1], name
    for name, (op, call) in ZERO_DIM_JOINS.items():
        assert native[op].get("device_check") == "NoCheck", op
        assert name not in CPU_SCALARS_REFUSED, name
        with trace_devices(pretend=True):
            call("cuda", torch, F)                              # runs, as on a GPU


def test_what_pretend_cuda_cannot_stand_for_is_said_where_it_happens(capsys):
    """Streams, events and device properties stop the run with a message naming the line;
    torch.cuda.device(0) and set_device(0) do nothing, as on a one-GPU machine; .pin_memory()
    gives a copy; autocast('cuda') runs but says it does not act on meta (float32 stays float32)."""
    import torch
    import torch.nn as nn
    from coursetools.learner.devtrace import NeedsValues, trace_devices
    with trace_devices(pretend=True):
        for make in (torch.cuda.Stream, torch.cuda.Event, torch.cuda.current_stream):
            with pytest.raises(NeedsValues, match="pretend-CUDA cannot stand for it") as raised:
                make()
            assert "test_trace.py" in str(raised.value) and "No device error was found" in str(raised.value)
        with torch.cuda.device(0):
            torch.cuda.set_device(0)
        pinned = torch.ones(3).pin_memory()
        assert pinned.device.type == "cpu" and not pinned.is_pinned()
        layer = nn.Linear(3, 2).cuda()
        with torch.autocast("cuda"):
            out = layer(torch.ones(1, 3, device="cuda"))
    assert out.dtype == torch.float32          # a GPU gives float16: said on stderr
    err = capsys.readouterr().err
    assert "autocast('cuda') does not act on the pretend GPU's tensors" in err and "gives float16" in err, err
