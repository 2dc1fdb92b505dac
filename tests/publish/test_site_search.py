"""The site search's error index (coursetools/publish/site_search.py) and the search page's
script that uses it (website/_static/course-search.js): a pasted error message's first search
result is its row of the cheat sheet's Errors table. Fast: no site build (the script runs in
Chromium on a small served folder; the anchor's rendering is checked with a two-page Sphinx
build of the Errors table alone)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import urllib.parse
from pathlib import Path

import pytest

from coursetools import layout
from coursetools.publish import site_search, website

ROOT = layout.ROOT
SHEETS = {"en": ROOT / "CHEATSHEET.md", "zh": ROOT / "zh" / "CHEATSHEET.md"}
SCRIPT = ROOT / "website" / "_static" / "course-search.js"
SAME_DEVICE = "error-expected-all-tensors-to-be-on-the-same-device"


def sheet(lang: str) -> str:
    return SHEETS[lang].read_text(encoding="utf-8")


# --------------------------------------------------------------------------------------
# The index
# --------------------------------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_error_rows_of_the_cheat_sheet(lang):
    """Every row of the real table is read, each with a unique anchor, its chapters and cause."""
    text = sheet(lang)
    rows = site_search.error_rows(text, str(SHEETS[lang]))
    table_lines = [l for l in text[text.index("| `"):].split("\n") if l.startswith("| `")]
    assert len(rows) == len(table_lines) >= 30
    anchors = [r.anchor for r in rows]
    assert len(set(anchors)) == len(anchors)
    assert all(re.fullmatch(r"error-[a-z0-9]+(-[a-z0-9]+)*", a) and len(a) <= 6 + site_search.SLUG_MAX
               for a in anchors)
    same = next(r for r in rows if r.message == "Expected all tensors to be on the same device")
    assert same.anchor == SAME_DEVICE
    assert same.chapters == ("course/01_device_basics.ipynb", "course/08_troubleshooting.ipynb")
    assert same.labels == ("01 §4", "08 §4")
    assert all(len(r.labels) == len(r.chapters) and all(re.fullmatch(r"\d\d §[\d.]+( row \d+| 第 \d+ 行)?", label)
                                                         for label in r.labels) for r in rows), rows
    assert all(r.chapters and all(c.startswith("course/") for c in r.chapters) for r in rows)
    assert all(r.cause and "`" not in r.cause and "](" not in r.cause for r in rows)
    by_message = {r.message: r for r in rows}
    assert "Found no NVIDIA driver on your system / No CUDA GPUs are available" in by_message
    assert by_message["can't optimize a non-leaf Tensor"].anchor == "error-cant-optimize-a-non-leaf-tensor"


@pytest.mark.timeout(60)
def test_both_editions_give_a_row_the_same_anchor():
    """The messages are the same in both editions (only the other columns are translated), and
    so are the anchors: the language switch keeps a reader on the row."""
    en, zh = (site_search.error_rows(sheet(lang)) for lang in ("en", "zh"))
    assert [(r.message, r.anchor, r.chapters) for r in en] == [(r.message, r.anchor, r.chapters) for r in zh]
    assert en[0].cause != zh[0].cause


@pytest.mark.timeout(60)
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_anchor_error_rows(lang):
    """One anchor at the start of each row's first cell, nothing else changed, idempotent."""
    text = sheet(lang)
    anchored = site_search.anchor_error_rows(text)
    rows = site_search.error_rows(text)
    for row in rows:
        assert f'| <span id="{row.anchor}" class="course-error-anchor"></span>`{row.message}`' in anchored
    assert anchored.count('class="course-error-anchor"') == len(rows)
    assert re.sub(r'<span id="[^"]*" class="course-error-anchor"></span>', "", anchored) == text
    assert site_search.anchor_error_rows(anchored) == anchored
    assert site_search.error_rows(anchored) == rows


