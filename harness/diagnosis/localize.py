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

    @property
    def found(self) -> bool:
        return self.module is not None

    def line(self) -> str:
        if not self.found:
            return (f"no module parts from the reference ({self.compared} compared, largest "
                    f"|Δ| {self.before_max_abs:.1e}, rel {self.before_max_rel:.1e})")
        size = (f"max |Δ| {self.max_abs:.3g} (rel {self.rel:.2g}, bound {self.bound:.2g})"
                if self.max_abs != float("inf") else f"not comparable: {self.note or 'non-finite'}")
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


def capture(module: nn.Module, names, run) -> tuple[dict[str, list[torch.Tensor]], dict[str, str]]:
    """``run()`` with a forward hook on each of ``module``'s submodules named in ``names``:
    ({trace name: its output tensors}, {trace name: the model's name for that module})."""
    by_name = dict(module.named_modules())
    outputs: dict[str, list[torch.Tensor]] = {}
    own = {n: model_name(n, by_name) for n in names}
    handles = []
    for name in names:
        if own[name] is None:
            continue

        def hook(_m, _inp, out, name=name):
            if name == "lm_head" or not name.endswith(".router"):
                outputs[name] = [_local(t) for t in _tensors(out)]
            else:
                outputs[name] = list(_router([_local(t) for t in _tensors(out)]))
        handles.append(by_name[own[name]].register_forward_hook(hook))
    try:
        with torch.no_grad():
            run()
    finally:
        for handle in handles:
            handle.remove()
    return outputs, {k: v for k, v in own.items() if v}


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


def first_divergence(module: nn.Module, run, weights: reference_trace.WeightSource,
                     arch: Qwen3Arch, inputs: torch.Tensor, positions: torch.Tensor, *,
                     mask: str = "document", regime: str = "float32") -> Divergence:
    """``run()`` makes ``module`` (the model under test) do its forward on the batch whose
    reference form is (``inputs``, ``positions``, ``mask``); ``weights`` are the weights it
    holds, under HF names. ``regime``: the diagnosis tolerance's precision regime."""
    expert_dtype = torch.bfloat16 if regime == "bf16_experts" else None
    steps = reference_trace.trace(weights, arch, inputs, positions, expert_dtype=expert_dtype,
                                  mask=mask)
    names = [n for n, _ in reference_trace.trace_names(arch)]
    got, own = capture(module, names, run)
    table, before, before_rel, compared = [], 0.0, 0.0, 0
    for name, want in steps:
        if name not in got:
            continue  # a module this model does not have (fused or replaced): not comparable
        diff = _compare(name, got[name], want, regime)
        compared += 1
        table.append(diff.line())
        if not diff.ok:
            return Divergence(own[name], diff.max_abs, diff.rel, diff.bound, before, before_rel,
                              diff.note, compared, _how(regime), table)
        before, before_rel = max(before, diff.max_abs), max(before_rel, diff.rel)
    return Divergence(None, 0.0, 0.0, 0.0, before, before_rel, "", compared, _how(regime), table)


def _how(regime: str) -> str:
    tol = diagnosis_tolerance("activations", regime)
    return (f"every module's output on the run's first batch and starting weights vs the "
            f"float64 reference (harness/diagnosis/trace.py), in forward order; diagnosis "
            f"tolerance {regime}: atol {tol.atol:g} + rtol {tol.rtol:g} x scale ({tol.metric})")
