"""Ignored labels through the real trainer.

Pretraining rows never hold an ignored label, so they leave the loss normalisation over valid
tokens unexercised. This run uses torchtitan's own SFT path (the same ``ChatDataset`` in 0.3.0
and spring 2026; spring's trainer passes the global valid-token count as a float)
(``ChatDataLoader``: prompt labels and EOS padding are ignored; harness/backends/sft_config.py)
on the tiny native backend from the pretrained fixture, 2 ranks, each accumulating 2
microbatches of one row (layout ``ga=2``). Its batches (in process and as the real trainer's
ranks received them) are compared token for token, ignored labels and positions included, with
an independent reference (harness/references/sft_data.py: hand-rendered chat template, the
``tokenizers`` library, numpy's seeded shuffle), and its step-1 ``global_avg_loss`` is
compared with an independent loss over the very batches each rank was fed (dumped
rank-side): the HF model (transformers, float32), CE summed over valid labels on each rank,
summed over ranks, divided by the global valid-label count (harness/references/loss.py).
Wrong normalisations (by all labels; by each rank's own valid labels, then averaged) are shown
to be outside the band, and a trainer planted to normalise by all labels fails the check.
"""

from __future__ import annotations

import math

import pytest

from harness.backends import sft_config
from harness.backends.common import TINY
from harness.checks.reference_forward import hf_loss_parts
from harness.launch import instrumented
from harness.plants import planted
from harness.references import data as ref
from harness.references.batch import Batch, load_batches, microbatches
from harness.references.loss import IGNORE_INDEX
from harness.references.sft_data import sft_reference_batches
from harness.registry import paths
from harness.registry.tolerances import parity_tolerance

# fp32 step-1 loss, torchrun 2 ranks vs in-process HF (the parity policy's torchrun_loss band;
# measured here: -1.3e-7): far below every wrong normalisation (>= 1e-2 here).
TOLERANCE = parity_tolerance("torchrun_loss", "float32").atol
TARGET = "harness.backends.sft_config"
EOS_ID = 0  # the fixture tokenizer's <|endoftext|>


def sft_reference(rank: int, n_batches: int = 1) -> list[Batch]:
    return sft_reference_batches(sft_config.CORPUS_FILE, paths.TINY_DENSE,
                                 sft_config.corpus_to_chat, seq_len=TINY.seq_len,
                                 local_batch_size=TINY.local_batch_size, dp_rank=rank,
                                 dp_world=2, n_batches=n_batches)


def sft_config_batches(rank: int, n_batches: int) -> list[Batch]:
    config = sft_config.tiny_sft()
    tokenizer = config.tokenizer.build(tokenizer_path=config.hf_assets_path)
    loader = config.dataloader.build(dp_world_size=2, dp_rank=rank, tokenizer=tokenizer,
                                     seq_len=TINY.seq_len, local_batch_size=TINY.local_batch_size)
    # the loader's first n_batches
    return [Batch.from_loader(*item) for item, _ in zip(loader, range(n_batches), strict=False)]


def sft_mismatches(rank: int, n_batches: int) -> list[str]:
    return [f"rank {rank} batch {b}: {m}" for b, (got, want) in
            enumerate(zip(sft_config_batches(rank, n_batches), sft_reference(rank, n_batches), strict=True))
            for m in ref.compare(got, want)]


def test_sft_dataloader_matches_independent_reference():
    """Torchtitan's chat dataset (in process) against the hand-rendered, ``tokenizers``-based
    reference (harness/references/sft_data.py): tokens, ignored labels and positions."""
    found = [m for rank in range(2) for m in sft_mismatches(rank, 3)]
    assert not found, "\n".join(found)


def test_sft_reference_catches_planted_mask_defect():
    with planted("sft_mask_off_by_one"):
        found = [m for rank in range(2) for m in sft_mismatches(rank, 1)]
    assert any(m for m in found if "labels" in m), "a shifted prompt mask went unnoticed"


@pytest.fixture(scope="module")
def sft_backend():
    with instrumented.instrumented_backend("titan_native") as name:
        yield name


def sft_run(backend_runs, name, plants=()):
    result = backend_runs.get(instrumented.sft_spec(name, plants=plants))
    assert result.ok, result.describe()
    assert len(result.steps) == 1
    return result


def microbatches_of(result) -> list[Batch]:
    return microbatches(result.run_dir, result.spec.layout_spec.local_batch_size)


