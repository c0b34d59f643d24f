"""Random-init first-step loss of the real architectures, forward only, on CPU (slow tier).

Specification: from random init, the first-step loss of native Qwen3-4B, the transformers
backend's Qwen3-4B and the 4-layer 30B-A3B MoE cut (each built by its backend's own config
function and initialised by the model's own init code; harness/random_init_forward.py says
how, on 24 GiB) equals the analytic ``ln V + s^2/2`` with ``s`` the lm_head init std the
backend is *configured* with (fixtures/expectations.toml, the tiny entries of that backend:
the same init code at every width), not the std measured on the model under test, so a
wrong init scale cannot move its own expectation; the measured std is itself checked against
the configured one; and the loss equals the source's published value.
"""

import json

import pytest

from harness.expectations import (
    ExpectationRegistry,
    analytic_random_init_loss,
    configured_lm_head_std,
)
from harness.random_init_forward import CASES, run_child
from harness.tolerances import INIT_STD_RTOL, loss_band


@pytest.mark.slow
def test_streamed_init_and_forward_equal_whole_model(tmp_path):
    """The streaming used by the slow cases is the model's own init and forward, unchanged.

    On the tiny fixtures (tied native, tied transformers backend, untied native MoE), fp32:
    every parameter the whole-model init writes is written by the streamed init, bit-identical,
    and the loss statistics of the streamed forward equal those of the whole model's forward.
    """
    report, wall_s, _ = run_child(["check-streaming"], tmp_path / "check-streaming.log",
                                  timeout_s=600, memory_limit_gib=8.0)
    print(f"streamed vs whole-model check on {list(report)}: {wall_s:.0f} s")
    problems = []
    for name, r in report.items():
        for key in ("missing_in_streamed", "extra_in_streamed", "weights_differ"):
            if r[key]:
                problems.append(f"{name}: {key}: {r[key]}")
        for stat in ("sampled_loss", "label_averaged_loss", "logit_variance"):
            whole, streamed = r["whole"][stat], r["streamed"][stat]
            if abs(whole - streamed) > 1e-5 * max(1.0, abs(whole)):
                problems.append(f"{name}: {stat} whole {whole:.8f} vs streamed {streamed:.8f}")
    assert not problems, "\n".join(problems)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_random_init_first_step_loss(case, tmp_path):
    spec = CASES[case]
    result, wall_s, polled_peak = run_child(["case", case], tmp_path / f"{case}.log")
    result["parent_wall_s"] = round(wall_s, 1)
    result["polled_peak_rss_gib"] = round(polled_peak, 2)
    (tmp_path / f"{case}.json").write_text(json.dumps(result, indent=2) + "\n")

    registry = ExpectationRegistry()
    tolerance = loss_band("analytic_random_init").value
    configured_std = configured_lm_head_std(spec.backend, result["hidden_size"])
    analytic = analytic_random_init_loss(result["vocab_size"], result["hidden_size"],
                                         configured_std)
    observed = result["label_averaged_loss"]
    published = registry.get(spec.backend, spec.model, "random", "neuron")
    summary = (
        f"{spec.what}: label-averaged first-step loss {observed:.4f} +- "
        f"{result['label_averaged_loss_se']:.4f}, sampled "
        f"{result['sampled_loss']:.4f} +- {result['sampled_loss_se']:.4f} "
        f"({result['tokens']} tokens), logit variance {result['logit_variance']:.4f}; "
        f"analytic ln V + s^2/2 = {analytic:.4f} (configured lm_head std {configured_std:.5f}, "
        f"measured {result['lm_head_std']:.5f}); "
        f"published {published.value} ({published.source}); "
        f"{result['wall_s']:.0f} s, peak RSS {result['peak_rss_gib']:.1f} GiB"
    )
    print(summary)  # the full record is <tmp_path>/<case>.json (under --basetemp)

    problems = []
    if abs(result["lm_head_std"] / configured_std - 1) > INIT_STD_RTOL:
        problems.append(f"lm_head init std {result['lm_head_std']:.5f} vs configured "
                        f"{configured_std:.5f} (rtol {INIT_STD_RTOL})")
    if abs(observed - analytic) > tolerance:
        problems.append(f"vs analytic: |{observed:.4f} - {analytic:.4f}| > {tolerance}")
    gap = abs(result["sampled_loss"] - observed)
    if gap > 4 * result["sampled_loss_se"] + 1e-3:
        problems.append(f"sampled loss is {gap:.4f} from the label-averaged loss (> 4 SE)")
    mismatch = published.check(observed)
    if mismatch:
        problems.append(f"vs published: {mismatch}")
    assert not problems, summary + "\n" + "\n".join(problems)


