"""Start a new chapter from the course's template.

    python3 make.py new-chapter 09_sparse_tensors "Sparse tensors on every device"

Writes a lesson (course/), an nbgrader source with one example question, visible and
hidden tests (solutions/), one wrong and one alternative fixture (tests/submissions/),
releases it, and adds it to README's course map. Every file already passes the test suite:
replace the example with your chapter, following docs/AUTHORING.md.
"""

from __future__ import annotations

import argparse
import json
import sys

import nbformat

from coursetools.author import authoring as A
from coursetools import layout
from coursetools.author import links, release

EXAMPLE_ANSWER = '''
def zeros_like_on(x, device):
    """A tensor of zeros with x's shape and dtype, created directly on `device`."""
    ### BEGIN SOLUTION
    return torch.zeros(x.shape, dtype=x.dtype, device=device)
    ### END SOLUTION
'''

EXAMPLE_TEST = '''
"""zeros_like_on: shape, dtype and device right, created on the device (no copy)."""
x = torch.ones(2, 3, dtype=torch.float64)
z = zeros_like_on(x, "meta")
assert z.shape == x.shape and z.dtype == x.dtype, f"expected {tuple(x.shape)} {x.dtype}, got {tuple(z.shape)} {z.dtype}"
assert z.is_meta, f"expected a tensor on meta, got one on {z.device}: did you create it on the CPU?"
### BEGIN HIDDEN TESTS
z = zeros_like_on(torch.ones(4, dtype=torch.int64), torch.device("cpu"))
assert z.dtype == torch.int64 and not z.any(), "integer dtypes too, and all zeros"
### END HIDDEN TESTS
'''

WRONG = """kind = "wrong"
description = "creates on the CPU: the device argument is ignored"
loses = ["test_zeros_like_on"]

[answers]
zeros_like_on = '''
def zeros_like_on(x, device):
    return torch.zeros_like(x)
'''
"""

ALTERNATIVE = """kind = "alternative"
description = "new_zeros keeps the dtype and takes the device"

[answers]
zeros_like_on = '''
def zeros_like_on(x, device):
    return x.new_zeros(x.shape, device=device)
'''
"""


def validate(path) -> None:
    """Fail loudly if a written notebook does not pass its nbformat schema (as stored)."""
    raw = nbformat.from_dict(json.loads(path.read_text(encoding="utf-8")))
    try:
        nbformat.validate(raw)
    except nbformat.ValidationError as exc:
        raise SystemExit(f"error: {path} does not validate against its nbformat schema: {exc.message}") from None


def create(name: str, title: str) -> None:
    if not layout.CHAPTER_NAME.match(name):
        raise SystemExit(f"error: {name!r} is not a chapter name like 09_sparse_tensors (NN_lowercase_words)")
    if name in layout.assignments() or (layout.COURSE_DIR / f"{name}.ipynb").exists():
        raise SystemExit(f"error: chapter {name} already exists")
    num = name[:2]
    lesson = [
        A.header(f"course/{name}.ipynb", f"{num} · {title}", goals=["TODO: what the exercise checks"],
                 minutes=30),
        A.setup_cell(),
        A.md("## 1. First idea\n\nA claim, then the cell that proves it."),
        A.code('x = torch.zeros(3, device=device)\nassert x.device.type == device.type\nprint(x.device)'),
        A.md("## Summary\n\n* ...\n\n**Next:** ..."),
    ]
    A.save(lesson, layout.COURSE_DIR / f"{name}.ipynb")
    exercise = [
        A.header(f"exercises/{name}/{name}.ipynb", f"{num} · {title}: exercises",
                 goals=["TODO"], minutes=30),
        A.setup_cell(locked=True),
        A.md("## Question 1 · `zeros_like_on` (2 points)\n\nTODO: replace with your questions (at least 4)."),
        A.answer("zeros_like_on", EXAMPLE_ANSWER),
        A.tests("test_zeros_like_on", 2, EXAMPLE_TEST),
    ]
    A.save(exercise, layout.source_notebook(name))
    fixtures_dir = layout.SUBMISSIONS_DIR / name
    fixtures_dir.mkdir(parents=True, exist_ok=True)
    (fixtures_dir / "zeros_like_on_ignores_device.toml").write_text(WRONG)
    (fixtures_dir / "zeros_like_on_new_zeros.toml").write_text(ALTERNATIVE)
    released = release.release([name])
    for path in [layout.COURSE_DIR / f"{name}.ipynb", layout.source_notebook(name), *released]:
        validate(path)
    links.fix_readme()
    print(f"created chapter {name}: course/{name}.ipynb, solutions/{name}/, exercises/{name}/, "
          f"tests/submissions/{name}/ and its row in README.md")
    print(f"next: write it (docs/AUTHORING.md), then `python3 make.py author-check {name}`")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 make.py new-chapter", description=__doc__.splitlines()[0])
    parser.add_argument("name", help="NN_topic, e.g. 09_sparse_tensors")
    parser.add_argument("title", help='e.g. "Sparse tensors on every device"')
    args = parser.parse_args(argv)
    create(args.name, args.title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
