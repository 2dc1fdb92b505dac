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
  Python for every user is Debian's python3.X (root's may lie under /root), reaching this
  suite's packages through a .pth file, in place of the pip install `make.py` would run
  (tests/unix_users.py).

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
given a db_url, as the guide says). Screenshots of each step go to test-artifacts/, and the
time of each step to test-artifacts/hub-class-<gradebook>.txt. Skipped, with a message, where
the suite is not root (users are made and servers started as them), or where Chromium,
configurable-http-proxy, Debian's python3.X or PostgreSQL is missing (.ci/run installs them).
"""

from __future__ import annotations

import contextlib
import csv
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

import unix_users
from browser_support import chromium_page
from course_copy import checkout_copy, free_port

from coursetools import layout, notebooks
from coursetools.author import fixtures

ROOT = layout.ROOT
CHAPTER = layout.assignments()[0]
RECIPE = ROOT / "deploy" / "jupyterhub"
ARTIFACTS = ROOT / "test-artifacts"
TEACHER = "course-teacher"
STUDENTS = {"course-alice": "all", "course-bob": "half", "course-carol": "none"}
PASSWORD = "class-on-a-hub-test"  # SharedPasswordAuthenticator wants 8 characters or more
COURSE_FOLDER = "pytorch-devices"   # deploy/jupyterhub/jupyterhub_config.py: COURSE_FOLDER
START_S = 180      # a hub and its proxy answered in ~3 s here; a server spawned in ~6-10 s
PAGE_MS = 120_000

pytestmark = [pytest.mark.timeout(1800)]


def _require() -> None:
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


def _wait_http(url: str, timeout_s: float, what: str, log: Path) -> None:
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

    def __init__(self, base: Path, python: Path, share: str, exchange: Path, etc: Path):
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
c.Authenticator.allowed_users = {set([TEACHER, *STUDENTS])!r}
c.JupyterHub.load_groups = {{"instructors": {{"users": [{TEACHER!r}]}}}}
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
""")
        self.log_path = self.dir / "hub.log"
        self._log = open(self.log_path, "w")
        env = {**os.environ, "COURSE_ETC_JUPYTER": str(etc)}
        self.proc = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(config)], cwd=self.dir,
                                     env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        _wait_http(f"{self.url}/hub/api", START_S, "JupyterHub", self.log_path)

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
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"hub-{gradebook}-{name}.png"
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


def _menu(page, item: str) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Nbgrader$")).click()
    page.get_by_role("menuitem", name=item, exact=True).click()


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
    dialog.locator("button.close").last.click()
    dialog.wait_for(state="detached", timeout=PAGE_MS)
    return text


def _students_view(page, hub: Hub, name: str) -> None:
    """A student's server has the Assignments tab and no Formgrader, in the menu and on the
    server (the hub's /etc/jupyter outranks the extensions' own enabling files)."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Nbgrader$")).click()
    items = page.locator(".lm-Menu-itemLabel:visible").all_inner_texts()
    page.keyboard.press("Escape")
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


def _server_env(who, python: Path, share: str, exchange: Path, etc: Path, teacher: bool) -> dict[str, str]:
    """The environment the hub gives a user's server (and so a terminal in it)."""
    config = [os.path.join(who.pw_dir, COURSE_FOLDER), str(etc / "instructor"), str(etc)] if teacher else [str(etc)]
    return {"HOME": who.pw_dir, "USER": who.pw_name, "SHELL": "/bin/bash", "LANG": "C.UTF-8",
            "PATH": f"{python.parent}:/usr/local/bin:/usr/bin:/bin", "PYTHONNOUSERSITE": "1",
            "JUPYTER_PATH": share, "JUPYTER_CONFIG_PATH": os.pathsep.join(config),
            "COURSE_EXCHANGE_ROOT": str(exchange), "JUPYTERHUB_USER": who.pw_name}


@pytest.fixture
def class_users():
    _require()
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
    folder = Path(tempfile.mkdtemp(prefix="course-hub-", dir="/tmp"))
    os.chmod(folder, 0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("gradebook", ["sqlite", "postgresql"])
def test_a_class_on_jupyterhub(gradebook, class_users, base, request):
    import make  # the stamps make.py checks before installing (make.layers)

    db_url = request.getfixturevalue("postgres_url") if gradebook == "postgresql" else None
    teacher = class_users[TEACHER]
    students = {name: class_users[name] for name in STUDENTS}
    timings = Timings()

    with timings.step("set-up: a Python for every user, the exchange, /etc/jupyter, the instructor's course"):
        some_student = next(iter(students.values()))
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

    hub, log = None, ""
    try:
        with timings.step("the hub and its proxy start"):
            hub = Hub(base, python, share, exchange, etc)
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
                env = _server_env(teacher, course_python, share, exchange, etc, teacher=True)
                proc = subprocess.run(
                    unix_users.as_user(teacher, ["env", "-i", *[f"{k}={v}" for k, v in env.items()],
                                                 str(course_python), "make.py", "grade-class", CHAPTER]),
                    cwd=course, capture_output=True, text=True, timeout=1200)
            (ARTIFACTS / f"hub-{gradebook}-grade-class.txt").write_text(proc.stdout + "\n" + proc.stderr[-6000:])
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
    summary = f"A class on JupyterHub ({gradebook} gradebook), 3 students:\n{timings.text()}\n"
    (ARTIFACTS / f"hub-class-{gradebook}.txt").write_text(summary)
    print(summary)
    critical = [line for line in log.splitlines() if re.match(r"\[[CE] ", line) and "Received signal SIGTERM" not in line]
    assert not critical, f"the hub logged errors: {critical[:20]}"
