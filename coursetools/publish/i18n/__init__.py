"""The course in Simplified Chinese, kept in step with the English masters.

Translations live in gettext PO files under locale/zh_CN/ (one per notebook or document,
plus tools/messages.po for the words of `make.py check` and `make.py lab`); the Chinese
notebooks and documents are generated from the English ones and those files
(coursetools/publish/i18n/build.py says where they go). `python3 make.py i18n --help` lists the
commands; docs/AUTHORING.md "The Chinese edition" says how to translate.

This module is what the other tools use at run time: `tr()` for their own words, and
`notebook_language()` to notice a Chinese notebook.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

from coursetools import layout

LANGUAGES = ("en", "zh")
MESSAGES = Path("locale") / "zh_CN" / "tools" / "messages.po"
TOOL_MODULES = ("coursetools/learner/selfcheck.py", "coursetools/learner/lab.py",
                "coursetools/instructor/classreport.py")
_language = "en"


def set_language(lang: str | None) -> None:
    """"zh" (or "zh_CN", "zh-CN") for Chinese, anything else for English."""
    global _language
    _language = "zh" if lang and lang.lower().replace("-", "_").split("_")[0] == "zh" else "en"


def language() -> str:
    return _language


@functools.cache
def _messages(root: Path = layout.ROOT) -> dict[str, str]:
    path = root / MESSAGES
    if not path.exists():
        return {}
    try:
        import polib
    except ImportError:  # the course's requirements.txt installs it; without it: English
        return {}
    return {e.msgid: e.msgstr for e in polib.pofile(str(path)) if e.msgstr and not e.fuzzy and not e.obsolete}


def N_(message: str) -> str:
    """Marks an English message for the tools' PO file (gettext's convention) where it is
    translated later, e.g. by coursetools/publish/i18n/testmessages.py; returns it unchanged."""
    return message


def tr(message: str) -> str:
    """`message` in the current language (English when there is no translation)."""
    if _language != "zh":
        return message
    return _messages().get(message, message)


CJK = _CJK = re.compile(r"[\u3400-\u9fff]")


def notebook_language(path: str | Path) -> str:
    """"zh" when a notebook's markdown is mostly Chinese (a notebook of the Chinese edition,
    or a learner's copy of one, wherever it was saved), else "en"."""
    try:
        return cells_language(json.loads(Path(path).read_text(encoding="utf-8"))["cells"])
    except (OSError, ValueError, KeyError, TypeError):
        return "en"


def cells_language(cells) -> str:
    """notebook_language for a notebook's cells (as read: dicts or NotebookNodes)."""
    try:
        text = "".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                       for c in cells if c.get("cell_type") == "markdown")
    except (KeyError, TypeError):
        return "en"
    chinese = len(_CJK.findall(text))
    return "zh" if chinese and chinese * 4 > len(re.findall(r"[A-Za-z]", text)) else "en"


@functools.cache
def test_descriptions(assignment: str, root: Path = layout.ROOT) -> dict[str, str]:
    """English test description (a test cell's docstring) -> its Chinese, for an exercise."""
    path = root / "locale" / "zh_CN" / "exercises" / f"{assignment}.po"
    if not path.exists():
        return {}
    try:
        import polib
    except ImportError:
        return {}
    return {e.msgid: e.msgstr for e in polib.pofile(str(path))
            if e.msgctxt == "test description" and e.msgstr and not e.fuzzy and not e.obsolete}


def describe_test(assignment: str, english: str) -> str:
    if _language != "zh":
        return english
    return test_descriptions(assignment).get(english, english)
