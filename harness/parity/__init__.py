"""Parity and checkpoint-conformance checks between the Qwen3 training backends.

- :mod:`~harness.parity.models` builds the models in-process from one HF checkpoint:
  transformers, torchtitan native (trainer's build and ``initial_load_in_hf`` path), the
  custom-op (``nki_moe``) variant, torchtitan's transformers backend, and the independent
  plain-torch :mod:`~harness.parity.reference`.
- :mod:`~harness.parity.compare` reports where two models or runs part (first divergent
  activation / step, settings side by side); the tolerances are the parity section of
  :mod:`harness.tolerances`, config.json is read by :mod:`harness.hf_config`.
- :mod:`~harness.parity.checkpoint`: saved-checkpoint and state-dict-adapter conformance.
- :mod:`~harness.parity.config_conformance`: native model vs HF config.json, field by field.
- :mod:`~harness.parity.training`: torchtitan's optimizer/schedule/clipping vs a reference.
- :mod:`~harness.parity.workarounds`: the registry's workarounds (harness/known_issues.py)
  applied in-process and to launches; the known issues themselves live only in the registry.
"""
