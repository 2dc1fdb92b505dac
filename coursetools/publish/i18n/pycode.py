"""The translatable words in a code cell: its comments and its docstrings. Nothing else
of the code changes (tests/publish/test_i18n.py compares the syntax trees, docstrings aside).

A run of full-line comments at one indentation is one msgid (the comment lines joined,
without their `# `), a comment after code is one msgid, a docstring's text (less its
indentation) is one msgid. Comments that steer tools (`# noqa`, `# type:`, nbgrader's
`### BEGIN SOLUTION`, `# YOUR CODE HERE`) and comments without words stay as they are.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass

KEEP_COMMENT = re.compile(r"^#+\s*(noqa|type:|pragma|fmt:|NBVAL|YOUR CODE HERE|(BEGIN|END) (SOLUTION|HIDDEN TESTS)|!)",
                          re.IGNORECASE)


@dataclass
class Piece:
    """Characters [start, end) of the source (offsets), their msgid, and how to put a
    translation back: `kind` is "comment", "comment-after" or "docstring"."""
    start: int
    end: int
    kind: str
    msgid: str
    indent: str = ""
    prefix: str = ""  # a docstring's opening quotes (and string prefix)
    suffix: str = ""  # its whitespace and closing quotes


def _mask_magics(source: str) -> str:
    """IPython's `%magic` and `!shell` lines blanked (same length), so Python can read the rest."""
    return "\n".join(" " * len(line) if line.lstrip().startswith(("%", "!")) else line
                     for line in source.split("\n"))


def _offsets(source: str) -> list[int]:
    starts, pos = [], 0
    for line in source.split("\n"):
        starts.append(pos)
        pos += len(line) + 1
    return starts


def _comment_text(token: str) -> str:
    return re.sub(r"^#\s?", "", token)


def comments(source: str) -> list[Piece]:
    masked = _mask_magics(source)
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(masked).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return []
    starts = _offsets(source)
    lines = source.split("\n")
    pieces: list[Piece] = []
    run: list[tokenize.TokenInfo] = []

    def close_run() -> None:
        if not run:
            return
        first, last = run[0], run[-1]
        text = "\n".join(_comment_text(t.string) for t in run)
        start = starts[first.start[0] - 1] + first.start[1]
        end = starts[last.end[0] - 1] + last.end[1]
        pieces.append(Piece(start, end, "comment", text, indent=" " * first.start[1]))
        run.clear()

    for tok in tokens:
        if tok.type != tokenize.COMMENT:
            if tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
                close_run()
            continue
        row, col = tok.start
        wordy = re.search(r"[A-Za-z]{2,}", tok.string) and not KEEP_COMMENT.match(tok.string)
        full_line = not lines[row - 1][:col].strip()
        if not wordy:
            close_run()
            continue
        if full_line:
            if run and (run[-1].start[1] != col or run[-1].start[0] != row - 1):
                close_run()
            run.append(tok)
        else:
            close_run()
            start = starts[row - 1] + col
            pieces.append(Piece(start, start + len(tok.string), "comment-after", _comment_text(tok.string)))
    close_run()
    return pieces


def docstrings(source: str) -> list[Piece]:
    """The docstrings of the functions and classes a cell defines (and of the cell itself)."""
    masked = _mask_magics(source)
    try:
        tree = ast.parse(masked)
    except SyntaxError:
        return []
    starts = _offsets(source)
    lines = source.split("\n")

    def offset(lineno: int, col: int) -> int:
        # ast's columns count UTF-8 bytes, `starts` characters: a docstring on a line with a
        # non-ASCII character (a "§", Chinese) would otherwise be cut in the wrong place
        return starts[lineno - 1] + len(lines[lineno - 1].encode("utf-8")[:col].decode("utf-8", "replace"))

    pieces = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        body = node.body
        if not (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            continue
        value = body[0].value
        start = offset(value.lineno, value.col_offset)
        end = offset(value.end_lineno, value.end_col_offset)
        literal = source[start:end]
        match = re.match(r'^([rRuU]?("""|\'\'\'|"|\'))(.*)(\2)$', literal, re.S)
        if not match:
            continue  # an implicitly joined or f-string: left alone
        opening, inner = match.group(1), match.group(3)
        lead = re.match(r"\s*", inner).group(0)
        trail = re.search(r"\s*$", inner).group(0)
        core = inner[len(lead):len(inner) - len(trail)] if trail else inner[len(lead):]
        if not re.search(r"[A-Za-z]{2,}", core):
            continue
        core_lines = core.split("\n")
        rest = [line for line in core_lines[1:] if line.strip()]
        indent = min((len(line) - len(line.lstrip()) for line in rest), default=0)
        msgid = "\n".join([core_lines[0]] + [line[indent:] for line in core_lines[1:]])
        pieces.append(Piece(start, end, "docstring", msgid, indent=" " * indent,
                            prefix=opening + lead, suffix=trail + match.group(4)))
    return pieces


def pieces(source: str) -> list[Piece]:
    """Every translatable piece of a code cell, in source order, none overlapping."""
    found = sorted(comments(source) + docstrings(source), key=lambda p: p.start)
    out: list[Piece] = []
    for piece in found:
        if out and piece.start < out[-1].end:
            continue
        out.append(piece)
    return out


def render(piece: Piece, translation: str) -> str:
    """The source text that replaces `piece` when it is translated as `translation`."""
    lines = translation.split("\n")
    if piece.kind == "comment":
        return ("\n" + piece.indent).join(("# " + line).rstrip() for line in lines)
    if piece.kind == "comment-after":
        return "# " + " ".join(line.strip() for line in lines)
    body = "\n".join([lines[0]] + [(piece.indent + line) if line.strip() else "" for line in lines[1:]])
    return piece.prefix + body + piece.suffix


def translate(source: str, lookup) -> tuple[str, list[tuple[Piece, bool]]]:
    """The cell with every piece `lookup(kind, msgid)` translates replaced; with each piece and
    whether it was translated."""
    out, pos, seen = [], 0, []
    for piece in pieces(source):
        translation = lookup(piece.kind, piece.msgid)
        out.append(source[pos:piece.start])
        out.append(render(piece, translation) if translation else source[piece.start:piece.end])
        pos = piece.end
        seen.append((piece, bool(translation)))
    out.append(source[pos:])
    return "".join(out), seen


def without_words(source: str) -> str:
    """The cell's syntax tree with docstrings blanked (comments are not in it): two cells
    with the same result are the same code."""
    tree = ast.parse(_mask_magics(source))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                body[0].value.value = ""
    return ast.dump(tree, include_attributes=False)


def magic_lines(source: str) -> list[str]:
    return [line for line in source.split("\n") if line.lstrip().startswith(("%", "!"))]
