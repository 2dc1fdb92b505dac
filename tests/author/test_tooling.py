"""Unit tests of coursetools: the pieces the self-check and the grading tests rely on."""

from __future__ import annotations

import pytest
from nbformat import v4

from coursetools.author import fixtures
from coursetools import layout, notebooks
from coursetools.grading.execute import Outcome
from coursetools.learner.selfcheck import rebuild, score_cells


@pytest.mark.parametrize("name", layout.assignments())
def test_clear_solution_matches_nbgrader_release(name):
    """The self-check rebuilds a deleted answer cell as nbgrader's stub: same text as the release."""
    source = notebooks.read(layout.source_notebook(name))
    release = {notebooks.grade_id(c): c.source for c in notebooks.read(layout.release_notebook(name)).cells}
    for cell in source.cells:
        if notebooks.is_solution(cell):
            assert notebooks.clear_solution(cell.source) == release[notebooks.grade_id(cell)]


def _test_cell(outputs, points=2):
    cell = v4.new_code_cell("assert True")
    cell.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True, "grade_id": "test_x",
                                 "points": points, "schema_version": 3, "task": False}
    cell.outputs = outputs
    return cell


@pytest.mark.parametrize("outputs, outcome", [
    ([], Outcome.OK),
    ([v4.new_output("stream", name="stdout", text="fine\n")], Outcome.OK),
    ([v4.new_output("error", ename="AssertionError", evalue="no", traceback=[])], Outcome.ERROR),
    ([v4.new_output("stream", name="stderr", text="UserWarning: x\n")], Outcome.ERROR),
])
def test_scoring_rule_matches_nbgrader_determine_grade(outputs, outcome):
    from nbgrader.utils import determine_grade
    cell = _test_cell(outputs)
    nb = v4.new_notebook(cells=[cell])
    ours = score_cells(nb, [outcome])[0].score
    theirs, _ = determine_grade(cell)
    assert ours == theirs


def test_a_test_that_never_ran_scores_zero_unlike_plain_nbgrader():
    from nbgrader.utils import determine_grade
    cell = _test_cell([])
    assert determine_grade(cell)[0] == 2  # nbgrader: no output = full credit
    assert score_cells(v4.new_notebook(cells=[cell]), [Outcome.NOT_RUN])[0].score == 0


def test_rebuild_keeps_answers_and_extra_cells_and_restores_the_rest():
    source = v4.new_notebook(cells=[
        v4.new_code_cell("setup = 1", metadata={"nbgrader": {"grade_id": "setup", "locked": True}}),
        v4.new_code_cell("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION",
                         metadata={"nbgrader": {"grade_id": "f", "solution": True}}),
        v4.new_code_cell("assert f() == 1\n### BEGIN HIDDEN TESTS\nassert f() + 1 == 2\n### END HIDDEN TESTS",
                         metadata={"nbgrader": {"grade_id": "test_f", "grade": True, "points": 1}}),
    ])
    learner = v4.new_notebook(cells=[
        v4.new_code_cell("setup = 'hacked'", metadata={"nbgrader": {"grade_id": "setup"}}),
        v4.new_code_cell("def f():\n    return 1", metadata={"nbgrader": {"grade_id": "f", "solution": True}}),
        v4.new_code_cell("print('my scratch work')"),
    ])  # the test cell was deleted
    graded = rebuild(learner, source)
    assert [c.source for c in graded.cells] == [
        "setup = 1", "def f():\n    return 1", "print('my scratch work')", source.cells[2].source]
    visible = rebuild(learner, source, visible_only=True)
    assert visible.cells[-1].source == "assert f() == 1"
    missing_answer = rebuild(v4.new_notebook(cells=[]), source)
    assert missing_answer.cells[1].source == "def f():\n    " + notebooks.CODE_STUB.replace("\n", "\n    ")


@pytest.mark.parametrize("text, problem", [
    ("kind = 'maybe'\ndescription='x'\n[answers]\nf='x'", "kind must be one of"),
    ("kind = 'wrong'\ndescription='x'\nloses=[]\n[answers]\nf='x'", "must lose points"),
    ("kind = 'alternative'\ndescription='x'\nloses=['test_f']\n[answers]\nf='x'", "must lose nothing"),
    ("kind = 'wrong'\nloses=['t']\n[answers]\nf='x'", "misconception"),
    ("kind = 'wrong'\ndescription='x'\nloses=['t']", "replaces no answer cell"),
    ("kind = 'wrong' description", "not valid TOML"),
    ("kind = 'wrong'\ndescription='x'\nloses=['t']\n[answers]\nf='x'\n[shows]\nu=['y']", "does not lose"),
    ("kind = 'wrong'\ndescription='x'\nloses=['t']\n[answers]\nf='x'\n[shows]\nt=[]", "non-empty"),
])
def test_fixture_files_are_validated(tmp_path, text, problem):
    path = tmp_path / "01_device_basics" / "bad.toml"
    path.parent.mkdir()
    path.write_text(text)
    with pytest.raises(fixtures.FixtureError, match=problem):
        fixtures.load(path)


def test_a_fixture_declares_what_the_message_of_a_lost_cell_says(tmp_path):
    path = tmp_path / "01_device_basics" / "says.toml"
    path.parent.mkdir()
    path.write_text("kind = 'wrong'\ndescription='x'\nloses=['t']\n[answers]\nf='x'\n"
                    "[shows]\nt='one backward over the SUM'\n")
    fx = fixtures.load(path)
    assert fx.shows == {"t": ["one backward over the SUM"]}
    said = "AssertionError: you ran one backward\nover the sum of the losses"
    assert fixtures.message_problems(fx, "t", said) == []                 # case and line breaks ignored
    assert fixtures.message_problems(fx, "t", "AssertionError: did you step per micro-batch?") == [
        "t: the message does not say 'one backward over the SUM'"]
    assert fixtures.message_problems(fx, "t", "\x1b[1m" + said + "\x1b[0m") == [
        "t: the message carries raw terminal colour codes (\\x1b[...m)"]


def test_notebook_reader_errors_name_the_problem(tmp_path):
    (tmp_path / "x.ipynb").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(notebooks.NotebookError, match="not UTF-8"):
        notebooks.read(tmp_path / "x.ipynb")


def test_nbformat_imports_without_building_the_iri_parser_and_iri_checks_still_work():
    """make.py's site file defers rfc3987_syntax (an Earley parser built at import, 1.2-1.7 s
    per process): importing nbformat leaves the stub in place, and jsonschema's "iri" format
    check still accepts and rejects as the real module does (it is imported on first use)."""
    import subprocess
    import sys

    code = ("import sys, nbformat\n"
            "stub = sys.modules.get('rfc3987_syntax')\n"
            "print(getattr(stub, '_course_lazy_stub', False))\n"
            "from jsonschema import FormatChecker\n"
            "fc = FormatChecker()\n"
            "print(fc.conforms('https://example.org/caf\\u00e9?q=1', 'iri'), fc.conforms('no iri at all', 'iri'))\n"
            "print(getattr(sys.modules['rfc3987_syntax'], '_course_lazy_stub', False))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[:3] == ["True", "True False", "False"], out
