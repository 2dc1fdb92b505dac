"""The learner's path in JupyterLab, in a real browser, started exactly as `make.py lab`.

Each test copies the repository as a fresh clone has it (every tracked and untracked,
not-ignored file, committed in a scratch git repository) and starts JupyterLab through
`coursetools.learner.lab.command`, the function `python3 make.py lab` runs, adding only a loopback
port, a random token, scratch per-user folders and a "browser" that records the address the
server asks it to open. Debian's Chromium, driven by Playwright, then opens that address:

* learner mode: course/00_start_here.ipynb opens in the work folder, runs from the menu
  (Run > Run All Cells) and shows its outputs; its link leads to lesson 01, whose "Next:
  the exercise" link opens the exercise; the reference answer to question 1 is typed in and
  the exercise run: the graded test cells of question 1 pass and the run stops at the next
  unanswered question. nbgrader's instructor panels and the news pop-up are absent. After
  JupyterLab's autosave interval (the value the server really uses), the learner's copies
  hold the outputs and the answer, and `git status --porcelain` of the checkout is empty.
* instructor mode: Nbgrader > Formgrader lists every assignment; an assignment's name and
  its Preview link open its folders in JupyterLab's file browser.

Screenshots go to test-artifacts/. Every process started is stopped, and a test fails if
JupyterLab leaves one behind. Skipped, with a message, only where Chromium or the playwright
package is missing (`.ci/run` installs Chromium from Debian; requirements-dev.txt lists
playwright).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from coursetools.author import fixtures
from coursetools.learner import lab
from coursetools import layout, notebooks

from browser_support import chromium_page, corner_pixel, screenshot_around  # tests/ is on sys.path (tests/conftest.py)
from course_copy import checkout_copy, free_port, git

ROOT = layout.ROOT
NOTEBOOK = lab.FIRST_NOTEBOOK
ARTIFACTS = ROOT / "test-artifacts"
SERVER_START_S = 120   # JupyterLab answered in ~7-12 s on a 2-core machine
PAGE_LOAD_MS = 180_000
RUN_ALL_MS = 300_000   # the notebook runs in ~10 s; a busy CI machine may be much slower
AUTOSAVE_S = 10        # the test's autosave interval (JupyterLab's default is 120 s)
STDERR_MIME = "application/vnd.jupyter.stderr"  # JupyterLab renders errors and stderr so
CHAPTER = "01_device_basics"


def scratch_env(scratch: Path, autosave_s: int | None) -> dict[str, str]:
    """Jupyter's per-user folders in `scratch`, so the test neither reads a developer's
    settings nor writes into their home; optionally a shorter autosave interval, set with the
    same mechanism the course uses (a labconfig/default_setting_overrides.json)."""
    env = {}
    for var, sub in [("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_RUNTIME_DIR", "runtime"),
                     ("JUPYTERLAB_SETTINGS_DIR", "lab-settings"),
                     ("JUPYTERLAB_WORKSPACES_DIR", "lab-workspaces"), ("IPYTHONDIR", "ipython")]:
        (scratch / sub).mkdir(parents=True, exist_ok=True)
        env[var] = str(scratch / sub)
    if autosave_s is not None:
        (scratch / "config" / "labconfig").mkdir(parents=True, exist_ok=True)
        (scratch / "config" / "labconfig" / "default_setting_overrides.json").write_text(json.dumps(
            {"@jupyterlab/docmanager-extension:plugin": {"autosaveInterval": autosave_s}}))
    return env


class LabServer:
    """`make.py lab`'s server (coursetools.learner.lab.command) on a free loopback port; a recording
    "browser" keeps the address it asks to open. Always stopped by `stop()`."""

    def __init__(self, root: Path, scratch: Path, *, instructor: bool = False, student: str | None = None,
                 autosave_s: int | None = None):
        self.port = free_port()
        self.token = secrets.token_hex(24)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = scratch / "jupyterlab.log"
        self.opened = scratch / "browser-opened.txt"
        recorder = scratch / "record_browser.py"
        recorder.write_text("import pathlib, sys\npathlib.Path(sys.argv[1]).write_text(sys.argv[2])\n")
        extra = ["--ip=127.0.0.1", f"--port={self.port}", "--port-retries=0",
                 f"--ServerApp.token={self.token}",
                 f"--ServerApp.browser={sys.executable} {recorder} {self.opened} %s"]
        self.started = time.perf_counter()
        self.cmd = lab.command(root, instructor=instructor, student=student, extra_args=extra)
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd.argv, cwd=self.cmd.cwd,
                                     env={**self.cmd.env, **scratch_env(scratch, autosave_s)},
                                     stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        self.descendants: dict[int, str] = {}

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def wait_ready(self) -> str:
        """Until the server answers and has asked the browser to open its page; that address."""
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"JupyterLab exited with {self.proc.returncode}:\n{self.log()}")
            if self.opened.exists() and self.opened.read_text():
                return self.opened.read_text()
            time.sleep(0.3)
        pytest.fail(f"JupyterLab did not open a browser within {SERVER_START_S} s:\n{self.log()}")

    def api(self, path: str):
        with urllib.request.urlopen(f"{self.url}{path}?token={self.token}", timeout=10) as r:
            return json.load(r)

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
def server_factory(tmp_path):
    """Start `make.py lab`'s server over a fresh checkout copy; stopped after the test."""
    started: list[LabServer] = []

    def start(checkout: Path | None = None, **kw) -> LabServer:
        """A server over a fresh checkout copy, or over `checkout` (several servers of one class)."""
        checkout = checkout or checkout_copy(tmp_path / "checkout")
        scratch = tmp_path / f"scratch-{len(started)}" if started else tmp_path / "scratch"
        scratch.mkdir()
        server = LabServer(checkout, scratch, **kw)
        server.checkout = checkout
        started.append(server)
        return server

    yield start
    leftovers = [p for server in started for p in server.stop()]
    assert not leftovers, f"JupyterLab left processes running (killed now): {leftovers}"


