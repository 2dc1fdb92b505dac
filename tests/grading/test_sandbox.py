"""The grading sandbox (coursetools/grading/sandbox.py), attacked directly, as root where it matters.

Each test runs a small Python program in the sandbox exactly as grading starts a kernel
(`wrap_command` with the configuration grading uses, plus the kernel's cgroup where this
machine has one) and checks what the program could do. Every loop is bounded in count;
no test depends on the machine's speed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from coursetools import layout
from coursetools.grading import sandbox

OK, WHY = sandbox.bwrap_works()
ROOT = os.geteuid() == 0
needs_sandbox = pytest.mark.skipif(not OK, reason=f"no working bubblewrap: {WHY}")
as_root = pytest.mark.skipif(not ROOT, reason="checks what the sandbox does when the grader is root")


@pytest.fixture
def course(tmp_path):
    """A course folder with hidden tests and a gradebook, as the grader has it."""
    root = tmp_path / "course"
    (root / "solutions" / "01").mkdir(parents=True)
    (root / "solutions" / "01" / "01.ipynb").write_text('{"hidden": "assert answer == 42"}')
    db = sqlite3.connect(root / "gradebook.db")
    db.execute("CREATE TABLE grade (student TEXT, score REAL)")
    db.executemany("INSERT INTO grade VALUES (?, ?)", [("alice", 18), ("mallory", 3)])
    db.commit()
    db.close()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "shipped.txt").write_text("data the assignment ships")
    return root, scratch


def _digest(folder):
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in sorted(os.walk(folder)):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            h.update(path.encode() + b"\0" + open(path, "rb").read())
    return h.hexdigest()


def run_in_sandbox(code: str, course, *, timeout=300, **limits):
    """Run `code` as grading runs a kernel; returns (exit status, the dict it printed last)."""
    root, scratch = course
    config = sandbox.SandboxConfig(mode="bwrap", hide=(str(root),), **limits)
    group = None
    if sandbox.cgroup_kind():
        group = sandbox.Cgroup.create(sandbox.cgroup_kind(), config.memory_mb * sandbox.MIB,
                                      config.max_processes)
    if ROOT:
        sandbox._readable_by_all(str(scratch))
    program = scratch / "attack.py"
    program.write_text(PRELUDE + textwrap.dedent(code))
    cmd = sandbox.wrap_command([sys.executable, "attack.py"], config, writable=[],
                               scratch=str(scratch), cgroup=group)
    try:
        proc = subprocess.run(cmd, cwd=scratch, capture_output=True, text=True, timeout=timeout,
                              env=sandbox.sandbox_env(config))
    finally:
        if group is not None:
            assert group.remove(), "the kernel's cgroup could not be removed"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc.returncode, (json.loads(lines[-1]) if lines else None), proc


PRELUDE = """
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)

def call(name, *args):
    if getattr(libc, name)(*args) == 0:
        return "ok"
    return errno.errorcode[ctypes.get_errno()]

def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc))
    except Exception as exc:
        return type(exc).__name__
