"""Grade a whole class with nbgrader, and say what happened to every submission.

    python3 make.py grade-class                       # every assignment, every student
    python3 make.py grade-class 01_device_basics --zip --csv grades.csv

nbgrader does the work (its own commands, its gradebook); this is the thin glue it lacks:

1. `generate_assignment` (with the gradebook) for each assignment;
2. with `--zip`: `zip_collect` from `downloaded/<assignment>/archive/` (files named
   `<student_id>__<notebook>.ipynb`, or zip files of them);
3. `autograde` of every submission in `submitted/<student>/<assignment>/`, with a
   progress bar. The course's nbgrader_config.py makes that grading survive a real class
   (coursetools.instructor.nbgrader_ext.ResilientExecute: sandbox, per-cell limits, crash recovery,
   tamper checks, hidden tests kept out of outputs);
4. `generate_feedback` (HTML per student, hidden tests removed) and `export` (CSV);
5. a summary table: each student's score per assignment, and what needs a human look —
   tampering, deleted or edited test cells (restored before grading), cells that crashed
   the kernel or timed out, submissions nbgrader could not grade at all, and the static
   review's findings (coursetools.grading.review: code no answer needs, with cell, line and
   construct; the score is not changed). The same flags go into the CSV's `flags` column.

Symbolic links in a submission folder are moved to `quarantine/` before grading: nbgrader
copies what a link points to, as the grader, where the student's code could read it.

A broken submission never stops the others: nbgrader moves on, and the summary says why
that one has no grade. Exit status: 0 when every submission was graded, 1 otherwise.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from coursetools import layout, notebooks
from coursetools.grading import review, sandbox
from coursetools.grading.execute import BUDGET_ENAME
from coursetools.grading.guard import TAMPER_ENAME
from coursetools.author.nbgrader_course import nbgrader_env

FLAG_ENAMES = {
    TAMPER_ENAME: "tampering",
    BUDGET_ENAME: "time budget spent",
    "DeadKernelError": "kernel crash",
    "CellTimeoutError": "timeout",
    "NotExecuted": "cells never ran",
}


@dataclass
class Result:
    student: str
    assignment: str
    score: float | None = None
    max_score: float = 0.0
    flags: list[str] = field(default_factory=list)

    @property
    def graded(self) -> bool:
        return self.score is not None


class Progress:
    """A one-line progress bar on a terminal; one line per step otherwise (CI logs)."""

    def __init__(self, total: int, label: str, stream=sys.stderr):
        self.total, self.label, self.stream, self.done = max(total, 1), label, stream, 0
        self.tty = stream.isatty()
        self.start = time.perf_counter()

    def step(self, what: str) -> None:
        self.done = min(self.done + 1, self.total)
        width = 30
        filled = int(width * self.done / self.total)
        bar = "#" * filled + "." * (width - filled)
        line = f"{self.label} [{bar}] {self.done}/{self.total} {what}"
        if self.tty:
            self.stream.write("\r" + line[:120].ljust(120))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> float:
        if self.tty:
            self.stream.write("\n")
        return time.perf_counter() - self.start


class Classroom:
    def __init__(self, course: Path, db_url: str | None = None, extra: list[str] | None = None,
                 log: Path | None = None):
        self.course = course.resolve()
        if not (self.course / "nbgrader_config.py").exists():
            raise SystemExit(f"error: {self.course} has no nbgrader_config.py: is it the course folder?")
        self.db_url = db_url
        self.extra = list(extra or [])
        if db_url:
            self.extra.append(f"--CourseDirectory.db_url={db_url}")
        self.log_path = log or self.course / "grading.log"
        self.quarantined: dict[tuple[str, str], list[str]] = {}

    # -- nbgrader ----------------------------------------------------------------------
    def nbgrader(self, *args: str, on_line=None) -> int:
        cmd = [sys.executable, "-m", "nbgrader", *args, *self.extra]
        with open(self.log_path, "a", encoding="utf-8") as log:
            log.write(f"\n$ nbgrader {' '.join(args)}\n")
            log.flush()
            proc = subprocess.Popen(cmd, cwd=self.course, env=nbgrader_env(), text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                if on_line:
                    on_line(line)
            return proc.wait()

    def _course_dir(self, trait: str, default: str) -> Path:
        """A CourseDirectory setting of this course's nbgrader_config.py, as a path."""
        from traitlets.config.loader import PyFileConfigLoader

        config = PyFileConfigLoader("nbgrader_config.py", path=str(self.course)).load_config()
        value = config.CourseDirectory.get(trait, default)
        return self.course / value

    def sandbox_config(self, mode: str | None, memory_mb: int | None,
                       expose: list[str] | None = None) -> "sandbox.SandboxConfig":
        """The kernels' sandbox as grading will set it up (nbgrader_config.py's settings,
        overridden by the command line); raises SandboxUnavailable where grading must not
        run (no sandbox and `bwrap` asked for, or no sandbox as root without consent)."""
        from traitlets.config.loader import PyFileConfigLoader

        config = PyFileConfigLoader("nbgrader_config.py", path=str(self.course)).load_config()
        settings = config.ResilientExecute
        mode = sandbox.resolve_mode(mode or settings.get("sandbox", "auto"))
        defaults = sandbox.SandboxConfig()
        return sandbox.SandboxConfig(
            mode=mode, memory_mb=memory_mb or settings.get("memory_mb", defaults.memory_mb),
            cpu_seconds=settings.get("cpu_seconds", defaults.cpu_seconds),
            max_processes=settings.get("max_processes", defaults.max_processes),
            file_mb=settings.get("file_mb", defaults.file_mb),
            tmpfs_mb=settings.get("tmpfs_mb", defaults.tmpfs_mb),
            hide=(str(self.course), *settings.get("hide", [])),
            expose=(*settings.get("expose", []), *(expose or [])))

    def source_dir(self) -> Path:
        return self._course_dir("source_directory", "source")

    def release_dir(self) -> Path:
        return self._course_dir("release_directory", "release")

    def assignments(self) -> list[str]:
        return layout.assignments(self.course)

    def students(self, assignment: str) -> list[str]:
        root = self.course / "submitted"
        if not root.is_dir():
            return []
        return sorted(p.name for p in root.iterdir() if (p / assignment).is_dir())

    def quarantine_links(self, assignment: str) -> None:
        """Move every symbolic link out of the submission folders of `assignment` (into
        quarantine/<student>/<assignment>/, as links): nbgrader's autograde copies what a link
        points to, as the grader, where the student's code could read it."""
        root = self.course / "submitted"
        for student in self.students(assignment):
            folder = root / student / assignment
            for dirpath, dirnames, filenames in os.walk(folder):
                for name in dirnames + filenames:
                    path = Path(dirpath) / name
                    if not path.is_symlink():
                        continue
                    target = os.readlink(path)
                    dest = self.course / "quarantine" / student / assignment / path.relative_to(folder)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    if dest.is_symlink() or dest.exists():
                        dest.unlink()
                    shutil.move(str(path), str(dest))
                    self.quarantined.setdefault((student, assignment), []).append(
                        f"symbolic link {path.relative_to(folder)} -> {target} moved to "
                        f"{dest.relative_to(self.course)} (not followed)")

    def grade(self, assignment: str, *, zip_collect: bool = False) -> None:
        if self.nbgrader("generate_assignment", assignment, "--force") != 0:
            raise SystemExit(f"error: nbgrader generate_assignment {assignment} failed; see {self.log_path}")
        if zip_collect:
            self.nbgrader("zip_collect", assignment, "--force")
        self.quarantine_links(assignment)
        students = self.students(assignment)
        progress = Progress(len(students), f"autograde {assignment}")
        pattern = re.compile(r"Sanitizing .*submitted[/\\]([^/\\]+)[/\\]" + re.escape(assignment))

        def on_line(line: str) -> None:
            match = pattern.search(line)
            if match:
                progress.step(match.group(1))

        self.nbgrader("autograde", assignment, "--force", on_line=on_line)
        seconds = progress.close()
        print(f"autograded {assignment}: {len(students)} submissions in {seconds:.0f} s "
              f"({60 * len(students) / max(seconds, 1e-9):.1f} per minute)", file=sys.stderr)
        self.nbgrader("generate_feedback", assignment, "--force")

    def export(self, csv_path: Path, results: dict[str, list[Result]] | None = None) -> None:
        """nbgrader's CSV, with a `flags` column: what the summary says needs a human look."""
        self.nbgrader("export", f"--to={csv_path}")
        if results is not None and csv_path.exists():
            add_flags_column(csv_path, results)

    # -- results -----------------------------------------------------------------------
    def results(self, assignment: str) -> list[Result]:
        from nbgrader.api import Gradebook, MissingEntry

        db_url = self.db_url or f"sqlite:///{self.course / 'gradebook.db'}"
        out = []
        with Gradebook(db_url) as gb:
            for student in self.students(assignment):
                result = Result(student, assignment)
                try:
                    sub = gb.find_submission_notebook(assignment, assignment, student)
                    graded_nb = notebooks.read(self.course / "autograded" / student / assignment / f"{assignment}.ipynb")
                except (MissingEntry, notebooks.NotebookError):
                    result.flags.append("NOT GRADED: nbgrader could not grade this submission (see grading.log)")
                    submitted = self.course / "submitted" / student / assignment / f"{assignment}.ipynb"
                    try:
                        notebooks.read(submitted)
                    except notebooks.NotebookError as exc:
                        result.flags.append(f"unreadable: {exc}")
                    out.append(result)
                    continue
                result.score, result.max_score = sub.score, sub.max_score
                if sub.needs_manual_grade:
                    result.flags.append("needs manual grading")
                seen = set()
                for cell in graded_nb.cells:
                    for output in cell.get("outputs", []):
                        if output.output_type == "error" and output.get("ename") in FLAG_ENAMES:
                            label = FLAG_ENAMES[output.ename]
                            gid = notebooks.grade_id(cell) or "an added cell"
                            if (label, gid) not in seen:
                                seen.add((label, gid))
                                result.flags.append(f"{label} in {gid}")
                result.flags.extend(self._cell_changes(student, assignment))
                result.flags.extend(self.quarantined.get((student, assignment), []))
                result.flags.extend(f"review: {finding}" for finding in review.review_notebook(graded_nb))
                feedback = self.course / "feedback" / student / assignment / f"{assignment}.html"
                if (self.course / "feedback").is_dir() and not feedback.exists():
                    result.flags.append("NO FEEDBACK: nbgrader wrote none for this submission (see grading.log)")
                out.append(result)
        return out

    def _cell_changes(self, student, assignment) -> list[str]:
        """Locked cells the student deleted or edited (nbgrader restored them for grading),
        found by comparing with the checksums nbgrader wrote into the release."""
        from nbgrader.utils import compute_checksum

        path = self.course / "submitted" / student / assignment / f"{assignment}.ipynb"
        release = self.release_dir() / assignment / f"{assignment}.ipynb"
        try:
            submitted = notebooks.read(path)
            released = notebooks.read(release)
        except notebooks.NotebookError:
            return []
        mine = {notebooks.grade_id(c): c for c in submitted.cells if notebooks.grade_id(c)}
        flags = []
        for cell in released.cells:
            name = notebooks.grade_id(cell)
            if not name or not notebooks.is_locked(cell):
                continue
            if name not in mine:
                flags.append(f"deleted {name} (restored)")
            elif compute_checksum(mine[name]) != notebooks.nbgrader_meta(cell).get("checksum"):
                flags.append(f"edited {name} (restored)")
        return flags


