"""Config conformance: a torchtitan native Qwen3 model vs the HF ``config.json`` it claims to be.

The native side is read from the *built* model (meta device: no memory, any size), module by
module -- every RMSNorm's ``eps``, every attention's head counts, every MoE router's
``top_k`` / ``route_norm`` / ``score_func`` -- and its RoPE is run: each distinct RoPE config is
built on CPU for a few positions and applied to random q/k, then compared with an
independent rotate-half RoPE at the HF config's theta (so a wrong theta, a wrong frequency
formula or a wrong rotation convention all show). Two properties are exercised, not read:
word-embedding tying (the built ``lm_head.weight`` must *be* ``tok_embeddings.weight``, the
same tensor, not merely flagged as tied) and the attention scale (one attention module of the
built model is run on CPU with random weights and input, and its attention output is compared
with ``softmax(q k^T * head_dim^-0.5)`` at the HF config's ``head_dim``, computed from the q,
k, v the module itself produced). The HF side is the config.json, read without transformers
(:class:`~harness.registry.hf_config.Qwen3Arch`).

Known violations (confirmed upstream defects) are not listed here: they are entries of the
one registry, harness/registry/known_issues/ (check ``config_conformance``, ``subject``).

Every violation is listed (grouped per field and value, with the module count and the first
module), not just the first.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch import nn
from torchtitan.models.common import attention as titan_attention

from harness.kernels.ops.rope_torch import apply_rope, rope_cos_sin
from harness.model.build import meta_module
from harness.parity.conformance.checkpoint import Violation
from harness.parity.env import prepare_in_process
from harness.parity.settings import theta_from_cos_sin_cache
from harness.registry.hf_config import Qwen3Arch
from harness.registry.tolerances import parity_tolerance as tolerance
from harness.upstream import titan_api


@dataclass
class ConformanceReport:
    subject: str
    violations: list[Violation] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    rows: list[tuple[str, str, str, bool]] = field(default_factory=list)  # field, native, hf, ok

    @property
    def ok(self) -> bool:
        return not self.violations

    def fields(self) -> set[str]:
        return {v.key for v in self.violations}

    def format(self) -> str:
        width = max((len(r[0]) for r in self.rows), default=10)
        lines = [f"config conformance: {self.subject}",
                 f"  {'field':<{width}}  {'native (built model)':<26}  {'HF config.json':<26}"]
        for name, native, hf, ok in self.rows:
            lines.append(f"  {name:<{width}}  {native:<26}  {hf:<26}{'' if ok else '  <-- VIOLATION'}")
        lines.append(f"  {len(self.violations)} violation(s):")
        lines += [f"    {v}" for v in self.violations]
        if self.notes:
            lines.append("  notes (differences that do not change the computation):")
            lines += [f"    {n}" for n in self.notes]
        return "\n".join(lines)


def build_meta(model_config) -> nn.Module:
    """The model of ``model_config`` as given (no ``update_from_config``: the config under
    conformance is the one a config function wrote), on the meta device."""
    return meta_module(model_config)


def _values(pairs: list[tuple[str, object]]) -> dict[object, list[str]]:
    by_value: dict[object, list[str]] = defaultdict(list)
    for where, value in pairs:
        by_value[value].append(where)
    return by_value


class _Checker:
    def __init__(self, report: ConformanceReport):
        self.report = report

    def per_module(self, name: str, pairs: list[tuple[str, object]], expected, same=None) -> None:
        """``pairs``: (module path, native value). One row; one violation per wrong value."""
        same = same or (lambda a, b: a == b)
        by_value = _values(pairs)
        bad = {v: w for v, w in by_value.items() if not same(v, expected)}
        shown = ", ".join(f"{_fmt(v)} x{len(w)}" for v, w in by_value.items()) if len(by_value) > 1 \
            else (_fmt(next(iter(by_value))) if by_value else "absent")
        self.report.rows.append((name, shown, _fmt(expected), not bad and bool(pairs)))
        if not pairs:
            self.report.violations.append(Violation("config", name,
                                                    f"not present in the native model; HF {expected!r}"))
        for value, where in bad.items():
            self.report.violations.append(Violation(
                "config", name, f"native {_fmt(value)} in {len(where)} module(s) (first: {where[0]}), "
                                f"HF config.json {_fmt(expected)}"))

    def single(self, name: str, native, expected, same=None) -> None:
        self.per_module(name, [("model", native)], expected, same)


def _fmt(v) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _close(rel: float):
    return lambda a, b: (isinstance(a, (int, float)) and isinstance(b, (int, float))
                         and math.isclose(float(a), float(b), rel_tol=rel))


def _rope_probe(rope_config, arch: Qwen3Arch, n_heads: int = 2, positions: int = 64):
    """Run the native RoPE module on random q/k at two position orders and compare it with the
    independent rotate-half RoPE. Returns (max rel error at HF's theta, max rel error at the
    module's own configured theta, theta recovered from the module's cos/sin cache): the
    first fails for a wrong theta *or* a wrong computation, the second only for a wrong
    computation (frequency formula, rotation convention, position handling)."""
    cfg = dataclasses.replace(rope_config, max_seq_len=positions)
    with torch.device("cpu"):
        module = cfg.build()
    gen = torch.Generator().manual_seed(1234)
    D = arch.head_dim
    q = torch.randn(2, positions, n_heads, D, generator=gen)
    k = torch.randn(2, positions, n_heads, D, generator=gen)
    pos = torch.stack([torch.arange(positions), torch.arange(positions).flip(0)])  # two orders
    with torch.no_grad():
        q_n, k_n = module(q, k, pos)

    def rel_error(theta: float) -> float:
        cos, sin = rope_cos_sin(pos, D, theta, dtype=torch.float32)
        q_r, k_r = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        err = max(float((q_n - q_r).abs().max()), float((k_n - k_r).abs().max()))
        return err / max(float(q_r.abs().max()), float(k_r.abs().max()))

    theta = float("nan")
    cache = getattr(module, "cache", None)
    if cache is not None and cache.dim() == 2 and cache.shape[-1] == 2 * D:
        theta = theta_from_cos_sin_cache(cache, D)
    return rel_error(arch.rope_theta), rel_error(float(rope_config.theta)), theta


def _attention_scale_probe(attention: nn.Module, arch: Qwen3Arch, length: int = 16) -> tuple[float, str]:
    """Run a CPU copy of ``attention`` (one built module, random weights) on a random input;
    capture the q, k, v its ``inner_attention`` receives (after its own projections, q/k norm
    and RoPE) and the output it returns, and compare that output with causal
    ``softmax(q k^T * arch.head_dim^-0.5) v`` (GQA by repeating kv heads). Returns (max rel
    error, note); the error is NaN with a note when the inner attention cannot be run here."""
    prepare_in_process()
    module = copy.deepcopy(attention).to_empty(device="cpu")
    gen = torch.Generator().manual_seed(4321)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)
    # RoPE caches are buffers (uninitialised after to_empty): rebuild RoPE from its own config
    rope_cfg = dataclasses.replace(attention.rope.config, max_seq_len=max(length, 1))
    with torch.device("cpu"):
        module.rope = rope_cfg.build()
    dim = next(p for n, p in module.named_parameters() if n.startswith("qkv_linear")).shape[-1]
    x = torch.randn(1, length, dim, generator=gen)
    positions = torch.arange(length)[None]
    inner = module.inner_attention
    if isinstance(inner, titan_attention.FlexAttention):
        masks = titan_attention.create_attention_mask(
            titan_attention.get_causal_mask_mod(), 1, None, length, length, device="cpu")
    elif isinstance(inner, titan_attention.ScaledDotProductAttention):
        masks = None
    else:
        return float("nan"), f"{type(inner).__name__} cannot run here (not probed)"
    seen: dict = {}

    def pre(_m, args, kwargs):
        seen["qkv"] = [t.detach().clone() for t in args[:3]]

    def post(_m, _args, _kwargs, out):
        seen["out"] = out.detach().clone()

    h1 = inner.register_forward_pre_hook(pre, with_kwargs=True)
    h2 = inner.register_forward_hook(post, with_kwargs=True)
    try:
        with torch.no_grad():
            module(x, masks, positions)
    finally:
        h1.remove()
        h2.remove()
    q, k, v = (t.transpose(1, 2).double() for t in seen["qkv"])  # B N L H
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = (q @ k.transpose(-1, -2)) * arch.head_dim ** -0.5
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    want = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1) @ v  # B N L H
    got = seen["out"].double().transpose(1, 2)
    err = float((got - want).abs().max()) / float(want.abs().max())
    return err, ""


def _attention_scale_check(report: ConformanceReport, atts, arch: Qwen3Arch, rtol: float) -> None:
    """The scale the attention really applies, per distinct attention config (usually one)."""
    probed: dict[tuple, list] = {}
    for n, a in atts:
        key = (type(a.inner_attention).__qualname__, a.n_heads, a.n_kv_heads, a.head_dim,
               repr(getattr(a, "scaling", None)), repr(a.rope.config))
        if key not in probed:
            err, note = _attention_scale_probe(a, arch)
            probed[key] = [n, err, note, 0]
        probed[key][3] += 1
    worst = max((p[1] for p in probed.values()), default=float("nan"))
    bad = [p for p in probed.values() if not p[2] and not p[1] <= rtol]
    report.rows.append(("attention scale (run: output vs softmax(qk^T/sqrt(head_dim)))",
                        f"max rel err {worst:.2e}", f"head_dim {arch.head_dim}, <= {rtol:.1e}", not bad))
    for n, _err, note, _count in probed.values():
        if note:
            report.notes.append(f"attention scale of {n}: {note}")
    for n, err, _note, count in bad:
        report.violations.append(Violation(
            "config", "attention scale",
            f"{count} module(s) (first: {n}): attention output max rel error {err:.3e} (> {rtol:.1e}) "
            f"vs causal softmax(q k^T * {arch.head_dim}^-0.5) v on the module's own q, k, v"))


def config_violations(model_config, hf: dict, subject: str = "", rope_rtol: float | None = None,
                      build=None) -> ConformanceReport:
    """Every way the native model built from ``model_config`` differs from HF ``config.json``.

    ``build(model_config) -> module`` replaces the meta-device build (the self-tests plant
    defects in the built model this way)."""
    arch = Qwen3Arch.from_hf_dict(hf)
    report = ConformanceReport(subject or f"native vs {arch.model_type} config.json")
    check = _Checker(report)
    model = (build or build_meta)(model_config)
    attention_rtol = tolerance("activations", "float32").rtol
    layers = [(k, model.layers[k]) for k in sorted(model.layers.keys(), key=int)]

    check.single("vocab_size (tok_embeddings rows)", model.tok_embeddings.weight.shape[0], arch.vocab_size)
    check.single("vocab_size (lm_head rows)", model.lm_head.weight.shape[0], arch.vocab_size)
    check.single("hidden_size", model.tok_embeddings.weight.shape[1], arch.hidden_size)
    check.single("num_hidden_layers", len(layers), arch.num_hidden_layers)
    # the built parameters themselves, not the config flag: tied means one tensor
    check.single("tie_word_embeddings (lm_head.weight is tok_embeddings.weight)",
                 model.lm_head.weight is model.tok_embeddings.weight, arch.tie_word_embeddings)
    norms = [(n, m.eps) for n, m in model.named_modules() if isinstance(m, nn.RMSNorm)]
    check.per_module("rms_norm_eps (every RMSNorm)", norms, arch.rms_norm_eps, _close(1e-9))
    affine = [(n, m.weight is not None) for n, m in model.named_modules() if isinstance(m, nn.RMSNorm)]
    check.per_module("RMSNorm has a weight", affine, True)

    atts = [(f"layers.{k}.attention", layer.attention) for k, layer in layers]
    check.per_module("num_attention_heads", [(n, a.n_heads) for n, a in atts], arch.num_attention_heads)
    check.per_module("num_key_value_heads", [(n, a.n_kv_heads) for n, a in atts], arch.num_key_value_heads)
    check.per_module("head_dim", [(n, a.head_dim) for n, a in atts], arch.head_dim)
    _attention_scale_check(report, atts, arch, attention_rtol)
    check.per_module("qk_norm (Qwen3 q_norm/k_norm)", [(n, a.q_norm is not None and a.k_norm is not None)
                                                      for n, a in atts], True)
    biases = [(f"{n}.{sub}", getattr(mod, "bias", None) is not None)
              for n, a in atts for sub, mod in a.named_modules() if isinstance(mod, nn.Linear)]
    check.per_module("attention_bias (attention Linear biases)", biases, arch.attention_bias)

    # RoPE: config fields and a numerical probe of every distinct rope config
    ropes = [(f"{n}.rope", a.rope.config) for n, a in atts]
    check.per_module("rope_theta (rope config)", [(n, float(c.theta)) for n, c in ropes], arch.rope_theta, _close(1e-9))
    scaling = "none" if arch.rope_type == "default" else arch.rope_type
    check.per_module("rope scaling", [(n, c.scaling) for n, c in ropes], scaling)
    rtol = rope_rtol if rope_rtol is not None else tolerance("rope", "float32").rtol
    probes: dict[tuple, list] = {}
    for n, c in ropes:
        key = (type(c).__qualname__, *(repr(getattr(c, f.name)) for f in dataclasses.fields(c)))
        if key not in probes:
            rel_hf, rel_own, theta = _rope_probe(c, arch)
            probes[key] = [n, rel_hf, rel_own, theta, 0, float(c.theta)]
        probes[key][4] += 1
    for label, idx, what in (("RoPE output vs rotate-half at HF theta", 1, "RoPE computation"),
                             ("RoPE output vs rotate-half at its own theta", 2, "RoPE convention")):
        worst = max((p[idx] for p in probes.values()), default=float("nan"))
        bad = [p for p in probes.values() if not p[idx] <= rtol]
        report.rows.append((label, f"max rel err {worst:.2e}", f"<= {rtol:.1e}", not bad))
        for p in bad:
            n, count, theta, own = p[0], p[4], p[3], p[5]
            at = f"HF theta {arch.rope_theta:.6g}" if idx == 1 else f"the module's configured theta {own:.6g}"
            report.violations.append(Violation(
                "config", what,
                f"{count} module(s) (first: {n}): output max rel error {p[idx]:.3e} (> {rtol:.1e}) vs "
                f"rotate-half RoPE at {at}; theta recovered from the native cos/sin cache: {theta:.6g}"))
    seq = sorted({c.max_seq_len for _, c in ropes})
    if arch.max_position_embeddings and seq and max(seq) < arch.max_position_embeddings:
        report.notes.append(f"RoPE cache covers {max(seq)} positions, HF max_position_embeddings is "
                            f"{arch.max_position_embeddings}: longer training sequences are refused "
                            f"(update_from_config raises), not silently wrong")

    # feed-forward / MoE, layer by layer
    kinds = [(f"layers.{k}", bool(getattr(layer, "moe_enabled", False))) for k, layer in layers]
    for i, (n, is_moe) in enumerate(kinds):
        if is_moe != arch.layer_is_moe(i):
            report.violations.append(Violation(
                "config", "MoE layer placement",
                f"{n} is {'MoE' if is_moe else 'dense'} natively, HF config makes it "
                f"{'MoE' if arch.layer_is_moe(i) else 'dense'} (num_experts={arch.num_experts}, "
                f"decoder_sparse_step={arch.decoder_sparse_step}, mlp_only_layers={list(arch.mlp_only_layers)})"))
    report.rows.append(("MoE layers", str(sum(m for _, m in kinds)),
                        str(sum(arch.layer_is_moe(i) for i in range(arch.num_hidden_layers))),
                        all(m == arch.layer_is_moe(i) for i, (_, m) in enumerate(kinds))))
    dense = [(f"layers.{k}.feed_forward", layer.feed_forward) for k, layer in layers
             if not getattr(layer, "moe_enabled", False)]
    if dense:
        check.per_module("intermediate_size (dense w1 rows)", [(n, f.w1.weight.shape[0]) for n, f in dense],
                         arch.intermediate_size)
        check.per_module("intermediate_size (dense w2 cols)", [(n, f.w2.weight.shape[1]) for n, f in dense],
                         arch.intermediate_size)
    moes = [(f"layers.{k}.moe", layer.moe) for k, layer in layers if getattr(layer, "moe_enabled", False)]
    if moes and arch.is_moe:
        routers = [(f"{n}.router", m.router) for n, m in moes]
        experts = [(f"{n}.{titan_api.MOE_GROUPED_EXPERTS_PATH}", titan_api.moe_grouped_experts(m))
                   for n, m in moes]
        check.per_module("num_experts (router)", [(n, r.num_experts) for n, r in routers], arch.num_experts)
        check.per_module("num_experts (gate rows)", [(n, r.gate.weight.shape[0]) for n, r in routers], arch.num_experts)
        check.per_module("num_experts (expert weights)", [(n, e.w1_EFD.shape[0]) for n, e in experts], arch.num_experts)
        check.per_module("num_experts_per_tok (top_k)", [(n, r.top_k) for n, r in routers], arch.num_experts_per_tok)
        check.per_module("moe_intermediate_size", [(n, e.w1_EFD.shape[1]) for n, e in experts],
                         arch.moe_intermediate_size)
        check.per_module("norm_topk_prob (route_norm)", [(n, bool(r.route_norm)) for n, r in routers],
                         arch.norm_topk_prob)
        check.per_module("router score function", [(n, r.score_func) for n, r in routers], "softmax")
        check.per_module("router route_scale", [(n, float(r.route_scale)) for n, r in routers], 1.0, _close(1e-12))
        check.per_module("router expert groups (node-limited routing)",
                         [(n, r.num_expert_groups) for n, r in routers], None)
        check.per_module("shared experts", [(n, m.shared_experts is not None) for n, m in moes], False)
        coeffs = sorted({m.load_balance_coeff for _, m in moes}, key=str)
        report.notes.append(f"torchtitan-only aux-loss-free load balancing (load_balance_coeff={coeffs}): "
                            f"expert_bias_E shifts top-k selection during training and has no HF equivalent")
    return report


def conformance_outcome(report: ConformanceReport) -> tuple[str | None, dict]:
    """(problem, observed) of the ``config_conformance`` check for ``known_issues.judge``:
    observed ``violated_fields`` = the sorted violated field names."""
    problem = None if report.ok else f"{len(report.violations)} violation(s):\n{report.format()}"
    return problem, {"violated_fields": tuple(sorted(report.fields()))}
