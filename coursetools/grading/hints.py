"""Feedback in two steps: a failing test says what it observed and which rule that breaks;
how to fix it comes only when the learner asks.

A test message is built as `symptom + fix_hint("the fix")`. `fix_hint` is defined in each
exercise's locked helpers cell, byte for byte as `HELPER_SOURCE` below (a notebook imports
nothing of the repository: it must run alone in Colab); `tests/course/test_notebooks_static.py`
holds every copy to this one.

- In the learner's own kernel (running a visible test in JupyterLab or Colab) the fix is left
  out, and the message says how to ask for it: `SHOW_FIXES = True` in a cell, then rerun.
- When a notebook is graded (`make.py check`, nbgrader autograde, grade-class), test cells run
  in the grader's process (coursetools/grading/remote.py), where `fix_hint` always returns
  `FIX_MARKER` + the fix. What the learner is shown is then split with `split`:
  `make.py check` prints the observation, and the fix with `--explain`; a feedback page shows
  the fix under a collapsed "How to fix".
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
SHOW_FIXES = False  # set SHOW_FIXES = True in a cell of your own, then rerun a test, to see how to fix it


def fix_hint(text):
    """The "how to fix" part of a test message, shown only when asked for (SHOW_FIXES)."""
    if SHOW_FIXES:
        return "\\nHow to fix: " + text
    return "\\n(Stuck? Run SHOW_FIXES = True in a cell, then this test again, to see how to fix it.)"
'''

HELPER_NAMES = ("fix_hint",)


def split(message: str) -> tuple[str, str]:
    """(what was observed and the rule, how to fix it): the second is "" when the message
    carries no fix."""
    observed, marker, fix = message.partition(FIX_MARKER)
    return (observed, fix.strip()) if marker else (message, "")


def grader_namespace() -> dict:
    """The grader's `fix_hint` (and `SHOW_FIXES`): the helpers' source, with fixes shown."""
    ns: dict = {}
    exec(compile(HELPER_SOURCE, "<grader hints>", "exec"), ns)
    ns["SHOW_FIXES"] = True
    return {"fix_hint": ns["fix_hint"], "SHOW_FIXES": True}
