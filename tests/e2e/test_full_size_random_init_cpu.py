"""Random-init first-step loss of the real architectures, forward only, on CPU (slow tier).

Specification: from random init, the first-step loss of native Qwen3-4B, the transformers
backend's Qwen3-4B and the 4-layer 30B-A3B MoE cut (each built by its backend's own config
function and initialised by the model's own init code; harness/checks/random_init_forward.py says
how, on 24 GiB) equals the analytic ``ln V + s^2/2`` with ``s`` the lm_head init std the
backend is *configured* with (fixtures/expectations.toml, the tiny entries of that backend:
the same init code at every width), not the std measured on the model under test, so a
wrong init scale cannot move its own expectation; the measured std is itself checked against
the configured one; and the loss equals the source's published value.
"""

import json

import pytest

from harness.checks.random_init_forward import CASES, random_init_problems, run_child, streamed_first_step
from harness.references.expected_loss import analytic_random_init_loss, configured_lm_head_std, expected_loss
from harness.registry.tolerances import INIT_STD_RTOL


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

    published = expected_loss(spec.backend, spec.model, "random", "neuron")
    problems, summary = random_init_problems(result, spec.backend, published)
    print(f"{spec.what}: {summary}")  # the full record is <tmp_path>/<case>.json (under --basetemp)
    assert not problems, summary + "\n" + "\n".join(problems)



def test_the_streamed_init_is_the_backends_own_init_scale():
    """The cheap form of the cases above (default tier, in-process): the streamed init of the
    tiny transformers-backend model is its backend's configured init (its patched
    ``_init_weights``, in force from the build through the unit-by-unit init): the measured
    lm_head std equals the configured one."""
    result = streamed_first_step("hf_v5-tiny_dense", batch=1, seq_len=32, compute_dtype="float32", chunk=16)
    configured = configured_lm_head_std("hf_v5", result["hidden_size"])
    assert abs(result["lm_head_std"] / configured - 1) <= INIT_STD_RTOL, (
        f"lm_head init std {result['lm_head_std']:.5f} vs configured {configured:.5f}")


# --- the checks above, on fabricated results: a 1.5x init-scale error cannot pass ------------


def _result(std: float, hidden: int = 2560, vocab: int = 151936) -> dict:
    loss = analytic_random_init_loss(vocab, hidden, std)
    return {"vocab_size": vocab, "hidden_size": hidden, "lm_head_std": std,
            "label_averaged_loss": loss, "label_averaged_loss_se": 1e-3, "sampled_loss": loss,
            "sampled_loss_se": 0.03, "tokens": 1024, "logit_variance": std**2 * hidden,
            "wall_s": 1.0, "peak_rss_gib": 1.0}


PUBLISHED_4B = expected_loss("titan_native", "Qwen3-4B-Instruct-2507", "random", "neuron")


def test_random_init_checks_pass_a_model_initialised_as_configured():
    problems, summary = random_init_problems(_result(0.02), "titan_native", PUBLISHED_4B)
    assert problems == [], summary


def test_random_init_checks_catch_a_1_5x_init_scale_error():
    problems, summary = random_init_problems(_result(0.03), "titan_native", PUBLISHED_4B)
    text = "\n".join(problems)
    assert "init std" in text and "vs analytic" in text and "vs published" in text, summary
