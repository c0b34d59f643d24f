"""Where a model parts from the reference: its first module whose output or gradient is beyond
the policy, found in one walk, unit by unit, on both sides.

``first_divergence(under_test, weights, arch, inputs, positions)`` walks the model under test
(harness/diagnosis/streamed.py: one unit in memory at a time) and the float64 reference
(harness/references/model.py ``Reference``: one unit's math from one unit's weights) together:

- forward, for each unit (embedding, each decoder layer, final norm, lm_head): the model runs
  its unit, the reference its same unit on its own float64 input, and that unit's modules are
  compared right away in forward order (``diff_tensors`` of harness/parity/compare.py, the
  diagnosis tolerance of harness/registry/tolerances.py); the first that differs is named and the walk
  stops. Everything before it agreed, so that module is where the defect acts (or the first
  place it shows: a wrong RoPE table shows at ``attention.rope``, not at its buffer). Each side
  keeps only its units' inputs, for the backward;
- backward, from the run's loss back, per unit: each side reruns its unit from its saved input
  with grad (the reference with the unit's weights as fresh float64 leaves), backwards it with
  the gradient its output received, and the unit's output gradients and parameter gradients
  (HF names) are compared right away in backward order; both are freed and the input
  gradients passed on. A tied embedding's gradient sums the lm_head's and the embedding's
  uses on both sides: it is compared at the embedding, once both are in.

So the comparison never holds more than one unit's float64 weights and graph, besides the unit
inputs kept for the backward (``LiveBytes``, harness/diagnosis/live_bytes.py, measures it).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from harness.diagnosis.live_bytes import LiveBytes
from harness.parity.compare import TensorDiff, diff_id_sets, diff_tensors
from harness.parity.conformance.native_to_hf import module_of_weight
from harness.references import model as reference_trace
from harness.references.loss import avg_loss
from harness.registry.hf_config import Qwen3Arch
from harness.registry.tolerances import diagnosis_tolerance


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
    reference_memory: dict = field(default_factory=dict)  # Walk.memory(): what the reference held

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
    from harness.parity.models import _hf_activation_modules  # noqa: PLC0415  heavy: torchtitan (parity.models), for the HF modules alone

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


class Recorder:
    """Forward hooks on each module in ``modules`` ({trace name: (the model's name, its
    modules)}) while the context is open: ``take()`` returns the outputs recorded since the
    last take ({trace name: output tensors}, detached) and forgets them; with ``grads``,
    ``out_grads`` ({trace name: {slot: gradient}}) fills during a later backward."""

    def __init__(self, modules: dict[str, tuple[str, tuple[nn.Module, ...]]], *,
                 grads: bool = False) -> None:
        self.modules, self.grads = modules, grads
        self.outputs: dict[str, list[torch.Tensor]] = {}
        self.out_grads: dict[str, dict[int, torch.Tensor]] = {}
        self._handles = []

    def __enter__(self) -> Recorder:
        for name, (_own, mods) in self.modules.items():
            for part, mod in enumerate(mods):
                self._handles.append(mod.register_forward_hook(
                    lambda _m, _inp, out, name=name, part=part: self._record(name, part, out)))
        return self

    def __exit__(self, *_exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def take(self) -> dict[str, list[torch.Tensor]]:
        outputs, self.outputs = self.outputs, {}
        return outputs

    def _record(self, name: str, part: int, out) -> None:
        tensors = _tensors(out)
        if name.endswith(".router"):
            self.outputs[name] = list(_router([_local(t) for t in tensors]))
            return
        self.outputs.setdefault(name, []).extend(_local(t) for t in tensors)
        if self.grads:
            slot = self.out_grads.setdefault(name, {})
            for k, t in enumerate(tensors):
                if t.requires_grad:
                    index = part * 16 + k
                    t.register_hook(lambda g, index=index, slot=slot: slot.__setitem__(index, _local(g)))


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
             for g, w in zip(got, want, strict=True)]
    bad = [d for d in diffs if not d.ok]
    return bad[0] if bad else max(diffs, key=lambda d: d.max_abs)


class _Found(Exception):
    """The walk's answer, raised from inside it (a streamed forward runs inside the model's
    own forward, whose hooks call the walk): the first divergent module."""

    def __init__(self, divergence: Divergence) -> None:
        super().__init__(divergence.module)
        self.divergence = divergence


def first_divergence(under_test, weights: reference_trace.WeightSource, arch: Qwen3Arch,
                     inputs: torch.Tensor, positions: torch.Tensor, *, mask: str = "document",
                     regime: str = "float32", modules=None,
                     labels: torch.Tensor | None = None) -> Divergence:
    """``under_test``: the model under test, streamed (harness/diagnosis/streamed.py:
    ``forward(modules, visit)``, ``backward(modules, labels, visit)``), on the batch whose
    reference form is (``inputs``, ``positions``, ``mask``); ``weights``: the weights it
    holds, under HF names. ``regime``: the diagnosis tolerance's precision regime.
    ``modules``: {trace name: (the model's name, its modules)} (default: looked up by
    torchtitan's native names on ``under_test.model``). With ``labels``, the run's loss is
    then backwarded through both and the gradients are compared in backward order.
    ``walk.memory()`` (the returned divergence's ``reference_memory``) is what the reference
    side held at its peak."""
    expert_dtype = torch.bfloat16 if regime == "bf16_experts" else None
    reference = reference_trace.Reference(arch, inputs, positions, expert_dtype=expert_dtype,
                                          mask=mask)
    names = [n for n, _ in reference_trace.trace_names(arch)]
    modules = modules if modules is not None else native_modules(under_test.model, names)
    walk = Walk(reference, weights, modules, regime, labels)
    try:
        under_test.forward(modules, walk.forward_unit)
        if labels is not None:
            walk.start_backward()
            under_test.backward(modules, labels, walk.backward_unit)
        found = walk.clean()
    except _Found as stop:
        found = stop.divergence
    found.reference_memory = walk.memory()
    return found


class Walk:
    """The comparison side of the walk: the reference's units, run as the model under test's
    come in (``forward_unit``, ``backward_unit`` are what the streamed model calls after each
    of its units), compared right away; it keeps only each unit's float64 input (for the
    backward), the gradient flowing back, and a tied embedding's gradient until its second use
    is in."""

    def __init__(self, reference: reference_trace.Reference, weights: reference_trace.WeightSource,
                 modules: dict, regime: str, labels: torch.Tensor | None) -> None:
        self.reference, self.weights, self.modules, self.regime = reference, weights, modules, regime
        self.labels = labels
        self.arch = reference.arch
        self.keys = weights.keys()
        self.own = {n: o for n, (o, _) in modules.items()}
        self.h: torch.Tensor = reference.input_ids  # the next unit's input
        self.saved: dict[str, torch.Tensor] = {}  # each unit's float64 input, for the backward
        self.grad: torch.Tensor | None = None  # the gradient the next unit back receives
        self.model_grads: dict[str, torch.Tensor] = {}  # parameter gradients not yet compared
        self.reference_grads: dict[str, torch.Tensor] = {}
        self.table: list[str] = []
        self.before = self.before_rel = 0.0
        self.compared = 0
        self.forward_before: tuple[float, float] | None = None
        self.live = LiveBytes()
        self.live.track(reference.tensors())
        self.largest_unit_weight_bytes = 0
        self.saved_input_bytes = 0

    # -- forward -------------------------------------------------------------------------------
    def forward_unit(self, unit: str, got: dict[str, list[torch.Tensor]]) -> None:
        x = self.h
        self.saved[unit] = x
        self.live.track(x)
        self.saved_input_bytes = self.live.now(self.saved.values())
        w = self._unit_weights(unit)
        with torch.no_grad():
            steps = list(self.reference.unit(unit, w, x))
        self.live.track(steps)
        self.live.sample()  # the unit's weights and every output of its modules
        del w
        for name, want in steps:
            if name not in got:
                continue  # a module this model does not have (fused or replaced): not comparable
            diff = _compare(name, got[name], want, self.regime)
            self.compared += 1
            self.table.append(diff.line())
            if not diff.ok:
                raise _Found(Divergence(self.own[name], diff.max_abs, diff.rel, diff.bound,
                                        self.before, self.before_rel, diff.note, self.compared,
                                        _how(self.regime), self.table))
            self.before, self.before_rel = max(self.before, diff.max_abs), max(self.before_rel, diff.rel)
        self.h = steps[-1][1]

    # -- backward ------------------------------------------------------------------------------
    def start_backward(self) -> None:
        """The forward agreed: gradients are compared next, their own largest |Δ| from zero."""
        self.forward_before = (self.before, self.before_rel)
        self.before = self.before_rel = 0.0
        self.h = None

    def backward_unit(self, unit: str, got_grads: dict[str, dict[int, torch.Tensor]],
                      model_grads: dict[str, torch.Tensor],
                      input_grad: torch.Tensor | None = None) -> None:
        """The model's unit ``unit`` has been backwarded (``got_grads``: its modules' output
        gradients; ``model_grads``: its parameter gradients under HF names; ``input_grad``: the
        gradient w.r.t. its input, None for the token ids); the reference's same unit is rerun
        from its saved input, backwarded, and the two compared, the unit's input gradient last
        (a defect in what a unit's backward sends back is named at that unit, not at the unit
        before it, whose output gradient it becomes)."""
        x = self.saved.pop(unit)
        x = x.detach().requires_grad_(True) if x.is_floating_point() else x
        leaves = {k: w.detach().requires_grad_(True) for k, w in self._unit_weights(unit).items()}
        with torch.enable_grad(), self.live.graph():
            steps = list(self.reference.unit(unit, leaves, x))
            retained = [t for name, want in steps if name in self.modules
                        for t in _output_tensors(want) if t.requires_grad]
            for t in retained:
                t.retain_grad()
            out = steps[-1][1]
            self.live.track(x, leaves, steps)
            self.live.sample()  # the unit's graph, before its backward frees it
            if unit == "lm_head":
                # the run's loss on its one rank's batch: the trainer divides by the global
                # count of valid labels, which differs from this rank's by a constant factor
                # that scales both sides alike
                avg_loss(out, self.labels).backward()
            else:
                out.backward(self.grad)
        del out
        self.grad = x.grad if x.is_floating_point() else None
        for key, leaf in leaves.items():
            if leaf.grad is not None:
                self.reference_grads[key] = _summed(self.reference_grads.get(key), leaf.grad)
        for key, g in model_grads.items():
            self.model_grads[key] = _summed(self.model_grads.get(key), g)
        self.live.track(self.grad, list(self.reference_grads.values()), [t.grad for t in retained])
        self.live.sample()
        tol = diagnosis_tolerance("gradients", self.regime)
        items = [(name, item) for name, want in reversed(steps)
                 for item in self._gradient_items(name, want, got_grads)]
        if input_grad is not None and self.grad is not None:
            items.append((unit, (f"{unit} (input)", input_grad, self.grad)))
        for name, (label, mine, theirs) in items:
            mine = _local(mine)
            diff = diff_tensors(f"∇ {label}", mine, theirs.reshape(mine.shape)
                                if mine.numel() == theirs.numel() else theirs, tol)
            self.compared += 1
            self.table.append(diff.line(width=44))
            if not diff.ok:
                raise _Found(Divergence(self.own.get(name, name), diff.max_abs, diff.rel,
                                        diff.bound, self.before, self.before_rel, diff.note,
                                        self.compared, _how(self.regime, gradients=True),
                                        self.table, kind="gradient", quantity=label))
            self.before, self.before_rel = max(self.before, diff.max_abs), max(self.before_rel, diff.rel)
        for grads in (self.model_grads, self.reference_grads):
            for key in [k for k in grads if reference_trace.unit_of(module_of_weight(k)) == unit]:
                del grads[key]  # one side only (a gradient the model names no HF weight for)

    def _gradient_items(self, name: str, want, got_grads):
        """Backward order within a module: the gradient w.r.t. its output (what the modules
        after it sent back), then its parameters' gradients (what its own backward computed),
        each (label, the model's, the reference's)."""
        items = []
        if got_grads.get(name):
            mine = [got_grads[name][k] for k in sorted(got_grads[name])]
            theirs = [t.grad for t in _output_tensors(want) if t.retains_grad and t.grad is not None]
            if len(mine) == len(theirs):
                items += [(f"{name} (output)", m, t) for m, t in zip(mine, theirs, strict=True)]
        keys = sorted(k for k in set(self.model_grads) & set(self.reference_grads)
                      if module_of_weight(k) == name)
        items += [(f"{name} ({key})", self.model_grads.pop(key), self.reference_grads.pop(key))
                  for key in keys]
        return items

    # -- the answer ----------------------------------------------------------------------------
    def clean(self) -> Divergence:
        if self.forward_before is None:
            return Divergence(None, 0.0, 0.0, 0.0, self.before, self.before_rel, "",
                              self.compared, _how(self.regime), self.table)
        fb = self.forward_before
        return Divergence(None, 0.0, 0.0, 0.0, max(fb[0], self.before), max(fb[1], self.before_rel),
                          "", self.compared, _how(self.regime, gradients=True), self.table,
                          gradient_before=(self.before, self.before_rel))

    def memory(self) -> dict:
        """Bytes of float64 tensors the reference side held: the most at once (weights, module
        outputs, graph, gradients and the unit inputs kept for the backward, measured by
        ``LiveBytes``), the unit inputs alone, the largest unit's weights, the whole model's."""
        return {"peak_live_bytes": self.live.peak,
                "saved_input_bytes": self.saved_input_bytes,
                "largest_unit_weight_bytes": self.largest_unit_weight_bytes,
                "model_weight_bytes": sum(self.weights.float64_bytes(k) for k in self.keys)}

    def _unit_weights(self, unit: str) -> dict[str, torch.Tensor]:
        w = {k: self.weights[k] for k in reference_trace.unit_weight_names(self.arch, unit, self.keys)}
        self.live.track(w)
        self.largest_unit_weight_bytes = max(self.largest_unit_weight_bytes, self.live.now(w.values()))
        return w


def _summed(a: torch.Tensor | None, b: torch.Tensor) -> torch.Tensor:
    return b if a is None else a + b


def _output_tensors(want) -> list[torch.Tensor]:
    return [t for t in _tensors(want) if t.is_floating_point()]


def _how(regime: str, gradients: bool = False) -> str:
    tol = diagnosis_tolerance("activations", regime)
    text = (f"every module's output on the run's first batch and starting weights vs the "
            f"float64 reference (harness/references/model.py), in forward order; diagnosis "
            f"tolerance {regime}: atol {tol.atol:g} + rtol {tol.rtol:g} x scale ({tol.metric})")
    if gradients:
        g = diagnosis_tolerance("gradients", regime)
        text += (f"; then the run's loss backwarded through both, every module's output and "
                 f"parameter gradients and each unit's input gradient in backward order, "
                 f"atol {g.atol:g} + rtol {g.rtol:g} x scale")
    return text
