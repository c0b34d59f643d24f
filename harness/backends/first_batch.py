"""Every run dumps each rank's step-1 batch, as the trainer feeds it to the model: the
independent HF forward on it is the step-1 expectation of full-size runs on any data, and of
random-init runs from their dumped step-0 weights (harness/expectations.py
``independent_first_step_loss``). Observes only. A run whose data-path hooks
(harness/data/rank_hooks.py) already dump these files (with more fields) leaves them to them.

Written to ``<dump>/harness_batches/rank{R}_step1.pt`` (the layout harness/data/loss_reference.py
``load_batches`` reads): ``input``, ``positions`` (the dataloader's per-document positions, or
None) and ``labels`` as the dataloader gives them, ``model_input`` / ``model_labels`` as
``post_dataloading_process`` returns them. Both generations: 0.3.0 returns (inputs, labels,
extra), spring-2026 (inputs, labels, extra_inputs, extra_kwargs).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch


def _plain(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    t = t.full_tensor() if hasattr(t, "full_tensor") else t
    if type(t) is not torch.Tensor:
        t = t.as_subclass(torch.Tensor)
    return t.cpu().clone()


def _rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", "0"))


def install(trainer_module) -> None:
    """Patch ``trainer_module.Trainer`` (idempotent)."""
    cls = trainer_module.Trainer
    if getattr(cls, "_harness_first_batch", False):
        return
    cls._harness_first_batch = True
    original_init = cls.__init__

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        post = self.post_dataloading_process

        def dumping_post(input_dict, labels, *rest, **kw):
            out = post(input_dict, labels, *rest, **kw)
            if self.step == 1 and not getattr(type(self), "_harness_data_hooks", False):
                folder = Path(self.config.dump_folder) / "harness_batches"
                folder.mkdir(parents=True, exist_ok=True)
                positions = input_dict.get("positions")
                torch.save({
                    "input": _plain(input_dict["input"]),
                    "positions": None if positions is None else _plain(positions),
                    "labels": _plain(labels),
                    "model_input": _plain(out[0]),
                    "model_labels": _plain(out[1]),
                }, folder / f"rank{_rank()}_step1.pt")
            return out

        self.post_dataloading_process = dumping_post

    cls.__init__ = __init__
