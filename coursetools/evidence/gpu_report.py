"""Run every notebook and every test on this machine's GPU, and write a short report.

    python3 make.py gpu-report                 every notebook, then the whole test suite
    python3 make.py gpu-report --no-tests      the notebooks only (a few minutes)
    python3 make.py gpu-report -- -k 05_mixed  arguments after -- go to pytest
    python3 make.py gpu-report --record        also write what each GPU-dependent lesson cell
                                               printed into the lesson (CUDA only)
    python3 make.py gpu-report --prune         remove stale or orphaned GPU records (no GPU)
    python3 make.py gpu-report --coverage      which GPU-dependent cells have a record (no GPU)

CI has no GPU, so the GPU branches of the notebooks (`if device.type == "cuda":`) run only
here. Each lesson, each solution and each released exercise with the reference answers
typed in runs alone in a Colab-like environment (coursetools/evidence/standalone.py: only torch,
numpy, matplotlib; deprecated APIs are errors), then `python -m pytest` runs the suite.
The report (test-artifacts/gpu-report.md and .json, also printed) gives the device, the
torch/CUDA versions, each notebook's time, the device it ran on and pass/fail, and the test
suite's summary. On a machine without CUDA everything still runs, on the CPU, and the report
says plainly that there was no CUDA device. Exit status: 0 when everything passed (and, with
--require-cuda, a CUDA device was there), 1 otherwise.

With --record (coursetools/author/gpu_records.py), each lesson that passed gets, right below each
of its GPU-dependent code cells, a collapsed markdown block with what that cell printed and
drew on this GPU, labelled with the GPU's name, the PyTorch and CUDA versions and the date.
It refuses to run without a CUDA device (exit 2): a CPU's output labelled as a GPU's would be
a lie. (--record-any-device, for the tool's own tests, records anywhere and labels the device
as it is, e.g. "On an x86_64 CPU with no GPU (PyTorch ...)".)
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nbformat import NotebookNode

from coursetools.author import fixtures, gpu_records
from coursetools import layout, notebooks
from coursetools.evidence import standalone

DEFAULT_OUT = layout.ROOT / "test-artifacts"
CELL_TIMEOUT_S = 300


@dataclass
class NotebookRow:
    notebook: str
    kind: str  # lesson, solution, exercise (solved)
    seconds: float
    device: str
    passed: bool
    problem: str = ""


@dataclass
class TestSummary:
    command: str
    exit_code: int
    summary: str
    seconds: float
    failed: list[str] = field(default_factory=list)
    log: str = ""


def machine() -> dict:
    """What this machine offers PyTorch: versions, and each CUDA device."""
    import torch
    info = {
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,  # None for a CPU build
        "cudnn": None,
        "cuda_available": torch.cuda.is_available(),
        "devices": [],
        "driver": None,
        "mps_available": bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()),
    }
    if info["cuda_available"]:
        info["cudnn"] = torch.backends.cudnn.version()
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            info["devices"].append({"index": i, "name": props.name,
                                    "capability": f"{props.major}.{props.minor}",
                                    "memory_gib": round(props.total_memory / 2**30, 1)})
        if shutil.which("nvidia-smi"):
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 check=False, capture_output=True, text=True)
            info["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    return info


def device_line(info: dict) -> str:
    if info["devices"]:
        names = ", ".join(f"cuda:{d['index']} {d['name']} ({d['memory_gib']} GiB, sm {d['capability']})"
                          for d in info["devices"])
        return f"{names}; CUDA {info['torch_cuda']}, cuDNN {info['cudnn']}, driver {info['driver'] or '?'}"
    why = ("this PyTorch is a CPU build" if not info["torch_cuda"]
           else f"PyTorch built with CUDA {info['torch_cuda']} found no usable GPU (driver? CUDA_VISIBLE_DEVICES?)")
    extra = "; an Apple GPU (mps) is available" if info["mps_available"] else ""
    return f"no CUDA device: {why}{extra}. Everything ran on the CPU; the GPU paths were not exercised."


def notebook_jobs() -> list[tuple[str, str, Callable[[], NotebookNode]]]:
    """(path shown, kind, loader) for every lesson, solution and solved release."""
    jobs = [(p.relative_to(layout.ROOT).as_posix(), "lesson", lambda p=p: notebooks.read(p))
            for p in layout.lessons()]
    for name in layout.assignments():
        source = layout.source_notebook(name)
        jobs.append((source.relative_to(layout.ROOT).as_posix(), "solution",
                     lambda p=source: notebooks.read(p)))
        release = layout.release_notebook(name)
        if release.exists():
            jobs.append((release.relative_to(layout.ROOT).as_posix(), "exercise (solved)",
                         lambda n=name: fixtures.solved_release(n)))
    return jobs


def run_notebooks(info: dict, out: Path, only: list[str] | None, jobs_at_once: int = 1,
                  executed: dict[str, NotebookNode] | None = None) -> list[NotebookRow]:
    """Run each notebook alone in the Colab-like environment, `jobs_at_once` of them at a time
    (each in its own kernel and folder), and return one row per notebook, in course order.
    `executed`, when given, receives each lesson's executed notebook (harness cells removed)."""
    executed_dir = out / "gpu-report-notebooks"
    executed_dir.mkdir(parents=True, exist_ok=True)
    jobs = [j for j in notebook_jobs() if not only or any(text in j[0] for text in only)]
    with tempfile.TemporaryDirectory(prefix="gpu-report-") as scratch:
        scratch = Path(scratch)
        print(f"building the Colab-like environment in {scratch} ...", flush=True)
        env = standalone.make_colab_like_env(scratch / "env")

        def one(n: int, shown: str, kind: str, load: Callable[[], NotebookNode]) -> NotebookRow:
            try:
                nb = load()
                result = standalone.run_notebook(
                    nb, scratch / f"run{n}", filename=Path(shown).name, timeout=CELL_TIMEOUT_S,
                    client_kwargs=env.client_kwargs(), kernel_env=env.kernel_env())
            except Exception as exc:  # a notebook that cannot even be loaded or started
                return NotebookRow(shown, kind, 0.0, "?", False, f"not run: {type(exc).__name__}: {exc}")
            problems = list(result.problems)
            if result.executed < result.code_cells or result.code_cells == 0:
                problems.append(f"only {result.executed} of {result.code_cells} code cells ran")
            if info["cuda_available"] and not result.device.startswith("cuda"):
                problems.append(f"CUDA is available but the setup cell chose {result.device!r}")
            problems += [f"figure from cell {f.cell}: {p}" for f in result.figures
                         if (p := standalone.image_problem(f))]
            stem = f"{kind.split()[0]}-{Path(shown).stem}"
            notebooks.write(result.executed_nb, executed_dir / f"{stem}.ipynb")
            if executed is not None and kind == "lesson":
                ran = copy.deepcopy(result.executed_nb)
                ran.cells = [c for c in ran.cells if not standalone.is_harness_cell(c)]
                executed[shown] = ran
            return NotebookRow(shown, kind, round(result.seconds, 1), result.device, not problems,
                               problems[0].splitlines()[0][:300] if problems else "")

        rows: dict[int, NotebookRow] = {}
        with ThreadPoolExecutor(max_workers=max(1, jobs_at_once)) as pool:
            futures = {pool.submit(one, n, *job): n for n, job in enumerate(jobs, 1)}
            for future in as_completed(futures):
                row = rows[futures[future]] = future.result()
                print(f"[{len(rows)}/{len(jobs)}] {row.notebook} ({row.kind}): "
                      f"{'ok' if row.passed else 'FAIL'} {row.seconds:.1f} s on {row.device}"
                      + (f": {row.problem}" if row.problem else ""), flush=True)
    return [rows[n] for n in sorted(rows)]


