"""The static review of submissions (coursetools/grading/review.py, issue 22): what it flags, what it
must not flag (every solution and fixture of the course), and how it is shown."""

from __future__ import annotations

import pytest
from nbformat import v4

import hostile_submissions as H
from coursetools.author import fixtures
from coursetools import layout, notebooks
from coursetools.grading import review
from coursetools.learner import selfcheck

ASSIGNMENTS = layout.assignments()
FIXTURES = fixtures.all_fixtures()


def _review(source: str) -> list[tuple[int, str, str]]:
    """Findings for `source` as a cell added to chapter 01 (whose setup imports torch, nn, mock)."""
    return review.review_source(source, CONTEXT)


CONTEXT = review._Context(notebooks.read(layout.source_notebook("01_device_basics")))


# -- false flags: the course's own answers, right and wrong ------------------------------------
@pytest.mark.parametrize("name", ASSIGNMENTS)
def test_no_solution_is_flagged(name):
    nb = notebooks.read(layout.source_notebook(name))
    found = review.review_notebook(nb)
    assert not found, f"{name}'s solutions are flagged: {[str(f) for f in found]}"


@pytest.mark.parametrize("fx", FIXTURES, ids=[f"{fx.assignment}/{fx.name}" for fx in FIXTURES])
def test_no_fixture_submission_is_flagged(fx):
    found = review.review_notebook(fixtures.submission(fx))
    assert not found, f"fixture {fx.assignment}/{fx.name} is flagged: {[str(f) for f in found]}"


def test_the_untouched_release_is_not_flagged():
    for name in ASSIGNMENTS:
        assert not review.review_notebook(notebooks.read(layout.release_notebook(name))), name


