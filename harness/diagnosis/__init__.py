"""Why a run failed, said where: the first divergent module and hints by signature.

Data flows one way (tests/selftest/test_import_graph.py LAYERS): diagnosis sits below checks
and report. ``harness.checks.run_checks`` asks ``diagnose(run)`` when a run's
``first_step_loss`` or ``finite`` check fails; the report prints what comes back; the comparison
with a previous night's report is harness/report/baseline.py.

- ``trace``: the float64 reference, module by module, one unit (and its weights) at a time;
- ``localize``: the run's model against it, both walked unit by unit forward and back, the
  first module beyond the diagnosis tolerance;
- ``live_bytes``: what the reference side holds at once, measured;
- ``subject``: the run's own model, starting weights and first batch;
- ``streamed``: that model built on meta and run one unit at a time, forward and back;
- ``hints``: the source's step-7 advice, by signature (the analytic random-init loss, the
  known issues recorded elsewhere);
- ``errors``: ``NotDiagnosable``, a run the diagnosis cannot diagnose, with the reason;
- ``rank_dump``: the step-0 weights a random-init run's ranks dumped, as an HF checkpoint
  (read through harness/registry/dump_layout.py).
"""
