"""A larger class on the course's JupyterHub, timed: what a class of 60 costs, projected from a
measured class of N (issue 37). Run as root (it makes Unix users, as the hub test does):

    .venv/bin/python benchmarks/hub_class.py --students 12

It sets up the one-server recipe exactly as tests/instructor/test_jupyterhub.py does
(tests/hub_support.py: the hub with deploy/jupyterhub/, real users, the shared exchange, the
instructor's course), then, without a browser (the browser test covers the clicks):

1. every student's server is started at once through the hub's REST API (as a class logging in
   at the start of a lesson), timed until all answer, and their memory measured (the
   resident set of each user's processes, from /proc);
2. the instructor generates and releases 01 (nbgrader's commands, as the instructor, with the
   environment the hub gives their server);
3. each student, as themselves, fetches, answers (every third: all, half, none) and submits
   (nbgrader's commands, what the Assignments tab's buttons call);
4. the instructor collects, runs `make.py grade-class`, and releases feedback;
5. each student fetches their feedback.

It prints each step's time, per student where a step is per student, the load it ran under,
and the projection for --project students (default 60): a step that each student does for
themselves scales with the class, one-at-a-time steps of the instructor's by N, grade-class
by its own rate line ("worked on N submission(s) in S s"), memory by the per-server figure.
Nothing asserts on time. Users and folders are removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import hub_support  # noqa: E402
import unix_users  # noqa: E402
from coursetools import layout, notebooks  # noqa: E402
from coursetools.author import fixtures  # noqa: E402

CHAPTER = layout.assignments()[0]
TEACHER = "course-bench-teacher"


def _api(hub, token: str, method: str, path: str) -> tuple[int, dict]:
    req = urllib.request.Request(f"{hub.url}/hub/api{path}", method=method,
                                 headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            body = r.read()
            return r.status, (json.loads(body) if body else {})
    except urllib.error.HTTPError as exc:
        return exc.code, {}


def _rss_mib(user) -> float:
    """Resident memory of every process of `user`, MiB (shared pages counted once per process:
    an upper bound)."""
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}").st_uid != user.pw_uid:
                continue
            with open(f"/proc/{pid}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            continue
    return total / 1024


def _run(who, env: dict[str, str], cmd: list[str], cwd: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(unix_users.as_user(who, ["env", "-i", *[f"{k}={v}" for k, v in env.items()], *cmd]),
                          cwd=cwd, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} as {who.pw_name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return proc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=12)
    parser.add_argument("--project", type=int, default=60)
    args = parser.parse_args()
    if not unix_users.IS_ROOT:
        return print("run it as root: it makes Unix users") or 2
    names = [f"course-bench-s{i:02d}" for i in range(1, args.students + 1)]
    for name in [TEACHER, *names]:
        unix_users.remove_user(name)
    load_before = os.getloadavg()
    base = Path(tempfile.mkdtemp(prefix="course-hub-bench-", dir="/tmp"))
    os.chmod(base, 0o755)
    hub = None
    times: list[tuple[str, float, bool]] = []  # (step, seconds, per student?)

    def step(label: str, per_student: bool = False):
        class _Step:
            def __enter__(self):
                self.t = time.perf_counter()

            def __exit__(self, *exc):
                if exc[0] is None:
                    times.append((label, time.perf_counter() - self.t, per_student))
        return _Step()

    try:
        teacher = unix_users.make_user(TEACHER)
        users = {name: unix_users.make_user(name) for name in names}
        with step("set-up (users' Python, exchange, /etc/jupyter, course)"):
            setup = hub_support.set_up_class(base, teacher, users[names[0]])
        token = secrets.token_hex(24)
        service = (f'c.JupyterHub.services = [{{"name": "bench", "api_token": {token!r}}}]\n'
                   'c.JupyterHub.load_roles = [{"name": "bench", "scopes": ["servers", "read:users"], '
                   '"services": ["bench"]}]\n')
        with step("hub and proxy start"):
            hub = setup.start_hub(base, TEACHER, names, service)

        with step(f"all {len(names)} students' servers started at once, until every one answers"):
            for name in names:
                status, _ = _api(hub, token, "POST", f"/users/{name}/server")
                assert status in (201, 202), (name, status)
            pending = set(names)
            deadline = time.monotonic() + 1800
            while pending and time.monotonic() < deadline:
                for name in sorted(pending):
                    status, info = _api(hub, token, "GET", f"/users/{name}")
                    server = (info.get("servers") or {}).get("", {})
                    if server.get("ready"):
                        pending.discard(name)
                time.sleep(1)
            assert not pending, f"not ready after 30 min: {sorted(pending)}"
        time.sleep(5)  # settled
        rss = [_rss_mib(users[n]) for n in names]
        # A kernel's share: a Python that imported what a lesson's kernel imports (ipykernel,
        # torch, matplotlib), as a student, its peak resident memory.
        probe = ("import resource, ipykernel.kernelapp, torch, matplotlib.pyplot; "
                 "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
        who = users[names[0]]
        kernel_mib = int(_run(who, setup.env(who), [str(setup.python), "-c", probe], who.pw_dir).stdout.split()[-1]) / 1024

        teacher_env = setup.env(teacher, teacher=True)
        course = str(setup.course)
        nbg = [str(setup.course_python), "-m", "nbgrader"]
        with step("instructor: generate and release 01"):
            _run(teacher, teacher_env, [*nbg, "generate_assignment", CHAPTER, "--force"], course)
            _run(teacher, teacher_env, [*nbg, "release_assignment", CHAPTER], course)
        every = fixtures.reference_answers(notebooks.read(layout.source_notebook(CHAPTER)))
        keys = list(every)
        with step("students: fetch, save answers, submit", per_student=True):
            for i, name in enumerate(names):
                who = users[name]
                env = setup.env(who)
                _run(who, env, [str(setup.python), "-m", "nbgrader", "fetch_assignment", CHAPTER], who.pw_dir)
                path = Path(who.pw_dir) / CHAPTER / f"{CHAPTER}.ipynb"
                keep = [keys, keys[: len(keys) // 2], []][i % 3]
                notebooks.write(fixtures.fill(notebooks.read(path), {k: every[k] for k in keep}), path)
                os.lchown(path, who.pw_uid, who.pw_gid)
                _run(who, env, [str(setup.python), "-m", "nbgrader", "submit", CHAPTER], who.pw_dir)
        with step("instructor: collect", per_student=True):
            _run(teacher, teacher_env, [*nbg, "collect", CHAPTER], course)
        with step("instructor: make.py grade-class"):
            graded = _run(teacher, teacher_env, [str(setup.course_python), "make.py", "grade-class", CHAPTER], course)
        rate = re.search(r"worked on (\d+) submission\(s\) in (\d+) s .*?(\d+) job\(s\)", graded.stdout)
        with step("instructor: release feedback", per_student=True):
            _run(teacher, teacher_env, [*nbg, "release_feedback", CHAPTER], course)
        with step("students: fetch feedback", per_student=True):
            for name in names:
                who = users[name]
                _run(who, setup.env(who), [str(setup.python), "-m", "nbgrader", "fetch_feedback", CHAPTER], who.pw_dir)
                assert list((Path(who.pw_dir) / CHAPTER / "feedback").rglob("*.html")), f"{name}: no feedback"
    finally:
        if hub is not None:
            hub.stop()
        for name in [TEACHER, *[f"course-bench-s{i:02d}" for i in range(1, args.students + 1)]]:
            unix_users.remove_user(name)
        shutil.rmtree(base, ignore_errors=True)

    n, m = args.students, args.project
    print(f"A class of {n} on the course's JupyterHub, {os.cpu_count()} cores; load average before "
          f"{load_before[0]:.1f}, after {os.getloadavg()[0]:.1f}")
    print(f"{'step':<78} {'seconds':>8} {'per student':>12}")
    for label, seconds, per in times:
        print(f"{label:<78} {seconds:8.1f} {seconds / n if per else float('nan'):12.2f}")
    print(f"memory per student's server (JupyterLab, no kernel running): median {sorted(rss)[len(rss) // 2]:.0f} MiB, "
          f"max {max(rss):.0f} MiB (resident, shared pages counted per process)")
    print(f"\nProjected for {m} students on this machine:")
    spawn = next(s for label, s, _ in times if "servers started" in label)
    print(f"  servers started together: {spawn / n * m:.0f} s if start-up is CPU-bound (it was {spawn:.0f} s for {n})")
    print(f"memory of a kernel's Python after importing ipykernel, torch and matplotlib: {kernel_mib:.0f} MiB (peak resident)")
    print(f"  memory of {m} idle servers: {sorted(rss)[len(rss) // 2] * m / 1024:.1f} GiB; with one kernel each "
          f"(torch imported): {(sorted(rss)[len(rss) // 2] + kernel_mib) * m / 1024:.1f} GiB")
    for label, seconds, per in times:
        if per:
            print(f"  {label}: {seconds / n * m:.0f} s")
    if rate:
        done, secs, jobs = map(int, rate.groups())
        print(f"  grade-class: {secs / done * m:.0f} s of grading at {jobs} job(s) "
              f"({done} graded in {secs} s here), plus its start-up")
    return 0


if __name__ == "__main__":
    sys.exit(main())
