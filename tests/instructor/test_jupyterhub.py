"""A class on JupyterHub, end to end, in Chromium (issue 37).

The test builds what docs/INSTRUCTORS.md, "A class on JupyterHub", tells an instructor to build
on one server, and runs a class through it:

* a JupyterHub (from PyPI) with its proxy, configurable-http-proxy (from npm), started with
  the course's own recipe, `deploy/jupyterhub/jupyterhub_config.py`, loaded unchanged; the
  test's config, loaded around it, changes only what a test must: loopback ports, a shared
  password in place of PAM, its scratch folders, and its users;
* four real Unix users made by the test (`useradd`): an instructor and three students, each
  server running as its user (the local-process spawner, the hub running as root);
* the students' global Jupyter config, `deploy/jupyterhub/etc-jupyter/`, in the place of
  /etc/jupyter (`COURSE_ETC_JUPYTER`), and nbgrader's shared exchange, a folder of mode 1777;
* the instructor's course: a fresh copy of this checkout in their home, with its .venv.
  Python for every user is this suite's own interpreter, or where root's lies under /root a
  relocated copy of that same build (never Debian's python3.X: packages installed for 3.11.7
  broke under 3.11.2), reaching this suite's packages through a .pth file, in
  place of the pip install `make.py` would run (tests/unix_users.py).

Then, in Chromium, one browser context (its own cookies) per user:
1. the instructor logs in and releases 01 in Formgrader (Generate, then Release);
2. each student logs in, fetches 01 in the Assignments tab, answers it (alice: every answer,
   bob: half of them, carol: none; the notebook is written as JupyterLab would save it) and
   submits it;
3. the instructor collects in Formgrader, grades with `make.py grade-class` run as the
   instructor with the environment the hub gives their server (a terminal there), and releases
   the feedback in Formgrader;
4. each student fetches their feedback in the Assignments tab and sees their own score, and
   nobody else's: the tab lists one submission, the feedback folder holds one file, and the
   exchange's feedback folder cannot be listed.

It runs twice: on the SQLite gradebook and on PostgreSQL (the course's nbgrader_config.py
given a db_url, as the guide says). Screenshots of each step go to test-artifacts/ (the SQLite
run's to test-artifacts/screenshots/, committed), and the
time of each step to test-artifacts/hub-class-<gradebook>.txt. Skipped, with a message, where
the suite is not root (users are made and servers started as them), or where Chromium,
configurable-http-proxy or PostgreSQL is missing (.ci/run installs them).
"""

from __future__ import annotations

import contextlib
import csv
import os
import re
import subprocess
import time
import urllib.parse
from pathlib import Path

import pytest

import unix_users
from browser_support import chromium_page
from hub_support import PASSWORD, Hub, require, set_up_class

from coursetools import layout, notebooks
from coursetools.author import fixtures

ROOT = layout.ROOT
CHAPTER = layout.assignments()[0]
ARTIFACTS = ROOT / "test-artifacts"
TEACHER = "course-teacher"
STUDENTS = {"course-alice": "all", "course-bob": "half", "course-carol": "none"}
PAGE_MS = 120_000

pytestmark = [pytest.mark.timeout(1800)]


class Timings:
    def __init__(self):
        self.steps: list[tuple[str, float]] = []

    @contextlib.contextmanager
    def step(self, name: str):
        start = time.perf_counter()
        yield
        self.steps.append((name, time.perf_counter() - start))

    def text(self) -> str:
        return "\n".join(f"{seconds:7.1f} s  {name}" for name, seconds in self.steps)


def _shot(page, gradebook: str, name: str) -> Path:
    """The SQLite run's screenshots are committed (test-artifacts/screenshots/), the other's not."""
    folder = ARTIFACTS / "screenshots" if gradebook == "sqlite" else ARTIFACTS
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"hub-{gradebook}-{name}.png"
    page.screenshot(path=str(path))
    return path


