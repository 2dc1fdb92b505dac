"""Every notebook runs alone, as in Colab, with no deprecated API, for real, and its figures render.

One run per notebook proves four things at once (each run costs 5-30 s, so it is done once):

* **Colab stand-alone.** Each lesson, and each released exercise with the reference answers
  typed in and each Predict question's proof put back (`fixtures.solved_release_with_proofs`:
  the reference answers checked against this PyTorch, on every release test-torch runs; the
  release itself holds no key), is copied alone into an empty folder and run in a
  kernel whose environment holds only what Colab ships: torch, numpy, matplotlib (and
  ipykernel). A first cell, added in memory, asserts that nbgrader and coursetools cannot be
  imported. Every cell must run without an error and without writing to stderr, exercises'
  test cells included.
* **No deprecations.** The same first cell turns DeprecationWarning and FutureWarning into
  errors when they are attributed to the notebook's code or to torch; around a cell tagged
  `deprecated-api` (an old spelling shown on purpose) the rule is lifted, then restored.
* **Run-time budget.** Each notebook's time is written to test-artifacts/notebook-times.json
  and printed at the end of the run. A notebook that "ran" faster than MIN_SECONDS (kernel
  start and `import torch` alone take longer), or executed no cell, did not really run: it
  fails, unless FAST_OK says why that is expected.
* **Figures.** Every image a notebook displays (image/png, image/svg+xml) is saved to the
  run's temporary folder and to test-artifacts/figures/, and must be a valid, non-blank image.

Also here, without running anything: every notebook's "Open in Colab" link points at an
existing notebook of the configured GitHub repository, and opens on a GPU runtime.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

from coursetools.author import authoring, fixtures
from coursetools import layout, notebooks
from coursetools.evidence import standalone

ROOT = layout.ROOT
ARTIFACTS = ROOT / "test-artifacts"
# `python3 make.py test-torch` runs these tests against another PyTorch release: it names the
# environment's Python (COLAB_PYTHON_ENV) and a times file of its own (TIMES_FILE_ENV).
COLAB_PYTHON_ENV = "COURSE_COLAB_PYTHON"
TIMES_FILE_ENV = "COURSE_TIMES_FILE"
TIMES_FILE = Path(os.environ.get(TIMES_FILE_ENV) or ARTIFACTS / "notebook-times.json")
FIGURES_DIR = ARTIFACTS / "figures"
EXECUTED_DIR = ARTIFACTS / "standalone"

# Every notebook starts a kernel (0.5-1 s) and imports torch in its setup cell (3 s of CPU
# time on the 2-core CI machines, over a second on the fastest): a notebook that "ran" in
# less than this executed nothing real (a no-op harness, cells skipped, no kernel).
MIN_SECONDS = 1.5
# Notebooks allowed to run faster than MIN_SECONDS, each with the reason. None: every
# notebook starts with the setup cell, which imports torch.
FAST_OK: dict[str, str] = {}
# docs/AUTHORING.md: a notebook runs "in well under 30 s" on a 2-core CPU. Over it, the table
# says so; it does not fail (CI machines' speed varies too much for a time limit to be fair).
BUDGET_S = 30.0
CELL_TIMEOUT_S = 180  # as nbval's, in pytest.ini


@dataclass(frozen=True)
class Target:
    id: str          # what the learner opens, e.g. exercises/01_x/01_x.ipynb
    kind: str        # "lesson" or "exercise"
    name: str        # NN_topic

    def load(self):
        if self.kind == "lesson":
            return notebooks.read(ROOT / self.id)
        # The release, answers typed in, and each Predict question's proof that its reference
        # answers are what this PyTorch does (solutions only: the release holds no key).
        return fixtures.solved_release_with_proofs(self.name)

    @property
    def stem(self) -> str:
        return f"{self.kind}-{self.name}"


def targets() -> list[Target]:
    found = [Target(p.relative_to(ROOT).as_posix(), "lesson", p.stem) for p in layout.lessons()]
    for name in layout.assignments():
        release = layout.release_notebook(name)
        if release.exists():
            found.append(Target(release.relative_to(ROOT).as_posix(), "exercise", name))
    return found


TARGETS = targets()


# --------------------------------------------------------------------------------------
# Timing record: a JSON file, and a table at the end of the run
# --------------------------------------------------------------------------------------

@dataclass
class Timing:
    notebook: str
    seconds: float
    cells_seconds: float
    code_cells: int
    executed: int
    figures: int
    device: str
    passed: bool
    problem: str = ""  # the first line of what failed


class TimingRecord:
    """Collects each notebook's time; rewrites TIMES_FILE after every notebook (so an
    interrupted run still leaves what it measured) and prints a table at the end."""

    def __init__(self):
        self.rows: list[Timing] = []
        self.started = datetime.datetime.now(datetime.timezone.utc)
        self.torch = importlib.metadata.version("torch")  # the kernels' release (colab_env)

    def add(self, row: Timing) -> None:
        self.rows = [r for r in self.rows if r.notebook != row.notebook] + [row]
        ARTIFACTS.mkdir(exist_ok=True)
        data = {
            "what": "each notebook run alone in a Colab-like environment, deprecations as errors "
                    "(tests/evidence/test_standalone.py); seconds: kernel start to shutdown, cells_seconds: "
                    "the cells alone",
            "started": self.started.isoformat(timespec="seconds"),
            "torch": self.torch,
            "python": platform.python_version(),
            "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs",
            "min_seconds": MIN_SECONDS,
            "budget_seconds": BUDGET_S,
            "complete": len(self.rows) == len(TARGETS),
            "notebooks": [asdict(r) for r in self.rows],
        }
        TIMES_FILE.write_text(json.dumps(data, indent=1) + "\n")
        # the table, for the end of a pytest-xdist run (conftest.py prints it there)
        TIMES_FILE.with_suffix(".txt").write_text("\n".join(self.table()) + "\n")

    def table(self) -> list[str]:
        lines = [f"{'seconds':>8} {'cells s':>8} {'ran':>7} {'figs':>5}  {'device':8} {'result':7} notebook"]
        for r in self.rows:
            note = f"  (over the {BUDGET_S:.0f} s budget)" if r.seconds > BUDGET_S else ""
            ran = f"{r.executed}/{r.code_cells}"
            lines.append(f"{r.seconds:8.1f} {r.cells_seconds:8.1f} {ran:>7} {r.figures:5d}  "
                         f"{r.device:8} {'pass' if r.passed else 'FAIL':7} {r.notebook}{note}")
        total = sum(r.seconds for r in self.rows)
        shown = TIMES_FILE.relative_to(ROOT) if TIMES_FILE.is_relative_to(ROOT) else TIMES_FILE
        lines.append(f"{total:8.1f} total, {len(self.rows)} notebooks, torch {self.torch} -> {shown}")
        return lines

    # pytest hook, called because the fixture below registers this object as a plugin
    def pytest_terminal_summary(self, terminalreporter):
        if self.rows:
            terminalreporter.section("notebook run times (stand-alone, deprecations as errors)")
            for line in self.table():
                terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def timing_record(request) -> TimingRecord:
    record = TimingRecord()
    request.config.pluginmanager.register(record, "course-notebook-times")
    return record


@pytest.fixture(scope="session")
def colab_env(tmp_path_factory, timing_record) -> standalone.ColabLikeEnv:
    """A virtual environment with only torch, numpy, matplotlib and ipykernel (linked from
    this one: the same builds, no download), built once per test run; or, under
    `python3 make.py test-torch`, that command's environment with another PyTorch release."""
    python = os.environ.get(COLAB_PYTHON_ENV)
    if python:
        env = standalone.existing_colab_like_env(Path(python))
    else:
        env = standalone.make_colab_like_env(tmp_path_factory.mktemp("colab-like-env"))
    timing_record.torch = env.packages["torch"]
    return env


