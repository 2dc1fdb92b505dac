"""Run a student's kernel where it cannot touch the grader: bubblewrap, an unprivileged
user, and resource limits.

The kernel runs inside `bwrap` (Debian's `bubblewrap`):

* as an unprivileged user with no capabilities, in its own user namespace, also when the
  grader is root: a root grader first drops to `nobody` (uid/gid 65534, no groups, empty
  capability sets) with `setpriv`, then starts bwrap with `--unshare-user --disable-userns
  --cap-drop ALL`. So `mount`, `umount` and remounting `/` read-write fail (EPERM), the
  kernel cannot make a user namespace of its own, and files readable only by root stay
  unreadable. Where user namespaces are refused (some containers), a root grader runs
  bwrap itself and drops to `nobody` inside with `setpriv` (still no capabilities);
* default deny: the kernel's file system is built from nothing (`file_system_view`). It
  holds, read-only, only the system folders (`/usr`, `/bin`, `/lib*`, `/sbin`, `/sys`), a
  few files of `/etc` (the loader's cache, users and hosts, the time zone), the Python
  running the kernel (its venv, the installation it was made from, the folders of its
  import path) and any folder asked for (`expose`). The course folder (gradebook,
  solutions with hidden tests, other students' submissions), the grader's home, other
  clones, `/var`, `/srv`, `/opt`, `/home` and nbgrader's exchange are simply not there.
  Every folder made on the way to a bind is 0755 (bubblewrap 0.8 would make it 0700, out
  of reach of a kernel running as `nobody`), so Python, the venv, the scratch and
  connection folders may lie anywhere: under `/tmp`, the grader's home, a 0700 TMPDIR;
* writable: `/tmp`, `/dev/shm` and the kernel's working folder (the notebook's scratch
  folder, copied in), each a tmpfs with a size cap, and the kernel's connection folder
  (a 1 MiB tmpfs when the grader is root);
* no network: a private network namespace with only a loopback interface (so a DDP
  rendezvous on 127.0.0.1 still works); private process and IPC namespaces; the kernel
  dies with the grader;
* limits: where a cgroup hierarchy is writable (v2 with the memory and pids controllers,
  or v1 memory and pids), each kernel gets its own cgroup: a memory cap that counts tmpfs
  files and shared memory, and a cap on processes and threads. Always, per process:
  `RLIMIT_DATA` (a cell over it gets a `MemoryError`), `RLIMIT_FSIZE` (file size),
  `RLIMIT_CPU`, `RLIMIT_NOFILE`, no core files, and `RLIMIT_NPROC`, set inside the
  sandbox's user namespace so that it counts that sandbox's processes only (Linux 5.14+).
  `describe()` says which of these hold on this machine; grade-class logs it.

The kernel talks to the grader over Unix sockets in the connection folder (ZeroMQ's `ipc`
transport), since the sandbox has no shared network.

Grading as root without the sandbox is refused unless asked for explicitly
(`COURSE_ALLOW_UNSANDBOXED_ROOT=1`, or `grade-class --unsandboxed-as-root`).

Not protected against: reading what the view shows (system files under /usr, the Python
installation and its packages), kernel exploits, CPU time up to the limits, and —
inside the kernel itself — code that defeats the in-kernel tamper checks (see
coursetools.grading.guard): those are flagged for review, not prevented.
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager

MODES = ("auto", "bwrap", "off")
NOBODY = 65534  # uid and gid the kernel runs as when the grader is root
ALLOW_ROOT_ENV = "COURSE_ALLOW_UNSANDBOXED_ROOT"  # "1": grade as root without the sandbox
MIB = 2**20
HIDDEN_TMPFS_BYTES = MIB  # the empty folders laid over hidden ones (read-only as well)
RUNTIME_TMPFS = "size=1m,mode=0700"  # the connection folder, when the grader is root
INPUT = "/tmp/.course-input"  # inside the sandbox: the scratch folder's files, read-only


class SandboxUnavailable(RuntimeError):
    pass


@dataclass(frozen=True)
class SandboxConfig:
    mode: str = "auto"  # auto: bwrap when it works here, else no sandbox (with a warning)
    memory_mb: int = 4096  # cgroup memory cap of the whole sandbox; RLIMIT_DATA per process
    cpu_seconds: int = 1800  # RLIMIT_CPU per process
    open_files: int = 4096
    max_processes: int = 512  # processes + threads: cgroup pids.max and RLIMIT_NPROC
    file_mb: int = 1024  # RLIMIT_FSIZE: the largest file the kernel may write
    tmpfs_mb: int = 1024  # size cap of each writable tmpfs: /tmp, /dev/shm, the scratch folder
    hide: tuple[str, ...] = ()  # folders replaced by an empty tmpfs (the course root, ...)
    expose: tuple[str, ...] = ()  # read-only folders re-exposed inside hidden ones
    # hidden even inside a system folder the kernel sees: nbgrader's default exchange (every
    # student's submissions) lies under /usr/local/share
    extra_hide: tuple[str, ...] = field(default=("/usr/local/share/nbgrader",))


def is_root() -> bool:
    return os.geteuid() == 0


# -- how the kernel is isolated on this machine -------------------------------------------

def _setpriv() -> list[str]:
    """Become `nobody` with no groups and no capabilities (root only)."""
    exe = shutil.which("setpriv")
    if exe is None:
        raise SandboxUnavailable("setpriv (util-linux) is not installed")
    return [exe, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all"]


def _recipe_args(recipe: str, keep_caps: bool = False) -> tuple[list[str], list[str]]:
    """(bwrap's own options, inside bwrap before the command) for a recipe.

    'userns' as root: bwrap (as root: it can reach every folder it binds) builds the
      sandbox, then setpriv becomes nobody and a second bwrap puts the kernel in its own
      user namespace (--disable-userns: no further ones), all capabilities dropped; the
      mounts of the first stage are locked in the second (they cannot be undone);
    'userns' not as root: one bwrap in a user namespace, as the grader's own uid;
    'setpriv' (root, where user namespaces are refused): bwrap as root, then setpriv to
      nobody inside: no capabilities, no user namespace.

    `keep_caps` (the warm-kernel zygote, 'userns' only): the process keeps every capability
    *inside its own user namespace* (none outside it), so that each kernel it forks can make
    namespaces and mounts of its own before it drops them all (coursetools.grading.warm).
    """
    caps = ["--cap-add", "ALL"] if keep_caps else ["--cap-drop", "ALL"]
    if keep_caps and recipe != "userns":
        raise SandboxUnavailable("warm kernels need user namespaces (bwrap --unshare-user)")
    if recipe == "userns" and not is_root():
        return ["--unshare-user", "--disable-userns", *caps], []
    if recipe == "userns":
        stage2 = [shutil.which("bwrap") or "bwrap", "--unshare-user", "--disable-userns",
                  "--uid", str(NOBODY), "--gid", str(NOBODY), *caps,
                  "--dev-bind", "/", "/", "--die-with-parent", "--"]
        return [], _setpriv() + stage2
    if recipe == "setpriv":
        return [], _setpriv() + ["--no-new-privs"]
    raise ValueError(recipe)


def _probe(exe: str, recipe: str) -> subprocess.CompletedProcess:
    own, inside = _recipe_args(recipe)
    cmd = [exe, *own, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
           "--perms", "1777", "--size", str(MIB), "--tmpfs", "/tmp",
           "--unshare-net", "--unshare-pid", "--unshare-ipc", "--die-with-parent", "--",
           *inside, "true"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30)


@functools.cache
def _isolation() -> tuple[str, str]:
    """('userns' | 'setpriv', bwrap's path) where the sandbox works here, else ('', why)."""
    exe = shutil.which("bwrap")
    if exe is None:
        return "", "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
    errors = []
    for recipe in ("userns", "setpriv") if is_root() else ("userns",):
        try:
            proc = _probe(exe, recipe)
        except (OSError, subprocess.TimeoutExpired, SandboxUnavailable) as exc:
            errors.append(f"{recipe}: {exc}")
            continue
        if proc.returncode == 0:
            return recipe, exe
        errors.append(f"{recipe}: {proc.stderr.strip()[:200]}")
    return "", "bwrap cannot create the sandbox's namespaces here: " + "; ".join(errors)


def bwrap_works() -> tuple[bool, str]:
    """Whether bubblewrap can create the sandbox here: (True, bwrap's path) or (False, why)."""
    recipe, detail = _isolation()
    return bool(recipe), detail


def resolve_mode(mode: str) -> str:
    """'auto' -> 'bwrap' where it works, else 'off'. 'bwrap' where it does not -> error.
    'off' (asked for, or what 'auto' comes to) as root -> error, unless ALLOW_ROOT_ENV=1."""
    if mode not in MODES:
        raise ValueError(f"sandbox mode must be one of {MODES}, got {mode!r}")
    ok, detail = (False, "the sandbox is turned off") if mode == "off" else bwrap_works()
    if ok:
        return "bwrap"
    if mode == "bwrap":
        raise SandboxUnavailable(detail)
    if is_root() and os.environ.get(ALLOW_ROOT_ENV) != "1":
        raise SandboxUnavailable(
            f"refusing to grade as root without the sandbox ({detail}): a submission would run "
            "with every privilege of the grader. Install bubblewrap, or grade as an unprivileged "
            f"user, or accept the risk explicitly: grade-class --unsandboxed-as-root "
            f"(or {ALLOW_ROOT_ENV}=1)")
    return "off"


# -- cgroups ------------------------------------------------------------------------------

CGROUP_ROOT = "/sys/fs/cgroup"


def _own_cgroup(controller: str) -> str | None:
    """This process's cgroup path for a v1 controller, or for v2 (controller '')."""
    try:
        lines = open("/proc/self/cgroup").read().splitlines()
    except OSError:
        return None
    for line in lines:
        hid, controllers, path = line.split(":", 2)
        if controller == "" and hid == "0":
            return path
        if controller and controller in controllers.split(","):
            return path
    return None


def _v2_parent() -> str | None:
    root = CGROUP_ROOT if os.path.exists(f"{CGROUP_ROOT}/cgroup.controllers") else f"{CGROUP_ROOT}/unified"
    own = _own_cgroup("")
    if own is None or not os.path.exists(f"{root}/cgroup.controllers"):
        return None
    parent = os.path.normpath(root + own)
    try:
        enabled = open(f"{parent}/cgroup.subtree_control").read().split()
    except OSError:
        return None
    return parent if {"memory", "pids"} <= set(enabled) else None


def _v1_parents() -> dict[str, str] | None:
    parents = {}
    for controller in ("memory", "pids"):
        own = _own_cgroup(controller)
        base = f"{CGROUP_ROOT}/{controller}"
        if own is None or not os.path.isdir(base):
            return None
        parents[controller] = os.path.normpath(base + own)
    return parents


class Cgroup:
    """One kernel's cgroup(s): a memory cap counting tmpfs and shared memory, and a cap on
    processes + threads. `procs` are the files the launcher writes its pid into."""

    def __init__(self, kind: str, dirs: list[str], procs: list[str]):
        self.kind, self.dirs, self.procs = kind, dirs, procs
        # Only a group its owner gave up on (its remove() found processes still dying) is
        # reaped at the next kernel: an empty group may be another thread's, whose kernel
        # has not joined it yet (grading several submissions at once in one process).
        self.abandoned = False

    @classmethod
    def create(cls, kind: str, memory_bytes: int, pids: int) -> "Cgroup":
        _reap(attempts=1)
        name = f"course-sandbox-{uuid.uuid4().hex[:12]}"
        if kind == "v2":
            path = os.path.join(_v2_parent(), name)
            os.mkdir(path)
            group = cls(kind, [path], [f"{path}/cgroup.procs"])
            _live.add(group)
            try:
                _write(f"{path}/memory.max", memory_bytes)
                if os.path.exists(f"{path}/memory.swap.max"):
                    _write(f"{path}/memory.swap.max", 0)
                _write(f"{path}/pids.max", pids)
            except OSError:
                group.remove()
                raise
            return group
        parents = _v1_parents()
        mem, pid = os.path.join(parents["memory"], name), os.path.join(parents["pids"], name)
        group = cls(kind, [], [])
        _live.add(group)
        try:
            for path in (mem, pid):
                os.mkdir(path)
                group.dirs.append(path)
                group.procs.append(f"{path}/cgroup.procs")
            _write(f"{mem}/memory.limit_in_bytes", memory_bytes)
            if os.path.exists(f"{mem}/memory.memsw.limit_in_bytes"):
                _write(f"{mem}/memory.memsw.limit_in_bytes", memory_bytes)  # no swapping past it
            _write(f"{pid}/pids.max", pids)
        except OSError:
            group.remove()
            raise
        return group

    def remove(self, attempts: int = 50) -> bool:
        """Kill what is left in the group and remove it (bounded retries); a group whose
        processes are still dying is retried later (next kernel, and at exit)."""
        for path in reversed(self.dirs):
            for _ in range(attempts):
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        break
                    for pid in _read_pids(f"{path}/cgroup.procs"):
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except OSError:
                            pass
                    time.sleep(0.02)
        gone = not any(os.path.exists(p) for p in self.dirs)
        if gone:
            _live.discard(self)
        else:
            self.abandoned = True
        return gone


_live: set[Cgroup] = set()  # every group this process made and has not removed yet


def _reap(attempts: int) -> None:
    """Remove the groups whose processes were still dying when their kernel was cleaned up
    (at each new group), and every group left (at exit, when no kernel runs any more)."""
    for group in list(_live):
        if attempts > 1 or (group.abandoned and not _read_pids(group.procs[0])):
            group.remove(attempts)


atexit.register(_reap, 50)


def _write(path: str, value) -> None:
    with open(path, "w") as f:
        f.write(f"{value}\n")


def _read_pids(path: str) -> list[int]:
    try:
        return [int(x) for x in open(path).read().split()]
    except (OSError, ValueError):
        return []


@functools.cache
def cgroup_kind() -> str:
    """'v2' or 'v1' where this process can make cgroups with memory and pids caps, else ''."""
    for kind in ("v2", "v1"):
        if (kind == "v2" and _v2_parent() is None) or (kind == "v1" and _v1_parents() is None):
            continue
        try:
            Cgroup.create(kind, 256 * MIB, 64).remove()
            return kind
        except (OSError, TypeError):
            continue
    return ""


# -- the kernel's command -----------------------------------------------------------------

# The only variables a sandboxed kernel inherits: no tokens, keys or passwords leak in.
SAFE_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TERM", "PYTHONHASHSEED",
            "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


def sandbox_env(config: SandboxConfig | None = None) -> dict[str, str]:
    """The kernel's environment: SAFE_ENV, plus the PYTHONPATH folders the sandbox shows
    (`import_path_extras`: never the course folder)."""
    env = {k: v for k, v in os.environ.items() if k in SAFE_ENV}
    env.update(HOME="/tmp", PYTHONDONTWRITEBYTECODE="1")
    extras = import_path_extras(config, sys_path=False) if config else []
    if extras:
        env["PYTHONPATH"] = os.pathsep.join(extras)
    return env


def _tools_checkout() -> list[str]:
    """The checkout these tools run from, when they run from one: it holds `solutions/`
    (every hidden test) even when the course being graded is another folder."""
    from coursetools import layout

    root = layout.ROOT
    return [str(root)] if (root / "solutions").is_dir() or (root / "nbgrader_config.py").exists() else []


def _hidden(config: SandboxConfig) -> list[str]:
    """Folders whose contents the kernel must never see: the course root and the others in
    `config.hide`, and the checkout of these tools."""
    return _existing([*config.hide, *_tools_checkout()])


def _protected(config: SandboxConfig) -> list[str]:
    """The hidden folders, the grader's home folder and the temporary folders (the kernel
    has a /tmp of its own; the grader's holds other users' files and the scratch folders):
    nothing bound may hold one."""
    return _existing([*_hidden(config), os.path.expanduser("~"), "/tmp", tempfile.gettempdir()])


def python_roots() -> list[str]:
    """Folders the kernel's Python needs: the venv, the installation it was made from, and
    the interpreter's own folder (wherever they lie: under /tmp, the grader's home, ...)."""
    roots = {sys.prefix, sys.base_prefix, os.path.dirname(sys.executable)}
    # Both as named (the kernel is started by that name: a venv may be a symlink) and as
    # resolved (its interpreter is a symlink into the installation it was made from).
    named = {os.path.abspath(r) for r in roots if r}
    return sorted(named | {os.path.realpath(r) for r in named}
                  | {os.path.dirname(os.path.realpath(sys.executable))})


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def import_path_extras(config: SandboxConfig, *, sys_path: bool = True) -> list[str]:
    """Folders on the import path the kernel needs besides its installation: PYTHONPATH
    entries and `.pth` additions (packages installed with `pip --target`, an editable
    install). The kernel is the same interpreter. Never one inside a hidden folder (the
    course root stays hidden even when a tool put it on PYTHONPATH), nor one that holds a
    hidden folder or the grader's home (it would show all of it)."""
    hidden = _hidden(config)
    protected = _protected(config)
    extras = []
    entries = [*os.environ.get("PYTHONPATH", "").split(os.pathsep), *(sys.path if sys_path else [])]
    # Each as named (what the kernel's sys.path will say: a .pth file names it so) and as
    # resolved (where a symlink on the way leads).
    named = [os.path.abspath(e) for e in entries if e and os.path.isdir(e)]
    for entry in dict.fromkeys(p for e in named for p in (e, os.path.realpath(e))):
        if any(_inside(p, entry) for p in protected) or any(_inside(entry, h) for h in hidden):
            continue
        extras.append(entry)
    return extras


def _existing(paths) -> list[str]:
    return [p for p in dict.fromkeys(os.path.realpath(p) for p in paths) if os.path.isdir(p)]


# -- what the kernel sees: a file system built from nothing (default deny) ----------------

# System folders the kernel's programs and libraries come from (read-only). Where one is a
# symlink (merged /usr: /bin -> usr/bin), the sandbox gets the same symlink.
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/sys")
# What of /etc a kernel needs: the dynamic loader's cache, user and host names (getpass,
# "localhost" for a DDP rendezvous), the time zone, Debian's alternatives and Python config.
ETC_ENTRIES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "passwd", "group", "nsswitch.conf",
               "hosts", "host.conf", "gai.conf", "localtime", "timezone", "alternatives",
               "os-release", "mime.types", "python3", f"python3.{sys.version_info.minor}")


def _ancestors(path: str) -> list[str]:
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


@dataclass
class FileSystemView:
    """The kernel's file system, as bwrap options: an empty read-only root with only what
    the kernel needs bound into it (the system folders, Python, the working folder), never
    the course, the grader's home, other clones or an nbgrader exchange. Every folder the
    view must create on the way to a bind is made 0755, whatever bwrap's default is (0700
    in bubblewrap 0.8: a kernel running as `nobody` could not pass through it)."""

    binds: list[str]  # read-only binds, at the same path
    writable: list[str]  # read-write binds, at the same path
    hidden: list[str]  # empty read-only tmpfs laid over these (inside a bound folder)
    symlinks: dict[str, str]  # path -> target
    scratch: str | None
    tmpfs_bytes: int
    tmpfs: list[str] = field(default_factory=list)  # empty writable tmpfs at these paths (a zygote's)

    def args(self) -> list[str]:
        ops: list[tuple[str, list[str]]] = []  # (target, bwrap options), emitted parents first
        for path, target in self.symlinks.items():
            ops.append((path, ["--symlink", target, path]))
        for path in self.binds:
            ops.append((path, ["--ro-bind", path, path]))
        for path in self.writable:
            ops.append((path, ["--bind", path, path]))
        for path in self.hidden:
            ops.append((path, ["--perms", "0755", "--size", str(HIDDEN_TMPFS_BYTES), "--tmpfs", path]))
        for path in [self.scratch] if self.scratch else []:
            ops.append((path, ["--perms", "1777", "--size", str(self.tmpfs_bytes), "--tmpfs", path]))
        for path in self.tmpfs:
            if not _inside(path, "/tmp"):
                ops.append((path, ["--perms", "1777", "--size", str(self.tmpfs_bytes), "--tmpfs", path]))
        mounts = {target for target, _ in ops}
        bound = [*self.binds, *self.writable]
        made: set[str] = {"/tmp"}
        out = ["--perms", "1777", "--size", str(self.tmpfs_bytes), "--tmpfs", "/tmp",
               "--dev", "/dev", "--perms", "1777", "--size", str(self.tmpfs_bytes), "--tmpfs", "/dev/shm",
               "--proc", "/proc"]
        for target, options in sorted(ops, key=lambda op: (op[0].count("/"), op[0])):
            for parent in _ancestors(target):
                # A parent shown by a bind exists already; one that a mount of the view
                # covers is made inside it; any other is made here, reachable by all.
                inside_bind = any(_inside(parent, b) and parent != b for b in bound)
                if parent in made or parent in mounts or inside_bind or parent in ("/dev", "/proc"):
                    continue
                out += ["--perms", "0755", "--dir", parent]
                made.add(parent)
            out += options
        if self.scratch:
            out += ["--ro-bind", self.scratch, INPUT]
        # Read-only from here on: the root, /dev and the hiding folders; not recursive, so
        # /tmp, /dev/shm, the working folder and the binds keep their own settings.
        out += ["--remount-ro", "/", "--remount-ro", "/dev"]
        for path in self.hidden:
            out += ["--remount-ro", path]
        return out

    def visible(self) -> list[str]:
        """What the kernel can read of the grader's file system (for the log and the docs)."""
        return sorted({*self.binds, *self.writable, *self.symlinks})


def file_system_view(config: SandboxConfig, *, writable: list[str], scratch: str | None,
                     readable: list[str] = (), tmpfs: list[str] = ()) -> FileSystemView:
    """What a kernel with this configuration sees (see FileSystemView)."""
    hidden_rules = [*_hidden(config), *config.extra_hide]
    symlinks: dict[str, str] = {}
    binds: list[str] = []

    def add(path: str) -> None:
        if os.path.islink(path):
            symlinks[path] = os.readlink(path)
        elif os.path.exists(path):
            binds.append(path)

    for path in SYSTEM_PATHS:
        add(path)
    for name in ETC_ENTRIES:
        add(f"/etc/{name}")
    tools = [shutil.which(t) for t in ("bwrap", "prlimit", "setpriv", "bash", "cp")]
    extra = [*python_roots(), *[os.path.dirname(os.path.realpath(t)) for t in tools if t],
             *import_path_extras(config), *[os.path.realpath(p) for p in config.expose if os.path.exists(p)]]
    for path in dict.fromkeys(extra):
        if path in ("/", "/etc") or any(_inside(path, b) for b in binds) or path in symlinks:
            continue
        binds = [b for b in binds if not _inside(b, path)]  # a wider folder replaces them
        binds.append(path)
    writable = [os.path.realpath(p) for p in writable]
    if scratch:
        scratch = os.path.realpath(scratch)
    # A protected folder that a bound folder holds (the course under /usr/local, say) is
    # covered by an empty one; binds inside it (its own .venv) are laid over that again.
    hidden = [p for p in dict.fromkeys(os.path.realpath(h) for h in hidden_rules)
              if os.path.isdir(p) and any(_inside(p, b) and p != b for b in binds)]
    # /sys is bound for what PyTorch reads there (CPU topology), but its cgroup tree is the
    # host's: every other grading kernel's cgroup and memory use. The kernel sees it empty.
    if "/sys" in binds and os.path.isdir(CGROUP_VIEW) and CGROUP_VIEW not in hidden:
        hidden.append(CGROUP_VIEW)
    binds += [os.path.realpath(p) for p in readable if not any(_inside(os.path.realpath(p), b) for b in binds)]
    return FileSystemView(binds=sorted(binds), writable=writable, hidden=hidden,
                          symlinks=symlinks, scratch=scratch, tmpfs_bytes=config.tmpfs_mb * MIB,
                          tmpfs=[os.path.realpath(p) for p in tmpfs])


CGROUP_VIEW = "/sys/fs/cgroup"
# Runs as the grader, before anything starts: join the kernel's cgroups (the files before
# "--"), then become bwrap (after the count of its options) with those options read from a
# pipe (`--args 3`) and the command on its command line. With
# --unshare-pid, bwrap's own process is pid 1 of the sandbox, and every kernel can read pid
# 1's command line: given on the command line, the options would show it the host's paths
# (the work folder, the scratch folder, the venv, the connection folder).
LAUNCHER = r'''
for f in "$@"; do [ "$f" = -- ] && break; echo $$ > "$f" || exit 125; shift; done
shift
n=$1 exe=$2
shift 2
exec 3< <(printf '%s\0' "${@:1:n}")
shift "$n"
exec "$exe" --args 3 -- "$@"
'''
# Runs inside the sandbox: copy the scratch folder's files into the kernel's tmpfs working
# folder, start the kernel there.
INSIDE = r'''
cp -R "$1"/. "$2"/ && cd "$2" || exit 125
shift 2
exec "$@"
'''


def _bash() -> str:
    return shutil.which("bash") or "/bin/bash"


def _limits(config: SandboxConfig, *, nproc: int | None) -> list[str]:
    exe = shutil.which("prlimit")
    if exe is None:
        return []
    args = [exe, f"--data={config.memory_mb * MIB}", f"--cpu={config.cpu_seconds}",
            f"--nofile={config.open_files}", "--core=0", f"--fsize={config.file_mb * MIB}"]
    if nproc:
        args.append(f"--nproc={nproc}")
    return args + ["--"]


def _nproc(recipe: str, config: SandboxConfig, cgroup: "Cgroup | None") -> int | None:
    """RLIMIT_NPROC for the kernel. In its own user namespace it counts that sandbox's
    processes only; as plain `nobody` (recipe 'setpriv') it counts every `nobody` process
    on the machine, so it is only set without a cgroup, for one kernel per core."""
    if recipe == "userns":
        return config.max_processes
    if cgroup is None:
        return config.max_processes * (os.cpu_count() or 1)
    return None


def wrap_command(cmd: list[str], config: SandboxConfig, *, writable: list[str],
                 scratch: str | None = None, cgroup: Cgroup | None = None,
                 zygote: tuple[list[str], list[str]] | None = None) -> list[str]:
    """The kernel command `cmd`, inside bwrap with limits (or with limits only, mode 'off').

    `writable`: folders bound read-write (the connection folder); `scratch`: the kernel's
    working folder, whose files are copied into a size-capped tmpfs at the same path;
    `cgroup`: the kernel's cgroup, joined before anything starts. `zygote`: (read-only
    folders, empty tmpfs folders) for a warm-kernel zygote, which keeps its capabilities
    inside its own user namespace (see _recipe_args)."""
    if config.mode == "off":
        return _limits(config, nproc=None) + cmd
    recipe, exe = _isolation()
    if not recipe:
        raise SandboxUnavailable(exe)
    own, inside = _recipe_args(recipe, keep_caps=zygote is not None)
    readable, tmpfs = zygote or ([], [])
    view = file_system_view(config, writable=writable, scratch=scratch, readable=readable, tmpfs=tmpfs)
    args = [exe, *own, *view.args()]
    args += ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
             "--unshare-cgroup-try", "--die-with-parent", "--new-session",
             "--setenv", "HOME", "/tmp",
             # ipykernel exits when its parent looks gone (parent pid 1), which is what any
             # parent outside a PID namespace looks like; --die-with-parent does that job.
             "--unsetenv", "JPY_PARENT_PID", "--"]
    copy_in = [_bash(), "-c", INSIDE, "sandbox-inside", INPUT, scratch] if scratch else []
    assert args[-1] == "--"
    options = args[1:-1]  # bwrap's own: given through a pipe, never on its command line
    command = [*inside, *_limits(config, nproc=_nproc(recipe, config, cgroup)), *copy_in, *cmd]
    procs = cgroup.procs if cgroup is not None else []
    return [_bash(), "-c", LAUNCHER, "sandbox-launch", *procs, "--", str(len(options)), exe,
            *options, *command]


