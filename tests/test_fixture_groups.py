"""Fixture groups (coursetools/fixture_groups.py): several fixtures graded in one submission
only where their grades cannot mix up. Static checks: no kernel, no nbgrader."""

from __future__ import annotations

import textwrap

import nbformat
import pytest

from coursetools import cellcode, fixture_groups, fixtures, layout, notebooks

FIXTURES = fixtures.all_fixtures()


@pytest.mark.parametrize("code, flagged", [
    ("def f(d):\n    torch.set_default_device(d)", "calls torch.set_default_device()"),
    ("def f(s):\n    torch.manual_seed(s)\n    return torch.randn(3)", "calls torch.manual_seed()"),
    ("def f():\n    os.environ['CUDA_VISIBLE_DEVICES'] = ''", "changes os.environ"),
    ("def f():\n    torch.backends.cudnn.benchmark = True", "changes torch.backends.cudnn.benchmark"),
    ("def f():\n    global DEVICE\n    DEVICE = 'cpu'", "rebinds DEVICE"),
    ("def f():\n    sys.exit(1)", "can end the kernel"),
    ("def f(m):\n    setattr(nn.Module, 'to', None)", "sets an attribute of the notebook-level nn"),
    ("def f(x):\n    MODEL.weight = x", "changes MODEL.weight"),
    ("def f(x):\n    torch.set_autocast_enabled(False)\n    return x", "calls torch.set_autocast_enabled()"),
    ("def f(cls):\n    torch.serialization.add_safe_globals([cls])", "calls torch.serialization.add_safe_globals()"),
])
def test_global_effects_are_found(code, flagged):
    effects = fixture_groups.global_effects(code)
    assert any(flagged in e for e in effects), effects


@pytest.mark.parametrize("code", [
    "def f(shape, seed):\n    g = torch.Generator().manual_seed(seed)\n    return torch.randn(shape, generator=g)",
    "def f(x):\n    with torch.set_grad_enabled(False):\n        return x * 2",
    "def f(d):\n    seen = {}\n    seen.setdefault('a', d)\n    return seen",
    "class M(nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.w = nn.Parameter(torch.ones(2))",
    "def f(m, name, t):\n    setattr(m, name, t)\n    return m",
    "def f(p):\n    p.kill()",
    "def f(model, t):\n    model.register_buffer('stats', t)\n    return model",
])
def test_local_work_is_not_a_global_effect(code):
    assert fixture_groups.global_effects(code) == []


def test_names_read_are_free_names_only():
    tree = cellcode.parse(textwrap.dedent("""
        import torch
        LIMIT = 3
        def f(x, device=DEFAULT):
            y = x.to(device)
            return helper(y) + LIMIT + [z for z in range(2)][0]
        print(OTHER)
        %time f(1)
    """))
    assert fixture_groups._used(tree) == {"DEFAULT", "helper", "OTHER", "print", "range", "get_ipython"}


def _notebook(cells: list[tuple[str, str, str]]) -> nbformat.NotebookNode:
    """A made-up source notebook: (kind, grade id, code) per cell."""
    nb = nbformat.v4.new_notebook()
    for kind, gid, code in cells:
        cell = nbformat.v4.new_code_cell(textwrap.dedent(code).strip())
        if kind == "answer":
            cell.metadata.nbgrader = {"grade": False, "solution": True, "locked": False, "grade_id": gid,
                                      "schema_version": 3}
            cell.source = f"{notebooks.BEGIN_SOLUTION}\n{cell.source}\n{notebooks.END_SOLUTION}"
        elif kind == "test":
            cell.metadata.nbgrader = {"grade": True, "solution": False, "locked": True, "grade_id": gid,
                                      "points": 1, "schema_version": 3}
        else:
            cell.metadata.nbgrader = {"grade": False, "solution": False, "locked": True, "grade_id": gid,
                                      "schema_version": 3}
        nb.cells.append(cell)
    return nb


SOURCE = _notebook([
    ("code", "setup", "DATA = [1, 2, 3]"),
    ("code", "helpers", "def twice_a(x):\n    return 2 * f_a(x)"),
    ("answer", "a", "def f_a(x):\n    return x + 1"),
    ("answer", "b", "def f_b(x):\n    return x - 1"),
    ("answer", "c", "def f_c():\n    return sum(DATA)"),
    ("test", "test_a", "assert f_a(1) == 2"),
    ("test", "test_a_twice", "assert twice_a(1) == 4"),
    ("test", "test_b", "assert f_b(1) == 0"),
    ("test", "test_c", "assert f_c() == 6 and DATA == [1, 2, 3]"),
])


