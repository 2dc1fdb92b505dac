"""The grading engine, one for the self-check and the classroom: run a notebook cell by cell
(execute), in a sandbox (sandbox), with tamper checks around every test (guard, whose kernel
side is guard_kernel), a static review of the student's cells (review), and a test kernel
started before the first submission (preflight)."""
