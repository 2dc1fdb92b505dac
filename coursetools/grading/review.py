"""Static review of a submission: flag, for a human, code that no honest answer needs.

Tamper checks inside the kernel can be read and steered by code in the same process
(docs/GRADING_SECURITY.md, "Forged scores and leaked tests"). Every way found to do so needs code that an
answer to a device exercise never contains, and that code sits in the submission for
anyone to read. This module reads it: Python's `ast` over every student cell (answer cells,
and any cell that is not one of the course's locked cells: added or changed ones), without
decoding or executing anything. A finding names the cell, the line and the construct. The
grade is never changed here: grade-class shows the findings in its summary table, in the
CSV (`flags` column) and in the flagged cell of the graded notebook and its feedback; the
self-check prints them under the score.

The constructs (`CONSTRUCTS`), each tested in tests/grading/test_review.py:

* **frame access**: `sys._getframe`, `sys._current_frames`, `inspect.currentframe`/`stack`/
  `trace`/`getouterframes`/`getinnerframes`/`getframeinfo`, `traceback.walk_stack`/
  `extract_stack`, and attributes `f_back`, `f_code`, `f_globals`, `f_locals`, `tb_frame`,
  `gi_frame`, `cr_frame`, ... on anything;
* **function internals**: `__closure__`, `cell_contents`, `__code__`, `__globals__`,
  `co_consts`, `co_code`, `co_names`, ..., `__builtins__`;
* **object-graph search**: the garbage collector (`gc` other than `gc.collect`),
  `__subclasses__`, `__bases__`, `__base__`, `__mro__`;
* **import machinery**: `sys.modules`, `sys.meta_path`, `sys.path_hooks`, changes to
  `sys.path`, `importlib` (other than `import_module` of a named module), `MAGIC_NUMBER`,
  `marshal`, `runpy`, `__loader__`, `__spec__`, relative imports, and imports of modules not
  installed here (a file the notebook wrote);
* **kernel machinery**: `get_ipython`, `IPython` (other than `IPython.display`), `ipykernel`,
  `jupyter_client`, `zmq`, `traitlets`, `comm`, `__main__`, the kernel's history (`In`,
  `Out`, `_ih`, `_oh`, `_i1`, ...), IPython magics other than `%time`, `%timeit`,
  `%matplotlib` and a few harmless ones (a `%%writefile` cell, `%run`, `%load_ext`, ...);
* **interpreter hooks**: `sys.settrace`, `sys.setprofile`, `sys.addaudithook`,
  `sys.excepthook`, `sys.displayhook`, `sys.unraisablehook`, assignments to `sys.stdout`/
  `stderr`/`stdin`, `threading.settrace`;
* **code that runs later**, out of the checks' sight: threads (`threading`, `_thread`,
  `ThreadPoolExecutor`), signal handlers, `atexit`, `weakref.finalize`, `__del__` methods,
  `asyncio` scheduling;
* **native code**: `ctypes`, `cffi`, `torch.utils.cpp_extension`, `torch.ops.load_library`,
  `/proc/<pid>/mem`;
* **code from strings**: `exec`, `eval`, `compile`, `code`/`codeop`, `types.FunctionType`/
  `CodeType`, `pickle`/`marshal` loads, `__reduce__` methods, and `timeit`/
  `torch.utils.benchmark.Timer` statements that are not string literals (a literal
  statement, like the argument of `%time`, is reviewed as code);
* **patching what the student did not define**: attribute assignment, `setattr`, `delattr` or
  `del` on a module (other than the documented `torch.backends` switches, e.g.
  `torch.backends.cudnn.benchmark`), on a builtin class, on a class or function a course cell
  defined, on `type(x)` or `x.__class__`; writes to `__class__`, `__dict__`, `__bases__`,
  `__code__`, `__module__`, ...; writes through `globals()`, `vars()` (of a module, or with
  no argument) or `locals()`; the builtins namespace (`__builtins__`, `import builtins`); a
  top-level name that shadows a builtin the notebook's tests call (`isinstance`, `all`, ...);
  class bodies that pose as another type (`__class__`, `__module__`, `__qualname__`,
  `__instancecheck__`, `__subclasscheck__`). Judged by what the code does, not how it is spelt:
  a small dataflow follows a library's module or class (and the course's helpers) through
  containers (`[torch.Tensor][0]`, `d["t"]`, `l.append(...)`), loops, object attributes,
  `globals()[...]`/`vars(m)[...]`, `getattr`, `__self__`, `pydoc.locate`, `import_module` and
  `sys.modules`, identity functions, and into the student's functions: a function that sets
  an attribute of a parameter (directly, through `setattr`, a mock or another function) is
  flagged where it is handed a library's module or class (`def _use(ns, f): ns.device = f`
  called as `_use(torch, F)`), across cells too; `unittest.mock` patchers (`patch`,
  `patch.object`, `patch.dict`, `patch.multiple`) replacing what the student did not define,
  started, as decorators, entered on a stack or inside a function (a patch in a top-level
  `with` block is undone before any test runs, and is not flagged); `register` on a library's
  class or ABC (`collections.abc.Sequence.register(X)`), or of a library's class on the
  student's ABC; a subclass of a library tensor type (`torch.Tensor`, `nn.Parameter`,
  `np.ndarray`, ...; by a class body or `type()`) that defines a torch or NumPy protocol
  (`__torch_function__`, `__array_function__`, ...) or what a test reads of a tensor
  (`is_meta`, `device`, `dtype`, ...); a top-level binding (assignment, loop, `global`) of a
  global the course's setup binds and its tests read (`device`: a test's GPU-only branch
  depends on it), an import of the same module excepted; the grader's agent
  (`__course_agent__`) by name;
* **obfuscation**, flagged as such: `getattr`/`setattr`/`delattr` with a computed name on a
  module or the builtins (`getattr(torch, device.type).synchronize()` and
  `getattr(torch, d.type, None)` stay allowed: a computed name on `torch` itself, used at once
  for a device module's public function, or with a default, or a device's `.type`),
  `__import__`/`import_module` with a computed name, a string that spells a flagged name
  built from pieces (`"ev" + "al"`, `"".join(...)`, `chr(...)`, slicing), any string that
  names one (`"_getframe"`), and decoding at run time (`base64`, `codecs.decode`, `binascii`,
  `zlib`/`bz2`/`lzma` decompression, `bytes.fromhex`).

Measured (tests/grading/test_review.py): no finding in any solution or fixture submission of the
course, nor in the honest controls (a `str` Enum, a NamedTuple, custom exceptions, an OrderedDict,
`numpy(force=True)`, `match`/`case`, `singledispatch`, a TorchFunctionMode); every attack of
the earlier rounds, each spelling of the fourth (`ROUND_4`) and each
obfuscation above is flagged.
"""

from __future__ import annotations

import ast
import builtins
import re
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterable, Iterator

from nbformat import NotebookNode

from coursetools import notebooks
from coursetools.cellcode import bound_names, params
from coursetools.cellcode import dotted as _dotted_name

CONSTRUCTS = {
    "frame access": "reads the interpreter's frames (a running test's code and variables)",
    "function internals": "reads or rewrites a function's closure, code or globals",
    "object-graph search": "searches the interpreter's objects (the garbage collector, every subclass)",
    "import machinery": "reaches modules through the import system or its internals",
    "kernel machinery": "reaches the Jupyter kernel, its messages or its history",
    "interpreter hooks": "installs a hook that runs on every call, line, error or output",
    "code that runs later": "runs code outside the cell that defines it (threads, signals, finalizers)",
    "native code": "runs native code or writes the process's memory",
    "code from strings": "runs code that is not in the cell as code",
    "patching": "changes a module, a builtin or a class it did not define",
    "obfuscation": "builds a name or code at run time, so that it cannot be read",
}

# -- what the constructs are made of --------------------------------------------------------
_FRAME_ATTRS = {"f_back", "f_code", "f_globals", "f_locals", "f_builtins", "f_trace", "f_lasti",
                "tb_frame", "tb_next", "gi_frame", "gi_code", "cr_frame", "cr_code", "ag_frame",
                "ag_code", "_getframe", "_current_frames", "_current_exceptions", "set_eval_frame"}
_FRAME_PATHS = {"sys._getframe", "sys._current_frames", "sys._current_exceptions",
                "inspect.currentframe", "inspect.stack", "inspect.trace", "inspect.getouterframes",
                "inspect.getinnerframes", "inspect.getframeinfo", "traceback.walk_stack",
                "traceback.walk_tb", "traceback.extract_stack", "traceback.print_stack",
                "traceback.format_stack", "torch._dynamo.eval_frame", "torch._C._dynamo"}
_INTERNAL_ATTRS = {"__closure__", "cell_contents", "__code__", "__globals__", "__builtins__",
                   "co_consts", "co_code", "co_names", "co_varnames", "co_cellvars", "co_freevars",
                   "co_filename", "co_lines", "co_positions", "_co_code_adaptive"}
_GRAPH_ATTRS = {"__subclasses__", "__bases__", "__base__", "__mro__"}
_GC_ALLOWED = {"gc.collect", "gc.isenabled", "gc.get_count", "gc.get_threshold"}
_IMPORT_ATTRS = {"MAGIC_NUMBER", "__loader__", "__spec__", "meta_path", "path_hooks",
                 "path_importer_cache"}
_IMPORT_PATHS = {"sys.modules", "sys.meta_path", "sys.path_hooks", "sys.path_importer_cache",
                 "importlib", "marshal", "imp", "runpy", "zipimport", "_imp", "pkgutil"}
_SYS_PATH_WRITES = {"append", "insert", "extend", "remove", "pop", "clear"}
_KERNEL_MODULES = {"IPython", "ipykernel", "jupyter_client", "zmq", "traitlets", "comm", "tornado",
                   "nbclient", "jupyter_core", "__main__", "ipywidgets"}
