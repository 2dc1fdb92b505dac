"""Feedback in two steps: a failing test says what it observed and which rule that breaks;
how to fix it comes only from the grader's side.

A test message is built as `symptom + fix_hint("the fix")`. Every fix text is a literal
argument of `fix_hint` (a string, an f-string, or a sum of them), in a test cell or in the
locked helpers cell; `fix_hint` is defined in each exercise's locked helpers cell, byte for
byte as `HELPER_SOURCE` below (a notebook imports nothing of the repository: it must run alone
in Colab); `tests/course/test_notebooks_static.py` holds every copy to this one, and every
message of a test to having a fix.

- The release holds no fix: nbgrader_ext.StripFixTexts, after nbgrader has saved the cells
  in its gradebook, turns every `fix_hint("...")` of the release into `fix_hint()`
  (notebooks.strip_fix_texts). In the learner's own kernel (a visible test in JupyterLab or
  Colab) a failure therefore says what was observed and the rule, then where the fix is.
- When a notebook is graded (`make.py check`, nbgrader autograde, grade-class), the test
  cells and the helpers come from the course's side (solutions/ or the gradebook) with their
  fix texts; `fix_hint(text)` returns `FIX_MARKER` + the fix. What the learner is shown is
  then split with `split`: `make.py check` prints the observation, and the fix with
  `--explain`; a feedback page shows the fix under a collapsed "How to fix".
"""

from __future__ import annotations

FIX_MARKER = "\nHow to fix: "
# A Predict question's "what really happens": its hidden test prints a line that starts so,
# once the learner has answered (the key is never in the release). `make.py check`
# shows it under the question, passed or failed; a feedback page shows the cell's output.
REVEAL_PREFIX = "What really happens"


def reveals(text: str) -> list[str]:
    """The reveal lines of a test cell's printed output."""
    return [line.strip() for line in text.splitlines() if line.strip().startswith(REVEAL_PREFIX)]

HELPER_SOURCE = '''\
def fix_hint(text=None):
    """The "how to fix" part of a test message. This notebook holds no fix: `python3 make.py
    check NN --explain` and your instructor's feedback page give one for every failure."""
    if text is None:
        return "\\n(How to fix: `python3 make.py check <chapter number> --explain` in the course's folder, or your feedback page.)"
    return "\\nHow to fix: " + text
'''

HELPER_NAMES = ("fix_hint",)


def split(message: str) -> tuple[str, str]:
    """(what was observed and the rule, how to fix it): the second is "" when the message
    carries no fix."""
    observed, marker, fix = message.partition(FIX_MARKER)
    return (observed, fix.strip()) if marker else (message, "")


def grader_namespace() -> dict:
    """The grader's `fix_hint`: the helpers' own source (the grader's copy of a test passes
    the fix text, which the release's copy no longer holds)."""
    ns: dict = {}
    exec(compile(HELPER_SOURCE, "<grader hints>", "exec"), ns)
    return {"fix_hint": ns["fix_hint"]}