# Runs inside the sandbox as the kernel would: for each path the kernel needs, the first
# folder on the way that is missing or that the kernel's user may not enter or read.
_DIAGNOSE = r"""
for p in "$@"; do
  cur=""
  IFS=/ read -ra parts <<< "${p#/}"
  for part in "${parts[@]}"; do
    cur="$cur/$part"
    if [ ! -e "$cur" ] && [ ! -L "$cur" ]; then printf 'missing\t%s\t%s\n' "$cur" "$p"; continue 2; fi
    if [ -d "$cur" ] && [ ! -x "$cur" ]; then printf 'no-entry\t%s\t%s\n' "$cur" "$p"; continue 2; fi
  done
  [ -r "$p" ] || printf 'no-read\t%s\t%s\n' "$p" "$p"
done
"""


@dataclass(frozen=True)
class Unreachable:
    """A path the kernel needs and cannot reach inside the sandbox."""
    needed: str  # what the kernel needs (the interpreter, a folder of its import path, ...)
    where: str  # the first folder on the way that is missing or closed
    problem: str  # 'missing', 'no-entry' or 'no-read'


def diagnose(config: SandboxConfig, paths: list[str], *, writable: list[str] = (),
             scratch: str | None = None) -> tuple[list[Unreachable], str]:
    """Check, inside the sandbox and as the kernel's user, that every path in `paths` can be
    reached: returns what cannot, and whatever the sandbox itself printed on stderr."""
    cmd = wrap_command([_bash(), "-c", _DIAGNOSE, "sandbox-diagnose", *paths], config,
                       writable=list(writable), scratch=scratch)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=sandbox_env(config))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], f"the sandbox could not run: {exc}"
    found = []
    for line in proc.stdout.splitlines():
        problem, where, needed = (line.split("\t") + ["", ""])[:3]
        found.append(Unreachable(needed=needed, where=where, problem=problem))
    return found, proc.stderr.strip()


