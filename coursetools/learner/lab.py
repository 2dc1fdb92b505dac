"""`python3 make.py lab`: the course in JupyterLab, in learner mode or instructor mode.

    python3 make.py lab                 learner mode: your own copies of the notebooks
    python3 make.py lab --instructor    instructor mode: the repository itself, with Formgrader
    python3 make.py lab --student NAME  student mode: one student of a class on this machine

**Learner mode** (the default) copies every lesson and exercise into `work/`, a git-ignored
folder, the first time (as nbgrader's "fetch" does), serves that folder and opens
`course/00_start_here.ipynb` in it. Everything a learner runs, types and saves (outputs,
answers, JupyterLab's own metadata) goes into those copies: the repository stays clean, so
`git pull` always applies a course update. `work/` mirrors the repository (`course/`,
`exercises/NN_topic/`), so every relative link resolves; an exercise's copy is named
`NN_topic_exercise.ipynb`, so that a lesson and its exercise do not open as two tabs with
the same name (the lessons' copies link to it). On every later start, notebooks new in the
course are copied in, copies the learner never changed (same cells) follow the course, and
copies the learner changed are kept and listed when the course has a newer version.
nbgrader's instructor panels are switched off (`jupyter-config/learner/`): the self-check
is `python3 make.py check`, which finds the learner's copy.

**Instructor mode** serves the repository root with nbgrader's Formgrader, Create Assignment,
Validate and the Assignments tab (`jupyter-config/instructor/`). What is opened there is the
course's source. nbgrader's exchange is `local-exchange/` in the course (git-ignored; set in
nbgrader_config.py, made here if missing), so an instructor can release in Formgrader, fetch
and submit as a student in the Assignments tab (into `local-exchange/student/`), collect and
grade, all on one machine; a class server replaces it (docs/INSTRUCTORS.md, "A class on JupyterHub").

**Student mode** (`--student NAME`) is one student of a class that shares this machine, as
on a hub: the Assignments tab on, Formgrader and Create Assignment off, the server in the
student's own folder `local-exchange/students/NAME/`, where fetched assignments land, and
nbgrader's student id NAME (coursetools/instructor/exchange.py). Several students can each run
it, on their own ports, and each sees only their own submissions and feedback. Student mode is
the hub's student view: the Jupyter configuration a hub puts in /etc/jupyter
(`deploy/jupyterhub/etc-jupyter/`: which extensions a student sees), under
`jupyter-config/student/nbgrader_config.py`, which puts the exchange in local-exchange/ (a hub's
is a shared folder); the course's own config is not read.

Both modes use JupyterLab's and Jupyter Server's own configuration files, found through
JUPYTER_CONFIG_PATH: `jupyter-config/<mode>/` (page_config.json disables lab plugins,
jupyter_server_config.json disables server extensions) and `jupyter-config/common/`
(settings overrides: no news pop-up). Arguments this command does not know go to
`jupyter lab` (e.g. `--port 8890`, `--no-browser`).

**`--lang zh`** (learner mode): the Chinese edition. Its notebooks (`zh/`, generated from
the English ones and locale/zh_CN, coursetools/i18n) are copied into `work/zh/` next to the
English copies (a Chinese notebook that links to a chapter not yet translated links to the
English copy), JupyterLab opens `work/zh/course/00_start_here.ipynb` and shows its own menus
in Chinese: `jupyter-config/zh/` sets the language pack's locale (jupyterlab-language-pack-zh-CN,
in requirements.txt) in JupyterLab's settings overrides. This command's own words are
Chinese too.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from coursetools.publish import i18n
from coursetools import layout
from coursetools.publish.i18n import tr

WORK_DIR = "work"
MANIFEST = ".course-versions.json"
FIRST_NOTEBOOK = "course/00_start_here.ipynb"
EXERCISE_SUFFIX = "_exercise"
# The references a learner reads beside the notebooks, copied into work/ at the same paths
# (their Chinese versions, zh/..., into work/zh/ with --lang zh).
REFERENCES = ("CHEATSHEET.md", "docs/MYTHS.md", "docs/LEARNERS.md")
CONFIG_DIR = "jupyter-config"
MODES = ("learner", "instructor", "student")
ZH = "zh"  # the Chinese edition's folder, in the repository and in work/
LOCAL_EXCHANGE = "local-exchange"  # nbgrader's exchange on one machine (nbgrader_config.py)
HUB_ETC = "deploy/jupyterhub/etc-jupyter"  # what a class hub puts in /etc/jupyter (docs/INSTRUCTORS.md)


def work_dir(root: Path = layout.ROOT) -> Path:
    return root / WORK_DIR


def copies(root: Path = layout.ROOT, lang: str = "en") -> list[tuple[Path, Path]]:
    """(course notebook, the learner's copy in work/) for every lesson and released exercise;
    with lang="zh", also every notebook of the Chinese edition (zh/ -> work/zh/)."""
    work = work_dir(root)
    pairs = [(p, work / "course" / p.name) for p in layout.lessons(root)]
    for name in layout.assignments(root):
        release = layout.release_notebook(name, root)
        if release.exists():
            pairs.append((release, work / "exercises" / name / f"{name}{EXERCISE_SUFFIX}.ipynb"))
    pairs += [(root / ref, work / ref) for ref in REFERENCES if (root / ref).exists()]
    if lang == ZH:
        for source, dest in list(pairs):
            chinese = root / ZH / source.relative_to(root)
            if chinese.exists():
                pairs.append((chinese, work / ZH / dest.relative_to(work)))
    return pairs


def copy_text(source: Path, root: Path = layout.ROOT, lang: str = "en") -> str:
    """What the learner's copy of `source` holds at first: the same notebook or document,
    except that a lesson's or a reference's links to an exercise name the exercise's copy
    (…_exercise.ipynb), and a reference's links to files work/ does not hold (README, the
    instructors' guide, the code) go to the course's repository on GitHub."""
    text = source.read_text(encoding="utf-8")
    if source.parent.name == "course" or source.suffix == ".md":  # (a Chinese lesson's link to
        for name in layout.assignments(root):  # an English exercise is ../../exercises/...)
            text = re.sub(rf"(?<![\w/])((?:\.\./)*exercises/{name}/){name}\.ipynb",
                          rf"\g<1>{name}{EXERCISE_SUFFIX}.ipynb", text)
    if source.suffix == ".md":
        text = _links_outside_work_to_github(text, source, root, lang)
    return _references_from_github(text, source, root, lang)


def _references_from_github(text: str, source: Path, root: Path, lang: str) -> str:
    """A notebook links to the references on GitHub (what works in Colab); its copy in work/
    links to their copies beside it, which JupyterLab opens."""
    cfg = layout.config()
    here = work_dir(root) / source.relative_to(root).parent
    for ref, dest in copies(root, lang):
        if ref.suffix == ".md":
            url = f"https://github.com/{cfg.github_repo}/blob/{cfg.branch}/{ref.relative_to(root).as_posix()}"
            text = text.replace(f"]({url}", f"]({Path(os.path.relpath(dest, here)).as_posix()}")
    return text


def _links_outside_work_to_github(text: str, source: Path, root: Path, lang: str) -> str:
    cfg = layout.config()
    held = {s.resolve() for s, _ in copies(root, lang)}
    base = source.parent

    def fix(match: re.Match) -> str:
        target = match.group(2)
        path, hash_, anchor = target.partition("#")
        if not path or re.match(r"^[a-z][a-z0-9+.-]*:", path, re.IGNORECASE):
            return match.group(0)
        if path.endswith(f"{EXERCISE_SUFFIX}.ipynb"):
            return match.group(0)  # an exercise's copy (renamed above)
        resolved = (base / path).resolve()
        if resolved in held:
            return match.group(0)
        try:
            rel = resolved.relative_to(root.resolve()).as_posix()
        except ValueError:
            return match.group(0)
        url = f"https://github.com/{cfg.github_repo}/blob/{cfg.branch}/{rel}" + (f"#{anchor}" if hash_ else "")
        return f"{match.group(1)}({url})"

    return re.sub(r"(\]|\]\s*)\(([^)\s]+)\)", fix, text)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def cells_fingerprint(text: str) -> str | None:
    """What the learner can change in a notebook: its cells' types and sources (outputs and
    JupyterLab's metadata are left out). None when the text is not a readable notebook."""
    try:
        cells = json.loads(text)["cells"]
        parts = [(c["cell_type"], "".join(c["source"]) if isinstance(c["source"], list) else c["source"])
                 for c in cells]
    except (ValueError, KeyError, TypeError):
        return None
    return _sha(json.dumps(parts))


def fingerprint(dest: Path, text: str) -> str | None:
    """What the learner can change: a notebook's cells, a document's whole text."""
    return cells_fingerprint(text) if dest.suffix == ".ipynb" else _sha(text)


@dataclass
class SyncReport:
    """What `sync` did: paths relative to the repository root."""
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    newer: list[tuple[str, str]] = field(default_factory=list)  # (learner's copy, course notebook)

    def lines(self) -> list[str]:
        out = []
        if len(self.added) > 3:
            out.append(tr("Copied {n} notebooks into {work}/: lessons in {work}/course/, "
                          "exercises in {work}/exercises/.").format(n=len(self.added), work=WORK_DIR))
            out.append(tr("Grade an exercise with the hidden tests: `python3 make.py check 01` (01: its chapter)."))
        elif self.added:
            out.append(tr("New in the course, copied in: ") + ", ".join(self.added))
        if self.updated:
            out.append(tr("Updated to the course's new version (you had not changed them): ")
                       + ", ".join(self.updated))
        if self.newer:
            out.append(tr("The course has a newer version of these notebooks; your copies are kept:"))
            out += [f"  {mine}   ({tr('course')}: {theirs})" for mine, theirs in self.newer]
            out.append(tr("  To take the new version, rename your copy (your work stays in it) and "
                          "start `python3 make.py lab` again."))
        return out


def sync(root: Path = layout.ROOT, lang: str = "en") -> SyncReport:
    """Bring work/ up to date with the course without ever overwriting the learner's work.

    A missing copy is created; a copy whose cells the learner never changed follows the
    course; a changed copy is kept, and reported when its course notebook changed since it
    was copied. work/.course-versions.json remembers what each copy was made from.
    """
    work = work_dir(root)
    manifest_path = work / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        manifest = {}
    report = SyncReport()
    for source, dest in copies(root, lang):
        key = dest.relative_to(root).as_posix()
        fresh = copy_text(source, root, lang)
        entry = manifest.get(key)
        record = {"source": source.relative_to(root).as_posix(), "source_sha256": _sha(fresh),
                  "cells": fingerprint(dest, fresh)}
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(fresh, encoding="utf-8")
            manifest[key] = record
            report.added.append(key)
            continue
        if entry and entry.get("source_sha256") == record["source_sha256"]:
            continue  # the course did not change this notebook since it was copied
        mine = fingerprint(dest, dest.read_text(encoding="utf-8", errors="replace"))
        if mine is not None and mine == record["cells"]:
            manifest[key] = record  # the same cells: nothing of the learner's to keep
        elif entry and mine is not None and mine == entry.get("cells"):
            dest.write_text(fresh, encoding="utf-8")  # untouched copy of an older version
            manifest[key] = record
            report.updated.append(key)
        else:
            report.newer.append((key, record["source"]))
    work.mkdir(parents=True, exist_ok=True)
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return report


_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|(?:href|src)=\"([^\"]+)\"")


