"""A long grading run survives interruption (issue 28): stop it with each signal, start it again.

Four students hand in chapter 02 (the smallest exercise). `python3 make.py grade-class --jobs 1`
(README's command) is stopped with SIGINT after its first submission is recorded, the re-run with SIGTERM after one more,
the next with SIGHUP after one more; the last run grades only the fourth. After each stop:
the exit status is 128 + the signal, no process grade-class started is left (workers,
kernels, sandboxes), the gradebook holds every recorded submission in full and nothing of the
one that was in progress; while the first run works, a second grade-class on the course is
refused with the holder's pid. The final grades are the ones each submission must get. Then
the assignment's source changes, and a run (two jobs) grades all four again and says why.
"""

from __future__ import annotations

import re
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from coursetools import layout, notebooks
from coursetools.author import fixtures
from coursetools.author.nbgrader_course import NbgraderCourse
from coursetools.grading import sandbox
from coursetools.instructor import record

A = "02_to_semantics"
SANDBOXED = sandbox.bwrap_works()[0]


def _total(name=A):
    return sum(notebooks.points(c) for c in notebooks.test_cells(notebooks.read(layout.source_notebook(name))))


def _cmd(course, *extra, via_make=False):
    """grade-class's command line; `via_make`: as README gives it, `make.py grade-class`
    (make.py becomes grade-class, so the signal sent to the pid the shell started arrives)."""
    start = ([sys.executable, str(layout.ROOT / "make.py"), "grade-class"] if via_make
             else [sys.executable, "-m", "coursetools.instructor.classroom"])
    cmd = [*start, A, "--course", str(course.root), "--timeout", "120", *extra]
    if not SANDBOXED:  # as root, grade-class refuses to run kernels unsandboxed unless asked
        cmd.append("--unsandboxed-as-root")
    return cmd


def _ledger(course) -> dict[str, str]:
    path = course.root / "gradebook.db"
    if not path.exists():
        return {}
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as db:
            rows = db.execute(f"SELECT student, submission_sha256 FROM {record.LEDGER_TABLE}").fetchall()
    except sqlite3.OperationalError:  # the table does not exist yet
        return {}
    return dict(rows)


