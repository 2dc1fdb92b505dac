"""Every committed notebook follows the course conventions (docs/AUTHORING.md), checked
without running anything: no outputs, clean metadata, the header and setup cell, imports
limited to what Colab ships, no network, and exercises built to be graded fairly."""

from __future__ import annotations

import ast
import re
import sys
from collections import Counter

import pytest

from coursetools.author import authoring, fixtures, helpers_cell
from coursetools import layout, notebooks
from coursetools.evidence import verdicts

ROOT = layout.ROOT
NOTEBOOKS = layout.all_notebooks()
IDS = [p.relative_to(ROOT).as_posix() for p in NOTEBOOKS]
ASSIGNMENTS = layout.assignments()

ALLOWED_TOP_LEVEL = set(sys.stdlib_module_names) | {"torch", "numpy", "matplotlib", "IPython"}
NETWORK_MODULES = {"urllib", "http", "requests", "httpx", "aiohttp", "ftplib", "smtplib", "webbrowser"}
FETCH_CALLS = {"urlopen", "urlretrieve", "load_state_dict_from_url", "download_url_to_file", "hub"}
NOTEBOOK_META_KEYS = set(authoring.NOTEBOOK_METADATA)
CELL_META_KEYS = {"nbgrader", "tags", "deletable", "editable"}
ALLOWED_MAGICS = ("%config ", "%matplotlib ")


