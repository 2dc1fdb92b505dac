"""A scratch nbgrader course: this repository's configuration and sources, elsewhere on disk.

The test suite grades fixture submissions through nbgrader's own `generate_assignment` and
`autograde`, in a course folder of its own, so the repository never gets a gradebook,
`submitted/` or `autograded/` folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from nbformat import NotebookNode

from coursetools import layout, notebooks

CONFIG_TEMPLATE = '''\
# Scratch course made by coursetools.author.nbgrader_course: the repository's configuration,
# with this folder as the course root.
c = get_config()  # noqa: F821
_repo_config = {repo_config!r}
exec(compile(open(_repo_config, encoding="utf-8").read(), _repo_config, "exec"),
     {{"get_config": get_config, "__file__": _repo_config}})  # noqa: F821
c.CourseDirectory.root = {root!r}
{extra}
'''


@dataclass
class CellGrade:
    score: float | None
    max_score: float
    needs_manual_grade: bool


def nbgrader_env() -> dict[str, str]:
    """nbgrader shells out to `alembic` (to create a gradebook): it must be on PATH."""
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


class NbgraderCourse:
    def __init__(self, root: Path, assignments: list[str] | None = None, extra_config: str = "",
                 repo: Path = layout.ROOT):
        self.root = Path(root).resolve()
        self.repo = repo
        self.assignments = assignments or layout.assignments(repo)
        self.root.mkdir(parents=True, exist_ok=True)
        for name in self.assignments:
            dest = self.root / "solutions" / name
            if dest.exists():
                shutil.rmtree(dest)
            shutil.copytree(repo / "solutions" / name, dest)
        (self.root / "nbgrader_config.py").write_text(CONFIG_TEMPLATE.format(
            repo_config=str(repo / "nbgrader_config.py"), root=str(self.root), extra=extra_config))

    @property
    def db_url(self) -> str:
        return f"sqlite:///{self.root / 'gradebook.db'}"

    def run(self, *args: str, check: bool = True, timeout: float | None = 3600) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "nbgrader", *args]
        proc = subprocess.run(cmd, cwd=self.root, capture_output=True, text=True, env=nbgrader_env(),
                              timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"nbgrader {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc

    def generate(self, name: str) -> None:
        """Release `name` into the course's own gradebook (what autograde compares against)."""
        self.run("generate_assignment", name, "--force",
                 f"--CourseDirectory.release_directory={self.root / 'release'}")

    def submission_path(self, student: str, name: str) -> Path:
        return self.root / "submitted" / student / name / f"{name}.ipynb"

    def submit(self, student: str, name: str, nb: NotebookNode) -> Path:
        path = self.submission_path(student, name)
        notebooks.write(nb, path)
        return path

    def autograde(self, name: str, *extra: str) -> subprocess.CompletedProcess:
        # As grade-class does: one test kernel per process, before nbgrader starts (its
        # pre-convert hook then finds the check done and starts none of its own).
        from coursetools.grading import preflight, sandbox

        preflight.check(sandbox.SandboxConfig(mode=sandbox.resolve_mode("auto")))
        return self.run("autograde", name, "--force", *extra, check=False)

    def autograded_notebook(self, student: str, name: str) -> NotebookNode:
        return notebooks.read(self.root / "autograded" / student / name / f"{name}.ipynb")

    def grades(self, name: str, students: list[str]) -> dict[str, dict[str, CellGrade] | None]:
        """student -> {test cell id -> grade}; None for a submission nbgrader did not grade."""
        from nbgrader.api import Gradebook, MissingEntry

        out: dict[str, dict[str, CellGrade] | None] = {}
        with Gradebook(self.db_url) as gb:
            for student in students:
                try:
                    sub = gb.find_submission_notebook(name, name, student)
                except MissingEntry:
                    out[student] = None
                    continue
                out[student] = {
                    g.name: CellGrade(g.score, g.max_score, g.needs_manual_grade)
                    for g in sub.grades if g.cell_type == "code"
                }
        return out