_KERNEL_ALLOWED = ("IPython.display",)
_HISTORY_NAMES = {"In", "Out", "_ih", "_oh", "_dh", "_ii", "_iii", "_i"}
_HISTORY_RE = re.compile(r"^_i?\d+$")
_SAFE_LINE_MAGICS = {"time", "timeit", "matplotlib", "who", "whos", "who_ls", "pwd", "precision",
                     "pinfo", "pinfo2", "pdoc", "pdef", "psource"}
_CODE_LINE_MAGICS = {"time", "timeit"}
_CODE_CELL_MAGICS = {"time", "timeit", "capture"}
_HOOK_PATHS = {"sys.settrace", "sys.setprofile", "sys.addaudithook", "sys.audit", "sys.excepthook",
               "sys.displayhook", "sys.unraisablehook", "sys.breakpointhook",
               "sys.set_asyncgen_hooks", "sys.setswitchinterval", "sys.monitoring",
               "threading.settrace", "threading.setprofile", "threading.settrace_all_threads",
               "threading.setprofile_all_threads", "gc.callbacks"}
_STREAMS = {"sys.stdout", "sys.stderr", "sys.stdin", "sys.__stdout__", "sys.__stderr__", "sys.__stdin__"}
_LATER_PATHS = {"threading", "_thread", "concurrent.futures.ThreadPoolExecutor",
                "concurrent.futures.thread", "signal.signal", "signal.setitimer", "signal.alarm",
                "signal.set_wakeup_fd", "signal.pthread_kill", "atexit", "weakref.finalize",
                "asyncio.get_event_loop", "asyncio.get_running_loop", "asyncio.new_event_loop",
                "asyncio.create_task", "asyncio.ensure_future", "asyncio.run_coroutine_threadsafe",
                "asyncio.set_event_loop", "sched"}
_THREADING_OK = {"get_ident", "current_thread", "main_thread", "active_count", "Lock", "RLock",
                 "get_native_id"}
_NATIVE_PATHS = {"ctypes", "_ctypes", "cffi", "torch.utils.cpp_extension", "torch.ops.load_library",
                 "torch.classes.load_library", "torch._C._jit_set_profiling_executor", "mmap"}
_PROC_MEM = re.compile(r"/proc/[^/]*/(mem|maps)\b")
_DYNAMIC_BUILTINS = {"exec", "eval", "compile", "__import__", "breakpoint"}
_DYNAMIC_PATHS = {"code", "codeop", "types.FunctionType", "types.CodeType", "types.LambdaType",
                  "pickle.loads", "pickle.load", "pickle.Unpickler", "_pickle", "copyreg", "dill",
                  "cloudpickle", "marshal.loads", "marshal.load", "shelve"}
_TIMERS = {"timeit.timeit", "timeit.repeat", "timeit.Timer", "torch.utils.benchmark.Timer",
           "torch.utils.benchmark.utils.timer.Timer"}
_DECODERS = {"base64.b64decode", "base64.standard_b64decode", "base64.urlsafe_b64decode",
             "base64.b32decode", "base64.b32hexdecode", "base64.b16decode", "base64.a85decode",
             "base64.b85decode", "base64.decodebytes", "base64.decode", "codecs.decode",
             "codecs.encode", "codecs.getdecoder", "binascii.a2b_base64", "binascii.a2b_hex",
             "binascii.unhexlify", "binascii.a2b_uu", "binascii.a2b_qp",
             "zlib.decompress", "bz2.decompress", "lzma.decompress", "gzip.decompress",
             "builtins.bytes.fromhex", "builtins.bytearray.fromhex", "quopri", "uu"}
# torch.backends switches a device answer may set (chapter 07 teaches them)
_TORCH_SWITCHES = re.compile(r"^torch\.backends\.[A-Za-z0-9_.]*\.(benchmark|deterministic|enabled|"
                             r"allow_tf32|allow_fp16_reduced_precision_reduction|"
                             r"allow_bf16_reduced_precision_reduction|fp32_precision|"
                             r"benchmark_limit|verbose)$")
# Public functions of a device module (torch.cuda, torch.mps, ...): `getattr(torch, kind).f()`.
_DEVICE_API = {"is_available", "device_count", "synchronize", "current_device", "set_device",
               "manual_seed", "manual_seed_all", "empty_cache", "memory_allocated",
               "max_memory_allocated", "memory_reserved", "max_memory_reserved",
               "reset_peak_memory_stats", "get_device_name", "get_device_properties",
               "get_device_capability", "current_stream", "default_stream", "Stream", "Event",
               "stream", "mem_get_info", "get_rng_state", "set_rng_state", "is_bf16_supported",
               "amp", "device", "is_initialized", "init", "driver_allocated_memory",
               "recommended_max_memory", "current_allocated_memory"}
# unittest.mock's patchers: each replaces an attribute of its target until stopped
_MOCK_PATCHERS = {"patch", "patch.object", "patch.dict", "patch.multiple"}
# Library types whose instances the tests observe as tensors and arrays: a student subclass
# that answers the tests' questions itself (a torch function protocol, an overridden property)
_TENSOR_TYPES = {"torch.Tensor", "torch._tensor.Tensor", "torch._C.TensorBase", "torch._C._TensorBase",
                 "torch.nn.Parameter", "torch.nn.parameter.Parameter", "torch.nn.Buffer",
                 "torch.nn.parameter.Buffer", "torch.nn.UninitializedParameter",
                 "torch.nn.parameter.UninitializedParameter", "torch.nn.UninitializedBuffer",
                 "torch.nn.parameter.UninitializedBuffer", "numpy.ndarray", "numpy.matrix",
                 "numpy.memmap", "numpy.recarray", "numpy.ma.MaskedArray", "numpy.ma.core.MaskedArray"}
_TENSOR_PROTOCOLS = {"__torch_function__", "__torch_dispatch__", "__array_function__", "__array_ufunc__",
                     "__array__", "__array_wrap__", "__array_interface__", "__array_struct__",
                     "__array_priority__", "__getattribute__", "__getattr__", "__eq__", "__ne__",
                     "__bool__", "__class__", "__instancecheck__"}
# what a test reads of a tensor or an array: a subclass that defines one answers for the base
_TENSOR_OBSERVED = {"device", "dtype", "shape", "layout", "is_meta", "is_cuda", "is_cpu", "is_mps",
                    "is_xpu", "is_mtia", "is_ipu", "is_xla", "is_hpu", "is_maia", "is_vulkan",
                    "is_mkldnn", "is_sparse", "is_sparse_csr", "is_quantized", "is_nested", "is_leaf",
                    "requires_grad", "grad", "grad_fn", "data", "ndim", "names", "itemsize", "nbytes",
                    "T", "mT", "H", "mH", "real", "imag", "base", "_base", "flags", "strides", "size",
                    "stride", "dim", "numel", "element_size", "data_ptr", "untyped_storage", "storage",
                    "get_device", "type", "is_contiguous", "is_floating_point", "is_complex", "equal",
                    "allclose", "isclose", "item", "tolist", "numpy", "cpu", "cuda", "to", "tobytes",
                    "__len__", "__iter__", "__repr__", "__str__", "__format__", "__float__", "__int__",
                    "__index__", "__reduce_ex__", "__deepcopy__"}
# The grader's agent in the kernel, by the names it is registered under
_AGENT_NAMES = ("__course_agent__", "__course")
# Lookups of an object by its dotted name (like an import)
_LOOKUPS = {"pydoc.locate", "pkgutil.resolve_name"}
# Calls whose result is (one of) their first argument's items, or the argument itself
_ITEM_CALLS = {"builtins.next", "builtins.iter", "builtins.list", "builtins.tuple", "builtins.set",
               "builtins.frozenset", "builtins.reversed", "builtins.sorted", "builtins.min",
               "builtins.max", "builtins.dict", "builtins.enumerate", "builtins.zip", "copy.copy",
               "contextlib.nullcontext", "builtins.filter", "typing.cast"}
_ITEM_METHODS = {"get", "pop", "popitem", "values", "items", "keys", "copy", "setdefault", "__getitem__",
                 "popleft", "__next__"}
_STORE_METHODS = {"append", "extend", "insert", "add", "update", "setdefault", "appendleft", "__setitem__"}
_PARAM = "@param:"  # how a function's parameter is named while the function is read

_DUNDER_WRITES_OK = {"__doc__", "__name__", "__wrapped__", "__signature__", "__annotations__"}
_POSING = {"__class__", "__module__", "__qualname__", "__instancecheck__", "__subclasscheck__"}
_NAMESPACE_CALLS = {"globals", "locals", "vars"}
_WRITE_METHODS = {"update", "setdefault", "pop", "popitem", "clear", "__setitem__", "__delitem__"}

# Names that, as a plain string literal, only serve to reach something flagged ("_getframe");
# built from pieces ("ev" + "al"), every flagged name counts, common words included.
DISTINCTIVE_NAMES = (_FRAME_ATTRS | _INTERNAL_ATTRS | _GRAPH_ATTRS | _IMPORT_ATTRS
                     | {"__import__", "get_ipython", "get_objects", "get_referrers", "get_referents",
                        "settrace", "setprofile", "addaudithook", "__main__", "ipykernel",
                        "jupyter_client", "__getattribute__", "__setattr__", "__delattr__",
                        "__course_agent__"})
SENSITIVE_NAMES = DISTINCTIVE_NAMES | _DYNAMIC_BUILTINS | {
    "sys", "gc", "inspect", "ctypes", "importlib", "marshal", "builtins", "modules", "IPython",
    "globals", "locals", "linecache", "__dict__", "__class__", "kernel", "session"}


@dataclass(frozen=True)
class Finding:
    """One flagged construct: where it is, and what it is."""
    where: str  # "answer cell pick_device", "cell 7 (added)"
    cell_index: int
    line: int
    construct: str  # a key of CONSTRUCTS
    detail: str

    def __str__(self) -> str:
        return f"{self.where}, line {self.line}: {self.detail} ({self.construct})"


# -- which cells are the student's ---------------------------------------------------------
def is_course_cell(cell: NotebookNode) -> bool:
    """A locked cell of the course (setup, helpers, tests): locked *and* known by its grade id.

    nbgrader restores such a cell's source before grading (OverwriteCells) and drops the
    grade id of a cell it does not know, so a student's cell that claims to be locked in its
    metadata is still the student's."""
    return notebooks.is_locked(cell) and bool(notebooks.grade_id(cell))


