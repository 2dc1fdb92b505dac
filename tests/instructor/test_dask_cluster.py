"""Grading on many machines (issue 27): a real Dask cluster on this machine, a PostgreSQL
gradebook, and one worker killed in the middle of a submission.

The scheduler and two workers are started as separate processes by Dask's own command
(`dask scheduler`, `dask worker ... --preload coursetools.instructor.daskworker`, as on a
real cluster); each worker starts a test kernel before it joins. `grade-class --scheduler`
sends four submissions of chapter 02 as data. While a worker is grading one, it is killed
(SIGKILL, no nanny to restart it): the scheduler gives that submission to the other worker,
and every submission ends in the PostgreSQL gradebook once, with the grade it must get.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from coursetools import layout, notebooks
from coursetools.author import fixtures
from coursetools.author.nbgrader_course import NbgraderCourse
from coursetools.grading import sandbox

pytest.importorskip("distributed", reason="Dask distributed (requirements-dev.txt) is not installed")

A = "02_to_semantics"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """`dask scheduler` and `dask worker` processes, stopped by `stop()`."""

    def __init__(self, tmp_path, workers: int):
        self.address = f"tcp://127.0.0.1:{_port()}"
        self.env = {**layout.env_with_course_tools(), "PYTHONUNBUFFERED": "1"}
        if not sandbox.bwrap_works()[0]:
            self.env[sandbox.ALLOW_ROOT_ENV] = "1"
        dask = [os.path.join(os.path.dirname(sys.executable), "dask")]
        self.logs = []
        self.procs = {"scheduler": self._start(tmp_path, "scheduler", dask + [
            "scheduler", "--host", "127.0.0.1", "--port", self.address.rsplit(":", 1)[1], "--no-dashboard"])}
        for i in range(workers):
            self.procs[f"w{i}"] = self._start(tmp_path, f"w{i}", dask + [
                "worker", self.address, "--name", f"w{i}", "--nthreads", "1", "--no-nanny",
                "--no-dashboard", "--preload", "coursetools.instructor.daskworker"])

    def _start(self, tmp_path, name, cmd):
        log = open(tmp_path / f"{name}.log", "w")
        self.logs.append(tmp_path / f"{name}.log")
        return subprocess.Popen(cmd, cwd=layout.ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)

    def client(self):
        from distributed import Client
        return Client(self.address, timeout="60s")

    def tail(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in self.logs)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


# Two workers each start a test kernel (preload), four submissions of 02, one graded twice
# (its first worker is killed): about 2 minutes on the loaded 2-core machine.
@pytest.mark.timeout(1200, method="thread")
def test_a_dask_cluster_grades_into_postgresql_with_a_worker_killed(tmp_path, postgres_url):
    from nbgrader.api import Gradebook

    course = NbgraderCourse(tmp_path / "course", [A])
    wrong = fixtures.load(layout.SUBMISSIONS_DIR / A / "move_to_copy_true.toml")
    source = notebooks.read(layout.source_notebook(A))
    total = sum(notebooks.points(c) for c in notebooks.test_cells(source))
    submissions = {"ada": (fixtures.solved_release(A), total),
                   "bob": (fixtures.submission(wrong), sum(fixtures.expected_scores(wrong, source).values())),
                   "cy": (notebooks.read(layout.release_notebook(A)), 0),
                   "dee": (fixtures.solved_release(A), total)}
    for student, (nb, _) in submissions.items():
        course.submit(student, A, nb)
    cluster = Cluster(tmp_path, workers=2)
    grade = None
    try:
        client = cluster.client()
        client.wait_for_workers(2, timeout=300)  # each one passed its preflight (preload)
        grade = subprocess.Popen(
            [sys.executable, "-m", "coursetools.instructor.classroom", A, "--course", str(course.root),
             "--scheduler", cluster.address, "--db-url", postgres_url],
            cwd=layout.ROOT, env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        killed, victim_keys = None, []
        deadline = time.monotonic() + 600
        while killed is None and time.monotonic() < deadline and grade.poll() is None:
            processing = client.processing()
            busy = [(addr, keys) for addr, keys in processing.items() if keys]
            if busy:
                time.sleep(3)  # well into the submission: its kernel is running
                processing = client.processing()
                info = client.scheduler_info(n_workers=-1)["workers"]
                for addr, keys in processing.items():
                    if keys:
                        name = info[addr]["name"]
                        victim_keys = [str(k) for k in keys]
                        os.killpg(cluster.procs[name].pid, signal.SIGKILL)
                        killed = name
                        break
            time.sleep(0.2)
        assert killed, f"no worker was seen grading:\n{cluster.tail()}"
        out, err = grade.communicate(timeout=900)
        assert grade.returncode == 0, f"{out}\n{err[-3000:]}\n{cluster.tail()}"
        survivor = next(n for n in ("w0", "w1") if n != killed)
        assert cluster.procs[survivor].poll() is None, "the other worker must still run"
        with Gradebook(postgres_url) as gb:
            scores = {s: gb.find_submission_notebook(A, A, s).score for s in submissions}
            assert len(gb.assignment_submissions(A)) == len(submissions), "a submission counted twice"
        assert scores == {s: expected for s, (_, expected) in submissions.items()}
        regraded = [s for s in submissions if any(f"-{s}-" in k for k in victim_keys)]
        assert regraded, (victim_keys, out)
        assert f"{A}: 4 submission(s): 4 graded now" in out, out
        print(f"killed worker {killed} while it held {regraded} (one of them running); all 4 graded once, "
              f"those on the other worker; scores {scores}")
        client.close()
    finally:
        if grade is not None and grade.poll() is None:  # a failed assertion: leave no grade-class behind
            grade.kill()
            grade.communicate(timeout=60)
        cluster.stop()


def test_the_slurm_recipe_starts_workers_that_check_their_sandbox():
    """README's Slurm recipe (dask-jobqueue): each job starts single-threaded workers with the
    course's preload, from the course's folder and environment. Only the job script is built
    (no Slurm here); its scheduler starts on this machine and is closed again."""
    jobqueue = pytest.importorskip("dask_jobqueue", reason="dask-jobqueue (requirements-dev.txt) is not installed")
    cluster = jobqueue.SLURMCluster(
        cores=8, processes=8, memory="16GB", walltime="02:00:00",
        job_script_prologue=["cd /srv/course", "source .venv/bin/activate"],
        worker_extra_args=["--preload", "coursetools.instructor.daskworker"],
        scheduler_options={"dashboard_address": None})
    try:
        script = cluster.job_script()
    finally:
        cluster.close()
    assert "--nthreads 1" in script and "--nworkers 8" in script, script
    assert "--preload coursetools.instructor.daskworker" in script, script
    assert script.index("cd /srv/course") < script.index("dask_worker"), script


def test_the_kubernetes_manifest_starts_a_worker_that_joins(tmp_path):
    """deploy/kubernetes/grading-cluster.yaml (README's Kubernetes recipe): its worker
    container's args, run here as the Dask operator runs them (the scheduler's address in
    DASK_SCHEDULER_ADDRESS, $(DASK_WORKER_NAME) filled in), start a worker that passes the
    course's preload (one test kernel) and joins. No Kubernetes here: the pod spec itself
    is checked only for what grading needs of it."""
    import yaml

    spec = yaml.safe_load((layout.ROOT / "deploy" / "kubernetes" / "grading-cluster.yaml").read_text())
    assert spec["kind"] == "DaskCluster" and spec["apiVersion"].startswith("kubernetes.dask.org/")
    pod = spec["spec"]["worker"]["spec"]
    (worker,) = pod["containers"]
    assert pod["securityContext"]["seccompProfile"]["type"] == "Unconfined", "bubblewrap needs user namespaces"
    args = [a.replace("$(DASK_WORKER_NAME)", "k8s-w0") for a in worker["args"]]
    assert args[:2] == ["dask", "worker"] and args[args.index("--nthreads") + 1] == "1"
    service_port = spec["spec"]["scheduler"]["service"]["ports"][0]["port"]
    assert service_port == 8786
    cluster = Cluster(tmp_path, workers=0)
    log = open(tmp_path / "k8s-w0.log", "w")
    cluster.logs.append(tmp_path / "k8s-w0.log")
    cluster.procs["k8s-w0"] = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "dask"), *args[1:], "--no-dashboard"],
        cwd=layout.ROOT, env={**cluster.env, "DASK_SCHEDULER_ADDRESS": cluster.address},
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        with cluster.client() as client:
            client.wait_for_workers(1, timeout=300)
            names = [w["name"] for w in client.scheduler_info(n_workers=-1)["workers"].values()]
        assert names == ["k8s-w0"], names
        assert "grading preflight passed" in (tmp_path / "k8s-w0.log").read_text(), cluster.tail()
    finally:
        cluster.stop()


# A LocalCluster of one worker with a nanny (`--scheduler local`), and a recycling threshold every
# worker passes (1 MiB): after each submission grade-class asks the worker's nanny for a fresh
# process, as it does for a worker a hostile answer left holding memory. Two
# submissions of 02: about a minute and a half on the loaded 2-core machine.
@pytest.mark.timeout(900, method="thread")
def test_a_dask_worker_past_the_memory_threshold_is_restarted_between_submissions(tmp_path):
    from coursetools.instructor import gradejob

    course = NbgraderCourse(tmp_path / "course", [A])
    source = notebooks.read(layout.source_notebook(A))
    total = sum(notebooks.points(c) for c in notebooks.test_cells(source))
    course.submit("ada", A, fixtures.solved_release(A))
    course.submit("cy", A, notebooks.read(layout.release_notebook(A)))
    env = {**layout.env_with_course_tools(), gradejob.WORKER_RECYCLE_ENV: "1"}
    if not sandbox.bwrap_works()[0]:
        env[sandbox.ALLOW_ROOT_ENV] = "1"
    done = subprocess.run(
        [sys.executable, "-m", "coursetools.instructor.classroom", A, "--course", str(course.root),
         "--scheduler", "local", "--jobs", "1"],
        cwd=layout.ROOT, env=env, capture_output=True, text=True, timeout=800)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    logs = "".join(p.read_text(errors="replace") for p in course.root.rglob("grading.log"))
    replaced = [line for line in logs.splitlines() if " replaced: " in line]
    assert len(replaced) == 2 and all("more than 1 MiB" in line and "[OK]" in line for line in replaced), \
        logs[-3000:]
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{course.root / 'gradebook.db'}") as gb:
        scores = {s: gb.find_submission_notebook(A, A, s).score for s in ("ada", "cy")}
    assert scores == {"ada": total, "cy": 0}, scores
