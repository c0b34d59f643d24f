"""Where a model parts from the reference: its first module whose output is beyond the policy.

``first_divergence(model, weights, arch, batch)`` runs the model under test forward once with a
hook on every module the reference trace names (harness/diagnosis/trace.py), walks the trace
in forward order, compares each module's output with the model's (``diff_tensors`` of
harness/parity/compare.py, the diagnosis tolerance of harness/tolerances.py) and stops at the
first that differs. Everything before it agreed, so that module is where the defect acts (or
the first place it shows: a wrong RoPE table shows at ``attention.rope``, not at its buffer).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from harness.diagnosis import trace as reference_trace
from harness.hf_config import Qwen3Arch
from harness.parity.compare import TensorDiff, diff_id_sets, diff_tensors
from harness.tolerances import diagnosis_tolerance


@dataclass
class Divergence:
    """The answer: the first divergent module (None: the model agrees with the reference)."""

    module: str | None
    max_abs: float = 0.0
    rel: float = 0.0
    bound: float = 0.0
    before_max_abs: float = 0.0  # the largest |difference| of every module before it
    before_max_rel: float = 0.0  # the largest relative difference of every module before it
    note: str = ""  # what made the comparison impossible (a shape), if anything
    compared: int = 0  # modules compared up to and including the divergent one
    how: str = ""
    table: list[str] = field(default_factory=list)  # one line per compared module
    kind: str = "activation"  # what parted: "activation" (forward) or "gradient" (backward)
    quantity: str = ""  # for a gradient: which one ("NAME (output)" or "NAME (HF weight)")
    gradient_before: tuple[float, float] | None = None  # a clean backward: its largest |Δ|, rel

    @property
    def found(self) -> bool:
        return self.module is not None

    def line(self) -> str:
        if not self.found:
            what = "outputs and gradients" if self.gradient_before else "outputs"
            return (f"no module parts from the reference ({self.compared} {what} compared, "
                    f"largest |Δ| {self.before_max_abs:.1e}, rel {self.before_max_rel:.1e})")
        size = (f"max |Δ| {self.max_abs:.3g} (rel {self.rel:.2g}, bound {self.bound:.2g})"
                if self.max_abs != float("inf") else f"not comparable: {self.note or 'non-finite'}")
        if self.kind == "gradient":
            return (f"{self.module}: gradient of {self.quantity}: {size}; the forward agreed, and "
                    f"every gradient after it in backward order within {self.before_max_abs:.1e} "
                    f"(rel {self.before_max_rel:.1e})")
        return (f"{self.module}: {size}; everything before it within {self.before_max_abs:.1e} "
                f"(rel {self.before_max_rel:.1e})")

    def to_json(self) -> dict:
        return {**asdict(self), "line": self.line()}


def _tensors(output) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (tuple, list)):
        return [t for t in output if isinstance(t, torch.Tensor)]
    raise TypeError(f"module output of type {type(output).__name__} has no tensor")


def _local(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    t = t.full_tensor() if hasattr(t, "full_tensor") else t
    return t.cpu()


def _router(output) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert ids [T, K] sorted per token, their weights in the same order) from
    torchtitan's router output (scores, ids, all scores) or the trace's (ids, weights)."""
    tensors = _tensors(output)
    ids = next(t for t in tensors if not t.is_floating_point())
    weights = next(t for t in tensors if t.is_floating_point() and t.shape == ids.shape)
    ids, weights = ids.reshape(-1, ids.shape[-1]), weights.reshape(-1, ids.shape[-1])
    order = ids.argsort(dim=-1)
    return ids.gather(1, order), weights.gather(1, order)


# The trace's module names are torchtitan 0.3.0's; where another generation names the same
# module differently (spring-2026 main: MoE.experts for 0.3.0's MoE.routed_experts, same
# signature), the model's own name is used and reported.
ALIASES = {".moe.routed_experts": ".moe.experts"}


def model_name(name: str, modules: dict) -> str | None:
    if name in modules:
        return name
    for theirs, ours in ALIASES.items():
        if name.endswith(theirs) and name[: -len(theirs)] + ours in modules:
            return name[: -len(theirs)] + ours
    return None


