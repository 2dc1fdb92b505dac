"""One submission graded where a worker runs: the expensive half of `nbgrader autograde`.

`grade-class` splits nbgrader's autograde in two. A *worker* (a process of this machine's
pool, or a Dask worker on another machine) gets a `Task`: the submission's files and the
assignment's source, as data, with the course's nbgrader configuration. It builds a scratch
course of its own (the source, a private gradebook made from it, the submission), runs
nbgrader's own `Autograde` in it up to and including the course's `ResilientExecute` (the
sandboxed kernel, the tamper checks, the static review), and sends back the executed
notebooks and its log. It never sees the instructor's folders or gradebook.

The coordinator (`grade-class`, coursetools.instructor.record) then records the result into
the one gradebook with nbgrader's own `Autograde` again, the execution replaced by the
worker's notebooks: nbgrader writes the grades, comments, timestamps and late penalties as
it always does, from one process, so no two writers ever meet in the gradebook.

A worker refuses work from a coordinator that runs other grading code (`code_digest`: the
course's tooling, nbgrader and PyTorch versions), and starts one test kernel before its
first submission (coursetools.grading.preflight).
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.metadata
import os
import pickle
import platform
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbgrader.preprocessors import NbGraderPreprocessor

from coursetools import layout

# Config sections a worker must not take from the coordinator as they are: paths of the
# coordinator's machine, and the steps after execution (the coordinator runs those).
SCRATCH_SOURCE, SCRATCH_RELEASE = "source", "release"
PACKAGES = ("nbgrader", "torch", "ipykernel", "jupyter_client", "nbconvert")


class WorkerMismatch(RuntimeError):
    """This worker runs other grading code than the coordinator: it must not grade."""


@dataclass
class Task:
    assignment: str
    student: str
    files: dict[str, bytes]   # the submission folder: relative path -> content (regular files only)
    source: dict[str, bytes]  # the assignment's source folder (answers and hidden tests)
    source_digest: str
    code_digest: str
    config: bytes             # the course's nbgrader configuration (a pickled traitlets Config)


@dataclass
class Job:
    """A submission to grade, read from disk only when a worker is about to take it."""
    assignment: str
    student: str
    folder: Path
    source: dict[str, bytes]
    source_digest: str
    submission_digest: str
    code_digest: str
    config: bytes

    @property
    def key(self) -> str:
        """A name for the task (Dask's key): assignment, student and what they are graded from."""
        return (f"grade-{self.assignment}-{self.student}-{self.source_digest[:10]}-"
                f"{self.submission_digest[:10]}")

    def task(self) -> Task:
        return Task(self.assignment, self.student, read_folder(self.folder), self.source,
                    self.source_digest, self.code_digest, self.config)


@dataclass
class Outcome:
    assignment: str
    student: str
    executed: dict[str, str] = field(default_factory=dict)  # notebook id -> executed notebook (JSON)
    graded: dict[str, str] = field(default_factory=dict)    # notebook id -> the final graded notebook
    feedback: dict[str, str] = field(default_factory=dict)  # notebook id -> feedback HTML
    log: str = ""
    error: str | None = None  # nbgrader could not grade this submission (its traceback)
    seconds: float = 0.0
    worker: str = ""
    sandbox: str = ""  # how this worker's kernels are contained (sandbox.describe)
    out_of_memory: bool = False  # the worker hit its memory cap on this submission
    # On a Dask worker: its address, and why it must be replaced after this submission
    # (retire_reason; DaskEngine asks the worker's nanny for a fresh process).
    address: str = ""
    retire: str = ""


def files_digest(files: dict[str, bytes]) -> str:
    """sha256 of a folder given as {relative path: bytes}: names and contents, in order."""
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(rel.encode("utf-8") + b"\0" + hashlib.sha256(files[rel]).digest())
    return h.hexdigest()


def read_folder(folder: Path) -> dict[str, bytes]:
    """The regular files under `folder` (symbolic links are not followed), relative paths."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(dirpath, d)))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.is_symlink() or not path.is_file():
                continue
            out[path.relative_to(folder).as_posix()] = path.read_bytes()
    return out


def write_folder(files: dict[str, bytes], folder: Path) -> None:
    for rel, data in files.items():
        path = (folder / rel).resolve()
        if folder.resolve() not in path.parents:
            raise ValueError(f"{rel!r} leaves its folder")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def code_digest(root: Path = layout.ROOT) -> str:
    """What grading runs: the course's tooling (coursetools/, nbgrader_config.py), Python's
    version and the versions of the packages that execute and grade. A worker whose digest
    differs grades differently, so it refuses work (WorkerMismatch)."""
    h = hashlib.sha256()
    files = sorted((root / "coursetools").rglob("*.py")) + [root / "nbgrader_config.py"]
    for path in files:
        if "__pycache__" in path.parts:
            continue
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    h.update(platform.python_version().encode())
    for name in PACKAGES:
        try:
            h.update(f"{name}=={importlib.metadata.version(name)}".encode())
        except importlib.metadata.PackageNotFoundError:
            h.update(f"{name} missing".encode())
    return h.hexdigest()


def describe_code() -> str:
    versions = []
    for name in ("nbgrader", "torch"):
        try:
            versions.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"no {name}")
    return f"{layout.ROOT} (Python {platform.python_version()}, {', '.join(versions)})"


# -- the worker's side ----------------------------------------------------------------------
_LOCK = threading.Lock()  # one submission at a time per process (nbgrader logs to one logger)
_STATE: dict = {"templates": {}, "checked": set(), "digest": None, "sandbox": ""}


# A worker's memory. The tests run in the worker's process, against answers from the student's
# kernel (coursetools.grading.remote bounds each answer before decoding it); these bound what
# is left: a cap on the worker's heap (RLIMIT_DATA, soft limit only, so a sandboxed kernel
# still gets its own), and a worker whose memory a submission pushed past the threshold is
# replaced after it (LocalEngine starts a fresh one), so no student inherits another's leftovers.
WORKER_MEMORY_ENV = "COURSE_WORKER_MEMORY_MIB"    # 0: no cap
WORKER_RECYCLE_ENV = "COURSE_WORKER_RECYCLE_MIB"  # 0: never recycled
DEFAULT_WORKER_MEMORY_MIB = 4096
DEFAULT_WORKER_RECYCLE_MIB = 1536
MIB = 2**20


def _env_mib(name: str, default: int) -> int:
    try:
        return max(0, int(os.environ.get(name, default)))
    except ValueError:
        return default


def cap_memory() -> int | None:
    """Cap this process's heap (RLIMIT_DATA's soft limit); returns the cap in MiB, or None."""
    import resource

    mib = _env_mib(WORKER_MEMORY_ENV, DEFAULT_WORKER_MEMORY_MIB)
    if not mib:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    want = mib * MIB if hard == resource.RLIM_INFINITY else min(mib * MIB, hard)
    if soft != resource.RLIM_INFINITY and soft <= want:
        return soft // MIB
    resource.setrlimit(resource.RLIMIT_DATA, (want, hard))
    return want // MIB


def memory_mib(field_name: str = "VmRSS") -> float | None:
    """This process's resident memory (VmRSS) or its peak (VmHWM), from /proc/self/status."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def retire_reason(outcome: "Outcome | None" = None) -> str | None:
    """Why this worker should be replaced after the submission it just graded, or None."""
    if outcome is not None and outcome.out_of_memory:
        return "it ran out of memory grading the last submission"
    limit = _env_mib(WORKER_RECYCLE_ENV, DEFAULT_WORKER_RECYCLE_MIB)
    rss = memory_mib()
    if limit and rss is not None and rss > limit:
        return f"it held {rss:.0f} MiB after the last submission (more than {limit} MiB)"
    return None


