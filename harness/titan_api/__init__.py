"""The torchtitan API generations the harness runs on, and the one installed.

Two generations of torchtitan's Python-config API are in use, and the harness supports both:

| generation   | torchtitan versions                    | where it comes from                      |
|--------------|----------------------------------------|------------------------------------------|
| ``v0_3``       | ``0.3.0``                                | PyPI (``pip install -e . -c constraints/cpu.txt``) |
| ``spring2026`` | ``0.2.2+main.*``, ``0.2.2+neuron*``        | torchtitan ``main`` of spring 2026 and its fork TorchTitan Neuron 0.2.2+neuron.1 (Neuron SDK 2.33); here: ``scripts/make_titan_venv.sh`` |

Everything that differs between them lives in one module per generation (``v0_3.py``,
``spring2026.py``), each exposing the same names (``API``), each difference with its reason.
Backends import those names from here and never branch on versions themselves.
"""

from __future__ import annotations

import importlib
import re
from importlib import metadata

# generation -> (what it accepts, how to install it)
SUPPORTED: dict[str, tuple[str, str]] = {
    "v0_3": (
        "torchtitan 0.3.0",
        "python3 -m pip install -e . -c constraints/cpu.txt",
    ),
    "spring2026": (
        "torchtitan 0.2.2+main.* (main of spring 2026) or 0.2.2+neuron* (TorchTitan Neuron)",
        "scripts/make_titan_venv.sh (wheel from ../shared/wheels), or the Neuron image's own "
        "torchtitan with `pip install -e . -c <(python3 constraints/neuron_image.py)`",
    ),
}

# The names every generation module defines (checked at import, so a generation module that
# forgets one fails here, not in the middle of a run).
API = (
    "GENERATION",
    "LRSchedulersContainer",
    "HuggingFaceTextDataLoader",
    "ATTN_BACKENDS",
    "qwen3_model_registry",
    "require_attn_backend",
    "qwen3_lm_head_init",
    "transformers_backend",
    "CPU_SHIMS",
    "moe_grouped_experts",
    "GROUPED_EXPERTS_COMPUTE_METHOD",
    "grouped_experts_config",
    "call_loss",
    "MOE_GROUPED_EXPERTS_PATH",
    "TEXT_PACKING",
    "post_dataloading_parts",
    "NOT_PORTED",
)


class UnsupportedTorchtitanError(RuntimeError):
    pass


def generation_of(version: str) -> str:
    """The API generation of a torchtitan version string."""
    if version == "0.3.0":
        return "v0_3"
    if re.fullmatch(r"0\.2\.2\+(main\.[0-9a-f]+|neuron.*)", version):
        return "spring2026"
    supported = "; ".join(
        f"{name}: {accepts} (install: {how})" for name, (accepts, how) in SUPPORTED.items()
    )
    raise UnsupportedTorchtitanError(
        f"torchtitan {version} is not a supported API generation. Supported: {supported}."
    )


def torchtitan_version() -> str:
    try:
        return metadata.version("torchtitan")
    except metadata.PackageNotFoundError as error:
        raise UnsupportedTorchtitanError(
            "torchtitan is not installed; install it with "
            f"`{SUPPORTED['v0_3'][1]}` or build the spring-2026 venv with "
            "`scripts/make_titan_venv.sh`"
        ) from error


TORCHTITAN_VERSION = torchtitan_version()


def generation() -> str:
    """The installed generation's name: report results under it ("v0_3" or "spring2026")."""
    return generation_of(TORCHTITAN_VERSION)


_impl = importlib.import_module(f"{__name__}.{generation()}")
_missing = [name for name in API if not hasattr(_impl, name)]
if _missing:  # pragma: no cover - a programming error in a generation module
    raise ImportError(f"{_impl.__name__} lacks {_missing}; every generation defines {API}")

GENERATION: str = _impl.GENERATION
LRSchedulersContainer = _impl.LRSchedulersContainer
HuggingFaceTextDataLoader = _impl.HuggingFaceTextDataLoader
ATTN_BACKENDS: dict[str, str] = _impl.ATTN_BACKENDS
qwen3_model_registry = _impl.qwen3_model_registry
require_attn_backend = _impl.require_attn_backend
qwen3_lm_head_init = _impl.qwen3_lm_head_init
transformers_backend = _impl.transformers_backend
CPU_SHIMS: dict[str, tuple[str, ...]] = _impl.CPU_SHIMS
moe_grouped_experts = _impl.moe_grouped_experts
GROUPED_EXPERTS_COMPUTE_METHOD: str = _impl.GROUPED_EXPERTS_COMPUTE_METHOD
grouped_experts_config = _impl.grouped_experts_config
call_loss = _impl.call_loss
MOE_GROUPED_EXPERTS_PATH: str = _impl.MOE_GROUPED_EXPERTS_PATH
TEXT_PACKING: str = _impl.TEXT_PACKING
post_dataloading_parts = _impl.post_dataloading_parts


def grouped_experts_compute(module, x_RD, num_tokens_per_expert_E, weights: dict | None = None):
    """``module``'s SwiGLU on already-dispatched tokens (its ``GROUPED_EXPERTS_COMPUTE_METHOD``),
    with ``weights`` (``{"w1_EFD": ..., "w2_EDF": ..., "w3_EFD": ...}``) standing in for its
    parameters when given, differentiably (``torch.func.functional_call``)."""
    import torch
    from torch.func import functional_call

    class ExpertsCompute(torch.nn.Module):
        def __init__(self, experts):
            super().__init__()
            self.experts = experts

        def forward(self, x, counts):
            return getattr(self.experts, GROUPED_EXPERTS_COMPUTE_METHOD)(x, counts)

    wrapper = ExpertsCompute(module)
    if weights is None:
        return wrapper(x_RD, num_tokens_per_expert_E)
    return functional_call(wrapper, {f"experts.{k}": v for k, v in weights.items()},
                           (x_RD, num_tokens_per_expert_E))
# Tests written against another generation's internals, not yet ported to this one:
# (pytest node-id glob, why). The root conftest skips them, naming the reason. Empty on every
# generation: keep it so, porting a test instead of listing it.
NOT_PORTED: tuple[tuple[str, str], ...] = _impl.NOT_PORTED
