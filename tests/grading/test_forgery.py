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


def _stopped_and_flagged(nb, report, what):
    results = _test_results(nb, report)
    assert all(o is Outcome.ERROR for o in results.values()), f"{what}: a forged pass: {results}"
    assert report.tampering, f"{what}: failed but not flagged: {report.outcomes}"


def test_an_honest_notebook_passes_under_the_guard():
    nb, report = _graded(answer="def f():\n    return 2")
    assert all(o is Outcome.OK for o in _test_results(nb, report).values()), (report.outcomes, report.tampering)
    assert not report.tampering and not report.forged


def test_the_guard_never_calls_the_notebooks_get_ipython():
    """Issue 22: the checks looked `get_ipython` up in the user namespace, so a student's
    get_ipython ran inside every check. Here one counts its calls, honestly answering."""
    counter = ("from IPython import get_ipython as _real\n_calls = []\n"
               "def get_ipython():\n    _calls.append(1)\n    return _real()")
    nb, report = _graded(counter, "print('CALLS', len(_calls))", answer="def f():\n    return 2")
    printed = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert "CALLS 0" in printed, printed
    assert not report.tampering, report.tampering


def test_the_checks_do_not_use_the_notebooks_globals():
    """A student's `globals` hands the check a copy of the namespace taken before the course's
    helper was replaced: the check reads the real namespace and flags the replacement."""
    cheat = ("_before = dict(globals())\n"
             "def expect_two(value):\n    pass\n"
             "def globals():\n    return _before")
    nb, report = _graded(cheat)
    _stopped_and_flagged(nb, report, "shadowed globals")
    assert "expect_two" in " ".join(report.tampering.values())


def test_a_session_send_patched_during_a_test_is_undone_and_flagged():
    """Issue 22: the answer patches the session's `send` while the test runs (drops the error,
    rewrites the reply to ok) and removes the patch afterwards. The guard compares the kernel's
    machinery right after the test's code, inside the test cell, and undoes it before the reply."""
    nb, report = _graded(answer=H.SESSION_SEND + "\nf = _forge_pass")
    _stopped_and_flagged(nb, report, "session send")
    assert "session" in " ".join(report.tampering.values())


def test_a_forged_reply_is_caught():
    """The answer sends an "ok" reply and an idle status for the running test, patching
    nothing: the real reply follows, and two replies for one request fail the test."""
    nb, report = _graded(answer=H.FORGED_REPLY + "\nf = _forge_pass")
    _stopped_and_flagged(nb, report, "forged reply")
    assert execute.FORGED_REPLY in " ".join(report.tampering.values())


def test_a_replaced_magic_number_is_flagged():
    """Issue 22: importlib.util.MAGIC_NUMBER (which the compiled test cells of issue 13
    compared first) replaced by an object whose `!=` forges a reply. The cells no longer read
    it, and the module's globals are compared."""
    nb, report = _graded(H.MAGIC_NUMBER)
    _stopped_and_flagged(nb, report, "magic number")
    assert "MAGIC_NUMBER" in " ".join(report.tampering.values())


def test_non_callable_attributes_and_module_globals_are_compared():
    """Issue 22: the display hook's `session` replaced by one that drops errors, and
    ipykernel.kernelbase.json_clean by one that turns an error reply into ok."""
    nb, report = _graded(H.NON_CALLABLE)
    _stopped_and_flagged(nb, report, "non-callable attributes")
    flagged = " ".join(report.tampering.values())
    assert "json_clean" in flagged and "displayhook" in flagged, flagged


def test_a_class_posing_as_a_torch_type_from_another_module_is_caught():
    """Issue 22: a str subclass posing as torch.device with __module__ = 'torch' (the check
    of issue 13 looked at __main__ classes only). Its origin is the cell that defined it."""
    test = ("d = pick_device()\n"
            "assert isinstance(d, torch.device) and d == torch.device('cuda', 0), f'expected cuda:0, got {d!r}'")
    cells = [_locked_cell(SETUP, "setup"), _answer_cell(H.STR_DEVICE_AS_TORCH, "pick_device"), _test_cell(test)]
    nb = v4.new_notebook(cells=cells)
    report = execute_resilient(nb, cwd="/tmp", timeout=120)
    assert report.outcomes[2] is Outcome.ERROR and report.tampering, (report.outcomes, report.tampering)
    assert "_Device" in report.tampering[2], report.tampering


def test_frame_access_from_an_answer_is_noticed_and_hidden_constants_are_redacted():
    """Issue 22: the answer keeps the calling test's code object (sys._getframe(1).f_code); a
    later cell prints its string constants. The audit hook notices the frame access (the
    test fails, flagged) and redaction removes the hidden tests' messages from every output."""
    answer = "def _honest():\n    return 2\n" + H.FRAME_LEAK_WRAPPER.replace("pick_device", "f").replace(
        "_honest_f = f", "_honest_f = _honest")
    cells = [_locked_cell(SETUP, "setup"), _answer_cell(answer),
             _test_cell("assert f() == 2\n" + HIDDEN_SOURCE), v4.new_code_cell(H.FRAME_LEAK_PRINT)]
    nb = v4.new_notebook(cells=cells)
    report = execute_resilient(nb, cwd="/tmp", timeout=120)
    assert report.outcomes[2] is Outcome.ERROR and "frame access" in report.tampering.get(2, ""), report.tampering
    printed = "".join(o.get("text", "") for o in nb.cells[3].outputs)
    assert "secret_hidden_message" in printed, "the leak did not happen: nothing to redact"
    hidden = guard.hidden_text(nb)
    assert "secret_hidden_message" in hidden and "f() must return 2" not in hidden, hidden
    guard.redact(nb, hidden)
    assert "secret_hidden_message" not in json.dumps(nb.cells[3].outputs)