@pytest.fixture
def chromium(tmp_path):
    """A headless Chromium page (Debian's browser, a fresh profile), closed after the test."""
    with chromium_page(tmp_path / "chromium-profile", "the JupyterLab browser test") as page:
        yield page


# The notebook the learner is working in: the last one opened (tabs' panels are added in
# the order they are opened; nothing else is open in a fresh workspace).
_PANEL = "[...document.querySelectorAll('.jp-NotebookPanel')].at(-1)"

# Done: the kernel is idle and every code cell has its execution count, or a cell failed
# (JupyterLab then stops running the rest, so waiting for all counts would only time out).
# A cell shown collapsed (a lesson's drawing helpers, an exercise's helpers) has a placeholder
# without a count: only the prompts of shown inputs are read (the cells after a collapsed one
# fail if it did not run).
# Never done while a dialog is open (it is answered first, see run_all).
_RUN_FINISHED = f"""() => {{
  const panel = {_PANEL};
  if (!panel || document.querySelector('.jp-Dialog') !== null) return false;
  const prompts = [...panel.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')].map(e => e.textContent.trim());
  const indicator = panel.querySelector('.jp-Notebook-ExecutionIndicator');
  if (prompts.length === 0 || indicator === null || indicator.dataset.status !== 'idle') return false;
  if (prompts.some(t => t === '[*]:')) return false;
  const failed = panel.querySelector('[data-mime-type="{STDERR_MIME}"]') !== null;
  return failed || prompts.every(t => /^\\[\\d+\\]:$/.test(t));
}}"""

# Idle, no dialog, nothing queued, no error, yet not every cell ran: a Run All that
# JupyterLab dropped (clicked while the page was still attaching to its kernel).
_STALLED = f"""() => {{
  const panel = {_PANEL};
  if (!panel) return false;
  const prompts = [...panel.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')].map(e => e.textContent.trim());
  const indicator = panel.querySelector('.jp-Notebook-ExecutionIndicator');
  return document.querySelector('.jp-Dialog') === null && indicator?.dataset.status === 'idle'
      && prompts.length > 0 && !prompts.some(t => t === '[*]:')
      && !prompts.every(t => /^\\[\\d+\\]:$/.test(t))
      && panel.querySelector('[data-mime-type="{STDERR_MIME}"]') === null;
}}"""

_CELLS = f"""() => [...{_PANEL}.querySelectorAll('.jp-CodeCell')].map(c => ({{
    prompt: c.querySelector('.jp-InputPrompt')?.textContent.trim() ?? '',
    outputs: [...c.querySelectorAll('.jp-OutputArea-output')].map(o => ({{
        mime: o.dataset.mimeType ?? '', text: o.textContent }}))
}}))"""