def kernel_user() -> str:
    """Who the sandboxed kernel runs as, in words."""
    if is_root():
        return f"nobody (uid {NOBODY})"
    return f"uid {os.getuid()} (the grader's own, in a user namespace)"


def explain(item: Unreachable) -> str:
    """The cause of one unreachable path and its fix, in words an instructor can act on."""
    try:
        st = os.stat(item.where)
        import pwd
        try:
            owner = pwd.getpwuid(st.st_uid).pw_name
        except KeyError:
            owner = str(st.st_uid)
        mode = f"mode {st.st_mode & 0o7777:04o}, owner {owner}"
    except OSError:
        mode = "it does not exist outside the sandbox either"
    if item.problem == "missing":
        return (f"{item.needed} is needed by the kernel but {item.where} is not in the sandbox's view "
                f"({mode}). Fix: show it to the kernel, read-only: c.ResilientExecute.expose = "
                f"['{item.where}'] in nbgrader_config.py, or grade-class --sandbox-expose {item.where}")
    verb = "enter" if item.problem == "no-entry" else "read"
    return (f"the kernel runs as {kernel_user()} and cannot {verb} {item.where} ({mode}), on the way to "
            f"{item.needed}. Fix: let other users {verb} it (chmod o+{'x' if verb == 'enter' else 'r'} "
            f"{item.where}, and its parent folders), or keep Python and the course's .venv in a folder "
            "others can read (e.g. /opt or /srv), or grade as an unprivileged user who owns them")


