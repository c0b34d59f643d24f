"""Parity and checkpoint-conformance checks between the Qwen3 training backends.

- :mod:`~harness.parity.models` builds the models in-process from one HF checkpoint:
  transformers, torchtitan native (trainer's build and ``initial_load_in_hf`` path), the
  custom-op (``nki_moe``) variant, torchtitan's transformers backend, and the independent
  plain-torch :mod:`~harness.parity.reference`.
- :mod:`~harness.parity.compare` reports where two models or runs part (first divergent
  activation / step, settings side by side); :mod:`~harness.parity.tolerances` is the policy.
- :mod:`~harness.parity.checkpoint`: saved-checkpoint and state-dict-adapter conformance.
- :mod:`~harness.parity.config_conformance`: native model vs HF config.json, field by field.
- :mod:`~harness.parity.training`: torchtitan's optimizer/schedule/clipping vs a reference.
- :mod:`~harness.parity.defects` / :mod:`~harness.parity.workarounds`: named upstream
  defects and their opt-in workarounds.
"""
