"""What a translation must keep: checked for every translated entry of every PO file.

* markdown: the same HTML tags, the same link targets, no code span the English lacks, the
  heading level, the list marker, the table's cells, the block quote;
* the seed posts' quoted sentences (「...」) word for word, and none added;
* Chinese in the translation (a copied English text is not a translation);
* code comments and docstrings: nothing that would end the comment or the string;
* the glossary (locale/zh_CN/glossary.csv): no English term in Chinese prose where the
  glossary has a Chinese one (code spans, link targets, HTML, URLs, "quoted English" and the
  terms the glossary keeps in English, such as CUDA or GPU, are allowed), none of the
  Chinese renderings the glossary says to avoid (an `avoid` entry is a literal string, or a
  regular expression written `re:PATTERN`), and, for a term with a `first_use` form (嵌入
  （embedding）, Tensor Core（张量核心）), that form at the term's first occurrence in each file
  (one name per idea).
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass
from pathlib import Path

from coursetools import layout
from coursetools.publish.i18n import build, catalog, markdown, testmessages

GLOSSARY = build.LOCALE_DIR / "glossary.csv"
SEED_QUOTE = re.compile(r"「([^」]*)」")
QUOTED_ENGLISH = re.compile(r"\"[^\"\n]*\"|“[^”\n]*”")


@dataclass
class Term:
    english: str
    chinese: str
    avoid: list[str]
    note: str
    first_use: str = ""  # the form the first occurrence in a file takes: 嵌入（embedding）

    def avoided(self, prose: str):
        """(variant, match) for each rendering to avoid found in `prose`."""
        for variant in self.avoid:
            pattern = re.compile(variant[3:]) if variant.startswith("re:") else re.compile(re.escape(variant))
            for match in pattern.finditer(prose):
                yield variant, match

    @property
    def kept_in_english(self) -> bool:
        return self.english.casefold() == self.chinese.casefold()


def glossary(root: Path = layout.ROOT) -> list[Term]:
    with open(root / GLOSSARY, encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    return [Term(r["english"].strip(), r["chinese"].strip(),
                 [a.strip() for a in (r.get("avoid") or "").split(";") if a.strip()], (r.get("note") or "").strip(),
                 (r.get("first_use") or "").strip())
            for r in rows if r.get("english", "").strip()]


def _term_pattern(term: str) -> re.Pattern:
    words = r"\s+".join(re.escape(w) for w in term.split())
    return re.compile(rf"(?<![\w`.(/-]){words}(?:s|es)?(?![\w`(/-])(?!\.\w)", re.IGNORECASE)


def chinese_prose(text: str) -> str:
    """The words of a translation a reader reads as Chinese prose: code, links, tags, URLs,
    "quoted English" and the seed posts' 「quotes」 taken out."""
    text = re.sub(r"```.*?```", " ", text, flags=re.S)
    text = re.sub(r"<(code|kbd|pre)\b[^>]*>.*?</\1>", " ", text, flags=re.S | re.I)
    text = markdown.prose(text)
    text = QUOTED_ENGLISH.sub(" ", text)
    return SEED_QUOTE.sub(" ", text)


def _quoted_cells(msgid: str, msgstr: str) -> list[str]:
    """The cells of a table row that quotes a post (its English row has Chinese in it) which
    the translation copies unchanged: the post's own words, English ones included."""
    if not (msgid.startswith("|") and markdown.CJK.search(msgid)):
        return []
    english = [c.strip() for c in msgid.strip().strip("|").split("|")]
    chinese = [c.strip() for c in msgstr.strip().strip("|").split("|")]
    return [zh for en, zh in zip(english, chinese) if zh and zh == en]


def glossary_problems(text: str, terms: list[Term], msgid: str = "", english_terms: bool = True) -> list[str]:
    """`english_terms=False`: a text block (what a command prints, a folder tree) or a test's
    message (plain text that names the test's variables: device, loss, backend) keeps its
    code in English without backquotes; only the variants to avoid are checked."""
    problems = []
    for cell in _quoted_cells(msgid, text):
        text = text.replace(cell, " ")
    prose = chinese_prose(text)
    # the forms the glossary chooses are fine wherever they stand: 嵌入（embedding）, and a name kept
    # in English is no English term ("Tensor Core" is not the English "tensor")
    for chosen in sorted({t.first_use for t in terms if t.first_use}, key=len, reverse=True):
        prose = prose.replace(chosen, " ")
    for term in terms:
        if term.kept_in_english and " " in term.chinese:
            prose = prose.replace(term.chinese, " ")
    for term in terms:
        if english_terms and not term.kept_in_english:
            for match in _term_pattern(term.english).finditer(prose):
                problems.append(f"English term {match.group(0)!r} in Chinese text: the glossary says "
                                f"{term.chinese} (or put code in `backquotes`)")
        for variant, match in term.avoided(prose):
            problems.append(f"{match.group(0)!r}: the glossary renders {term.english!r} as "
                            f"{term.first_use or term.chinese}, not {match.group(0)}")
    return problems + memory_problems(text)  # with its code: `CUDA_VISIBLE_DEVICES` says GPU too