def run_tests(pytest_args: list[str], out: Path, time_limit: float | None = None) -> TestSummary:
    """Run pytest, echoing and logging its output. With `time_limit` (seconds), pytest is
    stopped when it runs longer, and the summary counts what finished (a rented GPU's
    minutes are few: a partial report beats none)."""
    cmd = [sys.executable, "-m", "pytest", *pytest_args]
    log_path = out / "gpu-report-pytest.log"
    print(f"\n+ {' '.join(cmd)}   (log: {log_path})", flush=True)
    start = time.perf_counter()
    lines: list[str] = []
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=layout.ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, bufsize=1, start_new_session=True)
        stopped = threading.Event()  # set by the watchdog: the limit, not pytest, ended the run
        watchdog = threading.Timer(time_limit, _stop, args=(proc, stopped)) if time_limit else None
        if watchdog:
            watchdog.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stdout.write(line)
                log.write(line)
                lines.append(line.rstrip("\n"))
            code = proc.wait()
        finally:
            if watchdog:
                watchdog.cancel()
    seconds = time.perf_counter() - start
    summary = next((m.group(1) for line in reversed(lines)
                    if (m := re.match(r"^=+ (.*\d+ (?:passed|failed|error|errors|skipped|deselected|no tests ran).*?) =+$", line))),
                   None)
    if summary is None:
        counts = {word: sum(1 for line in lines if re.search(rf"\b{word}\b", line) and "::" in line)
                  for word in ("PASSED", "FAILED", "ERROR", "SKIPPED")}
        done = ", ".join(f"{n} {w.lower()}" for w, n in counts.items() if n) or "nothing finished"
        why = (f"stopped at the {time_limit:.0f} s limit" if stopped.is_set()
               else f"pytest exited with {code} and printed no summary")
        summary = f"{why}; finished before that: {done}"
    failed = [line.split(" - ")[0] for line in lines if line.startswith(("FAILED ", "ERROR "))]
    if not failed:  # no short summary (e.g. stopped early): the verbose lines say it too
        failed = [m.group(1) or m.group(2) for line in lines if (m := re.search(
            r"(?:FAILED|ERROR) (\S+::\S+)|^(\S+::\S+) (?:FAILED|ERROR)\b", line))]
    return TestSummary(" ".join(["python", "-m", "pytest", *pytest_args]), code, summary,
                       round(seconds, 1), failed[:50], str(log_path))


