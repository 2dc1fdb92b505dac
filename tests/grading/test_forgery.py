"""Grading that the student's code cannot forge, bounded in cost, with feedback that shows no
hidden test and runs no script (issues 13 and 22). The class simulation
(tests/instructor/test_classroom.py) grades one hostile submission per attack through nbgrader; these
are the pieces underneath, on small notebooks. The attacks of issue 22 are in
tests/hostile_submissions.py; each of them scored full marks from wrong answers, with no
flag, before the fixes these tests check (measured through grade-class, see the commit)."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
from nbformat import v4

import hostile_submissions as H
from coursetools.grading import execute, guard
from coursetools import layout, notebooks
from coursetools.grading.execute import BUDGET_ENAME, Outcome, execute_resilient
from coursetools.instructor.nbgrader_ext import (
    ClearHiddenTestsSafely,
    SafeOutputs,
    copy_data_files,
    grader_written_outputs,
)


def _test_cell(source, gid="test_f", points=2):
    cell = v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True, "grade_id": gid,
                                 "points": points, "schema_version": 3, "task": False}
    return cell


HIDDEN_SOURCE = ("assert f() == 2, 'f() must return 2'\n"
                 "### BEGIN HIDDEN TESTS\n"
                 "assert f() + 40 == 42, 'secret_hidden_message'\n"
                 "### END HIDDEN TESTS")


@pytest.fixture(scope="module")
def protocol_run(tmp_path_factory):
    """One kernel: a display update far over the cap, a hook that hides a failure, files."""
    cells = [
        v4.new_code_cell("from IPython.display import display\n"
                         "handle = display('small', display_id=True)\n"
                         "handle.update('x' * 5_000_000)"),
        v4.new_code_cell("import ipykernel, tempfile\n"
                         "print(tempfile.gettempdir())\n"
                         "print(ipykernel.get_connection_file())"),
        v4.new_code_cell("from IPython.display import clear_output\n"
                         "def _hide(result):\n"
                         "    clear_output()\n"
                         "    result.error_in_exec = None\n"
                         "get_ipython().events.register('post_run_cell', _hide)"),
        v4.new_code_cell("raise ValueError('this failure is hidden from the outputs')"),
    ]
    nb = v4.new_notebook(cells=cells)
    report = execute_resilient(nb, cwd=tmp_path_factory.mktemp("run"), timeout=60, guarded=False,
                               client_kwargs={"max_output_bytes": 100_000})
    return nb, report


def test_a_display_update_over_the_cap_is_dropped(protocol_run):
    nb, _ = protocol_run
    shown = [o for o in nb.cells[0].outputs if o.output_type == "display_data"]
    assert shown and shown[0].data["text/plain"] == "'small'", shown
    assert any("output truncated" in o.get("text", "") for o in nb.cells[0].outputs)


def test_a_hidden_failure_still_fails_by_the_protocol(protocol_run):
    """The hook cleared the error output and made the reply say 'ok'; the error message the
    kernel sent on iopub still decides, and the cell shows an error for nbgrader to score."""
    nb, report = protocol_run
    assert report.outcomes[3] is Outcome.ERROR
    assert any(o.output_type == "error" for o in nb.cells[3].outputs)


def test_no_kernel_files_left_behind(protocol_run):
    nb, _ = protocol_run
    printed = "".join(o.get("text", "") for o in nb.cells[1].outputs).split()
    tmpdir, connection_file = printed[0], printed[1]
    assert "kernel-files-" in tmpdir, f"the kernel's temporary folder was {tmpdir}"
    assert not os.path.exists(tmpdir), f"{tmpdir} left behind"
    assert not os.path.exists(connection_file), f"{connection_file} left behind"


def test_the_submission_budget_stops_the_rest(tmp_path):
    """Cells sleeping far longer than a small budget: the cell running when it runs out is
    stopped, every later cell never runs and scores 0, the report says so."""
    nb = v4.new_notebook(cells=[
        v4.new_code_cell("import time\nx = 1"),
        v4.new_code_cell("time.sleep(100_000)"),
        v4.new_code_cell("time.sleep(100_000)"),
        v4.new_code_cell("time.sleep(100_000)"),
        v4.new_code_cell("y = 2"),
        _test_cell("assert True"),
    ])
    report = execute_resilient(nb, cwd=tmp_path, timeout=4, budget=10, guarded=False)
    assert report.budget_exceeded_at is not None
    cut = report.budget_exceeded_at
    for i in range(cut + 1, len(nb.cells)):
        assert report.outcomes[i] is Outcome.NOT_RUN, (i, report.outcomes)
        assert nb.cells[i].outputs[0].ename == BUDGET_ENAME
    assert report.outcomes[-1] is not Outcome.OK
    enames = [o.get("ename") for c in nb.cells for o in c.outputs if o.output_type == "error"]
    assert BUDGET_ENAME in enames


def test_hidden_tests_never_reach_the_kernels_history(tmp_path):
    """A cell after the tests looks everywhere text lands (history, linecache): no hidden line
    (the tests ran in the grader's process)."""
    spy = v4.new_code_cell(
        "import linecache\n"
        "seen = [str(x) for x in In] + [''.join(e[2]) for e in list(linecache.cache.values()) if len(e) > 2]\n"
        "text = '\\n'.join(seen)\n"
        "print('secret_' + 'hidden_message' in text, 'b64' + 'decode' in text)")
    nb = v4.new_notebook(cells=[v4.new_code_cell("def f():\n    return 2"), _test_cell(HIDDEN_SOURCE), spy])
    report = execute_resilient(nb, cwd=tmp_path, timeout=60)
    assert report.outcomes[1] is Outcome.OK and not report.tampering, (report.outcomes, report.tampering)
    assert nb.cells[2].outputs[0].text.split() == ["False", "False"], nb.cells[2].outputs


def test_a_test_cell_that_does_not_compile_fails_at_once(tmp_path):
    """A test with a syntax error (an author's slip) fails with its SyntaxError, and the next test
    still runs. Before, the grader waited for the kernel to end a cell it had never started: each
    such test ran to the cell's time limit (180 s by default) and reported a timeout."""
    broken = _test_cell('assert f() == 2, (\n    f"unterminated\nstring")', gid="test_broken")
    nb = v4.new_notebook(cells=[v4.new_code_cell("def f():\n    return 2"), broken, _test_cell(HIDDEN_SOURCE)])
    report = execute_resilient(nb, cwd=tmp_path, timeout=20)
    assert report.outcomes[1:] == [Outcome.ERROR, Outcome.OK], report.outcomes
    errors = [o for o in nb.cells[1].outputs if o.output_type == "error"]
    assert [o.ename for o in errors] == ["SyntaxError"], nb.cells[1].outputs


def test_feedback_of_a_test_cell_is_the_graders_verdict_only():
    cell = _test_cell(HIDDEN_SOURCE)
    visible = v4.new_output("error", ename="AssertionError", evalue="f() must return 2",
                            traceback=["\x1b[32m<grader test test_f>:1\x1b[39m"])
    hidden = v4.new_output("error", ename="AssertionError", evalue="secret_hidden_message",
                           traceback=["File <grader test test_f>:3"])
    forged = v4.new_output("error", ename="Leak_" + "A" * 40, evalue="x", traceback=["<grader test test_f>:1"])
    cell.outputs = [visible]
    assert grader_written_outputs(cell, Outcome.ERROR, None)[0].evalue.startswith("f() must return 2")
    cell.outputs = [v4.new_output("stream", name="stdout", text="printed while the hidden test ran"), hidden]
    shown = grader_written_outputs(cell, Outcome.ERROR, None)
    assert len(shown) == 1 and "secret" not in str(shown) and "printed" not in str(shown)
    cell.outputs = [forged]
    assert grader_written_outputs(cell, Outcome.ERROR, None)[0].ename == "Error"
    cell.outputs = [v4.new_output("display_data", data={"text/plain": "'fake pass'"})]
    ok = grader_written_outputs(cell, Outcome.OK, None)
    assert ok[0].text == "passed: 2/2 points\n"
    flagged = grader_written_outputs(cell, Outcome.OK, "before test_f: torch.x changed")
    assert flagged[0].ename == guard.TAMPER_ENAME


def test_feedback_folds_the_fix_under_how_to_fix():
    """Feedback in two steps (coursetools/grading/hints.py): the page's error says what the
    test observed and the rule; the fix (what fix_hint returned in the grader) is there, but
    collapsed under "How to fix", escaped, and the page keeps it through nbconvert's sanitizer."""
    from nbconvert import HTMLExporter

    from coursetools.grading import hints

    cell = _test_cell(HIDDEN_SOURCE)
    fix = hints.grader_namespace()["fix_hint"]("assign the result: <x = x.to(device)>")
    cell.outputs = [v4.new_output("error", ename="AssertionError", evalue="x is still on cpu (lesson 02 §3)" + fix,
                                  traceback=["<grader test test_f>:1"])]
    shown = grader_written_outputs(cell, Outcome.ERROR, None)
    assert shown[0].evalue == ("x is still on cpu (lesson 02 §3) (test line 1)" + hints.FIX_MARKER
                               + "assign the result: <x = x.to(device)>"), "the line number belongs to the observation"
    cell.outputs = shown
    nb, _ = SafeOutputs().preprocess(v4.new_notebook(cells=[cell]), {})
    error, details = nb.cells[0].outputs
    assert error.evalue == "x is still on cpu (lesson 02 §3) (test line 1)" and "to(device)" not in str(error)
    from coursetools.instructor.nbgrader_ext import FEEDBACK_FILTERS
    page, _ = HTMLExporter(sanitize_html=True, filters=FEEDBACK_FILTERS).from_notebook_node(nb)
    folded = re.search(r"<details>\s*<summary>How to fix</summary>(.*?)</details>", page, flags=re.S)
    assert folded and "x = x.to(device)" in folded.group(1) and "<x = x" not in folded.group(1), (
        "the fix is not collapsed under How to fix, escaped")
    plain = _test_cell(HIDDEN_SOURCE)
    plain.outputs = [v4.new_output("error", ename="AssertionError", evalue="f() must return 2 (test line 1)",
                                   traceback=[])]
    nb, _ = SafeOutputs().preprocess(v4.new_notebook(cells=[plain]), {})
    assert len(nb.cells[0].outputs) == 1, "a message without a fix gets no How to fix"


def test_markers_in_a_student_cell_do_not_cost_the_feedback():
    answer = v4.new_code_cell("# ### BEGIN HIDDEN TESTS in my notes\nx = 1")
    answer.metadata["nbgrader"] = {"solution": True, "grade": False, "locked": False, "grade_id": "f",
                                   "schema_version": 3}
    nb = v4.new_notebook(cells=[answer, _test_cell(HIDDEN_SOURCE)])
    out, _ = ClearHiddenTestsSafely().preprocess(nb, {})
    assert out.cells[0].source == answer.source
    assert "secret_hidden_message" not in out.cells[1].source and "f() must return 2" in out.cells[1].source


def test_feedback_html_runs_no_student_script():
    from nbconvert import HTMLExporter

    cell = v4.new_code_cell("x")
    cell.outputs = [
        v4.new_output("display_data", data={
            "text/html": '<b>ok</b><script>document.title="pwned1"</script><img src=x onerror="pwned2()">'}),
        v4.new_output("display_data", data={"application/javascript": 'document.title="pwned3"'}),
        v4.new_output("display_data", data={"image/svg+xml": '<svg><script>pwned4()</script></svg>'}),
        v4.new_output("display_data", data={"text/markdown": '<script>pwned5()</script>'}),
    ]
    md = v4.new_markdown_cell('notes <script>pwned6()</script><a href="javascript:pwned7()">x</a>')
    nb = v4.new_notebook(cells=[cell, md])
    nb, _ = SafeOutputs().preprocess(nb, {})
    from coursetools.instructor.nbgrader_ext import FEEDBACK_FILTERS
    html, _ = HTMLExporter(sanitize_html=True, filters=FEEDBACK_FILTERS).from_notebook_node(nb)
    # nbgrader's feedback template renders Markdown cells itself, unsanitized: what it shows
    # is markdown2html of the cell as SafeOutputs left it.
    from nbconvert.filters import markdown2html
    html += markdown2html(nb.cells[1].source)
    assert "pwned" not in _live(html), "a student's script is live in the feedback"
    assert not re.search(r"<[^>]*(onerror|javascript:)", html, flags=re.I), "a live handler or link"
    assert "<b>ok</b>" in html, "harmless HTML stays"


def _live(html: str) -> str:
    """The text of every <script> element of the page (the template's own and any other)."""
    return "".join(re.findall(r"<script[^>]*>(.*?)</script>", html, flags=re.S | re.I))


def test_guard_and_execute_share_one_place_for_the_limits():
    from traitlets.config.loader import PyFileConfigLoader

    from coursetools import layout

    config = PyFileConfigLoader("nbgrader_config.py", path=str(layout.ROOT)).load_config()
    assert config.ResilientExecute.timeout == execute.CELL_TIMEOUT_S >= 180
    assert config.ResilientExecute.budget == execute.SUBMISSION_BUDGET_S >= 3 * execute.CELL_TIMEOUT_S
    assert [p.__name__ for p in config.GenerateFeedback.preprocessors][-2:] == ["ClearHiddenTestsSafely", "SafeOutputs"]
    assert config.HTMLExporter.sanitize_html is True
    assert notebooks.BEGIN_HIDDEN in HIDDEN_SOURCE


# -- issue 22: the attacks of a determined student, on a small notebook ----------------------------
def _locked_cell(source, gid="helpers"):
    cell = v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade": False, "solution": False, "locked": True, "grade_id": gid,
                                 "schema_version": 3, "task": False}
    return cell