HONEST = {
    "device module by name": "def sync(device):\n    getattr(torch, device.type).synchronize()",
    "accelerator if present": "acc = getattr(torch, 'accelerator', None)",
    "availability check (issue 32)": "def has(d):\n    backend = getattr(torch, d.type, None)\n    return backend is not None",
    "device module of a kind (issue 32)": "def backend(kind):\n    return getattr(torch, str(kind), None)",
    "cudnn switch": "torch.backends.cudnn.benchmark = True\ntorch.backends.cuda.matmul.allow_tf32 = False",
    "gc.collect": "import gc\ngc.collect()",
    "attributes of own objects": (
        "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.fc = nn.Linear(2, 2)\n"
        "def swap(model, name, value):\n    setattr(model, name, value)\n    return getattr(model, name)"),
    "vars of an object": "def drop(owner, name):\n    return vars(owner).pop(name)",
    "reduce getattr over a module's children": (
        "import functools\ndef child(module, path):\n    return functools.reduce(getattr, path.split('.'), module)"),
    "%timeit and %time": "%timeit torch.ones(3)\n%time x = torch.zeros(2)",
    "%%time cell": "%%time\ny = torch.ones(2) * 2",
    "shell escape": "!nvidia-smi",
    "IPython.display": "from IPython.display import display, Markdown\ndisplay(Markdown('**hi**'))",
    "a timed statement": (
        "from torch.utils import benchmark\n"
        "t = benchmark.Timer('fn()', globals={'fn': print})\nimport timeit\ntimeit.timeit(print, number=1)"),
    "mock.patch strings": "from unittest import mock\nwith mock.patch('torch.cuda.is_available', return_value=False):\n    pass",
    "mode strings": "def run(model, mode='eval'):\n    return getattr(model, mode)()",
    "os.environ": "import os\nos.environ['MASTER_PORT'] = '29500'",
    "sys.stdout flush": "import sys\nsys.stdout.flush()\nprint(sys.version)",
    "dataclass and replace": (
        "import dataclasses\n@dataclasses.dataclass\nclass B:\n    x: int\n"
        "def move(b):\n    return dataclasses.replace(b, **{f.name: getattr(b, f.name) for f in dataclasses.fields(b)})"),
    "subprocess": "import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'print(1)'], check=True)",
    "__import__ of a named module": "socket = __import__('socket')",
    "a /proc file": "print(open('/proc/meminfo').readline())",
    # honest controls of the earlier rounds, and code that looks like the round-4 attacks
    "a str Enum with __str__": (
        "from enum import Enum\nclass Kind(str, Enum):\n    CPU = 'cpu'\n    def __str__(self):\n        return self.value"),
    "a NamedTuple with __str__": (
        "from typing import NamedTuple\nclass P(NamedTuple):\n    a: int\n    def __str__(self):\n        return 'p'"),
    "custom exception classes": "class DeviceError(RuntimeError):\n    pass\nclass Mixed(DeviceError, ValueError):\n    pass",
    "an OrderedDict in reverse order": (
        "from collections import OrderedDict\nd = OrderedDict(reversed([('a', torch.ones(1))]))\nd.move_to_end('a')"),
    "numpy(force=True)": "def to_numpy(t):\n    return t.detach().numpy(force=True)",
    "match/case": ("def pick(d):\n    match d:\n        case 'cuda':\n            return torch.device('cuda')\n"
                   "        case _:\n            return torch.device('cpu')"),
    "singledispatch registering library classes": (
        "import functools\n@functools.singledispatch\ndef mv(x, d):\n    return x\n@mv.register(torch.Tensor)\n"
        "def _(x, d):\n    return x.to(d)\nmv.register(list, lambda x, d: [mv(i, d) for i in x])"),
    "a TorchFunctionMode of the learner's": (
        "from torch.overrides import TorchFunctionMode\nclass M(TorchFunctionMode):\n"
        "    def __torch_function__(self, func, types, args=(), kwargs=None):\n        return func(*args, **(kwargs or {}))"),
    "torch and nn imported again": "import torch\nimport torch.nn as nn\nfrom torch import nn",
    "dtypes in a loop": "for dt in [torch.float16, torch.bfloat16]:\n    x = torch.ones(2, dtype=dt)",
    "attributes set on a parameter that gets the student's model": (
        "def setup(model, d):\n    model.device = d\n    return model\nm = setup(nn.Linear(2, 2), 'cpu')"),
    "a cudnn switch set through a parameter": "def tune(b):\n    b.benchmark = True\ntune(torch.backends.cudnn)",
    "a module of the student's given a device": (
        "class Net(nn.Module):\n    def __init__(self, d):\n        super().__init__()\n        self.d = d\n"
        "net = Net(torch.device('cpu'))"),
    "mock.patch.dict of os.environ as a decorator": (
        "import os\n@mock.patch.dict(os.environ, {'X': '1'})\ndef f():\n    pass"),
    "mock.patch.object of the student's own object": (
        "class Loader:\n    def load(self):\n        return 1\nloader = Loader()\n"
        "def check():\n    with mock.patch.object(loader, 'load', return_value=2):\n        return loader.load()"),
    "a name bound in a comprehension": "names = [str(device) for device in [torch.device('cpu')]]",
    # the standard way a frozen dataclass sets its own field
    "frozen dataclass field in __post_init__": (
        "from dataclasses import dataclass\n@dataclass(frozen=True)\nclass Batch:\n    x: object\n    n: int = 0\n"
        "    def __post_init__(self):\n        object.__setattr__(self, 'n', len(self.x))"),
}


@pytest.mark.parametrize("label", list(HONEST))
def test_honest_code_is_not_flagged(label):
    assert not _review(HONEST[label]), (label, _review(HONEST[label]))


