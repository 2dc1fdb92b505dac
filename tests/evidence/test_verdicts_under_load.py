"""A lesson right only on a quiet machine is wrong for the learner: the measuring cells, run on a
machine this test makes busy, must print only conclusions their own figures support.

Every lesson with a cell tagged `verdict` (a cell that concludes from a timing; see
coursetools/evidence/verdicts.py) runs top to bottom in a kernel of the course's environment
while the test keeps two busy processes per core running (started by the module's fixture,
stopped at its end, each also ending by itself after LOAD_MAX_S). Then, for each tagged cell:

* it ran without an error and without writing to stderr (as everywhere);
* it printed at least one verdict line, and every verdict line of the notebook is consistent
  with the figures printed on that line (`verdicts.check_line`): a conclusion only where the
  ranges of the interleaved rounds do not overlap, the ratio the medians', the faster one named;
* what it printed after a verdict follows from it, and its figures draw their ranges
  (`verdicts.check_cell`): no cause, winner or ratio after "no conclusion", never "nothing to
  explain" or "no drop";
* nothing was left in the kernel's private TMPDIR (the multi-process lessons clean up).

The verdicts each run printed go to test-artifacts/verdicts-under-load.txt, with the load
measured while the notebook ran. `COURSE_VERDICT_LOAD=0` runs the same test on a quiet machine
(no load started): the README's and the closing notes' "quiet" columns come from such a run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from coursetools import layout, notebooks
from coursetools.evidence import standalone, verdicts

ROOT = layout.ROOT
ARTIFACTS = ROOT / "test-artifacts"
REPORT = ARTIFACTS / "verdicts-under-load.txt"
LOAD_PER_CORE = 2
LOAD_MAX_S = 1500  # a busy process ends by itself after this, even if the test's cleanup never runs
LOADED = os.environ.get("COURSE_VERDICT_LOAD", "1") != "0"
CELL_TIMEOUT_S = 300  # nbval's 180 s, with room for the load this test adds


# A lesson that starts processes (torchrun, mp.spawn, torch's elastic start_processes, a
# subprocess) runs here too: its launch limits must hold under load, and it must clean up.
LAUNCHES = re.compile(r"\b(subprocess\.(run|Popen)|torchrun|mp\.spawn|start_processes)\b")


def measuring_lessons() -> list[Path]:
    return [p for p in layout.lessons()
            if any(verdicts.TAG in c.get("metadata", {}).get("tags", [])
                   or (c.cell_type == "code" and LAUNCHES.search(c.source)) for c in notebooks.read(p).cells)]


LESSONS = measuring_lessons()


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@pytest.fixture(scope="module")
def cpu_load():
    """Two busy processes per core for the module's duration (none when COURSE_VERDICT_LOAD=0)."""
    procs = []
    if LOADED:
        spin = f"import time\nend = time.monotonic() + {LOAD_MAX_S}\nwhile time.monotonic() < end:\n    pass\n"
        # Each in a session of its own: jupyter_client starts the kernel in a new session, and
        # where Linux groups the scheduler by session (sched_autogroup, on by default on desktop
        # distributions and here), busy processes sharing the test's session would together get
        # one share against the kernel's: a load of 4 that costs the kernel nothing (measured:
        # the lessons ran as fast as on a quiet machine). Apart, each competes like a browser tab.
        procs = [subprocess.Popen([sys.executable, "-c", spin], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
                 for _ in range(LOAD_PER_CORE * _cores())]
        time.sleep(2)  # let the load average notice them
    try:
        yield len(procs)
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait(timeout=30)
    assert all(p.returncode is not None for p in procs)


@pytest.fixture(scope="module")
def report():
    lines: list[str] = []
    yield lines
    if lines:
        ARTIFACTS.mkdir(exist_ok=True)
        REPORT.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _stdout(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", [])
                   if o.get("output_type") == "stream" and o.get("name") == "stdout")


def test_some_lessons_measure():
    """The list below is not empty by accident: chapters 02, 05, 06, 07 and 08 measure or launch."""
    assert len(LESSONS) >= 9, f"only {[p.name for p in LESSONS]} have a cell tagged {verdicts.TAG!r}"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_verdicts_follow_from_the_figures_under_load(path, cpu_load, report, tmp_path, request):
    nb = notebooks.read(path)
    tagged = [i for i, c in enumerate(nb.cells) if verdicts.TAG in c.get("metadata", {}).get("tags", [])]
    # Short, as a learner's TMPDIR is: a DataLoader's workers share tensors through a Unix socket
    # made in TMPDIR, and under pytest's deep tmp_path its path passed the 108 bytes AF_UNIX allows
    # ("OSError: AF_UNIX path too long" in the workers, and the loader waited for them for ever).
    private_tmp = Path(tempfile.mkdtemp(prefix="course-vt-", dir="/tmp" if os.access("/tmp", os.W_OK) else None))
    request.addfinalizer(lambda: shutil.rmtree(private_tmp, ignore_errors=True))
    # PyTorch's own compile cache (torchinductor_<user>, made by the first meta op or dispatch mode,
    # torch/_inductor/runtime/cache_dir_utils.py) is PyTorch's to keep, not a lesson's leftover.
    env = {**os.environ, "TMPDIR": str(private_tmp), "TMP": str(private_tmp), "TEMP": str(private_tmp),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor-cache")}
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    result = standalone.run_notebook(nb, tmp_path / "run", filename=path.name, timeout=CELL_TIMEOUT_S,
                                     kernel_env=env, strict=False)  # strict: the Colab harness
    load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    executed = [c for c in result.executed_nb.cells if not standalone.is_harness_cell(c)]
    report.append(f"## {path.name}: {'loaded' if LOADED else 'quiet'} ({cpu_load} busy processes on "
                  f"{_cores()} cores; load average {load_before:.1f} before, {load_after:.1f} after; "
                  f"{result.seconds:.1f} s)")
    problems = list(result.problems)
    for i in tagged:
        printed = _stdout(executed[i])
        try:
            found = verdicts.parse(printed)
        except ValueError as exc:
            problems.append(f"cell {i}: {exc}")
            continue
        if not found and verdicts.TAG in nb.cells[i].get("metadata", {}).get("tags", []):
            problems.append(f"cell {i} is tagged {verdicts.TAG!r} but printed no verdict line: {printed[-400:]!r}")
        for v in found:
            report.append(f"cell {i}: {v.line}")
        problems += [f"cell {i}: {p}" for p in verdicts.check_cell(nb.cells[i].source, printed)]
    left = sorted(str(p.relative_to(private_tmp)) for p in private_tmp.iterdir())
    if left:
        problems.append(f"left in the kernel's TMPDIR: {left[:10]}")
    assert not problems, f"{path.name}, {'under load' if LOADED else 'quiet'}:\n  " + "\n  ".join(problems)
