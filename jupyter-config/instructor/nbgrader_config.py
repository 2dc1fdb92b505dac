# The instructor's global nbgrader config for `make.py lab --instructor`: the Assignments tab
# (the instructor trying release -> fetch -> submit as a student) reads it from the fetch folder,
# where the course's nbgrader_config.py is not (issue 37). See coursetools/instructor/exchange.py.
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
from coursetools.instructor import exchange  # noqa: E402

c = get_config()  # noqa: F821
exchange.configure(c, _ROOT)
