"""Adapters: each maps one operator's canonical signature onto one implementation.

torchtitan, which the harness needs to run at all (harness/registry/generations.py ``STACK``
refuses an environment without it), is imported at the top of its adapter. The optional
libraries (transformers' modeling code, the NKI kernels, nki-library, the Neuron SDK) are imported
inside the adapter function that uses them, so the registry loads without them and each such
implementation reports itself unavailable with its reason.
"""
