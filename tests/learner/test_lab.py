"""`make.py lab` without a browser (coursetools/learner/lab.py): the learner's work folder, course
updates that never touch the learner's work nor conflict in git, the self-check finding the
learner's copy, each mode's Jupyter configuration, and valid notebooks from `new-chapter`
and `release`. The browser tests (tests/learner/test_browser.py) run the same code in JupyterLab.
"""

from __future__ import annotations

import json
import time
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from coursetools.author import fixtures
from coursetools.learner import lab, selfcheck
from coursetools import layout, notebooks

ROOT = layout.ROOT
CHAPTER = "01_device_basics"


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=test", "-c", "user.email=test@example.org", *args],
                          cwd=cwd, check=True, capture_output=True, text=True).stdout


def course_copy(dest: Path) -> Path:
    """The notebooks of the repository (course/, solutions/, exercises/), the references
    learner mode copies (lab.REFERENCES) and its .gitignore."""
    for sub in ("course", "solutions", "exercises"):
        shutil.copytree(ROOT / sub, dest / sub, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    for ref in lab.REFERENCES:
        (dest / ref).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / ref, dest / ref)
    shutil.copy2(ROOT / ".gitignore", dest / ".gitignore")
    return dest


def edit_notebook(path: Path, change) -> None:
    nb = json.loads(path.read_text(encoding="utf-8"))
    change(nb)
    path.write_text(json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def answer_first_question(nb: dict) -> None:
    cell = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("solution"))
    cell["source"] = "def pick_device(preferred=None):\n    return 'my answer'\n"


def run_and_save(nb: dict) -> None:
    """What opening, running and autosaving does: outputs and metadata, the same cells."""
    nb["metadata"]["language_info"] = {"name": "python", "version": "3.11.7"}
    for n, cell in enumerate(c for c in nb["cells"] if c["cell_type"] == "code"):
        cell["execution_count"] = n + 1
        cell["outputs"] = [{"name": "stdout", "output_type": "stream", "text": ["ran\n"]}]


def change_course(nb: dict) -> None:
    nb["cells"].append({"cell_type": "markdown", "metadata": {}, "source": "A new paragraph."})


def test_first_start_copies_lessons_and_exercises_with_working_links(tmp_path):
    root = course_copy(tmp_path / "repo")
    report = lab.sync(root)
    pairs = lab.copies(root)
    assert len(pairs) == len(layout.lessons(root)) + len(layout.assignments(root)) + len(lab.REFERENCES)
    assert sorted(report.added) == sorted(d.relative_to(root).as_posix() for _, d in pairs)
    assert not report.updated and not report.newer
    work = lab.work_dir(root)
    names = [dest.name for _, dest in pairs]
    assert len(set(names)) == len(names), f"two copies share a name (two tabs with one title): {names}"
    for source, dest in pairs:
        if source.suffix == ".md":  # a reference: every relative link reaches a copy in work/
            text = dest.read_text(encoding="utf-8")
            links = [m.split("#")[0] for m in re.findall(r"\]\(([^)\s]+)\)", text)
                     if not re.match(r"^[a-z][a-z0-9+.-]*:|#", m)]
            assert links or source.name == "MYTHS.md", f"{dest}: no relative link left to check"
            broken = [link for link in links if not (dest.parent / link).is_file()
                      or not (dest.parent / link).resolve().is_relative_to(work.resolve())]
            assert not broken, f"{dest.relative_to(root)} links to files work/ does not hold: {broken}"
            continue
        if source.parent.name == "course":
            assert dest == work / "course" / source.name
        else:  # an exercise's copy is the release itself, byte for byte, under its own name
            assert dest.read_bytes() == source.read_bytes()
        copy = json.loads(dest.read_text(encoding="utf-8"))
        nbformat.validate(nbformat.from_dict(copy))
        broken = [link for link in lab.relative_links(copy) if not (dest.parent / link).is_file()]
        assert not broken, f"{dest.relative_to(root)} links to missing files: {broken}"
        outside = [link for link in lab.relative_links(copy)
                   if not (dest.parent / link).resolve().is_relative_to(work.resolve())]
        assert not outside, f"{dest.relative_to(root)} links out of the work folder: {outside}"
    lesson = (work / "course" / f"{CHAPTER}.ipynb").read_text(encoding="utf-8")
    assert f"../exercises/{CHAPTER}/{CHAPTER}{lab.EXERCISE_SUFFIX}.ipynb" in lesson
    assert lab.sync(root).lines() == [], "a second start with nothing new must report nothing"


