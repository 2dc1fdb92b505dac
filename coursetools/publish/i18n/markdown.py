"""Markdown text cut into translation units: one unit per paragraph, heading, list item,
table row or block quote. Code blocks, HTML-only lines, HTML comments, the Colab badge and
text that is already Chinese are kept as they are and never become a msgid.

Why paragraphs and not whole cells: a one-word change to a long cell then marks one
paragraph fuzzy, not the cell; a translator reads and edits units of one idea; a table row or
a list item can be translated and kept in step on its own. The cut is lossless: putting the
units back together gives the text byte for byte (`join(split(text)) == text`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
HEADING = re.compile(r"^#{1,6}\s")
LIST_ITEM = re.compile(r"^(?:[-*+]|\d+[.)])\s")
TABLE_SEPARATOR = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$")
HTML_ONLY = re.compile(r"^\s*(<[^>]+>\s*)+$")
COLAB_BADGE = re.compile(r"^\[!\[Open In Colab\]\([^)]*\)\]\([^)]*\)\s*$")
CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff\u3000-\u303f\uff00-\uffef]")
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
LINK_TARGET = re.compile(r"\]\([^)]*\)")
HTML_TAG = re.compile(r"<[^>]+>")
URL = re.compile(r"https?://\S+")


@dataclass
class Unit:
    """Lines [start, end) of the text; `kind` says what they are. Only units whose
    `translatable` is true become msgids."""
    start: int
    end: int
    kind: str  # paragraph, heading, item, row, quote, html, code, blank, comment, badge
    translatable: bool = False


def prose(text: str) -> str:
    """What a reader reads of a unit: without code spans, link targets, HTML tags and URLs."""
    text = CODE_SPAN.sub(" ", text)
    text = LINK_TARGET.sub("]", text)
    text = HTML_TAG.sub(" ", text)
    return URL.sub(" ", text)


def needs_translation(text: str) -> bool:
    """True when the unit holds English prose: words of two letters or more outside code,
    links and tags, and not already mostly Chinese (a quoted post stays as it is)."""
    if COLAB_BADGE.match(text.strip()):
        return False
    words = prose(text)
    letters = len(re.findall(r"[A-Za-z]", words))
    if not re.search(r"[A-Za-z]{2,}", words):
        return False
    return len(CJK.findall(words)) < letters


def _is_table_start(lines: list[str], i: int) -> bool:
    return ("|" in lines[i] and i + 1 < len(lines) and "|" in lines[i + 1]
            and bool(TABLE_SEPARATOR.match(lines[i + 1])))


def _ends_paragraph(lines: list[str], i: int) -> bool:
    line = lines[i]
    return (not line.strip() or bool(FENCE.match(line)) or bool(HEADING.match(line))
            or bool(LIST_ITEM.match(line)) or bool(HTML_ONLY.match(line)) or _is_table_start(lines, i)
            or line.startswith(">") or line.lstrip().startswith("<!--"))


def split(text: str) -> tuple[list[str], list[Unit]]:
    """The text's lines and its units, in order, covering every line once."""
    lines = text.split("\n")
    units: list[Unit] = []
    i, n = 0, len(lines)
    while i < n:
        line = lines[i]
        if not line.strip():
            units.append(Unit(i, i + 1, "blank"))
            i += 1
            continue
        fence = FENCE.match(line)
        if fence:
            mark = fence.group(1)
            j = i + 1
            while j < n and not (lines[j].strip().startswith(mark[0] * len(mark))
                                 and not lines[j].strip().strip(mark[0])):
                j += 1
            units.append(Unit(i, min(j + 1, n), "code"))
            i = min(j + 1, n)
            continue
        if line.lstrip().startswith("<!--"):
            j = i
            while j < n and "-->" not in lines[j]:
                j += 1
            units.append(Unit(i, min(j + 1, n), "comment"))
            i = min(j + 1, n)
            continue
        if HEADING.match(line):
            units.append(Unit(i, i + 1, "heading"))
            i += 1
            continue
        if _is_table_start(lines, i):
            units.append(Unit(i, i + 1, "row"))
            units.append(Unit(i + 1, i + 2, "code"))  # the |---| line
            j = i + 2
            while j < n and lines[j].strip() and "|" in lines[j]:
                units.append(Unit(j, j + 1, "row"))
                j += 1
            i = j
            continue
        if LIST_ITEM.match(line):
            j = i + 1
            while j < n and lines[j].strip() and not LIST_ITEM.match(lines[j]) \
                    and not HEADING.match(lines[j]) and not FENCE.match(lines[j]):
                j += 1
            units.append(Unit(i, j, "item"))
            i = j
            continue
        if line.startswith(">"):
            j = i + 1
            while j < n and lines[j].strip() and not FENCE.match(lines[j]) and not HEADING.match(lines[j]):
                j += 1
            units.append(Unit(i, j, "quote"))
            i = j
            continue
        if HTML_ONLY.match(line):
            units.append(Unit(i, i + 1, "html"))
            i += 1
            continue
        j = i + 1
        while j < n and not _ends_paragraph(lines, j):
            j += 1
        units.append(Unit(i, j, "paragraph"))
        i = j
    for unit in units:
        if unit.kind in ("paragraph", "heading", "item", "row", "quote", "html"):
            body = "\n".join(lines[unit.start:unit.end])
            unit.translatable = needs_translation(body)
            if COLAB_BADGE.match(body.strip()):
                unit.kind = "badge"
    return lines, units


def indentation(lines: list[str]) -> str:
    """The indentation every non-blank line shares."""
    found = [re.match(r"[ \t]*", line).group(0) for line in lines if line.strip()]
    if not found:
        return ""
    common = found[0]
    for ind in found[1:]:
        while not ind.startswith(common):
            common = common[:-1]
    return common


def msgid_of(lines: list[str], unit: Unit) -> str:
    """The unit's text as a msgid: its lines, less the indentation they share."""
    body = lines[unit.start:unit.end]
    ind = indentation(body)
    return "\n".join(line[len(ind):] for line in body)


def reindent(lines: list[str], unit: Unit, translation: str) -> str:
    """A translation put back in the unit's place, with the unit's indentation."""
    ind = indentation(lines[unit.start:unit.end])
    return "\n".join((ind + line) if line.strip() else line for line in translation.split("\n"))