@pytest.fixture(scope="session")
def figures_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("figures")


# --------------------------------------------------------------------------------------
# Colab links and runtime, checked without running anything
# --------------------------------------------------------------------------------------

NOTEBOOKS = layout.all_notebooks()
NB_IDS = [p.relative_to(ROOT).as_posix() for p in NOTEBOOKS]
COLAB_URL = re.compile(
    r"https://colab\.research\.google\.com/github/(?P<repo>[^/\s)]+/[^/\s)]+)/blob/(?P<branch>[^/\s)]+)/(?P<path>[^\s)#?]+)")


def test_one_configured_repository_builds_every_link():
    cfg = layout.config()
    assert re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", cfg.github_repo), (
        f"course.toml github_repo must be 'owner/name', got {cfg.github_repo!r}")
    assert re.fullmatch(r"[A-Za-z0-9_./-]+", cfg.branch) and ".." not in cfg.branch, cfg.branch
    assert cfg.colab_url("course/00_start_here.ipynb") == (
        f"https://colab.research.google.com/github/{cfg.github_repo}/blob/{cfg.branch}/course/00_start_here.ipynb")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NB_IDS)
def test_colab_links_open_an_existing_notebook_of_the_repository(path):
    """Every Colab link in the notebook (the header badge first) is built from course.toml
    and points at a notebook that exists in the repository, lessons and releases only (a
    learner must never be sent to a solution)."""
    nb = notebooks.read(path)
    cfg = layout.config()
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    links = list(COLAB_URL.finditer(text))
    header = COLAB_URL.search(nb.cells[0].source)
    assert header, f"{path.name}: the header has no 'Open in Colab' link"
    for link in links:
        url = link.group(0)
        assert link["repo"] == cfg.github_repo and link["branch"] == cfg.branch, (
            f"{url} is not built from course.toml ({cfg.github_repo}, branch {cfg.branch}): "
            "run `python3 make.py links`")
        target = ROOT / link["path"]
        assert target.is_file() and target.suffix == ".ipynb", f"{url} points at a missing notebook"
        assert link["path"].split("/")[0] in ("course", "exercises"), (
            f"{url}: Colab links open lessons or released exercises, never solutions/")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NB_IDS)
