"""Fixture submissions: realistic wrong answers and alternative correct answers.

Each is a small TOML file under tests/submissions/<assignment>/ that names the answer cells
it replaces; every other answer cell gets the reference solution:

    kind = "wrong"              # or "alternative" (a different correct approach)
    description = "pick_device() hard-codes 'cpu': never looks for CUDA or MPS"
    loses = ["test_pick_device_mocked"]   # test cells that must score 0; all others full

    [answers]
    pick_device = '''
    def pick_device(name=None):
        return torch.device("cpu")
    '''

    [shows]                     # optional: what the grader's message for a lost cell must say
    test_pick_device_mocked = ["hard-coded"]   # each string, ignoring case and line breaks

The submission is the released notebook with these answers typed in, as a student would.
`make.py test` grades several fixtures in one submission where their grades cannot mix up
(coursetools/author/fixture_groups.py); `alone = "why"` keeps one apart.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from nbformat import NotebookNode

from coursetools import layout, notebooks

KINDS = ("wrong", "alternative")


class FixtureError(ValueError):
    pass


@dataclass
class Fixture:
    assignment: str
    name: str
    kind: str
    description: str
    loses: list[str]
    answers: dict[str, str] = field(default_factory=dict)
    path: Path | None = None
    alone: str = ""  # why this fixture must be graded in a notebook of its own, if it must
    # test cell -> what the message the grader shows for it must contain: the learner is told
    # what they did, not only that the cell failed (a cell in `loses` only)
    shows: dict[str, list[str]] = field(default_factory=dict)

    @property
    def student_id(self) -> str:
        return f"{self.kind}-{self.name}".replace("_", "-")


def load(path: Path) -> Fixture:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise FixtureError(f"{path}: not valid TOML: {exc}") from None
    kind = data.get("kind")
    if kind not in KINDS:
        raise FixtureError(f"{path}: kind must be one of {KINDS}, got {kind!r}")
    fixture = Fixture(
        assignment=path.parent.name,
        name=path.stem,
        kind=kind,
        description=str(data.get("description", "")).strip(),
        loses=list(data.get("loses", [])),
        answers={k: str(v).strip("\n") for k, v in data.get("answers", {}).items()},
        path=path,
        alone=data.get("alone", ""),
        shows=_shows(path, data.get("shows", {})),
    )
    if not isinstance(fixture.alone, str):
        raise FixtureError(f"{path}: `alone` says why the fixture must be graded by itself, as a string")
    fixture.alone = fixture.alone.strip()
    if not fixture.description:
        raise FixtureError(f"{path}: say in `description` which misconception it is")
    if kind == "wrong" and not fixture.loses:
        raise FixtureError(f"{path}: a wrong answer must lose points (`loses` is empty)")
    if kind == "alternative" and fixture.loses:
        raise FixtureError(f"{path}: an alternative correct answer must lose nothing")
    if not fixture.answers:
        raise FixtureError(f"{path}: [answers] replaces no answer cell")
    not_lost = sorted(set(fixture.shows) - set(fixture.loses))
    if not_lost:
        raise FixtureError(f"{path}: [shows] names {', '.join(not_lost)}, which the fixture does not lose: "
                           "a message is shown only for a test cell that fails")
    return fixture


def _shows(path: Path, table) -> dict[str, list[str]]:
    if not isinstance(table, dict):
        raise FixtureError(f"{path}: [shows] maps a test cell to the strings its message must contain")
    out = {}
    for gid, wanted in table.items():
        wanted = [wanted] if isinstance(wanted, str) else wanted
        if not isinstance(wanted, list) or not wanted or not all(isinstance(w, str) and w.strip() for w in wanted):
            raise FixtureError(f"{path}: [shows] {gid} must be a non-empty string or list of strings")
        out[gid] = wanted
    return out


def _plain(text: str) -> str:
    return " ".join(text.split()).casefold()


def message_problems(fixture: Fixture, gid: str, message: str) -> list[str]:
    """What is wrong with the message the grader showed for test cell `gid` of this fixture:
    a string of its [shows] it lacks (compared ignoring case and line breaks), or terminal
    colour codes the learner would see raw. [] when the message is as declared."""
    wanted = fixture.shows.get(gid, [])
    if not wanted:
        return []
    problems = [f"{gid}: the message does not say {w!r}" for w in wanted if _plain(w) not in _plain(message)]
    if "\x1b[" in message:
        problems.append(f"{gid}: the message carries raw terminal colour codes (\\x1b[...m)")
    return problems


def all_fixtures(root: Path = layout.ROOT) -> list[Fixture]:
    out = []
    for name in layout.assignments(root):
        folder = root / "tests" / "submissions" / name
        if folder.is_dir():
            out.extend(load(p) for p in sorted(folder.glob("*.toml")))
    return out


def reference_answers(source: NotebookNode) -> dict[str, str]:
    """grade_id -> the reference solution's code, markers removed."""
    return {
        notebooks.grade_id(c): notebooks.strip_solution_markers(c.source)
        for c in source.cells if notebooks.is_solution(c)
    }