# "内存不足" (out of memory) where the text is about a GPU: device memory is 显存, and an out-of-
# memory error on a GPU is 显存不足（OOM） (issue 38: the edition had erased the host/device
# distinction the course is about). Host RAM running out stays 内存不足.
GPU_NEARBY = re.compile(r"CUDA|cuda|GPU|OOM|显卡|nvidia-smi")
HOST_OOM = re.compile(r"(?<!主机)内存不足")  # 主机内存不足: the host, said explicitly


def memory_problems(prose: str) -> list[str]:
    problems = []
    for match in HOST_OOM.finditer(prose):
        around = prose[max(match.start() - 40, 0):match.end() + 40]
        if GPU_NEARBY.search(around):
            problems.append(f"'内存不足' beside {GPU_NEARBY.search(around).group(0)}: a GPU's memory is 显存, "
                            "so write 显存不足（OOM） (内存不足 is for host RAM)")
    return problems


def _tags(text: str) -> list[str]:
    return sorted(re.sub(r"\s+", " ", t) for t in markdown.HTML_TAG.findall(markdown.CODE_SPAN.sub(" ", text)))


def _targets(text: str) -> list[str]:
    return sorted(re.findall(r"\]\(([^)]*)\)", markdown.CODE_SPAN.sub(" ", text)))


def _spans(text: str) -> set[str]:
    return {" ".join(re.sub(r"\n>", " ", m.group(2)).split()) for m in markdown.CODE_SPAN.finditer(text)}


def _pipes(text: str) -> int:
    return len(re.findall(r"(?<!\\)\|", markdown.CODE_SPAN.sub(" ", text)))


def entry_problems(msgid: str, msgstr: str, ctxt: str | None, terms: list[Term]) -> list[str]:
    """What is wrong with one translation ([] when nothing)."""
    problems = []
    quotes_en, quotes_zh = SEED_QUOTE.findall(msgid), SEED_QUOTE.findall(msgstr)
    missing = [q for q in quotes_en if q not in quotes_zh]
    added = [q for q in quotes_zh if q not in quotes_en]
    if missing:
        problems.append(f"the post's words must stay as quoted: 「{missing[0]}」 is missing")
    if added:
        problems.append(f"「{added[0]}」 is not a quote of the English text (use “...” for other quotes)")
    if (not markdown.CJK.search(msgstr) and re.search(r"[A-Za-z]{3,}", chinese_prose(msgid))
            and ctxt != catalog.CONTEXTS["text"]):  # a program's English output stays English
        problems.append("the translation has no Chinese in it")
    if ctxt is None:
        if _tags(msgid) != _tags(msgstr):
            problems.append(f"HTML tags differ: {_tags(msgid)} vs {_tags(msgstr)}")
        if _targets(msgid) != _targets(msgstr):
            problems.append(f"link targets differ: {_targets(msgid)} vs {_targets(msgstr)}")
        extra = sorted(_spans(msgstr) - _spans(msgid))
        if extra:
            problems.append(f"code the English does not have: {extra}")
        first_en, first_zh = msgid.split("\n", 1)[0], msgstr.split("\n", 1)[0]
        if markdown.HEADING.match(first_en):
            level = len(first_en) - len(first_en.lstrip("#"))
            if not re.match(rf"^#{{{level}}}\s", first_zh):
                problems.append(f"a heading of level {level} must stay one")
        item = markdown.LIST_ITEM.match(first_en)
        if item and not first_zh.startswith(item.group(0)):
            problems.append(f"a list item must keep its marker {item.group(0)!r}")
        if first_en.startswith("|") and _pipes(msgid) != _pipes(msgstr):
            problems.append(f"a table row must keep its cells: {_pipes(msgid)} '|' in the English, {_pipes(msgstr)}")
        if first_en.startswith(">") and any(line.strip() and not line.startswith(">")
                                            for line in msgstr.split("\n")):
            problems.append("every line of a block quote must start with '>'")
    elif ctxt in (catalog.CONTEXTS["message"], catalog.CONTEXTS["printed"]):
        wanted, given = sorted(set(testmessages.holes(msgid))), sorted(set(testmessages.holes(msgstr)))
        if wanted != given:
            problems.append(f"a test message's translation must keep its holes {wanted} as they are "
                            f"(found {given}; write a literal brace as {{{{ or }}}})")
    elif ctxt == catalog.CONTEXTS["docstring"]:
        if '"""' in msgstr or "'''" in msgstr or msgstr.endswith("\\"):
            problems.append("a docstring's translation must not contain triple quotes or end in '\\'")
    if ctxt in (catalog.CONTEXTS["message"], catalog.CONTEXTS["printed"]):  # a hole's code is not prose
        msgstr = "".join(p if isinstance(p, str) else " " for p in testmessages.parse(msgstr))
    problems += glossary_problems(msgstr, terms, msgid, english_terms=ctxt not in (catalog.CONTEXTS["text"], catalog.CONTEXTS["message"],
                                                                                     catalog.CONTEXTS["printed"]))
    return problems


