"""Figures drawn from the lesson's own objects, so a picture cannot disagree with the code; and,
where a cell needs a GPU this machine does not have, what that GPU prints, labelled as expected.

The one source of the course's drawing helpers. A lesson does not import this file (Colab opens a
notebook alone): its collapsed cell tagged `figures` holds the part of it that the lesson calls,
copied in by `python3 make.py figures`; tests/author/test_figures.py keeps the two equal.

Colours name devices, the same in every figure (Okabe-Ito, told apart in colour blindness):
the CPU is blue, CUDA green, MPS orange, meta grey. Each figure has a white card of its own, so it
reads the same in JupyterLab's light and dark themes and on the website; the text is 9 to 10 pt
on a figure 7 inches wide, legible on a phone.
"""
import matplotlib.pyplot as plt
import torch

DEVICE_COLOURS = {"cpu": "#56B4E9", "cuda": "#009E73", "mps": "#E69F00", "meta": "#C8C8C8"}
WARNING = "#D55E00"        # what will go wrong: a plain tensor attribute, a skipped step


def device_colour(device):
    """The colour of a device (torch.device or str) in every figure of the course."""
    return DEVICE_COLOURS.get(torch.device(device).type, "#CC79A7")


def _card(rows, width=7.0, title=None):
    """A figure with an empty axis of `rows` text rows (row 0 at the top), x from 0 to 1."""
    fig, ax = plt.subplots(figsize=(width, 0.6 + 0.32 * max(rows, 1)), facecolor="white")
    ax.set_xlim(0, 1)
    ax.set_ylim(rows - 0.5, -0.7)
    ax.axis("off")
    fig.subplots_adjust(left=0.02, right=0.98, top=1 - 0.45 / fig.get_figheight(), bottom=0.02)
    if title:
        ax.set_title(title, loc="left")
    return fig, ax


def _chip(ax, x, row, text, device=None, warn=False, dashed=False, **kw):
    """A rounded label at (x, row), filled with its device's colour (white: not a tensor)."""
    box = dict(boxstyle="round,pad=0.25", fc=device_colour(device) if device is not None else "white",
               ec=WARNING if warn else "#444444", lw=2 if warn else 0.8, ls="--" if dashed else "-")
    return ax.text(x, row, text, va="center", ha=kw.pop("ha", "left"), bbox=box, color="#111111", **kw)


def _describe(t):
    return f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')}"


def show_module(model, optimizer=None, title=None):
    """Draw `model` as the tree Module.to() walks: each submodule, its parameters (solid),
    buffers (dashed; non-persistent ones are not in state_dict) and plain tensor attributes (red:
    Module.to() skips them), each coloured by the device it is on now. With `optimizer`: which parameters it holds, and its state's devices."""
    held = {id(p) for group in (optimizer.param_groups if optimizer else []) for p in group["params"]}
    rows = []                                   # (depth, text, tensor or None, kind)
    for path, sub in model.named_modules():
        depth = path.count(".") + 1 if path else 0
        rows.append((depth, f"{path}: {type(sub).__name__}" if path else type(sub).__name__, None, "module"))
        tensors = [(n, t, "parameter") for n, t in sub._parameters.items() if t is not None]
        tensors += [(n, t, "buffer" if n not in sub._non_persistent_buffers_set else "unsaved")
                    for n, t in sub._buffers.items() if t is not None]
        tensors += [(n, t, "plain") for n, t in vars(sub).items() if isinstance(t, torch.Tensor)]
        rows += [(depth + 1, f"{n} {_describe(t)} {t.device}", t, kind) for n, t, kind in tensors]
    fig, ax = _card(len(rows), title=title or f"{type(model).__name__}: what Module.to() moves")
    for row, (depth, text, t, kind) in enumerate(rows):
        x = 0.02 + 0.05 * depth
        if t is None:
            ax.text(x, row, text, va="center", fontweight="bold")
            continue
        label = {"parameter": text, "buffer": f"{text} (buffer)", "unsaved": f"{text} (buffer, not in state_dict)",
                 "plain": f"{text} (plain attribute: Module.to() skips it)"}[kind]
        _chip(ax, x, row, label, t.device, warn=kind == "plain", dashed=kind in ("buffer", "unsaved"))
        if optimizer is not None and kind == "parameter":
            state = {k: v for k, v in optimizer.state.get(t, {}).items() if isinstance(v, torch.Tensor) and v.dim()}
            kinds = {}                          # "float32 cpu" -> the state's names of that kind
            for k, v in state.items():
                kinds.setdefault(f"{str(v.dtype).replace('torch.', '')} {v.device}", []).append(k)
            note = ("optimizer state: " + "; ".join(f"{', '.join(ks)} {kind}" for kind, ks in kinds.items())
                    if state else "in the optimizer, no state yet")
            _chip(ax, 0.98, row, note if id(t) in held else "NOT in the optimizer",
                  next((v.device for v in state.values()), None),
                  warn=id(t) not in held, ha="right", fontsize=9)
    return fig


