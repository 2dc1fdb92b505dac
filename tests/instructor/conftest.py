"""Fixtures shared by the instructor tests: a PostgreSQL server for the gradebook."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest


def _pg_bin():
    for pattern in ("/usr/lib/postgresql/*/bin",):
        found = sorted(glob.glob(pattern))
        if found and os.path.exists(os.path.join(found[-1], "pg_ctl")):
            return found[-1]
    pg_ctl = shutil.which("pg_ctl")
    return os.path.dirname(pg_ctl) if pg_ctl else None


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres_url():
    bindir = _pg_bin()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql): cannot test a server gradebook")
    pytest.importorskip("psycopg2", reason="psycopg2-binary (requirements-dev.txt) is not installed")
    # Not under pytest's tmp_path: its parents are private to root, and the server may run
    # as another user. For the same reason, as root not under TMPDIR either (Slurm and
    # systemd's PrivateTmp make it a folder only root may enter): /tmp, which anyone may cross.
    data = Path(tempfile.mkdtemp(prefix="course-pg-", dir="/tmp" if os.geteuid() == 0 else None))
    run_as = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root: use its own system user
        if shutil.which("runuser") is None or subprocess.run(["id", "postgres"], capture_output=True).returncode:
            shutil.rmtree(data)
            pytest.skip("running as root without a 'postgres' user to start the server as")
        shutil.chown(data, "postgres")
        run_as = ["runuser", "-u", "postgres", "--"]
    port = _free_port()

    def pg(tool, *args, check=True):
        return subprocess.run(run_as + [os.path.join(bindir, tool), *args], capture_output=True, text=True,
                              check=check, timeout=120)

    try:
        pg("initdb", "-D", str(data / "db"), "-U", "postgres", "--auth=trust", "-E", "UTF8")
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"initdb failed: {exc.stdout}\n{exc.stderr}") from None
    pg("pg_ctl", "-D", str(data / "db"), "-l", str(data / "server.log"), "-w", "-t", "60", "start",
       "-o", f"-c listen_addresses=127.0.0.1 -p {port} -k {data}")
    try:
        pg("createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "gradebook")
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/gradebook"
    finally:
        pg("pg_ctl", "-D", str(data / "db"), "-m", "immediate", "stop", check=False)
        shutil.rmtree(data, ignore_errors=True)
