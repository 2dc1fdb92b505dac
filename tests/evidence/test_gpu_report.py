"""`python3 make.py gpu-report` (coursetools/evidence/gpu_report.py): the report says what ran where,
and on a machine without CUDA it still runs and says so plainly. (The notebooks it runs are
the ones tests/evidence/test_standalone.py runs; here only the report and the pytest hand-off.)"""

from __future__ import annotations

import json
import os
import threading
import time

import torch

from coursetools.evidence import gpu_report

CPU_ONLY = {"python": "3.11.7", "platform": "Linux x86_64", "cpus": 2, "torch": "2.13.0+cpu",
            "torch_cuda": None, "cudnn": None, "cuda_available": False, "devices": [],
            "driver": None, "mps_available": False}
ON_GPU = {**CPU_ONLY, "torch": "2.13.0+cu128", "torch_cuda": "12.8", "cudnn": 91000,
          "cuda_available": True, "driver": "580.1",
          "devices": [{"index": 0, "name": "NVIDIA H200", "capability": "9.0", "memory_gib": 139.8}]}
ROWS = [gpu_report.NotebookRow("course/00_start_here.ipynb", "lesson", 6.2, "cuda", True),
        gpu_report.NotebookRow("course/05_mixed_precision.ipynb", "lesson", 9.9, "cuda", False,
                               "cell 7 raised FutureWarning: torch.cuda.amp.autocast(args...) is deprecated")]


def test_report_without_cuda_says_so_plainly():
    text = gpu_report.render(CPU_ONLY, ROWS[:1], None, "2026-01-01T00:00:00", 60)
    assert "no CUDA device: this PyTorch is a CPU build" in text
    assert "**No CUDA device.**" in text and "GPU paths" in text
    assert "| course/00_start_here.ipynb | lesson | 6.2 | cuda | pass |" in text
    assert "not run (--no-tests)" in text
    cuda_build = gpu_report.device_line({**CPU_ONLY, "torch_cuda": "12.8"})
    assert "found no usable GPU" in cuda_build


def test_report_on_a_gpu_names_the_device_and_each_notebook():
    tests = gpu_report.TestSummary("python -m pytest", 1, "1 failed, 300 passed in 612.0s", 612.0,
                                   ["FAILED tests/test_x.py::test_y"], "/tmp/log")
    text = gpu_report.render(ON_GPU, ROWS, tests, "2026-01-01T00:00:00", 900)
    assert "cuda:0 NVIDIA H200 (139.8 GiB, sm 9.0); CUDA 12.8, cuDNN 91000, driver 580.1" in text
    assert "No CUDA device" not in text
    assert "## Notebooks (1/2 passed" in text
    assert "| course/05_mixed_precision.ipynb | lesson | 9.9 | cuda | **FAIL** cell 7 raised FutureWarning" in text
    assert "**FAIL** (exit 1): 1 failed, 300 passed" in text and "- FAILED tests/test_x.py::test_y" in text


def test_runs_pytest_and_records_its_summary(tmp_path):
    code = gpu_report.main(["--no-notebooks", "--require-cuda", "--out", str(tmp_path), "--",
                            "tests/test_repo.py::test_course_toml_is_complete", "-q", "-p", "no:cacheprovider"])
    report = json.loads((tmp_path / "gpu-report.json").read_text())
    assert report["tests"]["exit_code"] == 0 and "1 passed" in report["tests"]["summary"]
    assert report["cuda"] == torch.cuda.is_available()
    assert code == (0 if torch.cuda.is_available() else 1)  # --require-cuda fails without one
    text = (tmp_path / "gpu-report.md").read_text()
    assert ("No CUDA device" in text) != torch.cuda.is_available()
    assert (tmp_path / "gpu-report-pytest.log").read_text().strip()


def test_a_time_limit_stops_pytest_and_reports_what_finished(tmp_path, monkeypatch):
    """--tests-time-limit: pytest is stopped, the report says so and counts what finished.

    The limit's clock is replaced by one that fires once the endless test has started (it
    drops a marker file), so the outcome never depends on how fast or busy the machine is."""
    tests = tmp_path / "suite"
    tests.mkdir()
    marker = tmp_path / "endless-started"
    (tests / "test_slow.py").write_text(
        "import pathlib, time\n\ndef test_a_quick_one():\n    pass\n\n"
        "def test_b_fails():\n    assert False\n\n"
        f"def test_c_endless():\n    pathlib.Path({str(marker)!r}).touch()\n    time.sleep(600)\n")

    class LimitReachedWhenEndlessStarts(threading.Thread):
        """Stands in for threading.Timer(limit, stop, args): calls stop(*args) as soon as the
        marker exists (or after 600 s: the test then fails on its summary, never hangs)."""

        def __init__(self, interval, function, args=()):
            super().__init__(daemon=True)
            self.function, self.args, self.cancelled = function, args, threading.Event()

        def run(self):
            deadline = time.monotonic() + 600
            while not marker.exists() and time.monotonic() < deadline and not self.cancelled.is_set():
                time.sleep(0.1)
            if not self.cancelled.is_set():
                self.function(*self.args)

        def cancel(self):
            self.cancelled.set()

    monkeypatch.setattr(gpu_report.threading, "Timer", LimitReachedWhenEndlessStarts)
    out = tmp_path / "out"
    code = gpu_report.main(["--no-notebooks", "--tests-time-limit", "10", "--out", str(out), "--",
                            str(tests), "-v", "-p", "no:cacheprovider", "-c", os.devnull,
                            "--rootdir", str(tests)])
    report = json.loads((out / "gpu-report.json").read_text())
    summary = report["tests"]["summary"]
    assert code == 1 and report["tests"]["exit_code"] != 0
    assert summary.startswith("stopped at the 10 s limit") and "1 passed" in summary and "1 failed" in summary, summary
    # (had the limit not stopped it, pytest would have printed its own summary line instead)
    assert any("test_b_fails" in t for t in report["tests"]["failed"]), report["tests"]["failed"]


def test_record_with_prune_or_coverage_is_refused_before_anything_runs(capsys, monkeypatch):
    ran = []
    monkeypatch.setattr(gpu_report, "prune_files", lambda paths: ran.append("prune") or [])
    monkeypatch.setattr(gpu_report, "machine", lambda: ran.append("machine") or CPU_ONLY)
    for flags in (["--record", "--prune"], ["--record-any-device", "--coverage"]):
        assert gpu_report.main(flags) == 2
        err = capsys.readouterr().err
        assert "run --record on its own" in err and "Nothing was run or written" in err
    assert ran == []
