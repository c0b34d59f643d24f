"""The checks of a launched run (``run_checks``) and the computations they compare with
(``reference_forward``, ``random_init_forward``).
"""