# -- what is flagged ------------------------------------------------------------------------------
FLAGGED = {
    # only a method's own instance and a plain field name pass; the rest stays flagged
    "object.__setattr__ of a dunder": (
        "class A:\n    def __init__(self):\n        object.__setattr__(self, '__class__', int)", "obfuscation"),
    "object.__setattr__ on another object": (
        "class A:\n    def __init__(self, t):\n        object.__setattr__(t, 'device', 1)", "obfuscation"),
    "object.__setattr__ outside a method": ("object.__setattr__(torch, 'x', 1)", "obfuscation"),
    "object.__setattr__ of a computed name": (
        "class A:\n    def __init__(self, n):\n        object.__setattr__(self, 'f' + n, 1)", "obfuscation"),
    # frame access
    "sys._getframe": ("import sys\nf = sys._getframe(1)", "frame access"),
    "f_back on anything": ("def g(x):\n    return x.f_back", "frame access"),
    "tb_frame": ("try:\n    1 / 0\nexcept Exception as e:\n    t = e.__traceback__.tb_frame", "frame access"),
    "inspect.stack": ("import inspect\ns = inspect.stack()", "frame access"),
    "from sys import _getframe": ("from sys import _getframe as g", "frame access"),
    "sys._current_frames": ("import sys\nprint(sys._current_frames())", "frame access"),
    # function internals
    "__closure__": ("def k(fn):\n    return fn.__closure__[0].cell_contents", "function internals"),
    "__globals__": ("def k(fn):\n    return fn.__globals__", "function internals"),
    "co_consts": ("def k(code):\n    return code.co_consts", "function internals"),
    # object graph
    "gc.get_objects": ("import gc\nobjs = gc.get_objects()", "object-graph search"),
    "gc via alias": ("import gc as g\nobjs = g.get_referrers(print)", "object-graph search"),
    "__subclasses__": ("cs = object.__subclasses__()", "object-graph search"),
    "().__class__.__base__": ("b = ().__class__.__base__", "object-graph search"),
    # import machinery
    "sys.modules": ("import sys\nm = sys.modules['torch']", "import machinery"),
    "sys.modules aliased": ("import sys as s\nm = s.modules", "import machinery"),
    "MAGIC_NUMBER": ("import importlib.util\nimportlib.util.MAGIC_NUMBER = b'x'", "import machinery"),
    "marshal": ("import marshal", "import machinery"),
    "sys.path insert": ("import sys\nsys.path.insert(0, '.')", "import machinery"),
    "module not installed": ("import my_module_written_by_the_notebook", "import machinery"),
    "relative import": ("from . import x", "import machinery"),
    # kernel
    "get_ipython": ("ip = get_ipython()", "kernel machinery"),
    "ipykernel": ("import ipykernel.kernelbase", "kernel machinery"),
    "IPython internals": ("from IPython.core.interactiveshell import InteractiveShell", "kernel machinery"),
    "In": ("print(In)", "kernel machinery"),
    "_i3": ("print(_i3)", "kernel machinery"),
    "a magic": ("%load_ext autoreload", "kernel machinery"),
    "a cell magic": ("%%writefile evil.py\nimport sys", "kernel machinery"),
    "__main__": ("import __main__", "kernel machinery"),
    # hooks
    "settrace": ("import sys\nsys.settrace(lambda *a: None)", "interpreter hooks"),
    "stderr replaced": ("import sys, io\nsys.stderr = io.StringIO()", "interpreter hooks"),
    "excepthook": ("import sys\nsys.excepthook = print", "interpreter hooks"),
    # later
    "thread": ("import threading\nthreading.Thread(target=print).start()", "code that runs later"),
    "signal handler": ("import signal\nsignal.signal(signal.SIGALRM, print)", "code that runs later"),
    "__del__": ("class A:\n    def __del__(self):\n        pass", "code that runs later"),
    "atexit": ("import atexit\natexit.register(print)", "code that runs later"),
    # native
    "ctypes": ("import ctypes", "native code"),
    "/proc/self/mem": ("f = open('/proc/self/mem', 'rb')", "native code"),
    "cpp_extension": ("from torch.utils.cpp_extension import load_inline", "native code"),
    # code from strings
    "exec": ("exec('x = 1')", "code from strings"),
    "eval as a value": ("f = eval", "code from strings"),
    "compile": ("c = compile('1', 'f', 'eval')", "code from strings"),
    "pickle.loads": ("import pickle\npickle.loads(b'.')", "code from strings"),
    "__reduce__": ("class P:\n    def __reduce__(self):\n        return (print, ())", "code from strings"),
    "types.FunctionType": ("import types\nf = types.FunctionType", "code from strings"),
    "timed computed statement": ("import timeit\ns = input()\ntimeit.timeit(s)", "code from strings"),
    "timed literal statement reviewed": ("import timeit\ntimeit.timeit('import gc; gc.get_objects()')",
                                         "object-graph search"),
    "%time reviewed": ("%time import sys; sys._getframe(0)", "frame access"),
    # patching
    "torch function replaced": ("torch.get_rng_state = lambda: None", "patching"),
    "torch class patched": ("torch.Tensor.is_cpu = property(lambda self: True)", "patching"),
    "setattr on a module": ("setattr(torch, 'manual_seed', print)", "patching"),
    "__code__ write": ("torch.manual_seed.__code__ = (lambda: 0).__code__", "patching"),
    "globals() write": ("globals()['x'] = 1", "patching"),
    "globals().update": ("globals().update(x=1)", "patching"),
    "globals() aliased": ("g = globals()\ng['expect_error'] = print", "patching"),
    "vars(module) write": ("vars(torch)['manual_seed'] = print", "patching"),
    "__builtins__": ("b = __builtins__", "patching"),
    "import builtins": ("import builtins\nbuiltins.compile = print", "patching"),
    "str patched": ("str.upper = lambda self: self", "patching"),
    "type(x) patched": ("def f(x):\n    type(x).__eq__ = lambda a, b: True", "patching"),
    "posing class": ("class D(str):\n    __module__ = 'torch'\n    __class__ = property(lambda s: torch.device)",
                     "patching"),
    "__instancecheck__": ("class M(type):\n    def __instancecheck__(cls, x):\n        return True", "patching"),
    # obfuscation
    "getattr builtins eval": ('getattr(__builtins__, "ev" + "al")("1")', "obfuscation"),
    "computed getattr on a module": ("import sys\nname = input()\nf = getattr(sys, name)", "obfuscation"),
    "computed __import__": ("m = __import__(''.join(['s', 'y', 's']))", "obfuscation"),
    "__import__ as a value": ("imp = __import__", "import machinery"),
    "__import__ of a flagged module": ("m = __import__('gc').get_objects()", "object-graph search"),
    "__import__ of a name built from pieces": ("m = __import__('s' + 'ys')", "obfuscation"),
    "import_module computed": ("import importlib\nm = importlib.import_module(input())", "obfuscation"),
    "chr-built name": ("n = chr(95) + 'getframe'", "obfuscation"),
    "reversed name": ("n = 'emarfteg_'[::-1]", "obfuscation"),
    "f-string name": ("a = 'get'\nn = f'_{a}frame'", "obfuscation"),
    "a string naming a flagged attribute": ("import functools\nf = functools.reduce(getattr, ['sys', '_getframe'], torch)",
                                            "obfuscation"),
    "exec of decoded text": ("import base64\nexec(base64.b64decode('eD0x'))", "obfuscation"),
    "codecs rot13": ("import codecs\nn = codecs.decode('riny', 'rot13')", "obfuscation"),
    "bytes.fromhex": ("n = bytes.fromhex('6576616c')", "obfuscation"),
    "getattr(torch, computed) elsewhere": ("m = getattr(torch, input())\nm.modules", "obfuscation"),
    "attrgetter computed": ("import operator\nf = operator.attrgetter(input())", "obfuscation"),
    "explicit __getattribute__": ("x = object.__getattribute__(torch, 'cuda')", "obfuscation"),
}


