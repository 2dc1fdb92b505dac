"""`python3 make.py trace [--pretend-cuda] SCRIPT [ARGS...]`: run a Python script under the device
tracer of lesson 08 (coursetools/learner/devtrace.py, the lesson's own cell). A device error then
ends with one line per tensor of the failed call: its device, dtype, shape, its name when it is a
parameter or buffer of a module, and the line of your code that made or last moved it.

--pretend-cuda: run as if this machine had one CUDA GPU (torch.cuda.is_available() says True);
what the script sends to "cuda" goes to `meta`, a device without values that runs PyTorch's
device checks. A device bug that only a GPU would raise is then found on a laptop. Where the script
needs a value from the pretend GPU (.item(), printing it, an `if` on it), the run stops with a
message naming that line: it never shows a made-up number. Module.to() keeps each Parameter object,
as on a GPU. What meta cannot stand for is said where it happens: autocast("cuda") (no effect on
meta: a note on stderr), CUDA streams, events and device properties (the run stops there).

DDP: `python3 make.py trace torchrun --nproc-per-node 2 train.py` (or `-m MODULE`, as `python -m`)
runs the launcher, and each rank it starts runs under the tracer too (rank_hook/sitecustomize.py),
as do the processes of torch.multiprocessing.spawn: a rank's device error comes back with the note.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback

from coursetools.learner import devtrace


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RANK_HOOK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_hook")
ALIASES = {"torchrun": "torch.distributed.run"}    # the console script is `python -m` of this module


def run_script(script: str, args: list[str], pretend: bool = False, module: bool = False) -> int:
    """Run `script` as `python script args...` would (`python -m script` when module), under the
    tracer, and so are the ranks it starts. 0: it finished; 1: it raised (the traceback, with the
    tracer's lines, is on stderr)."""
    path = None if module else os.path.abspath(script)
    if path is not None and not os.path.isfile(path):
        print(f"error: no such script: {script}", file=sys.stderr)
        return 2
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    saved_env = {k: os.environ.get(k) for k in ("PYTHONPATH", "COURSE_DEVTRACE", "COURSE_DEVTRACE_ROOT")}
    sys.argv = [path or script, *args]
    sys.path[0:0] = [os.path.dirname(path) if path else os.getcwd()]   # as `python script`, `python -m`
    os.environ.update(COURSE_DEVTRACE="pretend" if pretend else "1", COURSE_DEVTRACE_ROOT=ROOT,
                      PYTHONPATH=os.pathsep.join(filter(None, [RANK_HOOK, saved_env["PYTHONPATH"]])))
    try:
        with devtrace.trace_devices(pretend=pretend):
            if module:
                runpy.run_module(script, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except devtrace.NeedsValues as exc:
        print(f"\n[make.py trace --pretend-cuda] the run stopped at {exc}", file=sys.stderr)
        return 1
    except ImportError as exc:
        raised_by = traceback.extract_tb(exc.__traceback__)[-1].filename
        if module and raised_by in ("<frozen runpy>", runpy.__file__) and "No module named" in str(exc):
            print(f"error: no such module: {script}", file=sys.stderr)
            return 2
        print_error(exc, path)
        return 1
    except BaseException as exc:  # the script's own error, with the tracer's note
        stop = exc.__cause__
        if isinstance(stop, devtrace.PretendCannot):   # raised inside torch, which wrapped it
            print(f"\n[make.py trace --pretend-cuda] the run stopped at {stop}", file=sys.stderr)
            return 1
        print_error(exc, path)
        return 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        for key, value in saved_env.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
    return 0


def print_error(exc: BaseException, path: str | None = None) -> None:
    """The traceback of `exc` on stderr, from the script's first frame on, each run of torch's frames
    folded into one line, then the error with the tracer's note."""
    frames = traceback.extract_tb(exc.__traceback__)
    # Start the traceback at the script (at the module run, for -m): the frames of runpy and of
    # this runner say nothing. The tracer's own frames are left out too.
    ours = {os.path.abspath(__file__), os.path.abspath(runpy.__file__), os.path.abspath("<frozen runpy>")}
    start = next((i for i, f in enumerate(frames) if (os.path.abspath(f.filename) == path if path
                                                      else os.path.abspath(f.filename) not in ours)), 0)
    shown = [f for f in frames[start:] if os.path.abspath(f.filename) != os.path.abspath(devtrace.__file__)]
    print("Traceback (most recent call last):", file=sys.stderr)
    print(_fold_torch_frames(shown), end="", file=sys.stderr)
    print("".join(traceback.format_exception_only(type(exc), exc)), end="", file=sys.stderr)


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
    parser = argparse.ArgumentParser(prog="make.py trace", description=__doc__.split("\n\n")[0],
                                     usage="make.py trace [--pretend-cuda] (SCRIPT | -m MODULE | torchrun) [ARGS ...]")
    parser.add_argument("--pretend-cuda", action="store_true",
                        help="as if on a CUDA GPU: 'cuda' tensors live on meta (no values)")
    parser.add_argument("-m", dest="module", metavar="MODULE",
                        help="run a module, as `python -m MODULE` (torch.distributed.run is torchrun)")
    parser.add_argument("script", nargs="?", help="the script, or `torchrun` for the DDP launcher")
    argv = list(sys.argv[1:] if argv is None else argv)
    # Ours are the options before the script (or -m MODULE); all after it are the script's own.
    cut = next((i + 1 for i, a in enumerate(argv) if not a.startswith("-") and (i == 0 or argv[i - 1] != "-m")),
               len(argv))
    if "-m" in argv[:cut] and argv.index("-m") + 2 <= len(argv):
        cut = min(cut, argv.index("-m") + 2)
    ns = parser.parse_args(argv[:cut])
    args = argv[cut:]
    if ns.module:
        return run_script(ns.module, [a for a in [ns.script] if a] + args, pretend=ns.pretend_cuda, module=True)
    if not ns.script:
        parser.error("give a script to run (or -m MODULE)")
    if ns.script in ALIASES and not os.path.isfile(ns.script):
        return run_script(ALIASES[ns.script], args, pretend=ns.pretend_cuda, module=True)
    return run_script(ns.script, args, pretend=ns.pretend_cuda)


if __name__ == "__main__":
    sys.exit(main())
