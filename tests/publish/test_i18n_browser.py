"""`make.py lab --lang zh` in a real browser: JupyterLab in Chinese with the Chinese lesson 01.

Started exactly as tests/learner/test_browser.py starts `make.py lab` (coursetools.learner.lab.command on a
copy of the checkout, loopback port, scratch per-user folders), with `--lang zh`. Headless
Chromium opens the page the server asks for: the Chinese 00_start_here, with JupyterLab's own
menus in Chinese (the language pack, set by jupyter-config/zh/); its link leads to the Chinese
lesson 01, which runs from the Chinese Run menu (运行 > 运行所有单元格) without an error. The
screenshot, test-artifacts/screenshots/jupyterlab-zh-lesson-01.png, is committed.
"""

from __future__ import annotations

import functools
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
