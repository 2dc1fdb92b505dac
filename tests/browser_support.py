"""Headless Chromium for the browser tests (Debian's browser, driven by Playwright), shared by
tests/learner/test_browser.py (JupyterLab), tests/publish/test_site.py (the website) and
tests/publish/test_i18n_browser.py (JupyterLab in Chinese). tests/ is on sys.path
(tests/conftest.py), so each imports it as `browser_support`."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import pytest

# Chromium's own network use is switched off: the machines that run this have no network.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1400, "height": 1000}


def find_chromium() -> str | None:
    for candidate in ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(candidate)
        if found:
            return found
    return None


@contextlib.contextmanager
def chromium_page(profile: Path | None, what: str):
    """A headless Chromium page, closed on exit: with a fresh persistent profile in `profile`
    (JupyterLab keeps its state there), or without one. Skips the test, with a message naming
    `what` needs it, where Playwright or Chromium is missing (.ci/run installs Chromium)."""
    pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed "
                        "(pip install -r requirements-dev.txt)")
    from playwright.sync_api import sync_playwright

    executable = find_chromium()
    if executable is None:
        pytest.skip(f"Chromium is not installed (Debian: apt-get install chromium); {what} needs it")
    with sync_playwright() as pw:
        if profile is not None:
            context = pw.chromium.launch_persistent_context(
                str(profile), executable_path=executable, headless=True, args=CHROMIUM_ARGS, viewport=VIEWPORT)
            close = context.close
            page = context.pages[0] if context.pages else context.new_page()
        else:
            browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
            close = browser.close
            page = browser.new_page(viewport=VIEWPORT)
        try:
            page.set_default_timeout(60_000)
            yield page
        finally:
            close()


# The colour of an image's pixel (2, 2), read back through a canvas: the figure helpers
# (coursetools/learner/figures.py) draw on an opaque white card, so it reads [255, 255, 255, 255]
# on a light page and a dark one alike.
_CORNER_PIXEL = """img => { const c = document.createElement('canvas');
    c.width = img.naturalWidth; c.height = img.naturalHeight;
    const g = c.getContext('2d'); g.drawImage(img, 0, 0);
    return Array.from(g.getImageData(2, 2, 1, 1).data); }"""


def corner_pixel(page, image) -> list[int]:
    """RGBA of pixel (2, 2) of the <img> `image` (a Playwright locator) as the browser decoded it."""
    return page.evaluate(_CORNER_PIXEL, image.element_handle())


def screenshot_around(page, element, path: Path, margin: int = 30) -> Path:
    """A screenshot of `element` with `margin` pixels of the page around it, written to `path`."""
    box = element.bounding_box()
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), clip={"x": max(box["x"] - margin, 0), "y": max(box["y"] - margin, 0),
                                          "width": box["width"] + 2 * margin, "height": box["height"] + 2 * margin})
    return path