def student_cells(nb: NotebookNode) -> Iterator[tuple[int, NotebookNode]]:
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and not is_course_cell(cell) and cell.source.strip():
            yield index, cell


def cell_label(index: int, cell: NotebookNode) -> str:
    gid = notebooks.grade_id(cell)
    if gid and notebooks.is_solution(cell):
        return f"answer cell {gid}"
    return f"cell {index + 1} (added)"


# -- reading a cell --------------------------------------------------------------------------
def _parse(source: str) -> ast.Module | None:
    flags = ast.PyCF_ONLY_AST | getattr(ast, "PyCF_ALLOW_TOP_LEVEL_AWAIT", 0)
    try:
        return compile(source, "<cell>", "exec", flags=flags, dont_inherit=True)
    except (SyntaxError, ValueError):
        return None


@lru_cache(maxsize=1)
def _transformer():
    from IPython.core.inputtransformer2 import TransformerManager
    return TransformerManager()


_IPYTHON_SYNTAX = re.compile(r"^\s*[%!]|=\s*[%!]|\?\s*$", re.M)


def _ipython_to_python(source: str) -> str:
    """IPython's line magics and shell escapes turned into the calls IPython runs (line for line)."""
    if not _IPYTHON_SYNTAX.search(source):
        return source
    try:
        return _transformer().transform_cell(source)
    except Exception:  # noqa: BLE001 - not IPython-valid: ast reports it (or the kernel does)
        return source


@lru_cache(maxsize=1)
def installed_modules() -> frozenset[str]:
    """Top-level modules importable without files the notebook writes: the standard library,
    built-in modules and installed distributions."""
    names = set(sys.builtin_module_names) | set(getattr(sys, "stdlib_module_names", ()))
    try:
        from importlib.metadata import packages_distributions
        names |= set(packages_distributions())
    except Exception:  # noqa: BLE001 - old Python or a broken distribution: be lenient
        return frozenset()
    return frozenset(names)


def _builtin_names() -> set[str]:
    return {n for n in dir(builtins) if not n.startswith("__") or n == "__import__"}


@dataclass(frozen=True)
class _CellInfo:
    """What the review needs to know about a cell for the rest of the notebook."""
    builtins_loaded: frozenset[str]  # builtin names it reads
    defs: frozenset[str]  # classes and functions it defines at top level
    bound: frozenset[str]  # every name it binds at top level
    classes: frozenset[str]  # every class it defines
    aliases: tuple[tuple[str, str], ...]  # (name, dotted module path) of its imports
    loaded: frozenset[str]  # every name it reads
    global_bound: frozenset[str]  # names it binds in the notebook's namespace, in if/for/with/try too
    free: frozenset[str]  # names it reads and binds nowhere (not even as a parameter)


@lru_cache(maxsize=4096)
def _cell_info(source: str) -> _CellInfo | None:
    tree = _parse(_ipython_to_python(source))
    if tree is None:
        return None
    everything = _builtin_names()
    aliases: dict[str, str] = {}
    defs, bound = set(), set()
    for node in tree.body:
        _collect_aliases(node, aliases)
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            defs.add(node.name)
        bound |= _top_bound(node)
    loaded, classes, names, anywhere = set(), set(), set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                names.add(node.id)
                if node.id in everything:
                    loaded.add(node.id)
            else:
                anywhere.add(node.id)
        elif isinstance(node, ast.ClassDef):
            classes.add(node.name)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            anywhere |= params(node)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            anywhere.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            anywhere |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ExceptHandler) and node.name:
            anywhere.add(node.name)
    return _CellInfo(frozenset(loaded), frozenset(defs), frozenset(bound), frozenset(classes),
                     tuple(aliases.items()), frozenset(names), frozenset(_global_bound(tree.body)),
                     frozenset(names - anywhere))


def _global_bound(body: list[ast.stmt]) -> set[str]:
    """Names statements bind in the namespace they run in, inside if/for/while/with/try too
    (`if ...: device = torch.device("cuda") else: ...`), and names functions declare global."""
    names: set[str] = set()
    for stmt in body:
        names |= _top_bound(stmt)
        if isinstance(stmt, (ast.For, ast.AsyncFor)):
            names |= set(bound_names(stmt.target))
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            names |= {n for item in stmt.items if item.optional_vars for n in bound_names(item.optional_vars)}
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(stmt, field, None)
            if isinstance(inner, list) and not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names |= _global_bound(inner)
        for handler in getattr(stmt, "handlers", []):
            names |= _global_bound(handler.body)
        for case in getattr(stmt, "cases", []):
            names |= _global_bound(case.body)
    return names


def builtins_the_tests_use(nb: NotebookNode) -> set[str]:
    """Builtin names the notebook's test cells call or read (a student's global of that name
    would replace the builtin for the test)."""
    names: set[str] = set()
    for cell in nb.cells:
        if cell.cell_type == "code" and notebooks.is_test_cell(cell):
            info = _cell_info(cell.source)
            if info is not None:
                names |= info.builtins_loaded
    return names


@dataclass
class _Summary:
    """What a function of the student's does with its parameters, for the calls that hand it a
    library's module or class: `def _use(ns, f): ns.device = f` called as `_use(torch, F)`."""
    params: list[str]  # positional parameters, in order
    names: set[str]  # every parameter
    bound: bool = False  # called on an instance or a class: the first parameter is not passed
    writes: dict[str, set[str | None]] = field(default_factory=dict)  # parameter -> attributes it sets
    returns: set[str] = field(default_factory=set)  # parameters it may return
    returns_origin: str | None = None  # a library's module or class it may return


class _Context:
    """What the review knows about the whole notebook: names the course's cells bind (and
    which of them are classes or functions), classes the student defines, imports."""

    def __init__(self, nb: NotebookNode | None):
        self.course_defs: set[str] = set()  # classes and functions the course's cells define
        self.course_names: set[str] = set()  # every top-level name the course's cells bind
        self.student_classes: set[str] = set()
        self.aliases: dict[str, str] = {}  # name -> dotted module path, from every cell's imports
        self.test_builtins: set[str] = set()
        # globals the course's setup and helper cells bind and its tests read (`device`)
        self.test_globals: dict[str, str | None] = {}  # name -> the module it is bound to, if any
        # what the student's cells define, for the other cells: functions' summaries, top-level
        # names bound to a library's module or class, classes that are ABCs or tensor types
        self.summaries: dict[str, _Summary] = {}
        self.top_origins: dict[str, str] = {}
        self.abc_classes: set[str] = set()
        self.tensor_classes: set[str] = set()
        self.collected: set[str] = set()  # the cells read for the above
        if nb is None:
            return
        self.test_builtins = builtins_the_tests_use(nb)
        tests_read: set[str] = set()
        setup_bound: set[str] = set()
        for cell in nb.cells:
            info = _cell_info(cell.source) if cell.cell_type == "code" else None
            if info is None:
                continue
            self.aliases.update(info.aliases)
            if is_course_cell(cell):
                self.course_defs |= info.defs
                self.course_names |= info.bound
                if notebooks.is_test_cell(cell):
                    tests_read |= info.free  # not the test's own `got`, a lambda's parameter
                else:
                    setup_bound |= info.global_bound
            else:
                self.student_classes |= info.classes
        self.test_globals = {name: self.aliases.get(name) for name in (setup_bound & tests_read) - self.course_defs}
        students = [cell.source for _, cell in student_cells(nb)]
        self.collected = set(students)
        for _ in range(2):  # twice: a function may call one defined after it
            for source in students:
                tree = _parse(_ipython_to_python(source))
                if tree is not None:
                    _collect(tree, self)


    def fork(self) -> "_Context":
        """A copy whose collections a cell's own definitions may be added to."""
        other = object.__new__(_Context)
        other.__dict__.update(self.__dict__)
        other.summaries = dict(self.summaries)
        other.top_origins = dict(self.top_origins)
        other.abc_classes = set(self.abc_classes)
        other.tensor_classes = set(self.tensor_classes)
        return other


def _collect(tree: ast.Module, context: _Context) -> None:
    """Read a student cell for what the other cells need of it: its functions' summaries, its
    top-level names bound to a library's module or class, its ABCs and tensor classes."""
    _link_parents(tree)
    reader = _Reviewer(context, lambda *args: None, collecting=True)
    reader.visit(tree)
    for name, origin in reader.origins[0].items():
        if _is_library(origin):
            context.top_origins[name] = origin  # type: ignore[assignment]
    for name, path in reader.scopes[0].items():
        if path and name not in context.aliases:
            context.top_origins[name] = path


def _is_library(origin: str | None) -> bool:
    return bool(origin) and not origin.startswith(_PARAM)  # type: ignore[union-attr]


def _collect_aliases(node: ast.AST, aliases: dict[str, str]) -> None:
    if isinstance(node, ast.Import):
        for a in node.names:
            if a.asname:
                aliases[a.asname] = a.name
            else:
                top = a.name.split(".")[0]
                aliases[top] = top
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        for a in node.names:
            if a.name != "*":
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"


