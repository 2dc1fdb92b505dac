"""The warm kernel server (a zygote): a Python process that has imported the kernel and
PyTorch once, and forks one fresh kernel per notebook run. It never runs student code.

This file runs on its own (`python zygote.py MODULES`, its command line blanked at once),
inside the same sandbox as a cold kernel would (coursetools.grading.warm starts it): the
course's tools are not importable there. It talks to the grader over its stdin and stdout, one JSON object per line:

    {"op": "fork", "ctl": SOCKET, "connection_file": PATH, "cwd": PATH, "env": {...},
     "isolate": null | {"tmpfs_bytes": N, "runtime": FOLDER, "spool": FOLDER, "input": PATH,
                        "scratch_root": FOLDER}}
        -> {"ok": true, "pid": PID}   (the pid in the zygote's own pid namespace)
    {"op": "reap", "pid": PID} -> {"ok": true, "status": N | null}
    {"op": "ping"} -> {"ok": true, "threads": N}

A forked child first connects to the grader's socket `ctl`: the grader reads the child's
host pid from the socket's peer credentials, moves it into the kernel's own cgroup, and
answers "go" with the file descriptor the kernel's stderr goes to. Then the child isolates
itself (`isolate`, in the sandbox): new mount, network, IPC and UTS namespaces; fresh tmpfs
on /tmp, /dev/shm, the spool (where the working folder is made and the submission's files
copied in) and the connection folder (where only its own sub-folder is bound back); a
loopback interface; every capability dropped and no new privileges. Then it becomes the
kernel: a new session, the run's environment and working folder, and ipykernel's app.

Fork safety: the zygote refuses to fork while it has more than one thread (a fork copies
only the calling thread: a lock held by another would stay held in the child forever), and
it imports PyTorch without running anything that starts its intra-op pool.
"""

import ctypes
import errno
import json
import os
import re
import signal
import socket
import struct
import sys

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_CAP_AMBIENT = 4, 38, 24, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWIPC, CLONE_NEWUTS = 0x20000, 0x40000000, 0x08000000, 0x04000000
MS_NOSUID, MS_NODEV, MS_RDONLY, MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 2, 4, 1, 32, 4096, 8192, 16384, 1 << 18
INPUT = "/tmp/.course-input"


def _check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source, target, fstype, flags, data=None):
    _check(_libc.mount(source.encode() if source else None, target.encode(),
                       fstype.encode() if fstype else None, flags,
                       data.encode() if data else None), f"mount {target}")


def threads():
    return len(os.listdir("/proc/self/task"))


def _loopback_up():
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        import fcntl
        flags = struct.unpack("16sH", fcntl.ioctl(sock, 0x8913, struct.pack("16sH", b"lo", 0)))[1]
        fcntl.ioctl(sock, 0x8914, struct.pack("16sH", b"lo", flags | 0x1 | 0x40))  # IFF_UP|IFF_RUNNING
    finally:
        sock.close()