def test_opens_in_colab_on_a_gpu_runtime_and_tells_cpu_users_how_to_switch(path):
    nb = notebooks.read(path)
    assert nb.metadata.get("accelerator") == "GPU" and nb.metadata.get("colab", {}).get("gpuType"), (
        f"{path.name}: notebook metadata must ask Colab for a GPU runtime "
        f"(coursetools/author/authoring.py NOTEBOOK_METADATA)")
    setup = next(c for c in nb.cells if c.cell_type == "code")
    assert setup.source == authoring.SETUP_SOURCE
    assert 'if device.type == "cpu":' in setup.source and standalone.GPU_HINT in setup.source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NB_IDS)
def test_deprecated_api_cells_catch_what_they_show(path):
    """A cell tagged deprecated-api is exempt from the deprecation check, so it must be a
    code cell that catches the warning it demonstrates (docs/AUTHORING.md)."""
    for i, cell in enumerate(notebooks.read(path).cells):
        if standalone.is_deprecated_api_cell(cell):
            assert cell.cell_type == "code", f"cell {i}: '{standalone.DEPRECATED_TAG}' tags code cells"
            assert "catch_warnings" in cell.source, (
                f"cell {i} is tagged '{standalone.DEPRECATED_TAG}' but catches no warning: "
                "use warnings.catch_warnings(record=True) and assert on the warning")


# --------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------