def _top_bound(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(node, ast.Assign):
        return {n for t in node.targets for n in bound_names(t)}
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        return set(bound_names(node.target))
    return set()


# -- constant folding (no decoding, no execution) ---------------------------------------------
def _fold(node: ast.AST | None, consts: dict[str, str], depth: int = 0) -> str | None:
    """The string an expression always evaluates to, when it is built from string literals by
    concatenation, repetition, f-strings, join, slicing, chr(), str methods or names bound
    to such strings; None otherwise."""
    if node is None or depth > 20:
        return None

    def fold(n: ast.AST | None) -> str | None:
        return _fold(n, consts, depth + 1)

    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.Name):
        return consts.get(node.id)
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, ast.Add):
            left, right = fold(node.left), fold(node.right)
            return left + right if left is not None and right is not None else None
        if isinstance(node.op, ast.Mult) and isinstance(node.right, ast.Constant):
            text, count = fold(node.left), node.right.value
            if text is not None and isinstance(count, int) and 0 <= count < 100:
                return text * count
        return None
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.FormattedValue):
                if value.format_spec is not None or value.conversion not in (-1, 115):
                    return None
                value = value.value
            part = fold(value)
            if part is None:
                return None
            parts.append(part)
        return "".join(parts)
    if isinstance(node, ast.Subscript):
        text = fold(node.value)
        index = node.slice
        if text is None:
            return None
        if isinstance(index, ast.Slice):
            bounds = []
            for bound in (index.lower, index.upper, index.step):
                if bound is None:
                    bounds.append(None)
                elif isinstance(bound, ast.Constant) and isinstance(bound.value, int):
                    bounds.append(bound.value)
                elif (isinstance(bound, ast.UnaryOp) and isinstance(bound.op, ast.USub)
                      and isinstance(bound.operand, ast.Constant) and isinstance(bound.operand.value, int)):
                    bounds.append(-bound.operand.value)
                else:
                    return None
            try:
                return text[slice(*bounds)]
            except ValueError:
                return None
        if isinstance(index, ast.Constant) and isinstance(index.value, int):
            try:
                return text[index.value]
            except IndexError:
                return None
        return None
    if isinstance(node, ast.Call) and not node.keywords:
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("chr", "str") and len(node.args) == 1:
            arg = node.args[0]
            if func.id == "str":
                return fold(arg)
            if isinstance(arg, ast.Constant) and isinstance(arg.value, int) and 0 <= arg.value < 0x110000:
                return chr(arg.value)
            return None
        if isinstance(func, ast.Attribute):
            if func.attr == "join" and len(node.args) == 1:
                sep, items = fold(func.value), node.args[0]
                if sep is None:
                    return None
                if isinstance(items, (ast.List, ast.Tuple)):
                    parts = [fold(e) for e in items.elts]
                    return sep.join(parts) if all(p is not None for p in parts) else None  # type: ignore[arg-type]
                if isinstance(items, ast.Call) and isinstance(items.func, ast.Name) and items.func.id == "reversed":
                    text = fold(items.args[0]) if items.args else None
                    return sep.join(reversed(text)) if text is not None else None
                text = fold(items)
                return sep.join(text) if text is not None else None
            if func.attr in ("lower", "upper", "strip", "lstrip", "rstrip", "title", "casefold",
                             "swapcase", "capitalize") and not node.args:
                text = fold(func.value)
                return getattr(text, func.attr)() if text is not None else None
            if func.attr == "replace" and len(node.args) == 2:
                text, old, new = fold(func.value), fold(node.args[0]), fold(node.args[1])
                return text.replace(old, new) if text is not None and old is not None and new is not None else None
            if func.attr == "format":
                text, args = fold(func.value), [fold(a) for a in node.args]
                if text is not None and all(a is not None for a in args):
                    try:
                        return text.format(*args)
                    except (IndexError, KeyError, ValueError):
                        return None
    return None


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _names_flagged(text: str, names: set[str]) -> bool:
    """Whether a string is a (dotted) name with a part in `names`: '_getframe', 'sys.modules'."""
    stripped = text.strip()
    if not stripped or len(stripped) > 200:
        return False
    parts = stripped.split(".")
    return all(_IDENTIFIER.fullmatch(p) for p in parts) and any(p in names for p in parts)


