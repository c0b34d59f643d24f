"""Expected first-step losses, read from fixtures/expectations.toml.

Like HF's ``Expectations``, values are keyed by where they apply (backend, model, init, device
kind); unlike it, there is no "closest key" fallback: a missing key is an error that names it.
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

from harness.backends import paths
from harness.tolerances import loss_band

EXPECTATIONS_FILE = paths.FIXTURES / "expectations.toml"


class MissingExpectation(KeyError):
    pass


@dataclass(frozen=True)
class Expectation:
    key: tuple[str, str, str, str]
    value: float
    tolerance: float
    tolerance_name: str
    source: str  # how the value was obtained, for messages and reports

    def check(self, observed: float) -> str | None:
        """None when ``observed`` meets the expectation, else a message saying by how much not."""
        if math.isfinite(observed) and abs(observed - self.value) <= self.tolerance:
            return None
        return (
            f"first-step loss {observed:.6f} vs expected {self.value:.6f} "
            f"(|diff| {abs(observed - self.value):.3g} > {self.tolerance_name} {self.tolerance:g}); "
            f"expected value from {self.source}; key {self.key}"
        )


def _recorded_loss(ref: str) -> float:
    model, key, mask = ref.split(":")
    card = json.loads((paths.FIXTURES / model / "fixture_card.json").read_text())
    table = {"document": "recorded_first_step_loss", "causal": "recorded_first_step_loss_causal_mask"}
    return float(card[table[mask]][key])


def analytic_random_init_loss(vocab_size: int, hidden_size: int, lm_head_std: float) -> float:
    """E[CE] of logits ~ N(0, s^2) with s^2 = std^2 * hidden (|RMSNorm(h)|^2 = hidden)."""
    variance = lm_head_std**2 * hidden_size
    return math.log(vocab_size) + variance / 2


def _model_config(model: str) -> dict:
    for root in (paths.FIXTURES, paths.FIXTURES / "reference_configs"):
        path = root / model / "config.json"
        if path.is_file():
            return json.loads(path.read_text())
    raise FileNotFoundError(f"no config.json for model {model!r} under {paths.FIXTURES}")


def _analytic(model: str, spec: dict) -> tuple[float, str]:
    hf = _model_config(model)
    std = spec["lm_head_std"]
    if std == "hidden^-0.5":
        std = hf["hidden_size"] ** -0.5
    value = analytic_random_init_loss(hf["vocab_size"], hf["hidden_size"], float(std))
    return value, f"ln V + std^2*hidden/2 (V={hf['vocab_size']}, hidden={hf['hidden_size']}, std={std:.4g})"


class ExpectationRegistry:
    def __init__(self, path: Path = EXPECTATIONS_FILE) -> None:
        data = tomllib.loads(Path(path).read_text())
        self.path = Path(path)
        self.entries: list[dict] = data["expectation"]

    def keys(self) -> list[tuple[str, str, str, str]]:
        return [(e["backend"], e["model"], e["init"], e["device"]) for e in self.entries]

    def get(self, backend: str, model: str, init: str, device: str) -> Expectation:
        matches = [
            e for e in self.entries
            if (e["backend"], e["model"], e["init"]) == (backend, model, init)
            and e["device"] in (device, "any")
        ]
        exact = [e for e in matches if e["device"] == device]
        chosen = (exact or matches)[:1]
        if not chosen:
            raise MissingExpectation(
                f"no expectation for backend={backend!r} model={model!r} init={init!r} "
                f"device={device!r} in {self.path}; known keys: {self.keys()}"
            )
        entry = chosen[0]
        key = (backend, model, init, entry["device"])
        if "value" in entry:
            value, source = float(entry["value"]), f"published value in {self.path.name}"
        elif "recorded" in entry:
            value, source = _recorded_loss(entry["recorded"]), f"fixture card ({entry['recorded']})"
        elif "analytic_random_init" in entry:
            value, source = _analytic(model, entry["analytic_random_init"])
        else:
            raise ValueError(f"expectation {key} in {self.path} gives no value source")
        band = loss_band(entry["tolerance"])
        return Expectation(key, value, band.value, band.name, source)