def _save(result: standalone.RunResult, target: Target, figures_dir: Path) -> tuple[Path, list[Path]]:
    EXECUTED_DIR.mkdir(parents=True, exist_ok=True)
    executed = EXECUTED_DIR / f"{target.stem}.ipynb"
    notebooks.write(result.executed_nb, executed)
    FIGURES_DIR.mkdir(parents=True, exist_ok=True)
    for old in FIGURES_DIR.glob(f"{target.stem}.*"):
        old.unlink()
    standalone.save_figures(result.figures, FIGURES_DIR, target.stem)
    return executed, standalone.save_figures(result.figures, figures_dir, target.stem)


def check_run(result: standalone.RunResult, target: Target, env: standalone.ColabLikeEnv,
              figure_paths: list[Path], see: str) -> None:
    """Everything one stand-alone run must show; raises AssertionError on the first miss."""
    assert not result.problems, (
        f"{target.id} failed when run alone in a Colab-like environment (only torch, numpy, "
        f"matplotlib; deprecation warnings are errors, except in cells tagged "
        f"'{standalone.DEPRECATED_TAG}'; cells counted from 0, markdown included):\n  "
        + "\n  ".join(result.problems) + f"\n{see}")
    assert result.code_cells > 0, f"{target.id} has no code cell: nothing ran"
    assert result.executed == result.code_cells, (
        f"only {result.executed} of {result.code_cells} code cells ran {see}")
    assert result.seconds >= MIN_SECONDS or target.id in FAST_OK, (
        f"{target.id} 'ran' in {result.seconds:.2f} s, faster than kernel start and `import torch` "
        f"alone (MIN_SECONDS = {MIN_SECONDS}): it did not really execute {see}")
    match = standalone.SETUP_REPORT.search(result.setup_report)
    assert match, f"the setup cell printed no device report: {result.setup_report!r} {see}"
    # torch.__version__ carries the build ("2.15.0+cu132"); the distribution may not ("2.15.0")
    assert match.group(1).split("+")[0] == env.packages["torch"].split("+")[0], (
        f"the setup cell reports PyTorch {match.group(1)}, but the kernel has {env.packages['torch']}")
    if match.group(2) == "cpu":
        assert standalone.GPU_HINT in result.setup_report, (
            "on a CPU runtime the setup cell must tell the learner how to switch Colab to a GPU")
    bad_figures = [f"{path}: {problem}" for fig, path in zip(result.figures, figure_paths)
                   if (problem := standalone.image_problem(fig))]
    assert not bad_figures, "figures that did not render:\n  " + "\n  ".join(bad_figures)


@pytest.mark.parametrize("target", TARGETS, ids=[t.id for t in TARGETS])
def test_notebook_runs_alone_like_in_colab(target, colab_env, timing_record, figures_dir, tmp_path):
    nb = target.load()
    result = standalone.run_notebook(
        nb, tmp_path / "colab", filename=Path(target.id).name, timeout=CELL_TIMEOUT_S,
        client_kwargs=colab_env.client_kwargs(), kernel_env=colab_env.kernel_env())
    executed_path, figure_paths = _save(result, target, figures_dir)
    passed, problem = False, "did not finish"
    try:
        check_run(result, target, colab_env, figure_paths, f"(the executed notebook: {executed_path})")
        passed, problem = True, ""
    except AssertionError as exc:
        problem = next((line.strip() for line in str(exc).splitlines()[1:] if line.strip()), str(exc))[:300]
        raise
    finally:
        timing_record.add(Timing(target.id, round(result.seconds, 2), round(result.cells_seconds, 2),
                                 result.code_cells, result.executed, len(result.figures),
                                 result.device, passed, problem))


def test_harness_runs_in_an_interpreter_of_its_own(colab_env):
    assert colab_env.python.parent.parent == colab_env.root
    assert Path(sys.prefix).resolve() != colab_env.root.resolve()
    assert {"torch", "numpy", "matplotlib"} <= set(colab_env.packages)
    assert not {"nbgrader", "nbval", "pytest", "nbclient"} & {p.lower() for p in colab_env.packages}