def _answer_cell(source, gid="answer_f"):
    cell = v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade": False, "solution": True, "locked": False, "grade_id": gid,
                                 "schema_version": 3, "task": False}
    return cell


SETUP = "import torch"
HELPERS = "def expect_two(value):\n    assert value == 2, f'expected 2, got {value!r}'"
WRONG_F = "def f():\n    return 3"  # fails both tests: every pass below is a forgery


def _graded(*student_cells, answer=WRONG_F, tests=2):
    """A notebook: setup and helper cells (locked), the answer cell, the student's extra cells,
    then `tests` test cells with hidden tests (2 points each); executed under the guard."""
    cells = [_locked_cell(SETUP, "setup"), _locked_cell(HELPERS), _answer_cell(answer)]
    cells += [v4.new_code_cell(source) for source in student_cells]
    cells += [_test_cell("expect_two(f())\n" + HIDDEN_SOURCE, gid=f"test_{i}") for i in range(tests)]
    nb = v4.new_notebook(cells=cells)
    return nb, execute_resilient(nb, cwd="/tmp", timeout=120)


def _test_results(nb, report):
    return {notebooks.grade_id(c): report.outcomes[i] for i, c in enumerate(nb.cells) if notebooks.is_test_cell(c)}


def _earned(nb, report, what, passed=False):
    """Every test scored what the answer earns: here (WRONG_F), nothing."""
    results = _test_results(nb, report)
    want = Outcome.OK if passed else Outcome.ERROR
    assert all(o is want for o in results.values()), f"{what}: {results}"


