"""Run every notebook stand-alone on another PyTorch release.

    python3 make.py test-torch 2.9.1          a release by number
    python3 make.py test-torch lowest         the ends of the supported range (course.toml)
    python3 make.py test-torch newest
    python3 make.py test-torch 2.9.1 -k 01_device   only some notebooks (pytest -k)

Makes (or reuses) a virtual environment of its own with that release of torch and only what
Colab has besides (numpy, matplotlib, ipykernel, setuptools), then runs the stand-alone test
(tests/evidence/test_standalone.py: each lesson, and each exercise with the reference answers filled
in, alone in a kernel of that environment; an error, a line on stderr or a deprecation
warning fails it) and prints a table. No GPU is needed: the default Linux wheels are CUDA
builds and run on the CPU. It says how much it will download before it downloads.

The environments live outside the repository, so every clone (CI's included) reuses them:
`$COURSE_TORCH_VENVS/<release>`, by default `~/.cache/pytorch-devices-course/torch/<release>`.
Exit status: 0 every notebook passed, 1 some failed, 2 the release could not be installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from coursetools import layout

# What Colab has besides torch that the notebooks (and their kernel) need. setuptools: on
# torch < 2.11 `torch.utils.benchmark` imports it, and Colab has it.
COMPANIONS = ("numpy", "matplotlib", "ipykernel", "setuptools")
STAMP = ".course-torch-env.json"
VENVS_ENV = "COURSE_TORCH_VENVS"


def venvs_root() -> Path:
    if os.environ.get(VENVS_ENV):
        return Path(os.environ[VENVS_ENV])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "pytorch-devices-course" / "torch"


def resolve(release: str) -> str:
    """"lowest"/"newest"/"tested" (course.toml) or a release number such as "2.9.1"."""
    cfg = layout.config()
    named = {"lowest": cfg.torch_lowest, "newest": cfg.torch_newest, "tested": cfg.tested_torch}
    version = named.get(release, release)
    try:
        Version(version)
    except InvalidVersion:
        raise SystemExit(f"error: {release!r} is not a PyTorch release (e.g. 2.9.1) nor one of "
                         f"{', '.join(named)}") from None
    return version


def _python(root: Path) -> Path:
    return root / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _pip_env() -> dict[str, str]:
    """pip's environment for an explicitly asked release: a machine-wide constraint file (some
    machines cap torch) would refuse it, so constraints are pointed at an empty file."""
    empty = Path(tempfile.gettempdir()) / "course-no-constraints.txt"
    empty.write_text("")
    return {**os.environ, "PIP_CONSTRAINT": str(empty), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def _url_size(url: str) -> int | None:
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "file":
        path = Path(urllib.request.url2pathname(parsed.path))
        return path.stat().st_size if path.exists() else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=30) as reply:
            return int(reply.headers.get("Content-Length") or 0) or None
    except (OSError, ValueError):
        return None


def download_plan(python: Path, specs: list[str]) -> tuple[int, int, int]:
    """(packages, bytes to download, packages whose size is unknown): what pip would fetch
    for `specs` in the environment of `python`, asked of pip without installing anything."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        result = subprocess.run(
            [str(python), "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report), *specs],
            capture_output=True, text=True, env=_pip_env())
        if result.returncode != 0:
            raise SystemExit(f"error: pip cannot install {' '.join(specs)}:\n{result.stderr.strip()[-2000:]}")
        items = json.loads(report.read_text()).get("install", [])
    sizes = [_url_size(item.get("download_info", {}).get("url", "")) for item in items]
    return len(items), sum(s for s in sizes if s), sum(1 for s in sizes if s is None)


