"""Launching runs: the launcher (``run``), the runs each tier makes (``run_matrix``), the
subjects (any config function), the preflight, the run cache shared by workers, the child
processes a session started, found by their marker (``children``), tests in a child process
(``own_process``), the instrumented module.
"""