def test_an_honest_notebook_passes():
    nb, report = _graded(answer="def f():\n    return 2")
    _earned(nb, report, "honest", passed=True)
    assert not report.tampering and not report.forged


_SHADOWED_GLOBALS = ("_before = dict(globals())\n"
                     "def expect_two(value):\n    pass\n"
                     "def globals():\n    return _before")
_TORCH_MODE = ("from torch.overrides import TorchFunctionMode\n"
               "class _Yes(TorchFunctionMode):\n"
               "    def __torch_function__(self, func, types, args=(), kwargs=None):\n"
               "        return func(*args, **(kwargs or {}))\n"
               "_Yes().__enter__()")

# Every attack of issues 13, 22 and 32 on a small notebook: an answer `f` that returns 3 where
# the tests want 2, and the attack in the answer cell or in a cell of its own. Under the in-kernel
# guard each of these forged passes (measured, see README); with the tests in the grader's
# process none can: there is no verdict in the kernel to forge.
ATTACKS = {
    "session send (22)": dict(answer=H.SESSION_SEND + "\nf = _forge_pass"),
    "forged reply (22)": dict(answer=H.FORGED_REPLY + "\nf = _forge_pass"),
    "magic number (22)": dict(cells=[H.MAGIC_NUMBER]),
    "non-callable attributes (22)": dict(cells=[H.NON_CALLABLE]),
    "a student's get_ipython (22)": dict(cells=[H.USER_GET_IPYTHON]),
    "shadowed globals (22)": dict(cells=[_SHADOWED_GLOBALS]),
    "closure key (13)": dict(cells=[H.CLOSURE_KEY]),
    "closure key (22)": dict(cells=[H.CLOSURE_KEY_NOW]),
    "inspect closures + AST transformer (32)": dict(cells=[H.INSPECT_CLOSURES]),
    "Formatter fields (32)": dict(cells=[H.FORMATTER_FIELDS]),
    "a torch mode left entered": dict(cells=[_TORCH_MODE]),
    "traceback frames (32)": dict(answer=H.TRACEBACK_FRAMES, cells=[]),
}


