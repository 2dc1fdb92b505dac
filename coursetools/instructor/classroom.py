"""Grade a whole class with nbgrader, and say what happened to every submission.

    python3 make.py grade-class                       # every assignment, every student
    python3 make.py grade-class 01_device_basics --zip --csv grades.csv
    python3 make.py grade-class --jobs 4              # four submissions at once
    python3 make.py grade-class --scheduler tcp://head:8786   # on a Dask cluster

nbgrader does the work (its own converters, its gradebook); this is the glue it lacks:

1. `generate_assignment` (with the gradebook) for each assignment, into a release folder of
   the run's own: the course's release (exercises/, tracked in git) is never overwritten; where
   it differs from what the source generates now (an instructor's local edit), a note names
   the files;
2. with `--zip`: `zip_collect` from `downloaded/<assignment>/archive/` (files named
   `<student_id>__<notebook>.ipynb`, or zip files of them);
3. autograde of every submission in `submitted/<student>/<assignment>/`, with a progress
   bar, `--jobs` at once (default: the usable cores, one per 1.5 GiB of memory). Workers
   (processes of this machine, or Dask workers elsewhere: coursetools.instructor.engines)
   run nbgrader's autograde up to the course's execution step in a scratch course of their
   own (coursetools.instructor.gradejob: the sandbox, per-cell limits, crash recovery, tamper
   checks, hidden tests kept out of outputs); this process records each result into the
   one gradebook with nbgrader's own steps (coursetools.instructor.record) and writes that
   student's feedback. Only this process writes the gradebook;
4. `export` (CSV);
5. a summary table: each student's score per assignment, and what needs a human look —
   tampering, deleted or edited test cells (restored before grading), cells that crashed
   the kernel or timed out, cells Python could not compile (a SyntaxError: cell and line),
   submissions nbgrader could not grade at all, and the static
   review's findings (coursetools.grading.review: code no answer needs, with cell, line and
   construct; the score is not changed). The same flags go into the CSV's `flags` column;
6. the class report beside the CSV (coursetools.instructor.classreport: what the class
   misunderstood, per question; `--lang zh` for Chinese).

A long run survives interruption (coursetools.instructor.runguard): SIGINT, SIGTERM or
SIGHUP stop every process it started and keep every submission already recorded; a second
grade-class on the same course is refused while one runs; a re-run skips each submission
already graded from the same submitted files and the same assignment source (a ledger in the
gradebook's database), unless `--force`. A changed source regrades the whole assignment.

Symbolic links in a submission folder are moved to `quarantine/` before grading: nbgrader
copies what a link points to, as the grader, where the student's code could read it.

A broken submission never stops the others: the summary says why that one has no grade.
Exit status: 0 when every submission was graded and got its feedback page, 1 when any was not
graded or got no feedback page (its flag and a last line on stderr say why: nbgrader's own
error), 2 when grading could not start (or another grade-class holds the course), 128 + the
signal's number when stopped.
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
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from coursetools import layout, notebooks
from coursetools.grading import review, sandbox
from coursetools.grading.execute import BUDGET_ENAME
from coursetools.grading.guard import TAMPER_ENAME
from coursetools.author.nbgrader_course import nbgrader_env
from coursetools.instructor import engines, gradejob, runguard

FLAG_ENAMES = {
    TAMPER_ENAME: "tampering",
    BUDGET_ENAME: "time budget spent",
    "DeadKernelError": "kernel crash",
    "CellTimeoutError": "timeout",
    "NotExecuted": "cells never ran",
}


# The release grade-class generates (what the gradebook's checksums are of), in the course
# but apart from its own release folder (git-ignored; the release holds no hidden test)
RUN_RELEASE = ".grade-class-release"

# A cell Python could not compile: every test of what it should define then fails with a
# NameError, which reads like a wrong answer; the instructor looks at the cell instead.
COMPILE_ENAMES = ("SyntaxError", "IndentationError", "TabError")


def compile_flag(cell, output) -> str:
    """"does not compile: SyntaxError in match_loss_inputs, line 10: invalid syntax": the
    cell (its grade id, or "an added cell"), the line in that cell, and Python's message."""
    where = notebooks.grade_id(cell) or "an added cell"
    evalue = output.get("evalue", "")
    found = re.search(r"\((?:[^,()]*), line (\d+)\)\s*$", evalue)
    message = evalue[:found.start()].strip() if found else evalue.strip()
    line = f", line {found.group(1)}" if found else ""
    return f"does not compile: {output.get('ename')} in {where}{line}: {message[:200]}"


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

    @property
    def has_feedback(self) -> bool:
        return not any(flag.startswith(NO_FEEDBACK) for flag in self.flags)


NO_FEEDBACK = "NO FEEDBACK"  # the flag's prefix: a graded submission whose feedback page is missing


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


@dataclass
class Plan:
    """What a run does with one assignment's submissions."""
    assignment: str
    students: list[str]
    jobs: list[gradejob.Job] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # graded before from the same files and source
    source_changed: int = 0  # submissions graded before from another version of the source
    forced: bool = False


