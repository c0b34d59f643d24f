"""``python -m harness`` (``commands``): run, check, report.
"""
