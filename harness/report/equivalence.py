"""Which runs of a report should agree, and whether they do: the report's equivalence section.

``pairs(runs)`` is the one home of the pairing; ``summary.md``, ``results.json``, ``junit.xml``
and the main job's console and exit status all read its ``Pair`` list.

Two kinds of pair should agree, step by step, on the loss:

- **backends**: two runs on the same weights and model, the same data and ranks (the same
  ``model`` key, size, init, device, ranks, layout and ``RunSpec.setting``), each of another
  configuration: two backends (hf_v5 and titan_native tiny pretrained), or one backend's two
  config functions (two subjects of one kind). Two backends' random inits are two draws, not
  the same weights: random-init runs pair only within one backend. Held within
  ``parity_tolerance("torchrun_loss", regime)`` and judged as tests/parity/
  test_torchrun_parity.py judges hf_v5 against titan_native: check ``loss_curve_vs_<reference
  backend>`` (the reference is torchtitan's native Qwen3 where one side is it), observed
  ``deviation`` (the judged run's step-1 loss minus the reference's), the judged run's
  workarounds and ``where``, with the reference's attention (the comparator's mask).
- **layout**: a layout's run and the FSDP run that is the same run but the layout (their specs
  equal once the layout's is FSDP: ``RunSpec.with_layout``), on the same device, where the
  layout reads the FSDP run's batches row for row (``Layout.same_batches_as_fsdp``). Held
  within ``layout_loss`` and judged as tests/parity/test_layouts.py judges it (check
  ``layout_vs_fsdp``).

Masking decides what is one model (``same_model``): two runs whose packed rows are masked alike
are; native Qwen3's two, "row_causal" (sdpa) and "document" (flex), are two models (they part
by ~4e-4 at step 1, 20x the band) and are listed as "not comparable: different masking"; the
transformers backend as configured ("causal") is held against either, as the parity test holds
it, and a known issue records where it is neither (``hf_v5-causal-mask-across-documents``).
One backend's runs of two maskings are two models. A layout that reads other batches than the
FSDP run (TP, CP) is listed as not comparable: it is held to the reference trajectory on its
own batches instead (tests/parity/test_layouts.py). A self-test's planted run is meant to
differ and pairs with nothing.

Verdicts: "agree" (within the band, no known issue applies), "known difference" (a known issue
applies and the observed deviation is inside its signature: the issue and its workaround are
named), "DIFFER" (outside the band, and no known issue explains it), "FAIL" (a known issue
says they differ here, but they agree: upstream fixed it), "not comparable" (by design, above)
and "not compared" (no common step, or no tolerance measured for the regime: a full size's
bf16 runs). "DIFFER" and "FAIL" fail the main job.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from itertools import combinations

from harness.registry import known_issues
from harness.registry.layouts import FSDP
from harness.registry.tolerances import parity_tolerance
from harness.results.run_result import RunResult

FAILING = ("DIFFER", "FAIL")
# The backend other backends are held to (torchtitan's native Qwen3): the reference side of a
# backend pair where one side is it.
REFERENCE_BACKEND = "titan_native"
# The transformers backend's masking as configured (causal over the row, per-document
# positions): the source takes it for native Qwen3, and it is held against either native mask.
HELD_TO_EITHER_NATIVE_MASK = "causal"


@dataclass(frozen=True)
class Pair:
    kind: str  # "backends" or "layout"
    run: str  # the judged run
    reference: str  # the run it is held to
    status: str  # agree | known difference | DIFFER | FAIL | not comparable | not compared
    why: str  # what makes the two one model, or not
    message: str = ""
    check: str | None = None  # the known-issue check it is judged as
    tolerance: str | None = None  # "<quantity> <regime>"
    band: float | None = None
    steps: int = 0  # common steps compared
    step1_delta: float | None = None  # the run's loss minus the reference's, first common step
    max_delta: float | None = None  # max |loss difference| over the common steps
    known_issues: tuple[str, ...] = ()
    workaround: str | None = None  # "--workaround NAME (what it does)"

    @property
    def ok(self) -> bool:
        return self.status not in FAILING

    def line(self) -> str:
        """One line of summary.md and the console."""
        head = f"`{self.run}` vs `{self.reference}` ({self.kind}; {self.why}): {self.status}"
        if self.steps:
            head += (f": step-1 delta {self.step1_delta:+.3e}, max |delta| {self.max_delta:.3e} over "
                     f"{self.steps} step(s), band {self.band:g} ({self.tolerance})")
        if self.status == "known difference":
            head += f"; known issue {', '.join(self.known_issues)}"
            if self.workaround:
                head += f"; workaround: {self.workaround}"
        elif self.message and self.status != "agree":
            head += f" ({self.message.splitlines()[0]})"
        return head

    def to_json(self) -> dict:
        data = asdict(self)
        data["known_issues"] = list(self.known_issues)
        data["ok"] = self.ok
        return data


def regime(run: RunResult) -> str | None:
    """The parity precision regime of the run's model (its backend size's, the backend
    registry's: "float32", "bf16_experts", "bfloat16")."""
    return run.spec.size_spec.precision


