"""Installed into each launched rank through PYTHONPATH (see harness/upstream/install.py).

Python imports ``sitecustomize`` at start-up, before ``-m torchtitan.train`` runs, which is the
only point early enough for shims that must act before torchtitan imports itself. It installs
the shims named in ``HARNESS_SHIMS`` and nothing else; with the variable unset it does nothing.
"""

import os

if os.environ.get("HARNESS_SHIMS"):
    try:
        from harness.upstream.install import install_from_env

        install_from_env()
    except Exception as error:  # site.py would print this and carry on without the shims
        import sys

        print(f"harness: cannot install HARNESS_SHIMS: {error}", file=sys.stderr)
        raise SystemExit(2) from error
