# Every user's global nbgrader config on the hub: /etc/jupyter/nbgrader_config.py
# (deploy/jupyterhub/jupyterhub_config.py). The exchange is one folder every user can write:
#     mkdir -p /srv/nbgrader/exchange && chmod 1777 /srv/nbgrader/exchange
# nbgrader makes each course's folders in it with the permissions it needs (inbound: students
# may write, not list; feedback: each student finds only their own). Each student's record of
# submissions stays in their own home (nbgrader's default cache).
import os

c = get_config()  # noqa: F821
c.CourseDirectory.course_id = "pytorch-devices"
c.Exchange.root = os.environ.get("COURSE_EXCHANGE_ROOT", "/srv/nbgrader/exchange")  # the tests put it elsewhere