def native_modules(module: nn.Module, names) -> dict[str, tuple[str, tuple[nn.Module, ...]]]:
    """{trace name: (the model's name for it, its module)} for torchtitan's native Qwen3."""
    by_name = dict(module.named_modules())
    own = {n: model_name(n, by_name) for n in names}
    return {n: (o, (by_name[o],)) for n, o in own.items() if o}


# The trace's modules in transformers' Qwen3 decoder layer (torchtitan's transformers backend:
# HFTransformerModel.model is the HF ForCausalLM), relative to the layer; one tuple entry per
# module whose outputs together are the trace step's (q, k, v are three Linear modules). RoPE
# is a function there (apply_rotary_pos_emb), not a module: a RoPE defect shows at the
# attention's output.
HF_LAYER_MODULES = {
    "attention_norm": ("input_layernorm",),
    "attention.qkv_linear": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "attention.q_norm": ("self_attn.q_norm",),
    "attention.k_norm": ("self_attn.k_norm",),
    "attention": ("self_attn",),
    "ffn_norm": ("post_attention_layernorm",),
    "feed_forward": ("mlp",),
    "moe.router": ("mlp.gate",),
    "moe.routed_experts": ("mlp.experts",),
    "moe": ("mlp",),
}


def hf_modules(hf_causal_lm: nn.Module, arch: Qwen3Arch) -> dict[str, tuple[str, tuple[nn.Module, ...]]]:
    """{trace name: (transformers' module name, its modules)} for an HF Qwen3 ForCausalLM, on
    the layers that harness/parity/models.py ``_hf_activation_modules`` finds."""
    from harness.parity.models import _hf_activation_modules

    mods, _ = _hf_activation_modules(hf_causal_lm.model, hf_causal_lm.lm_head, arch)
    out = {"tok_embeddings": ("model.embed_tokens", (mods["embed"],)),
           "norm": ("model.norm", (mods["norm"],)), "lm_head": ("lm_head", (hf_causal_lm.lm_head,))}
    for i in range(arch.num_hidden_layers):
        layer = mods[f"layers.{i}"]
        out[f"layers.{i}"] = (f"model.layers.{i}", (layer,))
        for ours, theirs in HF_LAYER_MODULES.items():
            try:
                found = tuple(layer.get_submodule(t) for t in theirs)
            except AttributeError:
                continue  # a dense layer has no router, an MoE layer no dense mlp
            if ours == "feed_forward" and arch.layer_is_moe(i) or ours.startswith("moe") and not arch.layer_is_moe(i):
                continue
            out[f"layers.{i}.{ours}"] = (f"model.layers.{i}.{'+'.join(theirs)}", found)
    return out


def capture(modules: dict[str, tuple[str, tuple[nn.Module, ...]]], run, *, grads: bool = False):
    """``run()`` with a forward hook on each module in ``modules``; returns ({trace name: its
    output tensors}, {trace name: their gradients, filled by a later backward} when ``grads``,
    and ``run()``'s result)."""
    outputs: dict[str, list[torch.Tensor]] = {}
    out_grads: dict[str, dict[int, torch.Tensor]] = {}
    handles = []
    for name, (_own, mods) in modules.items():
        for part, mod in enumerate(mods):
            def hook(_m, _inp, out, name=name, part=part):
                tensors = _tensors(out)
                if name.endswith(".router"):
                    outputs[name] = list(_router([_local(t) for t in tensors]))
                    return
                outputs.setdefault(name, []).extend(_local(t) for t in tensors)
                if grads:
                    slot = out_grads.setdefault(name, {})
                    for k, t in enumerate(tensors):
                        if t.requires_grad:
                            index = part * 16 + k
                            t.register_hook(lambda g, index=index, slot=slot: slot.__setitem__(index, _local(g)))
            handles.append(mod.register_forward_hook(hook))
    try:
        with torch.set_grad_enabled(grads):
            result = run()
    finally:
        for handle in handles:
            handle.remove()
    return outputs, out_grads, result