@dataclass
class RunLog:
    """What this run graded, and what it could not."""
    recorded: dict[str, list[str]] = field(default_factory=dict)  # assignment -> students
    failed: dict[str, list[str]] = field(default_factory=dict)    # nbgrader could not grade them
    lost: dict[tuple[str, str], str] = field(default_factory=dict)  # no worker could finish them
    seconds: float = 0.0
    recording_s: float = 0.0  # this process's share: the gradebook, graded notebook, feedback


class Classroom:
    def __init__(self, course: Path, db_url: str | None = None, settings: dict | None = None,
                 log: Path | None = None):
        self.course = course.resolve()
        if not (self.course / "nbgrader_config.py").exists():
            raise SystemExit(f"error: {self.course} has no nbgrader_config.py: is it the course folder?")
        self.db_url = db_url
        # Settings from the command line over nbgrader_config.py's: {"ResilientExecute": {...}}
        self.settings = settings or {}
        self.extra = [f"--CourseDirectory.db_url={db_url}"] if db_url else []
        self.log_path = log or self.course / "grading.log"
        self.lost: dict[tuple[str, str], str] = {}
        # (assignment, student) -> nbgrader's error where it graded a submission but wrote no
        # feedback page (the Recorder's; an older run's missing page is found by results())
        self.no_feedback: dict[tuple[str, str], str] = {}
        # Where grade-class's generate_assignment writes the release: the course's release
        # folder (exercises/, tracked in git) is the instructor's, and is left as it is. The
        # checks of a finished run (make.py class-report: restored cells) read it there too.
        self.release_override: Path | None = None
        if (self.course / RUN_RELEASE).is_dir():
            self.release_override = self.course / RUN_RELEASE

    @property
    def gradebook_url(self) -> str:
        return self.db_url or self.config().CourseDirectory.get(
            "db_url", f"sqlite:///{self.course / 'gradebook.db'}")

    # -- nbgrader ----------------------------------------------------------------------
    def nbgrader(self, *args: str, on_line=None) -> int:
        cmd = [sys.executable, "-m", "nbgrader", *args, *self.extra]
        with open(self.log_path, "a", encoding="utf-8") as log:
            log.write(f"\n$ nbgrader {' '.join(args)}\n")
            log.flush()
            proc = subprocess.Popen(cmd, cwd=self.course, env=nbgrader_env(), text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            runguard.spawned(proc.pid)
            try:
                assert proc.stdout is not None
                for line in proc.stdout:
                    log.write(line)
                    if on_line:
                        on_line(line)
                return proc.wait()
            finally:
                runguard.waited(proc.pid)

    def config(self):
        """The course's nbgrader configuration (nbgrader_config.py), with this run's
        settings over it: what nbgrader would use for `nbgrader autograde` here."""
        from traitlets.config.loader import PyFileConfigLoader

        config = PyFileConfigLoader("nbgrader_config.py", path=str(self.course)).load_config()
        root = config.CourseDirectory.get("root")
        if root and Path(root).resolve() != self.course:
            # nbgrader's own commands would grade there: say so rather than mix two courses
            raise SystemExit(f"error: {self.course / 'nbgrader_config.py'} sets CourseDirectory.root to "
                             f"{root}, not this folder: grade there (--course {root}) or fix the setting")
        config.CourseDirectory.root = str(self.course)
        if self.db_url:
            config.CourseDirectory.db_url = self.db_url
        for section, values in self.settings.items():
            for trait, value in values.items():
                if trait == "expose":
                    value = [*config[section].get("expose", []), *value]
                config[section][trait] = value
        return config

    def _course_dir(self, trait: str, default: str) -> Path:
        """A CourseDirectory setting of this course's nbgrader_config.py, as a path."""
        value = self.config().CourseDirectory.get(trait, default)
        return self.course / value

    def sandbox_config(self) -> "sandbox.SandboxConfig":
        """The kernels' sandbox as grading will set it up (nbgrader_config.py's settings,
        overridden by the command line); raises SandboxUnavailable where grading must not
        run (no sandbox and `bwrap` asked for, or no sandbox as root without consent)."""
        settings = self.config().ResilientExecute
        mode = sandbox.resolve_mode(settings.get("sandbox", "auto"))
        defaults = sandbox.SandboxConfig()
        return sandbox.SandboxConfig(
            mode=mode, memory_mb=settings.get("memory_mb", defaults.memory_mb),
            cpu_seconds=settings.get("cpu_seconds", defaults.cpu_seconds),
            max_processes=settings.get("max_processes", defaults.max_processes),
            file_mb=settings.get("file_mb", defaults.file_mb),
            tmpfs_mb=settings.get("tmpfs_mb", defaults.tmpfs_mb),
            hide=(str(self.course), *settings.get("hide", [])),
            expose=tuple(settings.get("expose", [])))

    def source_dir(self) -> Path:
        return self._course_dir("source_directory", "source")

    def release_dir(self) -> Path:
        return self.release_override or self.course_release_dir()

    def course_release_dir(self) -> Path:
        return self._course_dir("release_directory", "release")

    def generate(self, name: str) -> int:
        """nbgrader's generate_assignment of `name` into grade-class's own release folder
        (RUN_RELEASE), never over the course's (exercises/: an instructor's local edit stays)."""
        if self.release_override is None:
            raise RuntimeError("Classroom.generate: set release_override, the run's own release folder, first")
        return self.nbgrader("generate_assignment", name, "--force",
                             f"--CourseDirectory.release_directory={self.release_override}")

    def release_differences(self, name: str) -> list[str]:
        """The files of the course's release of `name` (exercises/NN) that differ from what its
        source generates now (missing, extra or changed), as paths relative to the course;
        [] when they are the same or the course has no release of it."""
        mine, generated = self.course_release_dir() / name, self.release_dir() / name
        if not mine.is_dir() or mine.resolve() == generated.resolve():
            return []

        def files(folder: Path) -> dict[str, bytes]:
            return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
                    if p.is_file() and "__pycache__" not in p.parts and ".ipynb_checkpoints" not in p.parts}
        a, b = files(mine), files(generated)
        return [str((mine / rel).relative_to(self.course)) for rel in sorted(set(a) | set(b)) if a.get(rel) != b.get(rel)]

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
        points to, as the grader, where the student's code could read it. The summary flags
        each from what quarantine/ holds, so a later run still shows it."""
        root = self.course / "submitted"
        for student in self.students(assignment):
            folder = root / student / assignment
            for dirpath, dirnames, filenames in os.walk(folder):
                for name in dirnames + filenames:
                    path = Path(dirpath) / name
                    if not path.is_symlink():
                        continue
                    dest = self.course / "quarantine" / student / assignment / path.relative_to(folder)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    if dest.is_symlink() or dest.exists():
                        dest.unlink()
                    shutil.move(str(path), str(dest))

    def quarantined(self, student: str, assignment: str) -> list[str]:
        folder = self.course / "quarantine" / student / assignment
        if not folder.is_dir():
            return []
        flags = []
        for path in sorted(folder.rglob("*")):
            if path.is_symlink():
                rel = path.relative_to(folder)
                flags.append(f"symbolic link {rel} -> {os.readlink(path)} moved to "
                             f"{path.relative_to(self.course)} (not followed)")
        return flags

    # -- a run ------------------------------------------------------------------------
    def plan(self, assignment: str, *, force: bool, ledger, config_bytes: bytes, code: str) -> Plan:
        """Which submissions of a registered assignment to grade: those not graded before
        from the same submitted files and the same source (all of them with `force`)."""
        from nbgrader.api import Gradebook

        students = self.students(assignment)
        plan = Plan(assignment, students, forced=force)
        source = gradejob.read_folder(self.source_dir() / assignment)
        source_digest = gradejob.files_digest(source)
        entries = ledger.entries(assignment)
        plan.source_changed = sum(1 for s, e in entries.items()
                                  if s in students and e.source_sha256 != source_digest)
        with Gradebook(self.gradebook_url) as gb:
            for student in students:  # in order, so that nbgrader's export lists them in order
                gb.update_or_create_student(student)
            for student in students:
                folder = self.course / "submitted" / student / assignment
                adopt_renamed(folder, assignment, self.release_dir() / assignment / f"{assignment}.ipynb")
                submission_digest = gradejob.files_digest(gradejob.read_folder(folder))
                entry = entries.get(student)
                done = (not force and entry is not None and entry.submission_sha256 == submission_digest
                        and entry.source_sha256 == source_digest and self._complete(gb, student, assignment))
                if done:
                    plan.skipped.append(student)
                    continue
                plan.jobs.append(gradejob.Job(assignment, student, folder, source, source_digest,
                                              submission_digest, code, config_bytes))
        return plan

    def _complete(self, gb, student: str, assignment: str) -> bool:
        """The gradebook holds this submission's grades, and its graded notebook and feedback exist."""
        from nbgrader.api import MissingEntry

        try:
            gb.find_submission(assignment, student)
        except MissingEntry:
            return False
        graded = self.course / "autograded" / student / assignment
        feedback = self.course / "feedback" / student / assignment
        return graded.is_dir() and any(graded.glob("*.ipynb")) and feedback.is_dir() and any(feedback.glob("*.html"))

    def grade(self, plans: list[Plan], engine, recorder, ledger, stop: runguard.StopSignals) -> RunLog:
        """Every job of `plans` through the engine; each result recorded as it comes."""
        from coursetools.instructor.record import LedgerEntry, now

        run = RunLog()
        jobs = [job for plan in plans for job in plan.jobs]
        if not jobs:
            return run
        label = "autograde " + (plans[0].assignment if len(plans) == 1 else f"{len(plans)} assignments")
        progress = Progress(len(jobs), label)
        recorded: set[tuple[str, str]] = set()
        for job, outcome in engine.run(jobs):
            where = (job.assignment, job.student)
            if where in recorded:  # a result that came twice (a worker lost after it finished)
                continue
            recorded.add(where)
            started = time.perf_counter()
            if isinstance(outcome, engines.Lost):
                run.lost[where] = outcome.reason
                self.lost[where] = outcome.reason
                shutil.rmtree(self.course / "autograded" / job.student / job.assignment, ignore_errors=True)
                ledger.forget(job.assignment, job.student)
                run.failed.setdefault(job.assignment, []).append(job.student)
            elif recorder.record(outcome):
                ledger.put(job.assignment, job.student, LedgerEntry(
                    job.submission_digest, job.source_digest, now(), outcome.worker))
                run.recorded.setdefault(job.assignment, []).append(job.student)
            else:
                ledger.forget(job.assignment, job.student)
                run.failed.setdefault(job.assignment, []).append(job.student)
            run.recording_s += time.perf_counter() - started
            progress.step(f"{job.student} ({job.assignment})")
            if stop.requested:
                break
        self.no_feedback.update(getattr(recorder, "feedback_errors", {}))
        run.seconds = progress.close()
        return run

    def export(self, csv_path: Path, results: dict[str, list[Result]] | None = None) -> None:
        """nbgrader's CSV, with a `flags` column: what the summary says needs a human look."""
        self.nbgrader("export", f"--to={csv_path}")
        if results is not None and csv_path.exists():
            add_flags_column(csv_path, results)

    # -- results -----------------------------------------------------------------------
    def results(self, assignment: str) -> list[Result]:
        from nbgrader.api import Gradebook, MissingEntry

        out = []
        with Gradebook(self.gradebook_url) as gb:
            for student in self.students(assignment):
                result = Result(student, assignment)
                try:
                    sub = gb.find_submission_notebook(assignment, assignment, student)
                    graded_nb = notebooks.read(self.course / "autograded" / student / assignment / f"{assignment}.ipynb")
                except (MissingEntry, notebooks.NotebookError):
                    lost = self.lost.get((assignment, student))
                    result.flags.append(f"NOT GRADED: {lost}" if lost else
                                        "NOT GRADED: nbgrader could not grade this submission (see grading.log)")
                    problem = submission_problem(self.course / "submitted" / student / assignment, assignment)
                    if problem:
                        result.flags.append(problem)
                    out.append(result)
                    continue
                result.score, result.max_score = sub.score, sub.max_score
                if sub.needs_manual_grade:
                    result.flags.append("needs manual grading")
                seen = set()
                for cell in graded_nb.cells:
                    for output in cell.get("outputs", []):
                        if output.output_type == "error" and output.get("ename") in COMPILE_ENAMES:
                            result.flags.append(compile_flag(cell, output))
                        if output.output_type == "error" and output.get("ename") in FLAG_ENAMES:
                            label = FLAG_ENAMES[output.ename]
                            gid = notebooks.grade_id(cell) or "an added cell"
                            if (label, gid) not in seen:
                                seen.add((label, gid))
                                result.flags.append(f"{label} in {gid}")
                renamed = renamed_from(self.course / "submitted" / student / assignment, assignment)
                if renamed:
                    result.flags.append(f"graded {renamed!r} as {assignment}.ipynb (the student's file had "
                                        "another name)")
                result.flags.extend(self._cell_changes(student, assignment))
                result.flags.extend(self.quarantined(student, assignment))
                result.flags.extend(f"review: {finding}" for finding in review.review_notebook(graded_nb))
                feedback = self.course / "feedback" / student / assignment / f"{assignment}.html"
                if not feedback.exists():
                    why = self.no_feedback.get((assignment, student))
                    result.flags.append(f"{NO_FEEDBACK}: nbgrader's generate_feedback failed: {why} (grading.log)"
                                        if why else f"{NO_FEEDBACK}: nbgrader wrote none for this submission "
                                        "(see grading.log)")
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
        chinese = chinese_release_checksums(assignment)
        flags = []
        for cell in released.cells:
            name = notebooks.grade_id(cell)
            if not name or not notebooks.is_locked(cell):
                continue
            if name not in mine:
                flags.append(f"deleted {name} (restored)")
                continue
            elif compute_checksum(mine[name]) not in {notebooks.nbgrader_meta(cell).get("checksum"), chinese.get(name)}:
                flags.append(f"edited {name} (restored)")
        # An answer cell the student deleted: nbgrader_ext.RestoreDeletedAnswers put it back empty.
        for cell in released.cells:
            name = notebooks.grade_id(cell)
            meta = notebooks.nbgrader_meta(cell)
            if name and meta.get("solution") and not meta.get("grade") and name not in mine:
                flags.append(f"deleted answer cell {name} (restored empty: graded as unanswered)")
        return flags


