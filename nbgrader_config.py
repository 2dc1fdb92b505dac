"""nbgrader configuration of the course: `solutions/` is the source, `exercises/` the release.

nbgrader ignores (only logs) an exception raised in this file and falls back to its
defaults, so tests/author/test_release.py loads it and checks every value below.
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
    CheckCellMetadata, ComputeChecksums, DeduplicateIds, GetGrades, IgnorePattern, IncludeHeaderFooter,
    InstantiateTests, LimitOutput, LockCells, OverwriteKernelspec, SaveAutoGrades, SaveCells,
)

from coursetools.grading.execute import CELL_TIMEOUT_S, SUBMISSION_BUDGET_S  # noqa: E402
from coursetools.instructor import exchange  # noqa: E402
from coursetools.instructor.nbgrader_ext import (  # noqa: E402
    FEEDBACK_FILTERS, FEEDBACK_TEMPLATE, ClearHiddenTestsSafely, COURSE_FEEDBACK_EXPORTER, OverwriteCellsQuietly, ResilientExecute, RestoreDeletedAnswers,
    SafeOutputs, StripFixTexts, StripSolutionsOnly, TagStubCells, feedback_template_dirs, preflight_hook,
)

c.CourseDirectory.root = _ROOT
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "exercises"
# Every student-visible cell keeps its place; locked cells are restored on grading.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
# nbgrader's default list, plus the nbval tags for the release (see TagStubCells), after the
# solutions-only regions are gone (StripSolutionsOnly: a Predict question's proof, which holds
# its answer key, stays in solutions/; neither the release nor the gradebook gets it), and
# with no fix text in the release (StripFixTexts, after SaveCells: the gradebook keeps them).
c.GenerateAssignment.preprocessors = [
    StripSolutionsOnly, IncludeHeaderFooter, InstantiateTests, LockCells, ClearSolutions, ClearOutput,
    CheckCellMetadata, ComputeChecksums, SaveCells, ClearHiddenTests, StripFixTexts, ClearMarkScheme,
    ComputeChecksums, CheckCellMetadata, TagStubCells,
]
# A deleted test cell comes back from the gradebook instead of leaving a hole (nbgrader's
# OverwriteCells, quiet about test cells that arrive as released: OverwriteCellsQuietly); a
# deleted answer cell comes back empty (RestoreDeletedAnswers). See nbgrader_ext.py.
c.OverwriteCells.add_missing_cells = True
c.Autograde.sanitize_preprocessors = [
    ClearOutput, DeduplicateIds, OverwriteKernelspec, OverwriteCellsQuietly, RestoreDeletedAnswers,
    CheckCellMetadata,
]

# Autograding: nbgrader's steps, with Execute replaced by ResilientExecute (a crash or a
# hang costs one cell, not the notebook; the kernel runs sandboxed; a test's result comes
# from the kernel protocol, with tamper checks around it, and its outputs become the
# grader's verdict; hidden tests reach the kernel compiled). See coursetools/instructor/nbgrader_ext.py.
c.Autograde.autograde_preprocessors = [
    ResilientExecute, IgnorePattern, ClearMetadataPreprocessor, LimitOutput, SaveAutoGrades,
    AssignLatePenalties, CheckCellMetadata,
]
# Per-cell limit and per-submission budget: one place, coursetools/grading/execute.py (the
# self-check uses the same limit). Chapter 06's graded cell launches 2 processes (up to
# 42 s seen on a loaded 2-core machine); the budget is 5 cell limits for a whole notebook.
c.ResilientExecute.timeout = CELL_TIMEOUT_S
c.ResilientExecute.budget = SUBMISSION_BUDGET_S
# "auto": bubblewrap where it works, otherwise no sandbox (with a warning in the log).
# Set "bwrap" to refuse grading without the sandbox.
c.ResilientExecute.sandbox = "auto"
c.ResilientExecute.memory_mb = 4096
# The sandbox shows the kernel only the system folders, its Python (venv, installation,
# import path) and its working folder. A folder the kernel needs besides (data the notebooks
# read from an absolute path, a library outside the venv) is listed here, read-only:
# c.ResilientExecute.expose = ["/srv/course-data"]
# Before the first submission, start one kernel as grading will and stop the whole run with
# one message if it cannot start (README, "When grading stops before the first submission").
c.Autograde.pre_convert_hook = preflight_hook

# Feedback shows the visible tests only: hidden tests' source is cleared (nbgrader's
# default feedback would show it), without failing on a student cell that merely contains
# the markers (nbgrader's ClearHiddenTests raises there, and that student gets no feedback).
# Feedback HTML runs nothing: output kinds that can carry script are dropped (SafeOutputs),
# and HTML/Markdown from students goes through nbconvert's sanitizer.
c.GenerateFeedback.preprocessors = [GetGrades, CSSHTMLHeaderPreprocessor, ClearHiddenTestsSafely, SafeOutputs]
c.HTMLExporter.sanitize_html = True
# ... and loads nothing from elsewhere: nbgrader's feedback template would fetch MathJax from
# a CDN in every page; the course's template folder, searched first, makes that macro empty.
c.HTMLExporter.extra_template_basedirs = feedback_template_dirs()
# The course's feedback page (nbgrader's, usable on a phone; templates/course_feedback), for
# nbgrader's own generate_feedback and Formgrader's button as for grade-class; the setting is the
# exporter's own, so Formgrader's grading pages keep their 'formgrade' template.
c.GenerateFeedback.exporter_class = COURSE_FEEDBACK_EXPORTER
c.CourseFeedbackExporter.template_name = FEEDBACK_TEMPLATE
# HTML in feedback goes through the course's sanitizer (it keeps the collapsed "How to fix").
c.HTMLExporter.filters = dict(FEEDBACK_FILTERS)

# One machine: nbgrader's exchange is local-exchange/ in the course (git-ignored), so that
# release -> fetch (as a student) -> submit -> collect -> autograde work before a class
# server exists (`make.py lab --instructor` shows Formgrader's release and collect and the
# Assignments tab; `make.py lab --student NAME` is one student). On a class server whose
# global nbgrader config sets the exchange (a hub's /etc/jupyter/nbgrader_config.py,
# docs/INSTRUCTORS.md, "A class on JupyterHub"), this line sets nothing: this file is read after
# that one and would otherwise win over it.
exchange.configure(c, _ROOT)

# zip_collect: files named <student_id>__<notebook>.ipynb (e.g. from an LMS download).
c.FileNameCollectorPlugin.named_regexp = (
    r"(?:.*[/\\])?(?P<student_id>[A-Za-z0-9.-]+)__(?P<file_id>[^/\\]+\.ipynb)$")
