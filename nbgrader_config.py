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

from nbgrader.preprocessors import (  # noqa: E402
    ClearHiddenTests, ClearMarkScheme, ClearOutput, ClearSolutions, CheckCellMetadata,
    ComputeChecksums, IncludeHeaderFooter, InstantiateTests, LockCells, SaveCells,
)

from coursetools.nbgrader_ext import TagStubCells  # noqa: E402

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
# Per-cell limit while grading (a DDP launch in chapter 06 takes ~10-15 s on 2 CPUs).
c.Execute.timeout = 120
