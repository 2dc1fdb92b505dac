"""The course works where learners use it: JupyterLab, in a real browser.

JupyterLab is started the way `python3 make.py lab` starts it (same environment, no browser
of its own, here on a loopback port with a random token), over a scratch copy of course/ so
that nothing is saved into the repository. Debian's Chromium, driven by Playwright, opens
course/00_start_here.ipynb, runs every cell through the menu (Run > Run All Cells), and the
test reads what the page shows: every cell ran, the setup cell's device report and the
other outputs are there, and nothing was written to stderr or raised. Screenshots go to the
test's temporary folder and to test-artifacts/. Every process started is stopped, and the
test fails if JupyterLab leaves one behind.

Skipped, with a message, only where Chromium or the playwright package is missing
(`.ci/run` installs Chromium from Debian; requirements-dev.txt lists playwright).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from coursetools import layout, notebooks

ROOT = layout.ROOT
NOTEBOOK = "course/00_start_here.ipynb"
ARTIFACTS = ROOT / "test-artifacts"
# Chromium's own network use is switched off: the machines that run this have no network.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SERVER_START_S = 120   # JupyterLab answered in ~7-12 s on a 2-core machine
PAGE_LOAD_MS = 180_000
RUN_ALL_MS = 300_000   # the notebook runs in ~10 s; a busy CI machine may be much slower
STDERR_MIME = "application/vnd.jupyter.stderr"  # JupyterLab renders errors and stderr so


def find_chromium() -> str | None:
    for candidate in ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(candidate)
        if found:
            return found
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def lab_env(scratch: Path) -> dict[str, str]:
    """make.py's environment for `lab`, with Jupyter's per-user folders in `scratch` so the
    test neither reads a developer's settings nor writes into their home."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import make  # the repository's make.py (standard library only)
    env = make.jupyter_env()
    for var, sub in [("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_RUNTIME_DIR", "runtime"),
                     ("JUPYTERLAB_SETTINGS_DIR", "lab-settings"),
                     ("JUPYTERLAB_WORKSPACES_DIR", "lab-workspaces"), ("IPYTHONDIR", "ipython")]:
        (scratch / sub).mkdir(parents=True, exist_ok=True)
        env[var] = str(scratch / sub)
    # No "get Jupyter news?" toast over the screenshot, and no attempt to reach the network.
    settings = scratch / "lab-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    return env


class LabServer:
    """`jupyter lab --no-browser` on a free loopback port; always stopped by `stop()`."""

    def __init__(self, root_dir: Path, scratch: Path):
        self.port = free_port()
        self.token = secrets.token_hex(24)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = scratch / "jupyterlab.log"
        cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1",
               f"--port={self.port}", "--port-retries=0", f"--ServerApp.token={self.token}",
               f"--ServerApp.root_dir={root_dir}"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-root")  # CI containers run as root; Jupyter refuses it otherwise
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, cwd=root_dir, env=lab_env(scratch), stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.descendants: dict[int, str] = {}

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def wait_ready(self) -> None:
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"JupyterLab exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"{self.url}/api/status?token={self.token}", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        pytest.fail(f"JupyterLab did not answer within {SERVER_START_S} s:\n{self.log()}")

    def remember_processes(self) -> None:
        """Note the server's kernels (their own sessions: a process-group kill misses them)."""
        import psutil
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    self.descendants[child.pid] = " ".join(child.cmdline())[:200]

    def stop(self) -> list[str]:
        """Stop the server (it shuts its kernels down); kill whatever it left; return what
        had to be killed (empty when the shutdown was clean)."""
        import psutil
        self.remember_processes()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # Jupyter shuts its kernels down, then exits
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()
        leftovers = []
        deadline = time.monotonic() + 10
        for pid, cmdline in self.descendants.items():
            with contextlib.suppress(psutil.NoSuchProcess):
                proc = psutil.Process(pid)
                while proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE \
                        and time.monotonic() < deadline:
                    time.sleep(0.2)
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    leftovers.append(f"{pid} {cmdline}")
                    proc.kill()
        return leftovers


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server over a scratch copy of course/; stopped after the test."""
    served = tmp_path / "served"
    shutil.copytree(layout.COURSE_DIR, served / "course")
    server = LabServer(served, tmp_path)
    try:
        server.wait_ready()
        yield server
    finally:
        leftovers = server.stop()
    assert not leftovers, f"JupyterLab left processes running (killed now): {leftovers}"


@pytest.fixture
def chromium(tmp_path):
    """A headless Chromium page (Debian's browser, a fresh profile), closed after the test."""
    pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed "
                        "(pip install -r requirements-dev.txt)")
    from playwright.sync_api import sync_playwright
    executable = find_chromium()
    if executable is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium); "
                    "the JupyterLab browser test needs it")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=executable, headless=True,
            args=CHROMIUM_ARGS, viewport={"width": 1400, "height": 1000})
        try:
            yield context.pages[0] if context.pages else context.new_page()
        finally:
            context.close()


