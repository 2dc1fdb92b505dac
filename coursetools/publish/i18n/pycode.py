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


def _char_offset(source: str):
    """(line, column) of an ast node in `source` -> its character offset. ast's columns count
    UTF-8 bytes: a piece on a line with a non-ASCII character (a "§", Chinese) would otherwise
    be cut in the wrong place."""
    starts = _offsets(source)
    lines = source.split("\n")

    def offset(lineno: int, col: int) -> int:
        return starts[lineno - 1] + len(lines[lineno - 1].encode("utf-8")[:col].decode("utf-8", "replace"))

    return offset


def docstrings(source: str) -> list[Piece]:
    """The docstrings of the functions and classes a cell defines (and of the cell itself)."""
    masked = _mask_magics(source)
    try:
        tree = ast.parse(masked)
    except SyntaxError:
        return []
    offset = _char_offset(source)

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


# --------------------------------------------------------------------------- what the code says

# The words a cell *says* when it runs, as opposed to what it computes: the lines it prints
# for the reader (a verdict, a summary, the setup cell's "No GPU found"), a test's failure
# message, the hint handed to the tests' helpers, the fix a test gives. In the Chinese
# edition these string literals are Chinese; everything else of the code stays the English
# program (`without_said` is what the edition's check and the site's same_code compare).
HINTED_CALLS = {"fix_hint": (0,), "call_answer": (1, 2), "expect_error": (2,)}  # testmessages.HINTED_CALLS
COLAB_PREFIX = "https://colab.research.google.com/github/"


def _is_string(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str))


def _outer_strings(node: ast.AST) -> list[ast.AST]:
    """The outermost string literals in an expression (an f-string's fields stay code)."""
    if _is_string(node):
        return [node]
    if isinstance(node, (ast.Lambda, ast.ListComp, ast.GeneratorExp, ast.DictComp, ast.SetComp)):
        return []
    if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in HINTED_CALLS):
        return []  # an argument of another call is code (a device name, a key)
    found = []
    for child in ast.iter_child_nodes(node):
        found += _outer_strings(child)
    return found


def _is_program(node: ast.AST) -> bool:
    """A string that holds code (a script the helpers write to a file), not words to read."""
    text = node.value if isinstance(node, ast.Constant) else "".join(
        v.value for v in node.values if isinstance(v, ast.Constant))
    return "\n" in text.strip() and bool(re.search(r"^\s*(def |import |from \w+ import |\w+ = )", text, re.M))


def _call_name(func: ast.AST) -> str | None:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def said_nodes(tree: ast.AST, data: bool = False, messages: bool = True) -> list[ast.AST]:
    """The string literals a cell says (found by where they stand, never by their words, so
    that the English and the Chinese cell give the same list): print() arguments, assert and
    raise messages, the hint (and fix) arguments of HINTED_CALLS, what fix_hint returns; with
    `data`, also the strings of a literal table bound to a name at the top of the cell
    (lesson 08's INDEX) and a Colab address. Without `messages`, print() arguments and Colab
    addresses only: a lesson's own raise and assert messages are code a later cell may match
    (lesson 08's tracer words its errors as PyTorch does, and find_lesson() looks them up)."""
    found: list[ast.AST] = []

    def add(nodes):
        for n in nodes:
            if all(n is not f for f in found) and not _is_program(n):
                found.append(n)

    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and _call_name(node.func) == "print"
                and not any(k.arg == "file" for k in node.keywords)):  # print(..., file=x): the program's, not the reader's
            for arg in node.args:
                add(_outer_strings(arg))
        elif not messages:
            pass
        elif isinstance(node, ast.Assert) and node.msg is not None:
            add(_outer_strings(node.msg))
        elif isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            for arg in node.exc.args:
                add(_outer_strings(arg))
        if messages and isinstance(node, ast.Call) and _call_name(node.func) in HINTED_CALLS:
            for index in HINTED_CALLS[_call_name(node.func)]:
                if len(node.args) > index:
                    add(_outer_strings(node.args[index]))
        if messages and isinstance(node, ast.FunctionDef) and node.name == "fix_hint":
            for inner in ast.walk(node):
                if isinstance(inner, ast.Return) and inner.value is not None:
                    add(_outer_strings(inner.value))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(COLAB_PREFIX):
            add([node])
    if messages and isinstance(tree, ast.Module):  # SCALAR_HINT = "...": a piece of a test's messages
        for stmt in tree.body:
            if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                    and stmt.targets[0].id.isupper() and _is_string(stmt.value)):
                add([stmt.value])
    if data and isinstance(tree, ast.Module):
        for stmt in tree.body:
            if isinstance(stmt, ast.Assign) and isinstance(stmt.value, (ast.List, ast.Tuple)):
                for inner in ast.walk(stmt.value):
                    if isinstance(inner, ast.Constant) and isinstance(inner.value, str) and len(inner.value.split()) > 2:
                        add([inner])
    return sorted(found, key=lambda n: (n.lineno, n.col_offset))


def literal_text(node: ast.AST) -> str:
    """A string literal as a template: its text, literal braces doubled, an f-string's fields
    as {holes} (coursetools/publish/i18n/testmessages.py's msgid syntax)."""
    if isinstance(node, ast.Constant):
        return node.value.replace("{", "{{").replace("}", "}}")
    out = []
    for value in node.values:
        if isinstance(value, ast.Constant):
            out.append(value.value.replace("{", "{{").replace("}", "}}"))
        else:
            segment = ast.unparse(value.value)
            if value.conversion != -1:
                segment += "!" + chr(value.conversion)
            if value.format_spec is not None:
                segment += ":" + "".join(v.value if isinstance(v, ast.Constant) else "{" + ast.unparse(v.value) + "}"
                                         for v in value.format_spec.values)
            out.append("{ " + segment + " }" if segment.startswith("{") else "{" + segment + "}")
    return "".join(out)


