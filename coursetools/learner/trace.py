"""`python3 make.py trace [--pretend-cuda] SCRIPT [ARGS...]`: run a Python script under the device
tracer of lesson 08 (coursetools/learner/devtrace.py, the lesson's own cell). A device error then
ends with one line per tensor of the failed call: its device, dtype, shape, its name when it is a
parameter or buffer of a module, and the line of your code that made or last moved it.

--pretend-cuda: run as if this machine had one CUDA GPU (torch.cuda.is_available() says True);
what the script sends to "cuda" goes to `meta`, a device without values that runs PyTorch's
device checks. A device bug that only a GPU would raise is then found on a laptop. Where the script
needs a value from the pretend GPU (.item(), printing it, an `if` on it), the run stops with a
message naming that line: it never shows a made-up number.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback

from coursetools.learner import devtrace


def run_script(script: str, args: list[str], pretend: bool = False) -> int:
    """Run `script` as `python script args...` would, under the tracer. 0: it finished; 1: it
    raised (the traceback, with the tracer's lines, is on stderr)."""
    path = os.path.abspath(script)
    if not os.path.isfile(path):
        print(f"error: no such script: {script}", file=sys.stderr)
        return 2
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [path, *args]
    sys.path[0:0] = [os.path.dirname(path)]     # as `python script`: its folder first
    try:
        with devtrace.trace_devices(pretend=pretend):
            runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except devtrace.NeedsValues as exc:
        print(f"\n[make.py trace --pretend-cuda] the run stopped at {exc}", file=sys.stderr)
        return 1
    except BaseException as exc:  # the script's own error, with the tracer's note
        frames = traceback.extract_tb(exc.__traceback__)
        # Start the traceback at the script: the frames of runpy and of this runner say nothing.
        # The tracer's own frames are left out too.
        start = next((i for i, f in enumerate(frames) if os.path.abspath(f.filename) == path), 0)
        shown = [f for f in frames[start:] if os.path.abspath(f.filename) != os.path.abspath(devtrace.__file__)]
        print("Traceback (most recent call last):", file=sys.stderr)
        print(_fold_torch_frames(shown), end="", file=sys.stderr)
        print("".join(traceback.format_exception_only(type(exc), exc)), end="", file=sys.stderr)
        return 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return 0


def _fold_torch_frames(frames: list[traceback.FrameSummary]) -> str:
    """The traceback's frames, each run of frames inside torch as one line (they are PyTorch's
    own; the last frame of your code and the error are what to read)."""
    torch_dir = os.path.dirname(os.path.abspath(devtrace.torch.__file__)) + os.sep
    text, inside = [], []
    for frame in [*frames, None]:
        if frame is not None and os.path.abspath(frame.filename).startswith(torch_dir):
            inside.append(frame)
            continue
        if inside:
            text.append(f"  [{len(inside)} frame(s) inside torch, the last in {inside[-1].filename}:"
                        f"{inside[-1].lineno}, {inside[-1].name}]\n")
            inside = []
        if frame is not None:
            text.extend(traceback.format_list([frame]))
    return "".join(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make.py trace", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pretend-cuda", action="store_true",
                        help="as if on a CUDA GPU: 'cuda' tensors live on meta (no values)")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    ns = parser.parse_args(argv)
    return run_script(ns.script, ns.args, pretend=ns.pretend_cuda)


if __name__ == "__main__":
    sys.exit(main())