# Done: the kernel is idle and every code cell has its execution count, or a cell failed
# (JupyterLab then stops running the rest, so waiting for all counts would only time out).
# Never done while a dialog is open (it is answered first, see run_all_in_jupyterlab).
_RUN_FINISHED = f"""() => {{
  const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')]
      .map(e => e.textContent.trim());
  const indicator = document.querySelector('.jp-Notebook-ExecutionIndicator');
  if (document.querySelector('.jp-Dialog') !== null) return false;
  if (prompts.length === 0 || indicator === null || indicator.dataset.status !== 'idle') return false;
  if (prompts.some(t => t === '[*]:')) return false;
  const failed = document.querySelector('.jp-Notebook [data-mime-type="{STDERR_MIME}"]') !== null;
  return failed || prompts.every(t => /^\\[\\d+\\]:$/.test(t));
}}"""

# Idle, no dialog, nothing queued, no error, yet not every cell ran: a Run All that
# JupyterLab dropped (clicked while the page was still attaching to its kernel).
_STALLED = f"""() => {{
  const prompts = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputPrompt')]
      .map(e => e.textContent.trim());
  const indicator = document.querySelector('.jp-Notebook-ExecutionIndicator');
  return document.querySelector('.jp-Dialog') === null && indicator?.dataset.status === 'idle'
      && prompts.length > 0 && !prompts.some(t => t === '[*]:')
      && !prompts.every(t => /^\\[\\d+\\]:$/.test(t))
      && document.querySelector('.jp-Notebook [data-mime-type="{STDERR_MIME}"]') === null;
}}"""


def screenshot(page, tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    page.screenshot(path=str(path))
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy2(path, ARTIFACTS / name)
    return path


def wait_for_kernel(lab: LabServer, relpath: str) -> None:
    """Until the server has started the notebook's kernel and it has answered (idle)."""
    deadline = time.monotonic() + PAGE_LOAD_MS / 1000
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{lab.url}/api/sessions?token={lab.token}", timeout=10) as r:
            sessions = json.load(r)
        if any(s.get("path", "").endswith(relpath) and (s.get("kernel") or {}).get("execution_state") == "idle"
               for s in sessions):
            return
        time.sleep(0.5)
    pytest.fail(f"JupyterLab started no kernel for {relpath} within {PAGE_LOAD_MS // 1000} s:\n{lab.log()}")


def run_all_cells(page) -> None:
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()


def run_all_in_jupyterlab(page, lab: LabServer, relpath: str, tmp_path: Path) -> dict:
    """Open `relpath` in JupyterLab, run all cells from the menu, return what the page shows."""
    page.set_default_timeout(60_000)
    page.goto(f"{lab.url}/lab/tree/{relpath}?token={lab.token}", timeout=PAGE_LOAD_MS)
    page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=PAGE_LOAD_MS)
    wait_for_kernel(lab, relpath)
    page.wait_for_function(
        "() => document.querySelector('.jp-Notebook-ExecutionIndicator')?.dataset.status === 'idle'",
        timeout=PAGE_LOAD_MS)
    lab.remember_processes()
    run_all_cells(page)
    started = last_click = time.perf_counter()
    deadline = started + RUN_ALL_MS / 1000
    retries: list[str] = []
    while not page.evaluate(_RUN_FINISHED):
        now = time.perf_counter()
        dialog = page.locator(".jp-Dialog")
        if dialog.count():
            # "Select Kernel" (the page had no kernel yet) or "Restart Kernel?" (asked by the
            # retry below): a learner accepts, and so does the test. Anything else fails.
            text = " ".join(dialog.first.inner_text().split())
            if not text.startswith(("Select Kernel", "Restart Kernel")):
                shot = screenshot(page, tmp_path, "jupyterlab-dialog.png")
                pytest.fail(f"JupyterLab asked: {text!r} (screenshot {shot})")
            page.locator(".jp-Dialog .jp-mod-accept").first.click()
            retries.append(f"accepted {text[:60]!r}")
            last_click = now
        elif page.evaluate(_STALLED) and now - last_click > 10 and len(retries) < 4:
            # Run All clicked while the page was still attaching to its kernel runs the
            # first cell or none, then stops. Start over as a learner would.
            wait_for_kernel(lab, relpath)
            page.get_by_role("menuitem", name="Kernel", exact=True).click()
            page.get_by_role("menuitem", name=re.compile(r"^Restart Kernel and Run All Cells")).click()
            retries.append("the run stalled: Kernel > Restart Kernel and Run All Cells")
            last_click = time.perf_counter()
        if now > deadline:
            shot = screenshot(page, tmp_path, "jupyterlab-timeout.png")
            pytest.fail(f"the cells did not all finish within {RUN_ALL_MS // 1000} s (screenshot {shot}; "
                        f"{retries})\n{lab.log()}")
        time.sleep(0.5)
    seconds = time.perf_counter() - started
    cells = page.evaluate("""() => [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')].map(c => ({
        prompt: c.querySelector('.jp-InputPrompt')?.textContent.trim() ?? '',
        outputs: [...c.querySelectorAll('.jp-OutputArea-output')].map(o => ({
            mime: o.dataset.mimeType ?? '', text: o.textContent }))
    }))""")
    stem = Path(relpath).stem
    page.locator(".jp-Notebook .jp-CodeCell").first.scroll_into_view_if_needed()
    top = screenshot(page, tmp_path, f"jupyterlab-{stem}-top.png")
    page.locator(".jp-Notebook .jp-CodeCell").last.scroll_into_view_if_needed()
    bottom = screenshot(page, tmp_path, f"jupyterlab-{stem}-bottom.png")
    return {"cells": cells, "seconds": seconds, "screenshots": [top, bottom], "retries": retries}