def _stop(proc: subprocess.Popen, stopped: threading.Event | None = None) -> None:
    """Stop pytest and everything it started (kernels, nbgrader, xdist workers)."""
    if stopped is not None:
        stopped.set()
    if os.name == "nt":
        proc.kill()
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        time.sleep(5)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _shown(path: Path) -> str:
    return path.relative_to(layout.ROOT).as_posix() if path.is_relative_to(layout.ROOT) else str(path)


def render(info: dict, rows: list[NotebookRow], tests: TestSummary | None, started: str,
           seconds: float) -> str:
    gpu = bool(info["devices"])
    lines = [
        "# GPU report",
        "",
        f"- **Device:** {device_line(info)}",
        (f"- **PyTorch** {info['torch']} (CUDA build: {info['torch_cuda'] or 'no'}), "
         f"Python {info['python']}, {info['platform']}, {info['cpus']} CPUs"),
        f"- **When:** {started}, {seconds / 60:.1f} minutes in all",
        "",
    ]
    if not gpu:
        lines += [("> **No CUDA device.** This report comes from a CPU run; it proves nothing "
                   "about the notebooks' GPU paths."), ""]
    if rows:
        ok = sum(r.passed for r in rows)
        lines += [f"## Notebooks ({ok}/{len(rows)} passed; each run alone, Colab-like, deprecations as errors)",
                  "", "| notebook | kind | seconds | ran on | result |", "|---|---|---:|---|---|"]
        for r in rows:
            result = "pass" if r.passed else f"**FAIL** {r.problem.replace('|', '/')}"
            lines.append(f"| {r.notebook} | {r.kind} | {r.seconds:.1f} | {r.device} | {result} |")
        lines.append("")
    if tests:
        status = "pass" if tests.exit_code == 0 else f"**FAIL** (exit {tests.exit_code})"
        lines += ["## Test suite", "",
                  (f"`{tests.command}`: {status}: {tests.summary} "
                   f"({tests.seconds / 60:.1f} min; log `{_shown(Path(tests.log))}`)"), ""]
        lines += [f"- {t}" for t in tests.failed]
        if tests.failed:
            lines.append("")
    else:
        lines += ["## Test suite", "", "not run (--no-tests)", ""]
    return "\n".join(lines)


def _lesson_path(shown: str) -> Path:
    return Path(shown) if Path(shown).is_absolute() else layout.ROOT / shown


def record(rows: list[NotebookRow], executed: dict[str, NotebookNode], info: dict) -> list[str]:
    """Write the record blocks into every lesson whose run passed; lines saying what was done."""
    device = gpu_records.device_from(info)
    lines = []
    for row in rows:
        if row.kind != "lesson":
            continue
        if not row.passed or row.notebook not in executed:
            lines.append(f"{row.notebook}: not recorded, its run failed ({row.problem or 'no result'})")
            continue
        path = _lesson_path(row.notebook)
        nb = notebooks.read(path)
        new, notes = gpu_records.write_blocks(nb, executed[row.notebook].cells, device)
        if new is not nb:
            notebooks.write(new, path)
        cov = gpu_records.coverage(new, row.notebook)
        lines.append(f"{row.notebook}: {len(cov.recorded)} of {len(cov.dependent)} GPU-dependent cells recorded"
                     + (f" ({'; '.join(notes)})" if notes else ""))
    return [f"records made on {device.where()}:", *lines]


def _lesson_files(only: list[str] | None, paths: list[Path] | None = None) -> list[Path]:
    files = list(paths) if paths else layout.lessons()
    return [p for p in files if not only or any(text in str(p) for text in only)]


