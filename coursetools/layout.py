"""Where things live in the repository, and the course's configuration (`course.toml`)."""

from __future__ import annotations

import functools
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def env_with_course_tools() -> dict[str, str]:
    """This process's environment with the repository first on PYTHONPATH (so a child
    process can `python -m coursetools...`), keeping what PYTHONPATH already held."""
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(ROOT)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *rest])}
COURSE_DIR = ROOT / "course"
SOLUTIONS_DIR = ROOT / "solutions"
EXERCISES_DIR = ROOT / "exercises"
TESTS_DIR = ROOT / "tests"
SUBMISSIONS_DIR = TESTS_DIR / "submissions"

CHAPTER_NAME = re.compile(r"^\d\d_[a-z0-9_]+$")


@dataclass(frozen=True)
class CourseConfig:
    title: str
    github_repo: str
    branch: str
    tested_torch: str     # the release the test suite is pinned to
    torch_supported: str  # the supported range, a PEP 440 specifier (">=2.9,<2.16")
    torch_lowest: str     # the lowest release CI runs every notebook on
    torch_newest: str     # the newest release CI runs every notebook on

    def torch_span(self) -> str:
        """The range as README says it: ">=2.9,<2.16" -> "2.9 – 2.15"."""
        from packaging.specifiers import SpecifierSet

        spec = SpecifierSet(self.torch_supported)
        low = next(s.version for s in spec if s.operator == ">=")
        high = next(s.version for s in spec if s.operator == "<")
        major, minor = (int(x) for x in high.split(".")[:2])
        return f"{low} – {major}.{minor - 1}"

    def colab_url(self, relpath: str | Path) -> str:
        """The "Open in Colab" address of a notebook, given its path in the repository."""
        rel = Path(relpath).as_posix()
        return f"https://colab.research.google.com/github/{self.github_repo}/blob/{self.branch}/{rel}"


@functools.cache
def config() -> CourseConfig:
    """Read `course.toml` (title, GitHub repository, branch, the torch releases)."""
    with open(ROOT / "course.toml", "rb") as fh:
        data = tomllib.load(fh)
    course = data["course"]
    return CourseConfig(
        title=course["title"],
        github_repo=course["github_repo"],
        branch=course["branch"],
        tested_torch=data["torch"]["tested"],
        torch_supported=data["torch"]["supported"],
        torch_lowest=data["torch"]["lowest"],
        torch_newest=data["torch"]["newest"],
    )


def assignments(root: Path = ROOT) -> list[str]:
    """Names of the graded assignments (`solutions/NN_topic/NN_topic.ipynb`), in order."""
    src = root / "solutions"
    return sorted(
        p.name for p in src.iterdir()
        if p.is_dir() and CHAPTER_NAME.match(p.name) and (p / f"{p.name}.ipynb").exists()
    )


def source_notebook(name: str, root: Path = ROOT) -> Path:
    return root / "solutions" / name / f"{name}.ipynb"


def release_notebook(name: str, root: Path = ROOT) -> Path:
    return root / "exercises" / name / f"{name}.ipynb"


def lessons(root: Path = ROOT) -> list[Path]:
    """Lesson notebooks, `course/NN_topic.ipynb`, in order."""
    return sorted(p for p in (root / "course").glob("*.ipynb") if CHAPTER_NAME.match(p.stem))


def all_notebooks(root: Path = ROOT) -> list[Path]:
    """Every committed notebook of the course: lessons, solutions, released exercises."""
    nbs = list(lessons(root))
    for name in assignments(root):
        nbs.append(source_notebook(name, root))
        release = release_notebook(name, root)
        if release.exists():
            nbs.append(release)
    return nbs
