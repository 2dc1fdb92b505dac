"""Verdicts that hold on a busy machine: the helpers every measuring lesson cell uses, and the
check that what such a cell concluded follows from the figures it printed.

A lesson cell that draws a conclusion from a measurement (one variant faster than another, a
saving, an overhead) measures the variants **interleaved** (A B, B A, A B, ...: a burst of load
falls on both alike), **repeats** them (`ROUNDS` rounds at least), prints each one's median and
range, and concludes only when every round of one beat every round of the other. Otherwise it
prints "no conclusion: within noise". Such a cell carries the tag `verdict`.

How often two equally fast variants get a winner anyway depends on how their spreads compare. If
both vary alike, the rounds are exchangeable, and all 5 of one landing below all 5 of the other
happens in 2 of the C(10, 5) = 252 orderings: 0.8 %. If one is steadier than the other (a stable
variant against a noisy one, equal medians), more often: a seeded simulation of the helpers' own
order, 5 rounds (tests/evidence/test_verdicts.py), gave 1.2 % when one varies twice as much as the
other, 4 % at ten times, and 6 % when one does not vary at all (2 in 32: all 5 rounds of the noisy
one on the same side). A CPU run of the course prints about 27 verdicts; were every one of them a
comparison of equally fast variants, the same simulation gave at least one false winner in 19 %
(equal spreads) to 82 % (one steady) of runs. Most of the course's comparisons are of variants
that differ by design; a false winner can come only from those that run the same work (a flag
the CPU ignores, a no-op at two sizes).

What a cell prints after a verdict must follow from it (`check_output`): after "no conclusion" no
cause, no winner, no ratio stated as a finding, and never "nothing to explain" or "no drop" (the
absence of a difference is a conclusion too); a figure of a verdict cell draws each variant's range
(`check_source`). `check_cell` runs all three checks.

The two functions in `HELPER_SOURCE` are copied, byte for byte, into the chapter-tools cell of
each notebook that has such a cell (a notebook imports nothing of the repository's own: it must
run alone in Colab). `tests/course/test_notebooks_static.py` holds every copy to this one, and
`tests/evidence/test_verdicts_under_load.py` runs the notebooks under a CPU load it starts and
checks every verdict cell's source and printed output with `check_cell`.
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
    not overlap). For two equally fast variants, 5 rounds each, that happens by chance in 0.8 %
    of runs if both vary alike (2 of 252 orderings), and in up to 6 % if one is steady and the
    other noisy (simulated). Returns the faster label, or None: no conclusion, within noise."""
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


# What a cell may not print after a verdict that drew no conclusion (until its next verdict line):
# a "no conclusion" allows no reading of the figures beyond "within noise".
AFTER_NO_CONCLUSION = {
    "a cause": re.compile(r"(?i)\b(so|because|therefore|hence|thus|explains?|explained)\b|(?<!\bno )\bcaused?\b"),
    "a winner": re.compile(r"(?i)\bin every round\b|\b(was|were) (faster|slower|quicker)\b|\b(won|beat|beats)\b"),
}
# A ratio stated as a finding ("8.9× the time", "0.96× the single samples' median", "5× as fast"):
# only a verdict that concluded supports one.
RATIO_FINDING = re.compile(r"\d[\d.,]*× (the|as|faster|slower)\b")
# The absence of a difference is a conclusion too, and the rule never draws it: a verdict either
# names a winner or says "no conclusion". (A 5× ratio of medians with one overlapping round is "no
# conclusion", not "nothing to explain".)
ABSENCE = re.compile(r"(?i)\bnothing to explain\b|\bno (\w+ )?(drop|difference|overhead|price|gain|saving)s?\b")
# Drawing calls that plot a value per variant: in a verdict cell each must carry its range.
PLOTS = ("bar", "barh", "plot", "loglog", "semilogx", "semilogy", "scatter")


def check_output(text: str) -> list[str]:
    """What is wrong with what a verdict cell printed around its verdict lines: each verdict line's
    own figures (`check_line`); after a "no conclusion" (until the next verdict line), a cause, a
    winner or a ratio stated as a finding; a ratio stated as a finding that no concluding verdict
    precedes; and anywhere, a claimed absence of a difference ("nothing to explain", "no drop"),
    which the rule never concludes."""
    problems = []
    current: Verdict | None = None  # the last verdict line above this line
    by_line = {v.line: v for v in parse(text)}
    for raw in text.splitlines():
        start = raw.find("verdict (")
        if start >= 0 and raw[start:].rstrip() in by_line:
            current = by_line[raw[start:].rstrip()]
            problems += [f"{p}: {current.line}" for p in check_line(current)]
            continue
        line = raw.strip()
        if not line:
            continue
        problems += [f"{m[0]!r} claims the absence of a difference, which no verdict concludes "
                     f"(say 'no conclusion'): {line!r}" for m in ABSENCE.finditer(line)]
        if current is not None and not current.concluded:
            for what, pattern in AFTER_NO_CONCLUSION.items():
                if m := pattern.search(line):
                    problems.append(f"{what} ({m[0]!r}) after a verdict that drew no conclusion: {line!r}")
        if current is None or not current.concluded:
            problems += [f"a ratio stated as a finding ({m[0]!r}) "
                         + ("with no verdict above it" if current is None else
                            "after a verdict that drew no conclusion") + f": {line!r}"
                         for m in RATIO_FINDING.finditer(line)]
    return problems


def check_source(source: str) -> list[str]:
    """What is wrong with a verdict cell's drawing: a bar or line of a measured value drawn without
    its range (`xerr=`/`yerr=`, or `errorbar`), under a title that may say "no conclusion" over
    bars 5× apart."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    problems = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in PLOTS
                and not {"xerr", "yerr"} & {k.arg for k in node.keywords}):
            problems.append(f"line {node.lineno}: .{node.func.attr}() draws a measured value without its range: "
                            "draw each variant's range over its rounds (xerr=/yerr=, or errorbar)")
    return problems


def check_cell(source: str, text: str) -> list[str]:
    """Every check of a verdict cell: its source's drawing and its printed output."""
    return check_source(source) + check_output(text)


def helper_defs(source: str) -> dict[str, str]:
    """The helper functions a cell's source defines, normalised (ast.unparse) for comparison."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    return {node.name: ast.unparse(node) for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name in HELPER_NAMES}


CANONICAL = helper_defs(HELPER_SOURCE)
