"""nbgrader configuration of the course: `solutions/` is the source, `exercises/` the release.

nbgrader ignores (only logs) an exception raised in this file and falls back to its
defaults, so tests/test_release.py loads it and checks every value below.
"""

import os
import sys

c = get_config()  # noqa: F821  (provided by traitlets when nbgrader loads this file)

_ROOT = os.path.dirname(os.path.abspath(__file__))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from nbconvert.preprocessors import ClearMetadataPreprocessor, CSSHTMLHeaderPreprocessor  # noqa: E402
from nbgrader.preprocessors import (  # noqa: E402
    AssignLatePenalties, ClearHiddenTests, ClearMarkScheme, ClearOutput, ClearSolutions,
    CheckCellMetadata, ComputeChecksums, GetGrades, IgnorePattern, IncludeHeaderFooter,
    InstantiateTests, LimitOutput, LockCells, SaveAutoGrades, SaveCells,
)

from coursetools.nbgrader_ext import ResilientExecute, TagStubCells  # noqa: E402

c.CourseDirectory.root = _ROOT
c.CourseDirectory.course_id = "pytorch-devices"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "exercises"
# Every student-visible cell keeps its place; locked cells are restored on grading.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
# nbgrader's default list, plus the nbval tags for the release (see TagStubCells).
c.GenerateAssignment.preprocessors = [
    IncludeHeaderFooter, InstantiateTests, LockCells, ClearSolutions, ClearOutput,
    CheckCellMetadata, ComputeChecksums, SaveCells, ClearHiddenTests, ClearMarkScheme,
    ComputeChecksums, CheckCellMetadata, TagStubCells,
]
# A deleted test cell comes back from the gradebook instead of leaving a hole.
c.OverwriteCells.add_missing_cells = True

# Autograding: nbgrader's steps, with Execute replaced by ResilientExecute (a crash or a
# hang costs one cell, not the notebook; the kernel runs sandboxed; tamper checks;
# hidden-test source removed from outputs). See coursetools/nbgrader_ext.py.
c.Autograde.autograde_preprocessors = [
    ResilientExecute, IgnorePattern, ClearMetadataPreprocessor, LimitOutput, SaveAutoGrades,
    AssignLatePenalties, CheckCellMetadata,
]
# Per-cell limit (a DDP launch in chapter 06 took 6-11 s on 2 CPUs in our runs).
c.ResilientExecute.timeout = 120
# "auto": bubblewrap where it works, otherwise no sandbox (with a warning in the log).
# Set "bwrap" to refuse grading without the sandbox.
c.ResilientExecute.sandbox = "auto"
c.ResilientExecute.memory_mb = 4096

# Feedback shows the visible tests only: hidden tests' source is cleared (nbgrader's
# default feedback would show it).
c.GenerateFeedback.preprocessors = [GetGrades, CSSHTMLHeaderPreprocessor, ClearHiddenTests]

# zip_collect: files named <student_id>__<notebook>.ipynb (e.g. from an LMS download).
c.FileNameCollectorPlugin.named_regexp = (
    r"(?:.*[/\\])?(?P<student_id>[A-Za-z0-9.-]+)__(?P<file_id>[^/\\]+\.ipynb)$")
