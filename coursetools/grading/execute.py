"""Execute a notebook cell by cell so that one crash or hang costs one cell, not the rest.

nbclient (like nbgrader's Execute) gives up on a notebook when its kernel dies, and a cell
that loops forever stalls every later one. Here each code cell runs with a time limit; when
a cell kills the kernel or outlives its limit, that cell gets an error output saying so, a
fresh kernel is started, the code cells that had already run cleanly (except test cells,
which define nothing later cells need) are replayed, and execution goes on with the next
cell. Later cells that needed what the broken cell would have defined fail on their own.

A cell's result is decided from the kernel protocol, not from the outputs the notebook
ends up with: the `execute_reply` status, and every `error` and stderr message the kernel
published while the cell ran (code in the kernel can clear or fake outputs afterwards, not
un-send a message). When the notebook has test cells, the tamper checks of
coursetools.grading.guard run before and after each of them (`guarded`), and test cells reach the
kernel compiled, so hidden tests never arrive as text. The whole notebook has a time
budget (`budget`): when it runs out, the running cell is stopped and the rest never run.
"""

from __future__ import annotations

import copy
import enum
import math
import os
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty
from typing import Any, Callable

from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionComplete, CellTimeoutError, DeadKernelError
from nbclient.util import ensure_async
from nbformat import NotebookNode, v4
from traitlets import Integer

from coursetools.grading import guard, hardware, remote, warm
from coursetools import notebooks

# One place for the limits: the self-check (coursetools.learner.selfcheck), grade-class
# (nbgrader_config.py's ResilientExecute) and the author checks read these.
CELL_TIMEOUT_S = 180  # per cell: chapter 06's graded cell launches 2 processes (up to 42 s seen on 2 cores)
SUBMISSION_BUDGET_S = 5 * CELL_TIMEOUT_S  # per notebook, kernel starts and restarts included
BUDGET_ENAME = "SubmissionBudgetExceeded"
GUARD_TIMEOUT_S = 120  # a tamper-check cell of the grader's (it imports torch once)
ERROR_FLOOR_BYTES = 2_000  # an error output keeps this much even past the output caps (it is evidence)
FORGED_REPLY = ("the kernel answered this cell twice (two replies or two idle statuses): code in the "
                "kernel sent a forged result before the real one")


class KernelStartError(RuntimeError):
    """The kernel could not be started at all: the grader's problem, not the notebook's.
    `stderr`: what the kernel's process wrote before it died (the last few KiB)."""

    def __init__(self, message: str, stderr: str = ""):
        super().__init__(message)
        self.stderr = stderr


class Outcome(enum.Enum):
    OK = "ok"
    ERROR = "error"  # raised, or wrote to stderr
    TIMEOUT = "timeout"
    CRASHED = "crashed"  # the kernel died while this cell ran
    NOT_RUN = "not run"


@dataclass
class ExecutionReport:
    outcomes: list[Outcome]
    restarts: int = 0
    gave_up_at: int | None = None  # index of the first cell left unrun after too many restarts
    notes: list[str] = field(default_factory=list)
    tampering: dict[int, str] = field(default_factory=dict)  # test cell index -> what changed
    forged: dict[int, str] = field(default_factory=dict)  # cell index -> a forged reply seen
    budget_exceeded_at: int | None = None  # the cell running when the budget ran out
    seconds: float = 0.0
    dropped_output_bytes: int = 0
    sent: set[str] = field(default_factory=set)  # every string the grader sent the kernel's agent
    received: set[str] = field(default_factory=set)  # every string the agent answered with


def _size(value: Any) -> int:
    """Bytes of text in a message's content, without copying it (a repr of 200 MiB would)."""
    if isinstance(value, (str, bytes)):
        return len(value)
    if isinstance(value, dict):
        return sum(_size(k) + _size(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return sum(_size(v) for v in value)
    return 8


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit:,} characters cut: over the output cap]"


