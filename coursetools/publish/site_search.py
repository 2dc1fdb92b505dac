"""The site search's error index: a pasted error message finds its row of the cheat sheet.

Sphinx's own search (searchtools.js) ranks pages by the words of the query, one at a time. A
pasted error message is a long string of common words ("Expected all tensors to be on the
same device, but found at least two devices, cuda:0 and cpu!"), so the page that explains it
ranks low, and the link lands at the top of that page, not at the row that explains the
message. This module gives the search a second, exact index:

- `error_rows` reads the rows of CHEATSHEET.md's "Errors" table (either edition: the
  backquoted messages are the same in both, only the other columns are translated);
- `anchor_error_rows` gives each row an anchor (`<span id="error-...">` at the start of its
  first cell: myst passes inline HTML through to the page, in a table cell too), so a result
  can link to the row itself;
- `error_index` makes the JSON that website/_static/course-search.js reads on the search
  page (`INDEX_FILE`, under each edition's `_static/`). The script matches the query against
  each row's message and lists the rows it finds before Sphinx's results.

An anchor is made from the message alone (`error-` and a slug of it), so the two editions give
a row the same anchor, and it stays the same while the row's other columns change.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
import re
import unicodedata
from pathlib import Path

INDEX_FILE = "_static/course-errors.json"   # relative to an edition's root in the built site
ANCHOR_CLASS = "course-error-anchor"
# The heading of the Errors section, in each edition (zh/CHEATSHEET.md: "## 报错"), and the first
# header cell of its table ("Message (part)", "报错消息（片段）"): either finds the table.
ERRORS_HEADINGS = ("errors", "报错")
MESSAGE_HEADERS = ("message", "报错消息")
SLUG_MAX = 60                                # characters of the slug after "error-" (a word's end)

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_ANCHOR_SPAN = re.compile(r'^\s*<span\s+id="[^"]*"\s+class="' + ANCHOR_CLASS + r'"\s*>\s*</span>\s*')
_MD_LINK = re.compile(r"\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HTML_LINK = re.compile(r"""<a\s[^>]*?href="([^"]+)"[^>]*>(.*?)</a>""", re.DOTALL)
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^//")


@dataclasses.dataclass(frozen=True)
class ErrorRow:
    """One row of the Errors table. `message`: the backquoted text of its first cell, as the
    cheat sheet writes it (` / ` between alternative wordings, `...` for an elided part);
    `anchor`: its id on the page; `chapters`: the targets of the Chapter cell's links, as
    written (`course/08_troubleshooting.ipynb#4-a-debugging-routine` on the site, where each
    points at its section); `labels`: those links' texts (`08 §4`); `cause`: the Cause cell as
    plain text, the excerpt a search result shows."""
    message: str
    anchor: str
    chapters: tuple[str, ...]
    cause: str
    labels: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class _Table:
    lines: list[str]              # the markdown's lines
    rows: list[int]               # the index in `lines` of each body row of the Errors table


def _cells(line: str) -> list[str]:
    """The cells of a markdown table row. A `|` inside backquotes or escaped as `\\|` does
    not end a cell (GFM tables, as myst reads them)."""
    body = line.strip()
    if body.startswith("|"):
        body = body[1:]
    cells, cell, code, i = [], [], False, 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body) and body[i + 1] == "|":
            cell.append("\\|")
            i += 2
            continue
        if ch == "`":
            code = not code
        if ch == "|" and not code:
            cells.append("".join(cell).strip())
            cell = []
        else:
            cell.append(ch)
        i += 1
    rest = "".join(cell).strip()
    if rest:
        cells.append(rest)
    return cells


def _is_row(line: str) -> bool:
    return line.lstrip().startswith("|")


def _is_separator(line: str) -> bool:
    cells = _cells(line)
    return bool(cells) and all(re.fullmatch(r":?-{1,}:?", c.replace(" ", "")) for c in cells)


def _message_header(cell: str) -> bool:
    return cell.strip().lower().startswith(MESSAGE_HEADERS)


def _outside_fences(lines: list[str]) -> list[bool]:
    """For each line, whether it lies outside a ``` / ~~~ code fence (a table or a heading in
    a code example is not the cheat sheet's)."""
    out, fence = [], None
    for line in lines:
        m = re.match(r"^\s*(`{3,}|~{3,})", line)
        if fence is None and m:
            fence = m.group(1)[0] * 3
            out.append(False)
        elif fence is not None:
            out.append(False)
            if line.strip().startswith(fence):
                fence = None
        else:
            out.append(True)
    return out