def first_use_problems(texts: list[str], terms: list[Term]) -> list[str]:
    """`texts`: one file's translations in the order a reader meets them. A term with a
    `first_use` form takes that form where the file first names it: 嵌入（embedding）, then 嵌入."""
    problems = []
    for term in (t for t in terms if t.first_use):
        for text in texts:
            prose = chinese_prose(text)
            at = prose.find(term.chinese)
            if at < 0:
                continue
            if not prose.startswith(term.first_use, at):
                problems.append(f"the first {term.chinese!r} of the file must read {term.first_use} "
                                f"(then {term.chinese}): {prose[max(at - 20, 0):at + 30]!r}")
            break
    return problems


def po_problems(root: Path = layout.ROOT) -> list[str]:
    """Every problem of every translated, not fuzzy entry of the edition's PO files (and of
    the tools' messages)."""
    terms = glossary(root)
    problems = message_problems(root)
    for src in build.edition(root):
        po = build.po_file(src, root)
        for entry in po.translated_entries():
            for problem in entry_problems(entry.msgid, entry.msgstr, entry.msgctxt, terms):
                where = entry.occurrences[0] if entry.occurrences else (src.path, "")
                first = " ".join(entry.msgid.split())[:70]
                problems.append(f"{src.po.as_posix()} ({where[0]}:{where[1]}, {first!r}): {problem}")
        texts = [e.msgstr for e in po.translated_entries() if e.msgctxt != catalog.CONTEXTS["text"]]
        problems += [f"{src.po.as_posix()}: {problem}" for problem in first_use_problems(texts, terms)]
    return problems


def message_problems(root: Path = layout.ROOT) -> list[str]:
    """The tools' own words (locale/zh_CN/tools/messages.po): each translation keeps the
    English's {placeholders}, and is Chinese."""
    from coursetools.publish.i18n import MESSAGES

    path = root / MESSAGES
    if not path.exists():
        return []
    problems = []
    for entry in catalog.load(path).translated_entries():
        if entry.msgctxt == testmessages.GRADER_CONTEXT:  # f-string templates (testmessages)
            wanted, got = sorted(set(testmessages.holes(entry.msgid))), sorted(set(testmessages.holes(entry.msgstr)))
        else:
            wanted, got = sorted(re.findall(r"\{\w*\}", entry.msgid)), sorted(re.findall(r"\{\w*\}", entry.msgstr))
        if wanted != got:
            problems.append(f"{MESSAGES.as_posix()} ({entry.msgid[:50]!r}): placeholders {wanted} became {got}")
        if not markdown.CJK.search(entry.msgstr):
            problems.append(f"{MESSAGES.as_posix()} ({entry.msgid[:50]!r}): the translation has no Chinese in it")
    return problems


def seeds_dir(root: Path = layout.ROOT) -> Path | None:
    import os

    for candidate in (os.environ.get("COURSE_SEEDS_DIR"), root.parent / "shared" / "seeds", root / "shared" / "seeds"):
        if candidate and Path(candidate).is_dir() and any(Path(candidate).glob("*.txt")):
            return Path(candidate)
    return None


def seed_problems(result: build.Result, seeds: Path) -> list[str]:
    """Each 「quote」 in the Chinese edition is word for word in a seed post."""
    text = "".join(p.read_text(encoding="utf-8") for p in sorted(seeds.glob("*.txt")))
    problems = []
    for target, content in result.outputs.items():
        if target.endswith(".ipynb"):
            nb = json.loads(content)
            content = "\n".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                                for c in nb["cells"])
        for quote in SEED_QUOTE.findall(content):
            if quote not in text:
                problems.append(f"{target}: 「{quote[:40]}」 is not word for word in the seed posts ({seeds})")
    return problems