@pytest.mark.parametrize("what", list(ATTACKS))
def test_an_attack_scores_what_its_answers_earn(what):
    attack = ATTACKS[what]
    nb, report = _graded(*attack.get("cells", []), answer=attack.get("answer", WRONG_F))
    _earned(nb, report, what)


def test_a_spoofing_device_scores_nothing():
    """Issue 32: a class built with type() (no class body) that claims to be torch.device and
    equals every device. isinstance is asked of the object's real type, and a device compared
    here is plain data, never a kernel object's __eq__."""
    test = ("d = f()\n"
            "assert isinstance(d, torch.device), f'expected a torch.device, got {type(d).__name__}'\n"
            "### BEGIN HIDDEN TESTS\n"
            "assert d == torch.device('cuda', 0), 'secret_hidden_message'\n"
            "### END HIDDEN TESTS")
    for source in (test, "assert f() == torch.device('cuda', 0)"):
        cells = [_locked_cell(SETUP, "setup"), _answer_cell(H.SPOOF_DEVICE), _test_cell(source)]
        nb = v4.new_notebook(cells=cells)
        report = execute_resilient(nb, cwd="/tmp", timeout=120)
        assert report.outcomes[2] is Outcome.ERROR, (source, report.outcomes, nb.cells[2].outputs)


