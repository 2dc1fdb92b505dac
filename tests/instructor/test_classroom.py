"""A simulated class graded end to end: release -> collect -> autograde -> feedback -> CSV.

Forty-three students hand in chapter 01 (two of them through `zip_collect`), four hand in
chapter 02; among them every kind of broken, slow and hostile submission a real class
produces, and the attacks of a determined student (issue 22, tests/hostile_submissions.py).
`python3 make.py grade-class` grades them all in one run; each test below checks one
student's exact score and flags, so a failure names the case. Expected scores are "full
marks minus the test cells the submission must lose", computed from the notebooks; an
expected flag is a piece of text one of the student's flags must contain. A student expected
to have no review flag must have none (the static review, coursetools/grading/review.py).
"""

from __future__ import annotations

import csv
import html
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from html.parser import HTMLParser
from pathlib import Path

import pytest

import hostile_submissions as H
from coursetools.author import fixtures
from coursetools.grading import guard, sandbox
from coursetools.instructor import nbgrader_ext
from coursetools import layout, notebooks
from coursetools.author.nbgrader_course import NbgraderCourse

A1, A2 = "01_device_basics", "02_to_semantics"
TOKEN = uuid.uuid4().hex[:8]
OUTSIDE = f"/var/tmp/escaped-{TOKEN}"  # files a submission tries to create outside its folder
OUTSIDE_TMP = f"/tmp/escaped-{TOKEN}"  # (the sandbox's /tmp is private and thrown away)
SANDBOXED = sandbox.bwrap_works()[0]
HUGE_UPDATE = 50 * 2**20  # bytes of one display update (issue 13 measured 200 MiB kept whole)
needs_sandbox = pytest.mark.skipif(not SANDBOXED, reason=f"no working bubblewrap: {sandbox.bwrap_works()[1]}")


def _source(name):
    return notebooks.read(layout.source_notebook(name))


def _points(name):
    return {notebooks.grade_id(c): notebooks.points(c) for c in notebooks.test_cells(_source(name))}


def _test_ids(name):
    return list(_points(name))


def _answers(name):
    return fixtures.reference_answers(_source(name))


def _release(name):
    return notebooks.read(layout.release_notebook(name))


def _cell(nb, gid):
    return next(c for c in nb.cells if notebooks.grade_id(c) == gid)


def _add_cell(nb, source, after=None):
    """A cell the student added (no nbgrader metadata), after cell `after` (default: at the end)."""
    from nbformat import v4
    new = v4.new_code_cell(source)
    new.pop("id", None)  # the course's notebooks are nbformat 4.4: no cell ids
    index = len(nb.cells) if after is None else nb.cells.index(_cell(nb, after)) + 1
    nb.cells.insert(index, new)
    return nb


def _fixture(name, fixture):
    return fixtures.load(layout.SUBMISSIONS_DIR / name / f"{fixture}.toml")