def expected_link(path) -> str:
    rel = path.relative_to(ROOT)
    if rel.parts[0] in ("solutions", "exercises"):
        name = rel.parts[1]
        rel = f"exercises/{name}/{name}.ipynb"
    return layout.config().colab_url(rel)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_no_outputs_or_execution_counts(path):
    nb = notebooks.read(path)
    dirty = [i for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"cells {dirty} have stored outputs: clear them (notebooks are committed without outputs)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_clean_metadata(path):
    nb = notebooks.read(path)
    assert set(nb.metadata) <= NOTEBOOK_META_KEYS, f"unexpected notebook metadata {set(nb.metadata) - NOTEBOOK_META_KEYS}"
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    for i, cell in enumerate(nb.cells):
        meta = cell.get("metadata", {})
        helpers = cell.cell_type == "code" and notebooks.grade_id(cell) == helpers_cell.HELPERS_ID
        extra = set(meta) - CELL_META_KEYS - {"jupyter"} - ({"cellView"} if helpers else set())
        assert not extra, f"cell {i} has editor metadata {extra}: strip it"
        # the one editor setting a lesson may keep: a code cell shown collapsed (plumbing, not the
        # reading path); an exercise's locked helpers cell is shown collapsed too, in JupyterLab
        # and in Colab's form view (coursetools/author/helpers_cell.py)
        if "jupyter" in meta:
            assert meta["jupyter"] == {"source_hidden": True} and cell.cell_type == "code" and (
                path.parent == layout.COURSE_DIR or helpers), (
                f"cell {i} has editor metadata {meta['jupyter']}: only a lesson's code cell or an exercise's "
                'helpers cell may carry "jupyter": {"source_hidden": true} (shown collapsed)')
        if "cellView" in meta:
            assert meta["cellView"] == helpers_cell.COLAB_FORM, f"cell {i}: cellView {meta['cellView']!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_header_with_colab_link_then_standard_setup_cell(path):
    nb = notebooks.read(path)
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.lstrip().startswith("[![Open In Colab]")
    assert f"({expected_link(path)})" in first.source, (
        f"the Colab link must be {expected_link(path)}: run `python3 make.py links`")
    assert "\n# " in first.source, "the header needs a title (`# NN · Topic`)"
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    assert code_cells and code_cells[0].source == authoring.SETUP_SOURCE, (
        "the first code cell must be the standard setup cell (coursetools/author/authoring.py SETUP_SOURCE), unchanged")
    if path.parent.parent.name in ("solutions", "exercises"):
        assert notebooks.grade_id(code_cells[0]) == authoring.SETUP_GRADE_ID and notebooks.is_locked(code_cells[0])


def _imports_and_calls(source: str):
    lines = []
    for line in source.splitlines():
        stripped = line.strip()
        if stripped.startswith(("!", "%")):
            assert stripped.startswith(ALLOWED_MAGICS), f"shell escape or magic not allowed: {stripped!r}"
            lines.append("")
        else:
            lines.append(line)
    tree = ast.parse("\n".join(lines))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield "import", alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield "import", node.module
        elif isinstance(node, ast.Attribute):
            yield "attr", node.attr
        elif isinstance(node, ast.Name):
            yield "name", node.id


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_self_contained_no_repo_imports_no_network(path):
    nb = notebooks.read(path)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for kind, name in _imports_and_calls(cell.source):
            top = name.split(".")[0]
            if kind == "import":
                assert top in ALLOWED_TOP_LEVEL, (
                    f"cell {i} imports {name}: notebooks may use only torch, numpy, matplotlib and "
                    "the standard library (what Colab ships), never the repository's own code")
                assert top not in NETWORK_MODULES, f"cell {i} imports {name}: no network access in notebooks"
            elif name in FETCH_CALLS:
                assert False, f"cell {i} uses {name}: notebooks never download (generate data instead)"


def _is_print(stmt: ast.Expr) -> bool:
    call = stmt.value
    return isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "print"


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_exercise_structure(name):
    nb = notebooks.read(layout.source_notebook(name))
    assert (layout.COURSE_DIR / f"{name}.ipynb").exists(), f"assignment {name} has no lesson course/{name}.ipynb"
    ids = [notebooks.grade_id(c) for c in notebooks.nbgrader_cells(nb)]
    dupes = [gid for gid, n in Counter(ids).items() if n > 1]
    assert not dupes, f"duplicate grade ids {dupes}"
    tests = notebooks.test_cells(nb)
    assert len(tests) >= 4, f"{name} has {len(tests)} graded questions; the course asks for at least 4"
    for cell in tests:
        gid = notebooks.grade_id(cell)
        assert gid.startswith("test_") and notebooks.points(cell) > 0, gid
        assert notebooks.first_comment(cell.source), f"{gid} must start with a docstring saying what it checks"
        assert notebooks.BEGIN_HIDDEN in cell.source and notebooks.END_HIDDEN in cell.source, (
            f"{gid} has no hidden tests: every graded question needs them")
        body = ast.parse(cell.source).body
        assert body and not (isinstance(body[-1], ast.Expr) and not _is_print(body[-1])), (
            f"{gid} ends with a bare expression: nbgrader reads a displayed value as partial "
            "credit; end with a statement (e.g. `_ = ...`)")
        visible = ast.parse(cell.source.split(notebooks.BEGIN_HIDDEN)[0]).body
        assert len(visible) >= 2, f"{gid} has no visible test (only hidden ones): learners need one to check themselves"
    answers = [c for c in nb.cells if notebooks.is_solution(c)]
    assert answers, f"{name} has no answer cells"
    for cell in answers:
        assert notebooks.BEGIN_SOLUTION in cell.source and notebooks.END_SOLUTION in cell.source, notebooks.grade_id(cell)


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_fixtures_cover_every_question(name):
    """Every graded question has a realistic wrong answer that loses it, and the chapter has an
    alternative correct answer: proof that the tests can fail, and that they grade behaviour."""
    nb = notebooks.read(layout.source_notebook(name))
    mine = [f for f in fixtures.all_fixtures() if f.assignment == name]
    lost = {gid for f in mine if f.kind == "wrong" for gid in f.loses}
    uncovered = [notebooks.grade_id(c) for c in notebooks.test_cells(nb) if notebooks.grade_id(c) not in lost]
    assert not uncovered, f"no wrong-answer fixture in tests/submissions/{name}/ loses {uncovered}"
    assert any(f.kind == "alternative" for f in mine), f"tests/submissions/{name}/ needs an alternative correct answer"
    for fx in mine:
        fixtures.expected_scores(fx, nb)  # raises on unknown test cells
        fixtures.submission(fx)           # raises on unknown answer cells


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_cell_predicates_agree_with_nbgrader(path):
    """coursetools re-states nbgrader's cell predicates (to keep the self-check fast)."""
    from nbgrader import utils
    for cell in notebooks.read(path).cells:
        assert notebooks.is_grade(cell) == utils.is_grade(cell)
        assert notebooks.is_solution(cell) == utils.is_solution(cell)
        assert notebooks.is_locked(cell) == utils.is_locked(cell)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_valid_against_nbformat_schema(path):
    """JupyterLab logs "Notebook JSON is invalid" for a notebook its schema rejects (e.g. a
    cell `id` in nbformat 4.4 or older); checked on the file as stored, without upgrading."""
    import json

    import nbformat

    raw = nbformat.from_dict(json.loads(path.read_text(encoding="utf-8")))
    try:
        nbformat.validate(raw)
    except nbformat.ValidationError as exc:
        pytest.fail(f"{path.name} does not validate against nbformat "
                    f"{raw.get('nbformat')}.{raw.get('nbformat_minor')}: {exc.message}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_relative_links_point_at_existing_files(path):
    """Every relative link (lesson -> exercise, exercise -> lesson, next chapter) names a
    file of the repository, so it opens in JupyterLab (make.py lab's work folder mirrors
    these paths; tests/learner/test_lab.py checks the copies' links)."""
    import json

    from coursetools.learner import lab

    links = lab.relative_links(json.loads(path.read_text(encoding="utf-8")))
    broken = [link for link in links if not (path.parent / link).is_file()]
    assert not broken, f"{path.name} links to files that do not exist: {broken}"
    if path.parent == layout.COURSE_DIR and path.stem in ASSIGNMENTS:
        exercise = f"../exercises/{path.stem}/{path.stem}.ipynb"
        assert exercise in links, f"lesson {path.name} does not link to its exercise {exercise}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_fix_hints_are_the_one_helper(path):
    """Feedback in two steps: a notebook whose tests call fix_hint defines it in its locked
    helpers cell byte for byte as coursetools/grading/hints.py's HELPER_SOURCE; an answer cell
    never calls it; every fix is fix_hint's literal argument, so that the release step can take
    it out (coursetools/author/fixtexts.py)."""
    from coursetools.author import fixtexts

    from coursetools.grading import hints

    nb = notebooks.read(path)
    calls = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "fix_hint(" in c.source
             and "def fix_hint" not in c.source]
    defining = [c for c in nb.cells if c.cell_type == "code" and "def fix_hint" in c.source]
    if not calls and not defining:
        return
    assert len(defining) == 1, f"fix_hint is defined in {len(defining)} cells; copy hints.HELPER_SOURCE into the helpers cell"
    assert hints.HELPER_SOURCE.strip() in defining[0].source, (
        "the helpers cell's fix_hint differs from coursetools/grading/hints.py's HELPER_SOURCE: copy it byte for byte")
    answers = [i for i in calls if notebooks.is_solution(nb.cells[i])]
    assert not answers, f"answer cells {answers} call fix_hint: it is for test messages only"
    if path.parent.parent == layout.SOLUTIONS_DIR:
        problems = fixtexts.rules(nb, every_failure=False)
        assert not problems, "fix texts the release step cannot take out:\n" + "\n".join(map(str, problems))


@pytest.mark.parametrize("name", layout.assignments())
def test_every_failure_of_a_test_has_a_fix(name):
    """`make.py check --explain` and the feedback page give a fix for every failure: every
    assert and raised AssertionError of a test cell (hidden ones included), and every failure
    the helpers raise, carries a fix_hint (coursetools/author/fixtexts.py's rules)."""
    from coursetools.author import fixtexts

    problems = fixtexts.rules(notebooks.read(layout.source_notebook(name)))
    assert not problems, f"{name}: failures without a fix:\n" + "\n".join(map(str, problems))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_measuring_cells_use_the_one_verdict(path):
    """A cell that concludes from a timing carries the tag `verdict` and prints through the
    course's `verdict` helper; the notebook defining it has the canonical `interleaved` and
    `verdict`, byte for byte as coursetools/evidence/verdicts.py's HELPER_SOURCE (normalised by
    ast), so that every lesson concludes by the same rule, the one the load test checks."""
    nb = notebooks.read(path)
    defined: dict[str, str] = {}
    for cell in nb.cells:
        if cell.cell_type == "code":
            defined.update(verdicts.helper_defs(cell.source))
    tagged = [i for i, c in enumerate(nb.cells) if verdicts.TAG in c.get("metadata", {}).get("tags", [])]
    for name, source in defined.items():
        assert source == verdicts.CANONICAL[name], (
            f"{name}() differs from coursetools/evidence/verdicts.py's HELPER_SOURCE: copy it byte for byte")
    if tagged:
        assert set(defined) == set(verdicts.HELPER_NAMES), (
            f"cells {tagged} are tagged {verdicts.TAG!r} but the notebook does not define "
            f"{sorted(set(verdicts.HELPER_NAMES) - set(defined))} (copy HELPER_SOURCE into its tools cell)")
    for i in tagged:
        cell = nb.cells[i]
        assert cell.cell_type == "code" and "verdict(" in cell.source, (
            f"cell {i} is tagged {verdicts.TAG!r} but calls no verdict(): it must print its conclusion through it")
        drawing = verdicts.check_source(cell.source)
        assert not drawing, f"cell {i}: " + "; ".join(drawing)
    untagged = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and i not in tagged
                and "def verdict" not in c.source
                and re.search(r"(?<![\w.])verdict\(", c.source)]
    assert not untagged, f"cells {untagged} call verdict() without the tag {verdicts.TAG!r}: the load test would skip them"


