"""What a test expects is built by the grader's torch and numpy, its comparisons run here on
copies, and what it observes of a kernel tensor is read by the library's own accessors, taken
before any student code ran (coursetools/grading/remote.py, agent_kernel.py).

Each attack (tests/hostile_submissions.py, round 4) scored full marks from a wrong answer before,
with no flag (the torch.device class replaced: 26/26 against an honest 20 on chapter 01); here
each scores what its answer earns, and the honest answer of each test keeps its pass."""

from __future__ import annotations

import pytest
from nbformat import v4

import hostile_submissions as H
from coursetools.grading.execute import Outcome, execute_resilient


def _cell(source, gid, **flags):
    cell = v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade": False, "solution": False, "locked": False, "grade_id": gid,
                                 "schema_version": 3, "task": False, **flags}
    return cell


SETUP = "import torch\nimport numpy as np\nfrom torch import nn"


def _run(answer: str, tests: list[str]):
    cells = [_cell(SETUP, "setup", locked=True), _cell(answer, "answer", solution=True)]
    cells += [_cell(t, f"test_{i}", grade=True, locked=True, points=2) for i, t in enumerate(tests)]
    nb = v4.new_notebook(cells=cells)
    report = execute_resilient(nb, cwd="/tmp", timeout=120)
    outcomes = report.outcomes[2:]
    errors = ["".join(o.get("evalue", "") for o in c.outputs if o.output_type == "error") for c in nb.cells[2:]]
    return outcomes, errors


DEVICE_TEST = "assert pick_device() == torch.device('cuda', 0), 'expected cuda:0'"
DEVICE_TEST_ISINSTANCE = ("d = pick_device()\n"
                          "assert isinstance(d, torch.device) and d.type == torch.device('cuda').type, d")
ALLCLOSE_TESTS = ["assert torch.allclose(make(), torch.ones(3)), 'values'",
                  "assert torch.equal(make(), torch.ones(3)), 'values'",
                  "torch.testing.assert_close(make(), torch.ones(3))"]
ARRAY_TESTS = ["assert np.array_equal(to_numpy(torch.ones(3)), np.ones(3)), 'values'",
               "assert np.allclose(to_numpy(torch.ones(3)), np.ones(3)), 'values'"]
META_TESTS = ["m = build_on()\nassert all(p.is_meta for p in m.parameters()), 'not on meta'",
              "m = build_on()\nassert all(t.is_meta for t in m.state_dict().values()), 'not on meta'"]

ATTACKS = {
    "the kernel's torch.device replaced": (H.REPLACED_DEVICE_CLASS, [DEVICE_TEST, DEVICE_TEST_ISINSTANCE],
                                           "def pick_device():\n    return torch.device('cuda', 0)"),
    "a tensor subclass agreeing to allclose/equal": (
        H.AGREEING_TENSOR, ALLCLOSE_TESTS, "def make():\n    return torch.ones(3)"),
    "an ndarray subclass agreeing to array_equal/allclose": (
        H.AGREEING_ARRAY, ARRAY_TESTS, "def to_numpy(t):\n    return t.numpy()"),
    "Parameter and Tensor subclasses saying is_meta": (
        H.META_SUBCLASSES, META_TESTS, "def build_on():\n    return nn.Linear(2, 2, device='meta')"),
    "mock.patch.object(torch.Tensor, 'is_meta')": (
        H.META_MOCK_PATCH, META_TESTS, "def build_on():\n    return nn.Linear(2, 2, device='meta')"),
    "is_meta set through [torch.Tensor][0]": (
        H.META_LIST_ALIAS, META_TESTS, "def build_on():\n    return nn.Linear(2, 2, device='meta')"),
    # The agent's module has a name drawn for each notebook: the known name finds nothing.
    "the agent found by its name, its encoder replaced": (
        H.AGENT_BY_NAME, ["assert f() == 2, 'two'"], "def f():\n    return 2"),
    # A test's torch.ones and torch.Tensor are the library's, as the agent found them at install.
    "torch.ones rebound through a parameter": (
        H.REBOUND_FACTORY, ALLCLOSE_TESTS[:2], "def make():\n    return torch.ones(3)"),
    "torch.Tensor rebound through a parameter": (
        H.REBOUND_TENSOR_CLASS, ["assert isinstance(make(), torch.Tensor), 'a tensor'",
                                 "assert isinstance(make(), (torch.Tensor, np.ndarray)), 'a tensor'"],
        "def make():\n    return torch.ones(3)"),
}


@pytest.mark.parametrize("what", list(ATTACKS))
def test_an_attack_on_expected_values_or_observations_scores_what_it_earns(what):
    attack, tests, honest = ATTACKS[what]
    outcomes, errors = _run(attack, tests)
    assert all(o is Outcome.ERROR for o in outcomes), f"{what}: {outcomes}"
    if "subclass" in what:
        # The test fails saying why: the value is of a class the course never makes.
        assert "defined outside PyTorch" in errors[0], errors
    outcomes, errors = _run(honest, tests)
    assert all(o is Outcome.OK for o in outcomes), f"{what}, honest: {outcomes} {errors}"


def test_expected_values_are_the_graders_own():
    """The test's torch.device, dtypes and comparison functions are the grader's objects, even
    when the notebook binds `torch` to something else."""
    answer = "import types\ntorch = types.SimpleNamespace(device=lambda *a: 'spoof')\ndef f():\n    return 1"
    test = ("assert repr(torch.device('cuda', 0)) == \"device(type='cuda', index=0)\"\n"
            "assert isinstance(torch.float16, torch.dtype) and str(torch.float16) == 'torch.float16'\n"
            "assert np.array_equal([1, 2], [1, 2]) and not np.array_equal([1, 2], [1, 3])")
    outcomes, errors = _run(answer, [test])
    assert outcomes == [Outcome.OK], errors