# student -> (notebook builder, test cells it must lose, flags the summary must show)
def class_of_01(course_root):
    full = _answers(A1)
    ids = _test_ids(A1)
    cases = {}

    def solved(**overrides):
        return fixtures.fill(_release(A1), {**full, **overrides})

    cases["correct"] = (solved(), [], [])
    cases["partial"] = (fixtures.fill(_release(A1), {"pick_device": full["pick_device"]}),
                        [i for i in ids if not i.startswith("test_pick_device")], [])
    cases["blank"] = (_release(A1), ids, [])
    cases["infinite-loop"] = (
        solved(seeded_randn="def seeded_randn(shape, seed, device='cpu', dtype=torch.float32):\n"
                            "    while True:\n        pass"),
        ["test_seeded_randn"], ["timeout in test_seeded_randn"])
    cases["kernel-crash"] = (
        solved(common_device="import os\ndef common_device(tensors):\n    os._exit(1)"),
        ["test_common_device", "test_common_device_scalars"], ["kernel crash in test_common_device"])
    cases["sys-exit"] = (solved(build_on="import sys\nsys.exit('I give up')\n" + full["build_on"]),
                         ["test_build_on", "test_build_on_restores"], [])
    cases["huge-output"] = (
        _add_cell(solved(), "for i in range(300_000):\n    print('spam ' * 20)", after="build_on"), [], [])
    cases["memory-hog"] = (
        solved(seeded_randn="hog = []\nwhile True:\n    hog.append(bytearray(50 * 2**20))\n" + full["seeded_randn"]),
        ["test_seeded_randn"], [])
    deleted = solved()
    deleted.cells.remove(_cell(deleted, "test_common_device"))
    cases["deleted-test"] = (deleted, [], ["deleted test_common_device (restored)"])
    # Issue 37: a deleted answer cell comes back empty (graded as unanswered) and is flagged; a
    # notebook saved under another name (a browser's "(1)") is graded under its own, flagged.
    no_answer = solved()
    no_answer.cells.remove(_cell(no_answer, "common_device"))
    cases["deleted-answer"] = (no_answer, ["test_common_device", "test_common_device_scalars"],
                               ["deleted answer cell common_device (restored empty"])
    cases["renamed"] = (solved(), [], [f"graded '{A1} (1).ipynb' as {A1}.ipynb"])
    edited = fixtures.fill(_release(A1), {**full, **_fixture(A1, "pick_device_hardcodes_cpu").answers})
    _cell(edited, "test_pick_device_auto").source = "pass  # trust me"
    _cell(edited, "test_pick_device_named").source = "assert True"
    cases["edited-test"] = (edited, ["test_pick_device_auto", "test_pick_device_named"],
                            ["edited test_pick_device_auto (restored)", "edited test_pick_device_named (restored)"])
    # Cheats that passed without the in-kernel tamper checks of issue 22. With the tests in the
    # grader's process (issue 32) each earns what its answers earn: the patched get_rng_state
    # changes an observation, and the Generator check still fails the wrong seeded_randn; the
    # student's own expect_error is never called (the grader runs the course's).
    cheat = ("def seeded_randn(shape, seed, device='cpu', dtype=torch.float32):\n"
             "    torch.manual_seed(seed)\n"
             "    return torch.randn(shape, device=device, dtype=dtype)\n"
             "_frozen = torch.get_rng_state()\n"
             "torch.get_rng_state = lambda: _frozen  # the 'global state unchanged' check now passes\n")
    cases["torch-patch"] = (solved(seeded_randn=cheat), ["test_seeded_randn"],
                            ["torch.get_rng_state (a module's attribute) (patching)"])
    helper_cheat = (_fixture(A1, "pick_device_silent_fallback").answers["pick_device"]
                    + "\n\ndef expect_error(kind, fn, hint=''):\n    return 'gpu cuda cuda:2 mps'\n")
    cases["helper-patch"] = (solved(pick_device=helper_cheat), _fixture(A1, "pick_device_silent_fallback").loses,
                             ["redefines 'expect_error'"])
    attack = f'''
import sqlite3
attempts = {{}}
for label, action in {{
    "write gradebook": lambda: sqlite3.connect({str(course_root / "gradebook.db")!r}).execute("UPDATE grade SET auto_score = 99"),
    "overwrite another student": lambda: open({str(course_root / "submitted" / "correct" / A1 / f"{A1}.ipynb")!r}, "w").write("{{}}"),
    "write outside": lambda: open({OUTSIDE!r}, "w").write("escaped"),
    "write /tmp": lambda: open({OUTSIDE_TMP!r}, "w").write("escaped"),
    "network": lambda: __import__("socket").create_connection(("1.1.1.1", 80), timeout=3),
}}.items():
    try:
        action()
        attempts[label] = "done?"
    except Exception as exc:
        attempts[label] = type(exc).__name__
print(attempts)
'''
    cases["writes-gradebook"] = (_add_cell(solved(), attack, after="setup"), [], [])
    spy = f'''
import glob, linecache
for path in glob.glob({str(course_root / "solutions" / "**" / "*.ipynb")!r}, recursive=True):
    print(open(path).read())
print(In)
for name, entry in list(linecache.cache.items()):
    print(name, "".join(entry[2]))
'''
    cases["reads-solutions"] = (_add_cell(solved(), spy), [], ["the kernel's history (In) (kernel machinery)"])
    # -- the sandbox, attacked as a root grader's kernel would be (issue 13): each must
    # score its honest score (full marks: the answers are right) and change nothing.
    escape = f"""
import ctypes, errno, glob, json, sqlite3
_libc = ctypes.CDLL(None, use_errno=True)
def _call(name, *args):
    return "ok" if getattr(_libc, name)(*args) == 0 else errno.errorcode[ctypes.get_errno()]
_course = {str(course_root)!r}
_escape = {{"remount / rw": _call("mount", None, b"/", None, 32, None),
           "umount course": _call("umount2", _course.encode(), 2),
           "umount /tmp": _call("umount2", b"/tmp", 2)}}
_escape["solutions"] = len(glob.glob(_course + "/solutions/**/*.ipynb", recursive=True))
try:
    _db = sqlite3.connect(_course + "/gradebook.db")
    _db.execute("UPDATE grade SET auto_score = 0, extra_credit = 50")
    _db.commit()
    _escape["sql"] = "ok"
except Exception as _exc:
    _escape["sql"] = type(_exc).__name__
print("SANDBOX-ATTACK", json.dumps(_escape))
"""
    cases["escape-as-root"] = (_add_cell(solved(), escape, after="setup"), [], ["ctypes (native code)"])
    # The bomb forks from a small Python (a kernel with torch loaded forks slowly); its
    # processes count against the same per-kernel cap.
    bomb = (
        "import errno, json, os\n"
        "r, w = os.pipe()\n"
        "children, error = [], None\n"
        "for _ in range(4096):  # bounded; the children wait on the pipe, so none exits early\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError as exc:\n"
        "        error = errno.errorcode[exc.errno]\n"
        "        break\n"
        "    if pid == 0:\n"
        "        os.close(w)\n"
        "        os.read(r, 1)\n"
        "        os._exit(0)\n"
        "    children.append(pid)\n"
        "os.close(w)\n"
        "for pid in children:\n"
        "    os.waitpid(pid, 0)\n"
        "print('SANDBOX-ATTACK', json.dumps({'forked': len(children), 'error': error}))\n")
    fork_bomb = f"import subprocess, sys\nsubprocess.run([sys.executable, '-S', '-c', {bomb!r}], timeout=600)\n"
    cases["fork-bomb"] = (_add_cell(solved(), fork_bomb, after="setup"), [], [])
    # One cell per file system (each within the 20 s cell limit on a busy machine).
    filled = _add_cell(solved(), """
import errno, json, os
_chunk = bytes(64 * 2**20)
def _fill(where, path):  # two files of 768 MiB (each under the 1 GiB file-size cap):
    written, error = 0, None  # past the 1 GiB tmpfs cap, bounded
    try:
        for part in range(2):
            with open(f"{path}{part}", "wb") as f:
                for _ in range(12):
                    f.write(_chunk)
                    f.flush()
                    written += 64
    except OSError as exc:
        error = errno.errorcode[exc.errno]
    finally:
        for part in range(2):
            if os.path.exists(f"{path}{part}"):
                os.unlink(f"{path}{part}")
    print("SANDBOX-ATTACK", json.dumps({where: [written, error]}))
""", after="setup")
    for where, path in [("/dev/shm", "/dev/shm/hog"), ("/tmp", "/tmp/hog"), ("working folder", "hog")]:
        filled = _add_cell(filled, f"_fill({where!r}, {path!r})")
    flags = []
    if sandbox.cgroup_kind():  # shared memory that no rlimit counts: only the cgroup stops it
        # memfds of 960 MiB (each under the 1 GiB file-size cap), 3 GiB in all; the cap is 2 GiB
        filled = _add_cell(filled, (
            "_fds = [os.memfd_create(f'hog{i}') for i in range(3)]\n"
            "for _fd in _fds:\n"
            "    for _ in range(15):\n"
            "        os.write(_fd, _chunk)\n"
            "print('SANDBOX-ATTACK', json.dumps({'memfd': 'not stopped'}))\n"))
        flags = ["kernel crash in an added cell"]
    cases["fills-memory"] = (filled, [], flags)
    cases["zip-alice"] = (solved(), [], [])
    cases["zip-bob"] = (_release(A1), ids, [])
    # -- forged scores (issue 13): each hook below made blank answers score full marks when
    # nbgrader trusted the kernel's outputs. Blank answers: the honest score is 0, and each
    # must be flagged for review.
    blank_with = lambda source: _add_cell(_release(A1), source, after="setup")  # noqa: E731
    forgeries = {
        "forge-custom-exc": "get_ipython().set_custom_exc((BaseException,), lambda *args, **kwargs: None)",
        "forge-events": (
            "from IPython.display import clear_output\n"
            "def _hide(result):\n"
            "    clear_output()\n"
            "    result.error_in_exec = None  # the reply's status would say 'ok'\n"
            "    get_ipython().display_pub.publish({'text/plain': \"'all good'\"})\n"
            "get_ipython().events.register('post_run_cell', _hide)"),
        "forge-ast": (
            "import ast\n"
            "class _Swallow(ast.NodeTransformer):\n"
            "    def visit_Module(self, node):\n"
            "        handler = ast.ExceptHandler(type=None, name=None, body=[ast.Pass()])\n"
            "        node.body = [ast.Try(body=node.body or [ast.Pass()], handlers=[handler], orelse=[], finalbody=[])]\n"
            "        return ast.fix_missing_locations(node)\n"
            "get_ipython().ast_transformers.append(_Swallow())"),
        "forge-input-transformer": (
            "def _wrap(lines):\n"
            "    return ['try:\\n'] + ['    ' + line for line in lines] + ['\\n', 'except BaseException:\\n', '    pass\\n']\n"
            "get_ipython().input_transformers_cleanup.append(_wrap)"),
        "forge-traceback": "get_ipython()._showtraceback = lambda *args, **kwargs: None",
        "forge-compile": (
            "import ast, builtins\n"
            "_compile = builtins.compile\n"
            "class _NoAsserts(ast.NodeTransformer):\n"
            "    def visit_Assert(self, node):\n"
            "        return ast.Pass()\n"
            "def compile(source, *args, **kwargs):\n"
            "    if isinstance(source, ast.AST):\n"
            "        source = ast.fix_missing_locations(_NoAsserts().visit(source))\n"
            "    return _compile(source, *args, **kwargs)\n"
            "builtins.compile = compile"),
        "forge-torch-code": "torch.manual_seed.__code__ = (lambda *args, **kwargs: None).__code__",
        "forge-tensor-property": "torch.Tensor.is_cpu = property(lambda self: True)",
        "forge-guard-disarmed": (
            "import sys, types\n"
            "_dummy = types.SimpleNamespace(verify=lambda *a: None, before_locked=lambda g: None,\n"
            "                               after_locked=lambda g: None)\n"
            "for _name in [n for n in sys.modules if n.startswith('_grader_guard')]:\n"
            "    sys.modules[_name] = _dummy\n"
            "torch.get_rng_state = lambda: None"),
    }
    for student, source in forgeries.items():
        cases[student] = (blank_with(source), ids, ["review: "])
    fake_device = (
        "class _Device(str):\n"
        "    __class__ = property(lambda self: torch.device)  # isinstance(x, torch.device) is True\n"
        "    type = 'cpu'\n"
        "    def __eq__(self, other):\n"
        "        return True\n"
        "    __hash__ = str.__hash__\n"
        "def pick_device(name=None):\n"
        "    return _Device('cpu')\n")
    pick_tests = [i for i in ids if i.startswith("test_pick_device")]
    cases["forge-str-device"] = (solved(pick_device=fake_device), pick_tests,
                                 ["a class that poses as another type"])
    # -- hidden tests must not reach feedback, in any encoding; nbgrader's markers in a
    # student cell must not cost that student the feedback; feedback HTML runs nothing.
    leak = '''
import base64, linecache, sys
from IPython.display import SVG, display
found = [str(x) for x in In] + [str(x) for x in globals().get("_ih", [])]
found += ["".join(entry[2]) for entry in list(linecache.cache.values()) if len(entry) > 2]
for frame_info in sys._current_frames().values():
    found.append(str(frame_info.f_code.co_consts))
blob = "\\n".join(found)
print(base64.b64encode(blob.encode()).decode())
lines = "".join(f'<text x="0" y="{12 * i}">{line[:200]}</text>' for i, line in enumerate(blob.splitlines()[:2000]))
display(SVG(f'<svg xmlns="http://www.w3.org/2000/svg">{lines}</svg>'))
'''
    cases["leak-base64-svg"] = (_add_cell(solved(), leak), [], ["sys._current_frames (frame access)"])
    marked = solved(pick_device="# ### BEGIN HIDDEN TESTS (my notes)\n" + full["pick_device"])
    cases["nbgrader-markers"] = (marked, [], [])
    script = (
        "from IPython.display import HTML, Javascript, Markdown, display\n"
        "display(HTML('<script>document.title = \"pwned-html\"</script><img src=x onerror=\"alert(1)\">'))\n"
        "display(Javascript('document.title = \"pwned-js\"'))\n"
        "display(Markdown('<script>alert(\"pwned-md\")</script>'))\n")
    scripted = _add_cell(solved(), script)
    from nbformat import v4 as _v4
    md = _v4.new_markdown_cell('My notes <script>alert("pwned-cell")</script><img src=x onerror="alert(2)">')
    md.pop("id", None)
    scripted.cells.append(md)
    cases["live-script"] = (scripted, [], [])
    flood = ("from IPython.display import display\n"
             "handle = display('small', display_id=True)\n"
             f"handle.update('x' * {HUGE_UPDATE})\n")
    cases["huge-display-update"] = (_add_cell(solved(), flood), [], [])
    # -- issue 22: a determined student's attacks (tests/hostile_submissions.py). Before its
    # fixes the first three scored 18/18 from blank answers with no flag, as did
    # user-get-ipython and non-callable; str-device-as-torch 15/18 (12 honest), no flag.
    answer_ids = [notebooks.grade_id(c) for c in _source(A1).cells
                  if notebooks.is_solution(c) and c.cell_type == "code"]
    blank_answers = lambda source: fixtures.fill(_release(A1), {gid: source for gid in answer_ids})  # noqa: E731
    review = "review: "
    cases["closure-key"] = (blank_with(H.CLOSURE_KEY), ids, ["sys.modules (import machinery)", "cell_contents"])
    # The same attack against the guard of issue 22, which it beat (18/18 from blank answers):
    # with no checker in the kernel, it earns nothing.
    cases["closure-key-now"] = (blank_with(H.CLOSURE_KEY_NOW), ids,
                                ["__subclasses__ (object-graph search)", "(function internals)"])
    cases["session-send"] = (blank_answers(H.SESSION_SEND), ids,
                             ["get_ipython (kernel machinery)"])
    cases["magic-number"] = (blank_with(H.MAGIC_NUMBER), ids,
                             ["importlib.util (import machinery)"])
    cases["frame-leak"] = (_add_cell(solved(pick_device=full["pick_device"] + "\n" + H.FRAME_LEAK_WRAPPER),
                                     H.FRAME_LEAK_PRINT), [],
                           ["f_code"])
    cases["str-device-as-torch"] = (solved(pick_device=H.STR_DEVICE_AS_TORCH), pick_tests,
                                    ["poses as another type (__module__)"])
    cases["huge-error"] = (_add_cell(solved(), H.HUGE_ERROR), [], [])
    cases["user-get-ipython"] = (blank_answers(H.USER_GET_IPYTHON), ids,
                                 ["IPython.get_ipython (kernel machinery)"])
    cases["non-callable"] = (blank_with(H.NON_CALLABLE), ids,
                             ["ipykernel.kernelbase.json_clean", review])
    cases["symlink"] = (_add_cell(solved(), H.SYMLINK_READ), [], [f"symbolic link {H.SYMLINK_NAME} -> "])
    # -- issue 32: written against the guard of issue 22, which flagged none of them: blank
    # answers scored 18/18 (inspect closures, Formatter fields), the Tensor property 18/18
    # against an honest 16, the type()-built spoof 15/18 against 12, and the traceback-frame
    # read put 46 of 46 hidden messages in the feedback. Each now earns what its answers earn;
    # whether the static review flags it is not asserted (ANY_REVIEW).
    cases["inspect-closures"] = (blank_with(H.INSPECT_CLOSURES), ids, [])
    cases["formatter-fields"] = (blank_with(H.FORMATTER_FIELDS), ids, [])
    cases["tensor-alias"] = (_add_cell(solved(build_on=_fixture(A1, "build_on_create_then_move").answers["build_on"]),
                                       H.TENSOR_PROPERTY_ALIAS, after="setup"),
                             _fixture(A1, "build_on_create_then_move").loses, [])
    spoof = H.SPOOF_DEVICE.replace("def f():\n    return _Spoof()", "def pick_device(preferred=None):\n    return _Spoof()")
    cases["spoof-device"] = (solved(pick_device=spoof), pick_tests, [])
    frames = H.TRACEBACK_FRAMES.replace("def f():", "def _steal():").replace("    return 3", "    return None")
    wrapped = full["pick_device"] + "\n" + frames + (
        "\n_honest_pick = pick_device\ndef pick_device(*args, **kwargs):\n    _steal()\n"
        "    return _honest_pick(*args, **kwargs)\n")
    cases["traceback-frames"] = (_add_cell(solved(pick_device=wrapped), H.TRACEBACK_PRINT), [], [])
    cases["html-entities"] = (_add_cell(solved(), H.HTML_ENTITIES), [], [])
    return cases


