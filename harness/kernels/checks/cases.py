"""Input cases for every operator: real Qwen3 shapes with few tokens, and edge cases.

Every builder draws from the seeded generator it is given (seed = crc32("op/case"), see
``Case.seed``); floating inputs are float64 masters. Shapes: Qwen3-4B (head_dim 128, 32 query
heads, 8 KV heads, hidden 2560, vocab 151936) and Qwen3-30B-A3B (hidden 2048, expert hidden
768, 128 experts top-8, and the 64-expert top-4 cut), with a handful of tokens so the CPU
suite stays fast.
"""

from __future__ import annotations

import torch

from harness.kernels.checks.spec import Case
from harness.kernels.ops.cross_entropy_torch import IGNORE_INDEX

F64 = torch.float64

QWEN3_ROPE_THETA = 1_000_000.0
QWEN3_RMS_EPS = 1e-6
QWEN3_VOCAB = 151936
HEAD_DIM = 128


def _randn(gen: torch.Generator, *shape, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=F64) * scale


def _row_scales(gen: torch.Generator, rows: int, exponents: list[int]) -> torch.Tensor:
    """Per-row powers of two cycling through ``exponents`` (bf16/fp32 share the exponent range)."""
    return torch.tensor([2.0 ** exponents[i % len(exponents)] for i in range(rows)], dtype=F64)


# ---------------------------------------------------------------- rotary embedding


def _rope(batch: int, seq: int, heads: int, positions_fn, scales=None):
    def build(gen: torch.Generator) -> dict[str, torch.Tensor]:
        x = _randn(gen, batch, seq, heads, HEAD_DIM)
        if scales is not None:
            x = x * _row_scales(gen, batch * seq * heads, scales).reshape(batch, seq, heads, 1)
        return {"x": x, "positions": positions_fn(gen)}

    return build


def rope_cases() -> tuple[Case, ...]:
    p = {"theta": QWEN3_ROPE_THETA}
    return (
        Case("qwen3_4b_q", _rope(1, 4, 32, lambda g: torch.arange(4)[None]), p, "Qwen3-4B queries: 32 heads x 128"),
        Case(
            "qwen3_4b_kv_packed",
            _rope(2, 6, 8, lambda g: torch.tensor([[0, 1, 2, 0, 1, 2], [5, 6, 7, 8, 9, 10]])),
            p,
            "Qwen3-4B keys: 8 KV heads, per-sample positions with a document restart",
        ),
        Case("single_token", _rope(1, 1, 1, lambda g: torch.tensor([[7]])), p, "one token, one head"),
        Case(
            "long_positions",
            _rope(1, 4, 8, lambda g: torch.randint(32768, 40960, (1, 4), generator=g)),
            p,
            "positions in [32768, 40960): Qwen3's 40k context",
        ),
        Case(
            "bf16_extremes",
            _rope(1, 5, 4, lambda g: torch.arange(5)[None], scales=[-100, -50, 0, 50, 120]),
            p,
            "head vectors scaled 2^-100 .. 2^120 (bfloat16's exponent range)",
        ),
    )


def rope_gradcheck_case() -> Case:
    def build(gen):
        return {"x": _randn(gen, 2, 3, 2, 8), "positions": torch.tensor([[0, 5, 9], [3, 4, 5]])}

    return Case("gradcheck", build, {"theta": 10000.0})


# ---------------------------------------------------------------- RMSNorm


def _rms(shape, scales=None, outlier: bool = False):
    def build(gen: torch.Generator) -> dict[str, torch.Tensor]:
        x = _randn(gen, *shape)
        rows = x.numel() // shape[-1]
        if scales is not None:
            x = x * _row_scales(gen, rows, scales).reshape(*shape[:-1], 1)
        if outlier:
            x[..., 3] *= 2.0**10
        weight = 1.0 + _randn(gen, shape[-1], scale=0.1)
        return {"x": x, "weight": weight}

    return build


