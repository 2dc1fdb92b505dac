"""Verdicts that hold on a busy machine: the helpers every measuring lesson cell uses, and the
check that what such a cell concluded follows from the figures it printed.

A lesson cell that draws a conclusion from a measurement (one variant faster than another, a
saving, an overhead) measures the variants **interleaved** (A B, B A, A B, ...: a burst of load
falls on both alike), **repeats** them (`ROUNDS` rounds at least), prints each one's median and
range, and concludes only when every round of one beat every round of the other. If the two
were equally fast, the rounds would be exchangeable, and all 5 of one landing below all 5 of the
other would happen in 2 of the C(10, 5) = 252 orderings: 0.8 %. Otherwise it prints "no
conclusion: within noise". Such a cell carries the tag `verdict`.

The two functions in `HELPER_SOURCE` are copied, byte for byte, into the chapter-tools cell of
each notebook that has such a cell (a notebook imports nothing of the repository's own: it must
run alone in Colab). `tests/course/test_notebooks_static.py` holds every copy to this one, and
`tests/evidence/test_verdicts_under_load.py` runs the notebooks under a CPU load it starts and
checks every printed verdict line with `check_line`.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass

TAG = "verdict"
ROUNDS = 5

HELPER_SOURCE = '''\
def interleaved(timers, rounds=5):
    """Time each variant once per round, `rounds` rounds, the order reversed every other round
    (A B, B A, A B, ...), so that a burst of load on the machine falls on all of them alike.
    `timers` maps a label to a function that measures that variant once and returns seconds.
    Returns {label: [seconds, one per round]}."""
    samples = {label: [] for label in timers}
    order = list(timers)
    for r in range(rounds):
        for label in order if r % 2 == 0 else order[::-1]:
            samples[label].append(timers[label]())
    return samples


def verdict(samples, a, b, unit="ms"):
    """Print one line: the median and range (min-max) of the per-round times of `a` and `b`,
    then a conclusion only if every round of one beat every round of the other (their ranges do
    not overlap; for two equally fast variants, 5 rounds each, that happens by chance in 2 of 252
    orderings). Returns the faster label, or None: no conclusion, within noise."""
    scale = {"s": 1.0, "ms": 1e3, "µs": 1e6}[unit]
    from statistics import median

    ta, tb = sorted(samples[a]), sorted(samples[b])
    ma, mb = median(ta), median(tb)
    faster = a if ta[-1] < tb[0] else b if tb[-1] < ta[0] else None
    if faster is None:
        conclusion = "no conclusion: within noise (the ranges overlap)"
    else:
        slower, ratio = (b, mb / ma) if faster == a else (a, ma / mb)
        conclusion = f"{faster} {ratio:.2f}× as fast as {slower}"
    print(f"verdict ({len(ta)} interleaved rounds): "
          f"{a} median {ma * scale:.4g} {unit}, range {ta[0] * scale:.4g}–{ta[-1] * scale:.4g} | "
          f"{b} median {mb * scale:.4g} {unit}, range {tb[0] * scale:.4g}–{tb[-1] * scale:.4g} → {conclusion}")
    return faster
'''

HELPER_NAMES = ("interleaved", "verdict")

_NUM = r"([0-9][0-9.e+-]*)"
LINE = re.compile(
    r"verdict \((?P<rounds>\d+) interleaved rounds\): "
    r"(?P<a>.+?) median " + _NUM.replace("(", "(?P<ma>", 1) + r" (?P<unit>s|ms|µs), "
    r"range " + _NUM.replace("(", "(?P<a0>", 1) + "–" + _NUM.replace("(", "(?P<a1>", 1) + r" \| "
    r"(?P<b>.+?) median " + _NUM.replace("(", "(?P<mb>", 1) + r" (?P=unit), "
    r"range " + _NUM.replace("(", "(?P<b0>", 1) + "–" + _NUM.replace("(", "(?P<b1>", 1) + r" → "
    r"(?P<conclusion>.*)$")


@dataclass(frozen=True)
class Verdict:
    line: str
    rounds: int
    a: str
    b: str
    a_range: tuple[float, float]
    b_range: tuple[float, float]
    a_median: float
    b_median: float
    conclusion: str

    @property
    def concluded(self) -> bool:
        return not self.conclusion.startswith("no conclusion")


def parse(text: str) -> list[Verdict]:
    """Every verdict line in `text` (a cell's printed output)."""
    found = []
    for raw in text.splitlines():
        start = raw.find("verdict (")
        if start < 0:
            continue
        m = LINE.match(raw[start:].rstrip())
        if not m:
            raise ValueError(f"a line starting 'verdict (' that does not follow the format: {raw!r}")
        f = {k: float(m[k]) for k in ("ma", "a0", "a1", "mb", "b0", "b1")}
        found.append(Verdict(raw[start:], int(m["rounds"]), m["a"], m["b"], (f["a0"], f["a1"]),
                             (f["b0"], f["b1"]), f["ma"], f["mb"], m["conclusion"]))
    return found


def check_line(v: Verdict) -> list[str]:
    """What is wrong with one printed verdict: a conclusion its own figures do not support, a
    ratio that is not the medians', too few rounds. Printed figures have 4 significant digits, so
    ranges that touch at that precision allow either reading."""
    problems = []
    if v.rounds < ROUNDS:
        problems.append(f"{v.rounds} rounds: at least {ROUNDS} are needed for a conclusion to mean anything")
    for label, (lo, hi), med in ((v.a, v.a_range, v.a_median), (v.b, v.b_range, v.b_median)):
        if not lo <= med <= hi:
            problems.append(f"{label}: median {med} outside its range {lo}–{hi}")
    a_below, b_below = v.a_range[1] < v.b_range[0], v.b_range[1] < v.a_range[0]
    touching = math.isclose(v.a_range[1], v.b_range[0], rel_tol=1e-3) or \
        math.isclose(v.b_range[1], v.a_range[0], rel_tol=1e-3)
    if not v.concluded:
        if (a_below or b_below) and not touching:
            problems.append("the ranges do not overlap, yet the line draws no conclusion")
        return problems
    if not (a_below or b_below) and not touching:
        problems.append("a conclusion although the ranges overlap: within noise")
        return problems
    faster, slower, ratio = (v.a, v.b, v.b_median / v.a_median) if a_below or (
        touching and v.a_median < v.b_median) else (v.b, v.a, v.a_median / v.b_median)
    m = re.fullmatch(r"(.+) ([0-9.]+)× as fast as (.+)", v.conclusion)
    if not m:
        problems.append(f"the conclusion {v.conclusion!r} is not 'X N× as fast as Y'")
    elif (m[1], m[3]) != (faster, slower):
        problems.append(f"the conclusion names {m[1]!r} faster, the figures say {faster!r}")
    elif not math.isclose(float(m[2]), ratio, rel_tol=0.01, abs_tol=0.011):
        problems.append(f"the ratio {m[2]} is not the medians' ratio {ratio:.3f}")
    return problems


def helper_defs(source: str) -> dict[str, str]:
    """The helper functions a cell's source defines, normalised (ast.unparse) for comparison."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    return {node.name: ast.unparse(node) for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name in HELPER_NAMES}


CANONICAL = helper_defs(HELPER_SOURCE)
