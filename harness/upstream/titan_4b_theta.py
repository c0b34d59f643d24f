"""Workaround ``titan_4b_theta`` in the ranks: native Qwen3's "4B" flavor takes its RoPE theta
from the run's assets' config.json (known issue ``titan-4B-rope-theta-1e6``).

Defect: torchtitan's ``model_registry("4B")`` hard-codes ``CosSinRoPE.Config(theta=1e6)``
(0.3.0 and spring-2026 main ``models/qwen3/__init__.py``), while Qwen3-4B-Instruct-2507's
config.json says 5e6, and the HF state-dict adapter never compares them: the source's native
config trains 2507's weights at the wrong rotary frequencies. The harness applies this to every
full-size titan_native run (harness/backends ``SizeSpec.workarounds``) so the run is held to the
HF forward of the weights it loads; the defect itself stays checked by the config-conformance
check (tests/parity/test_config_conformance.py), which fails once upstream fixes it.

The config functions run in the ranks after torchtitan is imported; this wraps
``torchtitan.models.qwen3.model_registry`` (which harness.upstream.titan_api calls at call time) so the
"4B" spec's every layer gets the theta of ``$HARNESS_FULL_ASSETS/config.json`` (the launcher
exports the run's assets dir there, harness/registry/environment.py ``FULL_ASSETS``), through the
same function the in-process realisation uses (harness/upstream/workarounds.py ``theta_from_hf``).
"""

from __future__ import annotations

import functools
import os
from types import ModuleType

from harness.registry import environment
from harness.registry.hf_config import read_config_json

FLAVOR = "4B"


def theta_from_assets(qwen3_module: ModuleType) -> None:
    original = qwen3_module.model_registry
    if getattr(original, "__harness_titan_4b_theta__", False):
        return

    @functools.wraps(original)
    def model_registry(flavor: str, *args, **kwargs):
        spec = original(flavor, *args, **kwargs)
        if flavor == FLAVOR:
            from harness.upstream.workarounds import theta_from_hf  # noqa: PLC0415  heavy: torch; the rank's shims install before torch loads

            assets = os.environ.get(environment.FULL_ASSETS)
            if not assets:
                raise RuntimeError(f"titan_4b_theta: {environment.FULL_ASSETS} is not set, so the run's "
                                   f"config.json (whose rope theta the 4B flavor must take) is "
                                   f"unknown; the launcher exports it for every full-size run")
            spec.model = theta_from_hf(spec.model, read_config_json(assets))
        return spec

    model_registry.__harness_titan_4b_theta__ = True
    qwen3_module.model_registry = model_registry


PATCHES = (("torchtitan.models.qwen3", theta_from_assets),)
