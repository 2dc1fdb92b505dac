"""The kernel side of the tamper checks (coursetools.grading.guard): this file's source is sent to the
kernel in the grader's first cell, before any student code, and run there in a namespace of
its own with a private copy of the builtins. The kernel never imports it (the sandbox hides
the course folder), and nothing here runs in the grader's own process.

`install()` records, out of the students' reach (in closures):

* every public callable of builtins, torch, torch.nn.functional, torch.testing, torch.cuda,
  ... with its `__code__`, and every attribute of torch.Tensor and torch.nn.Module;
* the machinery that decides, displays and reports a cell's result: the IPython shell, the
  kernel, its session and sockets, the display hook and publisher, the display formatter and
  its formatters, the compiler, events, input and AST transformers, traceback display,
  `sys.stdout/stderr`: every attribute (callable or not, traitlets' values included) of each,
  the attributes of the classes behind them, and the globals of the modules they run
  (`ipykernel.kernelbase.json_clean`, `linecache.cache`, `importlib.util.MAGIC_NUMBER`, ...);
  trace and profile hooks, `gc.callbacks`, signal handlers, PyTorch's mode stacks;

and installs an audit hook (which cannot be removed) that notices, in code from the
student's cells, `__code__` swaps and reads, frame access (`sys._getframe`,
`sys._current_frames`, `f_code`, `tb_frame`, `gi_frame`, ...), trace hooks and garbage-
collector searches, and blocks further audit hooks. It makes the kernel process
non-dumpable (`non_dumpable`), so that a process it starts cannot open its memory.

It then creates a class whose name the grader chose (`guard_name`), holding the four entry
points the grader's cells call: `verify`, `run`, `before_locked` and `after_locked`. The
grader's cells reach it through `().__class__.__base__.__subclasses__()` and a comparison
made with `str.__eq__`: no name is looked up in the notebook's namespace, so no function a
student defines there (`get_ipython`, `globals`, `__import__`, `exec`) runs inside a check.
The class is the oldest of that name, so a later impostor is never picked.

* `verify(where, nonce)` (before and after every test cell) compares all of the above with
  the records, checks that the student's classes do not fake a type (`__class__`, `__eq__`,
  ... on a subclass of str, torch.Tensor, ...: judged by where their code was written, not by
  their `__module__`), and that the cell calling it is the grader's own (an input or AST transformer could rewrite it). It
  answers with an HMAC of the nonce under the key drawn for this submission, or raises.
* `run(filename, lines, blob)` runs a test cell the grader compiled (hidden tests never
  arrive as text), with its visible lines only in `linecache`. Right after the test's code it
  compares the machinery once more, inside the same cell: a patch installed while the test
  ran (a session's `send` that drops the error and rewrites the reply, say) is undone there,
  before the kernel sends its reply, and noted, so the next check fails.
* `before_locked()` / `after_locked()` around each locked cell of the course record the names
  it defines (the helpers the tests use), their insides, and the classes it made.

Test cells may patch things themselves (`unittest.mock`): the checks run between cells and
after the test's own code, when such patches are undone.
"""

# This module runs in the kernel from its source (coursetools.grading.guard.kernel_source): keep it
# self-contained, importing only the standard library, torch and IPython/ipykernel, and only
# inside install().