def test_a_check_cell_rewritten_by_a_transformer_is_flagged():
    """An AST transformer that wraps the grader's test cells in try/except (the last part of
    issue 22's closure-key attack) is itself one of the things the checks compare."""
    swallow = "import ast\n" + H.CLOSURE_KEY[H.CLOSURE_KEY.index("class _Swallow"):].replace(
        'n.id == "exec"', 'n.id == "run"').replace("isinstance(n, ast.Name) and n.id", "isinstance(n, ast.Attribute) and n.attr")
    nb, report = _graded(swallow)
    _stopped_and_flagged(nb, report, "AST transformer")


@pytest.mark.parametrize("role", ["grader_compiled", "verify"])
def test_a_grader_cell_that_does_not_run_as_sent_is_flagged(monkeypatch, role):
    """What such a transformer leaves, without the transformer in place any more (it can take
    itself out while a check runs): the guard's `run` and `verify` compare the code that calls
    them with the grader's cell, and a wrapped cell is not it."""
    real = guard.instrument

    def rewritten(nb, name=None):
        inst = real(nb, name)
        for cell in inst.nb.cells:
            if role == "grader_compiled" and cell.metadata.get("grader_compiled"):
                body = cell.source.split("\n", 1)[1]
                cell.source = f"try:\n    {body}\nexcept BaseException:\n    pass"
            elif role == "verify" and guard.guard_role(cell) == "verify":
                cell.source = f"(lambda: {cell.source})()"
        return inst

    monkeypatch.setattr(guard, "instrument", rewritten)
    nb, report = _graded()
    _stopped_and_flagged(nb, report, f"rewritten {role} cell")
    assert "rewritten" in " ".join(report.tampering.values()), report.tampering


def test_the_kernel_side_is_a_module_sent_as_source():
    """guard_kernel.py is a module the grader's tools can import and read (importing it runs
    nothing); the kernel gets its source in the first cell, and never imports it."""
    import inspect
    import subprocess
    import sys

    from coursetools.grading import guard_kernel

    assert guard.kernel_source() == inspect.getsource(guard_kernel)
    probe = ("import sys; import coursetools.grading.guard_kernel as g; "
             "print(callable(g.install), 'torch' in sys.modules, 'IPython' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                         cwd=str(layout.ROOT)).stdout.split()
    assert out == ["True", "False", "False"], out
    inst = guard.instrument(v4.new_notebook(cells=[_test_cell(HIDDEN_SOURCE)]))
    init = inst.nb.cells[0].source
    assert repr(guard.kernel_source()) in init and "import coursetools" not in init


def test_a_torch_mode_left_entered_is_flagged_but_a_default_device_is_not():
    """A TorchFunctionMode that a student cell enters and never leaves answers for every torch
    call of the tests (a tensor's device included): compared. torch.set_default_device keeps a
    mode of PyTorch's own on that stack, which answers may need: not compared."""
    mode = ("from torch.overrides import TorchFunctionMode\n"
            "class _Yes(TorchFunctionMode):\n"
            "    def __torch_function__(self, func, types, args=(), kwargs=None):\n"
            "        return func(*args, **(kwargs or {}))\n"
            "_Yes().__enter__()")
    nb, report = _graded(mode, answer="def f():\n    return 2")
    assert "modes left entered" in " ".join(report.tampering.values()), report.tampering
    nb, report = _graded("torch.set_default_device('cpu')", answer="def f():\n    return 2")
    assert not report.tampering, report.tampering


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


def test_a_child_process_cannot_open_the_kernels_memory():
    """The guard makes the kernel non-dumpable: a process it starts, running as the same user,
    could otherwise open /proc/<kernel>/mem and rewrite the kernel (measured: it could, in the
    sandbox, before). Run as the sandboxed kernel runs (root's children could anyway)."""
    import inspect
    import subprocess
    import sys

    from coursetools.grading import guard_kernel, sandbox

    child = ("import os\ntry:\n    open(f'/proc/{os.getppid()}/mem', 'r+b')\n    print('OPENED')\n"
             "except OSError as exc:\n    print('REFUSED', exc.errno)")
    probe = (inspect.getsource(guard_kernel.non_dumpable) + "\nimport subprocess, sys\n"
             "print('BEFORE', subprocess.run([sys.executable, '-c', CHILD], capture_output=True, text=True).stdout)\n"
             "flag = non_dumpable()\n"
             "print('FLAG', flag())\n"
             "print('AFTER', subprocess.run([sys.executable, '-c', CHILD], capture_output=True, text=True).stdout)\n"
             ).replace("CHILD", repr(child))
    if sandbox.bwrap_works()[0]:
        config = sandbox.SandboxConfig(mode="bwrap")
        cmd, env = sandbox.wrap_command([sys.executable, "-c", probe], config, writable=[]), sandbox.sandbox_env(config)
    elif sandbox.is_root():
        pytest.skip("as root without the sandbox, a child process may open any memory")
    else:
        cmd, env = [sys.executable, "-c", probe], None
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env).stdout
    if not sys.platform.startswith("linux"):
        pytest.skip("prctl is Linux's")
    assert "BEFORE OPENED" in out and "FLAG 0" in out and "AFTER REFUSED 13" in out, out