def _region(t):
    """Where a tensor's memory is: 0 host (pageable), 1 pinned host memory, 2 the device."""
    return 2 if t.device.type != "cpu" else (1 if t.is_pinned() else 0)


def show_moves(steps, title=None):
    """Draw what each step did to memory: steps are (code, source tensor or None, result). Host
    memory, pinned host memory (if any tensor is pinned) and device memory are columns; an arrow
    is a copy from one to the other, and a result that IS its source is marked: no copy at all."""
    tensors = [t for _, source, result in steps for t in (source, result) if t is not None]
    device = next((t.device for t in tensors if t.device.type != "cpu"), None)
    pinned = any(_region(t) == 1 for t in tensors)
    columns = {0: "host memory", 1: "pinned host memory",
               2: "meta (the GPU's stand-in)" if device and device.type == "meta" else f"{device or 'device'} memory"}
    x = {0: 0.42, 1: 0.63, 2: 0.84} if pinned else {0: 0.47, 2: 0.8}
    fig, ax = _card(len(steps) + 1, title=title or "Where each step puts memory: an arrow is a copy")
    for region, left in x.items():
        ax.text(left, 0, columns[region], va="center", ha="center", fontweight="bold")
    for row, (code, source, result) in enumerate(steps, 1):
        ax.text(0.02, row, code, va="center", family="monospace", fontsize=9)
        if source is not None and result is source:
            _chip(ax, x[_region(result)], row, "same tensor: no copy", result.device, ha="center", fontsize=9)
            continue
        to = x[_region(result)]
        if source is not None:
            at = x[_region(source)]
            if at == to:                        # a copy within one memory: side by side
                at, to = at - 0.075, to + 0.075
            _chip(ax, at, row, _describe(source), source.device, ha="center", fontsize=9)
            ax.annotate("", (to - 0.06, row), (at + 0.06, row), arrowprops=dict(arrowstyle="->", color="#444444"))
        _chip(ax, to, row, _describe(result), result.device, ha="center", fontsize=9)
    return fig


def show_flowchart(start, rows, title):
    """A decision chart read left to right: from `start` (an error) to each clue, then to its
    cause and fix. rows: (clue, cause and fix, hits); the rows this run's own cases reached (hits,
    a list of their names) are outlined in red, filled with the CPU's colour (where the stray
    tensor was), and named."""
    import textwrap
    fig, ax = _card(2 * len(rows), title=title)
    middle = len(rows) - 0.5
    ax.text(0.01, middle, textwrap.fill(start, 16), va="center", fontweight="bold", fontsize=9,
            bbox=dict(boxstyle="round,pad=0.4", fc="white", ec="#444444"))
    for k, (clue, remedy, hits) in enumerate(rows):
        row = 2 * k + 0.5
        ax.annotate("", (0.265, row), (0.215, middle), arrowprops=dict(arrowstyle="->", color="#444444"))
        _chip(ax, 0.27, row, textwrap.fill(clue, 26), "cpu" if hits else None, warn=bool(hits), fontsize=9)
        ax.annotate("", (0.6, row), (0.56, row), arrowprops=dict(arrowstyle="->", color="#444444"))
        ax.text(0.605, row, textwrap.fill(remedy, 40) + ("\nhere: " + ", ".join(hits) if hits else ""),
                va="center", fontsize=9, color=WARNING if hits else "#111111")
    return fig


def _address_range(obj):
    """(device, first byte, end byte) of the memory a tensor or NumPy array reads."""
    if isinstance(obj, torch.Tensor):
        start = obj.untyped_storage().data_ptr() + obj.storage_offset() * obj.element_size()
        extent = sum((n - 1) * abs(s) for n, s in zip(obj.shape, obj.stride())) + 1 if obj.numel() else 0
        return obj.device.type, start, start + extent * obj.element_size()
    start = obj.__array_interface__["data"][0]
    return "cpu", start, start + obj.nbytes


def show_storage(title=None, **objects):
    """Draw which of the named tensors (and NumPy arrays) share memory: one bar per block of memory,
    each object a segment over the bytes it reads. Objects on one bar share memory: writing
    through one changes the others."""
    ranges = {name: _address_range(obj) for name, obj in objects.items()}
    blocks = []                                 # [device, start, end, [names]] merged where they overlap
    for name, (device, start, end) in sorted(ranges.items(), key=lambda item: item[1][1]):
        last = blocks[-1] if blocks else None
        if last and last[0] == device and start < last[2] and start and device != "meta":
            last[2] = max(last[2], end)
            last[3].append(name)
        else:
            blocks.append([device, start, end, [name]])
    order = list(objects)                       # show blocks and objects in the order given
    blocks.sort(key=lambda b: min(order.index(n) for n in b[3]))
    rows = sum(len(b[3]) + 1 for b in blocks)
    fig, ax = _card(rows, title=title or f"{len(objects)} objects, {len(blocks)} blocks of memory: "
                                         "objects in one block share memory")
    row = 0
    for device, start, end, names in blocks:
        heading = ("meta: no memory at all (shapes only)" if device == "meta"
                   else f"a block of {end - start} bytes on {device}")
        ax.text(0.02, row, heading, va="center", fontweight="bold")
        row += 1
        for name in sorted(names, key=order.index):
            _, first, last = ranges[name]
            left = 0.44 + 0.54 * (first - start) / max(end - start, 1)
            right = 0.44 + 0.54 * (last - start) / max(end - start, 1)
            ax.barh(row, max(right - left, 0.01), left=left, height=0.6, color=device_colour(device),
                    edgecolor="#444444")
            ax.text(0.05, row, f"{name} ({type(objects[name]).__name__})", va="center")
            row += 1
    return fig