def _find_table(markdown: str, source: str) -> _Table:
    """The Errors table: the first table after the `## Errors` (`## 报错`) heading, before the
    next heading of that level or above; without such a heading, the first table whose header
    starts with "Message" ("报错消息"). A table is a header row, a `|---|` row, then body rows."""
    lines = markdown.split("\n")
    outside = _outside_fences(lines)

    def table_at(start: int, stop: int) -> tuple[int, int] | None:
        i = start
        while i < stop - 1:
            if outside[i] and _is_row(lines[i]) and _is_separator(lines[i + 1]):
                return i, i + 2
            i += 1
        return None

    section = None
    for i, line in enumerate(lines):
        m = _HEADING.match(line) if outside[i] else None
        if m and m.group(2).strip().lower() in ERRORS_HEADINGS:
            level = len(m.group(1))
            end = next((j for j in range(i + 1, len(lines)) if outside[j] and (h := _HEADING.match(lines[j]))
                        and len(h.group(1)) <= level), len(lines))
            section = (i, end)
            break
    found = table_at(*section) if section else None
    if found is None:
        found = next(((i, i + 2) for i in range(len(lines) - 1) if outside[i] and _is_row(lines[i])
                      and _is_separator(lines[i + 1]) and _cells(lines[i])
                      and _message_header(_cells(lines[i])[0])), None)
    if found is None:
        where = (f"its '{lines[section[0]].strip()}' section has no table" if section else
                 "it has no '## Errors' (zh: '## 报错') section and no table whose header starts with "
                 "'Message' (zh: '报错消息')")
        raise ValueError(f"{source}: no Errors table: {where}. The site's error search needs the "
                         f"table `| Message (part) | Cause | Fix | Chapter |` (run `python3 make.py cheatsheet`)")
    header, body = found
    if len(_cells(lines[header])) < 3:
        raise ValueError(f"{source}, line {header + 1}: the Errors table has {len(_cells(lines[header]))} "
                         f"column(s); it needs Message, Cause, ... and Chapter")
    rows = []
    for j in range(body, len(lines)):
        if not _is_row(lines[j]):
            break
        rows.append(j)
    if not rows:
        raise ValueError(f"{source}, line {header + 1}: the Errors table has no rows")
    return _Table(lines, rows)


def _message(cell: str, source: str, line_no: int) -> str:
    cell = _ANCHOR_SPAN.sub("", cell)
    m = re.search(r"(`+)(.+?)\1", cell)
    if not m or not m.group(2).strip():
        raise ValueError(f"{source}, line {line_no}: the Errors table's first cell {cell!r} holds no "
                         f"backquoted message")
    return m.group(2).strip()


def slug(message: str) -> str:
    """`message` as an id's tail: ASCII, lowercase, words joined by hyphens, at most SLUG_MAX
    characters (cut at a word's end): `Expected all tensors to be on the same device` gives
    `expected-all-tensors-to-be-on-the-same-device`, and `can't optimize` gives `cant-optimize`."""
    text = re.sub(r"['\u2018\u2019]", "", message)          # can't -> cant, not can-t
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii").lower()
    text = re.sub(r"[^a-z0-9]+", "-", text).strip("-")
    if len(text) > SLUG_MAX:
        cut = text[:SLUG_MAX + 1]
        text = cut[:cut.rfind("-")] if "-" in cut else text[:SLUG_MAX]
    return text


def plain_text(cell: str) -> str:
    """A table cell's markdown as the text a reader sees: links become their text, code and
    emphasis marks and HTML tags are dropped."""
    text = _ANCHOR_SPAN.sub("", cell)
    text = _MD_LINK.sub(lambda m: m.group(1), text)
    text = _HTML_LINK.sub(lambda m: m.group(2), text)
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"(`+)(.+?)\1", lambda m: m.group(2), text)
    text = re.sub(r"(\*\*|__|\*)(\S(?:.*?\S)?)\1", lambda m: m.group(2), text)
    return re.sub(r"\s+", " ", text.replace("\\|", "|")).strip()


