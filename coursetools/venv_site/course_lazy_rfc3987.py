"""Defer `rfc3987_syntax` until it is used (installed into .venv by make.py, with a .pth).

jsonschema imports `rfc3987_syntax` eagerly for its "iri" formats, and that module builds an
Earley parser when imported: 1.2-1.7 s of CPU in every process that imports nbformat
(nbgrader, nbclient, nbval, JupyterLab, `make.py check`), although no Jupyter schema uses
those formats (python-jsonschema/jsonschema#1428). This stub stands in for the module until
something calls it; then the real module is imported (once, under a lock) and does the work,
so validation is unchanged. Nothing happens where the package or its parser library (lark)
is not installed.
"""

import importlib
import importlib.util
import sys
import threading
import types

_NAME = "rfc3987_syntax"
_lock = threading.RLock()
_loaded = []  # the real module, once imported


def _real():
    if _loaded:
        return _loaded[0]
    with _lock:
        if not _loaded:
            if sys.modules.get(_NAME) is _stub:
                del sys.modules[_NAME]
            try:
                module = importlib.import_module(_NAME)
            except BaseException:
                sys.modules.setdefault(_NAME, _stub)
                raise
            _loaded.append(module)
    return _loaded[0]


def _is_valid_syntax(term, value):
    return _real().is_valid_syntax(term, value)


def _getattr(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(_real(), name)


_spec = importlib.util.find_spec(_NAME) if _NAME not in sys.modules else None
_stub = types.ModuleType(_NAME, __doc__)
_stub.__spec__ = _spec
_stub._course_lazy_stub = True
_stub.is_valid_syntax = _is_valid_syntax
_stub.__getattr__ = _getattr

if _spec is not None and importlib.util.find_spec("lark") is not None:
    sys.modules[_NAME] = _stub
