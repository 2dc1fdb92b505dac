"""A Predict question after grading: the key stays hidden, what the learner may know shows.

A Predict question's hidden region holds its key. Two of its statements are meant for the
learner once graded: `print("What really happens ...")` (the reveal) and the message of
`assert not wrong, ...` (how many answers are wrong; which ones and the rule under "How to
fix"). Redaction keeps every other hidden string out of feedback, as before; these two pass.
"""

from __future__ import annotations

import ast

from nbformat import v4

from coursetools.grading import guard, hints
from coursetools.grading.execute import Outcome
from coursetools.instructor import nbgrader_ext

SOURCE = '''"""Question 6: where the tensors land."""
got = dict(PLACES)
assert all(v in ("cpu", "meta") for v in got.values()), "PLACES: answer cpu or meta"
### BEGIN HIDDEN TESTS
KEY = {"a": "meta", "b": "cpu", "c": "meta"}
print("What really happens (lesson 01 §3): a and c land on meta, b stays on the CPU.")
wrong = [name for name in KEY if f"{got[name]}" != KEY[name]]
assert not wrong, (f"PLACES: {len(wrong)} of the {len(KEY)} answers are wrong"
                   + fix_hint(f"recheck {wrong}: factory calls follow the block"))
assert got.get("secret") is None, "a secret hidden message the learner never sees"
### END HIDDEN TESTS
'''


def _cell(outputs):
    cell = v4.new_code_cell(SOURCE)
    cell.metadata["nbgrader"] = {"grade": True, "grade_id": "test_predict", "locked": True, "points": 2,
                                 "solution": False}
    cell.outputs = outputs
    return cell


def test_only_the_reveal_and_the_count_leave_a_hidden_region():
    nb = v4.new_notebook(cells=[_cell([])])
    hidden = guard.hidden_strings(nb)
    assert "a secret hidden message the learner never sees" in hidden
    assert not [h for h in hidden if h.startswith(hints.REVEAL_PREFIX)], hidden
    assert not [h for h in hidden if "answers are wrong" in h or "factory calls follow" in h], hidden
    tree = ast.parse(SOURCE)
    ids = guard.shown_after_grading(tree)
    kept = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and id(n) in ids}
    assert any(t.startswith("What really happens") for t in kept)
    assert "a secret hidden message the learner never sees" not in kept


def test_feedback_of_a_wrong_predict_shows_the_count_the_fix_and_the_reveal():
    evalue = "PLACES: 1 of the 3 answers are wrong" + hints.FIX_MARKER + "recheck ['b']: factory calls follow the block"
    line = SOURCE.split("\n").index(next(l for l in SOURCE.split("\n") if l.startswith("assert not wrong"))) + 1
    error = v4.new_output("error", ename="AssertionError", evalue=evalue,
                          traceback=[f"<grader test test_predict>:{line}", f"AssertionError: {evalue}"])
    reveal = v4.new_output("stream", name="stdout", text="What really happens (lesson 01 §3): a and c land on meta.\n")
    outputs = nbgrader_ext.grader_written_outputs(_cell([reveal, error]), Outcome.ERROR, None)
    assert outputs[0].output_type == "error"
    assert outputs[0].evalue.startswith("PLACES: 1 of the 3 answers are wrong"), outputs[0].evalue
    assert hints.split(outputs[0].evalue)[1].startswith("recheck ['b']")
    assert "a hidden test failed" not in outputs[0].evalue
    assert outputs[1].text.startswith("What really happens"), outputs


def test_any_other_hidden_failure_stays_hidden_and_a_pass_shows_the_reveal():
    lines = SOURCE.split("\n")
    line = lines.index(next(l for l in lines if "secret" in l)) + 1
    error = v4.new_output("error", ename="AssertionError", evalue="a secret hidden message the learner never sees",
                          traceback=[f"<grader test test_predict>:{line}", "AssertionError"])
    outputs = nbgrader_ext.grader_written_outputs(_cell([error]), Outcome.ERROR, None)
    assert outputs[0].evalue == "a hidden test failed (hidden tests are not shown)"
    reveal = v4.new_output("stream", name="stdout", text="noise\nWhat really happens (lesson 01 §3): a and c.\n")
    passed = nbgrader_ext.grader_written_outputs(_cell([reveal]), Outcome.OK, None)
    assert passed[0].text.startswith("passed: 2/2") and passed[1].text == "What really happens (lesson 01 §3): a and c.\n"


HIDDEN_WITH_FIX = '''"""Question 2: to_device."""
assert to_device(1) == 1, "to_device(1) must return 1" + fix_hint("return non-tensors unchanged")
### BEGIN HIDDEN TESTS
got = to_device(2)
assert got == 2, (f"a secret observation: got {got}, expected 2"
                  + fix_hint("return what .to() returns: x = x.to(device)"))
### END HIDDEN TESTS
'''