def class_of_02():
    full = _answers(A2)
    ids = _test_ids(A2)
    wrong = _fixture(A2, "move_to_copy_true")
    src = _source(A2)
    first_answer = next(notebooks.grade_id(c) for c in src.cells if notebooks.is_solution(c))
    crash_loses = [notebooks.grade_id(c) for c in notebooks.test_cells(src)
                   if notebooks.grade_id(c) == f"test_{first_answer}"]
    return {
        "correct": (fixtures.fill(_release(A2), full), [], []),
        "blank": (_release(A2), ids, []),
        "partial": (fixtures.submission(wrong), wrong.loses, []),
        "kernel-crash": (fixtures.fill(_release(A2), {
            **full, first_answer: full[first_answer] + "\nimport os\nos._exit(0)"}),
            crash_loses, []),
        # An answer cell Python cannot compile is flagged, with the cell and its line
        "syntax-error": (fixtures.fill(_release(A2), {
            **full, first_answer: full[first_answer] + "\ndef broken(:\n    pass\n"}),
            crash_loses, [f"does not compile: SyntaxError in {first_answer}, line "]),
        # The class report's synthetic class: each a wrong fixture, whose losses are known
        **{fixture.student_id: (fixtures.submission(fixture), fixture.loses, [])
           for fixture in (_fixture(A2, name) for name in REPORT_FIXTURES)},
        "feedback-page": feedback_page_submission(),
    }


# The class report's synthetic class (chapter 02's wrong fixtures, one student each): two pairs name the
# same rule (SAME_RULE: one misconception of two students), the others a rule of their own on
# the same question, so the report's grouping is seen both ways.
SAME_RULE = [("grow_embedding_cat_not_leaf", "grow_embedding_requires_grad_after_cat"),
             ("preprocess_float_first", "preprocess_only_labels_fixed")]
REPORT_FIXTURES = [name for pair in SAME_RULE for name in pair] + [
    "grow_embedding_forgets_dtype", "match_loss_inputs_to_ref", "match_loss_inputs_hard_coded",
    "snapshot_lesson_spelling"]
LATE = "partial"  # chapter 02's: handed in a day after the due date (nbgrader's timestamp.txt)


# The submission whose feedback page test_feedback_page_on_a_phone_and_a_desktop opens: a
# failed visible test (match_loss_inputs hard-codes the device), a failed hidden test (move_to
# setattr()s a frozen dataclass, which only a hidden test passes it) and a syntax error (snapshot).
FEEDBACK_SYNTAX_ERROR = "def snapshot(model:\n    return {}\n"


def feedback_page_submission():
    answers = {**_answers(A2), **_fixture(A2, "move_to_setattr_frozen").answers,
               **_fixture(A2, "match_loss_inputs_hard_coded").answers, "snapshot": FEEDBACK_SYNTAX_ERROR}
    return (fixtures.fill(_release(A2), answers),
            ["test_move_to_structure", "test_match_loss_inputs", "test_snapshot_values", "test_snapshot_independent"],
            ["does not compile: SyntaxError in snapshot, line "])


class ClassSummary:
    """Shows grade-class's table (every student's score and flags) at the end of the test
    run, and keeps it in test-artifacts/grade-class-summary.txt."""

    def __init__(self):
        self.text = ""

    def keep(self, text: str) -> None:
        self.text = text
        out = layout.ROOT / "test-artifacts"
        out.mkdir(exist_ok=True)
        (out / "grade-class-summary.txt").write_text(text)

    # pytest hook, called because graded_class registers this object as a plugin
    def pytest_terminal_summary(self, terminalreporter):
        if self.text:
            terminalreporter.section("grade-class on the simulated class (tests/instructor/test_classroom.py)")
            terminalreporter.write(self.text)


