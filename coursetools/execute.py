"""Execute a notebook cell by cell so that one crash or hang costs one cell, not the rest.

nbclient (like nbgrader's Execute) gives up on a notebook when its kernel dies, and a cell
that loops forever stalls every later one. Here each code cell runs with a time limit; when
a cell kills the kernel or outlives its limit, that cell gets an error output saying so, a
fresh kernel is started, the code cells that had already run cleanly (except test cells,
which define nothing later cells need) are replayed, and execution goes on with the next
cell. Later cells that needed what the broken cell would have defined fail on their own.
"""

from __future__ import annotations

import copy
import enum
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat import NotebookNode, v4
from traitlets import Integer

from . import notebooks


class KernelStartError(RuntimeError):
    """The kernel could not be started at all: the grader's problem, not the notebook's."""


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


class CappedClient(NotebookClient):
    """A NotebookClient that keeps at most `max_output_bytes` of output per cell.

    A cell printing gigabytes would otherwise fill the grader's memory before anything
    could trim it; the rest of such output is dropped (errors are always kept).
    """

    max_output_bytes = Integer(2_000_000, help="Output kept per cell, bytes").tag(config=True)

    def output(self, outs, msg, display_id, cell_index):
        counts = self.__dict__.setdefault("_output_bytes", {})
        used = counts.get(cell_index, 0)
        size = len(repr(msg.get("content", "")))
        if msg["msg_type"] != "error" and used + size > self.max_output_bytes:
            if used <= self.max_output_bytes:  # say so once
                outs.append(v4.new_output(
                    "stream", name="stdout",
                    text=f"\n[output truncated: this cell printed more than "
                         f"{self.max_output_bytes:,} bytes]\n"))
                counts[cell_index] = self.max_output_bytes + 1
            return None
        counts[cell_index] = used + size
        return super().output(outs, msg, display_id, cell_index)


class _RestartKernel(Exception):
    """A cell left the kernel unusable (out of memory): restart before the next cell."""


def _ran_out_of_memory(cell: NotebookNode) -> bool:
    return any(o.output_type == "error" and o.get("ename") == "MemoryError" for o in cell.outputs)


def error_output(ename: str, evalue: str) -> NotebookNode:
    return v4.new_output("error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


def _has_error(cell: NotebookNode) -> bool:
    return any(
        o.output_type == "error" or (o.output_type == "stream" and o.get("name") == "stderr")
        for o in cell.get("outputs", [])
    )


def execute_resilient(
    nb: NotebookNode,
    *,
    cwd: str | Path,
    timeout: int = 60,
    kernel_name: str = "python3",
    max_restarts: int = 3,
    is_replayable: Callable[[NotebookNode], bool] | None = None,
    client_kwargs: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
) -> ExecutionReport:
    """Run every code cell of `nb` in place (outputs are written into the cells).

    `is_replayable(cell)` says which cleanly-run cells are replayed in a fresh kernel after
    a crash; by default every code cell except nbgrader test cells. `client_kwargs` go to
    `nbclient.NotebookClient` (e.g. a sandboxing `kernel_manager_class`); `env` is the
    kernel's environment (default: this process's).
    """
    if is_replayable is None:
        def is_replayable(cell: NotebookNode) -> bool:
            return not notebooks.is_test_cell(cell)

    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    outcomes = [Outcome.NOT_RUN] * len(nb.cells)
    report = ExecutionReport(outcomes)
    replay: list[int] = []
    index = 0
    while index < len(nb.cells):
        client = CappedClient(
            nb,
            timeout=timeout,
            kernel_name=kernel_name,
            allow_errors=True,
            interrupt_on_timeout=False,
            shutdown_kernel="immediate",
            resources={"metadata": {"path": str(cwd)}},
            **(client_kwargs or {}),
        )
        replaying: int | None = None
        started = False
        try:
            with client.setup_kernel(env=dict(os.environ if env is None else env), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL):
                started = True
                for i in list(replay):
                    replaying = i
                    # Replay into a copy: the cell keeps the outputs of its first run.
                    client.execute_cell(copy.deepcopy(nb.cells[i]), i)
                replaying = None
                while index < len(nb.cells):
                    cell = nb.cells[index]
                    if cell.cell_type == "code" and cell.source.strip():
                        client.execute_cell(cell, index)
                        if _has_error(cell):
                            outcomes[index] = Outcome.ERROR
                            if _ran_out_of_memory(cell):
                                # What the cell allocated may still be held: later cells
                                # would fail for want of memory. Start afresh without it.
                                index += 1
                                raise _RestartKernel()
                        else:
                            outcomes[index] = Outcome.OK
                            if is_replayable(cell):
                                replay.append(index)
                    elif cell.cell_type == "code":
                        outcomes[index] = Outcome.OK
                    index += 1
        except _RestartKernel:
            report.restarts += 1
            report.notes.append(f"cell {index - 1}: out of memory, kernel restarted")
            if report.restarts > max_restarts:
                report.gave_up_at = index if index < len(nb.cells) else None
                break
        except (DeadKernelError, CellTimeoutError, RuntimeError) as exc:
            # RuntimeError: nbclient's "Kernel died before replying to kernel_info".
            if not started:
                raise KernelStartError(f"the kernel did not start: {exc}") from exc
            report.restarts += 1
            if replaying is not None:
                # A cell that ran cleanly once broke on replay: stop replaying it.
                replay.remove(replaying)
                report.notes.append(f"cell {replaying}: broke when replayed ({exc!r})")
            elif index < len(nb.cells):
                cell = nb.cells[index]
                # Keep what the cell printed; drop the kernel's own traceback of the interrupt.
                cell.outputs = [o for o in cell.outputs
                                if o.output_type == "stream" and o.get("name") == "stdout"]
                if isinstance(exc, CellTimeoutError):
                    outcomes[index] = Outcome.TIMEOUT
                    cell.outputs.append(error_output(
                        "CellTimeoutError",
                        f"this cell ran longer than the {timeout} s limit and was stopped "
                        "(an endless loop?)"))
                else:
                    outcomes[index] = Outcome.CRASHED
                    cell.outputs.append(error_output(
                        "DeadKernelError",
                        "the Python kernel died while this cell ran (os._exit, a segfault, "
                        "or running out of memory)"))
                report.notes.append(f"cell {index}: {outcomes[index].value}")
                index += 1
            if report.restarts > max_restarts:
                report.gave_up_at = index if index < len(nb.cells) else None
                break
    # Cells that never ran say so, so no grader can mistake "no output" for "passed".
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and outcomes[i] is Outcome.NOT_RUN and cell.source.strip():
            cell.outputs = [error_output(
                "NotExecuted",
                "this cell never ran: the kernel crashed or hung too often before it")]
    return report
