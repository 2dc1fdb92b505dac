"""How fast a class is graded, with and without the kernel sandbox, measured side by side.

    .venv/bin/python benchmarks/grading_throughput.py --students 12 --assignment 01_device_basics

Builds a scratch course with N copies of the reference answers (plus the untouched release,
so failing tests are part of the mix), then runs `grade-class` on it with the sandbox off
and with bubblewrap, each on a fresh copy, in alternating order over --rounds rounds, and
prints wall time and submissions per minute. Nothing here asserts on time: it reports
what this machine does.
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

from coursetools import fixtures, layout, notebooks, sandbox  # noqa: E402
from coursetools.nbgrader_course import NbgraderCourse  # noqa: E402


def build(root: Path, name: str, students: int) -> NbgraderCourse:
    course = NbgraderCourse(root, [name])
    solved = fixtures.solved_release(name)
    blank = notebooks.read(layout.release_notebook(name))
    for i in range(students):
        course.submit(f"s{i:02d}", name, blank if i % 4 == 3 else solved)
    return course


def grade(course: NbgraderCourse, name: str, mode: str) -> float:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "coursetools.classroom", name, "--course", str(course.root), "--sandbox", mode],
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
    args = parser.parse_args()
    modes = ["off"] + (["bwrap"] if sandbox.bwrap_works()[0] else [])
    if len(modes) == 1:
        print(f"no sandbox here ({sandbox.bwrap_works()[1]}): measuring without it only")
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for mode in (modes if r % 2 == 0 else modes[::-1]):
                course = build(Path(tmp) / f"{mode}{r}", args.assignment, args.students)
                times[mode].append(grade(course, args.assignment, mode))
                print(f"  round {r + 1}, sandbox {mode}: {times[mode][-1]:.1f} s", flush=True)
                shutil.rmtree(course.root, ignore_errors=True)
    print(f"grade-class {args.assignment}, {args.students} submissions, {os.cpu_count()} CPUs "
          f"(generate + autograde + feedback + export), mean of {args.rounds} rounds:")
    mean = {mode: sum(ts) / len(ts) for mode, ts in times.items()}
    for mode, seconds in mean.items():
        print(f"  sandbox {mode:5}: {seconds:6.1f} s  = {60 * args.students / seconds:5.1f} submissions/min"
              f"  (rounds: {', '.join(f'{t:.1f}' for t in times[mode])})")
    if len(mean) == 2:
        print(f"  sandbox cost: {mean['bwrap'] - mean['off']:+.1f} s ({mean['bwrap'] / mean['off'] - 1:+.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
