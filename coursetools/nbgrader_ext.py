"""nbgrader preprocessors the course adds to nbgrader's own (configured in nbgrader_config.py)."""

from __future__ import annotations

from typing import Tuple

from nbconvert.exporters.exporter import ResourcesDict
from nbformat.notebooknode import NotebookNode
from nbgrader import utils
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Unicode

from .notebooks import RAISES_TAG


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