# A GPU-only cell run without the GPU shows what it demonstrates (a CPU analogue, fake CUDA
# tensors, or the GPU's output labelled "expected, not recorded on a GPU": show_expected in
# coursetools/learner/figures.py), never a line that only says it skipped (issue 35).
SKIP_WORDS = re.compile(r"(?i)\b(skipped|not run)\b")
MACHINE_WORDS = re.compile(r"(?i)\b(gpu|cuda|accelerator|mps|windows|posix|machine)\b")


def _printed_text(node: ast.AST) -> str:
    """The literal text of a print argument (an f-string's fields as {})."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp):
        return _printed_text(node.left) + _printed_text(node.right)
    return ""


def bare_skips(nb) -> list[str]:
    """The lines a lesson's cells print to say they skipped for want of a machine feature."""
    found = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print" and node.args:
                text = _printed_text(node.args[0])
                if SKIP_WORDS.search(text) and MACHINE_WORDS.search(text):
                    found.append(text)
    return found


def test_no_lesson_cell_prints_only_that_it_skipped():
    """Lessons only: an exercise's test cell on a grader without a GPU says which CPU, meta or pretend-GPU
    check above carries its points ("CUDA check skipped: ... (the points come from the CPU checks
    above)"), which is what a student needs to read there."""
    found = sorted({(path.stem, text) for path in layout.lessons() for text in bare_skips(notebooks.read(path))})
    assert not found, (f"cells that print only that they skipped: {found}. Show what the cell demonstrates "
                       "instead: a CPU analogue, fake CUDA tensors, or show_expected(what a GPU prints, source)")