def screenshot(page, tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    page.screenshot(path=str(path))
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy2(path, ARTIFACTS / name)
    return path


def current_tab(page) -> str:
    return page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel").first.inner_text()


def wait_for_notebook(page, server: LabServer, relpath: str) -> None:
    """Until the notebook `relpath` (from the served folder) is the current tab, rendered,
    and its kernel has started and is idle."""
    name = Path(relpath).name
    page.wait_for_function(f"""() => {{
        const tab = document.querySelector('.lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel');
        const panel = {_PANEL};
        return tab?.textContent === {json.dumps(name)} && panel?.querySelector('.jp-CodeCell') != null
            && panel.querySelector('.jp-Notebook-ExecutionIndicator')?.dataset.status === 'idle';
    }}""", timeout=PAGE_LOAD_MS)
    deadline = time.monotonic() + PAGE_LOAD_MS / 1000
    while time.monotonic() < deadline:
        if any(s.get("path", "") == relpath and (s.get("kernel") or {}).get("execution_state") == "idle"
               for s in server.api("/api/sessions")):
            server.remember_processes()
            return
        time.sleep(0.5)
    pytest.fail(f"JupyterLab started no kernel for {relpath} within {PAGE_LOAD_MS // 1000} s:\n{server.log()}")


def run_all(page, server: LabServer, relpath: str, tmp_path: Path) -> dict:
    """Run > Run All Cells in the current notebook; what the page then shows."""
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
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
            wait_for_notebook(page, server, relpath)
            page.get_by_role("menuitem", name="Kernel", exact=True).click()
            page.get_by_role("menuitem", name=re.compile(r"^Restart Kernel and Run All Cells")).click()
            retries.append("the run stalled: Kernel > Restart Kernel and Run All Cells")
            last_click = time.perf_counter()
        if now > deadline:
            shot = screenshot(page, tmp_path, "jupyterlab-timeout.png")
            pytest.fail(f"the cells did not all finish within {RUN_ALL_MS // 1000} s (screenshot {shot}; "
                        f"{retries})\n{server.log()}")
        time.sleep(0.5)
    return {"cells": page.evaluate(_CELLS), "seconds": time.perf_counter() - started, "retries": retries}


def follow_link(page, text: str) -> None:
    """Click the link showing `text` in the current notebook, as a learner does."""
    link = page.locator(".jp-NotebookPanel").last.locator(".jp-RenderedMarkdown a", has_text=text).first
    link.scroll_into_view_if_needed()
    link.click()


def nbgrader_ui(page) -> list[str]:
    """nbgrader's panels and buttons visible in the page."""
    found = []
    if page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Nbgrader$")).count():
        found.append("the Nbgrader menu")
    if page.locator(".jp-NotebookPanel-toolbar", has_text="Validate").count():
        found.append("the Validate button")
    if page.locator(".lm-TabBar-tab[title*='Create Assignment' i], .lm-TabBar-tab[data-id*='create' i]").count():
        found.append("the Create Assignment sidebar")
    return found


def news_popup(page) -> bool:
    return page.get_by_text(re.compile(r"Jupyter news", re.IGNORECASE)).count() > 0


def check_start_here(cells: list[dict], where: str) -> None:
    """00_start_here ran in full: outputs, the setup cell's device report, nothing on stderr."""
    import torch

    expected_code = [c for c in notebooks.read(ROOT / NOTEBOOK).cells if c.cell_type == "code"]
    failures = [f"code cell {i}: {o['text'][:800]}" for i, c in enumerate(cells) for o in c["outputs"]
                if o["mime"] == STDERR_MIME]
    assert not failures, "a cell raised or wrote to stderr in JupyterLab:\n" + "\n".join(failures) + f"\n{where}"
    assert len(cells) == len(expected_code), f"JupyterLab shows {len(cells)} code cells, the notebook has {len(expected_code)}"
    prompts = [c["prompt"] for c in cells]
    assert prompts == [f"[{n}]:" for n in range(1, len(cells) + 1)], f"cells did not each run once, in order: {prompts} {where}"
    for i, (cell, source) in enumerate(zip(cells, expected_code)):
        if "print(" in source.source and "figures" not in source.metadata.get("tags", []):  # (helpers: defs only)
            assert any(o["text"].strip() for o in cell["outputs"]), f"code cell {i} prints, but shows no output {where}"
    setup = " ".join(o["text"] for o in cells[0]["outputs"])
    assert f"PyTorch {torch.__version__} | device: " in setup, f"the setup cell's report is missing: {setup!r} {where}"
    device = setup.split("device: ", 1)[1].split()[0]
    if device == "cpu":
        assert "Runtime > Change runtime type > T4 GPU" in setup, "the setup cell must tell a CPU user how to get a GPU"
    everything = "\n".join(o["text"] for c in cells for o in c["outputs"])
    assert f"torch       {torch.__version__}" in everything and f"chosen      {device}" in everything, (
        f"the device report (section 2) is not shown {where}")


def type_into_cell(page, index: int, text: str) -> None:
    """Replace the source of code cell `index` of the current notebook with `text`."""
    cell = page.locator(".jp-NotebookPanel").last.locator(".jp-CodeCell").nth(index)
    cell.scroll_into_view_if_needed()
    editor = cell.locator(".cm-content").first
    editor.click()
    page.keyboard.press("ControlOrMeta+a")
    page.keyboard.insert_text(text)
    page.keyboard.press("Escape")  # command mode, as after typing


def set_theme(page, theme: str) -> None:
    """Settings > Theme > `theme`, as a learner picks it; until JupyterLab has applied it."""
    page.get_by_role("menuitem", name="Settings", exact=True).click()
    page.locator(".lm-Menu-item", has_text="Theme").first.hover()        # a submenu (no menuitem role)
    page.locator(".lm-Menu-item").filter(has_text=re.compile(rf"^{re.escape(theme)}$")).click()
    # Applied: the theme's name is set and its stylesheet reached the notebook (dark or light
    # background), however long the machine takes to load it.
    page.wait_for_function(f"""() => {{
        const nb = document.querySelector('.jp-NotebookPanel .jp-Notebook');
        const rgb = nb ? getComputedStyle(nb).backgroundColor.match(/\\d+/g).slice(0, 3).map(Number) : null;
        return document.body.dataset.jpThemeName === {json.dumps(theme)} && rgb
            && (rgb[0] + rgb[1] + rgb[2] < 3 * 128) === {json.dumps("Dark" in theme)};
    }}""", timeout=60_000)


def figure_in_both_themes(page, tmp_path: Path, name: str) -> list[Path]:
    """The current notebook's first figure drawn by a course helper (a `= show_` cell), in
    JupyterLab's light and dark themes: an opaque white card on either page. Screenshots of the
    figure with the page around it go to test-artifacts/screenshots/; the light theme is back after."""
    figure = page.locator(f".jp-NotebookPanel .jp-CodeCell:has(.jp-InputArea:has-text('= show_')) "
                          ".jp-OutputArea-output img").first
    figure.scroll_into_view_if_needed()
    page.wait_for_function("img => img.complete && img.naturalWidth > 300", arg=figure.element_handle())
    shots = []
    for theme in ("JupyterLab Light", "JupyterLab Dark"):
        if page.evaluate("document.body.dataset.jpThemeName") != theme:
            set_theme(page, theme)
            figure.scroll_into_view_if_needed()
        card = corner_pixel(page, figure)
        page_colour = page.evaluate("getComputedStyle(document.querySelector('.jp-NotebookPanel .jp-Notebook'))"
                                    ".backgroundColor")
        shot = screenshot_around(page, figure, ARTIFACTS / "screenshots" /
                                 f"jupyterlab-figure-{name}-{theme.split()[-1].lower()}.png")
        shots.append(shot)
        assert card == [255, 255, 255, 255], f"the figure has no opaque white card in {theme}: {card} ({shot})"
        dark_page = sum(int(v) for v in re.findall(r"\d+", page_colour)[:3]) < 3 * 128
        assert dark_page == (theme == "JupyterLab Dark"), f"{theme}: the notebook's background is {page_colour}"
    set_theme(page, "JupyterLab Light")
    return shots


def test_learner_path_in_jupyterlab(chromium, server_factory, tmp_path):
    """make.py lab's learner mode, from the first page to a saved exercise, repository clean."""
    page = chromium
    server = server_factory(autosave_s=AUTOSAVE_S)
    checkout, work = server.checkout, lab.work_dir(server.checkout)
    opened = server.wait_ready()
    page.goto(opened, timeout=PAGE_LOAD_MS)  # what a learner's browser is given
    wait_for_notebook(page, server, NOTEBOOK)
    ready_s = time.perf_counter() - server.started
    first = screenshot(page, tmp_path, "jupyterlab-learner-first-start.png")
    where = f"(screenshot: {first})"

    # The page as the learner first sees it: the served folder is the work folder.
    assert server.cmd.serve_root == work and (work / NOTEBOOK).exists()
    assert not nbgrader_ui(page), f"learner mode shows {nbgrader_ui(page)} {where}"

    # View > Expand All Code first: a collapsed cell (the drawing helpers) shows no execution
    # count, and the check below reads every cell's.
    page.get_by_role("menuitem", name="View", exact=True).click()
    page.get_by_role("menuitem", name="Expand All Code", exact=True).click()
    shown = run_all(page, server, NOTEBOOK, tmp_path)
    check_start_here(shown["cells"], where)
    figure_shots = figure_in_both_themes(page, tmp_path, "00")   # the figure the learner's run drew
    assert not news_popup(page), f"the 'Jupyter news' pop-up is shown {where}"

    # 00 -> lesson 01 -> its exercise, through the links in the notebooks.
    follow_link(page, "01 · Device basics")
    wait_for_notebook(page, server, f"course/{CHAPTER}.ipynb")
    follow_link(page, f"exercises/{CHAPTER}")
    exercise_rel = f"exercises/{CHAPTER}/{CHAPTER}{lab.EXERCISE_SUFFIX}.ipynb"
    wait_for_notebook(page, server, exercise_rel)
    assert current_tab(page) == Path(exercise_rel).name

    # Answer question 1 with the reference answer, run everything (the release tags test
    # cells `raises-exception`, so JupyterLab runs on past a failing test): question 1's test
    # cells pass (a test cell that passes shows nothing), question 2's shows that it is
    # not answered yet.
    exercise = notebooks.read(work / exercise_rel)
    code = [c for c in exercise.cells if c.cell_type == "code"]
    answers = fixtures.reference_answers(notebooks.read(layout.source_notebook(CHAPTER, checkout)))
    solutions = [i for i, c in enumerate(code) if notebooks.is_solution(c)]
    first_answer, second_answer = solutions[0], solutions[1]
    gid = notebooks.grade_id(code[first_answer])
    type_into_cell(page, first_answer, answers[gid])
    ran = run_all(page, server, exercise_rel, tmp_path)
    shot = screenshot(page, tmp_path, "jupyterlab-learner-exercise.png")
    cells = ran["cells"]
    assert len(cells) == len(code), f"JupyterLab shows {len(cells)} code cells, the exercise has {len(code)}"
    tests_q1 = [i for i in range(first_answer + 1, second_answer) if notebooks.is_test_cell(code[i])]
    assert tests_q1
    for i in tests_q1:
        assert re.fullmatch(r"\[\d+\]:", cells[i]["prompt"]), f"test cell {notebooks.grade_id(code[i])} did not run ({shot})"
        errors = [o["text"][:500] for o in cells[i]["outputs"] if o["mime"] == STDERR_MIME]
        assert not errors, f"test cell {notebooks.grade_id(code[i])} failed on the reference answer: {errors} ({shot})"
    q2_test = next(i for i in range(second_answer + 1, len(code)) if notebooks.is_test_cell(code[i]))
    q2_text = " ".join(o["text"] for o in cells[q2_test]["outputs"] if o["mime"] == STDERR_MIME)
    assert "NotImplementedError" in q2_text, (
        f"{notebooks.grade_id(code[q2_test])} should fail with question 2's stub: {q2_text[:300]!r} ({shot})")

    # Past the autosave interval the server really uses: the learner's copies hold the work,
    # and the repository is untouched.
    doc = server.api("/lab/api/settings/@jupyterlab/docmanager-extension:plugin")
    interval = doc["settings"].get("autosaveInterval",
                                   doc["schema"]["properties"]["autosaveInterval"]["default"])
    assert doc["settings"].get("autosave", True) is not False
    assert interval == AUTOSAVE_S, f"the server's autosave interval is {interval} s"
    run_done = time.monotonic()
    saved = None
    while time.monotonic() < run_done + 3 * interval + 60:
        nb = notebooks.read(work / exercise_rel)
        if nb.cells and any(c.get("outputs") for c in nb.cells if c.cell_type == "code"):
            saved = nb
            if time.monotonic() > run_done + interval + 5:
                break
        time.sleep(1)
    assert saved is not None, f"autosave did not write {work / exercise_rel} within {3 * interval + 60} s"
    saved_answer = [c for c in saved.cells if c.cell_type == "code"][first_answer].source
    assert saved_answer.strip() == answers[gid].strip(), "the typed answer is not in the learner's copy"
    start_copy = notebooks.read(work / NOTEBOOK)
    assert any(c.get("outputs") for c in start_copy.cells if c.cell_type == "code"), (
        "00_start_here's outputs were not autosaved into the learner's copy")
    status = git(checkout, "status", "--porcelain")
    assert status == "", f"JupyterLab changed the repository:\n{status}"

    # The references open in JupyterLab, rendered: the cheat sheet from lesson 00's link (its
    # copy in work/ links to work/CHEATSHEET.md, where the course's links to GitHub), MYTHS and
    # the learners' guide from the file browser's paths.
    page.goto(f"{server.url}/lab/tree/{NOTEBOOK}?token={server.token}", timeout=PAGE_LOAD_MS)
    wait_for_notebook(page, server, NOTEBOOK)
    link = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-RenderedMarkdown a", has_text="CHEATSHEET.md").first
    link.scroll_into_view_if_needed()
    link.click()
    references = [("CHEATSHEET.md", "Device cheat sheet"), ("docs/MYTHS.md", "The posts' myths, checked"),
                  ("docs/LEARNERS.md", "Learners' guide")]
    for i, (rel, heading) in enumerate(references):
        if i:
            page.goto(f"{server.url}/lab/tree/{rel}?token={server.token}", timeout=PAGE_LOAD_MS)
        title = page.locator(".jp-MarkdownViewer .jp-RenderedMarkdown h1", has_text=heading).first
        title.wait_for(timeout=PAGE_LOAD_MS)
        assert (work / rel).is_file(), f"{rel} is not in the learner's work folder"
    shot_refs = screenshot(page, tmp_path, "jupyterlab-learner-reference.png")

    log = server.log_path.read_text(errors="replace")
    assert not re.search(r"^\[C ", log, re.MULTILINE), f"the server logged a critical error:\n{log[-3000:]}"
    assert " 404 " not in log or ".ipynb" not in "".join(l for l in log.splitlines() if " 404 " in l), (
        f"a notebook was not found:\n{log[-3000:]}")
    summary = (f"make.py lab (learner mode) to {NOTEBOOK} ready (rendered, kernel idle): {ready_s:.1f} s; "
               f"00 ran in {shown['seconds']:.1f} s, the exercise in {ran['seconds']:.1f} s; "
               f"autosave interval {interval} s; retries: {shown['retries'] + ran['retries'] or 'none'}")
    (ARTIFACTS / "jupyterlab-learner.txt").write_text(summary + "\n")
    print(summary, f"screenshots: {first}, {shot}, {shot_refs}")


def test_instructor_mode_formgrader_lists_and_links(chromium, server_factory, tmp_path):
    """make.py lab --instructor: Formgrader on this course, its links open real folders."""
    page = chromium
    server = server_factory(instructor=True)
    page.goto(server.wait_ready(), timeout=PAGE_LOAD_MS)
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Nbgrader$")).click()
    page.get_by_role("menuitem", name="Formgrader", exact=True).click()
    frame = page.frame_locator("iframe[src*='formgrader']")
    names = layout.assignments(server.checkout)
    for name in names:
        frame.get_by_role("link", name=name, exact=True).wait_for(timeout=PAGE_LOAD_MS)
    shot = screenshot(page, tmp_path, "jupyterlab-instructor-formgrader.png")
    assert not news_popup(page), f"the 'Jupyter news' pop-up is shown ({shot})"
    # nbgrader's exchange is the course's local-exchange/ (nbgrader_config.py): no warning that
    # it is missing, and release is offered (issue 28)
    assert frame.locator("#warning-exchange").count() == 0, f"Formgrader warns about the exchange ({shot})"
    assert frame.get_by_text("Release", exact=True).count() >= 1, f"no Release column in Formgrader ({shot})"
    # Generate: its dialog shows nbgrader's log, without the [DEBUG] lines it showed (90 of 96)
    # while Jupyter kept the server's logger at DEBUG (jupyter-config/instructor sets it to INFO).
    frame.locator("tr", has=frame.get_by_role("link", name=CHAPTER, exact=True)).locator("td.assign a").click()
    dialog = frame.locator("#success-modal.in, #error-modal.in").first
    dialog.wait_for(timeout=PAGE_LOAD_MS)
    said = dialog.inner_text()
    assert "Successfully created the student version" in said and "[DEBUG]" not in said, said[:2000]
    dialog.locator("button.close").last.click()
    dialog.wait_for(state="detached", timeout=PAGE_LOAD_MS)

    def browser_shows(folder: str, notebook: str) -> None:
        """Until JupyterLab's file browser shows `folder`, with `notebook` in it."""
        state = """() => ({crumbs: document.querySelector('.jp-FileBrowser .jp-BreadCrumbs')?.textContent ?? '',
            items: [...document.querySelectorAll('.jp-FileBrowser .jp-DirListing-itemText')].map(e => e.textContent)})"""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            now = page.evaluate(state)
            if re.sub(r"\s", "", now["crumbs"]).rstrip("/").endswith(folder) and notebook in now["items"]:
                return
            time.sleep(0.5)
        shot = screenshot(page, tmp_path, "jupyterlab-instructor-link.png")
        pytest.fail(f"the file browser does not show {folder}/{notebook}: {now} ({shot})")

    frame.get_by_role("link", name=CHAPTER, exact=True).click()
    browser_shows(f"solutions/{CHAPTER}", f"{CHAPTER}.ipynb")
    row = frame.locator("tr", has=frame.get_by_role("link", name=CHAPTER, exact=True))
    row.locator("a:has(.glyphicon-search)").click()  # Preview: the released version
    browser_shows(f"exercises/{CHAPTER}", f"{CHAPTER}.ipynb")
    # No critical line in the server's log (before issue 28: "Unwritable directory" for the
    # missing exchange).
    critical = [line for line in server.log_path.read_text(errors="replace").splitlines()
                if line.startswith("[C ")]
    assert not critical, f"the server logged a critical error: {critical}"
    print(f"Formgrader lists {', '.join(names)}; screenshot {shot}")


def _nbgrader(checkout: Path, *args: str) -> str:
    """One of nbgrader's own commands, as the instructor runs it in the course folder."""
    from coursetools.author.nbgrader_course import nbgrader_env
    proc = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=checkout,
                          env={**nbgrader_env(), "PYTHONPATH": str(checkout)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"nbgrader {' '.join(args)}:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


def open_assignments_tab(page, server: LabServer, tmp_path: Path, shot_name: str):
    """Open the server's JupyterLab and its Nbgrader > Assignment List; wait until the released
    list has loaded (the tab used to sit on "Loading, please wait..." on a fresh clone)."""
    page.goto(server.wait_ready(), timeout=PAGE_LOAD_MS)
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Nbgrader$")).click()
    page.get_by_role("menuitem", name="Assignment List", exact=True).click()
    released = page.locator("#released_assignments_list")
    try:
        released.locator(".list_item:visible, #released_assignments_list_placeholder:visible").first.wait_for(timeout=PAGE_LOAD_MS)
    except Exception:
        shot = screenshot(page, tmp_path, shot_name)
        pytest.fail(f"the Assignments tab did not load ({shot}); server log:\n{server.log()}")
    errors = page.locator(".alert-danger:visible")
    assert errors.count() == 0, f"the Assignments tab shows an error: {errors.all_inner_texts()}"
    return page


def _click_in_row(page, listing: str, name: str, button: str) -> None:
    row = page.locator(f"#{listing} .list_item:not(.nested_list_item)", has_text=name)
    row.get_by_role("button", name=button, exact=True).click()


def test_students_fetch_and_submit_in_the_assignments_tab(chromium, server_factory, tmp_path):
    """Issue 37: several students on one machine, each in `make.py lab --student NAME`, fetch
    and submit through nbgrader's Assignments tab from a fresh clone; each sees only their own
    submission; the instructor collects both without an owner warning."""
    page = chromium
    checkout = checkout_copy(tmp_path / "checkout")
    _nbgrader(checkout, "generate_assignment", CHAPTER, "--force")
    _nbgrader(checkout, "release_assignment", CHAPTER)
    answers = fixtures.reference_answers(notebooks.read(layout.source_notebook(CHAPTER, checkout)))
    shots, servers = [], {}
    for student in ("alice", "bob"):
        server = server_factory(checkout=checkout, student=student)
        open_assignments_tab(page, server, tmp_path, f"jupyterlab-assignments-{student}-failed.png")
        _click_in_row(page, "released_assignments_list", CHAPTER, "Fetch")
        page.locator("#fetched_assignments_list .list_item:not(.nested_list_item)", has_text=CHAPTER).wait_for(timeout=PAGE_LOAD_MS)
        fetched = server.cmd.serve_root / CHAPTER / f"{CHAPTER}.ipynb"
        assert fetched.is_file(), f"{student}'s fetch did not land in {server.cmd.serve_root}"
        if student == "alice":  # alice answers every question; bob submits the notebook as fetched
            notebooks.write(fixtures.fill(notebooks.read(fetched), answers), fetched)
        _click_in_row(page, "fetched_assignments_list", CHAPTER, "Submit")
        page.locator("#submitted_assignments_list .list_item:not(.nested_list_item)", has_text=CHAPTER).wait_for(timeout=PAGE_LOAD_MS)
        servers[student] = server
        critical = [line for line in server.log_path.read_text(errors="replace").splitlines()
                    if line.startswith(("[C ", "[E "))]
        assert not critical, f"{student}'s server logged errors: {critical}"
    # Both have submitted: each student's tab lists their own submission only.
    for student, server in servers.items():
        open_assignments_tab(page, server, tmp_path, f"jupyterlab-assignments-{student}-failed.png")
        submitted = page.locator("#submitted_assignments_list .list_item:not(.nested_list_item)", has_text=CHAPTER)
        submitted.first.wait_for(timeout=PAGE_LOAD_MS)
        shots.append(screenshot(page, tmp_path, f"jupyterlab-assignments-{student}.png"))
        assert submitted.count() == 1, f"{student} sees {submitted.count()} submissions ({shots[-1]})"
    inbound = sorted(p.name.split("+")[0] for p in
                     (checkout / "local-exchange" / "exchange" / "pytorch-devices" / "inbound").iterdir())
    assert inbound == ["alice", "bob"], inbound
    said = _nbgrader(checkout, "collect", CHAPTER)
    assert "cheating attempt" not in said, said
    for student in ("alice", "bob"):
        assert (checkout / "submitted" / student / CHAPTER / f"{CHAPTER}.ipynb").is_file(), said
    for student, expected in (("alice", answers), ("bob", {})):
        cells = {notebooks.grade_id(c): c.source for c in notebooks.read(
            checkout / "submitted" / student / CHAPTER / f"{CHAPTER}.ipynb").cells}
        assert all(cells[k] == v for k, v in expected.items()), f"{student}'s submission is not what they saved"
        assert expected or "raise NotImplementedError()" in cells["pick_device"], "bob's submission is not his blank copy"
    print(f"alice and bob fetched and submitted {CHAPTER} in the Assignments tab; screenshots {shots}")


def test_gpu_record_block_renders_in_jupyterlab(chromium, server_factory, tmp_path):
    """A GPU record block (`gpu-report --record`, coursetools/author/gpu_records.py) as JupyterLab
    shows it: collapsed, its summary names the device, versions and date, its data line is
    invisible; opened, it shows the recorded text and the figure (a cell attachment). The
    blocks are recorded here from a real run of tests/fixtures_gpu/tiny_lesson.json on this
    machine, and labelled with what this machine is."""
    from coursetools.author import gpu_records
    from coursetools.evidence import gpu_report, standalone
    page = chromium
    server = server_factory()
    opened = server.wait_ready()
    lesson = notebooks.read(ROOT / "tests" / "fixtures_gpu" / "tiny_lesson.json")
    run = standalone.run_notebook(lesson, tmp_path / "record", filename="tiny.ipynb", strict=False)
    assert not run.problems, run.problems
    device = gpu_records.device_from(gpu_report.machine())
    recorded, notes = gpu_records.write_blocks(lesson, run.executed_nb.cells, device)
    assert not notes and sum(map(gpu_records.is_block, recorded.cells)) == 4
    rel = "gpu-record-demo.ipynb"
    notebooks.write(recorded, server.cmd.serve_root / rel)
    page.goto(f"{server.url}/lab/tree/{rel}?token={server.token}", timeout=PAGE_LOAD_MS)
    wait_for_notebook(page, server, rel)
    assert opened  # (the server asked for its first page; this test opens its own)

    blocks = page.locator(".jp-NotebookPanel .jp-MarkdownCell details")
    blocks.first.wait_for(timeout=PAGE_LOAD_MS)
    shown = page.evaluate("""() => [...document.querySelectorAll('.jp-NotebookPanel .jp-MarkdownCell details')]
        .map(d => ({open: d.open, summary: d.querySelector('summary')?.textContent ?? '',
                    cell: d.closest('.jp-RenderedMarkdown').innerText}))""")
    where = f"(screenshot: {screenshot(page, tmp_path, 'jupyterlab-gpu-record-collapsed.png')})"
    assert len(shown) == 4, f"JupyterLab shows {len(shown)} <details> blocks, not 4 {where}"
    assert all(not b["open"] and b["summary"] in (device.label(), device.label("drew")) for b in shown), (
        f"{shown} {where}")
    assert not any("cell_sha256" in b["cell"] for b in shown), f"the data line is visible {where}"

    # Open the branch's block and the figure's block: the recorded text, the figure.
    skipped = "skipped: this machine has no GPU"
    expected = next(t for t in (c.source for c in recorded.cells if gpu_records.is_block(c))
                    if "device.type" not in t and ("on " in t or skipped in t) and "```text" in t
                    and "PyTorch" not in t.split("</summary>", 1)[1])
    summaries = page.locator(".jp-NotebookPanel .jp-MarkdownCell details > summary")
    summaries.nth(1).click()
    summaries.nth(2).click()
    page.wait_for_function("""() => {
        const open = [...document.querySelectorAll('.jp-NotebookPanel .jp-MarkdownCell details[open]')];
        const img = open.map(d => d.querySelector('img')).find(i => i);
        return open.length === 2 && img && img.complete && img.naturalWidth > 10;
    }""", timeout=60_000)
    summaries.nth(1).evaluate("e => e.scrollIntoView({block: 'start'})")  # the text, then the figure
    page.wait_for_timeout(500)  # (the scroll settles)
    shot = screenshot(page, tmp_path, "jupyterlab-gpu-record-block.png")
    text = page.locator(".jp-NotebookPanel .jp-MarkdownCell details[open] pre").first.inner_text()
    recorded_text = expected.split("```text\n", 1)[1].split("\n```", 1)[0]
    assert text.strip() == recorded_text.strip(), f"shown {text!r}, recorded {recorded_text!r} ({shot})"
    print(f"GPU record blocks render collapsed and open in JupyterLab; screenshot {shot}")
