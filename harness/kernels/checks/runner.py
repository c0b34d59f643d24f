"""Run one implementation on one case and check it against the float64 reference.

``run(op, impl, device, case, dtype)`` returns a ``RunResult`` whose ``checks`` cover: the
implementation's documented output dtypes, every output (forward), the gradient of every
differentiable input for a seeded upstream gradient (backward), and for the router the
routing-set rule. Rules: tolerances.py. Failure report and replay file: diagnostics.py.

``judge(result)`` gives each check (= property of the cell: ``dtype:NAME``, an output or
gradient name, ``routing:ids``, ``run``) its verdict under ``harness.registry.known_issues`` (check
``"kernel"``, context op / impl / device / case / dtype / property): a known issue excuses
exactly the property it names, and only when that property fails as its signature records.
``outcome(result)`` combines them: "fail" if any property fails, else "known" if a known
issue showed, else "pass".
"""

from __future__ import annotations

import functools
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

from harness.kernels.checks import compare
from harness.kernels.checks.compare import Check
from harness.kernels.checks.diagnostics import format_report, save_replay
from harness.kernels.checks.spec import Case, Implementation, OpSpec, dtype_name, torch_device
from harness.registry import known_issues
from harness.registry.known_issues import Verdict
from harness.registry.tolerances import UNIT_ROUNDOFF, lowest_precision
from harness.registry.tolerances import kernel_tolerance as tolerance