def _drop_capabilities():
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == errno.EINVAL:
            break
    header = struct.pack("Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = bytes(24)  # effective, permitted, inheritable: all empty (two 32-bit words each)
    _check(_libc.syscall(126 if os.uname().machine == "x86_64" else 91,
                         ctypes.c_char_p(header), ctypes.c_char_p(data)), "capset")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    status = open("/proc/self/status").read()
    for line in status.splitlines():
        if line.startswith(("CapEff:", "CapPrm:", "CapBnd:", "CapAmb:")) and int(line.split()[1], 16):
            raise OSError(errno.EPERM, f"capabilities left after dropping them: {line}")


def _copy_tree(src, dst):
    for entry in os.scandir(src):
        target = os.path.join(dst, entry.name)
        if entry.is_dir(follow_symlinks=False):
            os.mkdir(target)
            _copy_tree(entry.path, target)
        elif entry.is_file(follow_symlinks=False):
            with open(entry.path, "rb") as a, open(target, "wb") as b:
                while chunk := a.read(1 << 20):
                    b.write(chunk)


def _under(path, folder):
    return path != folder and path.startswith(folder.rstrip("/") + "/")


def _mounts():
    """(mount id, parent id, mount point, read-only) of this mount namespace."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            out.append((fields[0], fields[1], point, "ro" in fields[5].split(",")))
    return out


def _isolate(spec, cwd, connection_file):
    """In the forked child, before any student code: a view of its own (see the module)."""
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    size = spec["tmpfs_bytes"]
    covered = []  # folders that get a new, empty tmpfs of this kernel's own
    for path in ("/tmp", spec["scratch_root"], spec["runtime"], spec["spool"]):
        if not any(path == c or _under(path, c) for c in covered):
            covered.append(path)
    # What the sandbox shows inside those folders (a venv or Python under /tmp, a folder the
    # grader exposed) must stay: those mounts are moved aside, and back onto the new tmpfs.
    # The zygote's own folders (its runtime and spool) are not: the kernel never sees them.
    hidden = (spec["runtime"], spec["spool"])
    candidates = {(point, ro) for _, _, point, ro in _mounts()
                  if any(_under(point, c) for c in covered)
                  and not any(point == h or _under(point, h) for h in hidden)}
    # the outermost ones (a recursive bind carries what lies inside them)
    keep = sorted((point, ro) for point, ro in candidates
                  if not any(_under(point, other) for other, _ in candidates))
    # /dev/shm first: a fresh tmpfs, where the kept mounts, this kernel's connection folder and
    # its input wait while the folders that hold them are covered (a bind must come from this
    # mount namespace: not from a file descriptor opened before the unshare).
    _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=1777")
    staged = []
    for i, (point, ro) in enumerate(keep):
        stage = f"/dev/shm/.keep{i}"
        os.mkdir(stage)
        _mount(point, stage, None, MS_BIND | MS_REC)
        staged.append((stage, point, ro))
    stage = {"runtime": "/dev/shm/.runtime", "input": "/dev/shm/.input"}
    mine = os.path.dirname(connection_file)
    for name, source in (("runtime", mine), ("input", spec["input"])):
        os.mkdir(stage[name])
        _mount(source, stage[name], None, MS_BIND)
    for path in covered:
        _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=1777")
    for source, point, ro in staged:
        os.makedirs(point, mode=0o755, exist_ok=True)
        _mount(source, point, None, MS_MOVE)
        if ro:
            _mount(None, point, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
        os.rmdir(source)
    os.makedirs(mine, exist_ok=True)
    _mount(stage["runtime"], mine, None, MS_MOVE)
    # The working folder, as a cold kernel has it: a capped tmpfs at the same path, with the
    # submission's files copied in from a read-only bind at INPUT.
    os.makedirs(cwd, exist_ok=True)
    _mount("tmpfs", cwd, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=1777")
    os.mkdir(INPUT)
    _mount(stage["input"], INPUT, None, MS_MOVE)
    _mount(None, INPUT, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    for path in stage.values():
        os.rmdir(path)
    _copy_tree(INPUT, cwd)
    _loopback_up()
    _drop_capabilities()


def _child(request):
    """The forked child: wait for the grader's go, isolate, become the kernel. Never returns."""
    code = 0
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.setsid()
        ctl = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        ctl.connect(request["ctl"])
        ctl.sendall(b"hello\n")
        message, fds, _, _ = socket.recv_fds(ctl, 16, 1)
        if message != b"go\n" or len(fds) != 1:
            os._exit(3)
        os.dup2(fds[0], 2)
        os.close(fds[0])
        ctl.close()
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.close(null)
        os.closerange(3, 65536)
        spec = request.get("isolate")
        if spec:
            _isolate(spec, request["cwd"], request["connection_file"])
        _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        import tempfile
        tempfile.tempdir = None  # cached by an import in the zygote: read again from TMPDIR
        sys.argv = ["ipykernel_launcher", "-f", request["connection_file"]]
        from ipykernel.kernelapp import IPKernelApp
        app = IPKernelApp.instance()
        app.initialize(sys.argv[1:])
        app.start()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0
    except BaseException:  # noqa: BLE001 - say why on the kernel's stderr, then go
        import traceback
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _sweep():
    """In the sandbox's own pid namespace: kill every process that is neither this zygote nor
    one of its ancestors (the sandbox's own processes). What an earlier kernel started and
    left behind goes, also where the grader has no cgroup to kill it with."""
    keep, pid = {os.getpid()}, os.getpid()
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        keep.add(pid)
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in keep:
            try:
                os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass


def _warm(modules):
    import importlib
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - a missing module only makes kernels colder
            print(f"zygote: could not import {name}: {exc}", file=sys.stderr)
    torch = sys.modules.get("torch")
    if torch is not None:
        # The meta device's first use imports hundreds of modules; it starts no threads.
        torch.empty(1, device="meta").add_(1)
    if threads() > 1:
        # NumPy's OpenBLAS starts its worker threads when it is loaded, and stops them in a
        # pthread_atfork handler before any fork: one throwaway fork leaves this process
        # with its one thread. Any other thread stays, and the grader refuses to use us.
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)


def _blank_command_line(title=b"course-zygote"):
    """Overwrite this process's command line (what /proc/PID/cmdline shows, of the zygote
    and of every kernel forked from it) with `title`: it named the interpreter and the
    program's folder, host paths."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48 and 49)
    except (OSError, ValueError, IndexError):
        return
    if start <= 0 or end <= start:
        return
    ctypes.memset(start, 0, end - start)
    ctypes.memmove(start, title, min(len(title), end - start - 1))


def main():
    _blank_command_line()
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # no ptrace, no /proc/PID/mem for anyone
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    modules = json.loads(sys.argv[1]) if len(sys.argv) > 1 else []
    _warm(modules)
    sys.stdout.write(json.dumps({"ok": True, "ready": True, "threads": threads(), "pid": os.getpid()}) + "\n")
    sys.stdout.flush()
    live = set()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            op = request.get("op")
            if op == "fork":
                for pid in list(live):
                    if os.waitpid(pid, os.WNOHANG)[0] == pid:
                        live.discard(pid)
                if request.get("isolate") and not live:
                    _sweep()
                if live:
                    answer = {"ok": False, "error": f"a kernel is still alive (pid {sorted(live)}): one at a time"}
                elif threads() != 1:
                    answer = {"ok": False, "error": f"the zygote has {threads()} threads: forking is unsafe"}
                else:
                    pid = os.fork()
                    if pid == 0:
                        _child(request)
                    live.add(pid)
                    answer = {"ok": True, "pid": pid}
            elif op == "reap":
                pid = int(request["pid"])
                status = None
                try:
                    done, raw = os.waitpid(pid, 0)
                    status = os.waitstatus_to_exitcode(raw)
                except ChildProcessError:
                    pass
                live.discard(pid)
                answer = {"ok": True, "status": status}
            elif op == "ping":
                answer = {"ok": True, "threads": threads()}
            else:
                answer = {"ok": False, "error": f"unknown op {op!r}"}
        except Exception as exc:  # noqa: BLE001 - the grader falls back to a cold kernel
            answer = {"ok": False, "error": repr(exc)}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