# The simulated class is graded once, in the fixture, by grade-class with two jobs (48
# submissions; one after another they took 937 s on a 2-core machine at load 12; its
# subprocess limit is 3000 s). Every test here may be the one that pays for it, so they all
# get the class's time limit.
pytestmark = pytest.mark.timeout(3600)
JOBS = 2  # the simulation is graded in parallel; test_parallel_equals_serial grades a sample serially


# 60 s per cell: only the endless-loop student should reach it (the correct student's whole
# 01 notebook ran in 22 s at load ~16 on 2 cores), so a busy machine costs no honest point.
GRADING_ARGS = ["--timeout", "60", "--memory-mb", "2048"]


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory, request):
    root = tmp_path_factory.mktemp("class")
    course = NbgraderCourse(root, [A1, A2])
    cases = {A1: class_of_01(course.root), A2: class_of_02()}
    for name, students in cases.items():
        for student, (nb, _, _) in students.items():
            if student.startswith("zip-"):
                path = course.root / "downloaded" / name / "archive" / f"{student}__{name}.ipynb"
                notebooks.write(nb, path)
            else:
                course.submit(student, name, nb)
    # The symlink student's folder holds a link to the course's solutions (with hidden tests).
    link = course.submission_path("symlink", A1).parent / H.SYMLINK_NAME
    link.symlink_to(course.root / "solutions" / A1 / f"{A1}.ipynb")
    sources_before = _tree_digest(course.root / "solutions")
    renamed = course.submission_path("renamed", A1)
    renamed.rename(renamed.with_name(f"{A1} (1).ipynb"))
    # A due date for chapter 02, and one student a day late (nbgrader's own timestamp file)
    course.run("db", "assignment", "add", A2, "--duedate=2026-01-05 12:00:00 UTC")
    (course.submission_path(LATE, A2).parent / "timestamp.txt").write_text("2026-01-06 12:00:00 UTC")
    bad = course.submission_path("invalid-json", A1)
    bad.parent.mkdir(parents=True)
    bad.write_text('{"cells": [ this is not JSON')
    results_json = root / "results.json"
    cmd = [sys.executable, "-m", "coursetools.instructor.classroom", A1, A2, "--course", str(root), "--zip",
           *GRADING_ARGS, "--jobs", str(JOBS), "--json", str(results_json)]
    if not SANDBOXED:  # as root, grade-class refuses to run kernels unsandboxed unless asked
        cmd.append("--unsandboxed-as-root")
    started = time.monotonic()
    scratch_before = _grade_class_scratch()
    proc = subprocess.run(cmd, cwd=layout.ROOT, capture_output=True, text=True, timeout=3000,
                          env=layout.env_with_course_tools())
    scratch_left = sorted(_grade_class_scratch() - scratch_before)
    seconds = time.monotonic() - started
    summary = ClassSummary()
    request.config.pluginmanager.register(summary, "course-class-summary")
    summary.keep(proc.stdout)
    print(proc.stderr[-4000:])
    assert results_json.exists(), f"grade-class failed:\n{proc.stdout}\n{proc.stderr[-5000:]}"
    results = {a: {r["student"]: r for r in rs} for a, rs in json.loads(results_json.read_text()).items()}
    return {"course": course, "cases": cases, "results": results, "proc": proc,
            "sources_before": sources_before, "seconds": seconds, "cmd": cmd, "scratch_left": scratch_left}


def _grade_class_scratch() -> set[str]:
    import tempfile
    return {p.name for p in Path(tempfile.gettempdir()).glob("grade-class-*")}


def test_grade_class_leaves_no_scratch_behind(graded_class):
    """Issue 32: one grade-class-template-* folder per worker was left in TMPDIR after every
    run, each holding the assignment's source with its hidden tests and a gradebook."""
    assert not graded_class["scratch_left"], f"left in TMPDIR: {graded_class['scratch_left']}"


def _tree_digest(folder):
    import hashlib
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _expected(name, loses):
    pts = _points(name)
    return sum(pts.values()) - sum(pts[i] for i in loses), sum(pts.values())


STUDENTS_01 = ["correct", "partial", "blank", "infinite-loop", "kernel-crash", "sys-exit",
               "huge-output", "memory-hog", "deleted-test", "edited-test", "torch-patch",
               "helper-patch", "writes-gradebook", "reads-solutions", "zip-alice", "zip-bob",
               "escape-as-root", "fork-bomb", "fills-memory",
               "forge-custom-exc", "forge-events", "forge-ast", "forge-input-transformer",
               "forge-traceback", "forge-compile", "forge-torch-code", "forge-tensor-property",
               "forge-guard-disarmed", "forge-str-device", "leak-base64-svg", "nbgrader-markers",
               "live-script", "huge-display-update",
               "inspect-closures", "formatter-fields", "tensor-alias", "spoof-device", "traceback-frames",
               "html-entities",
               "closure-key", "closure-key-now", "session-send", "magic-number", "frame-leak",
               "str-device-as-torch", "huge-error", "user-get-ipython", "non-callable", "symlink",
               "deleted-answer", "renamed"]
STUDENTS_02 = ["correct", "blank", "partial", "kernel-crash", "syntax-error", "feedback-page",
               *(f"wrong-{name}".replace("_", "-") for name in REPORT_FIXTURES)]
# Issue 32's attacks: graded for their score; the review may or may not flag them.
ANY_REVIEW = {"inspect-closures", "formatter-fields", "tensor-alias", "spoof-device", "traceback-frames",
              "html-entities"}
SANDBOX_ONLY = {"writes-gradebook", "reads-solutions", "escape-as-root", "fork-bomb", "fills-memory"}


@pytest.mark.parametrize("name, student", [(A1, s) for s in STUDENTS_01] + [(A2, s) for s in STUDENTS_02])
def test_student_scores_exactly_as_expected(graded_class, name, student):
    if student in SANDBOX_ONLY and not SANDBOXED:
        pytest.skip(f"needs the sandbox: {sandbox.bwrap_works()[1]}")
    _, loses, flags = graded_class["cases"][name][student]
    result = graded_class["results"][name][student]
    if loses is not None:  # None: a forgery the review flags; its score is not asserted
        score, max_score = _expected(name, loses)
        assert (result["score"], result["max_score"]) == (score, max_score), (
            f"{student} scored {result['score']}/{result['max_score']}, expected {score}/{max_score}; "
            f"flags: {result['flags']}")
    for flag in flags:
        assert any(flag in f for f in result["flags"]), f"{student}: expected flag {flag!r}, got {result['flags']}"
    if not flags:
        unexpected = [f for f in result["flags"] if "tampering" in f or "deleted" in f or "edited" in f]
        assert not unexpected, f"{student}: unexpected flags {unexpected}"
    reviewed = [f for f in result["flags"] if f.startswith("review: ")]
    if student not in ANY_REVIEW and not any(flag in f for flag in flags for f in reviewed):
        assert not reviewed, f"{student}: flagged by the static review, expected not: {reviewed}"


def test_unreadable_submission_is_reported_and_does_not_stop_the_class(graded_class):
    result = graded_class["results"][A1]["invalid-json"]
    assert result["score"] is None
    assert any("NOT GRADED" in f for f in result["flags"]) and any("not valid JSON" in f for f in result["flags"])
    assert graded_class["proc"].returncode == 1, "grade-class exits 1 when a submission could not be graded"
    assert "invalid-json" in graded_class["proc"].stdout and "not graded" in graded_class["proc"].stdout


def test_summary_lists_every_student_and_the_flags(graded_class):
    out = graded_class["proc"].stdout
    for student in STUDENTS_01 + ["invalid-json"]:
        assert re.search(rf"^{re.escape(student)}\s", out, re.M), f"{student} missing from the summary"
    assert "flagged for a human look" in out
    assert re.search(r"autograde [^\n]*\[#+\.*\] \d+/\d+ ", graded_class["proc"].stderr), "a progress bar is shown"


@needs_sandbox
def test_hostile_code_changed_nothing_outside_its_folder(graded_class):
    course = graded_class["course"]
    assert not os.path.exists(OUTSIDE), "a submission wrote a file outside its own folder"
    assert not os.path.exists(OUTSIDE_TMP), "a submission wrote into the grader's /tmp"
    other = course.root / "submitted" / "correct" / A1 / f"{A1}.ipynb"
    notebooks.read(other)  # still a notebook: not overwritten with "{}"
    grades = graded_class["results"][A1]
    assert grades["correct"]["score"] == _expected(A1, [])[0], "another student's grade was changed"
    graded_nb = course.autograded_notebook("writes-gradebook", A1)
    printed = "".join(o.get("text", "") for c in graded_nb.cells for o in c.get("outputs", []))
    attempts = eval(next(line for line in printed.splitlines() if line.startswith("{'write gradebook'")))
    assert attempts["write gradebook"] != "done?" and attempts["overwrite another student"] != "done?", attempts
    assert attempts["write outside"] != "done?" and attempts["network"] == "OSError", attempts


