# The students' global nbgrader config for `make.py lab --student NAME` (one machine, several
# students; issue 37). nbgrader's Assignments tab reads it from JUPYTER_CONFIG_PATH wherever the
# student is; the course's nbgrader_config.py is not read, as on a hub. See
# coursetools/instructor/exchange.py.
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
from coursetools.instructor import exchange  # noqa: E402

c = get_config()  # noqa: F821
exchange.configure(c, _ROOT, student=os.environ.get(exchange.STUDENT_ENV) or None)
