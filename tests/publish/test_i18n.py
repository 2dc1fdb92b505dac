"""The Chinese edition (coursetools/i18n, issue 26): generated from the English masters and the
PO files in locale/zh_CN/, never edited by hand, never silently behind.

* the committed Chinese files are exactly a fresh `make.py i18n build` (the sync test);
* every translation keeps what it must (tags, link targets, code, headings, list markers,
  table cells, the seed posts' quotes) and follows the glossary;
* a Chinese notebook carries the English code: lessons the same code modulo comments and
  docstrings, exercises every locked cell byte for byte (tests/course/test_grading.py grades
  them through nbgrader);
* coverage per notebook is written to test-artifacts/i18n-coverage.txt and printed; a pending
  translation never fails the suite, it shows the English with a note;
* the machinery itself: a lossless markdown cut, msgmerge's fuzzy rules, pending notes, links.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import polib
import pytest

from coursetools.publish import i18n
from coursetools.learner import lab
from coursetools import layout, notebooks
from coursetools.publish.i18n import build, catalog, checks, markdown, pycode

ROOT = layout.ROOT
ARTIFACTS = ROOT / "test-artifacts"
EDITION = build.edition(ROOT)
NOTEBOOK_SOURCES = [s for s in EDITION if s.is_notebook]
IDS = [s.path for s in NOTEBOOK_SOURCES]
REBUILD = "run `python3 make.py i18n build` and commit zh/ and README.zh-CN.md"


@pytest.fixture(scope="module")
def fresh():
    return build.build(ROOT)


def _nb(text: str):
    return nbformat.reads(text, as_version=4)


# ------------------------------------------------------------------ in step with the sources

def test_chinese_edition_is_in_step_with_english_masters_and_po_files(fresh):
    """A change to an English notebook or document, or to a PO file, without a rebuild fails
    here: the Chinese edition is generated, never edited by hand."""
    differ, extra = build.stale(fresh, ROOT)
    assert not differ, (f"out of step with their English source and PO file: {differ}; {REBUILD} "
                        "(a translation that is now pending shows the English with a note: that is fine)")
    assert not extra, f"made by no source (a removed notebook, or edited by hand?): {extra}; {REBUILD}"


def test_files_a_chinese_lesson_writes_beside_itself_are_not_the_builds(tmp_path):
    """Running zh/course/06_ddp.ipynb in place writes 06_ddp_worker.py beside it, as the English
    lesson does: the sync test must not call it "made by no source", nor `build` delete it."""
    (tmp_path / "zh" / "course").mkdir(parents=True)
    for name in ("06_ddp.ipynb", "06_ddp_worker.py", ".gitignore"):
        (tmp_path / "zh" / "course" / name).write_text("{}", encoding="utf-8")
    (tmp_path / "zh" / "CHEATSHEET.md").write_text("#", encoding="utf-8")
    assert build.generated_files(tmp_path) == ["zh/CHEATSHEET.md", "zh/course/06_ddp.ipynb"]
    assert (ROOT / "zh" / "course" / ".gitignore").read_text(encoding="utf-8").count("_worker.py") == 3


def test_edition_covers_every_translated_chapter_and_the_documents():
    paths = {s.path for s in EDITION}
    for name in ("00_start_here", "01_device_basics", "02_to_semantics", "03_module_to",
                 "04_buffers_checkpoints", "05_mixed_precision", "05_mixed_precision_2", "06_ddp",
                 "06_ddp_2_failures", "06_ddp_3_training", "07_performance", "07_performance_2_waits",
                 "07_performance_3_tuning", "08_troubleshooting"):
        assert f"course/{name}.ipynb" in paths
    for name in layout.assignments(ROOT):
        assert f"exercises/{name}/{name}.ipynb" in paths, f"exercise {name} is not in the Chinese edition"
    assert {"README.md", "CHEATSHEET.md", "docs/MYTHS.md"} <= paths
    for name in ("01_device_basics", "02_to_semantics", "03_module_to", "04_buffers_checkpoints",
                 "08_troubleshooting"):
        assert f"exercises/{name}/{name}.ipynb" in paths
    assert {"README.md", "CHEATSHEET.md", "docs/MYTHS.md"} <= paths


def test_chinese_notebooks_are_not_chapters_of_the_english_course():
    """zh/ is not picked up as more chapters, assignments, lessons or fixtures."""
    everything = layout.all_notebooks(ROOT)
    assert not [p for p in everything if build.ZH_DIR in p.relative_to(ROOT).parts]
    assert all(not name.startswith(build.ZH_DIR) for name in layout.assignments(ROOT))


# ------------------------------------------------------------------ translation rules

def test_every_translation_keeps_structure_quotes_and_glossary():
    problems = checks.po_problems(ROOT)
    more = f"\n... and {len(problems) - 40} more" if len(problems) > 40 else ""
    assert not problems, "\n".join(problems[:40]) + more


def test_seed_posts_quotes_are_verbatim(fresh):
    seeds = checks.seeds_dir(ROOT)
    if seeds is None:
        pytest.skip("the seed posts (shared/seeds/*.txt beside the repository, or COURSE_SEEDS_DIR) "
                    "are not here: their quotes are checked where they are (CI has them)")
    problems = checks.seed_problems(fresh, seeds)
    assert not problems, "\n".join(problems)
    quoted = sum(len(checks.SEED_QUOTE.findall(text)) for text in fresh.outputs.values())
    assert quoted > 50, f"only {quoted} quotes found: the check would prove nothing"


def test_glossary_is_well_formed_and_used():
    terms = checks.glossary(ROOT)
    english = [t.english.casefold() for t in terms]
    assert len(english) == len(set(english)), "a term is listed twice in the glossary"
    for must in ("device", "tensor", "buffer", "mixed precision", "distributed data parallel"):
        assert must in english, f"the glossary lacks {must!r}"
    by = {t.english: t.chinese for t in terms}
    assert (by["device"], by["tensor"], by["buffer"], by["mixed precision"], by["distributed data parallel"]) == (
        "设备", "张量", "缓冲区", "混合精度", "分布式数据并行")
    text = "".join(e.msgstr for s in EDITION for e in build.po_file(s, ROOT) if e.msgstr)
    for term in ("设备", "张量", "缓冲区", "混合精度", "分布式数据并行"):
        assert term in text, f"the glossary's {term} is used nowhere"


def test_glossary_check_flags_english_terms_and_allows_code_and_kept_terms():
    terms = checks.glossary(ROOT)
    assert checks.glossary_problems("把 tensor 移到 GPU 上", terms), "an English term in Chinese prose must be flagged"
    assert checks.glossary_problems("这些 buffers 会被移动", terms), "plurals too"
    assert checks.glossary_problems("优化器的 `step` 之后，缓存区里", terms), "a rendering the glossary avoids"
    for fine in ("把 `tensor` 移到 CUDA GPU 上", "调用 `model.to(device)`",
                 "报错 \"Expected all tensors to be on the same device\"", "[链接](https://example.org/tensor)",
                 "<code>device</code> 和 PyTorch", "用 x.device 比较", "「to(device)本身不会做任何校验」"):
        assert not checks.glossary_problems(fine, terms), fine


ONE_NAME = [  # (the glossary's name, a rendering it avoids); one name per idea
    ("在 CPU 版 PyTorch 上", "在只有 CPU 的构建上"), ("安装的是 CPU 版 PyTorch", "安装的是只支持 CPU 的 PyTorch"),
    ("说出漏搬的张量在哪里创建", "说出放错设备的张量在哪里创建"), ("用假张量演示", "用伪张量演示"),
    ("是同一类 bug", "是同一类缺陷"), ("测试设备也有 bug", "测试设备也有漏洞"),
    ("Tensor Core（张量核心）按分块工作", "张量核心按分块工作"), ("嵌入（embedding）表在 GPU 上", "embedding 表在 GPU 上"),
    ("嵌入（embedding）表在 GPU 上", "嵌入表在 GPU 上"),  # the first 嵌入 of a file says what it is
]


def _cheatsheet_saying(tmp_path, words: str) -> list[str]:
    """po_problems of an edition that is the cheat-sheet whose first paragraph ends with `words`."""
    import shutil

    for d in ("solutions", "course", "locale/zh_CN/docs"):
        (tmp_path / d).mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / checks.GLOSSARY, tmp_path / checks.GLOSSARY)
    shutil.copy(ROOT / "CHEATSHEET.md", tmp_path / "CHEATSHEET.md")
    po = catalog.load(ROOT / "locale/zh_CN/docs/CHEATSHEET.po")
    entry = next(e for e in po.translated_entries() if e.msgctxt is None and e.msgid[0].isalpha())
    entry.msgstr += f"例如：{words}。"
    catalog.write(po, tmp_path / "locale/zh_CN/docs/CHEATSHEET.po")
    return checks.po_problems(tmp_path)


@pytest.mark.parametrize("chosen,avoided", ONE_NAME, ids=[a for _, a in ONE_NAME])
def test_one_name_per_idea_a_po_with_the_avoided_name_fails(tmp_path, chosen, avoided):
    assert not _cheatsheet_saying(tmp_path, chosen), chosen
    problems = _cheatsheet_saying(tmp_path, avoided)
    assert problems and all("CHEATSHEET.po" in p for p in problems), avoided


def test_one_name_per_idea_first_use_and_what_stays_allowed():
    terms = checks.glossary(ROOT)
    by = {t.english: t for t in terms}
    assert by["embedding"].first_use == "嵌入（embedding）" and by["tensor core"].first_use == "Tensor Core（张量核心）"
    assert checks.first_use_problems(["嵌入表在 GPU 上", "嵌入（embedding）表"], terms), "嵌入 before its first use"
    assert checks.first_use_problems(["先是 Tensor Core，", "后是 Tensor Core（张量核心）"], terms)
    assert not checks.first_use_problems(["嵌入（embedding）表在 GPU 上", "嵌入表", "Tensor Core（张量核心）", "Tensor Core"], terms)
    for fine in ("针对操作系统内核的漏洞利用不在考虑范围之内", "在只有 CPU 的机器上", "嵌入表和 `nn.Embedding`",
                 "Tensor Core 上以 TF32 运行", "一个 bug"):
        assert not checks.glossary_problems(fine, terms), fine


def test_gpu_memory_is_xiancun_and_the_check_says_so():
    """A GPU's memory is 显存 and running out of it 显存不足（OOM）; 内存 is host RAM (issue 38:
    the edition wrote GPU 内存 and 内存不足, erasing the host/device distinction)."""
    terms = checks.glossary(ROOT)
    for wrong in ("`del x` 会释放 GPU 内存", "显卡内存不够", "每块 GPU 都内存不足", "CUDA 报 OOM：内存不足",
                  "设置 `CUDA_VISIBLE_DEVICES` 后仍然内存不足"):
        assert checks.glossary_problems(wrong, terms), wrong
    for fine in ("`del x` 把显存还给 PyTorch 的缓存", "每块 GPU 都显存不足", "CUDA 说明警告：在主机内存不足时",
                 "数据集太大，加载时内存不足", "从 CPU 内存到显存的拷贝"):
        assert not checks.glossary_problems(fine, terms), fine
    text = "".join(e.msgstr for s in EDITION for e in build.po_file(s, ROOT) if e.msgstr)
    assert "GPU 内存" not in text and "显卡内存" not in text and text.count("显存") >= 15


def test_structure_checks_catch_broken_translations():
    terms = checks.glossary(ROOT)
    assert checks.entry_problems("## Summary", "小结", None, terms), "a heading must stay a heading"
    assert checks.entry_problems("- an item", "一项", None, terms), "a list item keeps its marker"
    assert checks.entry_problems("| a | b |", "| 甲乙 |", None, terms), "a table row keeps its cells"
    assert checks.entry_problems("See [x](a.ipynb).", "见 [x](b.ipynb)。", None, terms), "link targets stay"
    assert checks.entry_problems("<details>more</details>", "更多", None, terms), "HTML tags stay"
    assert checks.entry_problems("Use `x`.", "用 `y`。", None, terms), "no code the English lacks"
    assert checks.entry_problems("Post: 「原话」", "帖子：原话", None, terms), "the post's quote stays"
    assert checks.entry_problems("Some words here.", "Some words here.", None, terms), "a copy is no translation"
    assert not checks.entry_problems("## Summary", "## 小结", None, terms)


# ------------------------------------------------------------------ code stays the code

def _code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def _without_checksum(metadata):
    meta = json.loads(json.dumps(metadata))
    meta.get("nbgrader", {}).pop("checksum", None)
    return meta


@pytest.mark.parametrize("src", NOTEBOOK_SOURCES, ids=IDS)
def test_chinese_notebook_runs_the_english_code(fresh, src):
    """Same cells in the same order with the same metadata; code cells differ at most in
    comments, docstrings and what they say (print lines; in an exercise's locked cells the
    tests' messages): the same syntax tree once those are blanked, the same magics. A locked
    cell that reads Chinese carries its own nbgrader checksum (nbgrader validate sees it
    unedited; autograde grades the English cell from the gradebook, tests/course/test_grading.py)."""
    from nbgrader.utils import compute_checksum

    english = notebooks.read(ROOT / src.path)
    chinese = _nb(fresh.outputs[src.target])
    assert chinese.metadata == english.metadata
    assert ([(c.cell_type, _without_checksum(c.metadata)) for c in chinese.cells]
            == [(c.cell_type, _without_checksum(c.metadata)) for c in english.cells])
    lesson = src.kind == "lesson"
    for i, (en, zh) in enumerate(zip(english.cells, chinese.cells)):
        if en.cell_type != "code":
            continue
        assert pycode.without_said(zh.source, lesson, not lesson, english=en.source) == \
            pycode.without_said(en.source, lesson, not lesson, english=en.source), f"cell {i}: the code changed"
        assert pycode.magic_lines(zh.source) == pycode.magic_lines(en.source), f"cell {i}: a magic changed"
        meta = notebooks.nbgrader_meta(zh)
        if src.kind == "exercise" and meta.get("locked"):
            if zh.source == en.source:
                assert zh.metadata == en.metadata, f"cell {i}: an unchanged locked cell keeps the release's checksum"
            else:
                assert meta.get("checksum") == compute_checksum(zh), f"cell {i}: a Chinese locked cell's checksum is its own"


def test_grade_class_does_not_flag_a_chinese_submissions_locked_cells(tmp_path):
    """A Chinese submission's locked cells read Chinese, so their checksum is the Chinese
    release's: grade-class's summary must not call them edited; an edited one still is."""
    from types import SimpleNamespace
    from coursetools.instructor.classroom import Classroom

    name = "01_device_basics"
    (tmp_path / "release" / name).mkdir(parents=True)
    (tmp_path / "submitted" / "wang" / name).mkdir(parents=True)
    nbformat.write(notebooks.read(layout.release_notebook(name)), tmp_path / "release" / name / f"{name}.ipynb")
    chinese = notebooks.read(ROOT / "zh/exercises" / name / f"{name}.ipynb")
    submitted = tmp_path / "submitted" / "wang" / name / f"{name}.ipynb"
    nbformat.write(chinese, submitted)
    room = SimpleNamespace(course=tmp_path, release_dir=lambda: tmp_path / "release")
    assert Classroom._cell_changes(room, "wang", name) == []
    next(c for c in chinese.cells if notebooks.grade_id(c) == "test_common_device").source += "\npass"
    nbformat.write(chinese, submitted)
    assert Classroom._cell_changes(room, "wang", name) == ["edited test_common_device (restored)"]


def test_chinese_exercise_says_its_messages_and_setup_in_chinese(fresh):
    """Exercise 01 in Chinese: its tests' messages, the hints they hand to the helpers, the
    helpers' own words and the setup cell's line read Chinese, with Colab's Chinese menu."""
    nb = _nb(fresh.outputs["zh/exercises/01_device_basics/01_device_basics.ipynb"])
    cells = {notebooks.grade_id(c): c.source for c in nb.cells if notebooks.grade_id(c)}
    assert "代码执行程序 → 更改运行时类型" in cells["setup"] and "No GPU found" not in cells["setup"]
    assert "修正方法" in cells["helpers"] and "你的代码抛出了" in cells["helpers"]
    for gid, source in cells.items():
        if not gid.startswith("test_"):
            continue
        said = [p for p in pycode.said(source) if not i18n.CJK.search(p.msgid)
                and re.search(r"[A-Za-z]{3,} [A-Za-z]{3,} [A-Za-z]{3,}", re.sub(r"\{[^{}]*\}", "", p.msgid))]
        assert not said, f"{gid}: English left in its messages: {[p.msgid[:80] for p in said]}"
        assert i18n.CJK.search(source.split("\n", 1)[0]), f"{gid}: its docstring is English"


def test_lesson_08_find_lesson_answers_in_chinese_with_chinese_links(fresh):
    """find_lesson() prints the cause and fix in the Chinese table's words, and links to the
    Chinese lessons (zh/course/, locally and in Colab); the messages it matches stay English."""
    nb = _nb(fresh.outputs["zh/course/08_troubleshooting.ipynb"])
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "/blob/main/zh/course/" in code and "zh/course/{lesson}.ipynb" in code
    assert "原因：{cause}" in code
    assert '("Expected all tensors to be on the same device", None, ["01 §4", "08 §4"],\n     "同一运算' in code
    # a row's section reads as the Chinese tables write it; the data stays what find_lesson() parses
    assert '["08 §2 第 4 行"]' in code and " row 4" not in code


@pytest.mark.parametrize("src", NOTEBOOK_SOURCES, ids=IDS)
def test_chinese_notebook_hygiene(fresh, src):
    """No outputs, valid nbformat, the header's Colab badge opens the Chinese notebook, and
    every relative link names a file of the repository (a Chinese one where it exists)."""
    text = fresh.outputs[src.target]
    nb = _nb(text)
    nbformat.validate(nbformat.from_dict(json.loads(text)))
    assert not notebooks.has_outputs(nb)
    cfg = layout.config()
    assert f"({cfg.colab_url(src.target)})" in nb.cells[0].source, "the Colab badge must open the Chinese notebook"
    target_dir = (ROOT / src.target).parent
    broken = [link for link in lab.relative_links(json.loads(text)) if not (target_dir / link).is_file()]
    assert not broken, f"{src.target} links to files that do not exist: {broken}"


def test_chinese_notebooks_link_to_each_other(fresh):
    lesson = _nb(fresh.outputs["zh/course/01_device_basics.ipynb"])
    links = lab.relative_links(json.loads(fresh.outputs["zh/course/01_device_basics.ipynb"]))
    assert "../exercises/01_device_basics/01_device_basics.ipynb" in links  # -> zh/exercises/...
    assert "02_to_semantics.ipynb" in links
    assert lesson.cells[0].source.count("# 01 · 设备基础") == 1
    exercise = fresh.outputs["zh/exercises/01_device_basics/01_device_basics.ipynb"]
    assert "make.py check 01 --lang zh" in exercise, (
        "the Chinese exercise must tell its learner to check the Chinese notebook")


def test_readme_zh_course_map_links_the_chinese_notebooks(fresh):
    readme = fresh.outputs[build.README_ZH]
    cfg = layout.config()
    for src in NOTEBOOK_SOURCES:
        if src.kind == "lesson" or src.path.startswith("exercises/"):
            assert f"({src.target})" in readme, f"README.zh-CN.md's course map lacks {src.target}"
            assert cfg.colab_url(src.target) in readme, f"no Chinese Colab badge for {src.target}"
    assert "| # | 课程 | 练习 | 你要编写或修复的内容（计分） |" in readme
    for rel in re.findall(r"\]\(((?!https?:|#)[^)\s]+)\)", readme):
        assert (ROOT / rel.split("#")[0]).exists(), f"README.zh-CN.md links to {rel}, which does not exist"


def test_document_anchor_links_point_at_headings(fresh):
    for target, text in fresh.outputs.items():
        if not target.endswith(".md"):
            continue
        anchors = {build.github_slug(line) for line in text.splitlines() if re.match(r"#{1,6} ", line)}
        for anchor in re.findall(r"\]\(#([^)]+)\)", text):
            assert anchor in anchors, f"{target}: the link #{anchor} names no heading"


# ------------------------------------------------------------------ coverage

def test_coverage_table_per_notebook(fresh):
    """Coverage per notebook and document, in test-artifacts/i18n-coverage.txt (printed at the
    end of `make.py test`). Pending translations are reported here, never failed."""
    rows = build.coverage(ROOT, fresh)
    table = build.coverage_table(rows)
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "i18n-coverage.txt").write_text(table, encoding="utf-8")
    print(table)
    by = {r[0]: r for r in rows}
    for src in EDITION:
        path, n, done, fuzzy, missing, has_po = by[src.path]
        assert has_po and n == done + fuzzy + missing and n > 0
        # a test message pending shows in no notebook (make.py check and feedback pages say it),
        # a printed line pending stays English in the code (a program's output, no note in it)
        pending = sum(1 for (ctxt, _), state in fresh.stats[src.path].states.items()
                      if state != "translated" and ctxt not in (catalog.CONTEXTS["message"], catalog.CONTEXTS["printed"]))
        shown = fresh.outputs[src.target].count(build.PENDING)
        quoted = sum(e.msgstr.count(build.PENDING) for e in build.po_file(src, ROOT))  # README quotes it
        assert (shown > quoted) == bool(pending), (
            f"{src.target}: {pending} pending entries, but the pending note is "
            f"{'absent' if pending else 'present'}")


