"""nbgrader's exchange on one machine: `local-exchange/` in the course (git-ignored).

One function sets it, for every program that reads an nbgrader config here:
* the course's `nbgrader_config.py` (the instructor's commands, Formgrader, grade-class);
* `jupyter-config/instructor/nbgrader_config.py` and `jupyter-config/student/nbgrader_config.py`,
  the global configs `make.py lab --instructor` and `make.py lab --student NAME` put on
  JUPYTER_CONFIG_PATH. nbgrader's Assignments tab needs them: it reads the config of the
  server's folder to find the student's assignment folder, then reads the config again *from
  that folder*, where the course's file is not, so without a global config it fell back to
  /usr/local/share/nbgrader/exchange (issue 37). On a hub the same place is
  /etc/jupyter/nbgrader_config.py (docs/INSTRUCTORS.md, "A class on JupyterHub").

Several students on one machine (`--student NAME`) each get their own fetch folder and
submission cache, and nbgrader's student id is NAME: without that, the second student's fetch
said "You already have a copy", every submission claimed to be the Unix user's, and the shared
cache showed each student everyone's submissions. They are all one Unix user, so collect's
owner check (a warning that the files are "owned by root; cheating attempt?") means nothing
here and is off; on a hub, where each student is a Unix user, it stays on.

On a class server the exchange is the server's: a global nbgrader config outside the course
(a hub's /etc/jupyter/nbgrader_config.py, deploy/jupyterhub/etc-jupyter/) sets it for every
user. The course's nbgrader_config.py is read after it and would win, so `configure` then
sets nothing, and the same checkout works on a laptop and on the hub unchanged.
"""

from __future__ import annotations

import os
import re

COURSE_ID = "pytorch-devices"  # nbgrader's course id (the exchange's folder for this course)
FOLDER = "local-exchange"
STUDENT_ENV = "COURSE_STUDENT"  # make.py lab --student NAME sets it for the server
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def valid_student(name: str) -> str:
    """NAME, or ValueError saying what a student id may be (nbgrader's file names hold it
    between '+' signs, and it names a folder)."""
    if not NAME.fullmatch(name or ""):
        raise ValueError(f"student id {name!r}: use letters, digits, '.', '_' or '-' (at most 64), "
                         "starting with a letter or digit, e.g. --student alice")
    return name


def student_dir(root: str, student: str) -> str:
    """Where `make.py lab --student NAME` serves from and the student's fetches land."""
    return os.path.join(root, FOLDER, "students", valid_student(student))


def server_config(root: str) -> str | None:
    """The global nbgrader config a class server gives every user, if there is one: an
    nbgrader_config.py in a system-wide Jupyter config folder (/etc/jupyter, the environment's
    etc/jupyter) or on JUPYTER_CONFIG_PATH, outside the course `root` (the course's own
    jupyter-config/ files do not count, nor does a user's ~/.jupyter)."""
    from jupyter_core.paths import ENV_CONFIG_PATH, SYSTEM_CONFIG_PATH

    course = os.path.realpath(root)
    folders = [p for p in os.environ.get("JUPYTER_CONFIG_PATH", "").split(os.pathsep) if p]
    for folder in [*folders, *ENV_CONFIG_PATH, *SYSTEM_CONFIG_PATH]:
        real = os.path.realpath(folder)
        if real == course or real.startswith(course + os.sep):
            continue
        found = os.path.join(folder, "nbgrader_config.py")
        if os.path.isfile(found):
            return found
    return None


def configure(c, root: str, student: str | None = None) -> None:
    """Point config `c`'s exchange into `root`/local-exchange, as the instructor (student None:
    the instructor's own student view fetches to local-exchange/student) or as `student`;
    nothing where a class server's global nbgrader config sets the exchange (server_config)."""
    if server_config(root):
        return
    base = os.path.join(root, FOLDER)
    c.CourseDirectory.course_id = COURSE_ID
    c.Exchange.root = os.path.join(base, "exchange")  # what the instructor releases and collects
    if student:
        c.Exchange.assignment_dir = student_dir(root, student)  # where the student fetches to
        c.Exchange.cache = os.path.join(base, "cache", student)  # the student's record of submissions
        c.CourseDirectory.student_id = student  # who submits and fetches feedback
    else:
        c.Exchange.assignment_dir = os.path.join(base, "student")
        c.Exchange.cache = os.path.join(base, "cache", "instructor")
    c.ExchangeCollect.check_owner = False  # every "student" here is the same Unix user
    for folder in (c.Exchange.root, c.Exchange.assignment_dir):
        try:
            os.makedirs(folder, exist_ok=True)  # nbgrader needs both to exist (the tab chdirs into the second)
        except OSError:
            pass  # a read-only checkout: release and collect then say the exchange is missing
