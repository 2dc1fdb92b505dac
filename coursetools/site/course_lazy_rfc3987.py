"""Defer `rfc3987_syntax` until it is used (installed into .venv by make.py, with a .pth).

jsonschema imports `rfc3987_syntax` eagerly for its "iri" formats, and that module builds an
Earley parser when imported: 1.2-1.7 s of CPU in every process that imports nbformat
(nbgrader, nbclient, nbval, JupyterLab, `make.py check`), although no Jupyter schema uses
those formats (python-jsonschema/jsonschema#1428). This stub stands in for the module until
something calls it; then the real module is imported and does the work, so validation is
unchanged. Nothing happens where the package is not installed.
"""

import importlib
import importlib.util
import sys
import types

_NAME = "rfc3987_syntax"


def _real():
    module = sys.modules.get(_NAME)
    if getattr(module, "_course_lazy_stub", False):
        del sys.modules[_NAME]
        try:
            module = importlib.import_module(_NAME)
        except BaseException:
            sys.modules[_NAME] = _stub
            raise
    return module


def _is_valid_syntax(term, value):
    return _real().is_valid_syntax(term, value)


def _getattr(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(_real(), name)


_stub = types.ModuleType(_NAME, __doc__)
_stub._course_lazy_stub = True
_stub.is_valid_syntax = _is_valid_syntax
_stub.__getattr__ = _getattr

if _NAME not in sys.modules and importlib.util.find_spec(_NAME) is not None:
    sys.modules[_NAME] = _stub
