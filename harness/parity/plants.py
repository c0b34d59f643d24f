"""Deliberately broken inputs for the parity checks' self-tests (tests/parity/
test_checks_catch_planted.py): each check must fail on its plant, naming the problem.

These break copies (checkpoint directories in a temp dir, deep-copied configs, adapter
subclasses, fresh models); nothing here touches the fixtures or upstream code.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from harness.parity.reference import load_hf_tensors


# ------------------------------------------------------------------------------ checkpoints

def copy_checkpoint(src: str | Path, dst: str | Path, edit=None, sharded: bool = False) -> Path:
    """``src``'s config and tokenizer files plus its tensors after ``edit(tensors) -> tensors``,
    written as one ``model.safetensors`` or (``sharded``) two files with an index."""
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for p in src.iterdir():
        if p.is_file() and p.suffix != ".safetensors" and p.name != "model.safetensors.index.json":
            shutil.copy(p, dst / p.name)
    tensors = load_hf_tensors(src)
    if edit is not None:
        tensors = edit(dict(tensors))
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    if not sharded:
        save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
        return dst
    keys = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": keys[: len(keys) // 2],
              "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
    weight_map = {}
    for fname, ks in halves.items():
        save_file({k: tensors[k] for k in ks}, str(dst / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in ks})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (dst / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return dst


def edit_index(directory: Path, edit) -> None:
    path = Path(directory) / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    edit(index)
    path.write_text(json.dumps(index, indent=2))


def drop(key: str):
    def edit(t):
        del t[key]
        return t
    return edit


def transpose(key: str):
    def edit(t):
        t[key] = t[key].T.contiguous()
        return t
    return edit


def relayout(key: str):
    """The tensor's elements in transposed memory order, reshaped back to its own shape (a
    row-major / column-major mix-up; for a square matrix, a transpose): shapes cannot see it."""
    def edit(t):
        t[key] = t[key].T.contiguous().reshape(t[key].shape)
        return t
    return edit


def cast(key: str, dtype: torch.dtype):
    def edit(t):
        t[key] = t[key].to(dtype)
        return t
    return edit


def add(key: str, like: str):
    def edit(t):
        t[key] = torch.zeros_like(t[like])
        return t
    return edit


def add_orphan_shard(directory: Path, like_key: str = "model.norm.weight") -> Path:
    path = Path(directory) / "model-00003-of-00003.safetensors"
    save_file({"orphan." + like_key: torch.zeros(4)}, str(path), metadata={"format": "pt"})
    return path


# ------------------------------------------------------------------------------ adapters

def adapter_with_map(adapter, changes: dict):
    """A copy of a torchtitan state-dict adapter whose ``from_hf_map`` has ``changes``
    (HF abstract key -> native abstract key or None) applied; ``to_hf`` inverts the map as
    upstream does, so swaps are symmetric."""
    new = copy.copy(adapter)
    new.from_hf_map = {**adapter.from_hf_map, **changes}
    return new


class TransposingAdapter:
    """Wraps an adapter: ``from_hf`` puts the native tensors named in ``keys`` in transposed
    memory order, keeping their shape (for a square matrix, a transpose): an asymmetric
    conversion bug; ``to_hf`` is unchanged."""

    def __init__(self, inner, keys):
        self.inner, self.keys = inner, set(keys)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def to_hf(self, state):
        return self.inner.to_hf(state)

    def from_hf(self, hf_state):
        out = self.inner.from_hf(hf_state)
        return {k: (v.T.contiguous().reshape(v.shape) if k in self.keys else v) for k, v in out.items()}


class LossyAdapter(TransposingAdapter):
    """``to_hf`` rounds every tensor through bfloat16 (a lossy export)."""

    def __init__(self, inner):
        super().__init__(inner, ())

    def to_hf(self, state):
        return {k: v.to(torch.bfloat16).to(v.dtype) for k, v in self.inner.to_hf(state).items()}


# ------------------------------------------------------------------------------ configs

def with_rope(model_config, **changes):
    new = copy.deepcopy(model_config)
    for layer in new.layers:
        layer.attention.rope = dataclasses.replace(layer.attention.rope, **changes)
    return new


def with_rope_class(model_config, rope_config_cls):
    """Every layer's RoPE replaced by ``rope_config_cls`` with the same fields (e.g.
    ComplexRoPE: adjacent-pair rotation instead of rotate-half)."""
    new = copy.deepcopy(model_config)
    for layer in new.layers:
        old = layer.attention.rope
        fields = {f.name: getattr(old, f.name) for f in dataclasses.fields(old) if f.init}
        layer.attention.rope = rope_config_cls(**fields)
    return new


def with_norm_eps(model_config, eps: float):
    from torchtitan.models.common.nn_modules import RMSNorm

    new = copy.deepcopy(model_config)
    for _fqn, cfg, _parent, _attr in list(new.traverse(RMSNorm.Config)):
        cfg.eps = eps
    return new


def with_router(model_config, **changes):
    new = copy.deepcopy(model_config)
    for layer in new.layers:
        if layer.moe is not None:
            for k, v in changes.items():
                setattr(layer.moe.router, k, v)
    return new


def with_optimizer(trainer_config, **kwargs):
    new = copy.deepcopy(trainer_config)
    new.optimizer.param_groups[0].optimizer_kwargs.update(kwargs)
    return new


def with_lr_scheduler(trainer_config, **fields):
    new = copy.deepcopy(trainer_config)
    for k, v in fields.items():
        setattr(new.lr_scheduler, k, v)
    return new


# ------------------------------------------------------------------------------ HF models

def hf_norm_eps(model: torch.nn.Module, eps: float) -> None:
    for m in model.modules():
        if hasattr(m, "variance_epsilon"):
            m.variance_epsilon = eps


def hf_rope_theta(model: torch.nn.Module, theta: float) -> None:
    for m in model.modules():
        if hasattr(m, "inv_freq") and hasattr(m, "config"):
            d = m.inv_freq.numel() * 2
            inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
            m.inv_freq.copy_(inv)
