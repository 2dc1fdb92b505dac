"""The course as a website (`python3 make.py site`, coursetools/publish/website.py).

The site is built once for this module, as `make.py site` builds it (the same module, run in
a child process) into a scratch folder; the lessons' execution cache is the one `make.py
site` uses (website/_build/jupyter_cache, git-ignored), so a second run of these tests, or a
maintainer's build, re-runs only the lessons whose code changed. Then:

* every lesson and every released exercise is a page, and nothing else is (the manifest the
  generator writes, the pages Sphinx wrote, and a fresh staging from the repository agree:
  the site is made from the notebooks, never edited by hand, and the built folder is not
  committed); each lesson shows the outputs of a real run, the figures included;
* no hidden test of solutions/, plain or encoded, is in any file of the build;
* every internal link and anchor resolves (offline), the cheat sheet's links to the sections
  that prove its rules included;
* "Open in Colab" and the download button on every notebook page, the download serving the
  repository's own notebook; each chapter's prerequisites and time on the home page; the
  "About these outputs" page names the PyTorch and the machine that produced the outputs;
* recorded GPU output (coursetools/author/gpu_records.py) renders, with its label and figure, on a
  small site built from a fixture lesson recorded on this machine;
* the Chinese edition under zh/: the same pages from the zh/ files, its lessons showing the
  English run's outputs (and refusing them for other code), a language switch on every page of
  both to the same page in the other language, its cheat sheet and MYTHS linking to its own
  sections and cells;
* in Chromium (the Playwright set-up of tests/learner/test_browser.py): the home page, a lesson with
  a figure, both menu drawers on a phone, the language switch there and back, an exercise page,
  a search for `non_blocking` and for a pasted error message (its cheat-sheet row first, in both
  editions), the dark theme, and one figure drawn by
  the course's helpers per chapter in the light and the dark theme (an opaque white card in both);
  screenshots go to test-artifacts/screenshots/ (committed).
"""

from __future__ import annotations

import base64
import contextlib
import html
import json
import posixpath
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import zlib
from pathlib import Path

import pytest

from coursetools.author import cheatsheet, gpu_records
from coursetools import layout, notebooks
from coursetools.publish import website

ROOT = layout.ROOT
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
CACHE = website.BUILD_DIR / "jupyter_cache"
BUILD_TIMEOUT_S = 1800   # a cold build runs every lesson once (9 minutes on a busy 2-core machine)
# The first test of the module builds the site in its setup: its time limit is the build's
# (pytest.ini's 600 s cut CI's cold build off), with room for the test itself.
pytestmark = pytest.mark.timeout(BUILD_TIMEOUT_S + 300)


def build_site(build_dir: Path, root: Path = ROOT, cache: Path = CACHE) -> dict:
    """`python -m coursetools.publish.website` (what `make.py site` runs) into `build_dir`; its summary."""
    cmd = [sys.executable, "-m", "coursetools.publish.website", "--build-dir", str(build_dir), "--cache", str(cache)]
    if root != ROOT:
        cmd += ["--root", str(root)]
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=layout.env_with_course_tools(), capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT_S)
    wall = time.perf_counter() - started
    assert proc.returncode == 0, f"the site build failed ({proc.returncode}):\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    summary = json.loads((build_dir / "site-build.json").read_text())
    summary["wall_s"] = wall
    summary["log"] = proc.stdout
    return summary


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    build_dir = tmp_path_factory.mktemp("site")
    summary = build_site(build_dir)
    ran = [e["lesson"] for e in summary["lessons"] if not e["reused"]]
    line = (f"site: {summary['pages']} pages, {summary['links_checked']} internal links checked, built in "
            f"{summary['wall_s']:.1f} s ({len(ran)} lesson(s) run, {len(summary['lessons']) - len(ran)} "
            f"from the cache)")
    print(line)
    (ROOT / "test-artifacts").mkdir(exist_ok=True)
    (ROOT / "test-artifacts" / "site-build.txt").write_text(line + "\n")
    return {"dir": build_dir, "html": build_dir / "html", "src": build_dir / "src", "src_zh": build_dir / "src-zh",
            "summary": summary}


def page_text(path: Path) -> str:
    """The text a reader sees on an HTML page (tags removed, entities decoded)."""
    raw = path.read_text(encoding="utf-8")
    raw = re.sub(r"<(script|style)\b.*?</\1>", " ", raw, flags=re.DOTALL)
    return html.unescape(re.sub(r"<[^>]+>", "", raw))


def html_of(page: str) -> str:
    return str(Path(page).with_suffix(".html"))


# --------------------------------------------------------------------------------------
# What the site holds, and where it comes from
# --------------------------------------------------------------------------------------

def test_every_lesson_and_exercise_is_a_page_and_nothing_else(site):
    """In both editions: the English site at the root, the Chinese one (zh/, made from the
    repository's zh/ files) under zh/."""
    expected = set()
    for edition, src in ((website.EN, site["src"]), (website.ZH, site["src_zh"])):
        manifest = json.loads((src / website.MANIFEST).read_text())["pages"]
        content = ROOT / edition.repo_dir if edition.repo_dir else ROOT
        lessons = [p.relative_to(content).as_posix() for p in layout.lessons(content)]
        exercises = [layout.release_notebook(a, content).relative_to(content).as_posix() for a in layout.assignments()]
        assert lessons and len(exercises) == len(layout.assignments()), f"the {edition.lang} edition lacks pages"
        for rel in [*lessons, *exercises]:
            assert manifest.get(rel, {}).get("origin") == edition.repo(rel), f"{edition.repo(rel)} is not a page of the site"
        assert not [p for p in manifest if "solutions/" in p], "a solution was staged"
        prefix = f"{edition.site_dir}/" if edition.site_dir else ""
        expected |= {prefix + html_of(p) for p in manifest} | {f"{prefix}genindex.html", f"{prefix}search.html"}
    # The pages Sphinx wrote are exactly the staged ones (and its own index and search).
    written = {p.relative_to(site["html"]).as_posix() for p in website.site_pages(site["html"])}
    assert written == expected, (f"pages not made from the repository: {sorted(written - expected)}; "
                                 f"staged but not written: {sorted(expected - written)}")
    assert site["summary"]["pages"] == len(written)


def test_site_is_made_from_the_notebooks_never_by_hand(site, tmp_path):
    """A fresh staging from the repository equals what the build rendered, byte for byte; the
    built folder is git-ignored and nothing of it is committed; each page's origin is the
    repository file as it is now (sha256 in the manifest)."""
    fresh = website.stage(ROOT, tmp_path / "src", website.EN, other=True)
    # The Chinese edition, with the English run's outputs from the cache (english_outputs).
    fresh_zh = website.stage(ROOT, tmp_path / "src-zh", website.ZH, other=True,
                             outputs=website.english_outputs(fresh, CACHE))
    for src, staged in ((site["src"], fresh), (site["src_zh"], fresh_zh)):
        built = {p.relative_to(src).as_posix(): p.read_bytes() for p in src.rglob("*") if p.is_file()}
        again = {p.relative_to(staged.folder).as_posix(): p.read_bytes() for p in staged.folder.rglob("*") if p.is_file()}
        built.pop("about.md")  # written after the lessons ran: it records when and where they ran
        assert built == again, f"staged files differ from a fresh staging: {sorted(k for k in built.keys() | again.keys() if built.get(k) != again.get(k))}"
        manifest = json.loads((src / website.MANIFEST).read_text())["pages"]
        for page, entry in manifest.items():
            if entry["origin"]:
                assert entry["sha256"] == website._sha256(ROOT / entry["origin"]), f"{page}: its origin changed"
    tracked = subprocess.run(["git", "ls-files", "website/_build"], cwd=ROOT, capture_output=True, text=True).stdout
    assert not tracked.strip(), f"built files are committed: {tracked}"
    ignored = subprocess.run(["git", "check-ignore", "-q", "website/_build/html/index.html"], cwd=ROOT)
    assert ignored.returncode == 0, ".gitignore must ignore website/_build/ (the built site)"


def test_lessons_show_real_outputs_and_figures(site):
    """Each lesson page holds every code cell of the notebook as it is now, and the outputs of
    its run: the setup cell's report of the PyTorch that ran it; figures are images on disk."""
    import torch

    figures = 0
    for lesson in layout.lessons():
        rel = lesson.relative_to(ROOT).as_posix()
        page = site["html"] / html_of(rel)
        text = " ".join(page_text(page).split())
        for index, cell in enumerate(notebooks.read(lesson).cells):
            if cell.cell_type == "code" and cell.source.strip():
                first = " ".join(cell.source.strip().splitlines()[0].split())
                assert first in text, f"{rel}: code cell {index} ({first[:60]!r}) is not on its page"
        assert f"PyTorch {torch.__version__} | device: cpu" in text, f"{rel}: no output of a run on this PyTorch"
        raw = page.read_text(encoding="utf-8")
        for src in re.findall(r'<img[^>]+src="([^"]*_images/[^"]+\.png)"', raw):
            image = (page.parent / src).resolve()
            assert image.exists() and image.stat().st_size > 1000, f"{rel}: figure {src} is missing or empty"
            figures += 1
    ran = [lesson for lesson in layout.lessons() if '"image/png"' in lesson.read_text()]
    assert not ran, f"a lesson stores a figure in the repository: {ran}"
    assert figures >= 3, f"only {figures} figures on the lesson pages; the lessons draw more"


