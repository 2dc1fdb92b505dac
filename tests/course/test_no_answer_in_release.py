"""No answer in a release: no Predict key in any notebook a learner opens.

Every release, English and Chinese, is scanned for each Predict question's key (its reference
answers, as the tests compare them): a dict that gives three or more items their true value, a
12-hex-digit digest (with two or three choices per item a digest is the key), a solutions-only
marker that escaped the release step (coursetools/author/answerkeys.py). The key lives in the
hidden tests; the proof that it is what PyTorch does runs from solutions/ (nbval here,
test-torch on both ends of the range: fixtures.solved_release_with_proofs). Positive controls:
a key planted in a copy of a release, as a dict or as a digest, is found.
"""

from __future__ import annotations

import copy
import hashlib

import pytest
from nbformat import v4

from coursetools import layout, notebooks
from coursetools.author import answerkeys, fixtexts, fixtures

ROOT = layout.ROOT
NAMES = layout.assignments()


def _releases(name):
    found = [layout.release_notebook(name)]
    zh = ROOT / "zh" / "exercises" / name / f"{name}.ipynb"
    if zh.exists():
        found.append(zh)
    return found


@pytest.fixture(scope="module")
def all_keys():
    return {name: answerkeys.keys(notebooks.read(layout.source_notebook(name))) for name in NAMES}


def test_every_chapter_has_a_predict_question_with_a_key(all_keys):
    """The scan has something to look for: every chapter's Predict answer and its items."""
    empty = [name for name in NAMES if not any(all_keys[name].values())]
    assert not empty, f"no Predict key found in {empty}: is the answer cell still a dict of None?"


@pytest.mark.parametrize("name", NAMES)
def test_no_release_holds_a_key(name, all_keys):
    leaks = {str(path.relative_to(ROOT)): answerkeys.scan(notebooks.read(path), all_keys[name])
             for path in _releases(name)}
    leaks = {path: found for path, found in leaks.items() if found}
    assert not leaks, "an answer key a learner can read:\n" + "\n".join(
        f"{path}: {leak}" for path, found in leaks.items() for leak in found)


@pytest.mark.parametrize("name", NAMES)
def test_a_planted_key_is_found(name, all_keys):
    """Positive control: the key, planted as a dict literal or as the old digests in a copy of
    the release, is found; the untouched copy is clean (the test above)."""
    release = notebooks.read(layout.release_notebook(name))
    for grade_id, key in all_keys[name].items():
        first = next(iter(key))
        var = first.partition("[")[0]
        items = {answerkeys._item(full)[1]: answer for full, answer in key.items() if full.startswith(var + "[")}
        planted = copy.deepcopy(release)
        planted.cells.append(v4.new_code_cell(f"assert {var} == {{{', '.join(f'{k!r}: {v!r}' for k, v in items.items())}}}"))
        assert answerkeys.scan(planted, all_keys[name]), f"{name}: a planted {var} dict was not found"
        digests = {k: hashlib.sha256(f"{name[:2]}:{k}={v}".encode()).hexdigest()[:12] for k, v in items.items()}
        planted = copy.deepcopy(release)
        planted.cells.append(v4.new_code_cell(f"EXPECTED = {digests!r}"))
        assert answerkeys.scan(planted, all_keys[name]), f"{name}: planted digests were not found"


@pytest.mark.parametrize("name", NAMES)
def test_the_proof_is_put_back_for_test_torch(name):
    """What test-torch runs holds each Predict proof the release lacks (and nothing else differs)."""
    source = notebooks.read(layout.source_notebook(name))
    proofs = [i for i, c in enumerate(source.cells)
              if notebooks.BEGIN_SOLUTIONS_ONLY in c.source and not notebooks.is_solution(c)]
    nb = fixtures.solved_release_with_proofs(name)
    back = [i for i, c in enumerate(nb.cells) if notebooks.BEGIN_SOLUTIONS_ONLY in c.source]
    assert back == proofs and proofs, (back, proofs)


