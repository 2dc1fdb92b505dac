"""A class on JupyterHub as docs/INSTRUCTORS.md builds it, on loopback ports: the hub with the
course's recipe (deploy/jupyterhub/), real Unix users, a Python they may run, the shared
exchange, the instructor's course. Shared by tests/instructor/test_jupyterhub.py (the class
in Chromium) and benchmarks/hub_class.py (a larger class, timed). tests/ is on sys.path
(tests/conftest.py; the benchmark puts it there), so each imports it as `hub_support`."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

import unix_users
from course_copy import checkout_copy, free_port

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "deploy" / "jupyterhub"
COURSE_FOLDER = "pytorch-devices"   # deploy/jupyterhub/jupyterhub_config.py: COURSE_FOLDER
PASSWORD = "class-on-a-hub-test"  # SharedPasswordAuthenticator wants 8 characters or more
START_S = 180      # a hub and its proxy answered in ~3 s here; a server spawned in ~8-12 s


def require() -> None:
    if not unix_users.IS_ROOT:
        pytest.skip("the hub test makes Unix users and runs their servers as them: it needs root "
                    "(CI runs the suite as root)")
    pytest.importorskip("jupyterhub", reason="JupyterHub is not installed (requirements-dev.txt)")
    if shutil.which("configurable-http-proxy") is None:
        pytest.skip("configurable-http-proxy is not installed (npm install -g configurable-http-proxy; "
                    ".ci/run does)")
    for tool in ("useradd", "userdel", "runuser"):
        if shutil.which(tool) is None:
            pytest.skip(f"no {tool}: the hub test makes real users")


def wait_http(url: str, timeout_s: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status < 500:
                    return
        except Exception:
            time.sleep(0.5)
    pytest.fail(f"{what} did not answer at {url} in {timeout_s} s; log:\n{log.read_text(errors='replace')[-4000:]}")


class Hub:
    """The course's recipe, started as the guide says, on loopback ports; `stop()` stops the hub,
    its proxy and every server it spawned."""

    def __init__(self, base: Path, python: Path, share: str, exchange: Path, etc: Path, teacher: str,
                 students: list[str], extra_config: str = ""):
        self.dir = base / "hub"
        self.dir.mkdir()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = self.dir / "jupyterhub_config.py"
        env_for_servers = {
            "COURSE_EXCHANGE_ROOT": str(exchange),  # etc-jupyter/nbgrader_config.py: the exchange
            "JUPYTER_PATH": share,  # JupyterLab's application and extensions, as in a system-wide install
            "PATH": f"{python.parent}:/usr/local/bin:/usr/bin:/bin",
            "PYTHONNOUSERSITE": "1",
        }
        config.write_text(f"""
c = get_config()  # noqa: F821
load_subconfig({str(RECIPE / 'jupyterhub_config.py')!r})  # noqa: F821  (the course's recipe, unchanged)
# What a test must change: a shared password for PAM, its users, loopback ports, its folders.
c.JupyterHub.authenticator_class = "shared-password"
c.SharedPasswordAuthenticator.user_password = {PASSWORD!r}
c.Authenticator.allow_all = False
c.Authenticator.allowed_users = {set([teacher, *students])!r}
c.JupyterHub.load_groups = {{"instructors": {{"users": [{teacher!r}]}}}}
c.JupyterHub.bind_url = {self.url!r}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {free_port()}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{free_port()}"
c.JupyterHub.db_url = "sqlite:///{self.dir / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = {str(self.dir / 'cookie_secret')!r}
c.ConfigurableHTTPProxy.pid_file = {str(self.dir / 'proxy.pid')!r}
c.Spawner.cmd = [{str(python)!r}, "-m", "jupyterhub.singleuser"]
c.Spawner.environment = {env_for_servers!r}
c.Spawner.start_timeout = {START_S}
c.Spawner.http_timeout = {START_S}
{extra_config}
""")
        self.log_path = self.dir / "hub.log"
        self._log = open(self.log_path, "w")
        env = {**os.environ, "COURSE_ETC_JUPYTER": str(etc)}
        self.proc = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(config)], cwd=self.dir,
                                     env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_http(f"{self.url}/hub/api", START_S, "JupyterHub", self.log_path)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # the hub stops its servers and its proxy
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        self._log.close()


def server_env(who, python: Path, share: str, exchange: Path, etc: Path, teacher: bool) -> dict[str, str]:
    """The environment the hub gives a user's server (and so a terminal in it)."""
    config = [os.path.join(who.pw_dir, COURSE_FOLDER), str(etc / "instructor"), str(etc)] if teacher else [str(etc)]
    return {"HOME": who.pw_dir, "USER": who.pw_name, "SHELL": "/bin/bash", "LANG": "C.UTF-8",
            "PATH": f"{python.parent}:/usr/local/bin:/usr/bin:/bin", "PYTHONNOUSERSITE": "1",
            "JUPYTER_PATH": share, "JUPYTER_CONFIG_PATH": os.pathsep.join(config),
            "COURSE_EXCHANGE_ROOT": str(exchange), "JUPYTERHUB_USER": who.pw_name}


@dataclass
class ClassSetup:
    python: Path      # every user's Python (a system-wide environment, as /opt/... on a hub)
    share: str        # its share/jupyter (JupyterLab's application and extensions)
    exchange: Path    # nbgrader's shared exchange (/srv/nbgrader/exchange on a hub)
    etc: Path         # what the guide copies to /etc/jupyter
    course: Path      # the instructor's course (~/pytorch-devices)
    course_python: Path  # its .venv's Python

    def env(self, who, teacher: bool = False) -> dict[str, str]:
        python = self.course_python if teacher else self.python
        return server_env(who, python, self.share, self.exchange, self.etc, teacher)

    def start_hub(self, base: Path, teacher: str, students: list[str], extra_config: str = "") -> "Hub":
        return Hub(base, self.python, self.share, self.exchange, self.etc, teacher, students, extra_config)


def set_up_class(base: Path, teacher, some_student, db_url: str | None = None) -> ClassSetup:
    """Everything the guide's one-server recipe sets up, in `base` (a folder every user may
    cross) and the instructor's home: a Python for every user, the exchange (mode 1777), the
    global Jupyter config, and the instructor's course with its .venv, marked installed so that
    make.py runs no pip (make.layers)."""
    import make

    python = unix_users.venv(None, base / "opt-venv", base, interpreter_for=some_student)
    share = unix_users.jupyter_data(some_student, base)
    exchange = base / "exchange"
    exchange.mkdir()
    os.chmod(exchange, 0o1777)  # docs/INSTRUCTORS.md: every user may write, nbgrader does the rest
    etc = base / "etc-jupyter"
    shutil.copytree(RECIPE / "etc-jupyter", etc)  # as the guide copies it to /etc/jupyter
    course = Path(teacher.pw_dir) / COURSE_FOLDER
    checkout_copy(course)
    if db_url:
        with open(course / "nbgrader_config.py", "a") as f:
            f.write(f"\nc.CourseDirectory.db_url = {db_url!r}  # the class's PostgreSQL gradebook\n")
    unix_users.chown_tree(course, teacher)
    course_python = unix_users.venv(teacher, course / ".venv", base)
    for _, stamp, digest in make.layers(dev=False):  # installed: make.py runs no pip
        (course / ".venv" / stamp.name).write_text(digest)
    unix_users.chown_tree(course / ".venv", teacher)
    return ClassSetup(python, share, exchange, etc, course, course_python)
