# A class on one JupyterHub server (The Littlest JupyterHub's shape): every student and the
# instructor is a Unix user of this machine, each server runs as its user (the local-process
# spawner), and nbgrader's exchange is one shared folder. docs/INSTRUCTORS.md, "A class on
# JupyterHub", says how to install it; tests/instructor/test_jupyterhub.py runs this file with
# four real users, in Chromium, from release to feedback.
#
# Set before starting the hub:
#   - the authenticator (below: PAM, the machine's own passwords; a university's OAuth or LTI
#     authenticator in production);
#   - INSTRUCTORS: the users who get Formgrader and the course folder;
#   - the files of deploy/jupyterhub/etc-jupyter/ copied to /etc/jupyter/ (the students'
#     global config: nbgrader's exchange and which extensions they see).
import os
import pwd

c = get_config()  # noqa: F821

INSTRUCTORS = ["instructor"]
COURSE_FOLDER = "pytorch-devices"  # the course's checkout in each instructor's home
ETC_JUPYTER = os.environ.get("COURSE_ETC_JUPYTER", "/etc/jupyter")  # the tests put it elsewhere

c.JupyterHub.authenticator_class = "pam"
c.Authenticator.allow_all = True  # any user of this machine who can log in (or: allowed_users)
c.Authenticator.admin_users = set()  # an admin can open anyone's server: not the graders' job
c.JupyterHub.spawner_class = "localprocess"
c.Spawner.default_url = "/lab"
c.JupyterHub.load_groups = {"instructors": {"users": INSTRUCTORS}}


def course_roles(spawner):
    """Students: the Assignments tab (etc-jupyter/). Instructors: Formgrader too
    (etc-jupyter/instructor/), in their course folder, whose nbgrader_config.py comes first.

    All of it goes on JUPYTER_CONFIG_PATH. There /etc/jupyter outranks the files with which pip
    enables every nbgrader extension in the Python environment (<sys.prefix>/etc/jupyter), which
    a plain /etc/jupyter, Jupyter's weakest config folder, does not. And the course's
    nbgrader_config.py is found wherever nbgrader runs (Formgrader, a terminal), although a
    server's working folder is its user's home: without it Formgrader found no assignment."""
    paths = [ETC_JUPYTER]
    if any(group.name == "instructors" for group in spawner.user.groups):
        course = os.path.join(pwd.getpwnam(spawner.user.name).pw_dir, COURSE_FOLDER)
        paths[:0] = [course, os.path.join(ETC_JUPYTER, "instructor")]
        spawner.notebook_dir = course
    spawner.environment = {**spawner.environment, "JUPYTER_CONFIG_PATH": os.pathsep.join(paths)}


c.Spawner.pre_spawn_hook = course_roles
