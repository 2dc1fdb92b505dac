"""The coordinator's half of autograding: a worker's result into the one gradebook.

For each submission a worker graded (coursetools.instructor.gradejob), `Recorder.record` runs
nbgrader's own `Autograde` in this process on the instructor's course, with the course's
execution step (`ResilientExecute`) replaced by `ReplayExecute`, which hands back the
notebook the worker executed. Everything else is nbgrader's usual work: the student and
submission rows, timestamps, locked cells restored from the gradebook, the grades and
comments (`SaveAutoGrades`), late penalties, the files in `autograded/`. Then that student's
feedback: the page the worker made with nbgrader's `GenerateFeedback` in its scratch course
when nothing here differs from it (the same graded notebook; no manual grade, comment or
extra credit, no late penalty in this gradebook), otherwise nbgrader's `GenerateFeedback`
here. Last, the ledger (`Ledger`) notes what was graded from what, so that a later run can
skip it (resume).

Only this process writes to the gradebook, one submission after another: no two writers
meet (SQLite's "database is locked"), and a result that arrives twice is recorded once.
"""

from __future__ import annotations

import datetime
import hashlib
import io
import logging
import pickle
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets.config import Config

from coursetools.instructor.gradejob import Outcome

LEDGER_TABLE = "course_grade_class_ledger"
_REPLAY: dict[tuple[str, str, str], str] = {}
_REPLAY_LOCK = threading.Lock()


class ReplayMismatch(RuntimeError):
    """The worker's notebook is not the notebook nbgrader prepared here."""


class ReplayExecute(NbGraderPreprocessor):
    """Stands where `ResilientExecute` stands in nbgrader's autograde steps and returns the
    notebook a worker executed for this submission (its cells must be the ones nbgrader
    prepared here: same types, same sources)."""

    def preprocess(self, nb, resources):
        info = resources["nbgrader"]
        key = (info["assignment"], info["student"], info["notebook"])
        with _REPLAY_LOCK:
            text = _REPLAY.get(key)
        if text is None:
            raise ReplayMismatch(f"no executed notebook came back for {key[1]}'s {key[2]}")
        executed = nbformat.reads(text, as_version=4)
        mine = [(c.cell_type, c.source) for c in nb.cells]
        theirs = [(c.cell_type, c.source) for c in executed.cells]
        if mine != theirs:
            raise ReplayMismatch(f"the notebook executed for {key[1]}'s {key[2]} has other cells than "
                                 "the one prepared here (a worker with another course version?)")
        return executed, resources


@dataclass
class LedgerEntry:
    submission_sha256: str
    source_sha256: str
    graded_at: str
    worker: str


class Ledger:
    """What each recorded submission was graded from: the submission folder's checksum and
    the assignment source's, in a table of the gradebook's own database (so the gradebook,
    SQLite or PostgreSQL, stays the one source of truth). nbgrader ignores the table."""

    def __init__(self, db_url: str):
        from sqlalchemy import create_engine, text

        self.engine = create_engine(db_url, future=True)
        with self.engine.begin() as conn:
            conn.execute(text(
                f"CREATE TABLE IF NOT EXISTS {LEDGER_TABLE} (assignment VARCHAR(128) NOT NULL, "
                "student VARCHAR(128) NOT NULL, submission_sha256 VARCHAR(64) NOT NULL, "
                "source_sha256 VARCHAR(64) NOT NULL, graded_at VARCHAR(40) NOT NULL, "
                "worker VARCHAR(256) NOT NULL, PRIMARY KEY (assignment, student))"))

    def entries(self, assignment: str) -> dict[str, LedgerEntry]:
        from sqlalchemy import text

        with self.engine.connect() as conn:
            rows = conn.execute(text(
                f"SELECT student, submission_sha256, source_sha256, graded_at, worker FROM {LEDGER_TABLE} "
                "WHERE assignment = :a"), {"a": assignment}).all()
        return {r[0]: LedgerEntry(*r[1:]) for r in rows}

    def put(self, assignment: str, student: str, entry: LedgerEntry) -> None:
        from sqlalchemy import text

        with self.engine.begin() as conn:
            conn.execute(text(f"DELETE FROM {LEDGER_TABLE} WHERE assignment = :a AND student = :s"),
                         {"a": assignment, "s": student})
            conn.execute(text(
                f"INSERT INTO {LEDGER_TABLE} (assignment, student, submission_sha256, source_sha256, "
                "graded_at, worker) VALUES (:a, :s, :sub, :src, :at, :w)"),
                {"a": assignment, "s": student, "sub": entry.submission_sha256,
                 "src": entry.source_sha256, "at": entry.graded_at, "w": entry.worker})

    def forget(self, assignment: str, student: str) -> None:
        from sqlalchemy import text

        with self.engine.begin() as conn:
            conn.execute(text(f"DELETE FROM {LEDGER_TABLE} WHERE assignment = :a AND student = :s"),
                         {"a": assignment, "s": student})

    def close(self) -> None:
        self.engine.dispose()


def _capture(app) -> tuple[bool, str]:
    """Run an nbgrader converter in this process; (success, its log at INFO level)."""
    from nbgrader.utils import capture_log

    logger = app.log
    level, propagate = logger.level, logger.propagate
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        result = capture_log(app)
    finally:
        logger.setLevel(level)
        logger.propagate = propagate
    log = result.get("log", "")
    if not result["success"]:
        log += "\n" + result.get("error", "")
    return bool(result["success"]), log


