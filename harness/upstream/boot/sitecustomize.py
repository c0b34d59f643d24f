"""Installed into each launched rank through PYTHONPATH (see harness/upstream/install.py).

Python imports ``sitecustomize`` at start-up, before ``-m torchtitan.train`` runs, which is the
only point early enough for shims that must act before torchtitan imports itself. It installs
the shims named in ``HARNESS_SHIMS`` and the plants named in ``HARNESS_PLANTS`` (self-tests
only, harness/plants), the step-0 records and the start-up collection setting of a rank, and
nothing else; with both variables unset it does nothing.
"""

import os

# A launched rank imports with automatic garbage collection off, until torchtitan's Trainer is
# built and manages collection itself, the imports' objects frozen (harness/startup_gc.py).
# Before the shims: they import torch.
if os.environ.get("HARNESS_SHIMS") or os.environ.get("HARNESS_PLANTS"):
    try:
        from harness.startup_gc import defer_until_trainer
    except ImportError:  # another checkout's harness without it
        defer_until_trainer = None
    if defer_until_trainer is not None:
        defer_until_trainer()

for variable, module in (("HARNESS_SHIMS", "harness.upstream.install"), ("HARNESS_PLANTS", "harness.plants")):
    if os.environ.get(variable):
        try:
            import importlib

            importlib.import_module(module).install_from_env()
        except Exception as error:  # site.py would print this and carry on without them
            import sys

            print(f"harness: cannot install {variable}: {error}", file=sys.stderr)
            raise SystemExit(2) from error

# Every launched rank leaves what it has about step 0 (every rank's step-1 batch, a random-init
# run's step-0 weights, every rank's shard fingerprints: harness/rank_step0.py). It observes only.
# (A harness found on the path without it, e.g. another checkout's install, leaves nothing.)
if os.environ.get("HARNESS_SHIMS") or os.environ.get("HARNESS_PLANTS"):
    try:
        from harness.rank_step0 import install_in_rank
    except ImportError:
        install_in_rank = None
    if install_in_rank is not None:
        install_in_rank()