def install(guard_name, key, grader_files, mark, magic, templates):  # noqa: C901 - one closure
    """Set up the checks (see the module docstring). `grader_files`: the file names of the
    grader's compiled test cells; `mark`: the first line of those cells; `magic`: the grader's
    importlib.util.MAGIC_NUMBER; `templates`: the grader's cells (verify, run, locked) with
    placeholder arguments, compiled here to recognise the real ones."""
    import builtins
    import gc
    import hashlib
    import hmac
    import linecache
    import marshal
    import base64
    import signal
    import sys
    import types
    import importlib.util
    import torch
    import torch.nn
    import torch.nn.functional
    import torch.testing
    import torch.overrides
    import torch.utils._device
    import torch.utils._python_dispatch
    from IPython.core.getipython import get_ipython

    ip = get_ipython()
    user_ns = ip.user_ns
    dumpable = non_dumpable()
    kernel = ip.kernel
    missing = object()
    getframe = sys._getframe
    new_hmac, sha256 = hmac.new, hashlib.sha256
    b64decode, marshal_loads, run_code = base64.b64decode, marshal.loads, builtins.exec
    line_cache = linecache.cache
    same_python = importlib.util.MAGIC_NUMBER == magic
    function_type, code_type = types.FunctionType, types.CodeType

    # -- what is compared ------------------------------------------------------------------
    spaces = {"builtins": builtins, "torch": torch, "torch.Tensor": torch.Tensor,
              "torch.nn.Module": torch.nn.Module, "torch.nn.functional": torch.nn.functional,
              "torch.testing": torch.testing, "torch.cuda": torch.cuda,
              "torch.backends.mps": torch.backends.mps, "sys": sys}
    if hasattr(torch, "accelerator"):
        spaces["torch.accelerator"] = torch.accelerator
    for extra in ("inspect", "ast", "codeop", "unittest.mock", "warnings", "traceback"):
        if extra in sys.modules:
            spaces[extra] = sys.modules[extra]
    volatile_sys = {"input", "raw_input", "getpass",  # ipykernel swaps these per request
                    "excepthook",  # IPython swaps it in for each cell
                    "last_type", "last_value", "last_traceback", "last_exc", "exc_info",
                    "ps1", "ps2", "stdin"}
    class_caches = {"__slotnames__", "_abc_impl", "__weakref__"}

    def code_of(v):
        return v.__code__ if isinstance(v, function_type) else None

    def watched(space):
        out = {}
        for k, v in list(vars(space).items()):
            if isinstance(v, types.ModuleType):
                continue
            if isinstance(space, type) or (not k.startswith("_") and callable(v)):
                out[k] = (v, code_of(v))
        return out

    def wraps(new, old):
        """torch wraps some of its own functions later (importing torch._dynamo wraps
        torch.manual_seed with functools.wraps): a torch wrapper of the original is fine."""
        seen = 0
        while new is not missing and seen < 5:
            module = getattr(new, "__module__", None) or ""
            if not (module == "torch" or module.startswith("torch.")):
                return False
            new, seen = getattr(new, "__wrapped__", missing), seen + 1
            if new is old:
                return True
        return False

    # The objects that decide, display and report a cell's result, and their modules.
    def machinery_objects():
        objects = {"shell": ip, "kernel": kernel, "session": kernel.session, "compiler": ip.compile,
                   "displayhook": ip.displayhook, "display_pub": ip.display_pub,
                   "display_formatter": ip.display_formatter, "events": ip.events,
                   "input_transformer_manager": ip.input_transformer_manager,
                   "InteractiveTB": ip.InteractiveTB, "SyntaxTB": ip.SyntaxTB,
                   "stdout": sys.stdout, "stderr": sys.stderr, "sys.displayhook": sys.displayhook}
        for mime, formatter in list(ip.display_formatter.formatters.items()):
            objects[f"formatter[{mime}]"] = formatter
        for name in ("iopub_socket", "iopub_thread", "shell_stream", "control_stream"):
            value = getattr(kernel, name, None)
            if value is not None:
                objects[f"kernel.{name}"] = value
        for name in ("session", "pub_socket", "pub_thread"):
            for owner in ("displayhook", "display_pub", "stdout", "stderr"):
                value = getattr(objects[owner], name, None)
                if value is not None and not isinstance(value, (str, bytes, int, bool)):
                    objects.setdefault(f"{owner}.{name}", value)
        return objects

    fresh_objects = machinery_objects()
    protocol_modules = [name for name in (
        "ipykernel.kernelbase", "ipykernel.ipkernel", "ipykernel.zmqshell", "ipykernel.iostream",
        "ipykernel.displayhook", "ipykernel.jsonutil", "ipykernel.comm", "jupyter_client.session",
        "jupyter_client.jsonutil", "IPython.core.interactiveshell", "IPython.core.displayhook",
        "IPython.core.displaypub", "IPython.core.formatters", "IPython.core.compilerop",
        "IPython.core.ultratb", "IPython.core.events", "IPython.core.getipython",
        "IPython.core.display_functions", "linecache", "importlib", "importlib.util",
        "importlib._bootstrap", "importlib._bootstrap_external", "marshal", "base64", "hmac",
        "hashlib", "traceback", "codeop", "json", "zmq.sugar.socket", "zmq.eventloop.zmqstream")
        if name in sys.modules]
    # Attributes that change as an honest kernel runs cells (counters, the current request,
    # caches), measured on the course's solutions: not compared.
    volatile_attrs = {
        "execution_count", "_parent_ident", "_parents", "_shell_parent", "_shell_context",
        "_control_parent", "_control_parent_ident", "_shell_parent_ident", "last_execution_succeeded",
        "last_execution_result", "_last_traceback", "_last_traceback_during_displayhook", "msg",
        "parent_header", "_parent_header", "parent", "_main_mod_cache", "user_ns", "user_ns_hidden",
        "user_module", "user_global_ns", "_buffer", "_buffers", "_subprocess_flush_pending",
        "_flush_pending", "_io_loop", "_new_buffer", "_exc_info", "tb", "_tb_offset",
        "_outstanding_requests", "_execute_sleep", "exit_now", "_cache", "cache", "_filename_map",
        "flags", "_events", "_pending", "_hidden_lock", "_hidden_buf", "aborted",
        "_aborted_time", "_control_queue", "_eventloop_set", "shell_handlers_seen", "_traceback",
        "prompt_count", "_post_execute", "_tb_hidden", "echo", "_last_input_line",
        "_last_traceback_type", "_reply_content", "_start_time", "_time_offset", "_digest_history",
        "digest_history", "message_sent", "message_count", "_last_stdout", "_last_stderr",
        "_master_pid", "_fid", "_is_master_process", "_trait_notifiers", "_trait_validators",
        "_cross_validation_lock", "_subshell_manager", "_stream_dict", "last_exc", "_tee_warning",
        "_pending_exec", "_user_ns", "_parent_header_global", "exec_result", "softspace",
        "write",  # IPython tees sys.stdout/stderr's write into its history during each cell
        "_event_pipes"}  # ipykernel's IOPub thread: one pipe per thread that has printed
    volatile_globals = {"__warningregistry__", "_cache", "_pending_idle", "_cached_magic"}
    volatile_attrs |= {"_", "__", "___"}  # the display hook's last results
    printer_tables = {"type_printers", "deferred_printers", "singleton_printers"}

    # Keys of the records: ("object", label), ("attr", label, name), ("trait", label, name),
    # ("item", label, name, key), ("items", label, name), ("class", class name, name),
    # ("module", module), ("global", module, name), ("list", what).
    def describe(key):
        kind, rest = key[0], key[1:]
        if kind in ("attr", "trait", "class", "global"):
            return ".".join(str(part) for part in rest)
        if kind == "item":
            return f"{rest[0]}.{rest[1]}[{rest[2]!r}]"
        if kind == "items":
            return f"{rest[0]}.{rest[1]}[...]"
        if kind == "object":
            return f"{rest[0]} object"
        if kind == "module":
            return f"sys.modules[{rest[0]!r}]"
        return str(rest[0])

    def object_state(label, obj, state):
        """Every instance attribute and traitlets value of `obj`, and the contents of its
        dicts and lists (one level), kept by identity."""
        values = dict(getattr(obj, "__dict__", None) or {})
        traits = values.pop("_trait_values", None)
        items = [("attr", k, v) for k, v in values.items()]
        items += [("trait", k, v) for k, v in list((traits or {}).items())]
        for kind, name, value in items:
            if name in volatile_attrs:
                continue
            state[(kind, label, name)] = value
            if name in printer_tables:
                continue  # filled lazily by IPython itself: judged by student_printers()
            if type(value) is dict and len(value) < 500:
                for k, v in list(value.items()):
                    state[("item", label, name, k)] = v
            elif type(value) is list and len(value) < 500:
                state[("items", label, name)] = tuple(value)

    def classes_of(obj):
        return [c for c in type(obj).__mro__ if c is not object]

    machinery_classes = {}
    for obj in fresh_objects.values():
        for cls in classes_of(obj):
            machinery_classes[f"{cls.__module__}.{cls.__qualname__}"] = cls

    def protocol_state():
        """What a forged verdict would have to change, kept by identity."""
        state = {}
        for label, obj in machinery_objects().items():
            state[("object", label)] = obj
            object_state(label, obj, state)
        for name, cls in machinery_classes.items():
            for k, v in list(vars(cls).items()):
                if k not in class_caches:
                    state[("class", name, k)] = v
        for name in protocol_modules:
            module = sys.modules.get(name)
            state[("module", name)] = module
            for k, v in list(vars(module).items() if module is not None else ()):
                if k not in volatile_globals:
                    state[("global", name, k)] = v
        for event, callbacks in list(ip.events.callbacks.items()):
            state[("list", f"events[{event!r}]")] = tuple(callbacks)
        state[("list", "ast transformers")] = tuple(ip.ast_transformers)
        state[("list", "input transformers")] = tuple(ip.input_transformers_cleanup)
        state[("list", "input transformers (post)")] = tuple(ip.input_transformers_post)
        itm = ip.input_transformer_manager
        for part in ("cleanup_transforms", "line_transforms", "token_transformers"):
            state[("list", f"input_transformer_manager.{part}")] = tuple(getattr(itm, part, ()))
        state[("list", "custom exception handler")] = (tuple(ip.custom_exceptions), ip.__dict__.get("CustomTB"))
        state[("list", "builtins.compile")] = builtins.compile
        state[("list", "builtins.exec")] = builtins.exec
        state[("list", "shell.user_ns")] = ip.user_ns
        state[("list", "sys.modules['builtins']")] = sys.modules.get("builtins")
        return state

    def hooks_state():
        """Hooks that run code out of turn: trace and profile functions, gc callbacks, signal
        handlers, PyTorch's torch-function and dispatch mode stacks."""
        state = {("list", "trace function"): sys.gettrace(), ("list", "profile function"): sys.getprofile(),
                 ("list", "gc.callbacks"): tuple(gc.callbacks)}
        for number in range(1, getattr(signal, "NSIG", 65)):
            try:
                state[("list", f"signal {number} handler")] = signal.getsignal(number)
            except (ValueError, OSError):
                pass
        state[("list", "PyTorch's torch-function and dispatch modes left entered")] = torch_modes()
        state[("list", "the kernel process's dumpable flag (its memory open to its children)")] = dumpable()
        return state

    device_context = torch.utils._device.DeviceContext

    def torch_modes():
        """The modes on PyTorch's stacks, but the one torch.set_default_device keeps there (a
        DeviceContext: setting the default device is what some answers must do)."""
        modes = []
        for module, getter in (("torch.overrides", "_get_current_function_mode_stack"),
                               ("torch.utils._python_dispatch", "_get_current_dispatch_mode_stack")):
            try:
                modes += list(getattr(sys.modules[module], getter)())
            except (KeyError, AttributeError, RuntimeError):
                pass
        return tuple(m for m in modes if type(m) is not device_context)

    def same(a, b):
        if type(a) is tuple and type(b) is tuple:
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        if type(a) is int and type(b) is int:
            return a == b
        return a is b

    def differences(fresh, now):
        """The keys whose value changed, appeared or went since `fresh`. A traitlets value that
        appears is a default computed on first use, and a module global that appears is, as a
        rule, a submodule imported since (`importlib.readers`): neither is a change. What
        forges a verdict replaces something that was there."""
        changed = [k for k, v in now.items()
                   if (k in fresh and not same(fresh[k], v)) or (k not in fresh and k[0] not in ("trait", "global"))]
        return changed + [k for k in fresh if k not in now]

    def set_or_drop(mapping, name, key, fresh):
        if key in fresh:
            mapping[name] = fresh[key]
        else:
            mapping.pop(name, None)

    def restore(fresh, now):
        """Put back what changed in the protocol machinery (instance attributes, traitlets
        values, dict and list contents, module globals, class attributes, hook lists): the
        running cell's error and reply then go out as the kernel made them."""
        objects = fresh_objects
        lists = {"ast transformers": ip.ast_transformers,
                 "input transformers": ip.input_transformers_cleanup,
                 "input transformers (post)": ip.input_transformers_post}
        lists.update({f"events[{e!r}]": c for e, c in ip.events.callbacks.items()})
        for key in differences(fresh, now):
            kind = key[0]
            try:
                if kind == "attr" and key[1] in objects:
                    set_or_drop(vars(objects[key[1]]), key[2], key, fresh)
                elif kind == "trait" and key[1] in objects:
                    set_or_drop(objects[key[1]]._trait_values, key[2], key, fresh)
                elif kind == "item" and key[1] in objects and key in fresh:
                    # a replaced or removed entry is put back; an added one is left (the kernel
                    # adds entries of its own, e.g. for a new thread that prints)
                    container = fresh.get(("attr", key[1], key[2])) or fresh.get(("trait", key[1], key[2]))
                    if type(container) is dict:
                        container[key[3]] = fresh[key]
                elif kind == "items" and key in fresh:
                    container = fresh.get(("attr", key[1], key[2])) or fresh.get(("trait", key[1], key[2]))
                    if type(container) is list:
                        container[:] = list(fresh[key])
                elif kind == "global" and sys.modules.get(key[1]) is not None:
                    set_or_drop(vars(sys.modules[key[1]]), key[2], key, fresh)
                elif kind == "class" and key[1] in machinery_classes:
                    cls = machinery_classes[key[1]]
                    if key in fresh:
                        type.__setattr__(cls, key[2], fresh[key])
                    else:
                        type.__delattr__(cls, key[2])
                elif kind == "list" and key[1] in lists and key in fresh:
                    lists[key[1]][:] = list(fresh[key])
            except (TypeError, AttributeError, KeyError):
                pass

    # -- student classes that fake a value's type or comparisons ---------------------------
    forgeable = (str, bytes, int, float, complex, tuple, list, dict, set, frozenset, torch.Tensor)
    forging = frozenset({"__class__", "__eq__", "__ne__", "__hash__", "__bool__", "__lt__", "__le__",
               "__gt__", "__ge__", "__getattribute__", "__getattr__", "__instancecheck__",
               "__subclasscheck__", "__torch_function__", "__torch_dispatch__", "__len__",
               "__contains__", "__float__", "__int__", "__index__", "__str__", "__repr__", "__format__"})
    forging_order = tuple(sorted(forging))
    def library_roots():
        """Where library code lives: the installation's prefixes, and every folder of the
        import path the kernel cannot write to (packages on PYTHONPATH, `.pth` additions, an
        editable install), as named and as resolved. A folder it can write to (its working
        folder, /tmp) is not one: a module a student writes there is the student's."""
        import os
        found = {p for p in (sys.prefix, sys.base_prefix, sys.exec_prefix) if p}
        for entry in list(sys.path):
            if entry and os.path.isdir(entry) and not os.access(entry, os.W_OK):
                found.update((os.path.abspath(entry), os.path.realpath(entry)))
        return tuple(sorted(p.rstrip("/") + "/" for p in found))

    roots = library_roots()
    course_files = set()  # cells of the course (locked), recorded around them
    allowed_classes = set()

    def student_file(filename):
        return not (filename.startswith(roots) or filename in grader_files or filename in course_files
                    or filename.startswith("<frozen") or filename == "<grader guard>")

    def functions_in(value):
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if isinstance(value, property):
            return [f for f in (value.fget, value.fset, value.fdel) if f is not None]
        return [value]

    def made_by_student(value, cls):
        for fn in functions_in(value):
            code = code_of(fn)
            if code is None:
                continue
            if code.co_filename == "<string>":  # dataclasses, namedtuple: generated code
                if (getattr(cls, "__module__", None) or "") == "__main__":
                    return True
            elif student_file(code.co_filename):
                return True
        return False

    subclasses = type.__subclasses__

    def all_classes():
        seen, todo, out = set(), [object], []
        while todo:
            cls = todo.pop()
            try:
                subs = subclasses(cls)
            except TypeError:
                continue
            for sub in subs:
                if sub not in seen:
                    seen.add(sub)
                    out.append(sub)
                    todo.append(sub)
        return out

    def candidates():
        found = {}
        for cls in all_classes():
            own = vars(cls)
            if forging.isdisjoint(own) or id(cls) in allowed_classes:
                continue
            names = [k for k in forging_order if k in own]
            posing = issubclass(cls, forgeable) or "__class__" in names or (
                issubclass(cls, type) and ("__instancecheck__" in names or "__subclasscheck__" in names))
            if not posing:
                continue
            made = sorted(k for k in names if made_by_student(own[k], cls)
                          or (k == "__class__" and isinstance(own[k], type)
                              and (getattr(cls, "__module__", None) or "") not in ("builtins",)))
            if made:
                found[id(cls)] = f"class {cls.__qualname__} ({', '.join(made)})"
        return found

    def printers():
        """(table, key, printer) for every printer of every display formatter."""
        for formatter in list(ip.display_formatter.formatters.values()):
            for table in printer_tables:
                for k, printer in list((getattr(formatter, table, None) or {}).items()):
                    yield formatter, table, k, printer

    def student_printers(remove=False):
        """Display printers a student cell registered (they run when a result is shown, the
        check's own answer included)."""
        out = []
        for formatter, table, k, printer in printers():
            if any(student_file(code_of(f).co_filename) for f in functions_in(printer) if code_of(f)):
                out.append(f"a display printer registered by a student cell ({table}[{k!r}])")
                if remove:
                    getattr(formatter, table).pop(k, None)
        return out

    # -- what else the audit hook sees ---------------------------------------------------
    noticed = []
    trusted = ("torch", "IPython", "ipykernel", "jupyter_client", "builtins", "zmq", "traitlets",
               "tornado", "asyncio", "comm", "hmac", "marshal", "base64", "linecache", "numpy")
    frame_attrs = {"f_code", "tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back", "f_globals",
                   "f_locals"}
    busy = [False]
    in_locked = [False]

    def student_frame(depth=2):
        try:
            f = getframe(depth)
        except ValueError:
            return False
        return student_file(f.f_code.co_filename)

    def hook(event, args):
        if busy[0]:
            return
        if event == "sys.addaudithook":
            busy[0] = True
            try:
                if student_frame():
                    noticed.append("an audit hook added (blocked)")
            finally:
                busy[0] = False
            raise RuntimeError("the grader does not allow audit hooks")
        if in_locked[0]:
            return
        if event in ("object.__setattr__", "object.__delattr__", "object.__getattr__", "sys._getframe",
                     "sys._current_frames", "sys.settrace", "sys.setprofile", "gc.get_objects",
                     "gc.get_referrers", "gc.get_referents"):
            busy[0] = True
            try:
                if not student_frame():
                    return
                if event == "object.__getattr__":
                    name = args[1]
                    if name in frame_attrs:
                        noticed.append(f"frame access ({name}) from a student cell")
                    elif name == "__code__":
                        noticed.append(f"{getattr(args[0], '__qualname__', '?')}.__code__ read")
                elif event in ("sys._getframe", "sys._current_frames"):
                    noticed.append(f"frame access ({event}) from a student cell")
                elif event.startswith("gc."):
                    noticed.append(f"{event} called (searching the grader's objects?)")
                elif event in ("sys.settrace", "sys.setprofile"):
                    noticed.append(f"{event} called")
                else:
                    obj, name = args[0], args[1]
                    if name == "__code__":
                        noticed.append(f"{getattr(obj, '__qualname__', '?')}.__code__ replaced")
                    elif isinstance(obj, type) and (
                            getattr(obj, "__module__", "") or "").split(".")[0] in trusted:
                        noticed.append(f"{obj.__module__}.{obj.__qualname__}.{name} set")
            finally:
                busy[0] = False

    sys.addaudithook(hook)

    # -- records -----------------------------------------------------------------------------
    reference = {name: watched(space) for name, space in spaces.items()}
    fresh_protocol = protocol_state()
    fresh_hooks = hooks_state()
    locked_names, locked_insides, pending = {}, {}, {}
    pending_classes, pending_files = set(), set()

    def insides(v):
        """What a helper's behaviour hangs on: a class's attributes, a function's code."""
        if isinstance(v, type):
            return {k: x for k, x in vars(v).items() if k not in class_caches}
        code = code_of(v)
        if code is not None:
            return (code, getattr(v, "__defaults__", None), getattr(v, "__kwdefaults__", None))
        return None

    def space_changes():
        changed = []
        for name, ref in reference.items():
            space = spaces[name]
            now = vars(space)
            for k, (v, code) in ref.items():
                if name == "sys" and k in volatile_sys:
                    continue
                if k in ("input", "raw_input", "getpass"):
                    continue
                current = now.get(k, missing)
                if current is not v and not wraps(current, v):
                    changed.append(f"{name}.{k}")
                elif current is v and code is not None and code_of(v) is not code:
                    changed.append(f"{name}.{k}.__code__")
            if isinstance(space, type):  # a class: an added attribute shadows an inherited one
                for k in now:
                    if k not in ref and k not in class_caches:
                        changed.append(f"{name}.{k} (added)")
        return changed

    def changes():
        changed = space_changes()
        changed += [f"IPython/kernel: {describe(k)}" for k in differences(fresh_protocol, protocol_state())]
        changed += [describe(k) for k in differences(fresh_hooks, hooks_state())]
        for k, v in list(locked_names.items()):
            if user_ns.get(k, missing) is not v:
                changed.append(k)
            elif insides(v) != locked_insides[k]:
                changed.append(f"{k} (modified)")
        changed.extend(candidates().values())
        changed.extend(student_printers())
        changed.extend(noticed)
        return changed

    def shape(code):
        """What identifies the grader's cell code, whatever its string constants."""
        consts = tuple(shape(c) if isinstance(c, code_type) else type(c).__name__ for c in code.co_consts)
        return code.co_code, code.co_names, consts

    expected = {}
    for role, source in templates.items():
        expected[role] = {shape(compile(source, "<grader>", mode, dont_inherit=True))
                          for mode in ("single", "exec")}

    def called_by_grader(role):
        """Whether the cell that called this is the grader's own cell of that kind, unchanged
        (an input or AST transformer of the student's would have rewritten it)."""
        try:
            frame = getframe(2)
        except ValueError:
            return False
        return frame.f_globals is user_ns and shape(frame.f_code) in expected[role]

    def forget_tests():
        for name in list(line_cache):
            entry = line_cache.get(name)
            if entry and len(entry) > 2 and entry[2] and entry[2][0].startswith(mark):
                del line_cache[name]

    # -- the entry points ----------------------------------------------------------------------
    def verify(where, nonce):
        forget_tests()
        changed = changes()
        if not called_by_grader("verify"):
            changed.append("the grader's check cell was rewritten before it ran")
        if changed:
            unique = sorted(set(changed))
            shown = ", ".join(unique[:8]) + (" ..." if len(unique) > 8 else "")
            raise RuntimeError(f"{where}: {shown} changed since the grader's setup "
                               "(monkeypatched?); flagged for manual review")
        return "grader-token:" + new_hmac(key, nonce.encode(), sha256).hexdigest()

    def run(filename, lines, blob):
        if not called_by_grader("run"):
            noticed.append(f"the grader's test cell {filename} was rewritten before it ran")
        now = protocol_state()
        changed = [describe(k) for k in differences(fresh_protocol, now)]
        if changed:  # put in place after the check before this test (by a transformer?)
            restore(fresh_protocol, now)
            noticed.append(f"changed just before {filename} ran, undone: " + ", ".join(sorted(changed)[:5]))
        if not same_python:
            raise RuntimeError("the grader and the kernel run different Python versions")
        code = marshal_loads(b64decode(blob))
        line_cache[filename] = (0, None, list(lines), filename)
        try:
            run_code(code, user_ns)
        finally:
            now = protocol_state()
            changed = [describe(k) for k in differences(fresh_protocol, now)] + student_printers(remove=True)
            if changed:
                restore(fresh_protocol, now)
                noticed.append(f"changed while {filename} ran, undone before its reply: "
                               + ", ".join(sorted(changed)[:5]))

    def before_locked():
        in_locked[0] = True
        pending.clear()
        pending.update(user_ns)
        pending_classes.clear()
        pending_classes.update(candidates())
        pending_files.clear()
        pending_files.update(line_cache)

    def after_locked():
        in_locked[0] = False
        course_files.update(name for name in list(line_cache) if name not in pending_files
                            and name not in grader_files)
        for k, v in list(user_ns.items()):
            if k.startswith("_") or k in ("In", "Out", "exit", "quit", "get_ipython"):
                continue
            if pending.get(k, missing) is not v:
                locked_names[k] = v
                locked_insides[k] = insides(v)
                for fn in [v] + (list(vars(v).values()) if isinstance(v, type) else []):
                    for f in functions_in(fn):
                        code = code_of(f)
                        if code is not None and not code.co_filename.startswith(roots):
                            course_files.add(code.co_filename)
        allowed_classes.update(set(candidates()) - pending_classes)

    def forget_source():
        """The cell that ran this (it holds the key) is not kept where student code could read it."""
        for name in list(line_cache):
            entry = line_cache[name]
            if len(entry) > 2 and "install(" in "".join(entry[2]) and repr(guard_name) in "".join(entry[2]):
                del line_cache[name]

    forget_source()
    entry_points = {"verify": staticmethod(verify), "run": staticmethod(run),
                    "before_locked": staticmethod(before_locked), "after_locked": staticmethod(after_locked),
                    "__slots__": ()}
    anchor = type(guard_name, (), entry_points)
    # The class lives as long as the audit hook that refers to it (that is, as long as the process).
    keep.append(anchor)
    return anchor


def non_dumpable():
    """Make the kernel process non-dumpable (Linux): a process it starts, though it runs as the
    same user, can then not open the kernel's memory (/proc/<pid>/mem) to rewrite it. Returns
    a function that reads the flag back (None where there is no prctl)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
        return lambda: libc.prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
    except (OSError, AttributeError):  # not Linux
        return lambda: None


keep = []  # the guard's class, referred to from this namespace (which the audit hook keeps alive)
