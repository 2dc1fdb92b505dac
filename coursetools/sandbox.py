"""Run a student's kernel where it cannot touch the grader: bubblewrap plus resource limits.

The kernel runs inside `bwrap` (Debian's `bubblewrap`):

* the whole file system is read-only;
* the course folder (gradebook, solutions with hidden tests, other students' submissions,
  autograded notebooks), the grader's home folder, `/tmp` and PostgreSQL's socket folders
  are replaced by empty, throw-away folders — the submission cannot read or change them;
* only a scratch folder (the kernel's working folder, deleted after grading) and the
  kernel's own connection folder are writable;
* no network: a private network namespace with only a loopback interface (so a DDP
  rendezvous on 127.0.0.1 still works); private process and IPC namespaces; the kernel
  dies with the grader;
* `prlimit` caps the kernel's memory (data segment), CPU seconds and open files; a cell
  over the memory limit gets a `MemoryError`, a kernel over the CPU limit is killed.

The kernel talks to the grader over Unix sockets in the connection folder (ZeroMQ's `ipc`
transport), since the sandbox has no shared network.

Not protected against: reading world-readable files elsewhere on the machine (system
files, other users' readable files), kernel exploits, and — inside the kernel itself —
code that defeats the in-kernel tamper checks (see coursetools.guard): those are flagged
for review, not prevented.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager

MODES = ("auto", "bwrap", "off")


class SandboxUnavailable(RuntimeError):
    pass


@dataclass(frozen=True)
class SandboxConfig:
    mode: str = "auto"  # auto: bwrap when it works here, else no sandbox (with a warning)
    memory_mb: int = 4096  # RLIMIT_DATA of the kernel and every process it starts
    cpu_seconds: int = 1800  # RLIMIT_CPU per process
    open_files: int = 4096
    hide: tuple[str, ...] = ()  # folders replaced by an empty tmpfs (the course root, ...)
    expose: tuple[str, ...] = ()  # read-only folders re-exposed inside hidden ones
    extra_hide: tuple[str, ...] = field(default=("/run/postgresql", "/var/run/postgresql"))


@functools.cache
def bwrap_works() -> tuple[bool, str]:
    """Whether bubblewrap can create the namespaces the sandbox needs on this machine."""
    exe = shutil.which("bwrap")
    if exe is None:
        return False, "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
    probe = [exe, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-net",
             "--unshare-pid", "--unshare-ipc", "--die-with-parent", "--", "true"]
    try:
        proc = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"bwrap failed to start: {exc}"
    if proc.returncode != 0:
        return False, f"bwrap cannot create namespaces here: {proc.stderr.strip()[:200]}"
    return True, exe


def resolve_mode(mode: str) -> str:
    """'auto' -> 'bwrap' where it works, else 'off'. 'bwrap' where it does not -> error."""
    if mode not in MODES:
        raise ValueError(f"sandbox mode must be one of {MODES}, got {mode!r}")
    if mode == "off":
        return "off"
    ok, detail = bwrap_works()
    if ok:
        return "bwrap"
    if mode == "bwrap":
        raise SandboxUnavailable(detail)
    return "off"


# The only variables a sandboxed kernel inherits: no tokens, keys or passwords leak in.
SAFE_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TERM", "PYTHONHASHSEED",
            "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


def sandbox_env(config: SandboxConfig | None = None) -> dict[str, str]:
    """The kernel's environment: SAFE_ENV, plus the PYTHONPATH folders the sandbox shows
    (`import_path_extras`: never the course folder)."""
    env = {k: v for k, v in os.environ.items() if k in SAFE_ENV}
    env.update(HOME="/tmp", PYTHONDONTWRITEBYTECODE="1")
    extras = import_path_extras(_protected(config)) if config else []
    if extras:
        env["PYTHONPATH"] = os.pathsep.join(extras)
    return env


def _protected(config: SandboxConfig) -> list[str]:
    return _existing([*config.hide, os.path.expanduser("~")])


def python_roots() -> list[str]:
    """Folders the kernel's Python needs to see (re-exposed if a hidden folder covers them)."""
    roots = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    return sorted(r for r in roots if r)


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def import_path_extras(protected: list[str]) -> list[str]:
    """PYTHONPATH folders (packages installed with `pip --target`, say), which the kernel
    inherits and needs to see, except any inside or around a protected folder: the course
    root stays hidden even when a tool put it on PYTHONPATH."""
    extras = []
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if not entry or not os.path.isdir(entry):
            continue
        entry = os.path.realpath(entry)
        if any(_inside(entry, p) or _inside(p, entry) for p in protected):
            continue
        extras.append(entry)
    return extras


def _existing(paths) -> list[str]:
    return [p for p in dict.fromkeys(os.path.realpath(p) for p in paths) if os.path.isdir(p)]


def wrap_command(cmd: list[str], config: SandboxConfig, *, writable: list[str]) -> list[str]:
    """The kernel command `cmd`, inside bwrap with limits (or with limits only, mode 'off')."""
    limits = [shutil.which("prlimit") or "prlimit",
              f"--data={config.memory_mb * 2**20}", f"--cpu={config.cpu_seconds}",
              f"--nofile={config.open_files}", "--core=0", "--"]
    if shutil.which("prlimit") is None:
        limits = []
    if config.mode == "off":
        return limits + cmd
    ok, exe = bwrap_works()
    if not ok:
        raise SandboxUnavailable(exe)
    hidden = _existing(["/tmp", *config.hide, *config.extra_hide, os.path.expanduser("~")])
    args = [exe, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for path in hidden:
        args += ["--tmpfs", path]
    # The Python running the kernel, its PYTHONPATH, and anything asked for stay visible
    # (read-only) even when a hidden folder covers them (e.g. the course's own .venv).
    for path in _existing([*python_roots(), *import_path_extras(_protected(config)), *config.expose]):
        if any(_inside(path, h) for h in hidden):
            args += ["--ro-bind", path, path]
    for path in writable:
        args += ["--bind", path, path]
    args += ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--die-with-parent",
             "--new-session", "--setenv", "HOME", "/tmp",
             # ipykernel exits when its parent looks gone (parent pid 1), which is what any
             # parent outside a PID namespace looks like; --die-with-parent does that job.
             "--unsetenv", "JPY_PARENT_PID", "--"]
    return args + limits + cmd


class SandboxedKernelManager(AsyncKernelManager):
    """A kernel manager whose kernel runs inside the sandbox, over Unix sockets.

    Subclass it with `kernel_manager_for(...)`, which fixes the configuration and the
    writable scratch folder.
    """

    sandbox_config: SandboxConfig = SandboxConfig(mode="off")
    scratch: str = ""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._runtime = tempfile.mkdtemp(prefix="kernel-")
        self.transport = "ipc"
        self.connection_file = os.path.join(self._runtime, "kernel.json")
        self.ip = os.path.join(self._runtime, "ipc")

    def format_kernel_cmd(self, extra_arguments=None):
        cmd = super().format_kernel_cmd(extra_arguments)
        writable = [self._runtime] + ([self.scratch] if self.scratch else [])
        return wrap_command(cmd, self.sandbox_config, writable=writable)

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        if not restart:
            shutil.rmtree(self._runtime, ignore_errors=True)


def kernel_manager_for(config: SandboxConfig, scratch: str | Path) -> type[SandboxedKernelManager]:
    """A kernel manager class for one notebook's run, in `scratch` (writable)."""
    return type("SandboxedKernelManagerForRun", (SandboxedKernelManager,),
                {"sandbox_config": config, "scratch": str(scratch)})
