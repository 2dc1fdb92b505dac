"""`make.py lab --lang zh` in a real browser: JupyterLab in Chinese with the Chinese lesson 01.

Started exactly as tests/learner/test_browser.py starts `make.py lab` (coursetools.learner.lab.command on a
copy of the checkout, loopback port, scratch per-user folders), with `--lang zh`. Headless
Chromium opens the page the server asks for: the Chinese 00_start_here, with JupyterLab's own
menus in Chinese (the language pack, set by jupyter-config/zh/); its link leads to the Chinese
lesson 01, which runs from the Chinese Run menu (运行 > 运行所有单元格) without an error, and
says in Chinese what it prints: the setup line (with Colab's Chinese menu), its verdict lines, the
"expected, not recorded on a GPU" label. In the same session: the learner's copy of
exercise 01 with two wrong answers, run top to bottom, shows its failing tests' messages in
Chinese; and lesson 08's error index, find_lesson(), answers in Chinese with links to the Chinese
lessons. The screenshots (test-artifacts/screenshots/jupyterlab-zh-*.png) are committed.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import time

import pytest

from coursetools.learner import lab
from coursetools import layout, notebooks
from tests.learner.test_browser import (PAGE_LOAD_MS, RUN_ALL_MS, STDERR_MIME, _CELLS, _RUN_FINISHED,  # noqa: F401
                                chromium, follow_link, server_factory, wait_for_notebook)

ROOT = layout.ROOT
SCREENSHOT = ROOT / "test-artifacts" / "screenshots" / "jupyterlab-zh-lesson-01.png"
SHOTS = SCREENSHOT.parent
CJK = re.compile(r"[\u3400-\u9fff]")
EXERCISE = f"{lab.ZH}/exercises/01_device_basics/01_device_basics_exercise.ipynb"  # the learner's copy
WRONG = ("pick_device_hardcodes_cpu", "common_device_unnamed_error")  # as tests/evidence/test_standalone.py
INDEX_DEMO = "zh-08-find-lesson.ipynb"
# Run All ran every cell: an exercise's test cells are tagged raises-exception, so JupyterLab
# goes on after a failing one (the _RUN_FINISHED of test_browser stops at the first error).
_ALL_RAN = """() => {
  const panel = [...document.querySelectorAll('.jp-NotebookPanel')].at(-1);
  if (!panel || document.querySelector('.jp-Dialog') !== null) return false;
  const prompts = [...panel.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')].map(e => e.textContent.trim());
  const indicator = panel.querySelector('.jp-Notebook-ExecutionIndicator');
  return prompts.length > 0 && indicator?.dataset.status === 'idle' && prompts.every(t => /^\\[\\d+\\]:$/.test(t));
}"""
FIRST = f"{lab.ZH}/{lab.FIRST_NOTEBOOK}"
LESSON = f"{lab.ZH}/course/01_device_basics.ipynb"


def chinese_font() -> bool:
    """A font with Chinese glyphs (Debian: fonts-wqy-microhei, which .ci/run installs):
    without one Chromium draws every Chinese character as an empty box."""
    try:
        found = subprocess.run(["fc-list", ":lang=zh"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return bool(found.strip())


def test_jupyterlab_in_chinese_with_lesson_01(chromium, server_factory, monkeypatch, tmp_path):
    if not chinese_font():
        pytest.skip("no font with Chinese glyphs (Debian: apt-get install fonts-wqy-microhei): "
                    "the screenshot would show empty boxes")
    page = chromium
    monkeypatch.setattr(lab, "command", functools.partial(lab.command, lang="zh"))
    server = server_factory()
    page.goto(server.wait_ready(), timeout=PAGE_LOAD_MS)  # the page `make.py lab --lang zh` opens
    wait_for_notebook(page, server, FIRST)
    menus = [m.strip() for m in page.locator(".lm-MenuBar-itemLabel").all_inner_texts()]
    assert "运行" in menus and "编辑" in menus, f"JupyterLab's menus are not in Chinese: {menus}"

    follow_link(page, "01 · 设备基础")
    wait_for_notebook(page, server, LESSON)
    page.get_by_role("menuitem", name="运行", exact=True).click()
    page.get_by_role("menuitem", name="运行所有单元格", exact=True).click()
    deadline = time.monotonic() + RUN_ALL_MS / 1000
    while not page.evaluate(_RUN_FINISHED):
        dialog = page.locator(".jp-Dialog")
        if dialog.count():  # 选择内核 (Select Kernel): a learner accepts
            page.locator(".jp-Dialog .jp-mod-accept").first.click()
        assert time.monotonic() < deadline, f"lesson 01 did not finish running in JupyterLab:\n{server.log()}"
        time.sleep(0.5)
    cells = page.evaluate(_CELLS)
    errors = [o["text"][:300] for c in cells for o in c["outputs"] if o["mime"] == STDERR_MIME]
    assert not errors, f"the Chinese lesson 01 raised in JupyterLab: {errors}"
    code = [c for c in notebooks.read(server.checkout / LESSON).cells if c.cell_type == "code"]
    assert len(cells) == len(code) and all(c["prompt"] != "[ ]:" for c in cells)

    # Back to the top of the lesson (JupyterLab renders only the cells in view).
    page.evaluate("""() => { const panel = [...document.querySelectorAll('.jp-NotebookPanel')].at(-1);
        for (const el of panel.querySelectorAll('.jp-WindowedPanel-outer, .jp-Notebook')) el.scrollTop = 0; }""")
    page.wait_for_function("""() => [...[...document.querySelectorAll('.jp-NotebookPanel')].at(-1)
        .querySelectorAll('.jp-RenderedMarkdown h1')].some(h => h.textContent.includes('01 · 设备基础'))""",
                           timeout=60_000)
    page.wait_for_timeout(1000)
    shot = tmp_path / SCREENSHOT.name
    page.screenshot(path=str(shot))
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(shot, SCREENSHOT)
    print(f"JupyterLab in Chinese, lesson 01 run: {SCREENSHOT}")

    # What lesson 01 prints is Chinese: the setup line, a verdict, the GPU label
    printed = [o["text"] for c in cells for o in c["outputs"]]
    setup = " ".join(o["text"] for o in cells[0]["outputs"])
    on_cpu = "device: cpu" in setup
    if on_cpu:
        assert "没有找到 GPU" in setup and "代码执行程序 → 更改运行时类型" in setup, setup
        assert any("预期输出，并非在 GPU 上录制" in t for t in printed), "the GPU label is not Chinese"
    assert any("在选定的设备上：" in t for t in printed), "lesson 01's printed lines are not Chinese"
    if on_cpu:
        _shoot(page, tmp_path, "预期输出，并非在 GPU 上录制", "jupyterlab-zh-lesson-01-gpu-label.png")

    # Exercise 01, the learner's copy, with two wrong answers: run top to bottom, each failing
    # test says what it saw in Chinese (the notebook's own tests, no make.py check).
    from coursetools.author import fixtures
    name = "01_device_basics"
    answers = fixtures.reference_answers(notebooks.read(layout.source_notebook(name)))
    wrong = [fixtures.load(layout.SUBMISSIONS_DIR / name / f"{fx}.toml") for fx in WRONG]
    for fx in wrong:
        answers.update(fx.answers)
    mine = server.cmd.serve_root / EXERCISE
    notebooks.write(fixtures.fill(notebooks.read(ROOT / lab.ZH / "exercises" / name / f"{name}.ipynb"), answers), mine)
    page.goto(f"{server.url}/lab/tree/{EXERCISE}?token={server.token}", timeout=PAGE_LOAD_MS)
    wait_for_notebook(page, server, EXERCISE)
    exercise = _run_all_in_chinese(page, server)
    failed = [o["text"] for c in exercise for o in c["outputs"] if o["mime"] == STDERR_MIME]
    expected = {gid for fx in wrong for gid in fx.loses}
    assert len(failed) == len(expected), f"{len(failed)} failing cells, expected {sorted(expected)}: {failed}"
    assert all("AssertionError" in t and CJK.search(t.split("AssertionError", 1)[1]) for t in failed), failed
    _shoot(page, tmp_path, "AssertionError", "jupyterlab-zh-exercise-01-two-wrong.png", STDERR_MIME)

    # Lesson 08's error index: its setup, imports and index cells, as the Chinese lesson has them
    lesson08 = notebooks.read(ROOT / lab.ZH / "course" / "08_troubleshooting.ipynb")
    keep = [c for i, c in enumerate(lesson08.cells)
            if i in (0, 1) or "import re\n" in c.source and i < 10
            or "INDEX = [" in c.source or "def find_lesson" in c.source or "## 5." in c.source]
    demo = notebooks.read(ROOT / lab.ZH / "course" / "08_troubleshooting.ipynb")
    demo.cells = keep
    notebooks.write(demo, server.cmd.serve_root / INDEX_DEMO)
    page.goto(f"{server.url}/lab/tree/{INDEX_DEMO}?token={server.token}", timeout=PAGE_LOAD_MS)
    wait_for_notebook(page, server, INDEX_DEMO)
    index_cells = _run_all_in_chinese(page, server)
    said = " ".join(o["text"] for c in index_cells for o in c["outputs"])
    assert not any(o["mime"] == STDERR_MIME for c in index_cells for o in c["outputs"]), said[-2000:]
    assert "原因：" in said and "修正：" in said and "zh/course/01_device_basics.ipynb" in said, said[-2000:]
    _shoot(page, tmp_path, "原因：", "jupyterlab-zh-lesson-08-find-lesson.png")


def _run_all_in_chinese(page, server) -> list[dict]:
    """运行 > 运行所有单元格, until every cell ran; the cells as the page shows them."""
    page.get_by_role("menuitem", name="运行", exact=True).click()
    page.get_by_role("menuitem", name="运行所有单元格", exact=True).click()
    deadline = time.monotonic() + RUN_ALL_MS / 1000
    while not page.evaluate(_ALL_RAN):
        if page.locator(".jp-Dialog").count():  # 选择内核 (Select Kernel): a learner accepts
            page.locator(".jp-Dialog .jp-mod-accept").first.click()
        assert time.monotonic() < deadline, f"the notebook did not finish running in JupyterLab:\n{server.log()}"
        time.sleep(0.5)
    return page.evaluate(_CELLS)


def _shoot(page, tmp_path, text: str, name: str, mime: str | None = None) -> None:
    """Scroll the first output showing `text` to the top of the notebook; a screenshot, committed."""
    selector = f'.jp-OutputArea-output[data-mime-type="{mime}"]' if mime else ".jp-OutputArea-output"
    page.evaluate("""([selector, text]) => {
        const panel = [...document.querySelectorAll('.jp-NotebookPanel')].at(-1);
        const out = [...panel.querySelectorAll(selector)].find(o => o.textContent.includes(text));
        out?.closest('.jp-Cell')?.scrollIntoView({block: 'start'}); }""", [selector, text])
    page.wait_for_timeout(1000)
    shot = tmp_path / name
    page.screenshot(path=str(shot))
    shutil.copy2(shot, SHOTS / name)
    print(f"screenshot: {SHOTS / name}")
