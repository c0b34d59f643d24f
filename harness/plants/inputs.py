"""Plants realised as broken copies of inputs (see harness/plants/__init__.py).

A plant's ``make`` breaks a copy: a checkpoint directory written to a temp dir, a deep-copied
config, a wrapped adapter, or a freshly built model. Nothing here touches the fixtures or
upstream code. tests/parity/test_checks_catch_planted.py shows each check failing on its plant
and naming the problem. The functions above ``COPY_PLANTS`` are the tools the plants are made with.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from harness.kernels.ops.rope_torch import rope_inv_freq
from harness.plants import Plant
from harness.references.model import load_hf_tensors

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
    from torchtitan.models.common.nn_modules import RMSNorm  # noqa: PLC0415  heavy: torchtitan; the plants' registry builds without it

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

def hf_rope_theta(model: torch.nn.Module, theta: float) -> torch.nn.Module:
    """Every HF rotary module's inv_freq recomputed (by the one RoPE reference) at ``theta``."""
    for m in model.modules():
        if hasattr(m, "inv_freq") and hasattr(m, "config"):
            m.inv_freq.copy_(rope_inv_freq(m.inv_freq.numel() * 2, theta).to(m.inv_freq.dtype))
    return model


# ------------------------------------------------------------------------------ models in place

def untie_lm_head(model: torch.nn.Module) -> torch.nn.Module:
    """A native model (real or meta) whose lm_head holds its own copy of the embedding."""
    model.lm_head.weight = torch.nn.Parameter(model.tok_embeddings.weight.detach().clone())
    return model


def double_attention_scale_dim(model: torch.nn.Module) -> torch.nn.Module:
    """Attention scaled by (2 * head_dim)^-0.5 instead of head_dim^-0.5."""
    for layer in model.layers.values():
        layer.attention.scaling = (2 * layer.attention.head_dim) ** -0.5
    return model


def freeze_down_proj(model: torch.nn.Module) -> torch.nn.Module:
    """Layer 1's down projection frozen (requires_grad=False): torchtitan's optimizer skips it."""
    model.layers["1"].feed_forward.w2.weight.requires_grad_(False)
    return model


def rename_hf_router(model: torch.nn.Module) -> torch.nn.Module:
    """Layer 0's HF MoE router moved from ``mlp.gate`` to ``mlp.router`` (a transformers rename)."""
    mlp = model.model.layers[0].mlp
    mlp.router = mlp.gate
    del mlp.gate
    return model


def with_extra_native_tensor(state: dict) -> dict:
    return {**state, "layers.0.attention.extra_scale": torch.ones(4)}


# ------------------------------------------------------------------------------ the plants

Q = "model.layers.0.self_attn.q_proj.weight"
O_PROJ = "model.layers.0.self_attn.o_proj.weight"  # hidden x (heads * head_dim)
DOWN = "model.layers.1.mlp.down_proj.weight"  # hidden x intermediate
INV_FREQ = "model.layers.0.self_attn.rotary_emb.inv_freq"
ORPHAN_SHARD = "model-00003-of-00003.safetensors"
SECOND_SHARD = "model-00002-of-00002.safetensors"


def drifted_curve(losses, from_step: int = 51, ulps: int = 1) -> list[float]:
    """A loss curve that drifts slowly: every loss from ``from_step`` on moved up by ``ulps``
    float32 ulps (what a nightly's curve shows when its numbers creep, invisibly to any band)."""
    out = []
    for step, loss in enumerate(losses, start=1):
        value = torch.tensor(float(loss), dtype=torch.float32)
        for _ in range(ulps if step >= from_step else 0):
            value = torch.nextafter(value, torch.tensor(float("inf")))
        out.append(float(value))
    return out


def first_key_in_shard(directory: Path, shard_prefix: str) -> str:
    index = json.loads((Path(directory) / "model.safetensors.index.json").read_text())
    return sorted(k for k, f in index["weight_map"].items() if f.startswith(shard_prefix))[0]


def _copy(edit):
    return lambda src, dst: copy_checkpoint(src, dst, edit)


def _sharded(then):
    def make(src, dst):
        directory = copy_checkpoint(src, dst, sharded=True)
        then(directory)
        return directory
    return make


