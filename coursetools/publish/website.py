"""The course as a static website, built from the notebooks.

    python3 make.py site                 build it into website/_build/html (git-ignored)
    python3 make.py site --serve         build, then preview it on http://127.0.0.1:8000

The stack is Sphinx with myst-nb and sphinx-book-theme (docs/MAINTAINERS.md, "The website",
says why). A build has three steps:

1. **Stage** (`stage`): a folder laid out like the repository, holding only what the site
   shows: every lesson (`coursetools.layout.lessons`), every released exercise
   (`exercises/`, never `solutions/`), CHEATSHEET.md (its proof links pointing at the
   section that proves each rule), docs/MYTHS.md, the guides under docs/, and a
   generated home page (the course map, each chapter's prerequisites and time read from its
   header) whose toctrees make the sidebar follow the course map. Links to repository files
   that are not pages become GitHub links. `site-manifest.json` lists every staged page and
   the repository file it was made from.
2. **Execute** (`execute_lessons`): each lesson runs top to bottom in a kernel of this
   environment, in an empty folder, unless jupyter-cache already holds a run of exactly its
   code cells made with the same PyTorch and Python; each run's record keeps where it was
   made (machine, PyTorch, date, seconds). A lesson that raises or writes to stderr stops
   the build. The "About these outputs" page is written from these records.
3. **Render** (Sphinx, `website/conf.py`): myst-nb reads the outputs from the cache (it
   never re-runs a lesson), the theme adds search, the sidebar, "Open in Colab" and the
   download buttons; a warning fails the build. The download buttons then serve the
   repository's own notebooks (without outputs), as Colab opens them.

The Chinese edition (zh/, `make.py i18n build`) is a second site under zh/, staged the same
way from the zh/ files (`Edition`, `ZH`), with a language switch on every page of both that
opens the same page in the other language (website/conf.py). Its lessons are not run again:
each code cell gets the outputs of the same cell of the English run, after a check that the
two are the same code apart from comments and docstrings (`english_outputs`); myst-nb then
renders those outputs without executing anything.

Nothing is downloaded while building: the build refuses any network connection that does
not stay on this machine.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import copy
import dataclasses
import datetime
import functools
import hashlib
import html
import html.parser
import http.server
import json
import os
import platform
import posixpath
import re
import shutil
import socket
import sys
import tempfile
import time
import urllib.parse
from importlib import metadata
from pathlib import Path

import nbformat

from coursetools.author import cheatsheet, gpu_records
from coursetools import layout, notebooks
from coursetools.publish import site_search

SITE_DIR = layout.ROOT / "website"           # committed: conf.py, _static/
BUILD_DIR = SITE_DIR / "_build"               # git-ignored: src/, html/, doctrees/, jupyter_cache/
MANIFEST = "site-manifest.json"
CELL_TIMEOUT_S = 180                          # per cell, as nbval's in pytest.ini
COLAB_BADGE_URL = "https://colab.research.google.com/assets/colab-badge.svg"
LOCAL_BADGE = "_static/colab-badge.svg"
SETUP_REPORT = re.compile(r"PyTorch (\S+) \| device: (\S+)(?: \((.+)\))?")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^//")
# A markdown link or image: [text](target "title"), the target group rewritten.
MD_LINK = re.compile(r"(!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\()(<[^>\n]*>|[^)\s]+)((?:\s+\"[^\"\n]*\")?\))")
HTML_LINK = re.compile(r"""((?:href|src)=")([^"]+)(")""")


class SiteError(Exception):
    """The site cannot be built; the message says why and what to fix."""


# --------------------------------------------------------------------------------------
# Editions: the English site, and the Chinese one under zh/
# --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, eq=False)
class Edition:
    """One language of the site: where its notebooks and documents are in the repository,
    where its pages go on the site, and the words of the pages the build writes itself (the
    home page, the sidebar, the exercise note, "About these outputs")."""

    lang: str              # "en", "zh"
    repo_dir: str          # its files' folder in the repository: "" or "zh" (zh/ mirrors the repository)
    readme: str            # the README its home page's introduction comes from
    site_dir: str          # its pages' folder on the site: "" or "zh"
    sphinx_language: str   # Sphinx's `language` (the theme's words, the search's word splitting)
    hreflang: str          # the switch's hreflang and lang
    name: str              # the switch's label, in the edition's own language
    words: dict            # see EN_WORDS

    def repo(self, rel: str) -> str:
        """The repository path of this edition's file `rel` ("docs/MYTHS.md" -> "zh/docs/MYTHS.md")."""
        return posixpath.join(self.repo_dir, rel) if self.repo_dir else rel

    def w(self, key: str, **values) -> str:
        return self.words[key].format(**values) if values else self.words[key]


EN_WORDS = {
    "facts": re.compile(r"\*\*Prerequisites:\*\*\s*(?P<prereq>.*?)\s*\*\*Time:\*\*\s*(?P<time>[^\n]*?)\.?\s*$",
                        re.MULTILINE),
    "facts_missing": "'**Prerequisites:** ... **Time:** ...'",
    # The course map shows a time up to here: the rest of a header's Time line (how it was
    # measured or estimated, on what machine) is for maintainers, and stays on the page.
    "time_end": re.compile(r":|;|\s\(|\.\s"),
    "part": re.compile(r"^(.*?),\s*part\s+\d+\b", re.IGNORECASE),
    "part_number": re.compile(r"\bpart\s+(\d+)\b", re.IGNORECASE),
    "exercise_title_end": re.compile(r":\s*exercises$"),
    "title_sep": ":",
    "lesson": "Lesson", "lesson_part": "Lesson, part {n}", "nav_part": ", part {n}",
    "exercise_nav": "{number} Exercise: {title}",
    "map_heading": "Course map",
    "map_intro": "Each chapter: a **lesson** to read (shown here with the outputs of a real run: see "
                 "[About these outputs](about.md)) and an **exercise** graded by tests (shown as released: "
                 "fill it in on Colab or on your machine). Every lesson and exercise page has *Open in Colab* "
                 "(the rocket button, top right) and a download button for its notebook.",
    "map_header": "| # | Lesson | Exercise | Prerequisites | Time |",
    "map_exercise": "[exercise]({path}) ({points} points)",
    "map_time_lesson": "lesson {time}", "map_time_part": "part {n} {time}", "map_time_exercise": "exercise {time}",
    "map_time_sep": "; ",
    "cheatsheet_line": "The course on one page: the [cheat sheet]({path}).",
    "myths_line": "Where the course comes from: [the posts' myths, checked]({path}).",
    "guides_line": "Guides: {links}.", "list_sep": ", ",
    "reference": "Reference", "cheatsheet": "Cheat sheet", "myths": "The posts' myths, checked",
    "about": "About these outputs",
    "guides": {"docs/LEARNERS.md": "Learners' guide", "docs/INSTRUCTORS.md": "Instructors' guide",
               "docs/GRADING_SECURITY.md": "The grading security model",
               "docs/MAINTAINERS.md": "Maintainers' guide"},
    "guide_in_line": lambda title: title[:1].lower() + title[1:] if title.startswith("The") else title,
    "other_edition": '**中文版：** <a href="zh/index.html" hreflang="zh-CN" lang="zh-CN">整门课程的简体中文版</a>。',
    "cheat_cell": ", cell ",
    "verified": "Last verified: ", "about_link": "about these outputs",
    "check": "python3 make.py check {chapter}",
}