def ensure_venv(version: str) -> Path:
    """The environment for `version`, made on first use; its Python."""
    root = venvs_root() / version
    python = _python(root)
    # The companions at the versions the suite is tested with (requirements-lock.txt, which
    # pins no torch): an upstream release cannot break this run either.
    lock = layout.ROOT / "requirements-lock.txt"
    specs = [f"torch=={version}", *COMPANIONS, *(["-c", str(lock)] if lock.exists() else [])]
    lock_digest = hashlib.sha256(lock.read_bytes()).hexdigest() if lock.exists() else ""
    stamp = root / STAMP
    if (python.exists() and stamp.exists() and json.loads(stamp.read_text()).get("specs") == specs
            and json.loads(stamp.read_text()).get("lock", "") == lock_digest):
        print(f"Reusing the torch {version} environment in {root}", flush=True)
        return python
    print(f"Making a virtual environment for torch {version} in {root}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(root)], check=True)
    count, size, unknown = download_plan(python, specs)
    more = f" (and {unknown} of unknown size)" if unknown else ""
    print(f"pip will download {count} packages, {size / 1e9:.2f} GB{more}: torch {version} and "
          f"{', '.join(COMPANIONS)}. A CUDA build of torch takes 5-7 GB on disk once installed; "
          "this takes a few minutes.", flush=True)
    start = time.perf_counter()
    result = subprocess.run([str(python), "-m", "pip", "install", "--quiet", *specs], env=_pip_env())
    if result.returncode != 0:
        raise SystemExit(2)
    stamp.write_text(json.dumps({"specs": specs, "lock": lock_digest, "download_bytes": size,
                                 "install_seconds": round(time.perf_counter() - start, 1)}, indent=1))
    print(f"Installed in {time.perf_counter() - start:.0f} s", flush=True)
    return python


def table(times_file: Path) -> tuple[list[str], int, int]:
    """Lines of a table from the stand-alone test's times file; (lines, passed, total)."""
    data = json.loads(times_file.read_text())
    rows = data["notebooks"]
    lines = [f"{'result':6} {'seconds':>7}  notebook", "-" * 72]
    for r in rows:
        lines.append(f"{'pass' if r['passed'] else 'FAIL':6} {r['seconds']:7.1f}  {r['notebook']}")
        if not r["passed"] and r.get("problem"):
            lines.append(f"{'':16}{r['problem'][:200]}")
    passed = sum(r["passed"] for r in rows)
    return lines, passed, len(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make.py test-torch", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("release", nargs="+",
                        help="a release (2.9.1) or lowest / newest / tested (course.toml); several with --prepare")
    parser.add_argument("-k", dest="keyword", help="only the notebooks this pytest -k expression selects")
    parser.add_argument("--prepare", action="store_true",
                        help="only make (or reuse) each release's environment, run nothing: CI fetches "
                             "them while the suite runs")
    args = parser.parse_args(argv)
    if args.prepare:
        for release in args.release:
            start = time.perf_counter()
            ensure_venv(resolve(release))
            print(f"torch {resolve(release)}: environment ready after {time.perf_counter() - start:.0f} s", flush=True)
        return 0
    if len(args.release) != 1:
        parser.error("one release at a time (several only with --prepare)")
    version = resolve(args.release[0])
    cfg = layout.config()
    inside = Version(version) in SpecifierSet(cfg.torch_supported)
    print(f"torch {version}: {'inside' if inside else 'OUTSIDE'} the supported range "
          f"{cfg.torch_span()} (course.toml)", flush=True)
    python = ensure_venv(version)

    times_file = layout.ROOT / "test-artifacts" / f"notebook-times-torch-{version}.json"
    times_file.parent.mkdir(exist_ok=True)
    times_file.unlink(missing_ok=True)
    keyword = "test_notebook_runs_alone_like_in_colab" + (f" and ({args.keyword})" if args.keyword else "")
    cmd = [sys.executable, "-m", "pytest", "tests/evidence/test_standalone.py", "-k", keyword,
           "-p", "no:cacheprovider", "-q", "--no-header", "-rN", "--durations=0"]
    env = {**layout.env_with_course_tools(), "COURSE_COLAB_PYTHON": str(python),
           "COURSE_TIMES_FILE": str(times_file)}
    start = time.perf_counter()
    print("+", " ".join(cmd), flush=True)
    code = subprocess.run(cmd, cwd=layout.ROOT, env=env).returncode
    seconds = time.perf_counter() - start
    if not times_file.exists():
        print(f"error: the stand-alone test ran no notebook (pytest exit {code})", file=sys.stderr)
        return 2 if code not in (0, 1) else 1
    lines, passed, total = table(times_file)
    print(f"\nEvery notebook alone on torch {version} ({times_file.relative_to(layout.ROOT)}):")
    print("\n".join(lines))
    print(f"{passed}/{total} notebooks passed on torch {version} in {seconds:.0f} s")
    return 0 if passed == total and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