def rmsnorm_cases() -> tuple[Case, ...]:
    p = {"eps": QWEN3_RMS_EPS}
    return (
        Case("qwen3_4b_hidden", _rms((1, 4, 2560)), p, "Qwen3-4B hidden size 2560"),
        Case("qwen3_qk_norm", _rms((1, 3, 8, HEAD_DIM)), p, "per-head q/k norm over head_dim 128"),
        Case("qwen3_30b_hidden", _rms((2, 3, 2048)), p, "Qwen3-30B-A3B hidden size 2048"),
        Case("single_token", _rms((1, 1, 2560)), p, "one token"),
        Case(
            "bf16_extremes",
            _rms((1, 5, 256), scales=[-40, -20, 0, 20, 40], outlier=True),
            p,
            "rows scaled 2^-40 .. 2^40 (tiny rows: eps dominates) plus a 2^10 outlier channel",
        ),
    )


def rmsnorm_gradcheck_case() -> Case:
    return Case("gradcheck", _rms((2, 3, 8)), {"eps": 1e-6})


# ---------------------------------------------------------------- MoE router


def _router(tokens: int, dim: int, experts: int, gate_std: float = 0.02, shape_fn=None):
    def build(gen: torch.Generator) -> dict[str, torch.Tensor]:
        x = _randn(gen, tokens, dim)
        gate = _randn(gen, experts, dim, scale=gate_std)
        if shape_fn is not None:
            x, gate = shape_fn(gen, x, gate)
        return {"x": x, "gate_weight": gate}

    return build


def _all_to_one(gen, x, gate):
    """A constant feature every token carries, read only by expert 5: it wins every token."""
    x[:, 0] = 10.0
    gate[:, 0] = 0.0
    gate[5, 0] = 2.0
    return x, gate


def _boundary_tie(near: bool):
    """Experts 0, 1, 3 always lead; experts 2 and 9 tie for the 4th slot (top_k=4) for every
    token -- exactly (identical gate rows) or nearly (rows 2^-30 apart, below float32/bf16
    resolution of the logits once rounded)."""

    def shape(gen, x, gate):
        direction = _randn(gen, x.shape[1])
        direction = direction / direction.norm()
        x = x + 4.0 * direction
        gate = gate * 0.01
        for expert, strength in ((0, 3.0), (1, 2.5), (3, 2.0), (2, 1.5)):
            gate[expert] += strength * direction
        gate[9] = gate[2] * (1.0 + 2.0**-30) if near else gate[2]
        return x, gate

    return shape


def _saturate(gen, x, gate):
    return x * 2.0**6, gate * 25.0


def router_cases() -> tuple[Case, ...]:
    return (
        Case("qwen3_30b_a3b", _router(6, 2048, 128), {"top_k": 8}, "Qwen3-30B-A3B: 128 experts, top-8"),
        Case("qwen3_30b_64e_top4", _router(6, 2048, 64), {"top_k": 4}, "the 64-expert top-4 cut"),
        Case("single_token", _router(1, 256, 16), {"top_k": 4}, "one token"),
        Case("all_to_one_expert", _router(8, 256, 16, shape_fn=_all_to_one), {"top_k": 1},
             "every token routed to expert 5"),
        Case("exact_ties", _router(8, 256, 16, shape_fn=_boundary_tie(False)), {"top_k": 4}, "4th slot tied exactly"),
        Case("near_ties", _router(8, 256, 16, shape_fn=_boundary_tie(True)), {"top_k": 4},
             "4th slot tied within 2^-30"),
        Case(
            "bf16_extremes",
            _router(6, 256, 32, shape_fn=_saturate),
            {"top_k": 4},
            "logits in the thousands: softmax saturates, non-max probabilities underflow to exact ties at 0",
        ),
    )


def router_gradcheck_case() -> Case:
    return Case("gradcheck", _router(3, 8, 6, gate_std=0.5), {"top_k": 2})