def check(result):
    batches = load_batches(result.run_dir)
    assert len(batches) == 2
    for b in batches:
        ignored = (b.fed.labels == IGNORE_INDEX).float().mean()
        assert 0.1 < ignored < 0.9, f"ignored-label fraction {ignored:.2f}: not an SFT batch"
    parts = hf_loss_parts(paths.TINY_DENSE, batches)
    return result.steps[0].loss, parts


def test_sft_batches_hold_prompt_and_padding_labels(backend_runs, sft_backend):
    """The real trainer's SFT batches equal the independent reference on both ranks, and hold
    ignored labels of both kinds: prompts on every rank, EOS padding at a row end."""
    batches = load_batches(sft_run(backend_runs, sft_backend).run_dir)
    found = [f"rank {rank}: {m}" for rank, b in enumerate(batches)
             for m in ref.compare(b, sft_reference(rank)[0])]
    assert not found, "the trainer's SFT batches differ from the reference:\n" + "\n".join(found)
    padded = [bool(((b.labels[:, -1] == IGNORE_INDEX) & (b.inputs[:, -1] == EOS_ID)).any())
              for b in batches]
    assert any(padded), "no row ends in ignored EOS padding"
    for b in batches:
        labels, positions = b.labels, b.positions
        assert (labels[:, 0] == IGNORE_INDEX).all(), "a row's first (prompt) label is not ignored"
        # every document (positions restart at 0) begins with ignored prompt labels
        starts = (positions == 0).nonzero(as_tuple=True)
        assert (labels[starts] == IGNORE_INDEX).all()
        assert (labels != IGNORE_INDEX).any(dim=1).all(), "a row without a trained label"


def test_step1_loss_normalised_over_valid_tokens(backend_runs, sft_backend):
    loss, parts = check(sft_run(backend_runs, sft_backend))
    assert math.isfinite(loss)
    diff = loss - parts.global_avg
    assert abs(diff) <= TOLERANCE, (
        f"step-1 loss {loss:.7f} vs independent {parts.global_avg:.7f} (sum CE {parts.ce_sum:.3f} "
        f"/ {parts.valid} valid of {parts.total}): diff {diff:+.2e} > {TOLERANCE}")
    # the band separates the right normalisation from the wrong ones
    for wrong in (parts.all_token_avg, parts.mean_of_rank_means):
        assert abs(loss - wrong) > 100 * TOLERANCE


def test_gradient_accumulation_normalises_over_the_steps_valid_tokens(backend_runs, sft_backend):
    """``ga=2``: two microbatches of one row per rank whose valid labels differ; the step's loss
    is still the sum of CE over every valid label of the step over their count. A mean per
    microbatch (torchtitan #1759: each microbatch over its own valid labels, then averaged)
    weighs the sparser microbatch's tokens more, and the band tells the two apart."""
    result = sft_run(backend_runs, sft_backend)
    loss, parts = check(result)
    per_microbatch = hf_loss_parts(paths.TINY_DENSE, microbatches_of(result))
    counts = [v for _, v, _ in per_microbatch.per_rank]
    assert len(counts) == 4 and len(set(counts)) > 1, (
        f"valid labels per microbatch {counts}: not spread unevenly, the check would see nothing")
    assert abs(loss - parts.global_avg) <= TOLERANCE, (
        f"ga=2 step-1 loss {loss:.7f} vs independent {parts.global_avg:.7f} ({parts.valid} valid "
        f"labels, per microbatch {counts}): diff {loss - parts.global_avg:+.2e} > {TOLERANCE}")
    assert abs(per_microbatch.mean_of_rank_means - parts.global_avg) > 100 * TOLERANCE


def test_a_per_microbatch_loss_mean_under_gradient_accumulation_is_caught(backend_runs, sft_backend):
    result = sft_run(backend_runs, sft_backend, plants=("ga_microbatch_mean",))
    loss, parts = check(result)
    assert abs(loss - parts.global_avg) > TOLERANCE, "a per-microbatch mean went unnoticed"
    # and it is exactly the planted one
    assert abs(loss - hf_loss_parts(paths.TINY_DENSE, microbatches_of(result)).mean_of_rank_means) <= TOLERANCE


@pytest.mark.slow
def test_check_fails_on_planted_all_token_normalisation(backend_runs, sft_backend):
    loss, parts = check(sft_run(backend_runs, sft_backend, plants=("all_token_norm",)))
    assert abs(loss - parts.global_avg) > TOLERANCE, "planted normalisation went unnoticed"
    assert abs(loss - parts.all_token_avg) <= TOLERANCE  # and it is exactly the planted one
