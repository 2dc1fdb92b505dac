"""The learner's self-check: `python3 make.py check NOTEBOOK` (coursetools.learner.selfcheck).

Driven as a learner drives it, through the command line, on chapter 01's release.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

from coursetools.author import fixtures
from coursetools import layout, notebooks
from coursetools.learner import selfcheck

NAME = "01_device_basics"


def run_check(path, *args, timeout=300):
    # --as-given: on a machine where `make.py lab` made copies in work/, the release path
    # would otherwise grade that learner's copy
    return subprocess.run([sys.executable, "-m", "coursetools.learner.selfcheck", str(path), "--as-given", *args],
                          cwd=layout.ROOT, capture_output=True, text=True, timeout=timeout)


def write_variant(tmp_path, filename, edit=None, answers=None):
    """The release, with reference answers (or `answers`) typed in, then `edit(nb)` applied."""
    source = notebooks.read(layout.source_notebook(NAME))
    reference = fixtures.reference_answers(source)
    nb = fixtures.fill(notebooks.read(layout.release_notebook(NAME)), {**reference, **(answers or {})})
    if edit:
        edit(nb)
    path = tmp_path / filename
    notebooks.write(nb, path)
    return path


def cell(nb, gid):
    return next(c for c in nb.cells if notebooks.grade_id(c) == gid)


def test_reference_answers_get_full_marks_and_exit_0(tmp_path):
    path = write_variant(tmp_path, f"{NAME}.ipynb")
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    out = run_check(path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Score: 26/26" in out.stdout
    for gid in ("test_pick_device_auto", "test_common_device_scalars", "test_build_on_restores"):
        assert gid in out.stdout
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before, "the learner's file must never be modified"


def test_untouched_release_scores_zero_and_says_not_answered():
    path = layout.release_notebook(NAME)
    before = path.read_bytes()
    out = run_check(path)
    assert out.returncode == 1
    assert "Score: 0/26" in out.stdout and "not answered yet" in out.stdout
    assert path.read_bytes() == before


def test_editing_or_deleting_tests_does_not_help(tmp_path):
    """A wrong answer, its test cell replaced by `pass`, another test cell deleted: the course's
    own tests (hidden ones included) are restored, and the failing assertion is printed."""
    wrong = fixtures.load(layout.SUBMISSIONS_DIR / NAME / "pick_device_hardcodes_cpu.toml")

    def tamper(nb):
        cell(nb, "test_pick_device_auto").source = "pass  # tests are for other people"
        nb.cells.remove(cell(nb, "test_pick_device_named"))
    path = write_variant(tmp_path, "tampered.ipynb", edit=tamper, answers=wrong.answers)
    out = run_check(path)
    assert out.returncode == 1
    assert "Score: 20/26" in out.stdout, out.stdout
    assert "on a machine without any GPU expected cpu" in out.stdout or "expected cuda:0" in out.stdout
    assert "FAIL 0/3  test_pick_device_named" in out.stdout


def test_visible_only_runs_only_the_tests_the_learner_sees(tmp_path):
    """pick_device_forgets_mps fails only a hidden test: visible-only mode gives it full marks."""
    wrong = fixtures.load(layout.SUBMISSIONS_DIR / NAME / "pick_device_forgets_mps.toml")
    path = write_variant(tmp_path, "mps.ipynb", answers=wrong.answers)
    assert "Score: 26/26" in run_check(path, "--visible-only").stdout
    assert "Score: 23/26" in run_check(path).stdout


def test_a_crash_costs_only_the_questions_that_need_the_crashed_code(tmp_path):
    """os._exit in one answer: its tests score 0 ("kernel died"), every other question is still
    graded (fresh kernel, earlier cells replayed); a test that never ran would score 0 too."""
    crash = "import os\ndef common_device(tensors):\n    os._exit(3)\n"
    path = write_variant(tmp_path, "crash.ipynb", answers={"common_device": crash})
    out = run_check(path)
    assert out.returncode == 1
    assert "Score: 21/26" in out.stdout, out.stdout
    assert "kernel died" in " ".join(out.stdout.split())
    assert "ok   2/2  test_build_on_restores" in out.stdout, "questions after the crash must still be graded"


def test_an_endless_loop_costs_its_question_only(tmp_path):
    # it waits instead of spinning: the same endless cell for the limit, without burning a core
    # for 40 s that the rest of the suite needs
    loop = ("def seeded_randn(shape, seed, device='cpu', dtype=torch.float32):\n    import time\n"
            "    while True:\n        time.sleep(0.1)\n")
    path = write_variant(tmp_path, "loop.ipynb", answers={"seeded_randn": loop})
    # The limit is far above what any other cell of chapter 01 needs on a busy 2-core machine
    # (a 5 s limit stopped a correct test there), so only the endless loop can reach it.
    out = run_check(path, "--timeout", "40")
    assert "Score: 23/26" in out.stdout, out.stdout
    assert "longer than the 40 s limit" in " ".join(out.stdout.split())


@pytest.mark.parametrize("make_input, expected", [
    (lambda d: d / "missing.ipynb", "no such file"),
    (lambda d: (d / "broken.ipynb").write_text('{"cells": [') and d / "broken.ipynb", "not valid JSON"),
    (lambda d: (d / "list.ipynb").write_text("[1, 2]") and d / "list.ipynb", "not a Jupyter notebook"),
    (lambda d: d, "is a folder"),
    (lambda d: layout.COURSE_DIR / "01_device_basics.ipynb", "not an exercise notebook"),
], ids=["missing", "invalid-json", "not-a-notebook", "folder", "lesson"])
def test_bad_input_gets_a_one_line_error_and_exit_2(tmp_path, make_input, expected, capsys):
    assert selfcheck.main([str(make_input(tmp_path)), "--as-given"]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], err
    assert out == ""


def test_bad_input_through_the_command_line(tmp_path):
    """The same, as the learner runs it: one line on stderr, exit status 2, nothing else."""
    out = run_check(tmp_path / "missing.ipynb", timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [f"error: no such file: {tmp_path / 'missing.ipynb'}"]


def test_foreign_nbgrader_notebook_is_rejected(tmp_path, capsys):
    nb = notebooks.read(layout.release_notebook(NAME))
    for c in nb.cells:
        if notebooks.grade_id(c):
            c.metadata["nbgrader"]["grade_id"] = "other_" + c.metadata["nbgrader"]["grade_id"]
    path = tmp_path / "other.ipynb"
    path.write_text(json.dumps(nb))
    assert selfcheck.main([str(path), "--as-given"]) == 2
    assert "none of any assignment" in capsys.readouterr().err


def test_messages_say_whose_error_it_is_and_keep_the_end_of_long_ones():
    """An exception from the learner's code (not a failed check) says where it was raised; a
    long message keeps its end (e.g. which rank raised what) as well as its start; grader
    errors without a traceback (a time limit) get no such note."""
    from nbformat import v4

    from coursetools.grading.execute import Outcome
    from coursetools.learner.selfcheck import _message, _shorten

    raised = v4.new_code_cell("test()")
    raised.outputs = [v4.new_output("error", ename="TypeError", evalue="unsupported operand",
                                    traceback=["\x1b[31mTypeError\x1b[0m",
                                               "Cell \x1b[32mIn[4], line 3\x1b[0m, in move_to(batch)\n  x + 1"])]
    from coursetools.grading import hints
    from coursetools.learner.selfcheck import RAISED_FIX
    # the learner's own error has a fix too (every failure has one)
    assert _message(raised, Outcome.ERROR) == ("TypeError: unsupported operand  [raised by your code, Cell In[4], line 3, "
                                               "in move_to(batch)]" + hints.FIX_MARKER + RAISED_FIX)
    failed = v4.new_code_cell("test()")
    failed.outputs = [v4.new_output("error", ename="AssertionError", evalue="x is on cpu",
                                    traceback=["Cell In[5], line 2"])]
    assert _message(failed, Outcome.ERROR) == "AssertionError: x is on cpu"
    stopped = v4.new_code_cell("test()")
    stopped.outputs = [v4.new_output("error", ename="CellTimeoutError", evalue="ran longer", traceback=[])]
    assert _message(stopped, Outcome.TIMEOUT) == "CellTimeoutError: ran longer"
    long = "RuntimeError: rank 1 failed:\n" + "noise " * 300 + "NameError: name 'model' is not defined"
    short = _shorten(long)
    assert short.startswith("RuntimeError: rank 1 failed:") and short.endswith("NameError: name 'model' is not defined")
    assert len(short) < 800 and "[...]" in short


def test_the_fix_comes_only_when_asked_for():
    """Feedback in two steps: the report says what a failing test observed and the rule; the
    fix (after hints.FIX_MARKER, what fix_hint adds when a notebook is graded) only with
    --explain, and then the report no longer points to --explain."""
    from coursetools.grading import hints

    fix = hints.grader_namespace()["fix_hint"]("keep the result of .to()")
    results = [selfcheck.QuestionResult("test_a", "a", 0.0, 2.0, "AssertionError: x is on cpu (lesson 02 §3)" + fix),
               selfcheck.QuestionResult("test_b", "b", 1.0, 1.0)]
    terse = selfcheck.format_report("ex.ipynb", NAME, results, 1.0, False)
    assert "x is on cpu (lesson 02 §3)" in terse and "keep the result" not in terse
    assert "make.py check --explain ex.ipynb" in terse
    explained = selfcheck.format_report("ex.ipynb", NAME, results, 1.0, False, explain=True)
    assert "How to fix: keep the result of .to()" in explained and "--explain" not in explained
    no_fix = [selfcheck.QuestionResult("test_a", "a", 0.0, 2.0, "AssertionError: x is on cpu")]
    assert "--explain" not in selfcheck.format_report("ex.ipynb", NAME, no_fix, 1.0, False)
    kernel = {}
    exec(hints.HELPER_SOURCE, kernel)
    # The release's fix_hint() (its text taken out) says where the fix is; the course's side,
    # which keeps the text, gets it after the marker the report splits at.
    assert "make.py check" in kernel["fix_hint"]() and "--explain" in kernel["fix_hint"]()
    assert hints.FIX_MARKER not in kernel["fix_hint"]()
    assert kernel["fix_hint"]("keep the result") == hints.FIX_MARKER + "keep the result"


def test_a_wrapped_unanswered_stub_says_not_answered_and_hints_stay_sentences():
    """call_answer(fn, hint) in the exercises' helpers wraps the answer's error as
    "<hint>\\nYour code raised <Error>: <message>". An unanswered stub under it was reported
    with the hint, run together with the error ("...so it is not a mismatch Your code raised
    NotImplementedError:"); it says "not answered yet", and any other error follows the hint
    as a sentence of its own (issue 38, item 8)."""
    from nbformat import v4

    def message(evalue):
        cell = v4.new_code_cell("")
        cell.outputs = [v4.new_output("error", ename="AssertionError", evalue=evalue, traceback=[])]
        return selfcheck._message(cell, selfcheck.Outcome.ERROR)

    hint = "a 0-dim CPU tensor mixes with any device, so it is not a mismatch"
    assert message(f"{hint}\nYour code raised NotImplementedError: ").startswith("not answered yet")
    said = message(f"{hint}\nYour code raised KeyError: 'scale'")
    assert said == f"AssertionError: {hint}. Your code raised KeyError: 'scale'", said
    assert message("expected meta, got cpu") == "AssertionError: expected meta, got cpu"


def test_a_predict_questions_reveal_follows_its_grade_passed_or_failed():
    """A Predict question's "what really happens" is shown once the answer is graded, under the question,
    whether it passed or failed; the fix only with --explain."""
    from coursetools.grading import hints
    from coursetools.learner import selfcheck

    reveal = "What really happens (lesson 01 §3): a lands on meta."
    results = [selfcheck.QuestionResult("test_predict_a", "Question 6, a", 2, 2, "", [reveal]),
               selfcheck.QuestionResult("test_predict_b", "Question 6, b", 0, 2,
                                        "AssertionError: PLACES: 1 of the 5 answers are wrong"
                                        + hints.FIX_MARKER + "recheck ['c']", [reveal.replace("a lands", "c stays")])]
    text = selfcheck.format_report("x.ipynb", "01_device_basics", results, 1.0, False)
    assert text.count("What really happens") == 2, text
    assert "1 of the 5 answers are wrong" in text and "recheck ['c']" not in text, text
    explained = selfcheck.format_report("x.ipynb", "01_device_basics", results, 1.0, False, explain=True)
    assert "recheck ['c']" in explained
