"""Warm kernels (coursetools/grading/warm.py): forked from a zygote, never shared.

A hostile notebook runs in a warm kernel and leaves behind what it can: files in /tmp,
/dev/shm, its working folder and the connection folder, an environment variable, a patched
module, a thread, a process that left its process group, a listening abstract socket, a
System V message queue. The next notebook, forked from the same zygote, must see none of
it, and must print exactly what it prints in a cold kernel. A kernel that kills or stops
its zygote only makes the next kernel cold.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest
from nbformat import v4

from coursetools.grading import sandbox, warm
from coursetools.grading.execute import Outcome, execute_resilient

OK, WHY = sandbox.bwrap_works()
SANDBOXED = pytest.param("bwrap", marks=pytest.mark.skipif(not OK, reason=f"no working bubblewrap: {WHY}"))


def hostile(MARK: str) -> list[str]:
    return [f"""
import os, sys, socket, threading, subprocess, builtins, json, torch
for folder in ("/tmp", "/dev/shm", os.getcwd(), os.path.dirname(__import__('ipykernel').get_connection_file())):
    try:
        open(os.path.join(folder, "{MARK}"), "w").write("left behind")
    except OSError as exc:
        print("could not write", folder, exc)
os.environ["{MARK}"] = "1"
torch.randn = lambda *a, **k: "patched"
builtins.{MARK.replace('-', '_')} = True
threading.Thread(target=__import__('time').sleep, args=(600,), name="{MARK}", daemon=True).start()
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "{MARK}"], start_new_session=True)
listener = socket.socket(socket.AF_UNIX); listener.bind("\\0{MARK}"); listener.listen()
print("ppid", os.getppid())
"""]


def probe(MARK: str) -> str:
    return f"""
import os, sys, socket, threading, builtins, json, torch
def visible_processes():
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if b"{MARK}" in open(f"/proc/{{pid}}/cmdline", "rb").read():
                    found.append(pid)
            except OSError:
                pass
    return found
probe = socket.socket(socket.AF_UNIX)
try:
    probe.connect("\\0{MARK}")
    abstract = "reachable"
except OSError:
    abstract = "unreachable"