def test_relative_links_finds_a_broken_link():
    nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source":
                     "[a](missing.ipynb#part) [b](https://example.org/x.ipynb) "
                     '<a href="../other.ipynb">c</a> [![img](https://x/y.svg)](https://z)'}]}
    assert lab.relative_links(nb) == ["missing.ipynb", "../other.ipynb"]


def test_course_update_keeps_edited_copies_and_says_so(tmp_path):
    root = course_copy(tmp_path / "repo")
    lab.sync(root)
    work = lab.work_dir(root)
    mine = work / "exercises" / CHAPTER / f"{CHAPTER}{lab.EXERCISE_SUFFIX}.ipynb"
    run_only = work / "course" / f"{CHAPTER}.ipynb"
    edit_notebook(mine, answer_first_question)
    edit_notebook(mine, run_and_save)
    edit_notebook(run_only, run_and_save)
    answered = mine.read_bytes()

    # A course update: exercise 01 and lesson 01 change, a chapter 09 lesson appears.
    edit_notebook(layout.release_notebook(CHAPTER, root), change_course)
    edit_notebook(root / "course" / f"{CHAPTER}.ipynb", change_course)
    shutil.copy2(root / "course" / "08_troubleshooting.ipynb", root / "course" / "09_new_topic.ipynb")
    report = lab.sync(root)

    assert mine.read_bytes() == answered, "the learner's answers were overwritten"
    assert report.newer == [(mine.relative_to(root).as_posix(),
                             layout.release_notebook(CHAPTER, root).relative_to(root).as_posix())]
    text = "\n".join(report.lines())
    assert "newer version" in text and mine.relative_to(root).as_posix() in text
    # Only run (same cells): it follows the course; outputs can be made again.
    assert report.updated == [run_only.relative_to(root).as_posix()]
    assert "A new paragraph." in run_only.read_text(encoding="utf-8")
    assert report.added == ["work/course/09_new_topic.ipynb"]

    # Said again at every start until the learner takes the new version ...
    assert lab.sync(root).newer == report.newer
    # ... by renaming their copy: the next start copies the course's version in.
    mine.rename(mine.with_name("my_answers.ipynb"))
    again = lab.sync(root)
    assert again.added == [mine.relative_to(root).as_posix()] and not again.newer
    assert "A new paragraph." in mine.read_text(encoding="utf-8")
    assert (mine.with_name("my_answers.ipynb")).read_bytes() == answered


def test_git_pull_never_conflicts_with_the_learners_work(tmp_path):
    upstream = course_copy(tmp_path / "upstream")
    git(upstream, "init", "-q", "-b", "main")
    git(upstream, "add", "-A")
    git(upstream, "commit", "-q", "-m", "course")
    learner = tmp_path / "learner"
    git(tmp_path, "clone", "-q", str(upstream), str(learner))
    lab.sync(learner)
    mine = lab.work_dir(learner) / "exercises" / CHAPTER / f"{CHAPTER}{lab.EXERCISE_SUFFIX}.ipynb"
    edit_notebook(mine, answer_first_question)
    edit_notebook(lab.work_dir(learner) / "course" / f"{CHAPTER}.ipynb", run_and_save)
    assert git(learner, "status", "--porcelain") == "", "the work folder must be git-ignored"

    edit_notebook(layout.release_notebook(CHAPTER, upstream), change_course)
    git(upstream, "commit", "-q", "-am", "course update")
    git(learner, "pull", "-q", "--ff-only")
    assert git(learner, "status", "--porcelain") == ""
    assert "A new paragraph." in layout.release_notebook(CHAPTER, learner).read_text(encoding="utf-8")
    assert [m for m, _ in lab.sync(learner).newer] == [mine.relative_to(learner).as_posix()]