class Watched:
    """grade-class in the background; every process below it is noted while it runs."""

    def __init__(self, cmd):
        import psutil

        self.proc = subprocess.Popen(cmd, cwd=layout.ROOT, env=layout.env_with_course_tools(), text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.root = psutil.Process(self.proc.pid)
        self.seen: dict[tuple[int, float], str] = {}

    def note(self) -> None:
        import psutil

        try:
            children = self.root.children(recursive=True)
        except psutil.Error:
            return
        for child in children:
            try:
                self.seen[(child.pid, child.create_time())] = " ".join(child.cmdline())[:160]
            except psutil.Error:
                pass

    def wait_until(self, condition, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.note()
            if condition():
                return
            if self.proc.poll() is not None:
                out, err = self.proc.communicate()
                pytest.fail(f"grade-class ended ({self.proc.returncode}) before {what}:\n{out}\n{err[-3000:]}")
            time.sleep(0.2)
        self.proc.kill()
        pytest.fail(f"{what} did not happen within {timeout_s} s")

    def left_running(self) -> list[str]:
        import psutil

        left = []
        for (pid, created), cmdline in self.seen.items():
            try:
                proc = psutil.Process(pid)
                if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"{pid} {cmdline}")
            except psutil.Error:
                pass
        return left


def _consistent(course, students):
    """Every submission the ledger says was recorded is complete (grades, graded notebook,
    feedback); none of the others left anything in autograded/."""
    from nbgrader.api import Gradebook

    ledger = _ledger(course)
    with Gradebook(course.db_url) as gb:
        for student in students:
            graded = course.root / "autograded" / student / A / f"{A}.ipynb"
            feedback = course.root / "feedback" / student / A / f"{A}.html"
            if student in ledger:
                sub = gb.find_submission_notebook(A, A, student)
                assert all(g.auto_score is not None for g in sub.grades), f"{student}: a grade is missing"
                assert graded.exists() and feedback.exists(), f"{student}: recorded without its files"
            else:
                assert not graded.exists(), f"{student} was not recorded, yet has a graded notebook"
    return ledger


@pytest.fixture
def course(tmp_path):
    course = NbgraderCourse(tmp_path / "course", [A])
    wrong = fixtures.load(layout.SUBMISSIONS_DIR / A / "move_to_copy_true.toml")
    course.submit("s1-solved", A, fixtures.solved_release(A))
    course.submit("s2-wrong", A, fixtures.submission(wrong))
    course.submit("s3-blank", A, notebooks.read(layout.release_notebook(A)))
    course.submit("s4-solved", A, fixtures.solved_release(A))
    expected = {"s1-solved": _total(), "s3-blank": 0, "s4-solved": _total(),
                "s2-wrong": sum(fixtures.expected_scores(wrong, notebooks.read(layout.source_notebook(A))).values())}
    return course, expected


def _scores(course, students):
    from nbgrader.api import Gradebook

    with Gradebook(course.db_url) as gb:
        return {s: gb.find_submission_notebook(A, A, s).score for s in students}


# Four grade-class runs (three stopped) and one regrade of four submissions: about 3-4 minutes
# on the loaded 2-core machine; each subprocess has its own limit.
@pytest.mark.timeout(1500, method="thread")
def test_stopped_with_each_signal_then_resumed_to_the_same_grades(course):
    course, expected = course
    students = sorted(expected)
    for step, sig in enumerate((signal.SIGINT, signal.SIGTERM, signal.SIGHUP), start=1):
        before = _ledger(course)
        # The first as an instructor's Ctrl-C on README's command; the others on grade-class itself.
        run = Watched(_cmd(course, "--jobs", "1", via_make=step == 1))
        run.wait_until(lambda: len(_ledger(course)) >= step, 600, f"submission {step} being recorded")
        if step == 1:  # while it works, a second grade-class on the same course is refused
            second = subprocess.run(_cmd(course), cwd=layout.ROOT, env=layout.env_with_course_tools(),
                                    capture_output=True, text=True, timeout=300)
            assert second.returncode == 2, (second.returncode, second.stderr[-2000:])
            assert f"pid {run.proc.pid}" in second.stderr and "another grade-class" in second.stderr, second.stderr
        run.note()
        run.proc.send_signal(sig)
        try:
            out, err = run.proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            run.proc.kill()
            pytest.fail(f"grade-class did not stop within 120 s of {sig.name}")
        assert run.proc.returncode == 128 + sig, (sig.name, run.proc.returncode, err[-3000:])
        assert f"stopped by {sig.name}" in out, out
        assert f"stopped by {sig.name}" not in err, "the stop report is printed twice on a terminal"
        left = run.left_running()
        assert not left, f"after {sig.name}, processes grade-class started are still running: {left}"
        ledger = _consistent(course, students)
        assert set(before) <= set(ledger) and len(ledger) >= step, (before, ledger)
        assert re.search(rf"{A}: {len(ledger) - len(before)} graded and recorded in this run", out), out
        if step > 1:  # what the run before had recorded, this one skipped
            assert f"{len(before)} graded before" in out, out
        print(f"{sig.name}: stopped with {len(ledger)} of {len(students)} recorded")
    last = subprocess.run(_cmd(course, "--jobs", "1"), cwd=layout.ROOT, env=layout.env_with_course_tools(),
                          capture_output=True, text=True, timeout=900)
    assert last.returncode == 0, last.stderr[-3000:]
    done = len(_ledger(course))
    assert f"{len(students) - 3} graded now, 3 skipped" in last.stdout, last.stdout
    assert done == len(students)
    assert _scores(course, students) == expected
    _consistent(course, students)
    # The assignment's source changes (a comment in a hidden test): every submission is graded
    # again, and the summary says why.
    source = course.root / "solutions" / A / f"{A}.ipynb"
    nb = notebooks.read(source)
    test = next(c for c in nb.cells if notebooks.is_test_cell(c))
    test.source += "\n# reviewed"
    notebooks.write(nb, source)
    again = subprocess.run(_cmd(course, "--jobs", "2"), cwd=layout.ROOT, env=layout.env_with_course_tools(),
                           capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"{len(students)} graded now" in again.stdout and "source changed since 4 of them" in again.stdout, again.stdout
    assert _scores(course, students) == expected


# Five worker starts with --jobs 1 on the smallest exercise: about a minute on the quiet 2-core machine.
@pytest.mark.timeout(900, method="thread")
def test_a_killed_worker_is_replaced_and_a_submission_is_given_up_after_three(course):
    """A grading worker of this machine dies (SIGKILL, as the out-of-memory killer would) while
    its kernel runs: a new worker grades that submission again. The first submission's worker is
    killed three times (engines.MAX_ATTEMPTS): it is reported NOT GRADED and not retried forever;
    the fourth kill falls on the next submission, which the next worker grades. Every other
    submission is graded once, with the grade it must get; the summary says how many workers died."""
    import psutil

    from coursetools.instructor import engines

    course, expected = course
    students = sorted(expected)
    run = Watched(_cmd(course, "--jobs", "1"))
    kills, deadline = 0, time.monotonic() + 600
    while kills < engines.MAX_ATTEMPTS + 1 and run.proc.poll() is None and time.monotonic() < deadline:
        run.note()
        for child in run.root.children(recursive=True):
            try:
                if "coursetools.instructor.localworker" not in " ".join(child.cmdline()):
                    continue
                # A kernel runs: an ipykernel process, or a kernel forked from the warm zygote
                # (both it and its parent are named "course-zygote"; the idle zygote's parent is
                # the worker's bash wrapper, so a warming worker is not taken for a busy one).
                busy = any(_is_kernel(k) for k in child.children(recursive=True))
            except psutil.Error:
                continue
            if busy:  # a kernel of this worker runs: the worker is in the middle of a submission
                child.kill()
                child.wait(30)
                kills += 1
                break
        time.sleep(0.1)
    try:
        out, err = run.proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        run.proc.kill()
        pytest.fail("grade-class did not finish within 600 s of the last kill")
    assert kills == engines.MAX_ATTEMPTS + 1, (kills, out, err[-3000:])
    assert run.proc.returncode == 1, (run.proc.returncode, err[-3000:])  # one submission not graded
    lost = students[0]
    assert f"{engines.MAX_ATTEMPTS + 1} worker process(es) died while grading" in out, out
    row = next(line for line in out.splitlines() if line.startswith(lost))
    assert "not graded" in row and f"its worker died {engines.MAX_ATTEMPTS} times" in row, row
    ledger = _consistent(course, students)
    assert set(ledger) == set(students[1:]), ledger
    assert _scores(course, students[1:]) == {s: expected[s] for s in students[1:]}
    assert not run.left_running(), run.left_running()
    print(f"{kills} workers killed: {lost} reported after {engines.MAX_ATTEMPTS}, the rest graded once")


def _is_kernel(process) -> bool:
    import psutil
    try:
        if "ipykernel" in " ".join(process.cmdline()):
            return True
        parent = process.parent()
        return (parent is not None and " ".join(process.cmdline()).strip() == "course-zygote"
                and " ".join(parent.cmdline()).strip() == "course-zygote")
    except psutil.Error:
        return False