def _fx(name, answers, loses=(), kind="wrong", alone=""):
    return fixtures.Fixture("made_up", name, kind, name, list(loses), answers, alone=alone)


def test_groups_follow_what_each_test_can_see():
    wrong_a = _fx("a_off", {"a": "def f_a(x):\n    return x"}, ["test_a", "test_a_twice"])
    wrong_b = _fx("b_off", {"b": "def f_b(x):\n    return x"}, ["test_b"])
    # reads DATA, which test_c reads too: it could change it, so it never shares with test_c's losers
    b_reads_data = _fx("b_reads_data", {"b": "def f_b(x):\n    DATA.append(x)\n    return x - 1"}, ["test_c"])
    wrong_c = _fx("c_off", {"c": "def f_c():\n    return 0"}, ["test_c"])
    b_leaks = _fx("b_leaks", {"b": "def f_b(x):\n    torch.set_default_device('meta')\n    return x - 1"},
                  kind="alternative")
    declared = _fx("c_declared", {"c": "def f_c():\n    return 6"}, kind="alternative", alone="made-up reason")
    made_up = [wrong_a, wrong_b, b_reads_data, wrong_c, b_leaks, declared]

    analysis = fixture_groups.Analysis(SOURCE, made_up)
    assert analysis.tests_seen_by(wrong_a) == {"test_a", "test_a_twice"}  # through twice_a
    assert analysis.tests_seen_by(b_reads_data) == {"test_b", "test_c"}  # through DATA
    assert analysis.alone_because(b_leaks) == ["b: calls torch.set_default_device()"]
    assert analysis.alone_because(declared) == ["its TOML says alone: made-up reason"]

    got = [[fx.name for fx in g.members] for g in fixture_groups.groups("made_up", made_up, SOURCE)]
    assert got == [["a_off", "b_off", "c_off"], ["b_leaks"], ["b_reads_data"], ["c_declared"]]


def test_a_member_is_held_to_its_own_cells_and_to_every_cell_no_member_loses():
    wrong_a = _fx("a_off", {"a": "def f_a(x):\n    return x"}, ["test_a", "test_a_twice"])
    wrong_b = _fx("b_off", {"b": "def f_b(x):\n    return x"}, ["test_b"])
    group = fixture_groups.Group("made_up", 1, [wrong_a, wrong_b])
    assert group.student_id == "fixtures-01" and group.loses == {"test_a", "test_a_twice", "test_b"}
    assert group.expected_for(wrong_a, SOURCE) == {"test_a": 0.0, "test_a_twice": 0.0, "test_c": 1.0}
    assert group.expected_for(wrong_b, SOURCE) == {"test_b": 0.0, "test_c": 1.0}
    assert fixture_groups.Group("made_up", 2, [wrong_b]).student_id == wrong_b.student_id


@pytest.mark.parametrize("name", layout.assignments())
def test_the_course_groups_keep_every_fixture_claim_apart(name):
    source = notebooks.read(layout.source_notebook(name))
    mine = [fx for fx in FIXTURES if fx.assignment == name]
    groups = fixture_groups.groups(name, FIXTURES, source)
    assert sorted(fx.name for g in groups for fx in g.members) == sorted(fx.name for fx in mine)
    assert len({g.student_id for g in groups}) == len(groups)
    analysis = fixture_groups.Analysis(source, mine)
    for group in groups:
        for fx in group.members:
            if analysis.alone_because(fx):
                assert group.members == [fx], f"{fx.name} must be graded alone: {analysis.alone_because(fx)}"
            for other in group.members:
                if other is fx:
                    continue
                assert not set(fx.answers) & set(other.answers), (fx.name, other.name)
                assert not set(fx.loses) & set(other.loses), (fx.name, other.name)
                assert not set(fx.loses) & analysis.tests_seen_by(other), (
                    f"{other.name} can reach {fx.name}'s lost tests")
    # the point of it: fewer kernels than fixtures
    assert len(groups) < len(mine)


def test_alone_must_say_why(tmp_path):
    folder = tmp_path / "01_device_basics"
    folder.mkdir()
    path = folder / "kept_apart.toml"
    body = 'kind = "alternative"\ndescription = "d"\n[answers]\npick_device = "def pick_device(p=None): pass"\n'
    path.write_text('alone = true\n' + body)
    with pytest.raises(fixtures.FixtureError, match="`alone` says why"):
        fixtures.load(path)
    path.write_text('alone = "  patches torch.cuda for the rest of the kernel  "\n' + body)
    assert fixtures.load(path).alone == "patches torch.cuda for the rest of the kernel"