@pytest.mark.timeout(60)
def test_error_index():
    rows = site_search.error_rows(sheet("en"))
    index = site_search.error_index(rows, "CHEATSHEET.md")
    json.dumps(index)
    first = index[0]
    assert first == {"message": rows[0].message, "anchor": rows[0].anchor,
                     "url": f"CHEATSHEET.html#{rows[0].anchor}", "cause": rows[0].cause,
                     "chapters": [{"label": "01 §4", "url": "course/01_device_basics.html"},
                                  {"label": "08 §4", "url": "course/08_troubleshooting.html"}]}
    # A page in a folder: its links are relative to it, the URLs to the edition's root.
    deeper = site_search.error_index(rows[:1], "docs/SHEET.md")[0]
    assert deeper["url"] == f"docs/SHEET.html#{rows[0].anchor}"
    assert [c["url"] for c in deeper["chapters"]] == ["docs/course/01_device_basics.html",
                                                      "docs/course/08_troubleshooting.html"]
    assert site_search.html_url("https://example.org/a.md", "CHEATSHEET.md") == "https://example.org/a.md"
    assert site_search.html_url("../course/08_x.ipynb#s-3", "docs/A.md") == "course/08_x.html#s-3"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_sites_cheat_sheet_links_each_error_to_its_section(tmp_path, lang):
    """On the site, each row's links go to the section that explains the message, not to the top
    of the chapter: the staged cheat sheet (what Sphinx builds, and what the search's index is
    made from) gives each the anchor of that section's heading, the Chinese edition its
    translated heading's. (tests/publish/test_site.py checks, on the built site, that each
    anchor is the section.)"""
    edition = website.EN if lang == "en" else website.ZH
    website.stage(ROOT, tmp_path, edition)
    rows = site_search.error_rows((tmp_path / "CHEATSHEET.md").read_text(encoding="utf-8"))
    same = next(r for r in rows if r.message == "Expected all tensors to be on the same device")
    assert same.chapters == (("course/01_device_basics.ipynb#4-the-same-device-rule-and-its-two-exceptions",
                              "course/08_troubleshooting.ipynb#4-a-debugging-routine") if lang == "en" else
                             ("course/01_device_basics.ipynb#4-同设备规则及其两个例外",
                              "course/08_troubleshooting.ipynb#4-一套调试流程"))
    loaded = next(r for r in rows if r.message.startswith("'pin_memory' argument"))
    assert loaded.chapters[0].startswith("course/07_performance_2_waits.ipynb#31-")  # the part that has §3.1
    assert loaded.labels == (("07 §3.1", "08 §2 row 6") if lang == "en" else ("07 §3.1", "08 §2 第 6 行"))
    assert all(len(r.chapters) == len(r.labels) and all("#" in c for c in r.chapters) for r in rows)
    # Lesson 08's own copy of the table does the same.
    lesson = json.loads((tmp_path / "course" / "08_troubleshooting.ipynb").read_text(encoding="utf-8"))
    table = next("".join(c["source"]) for c in lesson["cells"] if "error-index:start" in "".join(c["source"]))
    assert re.search(r"\[01 §4\]\(01_device_basics\.(ipynb|md)#4-", table), table[:600]


def test_a_section_link_the_lesson_does_not_have_stops_the_build():
    text = "| `m` | c | f | [01 §99](course/01_device_basics.ipynb) |"
    with pytest.raises(website.SiteError, match=r"\[01 §99\].*run `python3 make.py cheatsheet`"):
        website.section_links(text, "CHEATSHEET.md", ROOT, website.EN)
    assert website.section_links("[01](course/01_device_basics.ipynb)", "CHEATSHEET.md", ROOT, website.EN) == \
        "[01](course/01_device_basics.ipynb)"  # a plain chapter link stays as it is


@pytest.mark.timeout(60)
def test_write_error_index(tmp_path):
    path = site_search.write_error_index(tmp_path / "zh", sheet("zh"))
    assert path == tmp_path / "zh" / "_static" / "course-errors.json"
    entries = json.loads(path.read_text(encoding="utf-8"))
    assert entries[0]["anchor"] == SAME_DEVICE and "同一运算" in entries[0]["cause"]