def test_a_failed_hidden_test_shows_its_fix_and_hides_what_it_observed():
    """Every failure has a fix, a hidden one too: the feedback page says a hidden test failed
    and gives the fix under "How to fix"; what the hidden test observed stays out, and the
    fix's words survive redaction (they are meant for the learner)."""
    cell = v4.new_code_cell(HIDDEN_WITH_FIX)
    cell.metadata["nbgrader"] = {"grade": True, "grade_id": "test_to_device", "locked": True, "points": 2,
                                 "solution": False}
    line = HIDDEN_WITH_FIX.split("\n").index("assert got == 2, (f\"a secret observation: got {got}, expected 2\"") + 1
    evalue = "a secret observation: got 3, expected 2" + hints.FIX_MARKER + "return what .to() returns: x = x.to(device)"
    cell.outputs = [v4.new_output("error", ename="AssertionError", evalue=evalue,
                                  traceback=[f"<grader test test_to_device>:{line}", "AssertionError"])]
    shown = nbgrader_ext.grader_written_outputs(cell, Outcome.ERROR, None)
    observed, fix = hints.split(shown[0].evalue)
    assert observed == "a hidden test failed (hidden tests are not shown)" and "secret" not in shown[0].evalue
    assert fix == "return what .to() returns: x = x.to(device)"
    cell.outputs = shown
    nb = v4.new_notebook(cells=[cell])
    guard.redact(nb, guard.hidden_text(nb))
    assert hints.split(nb.cells[0].outputs[0].evalue)[1] == fix, nb.cells[0].outputs[0].evalue
    printed = v4.new_output("stream", name="stdout", text="a secret observation: got 3, expected 2\n")
    nb.cells[0].outputs = [printed]
    guard.redact(nb, guard.hidden_text(nb))
    assert "secret" not in nb.cells[0].outputs[0].text, "a hidden observation printed by the student's code"


HIDDEN_CALLS_A_CHECK = '''"""Question 3: the result follows its input's device."""
check_follows(make_batch, "cpu")
### BEGIN HIDDEN TESTS
check_follows(make_batch, "meta")
### END HIDDEN TESTS
'''


def test_a_failed_hidden_test_says_what_the_check_observed():
    """A hidden test that hands a course check data (a device name) fails with that check's
    message, the one `make.py check` prints: the feedback page shows it after "a hidden test
    failed: ", with the fix under "How to fix"; the hidden line itself (its code, its data
    "meta" as code) is not shown. A message holding any string of the hidden test is still
    replaced (test_a_failed_hidden_test_shows_its_fix_and_hides_what_it_observed)."""
    cell = v4.new_code_cell(HIDDEN_CALLS_A_CHECK)
    cell.metadata["nbgrader"] = {"grade": True, "grade_id": "test_follows", "locked": True, "points": 2,
                                 "solution": False}
    observed = "ref is on meta, the result on cpu: is a device hard-coded?"
    fix = "build the result on the input's device: torch.zeros(..., device=x.device)"
    line = HIDDEN_CALLS_A_CHECK.split("\n").index('check_follows(make_batch, "meta")') + 1
    cell.outputs = [v4.new_output("error", ename="AssertionError", evalue=observed + hints.FIX_MARKER + fix,
                                  traceback=[f"<grader test test_follows>:{line}", "AssertionError"])]
    shown = nbgrader_ext.grader_written_outputs(cell, Outcome.ERROR, None)
    said, how = hints.split(shown[0].evalue)
    assert said == nbgrader_ext.HIDDEN_FAILED_SAID + observed and how == fix, shown[0].evalue
    assert "check_follows(make_batch" not in repr(shown)
    cell.outputs = shown
    nb = v4.new_notebook(cells=[cell])
    guard.redact(nb, guard.hidden_text(nb))
    assert hints.split(nb.cells[0].outputs[0].evalue)[0] == said, "redaction took the check's message"
    # A message of two lines, the hidden test's words and the learner's error: only the error.
    cell.outputs = [v4.new_output("error", ename="AssertionError", traceback=[f"<grader test test_follows>:{line}"],
                                  evalue='check_follows(make_batch, "meta") failed\nYour code raised '
                                         "FrozenInstanceError: cannot assign to field 'x'" + hints.FIX_MARKER + fix)]
    shown = nbgrader_ext.grader_written_outputs(cell, Outcome.ERROR, None)
    assert hints.split(shown[0].evalue)[0] == (nbgrader_ext.HIDDEN_FAILED_SAID + "Your code raised "
                                               "FrozenInstanceError: cannot assign to field 'x'"), shown[0].evalue
    # The same failure, with the hidden line's own words in the message: not shown.
    cell.outputs = [v4.new_output("error", ename="AssertionError",
                                  evalue='check_follows(make_batch, "meta") failed' + hints.FIX_MARKER + fix,
                                  traceback=[f"<grader test test_follows>:{line}", "AssertionError"])]
    shown = nbgrader_ext.grader_written_outputs(cell, Outcome.ERROR, None)
    assert hints.split(shown[0].evalue)[0] == nbgrader_ext.HIDDEN_FAILED, shown[0].evalue
