"""The grading engine, one for the self-check and the classroom: run a notebook cell by cell
(execute), in a sandbox (sandbox), with every test run in the grader's own process against
proxies of the kernel's objects (remote; the kernel's side is agent_kernel), hidden-test text
redacted from outputs (guard), a static review of the student's cells (review), and a test kernel
started before the first submission (preflight)."""
