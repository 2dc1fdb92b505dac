"""Before the first submission: start one kernel exactly as grading will, and stop with one
clear message if it cannot.

A kernel that cannot start is never a student's fault: the sandbox cannot reach the
interpreter (a Python under a private folder), a folder of the import path is not in the
sandbox's view, torch is missing. Without this check every student of the class gets a
"not graded" row and the reason sits in the log. With it, `grade-class`, nbgrader's
autograde (through the course's pre-convert hook) and the self-check stop before grading
anyone, with one message that names the path, the cause and the fix.

A process that passed the check says so in its environment (`PREFLIGHT_ENV`), so that the
nbgrader process `grade-class` starts for the same interpreter, user, temporary folder and
sandbox does not start a second test kernel.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import time

from nbformat import v4

from coursetools.grading import sandbox, warm
from coursetools.grading.execute import GUARD_TIMEOUT_S, KernelStartError, Outcome, execute_resilient

PREFLIGHT_ENV = "COURSE_KERNEL_PREFLIGHT"
# What the test kernel runs: the interpreter and torch, which every graded notebook needs.
PROBE = "import sys, torch\nprint(sys.executable, torch.__version__)"


class PreflightError(RuntimeError):
    """No kernel can be started as grading would start it; the message says why and how to fix it."""


def _key(config: sandbox.SandboxConfig, kernel_name: str) -> str:
    parts = [sys.executable, os.path.realpath(sys.executable), str(os.geteuid()), tempfile.gettempdir(),
             config.mode, repr(sorted(config.expose)), os.environ.get("PYTHONPATH", ""), kernel_name]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def needed_paths(config: sandbox.SandboxConfig) -> list[str]:
    """What a kernel needs to reach: its interpreter, its installation and import path."""
    roots = sandbox.python_roots()
    own = [os.path.abspath(p) for p in sys.path if p and os.path.isdir(p)]
    own = [p for p in own if any(p == r or p.startswith(r.rstrip("/") + "/") for r in roots)]
    return list(dict.fromkeys([sys.executable, *roots, *own, *sandbox.import_path_extras(config)]))


def _message(what: str, config: sandbox.SandboxConfig, detail: str) -> str:
    lines = [f"grading cannot start: {what}",
             f"  kernel: {sys.executable} ({'sandbox: ' + sandbox.kernel_user() if config.mode != 'off' else 'no sandbox'}); "
             f"temporary folder {tempfile.gettempdir()}"]
    if config.mode != "off":
        problems, sandbox_said = sandbox.diagnose(config, needed_paths(config))
        for item in problems:
            lines.append(f"  cause: {sandbox.explain(item)}")
        if sandbox_said and not problems and sandbox_said.strip() not in detail:
            lines.append(f"  the sandbox said: {sandbox_said[-1500:]}")
        if not problems:
            lines.append("  fix: see docs/GRADING_SECURITY.md, 'When grading stops before the first submission'")
    if detail:
        lines.append("  the kernel said: " + detail[-2000:].replace("\n", "\n    "))
    return "\n".join(lines)


def check(config: sandbox.SandboxConfig, *, kernel_name: str = "python3", force: bool = False) -> float:
    """Start one kernel as grading will (same sandbox, same interpreter), run `import torch`
    in it; raise PreflightError with the cause and the fix if that fails. Returns the
    seconds it took (0 when this process, or the one that started it, already passed)."""
    key = _key(config, kernel_name)
    if not force and os.environ.get(PREFLIGHT_ENV) == key:
        return 0.0
    start = time.monotonic()
    scratch = tempfile.mkdtemp(prefix="preflight-")
    nb = v4.new_notebook(cells=[v4.new_code_cell(PROBE)])
    env = sandbox.sandbox_env(config) if config.mode != "off" else None
    try:
        report = execute_resilient(
            nb, cwd=scratch, timeout=GUARD_TIMEOUT_S, kernel_name=kernel_name, max_restarts=0,
            env=env, guarded=False, budget=2 * GUARD_TIMEOUT_S,
            client_kwargs={"kernel_manager_class": warm.kernel_manager_for(config, scratch)})
    except KernelStartError as exc:
        raise PreflightError(_message("a kernel does not start here.", config, exc.stderr or str(exc))) from exc
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if report.outcomes[0] is not Outcome.OK:
        said = "\n".join(o.get("text", "") or f"{o.get('ename', '')}: {o.get('evalue', '')}"
                         for o in nb.cells[0].outputs)
        raise PreflightError(_message("a kernel starts but cannot `import torch`.", config, said))
    os.environ[PREFLIGHT_ENV] = key
    return time.monotonic() - start
