"""nbgrader preprocessors the course adds to nbgrader's own (configured in nbgrader_config.py)."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Tuple

from nbconvert.exporters.exporter import ResourcesDict
from nbformat.notebooknode import NotebookNode
from nbgrader import utils
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Bool, Integer, List, Unicode

from . import guard, notebooks
from .execute import execute_resilient
from .notebooks import RAISES_TAG
from .sandbox import SandboxConfig, bwrap_works, kernel_manager_for, resolve_mode, sandbox_env


class TagStubCells(NbGraderPreprocessor):
    """Tag the release's answer and test cells so nbval permits their stub errors.

    An untouched release raises `NotImplementedError` in every answer cell and so fails
    every test cell; nbval must run it to the end and allow exactly those cells to raise.
    Tags are not part of nbgrader's checksums, and the tags are added to the release only:
    in `solutions/` every cell must run cleanly.
    """

    tag = Unicode(RAISES_TAG, help="The cell tag that permits an exception under nbval").tag(config=True)

    def preprocess_cell(self, cell: NotebookNode, resources: ResourcesDict,
                        cell_index: int) -> Tuple[NotebookNode, ResourcesDict]:
        if cell.cell_type == "code" and (utils.is_solution(cell) or utils.is_grade(cell)):
            tags = cell.metadata.setdefault("tags", [])
            if self.tag not in tags:
                tags.append(self.tag)
        return cell, resources


class ResilientExecute(NbGraderPreprocessor):
    """nbgrader's Execute step, made to survive a real class (replaces `Execute`).

    * each cell has a time limit; a cell that hangs or kills the kernel costs that cell
      (and what depends on it): the kernel is restarted, earlier cells replayed, and
      grading goes on (coursetools.execute). A cell that never ran gets an error, so
      nbgrader cannot score it as passed;
    * the kernel runs in the sandbox (coursetools.sandbox): no access to the course folder
      (gradebook, solutions, other submissions), no network, limited memory and CPU, in a
      scratch folder deleted afterwards;
    * tamper checks before every test cell (coursetools.guard), and hidden-test source
      removed from every output before the notebook is saved or turned into feedback;
    * a cell's output is capped (a submission printing gigabytes cannot exhaust the grader).
    """

    timeout = Integer(120, help="Seconds a cell may run before it is stopped").tag(config=True)
    max_restarts = Integer(6, help="Kernel restarts allowed per notebook (crashes, hangs)").tag(config=True)
    sandbox = Unicode("auto", help="'bwrap', 'off', or 'auto' (bwrap where it works)").tag(config=True)
    memory_mb = Integer(4096, help="Memory (data segment) limit of the kernel, MiB").tag(config=True)
    cpu_seconds = Integer(1800, help="CPU-time limit per kernel process, seconds").tag(config=True)
    hide = List(Unicode(), help="Extra folders the sandboxed kernel must not see").tag(config=True)
    max_output_bytes = Integer(2_000_000, help="Output kept per cell, bytes").tag(config=True)
    tamper_checks = Bool(True, help="Check torch and the locked helpers before each test").tag(config=True)
    kernel_name = Unicode("python3").tag(config=True)

    def sandbox_config(self, resources: ResourcesDict) -> SandboxConfig:
        mode = resolve_mode(self.sandbox)
        if mode == "off" and self.sandbox == "auto":
            self.log.warning("grading WITHOUT a sandbox: %s", bwrap_works()[1])
        hide = [os.getcwd(), *self.hide]  # nbgrader runs converters from the course root
        db_url = (resources.get("nbgrader") or {}).get("db_url", "")
        if db_url.startswith("sqlite:///"):
            hide.append(os.path.dirname(db_url[len("sqlite:///"):]))
        return SandboxConfig(mode=mode, memory_mb=self.memory_mb, cpu_seconds=self.cpu_seconds,
                             hide=tuple(hide), expose=())

    def preprocess(self, nb: NotebookNode, resources: ResourcesDict) -> Tuple[NotebookNode, ResourcesDict]:
        config = self.sandbox_config(resources)
        inst = guard.instrument(nb) if self.tamper_checks else None
        run_nb = inst.nb if inst else nb
        here = (resources.get("metadata") or {}).get("path") or "."
        scratch = tempfile.mkdtemp(prefix="grading-")
        try:
            for entry in os.listdir(here):  # data files the assignment ships, not notebooks
                src = os.path.join(here, entry)
                if os.path.isfile(src) and not entry.endswith(".ipynb"):
                    shutil.copy(src, scratch)
            kernel_env = sandbox_env(config) if config.mode != "off" else None
            report = execute_resilient(
                run_nb, cwd=scratch, timeout=self.timeout, kernel_name=self.kernel_name,
                max_restarts=self.max_restarts, env=kernel_env,
                is_replayable=lambda c: not notebooks.is_test_cell(c),
                client_kwargs={"kernel_manager_class": kernel_manager_for(config, scratch),
                               "max_output_bytes": self.max_output_bytes},
            )
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        tampering = guard.collect_outputs(nb, inst) if inst else []
        redacted = guard.redact(nb, guard.hidden_lines(nb))
        for note in report.notes:
            self.log.warning("%s: %s", resources.get("unique_key", "notebook"), note)
        for message in tampering:
            self.log.warning("TAMPERING %s", message)
        resources["resilient_execute"] = {
            "sandbox": config.mode, "restarts": report.restarts, "notes": report.notes,
            "tampering": tampering, "redacted_outputs": redacted,
        }
        return nb, resources