def test_no_hidden_test_in_any_built_file(site):
    """Every line of solutions/ between BEGIN and END HIDDEN TESTS, plain or encoded
    (HTML-escaped, URL-encoded, base64, JSON-escaped), is absent from every file the build
    made (pages, sources, search index, images, doctrees, the execution cache). A line that
    the course publishes anyway (it also occurs in a lesson, a release or a document) is no
    secret and is not checked."""
    secrets = hidden_lines()
    assert len(secrets) > 100, f"only {len(secrets)} hidden-test lines found in solutions/"
    roots = [site["dir"], CACHE]
    found = leaks(secrets, roots)
    assert not found, "hidden tests are in the built site:\n" + "\n".join(found[:20])


def hidden_lines() -> list[str]:
    public = []
    for path in [*layout.lessons(), *(layout.release_notebook(a) for a in layout.assignments())]:
        public += [c.source for c in notebooks.read(path).cells]
    for doc in ("README.md", cheatsheet.SHEET, "docs/MYTHS.md"):
        public.append((ROOT / doc).read_text(encoding="utf-8"))
    published = "\n".join(public)
    lines = set()
    for name in layout.assignments():
        for cell in notebooks.read(layout.source_notebook(name)).cells:
            for block in re.findall(rf"{re.escape(notebooks.BEGIN_HIDDEN)}\n(.*?){re.escape(notebooks.END_HIDDEN)}",
                                    cell.source, re.DOTALL):
                lines |= {line.strip() for line in block.splitlines() if line.strip()}
    return sorted(line for line in lines if line not in published)


def encodings(line: str) -> dict[str, str]:
    """The ways a line can be written into a built file (the leak check's own test)."""
    return {"plain": line, "html": html.escape(line), "html-noquote": html.escape(line, quote=False),
            "html-#39": html.escape(line).replace("&#x27;", "&#39;"),
            "url": urllib.parse.quote(line), "url-plus": urllib.parse.quote_plus(line),
            "url-all": urllib.parse.quote(line, safe=""),
            "json": json.dumps(line)[1:-1], "json-unicode": json.dumps(line, ensure_ascii=False)[1:-1],
            "json-notebook": json.dumps({"cells": [{"source": ["x = 1\n", f"    {line}\n"]}]}, indent=1)}


BASE64_RUN = re.compile(rb"[A-Za-z0-9+/]{24,}={0,2}")
JSON_ESCAPE = re.compile(r'\\(["\\/bfnrt]|u[0-9a-fA-F]{4})')
WORD = re.compile(r"\w{4,}")


def _json_unescape(text: str) -> str:
    simple = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
    return JSON_ESCAPE.sub(lambda m: chr(int(m.group(1)[1:], 16)) if m.group(1)[0] == "u"
                           else simple.get(m.group(1), m.group(1)), text)


def decoded_views(data: bytes, name: str) -> list[str]:
    """A file's text with each encoding undone: as it is, tags removed and HTML entities
    decoded, URL-decoded, JSON string escapes decoded; the same for every base64 run in it
    (data: URIs, encoded files) and for objects.inv's zlib body."""
    texts = [data.decode("utf-8", errors="replace")]
    if name == "objects.inv":
        texts.append(zlib.decompress(data.split(b"\n", 4)[4]).decode("utf-8", errors="replace"))
    for run in BASE64_RUN.findall(data):
        try:
            texts.append(base64.b64decode(run + b"=" * (-len(run) % 4)).decode("utf-8", errors="ignore"))
        except ValueError:
            pass
    views = []
    for text in texts:
        views += [text, html.unescape(re.sub(r"<[^>]+>", "", text)), urllib.parse.unquote_plus(text),
                  urllib.parse.unquote(text), _json_unescape(text)]
    return views


def leaks(secrets: list[str], roots: list[Path]) -> list[str]:
    """Where a secret line is found in a file under `roots`, in any of the file's decoded
    views. (Each line is looked for only in views that hold its longest word: the same
    answer as looking everywhere, in seconds rather than minutes.)"""
    keyed: dict[str, list[str]] = {}
    unkeyed = []
    for line in secrets:
        # A word at either end of the line may run on into its neighbours in a file ("x" +
        # "assert" is one word): only words inside the line are keys.
        words = [m.group(0) for m in WORD.finditer(line) if m.start() > 0 and m.end() < len(line)]
        (keyed.setdefault(max(words, key=len), []) if words else unkeyed).append(line)
    found = []
    for root in roots:
        for path in sorted(p for p in Path(root).rglob("*") if p.is_file()):
            for view in decoded_views(path.read_bytes(), path.name):
                present = set(WORD.findall(view))
                candidates = unkeyed + [line for word in present & keyed.keys() for line in keyed[word]]
                found += [f"{path}: {line!r}" for line in candidates if line in view]
    return sorted(set(found))


def test_leak_check_finds_every_encoding(tmp_path):
    """The leak check itself: a hidden line written in each encoding is found."""
    line = 'assert out.device == torch.device("meta"), f"got {out.device!r} <&> 100% secret"'
    for kind, form in encodings(line).items():
        (tmp_path / f"{kind}.html").write_text(f"<p>before {form} after</p>")
    for prefix in ("", "x", "xy"):  # every base64 alignment
        blob = base64.b64encode(f"{prefix}{line}\n".encode()).decode()
        (tmp_path / f"b64-{len(prefix)}.js").write_text(blob)
        (tmp_path / f"b64-uri-{len(prefix)}.html").write_text(f'<img src="data:text/plain;base64,{blob}">')
    (tmp_path / "highlighted.html").write_text("".join(f"<span>{html.escape(ch)}</span>" for ch in line))
    (tmp_path / "objects.inv").write_bytes(b"# Sphinx inventory\n# Project: x\n# Version: \n# zlib\n"
                                           + zlib.compress(line.encode()))
    (tmp_path / "clean.html").write_text("<p>assert out.device == torch.device, nothing else</p>")
    found = leaks([line], [tmp_path])
    flagged = {Path(f.split(":", 1)[0]).name for f in found}
    expected = {p.name for p in tmp_path.iterdir()} - {"clean.html"}
    assert flagged == expected, f"missed: {sorted(expected - flagged)}; wrongly flagged: {sorted(flagged - expected)}"


# --------------------------------------------------------------------------------------
# Links, anchors, reader features
# --------------------------------------------------------------------------------------

def test_every_internal_link_and_anchor_resolves(site):
    broken, checked = website.check_links(site["html"])
    assert not broken, "broken links:\n" + "\n".join(broken[:30])
    assert checked > 500, f"only {checked} internal links were checked"


def test_link_check_finds_broken_links(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "index.html").write_text(
        '<a href="sub/page.html#here">ok</a> <a href="sub/page.html#gone">no anchor</a> '
        '<a href="missing.html">no file</a> <a href="https://example.org/x">external</a> '
        '<img src="sub/pic.png"> <a href="#top">ok</a> <a href="#nowhere">no anchor here</a>'
        '<h1 id="top">t</h1>')
    (tmp_path / "sub" / "page.html").write_text('<h2 id="here">h</h2> <a href="../index.html#top">back</a>')
    broken, checked = website.check_links(tmp_path)
    assert checked == 7
    assert sorted(b.split(" (")[0] for b in broken) == [
        "index.html: #nowhere", "index.html: missing.html", "index.html: sub/page.html#gone", "index.html: sub/pic.png"]


EDITIONS = pytest.mark.parametrize("edition", [website.EN, website.ZH], ids=["en", "zh"])


def edition_html(site, edition) -> Path:
    return site["html"] / edition.site_dir if edition.site_dir else site["html"]


