"""Which device a run uses and what it needs there: the device profiles, the probe for
placeholder packages, the allocator's determinism. Reads only the registry.
"""