def chinese_release_checksums(assignment: str, root: Path = layout.ROOT) -> dict[str, str]:
    """grade id -> checksum of each locked cell of the Chinese edition's release (zh/exercises/):
    its test messages, comments and setup line are Chinese (coursetools/publish/i18n/build.py),
    so a Chinese submission's untouched locked cell has that checksum, not the English one.
    nbgrader grades the English cell either way (it restores every locked cell)."""
    path = root / "zh" / layout.release_notebook(assignment, root).relative_to(root)
    try:
        nb = notebooks.read(path)
    except notebooks.NotebookError:
        return {}
    return {notebooks.grade_id(c): notebooks.nbgrader_meta(c).get("checksum")
            for c in nb.cells if notebooks.grade_id(c) and notebooks.is_locked(c)}


def _notebooks_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.ipynb") if p.is_file() and not p.is_symlink())


def adopt_renamed(folder: Path, assignment: str, release: Path) -> str | None:
    """A submission whose notebook has another name ("01_device_basics (1).ipynb", a browser's
    download of the same file) is graded under its expected name: when the folder has no
    `<assignment>.ipynb` and exactly one other notebook, which holds this assignment's cells
    (a grade id of the release), a copy of it is put under the expected name (the student's
    file stays). Returns the adopted file's name, or None."""
    expected = folder / f"{assignment}.ipynb"
    if expected.exists() or expected.is_symlink():
        return None
    candidates = _notebooks_in(folder)
    if len(candidates) != 1:
        return None
    try:
        nb = notebooks.read(candidates[0])
        ids = {notebooks.grade_id(c) for c in notebooks.read(release).cells} - {None}
    except notebooks.NotebookError:
        return None
    if not ids & {notebooks.grade_id(c) for c in nb.cells}:
        return None
    shutil.copyfile(candidates[0], expected)
    return candidates[0].name


