"""Model parity between the Qwen3 training backends, in-process and over torchrun runs.

- :mod:`~harness.parity.models` builds the models in-process from one HF checkpoint:
  transformers, torchtitan native (trainer's build and ``initial_load_in_hf`` path), the
  custom-op (``nki_moe``) variant, torchtitan's transformers backend, and the independent
  plain-torch :mod:`~harness.references.model`.
- :mod:`~harness.parity.compare` reports where two models or runs part (first divergent
  activation / step, settings side by side); :mod:`~harness.parity.settings` and
  :mod:`~harness.parity.routing` are what it compares besides activations.
- :mod:`~harness.parity.training`: torchtitan's optimizer/schedule/clipping vs a reference.
- :mod:`~harness.parity.measure`: re-measures the numbers behind the parity tolerances.
- :mod:`~harness.parity.conformance`: checkpoint and config conformance against the HF format
  and the native <-> HF name table (it and parity import each other's parts, so one folder).

Elsewhere, each in its one home: the tolerances (:mod:`harness.registry.tolerances`), config.json
(:mod:`harness.registry.hf_config`), the known issues (:mod:`harness.registry.known_issues`) and their
in-process workarounds (:mod:`harness.upstream.workarounds`), the planted defects (:mod:`harness.plants`).
"""