def same_model(a: RunResult, b: RunResult) -> bool:
    """Whether the two runs' maskings make one model (see the module's docstring)."""
    a, b = a.spec, b.spec
    if a.mask == b.mask:
        return True
    return a.backend != b.backend and HELD_TO_EITHER_NATIVE_MASK in (a.mask, b.mask)


def _backend_candidates(run_a: RunResult, run_b: RunResult) -> bool:
    a, b = run_a.spec, run_b.spec
    same = (a.model is not None and a.model == b.model and a.size == b.size and a.init == b.init
            and run_a.device == run_b.device and run_a.nproc == run_b.nproc and a.layout == b.layout
            and a.setting == b.setting)
    if not same:
        return False
    if a.backend != b.backend:
        return a.init == "pretrained"  # two backends' random inits are two draws
    # one backend: another attention or config function (a subject) with the same workarounds
    # (a workaround is meant to change the run)
    return a.all_workarounds == b.all_workarounds


def _mask_text(a: RunResult, b: RunResult) -> str:
    a, b = a.spec, b.spec
    return f"masks {a.mask} vs {b.mask}" if a.mask != b.mask else f"mask {a.mask}"


def _order(a: RunResult, b: RunResult) -> tuple[RunResult, RunResult]:
    """(judged, reference): the reference is torchtitan's native Qwen3 where one side is it."""
    return ((b, a) if a.spec.backend == REFERENCE_BACKEND and b.spec.backend != REFERENCE_BACKEND
            else (a, b))