ZH_WORDS = {
    **EN_WORDS,
    "facts": re.compile(r"\*\*前置知识：\*\*\s*(?P<prereq>.*?)\s*\*\*用时：\*\*\s*(?P<time>[^\n]*?)[.。]?\s*$",
                        re.MULTILINE),
    "facts_missing": "'**前置知识：** ... **用时：** ...'",
    "time_end": re.compile(r"[：（(；;。]"),
    "part": re.compile(r"^(.*?)，\s*第\s*\d+\s*部分"),
    "part_number": re.compile(r"第\s*(\d+)\s*部分"),
    "exercise_title_end": re.compile(r"：\s*练习$"),
    "title_sep": "：",
    "lesson": "课", "lesson_part": "课，第 {n} 部分", "nav_part": "，第 {n} 部分",
    "exercise_nav": "{number} 练习：{title}",
    "map_heading": "课程地图",
    "map_intro": "每一章：一节要阅读的**课**（这里展示的是真实运行的输出，见[关于这些输出](about.md)），以及一个由测试评分的"
                 "**练习**（按发布时的样子展示：在 Colab 或你自己的机器上作答）。每个课和练习页面都有 *Open in Colab*"
                 "（右上角的火箭按钮）和下载笔记本的按钮。",
    "map_header": "| # | 课 | 练习 | 前置知识 | 用时 |",
    "map_exercise": "[练习]({path})（{points} 分）",
    "map_time_lesson": "课 {time}", "map_time_part": "第 {n} 部分 {time}", "map_time_exercise": "练习 {time}",
    "map_time_sep": "；",
    "cheatsheet_line": "一页纸上的整门课程：[速查表]({path})。",
    "myths_line": "课程从哪里来：[两篇帖子中的误区，逐条核实]({path})。",
    "guides_line": "指南：{links}。", "list_sep": "、",
    "reference": "参考", "cheatsheet": "速查表", "myths": "帖子中的误区，逐条核实",
    "about": "关于这些输出",
    "guides": {"docs/LEARNERS.md": "学习者指南", "docs/INSTRUCTORS.md": "教师指南",
               "docs/GRADING_SECURITY.md": "评分安全模型", "docs/MAINTAINERS.md": "维护者指南"},
    "guide_in_line": lambda title: title,
    "other_edition": '**English:** <a href="../index.html" hreflang="en" lang="en">the course in English</a>.',
    "cheat_cell": "，单元格 ",
    "verified": "最近验证：", "about_link": "关于这些输出",
    "check": "python3 make.py check {chapter} --lang zh",
}

EN = Edition("en", "", "README.md", "", "en", "en", "English", EN_WORDS)
ZH = Edition("zh", "zh", "README.zh-CN.md", "zh", "zh_CN", "zh-CN", "中文", ZH_WORDS)


def editions(root: Path) -> list[Edition]:
    """The site's editions: English, and Chinese where the repository has its lessons (zh/course/)."""
    return [EN, *([ZH] if layout.lessons(root / ZH.repo_dir) else [])]


# --------------------------------------------------------------------------------------
# Links
# --------------------------------------------------------------------------------------

def github_url(repo_path: str, root: Path) -> str:
    """The GitHub page of a repository file or folder (course.toml's repository and branch)."""
    cfg = layout.config()
    kind = "tree" if (root / repo_path).is_dir() else "blob"
    return f"https://github.com/{cfg.github_repo}/{kind}/{cfg.branch}/{repo_path}"


def heading_title(markdown_heading: str) -> str:
    """A heading's text as myst-parser slugs it: its text and inline code, no markup."""
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").parse(markdown_heading)
    inline = next((t for t in tokens if t.type == "inline"), None)
    return "".join(c.content for c in (inline.children or []) if c.type in ("text", "code_inline")) if inline else ""


