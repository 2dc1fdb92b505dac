"""Grading that the student's code cannot forge, bounded in cost, with feedback that shows no
hidden test and runs no script (issue 13). The class simulation (tests/test_classroom.py)
grades one hostile submission per attack through nbgrader; these are the pieces underneath,
on small notebooks."""

from __future__ import annotations

import os
import re

import pytest
from nbformat import v4

from coursetools import execute, guard, notebooks
from coursetools.execute import BUDGET_ENAME, Outcome, execute_resilient
from coursetools.nbgrader_ext import (
    ClearHiddenTestsSafely,
    SafeOutputs,
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


def test_hidden_tests_reach_the_kernel_compiled_not_as_text(tmp_path):
    """A cell after the tests looks everywhere text lands (history, linecache): no hidden line."""
    spy = v4.new_code_cell(
        "import linecache\n"
        "seen = [str(x) for x in In] + [''.join(e[2]) for e in list(linecache.cache.values()) if len(e) > 2]\n"
        "text = '\\n'.join(seen)\n"
        "print('secret_' + 'hidden_message' in text, 'b64' + 'decode' in text)")
    nb = v4.new_notebook(cells=[v4.new_code_cell("def f():\n    return 2"), _test_cell(HIDDEN_SOURCE), spy])
    report = execute_resilient(nb, cwd=tmp_path, timeout=60)
    assert report.outcomes[1] is Outcome.OK and not report.tampering, (report.outcomes, report.tampering)
    assert nb.cells[2].outputs[0].text.split() == ["False", "False"], nb.cells[2].outputs


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
    html, _ = HTMLExporter(sanitize_html=True).from_notebook_node(nb)
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