# -- the review of one cell -------------------------------------------------------------------
class _Reviewer(ast.NodeVisitor):
    """Walks one cell (or a string reviewed as code) and reports findings through `add`."""

    def __init__(self, context: _Context, add, consts: dict[str, str] | None = None, *, collecting: bool = False):
        self.context = context
        self.add = add  # add(line, construct, detail)
        self.scopes: list[dict[str, str | None]] = [{}]  # name -> dotted path (None: not a module's)
        # name (or dotted name) -> the library module or class it may hold (through a container, a
        # loop, a lookup), or the parameter it stands for ("@param:<function>:<name>")
        self.origins: list[dict[str, str | None]] = [{}]
        self.collecting = collecting  # only gathering the context's summaries: store them there
        self.funcs: list[_Summary] = []  # the functions being read, innermost last
        self.markers: dict[str, _Summary] = {}
        self.pending_name: str | None = None  # the name a lambda is being assigned to
        self.scoped_patches: set[int] = set()  # mock patchers of a top-level `with`: over before any test
        self.consts: dict[str, str] = dict(consts or {})
        self.functions: set[str] = set()  # names bound by def / lambda assignments
        self.namespace_names: set[str] = set()  # names bound to globals(), vars(), __dict__, ...
        self.depth = 0  # function nesting (0: the cell's top level)
        self.class_depth = 0
        self.selves: list[str | None] = []  # per function being read: its instance if it is a method

    # -- names and what they name
    def bind(self, name: str, path: str | None = None) -> None:
        self.scopes[-1][name] = path
        self.origins[-1][name] = None

    def set_origin(self, name: str, origin: str | None) -> None:
        """`name` (or a dotted name) may hold `origin`, in the scope that binds it."""
        if not origin:
            return
        for origins in reversed(self.origins):
            if name in origins:
                origins[name] = origin
                return
        self.origins[-1][name] = origin

    def lookup_origin(self, name: str) -> str | None:
        for scope, origins in zip(reversed(self.scopes), reversed(self.origins)):
            if name in origins:
                return origins[name]
            if name in scope:
                return None
        return self.context.top_origins.get(name)

    def origin(self, node: ast.AST | None) -> str | None:
        """The library module or class (a dotted path) an expression may evaluate to, followed
        through containers, loops, parameters, item lookups and name lookups; a parameter of the
        function being read as "@param:..."; None for anything else (a call's result)."""
        if node is None:
            return None
        path = self.resolve(node)
        if path:
            return path
        if isinstance(node, ast.Name):
            return self.lookup_origin(node.id)
        if isinstance(node, ast.Attribute):
            name = _dotted_name(node)
            if name and self.lookup_origin(name):
                return self.lookup_origin(name)
            base = self.origin(node.value)
            if not base or base.startswith(_PARAM):
                return base
            if node.attr == "__self__":  # a function's module or class
                return base.rsplit(".", 1)[0] if "." in base else base
            return f"{base}.{node.attr}"
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return next((o for o in map(self.origin, node.elts) if o), None)
        if isinstance(node, ast.Dict):
            return next((o for o in map(self.origin, node.values + [k for k in node.keys if k]) if o), None)
        if isinstance(node, ast.Starred):
            return self.origin(node.value)
        if isinstance(node, ast.Subscript):
            key = _fold(node.slice, self.consts)
            value = node.value
            if key and self.is_namespace(value):  # globals()["torch"], vars(torch)["Tensor"]
                if isinstance(value, ast.Call) and value.args:
                    base = self.origin(value.args[0])
                    return f"{base}.{key}" if _is_library(base) else None
                if isinstance(value, ast.Attribute) and value.attr == "__dict__":
                    base = self.origin(value.value)
                    return f"{base}.{key}" if _is_library(base) else None
                return self.lookup(key)[1] or self.lookup_origin(key)
            return self.origin(value)
        if isinstance(node, ast.IfExp):
            return self.origin(node.body) or self.origin(node.orelse)
        if isinstance(node, ast.BoolOp):
            return next((o for o in map(self.origin, node.values) if o), None)
        if isinstance(node, ast.NamedExpr):
            return self.origin(node.value)
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            return self.origin(node.elt) or next((o for o in (self.origin(g.iter) for g in node.generators) if o), None)
        if isinstance(node, ast.DictComp):
            return self.origin(node.value) or self.origin(node.key)
        if isinstance(node, ast.Call):
            return self.call_origin(node)
        return None

    def call_origin(self, node: ast.Call) -> str | None:
        func = node.func
        func_path = self.resolve(func) or ""
        if func_path in _LOOKUPS:
            return "a library object" if node.args and _fold(node.args[0], self.consts) is None else None
        if func_path == "builtins.getattr" and len(node.args) >= 2:  # a computed name on an alias
            base = self.origin(node.args[0])
            name = _fold(node.args[1], self.consts)
            if base and base.startswith(_PARAM):
                return base
            return (f"{base}.{name}" if name else base) if base else None
        if func_path in _ITEM_CALLS or func_path == "functools.reduce":
            return next((o for o in map(self.origin, node.args) if o), None)
        if isinstance(func, ast.Attribute) and func.attr in _ITEM_METHODS and not _is_library(self.resolve(func.value)):
            return self.origin(func.value)
        if isinstance(func, ast.Call) and self.resolve(func.func) in ("operator.itemgetter", "operator.attrgetter"):
            return next((o for o in map(self.origin, node.args) if o), None)
        called = self.called(node)
        if called:
            summary, args = called
            if summary.returns_origin:
                return summary.returns_origin
            for param, arg in args:
                if param in summary.returns and self.origin(arg):
                    return self.origin(arg)
        return None

    def called(self, node: ast.Call) -> tuple[_Summary, list[tuple[str, ast.AST]]] | None:
        """The student's function a call runs, and which argument each parameter gets."""
        func, args = node.func, list(node.args)
        if self.resolve(func) == "functools.partial" and args:
            func, args = args[0], args[1:]
        summary = None
        offset = 0
        if isinstance(func, ast.Name) and not self.resolve(func):
            summary = self.context.summaries.get(func.id)
            offset = 1 if summary and summary.bound else 0
        elif isinstance(func, ast.Attribute) and not self.resolve(func):
            summary = self.context.summaries.get("." + func.attr)
            offset = 1
        if summary is None:
            return None
        mapped: list[tuple[str, ast.AST]] = []
        positional = summary.params[offset:]
        for index, arg in enumerate(args):
            if isinstance(arg, ast.Starred):
                mapped += [(p, arg) for p in positional[index:]]
                break
            if index < len(positional):
                mapped.append((positional[index], arg))
        for keyword in node.keywords:
            if keyword.arg in summary.names:
                mapped.append((keyword.arg, keyword.value))
        return summary, mapped

    def record_write(self, marker: str, attr: str | None) -> None:
        """An attribute set on a parameter of a function being read."""
        ident, _, name = marker[len(_PARAM):].partition(":")
        summary = self.markers.get(ident)
        if summary is not None:
            summary.writes.setdefault(name, set()).add(attr)

    def check_writes_through(self, origin: str | None, attrs: Iterable[str | None], line: int, how: str) -> None:
        """Attributes set on what `origin` names: flagged when it is a library's module or class,
        remembered when it is a parameter (the calls decide)."""
        if not origin:
            return
        for attr in attrs:
            if origin.startswith(_PARAM):
                self.record_write(origin, attr)
                continue
            target = f"{origin}.{attr}" if attr else origin
            if attr and _TORCH_SWITCHES.match(target):
                continue
            self.add(line, "patching", f"{how} {target} (a library's module or class, reached through an alias)")

    def lookup(self, name: str) -> tuple[bool, str | None]:
        """(bound in the notebook?, the dotted path it stands for)."""
        for scope in reversed(self.scopes):
            if name in scope:
                return True, scope[name]
        if name in self.context.aliases:
            return True, self.context.aliases[name]
        if name in self.context.course_names or name in self.context.student_classes:
            return True, None
        return False, None

    def resolve(self, node: ast.AST | None) -> str | None:
        """The dotted path an expression names ('torch.nn.Module' for `nn.Module` after
        `import torch.nn as nn`; builtins as 'builtins.<name>'); None for anything else."""
        if isinstance(node, ast.Name):
            known, path = self.lookup(node.id)
            if known:
                return path
            if node.id == "__builtins__":
                return "builtins"
            return f"builtins.{node.id}" if hasattr(builtins, node.id) else None
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.Call):
            func = self.resolve(node.func)
            if func in ("builtins.__import__", "importlib.import_module") and node.args:
                name = _fold(node.args[0], self.consts)
                if name and func == "builtins.__import__":
                    fromlist = node.args[3] if len(node.args) > 3 else next(
                        (k.value for k in node.keywords if k.arg == "fromlist"), None)
                    return name if fromlist is not None else name.split(".")[0]
                return name
            if func in _LOOKUPS and node.args:  # pydoc.locate("torch.Tensor")
                return _fold(node.args[0], self.consts)
            if func == "builtins.getattr" and len(node.args) >= 2:
                base, name = self.resolve(node.args[0]), _fold(node.args[1], self.consts)
                return f"{base}.{name}" if base and name else None
            return None
        if isinstance(node, ast.Subscript):
            key = _fold(node.slice, self.consts)
            if key and self.resolve(node.value) == "sys.modules":
                return key
        return None

    @staticmethod
    def is_module_path(path: str | None) -> bool:
        """Whether a path names a module (or the builtins) rather than a class from one:
        every part lowercase (torch.cuda, sys) or private (torch._C)."""
        if not path or path.startswith("builtins."):
            return False
        return all(part[:1].islower() or part.startswith("_") for part in path.split("."))

    # -- checks on what an expression names
    def check_path(self, path: str, line: int, *, write: bool = False) -> None:
        """The rules on dotted paths: sys._getframe, gc.get_objects, sys.modules, ..."""
        parts = path.split(".")
        top, last = parts[0], parts[-1]

        def under(prefixes: Iterable[str]) -> bool:
            return any(path == p or path.startswith(p + ".") for p in prefixes)

        if under(_FRAME_PATHS):
            self.add(line, "frame access", path)
        if top == "gc" and len(parts) > 1 and path not in _GC_ALLOWED:
            self.add(line, "object-graph search", path)
        if under(_IMPORT_PATHS) and path not in ("importlib", "importlib.import_module"):
            self.add(line, "import machinery", path)
        if path == "sys.path" and write:
            self.add(line, "import machinery", "sys.path replaced")
        if top in _KERNEL_MODULES and path != "IPython" and not under(_KERNEL_ALLOWED):
            self.add(line, "kernel machinery", path)
        if last == "get_ipython":
            self.add(line, "kernel machinery", "get_ipython")
        if any(part.startswith(_AGENT_NAMES) for part in parts):
            self.add(line, "kernel machinery", f"{path} (the grader's agent)")
        if under(_HOOK_PATHS):
            self.add(line, "interpreter hooks", path)
        if write and under(_STREAMS):
            self.add(line, "interpreter hooks", f"{path} replaced")
        if under(_LATER_PATHS) and not (top == "threading" and len(parts) == 2 and last in _THREADING_OK):
            self.add(line, "code that runs later", path)
        if under(_NATIVE_PATHS):
            self.add(line, "native code", path)
        if top == "builtins" and last in _DYNAMIC_BUILTINS:
            self.add(line, "import machinery" if last == "__import__" else "code from strings", last)
        if under(_DYNAMIC_PATHS):
            self.add(line, "code from strings", path)
        if under(_DECODERS):
            self.add(line, "obfuscation", f"{path} (decodes at run time)")
        if path == "builtins" or (top == "builtins" and write):
            self.add(line, "patching", "the builtins namespace")

    def check_attr(self, attr: str, line: int) -> None:
        """Rules on an attribute name, whatever it is read from."""
        if attr in _FRAME_ATTRS:
            self.add(line, "frame access", attr)
        if attr in _INTERNAL_ATTRS:
            self.add(line, "function internals", attr)
        if attr in _GRAPH_ATTRS:
            self.add(line, "object-graph search", attr)
        if attr in _IMPORT_ATTRS:
            self.add(line, "import machinery", attr)
        if attr == "get_ipython":
            self.add(line, "kernel machinery", "get_ipython")
        if attr in ("__getattribute__", "__setattr__", "__delattr__"):
            self.add(line, "obfuscation", f"an explicit {attr}")

    def check_write_target(self, base: ast.AST, attr: str, line: int, how: str = "sets") -> None:
        """`base.attr = ...`, `del base.attr`, `setattr(base, attr, ...)`: allowed on the
        student's own objects and classes, flagged on what the student did not define."""
        if attr.startswith("__") and attr.endswith("__") and attr not in _DUNDER_WRITES_OK:
            self.add(line, "patching", f"{how} {attr}")
            return
        path = self.resolve(base)
        if path:
            target = f"{path}.{attr}"
            if self.is_module_path(path):
                if not _TORCH_SWITCHES.match(target):
                    self.add(line, "patching", f"{how} {target} (a module's attribute)")
            elif path.startswith("builtins."):
                self.add(line, "patching", f"{how} {target[len('builtins.'):]} (a builtin)")
            else:
                self.add(line, "patching", f"{how} {target} (a class or function of a library)")
            return
        if isinstance(base, ast.Name) and base.id in self.context.course_defs:
            known_here = any(base.id in scope for scope in self.scopes)
            if not known_here:
                self.add(line, "patching", f"{how} {base.id}.{attr} ({base.id} is the course's)")
            return
        origin = self.origin(base)
        if origin:
            self.check_writes_through(origin, [attr], line, how)
            return
        if isinstance(base, ast.Name) and base.id in self.context.tensor_classes and (
                attr in _TENSOR_OBSERVED or attr in _TENSOR_PROTOCOLS):
            self.add(line, "patching", f"{how} {base.id}.{attr} ({base.id} is a tensor or array type of the student's)")
            return
        if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "type":
            self.add(line, "patching", f"{how} type(...).{attr} (the class of an object)")
        elif isinstance(base, ast.Attribute) and base.attr in ("__class__", "__dict__"):
            self.add(line, "patching", f"{how} {base.attr}.{attr}")

    def check_shadowing(self, name: str, line: int, same_as: str | None = None) -> None:
        """A top-level name of the student's that replaces, for the tests, a builtin they call,
        a helper the course's cells define or a global of the notebook they read (`device`).
        An import of the module the course's cells bound to that name (`import torch`) is not one."""
        if name in self.context.test_builtins and name not in self.context.course_names:
            self.add(line, "patching", f"redefines {name!r}, a builtin the tests call")
        elif name in self.context.course_defs:
            self.add(line, "patching", f"redefines {name!r}, a helper of the course's cells")
        elif name in self.context.test_globals and not (same_as and same_as == self.context.test_globals[name]):
            self.add(line, "patching", f"rebinds {name!r}, a global of the notebook that its tests read")

    def is_namespace(self, node: ast.AST) -> bool:
        """globals(), locals(), vars() (no argument, or of a module or the course's class),
        X.__dict__, sys.modules, or a name bound to one of them."""
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            name = node.func.id
            if name in _NAMESPACE_CALLS and not self.lookup(name)[0]:
                if name == "vars" and node.args:
                    arg = node.args[0]
                    path = self.resolve(arg)
                    return bool(path) or (isinstance(arg, ast.Name) and arg.id in self.context.course_defs)
                return True
        if isinstance(node, ast.Attribute) and node.attr == "__dict__":
            return True
        if isinstance(node, ast.Name) and node.id in self.namespace_names:
            return True
        return self.resolve(node) == "sys.modules"

    def check_namespace_write(self, target: ast.AST, line: int) -> None:
        if isinstance(target, ast.Subscript) and self.is_namespace(target.value):
            self.add(line, "patching", "writes to a namespace (globals(), vars(), __dict__, sys.modules)")

    def review_code_string(self, node: ast.AST, line: int, what: str) -> None:
        """A string that is run as code (a timed statement): reviewed as code when it is a
        literal (or built from literals), flagged when it is computed."""
        text = _fold(node, self.consts)
        if text is None:
            if isinstance(node, (ast.Lambda, ast.Attribute)) or (isinstance(node, ast.Name) and (
                    node.id in self.functions or self.resolve(node))):
                return  # a function (the student's, a builtin, a library's), not a string
            if isinstance(node, ast.Constant) and node.value is None:
                return
            self.add(line, "code from strings", f"{what} that is not a string literal")
            return
        tree = _parse(text)
        if tree is None:
            return
        for _, construct, detail in _review_tree(tree, self.context, self.consts):
            self.add(line, construct, f"{detail} (in {what})")

    # -- visitors: imports
    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            name, path = (a.asname or a.name).split(".")[0], a.name if a.asname else a.name.split(".")[0]
            self.bind(name, path)
            self.check_import(a.name, node.lineno)
            if self.depth == 0 and self.class_depth == 0:
                self.check_shadowing(name, node.lineno, same_as=path)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self.add(node.lineno, "import machinery", "a relative import")
            return
        module = node.module or ""
        self.check_import(module, node.lineno)
        for a in node.names:
            if a.name == "*":
                continue
            self.bind(a.asname or a.name, f"{module}.{a.name}")
            self.check_path(f"{module}.{a.name}", node.lineno)
            self.check_attr(a.name, node.lineno)
            if self.depth == 0 and self.class_depth == 0:
                self.check_shadowing(a.asname or a.name, node.lineno, same_as=f"{module}.{a.name}")

    def check_import(self, module: str, line: int) -> None:
        self.check_path(module, line)
        top = module.split(".")[0]
        installed = installed_modules()
        if installed and top and top not in installed:
            self.add(line, "import machinery",
                     f"imports {top!r}, which is not installed here (a module the notebook wrote?)")

    # -- visitors: names and attributes
    def visit_Name(self, node: ast.Name) -> None:
        if not isinstance(node.ctx, ast.Load):
            self.bind(node.id, None)
            if self.depth == 0 and self.class_depth == 0 and not _in_comprehension(node):
                self.check_shadowing(node.id, node.lineno)
            return
        known, path = self.lookup(node.id)
        if known:
            if path:
                self.check_path(path, node.lineno)
            return
        if node.id in _HISTORY_NAMES or _HISTORY_RE.match(node.id):
            self.add(node.lineno, "kernel machinery", f"the kernel's history ({node.id})")
        elif node.id == "__builtins__":
            self.add(node.lineno, "patching", "the builtins namespace (__builtins__)")
        elif node.id == "__import__":
            if not getattr(node, "_called", False):  # __import__("x") is judged as `import x`
                self.add(node.lineno, "import machinery", "__import__ used as a value")
        elif node.id in _DYNAMIC_BUILTINS:
            self.add(node.lineno, "code from strings", node.id)
        elif node.id == "get_ipython":
            self.add(node.lineno, "kernel machinery", "get_ipython")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        write = isinstance(node.ctx, (ast.Store, ast.Del))
        path = self.resolve(node)
        if path:
            self.check_path(path, node.lineno, write=write)
        if not getattr(node, "_own_setattr", False):
            self.check_attr(node.attr, node.lineno)
        if write:
            self.check_write_target(node.value, node.attr, node.lineno,
                                    "deletes" if isinstance(node.ctx, ast.Del) else "sets")
        self.visit(node.value)

    def visit_Constant(self, node: ast.Constant) -> None:
        value = node.value
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        if not isinstance(value, str):
            return
        if _PROC_MEM.search(value):
            self.add(node.lineno, "native code", "a /proc/<pid>/mem path")
        if any(name in value for name in _AGENT_NAMES):
            self.add(node.lineno, "kernel machinery", "the name of the grader's agent")
        if getattr(node, "_attr_name", False):
            return  # the name in getattr(x, "name"): judged as the attribute it names
        if _names_flagged(value, DISTINCTIVE_NAMES) or ("." in value and self.path_flagged(value.strip())):
            self.add(node.lineno, "obfuscation", f"the string {value.strip()!r} names a flagged construct")

    def path_flagged(self, path: str) -> bool:
        """Whether check_path would flag this dotted name ('sys.modules' in a string)."""
        if not _names_flagged(path, SENSITIVE_NAMES | {p.split(".")[0] for p in _IMPORT_PATHS | _HOOK_PATHS
                                                       | _LATER_PATHS | _NATIVE_PATHS | _DYNAMIC_PATHS}):
            return False
        hits: list[str] = []
        add, self.add = self.add, lambda *args: hits.append(args[1])
        try:
            self.check_path(path, 0)
        finally:
            self.add = add
        return bool(hits)

    def _built(self, node: ast.AST) -> bool:
        text = _fold(node, self.consts)
        if text is not None and _names_flagged(text, SENSITIVE_NAMES):
            self.add(node.lineno, "obfuscation", f"a name built from pieces ({text.strip()!r})")
            return True
        return False

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if not self._built(node):
            self.generic_visit(node)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        if not self._built(node):
            self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if not self._built(node):
            self.generic_visit(node)

    # -- visitors: assignments
    def visit_Assign(self, node: ast.Assign) -> None:
        if isinstance(node.value, ast.Lambda) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            self.pending_name = node.targets[0].id
        self.visit(node.value)
        self.pending_name = None
        path = self.resolve(node.value)
        text = _fold(node.value, self.consts)
        origin = path or self.origin(node.value)
        for target in node.targets:
            self.check_namespace_write(target, node.lineno)
            self.visit(target)
            self.bind_origin(target, node.value, origin)
            if isinstance(target, ast.Name):
                if path:
                    self.bind(target.id, path)
                if text is not None:
                    self.consts[target.id] = text
                if self.is_namespace(node.value):
                    self.namespace_names.add(target.id)
                if isinstance(node.value, ast.Lambda):
                    self.functions.add(target.id)
                if self.class_depth and self.depth == 0 and target.id in _POSING:
                    self.add(node.lineno, "patching", f"a class that poses as another type ({target.id})")

    def bind_origin(self, target: ast.AST, value: ast.AST | None, origin: str | None) -> None:
        """What a target may hold after `target = value` (or a loop over value)."""
        if isinstance(target, (ast.Tuple, ast.List)):
            if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts) and not any(
                    isinstance(e, ast.Starred) for e in target.elts + value.elts):
                for t, v in zip(target.elts, value.elts):
                    self.bind_origin(t, v, self.origin(v))
            else:
                for t in target.elts:
                    self.bind_origin(t, None, origin)
            return
        if isinstance(target, ast.Starred):
            self.bind_origin(target.value, None, origin)
            return
        if not origin:
            return
        if isinstance(target, ast.Name):
            self.set_origin(target.id, origin)
        elif isinstance(target, ast.Attribute) and _dotted_name(target) and not self.resolve(target.value):
            self.set_origin(_dotted_name(target), origin)  # holder.mod = torch
        elif isinstance(target, ast.Subscript) and _dotted_name(target.value) and not self.resolve(target.value):
            self.set_origin(_dotted_name(target.value), origin)  # box[0] = torch

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        self.visit(node.iter)
        origin = self.origin(node.iter)
        self.visit(node.target)
        self.bind_origin(node.target, None, origin)
        for stmt in node.body + node.orelse:
            self.visit(stmt)

    visit_AsyncFor = visit_For

    def visit_comprehension(self, node: ast.comprehension) -> None:
        self.visit(node.iter)
        origin = self.origin(node.iter)
        self.visit(node.target)
        self.bind_origin(node.target, None, origin)
        for cond in node.ifs:
            self.visit(cond)

    def visit_With(self, node: ast.With | ast.AsyncWith) -> None:
        if self.depth == 0 and self.class_depth == 0:
            # A patch in a top-level `with` is undone when the block ends, before any test runs.
            self.scoped_patches |= {id(item.context_expr) for item in node.items}
        for item in node.items:
            self.visit(item.context_expr)
            if item.optional_vars is not None:
                self.visit(item.optional_vars)
                self.bind_origin(item.optional_vars, None, self.origin(item.context_expr))
        for stmt in node.body:
            self.visit(stmt)

    visit_AsyncWith = visit_With

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.check_namespace_write(node.target, node.lineno)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.check_namespace_write(node.target, node.lineno)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self.check_namespace_write(target, node.lineno)
        self.generic_visit(node)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.generic_visit(node)
        path = self.resolve(node.value)
        if path:
            self.bind(node.target.id, path)
        else:
            self.set_origin(node.target.id, self.origin(node.value))

    def visit_Global(self, node: ast.Global) -> None:
        for name in node.names:
            self.check_shadowing(name, node.lineno)

    # -- visitors: calls
    def visit_Call(self, node: ast.Call) -> None:
        line = node.lineno
        func_path = self.resolve(node.func) or ""
        if func_path in ("builtins.getattr", "builtins.setattr", "builtins.delattr", "builtins.hasattr"):
            self.check_attr_call(node, func_path.split(".")[1])
        elif func_path in ("builtins.__import__", "importlib.import_module"):
            module = _fold(node.args[0], self.consts) if node.args else None
            if module is None:
                self.add(line, "obfuscation", f"{func_path.split('.')[-1]} of a computed name")
            else:
                if not isinstance(node.args[0], ast.Constant):
                    self.add(line, "obfuscation", f"a module name built from pieces ({module!r})")
                self.check_import(module, line)
        elif func_path in ("builtins.exec", "builtins.eval", "builtins.compile") and node.args:
            if _fold(node.args[0], self.consts) is None:
                self.add(line, "obfuscation", f"{func_path.split('.')[1]} of code built or decoded at run time")
        elif func_path in _TIMERS or func_path.endswith("benchmark.Timer"):
            for arg in list(node.args[:2]) + [k.value for k in node.keywords if k.arg in ("stmt", "setup")]:
                self.review_code_string(arg, line, "a timed statement")
        elif func_path.startswith("operator.") and func_path.split(".")[-1] in ("attrgetter", "methodcaller"):
            for arg in node.args[:1] if func_path.endswith("methodcaller") else node.args:
                text = _fold(arg, self.consts)
                if text is None:
                    self.add(line, "obfuscation", f"{func_path} of a computed name")
                else:
                    for part in text.split("."):
                        self.check_attr(part, line)
        elif func_path in ("functools.reduce", "builtins.map"):
            if any(self.resolve(a) == "builtins.getattr" for a in node.args) and any(
                    self.is_module_path(self.resolve(a)) or (self.resolve(a) or "") == "builtins"
                    for a in node.args):
                self.add(line, "obfuscation", "getattr applied to a module through reduce/map")
        if self.own_setattr(node):
            # A frozen dataclass's own field, set in its __init__/__post_init__: the standard
            # idiom (the dataclasses docs), not obfuscation.
            node.func._own_setattr = True
        if isinstance(node.func, ast.Attribute):
            method, owner = node.func.attr, node.func.value
            if method in _WRITE_METHODS and self.is_namespace(owner):
                self.add(line, "patching", f"writes to a namespace (.{method})")
            if method in _SYS_PATH_WRITES and self.resolve(owner) == "sys.path":
                self.add(line, "import machinery", f"sys.path.{method}")
            if method in _STORE_METHODS:  # a library's module or class put in a container
                stored = next((o for o in map(self.origin, node.args + [k.value for k in node.keywords]) if o), None)
                name = _dotted_name(owner)
                if stored and name and not self.resolve(owner):
                    self.set_origin(name, stored)
            if method == "register":
                self.check_register(node, owner)
        if func_path in _LOOKUPS and node.args:
            name = _fold(node.args[0], self.consts)
            if name is None:
                self.add(line, "obfuscation", f"{func_path} of a computed name")
            else:
                self.check_path(name, line)
        patcher = self.patcher(func_path)
        if patcher and id(node) not in self.scoped_patches:
            self.check_patch(node, patcher)
        if func_path in ("builtins.type", "types.new_class") and len(node.args) >= 2:
            self.check_built_class(node)
        called = self.called(node)
        if called:
            summary, args = called
            func = node.args[0] if func_path == "functools.partial" and node.args else node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "a function")
            for param, arg in args:
                attrs = summary.writes.get(param)
                if attrs:
                    self.check_writes_through(self.origin(arg), sorted(attrs, key=str), line,
                                              f"{name}() is handed it and sets")
        self.generic_visit(node)

    @staticmethod
    def patcher(func_path: str) -> str | None:
        """'patch.object' for unittest.mock.patch.object (or the `mock` package's)."""
        for prefix in ("unittest.mock.", "mock."):
            if func_path.startswith(prefix) and func_path[len(prefix):] in _MOCK_PATCHERS:
                return func_path[len(prefix):]
        return None

    def check_patch(self, node: ast.Call, patcher: str) -> None:
        """unittest.mock replacing an attribute of what the student did not define, for longer
        than a top-level `with` block (started, a decorator, inside a function a test calls)."""
        line = node.lineno
        target = node.args[0] if node.args else next(
            (k.value for k in node.keywords if k.arg in ("target", "in_dict")), None)
        if target is None:
            return
        text = _fold(target, self.consts)
        if isinstance(target, (ast.Constant, ast.JoinedStr, ast.BinOp)) or text is not None:
            if text is None:
                self.add(line, "patching", f"mock.{patcher} of a computed target")
            elif text != "os.environ":
                self.add(line, "patching", f"mock.{patcher}({text!r}) replaces a library's attribute")
            return
        attr = _fold(node.args[1], self.consts) if patcher == "patch.object" and len(node.args) > 1 else None
        if patcher == "patch.multiple":
            attrs = [k.arg for k in node.keywords if k.arg] or [None]
        else:
            attrs = [attr]
        origin = self.origin(target)
        if origin == "os.environ":
            return
        if origin:
            self.check_writes_through(origin, attrs, line, f"mock.{patcher} replaces")
        elif patcher == "patch.dict" and self.is_namespace(target):
            self.add(line, "patching", "mock.patch.dict of a namespace")
        elif isinstance(target, ast.Name) and target.id in self.context.course_defs:
            self.add(line, "patching", f"mock.{patcher} replaces an attribute of {target.id} (the course's)")
        elif isinstance(target, ast.Name) and target.id in self.context.tensor_classes:
            self.add(line, "patching", f"mock.{patcher} replaces an attribute of {target.id} (a tensor type)")
        elif isinstance(target, ast.Call) and isinstance(target.func, ast.Name) and target.func.id == "type":
            self.add(line, "patching", f"mock.{patcher} replaces an attribute of type(...) (the class of an object)")

    def check_register(self, node: ast.Call, owner: ast.AST) -> None:
        """`Sequence.register(X)` (a library's ABC told X is one), `ABCMeta.register`, and a
        student's ABC told a library's class is one of it."""
        origin = self.origin(owner)
        if origin == "abc.ABCMeta" or origin == "abc.ABC" or (
                _is_library(origin) and not self.is_module_path(origin) and not origin.startswith("builtins.")):
            self.add(node.lineno, "patching", f"{origin}.register (a library's class told another class is one of it)")
        elif isinstance(owner, ast.Name) and owner.id in self.context.abc_classes:
            registered = next((o for o in map(self.origin, node.args) if _is_library(o)), None)
            if registered:
                self.add(node.lineno, "patching", f"{owner.id}.register({registered}) (a library's class made one of the student's ABC)")

    def tensor_base(self, bases: Iterable[ast.AST]) -> str | None:
        for base in bases:
            origin = self.origin(base)
            if origin in _TENSOR_TYPES:
                return origin
            if isinstance(base, ast.Name) and base.id in self.context.tensor_classes:
                return base.id
        return None

    def check_built_class(self, node: ast.Call) -> None:
        """type(name, bases, namespace) / types.new_class with a tensor or array base."""
        bases = node.args[1]
        base = self.tensor_base(bases.elts if isinstance(bases, (ast.Tuple, ast.List)) else [bases])
        if not base:
            return
        namespace = node.args[2] if len(node.args) > 2 else None
        if isinstance(namespace, ast.Dict) and node.func and self.resolve(node.func) == "builtins.type":
            names = [_fold(k, self.consts) for k in namespace.keys if k is not None]
            found = [n for n in names if n in _TENSOR_PROTOCOLS or n in _TENSOR_OBSERVED]
            if not found and all(n is not None for n in names) and all(k is not None for k in namespace.keys):
                return
            what = ", ".join(n for n in found if n) or "a computed namespace"
        else:
            what = "a computed namespace"
        self.add(node.lineno, "patching", f"a subclass of {base} that answers for it ({what})")

    def own_setattr(self, node: ast.Call) -> bool:
        """`object.__setattr__(self, "field", value)` in a method of the student's own class, on
        its own instance, with a plain field name (not a dunder): how a frozen dataclass sets a
        field. Anything else spelt with __setattr__ stays flagged."""
        func = node.func
        me = self.selves[-1] if self.selves else None
        return bool(
            me and isinstance(func, ast.Attribute) and func.attr == "__setattr__"
            and self.resolve(func.value) == "builtins.object" and len(node.args) == 3 and not node.keywords
            and isinstance(node.args[0], ast.Name) and node.args[0].id == me
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
            and not node.args[1].value.startswith("__"))

    def check_attr_call(self, node: ast.Call, kind: str) -> None:
        """getattr / setattr / delattr / hasattr: a literal name is judged as the attribute it
        names; a computed one on a module or the builtins is obfuscation."""
        if len(node.args) < 2:
            return
        line = node.lineno
        base, name_node = node.args[0], node.args[1]
        name = _fold(name_node, self.consts)
        base_path = self.resolve(base)
        writes = kind in ("setattr", "delattr")
        how = "sets" if kind == "setattr" else "deletes"
        if name is not None:
            if base_path:
                self.check_path(f"{base_path}.{name}", line, write=writes)
            self.check_attr(name, line)
            if writes:
                self.check_write_target(base, name, line, how)
            return
        if kind == "hasattr":
            return
        if base_path == "torch" and kind == "getattr":
            parent = getattr(node, "_parent", None)
            # Honest: `getattr(torch, kind).is_available()`, and the availability check of a
            # device module with a default, `getattr(torch, device.type, None)` (issue 32).
            honest = (isinstance(parent, ast.Attribute) and parent.attr in _DEVICE_API) or len(node.args) == 3 \
                or (isinstance(name_node, ast.Attribute) and name_node.attr == "type")
            if not honest:
                self.add(line, "obfuscation", "getattr(torch, <computed name>), not used at once for "
                                              "a device module's function")
        elif base_path and (self.is_module_path(base_path) or base_path == "builtins"):
            self.add(line, "obfuscation", f"{kind}({base_path}, <computed name>)")
        elif isinstance(base, ast.Call) and self.resolve(base.func) == "builtins.getattr":
            self.add(line, "obfuscation", f"{kind} of a computed name on what getattr returned")
        elif writes and not base_path and self.origin(base):
            self.check_writes_through(self.origin(base), [None], line, f"{kind} on")
        elif writes:
            if base_path and base_path.startswith("builtins."):
                self.add(line, "patching", f"{kind} on {base_path[len('builtins.'):]} (a builtin)")
            elif base_path:
                self.add(line, "patching", f"{kind} on {base_path} (a class or function of a library)")
            elif isinstance(base, ast.Name) and base.id in self.context.course_defs and not any(
                    base.id in scope for scope in self.scopes):
                self.add(line, "patching", f"{kind} on {base.id} ({base.id} is the course's)")
            elif isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "type":
                self.add(line, "patching", f"{kind} on type(...) (the class of an object)")

    # -- visitors: definitions and scopes
    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if self.class_depth and self.depth == 0:
            if node.name == "__del__":
                self.add(node.lineno, "code that runs later", "a __del__ method")
            elif node.name in ("__reduce__", "__reduce_ex__"):
                self.add(node.lineno, "code from strings", f"a {node.name} method (runs code when unpickled)")
            elif node.name in _POSING:
                self.add(node.lineno, "patching", f"a class that poses as another type ({node.name})")
        if self.depth == 0 and self.class_depth == 0:
            self.check_shadowing(node.name, node.lineno)
        for expr in node.decorator_list + node.args.defaults + [d for d in node.args.kw_defaults if d]:
            self.visit(expr)
        self.bind(node.name, None)
        self.functions.add(node.name)
        # A method's own instance (its first parameter), for object.__setattr__(self, ...) below.
        first = node.args.posonlyargs + node.args.args
        self.selves.append(first[0].arg if self.class_depth and first else None)
        method = bool(self.class_depth and self.depth == 0)
        self.enter_function(node, node.name, method=method)
        outer = self.depth, self.class_depth
        self.depth, self.class_depth = self.depth + 1, 0
        for stmt in node.body:
            self.visit(stmt)
        self.depth, self.class_depth = outer
        self.leave_function()
        self.selves.pop()

    def enter_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, name: str | None,
                       *, method: bool = False) -> None:
        """A scope for the function's parameters, each standing for itself ("@param:..."), or
        for a library's module or class its default names; its summary, for its calls."""
        args = node.args
        positional = [a.arg for a in args.posonlyargs + args.args]
        summary = _Summary(positional, params(node), bound=method)
        ident = str(id(summary))
        self.markers[ident] = summary
        self.funcs.append(summary)
        self.scopes.append({p: None for p in params(node)})
        origins: dict[str, str | None] = {p: f"{_PARAM}{ident}:{p}" for p in params(node)}
        defaults = list(zip(reversed(positional), reversed(args.defaults))) + [
            (a.arg, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
        for param, default in defaults:
            origin = self.origin(default)
            if _is_library(origin):
                origins[param] = origin
        self.origins.append(origins)
        if name and self.collecting:
            decorated = getattr(node, "decorator_list", [])
            static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in decorated)
            if static:
                summary.bound = False
            if method:
                self.context.summaries["." + name] = summary
                cls = getattr(node, "_class_name", None)
                if name == "__init__" and cls:
                    self.context.summaries[cls] = summary
            else:
                self.context.summaries[name] = summary

    def leave_function(self) -> None:
        self.funcs.pop()
        self.scopes.pop()
        self.origins.pop()

    def visit_Return(self, node: ast.Return) -> None:
        self.generic_visit(node)
        self.note_return(node.value)

    def note_return(self, value: ast.AST | None) -> None:
        if not self.funcs or value is None:
            return
        origin = self.origin(value)
        summary = self.funcs[-1]
        if origin and origin.startswith(_PARAM):
            ident, _, name = origin[len(_PARAM):].partition(":")
            if self.markers.get(ident) is summary:
                summary.returns.add(name)
        elif origin:
            summary.returns_origin = origin

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        for expr in node.args.defaults + [d for d in node.args.kw_defaults if d]:
            self.visit(expr)
        name, self.pending_name = self.pending_name, None
        self.enter_function(node, name)
        self.depth += 1
        self.visit(node.body)
        self.note_return(node.body)
        self.depth -= 1
        self.leave_function()

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if self.depth == 0 and self.class_depth == 0:
            self.check_shadowing(node.name, node.lineno)
        for expr in node.bases + [k.value for k in node.keywords] + node.decorator_list:
            self.visit(expr)
        for decorator in node.decorator_list:  # @Sequence.register
            if isinstance(decorator, ast.Attribute) and decorator.attr == "register":
                self.check_register(ast.Call(func=decorator, args=[], keywords=[], lineno=node.lineno), decorator.value)
        bases = [self.origin(b) for b in node.bases]
        metaclass = next((self.origin(k.value) for k in node.keywords if k.arg == "metaclass"), None)
        if "abc.ABC" in bases or metaclass == "abc.ABCMeta" or any(
                isinstance(b, ast.Name) and b.id in self.context.abc_classes for b in node.bases):
            self.context.abc_classes.add(node.name)
        tensor_base = self.tensor_base(node.bases)
        if tensor_base:
            self.context.tensor_classes.add(node.name)
            answers = [n for stmt in node.body for n in _class_body_names(stmt)
                       if n in _TENSOR_PROTOCOLS or n in _TENSOR_OBSERVED]
            if answers:
                self.add(node.lineno, "patching",
                         f"a subclass of {tensor_base} that answers for it ({', '.join(dict.fromkeys(answers))})")
        self.bind(node.name, None)
        self.scopes.append({})
        self.origins.append({})
        outer = self.depth, self.class_depth
        self.depth, self.class_depth = 0, self.class_depth + 1
        for stmt in node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                stmt._class_name = node.name  # type: ignore[attr-defined]
            self.visit(stmt)
        self.depth, self.class_depth = outer
        self.scopes.pop()
        self.origins.pop()


def _class_body_names(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, ast.Assign):
        return [n for t in stmt.targets for n in bound_names(t)]
    if isinstance(stmt, ast.AnnAssign):
        return bound_names(stmt.target)
    return []


def _in_comprehension(node: ast.AST) -> bool:
    """Whether a name is bound by a comprehension (its own scope)."""
    parent = getattr(node, "_parent", None)
    while parent is not None and not isinstance(parent, ast.stmt):
        if isinstance(parent, ast.comprehension):
            return True
        parent = getattr(parent, "_parent", None)
    return False


def _link_parents(tree: ast.AST) -> None:
    """Each node's parent (`_parent`), and the literal name of getattr-like calls marked."""
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            child._parent = parent  # type: ignore[attr-defined]
        if (isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name)
                and parent.func.id in ("getattr", "setattr", "delattr", "hasattr")
                and len(parent.args) >= 2 and isinstance(parent.args[1], ast.Constant)):
            parent.args[1]._attr_name = True  # type: ignore[attr-defined]
        if isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id == "__import__":
            parent.func._called = True  # type: ignore[attr-defined]