"""


@pytest.fixture(params=["userns", "setpriv"])
def recipe(request, monkeypatch):
    """Both ways the sandbox drops privileges: the usual one (a user namespace) and the
    fallback for a root grader where user namespaces are refused."""
    if request.param == "setpriv" and not ROOT:
        pytest.skip("the setpriv fallback is for a root grader")
    exe = sandbox._isolation()[1]
    if sandbox._probe(exe, request.param).returncode != 0:
        pytest.skip(f"recipe {request.param} does not work here")
    monkeypatch.setattr(sandbox, "_isolation", lambda: (request.param, exe))
    return request.param


@needs_sandbox
def test_remount_and_umount_escape_fails_with_eperm(course, recipe):
    root, _ = course
    before = _digest(root)
    code = f"""
    MS_RDONLY, MS_REMOUNT, MS_BIND = 1, 32, 4096
    CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x20000
    status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines())
    out = {{
        "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
        "cap_eff": status["CapEff"].strip(), "cap_bnd": status["CapBnd"].strip(),
        "remount / rw": call("mount", None, b"/", None, MS_REMOUNT, None),
        "remount / rw (bind)": call("mount", None, b"/", None, MS_REMOUNT | MS_BIND, None),
        "umount a bind": call("umount2", b"/usr", 2),
        "umount /tmp": call("umount2", b"/tmp", 2),
        "new mount namespace": call("unshare", CLONE_NEWNS),
        "write course folder": attempt(lambda: open({str(root / "x")!r}, "w")),
        "new user namespace": call("unshare", CLONE_NEWUSER),
    }}
    if out["new user namespace"] == "ok":  # capabilities there: mounts stay locked anyway
        out["mount namespace in it"] = call("unshare", CLONE_NEWNS)
        out["umount there"] = call("umount2", b"/usr", 2)
    out["course folder"] = attempt(lambda: os.listdir({str(root)!r}))
    print(json.dumps(out))
    """
    rc, out, proc = run_in_sandbox(code, course)
    assert rc == 0 and out, proc.stderr
    assert out["remount / rw"] == "EPERM" and out["remount / rw (bind)"] == "EPERM", out
    assert out["umount a bind"] == "EPERM" and out["umount /tmp"] == "EPERM", out
    assert out["new mount namespace"] == "EPERM", out
    if recipe == "userns":  # --disable-userns
        assert out["new user namespace"] in ("EPERM", "ENOSPC", "EUSERS"), out
    elif out["new user namespace"] == "ok":  # setpriv where user namespaces work after all
        assert out["umount there"] in ("EINVAL", "EPERM"), out  # locked: still hidden
    assert int(out["cap_eff"], 16) == 0 and int(out["cap_bnd"], 16) == 0, out
    assert out["course folder"] == "ENOENT", out  # not there at all (default deny)
    assert out["write course folder"] in ("ENOENT", "EROFS", "EACCES"), out
    if ROOT:
        assert (out["uid"], out["gid"], out["groups"]) == (65534, 65534, []), out
    assert _digest(root) == before, "the course folder changed"


@needs_sandbox
@as_root
def test_as_root_the_kernel_is_nobody_outside_too(course, tmp_path):
    """Seen from outside the sandbox, the kernel's process belongs to nobody: a file only
    root may read, in a folder the sandbox shows (`expose`), stays unreadable."""
    shown = tmp_path / "shown"
    shown.mkdir(mode=0o755)
    os.chmod(tmp_path, 0o755)
    path = shown / "secret"
    path.write_text("root only")
    os.chmod(path, 0o600)
    code = f"""
    status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines())
    print(json.dumps({{"uid line": status["Uid"].split(), "read": attempt(lambda: open({str(path)!r}).read()),
                       "listed": sorted(os.listdir({str(shown)!r})),
                       "shadow": attempt(lambda: open("/etc/shadow").read())}}))
    """
    rc, out, proc = run_in_sandbox(code, course, expose=(str(shown),))
    assert rc == 0 and out, proc.stderr
    assert out["listed"] == ["secret"], out
    assert out["read"] == "EACCES", out
    assert out["uid line"] == ["65534"] * 4, out
    assert out["shadow"] in ("ENOENT", "EACCES"), out  # /etc/shadow is not in the view at all


@needs_sandbox
def test_gradebook_and_solutions_out_of_reach(course):
    root, _ = course
    before = _digest(root)
    code = f"""
    import sqlite3, glob
    def sql():
        db = sqlite3.connect({str(root / "gradebook.db")!r})
        db.execute("UPDATE grade SET score = 0 WHERE student = 'alice'")
        db.commit()
    out = {{
        "solutions": glob.glob({str(root / "solutions" / "**" / "*.ipynb")!r}, recursive=True),
        "read solution": attempt(lambda: open({str(root / "solutions" / "01" / "01.ipynb")!r}).read()),
        "sql": attempt(sql),
        "stat gradebook": attempt(lambda: os.stat({str(root / "gradebook.db")!r})),
    }}
    print(json.dumps(out))
    """
    rc, out, proc = run_in_sandbox(code, course)
    assert rc == 0 and out, proc.stderr
    assert out["solutions"] == [] and out["read solution"] == "ENOENT", out
    assert out["sql"] == "OperationalError" and out["stat gradebook"] == "ENOENT", out
    assert _digest(root) == before
    db = sqlite3.connect(root / "gradebook.db")
    assert db.execute("SELECT student, score FROM grade ORDER BY student").fetchall() == [
        ("alice", 18.0), ("mallory", 3.0)]


@needs_sandbox
def test_process_cap_holds(course):
    """A fork bomb (bounded: at most 4x the cap) stops at the cap; the children wait on a
    pipe, so none exits early and the count does not depend on speed."""
    cap = 64
    code = f"""
    import time
    r, w = os.pipe()
    children, error = [], None
    for _ in range({4 * cap}):
        try:
            pid = os.fork()
        except OSError as exc:
            error = errno.errorcode[exc.errno]
            break
        if pid == 0:
            os.close(w)
            os.read(r, 1)
            os._exit(0)
        children.append(pid)
    os.close(w)
    for pid in children:
        os.waitpid(pid, 0)
    print(json.dumps({{"forked": len(children), "error": error}}))
    """
    rc, out, proc = run_in_sandbox(code, course, max_processes=cap)
    assert rc == 0 and out, proc.stderr
    assert out["error"] == "EAGAIN", out
    assert 0 < out["forked"] < cap, out


@needs_sandbox
def test_tmpfs_shm_and_file_size_caps(course):
    """Every writable tmpfs has a size cap, and no file may pass the file-size cap."""
    _, scratch = course
    code = """
    import mmap
    MIB = 2**20
    def fill(path, mib):
        with open(path, "wb") as f:
            for _ in range(mib):
                f.write(b"x" * MIB)
                f.flush()
    def posix_shm():
        fd = os.open("/dev/shm/course-shm", os.O_CREAT | os.O_RDWR)
        os.ftruncate(fd, 8 * MIB)  # a sparse file: within the file cap, not yet using space
        m = mmap.mmap(fd, 8 * MIB)
        for i in range(0, 8 * MIB, 4096):
            m[i] = 1  # /dev/shm is full (a: 6 MiB, b: the 4 MiB left): SIGBUS
    out = {}
    for path in ["/tmp/a", "/tmp/b", "/dev/shm/a", "/dev/shm/b", "./a", "./b"]:
        out[path] = attempt(lambda: fill(path, 6))  # 6 MiB each: the file cap is 8 MiB
    pid = os.fork()
    if pid == 0:
        try:
            posix_shm()
        except BaseException as exc:
            print("shm child:", repr(exc), flush=True)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    out["shm map"] = "SIGBUS" if os.WIFSIGNALED(status) and os.WTERMSIG(status) == 7 else status
    for folder in ("/tmp", "/dev/shm", "."):
        for name in ("a", "b"):
            try:
                os.unlink(os.path.join(folder, name))
            except OSError:
                pass
    out["big file"] = attempt(lambda: fill("./big", 9))
    os.unlink("./big")
    out["/dev"] = attempt(lambda: open("/dev/course-file", "w"))
    print(json.dumps(out))
    """
    rc, out, proc = run_in_sandbox(code, course, tmpfs_mb=10, file_mb=8)
    assert rc == 0 and out, proc.stderr
    for folder in ("/tmp", "/dev/shm", "."):
        assert out[f"{folder}/a"] == "ok" and out[f"{folder}/b"] == "ENOSPC", (folder, out)
    assert out["big file"] == "EFBIG", out
    assert out["shm map"] == "SIGBUS", out
    assert out["/dev"] in ("EROFS", "EACCES"), out
    assert sorted(os.listdir(scratch)) == ["attack.py", "shipped.txt"], "the kernel wrote to the grader's folder"


@needs_sandbox
@pytest.mark.skipif(not sandbox.cgroup_kind(), reason="no writable cgroup with memory and pids here")
def test_memory_cap_counts_shared_memory(course):
    """memfd (shared memory, which RLIMIT_DATA does not count) past the cgroup memory cap:
    the writer is stopped (killed by the cgroup's OOM killer, or an error) long before."""
    code = """
    import mmap
    MIB = 2**20
    fd = os.memfd_create("hog")
    written = 0
    print(json.dumps({"started": True}), flush=True)
    try:
        for _ in range(512):  # 512 MiB, the cap is 128 MiB
            os.write(fd, b"x" * MIB)
            written += 1
    except OSError as exc:
        print(json.dumps({"written": written, "error": errno.errorcode[exc.errno]}), flush=True)
        raise SystemExit(0)
    print(json.dumps({"written": written, "error": None}), flush=True)
    """
    rc, out, proc = run_in_sandbox(code, course, memory_mb=128, tmpfs_mb=1024)
    assert out is not None, proc.stderr
    if out == {"started": True}:
        assert rc in (-9, 128 + 9), f"expected the cgroup's OOM killer (SIGKILL), got exit status {rc}"
    else:
        assert out["error"] is not None and out["written"] < 128, out


@needs_sandbox
def test_processes_of_two_sandboxes_do_not_share_the_cap(course):
    """RLIMIT_NPROC counts per user namespace: two kernels of the same uid (graded in
    parallel) each get the whole cap. Run one after the other while the first still holds
    its children: the second must reach as many as the first."""
    cap = 48
    folder = tempfile.mkdtemp(prefix="course-sandbox-hold-")
    hold = os.path.join(folder, "hold")
    os.mkfifo(hold)
    holder = f"""
    children = []
    r, w = os.pipe()
    for _ in range({cap - 16}):
        pid = os.fork()
        if pid == 0:
            os.close(w); os.read(r, 1); os._exit(0)
        children.append(pid)
    print(json.dumps({{"holding": len(children)}}), flush=True)
    open({hold!r}).read()  # until the test lets go
    os.close(w)
    for pid in children:
        os.waitpid(pid, 0)
    """
    root, scratch = course
    config = sandbox.SandboxConfig(mode="bwrap", hide=(str(root),), max_processes=cap)
    (scratch / "hold.py").write_text(PRELUDE + textwrap.dedent(holder))
    if ROOT:
        sandbox._readable_by_all(str(scratch))
    cmd = sandbox.wrap_command([sys.executable, "hold.py"], config, writable=[folder],
                               scratch=str(scratch))
    if ROOT:
        os.chmod(hold, 0o666)
        os.chmod(folder, 0o755)
    first = subprocess.Popen(cmd, cwd=scratch, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=sandbox.sandbox_env(config))
    try:
        line = first.stdout.readline()
        assert line, f"the first sandbox did not start: {first.stderr.read()[-2000:] if first.wait(60) is not None else ''}"
        assert json.loads(line) == {"holding": cap - 16}
        rc, out, proc = run_in_sandbox(f"""
            import os, json
            r, w = os.pipe()
            n = 0
            for _ in range({cap - 16}):
                pid = os.fork()
                if pid == 0:
                    os.close(w); os.read(r, 1); os._exit(0)
                n += 1
            os.close(w)
            print(json.dumps({{"forked": n}}))
            """, course, max_processes=cap)
    finally:
        # Let the holder go. Opening a FIFO for writing blocks until a reader opens it, and
        # a holder that never started never will: O_NONBLOCK fails at once (ENXIO) instead.
        try:
            fd = os.open(hold, os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, b"go")
            os.close(fd)
        except OSError:
            pass
        try:
            first.wait(timeout=120)
        finally:
            if first.poll() is None:
                first.kill()
                first.wait(timeout=30)
            shutil.rmtree(folder)
    assert rc == 0 and out == {"forked": cap - 16}, (out, proc.stderr)


def test_unsandboxed_root_is_refused_unless_asked_for(monkeypatch):
    monkeypatch.delenv(sandbox.ALLOW_ROOT_ENV, raising=False)
    if ROOT:
        with pytest.raises(sandbox.SandboxUnavailable, match="refusing to grade as root"):
            sandbox.resolve_mode("off")
        monkeypatch.setenv(sandbox.ALLOW_ROOT_ENV, "1")
    assert sandbox.resolve_mode("off") == "off"


@as_root
def test_grade_class_refuses_unsandboxed_root(tmp_path):
    """`grade-class --sandbox off` as root stops before grading anything; with
    --unsandboxed-as-root it goes on (and here stops at the unknown assignment)."""
    course = tmp_path / "course"
    (course / "solutions").mkdir(parents=True)
    (course / "nbgrader_config.py").write_text((layout.ROOT / "nbgrader_config.py").read_text())
    env = {k: v for k, v in layout.env_with_course_tools().items() if k != sandbox.ALLOW_ROOT_ENV}
    base = [sys.executable, "-m", "coursetools.instructor.classroom", "no_such_assignment", "--course", str(course),
            "--sandbox", "off"]
    refused = subprocess.run(base, cwd=layout.ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert refused.returncode == 2 and "refusing to grade as root" in refused.stderr, refused.stderr
    allowed = subprocess.run(base + ["--unsandboxed-as-root"], cwd=layout.ROOT, capture_output=True,
                             text=True, timeout=300, env=env)
    assert allowed.returncode == 2 and "no assignment no_such_assignment" in allowed.stderr, allowed.stderr
    assert "sandbox OFF" in allowed.stderr, "the log says the kernel runs unsandboxed"


@needs_sandbox
def test_log_line_says_which_limits_hold():
    line = sandbox.describe(sandbox.SandboxConfig(mode="bwrap"))
    assert "RLIMIT_FSIZE" in line and "tmpfs capped" in line
    if sandbox.cgroup_kind():
        assert f"cgroup {sandbox.cgroup_kind()}" in line and "pids.max" in line
    else:
        assert "no writable cgroup" in line
    if ROOT:
        assert "uid 65534" in line and "no capabilities" in line


@needs_sandbox
def test_the_kernel_sees_only_what_it_needs(course, tmp_path):
    """Default deny: the kernel's file system is built from nothing. Another clone of the
    course lying world-readable on the machine (a TA's checkout, an exchange folder) is not
    there at all; neither are /home, /root's other files, /var, /srv, /opt or /etc's secrets.
    What is there: the system folders, the interpreter and its import path, /tmp, /dev, /proc."""
    other = Path(tempfile.mkdtemp(prefix="course-other-clone-", dir="/var/tmp"))
    try:
        os.chmod(other, 0o755)
        (other / "solutions").mkdir(mode=0o755)
        (other / "solutions" / "01.ipynb").write_text("assert answer == 42  # a hidden test")
        os.chmod(other / "solutions" / "01.ipynb", 0o644)
        shown = sandbox.python_roots() + sandbox.import_path_extras(sandbox.SandboxConfig(hide=(str(course[0]),)))
        code = f"""
        top = sorted(os.listdir("/"))
        seen = []
        for folder in ("/var", "/srv", "/opt", "/home", "/mnt", "/media", "/run", "/root", "/work"):
            for dirpath, dirnames, filenames in os.walk(folder):
                if any(dirpath == r or dirpath.startswith(r + "/") for r in {shown!r}):
                    dirnames[:] = []
                    continue
                seen += [os.path.join(dirpath, n) for n in filenames]
        out = {{"top": top, "other clone": attempt(lambda: os.listdir({str(other)!r})),
                "etc": sorted(os.listdir("/etc")), "other files": seen[:20], "count": len(seen)}}
        print(json.dumps(out))
        """
        rc, out, proc = run_in_sandbox(code, course)
    finally:
        shutil.rmtree(other)
    assert rc == 0 and out, proc.stderr
    assert out["other clone"] == "ENOENT", out
    allowed_top = {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "sys", "tmp", "usr"}
    roots = {p.strip("/").split("/")[0] for p in shown}
    assert set(out["top"]) <= allowed_top | roots, out["top"]
    assert "shadow" not in out["etc"] and "ssh" not in out["etc"], out["etc"]
    assert out["count"] == 0, out["other files"]  # nothing but the interpreter's own files there


@needs_sandbox
def test_the_kernel_sees_nothing_of_its_neighbours(course):
    """From inside, the sandbox shows nothing of the host's other kernels or folders: the
    cgroup tree under /sys is empty (the host's shows every grading kernel's cgroup and its
    memory use), and pid 1's command line holds none of bwrap's options (bwrap reads
    them, the host's paths among them, from a pipe), only the command. Any path another process of the sandbox names
    (the interpreter, the working folder) is one the kernel sees anyway."""
    root, scratch = course
    code = """
    cmdlines, unseen = {}, []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                argv = open(f"/proc/{pid}/cmdline", "rb").read().decode().split("\\0")
            except OSError:
                continue
            cmdlines[pid] = argv
            unseen += [(pid, a) for a in argv if a.startswith("/") and "\\n" not in a
                       and not os.path.exists(a)]
    cgroup = sorted(os.listdir("/sys/fs/cgroup")) if os.path.isdir("/sys/fs/cgroup") else None
    print(json.dumps({"cmdlines": cmdlines, "unseen": unseen, "cgroup": cgroup,
                      "sys": sorted(os.listdir("/sys"))}))
    """
    rc, out, proc = run_in_sandbox(code, course)
    assert rc == 0 and out, proc.stderr
    assert out["cgroup"] in ([], None), out["cgroup"]
    assert "devices" in out["sys"], out["sys"]  # the rest of /sys is still there
    pid1 = [a for a in out["cmdlines"]["1"] if a]
    assert os.path.basename(pid1[0]) == "bwrap" and pid1[1:4] == ["--args", "3", "--"], pid1
    assert not {"--ro-bind", "--bind", "--tmpfs", "--symlink", "--perms"} & set(pid1), pid1
    assert not any(str(root) in " ".join(argv) for argv in out["cmdlines"].values()), out["cmdlines"]
    assert out["unseen"] == [], out["unseen"]
