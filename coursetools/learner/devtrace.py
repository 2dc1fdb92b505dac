# The device tracer (lesson 08, section 4): inside `with trace_devices():`, every tensor remembers
# the line of your code that made or moved it, and a device error lists, for each tensor of the
# failed call, its device, shape, dtype, name and that line. Only torch and the standard library.
import contextlib
import linecache
import os
import re
import sys
import weakref
from unittest import mock

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

_TORCH, _STDLIB = os.path.dirname(torch.__file__) + os.sep, os.path.dirname(os.__file__) + os.sep
_SKIPPED = {}    # file name -> whether it is torch's or the standard library's
DEVICE_ERROR = re.compile(r"same device|expected device|device type|device mismatch|device\b.*\bgenerator|to numpy"
                          r"|indices should be|on meta tensors|should be the same|copy out of meta|to have \w+ device", re.I)
MOVES = {"to", "cuda", "cpu", "copy_", "type"}
# Operations whose meta kernels do not check devices (measured on PyTorch 2.13 by
# tests/learner/test_trace.py): cpu @ meta returns a tensor, on a GPU it raises. The tracer checks
# them itself when a meta tensor takes part. (mv, dot, addmm and 1-D @ 1-D do check on meta.)
UNCHECKED_ON_META = {"matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "baddbmm", "addbmm", "einsum",
                     "tensordot", "linear", "bilinear", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
                     "conv_transpose2d", "conv_transpose3d", "embedding", "embedding_bag", "index_select",
                     "take", "put_", "gather", "scatter", "scatter_", "scatter_add", "scatter_add_",
                     "scatter_reduce", "scatter_reduce_", "masked_scatter", "masked_scatter_", "cdist",
                     "searchsorted", "bucketize", "linalg_cross", "linalg_solve_triangular",
                     "__getitem__", "__setitem__", "index_put_", "index_put"}
# A 0-dim CPU tensor joins a GPU tensor only where CUDA's kernel skips the device check
# (`device_check: NoCheck` in native_functions.yaml: element-wise ops built on TensorIterator).
# These check every tensor argument on a GPU, 0-dim ones included, while meta lets a 0-dim CPU
# tensor through: the tracer checks them without the exemption.
CPU_SCALARS_REFUSED = {"gather", "scatter", "scatter_", "scatter_add", "scatter_add_", "scatter_reduce",
                       "scatter_reduce_", "index_select", "take", "put_", "embedding", "embedding_bag",
                       "mm", "bmm", "addmm", "addmm_", "baddbmm", "addbmm", "nextafter", "nextafter_",
                       "logaddexp", "logaddexp2", "gcd", "gcd_", "lcm", "lcm_", "igamma", "igamma_",
                       "igammac", "igammac_", "clamp", "clamp_", "clip", "clip_", "clamp_min", "clamp_min_",
                       "clamp_max", "clamp_max_", "nll_loss", "cross_entropy", "huber_loss", "searchsorted",
                       "bucketize"}
INDEXING = {"__getitem__", "__setitem__", "index_put_", "index_put"}   # CUDA takes CPU indices here


def where_in_user_code():
    """'file:line  `code`' of the innermost frame outside torch, the standard library and this
    tracer."""
    frame = sys._getframe(1)
    while frame is not None:
        if not _skipped(frame.f_code):
            name = frame.f_code.co_filename
            line = linecache.getline(name, frame.f_lineno).strip()
            name = "<cell>" if re.search(r"ipykernel_\d+[/\\]\d+\.py$", name) else name  # a notebook's
            return f"{name}:{frame.f_lineno}" + (f"  `{line}`" if line else "")
        frame = frame.f_back
    return "?"


def _skipped(code):
    if code in _OWN_CODE:
        return True
    name = code.co_filename
    skip = _SKIPPED.get(name)
    if skip is None:        # site-packages may lie inside the stdlib folder: other libraries count
        skip = _SKIPPED[name] = name.startswith(_TORCH) or (
            name.startswith(_STDLIB) and not re.search(r"(site|dist)-packages", name[len(_STDLIB):]))
    return skip


