"""The committed fixtures are what scripts/make_fixtures.py makes, byte for byte."""

import subprocess
import sys

import pytest

from harness.registry import paths

SCRIPT = paths.REPO_ROOT / "scripts" / "make_fixtures.py"


def _check(only: str | None) -> subprocess.CompletedProcess:
    command = [sys.executable, str(SCRIPT), "--check"] + (["--only", only] if only else [])
    return subprocess.run(command, capture_output=True, text=True, timeout=3600)


def test_corpus_and_tokenizer_regenerate_bit_identically():
    done = _check("corpus,tokenizer")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


@pytest.mark.slow
def test_pretrained_checkpoints_regenerate_bit_identically():
    done = _check(None)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_committed_fixtures_stay_small():
    size = sum(p.stat().st_size for p in paths.FIXTURES.rglob("*") if p.is_file())
    assert size < 20 * 1024**2, f"fixtures/ holds {size / 1024**2:.1f} MiB (limit 20 MiB)"


def test_the_loss_contract_in_float32_recomputes_the_recorded_losses_bit_for_bit():
    """A cheap form of the regeneration above for torchtitan's loss contract (harness/references/
    loss.py): the HF forward of tiny_dense on the first dp=2 batches of torchtitan's
    dataloader, in the trainer's float32 arithmetic, is this generation's recorded step-1 loss
    for every masking, to the bit (the contract's float64 accumulation, the expectations', moves
    the recorded files: ``make_fixtures.py --check --only recorded`` fails with it)."""
    import json

    import torch

    from harness.upstream import titan_api
    from harness.parity.models import load_batches
    from harness.checks.reference_forward import MASKINGS, first_step_loss, hf_model

    recorded = json.loads((paths.TINY_DENSE / "recorded_losses.json").read_text())
    recorded = recorded[titan_api.api_generation_of(titan_api.generation())]
    model = hf_model(paths.TINY_DENSE)
    batches = [(b.inputs, b.positions, b.labels) for b in load_batches(paths.TINY_DENSE, 1, dp=2)[0]]
    losses = {mask: first_step_loss(model, batches, mask, dtype=torch.float32) for mask in MASKINGS}
    assert losses == {mask: recorded[mask]["dp2_lbs2_seq256"] for mask in MASKINGS}