def _review_tree(tree: ast.Module, context: _Context, consts: dict[str, str] | None = None,
                 collected: bool = False) -> list[tuple[int, str, str]]:
    details: dict[tuple[int, str], list[str]] = {}

    def add(line: int, construct: str, detail: str) -> None:
        """One finding per line and construct, naming every detail seen there."""
        seen = details.setdefault((line, construct), [])
        if detail in seen or any(d.endswith("." + detail) for d in seen):
            return  # `_getframe` after `sys._getframe`
        seen[:] = [d for d in seen if not detail.endswith("." + d)]  # `sys._getframe` after `_getframe`
        seen.append(detail)

    _link_parents(tree)
    if not collected:  # the cell's own functions and aliases, also for calls before their definitions
        context = context.fork()
        for _ in range(2):
            _Reviewer(context, lambda *args: None, consts, collecting=True).visit(tree)
    _Reviewer(context, add, consts).visit(tree)
    return [(line, construct, ", ".join(found)) for (line, construct), found in details.items()]


# -- a whole cell, IPython syntax included ----------------------------------------------------
def _magic_calls(tree: ast.AST, source: str) -> Iterator[tuple[ast.Call, str]]:
    """IPython's translations of %magic lines: (the call, the magic's name), for lines whose
    text does not itself call get_ipython."""
    lines = source.split("\n")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("run_line_magic", "run_cell_magic")
                and node.args and isinstance(node.args[0], ast.Constant)
                and 0 < node.lineno <= len(lines) and "get_ipython" not in lines[node.lineno - 1]):
            yield node, str(node.args[0].value)


