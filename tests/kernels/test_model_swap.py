"""use_custom_ops on a small Qwen3 MoE config: the built model carries the custom-op modules,
every other config field is unchanged, and forward+backward equal the unswapped model's
exactly (the operators are the same computation as torchtitan's)."""

from __future__ import annotations

import pytest
import torch

from harness.upstream import titan_api

pytest.importorskip("torchtitan")

import torchtitan.models.qwen3 as qwen3
from torchtitan.models.common import CosSinRoPE, Embedding, Linear
from torchtitan.models.common.attention import ScaledDotProductAttention
from torchtitan.models.common.moe import GroupedExperts
from torchtitan.models.common.rope import ComplexRoPE

from harness.kernels.ops import CustomOpCosSinRoPE, CustomOpGroupedExperts, use_custom_ops

DIM, VOCAB, LAYERS = 64, 128, 2

# F2 (known issue kernel-titan-router-cpu-autocast-bf16-scores, harness/registry/known_issues/):
# torchtitan's router warns that CPU autocast ignores float32.
pytestmark = pytest.mark.filterwarnings("ignore:In CPU autocast:UserWarning")


def _tiny_moe_config(moe: bool = True) -> qwen3.Qwen3Model.Config:
    """A Qwen3 MoE config built by torchtitan's own layer builder, at toy size.

    Attention runs through SDPA (causal) because FlexAttention has no CPU backward; the swap
    does not touch attention."""
    common = dict(n_layers=LAYERS, dim=DIM, n_heads=4, n_kv_heads=2, head_dim=16, attn_backend="flex",
                  rope=CosSinRoPE.Config(dim=16, max_seq_len=64, theta=1e6))
    if moe:
        layers = qwen3._build_qwen3_moe_layers(
            **common, moe_hidden_dim=32, num_experts=8, top_k=2, moe_comm_backend="standard"
        )
    else:
        layers = qwen3._build_qwen3_layers(**common, hidden_dim=96)
    for layer in layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
        if hasattr(layer.attention, "mask_type"):  # spring-2026 main: SDPA takes causal masks only
            layer.attention.mask_type = "causal"
    return qwen3.Qwen3Model.Config(
        vocab_size=VOCAB, dim=DIM, norm=qwen3._qwen3_norm(DIM),
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=DIM, param_init=qwen3._EMBEDDING_INIT),
        lm_head=Linear.Config(in_features=DIM, out_features=VOCAB, param_init=qwen3._LINEAR_INIT),
        layers=layers,
    )


def swapped_modules(model) -> list[str]:
    """Names of layers whose rope / experts are NOT the custom-op variants (empty = all swapped)."""
    missing = []
    for name, layer in model.layers.items():
        if type(layer.attention.rope) is not CustomOpCosSinRoPE:
            missing.append(f"layers.{name}.attention.rope")
        if layer.moe_enabled and type(titan_api.moe_grouped_experts(layer.moe)) is not CustomOpGroupedExperts:
            missing.append(f"layers.{name}.moe experts")
    return missing


def forward_backward(model, dtype):
    model = model.to(dtype)
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, VOCAB, (2, 12), generator=g)
    positions = torch.arange(12).repeat(2, 1)
    logits = model(tokens, positions, None)
    loss = logits.float().log_softmax(-1).gather(-1, tokens[..., None]).sum()
    loss.backward()
    return [logits.detach()] + [p.grad for _, p in sorted(model.named_parameters())]


def _pair(dtype):
    config = _tiny_moe_config()
    swapped_config = use_custom_ops(config)
    torch.manual_seed(0)
    reference = config.build()
    reference.init_states()
    swapped = swapped_config.build()
    swapped.load_state_dict(reference.state_dict())
    return reference, swapped


def test_use_custom_ops_swaps_every_layer_and_nothing_else():
    config = _tiny_moe_config()
    swapped = use_custom_ops(config)
    assert swapped is not config
    for original, new in zip(config.layers, swapped.layers, strict=True):
        assert type(original.attention.rope) is CosSinRoPE.Config  # the input is not mutated
        assert type(titan_api.moe_grouped_experts(original.moe)) is GroupedExperts.Config
        assert type(new.attention.rope) is CustomOpCosSinRoPE.Config
        assert type(titan_api.moe_grouped_experts(new.moe)) is CustomOpGroupedExperts.Config
        for a, b in ((original.attention.rope, new.attention.rope),
                     (titan_api.moe_grouped_experts(original.moe), titan_api.moe_grouped_experts(new.moe))):
            assert a.to_dict() == b.to_dict()  # every field (callables compared by repr)
    assert config.to_dict() == swapped.to_dict()  # every field, nested, is unchanged


def test_use_custom_ops_on_a_dense_qwen3_swaps_rope_only():
    swapped = use_custom_ops(_tiny_moe_config(moe=False))
    assert all(type(layer.attention.rope) is CustomOpCosSinRoPE.Config for layer in swapped.layers)
    assert all(layer.moe is None for layer in swapped.layers)


def test_use_custom_ops_rejects_what_it_cannot_swap():
    with pytest.raises(TypeError):
        use_custom_ops(CosSinRoPE.Config(dim=16, max_seq_len=8))
    config = _tiny_moe_config()
    config.layers[1].attention.rope = ComplexRoPE.Config(dim=16, max_seq_len=64)
    with pytest.raises(ValueError, match="layer 1"):
        use_custom_ops(config)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swapped_model_matches_torchtitan_exactly(dtype):
    reference, swapped = _pair(dtype)
    assert swapped_modules(swapped) == [] and len(swapped_modules(reference)) == 2 * LAYERS
    for a, b in zip(forward_backward(reference, dtype), forward_backward(swapped, dtype), strict=True):
        assert a is not None and b is not None and torch.equal(a, b)


def test_checker_catches_a_partial_swap():
    config = _tiny_moe_config()
    swapped = use_custom_ops(config)
    swapped.layers[-1].attention.rope = config.layers[-1].attention.rope  # planted: last layer left stock
    assert swapped_modules(swapped.build()) == [f"layers.{LAYERS - 1}.attention.rope"]


def test_checker_catches_a_one_ulp_weight_difference():
    reference, swapped = _pair(torch.float32)
    with torch.no_grad():
        w = swapped.norm.weight
        w[0] = torch.nextafter(w[0], torch.tensor(float("inf")))
    results = zip(forward_backward(reference, torch.float32), forward_backward(swapped, torch.float32),
                  strict=True)
    assert not all(torch.equal(a, b) for a, b in results)