def _compare(name: str, got: list[torch.Tensor], want, regime: str) -> TensorDiff:
    if name.endswith(".router"):
        ids, weights = _router([t.detach() for t in _tensors(want)])
        routing = diff_id_sets(name, got[0], ids, diagnosis_tolerance("router_flips", regime).atol)
        if not routing.ok:
            return routing
        return diff_tensors(name, got[1], weights, diagnosis_tolerance("router", regime))
    want = _tensors(want)
    tol = diagnosis_tolerance("activations", regime)
    if len(got) != len(want):
        return TensorDiff(name, False, float("inf"), float("nan"), float("nan"), None, 1, 1,
                          note=f"{len(got)} outputs vs the reference's {len(want)}")
    diffs = [diff_tensors(name, g, w.reshape(g.shape) if g.numel() == w.numel() else w, tol)
             for g, w in zip(got, want)]
    bad = [d for d in diffs if not d.ok]
    return bad[0] if bad else max(diffs, key=lambda d: d.max_abs)


class WholeModel:
    """The model under test held whole: one forward under ``capture``'s hooks, then the run's
    loss backwarded through it. ``run()``: its logits on the batch; ``model_grads()``: its
    parameter gradients under HF names."""

    def __init__(self, run, model_grads=None) -> None:
        self.run, self.model_grads = run, model_grads

    def record(self, modules, grads: bool):
        got, self.out_grads, self.logits = capture(modules, self.run, grads=grads)
        return got, self.logits

    def backward(self, labels, modules):
        run_loss(self.logits, labels).backward()
        return self.out_grads, self.model_grads()


def first_divergence(module: nn.Module | None, run, weights: reference_trace.WeightSource,
                     arch: Qwen3Arch, inputs: torch.Tensor, positions: torch.Tensor, *,
                     mask: str = "document", regime: str = "float32", modules=None,
                     labels: torch.Tensor | None = None, model_grads=None,
                     under_test=None) -> Divergence:
    """``run()`` makes ``module`` (the model under test) do its forward on the batch whose
    reference form is (``inputs``, ``positions``, ``mask``) and returns its logits; ``weights``
    are the weights it holds, under HF names. ``regime``: the diagnosis tolerance's precision
    regime. ``modules``: {trace name: (the model's name, its modules)} (default: looked up by
    torchtitan's native names). With ``labels`` (and ``model_grads()``: the model's parameter
    gradients under HF names), the run's loss is then backwarded through both and the
    gradients are compared in backward order (``first_gradient_divergence``).
    ``under_test``: how the model is run (``record(modules, grads)`` -> (outputs, logits),
    ``backward(labels, modules)`` -> (output gradients, HF parameter gradients)); default
    ``WholeModel(run, model_grads)``; harness/diagnosis/streamed.py streams it unit by unit."""
    expert_dtype = torch.bfloat16 if regime == "bf16_experts" else None
    grads = labels is not None
    leaves = reference_trace.Leaves(weights) if grads else weights
    steps = reference_trace.trace(leaves, arch, inputs, positions, expert_dtype=expert_dtype,
                                  mask=mask)
    names = [n for n, _ in reference_trace.trace_names(arch)]
    modules = modules if modules is not None else native_modules(module, names)
    own = {n: o for n, (o, _) in modules.items()}
    under_test = under_test if under_test is not None else WholeModel(run, model_grads)
    got, logits = under_test.record(modules, grads)
    table, before, before_rel, compared = [], 0.0, 0.0, 0
    walked: list[tuple[str, object]] = []
    with torch.set_grad_enabled(grads):
        for name, want in steps:
            walked.append((name, want))
            if name not in got:
                continue  # a module this model does not have (fused or replaced): not comparable
            diff = _compare(name, got[name], want, regime)
            compared += 1
            table.append(diff.line())
            if not diff.ok:
                return Divergence(own[name], diff.max_abs, diff.rel, diff.bound, before, before_rel,
                                  diff.note, compared, _how(regime), table)
            before, before_rel = max(before, diff.max_abs), max(before_rel, diff.rel)
    if grads:
        return first_gradient_divergence(walked, leaves, logits, labels, under_test, modules,
                                         own, regime, table, compared, (before, before_rel))
    return Divergence(None, 0.0, 0.0, 0.0, before, before_rel, "", compared, _how(regime), table)