def test_self_check_finds_the_learners_copy(tmp_path, monkeypatch, capsys):
    """`make.py check exercises/01.../01....ipynb`, the command the exercise names, grades the
    learner's copy in work/ (here: the reference answers, full marks; the original scores 0)."""
    release = layout.release_notebook(CHAPTER)
    source = notebooks.read(layout.source_notebook(CHAPTER))
    copy = tmp_path / f"{CHAPTER}{lab.EXERCISE_SUFFIX}.ipynb"
    notebooks.write(fixtures.fill(notebooks.read(release), fixtures.reference_answers(source)), copy)
    root = course_copy(tmp_path / "repo")
    lab.sync(root)
    found = lab.learner_copy(root / "exercises" / CHAPTER / f"{CHAPTER}.ipynb", root)
    assert found == lab.work_dir(root) / "exercises" / CHAPTER / copy.name
    assert lab.learner_copy(copy, root) is None, "a notebook that is not the course's is checked as given"

    monkeypatch.setattr(selfcheck.lab, "learner_copy", lambda path: copy if Path(path) == release else None)
    assert selfcheck.main([str(release)]) == 0
    out = capsys.readouterr().out
    assert f"checking your copy, {copy}" in out and "Score: 26/26" in out


def test_each_mode_uses_jupyters_own_configuration(tmp_path):
    root = course_copy(tmp_path / "repo")
    shutil.copytree(ROOT / lab.CONFIG_DIR, root / lab.CONFIG_DIR)
    learner = lab.command(root, extra_args=["--port=9999"])
    assert learner.serve_root == learner.cwd == lab.work_dir(root)
    assert f"--ServerApp.root_dir={lab.work_dir(root)}" in learner.argv
    assert str(lab.work_dir(root) / lab.FIRST_NOTEBOOK) in learner.argv and learner.argv[-1] == "--port=9999"
    paths = learner.env["JUPYTER_CONFIG_PATH"].split(os.pathsep)
    assert paths[:2] == [str(root / lab.CONFIG_DIR / "learner"), str(root / lab.CONFIG_DIR / "common")]
    instructor = lab.command(root, instructor=True)
    assert instructor.serve_root == instructor.cwd == root and instructor.report is None
    assert instructor.env["JUPYTER_CONFIG_PATH"].split(os.pathsep)[0] == str(root / lab.CONFIG_DIR / "instructor")

    def load(*parts):
        return json.loads((ROOT / lab.CONFIG_DIR).joinpath(*parts).read_text(encoding="utf-8"))
    assert load("learner", "labconfig", "page_config.json")["disabledExtensions"] == {"@jupyter/nbgrader": True}
    server = load("learner", "jupyter_server_config.json")["ServerApp"]["jpserver_extensions"]
    installed = json.loads((Path(sys.prefix) / "etc" / "jupyter" / "jupyter_server_config.d" / "nbgrader.json")
                           .read_text())["ServerApp"]["jpserver_extensions"]
    assert set(server) == set(installed) and not any(server.values()), "learner mode runs no nbgrader server extension"
    news = load("common", "labconfig", "default_setting_overrides.json")["@jupyterlab/apputils-extension:notification"]
    assert news == {"fetchNews": "false", "checkForUpdates": False}

    # Student mode (issue 37) is a hub's student view, /etc/jupyter as deploy/jupyterhub/etc-jupyter
    # has it, under the local exchange's nbgrader config; the hub gives instructors Formgrader on top.
    shutil.copytree(ROOT / lab.HUB_ETC, root / lab.HUB_ETC)
    student = lab.command(root, student="alice")
    assert student.serve_root == root / "local-exchange" / "students" / "alice" and student.report is None
    assert student.env["JUPYTER_CONFIG_PATH"].split(os.pathsep)[:3] == [
        str(root / lab.CONFIG_DIR / "student"), str(root / lab.HUB_ETC), str(root / lab.CONFIG_DIR / "common")]
    assert student.env["COURSE_STUDENT"] == "alice"
    hub = ROOT / lab.HUB_ETC
    seen = json.loads((hub / "jupyter_server_config.json").read_text())["ServerApp"]["jpserver_extensions"]
    assert seen["nbgrader.server_extensions.assignment_list"] and not seen["nbgrader.server_extensions.formgrader"]
    hidden = json.loads((hub / "labconfig" / "page_config.json").read_text())["disabledExtensions"]
    assert hidden["@jupyter/nbgrader:formgrader"] and hidden["@jupyter/nbgrader:create-assignment"]
    teacher = json.loads((hub / "instructor" / "jupyter_server_config.json").read_text())["ServerApp"]
    assert teacher["jpserver_extensions"]["nbgrader.server_extensions.formgrader"]
    with pytest.raises(ValueError, match="two modes"):
        lab.command(root, instructor=True, student="alice")