class Recorder:
    """Records workers' results into the course's gradebook with nbgrader's own converters."""

    def __init__(self, config: Config, log_path: Path):
        from coursetools.instructor.nbgrader_ext import ResilientExecute

        self.config = Config(config)
        steps = list(self.config.Autograde.get("autograde_preprocessors", []))
        if ResilientExecute not in steps:
            raise RuntimeError("nbgrader_config.py's Autograde.autograde_preprocessors has no ResilientExecute: "
                               "grade-class replaces that step with the workers' results")
        self.config.Autograde.autograde_preprocessors = [
            ReplayExecute if step is ResilientExecute else step for step in steps]
        self.config.Autograde.pre_convert_hook = None  # the workers ran the preflight
        self.log_path = log_path
        self.feedback_from_workers = 0
        # (assignment, student) -> why nbgrader's generate_feedback wrote no page (its own error)
        self.feedback_errors: dict[tuple[str, str], str] = {}

    def _folder(self, kind: str, outcome: Outcome) -> Path:
        return Path(self.config.CourseDirectory.root) / kind / outcome.student / outcome.assignment

    def _worker_feedback_holds(self, outcome: Outcome) -> bool:
        """The worker's feedback is what nbgrader's generate_feedback would write here when the
        graded notebooks are the same and the gradebook holds nothing the worker's did not:
        no manual score, comment or extra credit, no late penalty."""
        from nbgrader.api import Gradebook, MissingEntry
        from nbgrader.coursedir import CourseDirectory

        if not outcome.feedback or set(outcome.feedback) != set(outcome.graded):
            return False
        for nb_id, text in outcome.graded.items():
            path = self._folder("autograded", outcome) / f"{nb_id}.ipynb"
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                return False
        coursedir = CourseDirectory(config=self.config)
        with Gradebook(coursedir.db_url, coursedir.course_id) as gb:
            try:
                submission = gb.find_submission(outcome.assignment, outcome.student)
            except MissingEntry:
                return False
            for nb in submission.notebooks:
                if nb.late_submission_penalty:
                    return False
                if any(g.manual_score is not None or g.extra_credit for g in nb.grades):
                    return False
                if any(c.manual_comment for c in nb.comments):
                    return False
        return True

    def _write_feedback(self, outcome: Outcome) -> None:
        """As nbgrader's generate_feedback --force: a fresh folder with the graded folder's
        other files and one HTML page per notebook, readable by all (644)."""
        import os
        import shutil

        graded, dest = self._folder("autograded", outcome), self._folder("feedback", outcome)
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        for path in sorted(graded.rglob("*")):
            if path.is_file() and path.suffix != ".ipynb":
                target = dest / path.relative_to(graded)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, target)
        for nb_id, html in outcome.feedback.items():
            (dest / f"{nb_id}.html").write_text(html, encoding="utf-8")
        for dirpath, _, filenames in os.walk(dest):
            for name in filenames:
                os.chmod(os.path.join(dirpath, name), 0o644)

    def _write_log(self, header: str, text: str) -> None:
        with open(self.log_path, "a", encoding="utf-8") as log:
            log.write(f"\n{header}\n{text.rstrip()}\n")

    def record(self, outcome: Outcome) -> bool:
        """nbgrader's autograde of this submission with the worker's execution, then its
        feedback. Returns whether nbgrader graded it (False: the summary says 'not graded')."""
        from nbgrader.converters import Autograde
        from nbgrader.coursedir import CourseDirectory

        self._write_log(f"$ autograde {outcome.assignment} {outcome.student} (worker {outcome.worker}, "
                        f"{outcome.seconds:.1f} s)", outcome.log + ("\n" + outcome.error if outcome.error else ""))
        keys = [(outcome.assignment, outcome.student, nb_id) for nb_id in outcome.executed]
        with _REPLAY_LOCK:
            for key, nb_id in zip(keys, outcome.executed):
                _REPLAY[key] = outcome.executed[nb_id]
        try:
            coursedir = CourseDirectory(config=self.config)
            coursedir.assignment_id, coursedir.student_id = outcome.assignment, outcome.student
            app = Autograde(coursedir=coursedir, config=self.config)
            app.force, app.create_student = True, True
            ok, log = _capture(app)
        finally:
            with _REPLAY_LOCK:
                for key in keys:
                    _REPLAY.pop(key, None)
        self._write_log(f"$ record {outcome.assignment} {outcome.student}", log)
        if not ok or outcome.error:
            return False
        if self._worker_feedback_holds(outcome):
            self._write_feedback(outcome)
            self.feedback_from_workers += 1
            return True
        from coursetools.instructor import nbgrader_ext
        feedback_config = nbgrader_ext.feedback_config(self.config)
        coursedir = CourseDirectory(config=feedback_config)
        coursedir.assignment_id, coursedir.student_id = outcome.assignment, outcome.student
        app = nbgrader_ext.feedback_app(coursedir, self.config)
        app.force = True
        ok_feedback, log = _capture(app)
        self._write_log(f"$ generate_feedback {outcome.assignment} {outcome.student}", log)
        if not ok_feedback:
            self.feedback_errors[(outcome.assignment, outcome.student)] = error_line(log)
        return True


def error_line(log: str) -> str:
    """The last exception a converter's log names ("SelectorSyntaxError: Invalid character
    ..."), past nbgrader's own wrapper ("NbGraderException: Please see the above traceback"),
    or its last non-empty line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    found = [line for line in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*:", line)]
    causes = [line for line in found if "NbGraderException" not in line] or found
    if causes:
        return causes[-1][:300]
    return lines[-1][:300] if lines else "no error was logged"


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def config_bytes(config: Config) -> bytes:
    return pickle.dumps(config)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


__all__ = ["Ledger", "LedgerEntry", "Recorder", "ReplayExecute", "ReplayMismatch", "now", "io"]