def error_rows(markdown: str, source: str = "CHEATSHEET.md") -> list[ErrorRow]:
    """The rows of the cheat sheet's Errors table, in order (see `_find_table` for how it is
    found). `source` names the file in the errors: a ValueError says what is missing (no
    Errors section or table, a row without a backquoted message). Reads a sheet that
    `anchor_error_rows` already anchored the same way (the anchors are made again, equal)."""
    table = _find_table(markdown, source)
    rows, used = [], set()
    for j in table.rows:
        cells = _cells(table.lines[j])
        if len(cells) < 2:
            raise ValueError(f"{source}, line {j + 1}: an Errors table row with {len(cells)} cell(s)")
        message = _message(cells[0], source, j + 1)
        base = "error-" + (slug(message) or f"row-{len(rows) + 1}")
        anchor, n = base, 2
        while anchor in used:
            anchor, n = f"{base}-{n}", n + 1
        used.add(anchor)
        last = cells[-1] if len(cells) >= 3 else ""
        links = [(m.group(1), m.group(2)) for m in _MD_LINK.finditer(last)] + \
            [(m.group(2), m.group(1)) for m in _HTML_LINK.finditer(last)]
        rows.append(ErrorRow(message, anchor, tuple(t for _, t in links), plain_text(cells[1]),
                             tuple(plain_text(label) for label, _ in links)))
    return rows


def anchor_error_rows(markdown: str, source: str = "CHEATSHEET.md") -> str:
    """`markdown` with an anchor at the start of each Errors row's first cell:
    `<span id="error-..." class="course-error-anchor"></span>`. Myst renders inline HTML in
    a table cell as the HTML itself (a raw node), so the built page has an element with that
    id inside the row, and a search result can link to the row. Nothing else changes; running
    it twice gives the same text (an existing anchor is replaced)."""
    table = _find_table(markdown, source)
    lines = list(table.lines)
    for j, row in zip(table.rows, error_rows(markdown, source)):
        line = lines[j]
        indent = line[:len(line) - len(line.lstrip())]
        body = line.lstrip()[1:]                       # after the row's leading "|"
        first = len(body) - len(body.lstrip())
        rest = _ANCHOR_SPAN.sub("", body[first:])
        lines[j] = f'{indent}| <span id="{row.anchor}" class="{ANCHOR_CLASS}"></span>{rest}'
    return "\n".join(lines)


def html_url(target: str, page: str) -> str:
    """A link target of the staged markdown `page` as a URL relative to the site's root, with
    the suffix the built page has: `course/08_troubleshooting.ipynb` in CHEATSHEET.md gives
    `course/08_troubleshooting.html` (a fragment is kept, a URL with a scheme left as it is)."""
    if _SCHEME.match(target):
        return target
    path, hash_, fragment = target.partition("#")
    if path:
        path = posixpath.normpath(posixpath.join(posixpath.dirname(page), path))
        stem, ext = posixpath.splitext(path)
        if ext in (".md", ".ipynb", ".rst"):
            path = stem + ".html"
    else:
        path = posixpath.splitext(page)[0] + ".html"
    return path + hash_ + fragment


def error_index(rows: list[ErrorRow], page: str) -> list[dict]:
    """The search page's error index (JSON-ready): for each row, its message, anchor, the URL
    of the row (`CHEATSHEET.html#error-...`), its cause and the sections that explain it
    (`{"label": "08 §4", "url": "course/08_troubleshooting.html#4-a-debugging-routine"}`), every
    URL relative to the edition's root (the script resolves them against its own `_static/`'s
    parent). `page`: the staged markdown path of the page that shows the rows
    ("CHEATSHEET.md")."""
    page_html = html_url(posixpath.basename(page), page).partition("#")[0]
    return [{"message": r.message, "anchor": r.anchor, "url": f"{page_html}#{r.anchor}", "cause": r.cause,
             "chapters": [{"label": label, "url": html_url(c, page)}
                          for label, c in zip(r.labels or r.chapters, r.chapters)]} for r in rows]


def write_error_index(html_dir: Path, markdown: str, page: str = "CHEATSHEET.md",
                      source: str | None = None) -> Path:
    """Write `INDEX_FILE` into the built edition `html_dir` (the site's root, or its zh/) from
    the cheat sheet's markdown as staged, and return its path. Call it after Sphinx built the
    edition (Sphinx's copy of website/_static/ would not replace it, but a clean rebuild
    empties the folder)."""
    path = Path(html_dir) / INDEX_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    entries = error_index(error_rows(markdown, source or page), page)
    path.write_text(json.dumps(entries, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return path