def test_new_chapter_and_release_write_valid_notebooks(tmp_path):
    """`make.py new-chapter` and `make.py release`, in a scratch copy of the repository:
    every notebook they write passes nbformat's schema as stored (JupyterLab's check)."""
    repo = tmp_path / "repo"
    listed = git(ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    for rel in filter(None, listed):
        if (ROOT / rel).is_file():
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, repo / rel)
    env = {**os.environ, "PYTHONPATH": str(repo)}
    import make  # the module each make.py command runs (make.MODULES)

    for args in (["new-chapter", "09_sparse_tensors", "Sparse tensors on every device"], ["release"]):
        subprocess.run([sys.executable, "-m", f"coursetools.{make.MODULES[args[0]]}", *args[1:]], cwd=repo,
                       env=env, check=True, capture_output=True, text=True)
    written = layout.all_notebooks(repo)
    assert repo / "exercises" / "09_sparse_tensors" / "09_sparse_tensors.ipynb" in written
    for path in written:
        raw = nbformat.from_dict(json.loads(path.read_text(encoding="utf-8")))
        try:
            nbformat.validate(raw)
        except nbformat.ValidationError as exc:
            pytest.fail(f"{path.relative_to(repo)} is not a valid notebook: {exc.message}")


def test_check_takes_the_chapter_and_finds_the_learners_copy(tmp_path):
    """`make.py check 01` (what README and lesson 00 say): the chapter's number
    or name grades the learner's copy in work/ (work/zh/ with --lang zh), or the course's own
    exercise when `make.py lab` made none; anything else is a path."""
    root = course_copy(tmp_path / "repo")
    zh_release = root / lab.ZH / "exercises" / CHAPTER / f"{CHAPTER}.ipynb"
    zh_release.parent.mkdir(parents=True)
    shutil.copy2(layout.release_notebook(CHAPTER, root), zh_release)
    assert selfcheck.chapter_named("01", root) == selfcheck.chapter_named("1", root) == CHAPTER
    assert selfcheck.chapter_named(CHAPTER, root) == CHAPTER
    assert selfcheck.chapter_named("99", root) is None
    assert selfcheck.chapter_named("exercises/x.ipynb", root) is None
    release = Path("exercises") / CHAPTER / f"{CHAPTER}.ipynb"
    assert selfcheck.chapter_notebook(CHAPTER, None, root) == selfcheck.chapter_notebook(CHAPTER, "en", root) == release
    assert selfcheck.chapter_notebook(CHAPTER, "zh", root) == Path(lab.ZH) / release
    lab.sync(root, lab.ZH)
    mine = Path(lab.WORK_DIR) / "exercises" / CHAPTER / f"{CHAPTER}{lab.EXERCISE_SUFFIX}.ipynb"
    mine_zh = Path(lab.WORK_DIR) / lab.ZH / mine.relative_to(lab.WORK_DIR)
    assert selfcheck.chapter_notebook(CHAPTER, "en", root) == mine
    assert selfcheck.chapter_notebook(CHAPTER, "zh", root) == mine_zh
    start = time.time()
    for k, saved_last in enumerate((mine, mine_zh, mine)):  # no --lang: the copy saved last
        os.utime(root / saved_last, (start + k + 1,) * 2)
        assert selfcheck.chapter_notebook(CHAPTER, None, root) == saved_last
