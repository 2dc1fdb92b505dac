"""Run a notebook the way Colab does: alone, in an environment with only what Colab ships.

Used by tests/evidence/test_standalone.py and `python3 make.py gpu-report`.

* `make_colab_like_env(folder)` builds a virtual environment holding only torch, numpy,
  matplotlib, ipykernel and what they need (no nbgrader, no coursetools, no pytest). The
  packages are *linked* from the running environment rather than installed again: the very
  same builds the rest of the suite tests (the CPU wheel here, a CUDA one on a GPU machine),
  ready in about a second and with no download (the GPU machines have no network).
* `instrument(nb)` adds, in memory only, a first cell that checks nbgrader and coursetools
  are missing and turns deprecation warnings into errors, and lifts that rule around every
  cell tagged `deprecated-api` (a cell that shows an old spelling on purpose).
* `run_notebook(...)` copies the notebook alone into an empty folder, runs every cell in a
  kernel of that environment, and returns what a test needs: time, problems, figures.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
import venv
from datetime import datetime
from importlib import metadata
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient
from nbformat import NotebookNode, v4
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from traitlets import default

from coursetools import notebooks

# What Colab ships that the notebooks may use, and the kernel that runs them.
COLAB_PACKAGES = ("torch", "numpy", "matplotlib", "ipykernel")
# What a learner in Colab does not have: a notebook that needs it is not self-contained.
NOT_ON_COLAB = ("nbgrader", "coursetools")
KERNEL_NAME = "colab-like"

# A cell that shows a deprecated spelling on purpose (and catches its warning) carries it.
DEPRECATED_TAG = "deprecated-api"
# Deprecations become errors when they are attributed to the notebook's own code (torch,
# like every library, attributes its deprecation warnings to the caller) or to torch itself.
# Warnings from the machinery around (ipykernel, IPython, matplotlib internals) are left
# alone: they are not the course's to fix, and they do not reach the learner's screen.
STRICT_MODULES = r"(__main__|torch)(\.|$)"
STRICT_CATEGORIES = ("DeprecationWarning", "FutureWarning")
HARNESS_TAG = "course-harness"  # marks the cells instrument() adds

# A setup cell's report line, and what it tells a learner on a CPU runtime.
SETUP_REPORT = re.compile(r"PyTorch (\S+) \| device: (\S+)(?: \((.+)\))?")
GPU_HINT = "Runtime > Change runtime type"


# --------------------------------------------------------------------------------------
# The environment
# --------------------------------------------------------------------------------------

def _requirements_closure(roots: tuple[str, ...]) -> dict[str, metadata.Distribution]:
    """The installed distributions `roots` need at run time (extras and markers honoured:
    a CUDA build of torch needs e.g. `cuda-toolkit[cublas,...]`, whose extras name the
    libraries it loads)."""
    found: dict[str, metadata.Distribution] = {}
    done: set[tuple[str, str]] = set()  # (distribution, extra) already followed
    todo: list[tuple[str, frozenset[str]]] = [(r, frozenset()) for r in roots]
    while todo:
        raw, extras = todo.pop()
        name = canonicalize_name(raw)
        wanted = {""} | set(extras)
        if all((name, e) in done for e in wanted):
            continue
        dist = found.get(name)
        if dist is None:
            try:
                dist = metadata.distribution(name)
            except metadata.PackageNotFoundError:
                if name in map(canonicalize_name, roots):
                    raise RuntimeError(f"{name} is not installed in {sys.prefix}") from None
                continue  # an optional need that pip skipped for this platform
            found[name] = dist
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in wanted
                                         if (name, e) not in done):
                todo.append((req.name, frozenset(req.extras)))
        done.update((name, e) for e in wanted)
    return found


def _installed_entries(dist: metadata.Distribution) -> set[tuple[str, ...]]:
    """What `dist` put into site-packages, as paths to link: top-level entries, or the
    entries one level down in a folder several distributions share (`nvidia/`, `mpl_toolkits/`)."""
    if dist.files is None:
        raise RuntimeError(f"{dist.metadata['Name']} has no RECORD: cannot tell its files")
    site = Path(dist.locate_file(""))
    entries: set[tuple[str, ...]] = set()
    for file in dist.files:
        parts = file.parts
        if not parts or parts[0] == ".." or "__pycache__" in parts[:2]:
            continue  # scripts in bin/, data in share/, byte code (rebuilt on import)
        top = parts[0]
        shared_folder = (len(parts) > 2 and (site / top).is_dir()
                         and not (site / top / "__init__.py").exists()
                         and not top.endswith((".dist-info", ".egg-info")))
        entries.add((top, parts[1]) if shared_folder else (top,))
    return {e for e in entries if (site / Path(*e)).exists()}


def _link(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists() or dst.is_symlink():
        return
    try:
        dst.symlink_to(src, target_is_directory=src.is_dir())
    except OSError:  # e.g. Windows without the right to make links: copy instead
        if src.is_dir():
            shutil.copytree(src, dst, symlinks=True)
        else:
            shutil.copy2(src, dst)


@dataclasses.dataclass
class ColabLikeEnv:
    """A virtual environment with only what Colab ships, and a kernel that runs in it."""

    root: Path
    python: Path
    kernel_dir: Path
    mplconfig: Path
    packages: dict[str, str]  # distribution -> version

    def kernel_env(self) -> dict[str, str]:
        """The kernel's environment: this process's, minus whatever could make the repo's
        code, another environment or a user's settings reachable from the kernel."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYTHON", "JUPYTER", "CONDA", "PYTEST", "MPL", "NBVAL"))
               and k not in ("VIRTUAL_ENV", "MPLBACKEND")}
        env["PATH"] = str(self.python.parent) + os.pathsep + env.get("PATH", "")
        env["VIRTUAL_ENV"] = str(self.root)
        env["PYTHONNOUSERSITE"] = "1"
        env["MPLCONFIGDIR"] = str(self.mplconfig)
        return env

    def kernel_manager_class(self) -> type[AsyncKernelManager]:
        """A kernel manager that finds this environment's kernel and no other."""
        kernel_dirs = [str(self.kernel_dir)]

        class ColabLikeKernelManager(AsyncKernelManager):
            @default("kernel_spec_manager")
            def _colab_like_specs(self) -> KernelSpecManager:
                return KernelSpecManager(kernel_dirs=kernel_dirs)

        return ColabLikeKernelManager

    def client_kwargs(self) -> dict[str, Any]:
        return {"kernel_manager_class": self.kernel_manager_class(), "kernel_name": KERNEL_NAME}

    def run_python(self, code: str, cwd: Path) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.python), "-c", code], cwd=cwd, env=self.kernel_env(),
                              check=False, capture_output=True, text=True, timeout=300)