# ------------------------------------------------------------------ the machinery

def _all_markdown() -> list[str]:
    texts = []
    for src in build.sources(ROOT):
        if src.is_notebook:
            texts += [c.source for c in notebooks.read(ROOT / src.path).cells if c.cell_type == "markdown"]
        else:
            texts.append((ROOT / src.path).read_text(encoding="utf-8"))
    return texts


def test_markdown_cut_is_lossless_and_keeps_code_verbatim():
    for text in _all_markdown():
        lines, units = markdown.split(text)
        assert "\n".join("\n".join(lines[u.start:u.end]) for u in units) == text
        assert [i for u in units for i in range(u.start, u.end)] == list(range(len(lines)))
        assert not any(u.translatable for u in units if u.kind in ("code", "blank", "comment", "badge"))


def test_code_pieces_render_back_to_the_same_code():
    sample = ('def f(x):  # an inline note\n    """Do it.\n\n    More words.\n    """\n'
              '    # two lines\n    # of comment\n    return x  # noqa: E501\n%matplotlib inline\n')
    pieces = pycode.pieces(sample)
    assert [p.kind for p in pieces] == ["comment-after", "docstring", "comment"]
    assert pieces[1].msgid == "Do it.\n\nMore words."
    assert pieces[2].msgid == "two lines\nof comment"
    out, seen = pycode.translate(sample, lambda kind, msgid: {"Do it.\n\nMore words.": "做。\n\n更多。",
                                                             "two lines\nof comment": "一行注释"}.get(msgid))
    assert '"""做。\n\n    更多。\n    """' in out and "    # 一行注释\n    return x  # noqa: E501" in out
    assert "# an inline note" in out and [t for _, t in seen] == [False, True, True]
    assert pycode.without_words(out) == pycode.without_words(sample)