def test_start_here_runs_in_jupyterlab_in_a_browser(chromium, lab, tmp_path):
    # (chromium first: where there is no browser the test skips before starting a server)
    import torch

    before = hashlib.sha256((ROOT / NOTEBOOK).read_bytes()).hexdigest()
    shown = run_all_in_jupyterlab(chromium, lab, NOTEBOOK, tmp_path)
    cells = shown["cells"]
    expected_code = [c for c in notebooks.read(ROOT / NOTEBOOK).cells if c.cell_type == "code"]
    where = f"(screenshots: {', '.join(map(str, shown['screenshots']))})"

    failures = [f"code cell {i}: {o['text'][:800]}" for i, c in enumerate(cells) for o in c["outputs"]
                if o["mime"] == STDERR_MIME]
    assert not failures, "a cell raised or wrote to stderr in JupyterLab:\n" + "\n".join(failures) + f"\n{where}"
    assert len(cells) == len(expected_code), f"JupyterLab shows {len(cells)} code cells, the notebook has {len(expected_code)}"
    prompts = [c["prompt"] for c in cells]
    assert prompts == [f"[{n}]:" for n in range(1, len(cells) + 1)], f"cells did not each run once, in order: {prompts} {where}"
    for i, (cell, source) in enumerate(zip(cells, expected_code)):
        if "print(" in source.source:
            assert any(o["text"].strip() for o in cell["outputs"]), f"code cell {i} prints, but shows no output {where}"

    setup = " ".join(o["text"] for o in cells[0]["outputs"])
    assert f"PyTorch {torch.__version__} | device: " in setup, f"the setup cell's report is missing: {setup!r} {where}"
    device = setup.split("device: ", 1)[1].split()[0]
    if device == "cpu":
        assert "Runtime > Change runtime type > T4 GPU" in setup, "the setup cell must tell a CPU user how to get a GPU"
    everything = "\n".join(o["text"] for c in cells for o in c["outputs"])
    assert f"torch       {torch.__version__}" in everything and f"chosen      {device}" in everything, (
        f"the device report (section 2) is not shown {where}")
    assert hashlib.sha256((ROOT / NOTEBOOK).read_bytes()).hexdigest() == before, (
        "the repository's notebook changed: the browser test must work on a copy")
    print(f"JupyterLab ran {NOTEBOOK} in {shown['seconds']:.1f} s; retries: {shown['retries'] or 'none'}; {where}")
