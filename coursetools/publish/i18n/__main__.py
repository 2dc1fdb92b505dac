"""`python3 make.py i18n`: the Chinese edition, kept in step with the English one.

    python3 make.py i18n update          the English text into the PO files: new text comes in
                                         untranslated, changed text is marked fuzzy (with the old
                                         English beside it), translations are never thrown away
    python3 make.py i18n build           the PO files into the Chinese notebooks and documents
                                         (zh/, README.zh-CN.md); run it after every change to
                                         an English master or a PO file, and commit the result
    python3 make.py i18n check           change nothing; exit 1 when a generated file is out of
                                         step, or a translation breaks a rule (tags, links, code,
                                         the seed posts' quotes, the glossary)
    python3 make.py i18n coverage        entries, translated, fuzzy and missing per file
    python3 make.py i18n add PATH ...    put another notebook or document into the edition
                                         (e.g. course/05_mixed_precision.ipynb): makes its PO file

A translator edits only the msgstr lines of locale/zh_CN/**/*.po (Poedit, Weblate or
Crowdin open them; keep code spans, HTML tags and link targets; remove the `fuzzy` flag once
the translation matches the new English), then runs `update`, `build` and `check`.
"""

from __future__ import annotations

import argparse
import ast
import sys
import time
from pathlib import Path

from coursetools import layout
from coursetools.publish.i18n import MESSAGES, TOOL_MODULES, build, catalog, checks, testmessages


def tool_templates(root: Path = layout.ROOT) -> list[catalog.Template]:
    """The strings the tools pass to `tr("...")` or mark with `N_("...")` (the self-check's and
    make.py lab's words)."""
    found: dict[str, catalog.Template] = {}
    for module in TOOL_MODULES:
        tree = ast.parse((root / module).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("tr", "N_")
                    and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                t = found.setdefault(node.args[0].value, catalog.Template(node.args[0].value))
                t.occurrences.append((module, str(node.lineno)))
                t.kinds.append("python-brace-format" if "{" in node.args[0].value else "message")
    for msgid, module in testmessages.grader_templates(root):
        t = found.setdefault(("grader", msgid), catalog.Template(msgid, testmessages.GRADER_CONTEXT))
        t.occurrences.append((module, ""))
        t.kinds.append("python-brace-format")
    return list(found.values())


def update(root: Path, paths: list[str], add: bool = False) -> list[str]:
    targets = [build.find_source(p, root) for p in paths] if paths else build.edition(root)
    changed = []
    shared = catalog.compendium(build.po_file(s, root) for s in build.edition(root))
    for src in targets:
        if not add and not (root / src.po).exists():
            raise SystemExit(f"error: {src.path} has no PO file yet: `python3 make.py i18n add {src.path}`")
        po = catalog.merge(build.po_file(src, root), build.templates(src, root), src.path, shared)
        if catalog.write(po, root / src.po):
            changed.append(src.po.as_posix())
    if not paths:
        po = catalog.merge(catalog.load(root / MESSAGES), tool_templates(root), ", ".join(TOOL_MODULES))
        if catalog.write(po, root / MESSAGES):
            changed.append(MESSAGES.as_posix())
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 make.py i18n", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("command", choices=("update", "build", "check", "coverage", "add"))
    parser.add_argument("paths", nargs="*", help="update/add: the English notebooks or documents "
                        "(default: every one in the edition)")
    parser.add_argument("--root", type=Path, default=layout.ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if args.command in ("update", "add"):
        if args.command == "add" and not args.paths:
            parser.error("add: name the notebooks or documents to translate")
        for path in update(root, args.paths, add=args.command == "add"):
            print(f"updated {path}")
        print("next: translate the new and fuzzy entries, then `python3 make.py i18n build`")
        return 0
    started = time.perf_counter()
    result = build.build(root)
    seconds = time.perf_counter() - started
    if args.command == "build":
        changed = build.write(result, root)
        for path in changed:
            print(f"wrote {path}")
        print(f"{len(result.outputs)} files in the Chinese edition, {len(changed)} changed "
              f"(built in {seconds:.1f} s)")
        print(build.coverage_table(build.coverage(root, result)))
        return 0
    if args.command == "coverage":
        print(build.coverage_table(build.coverage(root, result)), end="")
        return 0
    problems = checks.po_problems(root)
    seeds = checks.seeds_dir(root)
    if seeds is not None:
        problems += checks.seed_problems(result, seeds)
    differ, extra = build.stale(result, root)
    problems += [f"{path} is out of step with its English source and PO file: run "
                 "`python3 make.py i18n build`" for path in differ]
    problems += [f"{path} is made by no source: run `python3 make.py i18n build`" for path in extra]
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if not problems:
        print(f"the Chinese edition is in step ({len(result.outputs)} files); "
              + ("the seed posts' quotes checked" if seeds else "seed posts not found: their quotes not checked"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
