"""Put first on PYTHONPATH by `make.py trace`, so that the processes a traced script starts for its
ranks run under the same device tracer: the ranks of `torchrun` (they have LOCAL_RANK) and the
processes of torch.multiprocessing / multiprocessing's spawn (mp.spawn, a DataLoader's spawned
workers). Their device errors then carry the tracer's note, and come back to the launcher in the
rank's traceback. Any other Python process is left alone. A failure here never stops the child:
it runs untraced, with a one-line warning."""

import os
import sys


def _is_a_rank():
    return "LOCAL_RANK" in os.environ or "--multiprocessing-fork" in getattr(sys, "orig_argv", ())


def _start_tracing():
    mode, root = os.environ.get("COURSE_DEVTRACE"), os.environ.get("COURSE_DEVTRACE_ROOT")
    if not mode or not root or not _is_a_rank():
        return
    try:
        sys.path.append(root)          # last: the course's package never hides a module of yours
        from coursetools.learner import trace
        context = trace.devtrace.trace_devices(pretend=mode == "pretend")
        context.__enter__()            # for the whole life of this process
        sys.course_device_tracer = context
        sys.excepthook = lambda kind, exc, tb: trace.print_error(exc)   # torch's frames folded
    except Exception as exc:          # torch missing, ...: run untraced, say so
        print(f"[make.py trace] this child process runs without the device tracer: {exc!r}", file=sys.stderr)


def _chain():
    """This file hides any other sitecustomize on the path: run that one too, as Python would have."""
    import importlib.machinery
    import importlib.util
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


_chain()
_start_tracing()
