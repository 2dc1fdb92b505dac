"""Repository hygiene: requirements, environment.yml, the two commands, CI, ignores."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from coursetools import layout

ROOT = layout.ROOT


def _req_lines(text: str) -> list[str]:
    return [line.split("#")[0].strip() for line in text.splitlines()
            if line.split("#")[0].strip() and not line.strip().startswith("-")]


def _env_pip_lines() -> list[str]:
    text = (ROOT / "environment.yml").read_text()
    block = text.split("- pip:", 1)[1]
    return [m.group(1).strip() for m in re.finditer(r"^\s+-\s+(.+)$", block, re.M)]


def test_environment_yml_names_the_same_packages_as_requirements():
    req = sorted(_req_lines((ROOT / "requirements.txt").read_text()))
    env = sorted(_env_pip_lines())
    assert req == env, (
        "requirements.txt and environment.yml drifted apart:\n"
        f"  only in requirements.txt: {sorted(set(req) - set(env))}\n"
        f"  only in environment.yml:  {sorted(set(env) - set(req))}")
    assert "python=3.11" in (ROOT / "environment.yml").read_text()


def test_torch_range_is_stated_once_in_course_toml_and_everything_else_agrees():
    """course.toml [torch] is the one place that says which releases the course supports;
    requirements.txt, environment.yml and README say the same, and the pinned release and
    both ends CI runs (make.py test-torch lowest|newest) lie inside the range."""
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    cfg = layout.config()
    supported = SpecifierSet(cfg.torch_supported)
    assert {s.operator for s in supported} == {">=", "<"}, f"a range, got {cfg.torch_supported}"
    for name, release in (("tested", cfg.tested_torch), ("lowest", cfg.torch_lowest),
                          ("newest", cfg.torch_newest)):
        assert supported.contains(release), f"course.toml [torch] {name} = {release} is outside {supported}"
    from packaging.version import Version

    low = next(s.version for s in supported if s.operator == ">=")
    # make.py test-torch lowest must run the lowest release a learner can install: with a
    # floor of ">=2.9" that is 2.9.0, whatever 2.9.x CI happens to run (issue 21 item 1).
    assert Version(cfg.torch_lowest) == Version(low), (
        f"course.toml [torch] lowest = {cfg.torch_lowest}, but the range {supported} allows {low}: "
        "make lowest the floor, or raise the floor to the lowest release the course passes on")
    req = next(Requirement(line) for line in _req_lines((ROOT / "requirements.txt").read_text())
               if line.startswith("torch"))
    assert req.specifier == supported, f"requirements.txt says {req}, course.toml torch{supported}"
    env = next(Requirement(line) for line in _env_pip_lines() if line.startswith("torch"))
    assert env.specifier == supported, f"environment.yml says {env}, course.toml torch{supported}"
    readme = (ROOT / "README.md").read_text()
    assert f"PyTorch {cfg.torch_span()}" in readme, f"README must say 'PyTorch {cfg.torch_span()}'"
    stale = (set(re.findall(r"PyTorch (\d+\.\d+(?:\.\d+)?) – (\d+\.\d+)", readme))
             - {tuple(cfg.torch_span().split(" – "))})
    assert not stale, f"README states another range too: {stale}"


def test_ci_runs_both_ends_of_the_torch_range():
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"make\.py test-torch lowest", ci), ".ci/run must run the notebooks on the lowest release"
    assert re.search(r"make\.py test-torch newest", ci), ".ci/run must run the notebooks on the newest release"


def test_course_toml_is_complete():
    data = tomllib.loads((ROOT / "course.toml").read_text())["course"]
    assert re.fullmatch(r"[\w.-]+/[\w.-]+", data["github_repo"])
    assert data["branch"] and data["title"]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 make.py test" in readme and "python3 make.py lab" in readme
    assert re.search(r"^python3 make\.py test\b", ci, re.M), ".ci/run must run the README's test command, unchanged"


def test_the_two_commands_are_at_the_top_of_the_readme():
    readme = (ROOT / "README.md").read_text()
    head = readme[: readme.find("## ", readme.find("## ") + 1)]
    assert "python3 make.py lab" in head and "python3 make.py test" in head


def test_grading_artefacts_are_ignored():
    ignored = (ROOT / ".gitignore").read_text().split()
    for entry in ("gradebook.db", "submitted/", "autograded/", "feedback/", ".venv/"):
        assert entry in ignored, f".gitignore must list {entry}"


def test_every_chapter_is_in_the_readme_course_map():
    from coursetools.author import links
    readme = (ROOT / "README.md").read_text()
    assert links.course_map() in readme, "README's course map is stale: run `python3 make.py links`"
    cfg = layout.config()
    for lesson in layout.lessons():
        rel = lesson.relative_to(ROOT).as_posix()
        assert f"({rel})" in readme, f"README course map has no link to {rel}"
        assert cfg.colab_url(rel) in readme, f"README course map has no Colab link for {rel}"
    for name in layout.assignments():
        rel = f"exercises/{name}/{name}.ipynb"
        assert f"({rel})" in readme, f"README course map has no link to {rel}"
        assert cfg.colab_url(rel) in readme, f"README course map has no Colab link for {rel}"


def _lock() -> dict[str, str]:
    text = (ROOT / "requirements-lock.txt").read_text()
    return {line.split("==")[0]: line.split("==")[1] for line in text.splitlines()
            if line and not line.startswith("#")}


def test_the_lock_pins_every_test_requirement_within_its_range():
    """requirements-lock.txt: every package requirements.txt and requirements-dev.txt
    name is pinned there, at a version their ranges accept, and torch is not (course.toml's
    tested release, or TORCH_SPEC, decides it). A hand edit or a stale lock fails here."""
    from packaging.requirements import Requirement

    lock = _lock()
    assert all(re.fullmatch(r"[a-z0-9][a-z0-9.-]*", name) for name in lock), "names are written normalised"
    assert not [n for n in lock if n.startswith(("torch", "nvidia-", "triton"))], "the lock must not pin torch"
    wanted = [Requirement(line) for f in ("requirements.txt", "requirements-dev.txt")
              for line in _req_lines((ROOT / f).read_text())]
    problems = []
    for req in wanted:
        name = req.name.lower().replace("_", "-")
        if name == "torch":
            continue
        if name not in lock:
            problems.append(f"{name}: not in the lock")
        elif not req.specifier.contains(lock[name], prereleases=True):
            problems.append(f"{name}=={lock[name]} is outside {req}")
    assert not problems, "requirements-lock.txt is stale: run `python3 make.py lock`:\n" + "\n".join(problems)


def test_the_suites_install_uses_the_lock_and_a_learners_does_not(monkeypatch):
    """make.py test (and every command needing the test packages) installs with the lock as pip
    constraints, and its stamps change when the lock does; make.py lab and check keep the ranges."""
    import make

    assert make.lock_args(True) == ["-c", str(ROOT / "requirements-lock.txt")]
    assert make.lock_args(False) == []
    base, learner = make.layers(dev=True), make.layers(dev=False)
    original = make.LOCK.read_bytes()
    monkeypatch.setattr(make.LOCK.__class__, "read_bytes",
                        lambda self: original + b"# changed\n" if self == make.LOCK else Path.read_bytes(self))
    changed = make.layers(dev=True)
    assert [d for *_, d in base] != [d for *_, d in changed], "a refreshed lock must reinstall"
    assert make.layers(dev=False) == learner, "a learner's install must not depend on the lock"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 make.py test" in ci
