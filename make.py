#!/usr/bin/env python3
"""One entry point for learners, instructors and maintainers. Needs only Python 3.11+ and pip.

    python3 make.py lab                 install (first time) and open the course in JupyterLab
                                        (your copies in work/; --instructor: Formgrader;
                                        --lang zh: the Chinese edition, JupyterLab in Chinese)
    python3 make.py test                install (first time) and run the whole test suite
                                        (the tested versions of requirements-lock.txt)
    python3 make.py lock                refresh requirements-lock.txt: the newest versions the
                                        requirements allow, resolved now (then run the tests)
    python3 make.py check NOTEBOOK      grade one exercise notebook you edited
    python3 make.py trace SCRIPT [ARGS] run a script under the device tracer: a device error names
                                        the line that made each tensor (--pretend-cuda: on a laptop)
    python3 make.py release [NAME ...]  regenerate exercises/ from solutions/ with nbgrader
    python3 make.py links               rewrite every notebook's "Open in Colab" link
    python3 make.py new-chapter NN_topic "Title"   start a chapter from the template
    python3 make.py author-check NAME   quick checks of one chapter while you write it
    python3 make.py grade-class ...     grade a class's submissions (see README, instructors)
    python3 make.py class-report ...    what the class misunderstood, for a finished grade-class run
    python3 make.py gpu-report          run every notebook and test on a CUDA GPU, write a report
                                        (--record: write what the GPU printed into the lessons;
                                        --prune, --coverage: check those records, no GPU)
    python3 make.py test-torch 2.9.1    run every notebook alone on another PyTorch release
                                        (or: lowest, newest; a venv of its own, reused)
    python3 make.py cheatsheet          regenerate CHEATSHEET.md (and chapter 08's error table)
                                        from the notebooks (--check: only say what is stale)
    python3 make.py figures             copy the drawing helpers each lesson calls into its
                                        collapsed `figures` cell (--check: only say what is stale)
    python3 make.py site                build the course website (lessons run, with their outputs)
                                        into website/_build/html (--serve: then preview it)
    python3 make.py i18n build          the Chinese edition (zh/, README.zh-CN.md) from the English
                                        notebooks and the PO files in locale/zh_CN/ (update: the
                                        English into the PO files; check; coverage; add PATH)

Everything is installed into ./.venv, never into your system Python. The first run takes a
few minutes; later runs reinstall only when requirements change. PyTorch: if .venv already
has a torch in the supported range (course.toml [torch] supported), it is kept; otherwise
the release the tests are pinned to (course.toml [torch] tested) is installed. To use another
build (e.g. a CUDA wheel on Windows), install it into .venv first, or set TORCH_SPEC, e.g.
TORCH_SPEC="torch==2.11.0".
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
STAMP = VENV / ".course-installed"
DEV_STAMP = VENV / ".course-installed-dev"
REQUIREMENTS = ROOT / "requirements.txt"
DEV_REQUIREMENTS = ROOT / "requirements-dev.txt"
# The versions the test suite was last run with: `make.py test` and CI install exactly these
# (as pip constraints), so an upstream release cannot break a submission that changed nothing
# (soupsieve 4 broke every feedback page under a Python older than 3.11.5).
# Learners' installs (`make.py lab`, `make.py check`) keep requirements.txt's ranges.
# Refresh on purpose: `python3 make.py lock`, then `python3 make.py test`, commit both.
LOCK = ROOT / "requirements-lock.txt"
# Never pinned by the lock: torch is course.toml's [torch] tested (or TORCH_SPEC), and its
# CUDA companions follow the torch build; pip and setuptools belong to the environment.
UNLOCKED_PREFIXES = ("torch", "nvidia-", "triton", "pip", "setuptools", "cuda-")

if sys.version_info < (3, 11):
    sys.exit(f"error: Python 3.11 or newer is needed, this is {sys.version.split()[0]}: "
             "install it from python.org (or use Colab, which needs no install)")


def venv_python() -> Path:
    if os.name == "nt":
        return VENV / "Scripts" / "python.exe"
    return VENV / "bin" / "python"


def torch_config() -> dict[str, str]:
    """course.toml's [torch] table: the supported range, the pinned release, the two ends."""
    import tomllib

    with open(ROOT / "course.toml", "rb") as fh:
        return tomllib.load(fh)["torch"]


def tested_torch() -> str:
    return torch_config()["tested"]


def run(cmd: list[str], **kw) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    result = subprocess.run([str(c) for c in cmd], **kw)
    if result.returncode != 0:
        sys.exit(result.returncode)


