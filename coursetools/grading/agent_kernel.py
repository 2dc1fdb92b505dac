"""The kernel's side of remote grading: run what the grader asks, report plain data.

Sent to the kernel as source by coursetools.grading.remote (never imported there from the
course folder, which the sandbox hides). It knows no test: the grader runs every test in its
own process and asks this agent, one operation at a time, to look up a name, get or set an
attribute, call a function, iterate, compare, enter or leave a context manager. Each
answer is plain data (JSON): numbers, strings, devices, dtypes, shapes, containers of
them, an exception as its type names and message, and for any other object a numbered
reference the grader can ask about next. No object crosses as an object.

Transport: the grader sends one execute request per test cell, whose code calls
`serve()`; the agent then reads operations with `input()` (the kernel protocol's stdin
channel) and writes each answer as the prompt of the next `input()`. A function of the
grader's that the student's code must call (a factory, a hook) arrives as a stub: calling it
sends a `callback` answer, and the agent serves the grader's operations until the grader
says `return` or `raise`.

Tensor and array observations (device, dtype, shape, is_meta, the values of a comparison) are
read with accessors captured at install, before any student cell ran; a subclass defined
outside the libraries and the locked helpers cell is refused (ForeignTensorError).

Student code can replace anything here: such tampering can only change what the grader
observes, never what it expects (hidden tests, their expected values and their messages never
reach the kernel), and the static review flags code that reaches for this agent.
"""

import builtins as _builtins
import json as _json
import operator as _operator
import sys as _sys

_MAX_TEXT = 200_000  # characters of one string answer
_MAX_ITEMS = 10_000  # items of one container answer
_BUILTINS = {name: getattr(_builtins, name) for name in (
    "len", "iter", "next", "repr", "str", "format", "bool", "hash", "int", "float", "complex",
    "isinstance", "issubclass", "list", "tuple", "dict", "set", "sorted", "dir", "type",
    "callable", "hasattr", "getattr", "abs", "round", "min", "max", "sum", "any", "all",
    "reversed", "enumerate", "zip", "id", "vars", "divmod", "pow")}
_OPERATORS = {name for name in dir(_operator) if not name.startswith("_")}
# The builtins this code calls, bound here when the agent is installed (before any student code):
# a student's `builtins.isinstance = ...` changes what the student's code sees, not the agent.
globals().update({name: getattr(_builtins, name) for name in (
    "isinstance", "issubclass", "type", "getattr", "setattr", "delattr", "hasattr", "str", "int",
    "float", "bool", "len", "list", "tuple", "dict", "set", "frozenset", "repr", "id", "iter",
    "next", "abs", "slice", "bytes", "range", "super", "BaseException", "Exception", "ValueError",
    "TypeError", "KeyError", "NameError", "KeyboardInterrupt", "SystemExit", "object", "vars")})
_type = type
_issubclass = issubclass

# Observations of a tensor or an array that the grader reads through the library's own
# accessors, taken when the agent was installed (before any student code ran): a property or
# method that student code later sets on torch.Tensor or np.ndarray (a patch, mock.patch.object)
# answers none of them.
_TENSOR_OBSERVED = frozenset({
    "device", "dtype", "shape", "is_meta", "is_cuda", "requires_grad", "is_leaf", "grad", "layout",
    "ndim", "size", "dim", "numel", "stride", "data_ptr", "untyped_storage", "storage_offset",
    "is_contiguous", "get_device", "element_size", "nbytes", "itemsize", "is_floating_point",
    "is_complex", "is_pinned", "detach", "cpu", "tolist", "float", "to", "numpy", "clone", "item"})
_ARRAY_OBSERVED = frozenset({"shape", "dtype", "ndim", "size", "strides", "base", "nbytes", "itemsize",
                             "flags", "tolist", "copy"})
_LIB = {}  # what the agent captured of torch and numpy at install
# The library modules a test names (torch, nn, F, np): their attributes as they were at install,
# so a test's `torch.ones`, `torch.Tensor`, `nn.Parameter` or `np.ndarray` is the library's own
# even where the student's code has rebound the module's attribute (or sys.modules' entry).
_CAPTURED_MODULES = ("torch", "torch.nn", "torch.nn.functional", "torch.testing", "numpy")


