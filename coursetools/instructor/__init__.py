"""The instructor's tools: `make.py grade-class` (classroom) and the nbgrader preprocessors
the course's nbgrader_config.py installs (nbgrader_ext)."""