def test_a_str_subclass_posing_as_a_device_scores_nothing():
    test = ("d = pick_device()\n"
            "assert isinstance(d, torch.device) and d == torch.device('cuda', 0), f'expected cuda:0, got {d!r}'")
    cells = [_locked_cell(SETUP, "setup"), _answer_cell(H.STR_DEVICE_AS_TORCH, "pick_device"), _test_cell(test)]
    nb = v4.new_notebook(cells=cells)
    report = execute_resilient(nb, cwd="/tmp", timeout=120)
    assert report.outcomes[2] is Outcome.ERROR, report.outcomes


def test_a_tensor_property_patched_through_an_alias_changes_no_verdict():
    """Issue 32: `is_meta` made True for every tensor. The test reads `is_meta` from the kernel
    (an observation the patch can change, as the README says), but compares values here."""
    test = ("t = make()\n"
            "assert torch.equal(t, torch.ones(3)), 'the values must be ones'")
    cells = [_locked_cell(SETUP, "setup"), _answer_cell("def make():\n    return torch.zeros(3)", "make"),
             v4.new_code_cell(H.TENSOR_PROPERTY_ALIAS), _test_cell(test)]
    nb = v4.new_notebook(cells=cells)
    report = execute_resilient(nb, cwd="/tmp", timeout=120)
    assert report.outcomes[3] is Outcome.ERROR, report.outcomes


def _python_storage(text: str) -> bytes:
    """How CPython stores `text` in memory (PEP 393): one, two or four bytes per character."""
    widest = max(map(ord, text))
    return text.encode("latin-1" if widest < 256 else "utf-16-le" if widest < 65536 else "utf-32-le")


def _memory_holds(pid: int, needles: set[str]) -> set[str]:
    """Which of `needles` are anywhere in the process's own memory (heap, stacks, anonymous
    maps: where Python keeps its strings; not the libraries' data), as CPython stores a string
    or as UTF-8 (a message buffer). Narrow text is pulled out first (one pass in C), then
    searched; the few needles with wider characters are looked for in the raw memory."""
    narrow_runs, found = [], set()
    wide = {n: (_python_storage(n), n.encode("utf-8")) for n in needles if max(map(ord, n)) >= 256}
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            parts = line.split()
            path = parts[5] if len(parts) > 5 else ""
            if "r" not in parts[1] or "w" not in parts[1] or (path and not path.startswith("[")):
                continue
            start, end = (int(x, 16) for x in parts[0].split("-"))
            try:
                mem.seek(start)
                chunk = mem.read(end - start)
            except (OSError, ValueError, OverflowError):
                continue
            narrow_runs += re.findall(rb"[\x09\x0a\x20-\x7e\x80-\xff]{8,}", chunk)
            for needle, forms in wide.items():
                if needle not in found and any(f in chunk for f in forms):
                    found.add(needle)
    narrow = b"\0".join(narrow_runs)
    for needle in needles:
        if needle not in wide and (_python_storage(needle) in narrow or needle.encode("utf-8") in narrow):
            found.add(needle)
    return found