# ---- No fix in a release (coursetools/author/fixtexts.py) ----------------------------------
@pytest.fixture(scope="module")
def all_fixes():
    return {name: fixtexts.fragments(notebooks.read(layout.source_notebook(name))) for name in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_no_release_holds_a_fix(name, all_fixes):
    """No release (English or Chinese) calls fix_hint with a text, or holds a fix's words in
    code, a comment or markdown; the chapter has fixes to look for (the scan is not empty)."""
    assert all_fixes[name], f"{name}: no fix_hint(...) text found in solutions/: nothing to look for"
    leaks = {str(path.relative_to(ROOT)): fixtexts.scan(notebooks.read(path), all_fixes[name])
             for path in _releases(name)}
    leaks = {path: found for path, found in leaks.items() if found}
    assert not leaks, "a fix a learner can read in a release (run `python3 make.py release`):\n" + "\n".join(
        f"{path}: {leak}" for path, found in leaks.items() for leak in found)


@pytest.mark.parametrize("name", NAMES)
def test_a_planted_fix_is_found(name, all_fixes):
    """Positive control: a fix of the chapter planted in a copy of its release, as fix_hint's
    argument, as a plain string in a test cell, or in markdown, is found."""
    release = notebooks.read(layout.release_notebook(name))
    fix = sorted(all_fixes[name], key=len)[-1]
    for cell in (v4.new_code_cell(f"assert ok, 'observed' + fix_hint({fix!r})"),
                 v4.new_code_cell(f"HINT = ({fix[:len(fix) // 2]!r}\n        {fix[len(fix) // 2:]!r})"),
                 v4.new_markdown_cell(f"Stuck? {fix}")):
        planted = copy.deepcopy(release)
        planted.cells.insert(len(planted.cells) // 2, cell)
        assert fixtexts.scan(planted, all_fixes[name]), f"{name}: a planted fix was not found in {cell.source!r}"
    bare = copy.deepcopy(release)
    bare.cells.append(v4.new_code_cell("assert ok, 'observed' + fix_hint(f'recheck {wrong}')"))
    assert fixtexts.scan(bare, all_fixes[name]), f"{name}: a fix_hint call with a text was not found"


def test_the_release_step_takes_every_fix_out():
    """notebooks.strip_fix_texts, the release step's edit: each fix_hint(...) call loses its
    text (nested calls and calls spread over lines included), nothing else changes; code that
    does not parse but calls fix_hint is refused rather than released with its fixes."""
    source = ('x = "é"  # fix_hint("in a comment") stays a comment\n'
              'assert x, (f"{x} is on cpu (lesson 02 §3)" + fix_hint("keep é "\n'
              '                                                 "the result")) ; y = fix_hint(f"a {fix_hint(\'b\')}")\n'
              'def fix_hint(text=None):\n    pass\nz = fix_hint()\n')
    assert notebooks.strip_fix_texts(source) == (
        'x = "é"  # fix_hint("in a comment") stays a comment\n'
        'assert x, (f"{x} is on cpu (lesson 02 §3)" + fix_hint()) ; y = fix_hint()\n'
        'def fix_hint(text=None):\n    pass\nz = fix_hint()\n')
    assert notebooks.strip_fix_texts("print(1)\n") == "print(1)\n"
    with pytest.raises(ValueError, match="does not parse"):
        notebooks.strip_fix_texts("%time f()\nassert ok, fix_hint('x')")


def test_a_fix_outside_fix_hints_argument_is_refused():
    """rules(): a fix kept in a variable (fix_hint(FIX)) could not be taken out of the release;
    with every_failure, an assert without a fix is named too."""
    nb = v4.new_notebook(cells=[v4.new_code_cell("FIX = 'keep the result'\nassert ok, 'observed' + fix_hint(FIX)\n"
                                                 "assert ok, 'observed'\nHINT = fix_hint('keep it')\n"
                                                 "assert ok, 'observed' + HINT\n",
                                                 metadata={"nbgrader": {"grade": True, "grade_id": "t", "points": 1,
                                                                        "solution": False, "locked": True}})])
    literal = fixtexts.rules(nb, every_failure=False)
    assert [p.line for p in literal] == [2] and "literal argument" in literal[0].what
    assert [p.line for p in fixtexts.rules(nb)] == [2, 3]