def _log_in(browser, hub: Hub, user: str):
    """A browser context of `user`'s own, logged in; returns its page, on JupyterLab."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(PAGE_MS)
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", PASSWORD)
    page.click("#login_submit")
    page.wait_for_url(re.compile(rf"/user/{user}/lab"), timeout=PAGE_MS)
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Nbgrader$")).wait_for(timeout=PAGE_MS)
    return page


def _close_menus(page) -> None:
    """Close any open JupyterLab menu. Escape reaches a menu only when it holds the keyboard
    focus; one fresh-clone CI run pressed it while the focus was elsewhere and waited 120 s for
    the Nbgrader menu to close. Each try presses Escape, then clicks the status bar, outside
    every menu (Lumino closes its menus on a mousedown outside them); up to PAGE_MS."""
    from playwright.sync_api import TimeoutError as PageTimeout

    deadline = time.monotonic() + PAGE_MS / 1000
    shown = page.locator(".lm-Menu:visible")
    while shown.count():
        page.keyboard.press("Escape")
        try:
            shown.first.wait_for(state="hidden", timeout=3_000)
            continue
        except PageTimeout:
            pass
        page.mouse.click(2, page.viewport_size["height"] - 2)  # the status bar's left end
        try:
            shown.first.wait_for(state="hidden", timeout=5_000)
        except PageTimeout:
            if time.monotonic() > deadline:
                raise


def _menu(page, item: str) -> None:
    """Nbgrader > `item`. A click on the menu bar toggles the menu: one that lands while a menu
    is still open (an Escape not yet handled on a loaded machine) closes it, and the item never
    shows; two fresh-clone CI runs waited 120 s for "Assignment List" so. Each try closes any
    open menu, opens this one, and waits a while for the item; then tries again, up to PAGE_MS."""
    from playwright.sync_api import TimeoutError as PageTimeout

    deadline = time.monotonic() + PAGE_MS / 1000
    label = page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Nbgrader$"))
    entry = page.get_by_role("menuitem", name=item, exact=True)
    while True:
        _close_menus(page)
        label.click()
        try:
            entry.wait_for(state="visible", timeout=15_000)
        except PageTimeout:
            if time.monotonic() > deadline:
                raise
            continue
        entry.click()
        return


def _formgrader(page, hub: Hub):
    """Formgrader in a browser tab of its own, as the guide says: JupyterHub's servers send
    `Content-Security-Policy: frame-ancestors 'none'`, so JupyterLab's Nbgrader > Formgrader,
    an iframe, stays blank on a hub (nbgrader issue 1870), and the recipe keeps that header."""
    answer = page.goto(f"{hub.url}/user/{TEACHER}/formgrader/manage_assignments")
    assert "frame-ancestors 'none'" in (answer.headers.get("content-security-policy") or ""), answer.headers
    try:
        page.get_by_role("link", name=CHAPTER, exact=True).wait_for(timeout=PAGE_MS)
    except Exception:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "hub-formgrader-failed.png"))
        shown = page.locator("body").inner_text(timeout=10_000)
        pytest.fail(f"Formgrader does not list {CHAPTER} (test-artifacts/hub-formgrader-failed.png):\n{shown[:3000]}")
    return page


def _formgrader_action(page, frame, column: str, expect: str, gradebook: str, shot: str) -> str:
    """Click `column`'s link in the chapter's row of Manage Assignments; wait for the success
    dialog, which must say `expect`; return the log it shows, and close it."""
    row = frame.locator("tr", has=frame.get_by_role("link", name=CHAPTER, exact=True))
    row.locator(f"td.{column} a").click()
    dialog = frame.locator("#success-modal.in, #error-modal.in").first  # Bootstrap's "shown"
    dialog.wait_for(timeout=PAGE_MS)
    page.wait_for_timeout(400)  # its fade-in, for the screenshot only
    text = dialog.inner_text()
    _shot(page, gradebook, shot)
    assert "Success" in text and expect in text, f"Formgrader's {column}: {text[-3000:]}"
    # Formgrader's dialogs showed nbgrader's [DEBUG] lines (90 of 96 for Generate): it logs at the
    # level of the server's logger, which Jupyter keeps at DEBUG; the instructor's server config
    # sets that logger to INFO (etc-jupyter/instructor/jupyter_server_config.json).
    assert "[DEBUG]" not in text, f"Formgrader's {column} dialog shows debug lines: {text[:1500]}"
    dialog.locator("button.close").last.click()
    dialog.wait_for(state="detached", timeout=PAGE_MS)
    return text


def _students_view(page, hub: Hub, name: str) -> None:
    """A student's server has the Assignments tab and no Formgrader, in the menu and on the
    server (the hub's /etc/jupyter outranks the extensions' own enabling files)."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Nbgrader$")).click()
    page.locator(".lm-Menu-itemLabel:visible").first.wait_for(timeout=PAGE_MS)
    items = page.locator(".lm-Menu-itemLabel:visible").all_inner_texts()
    _close_menus(page)
    assert "Assignment List" in items and "Formgrader" not in items, f"{name}'s Nbgrader menu: {items}"
    answer = page.request.get(f"{hub.url}/user/{name}/formgrader")
    assert answer.status == 404, f"{name}'s server serves Formgrader ({answer.status})"


