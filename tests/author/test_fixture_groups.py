"""Fixture groups (coursetools/author/fixture_groups.py): several fixtures graded in one submission
only where their grades cannot mix up. Static checks: no kernel, no nbgrader."""

from __future__ import annotations

import textwrap

import nbformat
import pytest

from coursetools import cellcode, layout, notebooks
from coursetools.author import fixture_groups, fixtures

FIXTURES = fixtures.all_fixtures()


@pytest.mark.parametrize("code, flagged", [
    ("def f(d):\n    torch.set_default_device(d)", "calls torch.set_default_device()"),
    ("def f(s):\n    torch.manual_seed(s)\n    return torch.randn(3)", "calls torch.manual_seed()"),
    ("def f():\n    os.environ['CUDA_VISIBLE_DEVICES'] = ''", "changes os.environ"),
    ("def f():\n    torch.backends.cudnn.benchmark = True", "changes torch.backends.cudnn.benchmark"),
    ("def f():\n    global DEVICE\n    DEVICE = 'cpu'", "rebinds DEVICE"),
    ("def f():\n    sys.exit(1)", "can end the kernel"),
    ("def f(m):\n    setattr(nn.Module, 'to', None)", "sets an attribute of nn.Module"),
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
    # the magic's own name comes along from its string: harmless, never a notebook name
    assert fixture_groups._used(tree) == {"DEFAULT", "helper", "OTHER", "print", "range", "get_ipython", "time"}


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
    # c_off stays apart from b_off too: cell b is read with every fixture's version of it, and
    # one of them (b_reads_data) reads DATA, which c_off's test reads (cautious, never unsound)
    assert got == [["a_off", "b_off"], ["b_leaks"], ["b_reads_data"], ["c_declared"], ["c_off"]]


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


_PLAIN_B = {"b": "def f_b(x):\n    return x - 1"}
_BASE = [("code", "setup", "import torch\nDATA = [1, 2, 3]\ndef reset():\n    DATA.clear()"),
         ("answer", "a", "def f_a(x):\n    return x + 1"),
         ("answer", "b", "def f_b(x):\n    return x - 1"),
         ("test", "test_a", "assert f_a(1) == 2"),
         ("test", "test_b", "assert f_b(1) == 0 and DATA == [1, 2, 3]")]


def _with(index, cell):
    cells = list(_BASE)
    cells[index] = cell
    return cells


# Ways one fixture's answer could change another fixture's lost test (found by attacking the
# analysis): each must keep the two fixtures apart.
HOLES = {
    "setter after an import in the answer": (_BASE, "import torch\ntorch.manual_seed(0)\ndef f_a(x):\n    return x"),
    "setter after an import in the function": (
        _BASE, "def f_a(x):\n    import torch\n    torch.set_default_dtype(torch.float64)\n    return x"),
    "os.environ after an import": (_BASE, "import os\nos.environ['CUDA_VISIBLE_DEVICES'] = ''\ndef f_a(x):\n    return x"),
    "setter under another name": (_BASE, "from torch import manual_seed as ms\nms(0)\ndef f_a(x):\n    return x"),
    "a notebook helper that changes a variable": (_BASE, "def f_a(x):\n    reset()\n    return x"),
    "an argument changed in place": (
        [("code", "setup", "X = [1, 2, 3]"), _BASE[1], _BASE[2], ("test", "test_a", "assert f_a(X) == [2, 3, 4]"),
         ("test", "test_b", "assert f_b(1) == 0 and X == [1, 2, 3]")],
        "def f_a(xs):\n    xs.append(0)\n    return xs"),
    "a class attribute changed by a method": (
        _with(0, ("code", "setup", "class Registry:\n    items = []"))[:4]
        + [("test", "test_b", "assert f_b(1) == 0 and Registry.items == []")],
        "def f_a(x):\n    Registry.items.append(x)\n    return x"),
    "a test that calls the answer through eval": (
        _BASE[:4] + [("test", "test_b", "assert f_b(1) == 0\nassert eval('f_a(0)') == 1")], "def f_a(x):\n    return x"),
    "a test that calls the answer in a magic": (
        _BASE[:4] + [("test", "test_b", "assert f_b(1) == 0\n%timeit -n1 -r1 f_a(0)")], "def f_a(x):\n    return x"),
    "a test that finds the answer by its name": (
        _BASE[:4] + [("test", "test_b", "assert f_b(1) == 0\nassert globals()['f_a'](0) == 1")],
        "def f_a(x):\n    return x"),
    "del of a notebook name": (
        _with(0, ("code", "setup", "def helper(x):\n    return x"))[:3]
        + [("test", "test_a", "assert f_a(1) == 2"), ("test", "test_b", "assert helper(1) == 1")],
        "del helper\ndef f_a(x):\n    return x"),
    "a registering decorator": (_BASE, "import atexit\n@atexit.register\ndef f_a(x=0):\n    return x"),
    "a setter found by getattr": (_BASE, "getattr(torch, 'manual_seed')(0)\ndef f_a(x):\n    return x"),
    "a write through globals()": (_BASE, "globals()['DATA'] = []\ndef f_a(x):\n    return x"),
    "a method replaced on the class of an argument": (
        _BASE, "def f_a(m):\n    type(m).forward = lambda self, x: 0\n    return 1"),
}


@pytest.mark.parametrize("name", list(HOLES))
def test_fixtures_that_could_reach_each_other_are_kept_apart(name):
    cells, code = HOLES[name]
    source = _notebook(cells)
    a = _fx("a_x", {"a": code}, ["test_a"])
    b = _fx("b_x", dict(_PLAIN_B), ["test_b"])
    got = [[fx.name for fx in g.members] for g in fixture_groups.groups("made_up", [a, b], source)]
    assert got == [["a_x"], ["b_x"]], fixture_groups.Analysis(source, [a, b]).tests_seen_by(a)


def test_a_read_inside_a_nested_function_and_an_except_block_count():
    tree = cellcode.parse(textwrap.dedent("""
        def check():
            def go():
                device = "cpu"
                return device
            return f_a(device)
        try:
            import numpy as np
        except ImportError:
            def helper():
                pass
    """))
    assert fixture_groups._used(tree) == {"ImportError", "device", "f_a"}
    assert fixture_groups._top_level(tree) == ({"check", "helper", "np"}, set())