def add_flags_column(csv_path: Path, results: dict[str, list[Result]]) -> None:
    """Add (or refill) a `flags` column to nbgrader's exported CSV, one row per submission."""
    flags = {(r.assignment, r.student): "; ".join(r.flags) for rs in results.values() for r in rs}
    with open(csv_path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return
    fields = [k for k in rows[0] if k != "flags"] + ["flags"]
    for row in rows:
        row["flags"] = flags.get((row.get("assignment"), row.get("student_id")), row.get("flags", ""))
    with open(csv_path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def summary_table(results: dict[str, list[Result]]) -> str:
    assignments = list(results)
    students = sorted({r.student for rs in results.values() for r in rs})
    index = {(r.student, r.assignment): r for rs in results.values() for r in rs}
    width = max([len(s) for s in students] + [7])
    cols = {a: max(len(a), len("not graded")) for a in assignments}  # whole names: no truncation
    head = f"{'student':<{width}} " + " ".join(f"{a:>{cols[a]}}" for a in assignments) + "  flags"
    lines = [head, "-" * len(head)]
    for student in students:
        cells, flags = [], []
        for a in assignments:
            r = index.get((student, a))
            if r is None:
                cells.append(f"{'—':>{cols[a]}}")
                continue
            cells.append(f"{(f'{r.score:g}/{r.max_score:g}' if r.graded else 'not graded'):>{cols[a]}}")
            flags += [f"{a[:2]}: {f}" for f in r.flags]
        lines.append(f"{student:<{width}} " + " ".join(cells) + ("  " + "; ".join(flags) if flags else ""))
    review = sum(1 for rs in results.values() for r in rs if r.flags)
    lines.append(f"\n{review} submission(s) flagged for a human look.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 make.py grade-class", description=__doc__.splitlines()[0])
    parser.add_argument("assignments", nargs="*", help="default: every assignment in solutions/")
    parser.add_argument("--course", type=Path, default=layout.ROOT,
                        help="the course folder, holding nbgrader_config.py (default: this repository)")
    parser.add_argument("--zip", action="store_true", help="zip_collect from downloaded/<assignment>/archive first")
    parser.add_argument("--csv", type=Path, default=None, help="grades CSV (default: <course>/grades.csv)")
    parser.add_argument("--db-url", default=None, help="gradebook database, e.g. postgresql://user@host/db")
    parser.add_argument("--sandbox", choices=["auto", "bwrap", "off"], default=None,
                        help="kernel sandbox (default: nbgrader_config.py's, 'auto')")
    parser.add_argument("--unsandboxed-as-root", action="store_true",
                        help="allow grading as root without the sandbox (refused otherwise: "
                             "a submission would run with root's privileges)")
    parser.add_argument("--timeout", type=int, default=None, help="seconds per cell (default: config's)")
    parser.add_argument("--budget", type=int, default=None,
                        help="seconds per submission, all cells together (default: config's)")
    parser.add_argument("--no-tamper-checks", action="store_true",
                        help="for measurements only (benchmarks/grading_throughput.py): grade without "
                             "the tamper checks; a forged score then goes through")
    parser.add_argument("--memory-mb", type=int, default=None, help="kernel memory limit, MiB (default: config's)")
    parser.add_argument("--sandbox-expose", action="append", default=[], metavar="PATH",
                        help="a folder the sandboxed kernel may read besides the system folders, its "
                             "Python and its working folder (repeatable; nbgrader_config.py: "
                             "c.ResilientExecute.expose)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON")
    args = parser.parse_args(argv)

    extra = []
    if args.sandbox:
        extra.append(f"--ResilientExecute.sandbox={args.sandbox}")
    if args.timeout:
        extra.append(f"--ResilientExecute.timeout={args.timeout}")
    if args.budget:
        extra.append(f"--ResilientExecute.budget={args.budget}")
    if args.no_tamper_checks:
        extra.append("--ResilientExecute.tamper_checks=False")
    if args.memory_mb:
        extra.append(f"--ResilientExecute.memory_mb={args.memory_mb}")
    room = Classroom(args.course, db_url=args.db_url, extra=extra)
    for path in args.sandbox_expose:
        room.extra.append(f"--ResilientExecute.expose={Path(path).resolve()}")
    if args.unsandboxed_as_root:
        os.environ[sandbox.ALLOW_ROOT_ENV] = "1"  # nbgrader's ResilientExecute reads it too
    try:
        config = room.sandbox_config(args.sandbox, args.memory_mb,
                                     [str(Path(p).resolve()) for p in args.sandbox_expose])
    except sandbox.SandboxUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    isolation = sandbox.describe(config)
    print(isolation, file=sys.stderr)
    with open(room.log_path, "a", encoding="utf-8") as log:
        log.write(f"\n{isolation}\n")
    names = args.assignments or room.assignments()
    unknown = sorted(set(names) - set(room.assignments()))
    if unknown:
        print(f"error: no assignment {', '.join(unknown)} in {room.source_dir()}", file=sys.stderr)
        return 2
    # One kernel, started as grading will, before any submission: a layout the sandbox
    # cannot serve stops here with one message, not with a "not graded" row per student.
    from coursetools.grading import preflight
    try:
        seconds = preflight.check(config)
    except preflight.PreflightError as exc:
        print(f"error: {exc}", file=sys.stderr)
        with open(room.log_path, "a", encoding="utf-8") as log:
            log.write(f"error: {exc}\n")
        return 2
    print(f"preflight: a kernel started as grading will start it, and imported torch ({seconds:.1f} s)",
          file=sys.stderr)
    results = {}
    for name in names:
        room.grade(name, zip_collect=args.zip)
        results[name] = room.results(name)
    csv_path = (args.csv or room.course / "grades.csv").resolve()
    room.export(csv_path, results)
    print(summary_table(results))
    print(f"grades: {csv_path}   feedback: {room.course / 'feedback'}   log: {room.log_path}")
    if args.json:
        args.json.write_text(json.dumps(
            {a: [r.__dict__ for r in rs] for a, rs in results.items()}, indent=1))
    ungraded = [r for rs in results.values() for r in rs if not r.graded]
    return 1 if ungraded else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
