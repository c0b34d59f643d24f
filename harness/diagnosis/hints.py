"""The source's step-7 advice ("if it's higher, double-check the asset path"), by signature.

For a failing pretrained run's step-1 loss, each signature the harness can compute is tried:

- the random-init loss of its config, ``ln V + s^2/2`` (harness/references/expected_loss.py): a
  pretrained run that starts there did not load its weights;
- every known issue's recorded first-step signature (harness/registry/known_issues/) that is recorded
  for another backend, generation, device or size: the same failure may have moved here.

Each hint carries the numbers behind it; no signature that fits, no hint.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from harness.registry import known_issues
from harness.registry.hf_config import Qwen3Arch

CHECK = "first_step_loss"


def random_init_hint(observed: float, vocab: int, hidden: int, lm_head_std: float,
                     read_from: str | Path) -> str | None:
    from harness.references.expected_loss import analytic_random_init_loss  # noqa: PLC0415  heavy: torch; budget.py reads diagnose's limits without it
    from harness.registry.tolerances import loss_band  # noqa: PLC0415  heavy: torch; budget.py reads diagnose's limits without it

    analytic = analytic_random_init_loss(vocab, hidden, lm_head_std)
    band = loss_band("analytic_random_init").value
    if abs(observed - analytic) > band:
        return None
    return (f"the weights did not load: check --assets-dir (this run read {read_from}). Its "
            f"step-1 loss {observed:.4f} is the random-init loss ln V + s^2/2 = {analytic:.4f} "
            f"(V {vocab}, s^2 = {lm_head_std:g}^2 x {hidden}) within {band:g}")


def known_issue_hints(deviation: float, context: dict[str, str]) -> list[str]:
    """Known issues recorded elsewhere whose first-step signature this deviation fits."""
    here = {i.name for i in known_issues.applicable(CHECK, **context)}
    hints = []
    for issue in known_issues.ISSUES:
        wheres = [w for w in issue.where if w.check == CHECK]
        signature = issue.signature_for(CHECK)
        if not wheres or issue.name in here or signature.quantity != "deviation":
            continue
        if signature.matches(deviation):
            recorded = "; ".join(_where(w) for w in wheres)
            hints.append(f"looks like {issue.name} (recorded for {recorded}): step-1 deviation "
                         f"{deviation:+.4f} fits its signature {signature.describe()}")
    return hints


def _where(where) -> str:
    parts = []
    for f in fields(where):
        value = getattr(where, f.name)
        if f.name != "check" and value:
            parts.append(f"{f.name}={','.join(map(str, value)) if isinstance(value, tuple) else value}")
    return " ".join(parts) or "everywhere"


def hints_for(run, observed: float, deviation: float | None) -> list[str]:
    """Every hint for a failing pretrained ``run`` (harness.results.run_result.RunResult)."""
    spec = run.spec
    if spec.init != "pretrained":
        return []
    from harness.references.expected_loss import configured_lm_head_std  # noqa: PLC0415  heavy: torch; budget.py reads diagnose's limits without it

    arch = Qwen3Arch.from_dir(spec.model_dir())
    hints = []
    try:
        std = configured_lm_head_std(spec.backend, arch.hidden_size,
                                     run.versions.get("torchtitan-generation") or None)
    except Exception:  # no random-init rule recorded for this backend: no signature to try
        std = None
    if std is not None:
        hint = random_init_hint(observed, arch.vocab_size, arch.hidden_size, std,
                                spec.hf_assets_path or spec.weights_dir())
        if hint:
            hints.append(hint)
    if deviation is not None:
        hints += known_issue_hints(deviation, run.where())
    return hints
