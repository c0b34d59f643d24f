"""Multi-step goldens: committed loss curves of the tiny runs, per torchtitan generation and device.

``tests/assets/losses/<generation>/<device>/<run>.txt`` holds one line per step, ``<step> <loss>``,
torchtitan's own format (its ``tests/assets/losses/*.txt``): the loss as the run logged it,
written with ``repr`` so that it reads back as the same float. Beside it, ``<run>.json`` (the
sidecar) records what makes the curve reproducible bit for bit (``REPRODUCIBLE_BY``: torch,
torchtitan, and the machine's arithmetic identity, harness/device/arithmetic.py), the command that
regenerates it, and where and when it was recorded. scripts/record_goldens.py writes both.

A run is compared with its golden (``compare``) exactly where the golden's identity is this
machine's (``differences`` is empty), else within a tolerance of the one policy where one was
measured, else not at all: the caller says what differs (``policy``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from harness.device.arithmetic import describe
from harness.registry import paths

# What decides whether a curve reproduces bit for bit: the sidecar's "reproducible_by" keys.
REPRODUCIBLE_BY = ("torch", "torchtitan", "arithmetic")
SIDECAR_KEYS = ("run", "steps", "device", "generation", "reproducible_by", "regenerate", "lr",
                "recorded")


class GoldenError(ValueError):
    pass


def folder(generation: str, device: str, root: Path = paths.GOLDENS) -> Path:
    return Path(root) / generation / device


def loss_file(generation: str, device: str, run: str, root: Path = paths.GOLDENS) -> Path:
    return folder(generation, device, root) / f"{run}.txt"


def format_losses(losses) -> str:
    """torchtitan's loss-file text: ``<step> <loss>`` per line, steps from 1."""
    return "".join(f"{step} {float(loss)!r}\n" for step, loss in enumerate(losses, start=1))


def parse_losses(text: str, source: str = "<text>") -> tuple[float, ...]:
    """The losses of a loss file, refusing anything but steps 1, 2, ... with one finite loss each."""
    losses = []
    for number, line in enumerate(text.splitlines(), start=1):
        parts = line.split()
        if len(parts) != 2:
            raise GoldenError(f"{source}:{number}: expected '<step> <loss>', got {line!r}")
        try:
            step, loss = int(parts[0]), float(parts[1])
        except ValueError:
            raise GoldenError(f"{source}:{number}: expected '<step> <loss>', got {line!r}") from None
        if step != number:
            raise GoldenError(f"{source}:{number}: step {step} where step {number} belongs")
        if not math.isfinite(loss):
            raise GoldenError(f"{source}:{number}: loss {parts[1]} is not finite")
        losses.append(loss)
    if not losses:
        raise GoldenError(f"{source}: no steps")
    return tuple(losses)


@dataclass(frozen=True)
class Golden:
    run: str
    losses: tuple[float, ...]
    sidecar: dict
    path: Path | None = None

    @property
    def reproducible_by(self) -> dict:
        return self.sidecar["reproducible_by"]


def read(path: str | Path) -> Golden:
    """A golden's loss file and its sidecar (``<run>.json`` beside it), both checked."""
    path = Path(path)
    losses = parse_losses(path.read_text(), str(path))
    side = path.with_suffix(".json")
    if not side.is_file():
        raise GoldenError(f"{path}: no sidecar {side.name} (what makes it reproducible)")
    sidecar = json.loads(side.read_text())
    missing = [k for k in SIDECAR_KEYS if k not in sidecar]
    missing += [f"reproducible_by.{k}" for k in REPRODUCIBLE_BY if k not in sidecar.get("reproducible_by", {})]
    if missing:
        raise GoldenError(f"{side}: lacks {missing}")
    if sidecar["run"] != path.stem or sidecar["steps"] != len(losses):
        raise GoldenError(f"{side}: says run {sidecar['run']!r} of {sidecar['steps']} steps; "
                          f"{path.name} holds {len(losses)} steps")
    return Golden(sidecar["run"], losses, sidecar, path)