class NeedsValues(RuntimeError):
    """Under pretend_cuda no tensor has values: the traced program asked for some."""


class PretendCannot(NeedsValues):
    """Under pretend_cuda the traced program used a part of CUDA that meta cannot stand for."""


class DeviceTracer(TorchFunctionMode):
    def __init__(self, *modules, pretend=False):
        super().__init__()
        self.origin = WeakIdKeyDictionary()   # tensor -> (what, where, (what, where) its data came from)
        self.by_storage = {}                  # storage address -> the same: Parameters, views
        self.names = WeakIdKeyDictionary()    # tensor -> "encoder.0.weight (parameter)"
        self.owner = WeakIdKeyDictionary()    # parameter or buffer -> (its module, weakly; kind; attribute)
        self.pretend = pretend
        self.swaps_chosen = False             # the program itself asked Module.to() to swap
        self.roots = WeakIdKeyDictionary()    # modules named, outermost first
        for module in modules:
            self.name_module(module)

    def name_module(self, root, again=False):
        """Name the parameters, buffers and plain tensor attributes of `root`'s tree (once)."""
        if root in self.roots and not again:
            return
        self.roots[root] = True
        for path, sub in root.named_modules():
            prefix = f"{path}." if path else ""
            for kind, items in (("parameter", sub._parameters), ("buffer", sub._buffers),
                                ("PLAIN ATTRIBUTE, Module.to() skips it", vars(sub))):
                for attr, value in items.items():
                    if isinstance(value, torch.Tensor) and value not in self.names:
                        self.names[value] = f"{prefix}{attr} ({kind})"
                        if kind in ("parameter", "buffer"):
                            self.owner[value] = (weakref.ref(sub), kind, attr)

    def stale(self, tensor):
        """Whether `tensor` was a module's parameter or buffer that the module no longer holds
        (a reference kept from before a .to() that made a new tensor)."""
        owner = self.owner.get(tensor)
        module = owner and owner[0]()
        if module is None:
            return False
        table = module._parameters if owner[1] == "parameter" else module._buffers
        return table.get(owner[2]) is not tensor

    def remember(self, tensor, what, where, source=None):
        """`source`: the record of the input an operation's result was computed from; the
        result keeps where that data first came from (one line, not the whole chain)."""
        first = (source[2] or source[:2]) if source else None
        record = (what, where, first if first and first[1] != where else None)
        self.origin[tensor] = record
        with contextlib.suppress(Exception):  # a tensor without storage (a subclass): by object only
            self.by_storage[tensor.untyped_storage()._cdata] = record

    def place(self, tensor):
        found = self.origin.get(tensor)
        if found is None:
            with contextlib.suppress(Exception):
                found = self.by_storage.get(tensor.untyped_storage()._cdata)
        return found

    def describe(self, tensor):
        place = self.place(tensor)
        made = f"{place[0]} at {place[1]}" + (f"\n       from a tensor {place[2][0]} at {place[2][1]}"
                                              if place and place[2] else "") if place else "origin unknown (made before the tracer started, or in another process: a DataLoader worker, another rank)"
        name = self.names.get(tensor, "")
        if name and self.stale(tensor):
            name += ", a STALE reference: the module's .to() has replaced it with a new tensor"
        name = f" {name}" if name else ""
        device = "cuda:0 (pretend: on meta)" if self.pretend and tensor.is_meta else tensor.device
        return f"{device}, {str(tensor.dtype).replace('torch.', '')} {tuple(tensor.shape)}{name}: {made}"

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        try:
            if name in UNCHECKED_ON_META or name in CPU_SCALARS_REFUSED:
                _check_devices(name, args, kwargs)
            result = _pretend_call(func, name, args, kwargs) if self.pretend else func(*args, **kwargs)
        except Exception as exc:
            self.explain(exc, name, args, kwargs)
            raise
        if name == "__set__" and getattr(func, "__self__", None) is torch.Tensor.data:
            # `param.data = new` (how Module.to() moves a parameter on a GPU): the object stays
            if self.place(args[1]):
                self.origin[args[0]] = self.place(args[1])
            return result
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        known = {id(t) for t in inputs}
        for out in tree_flatten(result)[0]:
            if not isinstance(out, torch.Tensor) or id(out) in known:
                continue
            alias = next((t for t in inputs if _same_storage(t, out)), None)
            if alias is not None:               # a view or alias (x[0], x.data): x's history
                if self.place(alias):
                    self.origin[out] = self.place(alias)
                continue
            moved = name in MOVES or (inputs and out.device != inputs[0].device)
            what = f"{'moved' if moved else 'made'} by {name}"
            if _unpickling():
                what = "received from another process (a DataLoader worker?), unpickled"
            source = None if moved else next((self.place(t) for t in inputs if t.device == out.device
                                               and self.place(t)), None)
            self.remember(out, what, where_in_user_code(), source)
        return result

    def swap_tensors(self, t1, t2, swap=torch.utils.swap_tensors):
        """torch.utils.swap_tensors while pretending: Module.to() swaps each parameter with its
        copy on meta, so the Parameter object survives, as a GPU's `param.data = ...` keeps it
        (CPU -> meta cannot take that road). The tracer's weak references (swap refuses tensors
        that have any) are set aside for the swap, and t1 keeps the history of its new data."""
        if not self.swaps_chosen and torch._has_compatible_shallow_copy_type(t1, t2):
            t1.data = t2        # what Module.to() does without the swap (.half(), meta -> meta)
            return
        tables = (self.origin, self.names, self.owner)
        moved_record = self.place(t2)
        saved = [[table.pop(t, None) for t in (t1, t2)] for table in tables]
        try:
            swap(t1, t2)
        except Exception as exc:
            for table, values in zip(tables, saved):
                for t, value in zip((t1, t2), values):
                    if value is not None:
                        table[t] = value
            raise PretendCannot(
                f"{where_in_user_code()}\nmoving this module to the pretend GPU: pretend-CUDA keeps each "
                f"Parameter object (as a GPU does) by swapping it with its copy on meta, and this one cannot "
                f"be swapped ({exc}). The run stops here: past it the tracer could not tell a real device "
                f"error from one of its own. No device error was found before this line.") from exc
        for table, (first, _) in zip(tables, saved):
            if first is not None:
                table[t1] = first
        if moved_record is not None:
            self.origin[t1] = moved_record

    def explain(self, exc, name, args, kwargs):
        if getattr(exc, "_device_trace", False):
            return                                  # an inner call explained it already
        exc._device_trace = True
        where = where_in_user_code()
        if self.pretend and _needs_values(exc):
            what = "printing a tensor" if name == "__repr__" else f"{name}()"
            raise NeedsValues(f"{where}\n{what} needs the values of a tensor on the pretend GPU, and "
                              "it has none (pretend-CUDA keeps them on meta): the run stops here. No "
                              "device error was found before this line.") from exc
        if not DEVICE_ERROR.search(str(exc)):
            return
        for root in list(self.roots.keys()):    # attributes assigned since their first forward
            self.name_module(root, again=True)
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        lines = [f"device tracer: {name}() at {where} was given {len(tensors)} tensor(s):"]
        lines += [f"  {k}. {self.describe(t)}" for k, t in enumerate(tensors, 1)]
        if self.pretend and _gpu_raises_too(name, tensors):
            lines.append("  (pretend-CUDA: meta stands for cuda:0; on a GPU this call raises the same error "
                         "in CUDA's words)")
        elif self.pretend:
            lines.append("  (pretend-CUDA: meta stands for cuda:0; this error may be meta's own: the tracer "
                         "cannot tell whether a GPU raises here)")
        exc.add_note("\n".join(lines))


