# The device tracer (lesson 08, section 4): inside `with trace_devices():`, every tensor remembers
# the line of your code that made or moved it, and a device error lists, for each tensor of the
# failed call, its device, shape, dtype, name and that line. Only torch and the standard library.
import contextlib
import linecache
import os
import re
import sys
from unittest import mock

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

_TORCH, _STDLIB = os.path.dirname(torch.__file__) + os.sep, os.path.dirname(os.__file__) + os.sep
_SKIPPED = {}    # file name -> whether it is torch's or the standard library's
DEVICE_ERROR = re.compile(r"same device|expected device|device type|device mismatch|device\b.*\bgenerator|to numpy"
                          r"|indices should be|on meta tensors|should be the same|copy out of meta", re.I)
MOVES = {"to", "cuda", "cpu", "copy_", "type"}
# Operations whose meta kernels do not check devices (measured, PyTorch 2.13): cpu @ meta returns
# a tensor, on a GPU it raises. The tracer checks them itself when a meta tensor takes part.
UNCHECKED_ON_META = {"matmul", "__matmul__", "__rmatmul__", "mm", "bmm", "mv", "dot", "linear",
                     "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                     "conv_transpose3d", "embedding", "index_select"}


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


class DeviceTracer(TorchFunctionMode):
    def __init__(self, *modules, pretend=False):
        super().__init__()
        self.origin = WeakIdKeyDictionary()   # tensor -> (what, where, (what, where) its data came from)
        self.by_storage = {}                  # storage address -> the same: Parameters, views
        self.names = WeakIdKeyDictionary()    # tensor -> "encoder.0.weight (parameter)"
        self.pretend = pretend
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
        name = f" {name}" if name else ""
        device = "cuda:0 (pretend: on meta)" if self.pretend and tensor.is_meta else tensor.device
        return f"{device}, {str(tensor.dtype).replace('torch.', '')} {tuple(tensor.shape)}{name}: {made}"

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        try:
            if name in UNCHECKED_ON_META:
                _check_devices(name, args, kwargs)
            result = _pretend_call(func, name, args, kwargs) if self.pretend else func(*args, **kwargs)
        except Exception as exc:
            self.explain(exc, name, args, kwargs)
            raise
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
        if name in MOVES and inputs and isinstance(inputs[0], torch.nn.Parameter):
            # Module.to() moves a parameter by replacing its .data: the Parameter object stays
            self.remember(inputs[0], f"moved by {name}", where_in_user_code())
        return result

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
        if self.pretend:
            lines.append("  (pretend-CUDA: meta stands for cuda:0; on a GPU this call raises the same error "
                         "in CUDA's words)")
        exc.add_note("\n".join(lines))


def _check_devices(name, args, kwargs):
    """The same-device rule for an operation meta does not check, when a meta tensor takes part
    (0-dim CPU tensors are exempt, as everywhere)."""
    tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)
               and not (t.device.type == "cpu" and t.dim() == 0)]
    devices = list(dict.fromkeys(str(t.device) for t in tensors))
    if len(devices) > 1 and "meta" in devices:
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                           f"{devices[0]} and {devices[1]}! (the device tracer checked this {name}(): on "
                           "meta PyTorch does not, on a GPU it raises)")


def _on_meta(device):
    return torch.device("meta") if device is not None and torch.device(device).type == "cuda" else device


def _pretend_call(func, name, args, kwargs):
    """Call func with every CUDA target replaced by meta (a device without values that runs
    PyTorch's device checks): what pretend-CUDA runs instead of the GPU."""
    if "device" in kwargs:
        kwargs = {**kwargs, "device": _on_meta(kwargs["device"])}
    if name == "__repr__" and args[0].is_meta:   # print(x): meta would print "tensor(...)", no values
        raise RuntimeError("printing a tensor: its values cannot be called on meta tensors")
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


_OWN_CODE = {where_in_user_code.__code__, DeviceTracer.__torch_function__.__code__,
             DeviceTracer.explain.__code__, DeviceTracer.remember.__code__}


@contextlib.contextmanager
def pretend_cuda():
    """torch.cuda says there is one GPU; the tracer puts what your code sends to "cuda" on meta."""
    answers = {"is_available": True, "device_count": 1, "current_device": 0, "synchronize": None,
               "is_bf16_supported": True, "get_device_name": "pretend CUDA (on meta)",
               "is_current_stream_capturing": False}
    with contextlib.ExitStack() as stack:
        for attr, value in answers.items():
            stack.enter_context(mock.patch(f"torch.cuda.{attr}", return_value=value))
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
        with pretend_cuda() if pretend else contextlib.nullcontext(), tracer:
            yield tracer
    finally:
        hook.remove()
