"""CHEATSHEET.md and chapter 08's error table are what `python3 make.py cheatsheet` makes from
the lessons' rule cells and 08's INDEX cell; every rule has a proof cell with an assert; the
sheet covers the rule topics it must (EXPECTED_TOPICS). The failure paths run on temporary copies."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from coursetools.author import cheatsheet
from coursetools import layout

ROOT = layout.ROOT


@pytest.fixture(scope="module")
def built():
    return cheatsheet.build(ROOT)


def test_rule_cells_follow_the_convention(built):
    assert not built.problems, "rule cells or 08's INDEX break the convention (docs/AUTHORING.md):\n" + \
        "\n".join(built.problems)


def test_cheatsheet_and_08_table_are_in_sync(built):
    stale = [path.relative_to(ROOT).as_posix() for path in cheatsheet.out_of_sync(built)]
    assert not stale, f"out of sync with the notebooks: {stale}; run `python3 make.py cheatsheet`"
    # ... and the maintainer's own command says so too
    check = subprocess.run([sys.executable, str(ROOT / "make.py"), "cheatsheet", "--check"], cwd=ROOT,
                           capture_output=True, text=True, timeout=600)
    assert check.returncode == 0 and "in sync" in check.stdout, check.stdout + check.stderr


def test_every_expected_rule_topic_has_a_rule_cell(built):
    assert not built.missing_topics, (
        "CHEATSHEET.md lacks rules on: " + "; ".join(built.missing_topics)
        + ". Tag the rule cell (docs/AUTHORING.md, rule cells), then run `python3 make.py cheatsheet`")


def test_cheatsheet_is_linked_from_readme_and_chapter_00():
    assert "(CHEATSHEET.md)" in (ROOT / "README.md").read_text(encoding="utf-8")
    start = (ROOT / "course" / "00_start_here.ipynb").read_text(encoding="utf-8")
    assert "blob/main/CHEATSHEET.md" in start


def test_every_index_pattern_compiles_and_every_message_is_listed_once(built):
    import re

    for row in built.rows:
        re.compile(row.pattern or re.escape(row.message))
    assert len({row.message for row in built.rows}) == len(built.rows), "two INDEX rows show the same message"


# ---- failure paths, on a temporary copy of course/ and CHEATSHEET.md ----

@pytest.fixture
def copy(tmp_path):
    shutil.copytree(ROOT / "course", tmp_path / "course")
    shutil.copy(ROOT / cheatsheet.SHEET, tmp_path / cheatsheet.SHEET)
    cheatsheet.main(["--root", str(tmp_path)])  # in sync, whatever the state of the real tree
    assert cheatsheet.main(["--check", "--root", str(tmp_path)]) == 0
    return tmp_path


def edit(path, change):
    nb = json.loads(path.read_text(encoding="utf-8"))
    change(nb["cells"])
    path.write_text(json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def text(cell):
    return "".join(cell["source"])


def rule_cells(cells):
    return [i for i, c in enumerate(cells) if "rule" in c.get("metadata", {}).get("tags", [])]


def run_check(root):
    return subprocess.run([sys.executable, "-m", "coursetools.author.cheatsheet", "--check", "--root", str(root)],
                          capture_output=True, text=True, cwd=ROOT, check=False)


def test_check_names_an_edited_cheatsheet(copy):
    sheet = copy / cheatsheet.SHEET
    sheet.write_text(sheet.read_text(encoding="utf-8").replace("## Rules", "## Rules\n\n- hand-made rule."),
                     encoding="utf-8")
    result = run_check(copy)
    assert result.returncode == 1 and "out of sync: CHEATSHEET.md" in result.stderr, result.stderr
    assert "08_troubleshooting" not in result.stderr


def test_check_names_an_edited_08_table(copy):
    def change(cells):
        cell = next(c for c in cells if cheatsheet.TABLE_START in text(c))
        cell["source"] = text(cell).replace("| two operands of one", "| three operands of one")
    edit(copy / "course" / "08_troubleshooting.ipynb", change)
    result = run_check(copy)
    assert result.returncode == 1 and "out of sync: course/08_troubleshooting.ipynb" in result.stderr
    assert "CHEATSHEET.md" not in result.stderr


def test_a_new_index_row_or_rule_changes_both_outputs(copy):
    def add_row(cells):
        cell = next(c for c in cells if text(c).startswith("# The error index"))
        cell["source"] = text(cell).replace(
            "INDEX = [\n", 'INDEX = [\n    ("A brand-new message", None, ["02 §1"], "a cause", "a fix"),\n')
    edit(copy / "course" / "08_troubleshooting.ipynb", add_row)
    assert {p.name for p in cheatsheet.out_of_sync(cheatsheet.build(copy))} == {
        "CHEATSHEET.md", "08_troubleshooting.ipynb"}
    assert cheatsheet.main(["--root", str(copy)]) == 0  # regenerates both
    assert "`A brand-new message` | a cause | a fix | [02 §1](course/02_to_semantics.ipynb)" in \
        (copy / cheatsheet.SHEET).read_text(encoding="utf-8")
    assert cheatsheet.main(["--check", "--root", str(copy)]) == 0

    def reword_rule(cells):
        i = rule_cells(cells)[0]
        cells[i]["source"] = text(cells[i]).replace("**Rule:** ", "**Rule:** Always ", 1)
    edit(copy / "course" / "02_to_semantics.ipynb", reword_rule)
    assert [p.name for p in cheatsheet.out_of_sync(cheatsheet.build(copy))] == ["CHEATSHEET.md"]


def add_index_row(root, refs: list[str], chapters: dict[str, str] | None = None):
    """A row ("A brand-new message", ..., refs) at the top of the copy's INDEX; with
    `chapters`, those keys added to CHAPTERS."""
    def change(cells):
        cell = next(c for c in cells if text(c).startswith("# The error index"))
        source = text(cell).replace(
            "INDEX = [\n", f'INDEX = [\n    ("A brand-new message", None, {json.dumps(refs, ensure_ascii=False)}, '
                           '"a cause", "a fix"),\n')
        for key, name in (chapters or {}).items():
            source = source.replace('    "08": "08_troubleshooting",\n', f'    "{key}": "{name}",\n    "08": "08_troubleshooting",\n')
        cell["source"] = source
    edit(root / "course" / "08_troubleshooting.ipynb", change)


def test_a_row_links_the_part_of_a_chapter_that_has_its_section(copy):
    """A chapter in parts (07_performance.ipynb, 07_performance_2_waits.ipynb, ...) is named
    by part in 08's CHAPTERS ("07_2"); a row's reference "02_2 §3" links to that part, labelled
    with the chapter and section only ("02 §3"), whatever the part's file is called."""
    shutil.copy(copy / "course" / "02_to_semantics.ipynb", copy / "course" / "02_to_semantics_zz_part2.ipynb")
    add_index_row(copy, ["02_2 §3", "08 §2 row 4"], {"02_2": "02_to_semantics_zz_part2"})
    assert cheatsheet.main(["--root", str(copy)]) == 0
    sheet = (copy / cheatsheet.SHEET).read_text(encoding="utf-8")
    assert ("`A brand-new message` | a cause | a fix | [02 §3](course/02_to_semantics_zz_part2.ipynb), "
            "[08 §2 row 4](course/08_troubleshooting.ipynb) |") in sheet


