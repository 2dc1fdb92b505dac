"""The verdict rule itself (coursetools/evidence/verdicts.py): the helper the lessons copy prints
lines the checker accepts, the checker refuses the conclusions a busy machine used to produce,
and the chance the lessons quote is the rule's."""

from __future__ import annotations

import contextlib
import io
import itertools
import math
import random

import pytest

from coursetools.evidence import verdicts


def helpers() -> dict:
    ns: dict = {}
    exec(verdicts.HELPER_SOURCE, ns)
    return ns


def printed(samples, a, b, unit="ms"):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        faster = helpers()["verdict"](samples, a, b, unit=unit)
    return faster, out.getvalue()


def test_interleaved_alternates_the_order_every_round():
    calls = []
    samples = helpers()["interleaved"]({"A": lambda: calls.append("A") or 1.0,
                                        "B": lambda: calls.append("B") or 2.0}, rounds=4)
    assert calls == ["A", "B", "B", "A", "A", "B", "B", "A"]
    assert samples == {"A": [1.0] * 4, "B": [2.0] * 4}


@pytest.mark.parametrize("unit", ["s", "ms", "µs"])
def test_the_helpers_lines_pass_the_check_and_conclude_only_without_overlap(unit):
    rng = random.Random(0)
    concluded = 0
    for _ in range(300):
        k = rng.choice([0.7, 1.0, 1.0, 1.4])
        samples = {"plain": [rng.gauss(1e-3, 1.5e-4) for _ in range(5)],
                   "tuned variant": [rng.gauss(1e-3 * k, 1.5e-4) for _ in range(5)]}
        faster, text = printed(samples, "plain", "tuned variant", unit)
        (v,) = verdicts.parse(text)
        assert verdicts.check_line(v) == [], text
        overlap = max(samples["plain"]) >= min(samples["tuned variant"]) and \
            max(samples["tuned variant"]) >= min(samples["plain"])
        assert (faster is None) == overlap
        concluded += faster is not None
    assert 0 < concluded < 300


@pytest.mark.parametrize("line, problem", [
    ("verdict (5 interleaved rounds): A median 1.0 ms, range 0.9–1.2 | B median 1.1 ms, range 1.0–1.3 "
     "→ A 1.10× as fast as B", "ranges overlap"),
    ("verdict (5 interleaved rounds): A median 1.0 ms, range 0.9–1.05 | B median 2.0 ms, range 1.9–2.1 "
     "→ B 2.00× as fast as A", "the figures say 'A'"),
    ("verdict (5 interleaved rounds): A median 1.0 ms, range 0.9–1.05 | B median 2.0 ms, range 1.9–2.1 "
     "→ A 10.06× as fast as B", "not the medians' ratio"),
    ("verdict (5 interleaved rounds): A median 1.0 ms, range 0.9–1.05 | B median 2.0 ms, range 1.9–2.1 "
     "→ no conclusion: within noise (the ranges overlap)", "yet the line draws no conclusion"),
    ("verdict (2 interleaved rounds): A median 1.0 ms, range 0.9–1.05 | B median 2.0 ms, range 1.9–2.1 "
     "→ A 2.00× as fast as B", "at least 5"),
])
def test_the_check_refuses_conclusions_the_figures_do_not_support(line, problem):
    (v,) = verdicts.parse("some text\n" + line + "\n")
    found = verdicts.check_line(v)
    assert any(problem in p for p in found), found


def test_a_line_that_looks_like_a_verdict_but_breaks_the_format_is_an_error():
    with pytest.raises(ValueError, match="does not follow the format"):
        verdicts.parse("verdict (5 interleaved rounds): A was faster")


def test_the_chance_the_lessons_quote_is_two_in_252():
    """With 5 rounds each and no real difference, every ordering of the 10 times is equally
    likely; one variant's 5 all below the other's happens in 2 of C(10, 5) orderings."""
    orderings = list(itertools.combinations(range(10), 5))  # which ranks variant A got
    separated = [ranks for ranks in orderings if ranks in ((0, 1, 2, 3, 4), (5, 6, 7, 8, 9))]
    assert len(orderings) == math.comb(10, 5) == 252 and len(separated) == 2
    assert "2 of 252" in verdicts.HELPER_SOURCE and verdicts.ROUNDS == 5