class Slugger:
    """The anchors myst-parser gives a document's headings (`myst_heading_anchors`): GitHub
    style, a repeated one suffixed -1, -2, ..."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def __call__(self, heading_line: str) -> str:
        from myst_parser.slugs import github_slugify, unique_slug

        slug = unique_slug(github_slugify(heading_title(heading_line)), self.seen)
        self.seen.add(slug)
        return slug


HEADING = re.compile(r"^#{1,6}\s+\S.*$", re.MULTILINE)


def heading_slugs(markdown: str) -> set[str]:
    """The anchors of the headings in `markdown` (what README's `#...` links use, and what
    myst-parser makes)."""
    slug = Slugger()
    return {slug(m.group(0)) for m in HEADING.finditer(_outside_fences(markdown))}


_outside_fences = cheatsheet.outside_fences  # fenced code blanked: links and headings there are code


def rewrite_links(text: str, origin: str, dest: str, pages, root: Path,
                  anchor_page: str | None = None, local_anchors: set[str] | None = None) -> str:
    """Markdown `text` from repository file `origin`, moved to staged path `dest`: every
    relative link keeps pointing at what it meant. A link to a staged page (`pages`: the
    repository paths of the staged pages, or a mapping from them to their staged paths, as a
    Chinese page's zh/course/... is staged at course/...) stays a relative link, rebased to
    `dest`; a link to any other repository file becomes its GitHub address. A `#anchor` alone stays when `local_anchors` is None or
    holds it, otherwise it points into `anchor_page` on GitHub (README's sections that are not
    part of the page). Fenced code is left as it is."""
    origin_dir = posixpath.dirname(origin)
    dest_dir = posixpath.dirname(dest)

    def target(raw: str) -> str:
        bare = raw[1:-1] if raw.startswith("<") and raw.endswith(">") else raw
        if SCHEME.match(bare):
            return raw
        if bare.startswith("#"):
            if local_anchors is None or bare[1:] in local_anchors or anchor_page is None:
                return raw
            return f"{github_url(anchor_page, root)}{bare}"
        path, _, fragment = bare.partition("#")
        resolved = posixpath.normpath(posixpath.join(origin_dir, path))
        if resolved.startswith(".."):
            return raw  # outside the repository: the link check will say so
        suffix = f"#{fragment}" if fragment else ""
        if resolved in pages:
            staged = pages[resolved] if isinstance(pages, dict) else resolved
            return posixpath.relpath(staged, dest_dir or ".") + suffix
        return github_url(resolved, root) + suffix

    def fix(chunk: str) -> str:
        chunk = MD_LINK.sub(lambda m: m.group(1) + target(m.group(2)) + m.group(3), chunk)
        return HTML_LINK.sub(lambda m: m.group(1) + target(m.group(2)) + m.group(3), chunk)

    parts = re.split(r"(^(?:```|~~~).*?^(?:```|~~~)[^\n]*$)", text, flags=re.MULTILINE | re.DOTALL)
    return "".join(part if i % 2 else fix(part) for i, part in enumerate(parts))


def local_badge(text: str, dest: str) -> str:
    """The Colab badge image served by the site itself (a reader's browser then fetches
    nothing from Google to show it); the link it sits in still opens Colab."""
    rel = posixpath.relpath(LOCAL_BADGE, posixpath.dirname(dest) or ".")
    return text.replace(f"]({COLAB_BADGE_URL})", f"]({rel})")


# --------------------------------------------------------------------------------------
# Staging
# --------------------------------------------------------------------------------------

@dataclasses.dataclass
class Lesson:
    path: str              # "course/05_mixed_precision_2.ipynb"
    title: str             # its header's title, without the number
    prerequisites: str     # markdown, links relative to the home page
    time: str              # "about 35 minutes"


@dataclasses.dataclass
class Chapter:
    """A chapter of the course map: the lessons numbered NN (one, or several parts) and the
    exercise numbered NN, if any."""

    number: str                    # "05"
    lessons: list[Lesson]
    exercise: str | None = None    # "exercises/05_mixed_precision/05_mixed_precision.ipynb"
    exercise_time: str | None = None
    points: float | None = None
    edition: Edition = EN

    @property
    def title(self) -> str:
        """The first lesson's title, without its ", part N: ..." tail ("，第 N 部分：..." in Chinese)."""
        first = self.lessons[0].title
        match = self.edition.words["part"].match(first)
        return match.group(1) if match else first

    def part_title(self, index: int) -> str:
        """A part's title without the chapter's: "Part 2: the recipe in a real training loop"."""
        title = self.lessons[index].title
        rest = title[len(self.title):].lstrip(" ,:·，：") if title.startswith(self.title) else title
        return (rest[:1].upper() + rest[1:]) if rest else self.lesson_label(index)

    def lesson_label(self, index: int) -> str:
        if len(self.lessons) == 1:
            return self.edition.w("lesson")
        return self.edition.w("lesson_part", n=self.part_number(index))

    def part_number(self, index: int) -> str:
        match = self.edition.words["part_number"].search(self.lessons[index].title)
        return match.group(1) if match else str(index + 1)

    def nav_title(self, index: int) -> str:
        """A lesson's sidebar entry, saying what the page is: "01 Device basics",
        "05 Mixed precision, part 2"."""
        part = self.edition.w("nav_part", n=self.part_number(index)) if len(self.lessons) > 1 else ""
        return f"{self.number} {plain(self.title)}{part}"

    def exercise_nav_title(self) -> str:
        """The exercise's sidebar entry: "01 Exercise: device basics" (the chapter's title up
        to a colon: "08 Exercise: troubleshooting")."""
        words = self.edition.words
        title = plain(self.title).split(words["title_sep"], 1)[0].strip()
        return self.edition.w("exercise_nav", number=self.number,
                              title=lower_first(title) if self.edition is EN else title)


def plain(title: str) -> str:
    """A title as plain text (a toctree entry or caption is not markdown)."""
    return title.replace("`", "")


def lower_first(title: str) -> str:
    """`title` with its first word in lower case, unless that word is a name ("PyTorch",
    "DDP", "CUDA") that keeps its capitals."""
    word = title.split(" ", 1)[0]
    if not word.isalpha() or any(ch.isupper() for ch in word[1:]):
        return title  # "Module.to()", "PyTorch", "DDP"
    return title[:1].lower() + title[1:]


@dataclasses.dataclass
class Staged:
    folder: Path
    pages: dict[str, str]        # staged path -> repository file it was made from ("" if generated)
    lessons: list[str]           # staged paths of the lessons (executed)
    chapters: list[Chapter]
    unlinked_proofs: list[str] = dataclasses.field(default_factory=list)
    edition: Edition = EN


def header_facts(nb: nbformat.NotebookNode, edition: Edition = EN) -> tuple[str, str] | None:
    """(prerequisites, time) from a notebook's header cell, as markdown; None if absent."""
    match = edition.words["facts"].search(nb.cells[0].source) if nb.cells else None
    return (match.group("prereq").rstrip(". 。"), match.group("time")) if match else None


def short_time(time_text: str, edition: Edition = EN) -> str:
    """A header's time as the course map shows it, the learner's part: up to its first colon,
    semicolon, parenthesis or sentence end ("about 45 minutes to read: 2,895 words ..." ->
    "about 45 minutes to read"; "about 45 minutes (estimated from its length, not timed)" ->
    "about 45 minutes"); the rest (how it was measured, on what machine) stays on the page."""
    return edition.words["time_end"].split(time_text, maxsplit=1)[0].strip().rstrip(".。")


def title_of(nb: nbformat.NotebookNode, fallback: str, edition: Edition = EN) -> str:
    match = re.search(r"^# (.+)$", nb.cells[0].source if nb.cells else "", re.MULTILINE)
    title = match.group(1).strip() if match else fallback
    title = re.sub(r"^\d\d\s*·\s*", "", title)
    return edition.words["exercise_title_end"].sub("", title)


def _write(path: Path, text: str) -> None:
    """Write only when the content changes (Sphinx then re-reads only what changed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")


def extract_attachments(nb: nbformat.NotebookNode, rel: str, dest: Path) -> list[str]:
    """Markdown cell attachments (a recorded GPU block's figures) as image files next to the
    staged notebook, their `attachment:NAME` references pointing at them (myst-nb does not
    read attachments). Returns the staged paths written."""
    written = []
    stem = posixpath.splitext(posixpath.basename(rel))[0]
    for index, cell in enumerate(nb.cells):
        for name, bundle in (cell.get("attachments") or {}).items():
            mime, data = next(((m, d) for m, d in bundle.items() if m.startswith("image/")), (None, None))
            if mime is None:
                continue
            ext = {"image/png": ".png", "image/jpeg": ".jpg", "image/svg+xml": ".svg", "image/gif": ".gif"}.get(mime, "")
            file_rel = posixpath.join(posixpath.dirname(rel), "_attachments",
                                      f"{stem}-cell{index}-{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}")
            if not file_rel.endswith(ext):
                file_rel += ext
            raw = data.encode() if mime == "image/svg+xml" else base64.b64decode("".join(data))
            target = dest / file_rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists() or target.read_bytes() != raw:
                target.write_bytes(raw)
            link = posixpath.relpath(file_rel, posixpath.dirname(rel) or ".")
            cell.source = cell.source.replace(f"(attachment:{name})", f"({link})")
            written.append(file_rel)
        cell.pop("attachments", None)
    return written


def _notebook_text(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb) + "\n"


def readme_intro(readme: str) -> str:
    """README's text between its title and its first section (README.zh-CN.md opens with a
    comment saying it is generated: it is skipped)."""
    readme = re.sub(r"^(?:\s*<!--.*?-->)+\s*", "", readme, flags=re.DOTALL)
    return re.split(r"^## ", readme.split("\n", 1)[1], maxsplit=1, flags=re.MULTILINE)[0].strip()


def _headings(nb: dict) -> tuple[list[str], list[tuple[int, int | None]]]:
    """A lesson's heading anchors, in order (every heading takes its slug, as myst-parser
    gives them; the order of cheatsheet.headings), and for each markdown cell (its index) the
    index of the last level-1 to 3 heading so far outside recorded GPU output: the section a
    rule cell stands in."""
    slug = Slugger()
    anchors: list[str] = []
    sections: list[tuple[int, int | None]] = []
    last = None
    found = cheatsheet.headings(nb)
    at = 0
    for index, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        tags = cell.get("metadata", {}).get("tags", [])
        while at < len(found) and found[at][0] == index:
            _, level, text = found[at]
            anchors.append(slug("#" * level + " " + text))
            if level <= 3 and gpu_records.RECORD_TAG not in tags:
                last = len(anchors) - 1
            at += 1
        sections.append((index, last))
    return anchors, sections


def _shown_anchors(lesson: Path, shown: Path | None) -> list[str]:
    """The heading anchors of `shown`, the lesson's Chinese version (same cells, headings
    translated), or of the lesson itself."""
    nb = json.loads(lesson.read_text(encoding="utf-8"))
    anchors, _ = _headings(nb)
    if shown is None or shown == lesson:
        return anchors
    shown_anchors, _ = _headings(json.loads(shown.read_text(encoding="utf-8")))
    if len(shown_anchors) != len(anchors):
        raise SiteError(f"{shown.name}: its Chinese version has {len(shown_anchors)} headings, the English "
                        f"lesson {len(anchors)}: run `python3 make.py i18n build`")
    return shown_anchors


# A link labelled with a lesson section, as the error tables write them (coursetools/author/
# cheatsheet.py): "[07 §3.1](course/07_performance_2_waits.ipynb)", "[08 §2 row 4](...)"; the
# Chinese tables say "第 4 行" for "row 4".
SECTION_LINK = re.compile(r"\[(?P<label>\d\d §(?P<section>\d+(?:\.\d+)*)(?: row (?P<row>\d+)| 第 (?P<zh_row>\d+) 行)?)\]"
                          r"\((?P<target>[^()#\s]+\.ipynb)\)")


def section_links(text: str, origin: str, root: Path, edition: "Edition") -> str:
    """`text` (markdown of repository file `origin`) with each link labelled as a lesson
    section pointing at that section's heading: `[01 §4](course/01_device_basics.ipynb)`
    gets `#4-the-same-device-rule-and-its-two-exceptions`. The heading is found in the English
    lesson (cheatsheet.ref_heading), its anchor taken from the edition's own lesson. A label
    whose section the lesson does not have is a SiteError (`make.py cheatsheet` checks the
    index's references the same way)."""
    cache: dict[str, tuple[dict, list[str]]] = {}

    def sub(m: re.Match) -> str:
        shown_rel = posixpath.normpath(posixpath.join(posixpath.dirname(origin), m["target"]))
        english_rel = shown_rel
        if edition.repo_dir and shown_rel.startswith(edition.repo_dir + "/"):
            english_rel = shown_rel[len(edition.repo_dir) + 1:]
        if not english_rel.startswith("course/") or not (root / english_rel).exists():
            return m.group(0)
        if english_rel not in cache:
            lesson, shown = root / english_rel, root / shown_rel
            cache[english_rel] = (json.loads(lesson.read_text(encoding="utf-8")),
                                  _shown_anchors(lesson, shown if shown.exists() else None))
        nb, anchors = cache[english_rel]
        ref = cheatsheet.Ref(m["label"][:2], m["section"], m["row"] or m["zh_row"])
        at = cheatsheet.ref_heading(nb, ref)
        if at is None:
            raise SiteError(f"{origin}: the link [{m['label']}]({m['target']}) names a section {english_rel} "
                            "does not have: run `python3 make.py cheatsheet`")
        return f"[{m['label']}]({m['target']}#{anchors[at]})"

    return SECTION_LINK.sub(sub, text)


def rule_anchors(lesson: Path, shown: Path | None = None) -> dict[str, str]:
    """{rule sentence: the anchor of the section it stands in} for one lesson's rule cells
    (the heading the cheat sheet's "§N title" names: the last one before the rule). The
    anchor is that of the same heading in `shown`, the lesson's Chinese version (same cells,
    headings translated), when given."""
    nb = json.loads(lesson.read_text(encoding="utf-8"))
    rules, _ = cheatsheet.read_rules(lesson)
    _, sections = _headings(nb)
    anchors = _shown_anchors(lesson, shown)
    found: dict[str, str] = {}
    sentences = iter(rules)
    for index, last in sections:
        cell = nb["cells"][index]
        text = cheatsheet.cell_text(cell)
        if cheatsheet.RULE_TAG in cell.get("metadata", {}).get("tags", []) and text.startswith(cheatsheet.RULE_PREFIX):
            rule = next(sentences, None)
            if rule is not None and last is not None:
                found[rule.sentence] = anchors[last]
    return found


CELL_ANCHOR = "cell-{k}"   # the id of a lesson's k-th code cell (1-based: the cheat sheet's "cell [k]")


def add_cell_anchors(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """`nb` with an anchor before each code cell, `<div id="cell-k">` for the k-th (counted
    as the cheat sheet counts them, coursetools/author/cheatsheet.py), in a markdown cell of
    its own: links go to the exact cell. Only markdown cells are added (the execution cache
    matches on code cells)."""
    cells, k = [], 0
    for cell in nb.cells:
        if cell.cell_type == "code":
            k += 1
            anchor = nbformat.v4.new_markdown_cell(
                f'<div id="{CELL_ANCHOR.format(k=k)}" class="course-cell-anchor"></div>')
            anchor.pop("id", None)
            cells.append(anchor)
        cells.append(cell)
    nb.cells = cells
    return nb


def code_cells(lesson: Path) -> list[str]:
    """The sources of a lesson's code cells, in order (cell [1] first)."""
    nb = json.loads(lesson.read_text(encoding="utf-8"))
    return [cheatsheet.cell_text(c) for c in nb["cells"] if c["cell_type"] == "code"]


def cell_link(page: str, k: int, dest: str) -> str:
    """The address of code cell [k] of staged lesson `page`, from staged page `dest`."""
    html_page = posixpath.splitext(page)[0] + ".html"
    return posixpath.relpath(html_page, posixpath.dirname(dest) or ".") + "#" + CELL_ANCHOR.format(k=k)


CHEAT_CELL = re.compile(r"(\]\(course/(?P<nb>[\w.-]+\.ipynb)(?:#[^)\s]*)?\))(?P<sep>, cell |，单元格 )\[(?P<k>\d+)\]")


def link_cells(text: str, dest: str) -> str:
    """The cheat sheet's "cell [k]" ("单元格 [k]" in Chinese) as links to that cell of the lesson."""
    def fix(m: re.Match) -> str:
        href = cell_link(f"course/{m.group('nb')}", int(m.group("k")), dest)
        word = m.group("sep").lstrip(", ，").rstrip()
        return f'{m.group(1)}{m.group("sep")[:-len(word) - 1]}<a href="{href}">{word} [{m.group("k")}]</a>'
    return CHEAT_CELL.sub(fix, text)


# Where a "proven in" names a cell: `course/NN.ipynb` §N, "# its comment line", or, later in
# the same table cell, "# another comment line" of the lesson named last. (The Chinese edition
# names `zh/course/NN.ipynb`, writes "，" for the comma and may quote with “ ”.)
MYTH_CITE = re.compile(r"`(?:zh/)?course/(?P<nb>[\w.-]+\.ipynb)` (?P<section>§[\d.]+)(?P<sep>,\s*|，\s*)(?P<q>[\"“])(?=#)"
                       r"|(?P<q2>[\"“])(?=#)")
CLOSING = {'"': '"', "“": "”"}


def myths_page(root: Path, pages, unlinked: list[str] | None = None, edition: Edition = EN) -> str:
    """docs/MYTHS.md for the site: each "proven in" cell (a lesson, its section, and the
    proving cell's first comment line) links to that code cell. A citation whose comment line
    no code cell of the lesson has stays plain text and is added to `unlinked` (the build
    reports them: docs/MYTHS.md is out of date there). The Chinese edition's quotes the
    Chinese lessons' comments, and links to them."""
    unlinked = [] if unlinked is None else unlinked
    rel = "docs/MYTHS.md"
    origin = edition.repo(rel)
    text = rewrite_links((root / origin).read_text(encoding="utf-8"), origin, rel, pages, root)
    sources: dict[str, list[str]] = {}

    def comment_lines(nb: str) -> list[set[str]]:
        if nb not in sources:
            path = root / edition.repo("course") / nb
            if not path.exists():
                raise SiteError(f"{origin} cites course/{nb}, which does not exist")
            sources[nb] = code_cells(path)
        # (A quote may drop a comment's `code` marks: the Chinese lessons' comments have them.)
        return [{line.strip() for line in source.splitlines()} | {line.strip().replace("`", "") for line in source.splitlines()}
                for source in sources[nb]]

    def quoted(nb: str, cell: str, start: int, close: str) -> tuple[int | None, str]:
        """(k, comment) of the code cell whose comment line is quoted from `start` (just
        after the opening quote; the comment itself may hold quotes); k is None, and the
        citation is kept in `unlinked`, where no code cell of the lesson has that line."""
        lines = comment_lines(nb)
        ends = [i for i, ch in enumerate(cell) if ch == close and i > start]
        for end in ends:
            for k, found in enumerate(lines, start=1):
                if cell[start:end] in found:
                    return k, cell[start:end]
        comment = cell[start:ends[0]] if ends else cell[start:]
        unlinked.append(f"{edition.repo('course')}/{nb}: {comment!r}")
        return None, comment

    def proofs(cell: str) -> str:
        out, pos, current = [], 0, None
        for m in MYTH_CITE.finditer(cell):
            if m.start() < pos:
                continue  # (a quote inside a comment already linked)
            current = m.group("nb") or current
            if current is None:
                continue
            opening = m.group("q") or m.group("q2")
            k, comment = quoted(current, cell, m.end(), CLOSING[opening])
            if k is None:
                continue
            label = f'{opening}{html.escape(comment, quote=False)}{CLOSING[opening]}'
            if m.group("nb"):
                label = f'<code>course/{current}</code> {m.group("section")}{m.group("sep")}{label}'
            out += [cell[pos:m.start()], f'<a href="{cell_link(f"course/{current}", k, rel)}">{label}</a>']
            pos = m.end() + len(comment) + 1
        return "".join(out) + cell[pos:]

    lines = []
    for line in text.split("\n"):
        if line.startswith("|") and ("`course/" in line or "`zh/course/" in line):
            head, _, last = line.rstrip().rstrip("|").rpartition("|")
            line = f"{head}|{proofs(last)}|"
        lines.append(line)
    return "\n".join(lines)


def cheatsheet_page(root: Path, pages, edition: Edition = EN) -> str:
    """CHEATSHEET.md for the site: each proof link goes to the section that holds the proof,
    each "cell [k]" to that cell. The rules' proof links are found in the order the lessons
    give their rules (the order `make.py cheatsheet` writes them, in both editions)."""
    origin = edition.repo(cheatsheet.SHEET)
    text = (root / origin).read_text(encoding="utf-8")
    out, pos = [], 0
    for lesson in layout.lessons(root):
        rules, _ = cheatsheet.read_rules(lesson)
        shown = root / edition.repo("course") / lesson.name
        anchors = rule_anchors(lesson, shown if edition is not EN else None)
        for rule in rules:
            link = f"](course/{rule.notebook})"
            at = text.find(link, pos)
            if at < 0:
                raise SiteError(f"{origin} has no proof link to course/{rule.notebook} for the rule "
                                f"{rule.sentence[:60]!r}: it is out of sync with the lessons; run "
                                f"`python3 make.py cheatsheet`" + (" and `python3 make.py i18n build`" if edition is not EN else ""))
            anchor = anchors.get(rule.sentence)
            end = at + len(link)
            out += [text[pos:end - 1], f"#{anchor})" if anchor else ")"]
            pos = end
    text = "".join(out) + text[pos:]
    # Each error row gets an anchor: a pasted error message's first search result is its row
    # (coursetools/publish/site_search.py, website/_static/course-search.js).
    text = site_search.anchor_error_rows(text, origin)
    text = section_links(text, origin, root, edition)
    return link_cells(rewrite_links(text, origin, cheatsheet.SHEET, pages, root), cheatsheet.SHEET)


def _other_edition_line(paragraph: str) -> bool:
    """A README paragraph that points to the other language's README (the site's language
    switch and the edition's own line stand for it)."""
    return "](README.zh-CN.md)" in paragraph or "](README.md)" in paragraph


def home_page(root: Path, chapters: list[Chapter], pages, edition: Edition = EN,
              other: bool = False) -> str:
    """The home page: README's introduction, the course map (each chapter's lessons, exercise,
    prerequisites and time, read from the notebooks' headers) and the toctrees that make the
    sidebar. `other`: the site has the other edition (the introduction's line pointing to the
    other README then points to its home page)."""
    w = edition.words
    readme = (root / edition.readme).read_text(encoding="utf-8")
    heading = re.search(r"^#\s+(.+)$", readme, re.MULTILINE)
    title = layout.config().title if edition is EN or heading is None else heading.group(1).strip()
    paragraphs = readme_intro(readme).split("\n\n")
    paragraphs = [(w["other_edition"] if other else None) if _other_edition_line(p) else p for p in paragraphs]
    intro = rewrite_links("\n\n".join(p for p in paragraphs if p), edition.readme, "index.md", pages, root,
                          anchor_page=edition.readme, local_anchors=set())
    rows = [w["map_header"], "|---|---|---|---|---|"]
    for ch in chapters:
        several = len(ch.lessons) > 1
        lessons = "<br>".join(f"[{ch.part_title(i) if several else ch.title}]({lesson.path})"
                              for i, lesson in enumerate(ch.lessons))
        exercise = (edition.w("map_exercise", path=ch.exercise, points=f"{ch.points:g}") if ch.exercise else "—")
        prereq = " ".join(ch.lessons[0].prerequisites.split())  # (the later parts need the first)
        times = [edition.w("map_time_part", n=ch.part_number(i), time=short_time(lesson.time, edition)) if several
                 else edition.w("map_time_lesson", time=short_time(lesson.time, edition))
                 for i, lesson in enumerate(ch.lessons)]
        if ch.exercise_time:
            times.append(edition.w("map_time_exercise", time=short_time(ch.exercise_time, edition)))
        cells = [ch.number, lessons, exercise, prereq, w["map_time_sep"].join(times)]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    toctrees = []
    for ch in chapters:
        entries = [f"{ch.nav_title(i)} <{lesson.path.removesuffix('.ipynb')}>" for i, lesson in enumerate(ch.lessons)]
        if ch.exercise:
            entries.append(f"{ch.exercise_nav_title()} <{ch.exercise.removesuffix('.ipynb')}>")
        caption = f"{ch.number} · {ch.title}".replace("`", "")  # (a caption is plain text)
        toctrees.append(":::{toctree}\n:hidden:\n:caption: " + f"{caption}\n\n"
                        + "\n".join(entries) + "\n:::")
    guides = [(rel, title) for rel, title in w["guides"].items() if rel in pages_staged(pages)]
    reference = [entry for entry, page in [
        (f"{w['cheatsheet']} <{cheatsheet.SHEET.removesuffix('.md')}>", cheatsheet.SHEET),
        (f"{w['myths']} <docs/MYTHS>", "docs/MYTHS.md"),
        *((f"{title} <{rel.removesuffix('.md')}>", rel) for rel, title in guides),
        (f"{w['about']} <about>", "about.md")]
        if page in pages_staged(pages)]
    toctrees.append(":::{toctree}\n:hidden:\n:caption: " + w["reference"] + "\n\n" + "\n".join(reference) + "\n:::")
    staged = pages_staged(pages)
    return "\n".join([
        f"# {title}", "",
        f"<!-- Generated by `python3 make.py site` (coursetools/publish/website.py) from {edition.readme} and the "
        "notebooks' headers. -->", "",
        intro, "",
        f"## {w['map_heading']}", "",
        w["map_intro"], "",
        # A container: the site's CSS shows the table as one card per chapter on a phone.
        ":::{container} course-map", *rows, ":::", "",
        *([edition.w("cheatsheet_line", path=cheatsheet.SHEET)] if cheatsheet.SHEET in staged else []),
        *([edition.w("myths_line", path="docs/MYTHS.md")] if "docs/MYTHS.md" in staged else []),
        *([edition.w("guides_line", links=w["list_sep"].join(f"[{w['guide_in_line'](title)}]({rel})"
                                                             for rel, title in guides))] if guides else []),
        "", *toctrees, "",
    ])


def pages_staged(pages) -> set[str]:
    """The staged paths of `pages` (a set of paths, or a mapping from repository paths to them)."""
    return set(pages.values()) if isinstance(pages, dict) else set(pages)


EXERCISE_NOTES = {"en": """:::{{note}}
**Checking your answers here, on the web or in Colab.** This is the exercise as released:
answer cells to fill in, each followed by its visible tests. Open it in Colab (the *Open in
Colab* badge, or the rocket button at the top of the page), run the cells from the top, then
run each test cell after your answer: a test cell that runs without an error means your answer
passes its visible tests. The hidden tests, which decide the grade, run only on your own copy
of the course (`{check}` in its folder) or in your instructor's grader. The locked setup
and helper cells are collapsed below: click one to show its code.
:::""", "zh": """:::{{note}}
**在网页上或 Colab 中检查你的答案。** 这是按发布时的样子展示的练习：每个要填写的答案单元格后面都跟着它的可见测试。
在 Colab 中打开它（*Open in Colab* 徽章，或页面顶部的火箭按钮），从头运行各单元格，然后在作答之后运行每个测试单元格：
测试单元格运行时没有报错，就表示你的答案通过了它的可见测试。决定成绩的隐藏测试只在你自己的课程副本中
（在它的文件夹里运行 `{check}`）或在你的教师的评分程序中运行。锁定的准备单元格和辅助单元格在下面是折叠的：点击即可显示代码。
:::"""}
# Question 1's heading: the first level-2 heading ("## Question 1 · ...", "## 1. ...").
QUESTION = re.compile(r"^##\s+\S", re.MULTILINE)
HIDE_INPUT = "hide-input"  # myst-nb: the cell's code collapsed behind a "show" toggle


def collapse_locked_setup(nb: nbformat.NotebookNode) -> int:
    """Tag the locked code cells before question 1 (setup, grading helpers) `hide-input`, so
    the page shows question 1 first; how many were tagged. Question 1 starts at the first
    level-2 heading or the first answer cell, whichever comes first."""
    tagged = 0
    for cell in nb.cells:
        if cell.cell_type == "markdown" and QUESTION.search(cell.source):
            break
        if cell.cell_type == "code" and cell.get("metadata", {}).get("nbgrader", {}).get("solution"):
            break
        if cell.cell_type == "code" and cell.get("metadata", {}).get("nbgrader", {}).get("locked"):
            tags = cell.metadata.setdefault("tags", [])
            if HIDE_INPUT not in tags:
                tags.append(HIDE_INPUT)
            tagged += 1
    return tagged


def stage(root: Path, dest: Path, edition: Edition = EN, other: bool = False, outputs=None) -> Staged:
    """Lay out in `dest` everything the site's `edition` shows, made from the repository at
    `root` (the Chinese edition from zh/, laid out as the English one: zh/course/X is staged at
    course/X). `other`: the site also has the other edition. `outputs(rel, nb)`, if given,
    fills each lesson's outputs before it is written (the Chinese edition's, from the English
    run: `english_outputs`)."""
    dest.mkdir(parents=True, exist_ok=True)
    content = root / edition.repo_dir if edition.repo_dir else root
    lessons = layout.lessons(content)
    if not lessons:
        raise SiteError(f"no lesson notebooks in {content / 'course'}")
    assignments = [a for a in layout.assignments(root) if layout.release_notebook(a, content).exists()]
    lesson_rel = [p.relative_to(content).as_posix() for p in lessons]
    exercise_rel = {a: layout.release_notebook(a, content).relative_to(content).as_posix() for a in assignments}
    pages: dict[str, str] = {}    # staged path -> the repository file it is made from ("" if generated)
    resources: list[str] = []    # staged files that are no pages (attachments)
    unlinked_proofs: list[str] = []  # docs/MYTHS.md's citations of a cell no lesson has
    for rel in [*lesson_rel, *exercise_rel.values()]:
        pages[rel] = edition.repo(rel)
    for rel in (cheatsheet.SHEET, "docs/MYTHS.md", *edition.words["guides"]):
        if (content / rel).exists():
            pages[rel] = edition.repo(rel)
    guides = [rel for rel in edition.words["guides"] if rel in pages]
    for generated in ("index.md", "about.md"):
        pages[generated] = ""
    targets = {(origin or edition.repo(rel)): rel for rel, origin in pages.items()}  # repository path -> staged

    chapters: dict[str, Chapter] = {}
    for lesson, rel in zip(lessons, lesson_rel):
        nb = notebooks.read(lesson)
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                source = section_links(cell.source, pages[rel], root, edition)
                cell.source = local_badge(rewrite_links(source, pages[rel], rel, targets, root), rel)
        resources += extract_attachments(nb, rel, dest)
        if outputs is not None:
            outputs(rel, nb)
        _write(dest / rel, _notebook_text(add_cell_anchors(nb)))
        facts = header_facts(nb, edition)
        if facts is None:
            raise SiteError(f"{pages[rel]}: its header has no {edition.words['facts_missing']} line "
                            "(docs/AUTHORING.md, the notebook skeleton)")
        prereq = rewrite_links(facts[0], pages[rel], "index.md", targets, root)
        chapter = chapters.setdefault(lesson.stem[:2], Chapter(lesson.stem[:2], [], edition=edition))
        chapter.lessons.append(Lesson(rel, title_of(nb, lesson.stem, edition), prereq, facts[1]))
    for name, rel in exercise_rel.items():
        chapter = chapters.get(name[:2])
        if chapter is None or chapter.exercise is not None:
            raise SiteError(f"{pages[rel]}: no lesson course/{name[:2]}_*.ipynb for this exercise, or a second "
                            f"exercise numbered {name[:2]}")
        ex_nb = notebooks.read(content / rel)
        ex_facts = header_facts(ex_nb, edition)
        chapter.exercise = rel
        chapter.exercise_time = ex_facts[1] if ex_facts else None
        chapter.points = sum(notebooks.points(c) for c in notebooks.test_cells(ex_nb))
    chapters = list(chapters.values())

    for name, rel in exercise_rel.items():
        nb = notebooks.read(content / rel)
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = local_badge(rewrite_links(cell.source, pages[rel], rel, targets, root), rel)
        resources += extract_attachments(nb, rel, dest)
        collapse_locked_setup(nb)
        check = edition.w("check", chapter=name.split("_", 1)[0])
        note = nbformat.v4.new_markdown_cell(EXERCISE_NOTES[edition.lang].format(check=check))
        note.pop("id", None)
        nb.cells.insert(1, note)
        _write(dest / rel, _notebook_text(nb))

    if cheatsheet.SHEET in pages:
        _write(dest / cheatsheet.SHEET, cheatsheet_page(root, targets, edition))
    if "docs/MYTHS.md" in pages:
        _write(dest / "docs/MYTHS.md", myths_page(root, targets, unlinked_proofs, edition))
    for rel in guides:
        text = (root / pages[rel]).read_text(encoding="utf-8")
        _write(dest / rel, rewrite_links(text, pages[rel], rel, targets, root))
    _write(dest / "index.md", home_page(root, chapters, targets, edition, other))
    badge = (SITE_DIR / LOCAL_BADGE).read_bytes()
    (dest / "_static").mkdir(exist_ok=True)
    if not (dest / LOCAL_BADGE).exists() or (dest / LOCAL_BADGE).read_bytes() != badge:
        (dest / LOCAL_BADGE).write_bytes(badge)

    # Whatever an earlier build staged and this one did not is removed (a deleted lesson).
    keep = {dest / p for p in [*pages, *resources]} | {dest / LOCAL_BADGE, dest / MANIFEST}
    for path in sorted(dest.rglob("*"), reverse=True):
        if path.is_file() and path not in keep:
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()
    manifest = {"edition": edition.lang,
                "pages": {p: {"origin": o, "sha256": _sha256(root / o) if o else None}
                          for p, o in sorted(pages.items())}}
    _write(dest / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return Staged(dest, pages, lesson_rel, chapters, unlinked_proofs, edition)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------------------
# Executing the lessons
# --------------------------------------------------------------------------------------

def environment() -> dict[str, str]:
    """What must match for a cached run to be reused: the PyTorch and Python of this build."""
    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = "not installed"
    return {"torch": torch, "python": platform.python_version()}


def machine() -> dict[str, object]:
    """This machine, as the "About these outputs" page describes it."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    memory = None
    with contextlib.suppress(ValueError, OSError, AttributeError):
        memory = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    return {"cpu": cpu, "cores": usable, "memory_gib": memory, "os": platform.platform(),
            "architecture": platform.machine()}


@dataclasses.dataclass
class Execution:
    lesson: str          # staged path
    reused: bool         # True: the cache held a matching run
    seconds: float       # the run's own time (of the run that made the outputs)
    executed_at: str     # ISO date and time of that run
    torch: str           # as the notebook's setup cell printed it
    device: str          # as the notebook's setup cell printed it
    machine: dict        # where that run was made (None: not recorded)


def _stderr(nb: nbformat.NotebookNode) -> list[str]:
    found = []
    for index, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stderr":
                found.append(f"cell {index}: {out.get('text', '')[:300]!r}")
    return found


def _setup_report(nb: nbformat.NotebookNode) -> tuple[str, str]:
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            match = SETUP_REPORT.search(out.get("text", "") if out.get("output_type") == "stream" else "")
            if match:
                return match.group(1), match.group(2) + (f" ({match.group(3)})" if match.group(3) else "")
    return "unknown (no setup-cell report in the outputs)", "unknown"


def run_notebook(nb: nbformat.NotebookNode, rel: str) -> float:
    """Run `nb` in place, top to bottom, in a kernel of this environment started in an empty
    folder; its seconds. The kernel talks over Unix sockets in a private folder (ZeroMQ's ipc
    transport), not over loopback TCP ports that another process on a busy machine could
    reach. A cell that raises, or writes to stderr, stops the build."""
    from jupyter_client.manager import AsyncKernelManager
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError
    from traitlets import default

    with tempfile.TemporaryDirectory(prefix="course-site-run-") as cwd, \
            tempfile.TemporaryDirectory(prefix="course-site-kernel-") as sockets:

        class IpcKernelManager(AsyncKernelManager):
            @default("transport")
            def _default_transport(self):
                return "ipc"

            @default("ip")
            def _default_ip(self):
                return os.path.join(sockets, "kernel")  # absolute: the kernel runs in `cwd`

        # The client owns the kernel: it shuts it down and closes its channels, whatever
        # happens. No timing in the cells' metadata: the cache keys on it.
        client = NotebookClient(nb, kernel_manager_class=IpcKernelManager, timeout=CELL_TIMEOUT_S,
                                allow_errors=False, record_timing=False,
                                resources={"metadata": {"path": cwd}})
        started = time.perf_counter()
        try:
            client.execute()
        except CellExecutionError as exc:
            raise SiteError(f"{rel} failed while building the site:\n{exc}") from None
        except Exception as exc:  # a dead kernel, a cell over its time limit
            raise SiteError(f"{rel} did not run to the end: {type(exc).__name__}: {exc}") from None
        seconds = time.perf_counter() - started
    stderr = _stderr(nb)
    if stderr:
        raise SiteError(f"{rel} wrote to stderr (no lesson cell may): " + "; ".join(stderr))
    return seconds


def execute_lessons(staged: Staged, cache_dir: Path, log=print) -> list[Execution]:
    """Run each staged lesson unless the cache holds a run of the same code cells, made with
    this PyTorch and Python; return where each lesson's outputs come from."""
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    cache = get_cache(str(cache_dir))
    env = environment()
    done = []
    for rel in staged.lessons:
        path = staged.folder / rel
        nb = nbformat.read(str(path), as_version=4)
        record = None
        with contextlib.suppress(KeyError):
            record = cache.match_cache_notebook(nb)
        if record is not None and (record.data or {}).get("environment") != env:
            log(f"  {rel}: the cached run was made with {(record.data or {}).get('environment')}, "
                f"this build has {env}: running it again")
            record = None
        reused = record is not None
        if record is None:
            log(f"  running {rel} ...", )
            started = datetime.datetime.now().astimezone()
            seconds = run_notebook(nb, rel)
            record = cache.cache_notebook_bundle(
                CacheBundleIn(nb, str(path), data={
                    "execution_seconds": seconds, "environment": env, "machine": machine(),
                    "executed_at": started.isoformat(timespec="seconds")}),
                check_validity=False, overwrite=True)
            log(f"  ran {rel} in {seconds:.1f} s")
        executed = cache.get_cache_bundle(record.pk).nb
        torch, device = _setup_report(executed)
        data = record.data or {}
        done.append(Execution(rel, reused, float(data.get("execution_seconds") or 0.0),
                              data.get("executed_at") or record.created.isoformat(timespec="seconds"),
                              torch, device, data.get("machine")))
    return done


def _children() -> list[str]:
    """This process's child processes still running (none once every kernel is shut down)."""
    try:
        import psutil
    except ImportError:  # (ipykernel needs psutil; without it, nothing to check with)
        return []
    found = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.status() != psutil.STATUS_ZOMBIE:
                found.append(f"{child.pid} {' '.join(child.cmdline())[:120]}")
    return found


def about_page(executions: list[Execution], staged: Staged) -> str:
    """Which PyTorch release and machine produced the outputs the site shows."""
    titles = {lesson.path: f"{ch.number} · {lesson.title}" for ch in staged.chapters for lesson in ch.lessons}
    machines = {json.dumps(e.machine, sort_keys=True) for e in executions}
    rows = ["| Lesson | PyTorch (as its setup cell printed) | device | run on | run time (s) |",
            "|---|---|---|---|---:|"]
    for e in executions:
        rows.append(f"| [{titles.get(e.lesson, e.lesson)}]({e.lesson}) | {e.torch} | {e.device} | "
                    f"{e.executed_at} | {e.seconds:.1f} |")
    lines = ["# About these outputs", "",
             "<!-- Generated by `python3 make.py site` from the records of the runs whose outputs "
             "this site shows. -->", "",
             "Every output and figure in the lessons comes from a real run of the notebook, top to "
             "bottom, on the machine below, when the site was built (a lesson whose code has not "
             "changed since an earlier build, with the same PyTorch and Python, keeps the outputs "
             "of that earlier run). Nothing was edited by hand. Outputs that differ on a GPU are "
             "shown, where a GPU run was recorded, in collapsed blocks labelled with the GPU, its "
             "PyTorch and CUDA versions and the date of the recording.", "",
             *rows, ""]
    for key in sorted(machines):
        facts = json.loads(key)
        which = [titles.get(e.lesson, e.lesson) for e in executions if json.dumps(e.machine, sort_keys=True) == key]
        lines.append("## The machine" if len(machines) == 1 else f"## The machine of {', '.join(which)}")
        lines.append("")
        if not facts:
            lines += ["Not recorded (the cache held these outputs from a run that did not record it).", ""]
            continue
        memory = f"{facts['memory_gib']} GiB" if facts.get("memory_gib") else "unknown"
        lines += [f"- CPU: {facts['cpu']} ({facts['cores']} cores usable by the build)",
                  f"- memory: {memory}", f"- operating system: {facts['os']}",
                  "- GPU: none used (every lesson printed `device: cpu`)"
                  if all(e.device == "cpu" for e in executions) else "- devices: see the table", ""]
    versions = {name: _version(name) for name in ("sphinx", "myst-nb", "sphinx-book-theme", "jupyter-cache")}
    lines += ["## The site", "",
              f"Built on {datetime.datetime.now().astimezone().isoformat(timespec='seconds')} with "
              + ", ".join(f"{k} {v}" for k, v in versions.items()) + " (`python3 make.py site`).", ""]
    return "\n".join(lines)


def about_page_zh(executions: list[Execution], staged: Staged) -> str:
    """The Chinese edition's "About these outputs": its outputs are the English run's (see
    `english_outputs`), so it says so and links to the English page for the machine."""
    titles = {lesson.path: f"{ch.number} · {lesson.title}" for ch in staged.chapters for lesson in ch.lessons}
    rows = ["| 课 | PyTorch（准备单元格打印的版本） | 设备 | 运行于 | 用时（秒） |", "|---|---|---|---|---:|"]
    for e in executions:
        if e.lesson in titles:
            rows.append(f"| [{titles[e.lesson]}]({e.lesson}) | {e.torch} | {e.device} | {e.executed_at} | {e.seconds:.1f} |")
    return "\n".join([
        "# 关于这些输出", "",
        "<!-- Generated by `python3 make.py site` from the records of the English lessons' runs. -->", "",
        "本版各课中的每个输出和每张图，都来自英文版同一节课在构建网站时的真实运行，没有任何手工修改。两个版本的代码单元格"
        "完全相同，只有注释和文档字符串译成了中文：构建网站时会逐个单元格核对这一点，代码不同就拒绝构建。因此输出中的文字"
        "是英文的，和你自己运行这些单元格时看到的一样。运行它们的机器见英文版的"
        '<a href="../about.html" hreflang="en" lang="en">About these outputs</a>。', "",
        *rows, ""])


def last_verified(executions: list[Execution], edition: Edition = EN) -> str:
    """What every page's "Last verified" line says: the PyTorch release(s) the lessons' outputs
    were made with and the date of the latest of those runs ("PyTorch 2.9.1, run on 2026-12-01")."""
    if not executions:
        return ""
    torch = sorted({e.torch for e in executions})
    date = max(e.executed_at for e in executions)[:10]
    if edition is EN:
        return f"PyTorch {', '.join(torch)}, run on {date}"
    return f"PyTorch {'、'.join(torch)}，运行于 {date}"


def same_code(english: str, chinese: str) -> bool:
    """Whether two lesson code cells are the same code apart from their comments, docstrings and
    printed lines (what the Chinese edition translates: pycode.said), so that one's outputs are
    the other's. (The outputs stay the English run's: its printed lines are English.)"""
    from coursetools.publish.i18n import pycode

    try:
        return pycode.without_said(english, True, False, english=english) == \
            pycode.without_said(chinese, True, False, english=english) \
            and pycode.magic_lines(english) == pycode.magic_lines(chinese)
    except SyntaxError:
        return english == chinese


def english_outputs(ran: Staged, cache_dir: Path):
    """The Chinese edition's lessons are not run again: each code cell gets the outputs of the
    same cell of the English lesson's run (in the cache `execute_lessons` filled), after a check
    that the two cells are the same code (`same_code`); a difference stops the build. Returns
    the `outputs` hook of `stage`."""
    from jupyter_cache import get_cache

    cache = get_cache(str(cache_dir))

    def fill(rel: str, nb: nbformat.NotebookNode) -> None:
        origin = ZH.repo(rel)
        if rel not in ran.lessons:
            raise SiteError(f"{origin} has no English lesson {rel} whose run could give it its outputs")
        english = nbformat.read(str(ran.folder / rel), as_version=4)
        try:
            record = cache.match_cache_notebook(english)
        except KeyError:
            raise SiteError(f"{rel}: no run of it in the cache {cache_dir} to give {origin} its outputs") from None
        executed = cache.get_cache_bundle(record.pk).nb
        en_code = [c for c in executed.cells if c.cell_type == "code"]
        zh_code = [c for c in nb.cells if c.cell_type == "code"]
        if len(en_code) != len(zh_code):
            raise SiteError(f"{origin} has {len(zh_code)} code cells, {rel} {len(en_code)}: the Chinese edition is "
                            "out of date; run `python3 make.py i18n build`")
        for k, (e, z) in enumerate(zip(en_code, zh_code), start=1):
            if not same_code(e.source, z.source):
                raise SiteError(f"{origin}, code cell [{k}]: its code is not {rel}'s (beyond comments and "
                                "docstrings), so the English run's outputs are not its outputs; run "
                                "`python3 make.py i18n build`")
            z.outputs = copy.deepcopy(e.outputs)
            z.execution_count = e.execution_count
    return fill


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "?"


# --------------------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------------------

@contextlib.contextmanager
def offline():
    """Refuse every connection that leaves this machine, for the duration: the build must
    download nothing (a theme or extension that tries fails the build, saying so)."""
    original = socket.socket.connect

    def connect(sock, address):
        host = address[0] if isinstance(address, tuple) else None
        if host is not None and not _local(host):
            raise SiteError(f"the site build tried to connect to {address!r}: nothing may be "
                            "downloaded while building the site")
        return original(sock, address)

    socket.socket.connect = connect
    try:
        yield
    finally:
        socket.socket.connect = original


def _local(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


@dataclasses.dataclass
class BuildResult:
    html: Path
    staged: Staged
    executions: list[Execution]
    pages: int           # HTML files
    links_checked: int   # internal links and anchors followed by check_links
    seconds: float


def build(root: Path = layout.ROOT, build_dir: Path = BUILD_DIR, cache_dir: Path | None = None,
          log=print) -> BuildResult:
    """Stage, execute and render the site; return where it is and what it took."""
    started = time.perf_counter()
    root, build_dir = Path(root).resolve(), Path(build_dir).resolve()
    cache_dir = Path(cache_dir).resolve() if cache_dir else build_dir / "jupyter_cache"
    html = build_dir / "html"
    with offline():
        other = len(editions(root)) > 1
        staged = stage(root, build_dir / "src", EN, other)
        log(f"staged {len(staged.pages)} pages from {root}")
        for citation in staged.unlinked_proofs:
            log(f"  docs/MYTHS.md cites a cell that no code cell has, left unlinked (fix the quote): {citation}")
        executions = execute_lessons(staged, cache_dir, log)
        left = _children()
        if left:
            raise SiteError(f"a lesson's kernel was left running: {left}")
        _write(staged.folder / "about.md", about_page(executions, staged))
        builds = [(staged, html, build_dir / "doctrees")]
        if other:
            shown = stage(root, build_dir / "src-zh", ZH, True, outputs=english_outputs(staged, cache_dir))
            log(f"staged {len(shown.pages)} pages of the Chinese edition (zh/), with the English run's outputs")
            for citation in shown.unlinked_proofs:
                log(f"  zh/docs/MYTHS.md cites a cell that no code cell has, left unlinked (fix the quote): {citation}")
            _write(shown.folder / "about.md", about_page_zh(executions, shown))
            builds.append((shown, html / ZH.site_dir, build_dir / "doctrees-zh"))
        for this, out, doctrees in builds:
            counterpart = next((b for b in builds if b[0] is not this), None)
            os.environ["COURSE_SITE_EDITION"] = json.dumps(
                sphinx_context(this, counterpart[0] if counterpart else None, executions))
            _sphinx(this.folder, out, doctrees, cache_dir)
    # The download buttons serve the repository's notebooks, exactly as Colab opens them; the
    # search page finds a pasted error message's row of the cheat sheet from its index.
    for this, out, _ in builds:
        if cheatsheet.SHEET in this.pages:
            site_search.write_error_index(out, (this.folder / cheatsheet.SHEET).read_text(encoding="utf-8"),
                                          cheatsheet.SHEET, source=this.edition.repo(cheatsheet.SHEET))
        for page, origin in this.pages.items():
            if page.endswith(".ipynb") and origin:
                target = out / "_sources" / page
                if not target.exists():
                    raise SiteError(f"Sphinx wrote no download copy of {page} ({target})")
                shutil.copy2(root / origin, target)
    broken, checked = check_links(html)
    if broken:
        raise SiteError(f"{len(broken)} broken internal link(s) in the built site:\n  " + "\n  ".join(broken))
    result = BuildResult(html, staged, executions, len(site_pages(html)), checked,
                         time.perf_counter() - started)
    summary = {"pages": result.pages, "links_checked": checked, "seconds": round(result.seconds, 1),
               "lessons": [dataclasses.asdict(e) for e in executions],
               "unlinked_myths_proofs": [u for b in builds for u in b[0].unlinked_proofs],
               "editions": {b[0].edition.lang: {"site_dir": b[0].edition.site_dir, "src": str(b[0].folder),
                                                "pages": len(b[0].pages)} for b in builds}}
    _write(build_dir / "site-build.json", json.dumps(summary, indent=1) + "\n")
    return result


def sphinx_context(staged: Staged, other: Staged | None, executions: list[Execution]) -> dict:
    """What website/conf.py needs to render one edition (passed in COURSE_SITE_EDITION): its
    language and title, whether myst-nb reads the execution cache (the English edition) or
    the outputs already in the notebooks (the Chinese one), its "Last verified" line, and the
    language switch: where the other edition is, and which pages it has (a page it lacks
    switches to its home page)."""
    ed = staged.edition
    switch = None
    if other is not None:
        oed = other.edition
        base = f"{oed.site_dir}/" if oed.site_dir else "../" * (ed.site_dir.count("/") + 1)
        switch = {"base": base, "label": oed.name, "hreflang": oed.hreflang,
                  "pages": sorted({posixpath.splitext(p)[0] for p in other.pages} | {"search", "genindex"})}
    heading = re.search(r"^# (.+)$", (staged.folder / "index.md").read_text(encoding="utf-8"), re.MULTILINE)
    return {"lang": ed.lang, "repo_dir": ed.repo_dir, "language": ed.sphinx_language, "title": plain(heading.group(1)) if heading else None,
            "execution": "cache" if ed is EN else "off",
            "verified": last_verified(executions, ed), "verified_label": ed.w("verified"),
            "about_label": ed.w("about_link"), "switch": switch}


def _sphinx(src: Path, html: Path, doctrees: Path, cache_dir: Path) -> None:
    from sphinx.application import Sphinx
    from sphinx.util.docutils import docutils_namespace, patch_docutils

    os.environ["COURSE_SITE_CACHE"] = str(cache_dir)
    warnings = StringIOWithEcho()
    with patch_docutils(str(SITE_DIR)), docutils_namespace():
        app = Sphinx(str(src), str(SITE_DIR), str(html), str(doctrees), "html",
                     status=sys.stdout, warning=warnings, freshenv=False, warningiserror=False,
                     keep_going=True)
        app.build()
    if warnings.getvalue().strip():
        raise SiteError("Sphinx warned (a warning fails the site build):\n" + warnings.getvalue())
    if app.statuscode:
        raise SiteError(f"Sphinx failed (status {app.statuscode})")


class StringIOWithEcho:
    """Sphinx's warning stream: kept for the error message, and shown as it comes."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        self.parts.append(text)
        sys.stderr.write(text)
        return len(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def getvalue(self) -> str:
        return "".join(self.parts)


# --------------------------------------------------------------------------------------
# Checking the built site
# --------------------------------------------------------------------------------------

def site_pages(html_dir: Path) -> list[Path]:
    """The site's HTML pages, both editions' (not the theme's templates under _static/)."""
    return sorted(p for p in Path(html_dir).rglob("*.html")
                  if not {"_static", "_sources"} & set(p.relative_to(html_dir).parts))


class _Page(html.parser.HTMLParser):
    """The ids (anchors) of an HTML page and the links it makes (href, src)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        values = dict(attrs)
        for key in ("id", "name") if tag == "a" else ("id",):
            if values.get(key):
                self.ids.add(values[key])
        for key in ("href", "src"):
            if values.get(key) and tag in ("a", "link", "script", "img", "source", "iframe", "area"):
                self.links.append(values[key])


def check_links(html_dir: Path) -> tuple[list[str], int]:
    """Every internal link and anchor of the built site, followed offline: a list of the
    broken ones ("page: link (why)"), and how many links were checked. External addresses
    (with a scheme) are not followed; `#` alone (the theme's buttons) is no anchor."""
    html_dir = Path(html_dir)
    pages: dict[Path, _Page] = {}
    for path in site_pages(html_dir):
        parser = _Page()
        parser.feed(path.read_text(encoding="utf-8"))
        pages[path] = parser
    broken, checked = [], 0
    for path, parser in pages.items():
        for link in parser.links:
            if SCHEME.match(link) or link in ("#", ""):
                continue
            checked += 1
            target_part, _, fragment = link.partition("#")
            target_part = urllib.parse.unquote(target_part.split("?", 1)[0])
            target = (path.parent / target_part).resolve() if target_part else path
            if target_part.endswith("/") or target.is_dir():
                target = target / "index.html"
            where = f"{path.relative_to(html_dir).as_posix()}: {link}"
            if not target.is_relative_to(html_dir.resolve()):
                broken.append(f"{where} (leaves the site)")
            elif not target.exists():
                broken.append(f"{where} (no such file)")
            elif fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else set()
                if urllib.parse.unquote(fragment) not in ids:
                    broken.append(f"{where} (no anchor #{fragment} in {target.relative_to(html_dir).as_posix()})")
    return broken, checked


# --------------------------------------------------------------------------------------
# Serving
# --------------------------------------------------------------------------------------

def server(html: Path, port: int = 8000, host: str = "127.0.0.1") -> http.server.ThreadingHTTPServer:
    """An HTTP server for the built site (not started: call serve_forever)."""
    handler = functools.partial(_QuietHandler, directory=str(html))
    return http.server.ThreadingHTTPServer((host, port), handler)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass


# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make.py site", description=__doc__.splitlines()[0])
    parser.add_argument("--serve", action="store_true", help="after building, serve the site on "
                        "http://127.0.0.1:PORT until Ctrl-C")
    parser.add_argument("--port", type=int, default=8000, help="the preview's port (default 8000)")
    parser.add_argument("--build-dir", type=Path, default=BUILD_DIR,
                        help="where to build (default website/_build; the site is its html/ folder)")
    parser.add_argument("--cache", type=Path, default=None,
                        help="the lessons' execution cache (default BUILD_DIR/jupyter_cache)")
    parser.add_argument("--root", type=Path, default=layout.ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        result = build(args.root, args.build_dir, args.cache)
    except SiteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    ran = [e.lesson for e in result.executions if not e.reused]
    print(f"\nbuilt {result.pages} pages in {result.seconds:.1f} s: {result.html}/index.html "
          f"({len(ran)} lesson(s) run, {len(result.executions) - len(ran)} from the cache)")
    if args.serve:
        try:
            httpd = server(result.html, args.port)
        except OSError as exc:
            print(f"error: cannot serve on 127.0.0.1:{args.port} ({exc}); try --port 8001", file=sys.stderr)
            return 1
        print(f"serving the site on http://127.0.0.1:{httpd.server_address[1]}/ (Ctrl-C stops it)", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            httpd.serve_forever()
        httpd.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