def _gpu_raises_too(name, tensors):
    """Whether a GPU refuses this mix too: a pretend-GPU tensor met a CPU tensor that CUDA does not
    exempt (one with dimensions, or a 0-dim one where CUDA checks every argument)."""
    if name in INDEXING:      # a GPU refuses GPU indices into a CPU tensor, takes CPU indices
        return not tensors[0].is_meta and any(t.is_meta and t.dim() > 0 for t in tensors[1:])
    cpu = [t for t in tensors if t.device.type == "cpu" and (t.dim() > 0 or name in CPU_SCALARS_REFUSED)]
    return bool(cpu) and any(t.is_meta for t in tensors)


def _check_devices(name, args, kwargs):
    """The same-device rule for an operation meta does not check, when a meta tensor takes part.
    0-dim CPU tensors are exempt, as on a GPU, except where CUDA checks every argument."""
    if name in INDEXING:      # x[idx]: CUDA moves CPU indices to x's device, not GPU indices to the CPU
        self_, indices = args[0], tree_flatten(args[1])[0]
        if not self_.is_meta and any(isinstance(i, torch.Tensor) and i.is_meta and i.dim() > 0
                                     for i in indices):
            raise RuntimeError(f"indices should be either on cpu or on the same device as the indexed tensor "
                               f"({self_.device}) (the device tracer checked this {name}(): on meta PyTorch "
                               "does not, on a GPU it raises)")
        return
    tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)
               and not (t.device.type == "cpu" and t.dim() == 0 and name not in CPU_SCALARS_REFUSED)]
    devices = list(dict.fromkeys(str(t.device) for t in tensors))
    if len(devices) > 1 and "meta" in devices:
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                           f"{devices[0]} and {devices[1]}! (the device tracer checked this {name}(): on "
                           "meta PyTorch lets it through, on a GPU it raises)")


