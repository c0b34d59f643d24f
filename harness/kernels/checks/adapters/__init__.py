"""Adapters: each maps one operator's canonical signature onto one implementation.

Imports of the implementing library happen inside the adapter, so the registry (and
``python -m harness.kernels.checks list``) loads without torchtitan, transformers or Neuron packages.
"""
