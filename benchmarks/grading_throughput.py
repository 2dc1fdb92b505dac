"""How fast a class is graded, side by side: with and without the kernel sandbox, or with
and without the tamper checks (guard cells around each test, tests sent compiled).

    .venv/bin/python benchmarks/grading_throughput.py --students 12 --assignment 01_device_basics
    .venv/bin/python benchmarks/grading_throughput.py --compare checks --students 8

Builds a scratch course with N copies of the reference answers (plus the untouched release,
so failing tests are part of the mix), then runs `grade-class` on it in each mode, each on a
fresh copy of the same submissions, in alternating order over --rounds rounds, and prints
wall time and submissions per minute. Nothing here asserts on time: it reports what this
machine does.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from coursetools.author import fixtures
from coursetools import layout, notebooks
from coursetools.grading import sandbox
from coursetools.author.nbgrader_course import NbgraderCourse


def build(root: Path, name: str, students: int) -> NbgraderCourse:
    course = NbgraderCourse(root, [name])
    solved = fixtures.solved_release(name)
    blank = notebooks.read(layout.release_notebook(name))
    for i in range(students):
        course.submit(f"s{i:02d}", name, blank if i % 4 == 3 else solved)
    return course


def grade(course: NbgraderCourse, name: str, mode: str) -> float:
    args = {"off": ["--sandbox", "off"], "bwrap": ["--sandbox", "bwrap"],
            "checks on": [], "checks off": ["--no-tamper-checks"]}[mode]
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "coursetools.instructor.classroom", name, "--course", str(course.root), *args],
        cwd=ROOT, capture_output=True, text=True, env=layout.env_with_course_tools())
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"grade-class failed ({mode}):\n{proc.stdout}\n{proc.stderr[-3000:]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=12)
    parser.add_argument("--assignment", default="01_device_basics")
    parser.add_argument("--rounds", type=int, default=2,
                        help="rounds; the order of the modes alternates, so that neither always "
                             "runs on a cold cache (default 2)")
    parser.add_argument("--compare", choices=["sandbox", "checks"], default="sandbox",
                        help="sandbox: off vs bwrap; checks: tamper checks off vs on (default sandbox)")
    args = parser.parse_args()
    if args.compare == "checks":
        modes = ["checks off", "checks on"]
    else:
        modes = ["off"] + (["bwrap"] if sandbox.bwrap_works()[0] else [])
    if len(modes) == 1:
        print(f"no sandbox here ({sandbox.bwrap_works()[1]}): measuring without it only")
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for mode in (modes if r % 2 == 0 else modes[::-1]):
                course = build(Path(tmp) / f"{mode.replace(' ', '-')}{r}", args.assignment, args.students)
                times[mode].append(grade(course, args.assignment, mode))
                print(f"  round {r + 1}, {mode}: {times[mode][-1]:.1f} s", flush=True)
                shutil.rmtree(course.root, ignore_errors=True)
    print(f"grade-class {args.assignment}, {args.students} submissions, {os.cpu_count()} CPUs "
          f"(generate + autograde + feedback + export), mean of {args.rounds} rounds:")
    mean = {mode: sum(ts) / len(ts) for mode, ts in times.items()}
    for mode, seconds in mean.items():
        print(f"  {mode:10}: {seconds:6.1f} s  = {60 * args.students / seconds:5.1f} submissions/min"
              f"  (rounds: {', '.join(f'{t:.1f}' for t in times[mode])})")
    if len(mean) == 2:
        base, new = modes
        print(f"  cost of {new}: {mean[new] - mean[base]:+.1f} s ({mean[new] / mean[base] - 1:+.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
