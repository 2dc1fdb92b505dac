"""What keeps a long grading run safe to stop and to start again.

* `CourseLock`: one `grade-class` per course at a time. A lock file in the course folder,
  held with `flock` for as long as the process lives (the kernel drops it when the process
  dies, however it dies); a second run is refused with the holder's pid, host and start time.
  A lock file left by a dead process is simply taken over.
* `StopSignals`: SIGINT, SIGTERM and SIGHUP (Ctrl-C, a scheduler's kill, a closed SSH
  session) do not kill `grade-class` in the middle of writing a grade: the handler notes the
  signal and stops every process the run started (`stop_descendants`), and the run ends
  after the submission it is recording, saying what was finished.
* `stop_descendants`: every process below this one, found through /proc, including those
  in sessions of their own (Jupyter starts each kernel in a new session, so a process-group
  kill misses it). This process is made a child subreaper (Linux), so processes orphaned
  below it (a worker killed before its kernel) are re-parented here and still found.
"""

from __future__ import annotations

import ctypes
import datetime
import errno
import json
import os
import platform
import signal
import sys
import time
from pathlib import Path

LOCK_NAME = ".grade-class.lock"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_PR_SET_CHILD_SUBREAPER = 36


class LockHeld(RuntimeError):
    """Another grade-class holds this course's lock."""


class CourseLock:
    def __init__(self, course: Path):
        self.path = Path(course) / LOCK_NAME
        self.fd: int | None = None
        self.took_over: dict | None = None

    def holder(self) -> dict:
        try:
            return json.loads(self.path.read_text(encoding="utf-8") or "{}")
        except (OSError, ValueError):
            return {}

    def acquire(self, what: str) -> "CourseLock":
        import fcntl

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            held = self.holder()
            raise LockHeld(
                f"another grade-class is grading this course: pid {held.get('pid', '?')} on "
                f"{held.get('host', '?')}, started {held.get('started', '?')} ({held.get('command', '')}). "
                f"Wait for it to finish, or stop it (kill {held.get('pid', 'PID')}: it stops its "
                f"workers and kernels and keeps what it finished). Lock: {self.path}") from None
        previous = self.holder()
        if previous.get("pid"):
            self.took_over = previous  # its process is gone: flock would not be ours otherwise
        info = {"pid": os.getpid(), "host": platform.node(), "command": what,
                "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        os.fsync(fd)
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.ftruncate(self.fd, 0)
        finally:
            os.close(self.fd)  # drops the flock
            self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def become_subreaper() -> bool:
    """Orphans of this process's descendants are re-parented here (Linux): they stay
    findable by `descendants()`. Returns whether that holds on this system."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def descendants(pid: int | None = None) -> list[int]:
    """Every live process below `pid` (default: this one), deepest last."""
    root = os.getpid() if pid is None else pid
    if not os.path.isdir("/proc"):
        return []
    children = _children_map()
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.append(child)
                todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().decode(errors="replace").rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except OSError:
        return False


_SPAWNED: set[int] = set()  # children this process started itself (their owners wait for them)


def spawned(pid: int) -> None:
    """Note a child this process started (subprocess.Popen): `reap_orphans` leaves it alone."""
    _SPAWNED.add(pid)


def waited(pid: int) -> None:
    _SPAWNED.discard(pid)


def reap_orphans() -> int:
    """Collect the exited orphans re-parented to this subreaper (a sandbox's helper processes
    end as zombies here), never a child this process started itself. Returns how many."""
    me, reaped = os.getpid(), 0
    if not os.path.isdir("/proc"):
        return 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in _SPAWNED:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().decode(errors="replace").rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and int(fields[1]) == me:
            try:
                if os.waitpid(int(entry), os.WNOHANG)[0]:
                    reaped += 1
            except ChildProcessError:
                pass
    return reaped


def stop_descendants(grace_s: float = 5.0) -> list[int]:
    """SIGTERM every process below this one, then SIGKILL what is still there after
    `grace_s`. Repeats until none is left (new ones may start meanwhile). Returns the pids."""
    stopped: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 10.0)
        while True:
            live = [p for p in descendants() if _alive(p)]
            if not live:
                return stopped
            for pid in live:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    continue
                if pid not in stopped:
                    stopped.append(pid)
            time.sleep(0.1)
            reap_orphans()
            if time.monotonic() > deadline:
                break
    return stopped


class StopSignals:
    """Within `with StopSignals(on_stop) as stop:`, SIGINT/SIGTERM/SIGHUP set `stop.signal`
    and call `on_stop()` once (which stops the workers); the run checks `stop.requested`
    between submissions. A second signal of the same kind is noted, not fatal."""

    def __init__(self, on_stop=None):
        self.on_stop = on_stop
        self.signal: int | None = None
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signal is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signal).name if self.signal else ""

    def _handle(self, signum, frame) -> None:
        first = self.signal is None
        self.signal = signum
        if first and self.on_stop is not None:
            self.on_stop()

    def __enter__(self):
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    @property
    def exit_status(self) -> int:
        """The shell's convention for a run ended by a signal: 128 + its number."""
        return 128 + (self.signal or 0)
