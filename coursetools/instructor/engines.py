"""Where submissions are graded: worker processes on this machine, or a Dask cluster.

Both engines take `gradejob.Task`s (a submission and its assignment's source, as data) and
give back, in the order they finish, each task with its `gradejob.Outcome` or the reason it
could not be graded. The coordinator (grade-class) records each result into the gradebook;
no worker ever writes there.

* `LocalEngine` (`grade-class --jobs N`, the default): N worker processes of this machine
  (`python -m coursetools.instructor.localworker`), each grading one submission at a time
  and talking to grade-class over a socket pair. A worker that dies (killed, out of memory)
  is replaced, and the submission it held goes back in the queue: graded once, never lost.
  After `MAX_ATTEMPTS` deaths on the same submission it is reported, not retried forever.
  A worker whose memory a submission pushed past a threshold is replaced after sending that
  submission's result (gradejob.retire_reason), and each worker's heap is capped
  (gradejob.cap_memory).
* `DaskEngine` (`grade-class --scheduler tcp://host:8786`, or `--scheduler local` for a Dask
  LocalCluster of `--jobs` workers): Dask distributed places each task on a worker and, when
  a worker is lost mid-run, runs its tasks again on another (up to the scheduler's
  `allowed-failures`, then `KilledWorker`). Workers are started by Dask's own tools (the
  `dask worker` command, dask-jobqueue on Slurm, dask-kubernetes), with
  `--preload coursetools.instructor.daskworker` so that each one checks its sandbox before it
  takes work.

`stop()` (called from grade-class's signal handler) makes `run()` end at once; the processes
themselves are stopped by the caller (runguard.stop_descendants).
"""

from __future__ import annotations

import os
import pickle
import queue
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from coursetools import layout
from coursetools.instructor import gradejob, runguard

MAX_ATTEMPTS = 3  # a submission whose worker died this many times is reported, not retried
GIB = 2**30
MEMORY_PER_JOB = 1.5 * GIB  # a kernel with PyTorch, and for chapter 06 two DDP processes more


class EngineFatal(RuntimeError):
    """The engine cannot grade at all (no worker can start, a worker runs other code)."""


@dataclass
class Lost:
    """A task that no worker could finish (the reason is shown as the submission's flag)."""
    reason: str


def usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def memory_bytes() -> int | None:
    """This machine's memory, or the cgroup's limit when one is set and smaller."""
    total = None
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and (total is None or int(text) < total):
            total = int(text)
    return total


