"""The tests' messages in Chinese (issue 38): templates read from the tests' source, matched
against what a run printed, and the Chinese line under the English in `make.py check` and on
the feedback page (coursetools/publish/i18n/testmessages.py).

The real messages of real wrong answers are checked where they are made: every failing test of
every graded fixture must have its Chinese (tests/course/test_grading.py,
`test_every_failure_has_its_chinese`); here, the machinery and the catalogue."""

from __future__ import annotations

import copy
import textwrap
from pathlib import Path

import polib
import pytest

from coursetools import layout, notebooks
from coursetools.grading import hints
from coursetools.instructor import nbgrader_ext
from coursetools.learner import selfcheck
from coursetools.publish import i18n
from coursetools.publish.i18n import catalog, checks, testmessages

ROOT = layout.ROOT


def _templates(source: str, helpers: str = "") -> list[str]:
    return testmessages.templates_of([textwrap.dedent(helpers), textwrap.dedent(source)])


def test_templates_keep_holes_join_texts_and_split_off_the_fix():
    found = _templates('''
        HINT = "a 0-dim CPU tensor mixes with any device, so it is not a mismatch"
        assert got == want, f"with one CUDA GPU expected cuda:0, got {got}" + (
            ": tensors report cuda:0, not cuda" if got == "cuda" else ": is the CPU hard-coded?")
        assert ok, f"{HINT}; expected meta, got {got!r}"
        assert fine, ("the model was built on the CPU and then moved, "
                      f"{n} copies" + fix_hint("build it on the device instead of moving it"))
        value = call_answer(lambda: f(), f"common_device({{'inputs': <meta>}}) should be meta: {HINT}")
        expect_error(ValueError, lambda: g(), hint="'gpu' is not a PyTorch device type")
        assert short, f"{x}"
    ''')
    assert sorted(found) == sorted([
        "with one CUDA GPU expected cuda:0, got {got}: tensors report cuda:0, not cuda",
        "with one CUDA GPU expected cuda:0, got {got}: is the CPU hard-coded?",
        "a 0-dim CPU tensor mixes with any device, so it is not a mismatch; expected meta, got {got!r}",
        "the model was built on the CPU and then moved, {n} copies",
        "build it on the device instead of moving it",
        "common_device({{'inputs': <meta>}}) should be meta: a 0-dim CPU tensor mixes with any device, "
        "so it is not a mismatch",
        "'gpu' is not a PyTorch device type",
    ]), found


def test_helpers_cell_messages_and_its_constants_reach_every_test_cell():
    found = _templates('assert ok, f"{PREFIX} went wrong in {where}"',
                       helpers='''
        PREFIX = "the lesson's rule"
        def expect_error(kind, fn, hint=""):
            raise AssertionError(f"expected {kind.__name__}, but nothing was raised. {hint}")
    ''')
    assert found == ["expected {kind.__name__}, but nothing was raised. {hint}",
                     "the lesson's rule went wrong in {where}"], found


def _root_with(tmp_path: Path, entries: dict[str, str], assignment: str = "01_x") -> Path:
    po = polib.POFile()
    for msgid, msgstr in entries.items():
        po.append(polib.POEntry(msgctxt=testmessages.CONTEXT, msgid=msgid, msgstr=msgstr))
    path = tmp_path / "locale" / "zh_CN" / "exercises" / f"{assignment}.po"
    path.parent.mkdir(parents=True)
    po.save(str(path))
    testmessages.catalog.cache_clear()
    return tmp_path