@functools.cache
def bwrap_version() -> str:
    recipe, exe = _isolation()
    if not recipe:
        return "bwrap (not working)"
    try:
        return subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "bwrap"


def describe(config: SandboxConfig) -> str:
    """What holds for a kernel on this machine with this configuration, in one line."""
    limits = (f"RLIMIT_DATA {config.memory_mb} MiB, RLIMIT_FSIZE {config.file_mb} MiB, "
              f"RLIMIT_CPU {config.cpu_seconds} s, RLIMIT_NOFILE {config.open_files} per process")
    if config.mode == "off":
        return (f"sandbox OFF: the kernel runs as the grader (uid {os.geteuid()}) and can read and "
                f"write everything the grader can; {limits}; no process, tmpfs or shared-memory caps")
    recipe, _ = _isolation()
    if recipe == "userns":
        who = (f"uid {NOBODY} (nobody) in its own user namespace" if is_root()
               else f"uid {os.getuid()} (the grader's, not root) in its own user namespace")
        who += ", no capabilities, no further user namespaces"
    else:
        who = f"uid {NOBODY} (nobody), no capabilities (setpriv; user namespaces refused here)"
    kind = cgroup_kind()
    nproc = _nproc(recipe, config, Cgroup("", [], []) if kind else None)
    if kind:
        memory = (f"memory {config.memory_mb} MiB for the whole kernel, tmpfs files and shared "
                  f"memory included (cgroup {kind}); processes+threads {config.max_processes} "
                  f"(cgroup {kind} pids.max)")
    else:
        memory = ("no writable cgroup: memory is capped per process (RLIMIT_DATA), tmpfs by their "
                  "sizes, memfd and System V shared memory NOT capped")
    if nproc:
        scope = "per sandbox" if recipe == "userns" else "shared by every nobody process"
        memory += f"; RLIMIT_NPROC {nproc} ({scope})"
    runtime = "1 MiB tmpfs" if can_mount_tmpfs() else "plain folder (its files are not capped in number)"
    return (f"sandbox {bwrap_version()}: kernel as {who}; file system: only the system folders, its "
            f"Python and its working folder, read-only (the course, home folders, /var, /srv, /opt not there); "
            f"network none; {memory}; {limits}; /tmp, /dev/shm and the working folder are "
            f"tmpfs capped at {config.tmpfs_mb} MiB each; connection folder: {runtime}")


