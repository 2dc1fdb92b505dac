"""nbgrader preprocessors the course adds to nbgrader's own (configured in nbgrader_config.py)."""

from __future__ import annotations

import builtins
import os
import re
import shutil
import stat
import tempfile
from typing import Tuple

from nbconvert.exporters import HTMLExporter
from nbconvert.exporters.exporter import ResourcesDict
from nbformat import v4
from nbformat.notebooknode import NotebookNode
from nbgrader import utils
from nbgrader.preprocessors import ClearHiddenTests, NbGraderPreprocessor, OverwriteCells
from traitlets import Bool, Integer, List, Unicode, default

from coursetools.grading import execute, guard, hints, review, warm
from coursetools import notebooks
from coursetools.grading.execute import (
    BUDGET_ENAME,
    CELL_TIMEOUT_S,
    SUBMISSION_BUDGET_S,
    Outcome,
    execute_resilient,
)
from coursetools.notebooks import RAISES_TAG
from coursetools.publish.i18n import cells_language, testmessages
from coursetools.grading.sandbox import (
    SandboxConfig,
    SandboxUnavailable,
    bwrap_works,
    resolve_mode,
    sandbox_env,
)


class StripSolutionsOnly(NbGraderPreprocessor):
    """Remove every `### BEGIN/END SOLUTIONS ONLY` region (notebooks.strip_solutions_only) before
    nbgrader computes checksums and saves the source cells: the release, and the gradebook
    that restores locked cells at grading, never hold it. A Predict question's proof lives there
    (its reference answers checked against what PyTorch does), so no answer key reaches a
    learner's notebook or kernel."""

    def preprocess_cell(self, cell: NotebookNode, resources: ResourcesDict,
                        cell_index: int) -> Tuple[NotebookNode, ResourcesDict]:
        if cell.cell_type == "code":
            cell.source = notebooks.strip_solutions_only(cell.source)
        return cell, resources


class StripFixTexts(NbGraderPreprocessor):
    """Turn every `fix_hint("the fix")` of the release into `fix_hint()` (notebooks.strip_fix_texts),
    after nbgrader has saved the cells in its gradebook: a learner's notebook holds no fix (its
    `fix_hint()` says where to get one), while grading restores the locked cells, and so the fix
    texts, from the gradebook (coursetools/grading/hints.py). Runs before nbgrader computes the
    release's checksums, as ClearHiddenTests does."""

    def preprocess_cell(self, cell: NotebookNode, resources: ResourcesDict,
                        cell_index: int) -> Tuple[NotebookNode, ResourcesDict]:
        if cell.cell_type == "code":
            cell.source = notebooks.strip_fix_texts(cell.source)
        return cell, resources


class TagStubCells(NbGraderPreprocessor):
    """Tag the release's answer and test cells so nbval permits their stub errors.

    An untouched release raises `NotImplementedError` in every answer cell and so fails
    every test cell; nbval must run it to the end and allow exactly those cells to raise.
    Tags are not part of nbgrader's checksums, and the tags are added to the release only:
    in `solutions/` every cell must run cleanly.
    """

    tag = Unicode(RAISES_TAG, help="The cell tag that permits an exception under nbval").tag(config=True)

    def preprocess_cell(self, cell: NotebookNode, resources: ResourcesDict,
                        cell_index: int) -> Tuple[NotebookNode, ResourcesDict]:
        if cell.cell_type == "code" and (utils.is_solution(cell) or utils.is_grade(cell)):
            tags = cell.metadata.setdefault("tags", [])
            if self.tag not in tags:
                tags.append(self.tag)
        return cell, resources