def _venv_python(root: Path) -> Path:
    return root / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def make_colab_like_env(root: Path, packages: tuple[str, ...] = COLAB_PACKAGES) -> ColabLikeEnv:
    """Build the environment in the empty folder `root` (about a second) and check it:
    torch, numpy and matplotlib import; nbgrader and coursetools do not."""
    root = Path(root)
    venv.EnvBuilder(with_pip=False, symlinks=os.name != "nt", clear=True).create(root)
    python = _venv_python(root)
    site = _site_packages(python)
    dists = _requirements_closure(packages)
    for dist in dists.values():
        base = Path(dist.locate_file(""))
        for entry in _installed_entries(dist):
            _link(base / Path(*entry), site / Path(*entry))
    return _finish(root, python, {d.metadata["Name"]: d.version for d in dists.values()})


def existing_colab_like_env(python: Path) -> ColabLikeEnv:
    """Use a virtual environment that was installed on its own, e.g. with another PyTorch
    release (`python3 make.py test-torch`), instead of one linked from this environment.
    It must hold what Colab ships and nothing of the course (checked as for a linked one)."""
    python = Path(python)
    root = Path(subprocess.run([str(python), "-c", "import sys; print(sys.prefix)"], capture_output=True,
                               text=True, check=True).stdout.strip())
    listing = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m, json; "
         "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"],
        capture_output=True, text=True, check=True)
    return _finish(root, python, json.loads(listing.stdout))