# -- the kernel manager -------------------------------------------------------------------

MS_NOSUID, MS_NODEV, MNT_DETACH = 2, 4, 2
_libc = ctypes.CDLL(None, use_errno=True)


def _mount_tmpfs(path: str, options: str) -> bool:
    return _libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options.encode()) == 0


def _umount(path: str) -> None:
    _libc.umount2(path.encode(), MNT_DETACH)


@functools.cache
def can_mount_tmpfs() -> bool:
    """Whether the grader can lay a tmpfs over the kernel's connection folder (root, with
    CAP_SYS_ADMIN: not in most containers)."""
    if not is_root():
        return False
    folder = tempfile.mkdtemp(prefix="course-sandbox-probe-")
    try:
        if not _mount_tmpfs(folder, RUNTIME_TMPFS):
            return False
        _umount(folder)
        return True
    finally:
        os.rmdir(folder)


_described: set[str] = set()


class SandboxedKernelManager(AsyncKernelManager):
    """A kernel manager whose kernel runs inside the sandbox, over Unix sockets.

    Subclass it with `kernel_manager_for(...)`, which fixes the configuration and the
    scratch folder (the kernel's working folder).
    """

    sandbox_config: SandboxConfig = SandboxConfig(mode="off")
    scratch: str = ""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._runtime = tempfile.mkdtemp(prefix="kernel-")
        self._mounted = False
        self._cgroup: Cgroup | None = None
        if self.sandbox_config.mode != "off" and is_root():
            # The kernel (nobody) writes its sockets here: a small tmpfs, so it cannot fill
            # the grader's disk through it; a plain folder where mounting is not allowed.
            self._mounted = _mount_tmpfs(self._runtime, f"{RUNTIME_TMPFS},uid={NOBODY},gid={NOBODY}")
            if not self._mounted:
                os.chown(self._runtime, NOBODY, NOBODY)
        # Released when the manager is cleaned up, dropped, or at exit, whichever is first.
        self._release = weakref.finalize(self, _release_runtime, self._runtime, self._mounted)
        self.transport = "ipc"
        self.connection_file = os.path.join(self._runtime, "kernel.json")
        self.ip = os.path.join(self._runtime, "ipc")

    def format_kernel_cmd(self, extra_arguments=None):
        cmd = super().format_kernel_cmd(extra_arguments)
        config = self.sandbox_config
        if config.mode == "off":
            return wrap_command(cmd, config, writable=[])
        key = describe(config)
        if key not in _described:
            _described.add(key)
            self.log.info("%s", key)
        if is_root():  # the kernel runs as nobody: its connection file and input readable
            if os.path.exists(self.connection_file):
                os.chown(self.connection_file, NOBODY, NOBODY)
            if self.scratch:
                _readable_by_all(self.scratch)
        self._drop_cgroup()
        kind = cgroup_kind()
        if kind:
            try:
                self._cgroup = Cgroup.create(kind, config.memory_mb * MIB, config.max_processes)
                # a manager dropped without cleanup: its group is reaped at the next kernel
                weakref.finalize(self, setattr, self._cgroup, "abandoned", True)
            except OSError as exc:
                self.log.warning("no cgroup for this kernel (%s): rlimits only", exc)
        return wrap_command(cmd, config, writable=[self._runtime], scratch=self.scratch or None,
                            cgroup=self._cgroup)

    def _drop_cgroup(self) -> None:
        if self._cgroup is not None:
            self._cgroup.remove()
            self._cgroup = None

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        self._drop_cgroup()
        if not restart:
            self._release()


def _release_runtime(path: str, mounted: bool) -> None:
    if mounted:
        _umount(path)
    shutil.rmtree(path, ignore_errors=True)


def _readable_by_all(folder: str) -> None:
    for root, dirs, files in os.walk(folder):
        os.chmod(root, os.stat(root).st_mode | 0o555)
        for name in files:
            path = os.path.join(root, name)
            os.chmod(path, os.stat(path).st_mode | 0o444)


def kernel_manager_for(config: SandboxConfig, scratch: str | Path) -> type[SandboxedKernelManager]:
    """A kernel manager class for one notebook's run in `scratch` (its files are copied into
    the kernel's own size-capped working folder at the same path)."""
    return type("SandboxedKernelManagerForRun", (SandboxedKernelManager,),
                {"sandbox_config": config, "scratch": str(scratch)})