# --------------------------------------------------------------------------------------
# The Chinese edition, alone as Colab runs it: two notebooks, not the whole edition
# (the edition is the English program, tests/publish/test_i18n.py; lesson 01 runs in Chinese
# JupyterLab, tests/publish/test_i18n_browser.py)
# --------------------------------------------------------------------------------------

ZH_WRONG = ("pick_device_hardcodes_cpu", "common_device_unnamed_error")  # exercise 01's two wrong answers
CJK = re.compile(r"[\u3400-\u9fff]")


def _chinese_run(nb, colab_env, tmp_path, filename: str) -> standalone.RunResult:
    return standalone.run_notebook(nb, tmp_path / "colab", filename=filename, timeout=CELL_TIMEOUT_S,
                                   client_kwargs=colab_env.client_kwargs(), kernel_env=colab_env.kernel_env(),
                                   strict=False)


def _setup_line_is_chinese(result: standalone.RunResult) -> None:
    setup = result.setup_report
    match = standalone.SETUP_REPORT.search(setup)
    assert match, setup
    if match.group(2) == "cpu":  # Colab's Chinese menu, the English in brackets
        assert "没有找到 GPU" in setup and "代码执行程序 → 更改运行时类型" in setup and "Change runtime type" in setup, setup


def test_chinese_exercise_with_two_wrong_answers_speaks_chinese_alone(colab_env, tmp_path):
    """The Chinese exercise 01, two wrong answers typed in, run alone as Colab runs it: the
    failing tests (and only those) fail, each with its message in Chinese; the setup line is Chinese."""
    name = "01_device_basics"
    answers = fixtures.reference_answers(notebooks.read(layout.source_notebook(name)))
    wrong = [fixtures.load(layout.SUBMISSIONS_DIR / name / f"{fx}.toml") for fx in ZH_WRONG]
    for fx in wrong:
        answers.update(fx.answers)
    nb = fixtures.fill(notebooks.read(ROOT / "zh" / "exercises" / name / f"{name}.ipynb"), answers)
    result = _chinese_run(nb, colab_env, tmp_path, f"{name}.ipynb")
    errors = {notebooks.grade_id(cell): out for cell in result.executed_nb.cells
              for out in cell.get("outputs", []) if out.get("output_type") == "error"}
    expected = {gid for fx in wrong for gid in fx.loses}
    assert set(errors) == expected, f"failing cells {sorted(errors)}, expected {sorted(expected)}"
    for gid, out in errors.items():
        assert out.ename == "AssertionError" and CJK.search(out.evalue), f"{gid}: {out.ename}: {out.evalue[:300]}"
    _setup_line_is_chinese(result)
    notebooks.write(result.executed_nb, tmp_path / "executed.ipynb")
    print(f"Chinese exercise 01, two wrong answers, alone: {len(errors)} failing tests, each in Chinese, e.g.\n"
          f"{next(iter(errors.values())).evalue}")


def test_chinese_lesson_08_alone_finds_the_lesson_in_chinese(colab_env, tmp_path):
    """The Chinese lesson 08 runs alone without an error, and its find_lesson() answers in
    Chinese (cause, fix) with the Chinese lessons' paths and Colab links."""
    nb = notebooks.read(ROOT / "zh" / "course" / "08_troubleshooting.ipynb")
    result = _chinese_run(nb, colab_env, tmp_path, "08_troubleshooting.ipynb")
    assert not result.problems, result.problems
    _setup_line_is_chinese(result)
    printed = ["".join(o.get("text", "") for o in c.get("outputs", []) if o.get("output_type") == "stream")
               for c in result.executed_nb.cells if c.cell_type == "code" and "def find_lesson" in c.source]
    assert printed and "原因：" in printed[0] and "修正：" in printed[0], printed
    assert "zh/course/01_device_basics.ipynb" in printed[0] and "/blob/main/zh/course/01_device_basics.ipynb" in printed[0]
