"""The analytic expectations, computed: the random-init first-step loss ``ln V + s^2/2`` and the
lm_head init std rules it is taken at, and the expected first-step loss of a run that needs
no launched run to compute it (``expected_loss``), from the rule the registry states
(harness/registry/expectations.py ``ExpectationRule``). A rule computed from a launched run's
weights is the checks' (harness/checks/reference_forward.py ``expectation_for_run``).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from harness.registry.expectations import (
    Expectation,
    ExpectationRegistry,
    ExpectationRule,
    MissingExpectation,
    lm_head_std_rule,
    model_config,
)


def analytic_random_init_loss(vocab_size: int, hidden_size: int, lm_head_std: float) -> float:
    """E[CE] of logits ~ N(0, s^2) with s^2 = std^2 * hidden (|RMSNorm(h)|^2 = hidden)."""
    variance = lm_head_std**2 * hidden_size
    return math.log(vocab_size) + variance / 2


def truncated_normal_std(std: float, cutoff: float) -> float:
    """The std of N(0, std^2) cut at +-cutoff*std (``nn.init.trunc_normal_(std=s, a=-c*s,
    b=c*s)``): the std it is given is the untruncated normal's; at c = 3 the variance drawn is
    0.9733 of it (1 - 2c*phi(c) / (2*Phi(c) - 1))."""
    phi = math.exp(-cutoff * cutoff / 2) / math.sqrt(2 * math.pi)
    mass = math.erf(cutoff / math.sqrt(2))
    return std * math.sqrt(1 - 2 * cutoff * phi / mass)


def lm_head_std(rule, hidden: int) -> float:
    """The std the lm_head is drawn with under ``rule``: ``0.02`` (a plain normal),
    ``hidden^-0.5``, or ``trunc3(hidden^-0.5)`` (that std, cut at +-3 std, as torchtitan's
    output inits do)."""
    rule = str(rule)
    truncated = re.fullmatch(r"trunc(\d+(?:\.\d+)?)\((.+)\)", rule)
    if truncated:
        return truncated_normal_std(lm_head_std(truncated.group(2), hidden),
                                    float(truncated.group(1)))
    return hidden ** -0.5 if rule == "hidden^-0.5" else float(rule)


def configured_lm_head_std(backend: str, hidden: int, generation: str | None = None) -> float:
    """The lm_head init std ``backend`` is configured with at width ``hidden``: its registered
    rule (harness/registry/expectations.py ``lm_head_std_rule``), never a std measured on a
    model."""
    return lm_head_std(lm_head_std_rule(backend, generation), hidden)


def analytic(rule: ExpectationRule, model: str,
             model_dir: str | Path | None = None) -> Expectation:
    """The random-init loss ``rule`` states for ``model`` (its config.json: a full-size run's
    own in ``model_dir``, else the fixtures'), in the rule's band."""
    hf = model_config(model, model_dir)
    std = lm_head_std(rule.lm_head_std, hf["hidden_size"])
    value = analytic_random_init_loss(hf["vocab_size"], hf["hidden_size"], std)
    return rule.expectation(value, f"ln V + std^2*hidden/2 (V={hf['vocab_size']}, "
                                   f"hidden={hf['hidden_size']}, std={std:.4g})")


def expectation_of(rule: ExpectationRule, model: str,
                   model_dir: str | Path | None = None) -> Expectation:
    """The expectation ``rule`` states where no launched run is needed: its value, or the
    analytic random-init loss; a rule computed from a run's weights is an error here."""
    if rule.value is not None:
        return rule.expectation(rule.value, rule.source)
    if rule.lm_head_std is not None:
        return analytic(rule, model, model_dir)
    raise MissingExpectation(f"{rule.key}: an hf_forward expectation is computed from a launched "
                             f"run (harness/checks/reference_forward.py expectation_for_run)")


def expected_loss(backend: str, model: str, init: str, device: str, mask: str = "causal",
                  dp: int = 2, generation: str | None = None,
                  model_dir: str | Path | None = None) -> Expectation:
    """The expected first-step loss of a run of this key, without launching it (arguments:
    harness/registry/expectations.py ``ExpectationRegistry.rule``; ``model_dir``: the
    config.json a full-size run reads)."""
    rule = ExpectationRegistry().rule(backend, model, init, device, mask, dp, generation,
                                      own_config=model_dir is not None)
    return expectation_of(rule, model, model_dir)