@pytest.mark.parametrize("label", list(FLAGGED))
def test_flagged(label):
    source, construct = FLAGGED[label]
    found = _review(source)
    assert construct in {c for _, c, _ in found}, f"{label}: expected {construct!r}, found {found}"


def test_every_construct_has_a_flag_test_and_a_description():
    assert {construct for _, construct in FLAGGED.values()} == set(review.CONSTRUCTS)


def test_a_builtin_the_tests_call_shadowed_at_top_level_is_flagged():
    """A student's global `isinstance` would answer for the tests' own isinstance checks."""
    nb = notebooks.read(layout.source_notebook("01_device_basics"))
    answer = next(c for c in nb.cells if notebooks.is_solution(c) and c.cell_type == "code")
    answer.source += "\ndef isinstance(obj, kind):\n    return True\n"
    found = review.review_notebook(nb)
    assert any("isinstance" in f.detail and f.construct == "patching" for f in found), found
    answer.source = answer.source.replace("def isinstance(obj, kind):", "def helper(obj, kind):")
    assert not review.review_notebook(nb)


def test_redefining_a_course_helper_is_flagged():
    nb = notebooks.read(layout.source_notebook("01_device_basics"))
    nb.cells.append(v4.new_code_cell("def expect_error(kind, fn, hint=''):\n    return 'anything'"))
    found = review.review_notebook(nb)
    assert [f.construct for f in found] == ["patching"] and "expect_error" in found[0].detail, found