def _grep_after(nb, needles, **kwargs):
    found: dict[str, set[str]] = {}

    def inspect_kernel(pid):
        found["found"] = _memory_holds(pid, needles)

    report = execute_resilient(nb, inspect_kernel=inspect_kernel, **kwargs)
    return report, found["found"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/mem")
def test_no_hidden_test_string_is_in_the_kernels_memory(tmp_path):
    """Issue 32: the kernel's memory, grepped after grading, holds no hidden-test message; the
    positive control (a string a student cell made) shows the grep finds what is there. The
    answer also reads every frame above it and prints their strings (attack 12)."""
    spy = v4.new_code_cell("marker = 'visible_' + 'marker_1234'\n" + H.TRACEBACK_PRINT)
    answer = H.TRACEBACK_FRAMES.replace("return 3", "return 2")
    nb = v4.new_notebook(cells=[_locked_cell(SETUP, "setup"), _locked_cell(HELPERS), _answer_cell(answer),
                                _test_cell("expect_two(f())\n" + HIDDEN_SOURCE), spy])
    report, found = _grep_after(nb, {"secret_hidden_message", "visible_marker_1234"}, cwd=tmp_path, timeout=120)
    assert report.outcomes[3] is Outcome.OK, report.outcomes
    assert found == {"visible_marker_1234"}, found
    printed = json.dumps(nb.cells[4].outputs)
    assert "secret" not in printed and "c2VjcmV0" not in printed, printed[:2000]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/mem")
@pytest.mark.parametrize("name", layout.assignments())
def test_no_hidden_test_of_a_chapter_reaches_the_kernel(name, tmp_path):
    """Each chapter's reference answers graded, then the kernel's memory grepped for every
    string constant of its hidden tests: none is there, except the arguments the grader gave
    the answers (what the student's code is handed: a scenario's inputs, never a message) and
    what the answers said themselves."""
    source = notebooks.read(layout.source_notebook(name))
    hidden = guard.hidden_strings(source)
    assert len(hidden) > 10, f"{name}: {len(hidden)} hidden strings: is the test reading the right cells?"
    report, found = _grep_after(source, hidden, cwd=tmp_path, timeout=180)
    assert all(o is not Outcome.ERROR for i, o in enumerate(report.outcomes)
               if notebooks.is_test_cell(source.cells[i])), report.outcomes
    # Not secrets: what the answers were handed, what the notebook's own cells say (the
    # reference answer's error message), and what a kernel holds that ran no test at all
    # (short phrases that PyTorch's own strings contain).
    given = {s for s in found if any(s in sent for sent in report.sent)}
    # ... and what the kernel itself said to the grader before any test could have told it (an
    # answer's own error message, "LOCAL_RANK='one' is not an integer", built by an f-string):
    # the kernel knows only what it is sent, so a string it answered with and was never sent
    # is its own.
    said = {s for s in found - given if any(s in answer for answer in report.received)}
    given |= said
    own = "\n".join(c.source for c in source.cells if not notebooks.is_test_cell(c))
    background = set()
    if found - given:  # a kernel that ran no test is graded only when there is something to explain
        untested = v4.new_notebook(cells=[c for c in source.cells if not notebooks.is_test_cell(c)])
        _, background = _grep_after(untested, found - given, cwd=tmp_path, timeout=180)
    leaked = {s for s in found - given - background if s not in own}
    assert not leaked, f"{name}: hidden-test strings in the kernel's memory: {sorted(leaked)[:10]}"
    assert len(given) < len(hidden) / 2, f"{name}: most hidden strings were sent as arguments: {sorted(given)[:10]}"


def test_an_error_message_counts_against_the_output_caps(tmp_path):
    """Issue 22: `raise ValueError("E" * 24 MiB)` kept its whole message (48 MiB of graded
    notebook). An error is evidence, so it is kept, cut to what the caps leave."""
    nb = v4.new_notebook(cells=[v4.new_code_cell("raise ValueError('E' * 5_000_000)"),
                                v4.new_code_cell("print('after')")])
    report = execute_resilient(nb, cwd=tmp_path, timeout=60, guarded=False,
                               client_kwargs={"max_output_bytes": 100_000, "max_total_output_bytes": 150_000})
    error = nb.cells[0].outputs[0]
    assert report.outcomes[0] is Outcome.ERROR and error.ename == "ValueError"
    assert len(json.dumps(nb)) < 200_000, f"{len(json.dumps(nb)):,} bytes kept"
    assert "characters cut" in error.evalue and report.dropped_output_bytes > 4_000_000


def test_submission_files_are_copied_without_following_symlinks(tmp_path):
    here, scratch, submitted = tmp_path / "autograded", tmp_path / "scratch", tmp_path / "submitted"
    for folder in (here, scratch, submitted):
        folder.mkdir()
    secret = tmp_path / "gradebook.db"
    secret.write_text("secret")
    (here / "data.csv").write_text("1,2\n")
    (here / "link.txt").symlink_to(secret)
    (here / "copied-from-a-link.txt").write_text("secret")  # what nbgrader made of a link
    (submitted / "copied-from-a-link.txt").symlink_to(secret)
    (here / "answers.ipynb").write_text("{}")
    skipped = copy_data_files(str(here), str(scratch), str(submitted))
    assert sorted(p.name for p in scratch.iterdir()) == ["data.csv"]
    assert sorted(skipped) == ["copied-from-a-link.txt", "link.txt"]


def test_feedback_loads_nothing_remote_and_redacts_what_a_reader_would_see():
    """Issue 32: a hidden message written as character references with zero-width spaces came
    through redaction (it ran before the sanitizer decoded them), and a remote <img> in an
    output or a Markdown output was a tracking pixel. Redaction now reads the sanitized,
    decoded text; only data: images remain."""
    from nbconvert import HTMLExporter

    from coursetools.instructor.nbgrader_ext import remote_references, sanitize_rich_outputs

    secret = "secret_hidden_message"
    cell = v4.new_code_cell("x")
    cell.outputs = [
        v4.new_output("display_data", data={"text/html": "".join(f"&#{ord(c)};&#8203;" for c in secret)}),
        v4.new_output("display_data", data={"text/markdown": "![p](https://tracker.example.org/p.gif)"}),
        v4.new_output("display_data", data={"text/html": '<img src="https://tracker.example.org/q.gif">'
                                                         '<img src="data:image/png;base64,iVBORw0KGgo=">'
                                                         '<a href="https://tracker.example.org/">x</a>'}),
    ]
    md = v4.new_markdown_cell("![p](https://tracker.example.org/m.gif) and ![ok](data:image/png;base64,iVBORw0KGgo=)")
    nb = v4.new_notebook(cells=[cell, md])
    sanitize_rich_outputs(nb)
    guard.redact(nb, {secret})
    nb, _ = SafeOutputs().preprocess(nb, {})
    html, _ = HTMLExporter(sanitize_html=True).from_notebook_node(nb)
    from nbconvert.filters import markdown2html
    html += markdown2html(nb.cells[1].source)
    assert secret not in guard.plain_text(html), "the hidden message is readable in the feedback"
    assert "tracker.example.org" not in html, "a remote reference is left in the feedback"
    # The check the class simulation and the Chinese feedback page go through (an nbgrader
    # feedback page, unlike this bare export, loads nothing: tests/instructor/test_classroom.py).
    assert remote_references('<img alt="p" src="https://tracker.example.org/p.gif"><script src=//cdn.example/x.js>'
                             '<div style="background: url(https://tracker.example.org/c.png)">') == [
        "https://tracker.example.org/p.gif", "//cdn.example/x.js", "https://tracker.example.org/c.png"]
    assert html.count("data:image/png;base64,iVBORw0KGgo=") >= 2, "data: images stay"


_COURSE_HELPERS = ("def call_answer(fn, hint=''):\n"
                   "    return fn()\n")
_FORGED_HELPERS = ("def call_answer(fn, hint=''):\n"
                   "    return 2\n")


def _helpers_cell(source):
    cell = v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade": False, "solution": False, "locked": True, "grade_id": "helpers",
                                 "schema_version": 3, "task": False}
    return cell


