"""What keeps grade-class safe to stop and start again (coursetools/instructor/runguard.py),
without grading: the course lock, and stopping every process below grade-class."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from coursetools import layout
from coursetools.instructor import runguard


def test_a_second_holder_is_refused_with_the_first_ones_pid(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from coursetools.instructor import runguard
            runguard.CourseLock({str(tmp_path)!r}).acquire("grade-class (test)")
            print("held", flush=True)
            time.sleep(60)
        """)], env=layout.env_with_course_tools(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(runguard.LockHeld) as refused:
            runguard.CourseLock(tmp_path).acquire("grade-class (second)")
        assert f"pid {holder.pid}" in str(refused.value) and "grade-class (test)" in str(refused.value)
    finally:
        holder.kill()
        holder.wait()
    # The holder is gone (killed, no clean-up): its lock file is still there, and is taken over.
    assert json.loads((tmp_path / runguard.LOCK_NAME).read_text())["pid"] == holder.pid
    lock = runguard.CourseLock(tmp_path).acquire("grade-class (third)")
    try:
        assert lock.took_over["pid"] == holder.pid
        assert json.loads((tmp_path / runguard.LOCK_NAME).read_text())["pid"] == os.getpid()
    finally:
        lock.release()


# A parent that starts a child in a session of its own (as Jupyter starts a kernel), which
# starts a grandchild; the parent is then killed, so the child is an orphan. As a subreaper,
# the script still finds and stops both.
SCRIPT = textwrap.dedent("""
    import json, os, subprocess, sys, time
    from coursetools.instructor import runguard
    assert runguard.become_subreaper()
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    spawner = ("import subprocess, sys, time; "
               f"subprocess.Popen({sleeper!r}, start_new_session=True); "
               f"subprocess.Popen({sleeper!r}); time.sleep(120)")
    parent = subprocess.Popen([sys.executable, "-c", spawner])
    runguard.spawned(parent.pid)
    for _ in range(100):
        if len(runguard.descendants()) >= 3:
            break
        time.sleep(0.1)
    before = runguard.descendants()
    os.kill(parent.pid, 9)
    parent.wait()
    runguard.waited(parent.pid)
    time.sleep(0.5)
    orphans = runguard.descendants()
    stopped = runguard.stop_descendants(grace_s=2)
    print(json.dumps({"before": before, "orphans": orphans, "stopped": stopped,
                      "after": [p for p in runguard.descendants() if runguard._alive(p)]}))
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="child subreapers are a Linux feature")
def test_orphans_in_their_own_sessions_are_found_and_stopped():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=layout.env_with_course_tools(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert len(report["before"]) == 3, report
    assert len(report["orphans"]) == 2, f"the orphans were not re-parented to the subreaper: {report}"
    assert sorted(report["stopped"]) == sorted(report["orphans"]) and report["after"] == [], report
    for pid in report["orphans"]:
        assert not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1][:3]


def test_signals_are_noted_not_fatal():
    import signal

    calls = []
    with runguard.StopSignals(lambda: calls.append("stop")) as stop:
        os.kill(os.getpid(), signal.SIGHUP)
        deadline = time.monotonic() + 5
        while not stop.requested and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(0.05)
    assert stop.name == "SIGHUP" and stop.exit_status == 128 + signal.SIGHUP
    assert calls == ["stop"], "the processes are stopped once"