def test_a_student_cell_claiming_to_be_locked_is_still_reviewed():
    """nbgrader drops the grade id of a cell it does not know (OverwriteCells), so a student
    cell whose metadata says locked (with or without an id nbgrader dropped) is the student's."""
    cell = v4.new_code_cell("import sys\nf = sys._getframe(0)")
    cell.metadata["nbgrader"] = {"locked": True, "grade": False, "solution": False, "schema_version": 3}
    nb = v4.new_notebook(cells=[cell])
    assert [f.construct for f in review.review_notebook(nb)] == ["frame access"]
    assert not review.is_course_cell(cell)


# -- round 4: flagged by what the code does, however it is spelt --------------------------------
# Each was unflagged before (checked against the review without these rules).
ROUND_4 = {
    # unittest.mock replacing what the student did not define, for longer than a top-level `with`
    "mock.patch.object(torch.Tensor, 'is_meta', ...).start()": (
        "mock.patch.object(torch.Tensor, 'is_meta', property(lambda self: True)).start()"),
    "mock.patch('torch.device', ...).start()": "class D:\n    pass\nmock.patch('torch.device', D).start()",
    "mock.patch as a decorator of an answer": (
        "@mock.patch.object(torch.Tensor, 'is_meta', True)\ndef build_on(factory):\n    return factory()"),
    "mock.patch as a context manager inside an answer": (
        "def build_on(factory):\n    with mock.patch('torch.device', object):\n        return factory()"),
    "mock.patch entered on an ExitStack": (
        "import contextlib\n_stack = contextlib.ExitStack()\n"
        "_stack.enter_context(mock.patch.object(torch.Tensor, 'is_meta', True))"),
    "mock.patch of a course helper": "mock.patch.object(fake_hardware, '__call__', print).start()",
    "mock.patch of the tensor type through a list": (
        "_T = [torch.Tensor][0]\nmock.patch.object(_T, 'is_meta', True).start()"),
    # aliases through containers, parameters, loops and lookups
    "an attribute set through [torch.Tensor][0]": "_T = [torch.Tensor][0]\n_T.is_meta = property(lambda s: True)",
    "setattr through a dict": "_d = {'t': torch.Tensor}\nsetattr(_d['t'], 'is_meta', property(lambda s: True))",
    "an attribute set in a loop over modules": "for _m in (torch,):\n    _m.device = object",
    "torch.device replaced through a parameter": (
        "class _Dev:\n    pass\ndef _use(ns, f):\n    ns.device = f\n_use(torch, _Dev)"),
    "through a keyword argument and setattr": "def _use(ns, f):\n    setattr(ns, 'device', f)\n_use(f=1, ns=torch)",
    "through a function that hands its parameter on": (
        "def _inner(x):\n    x.device = 1\ndef _use(ns):\n    _inner(ns)\n_use(torch)"),
    "through a lambda": "_use = lambda ns, f: setattr(ns, 'device', f)\n_use(torch, 1)",
    "through a function defined after its caller": "def go():\n    _use(torch, 1)\ndef _use(ns, f):\n    ns.device = f",
    "through a method": "class H:\n    def set(self, ns):\n        ns.device = 1\nH().set(torch)",
    "through __init__": "class H:\n    def __init__(self, ns):\n        ns.device = 1\nH(torch)",
    "through functools.partial": "import functools\ndef _use(ns, f):\n    ns.device = f\nfunctools.partial(_use, torch)(1)",
    "through an identity function": "_id = lambda x: x\n_id(torch).device = 1",
    "through an object's attribute": "class H:\n    pass\nh = H()\nh.m = torch\nh.m.device = 1",
    "through list.append": "_l = []\n_l.append(torch.Tensor)\n_l[0].is_meta = 1",
    "through globals()['torch']": "globals()['torch'].device = 1",
    "through pydoc.locate": "import pydoc\n_T = pydoc.locate('torch.Tensor')\n_T.is_meta = 1",
    "through importlib.import_module": "import importlib\n_t = importlib.import_module('torch')\n_t.device = 1",
    "through __self__": "_mod = torch.zeros.__self__\n_mod.zeros = print",
    "through getattr(torch, 'Ten' + 'sor')": "_T = getattr(torch, 'Ten' + 'sor')\n_T.is_meta = 1",
    "the agent through pydoc.locate": "import pydoc\n_a = pydoc.locate('__course_agent__')\n_a.serve = print",
    "the agent's name": "_name = '__course_agent__'",
    # ABC.register
    "a library ABC told a class is one of it": "import collections.abc\ncollections.abc.Sequence.register(torch.Size)",
    "a library class registered with the student's ABC": (
        "from abc import ABC\nclass D(ABC):\n    pass\nD.register(torch.device)"),
    # subclasses of library tensor types that answer for them
    "a torch.Tensor subclass with __torch_function__": (
        "class Fake(torch.Tensor):\n    @classmethod\n    def __torch_function__(cls, func, types, args=(), kwargs=None):\n"
        "        return True"),
    "an nn.Parameter subclass with an is_meta property": (
        "class P(nn.Parameter):\n    @property\n    def is_meta(self):\n        return True"),
    "an np.ndarray subclass with __array_function__": (
        "class Z(np.ndarray):\n    def __array_function__(self, func, types, args, kwargs):\n        return True"),
    "a tensor subclass built with type()": "Fake = type('Fake', (torch.Tensor,), {'is_meta': property(lambda s: True)})",
    "a property set on the student's tensor subclass": "class Fake(torch.Tensor):\n    pass\nFake.is_meta = True",
}