def renamed_from(folder: Path, assignment: str) -> str | None:
    """The student's file `adopt_renamed` graded under the expected name (the same bytes), if any."""
    expected = folder / f"{assignment}.ipynb"
    if not expected.is_file():
        return None
    data = expected.read_bytes()
    return next((p.name for p in _notebooks_in(folder) if p != expected and p.read_bytes() == data), None)


def submission_problem(folder: Path, assignment: str) -> str | None:
    """Why a submission's notebook cannot be graded, said to the instructor (what is there,
    what to do), or None when the file reads as a notebook."""
    expected = folder / f"{assignment}.ipynb"
    if not expected.exists():
        others = [p.name for p in _notebooks_in(folder)]
        if not others:
            return (f"the submission holds no notebook (no {expected.name}); ask the student to submit "
                    "it again")
        names = ", ".join(repr(n) for n in others)
        return (f"no {expected.name} in the submission; found {names}: rename the one to grade to "
                f"{expected.name} (in {folder}) and run grade-class again")
    try:
        notebooks.read(expected)
    except notebooks.NotebookError as exc:
        detail = str(exc).replace(str(expected), expected.name)
        detail = detail.replace("; was it saved completely? Re-download it or restore it from git", "")
        return (f"unreadable: {detail}. The file was cut off or edited outside Jupyter; ask the student "
                "to submit it again (grade-class then grades the new file)")
    return None