def _attack_report(graded_class, student):
    nb = graded_class["course"].autograded_notebook(student, A1)
    printed = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    reports = [json.loads(line.split(" ", 1)[1]) for line in printed.splitlines()
               if line.startswith("SANDBOX-ATTACK ")]
    assert reports, f"{student}'s attack printed nothing: {printed[-2000:]}"
    return {k: v for r in reports for k, v in r.items()}


@needs_sandbox
def test_sandbox_escape_as_root_fails(graded_class):
    """The escape issue 13 found (remount / read-write, unmount the folder hiding the
    course, read solutions/, rewrite the gradebook with SQL) fails at the first step. The
    course is not in the kernel's file system at all (default deny): nothing to unmount."""
    report = _attack_report(graded_class, "escape-as-root")
    assert report["remount / rw"] == "EPERM" and report["umount course"] in ("ENOENT", "EPERM"), report
    assert report["umount /tmp"] == "EPERM", report
    assert report["solutions"] == 0 and report["sql"] == "OperationalError", report


@needs_sandbox
def test_sandbox_process_cap_stops_a_fork_bomb(graded_class):
    report = _attack_report(graded_class, "fork-bomb")
    cap = sandbox.SandboxConfig().max_processes
    assert report["error"] == "EAGAIN" and 0 < report["forked"] < cap, report


@needs_sandbox
def test_sandbox_tmpfs_and_memory_caps_hold(graded_class):
    report = _attack_report(graded_class, "fills-memory")
    cap = sandbox.SandboxConfig().tmpfs_mb
    for where in ("/dev/shm", "/tmp", "working folder"):
        written, error = report[where]
        assert error == "ENOSPC" and written <= cap, (where, report)
    assert "memfd" not in report, "3 GiB of shared memory past a 2 GiB cap"


@needs_sandbox
def test_attacks_left_the_gradebook_unchanged(graded_class):
    """No grade in the gradebook carries extra credit (the escape's SQL gave itself some);
    every student's own score is checked above, solutions/ by the test below."""
    import sqlite3
    db = sqlite3.connect(graded_class["course"].root / "gradebook.db")
    extra = db.execute("SELECT COUNT(*) FROM grade WHERE extra_credit IS NOT NULL AND extra_credit != 0")
    assert extra.fetchone()[0] == 0, "a submission gave itself extra credit"


@needs_sandbox
def test_feedback_and_outputs_never_show_hidden_tests(graded_class):
    course = graded_class["course"]
    hidden = guard.hidden_lines(_source(A1))
    assert hidden
    for student in ("reads-solutions", "blank", "edited-test", "kernel-crash"):
        feedback = course.root / "feedback" / student / A1 / f"{A1}.html"
        assert feedback.exists(), f"no feedback for {student}"
        html = feedback.read_text(encoding="utf-8")
        import html as html_lib
        plain = html_lib.unescape(re.sub(r"<[^>]+>", "", html))
        leaked = [h for h in hidden if h in plain]
        assert not leaked, f"feedback of {student} shows hidden test code: {leaked[:3]}"
        graded_nb = course.autograded_notebook(student, A1)
        outputs = json.dumps([o for c in graded_nb.cells for o in c.get("outputs", [])])
        assert not [h for h in hidden if json.dumps(h)[1:-1] in outputs], f"{student}'s outputs leak hidden tests"
    spy = course.autograded_notebook("reads-solutions", A1)
    printed = "".join(o.get("text", "") for c in spy.cells for o in c.get("outputs", []))
    assert "print(In)" in printed, "the spy printed the kernel's history (hidden tests never reach it as text)"


def _feedback_files(course):
    return sorted((course.root / "feedback").rglob("*.html"))


def _decoded(text):
    """The text, plus every base64 run in it decoded (a leak printed as base64 is still a leak)."""
    import base64
    import binascii
    import html as html_lib
    import urllib.parse
    plain = html_lib.unescape(re.sub(r"<[^>]+>", " ", text))
    parts = [text, plain, urllib.parse.unquote(text)]
    for run in re.findall(r"[A-Za-z0-9+/]{40,}={0,2}", text):
        try:
            parts.append(base64.b64decode(run + "=" * (-len(run) % 4)).decode("utf-8", "replace"))
        except (binascii.Error, ValueError):
            pass
    return "\n".join(parts)


def test_no_feedback_file_shows_a_hidden_line_in_any_encoding(graded_class):
    """Every student's feedback (the leaking student's first): no hidden-test line, in plain
    text, HTML-escaped, URL-encoded or base64; no SVG drawing of them either."""
    course = graded_class["course"]
    files = _feedback_files(course)
    assert any("leak-base64-svg" in str(f) for f in files), "the leaking student got no feedback"
    for name in (A1, A2):
        hidden = guard.hidden_lines(_source(name)) | guard.hidden_strings(_source(name))
        assert hidden
        for path in files:
            if path.parent.name != name:
                continue
            page = path.read_text(encoding="utf-8")
            # Nothing the page loads comes from elsewhere: not a student's tracking pixel, not
            # nbgrader's MathJax (the course's feedback template loads none).
            loads = nbgrader_ext.remote_references(page)
            assert not loads, f"{path}: the feedback page loads from elsewhere: {loads[:3]}"
            text = _decoded(page) + "\n" + guard.plain_text(_decoded(page))
            leaked = [h for h in hidden if h in text]
            assert not leaked, f"{path} shows hidden test code: {leaked[:3]}"
            assert '<text x="0"' not in path.read_text(encoding="utf-8"), f"{path}: a student's SVG drawing"


def test_every_graded_submission_has_feedback(graded_class):
    """nbgrader's ClearHiddenTests raised on a student cell holding its markers: that
    student silently got no feedback. Now every graded submission has some."""
    course = graded_class["course"]
    for name, results in graded_class["results"].items():
        for student, result in results.items():
            if result["score"] is None:
                continue
            assert (course.root / "feedback" / student / name / f"{name}.html").exists(), (
                f"no feedback for {student} ({name}); flags: {result['flags']}")
            assert not any("NO FEEDBACK" in f for f in result["flags"]), result["flags"]


def test_feedback_runs_no_student_script(graded_class):
    course = graded_class["course"]
    page = (course.root / "feedback" / "live-script" / A1 / f"{A1}.html").read_text(encoding="utf-8")
    live = "".join(re.findall(r"<script[^>]*>(.*?)</script>", page, flags=re.S | re.I))
    assert "pwned" not in live, "a student's script is live in the feedback"
    assert not re.search(r"<[^>]*\s(onerror|onload)\s*=", page, flags=re.I), "a live event handler"
    assert "IPython.core.display.Javascript object" in page, "the JavaScript output shows as plain text"
    assert "My notes" in page, "the student's own Markdown is still shown"


@pytest.mark.parametrize("student", ["huge-display-update", "huge-error"])
def test_a_huge_display_update_or_error_is_capped(graded_class, student):
    """A 50 MiB display update, and (issue 22) a 24 MiB error message, which scored a graded
    notebook of 48 MiB and a feedback page of 24 MiB when errors did not count."""
    course = graded_class["course"]
    graded = course.root / "autograded" / student / A1 / f"{A1}.ipynb"
    feedback = course.root / "feedback" / student / A1 / f"{A1}.html"
    assert graded.stat().st_size < 5_000_000, f"graded notebook {graded.stat().st_size:,} bytes"
    assert feedback.stat().st_size < 5_000_000, f"feedback {feedback.stat().st_size:,} bytes"


def test_no_feedback_file_shows_a_hidden_test_string_constant(graded_class):
    """Issue 22: a function called by a hidden test kept the test's code object and a later
    cell printed its string constants (46 hidden-test messages in that student's feedback).
    Issue 32: the tests no longer run in the kernel, so what the frame-leak and traceback-frames
    students print holds none of them, before any redaction. No feedback file shows one, in
    plain text, HTML or base64."""
    course = graded_class["course"]
    for student in ("frame-leak", "traceback-frames"):
        printed = "".join(str(o.get("text", "")) for c in course.autograded_notebook(student, A1).cells
                          for o in c.get("outputs", []))
        assert len(printed) > 200, f"{student} printed nothing: the attack did not run"
        assert guard.REDACTED not in printed, f"{student}: something needed redacting"
    for name in (A1, A2):
        constants = guard.hidden_strings(_source(name))
        assert constants
        for path in _feedback_files(course):
            if path.parent.name == name:
                text = _decoded(path.read_text(encoding="utf-8"))
                leaked = [c for c in constants if c in text]
                assert not leaked, f"{path} shows hidden-test strings: {leaked[:3]}"