# ---------------------------------------------------------------- grouped SwiGLU


def _swiglu(dim: int, hidden: int, counts: list[int], scales=None, weight_std: float = 0.02):
    def build(gen: torch.Generator) -> dict[str, torch.Tensor]:
        experts = len(counts)
        rows = sum(counts)
        x = _randn(gen, rows, dim)
        if scales is not None:
            x = x * _row_scales(gen, rows, scales)[:, None]
        return {
            "x": x,
            "num_tokens_per_expert": torch.tensor(counts, dtype=torch.int64),
            "w1": _randn(gen, experts, hidden, dim, scale=weight_std),
            "w2": _randn(gen, experts, dim, hidden, scale=weight_std),
            "w3": _randn(gen, experts, hidden, dim, scale=weight_std),
        }

    return build


def swiglu_cases() -> tuple[Case, ...]:
    return (
        Case(
            "qwen3_30b_dims",
            _swiglu(2048, 768, [5]),
            note="Qwen3-30B-A3B expert dims (2048 -> 768 -> 2048), one expert, 5 rows (grouping: other cases); "
            "bfloat16 only, the training dtype, to keep the CPU suite fast",
            dtypes=(torch.bfloat16,),
        ),
        Case("many_experts", _swiglu(64, 32, [3, 0, 1, 5, 0, 0, 2, 4, 1, 0, 3, 1, 0, 2, 1, 1]),
             note="16 experts, several empty"),
        Case("single_token", _swiglu(64, 32, [0, 0, 1, 0]), note="one routed row"),
        Case("all_rows_one_expert", _swiglu(64, 32, [0, 0, 0, 16, 0, 0, 0, 0]), note="every row on expert 3"),
        Case("empty_first_last", _swiglu(64, 32, [0, 5, 3, 0]), note="first and last expert get no row"),
        Case(
            "bf16_extremes",
            _swiglu(64, 32, [4, 3, 3], scales=[-20, -10, 0, 10, 20], weight_std=0.2),
            note="rows scaled 2^-20 .. 2^20",
        ),
    )


def swiglu_gradcheck_case() -> Case:
    return Case("gradcheck", _swiglu(6, 4, [2, 0, 3], weight_std=0.5))


# ---------------------------------------------------------------- cross-entropy


def _ce(batch: int, length: int, vocab: int, ignored: int = 0, logit_scale: float = 2.0, row_exponents=None):
    def build(gen: torch.Generator) -> dict[str, torch.Tensor]:
        logits = _randn(gen, batch, length, vocab, scale=logit_scale)
        if row_exponents is not None:
            logits = logits * _row_scales(gen, batch * length, row_exponents).reshape(batch, length, 1)
        labels = torch.randint(0, vocab, (batch, length), generator=gen)
        flat = labels.reshape(-1)
        flat[torch.randperm(flat.numel(), generator=gen)[:ignored]] = IGNORE_INDEX
        return {"logits": logits, "labels": flat.reshape(batch, length)}

    return build


def ce_cases() -> tuple[Case, ...]:
    return (
        Case("qwen3_vocab", _ce(1, 4, QWEN3_VOCAB, ignored=1), note="full Qwen3 vocab 151936, 4 positions, 1 ignored"),
        Case("single_token", _ce(1, 1, QWEN3_VOCAB), note="one position, full vocab"),
        Case("small_vocab_batch", _ce(2, 5, 512, ignored=2), note="batch 2, 2 ignored labels"),
        Case(
            "bf16_extremes",
            _ce(1, 6, 512, row_exponents=[-20, -6, 0, 6, 9, 10]),
            note="logit rows scaled 2^-20 (uniform) .. 2^10 (saturated, |logit| ~ 1e4)",
        ),
    )


def ce_gradcheck_case() -> Case:
    return Case("gradcheck", _ce(2, 3, 7, ignored=1))