def relative_links(nb: dict) -> list[str]:
    """The relative link targets in a notebook's markdown cells (no web addresses, anchors
    cut off): each must name a file next to the notebook."""
    found = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        text = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        for match in _LINK.finditer(text):
            target = (match.group(1) or match.group(2)).split("#", 1)[0]
            if target and not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
                found.append(target)
    return found


def learner_copy(path: str | Path, root: Path = layout.ROOT) -> Path | None:
    """The learner's copy in work/ of a course notebook (e.g. the path an exercise names,
    exercises/01_device_basics/01_device_basics.ipynb), when it exists."""
    target = Path(path).resolve()
    for source, dest in copies(root, ZH):
        if source.resolve() == target and dest.exists():
            return dest
    return None


@dataclass
class LabCommand:
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    serve_root: Path
    report: SyncReport | None


def server_env(root: Path, mode: str, base: dict[str, str] | None = None,
               lang: str = "en") -> dict[str, str]:
    """This environment's Jupyter first (kernel, extensions), and the mode's configuration
    (with lang="zh", also jupyter-config/zh/: JupyterLab in Chinese)."""
    env = dict(os.environ if base is None else base)
    prefix = Path(sys.prefix)

    def prepend(var: str, *paths: Path) -> None:
        env[var] = os.pathsep.join([*(str(p) for p in paths), *filter(None, env.get(var, "").split(os.pathsep))])

    prepend("JUPYTER_PATH", prefix / "share" / "jupyter")
    configs = [root / CONFIG_DIR / mode, root / CONFIG_DIR / "common"]
    if mode == "student":  # a hub's student view (its /etc/jupyter), with the local exchange on top
        configs.insert(1, root / HUB_ETC)
    if lang == ZH:
        configs.insert(0, root / CONFIG_DIR / ZH)
    prepend("JUPYTER_CONFIG_PATH", *configs)
    prepend("PATH", Path(sys.executable).parent)  # nbgrader shells out to alembic
    env["PYTHONNOUSERSITE"] = "1"
    return env