def torch_in_range(py: Path) -> bool:
    """True when .venv has a torch in the supported range (course.toml [torch] supported)."""
    spec = "torch" + torch_config()["supported"]
    code = (
        "import sys\n"
        "try:\n"
        "    from importlib.metadata import version\n"
        "    from packaging.requirements import Requirement\n"
        f"    ok = Requirement({spec!r}).specifier.contains(version('torch').split('+')[0])\n"
        "except Exception:\n"
        "    ok = False\n"
        "sys.exit(0 if ok else 1)\n"
    )
    return subprocess.run([str(py), "-c", code], capture_output=True).returncode == 0


def torch_spec_wanted() -> str:
    return os.environ.get("TORCH_SPEC", f"torch=={tested_torch()}")


def layers(dev: bool) -> list[tuple[Path, Path, str]]:
    """(requirements file, its stamp, the digest the stamp holds once installed) for each layer
    of .venv: the course's packages, and with `dev` the tests' on top."""
    out, base_digest = [], ""
    lock = LOCK.read_bytes() if dev and LOCK.exists() else b""
    for requirements, stamp in [(REQUIREMENTS, STAMP)] + ([(DEV_REQUIREMENTS, DEV_STAMP)] if dev else []):
        base_digest = hashlib.sha256(
            base_digest.encode() + requirements.read_bytes() + torch_spec_wanted().encode() + lock).hexdigest()
        out.append((requirements, stamp, base_digest))
    return out


def lock_args(dev: bool) -> list[str]:
    """pip's `-c requirements-lock.txt` for the test suite's installs; nothing for learners'."""
    return ["-c", str(LOCK)] if dev and LOCK.exists() else []


def ensure_env(dev: bool) -> Path:
    """Create .venv and install what the course needs (and, with `dev`, what tests need).

    A stamp per layer (the course's packages; the tests' packages on top) records what was
    installed, so each command reinstalls only when a requirements file changed.
    """
    with _env_lock():
        return _ensure_env(dev)


def _env_lock():
    """One make.py at a time installs into .venv (CI fetches the test-torch environments while
    the suite runs, and both start by making sure .venv is ready); a no-op where there is no
    fcntl (Windows), where a learner runs one command at a time anyway."""
    import contextlib
    try:
        import fcntl
    except ImportError:
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def locked():
        with open(ROOT / ".venv.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    return locked()


def _ensure_env(dev: bool) -> Path:
    py = venv_python()
    if not py.exists():
        print(f"Creating the virtual environment {VENV} ...", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    torch_spec = torch_spec_wanted()
    pip = [py, "-m", "pip", "install", "--disable-pip-version-check", "--quiet"]
    for requirements, stamp, digest in layers(dev):
        if stamp.exists() and stamp.read_text() == digest:
            continue
        if requirements == REQUIREMENTS:
            run(pip + ["--upgrade", "pip", "packaging"])
            if "TORCH_SPEC" in os.environ or not torch_in_range(py):
                # Installed on its own first, so the range in requirements.txt is already
                # met and pip does not reach for the newest (multi-GB) build.
                run(pip + [torch_spec])
        run(pip + ["-r", requirements, *lock_args(dev)])
        stamp.write_text(digest)
    install_site_files(py)
    return py


def install_site_files(py: Path) -> None:
    """coursetools/venv_site/*.py into .venv's site-packages, each loaded at start by a .pth file:
    course_lazy_rfc3987 saves 1.2-1.7 s in every process that imports nbformat (its docstring
    says why and how)."""
    site_dir = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   capture_output=True, text=True, check=True).stdout.strip())
    for source in sorted((ROOT / "coursetools" / "venv_site").glob("*.py")):
        for target, text in ((site_dir / source.name, source.read_text()),
                             (site_dir / f"{source.stem}.pth", f"import {source.stem}\n")):
            if not target.exists() or target.read_text() != text:
                partial = target.with_name(f".{target.name}.{os.getpid()}")
                partial.write_text(text)
                os.replace(partial, target)  # a Python starting meanwhile sees all or nothing