report = {{
    "files": sorted(f for f in ("/tmp", "/dev/shm", os.getcwd()) if os.path.exists(os.path.join(f, "{MARK}"))),
    "env": os.environ.get("{MARK}"),
    "randn": type(torch.randn(2)).__name__,
    "builtin": hasattr(builtins, "{MARK.replace('-', '_')}"),
    "threads": [t.name for t in threading.enumerate() if t.name == "{MARK}"],
    "abstract": abstract,
    "cwd_files": sorted(os.listdir(".")),
}}
print(json.dumps(report, sort_keys=True))
"""


def run(cells: list[str], mode: str, scratch: str, *, warm_on: bool = True, monkeypatch=None):
    config = sandbox.SandboxConfig(mode=mode)
    nb = v4.new_notebook(cells=[v4.new_code_cell(c) for c in cells])
    env = sandbox.sandbox_env(config) if mode != "off" else None
    if monkeypatch is not None:
        monkeypatch.setenv(warm.ENV, "1" if warm_on else "0")
    manager = warm.kernel_manager_for(config, scratch)
    report = execute_resilient(nb, cwd=scratch, timeout=120, guarded=False, env=env,
                               client_kwargs={"kernel_manager_class": manager})
    return nb, report


def _text(nb, index: int) -> str:
    return "".join(o.get("text", "") for o in nb.cells[index].outputs if o.output_type == "stream")


@pytest.fixture
def scratch():
    """A new working folder per notebook run, as grading makes one per submission."""
    made = []

    def new() -> str:
        folder = tempfile.mkdtemp(prefix="grading-")
        with open(os.path.join(folder, "shipped.txt"), "w") as f:
            f.write("data the assignment ships")
        made.append(folder)
        return folder

    yield new
    for folder in made:
        subprocess.run(["rm", "-rf", folder], check=False)


def _zygotes(mode):
    config = sandbox.SandboxConfig(mode=mode)
    return [z for z in warm.POOL._all if z.config == config and z.alive()]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", [SANDBOXED, "off", pytest.param("bwrap-no-cgroup", marks=SANDBOXED.marks)])
def test_a_hostile_kernel_leaves_nothing_for_the_next(mode, scratch, monkeypatch):
    if mode == "bwrap-no-cgroup":
        # No cgroup to kill the leftovers with (a machine without a writable hierarchy): the
        # zygote kills whatever its last kernel left in the sandbox's pid namespace.
        monkeypatch.setattr(sandbox, "cgroup_kind", lambda: "")
        mode = "bwrap"
    mark = f"course-warm-leak-{mode}-{os.getpid()}"  # this test's own (tests run in parallel)
    try:
        _hostile_then_probe(mode, scratch, monkeypatch, mark)
    finally:  # without the sandbox, a process that left its session outlives its kernel
        subprocess.run(["pkill", "-9", "-f", mark], check=False)


def _hostile_then_probe(mode, scratch, monkeypatch, mark):
    nb, report = run(hostile(mark), mode, scratch(), monkeypatch=monkeypatch)
    assert report.outcomes == [Outcome.OK], nb.cells[0].outputs
    zygotes = _zygotes(mode)
    assert len(zygotes) == 1, "the hostile notebook did not run in a warm kernel"
    forks = zygotes[0].forks
    after, _ = run([probe(mark)], mode, scratch(), monkeypatch=monkeypatch)
    assert zygotes[0].forks == forks + 1, "the probe did not run in a kernel of the same zygote"
    seen = json.loads(_text(after, 0))
    cold, _ = run([probe(mark)], mode, scratch(), warm_on=False, monkeypatch=monkeypatch)
    assert seen == json.loads(_text(cold, 0)), f"warm {seen} != cold {_text(cold, 0)}"
    assert seen["env"] is None and seen["randn"] == "Tensor", seen
    assert not seen["builtin"] and seen["threads"] == [] and seen["cwd_files"] == ["shipped.txt"], seen
    if mode == "bwrap":
        # Its own /tmp, /dev/shm and working folder (without the sandbox, a cold kernel shares
        # the grader's /tmp too: nothing to compare).
        assert seen["files"] == [], seen
        # Its own network namespace: the abstract socket left listening is not there.
        assert seen["abstract"] == "unreachable", seen
        # The hostile kernel's cgroup (and its escaped `sleep`) were killed with it.
        leftover = subprocess.run(["pgrep", "-f", mark], capture_output=True, text=True).stdout.split()
        assert leftover == [], f"processes left by the hostile kernel: {leftover}"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", [SANDBOXED, "off"])
@pytest.mark.parametrize("attack", ["SIGKILL", "SIGSTOP"])
def test_a_kernel_that_attacks_its_zygote_only_makes_the_next_one_cold(mode, attack, scratch, monkeypatch):
    kill = f"import os, signal; os.kill(os.getppid(), signal.{attack}); print('sent')"
    nb, report = run([kill], mode, scratch(), monkeypatch=monkeypatch)
    assert report.outcomes == [Outcome.OK] and "sent" in _text(nb, 0), nb.cells[0].outputs
    cells = ["import torch; print(torch.arange(6).sum().item(), sorted(__import__('os').listdir('.')))"]
    after, report = run(cells, mode, scratch(), monkeypatch=monkeypatch)
    assert report.outcomes == [Outcome.OK], after.cells[0].outputs
    assert _text(after, 0) == "15 ['shipped.txt']\n"


@pytest.mark.timeout(300)
def test_the_zygote_forks_with_one_thread_after_importing_torch():
    """Fork safety: after the zygote's imports (PyTorch's intra-op pool untouched) it has one
    thread, and a forked child computes with PyTorch's and NumPy's thread pools."""
    zygote = warm.Zygote(None)
    try:
        assert zygote.ready["threads"] == 1, zygote.ready
        assert zygote.request({"op": "ping"})["threads"] == 1
    finally:
        zygote.close()
    code = textwrap.dedent("""
        import os, torch, numpy
        pid = os.fork()
        if pid == 0:
            torch.set_num_threads(2)
            torch.manual_seed(0)
            a = torch.randn(256, 256)
            b = numpy.random.default_rng(0).random((256, 256))
            # Two float32 BLAS libraries agree to rounding, not to allclose's default atol of 1e-8
            # (an element near zero of a 256-term sum differs by ~1e-5): that failed once in CI.
            ok = torch.allclose(a @ a, torch.from_numpy(a.numpy() @ a.numpy()), rtol=1e-4, atol=1e-3)
            ok = ok and numpy.allclose(b @ b, numpy.einsum("ij,jk->ik", b, b))
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        raise SystemExit(os.waitstatus_to_exitcode(status))
    """)
    assert subprocess.run([sys.executable, "-c", code], timeout=240).returncode == 0


@pytest.mark.timeout(300)
@pytest.mark.skipif(not OK, reason=f"no working bubblewrap: {WHY}")
def test_a_warm_kernel_has_no_capabilities_and_sees_no_zygote_folders(scratch, monkeypatch):
    code = textwrap.dedent("""
        import os, json
        status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
        print(json.dumps({k: status[k].strip() for k in ("CapEff", "CapPrm", "CapBnd", "CapAmb", "NoNewPrivs")}))
        print(json.dumps({n: sorted(os.listdir("/tmp/" + n)) if n.startswith("course-") else None
                          for n in os.listdir("/tmp")}))
        try:
            os.unshare(os.CLONE_NEWNS)
            print("unshare worked")
        except (OSError, AttributeError) as exc:
            print("unshare refused")
        fs = os.statvfs(os.path.dirname(__import__("ipykernel").get_connection_file()))
        print(fs.f_blocks * fs.f_frsize)
    """)
    nb, report = run([code], "bwrap", scratch(), monkeypatch=monkeypatch)
    lines = _text(nb, 0).splitlines()
    caps = json.loads(lines[0])
    assert caps == {"CapEff": "0000000000000000", "CapPrm": "0000000000000000", "CapBnd": "0000000000000000",
                    "CapAmb": "0000000000000000", "NoNewPrivs": "1"}, caps
    listed = json.loads(lines[1])
    # /tmp is its own: of the zygote's folders, only its own connection folder is there.
    assert not [n for n in listed if n.startswith("course-spool-")], listed
    runtimes = [n for n in listed if n.startswith("course-zygote-")]
    assert len(runtimes) == 1 and len(listed[runtimes[0]]) == 1, listed
    assert lines[2] == "unshare refused"
    if sandbox.can_mount_tmpfs():
        # Its connection folder is on the grader's small tmpfs: it cannot fill the disk.
        assert int(lines[3]) <= warm.RUNTIME_TMPFS_MB * 2**20, lines[3]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", [SANDBOXED, "off"])
def test_no_command_line_a_warm_kernel_reads_names_a_host_path(mode, scratch, monkeypatch):
    """Every command line a warm kernel can read (pid 1's, bwrap's, its own: a fork of the
    zygote's) names no host path: not the zygote's folders under the grader's TMPDIR, not the
    venv. Before, pid 1's and the kernel's own named the interpreter and
    <TMPDIR>/course-zygote-*/zygote.py; the command now reaches the zygote over its stdin, and
    the zygote blanks its own command line."""
    code = textwrap.dedent("""
        import os, json
        seen = {}
        for pid in ["self", *[p for p in os.listdir("/proc") if p.isdigit()]]:
            try:
                seen[pid] = open(f"/proc/{pid}/cmdline", "rb").read().decode("utf-8", "replace")
            except OSError:
                pass
        print(json.dumps(seen))
    """)
    nb, report = run([code], "bwrap" if mode != "off" else "off", scratch(), monkeypatch=monkeypatch)
    assert report.outcomes == [Outcome.OK], nb.cells[0].outputs
    seen = json.loads(_text(nb, 0).splitlines()[0])
    zygotes = _zygotes("bwrap" if mode != "off" else "off")
    assert zygotes, "no warm zygote ran"
    host = {sys.prefix, os.path.realpath(sys.prefix), os.path.realpath(sys.executable),
            os.path.dirname(sys.executable), "course-zygote-", "course-spool-"}
    for z in zygotes:
        host |= {z.runtime, z.spool, os.path.realpath(z.runtime)}
    if mode == "off":  # no pid namespace: the other processes are the machine's, not the sandbox's
        seen = {"self": seen["self"]}
    named = {pid: [h for h in host if h in line] for pid, line in seen.items()}
    assert not any(named.values()), {pid: (named[pid], seen[pid][:300]) for pid in named if named[pid]}
    assert seen["self"].split("\0")[0] == "course-zygote", seen["self"][:200]
    if mode != "off":
        assert "1" in seen and seen["1"], seen
