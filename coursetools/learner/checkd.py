"""`make.py check` through a small per-user daemon that keeps the check warm.

    python3 make.py check NOTEBOOK      (this module's main: the client)

The first check of a session runs as it always did (cold: this process imports PyTorch and
starts a kernel), then starts a daemon in the background. The daemon imports the checker
and PyTorch once and keeps a warm-kernel zygote (coursetools.grading.warm), so every later
check forks a fresh kernel of its own instead of starting Python and importing PyTorch again:
about 1.5 s instead of 7-9 s for chapter 01 on a 2-core machine (benchmarks/warm_kernels.py).

The daemon is the learner's own process, like a compiler's build daemon:
  * its socket lies in a folder only the user can open (0700, theirs, checked), and it
    answers only its own user (the socket's peer credentials);
  * one per course checkout and version of the course's tools and of PyTorch: after a
    `git pull`, an edit of coursetools/ or an upgrade of torch, the next check starts a new
    one (the old one times out);
  * it stops by itself after COURSE_CHECK_IDLE_S seconds without a check (default 900);
  * it runs one check at a time, each in a freshly forked kernel (nothing of one check's
    code reaches the next: coursetools.grading.warm).
`COURSE_CHECK_DAEMON=0` turns it off (every check cold); `make.py check --no-daemon` too.

Only the standard library is imported here before the daemon answers: the client costs a
Python start and a socket round trip.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import os
import socket
import stat
import struct
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = "COURSE_CHECK_DAEMON"
IDLE_ENV = "COURSE_CHECK_IDLE_S"
IDLE_S = 900
CONNECT_TIMEOUT_S = 2.0
# What the check reads from the environment: given to the daemon with each request.
PASSED_ENV = ("COLUMNS", "LINES", "NO_COLOR", "LANG", "LC_ALL", "COURSE_LANG", "TERM")


def _fingerprint() -> str:
    """The course's tools as they are now: a daemon started from other code is not used."""
    digest = hashlib.sha256(f"{ROOT}\0{sys.executable}\0{os.getuid()}".encode())
    paths = sorted((ROOT / "coursetools").rglob("*.py"))
    for name in ("torch", "ipykernel", "nbclient"):  # upgraded in .venv: a new daemon
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            paths.append(Path(spec.origin))
    for path in paths:
        info = path.stat()
        digest.update(f"{path}\0{info.st_mtime_ns}\0{info.st_size}\n".encode())
    return digest.hexdigest()[:20]


SOCKET_PATH_MAX = 107 - 16  # a Unix socket's path (108 bytes), less the temporary suffix


