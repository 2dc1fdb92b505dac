"""Tooling for the course *PyTorch devices, from `.to()` to DDP*. Notebooks never import this
package: each one must run alone (in Colab, for instance). `make.py` is the one entry point;
each of its commands is a module here, grouped by whom it serves:

    layout, notebooks, cellcode   what every part shares: where things live, reading and
                                  writing notebooks, reading the code of a cell
    learner/      lab (make.py lab), selfcheck (make.py check), trace (make.py trace) and
                  devtrace (the device tracer it runs, lesson 08's own cell)
    grading/      the grading engine, one for the self-check and the classroom: execute,
                  sandbox, remote and agent_kernel (tests in the grader, the kernel answers), guard (redaction), review (static review of
                  student cells), preflight (one test kernel before the first submission)
    instructor/   classroom (make.py grade-class), classreport (make.py class-report: what
                  the class misunderstood, after every run), nbgrader_ext (the preprocessors
                  nbgrader_config.py installs); grade-class's parts: gradejob (a
                  worker grades one submission), record (into the one gradebook),
                  engines (worker processes here, or Dask), localworker and daskworker
                  (the two kinds of worker), runguard (stop, lock, process tree)
    author/       authoring (notebook building blocks), newchapter, authorcheck, release,
                  links, cheatsheet, fixtures and fixture_groups (the fixture submissions),
                  gpu_records, nbgrader_course (a scratch nbgrader course)
    evidence/     standalone (every notebook alone, as in Colab), torchrange (make.py
                  test-torch), gpu_report (make.py gpu-report)
    publish/      website (make.py site), i18n (make.py i18n: the Chinese edition)
    venv_site/    files make.py installs into .venv's site-packages

tests/ mirrors this layout; tests/course/ checks the course's own notebooks.
"""
