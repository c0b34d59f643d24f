"""Rank-side hooks for the data-path and training-state checks, installed in torchtitan's real
trainer by the instrumented ``--module`` (harness/data/instrumented.py), or as a plant-style
post-import patch of ``torchtitan.trainer`` (``install_trainer_hooks(module)``).

What they write, under the run's dump folder:
- ``harness_batches/rank{R}_step{S}.pt``: for the first ``HARNESS_DUMP_STEPS`` steps (default
  1), the dataloader's batch as the trainer receives it (``input``, ``positions`` or None,
  ``labels``) and what ``post_dataloading_process`` (with every shim) makes of it, i.e. what
  the model and the loss are fed (``model_input``, ``model_labels``, ``model_positions``).
- ``harness_state/rank{R}.json``: per phase (``built``: trainer built; ``loaded``: after the
  checkpoint load at the start of ``train``; ``trained``: after the last step) whether the
  output projection and the token embedding are one parameter, and whether their values agree;
  ``harness_state/rank{R}_{phase}.pt``: every ``expert_bias`` buffer's local values.

Defects planted in torchtitan's data path and trainer, by name (``HARNESS_DATA_PLANTS``,
comma separated; ``planted(...)`` in-process):
- ``label_shift``: an off-by-one in the label shift (each label is the token after the right one);
- ``drop_eos``: the tokenizer's ``add_eos`` is ignored (documents run together);
- ``positions_no_reset``: positions count over the row, not reset at document boundaries;
- ``sft_mask_off_by_one``: the chat dataset also ignores the first assistant label;
- ``all_token_norm``: the loss is normalised by every label, ignored ones included;
- ``reset_expert_bias_on_load``: MoE ``expert_bias`` is zeroed after a checkpoint load;
- ``untie_embeddings``: the model config is built with weight tying off (instrumented module).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import torch

DUMP_STEPS_ENV = "HARNESS_DUMP_STEPS"
PLANTS_ENV = "HARNESS_DATA_PLANTS"
IGNORE_INDEX = -100
DATA_PLANTS = ("label_shift", "drop_eos", "positions_no_reset", "sft_mask_off_by_one",
               "all_token_norm",
               "reset_expert_bias_on_load", "untie_embeddings")


def env_plants() -> tuple[str, ...]:
    names = tuple(n for n in os.environ.get(PLANTS_ENV, "").split(",") if n)
    unknown = [n for n in names if n not in DATA_PLANTS]
    if unknown:
        raise ValueError(f"unknown data plant(s) {unknown}; known: {DATA_PLANTS}")
    return names


def _rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", "0"))


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def _plain(t):
    t = t.detach()
    t = t.full_tensor() if hasattr(t, "full_tensor") else t
    if type(t) is not torch.Tensor:
        t = t.as_subclass(torch.Tensor)
    return t.cpu().clone()


def _state_of(model) -> dict:
    """Tying and expert-bias state of one model part."""
    out: dict = {}
    emb = getattr(getattr(model, "tok_embeddings", None), "weight", None)
    head = getattr(getattr(model, "lm_head", None), "weight", None)
    if emb is not None and head is not None:
        le, lh = _local(emb.detach()), _local(head.detach())
        out["tied_same_parameter"] = emb is head
        out["tied_same_storage"] = (le.shape == lh.shape
                                    and le.untyped_storage().data_ptr()
                                    == lh.untyped_storage().data_ptr())
        out["tied_values_equal"] = bool(le.shape == lh.shape and torch.equal(le, lh))
        out["weight_tying_flag"] = bool(getattr(model, "enable_weight_tying", False))
    bias = {name: _local(buf.detach()).cpu().clone() for name, buf in model.named_buffers()
            if "expert_bias" in name}
    out["expert_bias_abs_sum"] = (float(sum(b.float().abs().sum() for b in bias.values()))
                                  if bias else None)
    return out, bias


def _record(trainer, phase: str) -> None:
    folder = Path(trainer.config.dump_folder) / "harness_state"
    folder.mkdir(parents=True, exist_ok=True)
    rank = _rank()
    states, biases = [], {}
    for i, part in enumerate(trainer.model_parts):
        state, bias = _state_of(part)
        states.append(state)
        biases.update({f"part{i}.{k}": v for k, v in bias.items()})
    path = folder / f"rank{rank}.json"
    record = json.loads(path.read_text()) if path.is_file() else {}
    record[phase] = {"step": int(trainer.step), "parts": states}
    path.write_text(json.dumps(record, indent=1))
    if biases:
        torch.save(biases, folder / f"rank{rank}_{phase}.pt")


def _zero_expert_bias(trainer) -> None:
    with torch.no_grad():
        for part in trainer.model_parts:
            for name, buf in part.named_buffers():
                if "expert_bias" in name:
                    buf.zero_()


def install_trainer_hooks(trainer_module, plants: tuple[str, ...] | None = None) -> None:
    """Patch ``torchtitan.trainer.Trainer``: batch dumps, state records, trainer plants
    (``plants``; None: those named in HARNESS_DATA_PLANTS). Usable as a post-import patch."""
    plants = env_plants() if plants is None else plants
    cls = trainer_module.Trainer
    if getattr(cls, "_harness_data_hooks", False):
        return
    cls._harness_data_hooks = True
    dump_steps = int(os.environ.get(DUMP_STEPS_ENV, "1"))
    original_init = cls.__init__
    original_train = cls.train

    def _dump(self, input_dict, labels, original_post):
        inputs, model_labels, extra = original_post(input_dict, labels)
        if self.step <= dump_steps:
            folder = Path(self.config.dump_folder) / "harness_batches"
            folder.mkdir(parents=True, exist_ok=True)
            positions = input_dict.get("positions")
            model_positions = extra.get("positions")
            torch.save({
                "input": input_dict["input"].detach().cpu().clone(),
                "positions": None if positions is None else positions.detach().cpu().clone(),
                "labels": labels.detach().cpu().clone(),
                "model_input": _plain(inputs),
                "model_labels": _plain(model_labels),
                "model_positions": None if model_positions is None else _plain(model_positions),
            }, folder / f"rank{_rank()}_step{self.step}.pt")
        return inputs, model_labels, extra

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        # Outermost, per instance: sees the dataloader's batch before any class-level patch
        # (upstream shims) rewrites it, and what comes out (what the model is fed).
        class_post = self.post_dataloading_process
        self.post_dataloading_process = lambda input_dict, labels: _dump(
            self, input_dict, labels, class_post)
        _record(self, "built")
        checkpointer_load = self.checkpointer.load

        def load(*a, **k):
            loaded = checkpointer_load(*a, **k)
            if loaded and "reset_expert_bias_on_load" in plants:
                _zero_expert_bias(self)
            _record(self, "loaded")
            return loaded

        self.checkpointer.load = load

    def train(self, *args, **kwargs):
        result = original_train(self, *args, **kwargs)
        _record(self, "trained")
        return result

    cls.__init__ = __init__
    cls.train = train

    if "all_token_norm" in plants:
        original_fwd_bwd = cls.forward_backward_step

        def forward_backward_step(self, *, input_dict, labels, global_valid_tokens):
            world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
            all_tokens = torch.full_like(global_valid_tokens, labels.numel() * world)
            return original_fwd_bwd(self, input_dict=input_dict, labels=labels,
                                    global_valid_tokens=all_tokens)

        cls.forward_backward_step = forward_backward_step


# ---- data plants, acting on torchtitan's own dataset and tokenizer -------------------------

def _patch_dataset_iter(text_datasets, transform) -> callable:
    cls = text_datasets.HuggingFaceTextDataset
    original = cls.__iter__

    def __iter__(self):
        for input_dict, labels in original(self):
            yield transform(input_dict, labels)

    cls.__iter__ = __iter__
    return lambda: setattr(cls, "__iter__", original)


def _label_shift(input_dict, labels):
    return input_dict, torch.cat([labels[1:], labels[-1:]])


def _positions_no_reset(input_dict, labels):
    return {**input_dict, "positions": torch.arange(len(input_dict["input"]))}, labels


def install_data_plants(plants: tuple[str, ...]) -> list:
    """Apply the data-path plants to the imported torchtitan modules; returns undo callables."""
    undo = []
    if not any(p in plants for p in ("label_shift", "positions_no_reset", "drop_eos",
                                      "sft_mask_off_by_one")):
        return undo
    from torchtitan.components import tokenizer as tokenizer_module
    from torchtitan.hf_datasets import text_datasets

    if "label_shift" in plants:
        undo.append(_patch_dataset_iter(text_datasets, _label_shift))
    if "positions_no_reset" in plants:
        undo.append(_patch_dataset_iter(text_datasets, _positions_no_reset))
    if "drop_eos" in plants:
        cls = tokenizer_module.HuggingFaceTokenizer
        original = cls.encode

        def encode(self, *args, **kwargs):
            kwargs["add_eos"] = False
            return original(self, *args, **kwargs)

        cls.encode = encode
        undo.append(lambda: setattr(cls, "encode", original))
    if "sft_mask_off_by_one" in plants:
        chat = text_datasets.ChatDataset
        original_tokenize = chat._tokenize_sample

        def _tokenize_sample(self, sample):
            result = original_tokenize(self, sample)
            if result is not None:
                labels = result[1]
                first = next((i for i, v in enumerate(labels) if v != IGNORE_INDEX), None)
                if first is not None:
                    labels[first] = IGNORE_INDEX
            return result

        chat._tokenize_sample = _tokenize_sample
        undo.append(lambda: setattr(chat, "_tokenize_sample", original_tokenize))
    return undo


@contextlib.contextmanager
def planted(*plants: str):
    """In-process: the data-path plants active inside the block."""
    undo = install_data_plants(plants)
    try:
        yield
    finally:
        for fn in reversed(undo):
            fn()