def test_docstring_on_a_line_with_non_ascii_characters_keeps_the_code_around_it():
    """ast counts columns in UTF-8 bytes: a docstring whose line holds a "§" (06 part 2's
    train_single) or Chinese was once cut one character too far, swallowing the line break
    after it, so the Chinese notebook's cell no longer parsed."""
    sample = 'def f(x):\n    """Step k (part 1, §8)."""\n    return x\n\n\ndef g():\n    """§ 两个 §"""\n'
    pieces = pycode.pieces(sample)
    assert [p.msgid for p in pieces] == ["Step k (part 1, §8)."]
    out, _ = pycode.translate(sample, lambda kind, msgid: "第 k 步（第 1 部分，§8）。")
    assert '"""第 k 步（第 1 部分，§8）。"""\n    return x' in out
    assert pycode.without_words(out) == pycode.without_words(sample)


def _templates(*msgids):
    return [catalog.Template(m, occurrences=[("x.ipynb", "0")], kinds=["paragraph"]) for m in msgids]


def test_update_marks_changed_english_fuzzy_and_keeps_translations():
    """msgmerge's rules: unchanged text keeps its translation; a new line break alone too; a
    changed sentence becomes fuzzy with the old English as #| msgid; new text comes in
    untranslated; text that is gone is kept as obsolete."""
    old = catalog.merge(None, _templates("A device has a type.", "Tensors live on devices.\nAlways.",
                                         "Gone from the English."), "x.ipynb")
    for entry, zh in zip(old, ("设备有类型。", "张量位于设备上。总是如此。", "已删除。")):
        entry.msgstr = zh
    new = catalog.merge(old, _templates("A device has a type.", "Tensors live on devices. Always.",
                                        "A device has a type and an index.", "Brand new text."), "x.ipynb")
    got = {e.msgid: e for e in new if not e.obsolete}
    assert got["A device has a type."].msgstr == "设备有类型。" and not got["A device has a type."].fuzzy
    assert got["Tensors live on devices. Always."].msgstr == "张量位于设备上。总是如此。"
    assert not got["Tensors live on devices. Always."].fuzzy, "a change of line breaks only is no change"
    changed = got["A device has a type and an index."]
    assert changed.fuzzy and changed.previous_msgid == "A device has a type." and changed.msgstr == "设备有类型。"
    assert got["Brand new text."].msgstr == ""
    assert [e.msgid for e in new.obsolete_entries()] == ["Gone from the English."]
    text = str(new)
    assert "#, fuzzy" in text and '#| msgid "A device has a type."' in text
    reread = polib.pofile(text)
    assert catalog.Lookup(reread).state("A device has a type and an index.") == "fuzzy"
    again = catalog.merge(catalog.merge(reread, _templates("Brand new text."), "x.ipynb"),
                          _templates("Brand new text."), "x.ipynb")
    assert sorted(e.msgid for e in again.obsolete_entries()) == [
        "A device has a type and an index.", "A device has a type.", "Gone from the English.",
        "Tensors live on devices. Always."], (
        "each obsolete entry is kept once, however many updates run (they once doubled per update)")


