"""The diagnosis's one error: a run it cannot diagnose (the reason is reported instead).

Raised where the model side finds it (harness/diagnosis/subject.py, streamed.py); caught by
the child's entry point (harness/diagnosis/__main__.py), which reports the reason.
"""


class NotDiagnosable(Exception):
    """The diagnosis cannot run for this run (the reason is reported instead)."""
