"""Comparators: the per-element rule, float64 arbitration and the routing-set rule.

The rules and their justification are in ``tolerances.py``; this module only computes them
and the numbers a failure report needs (worst index, abs/rel error, mismatch count,
histogram).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from harness.registry.tolerances import KernelTolerance as Tolerance

# Histogram buckets of |a-b| / bound (bound = tau * (|b| + rms_row(b))): the last two are failures.
HIST_EDGES = (0.0, 1 / 64, 1 / 8, 1 / 2, 1.0, 4.0, 64.0)
HIST_LABELS = ("0", "<1/64", "<1/8", "<1/2", "<=1", "<=4x", "<=64x", ">64x")


@dataclass
class Check:
    """Verdict on one compared quantity (an output, a gradient, a routing set, a dtype)."""

    name: str
    passed: bool
    verdict: str
    details: dict = field(default_factory=dict)

    def summary(self) -> str:
        return f"{'ok  ' if self.passed else 'FAIL'} {self.name}: {self.verdict}"


def row_scale(b: Tensor) -> Tensor:
    """RMS over the last dimension (keepdim); ``|b|`` for scalars and length-1 rows."""
    if b.dim() == 0 or b.shape[-1] <= 1:
        return b.abs()
    return b.pow(2).mean(dim=-1, keepdim=True).sqrt().expand_as(b)


def _histogram(ratio: Tensor) -> str:
    flat = torch.nan_to_num(ratio.flatten(), posinf=1e300)
    edges = torch.tensor(HIST_EDGES[1:], dtype=flat.dtype)
    buckets = torch.bucketize(flat, edges, right=False) + 1  # (0, 1/64] -> 1, ...
    buckets = torch.where(flat == 0, torch.zeros_like(buckets), buckets)
    counts = torch.bincount(buckets, minlength=len(HIST_LABELS)).tolist()
    return " ".join(f"{label}:{count}" for label, count in zip(HIST_LABELS, counts, strict=True) if count)


def _nan_aware_diff(a: Tensor, b: Tensor) -> Tensor:
    """|a - b|, with equal infinities and NaN == NaN counted as 0 and any other NaN as inf."""
    diff = (a - b).abs()
    if bool(torch.isfinite(diff).all()):
        return diff
    same_special = (a == b) | (torch.isnan(a) & torch.isnan(b))
    diff = torch.where(same_special, torch.zeros_like(diff), diff)
    return torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)


def elementwise(a: Tensor, b: Tensor, tol: Tolerance, detailed: bool = False) -> dict:
    """Rule 1 statistics for ``a`` (implementation) against ``b`` (float64 reference).

    The diagnostics (worst element, histogram, nki-library ratio) are computed when the rule
    fails or ``detailed`` is set; a pass costs a handful of tensor passes."""
    a = a.detach().to(torch.float64).cpu()
    b = b.detach().to(torch.float64).cpu()
    diff = (a - b).abs()
    finite = bool(torch.isfinite(diff).all())  # then a and b are finite too (the common case)
    if not finite:
        diff = _nan_aware_diff(a, b)
        b_scale = torch.nan_to_num(b, nan=0.0, posinf=0.0, neginf=0.0)
    else:
        b_scale = b
    denom = b.abs() + row_scale(b_scale)
    bound = tol.tau * denom + tol.underflow
    bad = diff > bound
    ratio = diff / bound
    if not finite:  # a NaN or infinity where the reference has none is always a mismatch
        bad |= torch.isinf(diff)
        ratio = torch.where(torch.isinf(diff), torch.full_like(diff, math.inf), ratio)
    total = diff.numel()
    mismatched = int(bad.sum())
    stats = {
        "total": total,
        "mismatched": mismatched,
        "tau": tol.tau,
        "precision": str(tol.precision),
        "passed": mismatched == 0,
        "worst_in_tau": float(ratio.max()) if total else 0.0,
        "max_abs_err": float(diff.max()) if total else 0.0,
    }
    if total and (detailed or mismatched):
        worst = int(torch.argmax(torch.nan_to_num(ratio, posinf=1e300)))
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), diff.shape)) if diff.dim() else ()
        worst_expected = float(b.flatten()[worst])
        stats.update(
            worst_index=index,
            actual=float(a.flatten()[worst]),
            expected=worst_expected,
            abs_err=float(diff.flatten()[worst]),
            rel_err=float(diff.flatten()[worst]) / abs(worst_expected) if worst_expected != 0 else math.inf,
            max_err_over_scale=float((diff / denom.clamp_min(1e-300)).max()),
            nkilib_ratio=(float(diff.max() / b.abs().max()) if b.abs().max() > 0
                          else (0.0 if diff.max() == 0 else math.inf)),
            histogram=_histogram(ratio),
        )
    if total and detailed:
        flat = ratio.flatten()
        k = max(1, int(round(0.999 * flat.numel())))
        stats["p999_in_tau"] = float(torch.kthvalue(torch.nan_to_num(flat, posinf=1e300), k).values)
    return stats


def arbitrate(a: Tensor, truth: Tensor, floor: Tensor, factor: float, underflow: float = 0.0) -> dict:
    """Rule 2: ``a``'s error against the float64 truth versus the ideal implementation's.

    ``underflow`` (the precision's smallest normal number) is an absolute allowance on both
    terms: below it gradual underflow, not the implementation, sets the error."""
    a = a.detach().to(torch.float64).cpu()
    e_impl = _nan_aware_diff(a, truth)
    e_floor = _nan_aware_diff(floor, truth)

    def ratio(x: float, y: float) -> float:
        if x == 0:
            return 0.0
        return x / y if y > 0 else math.inf

    max_impl, max_floor = float(e_impl.max()), float(e_floor.max())
    rms_impl = float(e_impl.pow(2).mean().sqrt()) if math.isfinite(max_impl) else math.inf
    rms_floor = float(e_floor.pow(2).mean().sqrt())
    result = {
        "max_err": max_impl,
        "max_floor": max_floor,
        "max_ratio": ratio(max(max_impl - underflow, 0.0), max_floor),
        "rms_err": rms_impl,
        "rms_floor": rms_floor,
        "rms_ratio": ratio(max(rms_impl - underflow, 0.0), rms_floor),
        "factor": factor,
        "underflow": underflow,
    }
    result["passed"] = result["max_ratio"] <= factor and result["rms_ratio"] <= factor
    return result


def routing_set(ids: Tensor, probs: Tensor, top_k: int, tol: Tolerance) -> dict:
    """The routing-set rule (tolerances.py): ``ids`` (T, K) against reference ``probs`` (T, E)."""
    ids = ids.detach().cpu().long()
    probs = probs.detach().to(torch.float64).cpu()
    tokens, experts = probs.shape
    problems: list[str] = []
    if tuple(ids.shape) != (tokens, top_k):
        return {"passed": False, "problems": [f"ids shape {tuple(ids.shape)} != {(tokens, top_k)}"]}
    if bool((ids < 0).any() or (ids >= experts).any()):
        return {"passed": False, "problems": ["expert id out of range"]}
    chosen = torch.zeros(tokens, experts, dtype=torch.bool).scatter_(1, ids, True)
    duplicates = chosen.sum(dim=1) != top_k
    if bool(duplicates.any()):
        problems.append(f"duplicate expert ids for tokens {duplicates.nonzero().flatten().tolist()}")
    scale = row_scale(probs)[:, :1]
    tau = tol.tau
    inf = torch.tensor(math.inf, dtype=torch.float64)
    # Best case for the chosen (could be computed this much higher), worst for the unchosen.
    chosen_low = torch.where(chosen, probs * (1 + tau) + tau * scale, inf).amin(dim=1)
    unchosen_high = torch.where(~chosen, probs * (1 - tau) - tau * scale, -inf).amax(dim=1)
    invalid = chosen_low < unchosen_high
    reference = torch.zeros_like(chosen).scatter_(1, torch.topk(probs, top_k, dim=1).indices, True)
    differs = (chosen != reference).any(dim=1)
    result = {
        "tokens": tokens,
        "invalid_tokens": invalid.nonzero().flatten().tolist(),
        "ties_resolved_differently": int((differs & ~invalid).sum()),
        "worst_margin": float((unchosen_high - chosen_low).max()) if tokens else 0.0,
        "tau": tau,
    }
    if result["invalid_tokens"]:
        t = result["invalid_tokens"][0]
        missing = (reference[t] & ~chosen[t]).nonzero().flatten().tolist()
        extra = (chosen[t] & ~reference[t]).nonzero().flatten().tolist()
        problems.append(
            f"{len(result['invalid_tokens'])} token(s) with a clearly better expert left out; first: token {t} "
            f"chose {extra} (p={[round(float(probs[t, e]), 6) for e in extra]}) over {missing} "
            f"(p={[round(float(probs[t, e]), 6) for e in missing]})"
        )
    result["problems"] = problems
    result["passed"] = not problems
    return result