SMALL_TABLE = """\
| Message (part) | Cause | Fix | Chapter |
|---|---|---|---|
| `first message` | a cause | a fix | [01](course/01_a.ipynb) |
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("text, says", [
    ("# Sheet\n\n## Rules\n\n- a rule\n", "no Errors table"),
    ("# Sheet\n\n## Errors\n\nNo table yet.\n\n## Later\n\n" + SMALL_TABLE.replace("Message", "Other"),
     "'## Errors' section has no table"),
    ("# Sheet\n\n## Errors\n\n| Message (part) | Cause | Fix | Chapter |\n|---|---|---|---|\n\ntext\n",
     "has no rows"),
    ("## Errors\n\n" + SMALL_TABLE + "| no backquotes | c | f | [01](course/01_a.ipynb) |\n",
     "holds no backquoted message"),
    ("## Errors\n\n```\n" + SMALL_TABLE + "```\n", "no Errors table"),
])
def test_bad_cheat_sheets_say_what_is_wrong(text, says):
    with pytest.raises(ValueError, match=re.escape(says)) as caught:
        site_search.error_rows(text, "zh/CHEATSHEET.md")
    assert str(caught.value).startswith("zh/CHEATSHEET.md")


@pytest.mark.timeout(60)
def test_the_table_is_found_by_its_header_or_its_section():
    """Without the Errors heading the table is found by its header; under it, whatever the
    header says; a `|` inside backquotes or escaped stays in its cell; repeated messages get
    distinct anchors."""
    assert [r.message for r in site_search.error_rows("# Sheet\n\n" + SMALL_TABLE)] == ["first message"]
    text = ("## 报错\n\n| 片段 | 原因 | 章 |\n|---|---|---|\n"
            "| `a | b` | x \\| y | [01](course/01_a.ipynb) |\n| `a | b` | z | [02](course/02_b.ipynb) |\n")
    rows = site_search.error_rows(text)
    assert [(r.message, r.cause, r.chapters) for r in rows] == [
        ("a | b", "x | y", ("course/01_a.ipynb",)), ("a | b", "z", ("course/02_b.ipynb",))]
    assert [r.anchor for r in rows] == ["error-a-b", "error-a-b-2"]


@pytest.mark.timeout(120)
def test_the_anchor_survives_myst_in_a_table_cell(tmp_path):
    """Sphinx with myst-nb (website/conf.py's parser and myst settings) renders each row's
    `<span id=...>` as that element, inside the row's first cell: the anchor a result links to."""
    text = sheet("en")
    errors = text[text.index("## Errors"):]
    errors = re.sub(r"\]\(course/[^)]+\)", "](https://example.org/chapter)", errors)  # no such pages here
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text('extensions = ["myst_nb"]\nnb_execution_mode = "off"\n'
                                 'myst_heading_anchors = 3\nmyst_enable_extensions = ["colon_fence"]\n')
    (src / "index.md").write_text("# Sheet\n\n" + site_search.anchor_error_rows(errors), encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", "-W", str(src), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
    for row in site_search.error_rows(errors):
        assert re.search(rf'<td><p><span id="{row.anchor}" class="course-error-anchor"></span><code', page), row.anchor


# --------------------------------------------------------------------------------------
# The search page's script, in Chromium
# --------------------------------------------------------------------------------------

import browser_support  # noqa: E402,F401  (tests/ is on sys.path)
from browser_support import chromium_page  # noqa: E402

# A search page as Sphinx's search.html has it: an empty #search-results, which searchtools.js
# fills when it starts (a heading, a summary, ul.search), here after `delay` ms (-1: at once,
# before this script's index can have loaded).
SEARCH_PAGE = """<!DOCTYPE html>
<html lang="{lang}" data-content_root="{root}">
<head><meta charset="utf-8"><title>Search</title>
<script src="{root}_static/course-search.js"></script></head>
<body><div class="bd-search-container"><div id="search-results"></div></div>
<script>
  const sphinxLike = () => {{
    const out = document.getElementById("search-results");
    out.appendChild(document.createElement("h2")).textContent = "Search Results";
    out.appendChild(document.createElement("p")).className = "search-summary";
    const ul = out.appendChild(document.createElement("ul"));
    ul.className = "search";
    const li = ul.appendChild(document.createElement("li"));
    li.className = "kind-text";
    const a = li.appendChild(document.createElement("a"));
    a.href = "course/01_device_basics.html#where";
    a.textContent = "Sphinx's own result";
  }};
  const delay = Number(new URLSearchParams(location.search).get("delay") || "-1");
  if (delay < 0) sphinxLike(); else setTimeout(sphinxLike, delay);
</script></body></html>
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Both editions' search pages, the script and each edition's index, served on a free port."""
    folder = tmp_path_factory.mktemp("search-site")
    for lang, prefix in (("en", ""), ("zh", "zh/")):
        edition = folder / prefix
        (edition / "_static").mkdir(parents=True, exist_ok=True)
        shutil.copy2(SCRIPT, edition / "_static" / "course-search.js")
        # The cheat sheet as the site stages it: its chapter links go to sections.
        website.stage(ROOT, folder / f"staged-{lang}", website.EN if lang == "en" else website.ZH)
        site_search.write_error_index(edition, (folder / f"staged-{lang}" / "CHEATSHEET.md").read_text(encoding="utf-8"))
        (edition / "search.html").write_text(SEARCH_PAGE.format(lang="zh-CN" if lang == "zh" else "en", root=""),
                                             encoding="utf-8")
    httpd = website.server(folder, port=0)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def page():
    with chromium_page(None, "the site search's browser test") as page:
        yield page


def first_results(page, base: str, query: str, prefix: str = "", delay: int = 300) -> dict:
    """Open the search page for `query`; when both lists are there, the first result links."""
    url = f"{base}{prefix}search.html?" + urllib.parse.urlencode({"q": query, "delay": delay})
    page.goto(url)
    page.wait_for_selector("#search-results ul.search:not(.course-error-hits) li")
    page.wait_for_timeout(400)   # the index is a local file: loaded well within this
    return page.evaluate("""() => ({
        first: document.querySelector('#search-results li a')?.getAttribute('href'),
        hits: [...document.querySelectorAll('#search-results ul.course-error-hits > li > a')].map(a => a.href),
        order: [...document.querySelectorAll('#search-results > *')].map(e => e.tagName + '.' + e.className),
        text: document.querySelector('#search-results ul.course-error-hits li')?.innerText || '',
    })""")


PASTED = [
    ("RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu! "
     "(when checking argument for argument mat1 in method wrapper_CUDA_addmm)", SAME_DEVICE),
    ("Expected all tensors to be on the same device, but got mat1 is on cpu, different from other tensors on "
     "cuda:0 (when checking argument in method wrapper_CUDA_addmm)", SAME_DEVICE),
    (textwrap.dedent("""\
        Traceback (most recent call last):
          File "/content/train.py", line 12, in <module>
            out = model(x)
                  ^^^^^^^^
          File "/usr/lib/python3/torch/nn/modules/linear.py", line 125, in forward
            return F.linear(input, self.weight, self.bias)
        RuntimeError: Expected all tensors to be on the same
        device, but found at least two devices, cuda:0 and cpu!"""), SAME_DEVICE),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 14.75 GiB total capacity; "
     "13.90 GiB already allocated)", "error-cuda-out-of-memory-tried-to-allocate"),
    ("RuntimeError: Found no NVIDIA driver on your system.", "error-found-no-nvidia-driver-on-your-system-no-cuda-gpus-are"),
    ("RuntimeError: No CUDA GPUs are available", "error-found-no-nvidia-driver-on-your-system-no-cuda-gpus-are"),
    ("RuntimeError: Expected a \u2018cuda\u2019 device type for generator but found \u2018cpu\u2019",
     "error-expected-a-cuda-device-type-for-generator-but-found-cpu"),
    ("\u201cRuntimeError: hook \u2018my_hook\u2019 has changed the type of value (was torch.cuda.FloatTensor got "
     "torch.FloatTensor)\u201d", "error-hook-has-changed-the-type-of-value"),
    ("EXPECTED ALL TENSORS TO BE ON THE SAME DEVICE", SAME_DEVICE),
    ("to be on the same device", SAME_DEVICE),
    ("TypeError: can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host "
     "memory first.", "error-cant-convert-cuda-0-device-type-tensor-to-numpy-use-tensor"),
    ('Unexpected key(s) in state_dict: "module.weight", "module.bias".',
     "error-missing-key-s-in-state-dict-unexpected-key-s-in-state-dict"),
]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("query, anchor", PASTED, ids=[f"paste{i}" for i in range(len(PASTED))])
def test_a_pasted_message_finds_its_row_first(served, page, query, anchor):
    got = first_results(page, served, query)
    assert got["first"] == f"CHEATSHEET.html#{anchor}" or got["first"].endswith(f"/CHEATSHEET.html#{anchor}"), got
    assert got["hits"][0] == f"{served}CHEATSHEET.html#{anchor}", got
    # Before Sphinx's list, after its heading and summary; the row's cause and chapters shown.
    assert got["order"] == ["H2.", "P.search-summary", "UL.search course-error-hits", "UL.search"], got
    assert got["text"].startswith(next(e["message"] for e in site_search.error_index(
        site_search.error_rows(sheet("en")), "CHEATSHEET.md") if e["anchor"] == anchor))
    assert "Cheat sheet, errors: " in got["text"] and re.search(r"Explained in chapter 0\d §\d", got["text"]), got


@pytest.mark.timeout(180)
@pytest.mark.parametrize("delay", [-1, 0, 1500])
def test_the_error_hits_stay_first_whatever_the_timing(served, page, delay):
    """Sphinx's list made before the index loaded, just after, or well after: ours is first."""
    got = first_results(page, served, PASTED[0][0], delay=delay)
    if delay > 400:
        page.wait_for_timeout(delay)
    got = page.evaluate("() => document.querySelector('#search-results li a').getAttribute('href')")
    assert got.endswith(f"CHEATSHEET.html#{SAME_DEVICE}")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("query", ["non_blocking", "autocast", "device", "same device", "to(device)"])
def test_an_unrelated_query_adds_no_error_hit(served, page, query):
    got = first_results(page, served, query)
    assert got["hits"] == [] and got["first"] == "course/01_device_basics.html#where", got


@pytest.mark.timeout(180)
def test_the_chinese_edition_uses_its_own_index(served, page):
    """Under zh/, the script finds zh/_static/course-errors.json next to itself: links to zh/'s
    cheat sheet and chapters, the cause in Chinese."""
    got = first_results(page, served, PASTED[1][0], prefix="zh/")
    assert got["hits"][0] == f"{served}zh/CHEATSHEET.html#{SAME_DEVICE}", got
    assert "同一运算" in got["text"] and "第 01 章 §4" in got["text"], got
    links = page.evaluate("() => [...document.querySelectorAll('.course-error-chapters a')].map(a => a.href)")
    assert [urllib.parse.unquote(link) for link in links[:2]] == [
        f"{served}zh/course/01_device_basics.html#4-同设备规则及其两个例外",
        f"{served}zh/course/08_troubleshooting.html#4-一套调试流程"]


@pytest.mark.timeout(180)
def test_a_hits_chapter_links_go_to_the_sections(served, page):
    """The result names each section ("chapter 08 §2 row 5") and its link goes there."""
    got = first_results(page, served, PASTED[3][0])
    assert "Explained in chapter 06 §2, chapter 08 §2 row 5" in got["text"], got
    links = page.evaluate("() => [...document.querySelectorAll('.course-error-chapters a')].map(a => a.href)")
    assert links[:2] == [f"{served}course/06_ddp.html#2-device-and-backend-per-process",
                         f"{served}course/08_troubleshooting.html#row-5--cuda_visible_devices-set-still-out-of-memory-wrong-cause"], links
