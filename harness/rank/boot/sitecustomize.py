"""Installed into each launched rank through PYTHONPATH (harness/launch/run.py ``rank_environment``
puts this folder first on every rank's path, on every device).

Python imports ``sitecustomize`` at start-up, before ``-m torchtitan.train`` runs, which is the
only point early enough for shims that must act before torchtitan imports itself. It installs,
in this order, the shims named in ``HARNESS_SHIMS`` (harness/upstream/install.py), the plants
named in ``HARNESS_PLANTS`` (self-tests only, harness/plants) and the rank-side observers named
in ``HARNESS_OBSERVERS`` (harness/rank/observers.py; last, so theirs are the outermost
wrappers), with a rank's start-up collection setting where shims or plants are named; then it
runs the ``sitecustomize`` it shadows, if the path holds another (an image's own), as Python
would have without this folder. With the three variables unset it installs nothing.

Before all that, a CPU rank whose launch started a warm zygote (``HARNESS_WARM_SOCKET``) hands
itself over to it (harness/rank/warm_start.py): the zygote forks the rank, which calls
``install_harness`` there for what its run adds to the zygote's shims.
"""

import importlib
import importlib.machinery
import importlib.util
import os
import sys

# The variables' names (standard library only; the repo root follows this folder on the path).
from harness.registry import environment


def install_harness() -> None:
    """The shims, plants and observers the environment names (each once per process: a warm
    rank's zygote installed the device's shims already)."""
    # A launched rank imports with automatic garbage collection off, until torchtitan's Trainer
    # is built and manages collection itself, the imports' objects frozen
    # (harness/rank/startup_gc.py). Before the shims: they import torch.
    if os.environ.get(environment.SHIMS) or os.environ.get(environment.PLANTS):
        try:
            from harness.rank.startup_gc import defer_until_trainer  # noqa: PLC0415  optional: another checkout's harness may lack it
        except ImportError:  # another checkout's harness without it
            defer_until_trainer = None
        if defer_until_trainer is not None:
            defer_until_trainer()

    for variable, module in ((environment.SHIMS, "harness.upstream.install"),
                             (environment.PLANTS, "harness.plants"),
                             (environment.OBSERVERS, "harness.rank.observers")):
        if os.environ.get(variable):
            try:
                importlib.import_module(module).install_from_env()
            except Exception as error:  # site.py would print this and carry on without them
                print(f"harness: cannot install {variable}: {error}", file=sys.stderr)
                raise SystemExit(2) from error


def _hand_over_to_a_zygote() -> None:
    """A CPU rank with a warm zygote (harness/rank/warm_start.py) is forked from it: this worker
    waits for that rank and exits as it does. Returns where the rank starts cold here."""
    socket_path = os.environ.get(environment.WARM_SOCKET)
    if not socket_path or os.environ.get(environment.ZYGOTE):
        return
    try:
        from harness.rank.warm_start import hand_over  # noqa: PLC0415  optional: another checkout's harness may lack it
    except ImportError:  # another checkout's harness without it
        return
    hand_over(socket_path)


def _run_the_sitecustomize_this_one_shadows() -> None:
    """Python imports one ``sitecustomize``, the first on the path: this one. The next one
    (a venv's or an image's own) runs here, as it would have run without this folder."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    shadowed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shadowed)


_hand_over_to_a_zygote()
install_harness()
_run_the_sitecustomize_this_one_shadows()
