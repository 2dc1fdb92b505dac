"""How grade-class scales: submissions per minute for 1, 2 and N jobs on this machine, 1 vs 2
Dask workers, and what that means for a big class (issue 27). Also the time of a resumed run
against a full one (issue 28).

    .venv/bin/python benchmarks/grade_class_scaling.py --students 12
    .venv/bin/python benchmarks/grade_class_scaling.py --modes jobs1,jobs2 --rounds 2
    .venv/bin/python benchmarks/grade_class_scaling.py --modes resume

Builds a scratch course with N submissions (reference answers, and every fourth the untouched
release, so failing tests are part of the mix), then grades a fresh copy of it in each mode,
alternating modes over --rounds rounds, and prints for each: the grading phase's wall time
(grade-class's own "worked on N submission(s) in S s" line: workers, kernels and recording,
without the start-up), submissions per minute, the whole command's wall time, the CPU time
the whole machine spent per submission (/proc/stat: kernels included, which getrusage misses;
run it on an otherwise quiet machine), how many cores were busy on average, and
the coordinator's recording time per submission (the part that does not spread over
workers). From the CPU cost of a submission with every core busy, and the coordinator's
recording time, it prints the projected wall time for 2,400 submissions on k machines of c
cores. Nothing here asserts on time: it reports what
this machine does, and the load it ran under (`os.getloadavg`).

Modes: jobs1, jobs2, jobsN (N = the default --jobs here), dask1 and dask2 (a Dask scheduler
and 1 or 2 workers started with Dask's own `dask` command on this machine, one thread each),
resume (a full run stopped with SIGTERM at 90 % and resumed, against a full run).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from coursetools import layout  # noqa: E402
from coursetools.grading import sandbox  # noqa: E402
from coursetools.instructor import engines  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grading_throughput  # noqa: E402  (benchmarks/grading_throughput.py)

CLASS = 2400  # submissions: 300 students, 8 assignments


def copy_course(base: Path, dest: Path) -> Path:
    """A copy of the scratch course whose nbgrader_config.py names the copy as its root."""
    shutil.copytree(base, dest, symlinks=True)
    config = dest / "nbgrader_config.py"
    config.write_text(config.read_text().replace(repr(str(base)), repr(str(dest))))
    return dest


def _cmd(course: Path, name: str, extra: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "coursetools.instructor.classroom", name, "--course", str(course), *extra]
    if not sandbox.bwrap_works()[0]:
        cmd.append("--unsandboxed-as-root")
    return cmd


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _machine_busy() -> float:
    """CPU-seconds every process of this machine has spent so far (/proc/stat: user, nice,
    system, irq, softirq, steal). getrusage misses the sandboxed kernels (their pid
    namespace's init is not this process's child): on a quiet machine this difference is
    the run's real cost."""
    try:
        fields = open("/proc/stat").readline().split()[1:]
    except OSError:
        return float("nan")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def run_grade_class(course: Path, name: str, extra: list[str], env: dict | None = None) -> dict:
    cpu0, busy0, start = _children_cpu(), _machine_busy(), time.perf_counter()
    proc = subprocess.run(_cmd(course, name, extra), cwd=ROOT, capture_output=True, text=True,
                          env=env or layout.env_with_course_tools())
    wall, cpu = time.perf_counter() - start, _children_cpu() - cpu0
    busy = _machine_busy() - busy0
    if proc.returncode != 0:
        raise SystemExit(f"grade-class {' '.join(extra)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-3000:]}")
    worked = re.search(r"worked on (\d+) submission\(s\) in (\d+) s .*recording ([0-9.]+) s per submission", proc.stdout)
    if not worked:
        raise SystemExit(f"no 'worked on' line in grade-class's output:\n{proc.stdout}")
    n, seconds, recording = int(worked.group(1)), float(worked.group(2)), float(worked.group(3))
    return {"n": n, "grading_s": seconds, "wall_s": wall, "cpu_s": cpu, "busy_s": busy, "record_s": recording,
            "per_min": 60 * n / max(seconds, 1e-9), "load": os.getloadavg()[0]}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_dask(course: Path, name: str, workers: int, scratch: Path) -> dict:
    """A scheduler and `workers` worker processes from Dask's own command, then grade-class
    --scheduler; the cluster's start-up (preflight in each worker) is not in the timing."""
    from distributed import Client

    address = f"tcp://127.0.0.1:{_port()}"
    env = {**layout.env_with_course_tools(), "PYTHONUNBUFFERED": "1"}
    dask = os.path.join(os.path.dirname(sys.executable), "dask")
    procs = [subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", address.rsplit(":", 1)[1],
                               "--no-dashboard"], env=env, cwd=ROOT, start_new_session=True,
                              stdout=open(scratch / "scheduler.log", "w"), stderr=subprocess.STDOUT)]
    for i in range(workers):
        procs.append(subprocess.Popen(
            [dask, "worker", address, "--nthreads", "1", "--no-dashboard", "--name", f"w{i}",
             "--preload", "coursetools.instructor.daskworker"], env=env, cwd=ROOT, start_new_session=True,
            stdout=open(scratch / f"w{i}.log", "w"), stderr=subprocess.STDOUT))
    try:
        with Client(address, timeout="60s") as client:
            client.wait_for_workers(workers, timeout=600)
        return run_grade_class(course, name, ["--scheduler", address], env)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def run_resume(course: Path, name: str, students: int, jobs: int) -> dict:
    """A full run stopped with SIGTERM once 90 % of the submissions are recorded, then the
    same command again: the resumed run's wall time against the full run's (measured by the
    caller on another copy)."""
    import sqlite3

    from coursetools.instructor.record import LEDGER_TABLE

    proc = subprocess.Popen(_cmd(course, name, ["--jobs", str(jobs)]), cwd=ROOT, env=layout.env_with_course_tools(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    target = int(0.9 * students)
    done = 0
    while proc.poll() is None:
        try:
            with sqlite3.connect(f"file:{course / 'gradebook.db'}?mode=ro", uri=True, timeout=5) as db:
                done = db.execute(f"SELECT COUNT(*) FROM {LEDGER_TABLE}").fetchone()[0]
        except sqlite3.OperationalError:
            done = 0
        if done >= target:
            proc.send_signal(signal.SIGTERM)
            break
        time.sleep(0.5)
    proc.communicate()
    resumed = run_grade_class(course, name, ["--jobs", str(jobs)])
    resumed["stopped_after"] = done
    return resumed


def projection(one_job: dict, two_jobs: dict | None) -> str:
    """Wall time for CLASS submissions on k machines of c cores. A submission costs a fixed
    amount of CPU (measured machine-wide with the cores kept busy: the most-jobs run), so c
    cores grade c / cost submissions a second; the coordinator records one submission after
    another on its own, which bounds the whole class from below."""
    busiest = two_jobs or one_job
    cost = busiest["busy_s"] / busiest["n"]
    record = max(one_job["record_s"], busiest["record_s"])
    lines = [f"projection for {CLASS:,} submissions: {cost:.1f} CPU-s per submission (every process, "
             f"measured with {'2 jobs' if two_jobs else '1 job'}), one job alone "
             f"{one_job['grading_s'] / one_job['n']:.1f} s per submission; the coordinator records "
             f"{record:.2f} s per submission (one process: at most {3600 / record:,.0f} an hour)",
             "| machines x cores | jobs | wall time |", "|---|---|---|"]
    for k, c in [(1, 2), (1, 8), (1, 32), (4, 8), (10, 8), (10, 32), (50, 32)]:
        jobs = k * c
        compute = CLASS * cost / jobs
        seconds = max(compute, CLASS * record)
        limit = " (recording-bound)" if CLASS * record >= compute else ""
        lines.append(f"| {k} x {c} | {jobs} | {seconds / 3600:.1f} h{limit} |" if seconds >= 5400
                     else f"| {k} x {c} | {jobs} | {seconds / 60:.0f} min{limit} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=12)
    parser.add_argument("--assignment", default="01_device_basics")
    parser.add_argument("--modes", default="jobs1,jobs2,jobsN,dask1,dask2")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="also write the measurements here")
    args = parser.parse_args()
    modes = args.modes.split(",")
    n_jobs = engines.default_jobs()
    scratch = Path(tempfile.mkdtemp(prefix="grade-class-scaling-"))
    print(f"{args.students} submissions of {args.assignment}; {engines.usable_cores()} usable cores, "
          f"default --jobs {n_jobs}; load before: {os.getloadavg()[0]:.1f}", flush=True)
    # the class grading_throughput.py grades: reference answers, every fourth the untouched release
    base = grading_throughput.build(scratch / "base", args.assignment, args.students).root
    measured: dict[str, list[dict]] = {m: [] for m in modes}
    try:
        for r in range(args.rounds):
            for mode in (modes if r % 2 == 0 else modes[::-1]):
                course = copy_course(base, scratch / f"{mode}-{r}")
                if mode.startswith("jobs"):
                    jobs = {"jobs1": 1, "jobs2": 2}.get(mode, n_jobs)
                    result = run_grade_class(course, args.assignment, ["--jobs", str(jobs)])
                elif mode.startswith("dask"):
                    result = run_dask(course, args.assignment, int(mode[4:]), scratch)
                elif mode == "resume":
                    full_copy = copy_course(base, scratch / f"resume-full-{r}")
                    full = run_grade_class(full_copy, args.assignment, ["--jobs", str(n_jobs)])
                    result = run_resume(course, args.assignment, args.students, n_jobs)
                    result["full_wall_s"] = full["wall_s"]
                else:
                    raise SystemExit(f"unknown mode {mode}")
                measured[mode].append(result)
                extra = (f"; full run {result['full_wall_s']:.0f} s, stopped after {result['stopped_after']}"
                         if mode == "resume" else "")
                print(f"{mode:6s} round {r + 1}: {result['n']} graded in {result['grading_s']:.0f} s "
                      f"({result['per_min']:.1f}/min), command {result['wall_s']:.0f} s, "
                      f"{result['busy_s'] / max(result['n'], 1):.1f} machine CPU-s per submission "
                      f"({result['busy_s'] / result['wall_s']:.2f} cores busy; the command's own children "
                      f"{result['cpu_s'] / max(result['n'], 1):.1f}), recording "
                      f"{result['record_s']:.2f} s per submission, load {result['load']:.1f}{extra}", flush=True)
                shutil.rmtree(course, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print("\n| mode | submissions/min | grading s | command s | machine CPU-s per submission | cores busy |")
    print("|---|---|---|---|---|---|")
    summary = {}
    for mode, runs in measured.items():
        if not runs:
            continue
        summary[mode] = {k: statistics.median(r[k] for r in runs)
                         for k in ("n", "grading_s", "wall_s", "cpu_s", "busy_s", "record_s", "per_min")}
        s = summary[mode]
        print(f"| {mode} | {s['per_min']:.1f} | {s['grading_s']:.0f} | {s['wall_s']:.0f} | "
              f"{s['busy_s'] / s['n']:.1f} | {s['busy_s'] / s['wall_s']:.2f} |")
    if "jobs1" in summary:
        print()
        print(projection(summary["jobs1"], summary.get("jobs2")))
    print(f"\nload after: {os.getloadavg()[0]:.1f}")
    if args.json:
        args.json.write_text(json.dumps({"measured": measured, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