def test_a_symlink_in_a_submission_is_not_followed(graded_class):
    """Issue 22: nbgrader copied what a link in the submission pointed to (the course's
    solutions, hidden tests included) as the grader, where the kernel read it."""
    course = graded_class["course"]
    nb = course.autograded_notebook("symlink", A1)
    printed = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert "SYMLINK False" in printed, printed[-2000:]
    assert (course.root / "quarantine" / "symlink" / A1 / H.SYMLINK_NAME).is_symlink()
    assert not (course.root / "autograded" / "symlink" / A1 / H.SYMLINK_NAME).exists()


def test_review_flags_show_in_the_feedback_and_the_csv(graded_class):
    """The static review's flag is in the instructor's feedback view (first in the flagged
    cell) and the CSV's flags column; the score stays as computed."""
    course = graded_class["course"]
    page = (course.root / "feedback" / "session-send" / A1 / f"{A1}.html").read_text(encoding="utf-8")
    assert "FlaggedForReview" in page and "get_ipython" in page
    rows = {(r["assignment"], r["student_id"]): r for r in csv.DictReader(open(course.root / "grades.csv"))}
    assert "get_ipython (kernel machinery)" in rows[(A1, "session-send")]["flags"]
    assert rows[(A1, "correct")]["flags"] == ""
    forged = graded_class["results"][A1]["closure-key-now"]
    assert forged["score"] == 0, f"closure-key-now scored {forged['score']}/{forged['max_score']}"


def test_hostile_submissions_changed_no_source(graded_class):
    """solutions/ of the graded course (hidden tests included) is byte for byte as before."""
    course = graded_class["course"]
    assert _tree_digest(course.root / "solutions") == graded_class["sources_before"]


def test_huge_output_is_truncated(graded_class):
    nb = graded_class["course"].autograded_notebook("huge-output", A1)
    text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert "output truncated" in text.lower() and len(text) < 5_000_000


def test_grades_csv_has_every_graded_submission(graded_class):
    rows = list(csv.DictReader(open(graded_class["course"].root / "grades.csv")))
    by_student = {(r["assignment"], r["student_id"]): r for r in rows}
    assert float(by_student[(A1, "correct")]["score"]) == _expected(A1, [])[0]
    assert float(by_student[(A1, "blank")]["score"]) == 0
    assert (A2, "partial") in by_student
    # Issue 37: what an instructor uploads. A submission nbgrader could not grade has no score
    # (nbgrader's export says 0.0), and its status says why; the others say "graded".
    broken = by_student[(A1, "invalid-json")]
    assert broken["status"] == "not graded" and broken["score"] == "" == broken["raw_score"], broken
    assert by_student[(A1, "correct")]["status"] == by_student[(A1, "blank")]["status"] == "graded"
    assert float(by_student[(A1, "renamed")]["score"]) == _expected(A1, [])[0]
    ungraded = [k for k, r in by_student.items() if r["status"] == "not graded"]
    assert ungraded == [(A1, "invalid-json")], ungraded


def test_grading_log_says_only_what_matters(graded_class):
    """Issue 37: nbgrader logged "Attribute 'checksum' for cell test_... has changed!" 7 times
    for every submission of 01, honest or blank, because the release clears hidden tests. Only a
    test cell the student edited is still reported."""
    log = (graded_class["course"].root / "grading.log").read_text(encoding="utf-8", errors="replace")
    cells = set(re.findall(r"Attribute 'checksum' for cell (\S+) has changed", log))
    assert cells, "the edited test cells are no longer reported at all"
    assert cells <= {"test_pick_device_auto", "test_pick_device_named"}, sorted(cells)
    assert "Answer cell common_device was deleted" in log
    # nbconvert's display_data_priority, "not recognized" by two feedback
    # preprocessors, was logged twice for every submission
    assert "display_data_priority" not in log


@needs_sandbox
def test_sandbox_keeps_pythonpath_packages_but_not_the_course(tmp_path, monkeypatch):
    """Packages on PYTHONPATH (e.g. installed with pip --target under /tmp) stay importable
    in the kernel's sandbox; a PYTHONPATH entry that is the hidden course folder does not
    make it visible."""
    site = tmp_path / "site"  # under /tmp, which the sandbox replaces with an empty tmpfs
    (site / "probe_pkg").mkdir(parents=True)
    (site / "probe_pkg" / "__init__.py").write_text("VALUE = 42\n")
    course = tmp_path / "course"
    (course / "source").mkdir(parents=True)
    (course / "source" / "secret.txt").write_text("hidden tests")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), str(course)]))
    config = sandbox.SandboxConfig(mode="bwrap", hide=(str(course),))
    probe = ("import os, probe_pkg; print(probe_pkg.VALUE); "
             f"print(os.path.exists({str(course)!r}))")
    env = sandbox.sandbox_env(config)  # what the grader gives the kernel
    assert env["PYTHONPATH"] == os.path.realpath(site), env.get("PYTHONPATH")
    cmd = sandbox.wrap_command([sys.executable, "-c", probe], config, writable=[])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["42", "False"], (
        f"expected the package importable and the course folder not there at all, got {proc.stdout!r}")


# -- grading in parallel, and again (issues 27 and 28) -------------------------------------------
# A sample of the class, one of each kind of outcome: full marks, a kernel crash (restarts),
# restored test cells, tampering, review flags, a submission nbgrader cannot read, a link moved
# to quarantine. Graded again one at a time, it must give what the parallel run gave.
SERIAL_SAMPLE = ["correct", "kernel-crash", "edited-test", "torch-patch", "session-send", "invalid-json",
                 "symlink"]


def _normalized(text: str, *roots) -> str:
    for root in roots:
        text = text.replace(str(root), "<course>")
    return text


def _graded_cells(path):
    """A graded notebook's cells without the kernel's execution timestamps."""
    nb = notebooks.read(path)
    for cell in nb.cells:
        cell.get("metadata", {}).pop("execution", None)
    return [dict(c) for c in nb.cells]


def test_parallel_equals_serial(graded_class, tmp_path):
    """Issue 27: the class was graded with two jobs; a sample graded with one job, in a
    course of its own, gets the same scores, flags, graded notebooks, feedback and CSV rows."""
    course = graded_class["course"]
    serial = NbgraderCourse(tmp_path / "serial", [A1])
    for student in SERIAL_SAMPLE:
        shutil.copytree(course.root / "submitted" / student / A1, serial.root / "submitted" / student / A1,
                        symlinks=True)
        quarantined = course.root / "quarantine" / student
        if quarantined.exists():
            shutil.copytree(quarantined, serial.root / "quarantine" / student, symlinks=True)
    out = tmp_path / "serial.json"
    cmd = [sys.executable, "-m", "coursetools.instructor.classroom", A1, "--course", str(serial.root),
           *GRADING_ARGS, "--jobs", "1", "--json", str(out)]
    if not SANDBOXED:
        cmd.append("--unsandboxed-as-root")
    proc = subprocess.run(cmd, cwd=layout.ROOT, capture_output=True, text=True, timeout=1800,
                          env=layout.env_with_course_tools())
    assert out.exists(), f"grade-class --jobs 1 failed:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    serial_results = {r["student"]: r for r in json.loads(out.read_text())[A1]}
    parallel_csv = {r["student_id"]: r for r in csv.DictReader(open(course.root / "grades.csv")) if r["assignment"] == A1}
    serial_csv = {r["student_id"]: r for r in csv.DictReader(open(serial.root / "grades.csv"))}
    for student in SERIAL_SAMPLE:
        mine, theirs = graded_class["results"][A1][student], serial_results[student]
        assert (mine["score"], mine["max_score"]) == (theirs["score"], theirs["max_score"]), (student, mine, theirs)
        roots = (course.root, serial.root)  # (the quarantined link still points into the first course)
        assert ([_normalized(f, *roots) for f in mine["flags"]]
                == [_normalized(f, *roots) for f in theirs["flags"]]), (student, mine["flags"], theirs["flags"])
        assert ({k: _normalized(v, *roots) for k, v in parallel_csv[student].items()}
                == {k: _normalized(v, *roots) for k, v in serial_csv[student].items()}), student
        if mine["score"] is None:
            continue
        assert (_graded_cells(course.root / "autograded" / student / A1 / f"{A1}.ipynb")
                == _graded_cells(serial.root / "autograded" / student / A1 / f"{A1}.ipynb")), student
        feedback = [(c.root / "feedback" / student / A1 / f"{A1}.html").read_text(encoding="utf-8")
                    for c in (course, serial)]
        assert _normalized(feedback[0], course.root) == _normalized(feedback[1], serial.root), \
            f"{student}'s feedback differs between the parallel and the serial run"
    print(f"{len(SERIAL_SAMPLE)} submissions graded again with one job: the same scores, flags, graded "
          "notebooks, feedback and CSV rows as with two jobs")


