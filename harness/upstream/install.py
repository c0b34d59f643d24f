"""Install the upstream shims a device profile asks for, in a launched rank.

A shim that must act on a torchtitan module *as it is imported* (because other modules copy
its globals at import time) is registered as a post-import hook: a meta-path finder that runs
the patch right after the module's own code and before anyone imports from it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable
from types import ModuleType

from harness.device import neuron_collectives
from harness.registry import environment
from harness.upstream import (
    dtensor_full_init,
    flex_attention_cpu,
    gloo_all_to_all,
    gloo_reduce_op,
    hf_config_kw_only,
    hf_rope_init,
    hf_shape_from_config,
    hf_tied_fsdp,
    titan_4b_theta,
    titan_sdpa_attention,
)
from harness.upstream.cpu_device import patch_torchtitan_tools_utils


class _PostImportHook(importlib.abc.MetaPathFinder):
    """Wraps the loader of whatever spec the finders after it give ``module_name``, so hooks
    on one module chain: each patch runs, in the order they were registered."""

    def __init__(self, module_name: str, patch: Callable[[ModuleType], None]) -> None:
        self.module_name = module_name
        self.patch = patch

    def find_spec(self, fullname, path, target=None):
        if fullname != self.module_name:
            return None
        later = sys.meta_path[sys.meta_path.index(self) + 1:] if self in sys.meta_path else []
        for finder in later:
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None:
            return None
        original_exec = spec.loader.exec_module
        patch = self.patch

        def exec_module(module: ModuleType) -> None:
            original_exec(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


_RECORDING: list[set[str]] = []  # ``targets`` is asking which modules the shims patch


def after_import(module_name: str, patch: Callable[[ModuleType], None]) -> None:
    """Run ``patch(module)`` right after ``module_name`` is first imported."""
    if _RECORDING:
        _RECORDING[-1].add(module_name)
    elif module_name in sys.modules:
        patch(sys.modules[module_name])
    else:
        sys.meta_path.insert(0, _PostImportHook(module_name, patch))


def _install_cpu_device() -> None:
    after_import("torchtitan.tools.utils", patch_torchtitan_tools_utils)


def _install_flex_attention_cpu() -> None:
    after_import("torch.nn.attention.flex_attention", flex_attention_cpu.allow_cpu_backward)
    after_import("torchtitan.models.common.attention", flex_attention_cpu.run_flex_eagerly)
    after_import("torchtitan.models.common.attention", flex_attention_cpu.build_block_masks_eagerly_on_cpu)
    after_import("torchtitan.distributed.utils", flex_attention_cpu.keep_flex_eager_under_determinism)
    after_import("transformers.integrations.flex_attention", flex_attention_cpu.transformers_flex_eager_on_cpu)


def _install_gloo_reduce_op() -> None:
    after_import(
        "torch.distributed.fsdp._fully_shard._fsdp_collectives",
        gloo_reduce_op.force_sum_reduction_on_cpu,
    )


def _install_gloo_all_to_all() -> None:
    after_import("torch.distributed.distributed_c10d", gloo_all_to_all.send_uneven_chunks_as_rows)


def _install_neuron_collectives() -> None:
    after_import("torch.distributed.distributed_c10d", neuron_collectives.refuse_in_c10d)
    after_import("torch.distributed._functional_collectives", neuron_collectives.refuse_in_functional)


def _install_hf_rope_init() -> None:
    after_import(
        "torchtitan.experiments.transformers_modeling_backend.model",
        hf_rope_init.recompute_rope_after_init_states,
    )


def _install_jsonl_metrics_sink() -> None:
    from harness.upstream.metrics_sink import use_jsonl_sink  # noqa: PLC0415  order: loads torchtitan, hooks first

    after_import("torchtitan.trainer", use_jsonl_sink)


def _install_patches(module) -> None:
    for module_name, patch in module.PATCHES:
        after_import(module_name, patch)


def _install_titan_sdpa_attention() -> None:
    _install_patches(titan_sdpa_attention)


def _install_hf_config_kw_only() -> None:
    _install_patches(hf_config_kw_only)


def _install_hf_shape_from_config() -> None:
    _install_patches(hf_shape_from_config)


def _install_dtensor_full_init() -> None:
    _install_patches(dtensor_full_init)


def _install_titan_4b_theta() -> None:
    _install_patches(titan_4b_theta)


def _install_hf_tied_fsdp() -> None:
    _install_patches(hf_tied_fsdp)


SHIMS: dict[str, Callable[[], None]] = {
    "cpu_device": _install_cpu_device,
    "flex_attention_cpu": _install_flex_attention_cpu,
    "gloo_reduce_op": _install_gloo_reduce_op,
    "gloo_all_to_all": _install_gloo_all_to_all,
    # The neuron tier's CPU stand-in refuses what ProcessGroupNeuron refuses (the rehearsal):
    "neuron_collectives": _install_neuron_collectives,
    # API-generation shims (harness.upstream.titan_api applies them in-process when needed):
    "titan_sdpa_attention": _install_titan_sdpa_attention,  # torchtitan 0.3.0 only
    "hf_config_kw_only": _install_hf_config_kw_only,  # spring-2026 main + transformers 5.x
    "hf_shape_from_config": _install_hf_shape_from_config,  # spring-2026 main
    "hf_tied_fsdp": _install_hf_tied_fsdp,  # spring-2026 main
    # The harness's own step records, for config functions it did not write (subjects):
    "jsonl_metrics_sink": _install_jsonl_metrics_sink,
    # Opt-in workarounds for named upstream defects (never installed by default):
    "hf_rope_init": _install_hf_rope_init,
    "dtensor_full_init": _install_dtensor_full_init,
    "titan_4b_theta": _install_titan_4b_theta,  # every full-size titan_native run
}


_INSTALLED: set[str] = set()  # in this process: a warm rank's zygote installed the device's


def install(names: list[str]) -> None:
    """Install each shim of ``names`` once in this process (a forked rank skips those its zygote
    installed before its imports, harness/rank/warm_start.py)."""
    unknown = [n for n in names if n not in SHIMS]
    if unknown:
        raise ValueError(f"unknown upstream shim(s) {unknown}; known: {sorted(SHIMS)}")
    for name in names:
        if name not in _INSTALLED:
            SHIMS[name]()
            _INSTALLED.add(name)


def targets(names) -> frozenset[str]:
    """The modules the shims ``names`` patch (as their installers name them; nothing is
    installed). A warm rank's zygote must not have imported one of them before the rank's own
    shims act on it (harness/launch/warm.py)."""
    unknown = [n for n in names if n not in SHIMS]
    if unknown:
        raise ValueError(f"unknown upstream shim(s) {unknown}; known: {sorted(SHIMS)}")
    _RECORDING.append(set())
    try:
        for name in names:
            SHIMS[name]()
    finally:
        recorded = _RECORDING.pop()
    return frozenset(recorded)


def install_from_env() -> None:
    install(environment.names(os.environ.get(environment.SHIMS)))