def test_translate_fills_holes_collapses_whitespace_and_translates_a_hint_inside(tmp_path):
    root = _root_with(tmp_path, {
        "on a machine without any GPU expected cpu, got {got}": "在没有 GPU 的机器上应得到 cpu，实际得到 {got}",
        "expected {kind.__name__}, got {type(exc).__name__}: {exc}. {hint}":
            "应当抛出 {kind.__name__}，实际抛出 {type(exc).__name__}：{exc}。{hint}",
        "'gpu' is not a PyTorch device type (NVIDIA GPUs are 'cuda')": "'gpu' 不是 PyTorch 的设备类型（NVIDIA GPU 是 'cuda'）",
        "{a} and {b} differ; {{literal}} braces": "{b} 与 {a} 不同；{{literal}} 花括号",
        "a short rule": "短规则",
    })
    try:
        assert testmessages.translate("01_x", "on a machine without  any GPU\nexpected cpu, got cuda:0", root) == (
            "在没有 GPU 的机器上应得到 cpu，实际得到 cuda:0")
        assert testmessages.translate(
            "01_x", "expected ValueError, got KeyError: 'gpu'. 'gpu' is not a PyTorch device type (NVIDIA GPUs are 'cuda')",
            root) == "应当抛出 ValueError，实际抛出 KeyError：'gpu'。'gpu' 不是 PyTorch 的设备类型（NVIDIA GPU 是 'cuda'）"
        assert testmessages.translate("01_x", "x1 and y2 differ; {literal} braces", root) == "y2 与 x1 不同；{literal} 花括号"
        assert testmessages.translate("01_x", "something no test says", root) is None
        assert testmessages.translate("01_x", "a short rule, and more", root) is None  # whole messages only
        # what make.py check and the feedback page pass: an exception name, a test line, Chinese
        assert testmessages.hint("01_x", "AssertionError: a short rule (test line 7)", root) == "短规则"
        assert testmessages.hint("01_x", "未作答：a short rule", root) == ""
    finally:
        testmessages.catalog.cache_clear()


def test_the_check_holds_a_translation_to_the_templates_holes():
    context = catalog.CONTEXTS["message"]
    ok = checks.entry_problems("got {got!r}, expected {want}", "期望 {want}，实际 {got!r}", context, [])
    assert ok == [], ok
    lost = checks.entry_problems("got {got!r}, expected {want}", "期望 {want}，实际 {got}", context, [])
    assert any("holes" in p for p in lost), lost
    # a hole's code is not prose: no glossary complaint about `tensor` inside a hole
    terms = checks.glossary(ROOT)
    assert checks.entry_problems("the {tensor.device} is wrong", "{tensor.device} 不对", context, terms) == []


def test_every_test_message_of_every_exercise_is_translated():
    """New tests arrive with their Chinese in the same change (`make.py i18n update`, then
    translate the entries with msgctxt "test message")."""
    missing = []
    for name in layout.assignments():
        po = catalog.load(ROOT / "locale" / "zh_CN" / "exercises" / f"{name}.po")
        have = {e.msgid for e in po.translated_entries() if e.msgctxt == testmessages.CONTEXT}
        missing += [f"{name}: {msgid[:90]!r}" for msgid, _ in testmessages.exercise_templates(name)
                    if msgid not in have]
    assert not missing, f"{len(missing)} test messages have no Chinese:\n" + "\n".join(missing[:20])


def test_every_grader_message_is_translated():
    po = catalog.load(ROOT / i18n.MESSAGES)
    have = {e.msgid for e in po.translated_entries() if e.msgctxt == testmessages.GRADER_CONTEXT}
    wanted = {msgid for msgid, _ in testmessages.grader_templates(ROOT)}
    assert wanted and wanted <= have, sorted(wanted - have)


def _fixes(name: str) -> list[str]:
    """The exercise's fix texts (fix_hint's argument) that have no hole."""
    source = notebooks.read(layout.source_notebook(name))
    found = []
    for cell in notebooks.test_cells(source):
        found += testmessages.templates_of([cell.source], {"fix_hint": 0}, statements=False)
    return [f for f in found if "{" not in f]


def _failing_result(message: str) -> selfcheck.QuestionResult:
    return selfcheck.QuestionResult("test_pick_device_auto", "pick_device()", 0.0, 2.0, message)


