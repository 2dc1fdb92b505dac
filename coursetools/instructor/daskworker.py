"""Dask worker preload: a worker checks that it can grade before it takes any work.

    dask worker tcp://scheduler:8786 --nworkers 4 --nthreads 1 \\
        --preload coursetools.instructor.daskworker

Run from the course's checkout (or with it on PYTHONPATH), inside the course's environment.
Before the worker joins the cluster, `dask_setup` starts one kernel exactly as grading will,
with this checkout's nbgrader_config.py (coursetools.grading.preflight): a worker whose
sandbox cannot start a kernel, or cannot import torch, fails to start with the cause and the
fix, instead of turning every submission it takes into a "not graded" row. grade-class's
tasks run the same check (with the coordinator's configuration) before a worker's first
submission.

One thread per worker process (`--nthreads 1`): a submission holds a kernel, and nbgrader
logs to one logger per process; a worker with more threads grades one at a time anyway.
"""

from __future__ import annotations

import logging
import pickle

logger = logging.getLogger("distributed.preload")


def dask_setup(worker=None) -> None:
    from traitlets.config.loader import PyFileConfigLoader

    from coursetools import layout
    from coursetools.instructor import gradejob

    # The same memory cap as a local grading worker (gradejob.cap_memory, COURSE_WORKER_MEMORY_MIB);
    # a worker that a submission left holding more than COURSE_WORKER_RECYCLE_MIB is restarted by
    # grade-class through its nanny (engines.DaskEngine._recycle).
    cap = gradejob.cap_memory()
    config = PyFileConfigLoader("nbgrader_config.py", path=str(layout.ROOT)).load_config()
    seconds = gradejob.ensure_ready(pickle.dumps(config))  # raises PreflightError: the worker does not start
    logger.info("grading preflight passed in %.1f s; %s; heap cap %s MiB", seconds, gradejob._STATE["sandbox"], cap)