def _capture_libraries():
    try:
        import torch
    except ImportError:
        torch = None
    try:
        import numpy
    except ImportError:
        numpy = None
    if torch is not None:
        accessors = {}
        for klass in reversed(torch.Tensor.__mro__):
            accessors.update(vars(klass))
        _LIB["torch"] = torch
        _LIB["Tensor"] = torch.Tensor
        _LIB["tensor_types"] = {torch.Tensor, torch.nn.Parameter}
        _LIB["tensor_accessors"] = {n: accessors[n] for n in _TENSOR_OBSERVED if n in accessors}
        _LIB["make_subclass"] = torch.Tensor._make_subclass
        # torch's names as they were at install (torch.Tensor, torch.device, torch.tensor, ...):
        # what the agent itself uses of torch, whatever the student's code rebinds later.
        _LIB["T"] = type("CapturedTorch", (), dict(vars(torch)))
    _LIB["modules"], _LIB["module_attrs"] = {}, {}
    for name in _CAPTURED_MODULES:
        module = _sys.modules.get(name)
        if module is not None:
            _LIB["modules"][name] = module
            _LIB["module_attrs"][name] = dict(vars(module))
    if numpy is not None:
        _LIB["numpy"] = numpy
        _LIB["ndarray"] = numpy.ndarray
        _LIB["array_accessors"] = {n: vars(numpy.ndarray)[n] for n in _ARRAY_OBSERVED if n in vars(numpy.ndarray)}


def _library_class(klass, prefix):
    """Whether `klass` is a class of the library named `prefix` (torch, numpy), found where its
    module says: a class a notebook defines is not, whatever it calls itself."""
    module = str(getattr(klass, "__module__", ""))
    if module != prefix and not module.startswith(prefix + "."):
        return False
    found = _sys.modules.get(module)
    for part in str(getattr(klass, "__qualname__", "")).split("."):
        found = getattr(found, part, None)
    return found is klass


class ForeignTensorError(TypeError):
    """A value of a class the course never makes, where the grader expects a tensor or an array."""


def _tensor_kind(value):
    """'tensor' or 'array' for a tensor or array of the library (or of the course's helpers),
    'foreign' for a subclass defined elsewhere, None for anything else."""
    klass = _type(value)
    tensor = _LIB.get("Tensor")
    if tensor is not None and _issubclass(klass, tensor):
        if klass in _LIB["tensor_types"] or _library_class(klass, "torch"):
            return "tensor"
        return "foreign"
    array = _LIB.get("ndarray")
    if array is not None and _issubclass(klass, array):
        return "array" if klass is array or _library_class(klass, "numpy") else "foreign"
    return None


def _foreign(value):
    klass = _type(value)
    base = "torch.Tensor" if _LIB.get("Tensor") is not None and _issubclass(klass, _LIB["Tensor"]) \
        else "numpy.ndarray"
    return ForeignTensorError(
        f"got an object of class {klass.__name__}, a subclass of {base} defined outside PyTorch, "
        "NumPy and the course's helpers: the grader does not take it as a tensor or an array")


def _observe(value, name):
    """The attribute `name` of a tensor or array, by the library's own accessor; a missing
    value when the library's accessors do not cover it."""
    kind = _tensor_kind(value)
    if kind is None:
        return _MISSING
    if kind == "foreign":
        raise _foreign(value)
    table = _LIB.get("tensor_accessors" if kind == "tensor" else "array_accessors", {})
    accessor = table.get(name)
    if accessor is None:
        return _MISSING
    return accessor.__get__(value, _type(value)) if hasattr(accessor, "__get__") else accessor


_MISSING = object()


class _GraderIterator:
    """A generator of the grader's: each item is asked for when the kernel's code wants it."""

    def __init__(self, next_item):
        self.next_item = next_item

    def __iter__(self):
        return self

    def __next__(self):
        return self.next_item()