@pytest.mark.parametrize("label", list(ROUND_4))
def test_round_4_attacks_are_flagged(label):
    found = _review(ROUND_4[label])
    assert {c for _, c, _ in found} & {"patching", "kernel machinery"}, f"{label}: not flagged: {found}"


def test_a_top_level_with_block_of_mock_patch_is_not_flagged():
    """A patch in a top-level `with` is undone before any test runs: trying one's answer under a
    pretend GPU is honest. The same patch kept (started, a decorator, inside a function) is flagged."""
    scoped = "with mock.patch('torch.cuda.is_available', return_value=True):\n    print(torch.cuda.is_available())"
    assert not _review(scoped)
    kept = "mock.patch('torch.cuda.is_available', return_value=True).start()"
    assert [c for _, c, _ in _review(kept)] == ["patching"]


def test_an_answer_that_rebinds_the_notebooks_device_is_flagged():
    """A test cell that reads the notebook's `device` (the course's hidden GPU branches now ask
    the grader, `grader_device()`, but a visible check may still read it): an answer cell that
    rebinds it is flagged."""
    import copy
    nb = notebooks.read(layout.source_notebook("02_to_semantics"))
    reader = copy.deepcopy(next(c for c in nb.cells if c.cell_type == "code" and notebooks.is_test_cell(c)))
    reader.source = "assert device.type in ('cpu', 'cuda', 'mps'), device"
    reader.metadata["nbgrader"]["grade_id"] = "test_reads_device"
    nb.cells.append(reader)
    assert "device" in review._Context(nb).test_globals
    answer = next(c for c in nb.cells if notebooks.is_solution(c) and c.cell_type == "code")
    answer.source += "\nimport torch\nfrom torch import nn\n"
    assert not review.review_notebook(nb)
    for rebinding in ("device = torch.device('cpu')", "for device in ['cpu']:\n    pass",
                      "def _f():\n    global device\n    device = 1"):
        answer.source += "\n" + rebinding + "\n"
        found = review.review_notebook(nb)
        assert any("'device'" in f.detail and f.construct == "patching" for f in found), (rebinding, found)
        answer.source = answer.source[: -len(rebinding) - 2]
    assert not review.review_notebook(nb)


