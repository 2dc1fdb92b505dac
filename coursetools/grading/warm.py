"""Warm kernels: each notebook run gets a freshly forked kernel of its own, from a zygote
that imported Python's kernel, PyTorch and NumPy once (coursetools/grading/zygote_server.py).

Why: starting a kernel and importing PyTorch is most of what a check or a submission costs
(chapter 01: about 2.5 of 5.4 CPU-s per submission); the student's code and the tests take
well under a second. Forking a process that has done it costs a few milliseconds.

What is never shared: the zygote never runs student code, and it hands out one kernel at a
time. Each kernel is a new process (copy-on-write pages of the zygote, nothing else),
  * in a cgroup of its own (the grader moves it there before it runs anything) with the
    same memory and process caps as a cold kernel, killed and removed after it;
  * in the sandbox (bwrap, user namespaces): with mount, network, IPC and UTS namespaces
    of its own, made by the child before any student code: fresh tmpfs on /tmp, /dev/shm
    and its working folder (the submission's files copied in, as for a cold kernel), a
    connection folder holding only its own sockets, its own loopback interface; then every
    capability is dropped, with no new privileges. The zygote is not dumpable (no ptrace,
    no /proc/PID/mem);
  * without the sandbox (a learner's own check): a new session, its own working folder,
    TMPDIR and IPython folder, as a cold kernel has.
So files, threads, patched modules, environment variables and child processes a submission
leaves behind end with its kernel and its namespaces. A kernel can still signal the zygote
(same user, same pid namespace): then the next run starts a new zygote, cold; grades never
depend on it (tests/grading/test_warm.py).

Where warm kernels are not possible (the sandbox's 'setpriv' recipe, no user namespaces; a
zygote that failed to start or fork), kernels start cold, as before, and the log says why.
`COURSE_WARM_KERNELS=0` turns them off (the benchmarks' cold baseline).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from queue import Empty

from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager
from jupyter_core.utils import ensure_async
from jupyter_client.provisioning.local_provisioner import LocalProvisioner

from coursetools.grading import sandbox

ENV = "COURSE_WARM_KERNELS"
# Imported by the zygote before it forks: the kernel, and what every chapter imports.
# torch._dynamo (with SymPy) comes with the first TorchDispatchMode, which the chapters'
# helpers use to count copies: 1.4 s in every kernel that imports it itself.
MODULES = ("ipykernel.kernelapp", "ipykernel.ipkernel", "IPython.core.interactiveshell",
           "ipykernel.debugger", "debugpy", "psutil", "sqlite3", "IPython.core.history",
           "numpy", "torch", "torch.nn", "torch.utils.data", "torch._dynamo", "torch.distributed",
           "torch.testing", "torch.utils.benchmark", "torch.multiprocessing")
START_TIMEOUT_S = 120  # a zygote's imports (PyTorch), on a loaded machine
FORK_TIMEOUT_S = 30
RETRY_AFTER_S = 600  # after a zygote failed to start, kernels start cold this long
MAX_IDLE = 2  # idle zygotes kept per process (one per grading thread is what is reused)
QUICK_FLUSH_S = 0.02
RUNTIME_TMPFS_MB = 4  # the zygote's program and one kernel's sockets at a time
PING_TIMEOUT_S = 3  # an idle zygote answers at once; a stopped one never (then: a new one)
log = logging.getLogger("coursetools.warm")


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0" and sys.platform == "linux" and hasattr(os, "pidfd_open")


def source() -> str:
    return Path(__file__).with_name("zygote_server.py").read_text()


class ZygoteError(RuntimeError):
    pass


# Runs as the zygote's first process: reads the command, NUL-separated and ended by an empty
# argument, from stdin (a pipe no other process holds), and becomes it.
EXEC_FROM_STDIN = r'args=(); while IFS= read -r -d "" a && [ -n "$a" ]; do args+=("$a"); done; exec "${args[@]}"'


class Zygote:
    """One zygote process, sandboxed as a kernel would be (`config`, or none), and the
    folders it shares with the grader: `runtime` (a sub-folder per kernel: its connection
    file and sockets) and `spool` (a sub-folder per kernel: the files of its working folder)."""

    def __init__(self, config: sandbox.SandboxConfig | None, modules=MODULES):
        self.config = config
        self.sandboxed = config is not None and config.mode != "off"
        self.runtime = tempfile.mkdtemp(prefix="course-zygote-")
        self.spool = tempfile.mkdtemp(prefix="course-spool-")
        self.scratch_root = os.path.realpath(tempfile.gettempdir())
        self.cgroup = None
        self.process = None
        self.mounted = False
        self.stderr = tempfile.TemporaryFile()
        self.forks = 0
        try:
            self._start(config, modules)
        except BaseException:
            self.close()
            raise

    def _start(self, config, modules) -> None:
        if self.sandboxed and sandbox.is_root():
            # The kernels' connection folders lie in `runtime`: a small tmpfs, as a cold
            # kernel's is, so that no kernel can fill the grader's disk through it.
            self.mounted = sandbox._mount_tmpfs(self.runtime, f"size={RUNTIME_TMPFS_MB}m,mode=0755,"
                                                              f"uid={sandbox.NOBODY},gid={sandbox.NOBODY}")
            for folder in (self.runtime, self.spool):
                os.chown(folder, sandbox.NOBODY, sandbox.NOBODY)
                os.chmod(folder, 0o755)
        # Its program, where the sandbox lets it read it (the course's tools are hidden there).
        program = os.path.join(self.runtime, "zygote.py")
        with open(program, "w") as f:
            f.write(source())
        os.chmod(program, 0o444)
        # Its command line names no host path: every process of the sandbox (bwrap, pid 1,
        # and each kernel, a fork of the zygote) can read the command lines above it. The
        # interpreter, the program and its arguments reach a shell over the zygote's stdin
        # (read to the empty argument that ends them, before the protocol's first line), and
        # the zygote blanks its own command line before it imports anything.
        argv = [sys.executable, program, json.dumps(list(modules))]
        cmd = [sandbox._bash(), "-c", EXEC_FROM_STDIN, "course-zygote"]
        env = sandbox.sandbox_env(config) if self.sandboxed else dict(os.environ)
        if self.sandboxed:
            kind = sandbox.cgroup_kind()
            if kind:  # the zygote's own memory: capped like a kernel's
                self.cgroup = sandbox.Cgroup.create(kind, config.memory_mb * sandbox.MIB, config.max_processes)
            cmd = sandbox.wrap_command(cmd, config, writable=[self.runtime], cgroup=self.cgroup,
                                       zygote=([self.spool], [self.scratch_root]))
        elif config is not None:  # config None: no sandbox and no limits, as nbclient's own kernels
            cmd = sandbox.wrap_command(cmd, config, writable=[])
        self.process = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.stderr, env=env, cwd="/", start_new_session=True)
        self.process.stdin.write(b"".join(a.encode() + b"\0" for a in argv) + b"\0")
        self.process.stdin.flush()
        self.ready = self._read(START_TIMEOUT_S)
        if not self.ready.get("ready"):
            raise ZygoteError(f"the zygote did not start: {self.ready}")
        if self.ready.get("threads") != 1:
            raise ZygoteError(f"the zygote has {self.ready.get('threads')} threads after its imports: "
                              "forking it would be unsafe")

    def _read(self, timeout: float) -> dict:
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        line = self.process.stdout.readline() if ready else b""
        if not line:
            self.close()
            raise ZygoteError(f"the zygote did not answer (exit status {self.process.poll()}): "
                              f"{self.stderr_text()[-2000:]}")
        return json.loads(line)

    def stderr_text(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode("utf-8", "replace")

    def request(self, op: dict, timeout: float = FORK_TIMEOUT_S) -> dict:
        if self.process.poll() is not None:
            raise ZygoteError(f"the zygote is gone (exit status {self.process.returncode})")
        try:
            self.process.stdin.write(json.dumps(op).encode() + b"\n")
            self.process.stdin.flush()
        except OSError as exc:
            self.close()
            raise ZygoteError(f"the zygote is gone: {exc}") from exc
        answer = self._read(timeout)
        if not answer.get("ok"):
            raise ZygoteError(answer.get("error", "the zygote refused"))
        return answer

    def alive(self) -> bool:
        return self.process.poll() is None

    def responsive(self) -> bool:
        """Alive and answering (a kernel may have stopped it with SIGSTOP: same user)."""
        try:
            return self.alive() and self.request({"op": "ping"}, timeout=PING_TIMEOUT_S).get("threads") == 1
        except (ZygoteError, ValueError, OSError):
            return False

    def spawn(self, *, connection_file: str, cwd: str, env: dict, stderr_fd: int | None,
              cgroup: sandbox.Cgroup | None, folder: str) -> "WarmProcess":
        """Fork a kernel. `folder`: its runtime sub-folder (holding `connection_file`)."""
        key = os.path.basename(folder)
        ctl_path = os.path.join(self.runtime, f"c{key}")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(ctl_path)
        os.chmod(ctl_path, 0o666)
        listener.listen(1)
        listener.settimeout(FORK_TIMEOUT_S)
        isolate = None
        if self.sandboxed:
            spool_dir = os.path.join(self.spool, key)
            _copy_files(cwd, spool_dir)
            isolate = {"tmpfs_bytes": self.config.tmpfs_mb * sandbox.MIB, "runtime": self.runtime,
                       "spool": self.spool, "input": spool_dir, "scratch_root": self.scratch_root}
        try:
            answer = self.request({"op": "fork", "ctl": ctl_path, "connection_file": connection_file,
                                   "cwd": os.path.realpath(cwd), "env": env, "isolate": isolate})
            nspid = answer["pid"]
            try:
                conn, _ = listener.accept()
            except socket.timeout as exc:
                raise ZygoteError("the forked kernel never called back") from exc
            with conn:
                conn.settimeout(FORK_TIMEOUT_S)
                hello = conn.recv(16)
                pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                                  struct.calcsize("3i")))
                if hello != b"hello\n" or _ns_pid(pid) != nspid:
                    raise ZygoteError(f"an unexpected process called back (pid {pid}, uid {uid})")
                pidfd = os.pidfd_open(pid)
                if cgroup is not None:
                    for procs in cgroup.procs:
                        with open(procs, "w") as f:
                            f.write(f"{pid}\n")
                null = None
                if stderr_fd is None:
                    null = os.open(os.devnull, os.O_WRONLY)
                try:
                    socket.send_fds(conn, [b"go\n"], [stderr_fd if stderr_fd is not None else null])
                finally:
                    if null is not None:
                        os.close(null)
            self.forks += 1
            return WarmProcess(self, pid, nspid, pidfd)
        finally:
            listener.close()
            try:
                os.unlink(ctl_path)
            except OSError:
                pass

    def reap(self, nspid: int) -> int | None:
        try:
            return self.request({"op": "reap", "pid": nspid}, timeout=PING_TIMEOUT_S).get("status")
        except (ZygoteError, ValueError):
            self.close()  # stopped, or gone: never leased again
            return None

    def close(self) -> None:
        if self.process is None:
            self._remove()
            return
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except OSError:
                self.process.kill()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            pass
        for stream in (self.process.stdin, self.process.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self._remove()

    def _remove(self) -> None:
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None
        if self.mounted:
            sandbox._umount(self.runtime)
            self.mounted = False
        shutil.rmtree(self.runtime, ignore_errors=True)
        shutil.rmtree(self.spool, ignore_errors=True)


def _ns_pid(pid: int) -> int | None:
    """The innermost pid of host process `pid` (its pid inside the zygote's pid namespace)."""
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    except OSError:
        return None
    return None


def _copy_files(src: str, dst: str) -> None:
    """The working folder's files, for the kernel to copy in (readable by the kernel's user)."""
    shutil.copytree(src, dst, symlinks=True)
    if sandbox.is_root():
        sandbox._readable_by_all(dst)


class WarmProcess:
    """The forked kernel, as much of subprocess.Popen as jupyter_client's provisioner uses.
    It is not this process's child: its exit is watched through a pidfd."""

    stdin = stdout = stderr = None

    def __init__(self, zygote: Zygote, pid: int, nspid: int, pidfd: int):
        self.zygote, self.pid, self.nspid, self.pidfd = zygote, pid, nspid, pidfd
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and self.pidfd >= 0:
            ready, _, _ = select.select([self.pidfd], [], [], 0)
            if ready:
                status = self.zygote.reap(self.nspid)
                self.returncode = status if status is not None else -signal.SIGKILL
                os.close(self.pidfd)
                self.pidfd = -1
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired("warm kernel", timeout)
            select.select([self.pidfd], [], [], 0.1 if end is None else max(0.0, min(0.1, end - time.monotonic())))
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.pidfd >= 0:
            signal.pidfd_send_signal(self.pidfd, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class _Pool:
    """Idle zygotes, by sandbox configuration. A zygote is leased to one kernel at a time;
    a thread that finds none idle starts another (grading in parallel threads)."""

    def __init__(self):
        self._idle: dict[object, list[Zygote]] = {}
        self._all: list[Zygote] = []
        self._order: list[Zygote] = []  # idle ones, least recently used first
        self._lock = threading.Lock()
        self.failures: dict[object, float] = {}  # configuration -> when a zygote last failed

    def acquire(self, config: sandbox.SandboxConfig | None) -> Zygote | None:
        key = config
        with self._lock:
            failed = self.failures.get(key)
            if failed is not None and time.monotonic() - failed < RETRY_AFTER_S:
                return None
            idle = self._idle.setdefault(key, [])
            while idle:
                zygote = idle.pop()
                self._order = [z for z in self._order if z is not zygote]
                if zygote.responsive():
                    return zygote
                self._all = [z for z in self._all if z is not zygote]
                zygote.close()
        try:
            zygote = Zygote(key)
        except (ZygoteError, sandbox.SandboxUnavailable, OSError) as exc:
            with self._lock:
                self.failures[key] = time.monotonic()
            log.warning("warm kernels unavailable, starting kernels cold: %s", exc)
            return None
        with self._lock:
            self._all.append(zygote)
        return zygote

    def release(self, zygote: Zygote) -> None:
        """Back to the idle ones. At most MAX_IDLE stay (the least recently used go): a
        process that grades for many configurations (a test run: each course hides its own
        folders) would otherwise keep a zygote, and its 200-300 MB, for each."""
        closing = []
        with self._lock:
            if zygote.alive():
                self._idle.setdefault(zygote.config, []).append(zygote)
                self._order = [z for z in self._order if z is not zygote] + [zygote]
            else:
                closing.append(zygote)
            idle = [z for z in self._order if any(z in zs for zs in self._idle.values())]
            for old in idle[:max(0, len(idle) - MAX_IDLE)]:
                self._idle[old.config].remove(old)
                closing.append(old)
            self._order = [z for z in self._order if z not in closing]
            self._all = [z for z in self._all if z not in closing]
        for old in closing:
            old.close()

    def discard(self, zygote: Zygote) -> None:
        with self._lock:
            self._all = [z for z in self._all if z is not zygote]
            self._order = [z for z in self._order if z is not zygote]
        zygote.close()

    def close(self) -> None:
        with self._lock:
            zygotes, self._all, self._idle, self._order = self._all, [], {}, []
        for zygote in zygotes:
            zygote.close()


POOL = _Pool()
atexit.register(POOL.close)


class WarmProvisioner(LocalProvisioner):
    """LocalProvisioner whose kernel is forked by a zygote; a cold start where it cannot be."""

    zygote: Zygote | None = None
    folders: tuple[str, ...] = ()

    async def launch_kernel(self, cmd, **kwargs):
        km = self.parent
        zygote = POOL.acquire(km.sandbox_config) if enabled() else None
        if zygote is not None:
            saved = (km.connection_file, km.ip)
            try:
                if zygote.sandboxed:
                    self._relocate(km, zygote)
                self.process = zygote.spawn(
                    connection_file=km.connection_file, cwd=str(kwargs.get("cwd") or os.getcwd()),
                    env=_kernel_env(kwargs.get("env"), zygote), stderr_fd=_fd(kwargs.get("stderr")),
                    cgroup=getattr(km, "_cgroup", None), folder=os.path.dirname(km.connection_file))
                self.zygote = zygote
                km.warm_zygote = zygote
                self.pid = self.pgid = self.process.pid
                self.cwd = kwargs.get("cwd")
                return self.connection_info
            except (ZygoteError, OSError) as exc:
                log.warning("a warm kernel could not be forked, starting this one cold: %s", exc)
                if (km.connection_file, km.ip) != saved:
                    km.connection_file, km.ip = saved
                    km._connection_file_written = False
                    km.write_connection_file()
                    self.connection_info = km.get_connection_info()
                self._remove_folders()
                POOL.discard(zygote)
        return await super().launch_kernel(cmd, **kwargs)

    def _relocate(self, km, zygote: Zygote) -> None:
        """The connection file and sockets go to a sub-folder of the zygote's runtime folder,
        the only one its kernels can write to; the working folder's files to its spool."""
        key = uuid.uuid4().hex[:8]  # short: socket paths are limited to 108 bytes
        folder = os.path.join(zygote.runtime, key)
        os.mkdir(folder, 0o755)
        self.folders = (folder, os.path.join(zygote.spool, key))
        if sandbox.is_root():
            os.chown(folder, sandbox.NOBODY, sandbox.NOBODY)
        km.connection_file = os.path.join(folder, "kernel.json")
        km.ip = os.path.join(folder, "ipc")
        km._connection_file_written = False
        km.write_connection_file()
        if sandbox.is_root():
            os.chown(km.connection_file, sandbox.NOBODY, sandbox.NOBODY)
        self.connection_info = km.get_connection_info()

    def _remove_folders(self) -> None:
        for folder in self.folders:
            shutil.rmtree(folder, ignore_errors=True)
        self.folders = ()

    async def wait(self):
        if not isinstance(self.process, WarmProcess):
            return await super().wait()
        import asyncio
        while self.process.poll() is None:
            await asyncio.sleep(0.02)
        ret = self.process.returncode
        self.process = None
        return ret

    async def cleanup(self, restart: bool = False) -> None:
        await super().cleanup(restart=restart)
        if isinstance(self.process, WarmProcess) and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._remove_folders()


def _kernel_env(env, zygote: Zygote) -> dict:
    out = dict(os.environ if env is None else env)
    if zygote.sandboxed:
        out.pop("JPY_PARENT_PID", None)  # as bwrap --unsetenv does for a cold kernel
    return out


def _fd(stream) -> int | None:
    if stream is None or stream == subprocess.DEVNULL:
        return None
    return stream if isinstance(stream, int) else stream.fileno()


class QuickReadyClient(AsyncKernelClient):
    """jupyter_client's kernel client, but ready 0.2 s sooner: once the kernel_info reply
    and an IOPub message have arrived, it flushes IOPub until 20 ms pass without a message,
    not 200 ms (a fixed 0.2 s of every kernel start; a message that comes later belongs to
    no cell and every reader of the notebook's cells ignores it)."""

    async def _async_wait_for_ready(self, timeout: float | None = None) -> None:
        deadline = time.time() + (float("inf") if timeout is None else timeout)
        while True:
            self.kernel_info()
            try:
                msg = await ensure_async(self.shell_channel.get_msg(timeout=1))
            except Empty:
                pass
            else:
                if msg["msg_type"] == "kernel_info_reply":
                    try:  # IOPub connected? If not, start over (as jupyter_client does)
                        await ensure_async(self.iopub_channel.get_msg(timeout=0.2))
                    except Empty:
                        pass
                    else:
                        self._handle_kernel_info_reply(msg)
                        break
            if not await self._async_is_alive():
                raise RuntimeError("Kernel died before replying to kernel_info")
            if time.time() > deadline:
                raise RuntimeError(f"Kernel didn't respond in {timeout:.0f} seconds")
        while True:
            try:
                await ensure_async(self.iopub_channel.get_msg(timeout=QUICK_FLUSH_S))
            except Empty:
                break

    wait_for_ready = _async_wait_for_ready


class _WarmMixin:
    """The kernel's provisioner forks it from a zygote; the zygote goes back to the pool
    only once the kernel's cgroup, and every process left in it, is gone."""

    warm_zygote: Zygote | None = None

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.client_factory = QuickReadyClient

    async def _async_pre_start_kernel(self, **kw):
        if self.provisioner is None:
            self.kernel_id = self.kernel_id or kw.pop("kernel_id", str(uuid.uuid4()))
            self.provisioner = WarmProvisioner(kernel_id=self.kernel_id, kernel_spec=self.kernel_spec,
                                               parent=self)
        return await super()._async_pre_start_kernel(**kw)

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        zygote, self.warm_zygote = self.warm_zygote, None
        if zygote is not None:
            POOL.release(zygote)


class WarmKernelManager(_WarmMixin, sandbox.SandboxedKernelManager):
    """A sandboxed kernel manager (coursetools.grading.sandbox) whose kernels are forked warm.
    Subclass it with `manager_for(...)`."""


class PlainWarmKernelManager(_WarmMixin, AsyncKernelManager):
    """Warm kernels without a sandbox or limits: what a cold kernel of nbclient's own
    manager is (the learner's self-check, the author checks)."""

    sandbox_config = None


def manager_for(config: sandbox.SandboxConfig, scratch: str | Path) -> type[WarmKernelManager]:
    """A warm kernel manager class for one notebook's run in `scratch` (as kernel_manager_for)."""
    return type("WarmKernelManagerForRun", (WarmKernelManager,),
                {"sandbox_config": config, "scratch": str(scratch)})


def kernel_manager_for(config: sandbox.SandboxConfig, scratch: str | Path) -> type:
    """The kernel manager grading uses: warm (manager_for) unless COURSE_WARM_KERNELS=0."""
    return manager_for(config, scratch) if enabled() else sandbox.kernel_manager_for(config, scratch)
