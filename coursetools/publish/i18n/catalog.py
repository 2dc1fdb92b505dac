"""PO files: read, merge the English text into them (msgmerge's rules), look translations up.

`merge` is what `make.py i18n update` does to each PO file, the way GNU msgmerge would:

* a msgid still in the English text keeps its translation (and its fuzzy mark, if any);
* a msgid whose English changed only in its line breaks or spaces keeps its translation;
* a new msgid close to an old translated one (difflib ratio >= 0.6) gets that translation,
  marked fuzzy, with the old English as `#| msgid` so a translator sees what changed;
* a new msgid that another PO file of the edition translates (the same English, e.g. the
  setup cell's comments) gets that translation (msgmerge's `--compendium`);
* any other new msgid is added untranslated;
* an old translated entry no longer used is kept as obsolete (`#~`), never thrown away.

A fuzzy or untranslated entry is never used by the build: its English is shown, with a
"translation pending" note.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path

import polib

LANGUAGE = "zh_CN"
WRAP = 78
FUZZY_CUTOFF = 0.6
# msgctxt of the pieces that are not markdown (see coursetools/publish/i18n/pycode.py)
CONTEXTS = {"comment": "code comment", "comment-after": "code comment", "docstring": "docstring",
            "test": "test description", "message": "test message", "text": "text block",
            "printed": "printed line"}  # a line the code prints or says (pycode.said), holes as {field}


@dataclass
class Template:
    """One msgid of the English text, where it occurs and what it is."""
    msgid: str
    msgctxt: str | None = None
    occurrences: list[tuple[str, str]] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)


def squash(text: str) -> str:
    return " ".join(text.split())


def header(source: str) -> dict[str, str]:
    return {
        "Project-Id-Version": "pytorch-devices-course",
        "Language": LANGUAGE,
        "MIME-Version": "1.0",
        "Content-Type": "text/plain; charset=UTF-8",
        "Content-Transfer-Encoding": "8bit",
        "Plural-Forms": "nplurals=1; plural=0;",
        "X-Source": source,
    }


HEADER_COMMENT = ("Simplified Chinese translation of {source}.\n"
                  "msgid: the English text (a paragraph, heading, list item, table row, code comment\n"
                  "or docstring); msgstr: its translation. Edit msgstr only, then run\n"
                  "`python3 make.py i18n build`. Glossary: locale/zh_CN/glossary.csv.")


def load(path: Path) -> polib.POFile | None:
    return polib.pofile(str(path), wrapwidth=WRAP) if path.exists() else None


def _usable(entry: polib.POEntry) -> bool:
    return bool(entry.msgstr)


def merge(old: polib.POFile | None, templates: list[Template], source: str,
          compendium: dict[tuple[str | None, str], str] | None = None) -> polib.POFile:
    po = polib.POFile(wrapwidth=WRAP)
    po.header = HEADER_COMMENT.format(source=source)
    po.metadata = header(source)
    previous = list(old) if old is not None else []  # a POFile lists its obsolete entries too
    exact = {(e.msgctxt, e.msgid): e for e in previous}
    squashed: dict[tuple[str | None, str], polib.POEntry] = {}
    for e in previous:
        if _usable(e):
            squashed.setdefault((e.msgctxt, squash(e.msgid)), e)
    used: set[int] = set()
    for t in templates:
        entry = polib.POEntry(msgid=t.msgid, msgctxt=t.msgctxt, msgstr="",
                              occurrences=list(t.occurrences),
                              comment=", ".join(dict.fromkeys(t.kinds)))
        found = exact.get((t.msgctxt, t.msgid)) or squashed.get((t.msgctxt, squash(t.msgid)))
        if found is not None:
            entry.msgstr = found.msgstr
            entry.tcomment = found.tcomment
            entry.flags = [f for f in found.flags if f != "fuzzy"]
            if "fuzzy" in found.flags:
                entry.flags.append("fuzzy")
                entry.previous_msgid = found.previous_msgid
            used.add(id(found))
        else:
            candidates = [e for e in previous if _usable(e) and e.msgctxt == t.msgctxt and not e.fuzzy]
            best, score = None, FUZZY_CUTOFF
            for e in candidates:
                matcher = difflib.SequenceMatcher(None, e.msgid, t.msgid, autojunk=False)
                if matcher.real_quick_ratio() < score or matcher.quick_ratio() < score:
                    continue
                ratio = matcher.ratio()
                if ratio >= score:
                    best, score = e, ratio
            if best is not None:
                entry.msgstr = best.msgstr
                entry.tcomment = best.tcomment
                entry.flags = ["fuzzy"]
                entry.previous_msgid = best.msgid
                used.add(id(best))
            elif compendium and (t.msgctxt, t.msgid) in compendium:
                entry.msgstr = compendium[(t.msgctxt, t.msgid)]  # the same English elsewhere
        po.append(entry)
    current = {(t.msgctxt, t.msgid) for t in templates}
    kept: set[tuple[str | None, str]] = set()
    for e in previous:
        if id(e) not in used and _usable(e) and (e.msgctxt, e.msgid) not in current | kept:
            kept.add((e.msgctxt, e.msgid))  # once, however often an older update wrote it
            gone = polib.POEntry(msgid=e.msgid, msgctxt=e.msgctxt, msgstr=e.msgstr, tcomment=e.tcomment,
                                 flags=list(e.flags), obsolete=True)
            po.append(gone)
    return po


def compendium(pos) -> dict[tuple[str | None, str], str]:
    """(msgctxt, msgid) -> translation, from the translated, not fuzzy entries of `pos`."""
    out: dict[tuple[str | None, str], str] = {}
    for po in pos:
        for e in po or []:
            if e.msgstr and not e.fuzzy and not e.obsolete:
                out.setdefault((e.msgctxt, e.msgid), e.msgstr)
    return out


def write(po: polib.POFile, path: Path) -> bool:
    """Write `po` to `path` (True when the file changed)."""
    text = po.__unicode__() if hasattr(po, "__unicode__") else str(po)
    if not text.endswith("\n"):
        text += "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return False
    path.write_text(text, encoding="utf-8")
    return True


class Lookup:
    """The translations a PO file gives: only translated, not fuzzy, not obsolete entries;
    an English text that differs only in spacing finds its translation too."""

    def __init__(self, po: polib.POFile | None):
        self.exact: dict[tuple[str | None, str], str] = {}
        self.squashed: dict[tuple[str | None, str], str] = {}
        self.fuzzy: set[tuple[str | None, str]] = set()
        for e in po or []:
            if e.obsolete:
                continue
            if e.msgstr and not e.fuzzy:
                self.exact[(e.msgctxt, e.msgid)] = e.msgstr
                self.squashed.setdefault((e.msgctxt, squash(e.msgid)), e.msgstr)
            elif e.fuzzy:
                self.fuzzy.add((e.msgctxt, squash(e.msgid)))

    def get(self, msgid: str, msgctxt: str | None = None) -> str | None:
        return self.exact.get((msgctxt, msgid)) or self.squashed.get((msgctxt, squash(msgid)))

    def state(self, msgid: str, msgctxt: str | None = None) -> str:
        """translated, fuzzy or missing"""
        if self.get(msgid, msgctxt):
            return "translated"
        return "fuzzy" if (msgctxt, squash(msgid)) in self.fuzzy else "missing"