def prune_files(paths: list[Path]) -> list[str]:
    """Remove stale, orphaned or unreadable record blocks (no GPU needed); what was removed."""
    lines = []
    for path in paths:
        name = gpu_records.shown(path, layout.ROOT)
        nb = notebooks.read(path)
        new, found = gpu_records.prune(nb, name)
        if found:
            notebooks.write(new, path)
            lines += [f"removed: {p.message.split(' Run `')[0]}" for p in found]
    return lines or ["no stale or orphaned GPU record: nothing to prune"]


def coverage_report(paths: list[Path], cells: bool = True) -> str:
    rows, nbs = [], {}
    for path in paths:
        name = gpu_records.shown(path, layout.ROOT)
        nbs[name] = notebooks.read(path)
        rows.append(gpu_records.coverage(nbs[name], name))
    return gpu_records.coverage_text(rows, nbs, cells)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pytest_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, pytest_args = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(prog="python3 make.py gpu-report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-tests", action="store_true", help="run the notebooks only, not pytest")
    parser.add_argument("--no-notebooks", action="store_true", help="run pytest only")
    parser.add_argument("--only", metavar="TEXT", action="append",
                        help="only the notebooks whose path contains TEXT (repeat for several)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="run N notebooks at a time (default 1; each notebook's time is then "
                             "measured on a shared machine)")
    parser.add_argument("--tests-time-limit", type=float, metavar="SECONDS",
                        help="stop pytest after this long and report what finished")
    parser.add_argument("--require-cuda", action="store_true",
                        help="fail (exit 1) when there is no CUDA device")
    parser.add_argument("--record", action="store_true",
                        help="write what each GPU-dependent lesson cell printed on this GPU into the "
                             "lesson, below the cell (needs CUDA)")
    parser.add_argument("--record-any-device", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--prune", action="store_true",
                        help="only remove GPU records whose cell changed since (or that follow no "
                             "code cell) from the lessons, and exit; no GPU needed")
    parser.add_argument("--coverage", action="store_true",
                        help="only list the lessons' GPU-dependent cells and which have a record, and exit")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="folder for gpu-report.md/.json and logs (default: test-artifacts/)")
    args = parser.parse_args(argv)
    if (args.prune or args.coverage) and (args.record or args.record_any_device):
        print("error: --prune and --coverage only edit or list the lessons and exit; run --record on "
              "its own (it replaces the records of the cells it runs). Nothing was run or written.",
              file=sys.stderr)
        return 2
    if args.prune or args.coverage:
        if args.prune:
            print("\n".join(prune_files(_lesson_files(args.only))))
        if args.coverage:
            print(coverage_report(_lesson_files(args.only)))
        return 0
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    start = time.perf_counter()

    info = machine()
    print(f"GPU report: {device_line(info)}", flush=True)
    recording = args.record or args.record_any_device
    if recording and not info["devices"] and not args.record_any_device:
        print("error: --record needs a CUDA device, and there is none here: a record says what a GPU "
              "printed, so it is made on one (see docs/GPU_RUNS.md). Nothing was run or written.",
              file=sys.stderr)
        return 2
    if recording and args.no_notebooks:
        print("error: --record runs the lessons; it cannot be combined with --no-notebooks", file=sys.stderr)
        return 2
    executed: dict[str, NotebookNode] = {}
    rows = [] if args.no_notebooks else run_notebooks(info, out, args.only, args.jobs, executed)
    recorded = record(rows, executed, info) if recording else []
    if recorded:
        print("\n".join(recorded), flush=True)
    tests = None if args.no_tests else run_tests(pytest_args, out, args.tests_time_limit)
    seconds = time.perf_counter() - start

    text = render(info, rows, tests, started, seconds)
    if recorded:
        text += "\n## GPU records written into the lessons\n\n" + "\n".join(f"- {line}" for line in recorded) + "\n"
    (out / "gpu-report.md").write_text(text + "\n")
    (out / "gpu-report.json").write_text(json.dumps({
        "started": started, "seconds": round(seconds, 1), "machine": info,
        "cuda": bool(info["devices"]), "device": device_line(info),
        "notebooks": [asdict(r) for r in rows], "tests": asdict(tests) if tests else None,
        "recorded": recorded,
    }, indent=1) + "\n")
    print("\n" + text)
    print(f"written: {out / 'gpu-report.md'} and gpu-report.json")
    failed = any(not r.passed for r in rows) or (tests is not None and tests.exit_code != 0)
    if args.require_cuda and not info["devices"]:
        print("error: --require-cuda, and there is no CUDA device", file=sys.stderr)
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