def refresh_lock() -> int:
    """requirements-lock.txt from what pip resolves now for requirements-dev.txt (and the tested
    torch), as into an empty environment: nothing is installed (`pip install --dry-run
    --ignore-installed --report`). Then `make.py test` installs it and runs the suite on it."""
    import json
    import platform
    import tempfile

    py = venv_python() if venv_python().exists() else Path(sys.executable)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [str(py), "-m", "pip", "install", "--disable-pip-version-check", "--quiet", "--dry-run",
               "--ignore-installed", "--report", str(report), "-r", str(DEV_REQUIREMENTS), torch_spec_wanted()]
        print("+", " ".join(cmd), flush=True)
        if subprocess.run(cmd).returncode != 0:
            print("error: pip could not resolve requirements-dev.txt; requirements-lock.txt is unchanged",
                  file=sys.stderr)
            return 1
        items = json.loads(report.read_text())["install"]
    pins = sorted((item["metadata"]["name"].lower().replace("_", "-"), item["metadata"]["version"])
                  for item in items)
    pins = [(name, version) for name, version in pins if not name.startswith(UNLOCKED_PREFIXES)]
    versions = subprocess.run([str(py), "-c", "import sys; print(sys.version.split()[0])"],
                              capture_output=True, text=True).stdout.strip()
    old = {line.split("==")[0]: line.split("==")[1] for line in LOCK.read_text().splitlines()
           if "==" in line and not line.startswith("#")} if LOCK.exists() else {}
    LOCK.write_text(
        "# The versions the test suite runs on: `python3 make.py test` and CI install exactly these\n"
        "# (pip constraints over requirements-dev.txt's ranges). Learners' installs keep the ranges.\n"
        "# Written by `python3 make.py lock` (resolved for Python "
        f"{versions} on {platform.system()} {platform.machine()}); never edit by hand.\n"
        "# Not pinned here: torch (course.toml [torch] tested), its CUDA companions, pip, setuptools.\n"
        + "".join(f"{name}=={version}\n" for name, version in pins))
    changed = [f"{name} {old.get(name, '(new)')} -> {version}" for name, version in pins if old.get(name) != version]
    gone = sorted(set(old) - {name for name, _ in pins})
    print(f"{LOCK.name}: {len(pins)} packages; {len(changed)} changed" + (":" if changed else ""))
    for line in changed + [f"{name} removed" for name in gone]:
        print(f"  {line}")
    print("Now run `python3 make.py test` (it installs these) and commit requirements-lock.txt with the result.")
    return 0


def jupyter_env() -> dict[str, str]:
    """Make Jupyter find this environment's kernel ("python3") before any user-wide one."""
    env = dict(os.environ)
    share = str(VENV / "share" / "jupyter")
    env["JUPYTER_PATH"] = os.pathsep.join(p for p in [share, env.get("JUPYTER_PATH", "")] if p)
    env["PYTHONNOUSERSITE"] = "1"
    bindir = str(venv_python().parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")  # nbgrader shells out to alembic
    return env


# make.py subcommand -> the coursetools module that implements it, by whom it serves
# (coursetools/__init__.py has the map): learner, instructor, author, evidence, publish.
MODULES = {"check": "learner.checkd", "trace": "learner.trace",
           "grade-class": "instructor.classroom", "class-report": "instructor.classreport",
           "release": "author.release", "links": "author.links", "author-check": "author.authorcheck",
           "new-chapter": "author.newchapter", "cheatsheet": "author.cheatsheet", "figures": "author.figures_sync",
           "gpu-report": "evidence.gpu_report", "test-torch": "evidence.torchrange",
           "site": "publish.website", "i18n": "publish.i18n"}


# Commands that run the test suite need the test-only packages too (`site`: Sphinx and its
# extensions, which only the website needs, are in requirements-dev.txt).
DEV_COMMANDS = {"gpu-report", "test-torch", "site"}


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__)
        return 0
    command, args = argv[0], argv[1:]
    if command == "lab":
        py = ensure_env(dev=False)
        # coursetools/learner/lab.py: the learner's work folder, the mode's Jupyter configuration.
        cmd = [str(py), "-m", "coursetools.learner.lab", *args]
        env = {**jupyter_env(), "PYTHONPATH": os.pathsep.join(
            [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])}
        if os.name == "posix":  # become it, so that Ctrl-C reaches Jupyter alone
            os.chdir(ROOT)
            os.execve(cmd[0], cmd, env)
        run(cmd, cwd=ROOT, env=env)
    elif command == "lock":
        return refresh_lock()
    elif command == "test":
        py = ensure_env(dev=True)
        # The whole suite (no arguments: the README's command, what CI runs) is spread over a
        # worker per core and one more (pytest-xdist; the order of work units: tests/conftest.py).
        workers = [] if args else ["-n", "auto", "--dist", "loadscope", "--no-loadscope-reorder"]
        run([py, "-m", "pytest", *workers, *args], cwd=ROOT, env=jupyter_env())
    elif command in MODULES:
        py = ensure_env(dev=command in DEV_COMMANDS)
        module = MODULES[command]
        cmd = [str(py), "-m", f"coursetools.{module}", *args]
        env = {**jupyter_env(), "PYTHONPATH": os.pathsep.join(
            [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])}
        if command == "grade-class" and os.name == "posix":
            # Become it: a signal (Ctrl-C, a scheduler's kill) then reaches grade-class itself,
            # which stops its workers and kernels and keeps what it finished (README).
            os.execve(cmd[0], cmd, env)
        run(cmd, cwd=os.getcwd(), env=env)
    else:
        print(f"error: unknown command {command!r}\n{__doc__}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