@dataclass
class RunResult:
    op: str
    impl: str
    device: str
    case: str
    dtype: torch.dtype
    compute_dtype: torch.dtype
    backward: bool
    checks: list[Check] = field(default_factory=list)
    replay_path: Path | None = None

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(check.passed for check in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [check for check in self.checks if not check.passed]

    def title(self) -> str:
        direction = "forward+backward" if self.backward else "forward only"
        return (
            f"{self.op} / {self.impl} on {self.device}, case {self.case}, {dtype_name(self.dtype)} "
            f"(computes in {dtype_name(self.compute_dtype)}; {direction})"
        )

    def report(self) -> str:
        return format_report(self)


@functools.lru_cache(maxsize=16)
def master_inputs(op_name: str, case_name: str) -> dict[str, torch.Tensor]:
    """The case's seeded float64 master inputs (cached; treat as read-only)."""
    from harness.kernels.checks.registry import get_op  # noqa: PLC0415  heavy: torchtitan via the adapters; the CLI imports the runner without it

    op = get_op(op_name)
    case = op.case(case_name)
    return case.build(torch.Generator().manual_seed(case.seed(op.name)))


def round_inputs(op: OpSpec, master: dict, dtype: torch.dtype) -> dict:
    return {k: (v.to(dtype) if k in op.float_inputs else v) for k, v in master.items()}


def default_cotangents(op: OpSpec, outputs: dict, inputs: dict, gen: torch.Generator) -> dict:
    if op.cotangents is not None:
        return op.cotangents(outputs, inputs, gen)
    return {name: torch.randn(outputs[name].shape, generator=gen, dtype=torch.float64) for name in op.diff_outputs}


def evaluate(call, op: OpSpec, inputs: dict, cotangents_for, backward: bool, device: torch.device) -> tuple[dict, dict]:
    """Call ``call(leaves)``; with ``backward`` also take gradients of ``op.diff_outputs`` for
    the cotangents ``cotangents_for(outputs)`` returns. Returns (results on CPU, cotangents)."""
    leaves = {}
    for name, value in inputs.items():
        tensor = value.to(device)
        if backward and name in op.diff_inputs:
            tensor = tensor.detach().clone().requires_grad_(True)
        leaves[name] = tensor
    outputs = call(leaves)
    results = {name: value.detach().cpu() for name, value in outputs.items()}
    cotangents = {}
    if backward:
        cotangents = cotangents_for(results)
        # An output cut off from the graph contributes no gradient (as autograd would treat it).
        names = [n for n in op.diff_outputs if outputs[n].requires_grad]
        grads = [None] * len(op.diff_inputs)
        if names:
            grads = torch.autograd.grad(
                [outputs[n] for n in names],
                [leaves[k] for k in op.diff_inputs],
                [cotangents[n].to(device=device, dtype=outputs[n].dtype) for n in names],
                allow_unused=True,
            )
        for name, grad in zip(op.diff_inputs, grads, strict=True):
            results[f"grad_{name}"] = torch.zeros_like(leaves[name]).cpu() if grad is None else grad.detach().cpu()
    return results, cotangents


_REFERENCE_CACHE: dict = {}
_REFERENCE_CACHE_SIZE = 12


def cached_reference(key, compute) -> dict:
    """Reference results are shared by every implementation run on the same registry case,
    dtype and cotangent dtypes (results are read-only). ``key=None`` disables caching."""
    if key is None:
        return compute()
    if key not in _REFERENCE_CACHE:
        if len(_REFERENCE_CACHE) >= _REFERENCE_CACHE_SIZE:
            _REFERENCE_CACHE.pop(next(iter(_REFERENCE_CACHE)))
        _REFERENCE_CACHE[key] = compute()
    return _REFERENCE_CACHE[key]


def evaluate_reference(op: OpSpec, inputs: dict, params: dict, pins: dict, cotangents: dict, backward: bool) -> dict:
    """The reference in float64 on ``inputs`` (floats up-cast), with ``cotangents`` as given."""
    as_f64 = {k: (v.to(torch.float64) if k in op.float_inputs else v) for k, v in inputs.items()}
    results, _ = evaluate(
        lambda leaves: op.reference(**leaves, **params, **pins),
        op,
        as_f64,
        lambda outputs: {n: cotangents[n].to(torch.float64) for n in op.diff_outputs},
        backward,
        torch.device("cpu"),
    )
    return results


def run(
    op: OpSpec,
    impl: Implementation,
    device: str,
    case: Case,
    dtype: torch.dtype,
    *,
    backward: bool = True,
    save_dir: Path | None = None,
    master: dict | None = None,
    always_arbitrate: bool = False,
) -> RunResult:
    """Run ``impl`` on ``case`` at ``dtype`` and check it. ``always_arbitrate`` computes the
    float64 arbitration numbers even where rule 1 passes (for ``calibrate``)."""
    params = dict(case.params)
    master = master if master is not None else master_inputs(op.name, case.name)
    inputs = round_inputs(op, master, dtype)
    compute = impl.compute_dtype(dtype, device)
    backward = backward and impl.backward
    result = RunResult(op.name, impl.name, device, case.name, dtype, compute, backward)
    gen = torch.Generator().manual_seed(case.seed(op.name) + 1)
    master_cots: dict = {}

    def cotangents_for(outputs):
        master_cots.update(default_cotangents(op, outputs, master, gen))
        return master_cots

    try:
        actual, _ = evaluate(
            lambda leaves: impl.run(leaves, params, device), op, inputs, cotangents_for, backward, torch_device(device)
        )
    except Exception as error:  # an implementation that raises fails the case, with its traceback
        result.checks.append(
            Check("run", False, f"raised {type(error).__name__}: {error}", {"traceback": traceback.format_exc()})
        )
        _finish(result, op, impl, case, dtype, master, save_dir)
        return result

    pins = op.pin(actual) if op.pin is not None else {}
    seen_cots = {n: master_cots[n].to(actual[n].dtype) for n in op.diff_outputs} if backward else {}
    cacheable = not pins and master is master_inputs(op.name, case.name)
    cot_dtypes = tuple(sorted((n, str(c.dtype)) for n, c in seen_cots.items()))
    cache_key = ("rounded", op.name, case.name, str(dtype), backward, cot_dtypes) if cacheable else None
    try:
        expected = cached_reference(
            cache_key, lambda: evaluate_reference(op, inputs, params, pins, seen_cots, backward)
        )
    except Exception as error:  # e.g. an output of the wrong shape makes the cotangent unusable
        result.checks.append(
            Check("reference", False, f"reference could not be evaluated against this implementation's outputs: "
                  f"{type(error).__name__}: {error}", {"traceback": traceback.format_exc()})
        )
        _finish(result, op, impl, case, dtype, master, save_dir)
        return result
    lazy = _Arbiter(op, master, params, pins, master_cots, backward, dtype, compute, actual, cacheable and case.name)

    if impl.output_dtypes is not None:
        for name, want in impl.output_dtypes(dtype, device).items():
            got = actual[name].dtype
            result.checks.append(
                Check(f"dtype:{name}", got == want, f"{dtype_name(got)} (documented: {dtype_name(want)})",
                      {"dtype": str(got), "documented": str(want)})
            )
    for name in op.discrete_outputs:
        result.checks.append(_routing_check(op, case, name, actual, expected, compute))
    for name, value in actual.items():
        if name in op.discrete_outputs or name in op.ignore_outputs:
            continue
        result.checks.append(_dense_check(op, name, value, expected.get(name), compute, lazy, always_arbitrate))
    _finish(result, op, impl, case, dtype, master, save_dir)
    return result


def _finish(result, op, impl, case, dtype, master, save_dir) -> None:
    if not result.passed and save_dir is not None:
        result.replay_path = save_replay(result, op, case, master, Path(save_dir))


def _routing_check(op, case, name, actual, expected, compute) -> Check:
    precision = lowest_precision(compute, actual["weights"].dtype)
    tol = tolerance(op.op_class, precision)
    stats = compare.routing_set(actual[name], expected["probs"], case.params["top_k"], tol)
    if stats["passed"]:
        verdict = (f"valid top-{case.params['top_k']} sets "
                   f"({stats['ties_resolved_differently']} tie(s) resolved differently)")
    else:
        verdict = "; ".join(stats["problems"])
    return Check(f"routing:{name}", stats["passed"], verdict, stats)


class _Arbiter:
    """Computes the float64 truth and the ideal-implementation floor on first need."""

    def __init__(self, op, master, params, pins, master_cots, backward, dtype, compute, actual, case_key=None):
        self.op, self.master, self.params, self.pins = op, master, params, pins
        self.master_cots, self.backward = master_cots, backward
        self.dtype, self.compute, self.actual = dtype, compute, actual
        self.case_key = case_key or None  # registry case name when results may be cached
        self._truth = self._floor = None

    def truth(self) -> dict:
        if self._truth is None:
            key = ("truth", self.op.name, self.case_key, self.backward) if self.case_key else None
            self._truth = cached_reference(
                key,
                lambda: evaluate_reference(self.op, self.master, self.params, self.pins, self.master_cots,
                                           self.backward),
            )
        return self._truth

    def floor_source(self) -> dict:
        if self._floor is None:
            round_in = lowest_precision(self.dtype, self.compute)
            cots = {
                n: self.master_cots[n].to(lowest_precision(self.actual[n].dtype, self.compute))
                for n in self.op.diff_outputs
                if n in self.master_cots
            }
            cot_dtypes = tuple(sorted((n, str(c.dtype)) for n, c in cots.items()))
            key = (("floor", self.op.name, self.case_key, str(round_in), self.backward, cot_dtypes)
                   if self.case_key else None)
            self._floor = cached_reference(
                key,
                lambda: evaluate_reference(
                    self.op, round_inputs(self.op, self.master, round_in), self.params, self.pins, cots, self.backward
                ),
            )
        return self._floor


def _arbitration(name, value, precision, tol, arbiter: _Arbiter) -> dict:
    floor = arbiter.floor_source()[name].to(precision).to(torch.float64)
    return compare.arbitrate(value, arbiter.truth()[name], floor, tol.arbitration_factor, tol.underflow)


def _dense_check(op, name, value, reference, compute, arbiter: _Arbiter, always_arbitrate: bool = False) -> Check:
    if reference is None:
        return Check(name, False, "the reference has no such output")
    if tuple(value.shape) != tuple(reference.shape):
        return Check(name, False, f"shape {tuple(value.shape)} != reference {tuple(reference.shape)}")
    precision = lowest_precision(compute, value.dtype)
    tol = tolerance(op.op_class, precision)
    stats = compare.elementwise(value, reference, tol, detailed=always_arbitrate)
    stats["u"] = UNIT_ROUNDOFF[precision]
    if always_arbitrate and precision != torch.float64:
        stats["arbitration"] = _arbitration(name, value, precision, tol, arbiter)
    if stats["passed"]:
        exact = stats.get("max_abs_err", 0.0) == 0.0
        detail = "exact" if exact else f"within tau={tol.tau:.3g} (worst {stats.get('worst_in_tau', 0):.3g} tau)"
        return Check(name, True, detail, stats)
    verdict = f"{stats['mismatched']}/{stats['total']} elements outside tau={tol.tau:.3g}"
    if precision == torch.float64:
        return Check(name, False, verdict, stats)
    arbitration = stats.get("arbitration") or _arbitration(name, value, precision, tol, arbiter)
    stats["arbitration"] = arbitration
    line = (
        f"max err {arbitration['max_err']:.3g} = {arbitration['max_ratio']:.3g}x floor, "
        f"rms {arbitration['rms_ratio']:.3g}x floor (K={tol.arbitration_factor:g})"
    )
    if arbitration["passed"]:
        return Check(name, True, f"arbitrated against float64: {line} [{verdict}]", stats)
    return Check(name, False, f"{verdict}; arbitration FAILED: {line}", stats)


# ------------------------------------------------------------------ verdicts per property

KNOWN_ISSUE_CHECK = "kernel"  # the check name of kernel cells in harness/registry/known_issues/


def context(result: RunResult, prop: str) -> dict[str, str]:
    return {"op": result.op, "impl": result.impl, "device": result.device, "case": result.case,
            "dtype": dtype_name(result.dtype), "property": prop}


def observed(check: Check) -> dict:
    """The quantities a known issue's signature may name: ``dtype`` (str(torch dtype)) for a
    dtype property; ``error_u`` (max |a-b| / (|b| + rms_row(b)) in units of the compared
    precision's u) for a value property that failed rule 1."""
    details = check.details
    values = {}
    if "dtype" in details:
        values["dtype"] = details["dtype"]
    if "max_err_over_scale" in details and details.get("u"):
        values["error_u"] = details["max_err_over_scale"] / details["u"]
    return values


def issues_for(result: RunResult, prop: str, workarounds=()) -> list:
    return known_issues.applicable(KNOWN_ISSUE_CHECK, workarounds, **context(result, prop))


def judge(result: RunResult, workarounds=()) -> list[tuple[Check, object]]:
    """``[(check, harness.registry.known_issues.Verdict)]`` for every property of the cell."""
    verdicts = []
    for check in result.checks:
        problem = None if check.passed else check.summary()
        verdicts.append((check, known_issues.judge(KNOWN_ISSUE_CHECK, problem, observed(check), workarounds,
                                                   **context(result, check.name))))
    return verdicts


def outcome(result: RunResult, workarounds=()):
    """One ``Verdict`` for the cell: "fail" if any property fails (known issues or not), else
    "known" if a known issue showed exactly as recorded, else "pass"."""
    verdicts = judge(result, workarounds)
    if not verdicts:
        return Verdict("fail", "no check ran")
    failed = [(c, v) for c, v in verdicts if v.status == "fail"]
    if failed:
        return Verdict("fail", "\n".join(f"[{c.name}] {v.message}" for c, v in failed),
                       tuple(i for _, v in failed for i in v.issues))
    known = [(c, v) for c, v in verdicts if v.status == "known"]
    if known:
        return Verdict("known", "\n".join(f"[{c.name}] {v.message}" for c, v in known),
                       tuple(i for _, v in known for i in v.issues))
    return Verdict("pass")


# ------------------------------------------------------------------ replay files


def replay(path: Path, save_dir: Path | None = None, impl=None):
    """Re-run a saved case with its saved inputs; returns the new RunResult. ``impl`` overrides
    the registry lookup (for implementations that are not registered, e.g. planted defects)."""
    from harness.kernels.checks.registry import get_op  # noqa: PLC0415  heavy: torchtitan via the adapters; the CLI imports the runner without it

    bundle = torch.load(path, weights_only=False)
    op = get_op(bundle["op"])
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}[
        bundle["dtype"]
    ]
    impl = impl if impl is not None else op.implementation(bundle["impl"])
    return run(
        op, impl, bundle["device"], op.case(bundle["case"]), dtype, backward=bundle["backward"],
        save_dir=save_dir, master=bundle["master_inputs"],
    )