def test_a_new_part_must_be_named_in_chapters(copy):
    """A lesson part that 08's CHAPTERS does not list (or lists under another name) is reported
    with the mapping to write: find_lesson() prints the lesson from CHAPTERS."""
    shutil.copy(copy / "course" / "02_to_semantics.ipynb", copy / "course" / "02_to_semantics_zz_part2.ipynb")
    result = cheatsheet.build(copy)
    assert any("CHAPTERS must map" in p and "'02_2': '02_to_semantics_zz_part2'" in p for p in result.problems), \
        result.problems


@pytest.mark.parametrize("refs, says", [
    (["02 §99"], "'02 §99': 02_to_semantics.ipynb has no heading numbered 99"),
    (["08 §2 row 99"], "'08 §2 row 99': 08_troubleshooting.ipynb has no heading 'Row 99 ...' inside §2"),
    (["08 §3 row 1"], "'08 §3 row 1'"),                 # row 1 is in §2, not in §3
    (["07 §3.1"], "a chapter in parts names the part: 07_2, 07_3"),  # 07 §3.1 is in the second part
    (["09 §1"], "'09 §1' names no lesson"),
    (["02"], "'02' is not a reference like '01 §4'"),
    (["02 4"], "'02 4' is not a reference"),
    ([], "no section explains it"),
])
def test_a_reference_the_lessons_do_not_have_is_reported(copy, refs, says):
    add_index_row(copy, refs)
    result = cheatsheet.build(copy)
    assert any(says in p for p in result.problems), result.problems
    assert run_check(copy).returncode == 1