def test_check_report_prints_the_chinese_under_the_english_and_the_fix_only_when_asked():
    english = ("AssertionError: on a machine without any GPU expected cpu, got cuda:0: the fallback chain "
               "ends on the CPU, and pick_device asks the machine what it has (lesson 01 §7)")
    fix = _fixes("01_device_basics")[0]
    message = english + hints.FIX_MARKER + fix
    i18n.set_language("zh")
    try:
        brief = selfcheck.format_report(Path("x.ipynb"), "01_device_basics", [_failing_result(message)], 1.0, False)
        full = selfcheck.format_report(Path("x.ipynb"), "01_device_basics", [_failing_result(message)], 1.0, False,
                                       explain=True)
    finally:
        i18n.set_language("en")
    lines = brief.splitlines()
    at = next(i for i, line in enumerate(lines) if "on a machine without any GPU" in line)
    hint = next(i for i, line in enumerate(lines) if line.strip().startswith("提示："))
    assert at < hint <= at + 2 and "cuda:0" in lines[hint], brief  # under the English (two lines, wrapped)
    assert brief.count("提示：") == 1, brief  # the fix's Chinese only with --explain
    english_report = selfcheck.format_report(Path("x.ipynb"), "01_device_basics", [_failing_result(message)], 1.0, False)
    assert "提示" not in english_report
    # with --explain the fix: the English under "How to fix:", the Chinese under 修正方法 (
    # 提示 stays the observation's label)
    assert full.count("提示：") == 1 and full.count("修正方法：") == 1 and "How to fix: " in full, full
    fix_line = next(i for i, line in enumerate(full.splitlines()) if "修正方法：" in line)
    assert i18n.CJK.search(full.splitlines()[fix_line].split("修正方法：", 1)[1]), full


def test_feedback_page_cell_gets_the_chinese_hint_and_a_bilingual_fix():
    from nbformat import v4
    cell = v4.new_code_cell("assert False")
    cell.metadata["nbgrader"] = {"grade": True, "solution": False, "grade_id": "t", "points": 1}
    fix = _fixes("01_device_basics")[0]
    cell.outputs = [v4.new_output("error", ename="AssertionError", traceback=[],
                                  evalue=("on a machine without any GPU expected cpu, got cuda:0: the fallback "
                                          "chain ends on the CPU, and pick_device asks the machine what it has "
                                          "(lesson 01 §7) (test line 3)")
                                  + hints.FIX_MARKER + fix)]
    english = v4.new_code_cell("assert False")
    english.metadata = cell.metadata
    english.outputs = copy.deepcopy(cell.outputs)
    nbgrader_ext.fold_fixes(english, "01_device_basics", chinese=False)
    assert "提示" not in str(english.outputs)
    nbgrader_ext.fold_fixes(cell, "01_device_basics", chinese=True)
    kinds = [o.output_type for o in cell.outputs]
    assert kinds == ["error", "display_data", "display_data"], kinds
    assert cell.outputs[1].data["text/plain"].startswith("提示：") and "cuda:0" in cell.outputs[1].data["text/plain"]
    details = cell.outputs[2].data["text/html"]
    assert "<details>" in details and fix.split()[0] in details and "修正方法：" in details and "提示：" not in details
    hidden = v4.new_code_cell("assert False")
    hidden.metadata = cell.metadata
    hidden.outputs = [v4.new_output("error", ename="AssertionError", traceback=[],
                                    evalue="a hidden test failed (hidden tests are not shown)")]
    nbgrader_ext.fold_fixes(hidden, "01_device_basics", chinese=True)
    assert hidden.outputs[1].data["text/plain"] == "提示：某个隐藏测试没有通过（隐藏测试的内容不显示）"


@pytest.mark.parametrize("text", [
    "提示：在没有任何 GPU 的机器上应当得到 cpu，实际得到 cuda:0。这句话很长，用来检查折行，逗号之前从不断开，而 torch.device(\"cuda\") 不会被拆开。",
    "short",
])
def test_chinese_lines_fit_the_terminal(text):
    import unicodedata
    lines = selfcheck.wrap_columns(text, 40)
    assert "".join(lines).replace(" ", "") == text.replace(" ", "")
    for line in lines:
        assert sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in line) <= 40, line
        assert line[:1] not in "，。；：）", line
