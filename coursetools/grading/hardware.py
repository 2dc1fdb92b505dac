"""The hardware a grading run offers the student's kernel, as the grader knows it.

A hidden test that also checks an answer on a real GPU asks `grader_device()`, a name the
grader puts in every test's namespace (coursetools/grading/remote.py), never a value of the
kernel's: the notebook's global `device` or the kernel's `torch.cuda.is_available()` are the
student's to rebind or patch (`device = torch.device("cpu")` in an answer cell would skip
every real-GPU check on a GPU grader).

The fact is decided here, in the grader's process:
* `COURSE_GRADER_DEVICE` (`cuda`, `mps` or `cpu`), when set: the grading entry point's word
  (a test also uses it to play a GPU grader on a CPU-only machine);
* else a sandboxed kernel has no accelerator (the sandbox's /dev holds no GPU device);
* else the grader's own PyTorch: CUDA, else MPS, else the CPU (an unsandboxed kernel runs
  on this machine, with the same devices).
"""

from __future__ import annotations

import os

ENV = "COURSE_GRADER_DEVICE"
KINDS = ("cuda", "mps", "cpu")


def device_type(*, sandboxed: bool) -> str:
    """'cuda', 'mps' or 'cpu': the accelerator the kernel of this grading run has."""
    said = os.environ.get(ENV, "").strip().lower()
    if said:
        if said not in KINDS:
            raise ValueError(f"{ENV}={said!r}: expected one of {', '.join(KINDS)}")
        return said
    if sandboxed:
        return "cpu"
    import torch
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return "cpu"


def test_names(kind: str) -> dict:
    """What a test cell sees of it: `grader_device()`, the grader's own torch.device."""
    def grader_device():
        """The device this grader checks answers on besides CPU and meta: cuda, mps, or cpu
        when it has no accelerator. Decided by the grader, not by the student's kernel."""
        import torch
        return torch.device(kind)
    return {"grader_device": grader_device}


def kernel_source(kind: str) -> str:
    """`grader_device()` defined in the kernel, for an unguarded run whose tests run there."""
    if kind not in KINDS:
        raise ValueError(f"{kind!r}: expected one of {', '.join(KINDS)}")
    return ("def grader_device():\n"
            "    import torch\n"
            f"    return torch.device({kind!r})\n")