_FIELD = re.compile(r"\{\{|\}\}|\{((?:[^{}]|\{[^{}]*\})*)\}")


def _fields(template: str) -> list[str]:
    return [m.group(1).strip() for m in _FIELD.finditer(template) if m.group(0) not in ("{{", "}}")]


def render_literal(node: ast.AST, english: str, translation: str) -> str | None:
    """Python source for the string literal `node` saying `translation` (a template with the
    English template's holes), or None when it cannot (a hole the English lacks)."""
    lead = re.match(r"\s*", english).group(0)
    trail = re.search(r"\s*$", english).group(0) if english.strip() else ""
    translation = translation.strip()
    translation = (lead if not translation.startswith(lead) else "") + translation
    translation = translation + (trail if not translation.endswith(trail) else "")
    if sorted(_fields(translation)) != sorted(_fields(english)):
        return None
    if not _fields(english):
        text = translation.replace("{{", "{").replace("}}", "}")
        return json_string(text)
    out, pos = [], 0
    for match in _FIELD.finditer(translation):
        out.append(_escape(translation[pos:match.start()]))
        out.append(match.group(0))
        pos = match.end()
    out.append(_escape(translation[pos:]))
    body = "".join(out)
    for quote in ('"', "'"):
        if any(quote in f for f in _fields(english)):
            continue  # before Python 3.12 a field may not hold the f-string's own quote
        candidate = "f" + quote + _requote(body, quote) + quote
        try:
            parsed = ast.parse(candidate, mode="eval").body
        except SyntaxError:
            continue
        if isinstance(parsed, ast.JoinedStr):
            return candidate
    return None


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")


def _requote(body: str, quote: str) -> str:
    """Escape `quote` in the literal parts of an f-string body (fields hold none of it)."""
    out, pos = [], 0
    for match in _FIELD.finditer(body):
        out.append(body[pos:match.start()].replace(quote, "\\" + quote))
        out.append(match.group(0))
        pos = match.end()
    out.append(body[pos:].replace(quote, "\\" + quote))
    return "".join(out)


def json_string(text: str) -> str:
    """A plain Python string literal for `text`, double-quoted where it can be."""
    literal = repr(text)
    if literal.startswith("'") and '"' not in text:
        literal = '"' + literal[1:-1].replace("\\'", "'") + '"'
    return literal


def said(source: str, data: bool = False, messages: bool = True) -> list[Piece]:
    """The string literals of said_nodes() as pieces (kind "literal", msgid literal_text)."""
    masked = _mask_magics(source)
    try:
        tree = ast.parse(masked)
    except SyntaxError:
        return []
    offset = _char_offset(source)

    out = []
    for node in said_nodes(tree, data, messages):
        out.append(Piece(offset(node.lineno, node.col_offset), offset(node.end_lineno, node.end_col_offset),
                         "literal", literal_text(node)))
        out[-1].node = node  # type: ignore[attr-defined]
    return out


def translate_said(source: str, lookup, data: bool = False, messages: bool = True) -> tuple[str, list[tuple[Piece, bool]]]:
    """The cell with every string literal it says that `lookup(msgid)` translates replaced by
    the Chinese literal; with each piece and whether it was translated."""
    out, pos, seen = [], 0, []
    for piece in said(source, data, messages):
        translation = lookup(piece.msgid)
        literal = render_literal(piece.node, piece.msgid, translation) if translation else None  # type: ignore[attr-defined]
        out.append(source[pos:piece.start])
        out.append(literal if literal else source[piece.start:piece.end])
        pos = piece.end
        seen.append((piece, bool(literal)))
    out.append(source[pos:])
    return "".join(out), seen


def _walk_code(tree: ast.AST):
    """ast.walk that does not go into an f-string (its parts differ between languages)."""
    todo = [tree]
    while todo:
        node = todo.pop(0)
        yield node
        if not isinstance(node, ast.JoinedStr):
            todo.extend(ast.iter_child_nodes(node))


def without_said(source: str, data: bool = False, messages: bool = True, english: str | None = None) -> str:
    """without_words, the said string literals blanked too: the program an edition's cell runs.
    An f-string keeps its fields, in any order (Chinese puts its words elsewhere). With
    `english` (the English cell), the literals blanked are the ones at the places the English
    cell says something (a table's strings are chosen by their English words)."""
    tree = ast.parse(_mask_magics(source))
    if english is None:
        said_ids = {id(n) for n in said_nodes(tree, data, messages)}
    else:
        reference = ast.parse(_mask_magics(english))
        places = {id(n) for n in said_nodes(reference, data, messages)}
        wanted = {i for i, n in enumerate(_walk_code(reference)) if id(n) in places}
        said_ids = {id(n) for i, n in enumerate(_walk_code(tree)) if i in wanted}

    class Blank(ast.NodeTransformer):
        def visit_JoinedStr(self, node):
            if id(node) not in said_ids:
                return node
            fields = sorted((v for v in node.values if not isinstance(v, ast.Constant)), key=ast.dump)
            return ast.JoinedStr(values=fields) if fields else ast.Constant("")

        def visit_Constant(self, node):
            return ast.Constant("") if id(node) in said_ids else node

    return without_words(ast.unparse(Blank().visit(tree)))