@pytest.mark.parametrize("where", ["added after", "added before", "altered"])
def test_a_submitted_helpers_cell_never_reaches_the_grader(tmp_path, monkeypatch, where):
    """The helpers the tests run in the grader's process (call_answer, expect_error, ...) come
    from the course's own helpers cell (the gradebook's, else the source notebook's), never
    from the submission, whatever nbgrader's earlier steps did: here none ran. A helpers cell
    the student added or altered, whose `call_answer` answers 2 whatever the answer returns,
    scored 2/2 for an answer returning 3 before; now 0."""
    from traitlets.config import Config
    from coursetools.grading import sandbox
    from coursetools.instructor.nbgrader_ext import ResilientExecute

    monkeypatch.setenv(sandbox.ALLOW_ROOT_ENV, "1")
    answer = v4.new_code_cell(WRONG_F)
    answer.metadata["nbgrader"] = {"grade": False, "solution": True, "locked": False, "grade_id": "f",
                                   "schema_version": 3, "task": False}
    test = _test_cell("assert call_answer(f) == 2, 'f() must return 2'")
    source = v4.new_notebook(cells=[_helpers_cell(_COURSE_HELPERS), answer, test])
    notebooks.write(source, tmp_path / "solutions" / "ch" / "ch.ipynb")
    cells = {"added after": [_helpers_cell(_COURSE_HELPERS), _helpers_cell(_FORGED_HELPERS)],
             "added before": [_helpers_cell(_FORGED_HELPERS), _helpers_cell(_COURSE_HELPERS)],
             "altered": [_helpers_cell(_FORGED_HELPERS)]}[where]
    submitted = v4.new_notebook(cells=[*cells, answer, _test_cell(test.source)])
    config = Config()
    config.CourseDirectory.root = str(tmp_path)
    config.CourseDirectory.source_directory = "solutions"
    step = ResilientExecute(config=config, sandbox="off")
    here = tmp_path / "submitted" / "alice" / "ch"
    here.mkdir(parents=True)
    nb, _ = step.preprocess(submitted, {"metadata": {"path": str(here)}, "unique_key": "helpers",
                                        "nbgrader": {"assignment": "ch", "notebook": "ch", "student": "alice"}})
    from nbgrader.utils import determine_grade
    assert determine_grade(nb.cells[-1])[0] == 0, nb.cells[-1].outputs
    assert "f() must return 2" in str(nb.cells[-1].outputs), nb.cells[-1].outputs  # failed on the answer


