"""Warm kernels against cold ones, side by side in one run (coursetools/grading/warm.py).

    .venv/bin/python benchmarks/warm_kernels.py check            # make.py check of chapter 01
    .venv/bin/python benchmarks/warm_kernels.py grade --students 8 --assignment 01_device_basics
    .venv/bin/python benchmarks/warm_kernels.py suite [PYTEST ARGS]   # default: tests/course/test_grading.py

check: `python3 make.py check` of chapter 01's reference answers, as a learner runs it:
  cold (COURSE_CHECK_DAEMON=0: every check starts Python, PyTorch and a kernel) against warm
  (the check daemon, started by one check first and not counted). Wall time of each check.
grade: `nbgrader autograde` (grade-class's grading step, the course's ResilientExecute) of
  N submissions (reference answers, every fourth one the untouched release), with
  COURSE_WARM_KERNELS=0 against 1: CPU-seconds of nbgrader and everything it started
  (workers, zygotes, kernels), per submission, and wall time.
suite: pytest with COURSE_WARM_KERNELS=0 against 1, wall time.

Modes alternate from round to round (neither always runs second, on warm caches); each
result is the median of the rounds with their spread (min-max), and the ratio warm/cold of
the medians. The machine's load average is printed before and after: compare runs only at
like loads. Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from coursetools import layout, notebooks  # noqa: E402
from coursetools.author import fixtures  # noqa: E402
from coursetools.author.nbgrader_course import NbgraderCourse  # noqa: E402


class CpuMeter:
    """CPU-seconds of this process's descendants. A killed sandbox's processes are never
    waited for by their parents, so RUSAGE_CHILDREN misses them: where cgroup v1's cpuacct
    controller is writable, this process moves into a cpuacct group of its own (the grader's
    kernel cgroups are made in the memory and pids hierarchies only, so every descendant
    stays counted here) and the group's usage, less this process's own, is measured."""

    def __init__(self):
        self.group = None
        base = "/sys/fs/cgroup/cpuacct"
        if os.path.isdir(base) and os.access(base, os.W_OK):
            group = os.path.join(base, f"course-bench-{os.getpid()}")
            try:
                os.mkdir(group)
                with open(os.path.join(group, "cgroup.procs"), "w") as f:
                    f.write(str(os.getpid()))
                self.group = group
            except OSError:
                pass
        self.how = ("cgroup cpuacct (every descendant)" if self.group else
                    "RUSAGE_CHILDREN (undercounts: processes of killed sandboxes are not included)")

    def read(self) -> float:
        me = resource.getrusage(resource.RUSAGE_SELF)
        own = me.ru_utime + me.ru_stime
        if self.group:
            with open(os.path.join(self.group, "cpuacct.usage")) as f:
                return int(f.read()) / 1e9 - own
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    def close(self) -> None:
        if self.group:
            with open("/sys/fs/cgroup/cpuacct/cgroup.procs", "w") as f:
                f.write(str(os.getpid()))
            for _ in range(100):
                try:
                    os.rmdir(self.group)
                    break
                except OSError:
                    time.sleep(0.1)


def _summary(label: str, values: list[float], unit: str) -> str:
    return (f"  {label:5}: median {statistics.median(values):6.2f} {unit}  "
            f"(min {min(values):.2f}, max {max(values):.2f}, n={len(values)})")


def _report(results: dict[str, list[float]], unit: str) -> None:
    for mode in ("cold", "warm"):
        print(_summary(mode, results[mode], unit))
    ratio = statistics.median(results["warm"]) / statistics.median(results["cold"])
    print(f"  warm/cold: {ratio:.2f}  (warm is {1 / ratio:.1f}x faster)")


def _load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def bench_check(rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-", dir="/tmp") as tmp:
        nb = Path(tmp) / "ch01.ipynb"
        name = "01_device_basics"
        notebooks.write(fixtures.solved_release(name), nb)
        runtime = Path(tmp) / "xdg"
        runtime.mkdir(mode=0o700)
        env = {**layout.env_with_course_tools(), "XDG_RUNTIME_DIR": str(runtime), "COURSE_CHECK_IDLE_S": "600"}
        cmd = [sys.executable, "make.py", "check", str(nb), "--as-given"]

        def once(mode: str) -> float:
            start = time.perf_counter()
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                                  env={**env, "COURSE_CHECK_DAEMON": "0" if mode == "cold" else "1"})
            seconds = time.perf_counter() - start
            if proc.returncode != 0 or "Score: 26/26" not in proc.stdout:
                raise SystemExit(f"make.py check failed ({mode}):\n{proc.stdout}\n{proc.stderr}")
            return seconds

        once("warm")  # starts the daemon: a learner's first check of the session, not counted
        from coursetools.learner import checkd
        os.environ["XDG_RUNTIME_DIR"] = str(runtime)
        for _ in range(600):
            if checkd.socket_path().exists():
                break
            time.sleep(0.5)
        once("warm")  # the daemon's own first check (its first fork), not counted
        results: dict[str, list[float]] = {"cold": [], "warm": []}
        try:
            for r in range(rounds):
                for mode in ("cold", "warm") if r % 2 == 0 else ("warm", "cold"):
                    results[mode].append(once(mode))
        finally:
            checkd.stop()
    print(f"make.py check of {name} (reference answers), wall seconds per check:")
    _report(results, "s")


def bench_grade(rounds: int, students: int, name: str) -> None:
    """CPU per submission at `students`, and the marginal cost of one more submission: the
    difference between `students` and twice as many, over `students` (what a long-running
    grade-class worker pays for each submission once its process and zygote are up)."""
    small, large = _grade_runs(rounds, students, name), _grade_runs(rounds, 2 * students, name)
    print(f"nbgrader autograde of {name}, {students} submissions, CPU-seconds per submission "
          f"(nbgrader and all it started):")
    _report({m: [c / students for c in small[0][m]] for m in small[0]}, "CPU-s")
    print(f"  marginal CPU-seconds of one more submission ({students} -> {2 * students}, medians):")
    marginal = {m: [(statistics.median(large[0][m]) - statistics.median(small[0][m])) / students]
                for m in small[0]}
    _report(marginal, "CPU-s")
    print(f"  wall seconds for the whole autograde of {students}:")
    _report(small[1], "s")


def _grade_runs(rounds: int, students: int, name: str):
    results: dict[str, list[float]] = {"cold": [], "warm": []}
    walls: dict[str, list[float]] = {"cold": [], "warm": []}
    solved = fixtures.solved_release(name)
    blank = notebooks.read(layout.release_notebook(name))
    meter = CpuMeter()
    print(f"CPU measured with {meter.how}")
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        for r in range(rounds):
            for mode in ("cold", "warm") if r % 2 == 0 else ("warm", "cold"):
                course = NbgraderCourse(Path(tmp) / f"{mode}{r}", [name])
                course.generate(name)
                for i in range(students):
                    course.submit(f"s{i:02d}", name, blank if i % 4 == 3 else solved)
                os.environ["COURSE_WARM_KERNELS"] = "0" if mode == "cold" else "1"
                before, start = meter.read(), time.perf_counter()
                course.autograde(name)
                walls[mode].append(time.perf_counter() - start)
                results[mode].append(meter.read() - before)
                print(f"  {students} submissions, round {r + 1}, {mode}: {results[mode][-1]:.1f} CPU-s, "
                      f"{walls[mode][-1]:.1f} s wall", flush=True)
                shutil.rmtree(course.root, ignore_errors=True)
    meter.close()
    os.environ.pop("COURSE_WARM_KERNELS", None)
    return results, walls


def bench_suite(rounds: int, args: list[str]) -> None:
    args = args or ["tests/course/test_grading.py", "-n", "auto", "--dist", "loadscope"]
    results: dict[str, list[float]] = {"cold": [], "warm": []}
    for r in range(rounds):
        for mode in ("cold", "warm") if r % 2 == 0 else ("warm", "cold"):
            start = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                                  cwd=ROOT, capture_output=True, text=True,
                                  env={**layout.env_with_course_tools(), "COURSE_WARM_KERNELS": "0" if mode == "cold" else "1"})
            results[mode].append(time.perf_counter() - start)
            tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-300:]
            print(f"  round {r + 1}, {mode}: {results[mode][-1]:.0f} s  {tail}", flush=True)
    print(f"pytest {' '.join(args)}, wall seconds:")
    _report(results, "s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["check", "grade", "suite"])
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds, modes alternating (default: check 6, grade 2, suite 1)")
    parser.add_argument("--students", type=int, default=8)
    parser.add_argument("--assignment", default="01_device_basics")
    args, rest = parser.parse_known_args()
    print(f"{os.cpu_count()} CPUs, {_load()}, {time.strftime('%Y-%m-%d %H:%M')}", flush=True)
    if args.what == "check":
        bench_check(args.rounds or 6)
    elif args.what == "grade":
        bench_grade(args.rounds or 2, args.students, args.assignment)
    else:
        bench_suite(args.rounds or 1, rest)
    print(f"after: {_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