def test_the_bare_skip_check_finds_one():
    nb = notebooks.nbformat.v4.new_notebook(cells=[notebooks.nbformat.v4.new_code_cell(
        'if on_gpu:\n    run()\nelse:\n    print(f"Skipped: no GPU here ({device})")\nprint("3 steps skipped")')])
    assert bare_skips(nb) == ["Skipped: no GPU here ({})"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", layout.assignments())
def test_answers_that_do_nothing_score_zero(name, tmp_path):
    """Every function an answer cell defines, replaced by one that returns None (a learner who
    wrote only the signatures, or a stub that returns instead of raising), earns no point: a
    test that passes for doing nothing cannot fail for a lazy answer. (A build_on test of
    chapter 01 once gave 2 points for leaving the default device alone by building nothing.)"""
    import nbformat

    from coursetools.learner import selfcheck

    source = notebooks.read(layout.source_notebook(name))
    answers = {}
    for cell in source.cells:
        if cell.cell_type == "code" and notebooks.is_solution(cell):
            funcs = [n.name for n in ast.parse(cell.source).body if isinstance(n, ast.FunctionDef)]
            if funcs:
                answers[notebooks.grade_id(cell)] = "".join(f"def {f}(*args, **kwargs):\n    return None\n"
                                                            for f in funcs)
    assert answers, f"{name}: no answer cell defines a function"
    path = tmp_path / f"{name}.ipynb"
    nbformat.write(fixtures.fill(notebooks.read(layout.release_notebook(name)), answers), path)
    _, results = selfcheck.check(path)
    earned = {r.grade_id: r.score for r in results if r.score}
    assert not earned, f"{name}: answers that return None earn {earned}"


# -- what a hidden test hands an answer is visible to it -------------------------------------------
# The arguments of each call reach the student's code in the kernel, which may record and print
# them (docs/GRADING_SECURITY.md says so). So a hidden test hands an answer data (a device name, a
# key, "batch-7"), never a phrase that could say what the test checks. Known exceptions: none
# (02's str leaf that move_to must hand back unchanged is "sample-42": the phrase it was, "just a string", could be recorded and printed into the feedback).
PROSE_ARGUMENTS_KNOWN: set[tuple[str, str, str]] = set()


def hidden_literal_arguments(nb) -> list[tuple[str, int, str, str]]:
    """(test's grade id, line, answer's name, string) for each string literal a hidden line of a
    test hands a function or class an answer cell defines: as an argument, a keyword's value, or
    inside a container or expression passed as one."""
    answers: set[str] = set()
    for cell in nb.cells:
        if cell.cell_type == "code" and notebooks.is_solution(cell):
            tree = ast.parse(cell.source)
            answers |= {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    found = []
    for cell in notebooks.test_cells(nb):
        hidden, inside = set(), False
        for number, line in enumerate(cell.source.split("\n"), start=1):
            if line.strip() == notebooks.BEGIN_HIDDEN:
                inside = True
            elif line.strip() == notebooks.END_HIDDEN:
                inside = False
            elif inside:
                hidden.add(number)
        for node in ast.walk(ast.parse(cell.source)):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in answers
                    and node.lineno in hidden):
                continue
            for arg in node.args + [k.value for k in node.keywords]:
                found += [(notebooks.grade_id(cell), node.lineno, node.func.id, sub.value) for sub in ast.walk(arg)
                          if isinstance(sub, ast.Constant) and isinstance(sub.value, str)]
    return found


@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_hidden_tests_hand_answers_data_not_phrases(name):
    found = hidden_literal_arguments(notebooks.read(layout.source_notebook(name)))
    prose = [(gid, line, fn, text) for gid, line, fn, text in found
             if re.search(r"\s", text) and (name, gid, text) not in PROSE_ARGUMENTS_KNOWN]
    assert not prose, (
        f"{name}: a hidden test hands an answer a phrase, which the answer can record and print: {prose}"
        + " (the arguments are visible to the student's code: pass data, e.g. 's' or 'batch-7')")


def test_the_scan_of_hidden_arguments_finds_them():
    nb = notebooks.read(layout.source_notebook("01_device_basics"))
    found = hidden_literal_arguments(nb)
    assert any(fn == "pick_device" and text == "cuda:2" for _, _, fn, text in found), found
    cell = next(c for c in notebooks.test_cells(nb) if notebooks.BEGIN_HIDDEN in c.source)
    cell.source = cell.source.replace(notebooks.END_HIDDEN, "pick_device('the hidden test checks mps')\n"
                                      + notebooks.END_HIDDEN, 1)
    assert ("the hidden test checks mps" in {text for *_, text in hidden_literal_arguments(nb)})