def test_a_rerun_skips_what_was_graded(graded_class):
    """Issue 28: the same command again grades nothing already graded from the same files and
    source (the unreadable submission is tried again) and reports the same results."""
    started = time.monotonic()
    proc = subprocess.run(graded_class["cmd"], cwd=layout.ROOT, capture_output=True, text=True, timeout=3000,
                          env=layout.env_with_course_tools())
    seconds = time.monotonic() - started
    results_json = graded_class["cmd"][graded_class["cmd"].index("--json") + 1]
    again = {a: {r["student"]: r for r in rs} for a, rs in json.loads(open(results_json).read()).items()}
    assert again == graded_class["results"], "a re-run changed a result"
    n1, n2 = len(graded_class["results"][A1]), len(graded_class["results"][A2])
    assert f"{A1}: {n1} submission(s): 0 graded now, 1 could not be graded, {n1 - 1} skipped" in proc.stdout, proc.stdout
    assert f"{A2}: {n2} submission(s): 0 graded now, {n2} skipped" in proc.stdout, proc.stdout
    print(f"the class ({n1 + n2} submissions, {JOBS} jobs): full run {graded_class['seconds']:.0f} s; "
          f"the same command again, nothing changed, {seconds:.0f} s")


def test_feedback_is_what_nbgraders_generate_feedback_writes(graded_class, tmp_path):
    """The feedback pages come from the workers (made in their scratch courses) when the
    gradebook holds nothing more; they must be byte for byte what nbgrader's own
    `generate_feedback` writes from the course's gradebook (chapter 02's class, and 01's
    `correct` and `edited-test`)."""
    import filecmp

    course = graded_class["course"]
    out = tmp_path / "feedback-by-nbgrader"
    for name, student in [(A2, "*"), (A1, "correct"), (A1, "edited-test")]:
        course.run("generate_feedback", name, "--force", f"--student={student}",
                   f"--CourseDirectory.feedback_directory={out}")
    compared = 0
    for page in sorted(out.rglob("*")):
        if page.is_file():
            mine = course.root / "feedback" / page.relative_to(out)
            assert mine.exists() and filecmp.cmp(mine, page, shallow=False), f"{mine} differs from nbgrader's {page}"
            compared += 1
    assert compared >= 6, compared


# -- the class report -----------------------------------------------------------------------

def _report(graded_class) -> dict:
    return json.loads((graded_class["course"].root / "grades-report.json").read_text(encoding="utf-8"))


def _lost(name, students):
    """test cell -> the students expected to lose points on it (the fixtures' `loses`)."""
    lost: dict[str, set[str]] = {}
    for student, (_, loses, _) in students.items():
        for gid in loses or []:
            lost.setdefault(gid, set()).add(student)
    return lost