def show_checkpoint(path, map_location, title=None):
    """Draw each entry of the checkpoint file at `path`: the location tag the file recorded for
    its tensor (the device it was saved from), and the device torch.load(path,
    map_location=map_location, weights_only=True) puts it on."""
    from torch.utils._pytree import keystr, tree_flatten_with_path   # private API, stable since 2.3
    tags = {}

    def spy(storage, location):                 # called once per storage, read into CPU memory
        tags[storage.data_ptr()] = location
        return storage
    as_saved = tree_flatten_with_path(torch.load(path, map_location=spy, weights_only=True))[0]
    loaded = [leaf for _, leaf in tree_flatten_with_path(torch.load(path, map_location=map_location,
                                                                    weights_only=True))[0]]
    where = f"'{map_location}'" if isinstance(map_location, (str, torch.device)) else repr(map_location)
    fig, ax = _card(len(as_saved) + 1, title=title or f"torch.load(map_location={where}): saved from, loaded on")
    for x, heading in ((0.02, "entry"), (0.5, "in the file"), (0.76, "after torch.load")):
        ax.text(x, 0, heading, va="center", fontweight="bold")
    for row, ((key, saved), value) in enumerate(zip(as_saved, loaded), 1):
        ax.text(0.02, row, keystr(key), va="center", family="monospace", fontsize=9)
        if isinstance(saved, torch.Tensor):
            tag = tags.get(saved.untyped_storage().data_ptr(), "?")
            _chip(ax, 0.5, row, tag, tag if tag != "?" else None, fontsize=9)
            _chip(ax, 0.76, row, str(value.device), value.device, fontsize=9)
        else:
            for x in (0.5, 0.76):
                _chip(ax, x, row, type(saved).__name__, fontsize=9)
        ax.annotate("", (0.75, row), (0.66, row), arrowprops=dict(arrowstyle="->", color="#444444"))
    return fig


def show_scale(runs, title=None):
    """The gradient scaler's scale after each step (log scale) of each run ({label: (scales,
    skipped)}), each skipped step marked: an inf/NaN gradient skipped optimizer.step() and
    halved the scale."""
    fig, ax = plt.subplots(figsize=(7, 2.8), facecolor="white")
    counts = []
    for (label, (scales, skipped)), colour, line in zip(runs.items(), ("#009E73", "#0072B2", "#CC79A7"),
                                                          ("-", "--", ":")):
        steps = range(1, len(scales) + 1)
        marked = [s for s, skip in zip(steps, skipped) if skip]
        counts.append((len(marked), len(scales)))
        ax.step(steps, scales, where="post", color=colour, ls=line, label=f"{label}: {len(marked)} skipped")
        ax.scatter(marked, [scales[s - 1] for s in marked], marker="x", color=WARNING, zorder=3)
    ax.set_yscale("log", base=2)
    ax.set(xlabel="optimizer step", ylabel="scale after the step (log2)",
           title=title or "GradScaler: each skipped step (x) halves the scale")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=9)
    fig.tight_layout()
    return fig


def show_timeline(spans, title, unit="ms"):
    """Spans (lane, start, end, label, colour) as bars on one lane per process or stream, time
    running right: what waits for what, and what overlaps."""
    lanes = list(dict.fromkeys(span[0] for span in spans))
    fig, ax = plt.subplots(figsize=(7, 0.9 + 0.55 * len(lanes)), facecolor="white")
    for lane, start, end, label, colour in spans:
        y = lanes.index(lane)
        ax.barh(y, end - start, left=start, height=0.6, color=colour, edgecolor="#444444")
        if label:
            ax.text((start + end) / 2, y, label, ha="center", va="center", fontsize=8, clip_on=True)
    ax.set_yticks(range(len(lanes)), lanes)
    ax.invert_yaxis()
    ax.set(xlabel=f"time ({unit})", title=title)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def show_expected(gpu_prints, source, machine="a GPU"):
    """For a cell that needs a GPU this machine lacks: what the cell prints on one, labelled
    "expected, not recorded on a GPU", with the source that says so (a link to PyTorch's docs or
    code). `...` in gpu_prints stands for what varies (a number, a name). `machine` names what the
    cell needs when one GPU is not enough ("2 GPUs"). `make.py gpu-report --record` puts the real
    output below the cell, and tests/author/test_gpu_records.py then checks this text against it
    (unless that GPU, too, lacked what the cell needs and printed this label)."""
    import textwrap
    print(f"On {machine} this cell prints (expected, not recorded on a GPU; source: {source}):")
    print(textwrap.indent(gpu_prints, "  "))