def _on_meta(device):
    return torch.device("meta") if device is not None and torch.device(device).type == "cuda" else device


def _pretend_call(func, name, args, kwargs):
    """Call func with every CUDA target replaced by meta (a device without values that runs
    PyTorch's device checks): what pretend-CUDA runs instead of the GPU."""
    if "device" in kwargs:
        kwargs = {**kwargs, "device": _on_meta(kwargs["device"])}
    if kwargs.get("pin_memory"):                 # torch.empty(..., pin_memory=True): pinning needs a GPU
        kwargs = {**kwargs, "pin_memory": False}
    if name == "__repr__" and args[0].is_meta:   # print(x): meta would print "tensor(...)", no values
        raise RuntimeError("printing a tensor: its values cannot be called on meta tensors")
    if name in ("masked_fill", "masked_fill_") and args[0].is_meta and len(args) > 2 and \
            isinstance(args[2], torch.Tensor) and args[2].device.type == "cpu" and args[2].dim() == 0:
        args = (*args[:2], args[2].item())      # CUDA reads a 0-dim CPU value; meta would refuse it
    if name == "pin_memory" and args and isinstance(args[0], torch.Tensor) and not args[0].is_meta:
        return args[0].clone()                   # a copy, as pinning makes; is_pinned() stays False
    if name == "cuda" and args and isinstance(args[0], torch.Tensor):
        return args[0].to("meta", non_blocking=kwargs.get("non_blocking", False))
    if name == "to" and args and isinstance(args[0], torch.Tensor):
        target, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args[1:], **kwargs)
        if target is not None and torch.device(target).type == "cuda":
            return args[0].to("meta", dtype or args[0].dtype, non_blocking=non_blocking,
                              copy=kwargs.get("copy", False))
    return func(*args, **kwargs)