def _finish(root: Path, python: Path, packages: dict[str, str]) -> ColabLikeEnv:
    """Give the environment in `root` its own kernel and matplotlib folder, and check it."""
    kernel_dir = root / "share" / "jupyter" / "kernels"
    spec = {"argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3 (Colab-like: torch, numpy, matplotlib only)",
            "language": "python", "metadata": {"debugger": False}}
    (kernel_dir / KERNEL_NAME).mkdir(parents=True, exist_ok=True)
    (kernel_dir / KERNEL_NAME / "kernel.json").write_text(json.dumps(spec, indent=1))
    mplconfig = root / "mplconfig"
    mplconfig.mkdir(exist_ok=True)
    env = ColabLikeEnv(root=root, python=python, kernel_dir=kernel_dir, mplconfig=mplconfig,
                       packages=packages)
    scratch = root / "scratch"
    scratch.mkdir(exist_ok=True)
    # Importing matplotlib's font manager builds its font cache now, not in a notebook's
    # first figure (where its "building the font cache" message would land on stderr).
    probe = env.run_python(
        "import importlib.util, sys\n"
        f"missing = [m for m in {COLAB_PACKAGES[:3]!r} if importlib.util.find_spec(m) is None]\n"
        f"present = [m for m in {NOT_ON_COLAB!r} if importlib.util.find_spec(m) is not None]\n"
        "assert not missing, f'not importable: {missing}'\n"
        "assert not present, f'importable, but Colab lacks them: {present}'\n"
        "import torch, numpy, matplotlib.font_manager\n"
        "print(sys.prefix)\n", cwd=scratch)
    if probe.returncode != 0 or Path(probe.stdout.strip()).resolve() != root.resolve():
        raise RuntimeError(f"the Colab-like environment in {root} is broken:\n{probe.stdout}{probe.stderr}")
    return env


# --------------------------------------------------------------------------------------
# Instrumenting and running a notebook
# --------------------------------------------------------------------------------------

_PRELUDE = f'''\
# Added by the course's test harness (coursetools/evidence/standalone.py), never saved.
import importlib.util as __course_util, warnings as __course_warnings
for __course_name in {NOT_ON_COLAB!r}:
    assert __course_util.find_spec(__course_name) is None, (
        f"{{__course_name}} is importable: this kernel must have only what Colab ships")
for __course_category in ({", ".join(STRICT_CATEGORIES)}):
    __course_warnings.filterwarnings("error", category=__course_category, module={STRICT_MODULES!r})
del __course_util, __course_name, __course_category
'''

_RELAX = f'''\
# Added by the course's test harness: the next cell is tagged {DEPRECATED_TAG!r}.
__course_relaxed = __course_warnings.catch_warnings()
__course_relaxed.__enter__()
for __course_category in ({", ".join(STRICT_CATEGORIES)}):
    __course_warnings.filterwarnings("default", category=__course_category, module={STRICT_MODULES!r})
del __course_category
'''

_RESTORE = '''\
# Added by the course's test harness: deprecations are errors again.
__course_relaxed.__exit__(None, None, None)
del __course_relaxed
'''


def _harness_cell(source: str) -> NotebookNode:
    cell = v4.new_code_cell(source)
    cell.metadata["tags"] = [HARNESS_TAG]
    cell.pop("id", None)
    return cell


def is_harness_cell(cell: NotebookNode) -> bool:
    return HARNESS_TAG in cell.get("metadata", {}).get("tags", [])