# grades.csv's `status`: what a row's score means (an upload can filter on it).
STATUS_GRADED, STATUS_MANUAL, STATUS_NOT_GRADED, STATUS_NOT_SUBMITTED = (
    "graded", "needs manual grading", "not graded", "not submitted")
SCORE_COLUMNS = ("raw_score", "score")


def status_of(result: Result | None) -> str:
    if result is None:
        return STATUS_NOT_SUBMITTED
    if not result.graded:
        return STATUS_NOT_GRADED
    return STATUS_MANUAL if "needs manual grading" in result.flags else STATUS_GRADED


def add_flags_column(csv_path: Path, results: dict[str, list[Result]]) -> None:
    """Add (or refill) the `status` and `flags` columns of nbgrader's exported CSV, one row
    per submission. nbgrader exports 0.0 for a submission it could not grade, the score a
    correct student whose file could not be read would then get in an LMS: such a row's
    scores are left empty, and its status says "not graded" (Formgrader shows the same
    submission as "needs autograding"). A student without a submission keeps nbgrader's 0,
    with status "not submitted"."""
    by_key = {(r.assignment, r.student): r for rs in results.values() for r in rs}
    with open(csv_path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        return
    fields = [k for k in rows[0] if k not in ("status", "flags")] + ["status", "flags"]
    # nbgrader lists students in the database's order, which differs between runs and
    # servers: by assignment (nbgrader's order), then student id.
    order = {name: i for i, name in enumerate(dict.fromkeys(r.get("assignment") for r in rows))}
    rows.sort(key=lambda r: (order[r.get("assignment")], r.get("student_id") or ""))
    for row in rows:
        result = by_key.get((row.get("assignment"), row.get("student_id")))
        row["status"] = status_of(result)
        row["flags"] = "; ".join(result.flags) if result else row.get("flags", "")
        if row["status"] == STATUS_NOT_GRADED:
            for column in SCORE_COLUMNS:
                if column in row:
                    row[column] = ""
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


def _names(students: list[str], limit: int = 8) -> str:
    shown = ", ".join(students[:limit])
    return shown + (f" and {len(students) - limit} more" if len(students) > limit else "")


def grading_report(plans: list[Plan], run: RunLog, jobs_label: str) -> list[str]:
    """One line per assignment: what this run graded, skipped, and why."""
    lines = []
    for plan in plans:
        done = len(run.recorded.get(plan.assignment, []))
        failed = len(run.failed.get(plan.assignment, []))
        line = f"{plan.assignment}: {len(plan.students)} submission(s): {done} graded now"
        if failed:
            line += f", {failed} could not be graded"
        if plan.skipped:
            line += (f", {len(plan.skipped)} skipped (graded before from the same submitted files and "
                     "the same source; --force grades them again)")
        if plan.forced:
            line += ", all graded again (--force)"
        elif plan.source_changed:
            line += (f"; the assignment's source changed since {plan.source_changed} of them were graded, "
                     "so every submission was graded again")
        lines.append(line)
    graded = sum(len(v) for v in run.recorded.values()) + sum(len(v) for v in run.failed.values())
    if graded:
        lines.append(f"worked on {graded} submission(s) in {run.seconds:.0f} s "
                     f"({60 * graded / max(run.seconds, 1e-9):.1f} per minute, {jobs_label}); "
                     f"recording {run.recording_s / graded:.2f} s per submission")
    return lines


def stopped_report(stop: runguard.StopSignals, plans: list[Plan], run: RunLog | None,
                   killed: int) -> str:
    lines = [f"grade-class stopped by {stop.name}: {killed} process(es) it had started were stopped "
             "(workers, nbgrader, kernels, sandboxes)."]
    for plan in plans:
        recorded = (run.recorded.get(plan.assignment, []) if run else [])
        failed = (run.failed.get(plan.assignment, []) if run else [])
        finished = set(recorded) | set(failed) | set(plan.skipped)
        rest = [s for s in plan.students if s not in finished]
        lines.append(f"  {plan.assignment}: {len(recorded)} graded and recorded in this run"
                     + (f" ({_names(recorded)})" if recorded else "")
                     + (f", {len(failed)} could not be graded" if failed else "")
                     + (f", {len(plan.skipped)} graded before" if plan.skipped else "")
                     + f"; {len(rest)} not graded yet" + (f" ({_names(rest)})" if rest else ""))
    lines.append("Every recorded submission is complete in the gradebook (grades, graded notebook, "
                 "feedback); grades.csv was not exported. Run grade-class again: it grades only the rest.")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python3 make.py grade-class", description=__doc__.splitlines()[0])
    parser.add_argument("assignments", nargs="*", help="default: every assignment in solutions/")
    parser.add_argument("--course", type=Path, default=layout.ROOT,
                        help="the course folder, holding nbgrader_config.py (default: this repository)")
    parser.add_argument("--zip", action="store_true", help="zip_collect from downloaded/<assignment>/archive first")
    parser.add_argument("--csv", type=Path, default=None, help="grades CSV (default: <course>/grades.csv)")
    parser.add_argument("--db-url", default=None, help="gradebook database, e.g. postgresql://user@host/db")
    parser.add_argument("--jobs", "-j", type=int, default=None,
                        help=f"submissions graded at once on this machine (default: the usable cores, "
                             f"at most one per 1.5 GiB of memory: {engines.default_jobs()} here); with "
                             "--scheduler local, the number of Dask workers")
    parser.add_argument("--scheduler", default=None, metavar="ADDRESS",
                        help="grade on a Dask distributed cluster (e.g. tcp://head:8786; 'local' starts "
                             "a Dask LocalCluster of --jobs workers here). Workers need this course's "
                             "checkout and environment; see docs/INSTRUCTORS.md, 'Grading a big class'")
    parser.add_argument("--force", action="store_true",
                        help="grade every submission again, also those graded before from the same "
                             "submitted files and the same source")
    parser.add_argument("--sandbox", choices=["auto", "bwrap", "off"], default=None,
                        help="kernel sandbox (default: nbgrader_config.py's, 'auto')")
    parser.add_argument("--unsandboxed-as-root", action="store_true",
                        help="allow grading as root without the sandbox (refused otherwise: "
                             "a submission would run with root's privileges)")
    parser.add_argument("--timeout", type=int, default=None, help="seconds per cell (default: config's)")
    parser.add_argument("--budget", type=int, default=None,
                        help="seconds per submission, all cells together (default: config's)")
    parser.add_argument("--no-tamper-checks", action="store_true",
                        help="for measurements only (benchmarks/grading_throughput.py): run the test "
                             "cells in the kernel, as before issue 32; a forged score then goes through")
    parser.add_argument("--memory-mb", type=int, default=None, help="kernel memory limit, MiB (default: config's)")
    parser.add_argument("--sandbox-expose", action="append", default=[], metavar="PATH",
                        help="a folder the sandboxed kernel may read besides the system folders, its "
                             "Python and its working folder (repeatable; nbgrader_config.py: "
                             "c.ResilientExecute.expose)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results as JSON")
    parser.add_argument("--lang", choices=("en", "zh"), default="en",
                        help="the class report's language (it goes beside the CSV: grades-report.html, "
                             "or grades-report.zh.html, and grades-report.json; `make.py class-report` "
                             "writes it again for a finished run)")
    return parser


def settings_from(args) -> dict:
    """The command line's settings for the course's ResilientExecute."""
    settings = {}
    if args.sandbox:
        settings["sandbox"] = args.sandbox
    if args.timeout:
        settings["timeout"] = args.timeout
    if args.budget:
        settings["budget"] = args.budget
    if args.no_tamper_checks:
        settings["tamper_checks"] = False
    if args.memory_mb:
        settings["memory_mb"] = args.memory_mb
    if args.sandbox_expose:
        settings["expose"] = [str(Path(p).resolve()) for p in args.sandbox_expose]
    return {"ResilientExecute": settings} if settings else {}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.unsandboxed_as_root:
        os.environ[sandbox.ALLOW_ROOT_ENV] = "1"  # the workers' ResilientExecute reads it too
    if args.jobs is not None and args.jobs < 1:
        print("error: --jobs must be 1 or more", file=sys.stderr)
        return 2
    room = Classroom(args.course, db_url=args.db_url, settings=settings_from(args))
    config = None
    if args.scheduler in (None, "local"):
        # The sandbox first: grading as root without it is refused whatever else is wrong.
        try:
            config = room.sandbox_config()
        except sandbox.SandboxUnavailable as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        isolation = sandbox.describe(config)
        print(isolation, file=sys.stderr)
    names = args.assignments or room.assignments()
    unknown = sorted(set(names) - set(room.assignments()))
    if unknown:
        print(f"error: no assignment {', '.join(unknown)} in {room.source_dir()}", file=sys.stderr)
        return 2
    lock = runguard.CourseLock(room.course)
    try:
        lock.acquire(" ".join(["grade-class", *argv]))
    except runguard.LockHeld as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        if lock.took_over:
            print(f"note: took over the lock of a grade-class that is no longer running "
                  f"(pid {lock.took_over.get('pid')} on {lock.took_over.get('host')}, started "
                  f"{lock.took_over.get('started')}): a re-run grades what it left", file=sys.stderr)
        if config is not None:
            _log(room, isolation)
        # The workers' scratch (a gradebook per assignment holding its source, hidden tests
        # included) goes in one folder of this run's, removed when the run ends, however it
        # ends: a signal is turned into a clean stop (runguard.StopSignals), and a worker
        # killed outright leaves its files here too (gradejob.SCRATCH_ENV).
        scratch = tempfile.mkdtemp(prefix="grade-class-run-")
        os.environ[gradejob.SCRATCH_ENV] = scratch
        try:
            return _run(room, args, names, config)
        finally:
            os.environ.pop(gradejob.SCRATCH_ENV, None)
            shutil.rmtree(scratch, ignore_errors=True)
    finally:
        lock.release()


def _log(room: Classroom, text: str) -> None:
    with open(room.log_path, "a", encoding="utf-8") as log:
        log.write(f"\n{text}\n")


def _run(room: Classroom, args, names: list[str], config) -> int:
    import pickle

    # nbgrader's own autograde says this on every submission it records (SQLAlchemy's
    # autoflush inside its gradebook); the nbgrader command wrote it to its log only.
    warnings.filterwarnings("ignore", message=".*not in session.*")

    from coursetools.grading import preflight
    from coursetools.instructor.record import Ledger, Recorder

    # Orphans below this process (a kernel whose worker was killed) come back here, so that
    # a stop finds them. Not with Dask's LocalCluster, whose processes Dask itself manages.
    if args.scheduler != "local":
        runguard.become_subreaper()
    state: dict = {"engine": None, "killed": 0}

    def on_stop() -> None:
        if state["engine"] is not None:
            state["engine"].stop()
        state["killed"] += len(runguard.stop_descendants())

    plans: list[Plan] = []
    run: RunLog | None = None
    with runguard.StopSignals(on_stop) as stop:
        remote = args.scheduler not in (None, "local")
        if remote:
            print(f"grading on the Dask cluster at {args.scheduler}: each worker checks its own sandbox "
                  "before its first submission", file=sys.stderr)
        else:
            # One kernel, started as grading will, before any submission: a layout the sandbox
            # cannot serve stops here with one message, not with a "not graded" row per student.
            # The workers started below inherit the result (preflight.PREFLIGHT_ENV).
            try:
                seconds = preflight.check(config)
            except preflight.PreflightError as exc:
                print(f"error: {exc}", file=sys.stderr)
                _log(room, f"error: {exc}")
                return 2
            print(f"preflight: a kernel started as grading will start it, and imported torch ({seconds:.1f} s)",
                  file=sys.stderr)
        if stop.requested:
            print(stopped_report(stop, plans, run, state["killed"]), file=sys.stderr)
            return stop.exit_status
        course_config = room.config()
        config_bytes = pickle.dumps(course_config)
        code = gradejob.code_digest()
        try:
            room.release_override = room.course / RUN_RELEASE
            for name in names:  # registers each assignment (the gradebook exists after the first)
                if room.generate(name) != 0:
                    print(f"error: nbgrader generate_assignment {name} failed; see {room.log_path}", file=sys.stderr)
                    return 2
                differs = room.release_differences(name)
                if differs:
                    note = (f"note: {', '.join(differs[:5])}" + (f" and {len(differs) - 5} more" if len(differs) > 5 else "")
                            + f" differ(s) from what {room.source_dir().name}/{name} generates now: grade-class "
                            "left them as they are and graded against the release generated from the source "
                            "(`python3 make.py release` updates them, overwriting your edits)")
                    print(note, file=sys.stderr)
                    _log(room, note)
                if args.zip:
                    room.nbgrader("zip_collect", name, "--force")
                room.quarantine_links(name)
                if stop.requested:
                    print(stopped_report(stop, plans, run, state["killed"]), file=sys.stderr)
                    return stop.exit_status
            ledger = Ledger(room.gradebook_url)
            for name in names:
                plans.append(room.plan(name, force=args.force, ledger=ledger, config_bytes=config_bytes,
                                       code=code))
        except RuntimeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        jobs = args.jobs or engines.default_jobs()
        total = sum(len(p.jobs) for p in plans)
        if args.scheduler:
            jobs_label = f"Dask cluster {args.scheduler}"
            engine = engines.DaskEngine(args.scheduler, jobs, room.log_path)
        else:
            jobs_label = f"{min(jobs, max(total, 1))} job(s)"
            engine = engines.LocalEngine(jobs, config_bytes, room.log_path)
        state["engine"] = engine
        recorder = Recorder(course_config, room.log_path)
        try:
            run = room.grade(plans, engine, recorder, ledger, stop)
        except engines.EngineFatal as exc:
            if not stop.requested:
                print(f"error: grading cannot go on: {exc}", file=sys.stderr)
                _log(room, f"error: {exc}")
                return 2
        finally:
            for said in getattr(engine, "ready", []):
                _log(room, said)
            ledger.close()
        if stop.requested:
            report = stopped_report(stop, plans, run, state["killed"])
            print(report)  # once, where the summary goes (it was on stderr too: twice on a terminal)
            _log(room, report)
            return stop.exit_status
    results = {plan.assignment: room.results(plan.assignment) for plan in plans}
    csv_path = (args.csv or room.course / "grades.csv").resolve()
    room.export(csv_path, results)
    print(summary_table(results))
    report = grading_report(plans, run or RunLog(), jobs_label)
    if getattr(engine, "restarts", 0):  # LocalEngine's; Dask reschedules on its own
        report.append(f"{engine.restarts} worker process(es) died while grading (killed, out of memory) and "
                      f"were replaced; each submission one held was graded again, up to "
                      f"{engines.MAX_ATTEMPTS} times")
    print("\n".join(report))
    _log(room, "\n".join(report))
    from coursetools.instructor import classreport
    report_html, report_json = classreport.write(room, results, csv_path, args.lang)
    print(f"grades: {csv_path}   feedback: {room.course / 'feedback'}   log: {room.log_path}")
    print(f"class report: {report_html}   data: {report_json}")
    if args.json:
        args.json.write_text(json.dumps(
            {a: [r.__dict__ for r in rs] for a, rs in results.items()}, indent=1))
    every = [r for rs in results.values() for r in rs]
    ungraded = [r for r in every if not r.graded]
    without = [r for r in every if r.graded and not r.has_feedback]
    if without:
        # A script running grade-class (a hub's cron job, a CI job) must notice: the grades are in
        # grades.csv, but no student can read why (a broken HTML export wrote no page).
        causes = sorted({f.split(": ", 1)[1] for r in without for f in r.flags if f.startswith(NO_FEEDBACK)})
        message = (f"error: {len(without)} of {len(every)} graded submission(s) got no feedback page; "
                   f"run grade-class again once the cause is fixed (it regrades only those). "
                   f"Cause: {causes[0]}" + (f" (and {len(causes) - 1} other)" if len(causes) > 1 else ""))
        print(message, file=sys.stderr)
        _log(room, message)
    # The exit status (docs/INSTRUCTORS.md, "Exit status"): 0 every submission graded with its
    # feedback page; 1 some were not graded or got no feedback page; 2 nothing graded (set-up).
    return 1 if ungraded or without else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