def _folder() -> Path | None:
    """A folder only this user can open, or None (then no daemon: checks stay cold)."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    folder = Path(base) / "course-check" if base else Path("/tmp") / f"course-check-{os.getuid()}"
    if len(os.fsencode(folder)) + 26 > SOCKET_PATH_MAX:  # too long for a socket's name
        folder = Path("/tmp") / f"course-check-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(folder)
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return None  # someone else's, or open to others: never trusted
    return folder


def socket_path() -> Path | None:
    folder = _folder()
    return folder / f"{_fingerprint()}.sock" if folder else None


def enabled(argv: list[str]) -> bool:
    return os.environ.get(ENV, "1") != "0" and "--no-daemon" not in argv and sys.platform == "linux"


def _send(conn: socket.socket, message: dict) -> None:
    data = json.dumps(message).encode()
    conn.sendall(struct.pack("!I", len(data)) + data)


def _recv(conn: socket.socket) -> dict | None:
    head = _exactly(conn, 4)
    if head is None:
        return None
    body = _exactly(conn, struct.unpack("!I", head)[0])
    return None if body is None else json.loads(body)


def _exactly(conn: socket.socket, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = conn.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


# -- the client ---------------------------------------------------------------------------

def ask(argv: list[str], path: Path | None = None) -> int | None:
    """Run the check in the daemon: its exit code, or None when no daemon answered (then
    nothing was printed, and the caller checks cold)."""
    path = path or socket_path()
    if path is None or not path.exists():
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(CONNECT_TIMEOUT_S)
    try:
        conn.connect(str(path))
        conn.settimeout(None)
        _send(conn, {"argv": argv, "cwd": os.getcwd(),
                     "env": {k: os.environ[k] for k in PASSED_ENV if k in os.environ}})
        first = _recv(conn)
    except OSError:
        conn.close()
        return None
    if first is None or first.get("kind") != "started":
        conn.close()
        return None  # a daemon that is stopping: nothing printed yet
    with conn:
        while True:
            message = _recv(conn)
            if message is None:
                print("error: the check daemon stopped during the check; run it again "
                      f"(or with {ENV}=0)", file=sys.stderr)
                return 2
            if message["kind"] == "out":
                sys.stdout.write(message["text"])
                sys.stdout.flush()
            elif message["kind"] == "err":
                sys.stderr.write(message["text"])
                sys.stderr.flush()
            elif message["kind"] == "exit":
                return int(message["code"])


def start_daemon() -> None:
    """Start the daemon in the background (it outlives this check; it stops when idle)."""
    path = socket_path()
    if path is None:
        return
    subprocess.Popen([sys.executable, "-m", "coursetools.learner.checkd", "--serve"],
                     cwd=str(ROOT), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--serve"]:
        return serve()
    use = enabled(argv)
    if use:
        code = ask(argv)
        if code is not None:
            return code
    from coursetools.learner import selfcheck

    code = selfcheck.main(argv)
    if use and code != 2:
        start_daemon()
    return code


# -- the daemon ---------------------------------------------------------------------------

class _Stream(io.TextIOBase):
    def __init__(self, conn: socket.socket, kind: str):
        self.conn, self.kind = conn, kind

    def write(self, text: str) -> int:
        if text:
            try:
                _send(self.conn, {"kind": self.kind, "text": text})
            except OSError:
                pass  # the learner pressed Ctrl-C: the check ends, nobody reads it
        return len(text)

    def isatty(self) -> bool:
        return False


def serve(idle_s: float | None = None) -> int:
    path = socket_path()
    if path is None:
        return 1
    idle_s = float(os.environ.get(IDLE_ENV, IDLE_S)) if idle_s is None else idle_s
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    old = os.umask(0o077)
    try:
        listener.bind(str(tmp))
    finally:
        os.umask(old)
    listener.listen(8)
    # Warm up before answering: the checker, PyTorch (the tests' comparisons) and a zygote.
    from coursetools.grading import warm
    from coursetools.learner import selfcheck
    import torch  # noqa: F401

    zygote = warm.POOL.acquire(None) if warm.enabled() else None
    if zygote is not None:
        warm.POOL.release(zygote)
    ino = os.stat(tmp).st_ino
    try:
        os.link(tmp, path)  # only one daemon per socket: a second one finds it taken
    except FileExistsError:
        listener.close()
        tmp.unlink()
        return 0
    tmp.unlink()
    listener.settimeout(idle_s)
    try:
        while True:
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                return 0
            with conn:
                if _handle(conn, selfcheck) == "stop":
                    return 0
            if not path.exists():
                return 0  # removed by hand: stop
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == ino:  # ours still (not a newer daemon's)
                path.unlink()
        warm.POOL.close()


def stop(path: Path | None = None) -> bool:
    """Ask the daemon of this checkout to stop now: whether one answered."""
    path = path or socket_path()
    if path is None or not path.exists():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(30)
        try:
            conn.connect(str(path))
            _send(conn, {"op": "stop"})
            return (_recv(conn) or {}).get("kind") == "stopped"
        except OSError:
            return False


def _handle(conn: socket.socket, selfcheck) -> str | None:
    _, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                      struct.calcsize("3i")))
    if uid != os.getuid():
        return None
    request = _recv(conn)
    if not request:
        return None
    if request.get("op") == "stop":
        _send(conn, {"kind": "stopped"})
        return "stop"
    saved_env = {k: os.environ.get(k) for k in PASSED_ENV}
    saved_cwd = os.getcwd()
    try:
        for k in PASSED_ENV:
            os.environ.pop(k, None)
        os.environ.update({k: v for k, v in request.get("env", {}).items() if k in PASSED_ENV})
        os.chdir(request["cwd"])
        _send(conn, {"kind": "started"})
        out, err = _Stream(conn, "out"), _Stream(conn, "err")
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = selfcheck.main(list(request["argv"]))
        except SystemExit as exc:  # argparse: --help, a wrong option
            code = exc.code if isinstance(exc.code, int) else 2
        except Exception as exc:  # noqa: BLE001 - said to the learner; the daemon goes on
            err.write(f"error: the check failed: {exc!r}\n")
            code = 2
        with contextlib.suppress(OSError):
            _send(conn, {"kind": "exit", "code": code})
    finally:
        os.chdir(saved_cwd)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


if __name__ == "__main__":
    sys.exit(main())
