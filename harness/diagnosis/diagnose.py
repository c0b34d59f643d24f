"""``diagnose(run)``: what the checks ask when a run's first step fails.

The first divergent module is found in a child process (``python -m harness.diagnosis
localize``), on the run's device: the run's plants and the model build never touch the
harness process, and a full-size model's memory is the child's own. Hints need no model.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.diagnosis import hints
from harness.registry import dump_layout, environment, known_issues, paths

TIMEOUT_S = 900
# Module walks a session may start, per device (none given: no limit). On trn2 every walk is a
# child of up to TIMEOUT_S that the nightly's time budget counts (scripts/nightly/budget.py): a
# night whose every run fails is diagnosed for its first few, and says so for the rest.
WALKS_PER_SESSION = {"neuron": 3}
_WALKS: list[str] = []  # the run dirs walked in this process (accelerator tiers: one process)


@dataclass
class Diagnosis:
    divergence: dict | None = None  # localize.Divergence.to_json()
    not_diagnosed: str | None = None  # why no divergence was looked for, or why it failed
    hints: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    later_nonfinite: int | None = None  # the first non-finite step after step 1, if any
    explained_by: str | None = None  # the known issue whose signature this failure is

    def lines(self) -> list[str]:
        out = []
        if self.explained_by is not None:
            out.append(f"diagnosis: the step-1 loss is known issue {self.explained_by}'s recorded "
                       f"signature here, so no module walk was run")
        if self.divergence is not None:
            where = self.divergence["line"]
            out.append(f"first divergent module: {where}" if self.divergence["module"]
                       else f"diagnosis: {where}")
        elif self.not_diagnosed:
            out.append(f"diagnosis not run: {self.not_diagnosed}")
        out += list((self.divergence or {}).get("known", ()))
        if self.later_nonfinite is not None and self.divergence is not None \
                and not self.divergence["module"]:
            out.append(f"step 1's forward and backward agree with the reference, but step "
                       f"{self.later_nonfinite} went non-finite: it arose after the first "
                       f"optimizer step (the diagnosis replays step 1: its batch, starting "
                       f"weights, loss and gradients)")
        out += [f"hint: {h}" for h in self.hints]
        return out

    @property
    def module(self) -> str | None:
        return (self.divergence or {}).get("module")

    def to_json(self) -> dict:
        return {"module": self.module, "divergence": self.divergence,
                "not_diagnosed": self.not_diagnosed, "hints": self.hints,
                "wall_s": round(self.wall_s, 1), "lines": self.lines()}


def request(run) -> dict:
    """Everything the child needs, from the run's result alone (its spec: the folders it read,
    the plants a self-test put into its ranks)."""
    spec = run.spec
    weights, precision = spec.weights_dir(), spec.size_spec.precision
    return {"backend": spec.backend, "attention": spec.attention, "model_dir": str(spec.model_dir()),
            "weights_dir": None if weights is None else str(weights),
            "run_dir": str(run.run_dir), "nproc": run.nproc, "device": run.device,
            "plants": list(spec.plants), "workarounds": list(spec.all_workarounds),
            "regime": precision if precision in ("float32", "bf16_experts") else "float32"}


def known_explanation(run, deviation: float | None) -> str | None:
    """The known issue (harness/registry/known_issues/) that a failing step-1 loss of this run is, by
    its recorded signature here (backend, size, init, device, attention, generation, the run's
    workarounds): that is the answer, and rebuilding the model would only say it again."""
    if deviation is None:
        return None
    verdict = known_issues.judge("first_step_loss", "the step-1 loss is off", {"deviation": deviation},
                                 run.spec.all_workarounds, **run.where())
    return ", ".join(i.name for i in verdict.issues) if verdict.status == "known" else None


def first_nonfinite_after_step_1(run) -> int | None:
    """A ``finite`` failure past step 1 (NaN/inf from a bad backward or update): the step."""
    for step in getattr(run, "steps", ()):
        if step.step > 1 and not (math.isfinite(step.loss) and math.isfinite(step.grad_norm)):
            return step.step
    return None


def launched(run) -> bool:
    return dump_layout.dump_folder(run.run_dir).is_dir()


def localize_in_child(req: dict, log: Path) -> tuple[dict | None, str | None]:
    # Marked, so the end-of-session sweep finds it if it outlives its timeout; no shims or
    # plants in its environment: the child applies the run's itself, in-process.
    env = environment.child_environment()
    with open(log, "w") as out:
        try:
            proc = subprocess.run([sys.executable, "-m", "harness.diagnosis", "localize",
                                   json.dumps(req)], stdout=out, stderr=subprocess.STDOUT,
                                  cwd=paths.REPO_ROOT, env=env, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return None, f"no answer within {TIMEOUT_S} s (log {log})"
    text = log.read_text(errors="replace")
    lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = " | ".join(text.splitlines()[-3:])
        return None, f"the diagnosis failed (exit {proc.returncode}, log {log}): {tail}"
    result = json.loads(lines[-1][len("RESULT "):])
    return result.get("divergence"), result.get("not_diagnosed")


_DONE: dict[str, Diagnosis] = {}  # run dir -> its diagnosis (two failing checks, one child)


def diagnose(run, observed: float | None = None, deviation: float | None = None) -> Diagnosis | None:
    """None for a result that is not a launched run's (no dump folder: nothing to rebuild)."""
    if not launched(run):
        return None
    key = str(Path(run.run_dir).resolve())
    if key in _DONE and (observed is None or _DONE[key].hints or run.spec.init != "pretrained"):
        return _DONE[key]
    _DONE[key] = _diagnose(run, observed, deviation)
    return _DONE[key]