def test_compendium_reuses_the_same_english_elsewhere():
    new = catalog.merge(None, _templates("PyTorch >= 2.6"), "y.ipynb",
                        compendium={(None, "PyTorch >= 2.6"): "PyTorch 2.6 及以上版本"})
    assert next(iter(new)).msgstr == "PyTorch 2.6 及以上版本" and not next(iter(new)).fuzzy


def test_pending_translation_shows_the_english_with_a_note():
    po = catalog.merge(None, _templates("## Summary", "A translated paragraph.", "| ab | cd |",
                                        "A fuzzy one.", "## Gone"), "x.ipynb")
    entries = list(po)
    entries[0].msgstr, entries[1].msgstr = "## 小结", "译好的段落。"
    entries[3].msgstr, entries[3].flags = "旧译文。", ["fuzzy"]
    text = ("## Summary\n\nA translated paragraph.\n\n| ab | cd |\n|---|---|\n| ab | cd |\n\nA fuzzy one.\n\n"
            "## Gone\n\n```\ncode\n```")
    stats = build.Stats()
    out = build.translate_markdown(text, catalog.Lookup(po), stats)
    assert out.startswith("## 小结\n\n译好的段落。\n\n")
    assert f"| ab | cd {build.PENDING} |\n|---|---|" in out, "a pending table row keeps its cells"
    assert f"A fuzzy one. {build.PENDING}" in out and "旧译文" not in out, "a fuzzy translation is not shown"
    assert out.endswith(f"## Gone\n\n{build.PENDING}\n\n```\ncode\n```"), "a heading keeps its anchor"
    assert (stats.count("translated"), stats.count("fuzzy"), stats.count("missing")) == (2, 1, 2)