def fill(release: NotebookNode, answers: dict[str, str]) -> NotebookNode:
    """The release with the given answer cells typed in (others stay as released)."""
    nb = notebooks.clear_outputs(NotebookNode(release))
    ids = {notebooks.grade_id(c) for c in nb.cells if notebooks.is_solution(c)}
    unknown = sorted(set(answers) - ids)
    if unknown:
        raise FixtureError(f"no answer cell {', '.join(unknown)} (answer cells: {', '.join(sorted(ids))})")
    for cell in nb.cells:
        gid = notebooks.grade_id(cell)
        if notebooks.is_solution(cell) and gid in answers:
            cell.source = answers[gid]
    return nb


def solved_release(name: str, root: Path = layout.ROOT) -> NotebookNode:
    """The released notebook with every reference answer filled in."""
    source = notebooks.read(layout.source_notebook(name, root))
    return fill(notebooks.read(layout.release_notebook(name, root)), reference_answers(source))


def solved_release_with_proofs(name: str, root: Path = layout.ROOT) -> NotebookNode:
    """The solved release, with each locked cell's solutions-only region put back (the proof
    that a Predict question's reference answers are what this PyTorch does, which the release
    never holds): what test-torch runs on both ends of the supported range. The
    release keeps the source's cells in order, so cells pair up by position (a run cell
    needs no grade id)."""
    nb = solved_release(name, root)
    source = notebooks.read(layout.source_notebook(name, root))
    if len(source.cells) != len(nb.cells):
        raise FixtureError(f"{name}: the release has {len(nb.cells)} cells, the source {len(source.cells)}: "
                           "run `python3 make.py release`")
    for mine, theirs in zip(nb.cells, source.cells):
        if (theirs.cell_type != "code" or notebooks.is_solution(theirs) or notebooks.is_grade(theirs)
                or notebooks.BEGIN_SOLUTIONS_ONLY not in theirs.source):
            continue
        if notebooks.strip_solutions_only(theirs.source).strip() != mine.source.strip():
            raise FixtureError(f"{name}: a released cell is not the source's without its proof: "
                               "run `python3 make.py release`")
        mine.source = theirs.source
    return nb


def submission(fixture: Fixture, root: Path = layout.ROOT) -> NotebookNode:
    return submission_with(fixture.assignment, fixture.answers, str(fixture.path), root)


def submission_with(assignment: str, changed: dict[str, str], what: str = "",
                    root: Path = layout.ROOT) -> NotebookNode:
    """The release with the reference answers typed in, except the `changed` answer cells."""
    source = notebooks.read(layout.source_notebook(assignment, root))
    answers = reference_answers(source)
    unknown = sorted(set(changed) - set(answers))
    if unknown:
        raise FixtureError(f"{what or assignment}: no answer cell {', '.join(unknown)}")
    answers.update(changed)
    return fill(notebooks.read(layout.release_notebook(assignment, root)), answers)


def expected_scores(fixture: Fixture, source: NotebookNode) -> dict[str, float]:
    """Test cell id -> the score this fixture must get."""
    tests = {notebooks.grade_id(c): notebooks.points(c) for c in notebooks.test_cells(source)}
    unknown = sorted(set(fixture.loses) - set(tests))
    if unknown:
        raise FixtureError(f"{fixture.path}: `loses` names no test cell {', '.join(unknown)}")
    return {gid: 0.0 if gid in fixture.loses else pts for gid, pts in tests.items()}
