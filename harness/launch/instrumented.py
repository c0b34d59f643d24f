"""A torchtitan ``--module`` that proxies another module's config functions, so a config
module the registry does not list (the SFT config, harness/backends/sft_config.py), or a registered
backend's under a name of its own, runs as a registered backend whose sizes and attention
variants it borrows, with the batches of as many steps dumped as the run asks
(``env(..., dump_steps=)``). Launched like any backend:

    torchrun ... -m torchtitan.train --module harness.launch.instrumented --config tiny
    (env: HARNESS_INSTRUMENT_TARGET=harness.backends.titan_native)

The config is the target's own, unchanged; what the ranks record comes from the launcher, as
for every run (harness/rank/observers.py). In tests, ``instrumented_backend(base)`` registers
it for the duration as a backend whose sizes and attention variants are ``base``'s, so
``RunSpec``/``launch``/``backend_runs`` launch it.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from dataclasses import replace

from harness.backends import BACKENDS, backend, register, unregister
from harness.launch.run import RunSpec
from harness.registry import environment

MODULE = __name__


def _target():
    name = os.environ.get(environment.INSTRUMENT_TARGET)
    if not name:
        raise AttributeError(f"{MODULE}: set {environment.INSTRUMENT_TARGET} to the config module "
                             "to instrument")
    return importlib.import_module(name)


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    function = getattr(_target(), name, None)
    if function is None or not callable(function):
        raise AttributeError(f"{os.environ.get(environment.INSTRUMENT_TARGET)} has no config "
                             f"function {name!r}")
    return function


def backend_name(base: str) -> str:
    return f"{base}_instrumented"


@contextlib.contextmanager
def instrumented_backend(base: str):
    """Register ``<base>_instrumented`` (module: this one) for the block; yields its name."""
    name = backend_name(base)
    if name in BACKENDS:  # registered by an enclosing block
        yield name
        return
    register(replace(backend(base), name=name, module=MODULE))
    try:
        yield name
    finally:
        unregister(name)


def env(target: str, *, dump_steps: int = 1) -> tuple:
    """RunSpec.extra_env for an instrumented run of config module ``target``."""
    return ((environment.INSTRUMENT_TARGET, target), (environment.DUMP_STEPS, str(dump_steps)))


# Every SFT run accumulates 2 microbatches of 1 row per rank (the same 2 rows per rank as local
# batch 2): one launch serves the batch checks, the normalisation across ranks and microbatches.
SFT_LAYOUT = "ga=2"


def sft_spec(name: str, *, plants: tuple[str, ...] = (), layout: str = SFT_LAYOUT) -> RunSpec:
    """The one-step instrumented SFT run (pretrained weights, harness/backends/sft_config.py's
    prompt-masked, padded rows) of instrumented backend ``name``: the ignored-label checks
    (tests/e2e/test_ignored_labels.py) and the gradient-accumulation layout's cheap form
    (tests/parity/test_layouts.py) read it."""
    return RunSpec(name, init="pretrained", steps=1, plants=tuple(plants),
                   extra_env=env("harness.backends.sft_config"), layout=layout)


def native_feed_spec(name: str, *, plants: tuple[str, ...] = (), attention: str | None = None):
    """The one-step instrumented titan_native run (random init, HF save at step 1) of the slow
    tier's data-path checks (the flex variant, the plants); the default tier's reads the run
    template's titan_native random-init run."""
    return RunSpec(name, steps=1, attention=attention, save_hf=True, plants=plants,
                   extra_env=env("harness.backends.titan_native"))