def test_links_follow_the_edition():
    links = build.Links({"course/a.ipynb": "zh/course/a.ipynb", "README.md": "README.zh-CN.md",
                         "docs/M.md": "zh/docs/M.md"},
                        anchors={"docs/M.md": {"the-end": "结尾"}},
                        prefixes=("https://colab.research.google.com/github/o/r/blob/main/",))
    text = ("[a](a.ipynb) [b](b.ipynb) [m](../docs/M.md#the-end) [g](https://x.org/a) "
            "[c](https://colab.research.google.com/github/o/r/blob/main/course/a.ipynb) "
            "`make.py check exercises/n/n.ipynb` `make.py check 01` `make.py check 02 --lang zh`")
    out = links.rewrite(text, "course/a.ipynb", "zh/course/a.ipynb")
    assert "[a](a.ipynb)" in out, "a Chinese notebook links to the Chinese notebook"
    assert "[b](../../course/b.ipynb)" in out, "and to the English one the edition lacks"
    assert "[m](../docs/M.md#结尾)" in out and "[g](https://x.org/a)" in out
    assert "blob/main/zh/course/a.ipynb)" in out
    assert "`make.py check 01 --lang zh` `make.py check 02 --lang zh`" in out, (
        "in the Chinese edition, a chapter's check grades the Chinese copy (and says --lang once)")
    assert "`make.py check 01`" in links.rewrite("`make.py check 01`", "README.md", "README.zh-CN.md"), (
        "a document explains the check (the copy saved last), as the English does")