def command(root: Path = layout.ROOT, *, instructor: bool = False, student: str | None = None,
            extra_args: list[str] | tuple[str, ...] = (), lang: str = "en") -> LabCommand:
    """Prepare (learner mode: bring work/ up to date) and build the `jupyter lab` command
    that `make.py lab` runs. The browser test starts its server from this, too."""
    from coursetools.instructor import exchange

    if instructor and student:
        raise ValueError("--instructor and --student are two modes: choose one")
    mode = "instructor" if instructor else "student" if student else "learner"
    extra_env: dict[str, str] = {}
    if instructor:
        serve_root, report, first = root, None, []
        for sub in ("exchange", "student"):  # the exchange, and the instructor's own fetch folder
            (root / LOCAL_EXCHANGE / sub).mkdir(parents=True, exist_ok=True)
    elif student:
        serve_root, report, first = Path(exchange.student_dir(str(root), student)), None, []
        serve_root.mkdir(parents=True, exist_ok=True)
        (root / LOCAL_EXCHANGE / "exchange").mkdir(parents=True, exist_ok=True)
        extra_env[exchange.STUDENT_ENV] = student
    else:
        report = sync(root, lang)
        serve_root = work_dir(root)
        first_notebook = serve_root / ZH / FIRST_NOTEBOOK if lang == ZH else serve_root / FIRST_NOTEBOOK
        first = [str(first_notebook)]
    argv = [sys.executable, "-m", "jupyter", "lab", f"--ServerApp.root_dir={serve_root}", *first]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-root")  # containers and cloud shells run as root
    argv += list(extra_args)
    # nbgrader reads nbgrader_config.py from the server's working folder (and, for the
    # Assignments tab, from JUPYTER_CONFIG_PATH: jupyter-config/<mode>/nbgrader_config.py).
    return LabCommand(argv, {**server_env(root, mode, lang=lang), **extra_env}, serve_root, serve_root, report)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 make.py lab", description=__doc__.splitlines()[0],
        epilog="Other arguments go to `jupyter lab`, e.g. --port 8890 or --no-browser.")
    parser.add_argument("--instructor", action="store_true",
                        help="serve the repository itself, with nbgrader's Formgrader")
    parser.add_argument("--student", metavar="NAME",
                        help="one student of a class on this machine: the Assignments tab, fetching "
                             "into local-exchange/students/NAME/ (try the class before a hub exists)")
    parser.add_argument("--lang", choices=("en", ZH), default="en",
                        help="zh: the Chinese edition (notebooks in work/zh/, JupyterLab in Chinese)")
    args, rest = parser.parse_known_args(argv)
    i18n.set_language(args.lang)
    from coursetools.instructor import exchange

    try:
        if args.student:
            exchange.valid_student(args.student)
        cmd = command(layout.ROOT, instructor=args.instructor, student=args.student, extra_args=rest,
                      lang=args.lang)
    except ValueError as exc:
        parser.error(str(exc))
    edition = f"{ZH}/" if args.lang == ZH else ""
    exercise = f"{WORK_DIR}/{edition}exercises/01_device_basics/01_device_basics{EXERCISE_SUFFIX}.ipynb"
    if cmd.report is not None:
        print(tr("Learner mode: your notebooks are in {work}/ (git-ignored), so what you run, "
                 "type and save stays yours and the course's own files stay as they are.").format(work=WORK_DIR))
        print("\n".join(cmd.report.lines()))
        print(tr("Check an exercise: python3 make.py check {exercise} "
                 "(instructors: python3 make.py lab --instructor)").format(exercise=exercise))
    elif args.student:
        print(tr("Student mode: you are {name}. The Assignments tab fetches into {folder}/ and submits "
                 "to this machine's exchange (release an assignment first: python3 make.py lab "
                 "--instructor, Formgrader).").format(
                     name=args.student, folder=Path(cmd.serve_root).relative_to(layout.ROOT)))
    else:
        print(tr("Instructor mode: serving the repository itself (edits change the course). "
                 "Nbgrader > Formgrader manages and grades the assignments."))
    sys.stdout.flush()
    if os.name == "posix":
        # Become the server: Ctrl-C then reaches Jupyter alone, which shuts its kernels down.
        os.chdir(cmd.cwd)
        os.execve(cmd.argv[0], cmd.argv, cmd.env)
    proc = subprocess.Popen(cmd.argv, cwd=cmd.cwd, env=cmd.env)
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            continue  # Jupyter handles Ctrl-C itself


if __name__ == "__main__":
    sys.exit(main())
