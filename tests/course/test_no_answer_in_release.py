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
from coursetools.author import answerkeys, fixtures

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