def test_class_report_counts_match_the_csv_and_the_fixtures(graded_class):
    """Every grade-class run writes the class report beside the CSV; its counts are the
    CSV's (scores, not graded, flagged) and the fixtures' (who loses which question), and the
    wrong fixtures that break the same rule are one misconception, with its lesson section."""
    report = _report(graded_class)["assignments"]
    with open(graded_class["course"].root / "grades.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    for name in (A1, A2):
        mine = report[name]
        csv_rows = {r["student_id"]: r for r in rows if r["assignment"] == name and r["status"] != "not submitted"}
        assert mine["submissions"] == len(csv_rows)
        graded = {s: float(r["score"]) for s, r in csv_rows.items() if r["status"] != "not graded"}
        assert mine["scores"] == graded and mine["graded"] == len(graded)
        assert set(mine["not_graded"]) == {s for s, r in csv_rows.items() if r["status"] == "not graded"}
        assert set(mine["flagged"]) == {s for s, r in csv_rows.items() if r["flags"] and s in graded}
        for q in mine["questions"]:
            losers = set(q["partial"]) | set(q["zero"])
            assert len(q["full"]) + len(losers) == len(graded), q["id"]
            grouped = [s for m in q["misconceptions"] for s in m["students"]]
            assert sorted(grouped) == sorted(losers), f"{q['id']}: every student who lost points, in one group"
            assert all(m["count"] == len(m["students"]) for m in q["misconceptions"])
    # Chapter 02: who loses which question is known from the fixtures, exactly
    lost = _lost(A2, graded_class["cases"][A2])
    questions = {q["id"]: q for q in report[A2]["questions"]}
    for gid, q in questions.items():
        assert set(q["partial"]) | set(q["zero"]) == lost.get(gid, set()), gid
    assert report[A2]["late"] and set(report[A2]["late"]) == {LATE}
    assert abs(report[A2]["late"][LATE] - 86400) < 1
    assert report[A2]["due"].startswith("2026-01-05 12:00")
    for pair in SAME_RULE:
        fxs = [_fixture(A2, name) for name in pair]
        gid = fxs[0].loses[0]
        groups = [m for m in questions[gid]["misconceptions"] if fxs[0].student_id in m["students"]]
        assert len(groups) == 1 and set(groups[0]["students"]) >= {f.student_id for f in fxs}, (
            f"{pair} break the same rule of {gid}: one misconception, got {questions[gid]['misconceptions']}")
        assert groups[0]["kind"] == "message" and groups[0]["rule_zh"], groups[0]
    for name in REPORT_FIXTURES:
        fx = _fixture(A2, name)
        for gid, shows in fx.shows.items():
            (group,) = [m for m in questions[gid]["misconceptions"] if fx.student_id in m["students"]]
            assert group["kind"] == "message", (name, group)
            for lesson in (w for w in shows if w.startswith("lesson ")):  # "lesson 02 §3, §7"
                number, sections = lesson.split(" ", 2)[1:]
                mine = re.search(rf"lesson {number} ([^;]*)", group["lesson"])
                assert mine and set(sections.split(", ")) <= set(mine.group(1).split(", ")), (name, lesson, group)
    # a failure that is no message of the test's own counts as "other", with what it was: the
    # unanswered release's stubs raise NotImplementedError (its preprocess script, which the
    # exercise asks to fix, shows that question's misconceptions as they are)
    first = notebooks.test_cells(_source(A2))[0]
    blank = [m for m in questions[notebooks.grade_id(first)]["misconceptions"] if "blank" in m["students"]]
    assert blank and all(m["kind"] == "other" and "NotImplementedError" in m["rule"] for m in blank), blank


def _report_html(graded_class, lang):
    from coursetools.instructor import classreport

    course = graded_class["course"].root
    if lang != "en":  # on demand, for the finished run
        proc = subprocess.run([sys.executable, "-m", "coursetools.instructor.classreport", "--course", str(course),
                               "--lang", lang], cwd=layout.ROOT, capture_output=True, text=True, timeout=600,
                              env=layout.env_with_course_tools())
        assert proc.returncode == 0, proc.stderr[-3000:]
    return classreport.paths_for(course / "grades.csv", lang)[0].read_text(encoding="utf-8")


class _Refs(HTMLParser):
    """Every element and every attribute that could make a browser fetch something."""

    def __init__(self):
        super().__init__()
        self.loads, self.tags, self.counts = [], set(), []

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        for key, value in attrs:
            if key in ("src", "href", "xlink:href", "srcset", "action", "poster", "data") and value and \
                    not value.startswith("#") and not value.startswith("data:"):
                self.loads.append((tag, key, value))
            if key == "data-count":
                self.counts.append(int(value))


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_class_report_is_self_contained_and_says_the_counts(graded_class, lang):
    """The page loads nothing from anywhere (no script, stylesheet, font or image but its own
    inline SVG), and shows the JSON's counts, in English and (make.py class-report --lang zh) Chinese."""
    page = _report_html(graded_class, lang)
    refs = _Refs()
    refs.feed(page)
    assert not refs.loads, f"the report loads {refs.loads}"
    assert not refs.tags & {"script", "link", "img", "iframe", "object", "embed"}, refs.tags
    assert "@import" not in page and not re.findall(r"url\((?!#)", page), "CSS or SVG loads a URL"
    outside = re.sub(r'\sxmlns(?::\w+)?="[^"]*"', "", page)  # namespaces name, they load nothing
    assert not re.findall(r"(?:https?:)?//[\w.-]+\.\w+/", outside), "the page names another host"
    report = _report(graded_class)["assignments"]
    expected = [m["count"] for a in (A1, A2) for q in report[a]["questions"] for m in q["misconceptions"]]
    assert refs.counts == expected
    if lang == "zh":
        assert 'lang="zh-CN"' in page and "全班的误解" in page and "需要人工查看" in page
        (group,) = [m for q in report[A2]["questions"] for m in q["misconceptions"]
                    if _fixture(A2, SAME_RULE[0][0]).student_id in m["students"]]
        assert html.escape(group["rule_zh"]) in page
    else:
        assert "What the class misunderstood" in page and "revisit lesson 02 §" in page
    for hidden in ("BEGIN HIDDEN TESTS", "END HIDDEN TESTS"):
        assert hidden not in page


def test_class_report_reads_on_a_phone(graded_class):
    """Screenshots at 390 and 1366 px (test-artifacts/screenshots/class-report-*.png, committed):
    at 390 px nothing is wider than the screen but the question table, which scrolls in its box."""
    from browser_support import chromium_page

    course = graded_class["course"].root
    _report_html(graded_class, "zh")
    out = layout.ROOT / "test-artifacts" / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    with chromium_page(None, "the class report's screenshots") as page:
        for lang, file in (("en", "grades-report.html"), ("zh", "grades-report.zh.html")):
            for width in (390, 1366):
                page.set_viewport_size({"width": width, "height": 1000})
                page.goto((course / file).as_uri())
                assert page.evaluate("document.documentElement.scrollWidth") <= width
                section = page.locator(f'[id="{A2}"]')
                section.screenshot(path=str(out / f"class-report-{lang}-{width}.png"))


@pytest.mark.timeout(900)
def test_grade_class_leaves_the_course_release_alone(tmp_path):
    """grade-class used to regenerate the tracked exercises/NN with nbgrader ("Removing existing
    assignment"), so an instructor's edit there was lost without a word. Now the release goes
    to a folder of the run's own; an edited release stays, and a note names its file; an
    unedited one gets no note. (No submission: generate and export only, no grading.)"""
    course = NbgraderCourse(tmp_path / "course", [A1, A2])
    for name in (A1, A2):
        shutil.copytree(layout.ROOT / "exercises" / name, course.root / "exercises" / name)
    edited = course.root / "exercises" / A2 / f"{A2}.ipynb"
    nb = notebooks.read(edited)
    next(c for c in nb.cells if c.cell_type == "markdown").source += "\n\nOffice hours moved to Friday."
    notebooks.write(nb, edited)
    before = {p: p.read_bytes() for p in (course.root / "exercises").rglob("*") if p.is_file()}
    cmd = [sys.executable, "-m", "coursetools.instructor.classroom", A1, A2, "--course", str(course.root)]
    if not SANDBOXED:
        cmd.append("--unsandboxed-as-root")
    proc = subprocess.run(cmd, cwd=layout.ROOT, capture_output=True, text=True, timeout=800,
                          env=layout.env_with_course_tools())
    assert proc.returncode == 0, proc.stderr[-3000:]
    after = {p: p.read_bytes() for p in (course.root / "exercises").rglob("*") if p.is_file()}
    assert after == before, "grade-class changed the course's release"
    notes = [line for line in proc.stderr.splitlines() if line.startswith("note: ")]
    assert notes == [line for line in notes if f"exercises/{A2}/{A2}.ipynb" in line] and len(notes) == 1, notes
    assert "Removing existing assignment" not in (course.root / "grading.log").read_text() or \
        str(course.root / "exercises") not in (course.root / "grading.log").read_text()


# A student's feedback page as the student reads it, on a phone and a desktop (one browser
# session): the course's feedback template (coursetools/instructor/templates/course_feedback).
FEEDBACK_SCREENSHOTS = layout.ROOT / "test-artifacts" / "screenshots"
_FEEDBACK_PAGE_PROBLEMS = """() => {
  const W = window.innerWidth, out = [];
  if (document.documentElement.scrollWidth > W)
    out.push(`the page is ${document.documentElement.scrollWidth} px wide in a ${W} px window`);
  for (const pre of document.querySelectorAll('div.output_area pre, div.input_area pre'))
    if (pre.scrollWidth > pre.clientWidth + 1 && pre.offsetParent)
      out.push(`a block hides ${pre.scrollWidth - pre.clientWidth} px of its lines: ${pre.innerText.slice(0, 60)}`);
  for (const img of document.images)
    if (!img.complete || img.naturalWidth === 0) out.push(`a broken image: ${img.outerHTML.slice(0, 120)}`);
  for (const s of document.querySelectorAll('details > summary'))
    if (getComputedStyle(s).display !== 'list-item') out.push(`a summary without its marker: ${s.innerText}`);
  return out.slice(0, 10);
}"""


def check_feedback_page(path: Path, name: str) -> list[Path]:
    """Open the feedback page `path` in Chromium at 390 and 1366 px; assert what a student
    needs; return the screenshots (test-artifacts/screenshots/NAME-{390,1366}-*.png)."""
    from browser_support import chromium_page

    shots = []
    with chromium_page(None, "the feedback page's browser test") as page:
        elsewhere: list[str] = []
        page.on("request", lambda r: elsewhere.append(r.url) if not r.url.startswith("file:") else None)
        page.goto(path.as_uri())
        toc = page.locator("#toc li").all_inner_texts()
        assert toc and not [t for t in toc if t.startswith("Test cell")], f"the index names tests 'Test cell': {toc}"
        assert any(t.startswith("match_loss_inputs") and "· test_match_loss_inputs" in t for t in toc), toc
        assert "Open In Colab" not in page.content(), "the page still has the Colab badge"
        errors = page.locator("div.output_error pre, div.output_stderr pre").all_inner_texts()
        hidden = [e for e in errors if "a hidden test failed" in e]
        assert hidden and "Your code raised FrozenInstanceError" in hidden[0], (
            f"the failed hidden test does not say what was observed: {hidden}")
        assert any("(test line" in e for e in errors), f"no failed visible test: {errors}"
        assert any("SyntaxError" in e for e in errors), f"no syntax error: {errors}"
        fix = page.locator("details > summary", has_text="How to fix").first
        fix.click()
        assert page.evaluate("s => s.parentElement.open", fix.element_handle()), "How to fix does not open"
        for width in (390, 1366):
            page.set_viewport_size({"width": width, "height": 844 if width < 500 else 900})
            page.wait_for_timeout(200)
            problems = page.evaluate(_FEEDBACK_PAGE_PROBLEMS)
            for what, locator in (("top", page.locator("#toc")),
                                  ("visible-test", page.locator("div.output_error", has_text="(test line").first),
                                  ("hidden-test", page.locator("div.output_error", has_text="a hidden test failed").first),
                                  ("syntax-error", page.locator("div.output_error", has_text="SyntaxError").first)):
                locator.evaluate("e => e.scrollIntoView({block: 'start'})")
                page.evaluate("window.scrollBy(0, -60)")
                FEEDBACK_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
                shot = FEEDBACK_SCREENSHOTS / f"{name}-{width}-{what}.png"
                page.screenshot(path=str(shot))
                shots.append(shot)
            assert not problems, f"the feedback page at {width} px:\n  " + "\n  ".join(problems) + f"\n({shots[-1]})"
        assert not elsewhere, f"the feedback page asked another host for: {elsewhere[:5]}"
    return shots


def test_feedback_page_on_a_phone_and_a_desktop(graded_class):
    """The feedback page of a submission with a failed visible test, a failed hidden test and a
    syntax error (feedback_page_submission), at 390 and 1366 px: no broken image (the Colab
    badge is gone), each test named by its question and id, "How to fix" a disclosure that
    opens, the hidden test's failure saying what was observed (the learner's own error, no
    text of the hidden test), every message wrapped inside the page."""
    course = graded_class["course"]
    page = course.root / "feedback" / "feedback-page" / A2 / f"{A2}.html"
    assert page.exists(), f"no feedback page for feedback-page: {page}"
    print("screenshots:", [p.name for p in check_feedback_page(page, "feedback-page")])