def run_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The trainer's loss: cross entropy summed over the valid labels (not -100), divided by
    their count, in float32 or better (torchtitan upcasts the logits). The trainer divides by
    the global count over every data-parallel rank; the diagnosis has one rank's batch, whose
    own count differs from it by a constant factor that scales both sides alike."""
    flat = logits.flatten(0, 1)
    flat = flat if flat.dtype == torch.float64 else flat.float()
    labels = labels.flatten().to(flat.device)
    valid = int((labels != -100).sum())
    return torch.nn.functional.cross_entropy(flat, labels, ignore_index=-100,
                                             reduction="sum") / max(valid, 1)


def _output_tensors(want) -> list[torch.Tensor]:
    return [t for t in _tensors(want) if t.is_floating_point()]


def first_gradient_divergence(walked, leaves, logits, labels, under_test, modules,
                              own: dict, regime: str, table: list[str], compared: int,
                              forward_before: tuple[float, float]) -> Divergence:
    """Backward order: for each module from ``lm_head`` back to ``tok_embeddings``, the
    gradient w.r.t. its output (what the modules after it sent back), then its parameters'
    gradients (what its own backward computed). The first beyond the gradient tolerance is
    named: an output gradient means the defect is in the backward of a module after it (one
    that has no parameters to show it, or no hook), a parameter gradient that the module's own
    backward is wrong."""
    outputs = []
    for name, want in walked:
        if name in modules:
            for t in _output_tensors(want):
                if t.requires_grad:
                    t.retain_grad()
            outputs.append((name, want))
    reference_logits = walked[-1][1]
    reference_trace.trace_backward(run_loss(reference_logits, labels))
    # {trace name: output gradients}, {HF name: gradient} through the model's own name mapping
    got_grads, model_grads = under_test.backward(labels, modules)
    tol = diagnosis_tolerance("gradients", regime)
    ref_params = leaves.grads()
    by_module: dict[str, list[str]] = {}
    for key in sorted(set(ref_params) & set(model_grads)):
        by_module.setdefault(reference_trace.module_of_weight(key), []).append(key)
    before = before_rel = 0.0
    names = [n for n, _ in walked]
    wants = dict(walked)
    for name in reversed(names):
        items = []
        if name in got_grads and got_grads[name]:
            mine = [got_grads[name][k] for k in sorted(got_grads[name])]
            theirs = [t.grad for t in _output_tensors(wants[name]) if t.grad is not None]
            if len(mine) == len(theirs):
                items += [(f"{name} (output)", m, t) for m, t in zip(mine, theirs)]
        items += [(f"{name} ({key})", model_grads[key], ref_params[key]) for key in by_module.get(name, [])]
        for label, mine, theirs in items:
            mine = _local(mine)
            diff = diff_tensors(f"∇ {label}", mine, theirs.reshape(mine.shape)
                                if mine.numel() == theirs.numel() else theirs, tol)
            compared += 1
            table.append(diff.line(width=44))
            if not diff.ok:
                where = own.get(name, name)
                return Divergence(where, diff.max_abs, diff.rel, diff.bound, before, before_rel,
                                  diff.note, compared, _how(regime, gradients=True), table,
                                  kind="gradient", quantity=label)
            before, before_rel = max(before, diff.max_abs), max(before_rel, diff.rel)
    fb = forward_before
    return Divergence(None, 0.0, 0.0, 0.0, max(fb[0], before), max(fb[1], before_rel), "",
                      compared, _how(regime, gradients=True), table,
                      gradient_before=(before, before_rel))


def _how(regime: str, gradients: bool = False) -> str:
    tol = diagnosis_tolerance("activations", regime)
    text = (f"every module's output on the run's first batch and starting weights vs the "
            f"float64 reference (harness/diagnosis/trace.py), in forward order; diagnosis "
            f"tolerance {regime}: atol {tol.atol:g} + rtol {tol.rtol:g} x scale ({tol.metric})")
    if gradients:
        g = diagnosis_tolerance("gradients", regime)
        text += (f"; then the run's loss backwarded through both, every module's output and "
                 f"parameter gradients in backward order, atol {g.atol:g} + rtol {g.rtol:g} x scale")
    return text