def test_language_of_a_notebook_and_the_tools_words(fresh, tmp_path):
    zh = tmp_path / "zh.ipynb"
    zh.write_text(fresh.outputs["zh/exercises/01_device_basics/01_device_basics.ipynb"], encoding="utf-8")
    assert i18n.notebook_language(zh) == "zh"
    assert i18n.notebook_language(ROOT / "exercises/01_device_basics/01_device_basics.ipynb") == "en"
    try:
        i18n.set_language("zh")
        assert i18n.tr("visible and hidden tests") == "可见测试和隐藏测试"
        assert i18n.tr("a string nobody translated") == "a string nobody translated"
        described = i18n.describe_test("01_device_basics", notebooks.first_comment(next(
            c.source for c in notebooks.read(ROOT / "solutions/01_device_basics/01_device_basics.ipynb").cells
            if notebooks.grade_id(c) == "test_build_on")))
        assert markdown.CJK.search(described), described
    finally:
        i18n.set_language("en")
    assert i18n.tr("visible and hidden tests") == "visible and hidden tests"


def test_every_tool_message_is_translated():
    """The self-check's and make.py lab's own words (tr("...")) all have a Chinese version."""
    po = catalog.load(ROOT / i18n.MESSAGES)
    from coursetools.publish.i18n.__main__ import tool_templates
    wanted = {t.msgid for t in tool_templates(ROOT)}
    have = {e.msgid for e in po.translated_entries()}
    assert wanted <= have, f"untranslated tool messages: {sorted(wanted - have)}; run `make.py i18n update`"