def truncated_error(content: dict, budget: int) -> dict:
    """An error message's content cut to about `budget` bytes: its name, the start of its
    message and the last frames of its traceback (an error is kept, cut, never dropped)."""
    budget = max(budget, ERROR_FLOOR_BYTES)
    out = dict(content)
    out["ename"] = _cut(str(content.get("ename", "")), 200)
    out["evalue"] = _cut(str(content.get("evalue", "")), budget // 2)
    frames, left = [], budget // 2
    for frame in reversed(list(content.get("traceback") or [])):
        frame = _cut(str(frame), max(left, 0))
        if left <= 0:
            break
        frames.insert(0, frame)
        left -= len(frame)
    out["traceback"] = frames
    return out


class CappedClient(NotebookClient):
    """A NotebookClient that keeps at most `max_output_bytes` of output per cell and
    `max_total_output_bytes` per notebook (display updates and error messages included), and
    records, per cell, the evidence the verdict uses: the execute_reply, whether any `error`
    or stderr message arrived on iopub (whatever happened to the outputs afterwards), and how
    many replies and idle statuses the kernel sent for each request (more than one: a forged
    reply, sent by code in the kernel before the real one).
    """

    max_output_bytes = Integer(2_000_000, help="Output kept per cell, bytes").tag(config=True)
    max_total_output_bytes = Integer(20_000_000, help="Output kept per notebook, bytes").tag(config=True)

    def __init__(self, *args, runtime_dir: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.evidence: dict[int, set[str]] = {}
        self.replies: dict[int, dict] = {}
        self.requests: dict[int, str] = {}  # cell index -> msg_id of its execute_request
        self.reply_count: Counter[str] = Counter()
        self.idle_count: Counter[str] = Counter()
        self.dropped = 0
        self._runtime_dir = runtime_dir
        self.on_cell_executed = self._record_reply

    def create_kernel_manager(self):
        km = super().create_kernel_manager()
        if self._runtime_dir and not hasattr(km, "_runtime"):  # the sandbox's has its own folder
            km.connection_file = os.path.join(self._runtime_dir, f"kernel-{uuid.uuid4().hex}.json")
        return km

    def _record_reply(self, cell, cell_index, execute_reply):
        reply = execute_reply or {}
        content = dict(reply.get("content", {}))
        for key in ("evalue", "traceback"):  # the reply repeats the error: kept small too
            if key in content:
                content[key] = _cut(str(content[key]), ERROR_FLOOR_BYTES) if key == "evalue" else []
        self.replies[cell_index] = content
        request = (reply.get("parent_header") or {}).get("msg_id")
        if request:
            self.requests[cell_index] = request

    def _count(self, channel: str, msg: dict) -> None:
        request = (msg.get("parent_header") or {}).get("msg_id")
        if not request:
            return
        kind = msg.get("msg_type")
        if channel == "shell" and kind == "execute_reply":
            self.reply_count[request] += 1
        elif channel == "iopub" and kind == "status" and (msg.get("content") or {}).get("execution_state") == "idle":
            self.idle_count[request] += 1

    def forged_cells(self) -> list[int]:
        """Cells whose request got more than one reply or idle status: the first of them, which
        made the client take the cell as done, was forged by code in the kernel. (Messages of a
        cell that arrive after it was done are read while the next cell runs; the grader's
        check after each test is that next cell.)"""
        return [i for i, request in self.requests.items()
                if self.reply_count[request] > 1 or self.idle_count[request] > 1]

    # nbclient 0.10-0.11's own loops, with every message counted (nbclient drops those of
    # earlier requests without a word).
    async def async_wait_for_reply(self, msg_id, cell=None):
        assert self.kc is not None
        timeout = self._get_timeout(cell)
        cummulative_time = 0
        while True:
            try:
                msg = await ensure_async(self.kc.shell_channel.get_msg(timeout=self.shell_timeout_interval))
            except Empty:
                await self._async_check_alive()
                cummulative_time += self.shell_timeout_interval
                if timeout and cummulative_time > timeout:
                    await self._async_handle_timeout(timeout, cell)
                    break
            else:
                self._count("shell", msg)
                if msg["parent_header"].get("msg_id") == msg_id:
                    return msg
        return None

    async def _async_poll_output_msg(self, parent_msg_id, cell, cell_index):
        assert self.kc is not None
        while True:
            msg = await ensure_async(self.kc.iopub_channel.get_msg(timeout=None))
            self._count("iopub", msg)
            if msg["parent_header"].get("msg_id") == parent_msg_id:
                try:
                    self.process_message(msg, cell, cell_index)
                except CellExecutionComplete:
                    return

    def _cap_note(self, outs, cell_index):
        counts = self.__dict__.setdefault("_output_bytes", {})
        if counts.get(cell_index, 0) <= self.max_output_bytes:  # say so once per cell
            outs.append(v4.new_output(
                "stream", name="stdout",
                text=f"\n[output truncated: this cell printed more than "
                     f"{self.max_output_bytes:,} bytes (or the notebook more than "
                     f"{self.max_total_output_bytes:,})]\n"))
            counts[cell_index] = self.max_output_bytes + 1

    def process_message(self, msg, cell, cell_index):
        kind = msg["msg_type"]
        content = msg.get("content") or {}
        seen = self.evidence.setdefault(cell_index, set())
        if kind == "error":
            seen.add("error")
        elif kind == "stream" and content.get("name") == "stderr":
            seen.add("stderr")
        elif kind == "update_display_data" and _size(content) > self.max_output_bytes:
            # An update replaces an earlier output's data wherever it is shown: over the
            # per-cell cap it is dropped, never kept.
            self.dropped += _size(content)
            self._cap_note(cell.outputs, cell_index)
            return None
        return super().process_message(msg, cell, cell_index)

    def output(self, outs, msg, display_id, cell_index):
        counts = self.__dict__.setdefault("_output_bytes", {})
        used = counts.get(cell_index, 0)
        total = self.__dict__.get("_total_bytes", 0)
        size = _size(msg.get("content", ""))
        room = min(self.max_output_bytes - used, self.max_total_output_bytes - total)
        if msg["msg_type"] == "error":
            if size > room:  # an error is evidence: kept, cut to what the caps leave
                msg = dict(msg, content=truncated_error(msg.get("content") or {}, room))
                cut = _size(msg["content"])
                self.dropped += size - cut
                size = cut
        elif size > room:
            self.dropped += size
            self._cap_note(outs, cell_index)
            return None
        counts[cell_index] = used + size
        self.__dict__["_total_bytes"] = total + size
        return super().output(outs, msg, display_id, cell_index)


class _RestartKernel(Exception):
    """A cell left the kernel unusable (out of memory): restart before the next cell."""


class _BudgetSpent(Exception):
    """The notebook's time budget ran out."""


def _ran_out_of_memory(cell: NotebookNode) -> bool:
    return any(o.output_type == "error" and o.get("ename") == "MemoryError" for o in cell.outputs)


def error_output(ename: str, evalue: str) -> NotebookNode:
    return v4.new_output("error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


def _has_error(cell: NotebookNode) -> bool:
    return any(
        o.output_type == "error" or (o.output_type == "stream" and o.get("name") == "stderr")
        for o in cell.get("outputs", [])
    )


def _failed(cell: NotebookNode, reply: dict | None, evidence: set[str]) -> bool:
    """The cell failed by any evidence: its reply's status, an error or stderr message sent
    while it ran, or what its outputs still show."""
    return (reply is None or reply.get("status") != "ok") or bool(evidence) or _has_error(cell)


def _reply_error(cell: NotebookNode, reply: dict | None, evidence: set[str]) -> None:
    """Make the cell's outputs show a failure the protocol saw but the outputs hide (cleared
    or replaced by code in the kernel), so every later reader (nbgrader) sees it."""
    if _has_error(cell):
        return
    if reply is not None and reply.get("status") == "error":
        ename, evalue = reply.get("ename", "Error"), reply.get("evalue", "")
    elif "stderr" in evidence:
        ename, evalue = "StderrWritten", "the cell wrote to stderr (the output was then hidden)"
    else:
        ename, evalue = "HiddenError", (f"the kernel reported status {(reply or {}).get('status')!r} "
                                        "or an error the outputs no longer show")
    cell.outputs.insert(0, error_output(ename, evalue))


def _mark_forged(nb: NotebookNode, client: CappedClient, outcomes: list[Outcome],
                 report: ExecutionReport) -> None:
    """A cell the kernel answered twice failed, whatever the first (forged) answer said."""
    for i in client.forged_cells():
        if i in report.forged:
            continue
        report.forged[i] = FORGED_REPLY
        outcomes[i] = Outcome.ERROR
        nb.cells[i].outputs.insert(0, error_output(guard.TAMPER_ENAME, FORGED_REPLY))
        report.notes.append(f"cell {i}: {FORGED_REPLY}")


class StderrTail:
    """The kernel process's own stderr (not the notebook's stderr stream, which travels over
    the kernel protocol): what the interpreter, the sandbox or a crash writes there. Read by
    a thread so the kernel never blocks on it; only the last `limit` bytes are kept, shown
    when the kernel dies before it could answer."""

    def __init__(self, limit: int = 8192):
        self.limit = limit
        self._buf = bytearray()
        read_fd, self.fd = os.pipe()
        self._thread = threading.Thread(target=self._drain, args=(read_fd,), daemon=True)
        self._thread.start()

    def _drain(self, read_fd: int) -> None:
        with os.fdopen(read_fd, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65536):
                self._buf += chunk
                del self._buf[:-self.limit]

    def close(self) -> None:
        """Close this process's end (the kernel keeps its own until it exits)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def text(self, wait: float = 2.0) -> str:
        """What arrived so far (after the kernel exited: all of it, up to `limit`)."""
        self.close()
        self._thread.join(wait)
        return bytes(self._buf).decode("utf-8", "replace").strip()


def _kernel_env(env: dict[str, str] | None, private: str) -> dict[str, str]:
    out = dict(os.environ if env is None else env)
    if env is None:  # not sandboxed: keep the kernel's files (cell sources, history) in `private`
        out.update(TMPDIR=private, IPYTHONDIR=os.path.join(private, "ipython"))
    return out


def course_helpers(nb: NotebookNode) -> str:
    """The helpers cell of a notebook of the course's own (solutions/, the gradebook's
    copy, or a notebook rebuilt from them): the first code cell with grade_id `helpers`."""
    return next((c.source for c in nb.cells if c.cell_type == "code" and not notebooks.is_test_cell(c)
                 and notebooks.grade_id(c) == "helpers"), "")


def execute_resilient(
    nb: NotebookNode,
    *,
    cwd: str | Path,
    timeout: int = CELL_TIMEOUT_S,
    kernel_name: str = "python3",
    max_restarts: int = 3,
    is_replayable: Callable[[NotebookNode], bool] | None = None,
    client_kwargs: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    guarded: bool = True,
    budget: float | None = SUBMISSION_BUDGET_S,
    inspect_kernel: Callable[[int], None] | None = None,
    helpers_source: str | None = None,
) -> ExecutionReport:
    """Run every code cell of `nb` in place (outputs are written into the cells).

    `is_replayable(cell)` says which cleanly-run cells are replayed in a fresh kernel after
    a crash; by default every code cell except nbgrader test cells. `client_kwargs` go to
    `nbclient.NotebookClient` (e.g. a sandboxing `kernel_manager_class`); `env` is the
    kernel's environment (default: this process's). `guarded`: tamper checks around test
    cells, and test cells sent compiled (coursetools.grading.guard); a failed check fails its test
    cell with a `TamperingDetected` error. `budget`: seconds for the whole notebook.
    """
    if is_replayable is None:
        def is_replayable(cell: NotebookNode) -> bool:
            return not notebooks.is_test_cell(cell)

    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    session = None
    run_nb = nb
    if guarded and any(c.cell_type == "code" and notebooks.is_test_cell(c) for c in nb.cells):
        # Tests run in this process (coursetools.grading.remote); the kernel gets the agent.
        helpers = helpers_source if helpers_source is not None else course_helpers(nb)
        session = remote.TestSession(helpers, (client_kwargs or {}).get("max_output_bytes", 2_000_000), cwd=cwd,
                                     accelerator=hardware.device_type(sandboxed=env is not None))
        # A tensor class the course's helpers cell defines (02's stand-in) is the course's: the
        # agent trusts the cell whose text is the course's own, never a submitted variant.
        init = remote.init_code((helpers,) if helpers else (), session.agent_name)
        if any("meta" in c.source for c in nb.cells if c.cell_type == "code"):
            # PyTorch's first operation on the meta device imports hundreds of modules (1.6 s
            # idle, 6-10 s on a loaded machine): done here, under the grader's own time limit,
            # it is not charged to whichever student cell or test happens to come first.
            init += "\n__import__('torch').zeros(1, device='meta').add_(1)"
        run_nb = v4.new_notebook(metadata=nb.metadata)
        run_nb.cells = [guard._guard_cell(init, "init"), *nb.cells]
    elif any(c.cell_type == "code" and notebooks.is_test_cell(c) for c in nb.cells):
        # Unguarded (an instructor's --no-tamper-checks): the tests run in the kernel, and
        # `grader_device()`, which the grader puts in a guarded test's namespace, is defined
        # there, with the grader's answer (coursetools/grading/hardware.py).
        kind = hardware.device_type(sandboxed=env is not None)
        run_nb = v4.new_notebook(metadata=nb.metadata)
        run_nb.cells = [guard._guard_cell(hardware.kernel_source(kind), "init"), *nb.cells]
    client_kwargs = dict(client_kwargs or {})
    if "kernel_manager_class" not in client_kwargs and warm.enabled():
        client_kwargs["kernel_manager_class"] = warm.PlainWarmKernelManager
    private = tempfile.mkdtemp(prefix="kernel-files-")
    try:
        report = _run(run_nb, cwd=cwd, timeout=timeout, kernel_name=kernel_name,
                      max_restarts=max_restarts, is_replayable=is_replayable,
                      client_kwargs=client_kwargs, env=_kernel_env(env, private),
                      budget=budget, private=private, session=session, inspect_kernel=inspect_kernel)
    finally:
        if session is not None:
            session.close()
        shutil.rmtree(private, ignore_errors=True)
    if run_nb is nb:
        return report
    if session is not None:
        report.sent = set(session.sent)
        report.received = set(session.received)
    # Map the run (the grader's cell first) back onto the notebook's own cells.
    shift = lambda j: j - 1 if j is not None and j > 0 else (None if j is None else 0)
    report.outcomes = report.outcomes[1:]
    report.forged = {i - 1: m for i, m in report.forged.items() if i > 0}
    report.budget_exceeded_at = shift(report.budget_exceeded_at)
    report.gave_up_at = shift(report.gave_up_at)
    return report


def _run(nb, *, cwd, timeout, kernel_name, max_restarts, is_replayable, client_kwargs, env,
         budget, private, session=None, inspect_kernel=None) -> ExecutionReport:
    def replayable(cell: NotebookNode) -> bool:
        role = guard.guard_role(cell)
        if role is not None:
            return role in ("init", "locked")
        return is_replayable(cell)

    outcomes = [Outcome.NOT_RUN] * len(nb.cells)
    report = ExecutionReport(outcomes)
    replay: list[int] = []
    index = 0
    start = time.monotonic()
    deadline = start + budget if budget else math.inf

    def limit(cell_limit: float = timeout) -> int:
        left = deadline - time.monotonic()
        if left <= 0:
            raise _BudgetSpent()
        return max(1, min(cell_limit, math.ceil(left)))

    def run_cell(client, cell, i):
        # The grader's own cells (importing torch, taking the snapshot) get their own limit,
        # not the student's per-cell one, which a test may set to a few seconds.
        client.timeout = limit(max(timeout, GUARD_TIMEOUT_S) if guard.guard_role(cell) else timeout)
        client.evidence[i] = set()
        client.replies.pop(i, None)
        if session is not None and notebooks.is_test_cell(cell):
            result = remote.run_test(client.km, cell.source, notebooks.grade_id(cell) or str(i), session,
                                     deadline=time.monotonic() + client.timeout)
            cell.outputs = result.outputs
            if result.timed_out:
                raise CellTimeoutError(f"the test ran longer than the {client.timeout} s limit")
            if result.crashed:
                raise DeadKernelError("the kernel died while the test ran")
            client.replies[i] = {"status": "ok" if result.ok else "error"}
            return client.replies[i], set()
        client.execute_cell(cell, i, store_history=guard.keeps_history(cell))
        return client.replies.get(i), client.evidence.get(i, set())

    dropped = 0
    while index < len(nb.cells):
        client = CappedClient(
            nb,
            timeout=timeout,
            kernel_name=kernel_name,
            allow_errors=True,
            interrupt_on_timeout=False,
            shutdown_kernel="immediate",
            resources={"metadata": {"path": str(cwd)}},
            runtime_dir=private,
            **(client_kwargs or {}),
        )
        replaying: int | None = None
        started = False
        kernel_stderr = StderrTail()
        try:
            limit()
            with client.setup_kernel(env=env, stdout=subprocess.DEVNULL, stderr=kernel_stderr.fd):
                started = True
                kernel_stderr.close()
                for i in list(replay):
                    replaying = i
                    # Replay into a copy: the cell keeps the outputs of its first run.
                    run_cell(client, copy.deepcopy(nb.cells[i]), i)
                replaying = None
                while index < len(nb.cells):
                    cell = nb.cells[index]
                    if cell.cell_type == "code" and cell.source.strip():
                        reply, evidence = run_cell(client, cell, index)
                        if _failed(cell, reply, evidence):
                            outcomes[index] = Outcome.ERROR
                            _reply_error(cell, reply, evidence)
                            if _ran_out_of_memory(cell):
                                # What the cell allocated may still be held: later cells
                                # would fail for want of memory. Start afresh without it.
                                index += 1
                                raise _RestartKernel()
                        else:
                            outcomes[index] = Outcome.OK
                            if replayable(cell):
                                replay.append(index)
                    elif cell.cell_type == "code":
                        outcomes[index] = Outcome.OK
                    index += 1
                if inspect_kernel is not None:
                    process = getattr(getattr(client.km, "provisioner", None), "process", None)
                    inspect_kernel(process.pid if process is not None else -1)
        except _BudgetSpent:
            _mark_forged(nb, client, outcomes, report)
            report.budget_exceeded_at = index
            report.notes.append(f"cell {index}: the notebook's time budget ran out")
            dropped += client.dropped
            break
        except _RestartKernel:
            _mark_forged(nb, client, outcomes, report)
            report.restarts += 1
            report.notes.append(f"cell {index - 1}: out of memory, kernel restarted")
            if report.restarts > max_restarts:
                report.gave_up_at = index if index < len(nb.cells) else None
                dropped += client.dropped
                break
        except (DeadKernelError, CellTimeoutError, RuntimeError) as exc:
            _mark_forged(nb, client, outcomes, report)
            # RuntimeError: nbclient's "Kernel died before replying to kernel_info".
            if not started:
                if time.monotonic() >= deadline:
                    report.budget_exceeded_at = index
                    break
                said = kernel_stderr.text()
                raise KernelStartError(f"the kernel did not start: {exc}"
                                       + (f"\nthe kernel's stderr:\n{said}" if said else ""),
                                       stderr=said) from exc
            report.restarts += 1
            budget_cut = isinstance(exc, CellTimeoutError) and time.monotonic() >= deadline - 0.5
            if replaying is not None:
                # A cell that ran cleanly once broke on replay: stop replaying it.
                replay.remove(replaying)
                report.notes.append(f"cell {replaying}: broke when replayed ({exc!r})")
            elif index < len(nb.cells):
                cell = nb.cells[index]
                # Keep what the cell printed; drop the kernel's own traceback of the interrupt.
                cell.outputs = [o for o in cell.outputs
                                if o.output_type == "stream" and o.get("name") == "stdout"]
                if budget_cut:
                    outcomes[index] = Outcome.TIMEOUT
                    cell.outputs.append(error_output(
                        BUDGET_ENAME,
                        f"the notebook's time budget ({budget:g} s for all its cells) ran out while "
                        "this cell ran; it and every later cell were stopped"))
                elif isinstance(exc, CellTimeoutError):
                    outcomes[index] = Outcome.TIMEOUT
                    cell.outputs.append(error_output(
                        "CellTimeoutError",
                        f"this cell ran longer than the {client.timeout} s limit and was stopped "
                        "(an endless loop?)"))
                else:
                    outcomes[index] = Outcome.CRASHED
                    # Whether the kernel announced the cell's number before it died is a race:
                    # the graded notebook must not depend on it (parallel equals serial).
                    cell.execution_count = None
                    cell.outputs.append(error_output(
                        "DeadKernelError",
                        "the Python kernel died while this cell ran (os._exit, a segfault, "
                        "or running out of memory)"))
                report.notes.append(f"cell {index}: {outcomes[index].value}")
                index += 1
            dropped += client.dropped
            if budget_cut:
                report.budget_exceeded_at = index - 1 if replaying is None else index
                break
            if report.restarts > max_restarts:
                report.gave_up_at = index if index < len(nb.cells) else None
                break
        else:
            _mark_forged(nb, client, outcomes, report)
            dropped += client.dropped
        finally:
            kernel_stderr.close()
    report.dropped_output_bytes = dropped
    report.seconds = time.monotonic() - start
    # Cells that never ran say so, so no grader can mistake "no output" for "passed".
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and outcomes[i] is Outcome.NOT_RUN and cell.source.strip():
            if report.budget_exceeded_at is not None:
                cell.outputs = [error_output(
                    BUDGET_ENAME, f"this cell never ran: the notebook's time budget ({budget:g} s) "
                                  "ran out before it")]
            else:
                cell.outputs = [error_output(
                    "NotExecuted",
                    "this cell never ran: the kernel crashed or hung too often before it")]
    return report