def _key_in_wrong_file(d):
    key = first_key_in_shard(d, "model-00001")
    edit_index(d, lambda idx: idx["weight_map"].__setitem__(key, SECOND_SHARD))


def _stored_twice(d):
    first = Path(d) / "model-00001-of-00002.safetensors"
    tensors = load_hf_tensors(d)
    wm = json.loads((Path(d) / "model.safetensors.index.json").read_text())["weight_map"]
    keep = {k: tensors[k] for k, f in wm.items() if f == first.name}
    other = first_key_in_shard(d, "model-00002")
    keep[other] = tensors[other]
    save_file(keep, str(first), metadata={"format": "pt"})


def _total_size_plus_4(d):
    edit_index(d, lambda idx: idx["metadata"].__setitem__("total_size", idx["metadata"]["total_size"] + 4))


def _complex_rope(model_config):
    from torchtitan.models.common.rope import ComplexRoPE  # noqa: PLC0415  heavy: torchtitan; the plants' registry builds without it

    return with_rope_class(model_config, ComplexRoPE.Config)


_SWAP_Q_K = {"model.layers.{}.self_attn.q_proj.weight": "layers.{}.attention.qkv_linear.wk.weight",
             "model.layers.{}.self_attn.k_proj.weight": "layers.{}.attention.qkv_linear.wq.weight"}

CHECKPOINT, ADAPTER, CONFIG, MODEL, GOLDEN = "checkpoint", "adapter", "config", "model", "golden"