class _StandIn:
    """An object of the grader's (a sentinel) as the kernel sees it."""


class _Held:
    def __init__(self, value):
        self.value = value


class Agent:
    def __init__(self, namespace):
        self.ns = namespace
        self.refs = {}
        self.ids = {}
        self.next_ref = 1
        self.stubs = {}
        self.input = None
        self.sequence = 0

    # -- encoding (kernel -> grader) ---------------------------------------------------------
    def ref(self, value):
        key = id(value)
        found = self.ids.get(key)
        if found is not None and self.refs.get(found) is value:
            return found
        number = self.next_ref
        self.next_ref += 1
        self.refs[number] = value
        self.ids[key] = number
        return number

    def kind(self, value):
        torch = _LIB.get("T")
        kind = type(value)
        if kind in (list, dict, set, frozenset):
            return kind.__name__
        for base in (dict, list, set, frozenset):  # OrderedDict, defaultdict, Counter, ...
            if isinstance(value, base) and issubclass(kind, base):
                return base.__name__
        if torch is not None:
            if isinstance(value, torch.Tensor):
                return "tensor" if _tensor_kind(value) == "tensor" else "object"
        if isinstance(value, type(_sys)):
            return "module"
        if isinstance(value, type):
            return "class"
        return "object"

    def enc(self, value, depth=0):
        if type(value) is _Held:
            value = value.value
            return {"$": "ref", "id": self.ref(value), "kind": "object", "type": type(value).__name__}
        kind = type(value)
        if value is None or kind is bool:
            return value
        if kind is not str and isinstance(value, str) and kind.__module__ != "builtins":
            # A str subclass (a `str` Enum): its characters, read by str's own slot, so a
            # subclass's __eq__ or __str__ decides nothing.
            value, kind = str.__getitem__(value, slice(None)), str
        elif kind not in (int, bool) and isinstance(value, int) and not isinstance(value, bool) \
                and kind.__module__ != "builtins" and "torch" not in kind.__module__:
            value, kind = int.__index__(value), int
        elif kind is not float and isinstance(value, float) and kind.__module__ != "builtins" \
                and "numpy" not in kind.__module__:
            value, kind = float.__float__(value), float
        if kind is str:
            return value if len(value) <= _MAX_TEXT else value[:_MAX_TEXT] + "[... cut]"
        if kind is int:
            return value if abs(value) < 2 ** 53 else {"$": "int", "v": str(value)}
        if kind is float:
            return value if value == value and value not in (float("inf"), float("-inf")) \
                else {"$": "float", "v": repr(value)}
        if kind is tuple and depth < 8 and len(value) <= _MAX_ITEMS:
            return {"$": "tuple", "v": [self.enc(v, depth + 1) for v in value]}
        if kind is bytes:
            return {"$": "bytes", "v": value[:_MAX_TEXT].hex()}
        if value is Ellipsis:
            return {"$": "ellipsis"}
        if kind is slice:
            return {"$": "slice", "v": [self.enc(value.start), self.enc(value.stop), self.enc(value.step)]}
        torch = _LIB.get("T")
        if torch is not None:
            if kind is torch.device:
                return {"$": "device", "v": str(value)}
            if kind is torch.dtype:
                return {"$": "dtype", "v": str(value).replace("torch.", "")}
            if kind is torch.Size:
                return {"$": "size", "v": [int(v) for v in value]}
        if isinstance(value, type) and issubclass(value, BaseException):
            return {"$": "excclass", "id": self.ref(value), "name": value.__name__,
                    "module": str(getattr(value, "__module__", "")),
                    "mro": [c.__name__ for c in value.__mro__ if c.__module__ == "builtins"]}
        return {"$": "ref", "id": self.ref(value), "kind": self.kind(value),
                "type": type(value).__name__}

    def enc_exc(self, exc):
        kind = type(exc)
        try:
            message = str(exc)
        except BaseException:
            message = "<the exception's message could not be read>"
        args = []
        for a in getattr(exc, "args", ())[:8]:
            args.append(a if type(a) in (str, int, float, bool) or a is None else str(a)[:_MAX_TEXT])
        return {"type": kind.__name__, "module": str(getattr(kind, "__module__", "")),
                "mro": [c.__name__ for c in kind.__mro__ if c.__module__ == "builtins"],
                "message": message[:_MAX_TEXT], "args": args, "id": self.ref(exc),
                "class": self.ref(kind)}

    # -- decoding (grader -> kernel) ---------------------------------------------------------
    def dec(self, value):
        if not isinstance(value, dict):
            if isinstance(value, list):
                return [self.dec(v) for v in value]
            return value
        tag = value.get("$")
        if tag == "ref" or tag == "excclass":
            return self.refs[value["id"]]
        if tag == "tuple":
            return tuple(self.dec(v) for v in value["v"])
        if tag == "list":
            return [self.dec(v) for v in value["v"]]
        if tag == "set":
            return {self.dec(v) for v in value["v"]}
        if tag == "frozenset":
            return frozenset(self.dec(v) for v in value["v"])
        if tag == "dict":
            return {self.dec(k): self.dec(v) for k, v in value["v"]}
        if tag == "int":
            return int(value["v"])
        if tag == "float":
            return float(value["v"])
        if tag == "bytes":
            return bytes.fromhex(value["v"])
        if tag == "ellipsis":
            return Ellipsis
        if tag == "slice":
            return slice(*(self.dec(v) for v in value["v"]))
        if tag == "range":
            return range(*value["v"])
        if tag == "device":
            return _LIB["T"].device(value["v"])
        if tag == "dtype":
            found = vars(_LIB["T"]).get(value["v"])
            if not isinstance(found, _LIB["T"].dtype):
                raise ValueError(f"no dtype torch.{value['v']}")
            return found
        if tag == "size":
            return _LIB["T"].Size(value["v"])
        if tag == "tensor":
            torch = _LIB["T"]
            dtype = vars(torch)[value["dtype"]]
            if value["values"] is None:
                return torch.empty(value["shape"], dtype=dtype, device=value["device"])
            return torch.tensor(value["values"], dtype=dtype).reshape(value["shape"]).to(value["device"])
        if tag == "builtin":
            return getattr(_builtins, value["v"])
        if tag == "iter":
            return _GraderIterator(self.stub(value["id"], "next"))
        if tag == "cb":
            return self.stub(value["id"], value.get("name", "callback"))
        raise ValueError(f"unknown value from the grader: {tag!r}")

    def stub(self, number, name):
        found = self.stubs.get(number)
        if found is not None:
            return found
        agent = self

        def callback(*args, **kwargs):
            return agent.call_back(number, args, kwargs)

        callback.__name__ = callback.__qualname__ = str(name)
        self.stubs[number] = callback
        return callback

    def call_back(self, number, args, kwargs):
        answer = {"callback": {"id": number, "a": [self.enc(a) for a in args],
                               "k": {str(k): self.enc(v) for k, v in kwargs.items()}}}
        while True:
            op = self.receive(answer)
            if op["op"] == "return":
                return self.dec(op["v"])
            if op["op"] == "raise":
                raise self.grader_exception(op)
            answer = self.handle(op)

    def grader_exception(self, op):
        if op.get("id") is not None:
            return self.refs[op["id"]]
        kind = getattr(_builtins, op.get("type", "Exception"), None)
        if not (isinstance(kind, type) and issubclass(kind, BaseException)):
            kind = Exception
        return kind()

    # -- the loop ------------------------------------------------------------------------------
    def fast_input(self):
        """ipykernel's raw_input without its flushes of stdout and stderr and its purge of the
        stdin socket before every request (each a round trip to the kernel's threads): the
        same input_request and input_reply messages, to the same client. None where this
        ipykernel lacks the pieces (then the agent uses input())."""
        try:
            import zmq
            kernel = _sys.modules["IPython"].get_ipython().kernel
            socket, session = kernel.stdin_socket, kernel.session
            ident = kernel._get_shell_context_var(kernel._shell_parent_ident)
            parent = kernel.get_parent("shell")
        except Exception:
            return None

        def ask(prompt):
            session.send(socket, "input_request", {"prompt": prompt, "password": False}, parent, ident=ident)
            while True:
                readable, _, failed = zmq.select([socket], [], [socket], 0.05)
                if readable or failed:
                    _, reply = session.recv(socket)
                    if reply is not None:
                        try:
                            return str(reply["content"]["value"])
                        except Exception:
                            return ""

        return ask

    def receive(self, answer):
        self.sequence += 1
        answer["n"] = self.sequence  # a prompt asked again keeps its number: the grader skips it
        prompt = _json.dumps(answer)
        while True:
            line = self.input(prompt)
            if line.strip():  # an empty reply: the grader did not get the prompt, ask again
                return _json.loads(line)

    def serve(self):
        self.input = self.fast_input() or _builtins.input  # the kernel's stdin, for this request
        answer = {"ready": True}
        while True:
            op = self.receive(answer)
            if op["op"] == "done":
                return
            answer = self.handle(op)

    def handle(self, op):
        try:
            if op["op"] == "materialize":
                return {"ok": {"$": "raw", "v": self.materialize(self.dec(op["o"]))}}
            return {"ok": self.enc(self.perform(op))}
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            return {"raised": self.enc_exc(exc)}

    def perform(self, op):
        kind = op["op"]
        dec = self.dec
        if kind == "lookup":
            return tuple(n for n in op["names"] if n in self.ns)
        if kind == "global":
            try:
                return self.ns[op["name"]]
            except KeyError:
                raise NameError(f"name {op['name']!r} is not defined") from None
        if kind == "hold":  # a value the grader sent, kept here as an object (answered by reference)
            return _Held(dec(op["v"]))
        if kind == "stand_in":
            return _StandIn()
        if kind == "builtin_object":
            return getattr(_builtins, op["name"])
        if kind == "import":
            found = _LIB.get("modules", {}).get(op["name"])
            return found if found is not None else __import__("importlib").import_module(op["name"])
        if kind == "libattr":  # an attribute of a library module, as it was at install
            found = _LIB.get("module_attrs", {}).get(op["m"], {}).get(op["name"], _MISSING)
            if found is not _MISSING:
                return found
            module = _LIB.get("modules", {}).get(op["m"])
            if module is None:
                module = __import__("importlib").import_module(op["m"])
            return getattr(module, op["name"])
        if kind == "getattr":
            obj, name = dec(op["o"]), op["name"]
            if name == "__class__":
                return _type(obj)
            found = _observe(obj, name)
            return getattr(obj, name) if found is _MISSING else found
        if kind == "setattr":
            return setattr(dec(op["o"]), op["name"], dec(op["v"]))
        if kind == "delattr":
            return delattr(dec(op["o"]), op["name"])
        if kind == "call":
            args = [dec(a) for a in op.get("a", [])]
            kwargs = {k: dec(v) for k, v in op.get("k", {}).items()}
            return dec(op["f"])(*args, **kwargs)
        if kind == "operator":
            if op["name"] not in _OPERATORS:
                raise ValueError(f"no operator {op['name']!r}")
            return getattr(_operator, op["name"])(*(dec(a) for a in op["a"]))
        if kind == "builtin" and op["name"] == "isinstance":
            # By the object's real type: a class that claims another through a `__class__`
            # property is not an instance of it.
            obj, cls = dec(op["a"][0]), dec(op["a"][1])
            return issubclass(type(obj), cls)
        if kind == "builtin":
            fn = _BUILTINS[op["name"]]
            return fn(*(dec(a) for a in op.get("a", [])), **{k: dec(v) for k, v in op.get("k", {}).items()})
        if kind == "items":  # the items of a container, in one answer
            value = dec(op["o"])
            items = list(value)
            if len(items) > _MAX_ITEMS:
                raise ValueError(f"more than {_MAX_ITEMS} items")
            return tuple(items)
        if kind == "enter":
            manager = dec(op["o"])
            return type(manager).__enter__(manager)
        if kind == "exit":
            manager = dec(op["o"])
            exc = dec(op["e"]) if op.get("e") is not None else None
            return type(manager).__exit__(manager, type(exc) if exc is not None else None, exc,
                                          exc.__traceback__ if exc is not None else None)
        if kind == "super":
            return getattr(super(dec(op["cls"]), dec(op["self"])), op["name"])
        if kind == "mkclass":
            namespace = {k: dec(v) for k, v in op["attrs"].items()}
            for name, number in op["methods"].items():
                namespace[name] = self.stub(number, name)
            namespace["__module__"] = "__main__"
            namespace["__qualname__"] = op["name"]
            bases = tuple(dec(b) for b in op["bases"])
            return type(bases[0] if bases else object)(op["name"], bases, namespace)
        if kind == "forget":
            for number in op["ids"]:
                value = self.refs.pop(number, None)
                if value is not None and self.ids.get(id(value)) == number:
                    del self.ids[id(value)]
            return None
        raise ValueError(f"unknown operation {kind!r}")

    def materialize(self, value):
        """A copy of a tensor's or an array's values, read by the accessors captured at install."""
        kind = _tensor_kind(value)
        numpy = _LIB.get("numpy")
        if kind is None and numpy is not None and isinstance(value, numpy.generic) \
                and _library_class(_type(value), "numpy"):
            value, kind = numpy.asarray(value), "array"  # a NumPy scalar (np.float32(1.0))
        if kind == "foreign":
            raise _foreign(value)
        if kind is None:
            return {"other": True}
        if kind == "array":
            get = lambda name: _observe(value, name)
            if get("size") > 5_000_000:
                raise ValueError("array too large to compare")
            dtype = get("dtype")
            if dtype.kind not in "biufc":
                raise TypeError(f"an array of dtype {dtype} cannot be compared by the grader")
            values = get("tolist")()
            if dtype.kind == "c":
                values = _json.loads(_json.dumps(values, default=lambda z: [z.real, z.imag]))
            return {"array": True, "dtype": str(dtype), "shape": [int(s) for s in get("shape")],
                    "values": values}
        torch = _LIB["torch"]
        get = lambda t, name: _observe(t, name)
        plain = get(value, "detach")()
        if _type(plain) not in _LIB["tensor_types"]:
            plain = _LIB["make_subclass"](_LIB["Tensor"], plain)
        if get(plain, "numel")() > 5_000_000:
            raise ValueError("tensor too large to compare")
        device = get(plain, "device")
        dtype = get(plain, "dtype")
        values = None
        if device.type != "meta":
            cpu = get(plain, "to")("cpu")
            values = get(get(cpu, "float")() if dtype == torch.bfloat16 else cpu, "tolist")()
        return {"dtype": str(dtype).replace("torch.", ""), "shape": [int(s) for s in get(plain, "shape")],
                "device": str(device), "values": values, "requires_grad": bool(get(value, "requires_grad")),
                "layout": str(get(plain, "layout"))}

def install(namespace, trusted_cells=(), name="__course_agent__"):
    """`trusted_cells`: the sha256 of each of the notebook's locked helpers cells. A tensor class
    such a cell defines (02's StandInAccelTensor) is the course's: recorded when that cell has run,
    before any cell after it, so a class a student cell defines later under its name is not."""
    _capture_libraries()
    agent = Agent(namespace)
    if trusted_cells and "tensor_types" in _LIB:
        import hashlib

        def after_cell(result):
            raw = getattr(getattr(result, "info", None), "raw_cell", None) or ""
            if hashlib.sha256(raw.encode()).hexdigest() not in trusted_cells:
                return
            for value in list(namespace.values()):
                if isinstance(value, _type) and _issubclass(value, _LIB["Tensor"]) \
                        and str(getattr(value, "__module__", "")) == "__main__":
                    _LIB["tensor_types"].add(value)

        try:
            _sys.modules["IPython"].get_ipython().events.register("post_run_cell", after_cell)
        except Exception:
            pass
    module = type(_sys)(name)
    module.serve = agent.serve
    _sys.modules[name] = module
    return agent
