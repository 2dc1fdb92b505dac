"""A grading worker process of this machine (started by engines.LocalEngine, never by hand).

    python -m coursetools.instructor.localworker FD

FD is this process's end of a socket pair. grade-class sends the course's nbgrader
configuration first; the worker starts one test kernel as grading will
(coursetools.grading.preflight; free when grade-class already passed it with the same
interpreter, user and sandbox) and answers ("ready", how its kernels are sandboxed) or
("fatal", why it cannot grade). Then, for each ("task", gradejob.Task): ("done", Outcome), or
("done-retire", (Outcome, why)) when the submission left the worker holding more memory than
gradejob.retire_reason allows: the worker then exits and grade-class starts a fresh one. The
worker's heap is capped (gradejob.cap_memory). ("bye", None) ends it. Its stdout and stderr go to grade-class's log.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import traceback
import warnings


def main(argv: list[str]) -> int:
    from coursetools.instructor import engines, gradejob

    # Ctrl-C and a closed terminal reach the whole process group: grade-class decides, and
    # stops this worker itself (SIGTERM) after it has recorded what it can.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    warnings.filterwarnings("ignore", module="sqlalchemy")
    warnings.filterwarnings("ignore", message=".*not in session.*")
    conn = socket.socket(fileno=int(argv[0]))
    gradejob.cap_memory()
    kind, config = engines.recv(conn)
    assert kind == "config"
    try:
        gradejob.ensure_ready(config)
    except Exception as exc:  # noqa: BLE001 - the coordinator reports it and stops
        engines.send(conn, ("fatal", f"worker {gradejob.worker_name()}: {exc}"))
        return 2
    engines.send(conn, ("ready", gradejob._STATE["sandbox"]))
    while True:
        try:
            kind, task = engines.recv(conn)
        except EOFError:
            return 0
        if kind == "bye":
            return 0
        try:
            outcome = gradejob.grade(task)
        except gradejob.WorkerMismatch as exc:
            engines.send(conn, ("fatal", str(exc)))
            return 2
        except Exception:  # noqa: BLE001 - the worker's fault, not the submission's
            engines.send(conn, ("fatal", f"worker {gradejob.worker_name()} failed on {task.student}'s "
                                         f"{task.assignment}:\n{traceback.format_exc()}"))
            return 2
        why = gradejob.retire_reason(outcome)
        if why is not None:
            engines.send(conn, ("done-retire", (outcome, f"worker {gradejob.worker_name()} replaced: {why}")))
            return 0
        engines.send(conn, ("done", outcome))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main(sys.argv[1:]))