def test_an_alias_made_in_one_cell_and_used_in_another_is_flagged():
    nb = notebooks.read(layout.source_notebook("01_device_basics"))
    nb.cells.append(v4.new_code_cell("_T = [torch.Tensor][0]\ndef _use(ns, f):\n    ns.device = f"))
    nb.cells.append(v4.new_code_cell("_T.is_meta = True\n_use(torch, 1)"))
    found = review.review_notebook(nb)
    assert {f.line for f in found if f.cell_index == len(nb.cells) - 1} == {1, 2}, found


# -- every attack of issue 22 is flagged ----------------------------------------------------------
ATTACKS = {
    "closure key": (H.CLOSURE_KEY, {"import machinery", "function internals", "kernel machinery"}),
    "closure key, against the new guard": (H.CLOSURE_KEY_NOW, {"object-graph search", "function internals"}),
    "session send": (H.SESSION_SEND, {"kernel machinery"}),
    "magic number": (H.MAGIC_NUMBER, {"import machinery", "kernel machinery", "patching"}),
    "forged reply": (H.FORGED_REPLY, {"kernel machinery"}),
    "frame leak (answer)": (H.FRAME_LEAK_WRAPPER, {"frame access"}),
    "frame leak (printer)": (H.FRAME_LEAK_PRINT, {"function internals"}),
    "str device as torch": (H.STR_DEVICE_AS_TORCH, {"patching"}),
    "user get_ipython": (H.USER_GET_IPYTHON, {"kernel machinery"}),
    "non-callable attributes": (H.NON_CALLABLE, {"kernel machinery", "patching"}),
    "shadowed globals": (H.SHADOW_GLOBALS, {"patching"}),
}


@pytest.mark.parametrize("label", list(ATTACKS))
def test_every_attack_of_issue_22_is_flagged(label):
    source, constructs = ATTACKS[label]
    found = {c for _, c, _ in _review(source)}
    assert constructs <= found, f"{label}: expected {constructs}, found {found}"


# -- where findings are shown ---------------------------------------------------------------------
def test_annotate_puts_the_findings_first_in_the_flagged_cell():
    added = v4.new_code_cell("import gc\nx = gc.get_objects()")
    added.outputs = [v4.new_output("stream", name="stdout", text="hello\n")]
    nb = v4.new_notebook(cells=[v4.new_code_cell("x = 1"), added])
    found = review.review_notebook(nb)
    review.annotate(nb, found)
    first = nb.cells[1].outputs[0]
    assert first.output_type == "error" and first.ename == review.REVIEW_ENAME
    assert "line 2" in first.evalue and "gc.get_objects" in first.evalue and "score is unchanged" in first.evalue
    assert nb.cells[1].outputs[1].text == "hello\n" and not nb.cells[0].get("outputs")
    assert str(found[0]) == "cell 2 (added), line 2: gc.get_objects (object-graph search)"


def test_the_self_check_lists_findings_under_the_score():
    found = [review.Finding("answer cell pick_device", 5, 3, "frame access", "sys._getframe")]
    text = selfcheck.format_report(layout.ROOT / "x.ipynb", "01_device_basics",
                                   [selfcheck.QuestionResult("test_a", "a", 2, 2)], 1.0, False, found)
    assert text.index("Score: 2/2") < text.index("Flagged for review")
    assert "answer cell pick_device, line 3: sys._getframe (frame access)" in text
    assert "Flagged" not in selfcheck.format_report(layout.ROOT / "x.ipynb", "n", [], 1.0, False, [])
