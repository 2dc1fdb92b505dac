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

from . import notebooks


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
) -> ExecutionReport:
    """Run every code cell of `nb` in place (outputs are written into the cells).

    `is_replayable(cell)` says which cleanly-run cells are replayed in a fresh kernel after
    a crash; by default every code cell except nbgrader test cells. `client_kwargs` go to
    `nbclient.NotebookClient` (e.g. a sandboxing `kernel_manager_class`).
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
        client = NotebookClient(
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
        try:
            with client.setup_kernel(env=os.environ.copy(), stderr=subprocess.DEVNULL):
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
                        else:
                            outcomes[index] = Outcome.OK
                            if is_replayable(cell):
                                replay.append(index)
                    elif cell.cell_type == "code":
                        outcomes[index] = Outcome.OK
                    index += 1
        except (DeadKernelError, CellTimeoutError, RuntimeError) as exc:
            # RuntimeError: nbclient's "Kernel died before replying to kernel_info".
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