_KERNEL_DECIDES_GPU = re.compile(r"^\s*(if|elif|while)\b.*((?<![.\w])device\.type\s*[!=]=|torch\.cuda\.is_available\(\))")


def test_no_test_cell_lets_the_kernel_decide_whether_the_gpu_checks_run():
    """A hidden test's real-GPU checks run when the grader says it has a GPU (grader_device(),
    coursetools/grading/hardware.py), never on a value the kernel reports: the notebook's global
    `device`, which an answer cell can rebind to the CPU, or the kernel's torch.cuda.is_available().
    Before, 21 test cells branched so (chapters 01-05 and 07)."""
    found = []
    for name in layout.assignments():
        nb = notebooks.read(layout.source_notebook(name))
        for cell in notebooks.test_cells(nb):
            lines = cell.source.splitlines()
            for i, line in enumerate(lines):
                rebound = i > 0 and lines[i - 1].strip().startswith("device = grader_device()")
                if _KERNEL_DECIDES_GPU.match(line) and not rebound:
                    found.append(f"{name} {notebooks.grade_id(cell)}: {line.strip()}")
    assert not found, found


@pytest.mark.parametrize("answer", ["honest", "rebinds device"])
def test_the_grader_decides_whether_the_gpu_branch_runs(monkeypatch, answer):
    """An answer cell that rebinds the notebook's `device` to the CPU no longer skips a hidden
    test's GPU branch on a GPU grader (played here with COURSE_GRADER_DEVICE=cuda on a CPU-only
    machine: the branch runs, and on this machine fails trying to use CUDA). Before, the
    rebinding made the test print "skipped" and pass."""
    from coursetools.grading import hardware
    monkeypatch.setenv(hardware.ENV, "cuda")
    setup = v4.new_code_cell('import torch\ndevice = torch.device("cpu")')
    rebind = v4.new_code_cell('device = torch.device("cpu")' if answer == "rebinds device" else "pass")
    test = _test_cell('device = grader_device()\n'
                      'if device.type != "cpu":\n'
                      '    assert str(device) == "cuda", device\n'
                      '    raise AssertionError("the GPU branch ran")\n'
                      'else:\n'
                      '    print("skipped the real-accelerator check")')
    nb = v4.new_notebook(cells=[setup, rebind, test])
    report = execute_resilient(nb, cwd="/tmp", timeout=60)
    assert report.outcomes[2] is Outcome.ERROR, nb.cells[2].outputs
    assert "the GPU branch ran" in str(nb.cells[2].outputs), nb.cells[2].outputs
    monkeypatch.setenv(hardware.ENV, "cpu")
    nb = v4.new_notebook(cells=[setup, rebind, _test_cell(test.source)])
    report = execute_resilient(nb, cwd="/tmp", timeout=60)
    assert report.outcomes[2] is Outcome.OK and "skipped" in str(nb.cells[2].outputs), nb.cells[2].outputs


@pytest.mark.parametrize("kind", ["cuda", "cpu"])
def test_an_unguarded_run_gives_the_tests_the_graders_device(monkeypatch, tmp_path, kind):
    """With tamper checks off (an instructor's --no-tamper-checks) the tests run in the kernel,
    where the grader defines `grader_device()` with its own answer: an honest notebook's hidden
    GPU branch neither fails on a NameError nor depends on the notebook's `device`."""
    from coursetools.grading import hardware
    monkeypatch.setenv(hardware.ENV, kind)
    setup = v4.new_code_cell('import torch\ndevice = torch.device("cpu")')
    test = _test_cell('d = grader_device()\nprint("grader says", d.type)\nassert d.type == "' + kind + '", d')
    nb = v4.new_notebook(cells=[setup, test])
    report = execute_resilient(nb, cwd=tmp_path, timeout=60, guarded=False)
    assert len(report.outcomes) == 2, report.outcomes
    assert report.outcomes[1] is Outcome.OK, nb.cells[1].outputs
    assert f"grader says {kind}" in str(nb.cells[1].outputs), nb.cells[1].outputs