# ------------------------------------------------------------------ learners

def test_lab_lang_zh_copies_the_chinese_edition_and_sets_jupyterlab_in_chinese(tmp_path, monkeypatch):
    import shutil
    for sub in ("course", "solutions", "exercises", "zh", "jupyter-config"):
        shutil.copytree(ROOT / sub, tmp_path / sub)
    report = lab.sync(tmp_path, lang="zh")
    work = lab.work_dir(tmp_path)
    for src in NOTEBOOK_SOURCES:
        rel = Path(src.target)
        exercise_copy = work / rel.parent / f"{rel.parent.name}{lab.EXERCISE_SUFFIX}.ipynb"
        copy = work / rel if src.kind == "lesson" else exercise_copy
        assert copy.exists(), f"{copy} was not made"
        broken = [link for link in lab.relative_links(json.loads(copy.read_text(encoding="utf-8")))
                  if not (copy.parent / link).is_file()]
        assert not broken, f"{copy.relative_to(tmp_path)} links to {broken}"
    assert (work / "course" / "05_mixed_precision.ipynb").exists(), "untranslated chapters: the English copies"
    assert any(k.startswith("work/zh/") for k in report.added)
    cmd = lab.command(tmp_path, lang="zh", extra_args=["--no-browser"])
    assert cmd.argv[cmd.argv.index("lab") + 2].endswith("work/zh/course/00_start_here.ipynb")
    config = cmd.env["JUPYTER_CONFIG_PATH"].split(":")[0]
    settings = json.loads((Path(config) / "labconfig" / "default_setting_overrides.json").read_text())
    assert settings["@jupyterlab/translation-extension:plugin"]["locale"] == "zh_CN"
    english = lab.command(tmp_path, extra_args=["--no-browser"])
    assert str(tmp_path / "jupyter-config" / "zh") not in english.env["JUPYTER_CONFIG_PATH"]
    from importlib.metadata import entry_points
    packs = {e.name for e in entry_points(group="jupyterlab.languagepack")}
    assert "zh_CN" in packs, "jupyterlab-language-pack-zh-CN is not installed (requirements.txt)"
    mine = lab.learner_copy(tmp_path / "zh/exercises/01_device_basics/01_device_basics.ipynb", tmp_path)
    assert mine == work / "zh/exercises/01_device_basics/01_device_basics_exercise.ipynb"