def worker_name() -> str:
    return f"{platform.node()}:{os.getpid()}"


def _my_digest() -> str:
    if _STATE["digest"] is None:
        _STATE["digest"] = code_digest()
    return _STATE["digest"]


def _nbgrader_on_path() -> None:
    """nbgrader shells out to `alembic` when it creates a gradebook: this Python's bin/ first."""
    bindir = os.path.dirname(sys.executable)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")


def _worker_config(config_bytes: bytes, root: Path):
    """The coordinator's course configuration, pointed at this worker's scratch course and
    cut after the execution step (the coordinator records the grades)."""
    from traitlets.config import Config

    from coursetools.instructor.nbgrader_ext import ResilientExecute, feedback_template_dirs

    config = pickle.loads(config_bytes)
    assert isinstance(config, Config)
    config.CourseDirectory.root = str(root)
    config.CourseDirectory.source_directory = SCRATCH_SOURCE
    config.CourseDirectory.release_directory = SCRATCH_RELEASE
    for trait in ("submitted_directory", "autograded_directory", "feedback_directory", "directory_structure"):
        config.CourseDirectory.pop(trait, None)
    config.CourseDirectory.db_url = f"sqlite:///{root / 'gradebook.db'}"
    steps = list(config.Autograde.get("autograde_preprocessors", [ResilientExecute]))
    if ResilientExecute not in steps:
        raise RuntimeError("nbgrader_config.py's Autograde.autograde_preprocessors has no ResilientExecute")
    steps.insert(steps.index(ResilientExecute) + 1, CaptureExecuted)
    config.Autograde.autograde_preprocessors = steps
    config.Autograde.pre_convert_hook = None  # this worker ran the preflight before taking work
    config.Autograde.post_convert_hook = None
    config.GenerateAssignment.pre_convert_hook = None
    config.GenerateAssignment.post_convert_hook = None
    hide = list(config.ResilientExecute.get("hide", []))
    config.ResilientExecute.hide = [*hide, str(root)]
    # The feedback templates of this machine (the coordinator's paths may not exist here).
    config.HTMLExporter.extra_template_basedirs = feedback_template_dirs()
    return config