def test_each_reference_names_the_heading_the_site_links_to():
    """cheatsheet.ref_heading finds a numbered section, a subsection and a row inside a section,
    and nothing for a number that is only a prefix ("3" is not "3.1")."""
    nb = json.loads((ROOT / "course" / "08_troubleshooting.ipynb").read_text(encoding="utf-8"))
    found = cheatsheet.headings(nb)

    def title(ref):
        at = cheatsheet.ref_heading(nb, cheatsheet.parse_ref(ref))
        return None if at is None else found[at][2]
    assert title("08 §3").startswith("3. Mismatch sources")
    assert title("08 §3.1").startswith("3.1 Embedding indices")
    assert title("08 §2 row 1").startswith("Row 1 · ")
    assert title("08 §2 row 10").startswith("Row 10 · ")
    assert title("08 §3 row 1") is None and title("08 §31") is None
    assert cheatsheet.parse_ref("07_2 §3.1").label == "07 §3.1"


def test_a_proof_cell_without_assert_is_reported(copy):
    path = copy / "course" / "04_buffers_checkpoints.ipynb"

    def drop_asserts(cells):
        i = rule_cells(cells)[0]
        proof = next(c for c in cells[i + 1:] if c["cell_type"] == "code")
        proof["source"] = "\n".join(line for line in text(proof).splitlines()
                                    if not line.lstrip().startswith("assert"))
    edit(path, drop_asserts)
    result = run_check(copy)
    assert result.returncode == 1 and "04_buffers_checkpoints.ipynb" in result.stderr
    assert "has no assert" in result.stderr, result.stderr


def test_a_rule_cell_without_a_proof_cell_is_reported(copy):
    def two_rules_in_a_row(cells):
        i = rule_cells(cells)[0]
        cells.insert(i + 1, {"cell_type": "markdown", "metadata": {"tags": ["rule"]},
                             "source": "**Rule:** A second rule with no proof between."})

    edit(copy / "course" / "01_device_basics.ipynb", two_rules_in_a_row)
    problems = cheatsheet.build(copy).problems
    assert any("01_device_basics.ipynb" in p and "no proof cell" in p for p in problems), problems

    def rule_at_the_end(cells):
        cells.append({"cell_type": "markdown", "metadata": {"tags": ["rule"]},
                      "source": "**Rule:** The last word, never proven."})
    edit(copy / "course" / "03_module_to.ipynb", rule_at_the_end)
    problems = cheatsheet.build(copy).problems
    assert any("03_module_to.ipynb" in p and "no code cell after it" in p for p in problems), problems


def test_a_malformed_rule_cell_is_reported(copy):
    def untagged_and_unprefixed(cells):
        i = rule_cells(cells)[0]
        cells[i]["metadata"] = {}  # **Rule:** text without the tag
        j = rule_cells(cells)[0]
        cells[j]["source"] = "Rule: " + text(cells[j])  # a tag without the **Rule:** prefix

    edit(copy / "course" / "02_to_semantics.ipynb", untagged_and_unprefixed)
    problems = cheatsheet.build(copy).problems
    assert any("is not tagged 'rule'" in p for p in problems), problems
    assert any("does not begin with **Rule:**" in p for p in problems), problems


def test_a_missing_topic_is_named(copy):
    def untag_buffer_rule(cells):
        for i in rule_cells(cells):
            if "buffer" in text(cells[i]):
                cells[i]["metadata"] = {}
                cells[i]["source"] = text(cells[i]).replace("**Rule:** ", "", 1)
    edit(copy / "course" / "04_buffers_checkpoints.ipynb", untag_buffer_rule)
    missing = cheatsheet.build(copy).missing_topics
    assert any(topic.startswith("buffers vs attributes") for topic in missing), missing
    assert not any(topic.startswith("loading across devices") for topic in missing), missing


def test_first_sentence_ignores_full_stops_in_code():
    assert cheatsheet.first_sentence("Use `x.to(d)` and `nn.Linear(..., device=d)`. More.") == \
        "Use `x.to(d)` and `nn.Linear(..., device=d)`."
    assert cheatsheet.first_sentence("no full stop") is None


def test_section_reference_from_the_headings():
    assert cheatsheet._section([(1, "00 · Title"), (2, "4. The same-device rule")]) == "§4 The same-device rule"
    assert cheatsheet._section([(2, "2. Perf"), (3, "2.7 Sync points")]) == "§2.7 Sync points"
    assert cheatsheet._section([(2, "2. Rows"), (3, "Row 8 · DataLoader")]) == "§2 Row 8 · DataLoader"