def review_source(source: str, context: _Context | None = None) -> list[tuple[int, str, str]]:
    """(line, construct, detail) for each finding in one cell's source."""
    context = context or _Context(None)
    lines = source.split("\n")
    first = next((i for i, line in enumerate(lines) if line.strip()), 0)
    head = lines[first].strip() if lines else ""
    if head.startswith("%%"):  # a cell magic: its body is code only for %%time and the like
        name = (head[2:].split() or [""])[0]
        if name not in _CODE_CELL_MAGICS:
            return [(first + 1, "kernel machinery", f"the cell magic %%{name}")]
        found = review_source("\n".join(lines[first + 1:]), context)
        return [(line + first + 1, construct, detail) for line, construct, detail in found]
    python = _ipython_to_python(source)
    tree = _parse(python)
    if tree is None:
        return []
    found = []
    generated = set()
    for call, name in _magic_calls(tree, source):
        generated.add(call.lineno)
        if name not in _SAFE_LINE_MAGICS:
            found.append((call.lineno, "kernel machinery", f"the magic %{name}"))
        elif name in _CODE_LINE_MAGICS and len(call.args) > 1 and isinstance(call.args[1], ast.Constant):
            inner = _parse(str(call.args[1].value))
            if inner is not None:
                found += [(call.lineno, construct, f"{detail} (in %{name})")
                          for _, construct, detail in _review_tree(inner, context)]
    for line, construct, detail in _review_tree(tree, context, collected=source in context.collected):
        if line in generated and detail == "get_ipython":
            continue  # IPython's own translation of the magic, judged by its name above
        if 0 < line <= len(lines) and lines[line - 1].lstrip().startswith("!") and detail == "get_ipython":
            continue  # a shell escape (!cmd), which IPython runs as get_ipython().system(...)
        found.append((line, construct, detail))
    return sorted(set(found))