def write(path: str | Path, losses, sidecar: dict) -> Path:
    """Write a golden's loss file and sidecar (scripts/record_goldens.py)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(format_losses(losses))
    path.with_suffix(".json").write_text(json.dumps(sidecar, indent=2, sort_keys=True) + "\n")
    return path


def shared_steps(lrs, golden_lrs) -> int:
    """How many first losses a run shares with a golden run of another length: those of the steps
    before the first whose logged learning rate differs (the schedule decays over the run's
    length after its warmup; the loss of step k comes from the updates of steps 1..k-1, so this
    is one step short of all it could claim)."""
    shared = 0
    for a, b in zip(lrs, golden_lrs, strict=False):  # runs of different lengths: the shared prefix
        if a is None or a != b:
            break
        shared += 1
    return shared


def differences(recorded: dict, here: dict) -> list[str]:
    """What differs between a golden's ``reproducible_by`` and this machine's, in words; empty
    where the curve must reproduce bit for bit."""
    out = []
    for key in REPRODUCIBLE_BY:
        a, b = recorded.get(key), here.get(key)
        if a != b:
            out.append(f"{key}: {_said(b)} here, {_said(a)} in the golden")
    return out


def _said(value) -> str:
    if isinstance(value, dict):
        return describe(value)
    return str(value)


@dataclass
class CurveComparison:
    """A run's loss curve against its golden: equal to the bit (``band`` 0) or within ``band``."""

    run: str
    observed: list[float]
    golden: list[float]
    band: float = 0.0
    first_step: int | None = None  # the first step out of the band (1-based), None if none
    worst: float = 0.0  # the largest |observed - golden| over the common steps
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.first_step is None

    def message(self) -> str:
        rule = "bit for bit" if self.band == 0 else f"within {self.band:g}"
        lines = [f"{self.run}: loss curve vs its golden ({rule}): "
                 + ("equal" if self.ok else f"first divergent step {self.first_step}"), *self.notes]
        if not self.ok:
            i = self.first_step - 1
            if i < len(self.observed) and i < len(self.golden):
                lines.append(f"step {self.first_step}: {self.observed[i]!r} vs golden "
                             f"{self.golden[i]!r} ({self.observed[i] - self.golden[i]:+.3e}); "
                             f"largest difference {self.worst:.3e}")
            lines.append("this run's curve, ready to paste over the golden once the change is "
                         "understood (or rerun scripts/record_goldens.py):\n"
                         + format_losses(self.observed))
        return "\n".join(lines)


def compare(run: str, observed, golden, band: float = 0.0) -> CurveComparison:
    """Every step of ``observed`` against ``golden``: ``band`` 0 means the same float to the bit."""
    observed, golden = [float(x) for x in observed], [float(x) for x in golden]
    result = CurveComparison(run, observed, golden, band)
    # strict=False: a length difference is noted below, after the shared steps are compared
    for i, (a, b) in enumerate(zip(observed, golden, strict=False)):
        diff = abs(a - b)
        result.worst = max(result.worst, diff if math.isfinite(diff) else math.inf)
        same = a == b if band == 0 else diff <= band
        if not same and result.first_step is None:
            result.first_step = i + 1
    if len(observed) != len(golden):
        result.notes.append(f"{len(observed)} steps vs the golden's {len(golden)}")
        if result.first_step is None:
            result.first_step = min(len(observed), len(golden)) + 1
    return result


@dataclass(frozen=True)
class Policy:
    """How a run is held to its golden here: ``band`` 0 (bit for bit), a positive band (the one
    policy's tolerance for another machine's arithmetic), or None: not comparable here, ``why``."""

    band: float | None
    why: str


def policy(golden: Golden, here: dict, regime: str, device: str) -> Policy:
    """Bit for bit where torch, torchtitan and the arithmetic are the golden's; where only the
    arithmetic differs, within ``golden_curve_across_machines`` if the policy measured one for
    ``regime`` on ``device`` (harness/registry/tolerances.py); else not compared, naming what
    differs (a version change moves a curve by what no tolerance can bound: re-record)."""
    from harness.registry.tolerances import parity_tolerance  # noqa: PLC0415  heavy: torch; reading a golden curve needs none

    differ = differences(golden.reproducible_by, here)
    if not differ:
        return Policy(0.0, "torch, torchtitan and arithmetic as recorded: bit for bit")
    if all(d.startswith("arithmetic:") for d in differ):
        try:
            tolerance = parity_tolerance("golden_curve_across_machines", regime, device)
        except KeyError:
            pass
        else:
            return Policy(tolerance.atol, f"{differ[0]}: within golden_curve_across_machines "
                                          f"({tolerance.why})")
    return Policy(None, f"{golden.run}'s golden ({golden.path}) was recorded elsewhere: "
                        + "; ".join(differ) + f"; no tolerance measured for that ({regime}, "
                        f"{device}); re-record it here with: {golden.sidecar['regenerate']}")
