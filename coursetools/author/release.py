"""Regenerate the student release (`exercises/`) from the nbgrader source (`solutions/`).

    python3 make.py release            # every assignment
    python3 make.py release 01_device_basics

Only nbgrader's own `generate_assignment` writes the release (with the preprocessors set in
nbgrader_config.py); nothing here edits a notebook. `--no-db` keeps the gradebook out of it
and makes the output byte-for-byte deterministic, which tests/author/test_release.py relies on.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from coursetools import layout


def nbgrader(*args: str, cwd: Path = layout.ROOT, check: bool = True) -> subprocess.CompletedProcess:
    """Run an nbgrader command with this environment's Python, from `cwd`."""
    cmd = [sys.executable, "-m", "nbgrader", *args]
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd[2:])} failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def release(names: list[str] | None = None, dest: Path | None = None) -> list[Path]:
    """Write the release of `names` (default: all) to `dest` (default: exercises/).

    Returns the released notebooks. A release folder whose source is gone is removed, so
    `exercises/` never keeps a chapter that `solutions/` dropped.
    """
    all_names = layout.assignments()
    names = names or all_names
    unknown = sorted(set(names) - set(all_names))
    if unknown:
        raise SystemExit(f"error: no assignment {', '.join(unknown)} in solutions/ "
                         f"(known: {', '.join(all_names)})")
    out_dir = (dest or layout.EXERCISES_DIR).resolve()
    extra: list[str] = []
    if dest is not None:
        extra.append(f"--CourseDirectory.release_directory={out_dir}")
    # One nbgrader process for all of them when it can (~4 s instead of ~4 s each).
    for pattern in (["*"] if sorted(names) == all_names else names):
        nbgrader("generate_assignment", pattern, "--force", "--no-db", *extra)
    if dest is None and out_dir.exists():
        for stale in out_dir.iterdir():
            if stale.is_dir() and stale.name not in all_names:
                shutil.rmtree(stale)
    return [out_dir / n / f"{n}.ipynb" for n in names]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 make.py release", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="assignments to release (default: all)")
    args = parser.parse_args(argv)
    for path in release(args.names or None):
        print(f"released {path.relative_to(layout.ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
