"""A channel that cannot exhaust the grader: an answer from the student's kernel is bounded
(size, items, nesting) before the grader decodes it, what the grader holds for a kernel (its
exception classes, its proxies) goes with that kernel's channel, and a grading worker is capped
and replaced after a submission that left it too big.

The attacks are scaled down from the ones measured through grade-class (5,000,000 empty lists:
a worker from 301 to 2,484 MiB; 200,000 fresh exception classes: 944 MiB held through the next
22 students); each runs in a subprocess that measures its own peak memory (VmHWM)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from coursetools import layout
from coursetools.grading import remote
from coursetools.instructor import gradejob

PROBE = r'''
import gc, json, sys
from nbformat import v4
from coursetools import notebooks
from coursetools.grading.execute import execute_resilient

def cell(source, gid, kind):
    c = v4.new_code_cell(source)
    md = {"grade": False, "solution": kind == "answer", "locked": kind != "answer", "grade_id": gid,
          "schema_version": 3, "task": False}
    if kind == "test":
        md.update(grade=True, points=2)
    c.metadata["nbgrader"] = md
    return c

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024

def run(answer):
    nb = v4.new_notebook(cells=[cell("import torch", "setup", "locked"), cell(answer, "answer_f", "answer")]
                         + [cell("assert f() == 2, 'f() must return 2'", f"test_{i}", "test") for i in range(2)])
    report = execute_resilient(nb, cwd="/tmp", timeout=120)
    return [[report.outcomes[i].value, [o.get("evalue", "") for o in c.outputs if o.output_type == "error"]]
            for i, c in enumerate(nb.cells) if notebooks.is_test_cell(c)]

run("def f():\n    return 2")  # imports and a first kernel, before measuring
gc.collect()
before = status("VmRSS")
open("/proc/self/clear_refs", "w").write("5")  # the peak (VmHWM) starts again from here
tests = run(sys.argv[1])
peak = status("VmHWM")
gc.collect()
alive = sum(1 for o in gc.get_objects() if isinstance(o, type) and o.__name__.startswith("DeviceError"))
print("RESULT " + json.dumps({"before": before, "peak": peak, "after": status("VmRSS"), "tests": tests,
                              "classes_alive": alive}))
'''

# The agent's encoder replaced: every answer after the first is 1,500,000 empty lists (6 MB of
# JSON; decoded, over 200 MiB in the grader). The agent's module has a name drawn per notebook;
# a determined student finds it among the modules all the same.
EMPTY_LISTS = ("def f():\n"
               "    import sys\n"
               "    agent = next(m for n, m in list(sys.modules.items()) if hasattr(m, 'serve') and\n"
               "                 n.startswith('__course')).serve.__self__\n"
               "    agent.enc = lambda value, depth=0: [[] for _ in range(1_500_000)]\n"
               "    return 2")
# Within the agent's own caps (10,000 items a tuple): 20,000 fresh exception classes, each of
# which the grader used to turn into a class of its own, kept for good in a module-level cache.
EXCEPTION_CLASSES = ("def f():\n"
                     "    return tuple(tuple(type(f'DeviceError{i}_{j}', (RuntimeError,), {})\n"
                     "                       for j in range(10_000)) for i in range(2))")


def _probe(answer: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(layout.ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", PROBE, answer], capture_output=True, text=True,
                          env=env, cwd=str(layout.ROOT), timeout=400)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"the probe failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux's /proc")
def test_an_answer_of_millions_of_empty_lists_costs_its_test_not_the_graders_memory():
    """Before: the grader's peak rose by 225 MiB (decoded, then dropped); now by 17-31 MiB."""
    got = _probe(EMPTY_LISTS)
    (first, _), (second, said) = got["tests"]
    assert first == "ok", got  # the first answer was the agent's own
    assert second == "error" and any("the answer sent more than" in s for s in said), got
    assert got["peak"] - got["before"] < 100, got


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux's /proc")
def test_fresh_exception_classes_are_bounded_and_freed_with_the_channel():
    """Before: 20,000 classes made here and kept after the notebook (84 MiB more, for every
    student after); now the 1,001st fails the test, and none is left once the notebook is done."""
    got = _probe(EXCEPTION_CLASSES)
    for outcome, said in got["tests"]:
        assert outcome == "error" and any("more than 1,000 exception classes" in s for s in said), got
    assert got["classes_alive"] == 0, got
    assert got["peak"] - got["before"] < 60, got


@pytest.mark.parametrize("text, what", [
    (json.dumps({"ok": [[]] * 2_000_000}), "items"),
    (json.dumps({"ok": "x" * (remote.MAX_ANSWER_CHARS + 1)}), "characters"),
    ("[" * 100 + "]" * 100, "levels of nesting"),
    ('{"ok": ' + "[" * 40 + "{}," * 1_200_000 + "]" * 40 + "}", "items"),
])
def test_an_answer_over_a_limit_is_refused_before_it_is_decoded(text, what):
    with pytest.raises(remote.AnswerTooLarge, match=what):
        remote.check_answer(text)


@pytest.mark.parametrize("text", [
    json.dumps({"ok": {"$": "raw", "v": {"values": [[0.123456789012345] * 1000] * 1000}}}),  # a 1000x1000 tensor
    json.dumps({"ok": "a, [b], {c}, " * 500_000}),  # commas and brackets inside a string are not items
    json.dumps({"raised": {"message": "\\\"[[[[" * 1000}}),
    "[" * 64 + "]" * 64,
])
def test_honest_answers_are_within_the_limits(text):
    remote.check_answer(text)


def test_no_exception_class_is_kept_outside_its_channel():
    """The cache is the channel's own: nothing at module level outlives a student."""
    assert not [name for name, value in vars(remote).items()
                if isinstance(value, dict) and name.upper() == name and "EXCEPTION" in name]


def test_a_worker_past_the_threshold_is_replaced(monkeypatch):
    monkeypatch.setenv(gradejob.WORKER_RECYCLE_ENV, "1")
    assert "more than 1 MiB" in gradejob.retire_reason()
    monkeypatch.setenv(gradejob.WORKER_RECYCLE_ENV, "0")
    assert gradejob.retire_reason() is None
    out_of_memory = gradejob.Outcome("a", "s", out_of_memory=True)
    assert "ran out of memory" in gradejob.retire_reason(out_of_memory)


def test_a_worker_is_under_a_memory_cap():
    """The cap is on the worker's heap (RLIMIT_DATA's soft limit): a kernel's sandbox still
    sets its own. Checked in a child, which then fails to allocate past it."""
    code = ("import os, resource\n"
            "os.environ['COURSE_WORKER_MEMORY_MIB'] = '600'\n"
            "from coursetools.instructor import gradejob\n"
            "print(gradejob.cap_memory(), resource.getrlimit(resource.RLIMIT_DATA)[1] == resource.RLIM_INFINITY)\n"
            "try:\n    b = bytearray(900 * 2**20)\nexcept MemoryError:\n    print('MemoryError')\n")
    env = dict(os.environ, PYTHONPATH=str(layout.ROOT))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.stdout.split() == ["600", "True", "MemoryError"], done.stdout + done.stderr