@EDITIONS
def test_cheatsheet_links_go_to_the_section_that_proves_each_rule(site, edition):
    """Each rule's proof link on the site's cheat sheet carries the anchor of the lesson
    section it names (the link check above proves each anchor exists), in both editions (the
    Chinese one's anchors are its translated headings')."""
    html_dir = edition_html(site, edition)
    raw = (html_dir / "CHEATSHEET.html").read_text(encoding="utf-8")
    rules = [r for lesson in layout.lessons() for r in cheatsheet.read_rules(lesson)[0]]
    word = "chapter" if edition is website.EN else "第"
    proof_links = re.findall(rf'href="(course/[^"#]+\.html)#([^"]+)"[^>]*>\s*(?:<[^>]+>)*\s*{word}', raw)
    english_links = re.findall(r'href="(course/[^"#]+\.html)#([^"]+)"[^>]*>\s*(?:<[^>]+>)*\s*chapter',
                               (site["html"] / "CHEATSHEET.html").read_text(encoding="utf-8"))
    checked: list[str] = []
    assert len(proof_links) == len(rules), (
        f"{len(rules)} rules, {len(proof_links)} proof links with an anchor on the site's cheat sheet")
    for (page, anchor), rule in zip(proof_links, rules):
        assert page == f"course/{Path(rule.notebook).stem}.html"
        title = rule.section.split(" ", 1)[1] if " " in rule.section else rule.section
        heading = re.search(rf'<section id="{re.escape(anchor)}">\s*(?:<span[^>]*></span>)?\s*<h\d[^>]*>(.*?)</h\d>',
                            (html_dir / page).read_text(encoding="utf-8"), re.DOTALL)
        assert heading, f"{page}: no section #{anchor}"
        shown = " ".join(html.unescape(re.sub(r"<[^>]+>", "", heading.group(1))).split()).rstrip("#")
        if edition is website.EN:
            plain = " ".join(title.replace("`", "").split())
            assert plain in shown, f"rule {rule.sentence[:50]!r} links to #{anchor} ({shown!r}), not to {title!r}"
        else:  # the same section as the English sheet's link: the heading at the same place
            en_page, en_anchor = english_links[len(checked)]
            sections = [re.findall(r'<section id="([^"]+)">', (d / page).read_text(encoding="utf-8"))
                        for d in (site["html"], html_dir)]
            assert en_page == page and sections[0].index(en_anchor) == sections[1].index(anchor), (
                f"zh: rule {rule.sentence[:50]!r} links to #{anchor} ({shown!r}), the English sheet to "
                f"{en_page}#{en_anchor}")
        checked.append(anchor)


def test_colab_and_download_on_every_notebook_page(site):
    cfg = layout.config()
    manifest = json.loads((site["src"] / website.MANIFEST).read_text())["pages"]
    notebooks_pages = [p for p, entry in manifest.items() if p.endswith(".ipynb")]
    assert len(notebooks_pages) == len(layout.lessons()) + len(layout.assignments())
    for page in notebooks_pages:
        raw = (site["html"] / html_of(page)).read_text(encoding="utf-8")
        assert f'href="{cfg.colab_url(page)}"' in raw, f"{page}: no 'Open in Colab' button for {cfg.colab_url(page)}"
        depth = "../" * page.count("/")
        assert f'href="{depth}_sources/{page}"' in raw, f"{page}: no download button for the notebook"
        served = site["html"] / "_sources" / page
        assert served.read_bytes() == (ROOT / page).read_bytes(), (
            f"{page}: the download is not the repository's notebook")
        assert "colab-badge.svg" not in raw or "colab.research.google.com/assets" not in raw, (
            f"{page}: the Colab badge image is fetched from Google")