def is_deprecated_api_cell(cell: NotebookNode) -> bool:
    return DEPRECATED_TAG in cell.get("metadata", {}).get("tags", [])


def instrument(nb: NotebookNode) -> NotebookNode:
    """A copy of `nb` that checks it runs as in Colab and that no deprecated API is used
    except in cells tagged `deprecated-api` (see the module's docstring)."""
    out = copy.deepcopy(nb)
    cells = [_harness_cell(_PRELUDE)]
    for cell in out.cells:
        if cell.cell_type == "code" and is_deprecated_api_cell(cell):
            cells += [_harness_cell(_RELAX), cell, _harness_cell(_RESTORE)]
        else:
            cells.append(cell)
    out.cells = cells
    return notebooks.clear_outputs(out)


@dataclasses.dataclass
class Figure:
    cell: int  # index of the cell in the original notebook
    mime: str
    data: bytes

    @property
    def suffix(self) -> str:
        return ".png" if self.mime == "image/png" else ".svg"


@dataclasses.dataclass
class RunResult:
    """What running one notebook showed."""

    seconds: float        # kernel start, every cell, shutdown
    cells_seconds: float  # the cells alone (kernel-side execution time)
    code_cells: int       # non-empty code cells of the notebook
    executed: int         # how many of them ran (got an execution count)
    problems: list[str]   # errors, stderr output, cells that never ran
    figures: list[Figure]
    setup_report: str     # the setup cell's one-line report ("" if missing)
    executed_nb: NotebookNode

    @property
    def device(self) -> str:
        match = SETUP_REPORT.search(self.setup_report)
        return match.group(2) if match else "?"


def _cell_seconds(cell: NotebookNode) -> float:
    timing = cell.get("metadata", {}).get("execution", {})
    start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
    if not (start and end):
        return 0.0
    # nbclient writes e.g. "2026-11-29T18:54:35.123456Z" (fromisoformat reads "Z" only from 3.11)
    elapsed = datetime.fromisoformat(end.replace("Z", "+00:00")) - datetime.fromisoformat(start.replace("Z", "+00:00"))
    return max(0.0, elapsed.total_seconds())


def _describe(cell: NotebookNode) -> str:
    first = next((line.strip() for line in cell.source.splitlines() if line.strip()), "")
    gid = notebooks.grade_id(cell)
    return f"[{gid}] {first[:70]}" if gid else first[:70]


def _problems(cell: NotebookNode, label: str) -> list[str]:
    out = []
    for o in cell.get("outputs", []):
        if o.output_type == "error":
            out.append(f"{label} raised {o.ename}: {o.evalue[:600]}")
        elif o.output_type == "stream" and o.get("name") == "stderr":
            out.append(f"{label} wrote to stderr: {o.text.strip()[:600]}")
    return out


def _figures(cell: NotebookNode, index: int) -> list[Figure]:
    figs = []
    for o in cell.get("outputs", []):
        if o.output_type not in ("display_data", "execute_result"):
            continue
        data = o.get("data", {})
        if "image/png" in data:
            figs.append(Figure(index, "image/png", base64.b64decode(data["image/png"])))
        if "image/svg+xml" in data:
            svg = data["image/svg+xml"]
            svg = "".join(svg) if isinstance(svg, list) else svg
            figs.append(Figure(index, "image/svg+xml", svg.encode("utf-8")))
    return figs


