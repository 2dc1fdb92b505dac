"""The learner's commands: `make.py lab` (the course in JupyterLab, your own copies in work/)
and `make.py check` (grade your exercise with the course's own tests)."""