def test_self_check_of_a_chinese_wrong_answer_says_each_failure_in_chinese(tmp_path, capsys):
    """`make.py check --explain` on a Chinese exercise with realistic wrong answers: under each
    failing test's English message (kept for searching) a Chinese line, `提示：…`, and the fix
    in Chinese, `修正方法：…`, under the English fix: every failure has one."""
    from coursetools.author import fixtures
    from coursetools.learner import selfcheck
    name = "01_device_basics"
    wrong = [f for f in fixtures.all_fixtures() if f.assignment == name and f.kind == "wrong" and not f.alone]
    answers = fixtures.reference_answers(notebooks.read(layout.source_notebook(name)))
    for fx in wrong[:3]:
        answers.update(fx.answers)
    path = tmp_path / f"{name}.ipynb"
    nbformat.write(fixtures.fill(notebooks.read(ROOT / "zh/exercises" / name / f"{name}.ipynb"), answers), path)
    try:
        status = selfcheck.main([str(path), "--explain"])
    finally:
        i18n.set_language("en")
    out = capsys.readouterr().out
    assert status == 1, out
    blocks = re.split(r"\n(?=  (?:ok  |FAIL) )", out)
    failing = [b for b in blocks if b.startswith("  FAIL")]
    assert failing, out
    for block in failing:  # the message at 12 columns, its fix at 14 (each: English, then Chinese)
        lines = block.splitlines()[1:]
        assert any(line.startswith(" " * 12 + "提示：") for line in lines), f"no Chinese line:\n{block}"
        # every failure has a fix: the English under "How to fix:", the Chinese under 修正方法
        assert any(line.startswith(" " * 14 + "How to fix: ") for line in lines), f"no fix:\n{block}"
        assert any(line.startswith(" " * 14 + "修正方法：") for line in lines), f"the fix has no Chinese:\n{block}"
        assert not any(line.startswith(" " * 14 + "提示：") for line in lines), f"提示 is the observation's:\n{block}"


def test_self_check_of_a_chinese_notebook_reports_in_chinese(capsys):
    """`make.py check` on a Chinese exercise: the same grading, the self-check's own words and
    the test descriptions in Chinese (the tests' messages stay the tests' own)."""
    from coursetools.learner import selfcheck
    try:  # by chapter, as a learner types it (the course's Chinese release: no copy in work/ here)
        status = selfcheck.main(["01", "--lang", "zh", "--as-given", "--visible-only", "--no-daemon"])
    finally:
        i18n.set_language("en")
    out = capsys.readouterr().out
    assert status == 1
    assert "得分：0/26" in out and "仅可见测试" in out and "尚未作答" in out, out
    # the footer's command checks the same Chinese copy again, and answers in Chinese
    assert "`python3 make.py check --explain 01 --lang zh`" in out, out
    assert "pick_device()：可用的最好设备" in out, out
    # the pointer to --explain (feedback in two steps) is translated too
    from coursetools.publish.i18n import set_language, tr
    set_language("zh")
    try:
        assert "卡住了" in tr("Stuck on one? `python3 make.py check --explain {path}` also says how to fix each failure.")
    finally:
        set_language("en")


@pytest.mark.parametrize("path", ["docs/MYTHS.md", "zh/docs/MYTHS.md"])
def test_myths_quote_the_comments_of_the_cells_that_prove_them(path):
    """Each row of MYTHS names the notebook and quotes the first comment of the cell that
    proves the verdict: the quote must be a comment of that notebook, in the same edition (a
    lesson's comment reworded, or its translation, leaves a stale quote behind)."""
    stale = []
    for row in (ROOT / path).read_text(encoding="utf-8").splitlines():
        quotes = re.findall(r'"(# [^"]+)"', row)
        named = re.findall(r"`((?:zh/)?course/[\w.-]+\.ipynb)`", row)
        if not quotes or not named:
            continue
        comments = []
        for nb in named:
            nb_path = ROOT / nb if nb.startswith("zh/") or path.startswith("docs/") else ROOT / "zh" / nb
            comments += [line.strip() for cell in notebooks.read(nb_path).cells if cell.cell_type == "code"
                         for line in cell.source.splitlines() if line.strip().startswith("#")]
        plain = [c.replace("`", "") for c in comments]
        for quote in quotes:
            wanted = quote.replace("`", "").rstrip("…").rstrip(".").strip()
            if not any(c.startswith(wanted) for c in plain):
                stale.append(f"{quote!r} is no comment of {named}")
    assert not stale, f"{path}: " + "\n".join(stale)


def test_readme_zh_shows_the_report_the_chinese_self_check_prints():
    """README.zh-CN's sample of `make.py check` is the Chinese report (a ```text block,
    translated whole), not the English one: its header and score lines are the self-check's
    own words in Chinese (issue 38)."""
    text = (ROOT / "README.zh-CN.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```text\n(.*?)```", text, re.S)
    assert blocks, "README.zh-CN.md has no ```text sample"
    sample = blocks[0].strip().splitlines()
    i18n.set_language("zh")
    try:
        header = i18n.tr("Self-check of {path} (assignment {name}; {which}; your file is not modified)")
        score = i18n.tr("Score: {total}/{possible}   ({seconds} s)")
    finally:
        i18n.set_language("en")
    assert sample[0].startswith(header.split("{path}")[0]) and "work/zh/" in sample[0], sample[0]
    assert sample[-1].startswith(score.split("{total}")[0]), sample[-1]
    assert "Self-check" not in blocks[0] and "Score" not in blocks[0]