def test_magics_and_recorded_gpu_blocks_change_nothing(copy):
    """An IPython %magic in one of 08's code cells, and a recorded GPU block whose text has a
    '#' line, leave the sheet as it was (the index reader parses magics as IPython does; a
    record is not part of the lesson's outline)."""
    def add_magic(cells):
        cell = next(c for c in cells if c["cell_type"] == "code" and not text(c).startswith("# The error index"))
        cell["source"] = "%time 1 + 1\n" + text(cell)
    edit(copy / "course" / "08_troubleshooting.ipynb", add_magic)

    def add_block(cells):  # just before 02's second rule: its section must not change
        second = rule_cells(cells)[1]
        cells.insert(second, {"cell_type": "markdown", "id": "recorded-block", "source": "## 99. Not a section\n",
                              "metadata": {"tags": ["gpu-record"]}})
    edit(copy / "course" / "02_to_semantics.ipynb", add_block)
    result = cheatsheet.build(copy)
    assert not result.problems, result.problems
    assert "§99" not in result.outputs[copy / cheatsheet.SHEET]
    assert cheatsheet.out_of_sync(result) == []


# ---- the error index points only to sections that show the message (three rows once sent readers to chapters
#      that never mention theirs) ----

def _chapter_text(root, chapter):
    """Every cell's source (markdown, code, comments) of every part of a chapter, whitespace
    collapsed; chapter 08's INDEX cell and the table generated from it are left out, since they
    hold every message of the index whatever the lessons say."""
    import re

    parts = []
    for path in layout.lessons(root):
        if path.name[:2] != chapter:
            continue
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            source = text(cell)
            if cheatsheet.TABLE_START in source or re.search(rf"^{cheatsheet.INDEX_NAME} = \[", source, re.M):
                continue
            parts.append(source)
    return " ".join(" ".join(parts).split())


def index_rows_without_their_message(root):
    """(message, reference) for every INDEX row whose referenced section does not contain the
    row's message (its pattern, or the message itself when the row has none, searched
    case-insensitively in the section's cells, whitespace collapsed)."""
    import re

    keys = cheatsheet.lesson_keys(root)
    missing = []
    for row in cheatsheet.read_index(root / "course" / f"{cheatsheet.INDEX_CHAPTER}.ipynb"):
        for reference in row.chapters:
            ref = cheatsheet.parse_ref(reference)
            nb = json.loads((root / "course" / keys[ref.key]).read_text(encoding="utf-8"))
            cells = cheatsheet.ref_cells(nb, ref) or []
            section = " ".join(" ".join(text(c) for c in cells if cheatsheet.TABLE_START not in text(c)).split())
            if not re.search(row.pattern or re.escape(row.message), section, re.IGNORECASE):
                missing.append((row.message, reference))
    return missing


def test_every_index_row_points_to_sections_that_show_its_message():
    """A learner sent to a section by the error index must find the message there: in its text, a
    code cell that raises and asserts on it, or a comment quoting it."""
    missing = index_rows_without_their_message(ROOT)
    assert not missing, ("08's INDEX sends readers to sections that never show the message "
                         "(point the row at the sections that do, or add the message, with its proof, "
                         "to the lesson): " + "; ".join(f"{m!r} -> {ch}" for m, ch in missing))


def test_the_index_check_catches_a_row_pointing_to_the_wrong_section(copy):
    """The check above fails on a row that points to a chapter that never mentions its message
    (as two rows once did) and on one that points to the right chapter but the wrong section."""
    def old_pointers(cells):
        cell = next(c for c in cells if text(c).startswith("# The error index"))
        source = text(cell).replace(
            '"Cannot copy out of meta tensor", ["00 §3"]', '"Cannot copy out of meta tensor", ["04 §7"]').replace(
            '"Placeholder storage has not been allocated on MPS",\n     ["08 §3.1"]',
            '"Placeholder storage has not been allocated on MPS",\n     ["01 §4", "08 §3.1"]').replace(
            '"Torch not compiled with CUDA enabled", None, ["01 §1", "08 §2 row 2"]',
            '"Torch not compiled with CUDA enabled", None, ["01 §2", "08 §2 row 2"]')
        assert source.count("04 §7") == 1 and source.count('["01 §4", "08 §3.1"]') == 1 and source.count('["01 §2"') == 1
        cell["source"] = source
    edit(copy / "course" / "08_troubleshooting.ipynb", old_pointers)
    missing = index_rows_without_their_message(copy)
    assert ("Cannot copy out of meta tensor; no data!", "04 §7") in missing
    assert ("Placeholder storage has not been allocated on MPS device!", "01 §4") in missing
    assert ("Torch not compiled with CUDA enabled", "01 §2") in missing
    assert len(missing) == 3, missing
