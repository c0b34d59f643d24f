"""Conformance of what torchtitan reads and writes against the HF Qwen3 format.

- :mod:`~harness.parity.conformance.checkpoint`: saved checkpoints (keys, shapes, dtypes, shard
  index, reload with no missing keys) and the state-dict adapter (coverage, round trip).
- :mod:`~harness.parity.conformance.config`: the native model built from a config vs the HF
  config.json, field by field, with RoPE, attention scale and tying exercised on the built
  modules.
- :mod:`~harness.parity.conformance.native_to_hf`: the native <-> HF Qwen3 name table, the one.
"""
