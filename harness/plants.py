"""Faults and defects planted in the system under test, to prove the harness catches them.

Each plant is installed in the launched ranks exactly like an upstream shim (HARNESS_SHIMS,
harness/upstream/install.py), so it changes torchtitan's real trainer, not the harness. They
are never installed unless a RunSpec names them (``RunSpec(plants=(...))``); the tests of the
harness's failure handling and its sensitivity self-check use them.
"""

from __future__ import annotations

import os
import time
from types import ModuleType

PLANT_STEP = 2  # the trainer step at which step-triggered plants act


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _wrap_forward_backward(trainer_module: ModuleType, action) -> None:
    cls = trainer_module.Trainer
    original = cls.forward_backward_step

    def forward_backward_step(self, *args, **kwargs):
        loss = original(self, *args, **kwargs)
        return action(self, loss)

    cls.forward_backward_step = forward_backward_step


def nan_loss(trainer_module: ModuleType) -> None:
    """Every rank's loss becomes NaN from step PLANT_STEP on (a numerical blow-up)."""
    _wrap_forward_backward(
        trainer_module, lambda self, loss: loss * float("nan") if self.step >= PLANT_STEP else loss
    )


def hang_rank1(trainer_module: ModuleType) -> None:
    """Rank 1 stops answering at step PLANT_STEP (a hung collective, a stuck device)."""

    def action(self, loss):
        if self.step >= PLANT_STEP and _rank() == 1:
            print(f"plant hang_rank1: rank 1 hangs at step {self.step}", flush=True)
            while True:
                time.sleep(1)
        return loss

    _wrap_forward_backward(trainer_module, action)


def crash_rank1(trainer_module: ModuleType) -> None:
    """Rank 1 raises at step PLANT_STEP."""

    def action(self, loss):
        if self.step >= PLANT_STEP and _rank() == 1:
            raise RuntimeError(f"plant crash_rank1: rank 1 crashed at step {self.step}")
        return loss

    _wrap_forward_backward(trainer_module, action)


def rope_theta_x10(rope_module: ModuleType) -> None:
    """Defect in the model: native RoPE's cos/sin cache is built with theta * 10."""
    cls = rope_module.CosSinRoPE
    original = cls._precompute_cache

    def _precompute_cache(self):
        theta = self.config.theta
        self.config.theta = theta * 10
        try:
            return original(self)
        finally:
            self.config.theta = theta

    cls._precompute_cache = _precompute_cache


def adapter_swaps_gate_up(adapter_module: ModuleType) -> None:
    """Defect in the checkpoint adapter: HF gate_proj and up_proj are mapped the wrong way round."""
    cls = adapter_module.Qwen3StateDictAdapter
    original_init = cls.__init__

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        gate = "model.layers.{}.mlp.gate_proj.weight"
        up = "model.layers.{}.mlp.up_proj.weight"
        self.from_hf_map[gate], self.from_hf_map[up] = self.from_hf_map[up], self.from_hf_map[gate]

    cls.__init__ = __init__


# name -> (module to patch right after import, patch)
PLANTS = {
    "plant_nan_loss": ("torchtitan.trainer", nan_loss),
    "plant_hang_rank1": ("torchtitan.trainer", hang_rank1),
    "plant_crash_rank1": ("torchtitan.trainer", crash_rank1),
    "plant_rope_theta_x10": ("torchtitan.models.common.rope", rope_theta_x10),
    "plant_adapter_swaps_gate_up": (
        "torchtitan.models.qwen3.state_dict_adapter", adapter_swaps_gate_up),
}
