"""Shared fixtures of the course's test suite."""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The repository (coursetools) and tests/ itself (hostile_submissions, shared by the grading
# and instructor tests), whichever folder a test file lies in (tests/ mirrors coursetools/).
for _path in (ROOT, ROOT / "tests"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

# Run order: cheap static checks first, then the long work units (under pytest-xdist's
# `--dist loadscope`, what `make.py test` runs, a unit is a file (a notebook: nbval's cells
# share one kernel) or a class (each grading shard is one); the longest go first so that no
# worker is left with one at the end), then notebooks (nbval) and the rest.
_ORDER = ["test_repo", "test_notebooks_static", "test_fixture_groups", "test_release", "test_classroom",
          "test_grading", "test_verdicts_under_load", "test_standalone", "test_site", "test_layouts", "test_jupyterhub", "test_selfcheck",
          "test_postgres_gradebook", "test_browser",
          "test_sandbox", "test_forgery", "test_lab", "test_tooling"]


def pytest_collection_modifyitems(session, config, items):
    def rank(item):
        path = Path(str(item.fspath))
        if path.suffix == ".ipynb":
            return _ORDER.index("test_browser") + 0.5
        if path.stem in _ORDER:
            return _ORDER.index(path.stem)
        return len(_ORDER)
    items.sort(key=rank)  # stable: keeps pytest's order inside each group


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (unless PYTEST_XDIST_AUTO_NUM_WORKERS says): one worker more than the cores this
    process may use (grading, notebooks and the class simulation
    spend part of their time waiting on kernels and subprocesses), and no more than one per
    1.5 GiB of memory: a worker grading 06 runs a kernel and two DDP processes, each with
    PyTorch loaded."""
    import os
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    workers = (cores or 1) + 1
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        workers = min(workers, max(1, int(memory // (1.5 * 2**30))))
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows): cores decide
        pass
    return workers


def pytest_configure(config):
    """Grading refuses to run unsandboxed as root (coursetools/grading/sandbox.py). Where bubblewrap
    cannot sandbox (not installed, user namespaces refused), the grading tests still test
    grading, unsandboxed, and say so once; the sandbox's own tests skip there."""
    import os

    from coursetools.grading import sandbox

    # `make.py check` in a test checks in its own process: a daemon it started would outlive
    # the test (tests/learner/test_checkd.py starts its own, and stops it).
    os.environ.setdefault("COURSE_CHECK_DAEMON", "0")
    if sandbox.is_root() and not sandbox.bwrap_works()[0]:
        os.environ.setdefault(sandbox.ALLOW_ROOT_ENV, "1")
        config._course_unsandboxed = sandbox.bwrap_works()[1]


def pytest_report_header(config):
    why = getattr(config, "_course_unsandboxed", None)
    if why:
        return [f"grading tests run WITHOUT the sandbox (root, and bubblewrap cannot sandbox here: {why})"]
    return None


# Under pytest-xdist, reports that modules print at the end (the simulated class's table, the
# notebook times) are printed by the workers' plugins, which have no terminal: the controller
# prints the files they wrote during this run.
_STARTED = time.time()
_SUMMARY_FILES = {
    "grade-class on the simulated class (tests/instructor/test_classroom.py)": "grade-class-summary.txt",
    "notebook run times (stand-alone, deprecations as errors)": "notebook-times.txt",
    "measuring cells' verdicts under load (tests/evidence/test_verdicts_under_load.py)": "verdicts-under-load.txt",
    "GPU records in the lessons (tests/author/test_gpu_records.py)": "gpu-record-coverage.txt",
    "the Chinese edition's translation coverage (tests/publish/test_i18n.py)": "i18n-coverage.txt",
}


def pytest_terminal_summary(terminalreporter, config):
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    for title, name in _SUMMARY_FILES.items():
        path = ROOT / "test-artifacts" / name
        if path.exists() and path.stat().st_mtime >= _STARTED:
            terminalreporter.section(title)
            terminalreporter.write(path.read_text())
