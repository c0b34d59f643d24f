"""The torchtitan API generations the harness runs on, and the one installed.

Two generations of torchtitan's Python-config API are in use, and the harness supports both:

| generation   | torchtitan versions                    | where it comes from                      |
|--------------|----------------------------------------|------------------------------------------|
| ``v0_3``       | ``0.3.0``                                | PyPI (``pip install -e . -c constraints/cpu.txt``) |
| ``spring2026`` | ``0.2.2+main.*``                          | torchtitan ``main`` of spring 2026; here: ``scripts/make_titan_venv.sh`` |
| ``spring2026-neuron`` | ``0.2.2+neuron*``                  | TorchTitan Neuron 0.2.2+neuron.1 (Neuron SDK 2.33), a fork of that ``main`` |

Everything that differs between the APIs lives in one module per API (``v0_3.py``,
``spring2026.py``), each exposing the same names (``API``), each difference with its reason.
Backends import those names from here and never branch on versions themselves.

TorchTitan Neuron is a generation of its own that shares the spring2026 API module
(``API_OF``): what was found wrong in public ``main`` (known issues recorded with
``generation="spring2026"``) is not known to be wrong in the fork, so on the fork those checks
run plain. Expectations computed from the API (init rules, the dataloader's batches) are the
API's (``api_generation``). A fork version the harness has not been run against is accepted
and named as such in every result (``fork_note``).
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
        "torchtitan 0.2.2+main.* (main of spring 2026)",
        "scripts/make_titan_venv.sh (wheel from ../shared/wheels)",
    ),
    "spring2026-neuron": (
        "torchtitan 0.2.2+neuron* (TorchTitan Neuron, a fork of spring-2026 main)",
        "on the Neuron image: git clone https://github.com/aws-neuron/torchtitan-neuron, "
        "`pip install -e .` in the image's venv, then "
        "`pip install -e . -c <(python3 constraints/neuron_image.py)` here",
    ),
}
# The API module of each generation (harness/titan_api/<module>.py).
API_OF = {"v0_3": "v0_3", "spring2026": "spring2026", "spring2026-neuron": "spring2026"}
# TorchTitan Neuron releases the harness has been checked against (Neuron SDK 2.33).
KNOWN_FORK_VERSIONS = ("0.2.2+neuron.1",)

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
    if re.fullmatch(r"0\.2\.2\+main\.[0-9a-f]+", version):
        return "spring2026"
    if is_fork(version):
        return "spring2026-neuron"
    supported = "; ".join(
        f"{name}: {accepts} (install: {how})" for name, (accepts, how) in SUPPORTED.items()
    )
    raise UnsupportedTorchtitanError(
        f"torchtitan {version} is not a supported API generation. Supported: {supported}."
    )


def is_fork(version: str) -> bool:
    """A TorchTitan Neuron build (``0.2.2+neuron*``)."""
    return re.fullmatch(r"0\.2\.2\+neuron.*", version) is not None


def fork_note(version: str) -> str | None:
    """None for a known fork release (or no fork); else what a result must say about it."""
    if not is_fork(version) or version in KNOWN_FORK_VERSIONS:
        return None
    return (f"TorchTitan Neuron {version} is not a release the harness knows "
            f"(known: {', '.join(KNOWN_FORK_VERSIONS)}): run as spring2026-neuron (the spring2026 "
            f"API); its expectations and known issues are those of "
            f"{KNOWN_FORK_VERSIONS[-1]}")


def api_generation_of(name: str) -> str:
    """The API module of generation ``name`` (a fork shares its base's)."""
    return API_OF[name]


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
    """The installed generation's name: results, reports and known issues use it ("v0_3",
    "spring2026" or "spring2026-neuron")."""
    return generation_of(TORCHTITAN_VERSION)


def api_generation() -> str:
    """The installed generation's API module ("v0_3" or "spring2026")."""
    return api_generation_of(generation())


_impl = importlib.import_module(f"{__name__}.{api_generation()}")
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
