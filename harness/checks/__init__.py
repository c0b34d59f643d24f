"""The checks of a launched run (``run_checks``), the run-level checks of the state beyond the
weights (``training_state``), and the computations they compare with (``reference_forward``,
``random_init_forward``).
"""