def _assignments_tab(page) -> None:
    _menu(page, "Assignment List")
    page.locator("#released_assignments_list .list_item:visible, "
                 "#released_assignments_list_placeholder:visible").first.wait_for(timeout=PAGE_MS)
    errors = page.locator(".alert-danger:visible")
    assert errors.count() == 0, f"the Assignments tab shows an error: {errors.all_inner_texts()}"


def _row(page, listing: str):
    return page.locator(f"#{listing} .list_item:not(.nested_list_item)", has_text=CHAPTER)


def _answers(kind: str) -> dict[str, str]:
    every = fixtures.reference_answers(notebooks.read(layout.source_notebook(CHAPTER)))
    names = list(every)
    keep = {"all": names, "half": names[: len(names) // 2], "none": []}[kind]
    return {k: every[k] for k in keep}


def _feedback_written(course: Path, proc) -> None:
    """Each student's feedback page exists after grade-class; otherwise fail with the errors
    grading.log holds for the feedback step (nbgrader's own)."""
    missing = [name for name in STUDENTS
               if not (course / "feedback" / name / CHAPTER / f"{CHAPTER}.html").is_file()]
    if not missing:
        return
    log = (course / "grading.log").read_text(errors="replace") if (course / "grading.log").exists() else ""
    errors = [line for line in log.splitlines()
              if re.search(r"(Error|Exception)\b.*:", line) and "Traceback" not in line]
    pytest.fail(f"grade-class (exit status {proc.returncode}) wrote no feedback page for {missing}; "
                f"grading.log's errors:\n" + "\n".join(errors[-15:]) + f"\n\nstderr:\n{proc.stderr[-2000:]}")


@pytest.fixture
def class_users():
    require()
    names = [TEACHER, *STUDENTS]
    for name in names:  # a run that was killed may have left them
        unix_users.remove_user(name)
    users = {name: unix_users.make_user(name) for name in names}
    yield users
    for name in names:
        unix_users.remove_user(name)


@pytest.fixture
def base():
    """A folder under /tmp itself, which every user may cross (not a private TMPDIR)."""
    with unix_users.crossable_folder("course-hub-") as folder:
        yield folder


@pytest.mark.parametrize("gradebook", ["sqlite", "postgresql"])
def test_a_class_on_jupyterhub(gradebook, class_users, base, request):
    db_url = request.getfixturevalue("postgres_url") if gradebook == "postgresql" else None
    teacher = class_users[TEACHER]
    students = {name: class_users[name] for name in STUDENTS}
    timings = Timings()

    with timings.step("set-up: a Python for every user, the exchange, /etc/jupyter, the instructor's course"):
        setup = set_up_class(base, teacher, next(iter(students.values())), db_url)
    exchange, course, course_python = setup.exchange, setup.course, setup.course_python

    hub, log = None, ""
    try:
        with timings.step("the hub and its proxy start"):
            hub = setup.start_hub(base, TEACHER, list(STUDENTS))
        with chromium_page(None, "the JupyterHub class test") as first:
            browser = first.context.browser

            with timings.step("instructor: log in, server spawned, JupyterLab loaded"):
                page = _log_in(browser, hub, TEACHER)
            with timings.step("instructor: Formgrader's Generate and Release of 01"):
                frame = _formgrader(page, hub)
                assert frame.locator("#warning-exchange").count() == 0, "Formgrader warns about the exchange"
                _formgrader_action(page, frame, "assign", "Successfully created the student version", gradebook,
                                   "1-instructor-generate")
                _formgrader_action(page, frame, "release", "Successfully released", gradebook,
                                   "2-instructor-release")
            assert (exchange / "pytorch-devices" / "outbound" / CHAPTER / f"{CHAPTER}.ipynb").is_file()

            pages = {}
            for name, kind in STUDENTS.items():
                who = students[name]
                with timings.step(f"{name}: log in, server spawned, JupyterLab loaded"):
                    pages[name] = spage = _log_in(browser, hub, name)
                    _students_view(spage, hub, name)
                with timings.step(f"{name}: fetch in the Assignments tab"):
                    _assignments_tab(spage)
                    _row(spage, "released_assignments_list").get_by_role("button", name="Fetch", exact=True).click()
                    _row(spage, "fetched_assignments_list").wait_for(timeout=PAGE_MS)
                fetched = Path(who.pw_dir) / CHAPTER / f"{CHAPTER}.ipynb"
                assert fetched.is_file() and fetched.stat().st_uid == who.pw_uid, f"{name}'s fetch: {fetched}"
                # The answers, saved as JupyterLab saves the file (the typing is the learner test's).
                notebooks.write(fixtures.fill(notebooks.read(fetched), _answers(kind)), fetched)
                os.lchown(fetched, who.pw_uid, who.pw_gid)
                with timings.step(f"{name}: submit in the Assignments tab"):
                    _row(spage, "fetched_assignments_list").get_by_role("button", name="Submit", exact=True).click()
                    _row(spage, "submitted_assignments_list").wait_for(timeout=PAGE_MS)
                _shot(spage, gradebook, f"3-{name}-submitted")
            inbound = sorted(p.name.split("+")[0] for p in (exchange / "pytorch-devices" / "inbound").iterdir())
            assert inbound == sorted(STUDENTS), inbound

            with timings.step("instructor: Formgrader's Collect"):
                frame = _formgrader(page, hub)
                said = _formgrader_action(page, frame, "collect", "Successfully collected", gradebook,
                                          "4-instructor-collect")
            assert "cheating attempt" not in said, said
            for name in STUDENTS:
                assert (course / "submitted" / name / CHAPTER / f"{CHAPTER}.ipynb").is_file(), said

            with timings.step("instructor: make.py grade-class (3 submissions)"):
                env = setup.env(teacher, teacher=True)
                proc = subprocess.run(
                    unix_users.as_user(teacher, ["env", "-i", *[f"{k}={v}" for k, v in env.items()],
                                                 str(course_python), "make.py", "grade-class", CHAPTER]),
                    cwd=course, capture_output=True, text=True, timeout=1200)
            (ARTIFACTS / f"hub-{gradebook}-grade-class.txt").write_text(proc.stdout + "\n" + proc.stderr[-6000:])
            # Every student's feedback page, checked here and now: a failed export fails with
            # nbgrader's own error from grading.log, not minutes later as a browser timeout.
            _feedback_written(course, proc)
            assert proc.returncode == 0, f"grade-class: {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
            with open(course / "grades.csv", newline="") as f:
                rows = {r["student_id"]: r for r in csv.DictReader(f) if r["assignment"] == CHAPTER}
            scores = {name: float(rows[name]["score"]) for name in STUDENTS}
            top = float(rows["course-alice"]["max_score"])
            assert scores["course-alice"] == top and scores["course-carol"] == 0, scores
            assert 0 < scores["course-bob"] < top, scores
            assert {rows[name]["status"] for name in STUDENTS} == {"graded"}, rows
            if db_url:  # grade-class and Formgrader used the server gradebook, not a file beside it
                assert not (course / "gradebook.db").exists(), "a SQLite gradebook was made on the PostgreSQL run"

            with timings.step("instructor: Formgrader's Release feedback"):
                frame = _formgrader(page, hub)
                _formgrader_action(page, frame, "release-feedback", "Successfully released feedback", gradebook,
                                   "5-instructor-release-feedback")

            for name in STUDENTS:
                spage = pages[name]
                with timings.step(f"{name}: fetch feedback in the Assignments tab"):
                    spage.reload()
                    spage.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Nbgrader$")).wait_for()
                    _assignments_tab(spage)
                    submitted = _row(spage, "submitted_assignments_list")
                    submitted.first.wait_for(timeout=PAGE_MS)
                    assert submitted.count() == 1, f"{name} sees {submitted.count()} submissions"
                    submitted.get_by_role("button", name="Fetch Feedback", exact=True).click()
                    # nbgrader's "(view feedback)" is an <a> without href: no link role
                    submitted.locator("a", has_text="view feedback").first.wait_for(timeout=PAGE_MS)
                _shot(spage, gradebook, f"6-{name}-feedback")
                pages_html = sorted((Path(students[name].pw_dir) / CHAPTER / "feedback").rglob("*.html"))
                assert len(pages_html) == 1, f"{name}'s feedback: {pages_html}"
                html = pages_html[0].read_text(errors="replace")
                assert re.search(rf"Score:\s*{scores[name]:g}\s*/\s*{top:g}", html) or f"{scores[name]:g}" in html
                for other in STUDENTS:
                    if other != name:
                        assert other not in html, f"{name}'s feedback names {other}"
            # The exchange's feedback folder cannot be listed by a student: each finds their own
            # by the hash of what they submitted.
            listing = subprocess.run(unix_users.as_user(students["course-carol"],
                                                        ["ls", str(exchange / "pytorch-devices" / "feedback")]),
                                     capture_output=True, text=True, timeout=60)
            assert listing.returncode != 0 and "Permission denied" in listing.stderr, listing

            first_view = pages["course-alice"]
            first_view.locator("#submitted_assignments_list a", has_text="view feedback").first.click()
            first_view.locator(".jp-FileBrowser .jp-DirListing-itemText", has_text=f"{CHAPTER}.html").first.wait_for()
            _shot(first_view, gradebook, "7-course-alice-feedback-folder")
            # The feedback page itself, as the student opens it from there.
            mine = sorted((Path(students["course-alice"].pw_dir) / CHAPTER / "feedback").rglob("*.html"))[0]
            rel = mine.relative_to(students["course-alice"].pw_dir).as_posix()
            first_view.goto(f"{hub.url}/user/course-alice/files/{urllib.parse.quote(rel)}")
            first_view.get_by_text(re.compile(r"Score", re.I)).first.wait_for()
            _shot(first_view, gradebook, "8-course-alice-feedback-page")
    finally:
        if hub is not None:
            hub.stop()
            log = hub.log()
            (ARTIFACTS / f"hub-{gradebook}-hub.log").write_text(log[-200_000:])
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    summary = (f"A class on JupyterHub ({gradebook} gradebook), 3 students, {os.cpu_count()} cores, "
               f"load average at the end {load} (1, 5, 15 min):\n{timings.text()}\n")
    (ARTIFACTS / f"hub-class-{gradebook}.txt").write_text(summary)
    print(summary)
    critical = [line for line in log.splitlines() if re.match(r"\[[CE] ", line) and "Received signal SIGTERM" not in line]
    assert not critical, f"the hub logged errors: {critical[:20]}"