COPY_PLANTS = (
    # checkpoint files: make(src_dir, dst_dir) -> the broken copy's directory
    Plant("checkpoint_drops_q_proj", CHECKPOINT, f"{Q} left out of the files",
          ("checkpoint conformance: missing", "reload: missing_keys"), make=_copy(drop(Q))),
    Plant("checkpoint_transposes_down_proj", CHECKPOINT, f"{DOWN} stored transposed",
          ("checkpoint conformance: shape",), make=_copy(transpose(DOWN))),
    Plant("checkpoint_relayouts_o_proj", CHECKPOINT,
          f"{O_PROJ}'s elements in transposed order, reshaped to its own shape",
          ("tensor equality: transposed",), make=_copy(relayout(O_PROJ))),
    Plant("checkpoint_q_proj_in_bf16", CHECKPOINT, f"{Q} stored in bfloat16",
          ("checkpoint conformance: dtype",), make=_copy(cast(Q, torch.bfloat16))),
    Plant("checkpoint_writes_inv_freq", CHECKPOINT, f"a non-persistent buffer {INV_FREQ} written out",
          ("checkpoint conformance: unexpected",), make=_copy(add(INV_FREQ, "model.norm.weight"))),
    Plant("checkpoint_writes_tied_lm_head", CHECKPOINT, "lm_head.weight written despite tie_word_embeddings",
          ("checkpoint conformance: unexpected (tied)",),
          make=_copy(add("lm_head.weight", "model.embed_tokens.weight"))),
    Plant("shards_orphan_file", CHECKPOINT, f"a shard {ORPHAN_SHARD} the index does not list",
          ("shard index",), make=_sharded(add_orphan_shard)),
    Plant("shards_listed_file_absent", CHECKPOINT, f"{SECOND_SHARD} listed in the index but absent",
          ("shard index", "checkpoint conformance: missing"),
          make=_sharded(lambda d: (Path(d) / SECOND_SHARD).unlink())),
    Plant("shards_key_indexed_in_wrong_file", CHECKPOINT, "the first key of shard 1 indexed under shard 2",
          ("shard index",), make=_sharded(_key_in_wrong_file)),
    Plant("shards_key_unindexed", CHECKPOINT, f"{Q} missing from the index's weight_map",
          ("shard index",), make=_sharded(lambda d: edit_index(d, lambda idx: idx["weight_map"].pop(Q)))),
    Plant("shards_total_size_wrong", CHECKPOINT, "the index's metadata.total_size 4 bytes too large",
          ("shard index: total_size",), make=_sharded(_total_size_plus_4)),
    Plant("shards_tensor_stored_twice", CHECKPOINT, "the first key of shard 2 also stored in shard 1",
          ("shard index",), make=_sharded(_stored_twice)),
    Plant("shards_without_index", CHECKPOINT, "two shard files and no model.safetensors.index.json",
          ("shard index",), make=_sharded(lambda d: (Path(d) / "model.safetensors.index.json").unlink())),
    # state-dict adapters: make(adapter) -> a broken copy
    Plant("adapter_drops_q_norm", ADAPTER, "q_norm mapped to nothing: the native parameter keeps its init",
          ("load report", "adapter coverage"),
          make=lambda a: adapter_with_map(a, {"model.layers.{}.self_attn.q_norm.weight": None})),
    Plant("adapter_swaps_q_k", ADAPTER, "q_proj and k_proj mapped the wrong way round",
          ("load: size mismatch",), make=lambda a: adapter_with_map(a, _SWAP_Q_K)),
    Plant("adapter_transposes_wo", ADAPTER, "from_hf puts layer 1's wo in transposed memory order",
          ("logits parity", "adapter round trip"),
          make=lambda a: TransposingAdapter(a, {"layers.1.attention.wo.weight"})),
    Plant("adapter_lossy_export", ADAPTER, "to_hf rounds every tensor through bfloat16",
          ("adapter round trip",), make=LossyAdapter),
    Plant("native_tensor_without_hf_name", ADAPTER, "a native tensor the adapter has no HF name for",
          ("adapter coverage",), make=with_extra_native_tensor),
    # model configs: make(config, ...) -> a broken deep copy
    Plant("rope_theta_1e4", CONFIG, "every layer's RoPE theta set to 1e4",
          ("config conformance: rope_theta", "config conformance: RoPE computation"),
          make=lambda c: with_rope(c, theta=1e4)),
    Plant("rope_adjacent_pairs", CONFIG, "adjacent-pair (complex) RoPE instead of rotate-half, same theta",
          ("config conformance: RoPE convention",), make=_complex_rope),
    Plant("rms_norm_eps_changed", CONFIG, "every RMSNorm's eps changed (default 1e-5)",
          ("config conformance: rms_norm_eps", "activation parity"),
          make=lambda c, eps=1e-5: with_norm_eps(c, eps)),
    Plant("router_not_normalised", CONFIG, "MoE router without top-k renormalisation (route_norm off)",
          ("config conformance: norm_topk_prob", "routing weights"),
          make=lambda c, **more: with_router(c, route_norm=False, **more)),
    Plant("adam_constants_changed", CONFIG, "AdamW betas (0.9, 0.99) and weight decay 0.01",
          ("optimizer hyperparameters",),
          make=lambda t: with_optimizer(t, betas=(0.9, 0.99), weight_decay=0.01)),
    Plant("adam_beta2_changed", CONFIG, "AdamW beta2 0.95 -> 0.99", ("update trajectory",),
          make=lambda t: with_optimizer(t, betas=(0.9, 0.99))),
    Plant("lr_schedule_changed", CONFIG, "3 warmup steps and cosine decay",
          ("optimizer hyperparameters",),
          make=lambda t: with_lr_scheduler(t, warmup_steps=3, decay_type="cosine")),
    # loss curves: make(losses) -> a drifted copy
    Plant("golden_curve_drifts", GOLDEN, "a 100-step loss curve one float32 ulp high from step 51 on",
          ("golden curve: bit for bit",), make=drifted_curve),
    # built models, edited in place: make(model) -> model
    Plant("untied_lm_head", MODEL, "lm_head holds its own tensor although the config says tied",
          ("tied embeddings", "config conformance: tie_word_embeddings"), make=untie_lm_head),
    Plant("attention_scale_doubled_dim", MODEL, "attention scaled by (2 * head_dim)^-0.5",
          ("config conformance: attention scale",), make=double_attention_scale_dim),
    Plant("down_proj_frozen", MODEL, "layer 1's down projection frozen in real training",
          ("update agreement: frozen",), make=freeze_down_proj),
    Plant("hf_rope_theta_1e4", MODEL, "the transformers model's inv_freq computed with theta 1e4",
          ("settings table", "activation parity"), make=lambda m: hf_rope_theta(m, 1e4)),
    Plant("hf_router_renamed", MODEL, "the HF MoE router renamed away from mlp.gate",
          ("activation recording: no router module",), make=rename_hf_router),
)