def review_notebook(nb: NotebookNode) -> list[Finding]:
    """Every finding in the notebook's student cells, in cell order."""
    context = _Context(nb)
    return [Finding(cell_label(index, cell), index, line, construct, detail)
            for index, cell in student_cells(nb)
            for line, construct, detail in review_source(cell.source, context)]


# -- where the findings are shown --------------------------------------------------------------
REVIEW_ENAME = "FlaggedForReview"


def annotate(nb: NotebookNode, findings: list[Finding]) -> None:
    """Put each flagged cell's findings first among its outputs (an error output named
    FlaggedForReview), where the instructor reads the graded notebook and its feedback. Only
    student cells are annotated, and none of them is scored from its outputs."""
    from nbformat import v4

    by_cell: dict[int, list[Finding]] = {}
    for finding in findings:
        by_cell.setdefault(finding.cell_index, []).append(finding)
    for index, found in by_cell.items():
        cell = nb.cells[index]
        summary = "; ".join(f"line {f.line}: {f.detail} ({f.construct})" for f in found)
        note = v4.new_output(
            "error", ename=REVIEW_ENAME,
            evalue=f"flagged for a human review, the score is unchanged: {summary}",
            traceback=[f"{REVIEW_ENAME}: this cell uses code that no answer needs; an instructor "
                       "will read it. The score is computed as usual."]
                      + [f"  line {f.line}: {f.detail} ({f.construct}: {CONSTRUCTS[f.construct]})"
                         for f in found])
        cell.outputs = [note] + list(cell.get("outputs", []))