def _unpickling():
    """Whether a pickled tensor is being rebuilt (a batch from a DataLoader worker, ...)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name in ("loads", "_rebuild_tensor_v2", "rebuild_storage_fd",
                                    "rebuild_storage_filename", "rebuild_tensor"):
            return True
        frame = frame.f_back
    return False


def _same_storage(a, b):
    try:
        return a.untyped_storage()._cdata == b.untyped_storage()._cdata
    except Exception:
        return False


def _needs_values(exc):
    return "cannot be called on meta tensors" in str(exc) or "copy out of meta" in str(exc)


def _cannot(what):
    """A stand-in for a part of torch.cuda that meta has no counterpart of: it stops the run."""
    def stop(*args, **kwargs):
        raise PretendCannot(f"{where_in_user_code()}\n{what}(): pretend-CUDA cannot stand for it (meta has no "
                            "CUDA streams, events or device properties): the run stops here. No device error "
                            "was found before this line.")
    return stop


def _set_device(device):
    if torch.cuda._get_device_index(device, optional=True) > 0:
        raise PretendCannot(f"{where_in_user_code()}\ntorch.cuda.set_device({device!r}): pretend-CUDA has one "
                            "GPU, cuda:0: the run stops here. No device error was found before this line.")


def _autocast_enter(enter, told=set()):
    """autocast("cuda") does not act on meta tensors: say so, once per line of the program."""
    def entered(self):
        where = where_in_user_code()
        if self.device == "cuda" and where not in told:
            told.add(where)
            print(f"[pretend-CUDA] {where}: autocast('cuda') does not act on the pretend GPU's tensors "
                  f"(meta): inside it a float32 matmul, linear or convolution stays float32 where a GPU gives "
                  f"{str(self.fast_dtype).replace('torch.', '')}, so a dtype error of mixed precision is not "
                  "found here (device errors still are).", file=sys.stderr)
        return enter(self)
    return entered


_OWN_CODE = {where_in_user_code.__code__, DeviceTracer.__torch_function__.__code__,
             DeviceTracer.explain.__code__, DeviceTracer.remember.__code__,
             DeviceTracer.swap_tensors.__code__, _set_device.__code__, _cannot("").__code__,
             _autocast_enter(None).__code__}


@contextlib.contextmanager
def pretend_cuda(tracer=None):
    """torch.cuda says there is one GPU; the tracer puts what your code sends to "cuda" on meta.
    Module.to() keeps each Parameter object, as on a GPU (through swap_tensors, see the tracer's)."""
    answers = {"is_available": True, "device_count": 1, "current_device": 0, "synchronize": None,
               "is_bf16_supported": True, "get_device_name": "pretend CUDA (on meta)",
               "is_current_stream_capturing": False, "_exchange_device": 0, "_maybe_exchange_device": 0}
    with contextlib.ExitStack() as stack:
        for attr, value in answers.items():
            stack.enter_context(mock.patch(f"torch.cuda.{attr}", return_value=value))
        for attr in ("Stream", "Event", "stream", "current_stream", "default_stream", "get_device_properties"):
            stack.enter_context(mock.patch(f"torch.cuda.{attr}", _cannot(f"torch.cuda.{attr}")))
        stack.enter_context(mock.patch("torch.cuda.set_device", _set_device))
        autocast = torch.amp.autocast_mode.autocast
        stack.enter_context(mock.patch.object(autocast, "__enter__", _autocast_enter(autocast.__enter__)))
        # A GPU's Module.to() keeps each Parameter (param.data = moved); CPU -> meta cannot, so
        # Module.to() swaps them instead (PyTorch's own flag), unless the program itself asked
        # for new Parameters.
        chosen = torch.__future__.get_swap_module_params_on_conversion()
        if not torch.__future__.get_overwrite_module_params_on_conversion():
            torch.__future__.set_swap_module_params_on_conversion(True)
            stack.callback(torch.__future__.set_swap_module_params_on_conversion, chosen)
            if tracer is not None:
                tracer.swaps_chosen = chosen
                stack.enter_context(mock.patch("torch.utils.swap_tensors", tracer.swap_tensors))
        yield   # (torch.accelerator still reports this machine: optimizers query its streams)


@contextlib.contextmanager
def trace_devices(*modules, pretend=False):
    """Inside, every tensor remembers where your code made or moved it; a device error lists the
    tensors of the failed call with that line. pretend=True: as if on a CUDA GPU (kept on meta).
    Modules given (or called inside) get their parameters and buffers named."""
    tracer = DeviceTracer(*modules, pretend=pretend)
    hook = torch.nn.modules.module.register_module_forward_pre_hook(
        lambda module, inputs: tracer.name_module(module))
    try:
        with pretend_cuda(tracer) if pretend else contextlib.nullcontext(), tracer:
            yield tracer
    finally:
        hook.remove()
