"""State beyond the weights, through torchtitan's real trainer (issue "No blind spots", item 9).

(a) MoE load balancing: nki_moe's ``expert_bias`` buffers move during training, are saved in
    the torchtitan (DCP) checkpoint, and are restored on resume (the resumed trainer's buffers
    right after the load equal the checkpoint's; both runs end with bitwise equal state).
(b) Resume: a run resumed from the step-K checkpoint of a first run (a fresh run dir whose
    ``--checkpoint.initial_load_path`` is that step folder,
    ``--checkpoint.no-initial-load-model-only`` so optimizer, lr schedule, dataloader and train
    state come back too) reproduces the uninterrupted run's later losses bitwise (seeded CPU
    runs are bit-identical), and its final full checkpoint equals the uninterrupted run's key by
    key, bitwise; titan_native and nki_moe.
(c) Tied embeddings (tiny_dense is tied): in every rank the token embedding and the output
    projection are one parameter after build, after the checkpoint load and after training, and
    the saved HF checkpoint holds no diverging ``lm_head.weight``.
Each is shown failing on a planted defect: expert_bias zeroed after the checkpoint load; a
model built untied.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from harness import training_state as ts
from harness.data import instrumented
from harness.launch import RunSpec

K, STEPS = 2, 4
CHECKPOINTING = ("--checkpoint.enable", "--checkpoint.interval", str(K),
                 "--checkpoint.no-last-save-model-only")


@pytest.fixture(scope="module")
def instrumented_names():
    with contextlib.ExitStack() as stack:
        yield {base: stack.enter_context(instrumented.instrumented_backend(base))
               for base in ("titan_native", "nki_moe")}


def _ok(result):
    assert result.ok, f"{result.name} failed: see {result.run_dir}"
    return result


def resume_pair(backend_runs, names, base, plants=()):
    """(uninterrupted run of STEPS, run resumed from its step-K checkpoint)."""
    env = instrumented.env(f"harness.backends.{base}")
    first = _ok(backend_runs.get(RunSpec(names[base], steps=STEPS, overrides=CHECKPOINTING,
                                         extra_env=env)))
    resume = CHECKPOINTING + (
        "--checkpoint.initial_load_path", str(ts.checkpoint_dir(first.run_dir, K).resolve()),
        "--checkpoint.no-initial-load-model-only")
    second = _ok(backend_runs.get(RunSpec(
        names[base], steps=STEPS, overrides=resume, plants=plants, extra_env=env)))
    return first, second


def resume_findings(first, second) -> list[str]:
    found = []
    want = {s.step: s.loss for s in first.steps}
    got = {s.step: s.loss for s in second.steps}
    if sorted(got) != list(range(K + 1, STEPS + 1)):
        found.append(f"resumed run logged steps {sorted(got)}, not {K + 1}..{STEPS}")
    for step, loss in got.items():
        if loss != want.get(step):
            found.append(f"step {step}: resumed loss {loss!r} != uninterrupted {want.get(step)!r}")
    diffs = ts.differences(ts.load_dcp(ts.checkpoint_dir(first.run_dir, STEPS)),
                           ts.load_dcp(ts.checkpoint_dir(second.run_dir, STEPS)))
    found += [f"final checkpoint: {d}" for d in diffs[:20]]
    return found


@pytest.mark.slow
@pytest.mark.parametrize("base", ["titan_native", "nki_moe"])
def test_resume_reproduces_uninterrupted_run(backend_runs, instrumented_names, base):
    first, second = resume_pair(backend_runs, instrumented_names, base)
    found = resume_findings(first, second)
    assert not found, "\n".join(found)


def expert_bias_findings(first, second) -> list[str]:
    found = []
    saved_k = ts.expert_bias(ts.load_dcp(ts.checkpoint_dir(first.run_dir, K)))
    saved_end = ts.expert_bias(ts.load_dcp(ts.checkpoint_dir(first.run_dir, STEPS)))
    if not saved_k:
        return ["no expert_bias in the step-K checkpoint"]
    for key, value in saved_k.items():
        if not value.abs().sum() > 0:
            found.append(f"{key}: still zero after {K} steps (never updated)")
        if torch.equal(value, saved_end[key]):
            found.append(f"{key}: unchanged between step {K} and step {STEPS}")
    # what the resumed trainer holds right after the load, on every rank
    for rank in range(first.nproc):
        loaded = torch.load(second.run_dir / "dump" / "harness_state" / f"rank{rank}_loaded.pt")
        loaded = {ts.canonical_key(k): v for k, v in loaded.items()}
        for key, value in saved_k.items():
            if key not in loaded:
                found.append(f"rank {rank}: {key} not found after load ({sorted(loaded)})")
            elif not torch.equal(loaded[key], value):
                found.append(f"rank {rank}: {key} after load {loaded[key].tolist()} != saved "
                             f"{value.tolist()}")
    return found


@pytest.mark.slow
def test_expert_bias_updated_saved_restored(backend_runs, instrumented_names):
    first, second = resume_pair(backend_runs, instrumented_names, "nki_moe")
    found = expert_bias_findings(first, second)
    assert not found, "\n".join(found)


@pytest.mark.slow
def test_checks_catch_expert_bias_lost_on_resume(backend_runs, instrumented_names):
    first, second = resume_pair(backend_runs, instrumented_names, "nki_moe",
                                plants=("reset_expert_bias_on_load",))
    assert expert_bias_findings(first, second), "zeroed expert_bias went unnoticed"
    assert resume_findings(first, second), "zeroed expert_bias left the resumed run identical"


def test_tied_embeddings_stay_one_tensor(backend_runs):
    """The instrumented one-step titan_native run the data-path checks share."""
    with instrumented.instrumented_backend("titan_native") as name:
        result = _ok(backend_runs.get(instrumented.native_feed_spec(name)))
    found = ts.tie_findings(result.run_dir, step=1)
    assert not found, "\n".join(found)


@pytest.mark.slow
def test_tie_check_catches_untied_model(backend_runs):
    with instrumented.instrumented_backend("titan_native") as name:
        result = _ok(backend_runs.get(instrumented.native_feed_spec(
            name, plants=("untie_embeddings",))))
    assert ts.tie_findings(result.run_dir, step=1), "an untied model went unnoticed"