_EXECUTED: dict[tuple[str, str], str] = {}


class CaptureExecuted(NbGraderPreprocessor):
    """Right after ResilientExecute in the worker's autograde: keeps the executed notebook,
    which goes back to the coordinator (its own nbgrader steps take over from there)."""

    def preprocess(self, nb, resources):
        info = resources["nbgrader"]
        _EXECUTED[(info["student"], info["notebook"])] = nbformat.writes(nb)
        return nb, resources


def _run(app) -> dict:
    from nbgrader.utils import capture_log

    return capture_log(app)


# The coordinator's scratch folder for this run (grade-class sets it; a worker on another
# machine, which cannot see it, removes its own files when it exits).
SCRATCH_ENV = "COURSE_GRADE_CLASS_SCRATCH"


def _template(task: Task, config_bytes: bytes) -> Path:
    """A gradebook that knows the assignment (nbgrader's generate_assignment, run once per
    worker process and source version); each submission gets a copy."""
    key = (task.assignment, task.source_digest, hashlib.sha256(config_bytes).hexdigest())
    cached = _STATE["templates"].get(key)
    if cached and cached.exists():
        return cached
    from nbgrader.converters import GenerateAssignment
    from nbgrader.coursedir import CourseDirectory

    base = os.environ.get(SCRATCH_ENV)
    root = Path(tempfile.mkdtemp(prefix="grade-class-template-", dir=base if base and os.path.isdir(base) else None))
    if not (base and os.path.isdir(base)):  # a worker of another machine's: removed when it exits
        atexit.register(shutil.rmtree, root, True)
    write_folder(task.source, root / SCRATCH_SOURCE / task.assignment)
    config = _worker_config(config_bytes, root)
    coursedir = CourseDirectory(config=config)
    coursedir.assignment_id = task.assignment
    app = GenerateAssignment(coursedir=coursedir, config=config)
    app.force = True
    result = _run(app)
    if not result["success"]:
        raise RuntimeError(f"worker {worker_name()}: generate_assignment {task.assignment} failed:\n"
                           f"{result.get('log', '')}\n{result.get('error', '')}")
    _STATE["templates"][key] = root / "gradebook.db"
    return root / "gradebook.db"


def ensure_ready(config_bytes: bytes) -> float:
    """Before a worker's first submission: one kernel started as grading will start it
    (coursetools.grading.preflight); raises PreflightError (or SandboxUnavailable) with the
    cause. Done once per process and sandbox setting. Returns the seconds it took."""
    from coursetools.grading import preflight, sandbox
    from coursetools.instructor.nbgrader_ext import ResilientExecute

    _nbgrader_on_path()
    root = Path(tempfile.mkdtemp(prefix="grade-class-preflight-"))
    try:
        step = ResilientExecute(config=_worker_config(config_bytes, root))
        sandbox_config = step.sandbox_config({"nbgrader": {"db_url": ""}})
        key = repr((sandbox_config.mode, sandbox_config.expose, step.kernel_name))
        if key in _STATE["checked"]:
            return 0.0
        seconds = preflight.check(sandbox_config, kernel_name=step.kernel_name)
        _STATE["sandbox"] = f"worker {worker_name()}: {sandbox.describe(sandbox_config)}"
    finally:
        shutil.rmtree(root, ignore_errors=True)
    _STATE["checked"].add(key)
    return seconds


