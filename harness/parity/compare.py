"""Comparators that say where two runs part: tensor diffs, layer-by-layer activations, step
tables with the first divergent step, and side-by-side settings.

Every comparator returns a report object with ``ok`` and ``format()``; tests assert ``ok``
and put ``format()`` in the assertion message, so a failure prints the whole picture (both
sides' settings, the per-layer table with the first divergent layer, the step table) rather
than one number.

Element-wise criterion (as in nki-library's comparator): ``|a - b| <= atol + rtol * max|b|``
with ``b`` the reference side and the tolerance from :mod:`harness.parity.tolerances`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import torch

from harness.parity.conformance.checkpoint import is_allowed, load_allow_list
from harness.references.model import document_causal_mask
from harness.registry import known_issues
from harness.registry.tolerances import ParityTolerance as Tolerance
from harness.upstream.versions import package_versions


@dataclass
class TensorDiff:
    name: str
    ok: bool
    max_abs: float
    scale: float  # max |reference|
    bound: float
    worst_index: tuple | None
    n_over: int
    numel: int
    note: str = ""

    @property
    def rel(self) -> float:
        return self.max_abs / self.scale if self.scale > 0 else self.max_abs

    def line(self, width: int = 32) -> str:
        status = "ok " if self.ok else "BAD"
        where = f" worst at {self.worst_index}" if self.worst_index is not None and not self.ok else ""
        extra = f" {self.note}" if self.note else ""
        return (f"  {status} {self.name:<{width}} max|a-b|={self.max_abs:.3e} "
                f"max|ref|={self.scale:.3e} rel={self.rel:.2e} bound={self.bound:.3e} "
                f"over={self.n_over}/{self.numel}{where}{extra}")


def diff_tensors(name: str, a: torch.Tensor, b: torch.Tensor, tol: Tolerance) -> TensorDiff:
    """Compare ``a`` against the reference ``b``."""
    if tuple(a.shape) != tuple(b.shape):
        return TensorDiff(name, False, math.inf, math.nan, math.nan, None, a.numel(), b.numel(),
                          note=f"shape {tuple(a.shape)} vs {tuple(b.shape)}")
    af, bf = a.detach().double(), b.detach().double()
    finite = torch.isfinite(af) & torch.isfinite(bf)
    if tol.metric == "rms":
        if not bool(finite.all()):
            n = int((~finite).sum())
            return TensorDiff(name, False, math.inf, math.nan, math.nan, None, n, af.numel(),
                              note="(non-finite values)")
        norm_b = float(bf.norm())
        err = float((af - bf).norm())
        bound = tol.bound(norm_b)
        return TensorDiff(name, err <= bound, err, norm_b, bound, None, int(err > bound), 1,
                          note="(L2 norms: ||a-b|| vs ||ref||)")
    scale = float(bf[torch.isfinite(bf)].abs().max()) if bf.numel() and torch.isfinite(bf).any() else 0.0
    bound = tol.bound(scale)
    # A NaN anywhere is a mismatch (even against a NaN); equal infinities are not.
    same_inf = torch.isinf(af) & (af == bf)
    err = torch.where(finite, (af - bf).abs(),
                      torch.where(same_inf, torch.zeros_like(af), torch.full_like(af, math.inf)))
    over = err > bound
    max_abs = float(err.max()) if err.numel() else 0.0
    worst = tuple(int(i) for i in torch.unravel_index(err.argmax(), err.shape)) if err.numel() else None
    return TensorDiff(name, not bool(over.any()), max_abs, scale, bound, worst,
                      int(over.sum()), err.numel())


def diff_id_sets(name: str, a: torch.Tensor, b: torch.Tensor, max_fraction: float) -> TensorDiff:
    """Routing decisions: per token, the set of chosen experts (order-free, ties aside)."""
    if a.shape != b.shape:
        return TensorDiff(name, False, math.inf, math.nan, math.nan, None, a.shape[0], b.shape[0],
                          note=f"shape {tuple(a.shape)} vs {tuple(b.shape)}")
    differ = (a.sort(dim=-1).values != b.sort(dim=-1).values).any(dim=-1)
    n = int(differ.sum())
    frac = n / max(1, differ.numel())
    worst = (int(differ.nonzero()[0, 0]),) if n else None
    return TensorDiff(name, frac <= max_fraction, float(frac), 1.0, max_fraction, worst, n,
                      differ.numel(), note="(fraction of tokens routed to a different expert set)")


@dataclass
class ActivationReport:
    name_a: str
    name_b: str
    diffs: list[TensorDiff]
    missing: list[str] = field(default_factory=list)
    settings: str = ""

    @property
    def ok(self) -> bool:
        return all(d.ok for d in self.diffs) and not self.missing

    @property
    def first_divergent(self) -> TensorDiff | None:
        return next((d for d in self.diffs if not d.ok), None)

    def format(self) -> str:
        width = max((len(d.name) for d in self.diffs), default=10)
        head = f"activations, {self.name_a} vs {self.name_b} (reference side), in forward order:"
        lines = [head, *[d.line(width) for d in self.diffs]]
        if self.missing:
            lines.append(f"  not captured on one side: {self.missing}")
        first = self.first_divergent
        lines.append(f"  first divergent activation: {first.name if first else 'none'}")
        if self.settings:
            lines += ["settings:", self.settings]
        return "\n".join(lines)


def activation_order(names) -> list[str]:
    """embed, then per layer attn, router ids, mlp, block output; then norm, logits."""
    def key(name: str):
        if name == "embed":
            return (-1, 0)
        if name == "norm":
            return (10**6, 0)
        if name == "logits":
            return (10**6, 1)
        parts = name.split(".")
        layer = int(parts[1])
        sub = {"attn": 0, "mlp": 2}.get(parts[2], 3) if len(parts) > 2 else 4
        if name.endswith("router_top_ids"):
            sub = 1
        return (layer, sub)
    return sorted(names, key=key)


def compare_activations(name_a: str, acts_a: dict, name_b: str, acts_b: dict, tol_for,
                        router_fraction: float = 0.0, settings: str = "") -> ActivationReport:
    """``tol_for(activation name) -> Tolerance``; ``acts_b`` is the reference side."""
    names = activation_order(set(acts_a) & set(acts_b))
    # Every side records the same activations, router ids included (every MoE model here
    # exposes its routers): an activation recorded on one side only is a failure, never skipped.
    missing = sorted(set(acts_a) ^ set(acts_b))
    diffs = []
    for n in names:
        if n.endswith("router_top_ids"):
            diffs.append(diff_id_sets(n, acts_a[n], acts_b[n], router_fraction))
        else:
            diffs.append(diff_tensors(n, acts_a[n], acts_b[n], tol_for(n)))
    return ActivationReport(name_a, name_b, diffs, missing, settings)


@dataclass
class NamedTensorsReport:
    """Per-name comparison of two {name: tensor} dicts (parameters, gradients)."""

    what: str
    name_a: str
    name_b: str
    diffs: list[TensorDiff]
    only_a: list[str]
    only_b: list[str]

    @property
    def ok(self) -> bool:
        return all(d.ok for d in self.diffs) and not self.only_a and not self.only_b

    def format(self, limit: int = 60) -> str:
        bad = [d for d in self.diffs if not d.ok]
        width = max((len(d.name) for d in self.diffs), default=10)
        lines = [f"{self.what}: {self.name_a} vs {self.name_b} (reference side): "
                 f"{len(self.diffs)} compared, {len(bad)} outside tolerance"]
        shown = bad[:limit] if bad else sorted(self.diffs, key=lambda d: -d.rel)[:5]
        lines += [d.line(width) for d in shown]
        if self.only_a:
            lines.append(f"  only in {self.name_a}: {self.only_a}")
        if self.only_b:
            lines.append(f"  only in {self.name_b}: {self.only_b}")
        return "\n".join(lines)


def compare_named(what: str, name_a: str, a: dict, name_b: str, b: dict, tol: Tolerance) -> NamedTensorsReport:
    keys = sorted(set(a) & set(b))
    diffs = [diff_tensors(k, a[k], b[k], tol) for k in keys]
    return NamedTensorsReport(what, name_a, name_b, diffs, sorted(set(a) - set(b)), sorted(set(b) - set(a)))


@dataclass
class CurveReport:
    """Two per-step series (losses, grad norms, learning rates) and the band between them."""

    what: str
    name_a: str
    name_b: str
    a: list[float]
    b: list[float]
    bands: list[float]
    settings: str = ""

    @property
    def first_divergent_step(self) -> int | None:
        n = max(len(self.a), len(self.b))
        for i in range(n):
            if i >= len(self.a) or i >= len(self.b):
                return i + 1
            x, y = self.a[i], self.b[i]
            if not (math.isfinite(x) and math.isfinite(y)) or abs(x - y) > self.bands[i]:
                return i + 1
        return None

    @property
    def ok(self) -> bool:
        return self.first_divergent_step is None

    def format(self) -> str:
        lines = [f"{self.what} per step, {self.name_a} vs {self.name_b}:",
                 f"  {'step':>4}  {self.name_a:>14}  {self.name_b:>14}  {'|diff|':>10}  {'band':>10}"]
        for i in range(max(len(self.a), len(self.b))):
            x = self.a[i] if i < len(self.a) else math.nan
            y = self.b[i] if i < len(self.b) else math.nan
            band = self.bands[i] if i < len(self.bands) else math.nan
            d = abs(x - y)
            mark = "" if (math.isfinite(d) and d <= band) else "  <-- outside band"
            lines.append(f"  {i + 1:>4}  {x:>14.7f}  {y:>14.7f}  {d:>10.3e}  {band:>10.3e}{mark}")
        first = self.first_divergent_step
        lines.append(f"  first divergent step: {first if first else 'none'}")
        if self.settings:
            lines += ["settings:", self.settings]
        return "\n".join(lines)


def compare_curves(what: str, name_a: str, a: list[float], name_b: str, b: list[float],
                   band) -> CurveReport:
    """``band``: a float, or a list (per step), or a callable ``step (1-based) -> float``."""
    n = max(len(a), len(b))
    if callable(band):
        bands = [float(band(i + 1)) for i in range(n)]
    elif isinstance(band, (list, tuple)):
        bands = [float(x) for x in band] + [float(band[-1])] * (n - len(band))
    else:
        bands = [float(band)] * n
    return CurveReport(what, name_a, name_b, list(a), list(b), bands)


def versions_line() -> str:
    return "versions: " + ", ".join(f"{k} {v}" for k, v in package_versions().items())


def parity_message(*parts: str) -> str:
    """Assertion message: every part, then the package versions (part of every result)."""
    return "\n".join([*(p for p in parts if p), versions_line()])


def document_mask_problem(mask_mod, positions: torch.Tensor) -> str | None:
    """A flex ``mask_mod`` (e.g. a BlockMask's) against causal AND same-document over packed
    rows with per-document ``positions``: None when equal, else how many (query, key) pairs
    differ and how many of them cross a document boundary."""
    from torch.nn.attention.flex_attention import create_mask  # noqa: PLC0415  heavy: flex_attention adds about 0.6 s over torch

    B, L = positions.shape
    got = create_mask(mask_mod, B, 1, L, L, device="cpu")
    want = document_causal_mask(positions)
    wrong = int((got != want).sum())
    if wrong == 0:
        return None
    return (f"attention mask: {wrong} of {got.numel()} (query, key) pairs differ from same-document "
            f"causal; {int((got & ~want).sum())} cross a document boundary, "
            f"{int((~got & want).sum())} same-document causal pairs are masked out")


def native_keys_not_loaded_kinds(model) -> tuple[str, ...]:
    """The kinds (layer index dropped) of the native tensors a model's HF load left at their
    init, allow-listed buffers aside: the ``native_moe_parity`` observation."""
    report = getattr(model, "load_report", None)
    keys = getattr(report, "native_keys_not_loaded", set())
    allow = load_allow_list()
    return tuple(sorted({re.sub(r"^layers\.\d+\.", "", k) for k in keys if not is_allowed(k, allow)}))


def judge_parity(problem: str | None, models, workarounds=(), *, subject: str):
    """The verdict of a parity comparison between ``models`` (ParityModels) of fixture
    ``subject``: a comparison that involves a native model is the ``native_moe_parity`` check,
    judged against the known issues with what that model's HF load left unloaded."""
    from harness.upstream import titan_api  # noqa: PLC0415  heavy: torchtitan; the comparisons load without it

    natives = [m for m in models if m.kind == "native"]
    if not natives or len(natives) == len(models):  # two native loads agree with each other
        return known_issues.Verdict("pass") if problem is None else known_issues.Verdict("fail", problem)
    observed = {"native_keys_not_loaded": native_keys_not_loaded_kinds(natives[0])}
    return known_issues.judge("native_moe_parity", problem, observed, workarounds,
                              subject=subject, generation=titan_api.generation())