def default_jobs() -> int:
    """The usable cores, and no more than one job per 1.5 GiB of memory (the test runner's
    rule, tests/conftest.py): each job holds a kernel with PyTorch, chapter 06 two DDP
    processes more."""
    jobs = usable_cores()
    memory = memory_bytes()
    if memory:
        jobs = min(jobs, max(1, int(memory // MEMORY_PER_JOB)))
    return jobs


# -- this machine ---------------------------------------------------------------------------
def send(conn: socket.socket, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    conn.sendall(len(data).to_bytes(8, "big") + data)


def _read_exact(conn: socket.socket, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = conn.recv(min(left, 1 << 20))
        if not chunk:
            raise EOFError("the other end closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def recv(conn: socket.socket):
    size = int.from_bytes(_read_exact(conn, 8), "big")
    return pickle.loads(_read_exact(conn, size))


class LocalEngine:
    """N worker processes on this machine (see the module's docstring)."""

    def __init__(self, jobs: int, config: bytes, log_path: Path, env: dict[str, str] | None = None):
        self.jobs = max(1, jobs)
        self.config = config
        self.log_path = log_path
        self.env = dict(env or layout.env_with_course_tools())
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        self.stopping = threading.Event()
        self.ready: list[str] = []  # what each worker said when it started (its sandbox)
        self.restarts = 0
        self.recycled: list[str] = []  # workers replaced after a submission left them too big

    def stop(self) -> None:
        self.stopping.set()

    def _start_worker(self, log) -> tuple[subprocess.Popen, socket.socket]:
        mine, theirs = socket.socketpair()
        proc = subprocess.Popen(
            [sys.executable, "-m", "coursetools.instructor.localworker", str(theirs.fileno())],
            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            env=self.env, cwd=str(layout.ROOT))
        runguard.spawned(proc.pid)
        theirs.close()
        send(mine, ("config", self.config))
        return proc, mine

    def run(self, jobs: list[gradejob.Job]) -> Iterator[tuple[gradejob.Job, object]]:
        todo: queue.Queue = queue.Queue()
        for job in jobs:
            todo.put(job)
        results: queue.Queue = queue.Queue()
        attempts: dict[str, int] = {}
        lock = threading.Lock()
        log = open(self.log_path, "a", encoding="utf-8")

        def slot(index: int) -> None:
            proc = conn = None
            task = None
            try:
                while not self.stopping.is_set():
                    if proc is None:
                        proc, conn = self._start_worker(log)
                        try:
                            kind, said = recv(conn)
                        except (EOFError, OSError):
                            kind, said = "fatal", f"worker {proc.pid} exited before it was ready ({proc.wait()}); see the log"
                        if kind == "fatal":
                            results.put(("fatal", said))
                            return
                        with lock:
                            self.ready.append(said)
                    if task is None:
                        try:
                            task = todo.get_nowait()
                        except queue.Empty:
                            send(conn, ("bye", None))
                            return
                    try:
                        send(conn, ("task", task.task()))
                        kind, payload = recv(conn)
                    except (EOFError, OSError):
                        code = proc.wait()
                        runguard.waited(proc.pid)
                        proc = conn = None
                        if self.stopping.is_set():
                            return
                        with lock:
                            self.restarts += 1
                            attempts[task.key] = attempts.get(task.key, 0) + 1
                            tries = attempts[task.key]
                        if tries >= MAX_ATTEMPTS:
                            results.put(("lost", (task, Lost(
                                f"its worker died {tries} times while grading it (exit {code})"))))
                            task = None
                        continue  # a new worker takes the same task
                    if kind == "fatal":
                        results.put(("fatal", payload))
                        return
                    if kind == "done-retire":
                        payload, why = payload
                        with lock:
                            self.recycled.append(why)
                        print(why, file=log, flush=True)
                        conn.close()
                        _reap(proc)
                        proc = conn = None
                    results.put(("done", (task, payload)))
                    task = None
            except Exception as exc:  # noqa: BLE001 - the run must hear of it
                if not self.stopping.is_set():
                    results.put(("fatal", f"worker slot {index}: {type(exc).__name__}: {exc}"))
            finally:
                results.put(("slot-ended", index))
                if conn is not None:
                    conn.close()
                if proc is not None:
                    _reap(proc)

        slots = min(self.jobs, len(jobs))
        threads = [threading.Thread(target=slot, args=(i,), daemon=True) for i in range(slots)]
        for thread in threads:
            thread.start()
        ended = 0
        try:
            while ended < slots:
                runguard.reap_orphans()
                try:
                    kind, payload = results.get(timeout=0.5)
                except queue.Empty:
                    if self.stopping.is_set():
                        return
                    continue
                if kind == "slot-ended":
                    ended += 1
                elif kind == "fatal":
                    self.stop()
                    raise EngineFatal(payload)
                elif kind in ("done", "lost"):
                    yield payload
                if self.stopping.is_set():
                    return
        finally:
            self.stop()
            log.close()


# -- a Dask cluster -------------------------------------------------------------------------
class DaskEngine:
    """Tasks on a Dask distributed cluster (see the module's docstring)."""

    def __init__(self, scheduler: str, jobs: int, log_path: Path):
        try:
            from distributed import Client, LocalCluster
        except ImportError as exc:
            raise EngineFatal("--scheduler needs Dask distributed: pip install 'distributed>=2024.1' "
                              "(on the machine that runs grade-class and on every worker)") from exc
        self.cluster = None
        if scheduler == "local":
            self.cluster = LocalCluster(n_workers=max(1, jobs), threads_per_worker=1, processes=True,
                                        dashboard_address=None,
                                        preload=["coursetools.instructor.daskworker"])
            self.client = Client(self.cluster)
        else:
            self.client = Client(scheduler, timeout="60s")
        self.scheduler = scheduler
        self.log_path = log_path
        self.stopping = threading.Event()
        self.ready: list[str] = []
        self.recycled: list[str] = []  # workers restarted after a submission left them too big

    def stop(self) -> None:
        self.stopping.set()

    def _recycle(self, outcome: gradejob.Outcome) -> None:
        """Restart the worker that graded `outcome` (its nanny starts a fresh process), so the
        memory a submission left behind is no other student's. A worker without a nanny
        (`dask worker --no-nanny`) is closed instead: the scheduler gives its work to the others."""
        result = self.client.restart_workers([outcome.address], raise_for_error=False)
        state = result.get(outcome.address, "restarted") if isinstance(result, dict) else "restarted"
        why = f"worker {outcome.worker} ({outcome.address}) replaced: {outcome.retire} [{state}]"
        self.recycled.append(why)
        with open(self.log_path, "a", encoding="utf-8") as log:
            print(why, file=log)

    def workers(self) -> list[str]:
        return sorted(self.client.scheduler_info(n_workers=-1).get("workers", {}))

    def run(self, jobs: list[gradejob.Job]) -> Iterator[tuple[gradejob.Job, object]]:
        from distributed import as_completed
        from distributed.client import FutureCancelledError

        if not jobs:
            return
        self.client.wait_for_workers(1, timeout=120)
        waiting = list(reversed(jobs))
        futures: dict = {}
        pending = as_completed([], with_results=False)

        def top_up() -> None:
            # A few tasks per worker in flight: submissions travel as data, not all at once.
            window = 4 * max(1, len(self.workers()))
            while waiting and len(futures) < window:
                job = waiting.pop()
                future = self.client.submit(gradejob.grade, job.task(), key=job.key, pure=False, retries=0)
                futures[future] = job
                pending.add(future)

        top_up()
        try:
            for future in pending:
                if self.stopping.is_set():
                    return
                job = futures.pop(future)
                top_up()
                try:
                    outcome = future.result()
                except gradejob.WorkerMismatch as exc:
                    raise EngineFatal(str(exc)) from None
                except FutureCancelledError:
                    continue
                except Exception as exc:  # noqa: BLE001
                    name = type(exc).__name__
                    if name == "KilledWorker":
                        yield job, Lost("the Dask workers grading it died (KilledWorker: "
                                        "the scheduler's allowed-failures was reached)")
                        continue
                    if name in ("PreflightError", "SandboxUnavailable"):
                        raise EngineFatal(f"a Dask worker cannot grade: {exc}") from None
                    raise EngineFatal(f"a Dask worker failed: {name}: {exc}") from None
                finally:
                    future.release()
                if outcome.sandbox and outcome.sandbox not in self.ready:
                    self.ready.append(outcome.sandbox)
                if outcome.retire and outcome.address:
                    self._recycle(outcome)
                yield job, outcome
        finally:
            self.stop()
            self.client.cancel(list(futures))
            self.client.close()
            if self.cluster is not None:
                self.cluster.close()


def _reap(proc) -> None:
    """Wait for a worker that was told to end (30 s), kill it if it does not, and tell the run
    guard it is gone."""
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    runguard.waited(proc.pid)