def compare(kind: str, run: RunResult, reference: RunResult, why: str, quantity: str, check: str,
            context: dict[str, str]) -> Pair:
    """The two loss curves over their common steps, within ``quantity``'s band of the run's
    regime, judged as ``check`` with the known issues (``context``: where, in their terms)."""
    base = dict(kind=kind, run=run.spec.name, reference=reference.spec.name, why=why, check=check)
    ref_losses = {s.step: s.loss for s in reference.steps}
    common = [(s.step, s.loss - ref_losses[s.step]) for s in run.steps if s.step in ref_losses]
    if not common:
        return Pair(status="not compared", message="no common step (see the runs' own checks)", **base)
    regimes = {regime(run), regime(reference)}
    name = regime(run)
    if len(regimes) != 1 or name is None:
        return Pair(status="not compared", message=f"no one precision regime: {sorted(map(str, regimes))}", **base)
    try:
        tolerance = parity_tolerance(quantity, name, run.device)
        band = tolerance.atol
    except KeyError as error:
        return Pair(status="not compared", message=str(error.args[0]), **base)
    deltas = [d for _, d in common]
    step1, worst = deltas[0], max((abs(d) for d in deltas), key=lambda d: (math.isnan(d), d))
    outside = [(step, d) for step, d in common if not abs(d) <= band]
    problem = None if not outside else (
        f"{run.spec.name} vs {reference.spec.name}: loss differs by more than {band:g} ({quantity} {name}) at "
        f"{len(outside)} of {len(common)} step(s), first at step {outside[0][0]} ({outside[0][1]:+.3e}), "
        f"max |delta| {worst:.3e}")
    verdict = known_issues.judge(check, problem, {"deviation": step1}, run.spec.all_workarounds, **context)
    # the band's kind: measured on the run's device, or its coarse bound (never measured there)
    measured = dict(tolerance=f"{quantity} {name}" + ("" if tolerance.kind == "measured" else
                                                      f" (coarse on {run.device})"),
                    band=band, steps=len(common), step1_delta=step1, max_delta=worst)
    if verdict.status == "known":
        issue = verdict.issues[0]
        workaround = (f"--workaround {issue.workaround.name} ({issue.workaround.what})"
                      if issue.workaround else None)
        return Pair(status="known difference", message=verdict.message, **base, **measured,
                    known_issues=tuple(i.name for i in verdict.issues), workaround=workaround)
    if verdict.status == "pass":
        return Pair(status="agree", message=verdict.message, **base, **measured)
    return Pair(status="DIFFER" if problem else "FAIL", message=verdict.message, **base, **measured,
                known_issues=tuple(i.name for i in verdict.issues))


def _backend_pair(a: RunResult, b: RunResult) -> Pair:
    run, reference = _order(a, b)
    why = f"same weights ({run.spec.model}, {run.spec.init}), {_mask_text(run, reference)}"
    if not same_model(run, reference):
        return Pair("backends", run.spec.name, reference.spec.name, "not comparable", why,
                    "different masking: two models")
    context = {**run.where(), "attention": reference.spec.attention}
    return compare("backends", run, reference, why, "torchrun_loss",
                   f"loss_curve_vs_{reference.spec.backend}", context)


def _layout_pair(run: RunResult, fsdp: RunResult) -> Pair:
    spec, entry = run.spec, run.spec.layout_spec
    names, why = (spec.name, fsdp.spec.name), f"layout {spec.layout} vs {FSDP}"
    if entry.full_size and not entry.same_batches_as_fsdp:
        return Pair("layout", *names, "not comparable", why,
                    "other batches than the FSDP run (the size's local batch on fewer data-parallel "
                    "ranks): its step-1 loss is held to the HF forward on its own batches")
    if entry.full_size and spec.init == "random":
        return Pair("layout", *names, "not comparable", why,
                    "other weights than the FSDP run: a random init drawn under another sharding "
                    "(the layout's experts or tensors are split otherwise)")
    if not entry.same_batches_as_fsdp:
        return Pair("layout", *names, "not comparable", why,
                    f"other batches than the FSDP run ({entry.data_parallel} data-parallel ranks x "
                    f"{entry.rows_per_rank} rows): held to the reference trajectory on its own batches")
    return compare("layout", run, fsdp, f"{why}, the same batches", "layout_loss",
                   "layout_vs_fsdp", run.where())


def pairs(runs: list[RunResult]) -> list[Pair]:
    """Every pair of ``runs`` that should agree, compared and judged, and the near pairs that
    are not comparable, said why; in the report's order."""
    runs = [r for r in runs if not r.spec.plants]
    found = [_backend_pair(a, b) for a, b in combinations(runs, 2) if _backend_candidates(a, b)]
    found += [_layout_pair(run, fsdp) for run in runs for fsdp in runs
              if run.spec.layout != FSDP == fsdp.spec.layout and run.device == fsdp.device
              and run.spec.with_layout(FSDP) == fsdp.spec]
    return found


def lines(found: list[Pair]) -> list[str]:
    """The section's lines (summary.md, the console)."""
    if not found:
        return ["no two runs of this report are meant to agree (backends on the same weights, or a "
                "layout and its FSDP run)"]
    return [f"- {p.line()}" for p in found]