def test_home_page_gives_each_chapter_its_prerequisites_and_time(site):
    text = " ".join(page_text(site["html"] / "index.html").split())
    for lesson in layout.lessons():
        facts = website.header_facts(notebooks.read(lesson))
        assert facts, f"{lesson.name}: no prerequisites and time in its header"
        assert website.short_time(facts[1]) in text, f"the home page lacks {lesson.name}'s time ({facts[1]!r})"
        first_part = min(p for p in layout.lessons() if p.stem[:2] == lesson.stem[:2])
        if lesson == first_part:  # a later part's prerequisite is the first part
            prereq = " ".join(re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", facts[0]).replace("`", "").split())
            assert prereq in text, f"the home page lacks {lesson.name}'s prerequisites ({prereq!r})"


def test_about_page_names_the_pytorch_and_machine_of_the_outputs(site):
    import torch

    text = " ".join(page_text(site["html"] / "about.html").split())
    assert f"| {torch.__version__} | cpu |" in (site["src"] / "about.md").read_text(), "the table lacks this PyTorch"
    assert torch.__version__ in text
    facts = website.machine()
    for lesson in site["summary"]["lessons"]:
        assert lesson["torch"] == torch.__version__, f"{lesson['lesson']}: outputs of PyTorch {lesson['torch']}"
        assert lesson["machine"], f"{lesson['lesson']}: no record of the machine that ran it"
        assert lesson["seconds"] > 1.0, f"{lesson['lesson']}: 'ran' in {lesson['seconds']} s"
    if all(lesson["machine"] == facts for lesson in site["summary"]["lessons"]):
        assert facts["cpu"] in text and f"{facts['cores']} cores" in text


def test_site_build_downloads_nothing():
    """The build refuses every connection that leaves this machine (no packet is sent)."""
    import socket

    with website.offline():
        with pytest.raises(website.SiteError, match="nothing may be downloaded"):
            socket.create_connection(("192.0.2.1", 80), timeout=1)
        with socket.socket() as server:  # loopback stays allowed (the kernels' own sockets)
            server.bind(("127.0.0.1", 0))
            server.listen(1)
            socket.create_connection(server.getsockname(), timeout=5).close()


def test_built_pages_fetch_nothing_from_elsewhere(site):
    """No page loads a script, a style sheet, a font or an image from another site."""
    outside = set()
    for page in website.site_pages(site["html"]):
        raw = page.read_text(encoding="utf-8")
        outside |= set(re.findall(r'<(?:script|link|img|source|iframe)\b[^>]*(?:src|href)="((?:https?:)?//[^"]+)"', raw))
    assert not outside, f"the pages load from elsewhere: {sorted(outside)[:10]}"


# --------------------------------------------------------------------------------------
# Recorded GPU output
# --------------------------------------------------------------------------------------

PART_2 = {"cells": [
    {"cell_type": "markdown", "metadata": {}, "source": (
        "# 00 · A tiny lesson, part 2: one more cell\n\n"
        "**Prerequisites:** [part 1](00_tiny.ipynb). **Time:** about 2 minutes to read: 12 words.")},
    {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": "print(6 * 7)"}],
    "metadata": {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}},
    "nbformat": 4, "nbformat_minor": 5}


@pytest.fixture(scope="module")
def tiny_site(tmp_path_factory):
    """A site built from a fixture repository: chapter 00 in two parts, part 1 being
    tests/fixtures_gpu/tiny_lesson.json with its GPU-dependent cells recorded (run on this
    machine, so its blocks are labelled with what this machine is), part 2 a one-cell lesson."""
    from coursetools.evidence import gpu_report, standalone

    scratch = tmp_path_factory.mktemp("tiny-site")
    repo = scratch / "repo"
    lesson = notebooks.read(ROOT / "tests" / "fixtures_gpu" / "tiny_lesson.json")
    lesson.cells[0].source += "\n\n**Prerequisites:** none. **Time:** about 1 minute."
    run = standalone.run_notebook(lesson, scratch / "record", filename="tiny.ipynb", strict=False)
    assert not run.problems, run.problems
    device = gpu_records.device_from(gpu_report.machine())
    recorded, notes = gpu_records.write_blocks(lesson, run.executed_nb.cells, device)
    assert not notes and sum(map(gpu_records.is_block, recorded.cells)) == 4
    notebooks.write(recorded, repo / "course" / "00_tiny.ipynb")
    (repo / "course" / "00_tiny_2.ipynb").write_text(json.dumps(PART_2))
    (repo / "solutions").mkdir()
    (repo / "README.md").write_text("# Tiny\n\nA fixture course.\n\n## Two commands\n\nNone.\n")
    (repo / "docs").mkdir()
    (repo / "docs" / "INSTRUCTORS.md").write_text("# Instructors' guide\n\nNothing to grade.\n")
    build_site(scratch / "build", root=repo, cache=scratch / "cache")
    return {"html": scratch / "build" / "html", "src": scratch / "build" / "src", "recorded": recorded,
            "device": device}


def test_recorded_gpu_blocks_render_with_their_labels(tiny_site):
    """A lesson with record blocks: each is a collapsed <details> whose summary is the
    block's label, holding the recorded text and, for the figure, an image on disk."""
    page = tiny_site["html"] / "course" / "00_tiny.html"
    raw = page.read_text(encoding="utf-8")
    blocks = re.findall(r"<details>(.*?)</details>", raw, re.DOTALL)
    expected = [c.source for c in tiny_site["recorded"].cells if gpu_records.is_block(c)]
    assert len(blocks) == len(expected) == 4, f"{len(blocks)} <details> blocks on the page, {len(expected)} recorded"
    for shown, source in zip(blocks, expected):
        summary = re.search(r"<summary>(.*?)</summary>", shown, re.DOTALL).group(1)
        label = re.search(r"<summary>(.*?)</summary>", source, re.DOTALL).group(1)
        assert html.unescape(summary).strip() == label.strip()
        assert "cell_sha256" not in page_text_of(shown), "the block's data line is shown"
        for text in re.findall(r"```text\n(.*?)\n```", source, re.DOTALL):
            assert html.escape(text.splitlines()[0], quote=False) in shown, f"recorded text {text[:60]!r} not shown"
        if "attachment:" in source:
            images = re.findall(r'<img[^>]+src="([^"]+)"', shown)
            assert images, "the recorded figure is not shown"
            path = (page.parent / images[0]).resolve()
            assert path.exists() and path.stat().st_size > 1000, f"the figure {images[0]} is not in the site"
    assert tiny_site["device"].label().split(" the cell")[0] in html.unescape(raw)


def test_a_chapter_in_parts_is_one_chapter_of_the_map(tiny_site):
    """Lessons 00_tiny and 00_tiny_2: one sidebar caption, one course-map row, both parts
    with their times, each part a page with its own Colab link."""
    index = (tiny_site["src"] / "index.md").read_text()
    assert index.count(":caption: 00 ·") == 1, index
    assert "00 A tiny lesson for the GPU-record tests, part 1 <course/00_tiny>" in index, index
    assert "00 A tiny lesson for the GPU-record tests, part 2 <course/00_tiny_2>" in index, index
    rows = [line for line in index.splitlines() if line.startswith("| 00 |")]
    assert len(rows) == 1 and "about 1 minute" in rows[0] and "about 2 minutes to read" in rows[0], rows
    assert "12 words" not in rows[0], "the course map shows the time up to its first colon"
    raw = (tiny_site["html"] / "course" / "00_tiny_2.html").read_text(encoding="utf-8")
    assert layout.config().colab_url("course/00_tiny_2.ipynb") in raw and "42" in page_text(
        tiny_site["html"] / "course" / "00_tiny_2.html")


# --------------------------------------------------------------------------------------
# Navigation, "last verified", exercise pages, links to cells
# --------------------------------------------------------------------------------------

def sidebar_entries(raw: str) -> list[str]:
    """The sidebar's page entries (the course map's toctrees), as a reader sees them."""
    nav = re.search(r'<nav class="bd-links bd-docs-nav".*?</nav>', raw, re.DOTALL)
    assert nav, "no sidebar navigation on the page"
    return [" ".join(html.unescape(re.sub(r"<[^>]+>", "", a)).split())
            for a in re.findall(r'<a class="reference internal"[^>]*>(.*?)</a>', nav.group(0), re.DOTALL)]


def test_sidebar_entries_say_what_each_page_is(site):
    """"01 Device basics", "05 Mixed precision, part 2", "01 Exercise: device basics": each
    entry names its chapter and page, none is a bare "Lesson" or "Exercise"."""
    entries = sidebar_entries((site["html"] / "index.html").read_text(encoding="utf-8"))
    assert not [e for e in entries if re.fullmatch(r"(Lesson|Exercise)(, part \d+)?", e)], entries
    chapters = site_chapters()
    for ch in chapters:
        several = len(ch.lessons) > 1
        for i, lesson in enumerate(ch.lessons):
            want = f"{ch.number} {ch.title.replace('`', '')}" + (f", part {ch.part_number(i)}" if several else "")
            assert want in entries, f"no sidebar entry {want!r} for {lesson.path}: {entries}"
        if ch.exercise:
            want = f"{ch.number} Exercise: {website.lower_first(ch.title.replace('`', '').split(':')[0].strip())}"
            assert want in entries, f"no sidebar entry {want!r} for {ch.exercise}: {entries}"
    assert len(set(entries)) == len(entries), f"two sidebar entries read the same: {entries}"
    for want in ("01 Device basics", "01 Exercise: device basics", "03 Exercise: Module.to() vs Tensor.to()",
                 "05 Mixed precision (AMP), part 2", "08 Exercise: troubleshooting"):
        assert want in entries, f"no sidebar entry {want!r}: {entries}"
    assert layout.config().title not in entries, f"a sidebar entry repeats the site's title (shown above it): {entries}"
    zh = sidebar_entries((site["html"] / "zh" / "index.html").read_text(encoding="utf-8"))
    for want in ("01 设备基础", "01 练习：设备基础", "05 混合精度（AMP），第 2 部分", "08 练习：排错", "学习者指南", "速查表"):
        assert want in zh, f"no sidebar entry {want!r} in the Chinese edition: {zh}"
    assert len(set(zh)) == len(zh), f"two sidebar entries read the same: {zh}"


def site_chapters() -> list:
    """The course map's chapters, as a fresh staging reads them from the repository."""
    import tempfile
    with tempfile.TemporaryDirectory() as scratch:
        return website.stage(ROOT, Path(scratch)).chapters


def test_one_search_box_and_a_favicon(site):
    """The search button of the article header (there at every width) is the page's only
    search box in the layout a desktop shows; the favicon is the site's own SVG."""
    for page in ("index.html", "course/01_device_basics.html"):
        raw = (site["html"] / page).read_text(encoding="utf-8")
        sidebar = re.search(r'<div id="pst-primary-sidebar".*?<nav class="bd-links', raw, re.DOTALL).group(0)
        assert "search-button" not in sidebar, f"{page}: a second search box in the sidebar"
        assert re.search(r'<div class="article-header-buttons">.*?class="[^"]*\bsearch-button\b', raw, re.DOTALL), (
            f"{page}: no search button in the article header")
        icon = re.search(r'<link rel="icon" href="([^"]+)"', raw)
        assert icon and icon.group(1).endswith("_static/favicon.svg"), f"{page}: no favicon link ({icon})"
    svg = (site["html"] / "_static" / "favicon.svg").read_text(encoding="utf-8")
    assert svg.lstrip().startswith("<svg") and "http" not in svg.replace("http://www.w3.org/2000/svg", "")


def test_every_page_says_when_its_outputs_were_last_verified(site):
    """"Last verified: PyTorch X, run on DATE (about these outputs)" on every page: the
    PyTorch and the date of the latest run whose outputs the site shows."""
    lessons = site["summary"]["lessons"]
    torch_versions = ", ".join(sorted({e["torch"] for e in lessons}))
    date = max(e["executed_at"] for e in lessons)[:10]
    wants = {"en": f"Last verified: PyTorch {torch_versions}, run on {date}",
             "zh": f"最近验证：PyTorch {torch_versions.replace(', ', '、')}，运行于 {date}"}
    for path in website.site_pages(site["html"]):
        raw = path.read_text(encoding="utf-8")
        line = re.search(r'<p class="course-last-verified">(.*?)</p>', raw, re.DOTALL)
        rel = path.relative_to(site["html"]).as_posix()
        want = wants["zh" if rel.startswith("zh/") else "en"]
        assert line, f"{rel}: no 'Last verified' line"
        assert want in " ".join(page_text_of(line.group(1)).split()), f"{rel}: {line.group(1)!r}, want {want!r}"
        about_page = "zh/about.html" if rel.startswith("zh/") else "about.html"
        about = "#" if rel == about_page else posixpath_rel(about_page, rel)
        assert f'href="{about}"' in line.group(1), f"{rel}: 'Last verified' does not link to {about}"


def posixpath_rel(target: str, page: str) -> str:
    import posixpath
    return posixpath.relpath(target, posixpath.dirname(page) or ".")


def test_exercise_pages_collapse_the_locked_setup_and_advise_a_web_reader(site):
    """Every locked code cell before question 1 is collapsed (`hide-input`, in the staged copy
    only); the note at the top says how a web or Colab reader checks an answer."""
    for assignment in layout.assignments():
        rel = layout.release_notebook(assignment).relative_to(ROOT).as_posix()
        original = notebooks.read(ROOT / rel)
        assert not any("hide-input" in c.metadata.get("tags", []) for c in original.cells), (
            f"{rel}: the repository's notebook carries the site's tag")
        first_question = next(i for i, c in enumerate(original.cells)
                              if c.cell_type == "markdown" and website.QUESTION.search(c.source)
                              or c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution"))
        locked = [c for c in original.cells[:first_question]
                  if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("locked")]
        assert locked, f"{rel}: no locked setup cell before question 1"
        raw = (site["html"] / html_of(rel)).read_text(encoding="utf-8")
        article = raw[raw.index('<article class="bd-article"'):]
        head = article.split("<h2", 1)[0] if original.cells[first_question].cell_type == "markdown" \
            else article.split('<div class="cell tag_raises-exception', 1)[0]
        cells = re.findall(r'<div class="cell (?:tag_[\w-]+ )*docutils container[^"]*"', head)
        assert len(cells) == len(locked), (rel, cells)
        assert all("tag_hide-input" in c for c in cells), f"{rel}: a locked cell before question 1 is not collapsed"
        note = " ".join(page_text(site["html"] / html_of(rel)).split())
        for words in ("Open in Colab", "run each test cell", "The hidden tests, which decide the grade, run only"):
            assert words in note, f"{rel}: the web reader's note lacks {words!r}"


@EDITIONS
def test_cheatsheet_and_myths_link_to_the_exact_cell(site, edition):
    """Each "cell [k]" of the cheat sheet and each "proven in" cell of MYTHS links to
    `course/NN.html#cell-k`, and the anchor stands right before the k-th code cell (the link
    check proves the anchors exist); in the Chinese edition, "单元格 [k]" and the Chinese
    lessons' cells."""
    html_dir = edition_html(site, edition)
    sheet = (html_dir / "CHEATSHEET.html").read_text(encoding="utf-8")
    rules = [r for lesson in layout.lessons() for r in cheatsheet.read_rules(lesson)[0]]
    word = "cell" if edition is website.EN else "单元格"
    links = re.findall(rf'<a href="(course/[^"#]+\.html)#cell-(\d+)">{word} \[(\d+)\]</a>', sheet)
    assert len(links) == len(rules), f"{len(rules)} rules, {len(links)} '{word} [k]' links on the cheat sheet"
    myths = (html_dir / "docs" / "MYTHS.html").read_text(encoding="utf-8")
    myth_links = re.findall(r'href="\.\./(course/[^"#]+\.html)#cell-(\d+)"', myths)
    assert len(myth_links) >= 30, f"MYTHS' 'proven in' column links to {len(myth_links)} cells"
    targets = {(page, int(k)) for page, k, *_ in links} | {(page, int(k)) for page, k in myth_links}
    for page, k in sorted(targets):
        raw = (html_dir / page).read_text(encoding="utf-8")
        after = raw.split(f'id="cell-{k}"', 1)
        assert len(after) == 2, f"{page}: no #cell-{k}"
        shown = " ".join(page_text_of(re.search(r'<div class="cell_input.*?</pre>', after[1], re.DOTALL).group(0)).split())
        lesson = ROOT / edition.repo("course") / (Path(page).stem + ".ipynb")
        source = website.code_cells(lesson)[k - 1]
        assert " ".join(source.split())[:60] in shown, f"{page}#cell-{k} is not code cell [{k}]: {shown[:80]!r}"


def test_the_chinese_edition_shows_the_english_runs_outputs(site):
    """Each Chinese lesson page shows the outputs of the English lesson's run (the same code
    cells, comments translated: coursetools/publish/website.py, english_outputs): as many
    outputs and figures as the English page, the same setup report, the Chinese text."""
    import torch

    for lesson in layout.lessons():
        rel = lesson.relative_to(ROOT).as_posix()
        en = (site["html"] / html_of(rel)).read_text(encoding="utf-8")
        zh = (site["html"] / "zh" / html_of(rel)).read_text(encoding="utf-8")
        for what in ('class="cell_output', "<img "):
            assert zh.count(what) == en.count(what), (
                f"zh/{rel}: {zh.count(what)} of {what!r}, the English page {en.count(what)}")
        text = " ".join(page_text(site["html"] / "zh" / html_of(rel)).split())
        assert f"PyTorch {torch.__version__} | device: cpu" in text, f"zh/{rel}: no output of the English run"
        title = website.title_of(notebooks.read(ROOT / "zh" / rel), lesson.stem, website.ZH)
        assert re.search(r"[\u4e00-\u9fff]", title) and title.replace("`", "") in text, f"zh/{rel}: not the Chinese lesson"
    assert '<html lang="zh-CN"' in (site["html"] / "zh" / "index.html").read_text(encoding="utf-8")


def test_the_chinese_edition_refuses_outputs_of_other_code(site, tmp_path):
    """A Chinese lesson whose code is not the English lesson's (beyond comments) gets no
    outputs from the English run: the build stops, naming the cell and the fix."""
    rel = layout.lessons()[1].relative_to(ROOT).as_posix()
    ran = website.Staged(site["src"], {}, [rel], [])
    fill = website.english_outputs(ran, CACHE)
    nb = notebooks.read(ROOT / "zh" / rel)
    fill(rel, nb)  # the Chinese lesson as it is: outputs copied
    assert any(c.get("outputs") for c in nb.cells if c.cell_type == "code")
    code = [c for c in nb.cells if c.cell_type == "code"]
    code[2].source = "# 只改了注释\n" + code[2].source  # a comment more: still the same code
    fill(rel, nb)
    code[2].source += "\nprint('one more line')"
    with pytest.raises(website.SiteError, match=r"code cell \[3\].*i18n build"):
        fill(rel, nb)
    assert website.same_code("x = 1  # one\n", "x = 1  # 一\n")
    assert not website.same_code("x = 1\n", "x = 2\n")
    assert not website.same_code("%%time\nx = 1\n", "x = 1\n")


def test_every_page_switches_to_the_same_page_in_the_other_language(site):
    """The language switch on every page of each edition opens the same page in the other
    one (its home page where the other edition has no such page), and names the language in
    that language."""
    pages = {p.relative_to(site["html"]).as_posix() for p in website.site_pages(site["html"])}
    for rel in sorted(pages):
        raw = (site["html"] / rel).read_text(encoding="utf-8")
        switch = re.search(r'<a class="btn btn-sm course-language-switch" href="([^"]+)"\s+hreflang="([^"]+)"[^>]*>([^<]+)</a>', raw)
        assert switch, f"{rel}: no language switch"
        chinese = rel.startswith("zh/")
        counterpart = rel.removeprefix("zh/") if chinese else f"zh/{rel}"
        target = posixpath.normpath(posixpath.join(posixpath.dirname(rel), switch.group(1)))
        expected = counterpart if counterpart in pages else ("index.html" if chinese else "zh/index.html")
        assert target == expected, f"{rel}: the switch goes to {target}, not {expected}"
        assert (switch.group(2), switch.group(3).strip()) == (("en", "English") if chinese else ("zh-CN", "中文")), rel


@EDITIONS
def test_every_error_row_has_an_anchor_and_an_index_entry(site, edition):
    """Each row of the cheat sheet's error table is an anchor on the site's page, and the
    search page's error index (_static/course-errors.json) lists it with its link: what lets a
    pasted message's first result be its row (tests/publish/test_site_search.py tests the
    matching in the browser)."""
    from coursetools.publish import site_search

    html_dir = edition_html(site, edition)
    rows = site_search.error_rows((ROOT / edition.repo(cheatsheet.SHEET)).read_text(encoding="utf-8"))
    page = (html_dir / "CHEATSHEET.html").read_text(encoding="utf-8")
    index = json.loads((html_dir / site_search.INDEX_FILE).read_text(encoding="utf-8"))
    assert len(rows) >= 30 and [e["anchor"] for e in index] == [r.anchor for r in rows]
    for row, entry in zip(rows, index):
        assert f'id="{row.anchor}"' in page, f"{edition.lang}: no anchor {row.anchor} on the cheat sheet"
        assert entry["url"] == f"CHEATSHEET.html#{row.anchor}" and entry["message"] == row.message


@EDITIONS
def test_a_search_hits_chapter_links_go_to_the_section_that_explains_it(site, edition):
    """Each section the error index names ("08 §2 row 4") is a link to that section's heading on
    the built lesson page, in the search's index and on the cheat sheet: the English heading
    carries the number (or "Row k"), the Chinese one is the heading at the same place."""
    from coursetools.publish import site_search

    html_dir = edition_html(site, edition)
    index = json.loads((html_dir / site_search.INDEX_FILE).read_text(encoding="utf-8"))
    sheet = (html_dir / "CHEATSHEET.html").read_text(encoding="utf-8")

    def headings(page_dir: Path, page: str) -> list[tuple[str, str]]:
        """(id, heading text) of each section of a built page, ids of the heading's <span> included."""
        raw = (page_dir / page).read_text(encoding="utf-8")
        found = re.findall(r'<section id="([^"]+)">\s*((?:<span id="[^"]+"></span>)*)\s*<h\d[^>]*>(.*?)</h\d>', raw, re.DOTALL)
        return [(" ".join([sid, *re.findall(r'id="([^"]+)"', spans)]), page_text_of(text).rstrip("#").strip())
                for sid, spans, text in found]

    found: list[tuple[str, int]] = []   # (page, its section's place) of each link of the index
    for entry in index:
        assert entry["chapters"], entry["message"]
        for where in entry["chapters"]:
            page, _, anchor = where["url"].partition("#")
            assert anchor, f"{edition.lang}: {entry['message']!r}: {where['label']} links to the top of {page}"
            sections = headings(html_dir, page)
            at = next((i for i, (ids, _) in enumerate(sections) if anchor in ids.split()), None)
            assert at is not None, f"{edition.lang}: {page} has no section #{anchor}"
            label = re.match(r"(\d\d) §([\d.]+)(?: row (\d+)| 第 (\d+) 行)?$", where["label"])
            assert label and page.startswith(f"course/{label[1]}_"), where
            english = headings(site["html"], page)[at][1]
            expected = f"Row {label[3] or label[4]} " if (label[3] or label[4]) else f"{label[2]}{'.' if '.' not in label[2] else ''} "
            assert english.startswith(expected), f"{where['label']} links to {english!r}"
            found.append((page, at))
        # The cheat sheet's row links to the same sections (myst writes the section's own id).
        row = re.search(rf'<tr[^>]*>\s*<td><p><span id="{entry["anchor"]}".*?</tr>', sheet, re.DOTALL)
        links = re.findall(r'href="(course/[^"#]+)#([^"]+)"', row.group(0).rsplit("<td>", 1)[1])
        assert [(page, next(i for i, (ids, _) in enumerate(headings(html_dir, page)) if anchor in ids.split()))
                for page, anchor in links] == found[-len(entry["chapters"]):], (edition.lang, entry["message"], links)
    assert len(found) >= len(index) >= 30, (len(found), len(index))


def test_every_myths_citation_names_a_cell_the_lesson_has(site):
    """A "proven in" citation that matches no code cell stays plain text; the build lists it.
    This fails while docs/MYTHS.md quotes a comment line the lesson no longer has."""
    assert site["summary"]["unlinked_myths_proofs"] == [], (
        "docs/MYTHS.md cites cells by comment lines no code cell has (fix the quotes): "
        f"{site['summary']['unlinked_myths_proofs']}")


def page_text_of(fragment: str) -> str:
    return html.unescape(re.sub(r"<!--.*?-->", "", re.sub(r"<[^>]+>", "", fragment), flags=re.DOTALL))


# --------------------------------------------------------------------------------------
# In the browser
# --------------------------------------------------------------------------------------

import browser_support  # noqa: E402  (tests/ is on sys.path)
from browser_support import chromium_page, corner_pixel, screenshot_around  # noqa: E402

try:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
except ImportError:  # the browser test skips without playwright (browser_support)
    PlaywrightTimeout = TimeoutError


@pytest.fixture
def browser_page():
    """A headless Chromium page (Debian's browser, as tests/learner/test_browser.py), closed after."""
    with chromium_page(None, "the site's browser test") as page:
        yield page


def shot(page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / name
    page.screenshot(path=str(path))
    return path


def test_site_in_the_browser(site, browser_page):
    """Served as `make.py site --serve` serves it: home, a lesson with a figure, an exercise,
    search for `non_blocking`, the dark theme; nothing is loaded from another host."""
    page = browser_page
    httpd = website.server(site["html"], port=0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    requested_elsewhere: list[str] = []
    failed: list[str] = []
    page.on("request", lambda r: requested_elsewhere.append(r.url) if not r.url.startswith(base) else None)
    page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    try:
        page.goto(f"{base}/index.html")
        home = shot(page, "site-home.png")
        titles = [t.strip() for t in page.locator(".bd-sidebar-primary .caption-text").all_inner_texts()]
        numbers = sorted({p.stem[:2] for p in layout.lessons()})
        assert [t.split(" · ")[0] for t in titles] == [*numbers, "Reference"], (
            f"the sidebar does not follow the course map: {titles} ({home})")
        for number, title in zip(numbers, titles):
            first = next(p for p in layout.lessons() if p.stem[:2] == number)
            assert title.split(" · ", 1)[1] in website.title_of(notebooks.read(first), first.stem).replace("`", "")

        # A lesson with a figure: the first image of its outputs, loaded.
        lesson = next(p for p in layout.lessons() if re.search(
            r'class="cell_output[^"]*">\s*<img[^>]+_images/[^"]+\.png"',
            (site["html"] / "course" / f"{p.stem}.html").read_text(encoding="utf-8")))
        page.goto(f"{base}/course/{lesson.stem}.html")
        figure = page.locator(".cell_output img").first
        figure.scroll_into_view_if_needed()
        page.wait_for_function("img => img.complete && img.naturalWidth > 100", arg=figure.element_handle())
        page.wait_for_timeout(300)
        lesson_shot = shot(page, "site-lesson-figure.png")
        launch = page.locator(f'a[href="{layout.config().colab_url(f"course/{lesson.name}")}"]')
        assert launch.count() >= 1, f"no Open in Colab button on {lesson.name} ({lesson_shot})"

        # The menu buttons a reader sees (two .primary-toggle on each page; the themes bind the first,
        # website/_static/course-toggles.js forwards the visible one). Desktop: ☰ collapses the
        # course map and brings it back. Phone: ☰ opens the course map's drawer, the other button the
        # page contents'.
        sidebar = page.locator("#pst-primary-sidebar")
        page.locator(".primary-toggle:visible").first.click()
        gone = "() => { const b = document.querySelector('#pst-primary-sidebar').getBoundingClientRect(); return b.right <= 0 || b.width === 0; }"
        with contextlib.suppress(PlaywrightTimeout):   # the sidebar slides out: wait for it, however busy the machine
            page.wait_for_function(gone, timeout=20_000)
        collapsed = shot(page, "site-menu-collapsed.png")
        box = sidebar.bounding_box()
        assert box is None or box["x"] + box["width"] <= 0 or box["width"] == 0, (
            f"☰ did not collapse the course map at 1400 px: it is at {box} ({collapsed})")
        page.locator(".primary-toggle:visible").first.click()
        page.wait_for_function("() => document.querySelector('#pst-primary-sidebar').getBoundingClientRect().left >= 0")
        assert sidebar.bounding_box()["width"] > 100, f"☰ did not bring the course map back ({collapsed})"
        page.set_viewport_size({"width": 390, "height": 844})
        page.reload()
        for toggle, drawer, inside in ((".primary-toggle", "#pst-primary-sidebar-modal", "01 · "),
                                       (".secondary-toggle", "#pst-secondary-sidebar-modal", "")):
            page.locator(f"{toggle}:visible").first.click()
            with contextlib.suppress(PlaywrightTimeout):
                page.wait_for_function("d => document.querySelector(d).open", arg=drawer, timeout=20_000)
            phone = shot(page, f"site-phone-{toggle.strip('.').split('-')[0]}-drawer.png")
            assert page.evaluate("d => document.querySelector(d).open", drawer) and page.locator(drawer).is_visible() \
                and inside in page.locator(drawer).inner_text(), (
                f"the {toggle} button opened no drawer at 390 px ({phone})")
            page.keyboard.press("Escape")
            page.wait_for_function("d => !document.querySelector(d).open", arg=drawer)
        # The language switch, on a phone: this lesson in Chinese, then back in English.
        english_url = page.url
        page.locator(".course-language-switch:visible").first.click()
        page.wait_for_url(f"{base}/zh/course/{lesson.stem}.html")
        zh_shot = shot(page, "site-phone-zh-lesson.png")
        assert page.evaluate("document.documentElement.lang") == "zh-CN", f"the Chinese page is not lang=zh-CN ({zh_shot})"
        zh_title = website.title_of(notebooks.read(ROOT / "zh" / "course" / lesson.name), lesson.stem, website.ZH)
        assert zh_title.replace("`", "") in page.locator("main h1").first.inner_text(), (
            f"the switch did not open the Chinese lesson ({zh_shot})")
        page.locator(".course-language-switch:visible").first.click()
        page.wait_for_url(english_url)
        page.set_viewport_size(browser_support.VIEWPORT)

        exercise = layout.release_notebook(layout.assignments()[0]).relative_to(ROOT).as_posix()
        page.goto(f"{base}/{html_of(exercise)}")
        stub = page.locator(".cell_input", has_text="raise NotImplementedError()").first
        stub.evaluate("e => e.scrollIntoView({block: 'start'})")  # an answer cell and its tests
        page.wait_for_timeout(300)
        exercise_shot = shot(page, "site-exercise.png")
        assert page.locator(".cell_input").count() > 3, f"the exercise shows no code cells ({exercise_shot})"

        # Search, as a reader types it in the search box.
        page.goto(f"{base}/index.html")
        page.keyboard.press("Control+k")
        box = page.locator("input[name='q']:visible").first
        box.fill("non_blocking")
        box.press("Enter")
        page.wait_for_url(re.compile(r"search\.html\?q=non_blocking"))
        results = page.locator("#search-results ul.search li")
        results.first.wait_for(timeout=60_000)
        found = results.all_inner_texts()
        search_shot = shot(page, "site-search.png")
        assert any("Performance" in r for r in found), f"search for non_blocking found {found} ({search_shot})"
        page.wait_for_function("() => document.querySelector('#search-results p.search-summary') !== null", timeout=60_000)
        excerpts = page.locator("#search-results ul.search li p.context").all_inner_texts()
        assert excerpts and not [e for e in excerpts if re.match(r"\W*(Contents|Show code cell)", e)], (
            f"search excerpts show the theme's contents or toggle labels: {excerpts[:3]} ({search_shot})")

        # A pasted error message, as a learner copies it from a traceback: its first result is
        # its row of the cheat sheet (website/_static/course-search.js), in both editions.
        pasted = ("RuntimeError: Expected all tensors to be on the same device, but found at least two "
                  "devices, cuda:0 and cpu! (when checking argument for argument mat1 in method wrapper_CUDA_addmm)")
        for prefix in ("", "zh/"):
            page.goto(f"{base}/{prefix}index.html")
            page.keyboard.press("Control+k")
            box = page.locator("input[name='q']:visible").first
            box.fill(pasted)
            box.press("Enter")
            page.wait_for_url(re.compile(r"search\.html\?q="))
            first = page.locator("#search-results ul.search li").first
            first.wait_for(timeout=60_000)
            error_shot = shot(page, f"site-search-error{'-zh' if prefix else ''}.png")
            href = first.locator("a").first.get_attribute("href")
            assert href.endswith(f"/{prefix}CHEATSHEET.html#error-expected-all-tensors-to-be-on-the-same-device"), (
                f"the pasted error's first result is {href} ({error_shot})")
            first.locator("a").first.click()
            page.wait_for_url(re.compile(r"CHEATSHEET\.html#error-"))
            row = page.locator("#error-expected-all-tensors-to-be-on-the-same-device")
            assert row.count() == 1 and row.is_visible() or row.bounding_box() is not None, f"no such row ({error_shot})"
            landed = shot(page, f"site-search-error-row{'-zh' if prefix else ''}.png")
            top = page.evaluate("() => document.querySelector('#error-expected-all-tensors-to-be-on-the-same-device')"
                                ".closest('tr').getBoundingClientRect().top")
            assert 0 <= top < page.viewport_size["height"] / 2, f"the row is not in view at the top ({top} px; {landed})"

        # Dark theme: the theme switch turns the page dark.
        page.goto(f"{base}/course/{lesson.stem}.html")
        light = page.evaluate("getComputedStyle(document.body).backgroundColor")
        page.locator(".theme-switch-button:visible").first.click()  # a menu: system, light, dark
        page.locator("[data-mode='dark']:visible, [data-bs-theme-value='dark']:visible").or_(
            page.get_by_role("menuitem", name="Dark")).or_(page.get_by_text("Dark", exact=True)).first.click()
        page.wait_for_function("document.documentElement.dataset.theme === 'dark'")
        page.mouse.move(5, 500)
        page.wait_for_timeout(300)
        dark = page.evaluate("getComputedStyle(document.body).backgroundColor")
        dark_shot = shot(page, "site-dark.png")
        assert page.evaluate("document.documentElement.dataset.theme") == "dark" and dark != light, (
            f"the theme switch did not turn the page dark ({light} -> {dark}, {dark_shot})")

        # One figure drawn by the course's helpers per chapter, in both themes: the figure keeps its
        # white card on the dark page (legible in both), at its own size.
        figure_shots = []
        for number in sorted({p.stem[:2] for p in layout.lessons()}):
            lesson = next((p for p in layout.lessons() if p.stem.startswith(number) and "= show_" in
                           (site["html"] / "course" / f"{p.stem}.html").read_text(encoding="utf-8").replace(
                               '<span class="o">=</span> <span class="n">show_', "= show_")), None)
            assert lesson is not None, f"chapter {number} has no figure drawn by a show_ helper on the site"
            page.goto(f"{base}/course/{lesson.stem}.html")
            figure = page.locator("div.cell", has=page.locator(".cell_input", has_text="= show_")).locator(
                ".cell_output img").first
            figure.scroll_into_view_if_needed()
            page.wait_for_function("img => img.complete && img.naturalWidth > 300", arg=figure.element_handle())
            for theme in ("dark", "light"):
                page.evaluate("t => { document.documentElement.dataset.theme = t; document.documentElement.dataset.mode = t; }",
                              theme)
                page.wait_for_timeout(200)
                background = page.evaluate("getComputedStyle(document.body).backgroundColor")
                card = corner_pixel(page, figure)
                path = screenshot_around(page, figure, SCREENSHOTS / f"site-figure-{number}-{theme}.png")
                figure_shots.append(path.name)
                assert card[:3] == [255, 255, 255] and card[3] == 255, (
                    f"{lesson.name}'s figure has no opaque white card ({card}) on the {theme} page ({path})")
                assert (theme == "dark") == (background != light), (theme, background, light, path)
            page.evaluate("document.documentElement.dataset.theme = 'dark'")
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert not requested_elsewhere, f"the site asked another host for: {requested_elsewhere[:10]}"
    assert not failed, f"requests failed: {failed[:10]}"
    print(f"screenshots: {home}, {lesson_shot}, {exercise_shot}, {search_shot}, {dark_shot}; figures: {figure_shots}")


FIT_WIDTHS = (390, 1366)
# Why a page is wider than the window, or what is cut off: the widest elements that stick out,
# code blocks whose lines are hidden behind a scrollbar, the page-contents column past the edge.
_FIT_PROBLEMS = """() => {
  const W = window.innerWidth, out = [];
  if (document.documentElement.scrollWidth > W)
    out.push(`the page is ${document.documentElement.scrollWidth} px wide in a ${W} px window`);
  for (const e of document.querySelectorAll('article *')) {
    const r = e.getBoundingClientRect();
    if (r.width && r.right > W + 1 && !e.closest('.pst-scrollable-table-container, .table-wrapper, .course-scroll'))
      { out.push(`${e.tagName.toLowerCase()}.${e.className} ends at ${Math.round(r.right)} px`); if (out.length > 6) break; }
  }
  for (const pre of document.querySelectorAll('article pre'))
    if (pre.scrollWidth > pre.clientWidth + 1 && pre.offsetParent)
      out.push(`a code block hides ${pre.scrollWidth - pre.clientWidth} px of its lines: ${pre.innerText.slice(0, 60)}`);
  // A header that takes room but shows nothing is an empty band across the page.
  for (const band of document.querySelectorAll('#pst-header, .bd-header-article')) {
    const r = band.getBoundingClientRect();
    const shown = [...band.querySelectorAll('*')].some(e => {
      const b = e.getBoundingClientRect();
      return b.width > 0 && b.height > 0 && getComputedStyle(e).visibility !== 'hidden'
        && (e.children.length === 0 || e.tagName === 'svg' || e.tagName === 'BUTTON');
    });
    if (r.height > 0 && !shown) out.push(`${band.id || band.className} is an empty ${Math.round(r.height)} px band`);
  }
  const toc = document.querySelector('.bd-sidebar-secondary');
  if (toc && toc.offsetParent) {
    const r = toc.getBoundingClientRect();
    if (r.right > W + 1 || toc.scrollWidth > toc.clientWidth + 1)
      out.push(`the page-contents column is cut off (right ${Math.round(r.right)}, content ${toc.scrollWidth} > ${toc.clientWidth})`);
  }
  return out.slice(0, 10);
}"""


def test_site_fits_a_phone_and_a_desktop_in_both_themes(site, browser_page):
    """The landing page, a lesson, an exercise and the cheat sheet at 390 px and 1366 px, light
    and dark: nothing wider than the window (wide tables scroll inside their own box), no
    code line hidden behind a scrollbar, the page-contents column whole, no header that is an
    empty band, a search button that opens the search; 16 screenshots. On
    the exercise page question 1 comes first, the locked set-up cells collapsed above it."""
    page = browser_page
    httpd = website.server(site["html"], port=0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    exercise = html_of(layout.release_notebook(layout.assignments()[0]).relative_to(ROOT).as_posix())
    pages = {"home": "index.html", "lesson": "course/01_device_basics.html", "exercise": exercise,
             "cheatsheet": "CHEATSHEET.html"}
    problems, shots = [], []
    try:
        for width in FIT_WIDTHS:
            page.set_viewport_size({"width": width, "height": 844 if width < 500 else 900})
            for name, rel in pages.items():
                page.goto(f"{base}/{rel}")
                page.wait_for_load_state("load")
                if name == "exercise":
                    heights = page.evaluate("() => Array.from(document.querySelectorAll("
                                            "'div.cell.tag_hide-input'), c => c.getBoundingClientRect().height)")
                    if len(heights) < 2 or max(heights) > 120:
                        problems.append(f"{rel} at {width} px: the set-up cells before question 1 are not "
                                        f"collapsed (heights {heights})")
                for theme in ("light", "dark"):
                    page.evaluate("t => { document.documentElement.dataset.theme = t; "
                                  "document.documentElement.dataset.mode = t; }", theme)
                    page.evaluate("window.scrollTo(0, 0)")
                    page.wait_for_function("t => document.documentElement.dataset.theme === t", arg=theme)
                    path = shot(page, f"site-{name}-{width}-{theme}.png")
                    shots.append(path.name)
                problems += [f"{rel} at {width} px: {p}" for p in page.evaluate(_FIT_PROBLEMS)]
            # Whatever the width, one visible search button opens the search dialog.
            page.goto(f"{base}/index.html")
            buttons = page.locator("button.search-button__button:visible")
            if buttons.count() == 0:
                problems.append(f"index.html at {width} px: no visible search button")
            else:
                buttons.first.click()
                if not page.evaluate("() => document.getElementById('pst-search-dialog')?.open"):
                    problems.append(f"index.html at {width} px: the search button opened no search dialog")
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert len(shots) == 16, shots
    assert not problems, "cut off or too wide:\n  " + "\n  ".join(problems)


# The Chinese edition as a Chinese reader meets it, at a phone's width and a desktop's: one
# browser session for several checks (CI time).
# Query: (its screenshot's name, the chapter its first result is)
ZH_QUERIES = {"混合精度": ("mixed-precision", "05_mixed_precision"), "锁页内存": ("pinned-memory", "07_performance")}


def test_what_readers_meet_in_the_browser(site, browser_page):
    """At 390 and 1366 px: an unspaced Chinese query (混合精度, 锁页内存, 显存不足) finds what the
    same words with spaces find, chapter 05 first for 混合精度 (website/course-zh-split.js);
    every link of a Chinese notebook page stays in the Chinese edition (the launch button
    opens zh/course/... in Colab); the course map fits a phone as one card per chapter and
    shows learners' times only; a wrapped code line starts right of the line it continues and
    the copy button copies exactly the code; a figure has a numbered caption and alt text from the
    lesson's words and opens enlarged on a tap; no page logs the theme's "invalid theme mode" error."""
    page = browser_page
    httpd = website.server(site["html"], port=0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    console_errors: list[str] = []
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)

    def results(query: str) -> list[str]:
        page.goto(f"{base}/zh/search.html?q={urllib.parse.quote(query)}")
        # Finished: the summary (made when the search starts) gives the count, or says none.
        page.wait_for_function("() => /\\d|没有|did not match|no pages/i.test("
                               "document.querySelector('#search-results p.search-summary')?.innerText || '')",
                               timeout=60_000)
        return page.eval_on_selector_all("#search-results ul.search:not(.course-error-hits) > li > a",
                                         "links => links.map(a => a.getAttribute('href'))")

    try:
        for width in FIT_WIDTHS:
            page.set_viewport_size({"width": width, "height": 844 if width < 500 else 900})
            for query, (name, chapter) in ZH_QUERIES.items():
                unspaced = results(query)
                path = shot(page, f"site-zh-search-{name}-{width}.png")
                spaced = results(" ".join([query[:2], query[2:]]))
                # (the unspaced query may find more: a section whose title holds it whole)
                assert spaced and set(spaced) <= set(unspaced), (
                    f"{query} found {len(unspaced)} pages, {query[:2]} {query[2:]} {len(spaced)} ({path})")
                if width == FIT_WIDTHS[0]:
                    assert chapter in unspaced[0], f"{query}'s first result is {unspaced[0]} ({path})"
            # Out of memory: the troubleshooting chapter's OOM section first, then the DDP chapter's.
            oom = results("显存不足")
            path = shot(page, f"site-zh-search-oom-{width}.png")
            assert oom and oom[0].startswith("course/08_troubleshooting") and set(results("显存 不足")) <= set(oom), (
                f"显存不足 found {oom} ({path})")

            # Every link of a Chinese notebook page stays in the Chinese edition.
            for rel in ("zh/course/01_device_basics.html",
                        "zh/" + html_of(layout.release_notebook(layout.assignments()[0]).relative_to(ROOT).as_posix())):
                page.goto(f"{base}/{rel}")
                hrefs = page.eval_on_selector_all("a[href]", "links => links.map(a => a.href)")
                switch = page.eval_on_selector_all("a.course-language-switch", "ls => ls.map(a => a.href)")
                stray = [h for h in hrefs if h.startswith(base) and not h.startswith(f"{base}/zh/") and h not in switch]
                outside = [h for h in hrefs if re.search(r"colab\.research\.google\.com|github\.com/.*/(blob|edit)/", h)
                           and "/zh/" not in h]
                path = shot(page, f"site-zh-notebook-links-{width}.png")
                assert not stray and not outside, (
                    f"{rel} links out of the Chinese edition: {stray[:5]} {outside[:5]} ({path})")
                colab = [h for h in hrefs if "colab.research.google.com/github/" in h]
                assert colab and all("/zh/course/" in h or "/zh/exercises/" in h for h in colab), (rel, colab)

            # The course map on the home page, both editions.
            for prefix in ("", "zh/"):
                page.goto(f"{base}/{prefix}index.html")
                table = page.locator(".course-map table").first
                table.scroll_into_view_if_needed()
                box = table.bounding_box()
                path = screenshot_around(page, table, SCREENSHOTS / f"site-{prefix.strip('/') or 'en'}-course-map-{width}.png",
                                         margin=10) if box["height"] < 4000 else shot(page, "site-course-map-too-tall.png")
                text = table.inner_text()
                assert "measured" not in text and "not timed" not in text and "实测" not in text and "负载" not in text, (
                    f"the course map shows maintainers' notes ({path}): {text[:300]}")
                wide = page.evaluate("() => document.documentElement.scrollWidth")
                assert wide <= width, f"the home page is {wide} px wide at {width} px ({path})"
                cards = page.evaluate("() => getComputedStyle(document.querySelector('.course-map tbody tr')).display")
                assert (cards == "block") == (width < 500), f"course map rows display {cards} at {width} px ({path})"
                if width < 500:
                    assert box["height"] < 3000, f"the course map is {box['height']:.0f} px tall on a phone ({path})"

            # Code: a wrapped line starts right of the line it continues (course-code.js), and
            # the copy button (sphinx-copybutton) copies exactly the cell's code.
            page.goto(f"{base}/course/01_device_basics.html")
            pre = page.locator("div.cell_input div.highlight pre").first
            pre.scroll_into_view_if_needed()
            wrapped = page.evaluate(_WRAPPED_LINES)
            path = shot(page, f"site-code-wrap-copy-{width}.png")
            if width < 500:
                assert wrapped, f"no code line of lesson 01 wraps at {width} px ({path})"
            starts = [w for w in wrapped if w[2] <= w[1] + 1]
            assert not starts, f"wrapped parts start where their line does (a new statement?): {starts[:3]} ({path})"
            page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=base)
            pre.hover()
            page.locator("div.cell_input button.copybtn").first.click()
            copied = page.evaluate("navigator.clipboard.readText()")
            setup = next(c.source for c in notebooks.read(ROOT / "course" / "01_device_basics.ipynb").cells
                          if c.cell_type == "code")
            assert copied == setup.rstrip("\n"), f"the copy button copied {copied[:200]!r} ({path})"

            # The cheat sheet's Errors table: each row's Chapter link on screen (cards on a phone).
            for prefix in ("", "zh/"):
                page.goto(f"{base}/{prefix}CHEATSHEET.html#{SAME_DEVICE_ROW}")
                chapter = page.locator(f"tr:has(#{SAME_DEVICE_ROW}) td").nth(3)
                chapter.scroll_into_view_if_needed()
                box = chapter.locator("a").first.bounding_box()
                path = shot(page, f"site-{prefix.strip('/') or 'en'}-cheatsheet-errors-{width}.png")
                assert box and 0 <= box["x"] and box["x"] + box["width"] <= width, (
                    f"the Chapter link of an error row is off screen at {width} px: {box} ({path})")

            # Figures: numbered, described by the lesson's words (alt text too), enlarged on a tap.
            for prefix, number in (("", "Figure 1"), ("zh/", "图 1")):
                page.goto(f"{base}/{prefix}course/01_device_basics.html")
                img = page.locator("figure.course-figure > img").first
                img.scroll_into_view_if_needed()
                page.wait_for_function("i => i.complete && i.naturalWidth > 100", arg=img.element_handle())
                alt, caption = img.get_attribute("alt"), page.locator("figure.course-figure > figcaption").first.inner_text()
                path = shot(page, f"site-{prefix.strip('/') or 'en'}-figure-{width}.png")
                assert caption.startswith(number) and len(caption) > len(number) + 10 and alt == caption, (
                    f"the figure's caption {caption!r}, alt {alt!r} ({path})")
                inline = img.bounding_box()["width"]
                img.click()
                dialog = page.locator("dialog.course-figure-dialog")
                page.wait_for_function("() => document.querySelector('dialog.course-figure-dialog')?.open")
                big = dialog.locator("img")
                page.wait_for_function("i => i.complete && i.naturalWidth > 100", arg=big.element_handle())
                path = shot(page, f"site-{prefix.strip('/') or 'en'}-figure-enlarged-{width}.png")
                natural = big.evaluate("i => i.naturalWidth")
                assert big.bounding_box()["width"] >= min(natural, inline) and (
                    width > natural or big.bounding_box()["width"] > inline * 1.5), (
                    f"the figure did not open enlarged: {inline} px inline, {big.bounding_box()} in the dialog ({path})")
                page.keyboard.press("Escape")
                page.wait_for_function("() => !document.querySelector('dialog.course-figure-dialog').open")
    finally:
        httpd.shutdown()
        httpd.server_close()
    theme = [m for m in console_errors if "theme mode" in m]
    assert not theme, theme


SAME_DEVICE_ROW = "error-expected-all-tensors-to-be-on-the-same-device"


def test_every_page_has_one_viewport_tag(site):
    """Three viewport meta tags were on every page (Sphinx's, one in `metatags`, the theme's)."""
    pages = website.site_pages(site["html"])
    counts = {p.relative_to(site["html"]).as_posix(): p.read_text(encoding="utf-8").count('name="viewport"')
              for p in pages}
    assert len(pages) > 50 and not {p: n for p, n in counts.items() if n != 1}, counts


# Each wrapped line of a code cell: [its first characters, where its first part starts, where
# its later parts start] (px from the left).
_WRAPPED_LINES = """() => { const out = [];
  for (const s of document.querySelectorAll('div.cell_input span.course-line')) {
    const r = document.createRange(); r.selectNodeContents(s);
    const rects = [...r.getClientRects()].filter(x => x.width > 0);
    if (!rects.length) continue;
    const top = rects[0].top, first = rects.filter(x => Math.abs(x.top - top) < 2), later = rects.filter(x => x.top > top + 2);
    if (later.length) out.push([s.textContent.slice(0, 40), Math.min(...first.map(x => x.left)),
                                Math.min(...later.map(x => x.left))]);
  }
  return out; }"""