_GRADER_FRAME = re.compile(r"<grader test (?P<gid>[^>]*)>:(?P<line>\d+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Exception names shown in feedback as they are; any other name (a student's class name can
# carry any text) is shown as "Error".
_SAFE_ENAMES = {name for name, value in vars(builtins).items()
                if isinstance(value, type) and issubclass(value, BaseException)} | {
    guard.TAMPER_ENAME, BUDGET_ENAME, "CellTimeoutError", "DeadKernelError", "NotExecuted",
    "StderrWritten", "HiddenError", review.REVIEW_ENAME}
_GRADER_ENAMES = {guard.TAMPER_ENAME, BUDGET_ENAME, "CellTimeoutError", "DeadKernelError", "NotExecuted"}


def _hidden_line_numbers(source: str) -> set[int]:
    hidden, inside = set(), False
    for number, line in enumerate(source.split("\n"), start=1):
        text = line.strip()
        if text == notebooks.BEGIN_HIDDEN:
            inside = True
        elif text == notebooks.END_HIDDEN:
            inside = False
        if inside or text == notebooks.END_HIDDEN:
            hidden.add(number)
    return hidden


def _failing_line(error: NotebookNode) -> int | None:
    """The line of the test cell that raised: the innermost frame in the compiled test."""
    found = None
    for frame in error.get("traceback", []):
        for match in _GRADER_FRAME.finditer(_ANSI.sub("", frame)):
            found = int(match.group("line"))
    return found


HIDDEN_FAILED = "a hidden test failed (hidden tests are not shown)"
HIDDEN_FAILED_SAID = "a hidden test failed: "


def grader_written_outputs(cell: NotebookNode, outcome: Outcome, tampering: str | None) -> list[NotebookNode]:
    """What feedback shows for a test cell: the grader's verdict, never the outputs the
    test produced (hidden tests ran there: anything they printed or drew stays out)."""
    points = notebooks.points(cell)
    reveal = _reveal_output(cell)
    if outcome is Outcome.OK and not tampering:
        return [v4.new_output("stream", name="stdout", text=f"passed: {points:g}/{points:g} points\n"), *reveal]
    if tampering:
        return [guard.tamper_output(tampering[:1000])]
    errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
    first = errors[0] if errors else None
    if first is not None and first.get("ename") in _GRADER_ENAMES:
        return [execute.error_output(first.ename, first.get("evalue", "")[:1000])]
    if first is None:
        return [execute.error_output("StderrWritten", "the test wrote to stderr (a warning?), which scores 0")]
    ename = first.get("ename") if first.get("ename") in _SAFE_ENAMES else "Error"
    line = _failing_line(first)
    lines = cell.source.split("\n")
    predict = line is not None and 0 < line <= len(lines) and lines[line - 1].strip().startswith(guard.PREDICT_ASSERT)
    observed, fix = hints.split(_ANSI.sub("", first.get("evalue", "")))
    if line is None or (line in _hidden_line_numbers(cell.source) and not predict):
        # A hidden test's failure says what was observed, as `make.py check` says it, where
        # that is not the hidden test's own text: each line of the message that holds no text
        # of the hidden test (a string constant, an f-string's words, a line of its code: what
        # redaction would remove) is shown, e.g. the learner's own error ("Your code raised
        # FrozenInstanceError: cannot assign to field 'features'") or a visible check's message;
        # a hidden test's own words (its expected values among them) never are. With nothing
        # left, only "a hidden test failed". How to fix it is for the learner either way (every
        # failure has a fix, and a fix names no expected value: coursetools/author/fixtexts.py).
        hidden = guard.hidden_text(v4.new_notebook(cells=[cell]))
        kept = [text.strip() for text in observed.split("\n") if text.strip() and not guard._leaks(text, hidden)]
        shown = f"{HIDDEN_FAILED_SAID}{' '.join(kept)[:1000]}" if kept else HIDDEN_FAILED
        return [execute.error_output(ename, shown + (hints.FIX_MARKER + fix[:1000] if fix else "")), *reveal]
    message = observed[:1000] if predict else f"{observed[:1000]} (test line {line})"
    return [execute.error_output(ename, message + (hints.FIX_MARKER + fix[:1000] if fix else "")), *reveal]


def _reveal_output(cell: NotebookNode) -> list[NotebookNode]:
    """A Predict question's "what really happens" lines its hidden test printed (hints.reveals),
    for the feedback page: shown once the learner has answered, right or wrong."""
    printed = "".join(o.get("text", "") for o in cell.get("outputs", [])
                      if o.output_type == "stream" and o.get("name") == "stdout")
    lines = hints.reveals(printed)
    return [v4.new_output("stream", name="stdout", text="\n".join(lines) + "\n")] if lines else []


def fix_details(fix: str, chinese: str = "") -> NotebookNode:
    """How to fix a failing test, for a feedback page: collapsed under "How to fix" (the
    message above it says what was observed and which rule that breaks). The Chinese
    edition's page adds the fix in Chinese under the English, which stays for searching."""
    import html
    body = html.escape(fix).replace("\n", "<br>")
    summary, plain = "How to fix", f"How to fix: {fix}"
    if chinese:
        summary = "How to fix · 如何修正"
        body += f'<br><span lang="zh-CN">修正方法：{html.escape(chinese)}</span>'  # 提示 is the observation's
        plain += f"\n修正方法：{chinese}"
    return v4.new_output("display_data", data={
        "text/html": f"<details><summary>{summary}</summary><p>{body}</p></details>",
        "text/plain": plain})


def hint_output(chinese: str) -> NotebookNode:
    """A failing test's observation in Chinese, under the English error on a feedback page
    of the Chinese edition."""
    import html
    return v4.new_output("display_data", data={
        "text/html": f'<p lang="zh-CN">提示：{html.escape(chinese)}</p>',
        "text/plain": f"提示：{chinese}"})


def fold_fixes(cell: NotebookNode, assignment: str | None = None, chinese: bool = False) -> None:
    """A test cell's failure in feedback: the observation stays in the error, the fix
    (after hints.FIX_MARKER) moves under a collapsed "How to fix" after it. With `chinese`
    (a submission of the Chinese edition), each gets its Chinese line from the exercise's PO
    file (coursetools/publish/i18n/testmessages.py) or the grader's own (a hidden test, a time
    limit)."""
    if not (utils.is_grade(cell) and not utils.is_solution(cell)):
        return
    outputs = []
    for out in cell.get("outputs", []):
        outputs.append(out)
        if out.output_type == "stream" and chinese:  # a Predict question's "what really happens"
            for line in hints.reveals(out.get("text", "")):
                said = testmessages.hint(assignment, line)
                if said:
                    outputs.append(hint_output(said))
        if out.output_type != "error":
            continue
        observed, fix = hints.split(out.get("evalue", ""))
        if fix:
            out.evalue = observed
            out.traceback = [f"{out.get('ename', 'Error')}: {observed}"]
        said = testmessages.failure_hint(assignment, out.get("ename", ""), observed) if chinese else ""
        if said:
            outputs.append(hint_output(said))
        if fix:
            outputs.append(fix_details(fix, testmessages.hint(assignment, fix) if chinese else ""))
    cell.outputs = outputs


class ResilientExecute(NbGraderPreprocessor):
    """nbgrader's Execute step, made to survive a real class (replaces `Execute`).

    * each cell has a time limit, and the whole notebook a time budget; a cell that hangs
      or kills the kernel costs that cell (and what depends on it): the kernel is
      restarted, earlier cells replayed, and grading goes on (coursetools.grading.execute). A cell
      that never ran gets an error, so nbgrader cannot score it as passed;
    * a test cell runs in this process, the student's objects reached through proxies of the
      kernel's (coursetools.grading.remote): no verdict is decided in the kernel; its outputs
      are then replaced by the grader's verdict (passed / the visible assertion message /
      "a hidden test failed"), which is what nbgrader scores and feedback shows;
    * the kernel runs in the sandbox (coursetools.grading.sandbox): no access to the course folder
      (gradebook, solutions, other submissions), no network, limited memory and CPU, in a
      scratch folder deleted afterwards;
    * test cells never reach the kernel, and any output line still holding hidden-test source
      or a hidden test's string constant (read as a reader sees it) is removed;
    * output is capped per cell and per notebook (display updates and errors included);
    * the static review (coursetools.grading.review) reads the student's cells and puts what it
      flags first in the flagged cell (`FlaggedForReview`); the score is not changed;
    * files from the submission folder reach the kernel's scratch folder as regular files
      only: symbolic links are not followed.
    """

    timeout = Integer(CELL_TIMEOUT_S, help="Seconds a cell may run before it is stopped").tag(config=True)
    budget = Integer(SUBMISSION_BUDGET_S, help="Seconds a whole submission may run").tag(config=True)
    max_restarts = Integer(6, help="Kernel restarts allowed per notebook (crashes, hangs)").tag(config=True)
    sandbox = Unicode("auto", help="'bwrap', 'off', or 'auto' (bwrap where it works)").tag(config=True)
    memory_mb = Integer(4096, help="Memory (data segment) limit of the kernel, MiB").tag(config=True)
    cpu_seconds = Integer(1800, help="CPU-time limit per kernel process, seconds").tag(config=True)
    max_processes = Integer(SandboxConfig.max_processes, help="Processes and threads the sandboxed kernel may run").tag(config=True)
    file_mb = Integer(SandboxConfig.file_mb, help="Largest file the sandboxed kernel may write, MiB").tag(config=True)
    tmpfs_mb = Integer(SandboxConfig.tmpfs_mb, help="Size of each writable tmpfs in the sandbox (/tmp, /dev/shm, "
                                  "the working folder), MiB").tag(config=True)
    hide = List(Unicode(), help="Extra folders the sandboxed kernel must not see").tag(config=True)
    expose = List(Unicode(), help="Extra folders the sandboxed kernel may read (the sandbox shows only "
                                  "the system folders, Python and the working folder)").tag(config=True)
    max_output_bytes = Integer(2_000_000, help="Output kept per cell, bytes").tag(config=True)
    max_total_output_bytes = Integer(20_000_000, help="Output kept per notebook, bytes").tag(config=True)
    tamper_checks = Bool(True, help="Run test cells in the grader's process (coursetools.grading.remote), "
                                    "not in the kernel").tag(config=True)
    kernel_name = Unicode("python3").tag(config=True)

    def sandbox_config(self, resources: ResourcesDict) -> SandboxConfig:
        mode = resolve_mode(self.sandbox)
        if mode == "off" and self.sandbox == "auto":
            self.log.warning("grading WITHOUT a sandbox: %s", bwrap_works()[1])
        hide = [os.getcwd(), *self.hide]  # nbgrader runs converters from the course root
        db_url = (resources.get("nbgrader") or {}).get("db_url", "")
        if db_url.startswith("sqlite:///"):
            hide.append(os.path.dirname(db_url[len("sqlite:///"):]))
        return SandboxConfig(mode=mode, memory_mb=self.memory_mb, cpu_seconds=self.cpu_seconds,
                             max_processes=self.max_processes, file_mb=self.file_mb,
                             tmpfs_mb=self.tmpfs_mb, hide=tuple(hide), expose=tuple(self.expose))

    def submitted_folder(self, resources: ResourcesDict) -> str | None:
        """The student's folder in submitted/, where nbgrader copied this notebook's files from."""
        info = resources.get("nbgrader") or {}
        student, assignment = info.get("student"), info.get("assignment")
        if not student or not assignment:
            return None
        course = self.config.CourseDirectory
        root = course.get("root", os.getcwd())
        return os.path.join(root, course.get("submitted_directory", "submitted"), student, assignment)

    def course_helpers(self, nb: NotebookNode, resources: ResourcesDict) -> str:
        """The course's own helpers cell for this notebook, never the submission's: the
        gradebook's copy (what nbgrader restores a locked cell from), else the source
        notebook's. A `helpers` cell the student added or changed is not read, whatever
        nbgrader's earlier steps (duplicate ids, restoring locked cells) did with it. Without
        nbgrader's assignment and notebook (a direct call on a notebook the caller vouches
        for), the notebook's own."""
        info = resources.get("nbgrader") or {}
        assignment, name = info.get("assignment"), info.get("notebook")
        if not assignment or not name:
            return execute.course_helpers(nb)
        if info.get("db_url"):
            from nbgrader.api import Gradebook, MissingEntry
            try:
                with Gradebook(info["db_url"]) as gradebook:
                    return gradebook.find_source_cell("helpers", name, assignment).source
            except MissingEntry:
                pass
        course = self.config.CourseDirectory
        source = os.path.join(course.get("root", os.getcwd()), course.get("source_directory", "source"),
                              assignment, f"{name}.ipynb")
        if os.path.exists(source):
            return execute.course_helpers(notebooks.read(source))
        raise RuntimeError(f"no helpers cell of the course's own for {assignment}/{name} "
                           f"(neither in the gradebook nor in {source}): not grading it with the submission's")

    def preprocess(self, nb: NotebookNode, resources: ResourcesDict) -> Tuple[NotebookNode, ResourcesDict]:
        config = self.sandbox_config(resources)
        helpers = self.course_helpers(nb, resources)
        here = (resources.get("metadata") or {}).get("path") or "."
        key = resources.get("unique_key", "notebook")
        scratch = tempfile.mkdtemp(prefix="grading-")
        try:
            skipped = copy_data_files(here, scratch, self.submitted_folder(resources))
            for name in skipped:
                self.log.warning("%s: %s is a symbolic link in the submission: not given to the kernel", key, name)
            kernel_env = sandbox_env(config) if config.mode != "off" else None
            report = execute_resilient(
                nb, cwd=scratch, timeout=self.timeout, kernel_name=self.kernel_name,
                max_restarts=self.max_restarts, env=kernel_env, guarded=self.tamper_checks,
                budget=self.budget, helpers_source=helpers,
                is_replayable=lambda c: not notebooks.is_test_cell(c),
                client_kwargs={"kernel_manager_class": warm.kernel_manager_for(config, scratch),
                               "max_output_bytes": self.max_output_bytes,
                               "max_total_output_bytes": self.max_total_output_bytes},
            )
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        for i, cell in enumerate(nb.cells):
            if cell.cell_type == "code" and notebooks.is_test_cell(cell):
                cell.outputs = grader_written_outputs(cell, report.outcomes[i], report.tampering.get(i))
        sanitize_rich_outputs(nb)
        redacted = guard.redact(nb, guard.hidden_text(nb))
        findings = review.review_notebook(nb)
        review.annotate(nb, findings)
        for finding in findings:
            self.log.warning("REVIEW %s: %s", key, finding)
        for note in report.notes:
            self.log.warning("%s: %s", key, note)
        for message in report.tampering.values():
            self.log.warning("TAMPERING %s: %s", key, message)
        self.log.info("%s: executed in %.1f s (budget %d s)", key, report.seconds, self.budget)
        resources["resilient_execute"] = {
            "sandbox": config.mode, "restarts": report.restarts, "notes": report.notes,
            "tampering": list(report.tampering.values()), "redacted_outputs": redacted,
            "budget_exceeded": report.budget_exceeded_at is not None,
            "seconds": report.seconds, "dropped_output_bytes": report.dropped_output_bytes,
            "review": [str(f) for f in findings], "symlinks_skipped": skipped,
        }
        return nb, resources


def copy_data_files(here: str, scratch: str, submitted: str | None = None) -> list[str]:
    """Copy the regular files of `here` (data files the assignment ships; not notebooks) into
    the kernel's scratch folder, as the grader, without following symbolic links: a link, or a
    file nbgrader copied from a link in the student's `submitted` folder (it follows links),
    is left out. Returns the names left out."""
    skipped = []
    for entry in sorted(os.listdir(here)):
        if entry.endswith(".ipynb"):
            continue
        src = os.path.join(here, entry)
        info = os.lstat(src)
        if submitted is not None and os.path.islink(os.path.join(submitted, entry)):
            skipped.append(entry)
            continue
        if stat.S_ISLNK(info.st_mode):
            skipped.append(entry)
            continue
        if not stat.S_ISREG(info.st_mode):
            continue
        try:
            fd = os.open(src, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:  # replaced by a link since lstat
            skipped.append(entry)
            continue
        with os.fdopen(fd, "rb") as source, open(os.path.join(scratch, entry), "wb") as dest:
            shutil.copyfileobj(source, dest)
    return skipped


def preflight_hook(**_kwargs) -> None:
    """nbgrader's pre-convert hook (nbgrader_config.py): before the first submission of an
    `nbgrader autograde` run, start one kernel as ResilientExecute will (coursetools.grading.preflight).
    If it cannot start, log one message with the cause and the fix and stop the whole run,
    before nbgrader has created anything for a student (a hook's other errors nbgrader only
    logs, so it exits with SystemExit). Later submissions cost nothing: the check is done."""
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config import Application

    from coursetools.grading import preflight

    app = Application.instance()
    while getattr(app, "subapp", None) is not None:
        app = app.subapp
    step = ResilientExecute(config=app.config)
    try:
        config = step.sandbox_config({"nbgrader": {"db_url": CourseDirectory(config=app.config).db_url}})
        seconds = preflight.check(config, kernel_name=step.kernel_name)
    except (preflight.PreflightError, SandboxUnavailable) as exc:
        app.log.error("%s", exc)
        raise SystemExit(f"error: {exc}") from exc
    if seconds:
        app.log.info("preflight: a sandboxed kernel started and imported torch in %.1f s", seconds)


class OverwriteCellsQuietly(OverwriteCells):
    """nbgrader's OverwriteCells (locked cells restored from the gradebook, deleted grade cells
    added back: `add_missing_cells`), without its false alarm. Every test cell with hidden
    tests reaches the grader without them (the release cleared them), so nbgrader logged
    "Attribute 'checksum' for cell test_... has changed!" for each: 7 lines per submission of
    chapter 01, honest or blank alike, burying the lines that matter. A locked cell exactly as
    released (its checksum is the one the release computed) is restored without a warning; an
    edited one is still reported, and the summary flags it from the release file itself
    (coursetools/instructor/classroom.py, _cell_changes)."""

    def preprocess_cell(self, cell, resources, cell_index):
        meta = cell.metadata.get("nbgrader", {})
        self._as_released = bool(meta.get("checksum")) and utils.compute_checksum(cell) == meta.get("checksum")
        return super().preprocess_cell(cell, resources, cell_index)

    def report_change(self, name, attr, old, new):
        if attr == "checksum" and getattr(self, "_as_released", False):
            self.log.debug("cell %s as released: its hidden tests restored", name)
            return
        super().report_change(name, attr, old, new)


ANSWER_STUBS = {"code": notebooks.CODE_STUB, "markdown": "YOUR ANSWER HERE"}


class RestoreDeletedAnswers(NbGraderPreprocessor):
    """An answer cell the student deleted comes back empty (the release's stub), where the
    release had it. nbgrader adds back deleted grade cells (tests, manually graded answers),
    never an autograded answer cell, so the tests after it met a notebook without it; now the
    notebook is graded as if the question were unanswered, and the summary flags it
    ("deleted answer cell ... (restored empty)", classroom._cell_changes). The stub, never the
    gradebook's source (which holds the solution), is what comes back."""

    def preprocess(self, nb, resources):
        from nbgrader.api import Gradebook
        from nbgrader.nbgraderformat import MetadataValidator

        info = resources["nbgrader"]
        with Gradebook(info["db_url"]) as gb:
            source = gb.find_notebook(info["notebook"], info["assignment"])
            order = [(c.name, c.cell_type) for c in source.source_cells]
            graded = {c.name for c in source.grade_cells}
            answers = [c.name for c in source.solution_cells if c.name not in graded]
        present = {c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells}
        names = [name for name, _ in order]
        types = dict(order)
        for name in (n for n in names if n in answers and n not in present):
            cell = NotebookNode({
                "cell_type": types[name], "metadata": {"nbgrader": {
                    "grade": False, "grade_id": name, "locked": False, "solution": True, "task": False,
                    "schema_version": 3}},
                "source": ANSWER_STUBS.get(types[name], "")})
            if types[name] == "code":
                cell["execution_count"], cell["outputs"] = None, []
            cell = MetadataValidator().upgrade_cell_metadata(cell)
            before = names[:names.index(name)]
            index = 0
            for i, existing in enumerate(nb.cells):
                if existing.metadata.get("nbgrader", {}).get("grade_id") in before:
                    index = i + 1
            nb.cells.insert(index, cell)
            self.log.warning("Answer cell %s was deleted from the submission: restored empty (graded as "
                             "unanswered)", name)
        return nb, resources


def _quiet_priority() -> List:
    """nbconvert's HTML exporter configures `NbConvertBase.display_data_priority` for every
    preprocessor it runs, and nbgrader's base class declares that trait without config=True:
    traitlets then logged "Config option `display_data_priority` not recognized" for each of
    the two feedback preprocessors below, on every submission. Declared configurable
    here, it takes the exporter's value quietly; neither preprocessor reads it."""
    return List(NbGraderPreprocessor.class_traits()["display_data_priority"].default()).tag(config=True)


class ClearHiddenTestsSafely(ClearHiddenTests):
    """nbgrader's ClearHiddenTests for feedback, minus its failure mode: a student cell
    whose text contains the hidden-test markers (a comment will do) made it raise, and that
    student got no feedback at all. Here only test cells are cleared; other cells are the
    student's own text and stay as they are."""

    display_data_priority = _quiet_priority()

    def preprocess_cell(self, cell, resources, cell_index):
        if not utils.is_grade(cell) or utils.is_solution(cell):
            return cell, resources
        return super().preprocess_cell(cell, resources, cell_index)


# Output kinds that feedback shows. Everything else (JavaScript, widgets, SVG, which can
# carry script, PDFs, vendor formats) is replaced by a note; HTML and Markdown go through
# nbconvert's sanitizer (HTMLExporter.sanitize_html, nbgrader_config.py).
SAFE_MIME = ("text/plain", "text/html", "text/markdown", "text/latex", "image/png", "image/jpeg",
             "image/gif")


_SAFE_TAGS = ["a", "abbr", "b", "blockquote", "br", "code", "del", "details", "div", "em", "h1", "h2",
              "h3", "h4", "h5", "h6", "hr", "i", "img", "li", "ol", "p", "pre", "span", "strong", "sub",
              "summary", "sup", "table", "tbody", "td", "th", "thead", "tr", "ul"]
_SAFE_ATTRIBUTES = {"*": ["class", "id", "title"], "a": ["href"], "img": ["src", "alt"]}


def _attribute_allowed(tag: str, name: str, value: str) -> bool:
    """No remote reference survives: an image only from a `data:` URL (nothing is loaded when
    the page opens: no tracking pixel), a link only within the page."""
    if name in ("class", "id", "title", "alt"):
        return True
    if tag == "img" and name == "src":
        return value.strip().lower().startswith("data:image/")
    if tag == "a" and name == "href":
        return value.strip().startswith("#")
    return False


_REMOTE_LOAD = re.compile(
    r"<(?:img|image|source|video|audio|iframe|embed|object|link|script)\b[^>]*?\b(?:src|href|data)\s*=\s*[\"']?"
    r"((?:https?:)?//[^\"'\s>]+)|url\(\s*[\"']?((?:https?:)?//[^\"')\s]+)", re.I)


def remote_references(page: str) -> list[str]:
    """What an HTML page would load from elsewhere when opened: the addresses of its remote
    scripts, style sheets, images, frames and CSS url()s (links a reader may follow are not
    loads). A feedback page has none."""
    return [a or b for a, b in _REMOTE_LOAD.findall(page)]


# An <img> whose remote src the sanitizer removed: a broken image on the page, so it goes.
_IMG_WITHOUT_SRC = re.compile(r"<img(?![^>]*\ssrc=)[^>]*>", re.IGNORECASE)
# The exercise's "Open In Colab" badge (a remote image in a link to Colab): nothing a graded
# student's feedback page can use, and the page loads nothing from elsewhere.
_COLAB_BADGE = re.compile(r"\[!\[[^\]]*\]\(https://colab\.research\.google\.com/assets/colab-badge\.svg\)\]"
                          r"\([^)\s]*\)\s*")


def sanitize_html(html: str) -> str:
    import bleach

    clean = bleach.clean(html, tags=_SAFE_TAGS, attributes=_attribute_allowed, protocols=["data"], strip=True)
    return _IMG_WITHOUT_SRC.sub("", clean)


def clean_html(element) -> str:
    """nbconvert's `clean_html` template filter for feedback pages (FEEDBACK_FILTERS): the
    course's sanitizer, which also keeps <details>/<summary> (the collapsed "How to fix")
    and lets no remote reference through."""
    return sanitize_html(element.decode() if isinstance(element, bytes) else str(element))


# HTMLExporter.filters of feedback pages: nbconvert's own clean_html escapes <details>.
FEEDBACK_FILTERS = {"clean_html": "coursetools.instructor.nbgrader_ext.clean_html"}


def sanitize_markdown(source: str) -> str:
    """Markdown rendered to HTML with only harmless tags and attributes left, and no remote
    reference (nbgrader's feedback template renders Markdown cells without nbconvert's sanitizer)."""
    from nbconvert.filters import markdown2html

    return sanitize_html(markdown2html(_COLAB_BADGE.sub("", source)))


def sanitize_rich_outputs(nb: NotebookNode) -> None:
    """Before redaction (which then reads what a reader would see): every HTML output
    sanitized, every Markdown output rendered and sanitized into HTML (issue 32: redaction ran
    first, and the sanitizer turned `&#115;` back into letters)."""
    for cell in nb.cells:
        sanitize_cell_outputs(cell)


def sanitize_cell_outputs(cell: NotebookNode) -> None:
    """sanitize_rich_outputs for one cell, in place."""
    if cell.cell_type == "code":
        for out in cell.get("outputs", []):
            data = out.get("data") if out.output_type in ("display_data", "execute_result") else None
            if not data:
                continue
            if isinstance(data.get("text/markdown"), str):
                rendered = sanitize_markdown(data.pop("text/markdown"))
                data.setdefault("text/html", rendered)
            if isinstance(data.get("text/html"), str):
                data["text/html"] = sanitize_html(data["text/html"])


# The feedback page's template (templates/course_feedback/): nbgrader's "feedback" made usable
# on any screen (tests named by question, "How to fix" a disclosure, messages that wrap).
FEEDBACK_TEMPLATE = "course_feedback"


class CourseFeedbackExporter(HTMLExporter):
    """The exporter of every feedback page (GenerateFeedback.exporter_class: grade-class,
    nbgrader's own `generate_feedback` and Formgrader's button alike): the course's template
    (`CourseFeedbackExporter.template_name`, which wins over the `HTMLExporter.template_name =
    'feedback'` that nbgrader sets, without touching Formgrader's own 'formgrade' pages), able to
    extend nbgrader's `feedback/index.html.j2` by that name: nbgrader's template folder is searched
    too. Named by its import path in the configuration (COURSE_FEEDBACK_EXPORTER), which is
    pickled to the grading workers."""

    @default("template_paths")
    def _template_paths(self, prune=True, root_dirs=None):
        return [*super()._template_paths(prune, root_dirs), feedback_template_dirs()[1]]


COURSE_FEEDBACK_EXPORTER = f"{__name__}.CourseFeedbackExporter"


def feedback_template_dirs() -> list[str]:
    """HTMLExporter.extra_template_basedirs for feedback pages: the course's own (a mathjax
    macro that loads nothing, so no page fetches from a CDN), then nbgrader's, which holds
    the feedback template itself (nbgrader adds it only when the setting is unset)."""
    import nbgrader
    ours = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")
    theirs = os.path.join(os.path.dirname(os.path.abspath(nbgrader.__file__)),
                          "server_extensions", "formgrader", "templates")
    return [ours, theirs]


def feedback_config(config):
    """The configuration GenerateFeedback runs with: `config`, nbgrader's feedback template,
    and the course's template folder first (feedback_template_dirs)."""
    from traitlets.config import Config
    out = Config(config)
    out.GenerateFeedback.exporter_class = COURSE_FEEDBACK_EXPORTER
    out.CourseFeedbackExporter.template_name = FEEDBACK_TEMPLATE
    if "extra_template_basedirs" not in config.get("HTMLExporter", {}):
        out.HTMLExporter.extra_template_basedirs = feedback_template_dirs()
    if "filters" not in config.get("HTMLExporter", {}):
        out.HTMLExporter.filters = dict(FEEDBACK_FILTERS)
    return out


def feedback_app(coursedir, config):
    """nbgrader's GenerateFeedback with `feedback_config(config)`: the same page as nbgrader's own
    `generate_feedback` writes with nbgrader_config.py (test_feedback_is_what_nbgraders_generate_feedback_writes)."""
    from nbgrader.converters import GenerateFeedback

    return GenerateFeedback(coursedir=coursedir, config=feedback_config(config))


class SafeOutputs(NbGraderPreprocessor):
    """Feedback HTML that runs nothing: drop every output kind outside SAFE_MIME, and render
    Markdown cells (a student can edit any that is not locked) to sanitized HTML."""

    display_data_priority = _quiet_priority()

    def preprocess(self, nb, resources):
        # The Chinese edition's submissions get Chinese hints under the tests' messages.
        self._chinese = cells_language(nb.cells) == "zh"
        self._assignment = (resources.get("nbgrader") or {}).get("assignment")
        return super().preprocess(nb, resources)

    def preprocess_cell(self, cell, resources, cell_index):
        if cell.cell_type != "code":
            cell.pop("attachments", None)
            if cell.cell_type == "markdown":
                cell.source = sanitize_markdown(cell.source)
            return cell, resources
        kept = []
        sanitize_cell_outputs(cell)
        for out in cell.get("outputs", []):
            if out.output_type in ("display_data", "execute_result"):
                data = out.get("data", {})
                dropped = sorted(m for m in data if m not in SAFE_MIME)
                for mime in dropped:
                    del data[mime]
                if dropped and not data:
                    data["text/plain"] = f"[{', '.join(dropped)} output not shown in feedback]"
                out.get("metadata", {}).clear()
            kept.append(out)
        cell.outputs = kept
        fold_fixes(cell, getattr(self, "_assignment", None), getattr(self, "_chinese", False))
        return cell, resources
