"""Config conformance: a torchtitan native Qwen3 model vs the HF ``config.json`` it claims to be.

The native side is read from the *built* model (meta device: no memory, any size), module by
module -- every RMSNorm's ``eps``, every attention's head counts, every MoE router's
``top_k`` / ``route_norm`` / ``score_func`` -- and its RoPE is run: each distinct RoPE config is
built on CPU for a few positions and applied to random q/k, then compared with an
independent rotate-half RoPE at the HF config's theta (so a wrong theta, a wrong frequency
formula or a wrong rotation convention all show). The HF side is the config.json, read
without transformers (:class:`~harness.parity.spec.Qwen3Arch`).

Every violation is listed (grouped per field and value, with the module count and the first
module), not just the first.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from harness.parity import reference
from harness.parity.checkpoint import Violation
from harness.parity.spec import Qwen3Arch


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


KNOWN_VIOLATIONS = Path(__file__).with_name("known_config_violations.toml")


def known_violations(path: Path = KNOWN_VIOLATIONS) -> list[dict]:
    """Confirmed-defect violations, as data: [{subject, reference, defect, fields}]."""
    return tomllib.loads(Path(path).read_text()).get("known", [])


def build_meta(model_config) -> nn.Module:
    with torch.device("meta"):
        return model_config.build()


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
            self.report.violations.append(Violation("config", name, f"not present in the native model; HF {expected!r}"))
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
        cos, sin = reference.rope_cos_sin(pos, D, theta)
        q_r, k_r = reference.apply_rope(q, cos, sin), reference.apply_rope(k, cos, sin)
        err = max(float((q_n - q_r).abs().max()), float((k_n - k_r).abs().max()))
        return err / max(float(q_r.abs().max()), float(k_r.abs().max()))

    theta = float("nan")
    cache = getattr(module, "cache", None)
    if cache is not None and cache.dim() == 2 and cache.shape[-1] == 2 * D:
        from harness.parity.settings import theta_from_cos_sin_cache

        theta = theta_from_cos_sin_cache(cache, D)
    return rel_error(arch.rope_theta), rel_error(float(rope_config.theta)), theta


def config_violations(model_config, hf: dict, subject: str = "", rope_rtol: float | None = None) -> ConformanceReport:
    """Every way the native model built from ``model_config`` differs from HF ``config.json``."""
    from harness.tolerances import parity_tolerance as tolerance

    arch = Qwen3Arch.from_hf_dict(hf)
    report = ConformanceReport(subject or f"native vs {arch.model_type} config.json")
    check = _Checker(report)
    model = build_meta(model_config)
    layers = [(k, model.layers[k]) for k in sorted(model.layers.keys(), key=int)]

    check.single("vocab_size (tok_embeddings rows)", model.tok_embeddings.weight.shape[0], arch.vocab_size)
    check.single("vocab_size (lm_head rows)", model.lm_head.weight.shape[0], arch.vocab_size)
    check.single("hidden_size", model.tok_embeddings.weight.shape[1], arch.hidden_size)
    check.single("num_hidden_layers", len(layers), arch.num_hidden_layers)
    check.single("tie_word_embeddings", model.lm_head.weight is model.tok_embeddings.weight
                 or bool(getattr(model, "enable_weight_tying", False)), arch.tie_word_embeddings)
    norms = [(n, m.eps) for n, m in model.named_modules() if isinstance(m, nn.RMSNorm)]
    check.per_module("rms_norm_eps (every RMSNorm)", norms, arch.rms_norm_eps, _close(1e-9))
    affine = [(n, m.weight is not None) for n, m in model.named_modules() if isinstance(m, nn.RMSNorm)]
    check.per_module("RMSNorm has a weight", affine, True)

    atts = [(f"layers.{k}.attention", l.attention) for k, l in layers]
    check.per_module("num_attention_heads", [(n, a.n_heads) for n, a in atts], arch.num_attention_heads)
    check.per_module("num_key_value_heads", [(n, a.n_kv_heads) for n, a in atts], arch.num_key_value_heads)
    check.per_module("head_dim", [(n, a.head_dim) for n, a in atts], arch.head_dim)
    check.per_module("attention scale", [(n, a.scaling if a.scaling is not None else a.head_dim ** -0.5)
                                         for n, a in atts], arch.head_dim ** -0.5, _close(1e-9))
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
    kinds = [(f"layers.{k}", bool(getattr(l, "moe_enabled", False))) for k, l in layers]
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
    dense = [(f"layers.{k}.feed_forward", l.feed_forward) for k, l in layers if not getattr(l, "moe_enabled", False)]
    if dense:
        check.per_module("intermediate_size (dense w1 rows)", [(n, f.w1.weight.shape[0]) for n, f in dense],
                         arch.intermediate_size)
        check.per_module("intermediate_size (dense w2 cols)", [(n, f.w2.weight.shape[1]) for n, f in dense],
                         arch.intermediate_size)
    moes = [(f"layers.{k}.moe", l.moe) for k, l in layers if getattr(l, "moe_enabled", False)]
    if moes and arch.is_moe:
        routers = [(f"{n}.router", m.router) for n, m in moes]
        experts = [(f"{n}.routed_experts.inner_experts", m.routed_experts.inner_experts) for n, m in moes]
        check.per_module("num_experts (router)", [(n, r.num_experts) for n, r in routers], arch.num_experts)
        check.per_module("num_experts (gate rows)", [(n, r.gate.weight.shape[0]) for n, r in routers], arch.num_experts)
        check.per_module("num_experts (expert weights)", [(n, e.w1_EFD.shape[0]) for n, e in experts], arch.num_experts)
        check.per_module("num_experts_per_tok (top_k)", [(n, r.top_k) for n, r in routers], arch.num_experts_per_tok)
        check.per_module("moe_intermediate_size", [(n, e.w1_EFD.shape[1]) for n, e in experts], arch.moe_intermediate_size)
        check.per_module("norm_topk_prob (route_norm)", [(n, bool(r.route_norm)) for n, r in routers], arch.norm_topk_prob)
        check.per_module("router score function", [(n, r.score_func) for n, r in routers], "softmax")
        check.per_module("router route_scale", [(n, float(r.route_scale)) for n, r in routers], 1.0, _close(1e-12))
        check.per_module("router expert groups (node-limited routing)", [(n, r.num_expert_groups) for n, r in routers], None)
        check.per_module("shared experts", [(n, m.shared_experts is not None) for n, m in moes], False)
        coeffs = sorted({m.load_balance_coeff for _, m in moes}, key=str)
        report.notes.append(f"torchtitan-only aux-loss-free load balancing (load_balance_coeff={coeffs}): "
                            f"expert_bias_E shifts top-k selection during training and has no HF equivalent")
    return report