def run_notebook(nb: NotebookNode, workdir: Path, *, filename: str,
                 client_kwargs: dict[str, Any] | None = None, kernel_env: dict[str, str] | None = None,
                 timeout: int = 180, strict: bool = True) -> RunResult:
    """Write `nb` alone into the empty folder `workdir`, run it there (instrumented when
    `strict`) and report. The notebook file is left as it was given (not executed)."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if any(workdir.iterdir()):
        raise ValueError(f"{workdir} is not empty")
    path = workdir / filename
    notebooks.write(notebooks.clear_outputs(copy.deepcopy(nb)), path)
    original = notebooks.read(path)
    run = instrument(original) if strict else notebooks.clear_outputs(copy.deepcopy(original))
    client = NotebookClient(run, timeout=timeout, startup_timeout=120, allow_errors=True,
                            record_timing=True, shutdown_kernel="immediate",
                            resources={"metadata": {"path": str(workdir)}},
                            **(client_kwargs or {}))
    log_path = workdir.parent / f"{workdir.name}.kernel-stderr.log"
    problems: list[str] = []
    start = time.perf_counter()
    with open(log_path, "w") as log:
        try:
            client.execute(env=kernel_env or os.environ.copy(), stderr=log)
        except Exception as exc:  # a dead kernel, a cell over its time limit
            problems.append(f"the run stopped: {type(exc).__name__}: {str(exc)[:600]}")
    seconds = time.perf_counter() - start
    kernel_log = log_path.read_text(errors="replace").strip()
    if problems and kernel_log:
        problems.append(f"kernel stderr ({log_path}):\n{kernel_log[-2000:]}")

    # Map the executed cells back onto the notebook's own cells.
    originals = iter(range(len(original.cells)))
    code_cells = executed = 0
    cells_seconds = 0.0
    figures: list[Figure] = []
    setup_report = ""
    for cell in run.cells:
        if is_harness_cell(cell):
            problems += _problems(cell, "the test harness's own cell")
            continue
        index = next(originals)
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        code_cells += 1
        label = f"cell {index} ({_describe(cell)})"
        if cell.get("execution_count") is not None:
            executed += 1
            cells_seconds += _cell_seconds(cell)
        elif not problems:
            problems.append(f"{label} never ran")
        problems += _problems(cell, label)
        figures += _figures(cell, index)
        if code_cells == 1:
            setup_report = "".join(o.get("text", "") for o in cell.get("outputs", [])
                                   if o.output_type == "stream" and o.get("name") == "stdout")
    return RunResult(seconds=seconds, cells_seconds=cells_seconds, code_cells=code_cells,
                     executed=executed, problems=problems, figures=figures,
                     setup_report=setup_report, executed_nb=run)


# --------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------

def image_problem(fig: Figure) -> str | None:
    """None when `fig` is a valid, non-blank image; otherwise what is wrong with it."""
    if not fig.data:
        return "the image is empty (0 bytes)"
    if fig.mime == "image/png":
        if not fig.data.startswith(b"\x89PNG\r\n\x1a\n"):
            return "not a PNG (bad signature)"
        try:
            from PIL import Image
            with Image.open(io.BytesIO(fig.data)) as img:
                img.load()
                width, height = img.size
                extrema = img.convert("RGB").getextrema()
        except Exception as exc:
            return f"the PNG cannot be decoded: {exc}"
        if width < 10 or height < 10:
            return f"the image is {width}x{height} pixels"
        if all(lo == hi for lo, hi in extrema):
            return "the image is blank (a single colour)"
        return None
    try:
        root = ElementTree.fromstring(fig.data)
    except ElementTree.ParseError as exc:
        return f"the SVG is not valid XML: {exc}"
    if not root.tag.endswith("svg"):
        return f"the SVG's root element is <{root.tag}>"
    drawn = [el for el in root.iter()
             if el.tag.rsplit("}", 1)[-1] in ("path", "line", "polyline", "polygon", "rect",
                                               "circle", "ellipse", "text", "use", "image")]
    return None if drawn else "the SVG draws nothing"


def save_figures(figures: list[Figure], folder: Path, stem: str) -> list[Path]:
    """Write each figure as `<stem>.cell<N>.<k>.png|svg` into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    counts: dict[int, int] = {}
    for fig in figures:
        k = counts[fig.cell] = counts.get(fig.cell, 0) + 1
        path = folder / f"{stem}.cell{fig.cell:02d}.{k}{fig.suffix}"
        path.write_bytes(fig.data)
        paths.append(path)
    return paths