def _feedback(config, task: Task) -> tuple[dict[str, str], str]:
    """nbgrader's feedback of the submission just graded, from this scratch course's gradebook
    (the coordinator uses it when its gradebook has nothing more: no manual grade, no late
    penalty; record.Recorder checks)."""
    from nbgrader.coursedir import CourseDirectory
    from coursetools.instructor import nbgrader_ext

    feedback_config = nbgrader_ext.feedback_config(config)
    coursedir = CourseDirectory(config=feedback_config)
    coursedir.assignment_id, coursedir.student_id = task.assignment, task.student
    app = nbgrader_ext.feedback_app(coursedir, config)
    app.force = True
    result = _run(app)
    folder = Path(config.CourseDirectory.root) / "feedback" / task.student / task.assignment
    pages = {p.stem: p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.html"))} if result["success"] else {}
    return pages, "\n" + result.get("log", "")


def grade(task: Task) -> Outcome:
    """Grade one submission in a scratch course; never raises for the submission's faults
    (they come back as `Outcome.error`), only for the worker's (WorkerMismatch, preflight)."""
    if task.code_digest != _my_digest():
        raise WorkerMismatch(
            f"worker {worker_name()} runs other grading code than grade-class: {describe_code()}; "
            "give every worker the same course checkout and environment")
    with _LOCK:
        ensure_ready(task.config)
        start = time.monotonic()
        outcome = Outcome(task.assignment, task.student, worker=worker_name(), sandbox=_STATE["sandbox"])
        template = _template(task, task.config)
        root = Path(tempfile.mkdtemp(prefix="grade-class-"))
        try:
            from nbgrader.converters import Autograde
            from nbgrader.coursedir import CourseDirectory

            write_folder(task.source, root / SCRATCH_SOURCE / task.assignment)
            write_folder(task.files, root / "submitted" / task.student / task.assignment)
            shutil.copyfile(template, root / "gradebook.db")
            config = _worker_config(task.config, root)
            coursedir = CourseDirectory(config=config)
            coursedir.assignment_id, coursedir.student_id = task.assignment, task.student
            app = Autograde(coursedir=coursedir, config=config)
            app.force, app.create_student = True, True
            for key in [k for k in _EXECUTED if k[0] == task.student]:
                del _EXECUTED[key]
            try:
                result = _run(app)
            except MemoryError:
                # The worker's cap (cap_memory): this submission's fault, reported as such;
                # the worker is replaced after it (retire_reason).
                outcome.out_of_memory = True
                result = {"success": False, "log": "", "error": "the grading worker ran out of memory "
                                                                 "grading this submission"}
            outcome.log = result.get("log", "")
            graded = root / "autograded" / task.student / task.assignment
            for path in sorted(graded.glob("*.ipynb")) if graded.is_dir() else []:
                outcome.graded[path.stem] = path.read_text(encoding="utf-8")
                outcome.executed[path.stem] = _EXECUTED.pop((task.student, path.stem), "")
            if not result["success"]:
                outcome.error = result.get("error") or "nbgrader autograde failed"
            elif not outcome.graded or not all(outcome.executed.values()):
                outcome.error = "nbgrader wrote no graded notebook"
            else:
                outcome.feedback, log = _feedback(config, task)
                outcome.log += log
        finally:
            shutil.rmtree(root, ignore_errors=True)
        outcome.seconds = time.monotonic() - start
        outcome.address = _dask_address()
        if outcome.address:  # a local worker decides for itself (coursetools/instructor/localworker.py)
            outcome.retire = retire_reason(outcome) or ""
        return outcome


def _dask_address() -> str:
    """The address of the Dask worker running this task, or "" outside one."""
    if "distributed" not in sys.modules:
        return ""
    try:
        from distributed import get_worker
        return str(get_worker().address)
    except (ImportError, ValueError):
        return ""
