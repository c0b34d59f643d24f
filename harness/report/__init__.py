"""What a person reads: the main job's report (``run_report``), the comparison with a previous
night (``baseline``), the pytest plugin that writes a session's report (``pytest_plugin``).
"""