def _diagnose(run, observed, deviation) -> Diagnosis:
    start = time.monotonic()
    diagnosis = Diagnosis()
    from harness.diagnosis.subject import NATIVE_BUILDS  # noqa: PLC0415  heavy: torch; budget.py reads this module's limits without it

    try:
        req = request(run)
    except Exception as error:  # a subject the registry does not describe
        diagnosis.not_diagnosed = f"{type(error).__name__}: {error}"
    else:
        if run.spec.backend not in NATIVE_BUILDS:
            diagnosis.not_diagnosed = (f"backend {run.spec.backend!r}: the diagnosis rebuilds only "
                                       f"{sorted(NATIVE_BUILDS)}")
        elif req["weights_dir"] is None and dump_layout.initial_weights_dir(run.run_dir) is None:
            diagnosis.not_diagnosed = (f"random init, and the ranks dumped no step-0 weights "
                                       f"under {dump_layout.initial_folder(dump_layout.dump_folder(run.run_dir))}")
    diagnosis.explained_by = known_explanation(run, deviation)
    if diagnosis.not_diagnosed is None and diagnosis.explained_by is None:
        cap = WALKS_PER_SESSION.get(run.device)
        if cap is not None and len(_WALKS) >= cap:
            diagnosis.not_diagnosed = (f"this session's {cap} module walks on {run.device} are "
                                       f"spent ({', '.join(Path(d).name for d in _WALKS)}): the "
                                       f"nightly's time budget holds {cap} (scripts/nightly/budget.py)")
        else:
            _WALKS.append(str(run.run_dir))
            diagnosis.divergence, diagnosis.not_diagnosed = localize_in_child(
                req, Path(run.run_dir) / "diagnosis.log")
    if observed is not None:
        try:
            diagnosis.hints = hints.hints_for(run, observed, deviation)
        except Exception as error:
            diagnosis.hints = [f"(hints unavailable: {type(error).__name__}: {error})"]
    diagnosis.later_nonfinite = first_nonfinite_after_step_1(run)
    diagnosis.wall_s = time.monotonic() - start
    return diagnosis
