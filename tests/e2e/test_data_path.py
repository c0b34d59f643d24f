"""The data path, checked against an independent reference.

Recorded losses and the parity references use torchtitan's own tokenizer call, packing,
positions and loss normalisation, so a dataloader defect would be invisible to them. Here the
fixture corpus is tokenised and packed with the ``tokenizers`` library from the documented
contract (harness/references/data.py) of the installed generation's packing
(``titan_api.TEXT_PACKING``: 0.3.0 shifts labels within each document, spring 2026 across the
packed row), and compared token for token, positions included, for
dp ranks 0 and 1 (dp 2, local batch 2, seq 256: the tiny runs' shape) with:
- the dataloader the backend config builds (``titan_native.tiny().dataloader``), in process;
- what torchtitan's real trainer (torchrun, 2 ranks) receives and feeds the model, dumped by a
  rank-side observer (harness/rank/observers.py, installed by the launcher in every rank):
  in the default tier the run template's own titan_native random-init run; in the slow tier
  the one-step instrumented run (harness/launch/instrumented.py) of the flex variant and with
  each plant.
Each check is shown failing on defects planted in torchtitan's data path: an off-by-one label
shift, a dropped EOS, positions not reset at a document boundary.
"""

from __future__ import annotations

import pytest
import torch

from harness.backends import BACKENDS, titan_native
from harness.backends.common import TINY
from harness.launch import instrumented
from harness.launch.run_matrix import RunCase
from harness.plants import planted
from harness.references import data as ref
from harness.references.batch import Batch, load_batches
from harness.registry import paths
from harness.upstream import titan_api

DP = 2
N_BATCHES = 3  # in process: the first three local batches of each rank
DATA_PLANTS = ("label_shift", "drop_eos", "positions_no_reset")


def reference(rank: int, n_batches: int = 1, packing: str = titan_api.TEXT_PACKING) -> list[Batch]:
    return ref.reference_batches(paths.CORPUS, paths.TINY_DENSE, seq_len=TINY.seq_len,
                                 local_batch_size=TINY.local_batch_size, dp_rank=rank,
                                 dp_world=DP, n_batches=n_batches, packing=packing)


def config_batches(rank: int, n_batches: int) -> list[Batch]:
    """The first batches of the dataloader the backend's config builds, as the trainer builds it."""
    config = titan_native.tiny()
    tokenizer = config.tokenizer.build(tokenizer_path=config.hf_assets_path)
    loader = config.dataloader.build(dp_world_size=DP, dp_rank=rank, tokenizer=tokenizer,
                                     seq_len=TINY.seq_len, local_batch_size=TINY.local_batch_size)
    # the loader's first n_batches
    return [Batch.from_loader(*item) for item, _ in zip(loader, range(n_batches), strict=False)]


def mismatches(got: list[Batch], want: list[Batch]) -> list[str]:
    return [f"batch {i}: {m}" for i, (g, w) in enumerate(zip(got, want, strict=True))
            for m in ref.compare(g, w)]


@pytest.mark.parametrize("packing", ref.PACKINGS)
def test_reference_contract_sanity(packing):
    """The reference itself, for each generation's packing: documents end in EOS, positions
    restart at 0 at every document start, no BOS (the fixture tokenizer has none); within a
    document label t is input t+1. "within_document": the label of a document's last input is
    its EOS (the next input starts a new document at 0); "across_row": the EOS is an input whose
    label is the next document's first token, and label t is input t+1 across the whole row."""
    batch = reference(0, packing=packing)[0]
    tok = ref.TokenizerRef(paths.TINY_DENSE)
    assert tok.bos_id is None and tok.eos_id == 0
    same_doc = batch.positions[:, 1:] != 0
    assert torch.equal(batch.labels[:, :-1][same_doc], batch.inputs[:, 1:][same_doc])
    if packing == "within_document":
        eos = batch.labels == tok.eos_id
        assert eos.any(), "the first batch holds no document end"
        rows, cols = eos[:, :-1].nonzero(as_tuple=True)
        assert (batch.positions[rows, cols + 1] == 0).all()
        assert not (batch.inputs == tok.eos_id).any(), "an EOS fed as an input"
    else:
        eos = batch.inputs == tok.eos_id
        assert eos.any(), "the first batch holds no document end"
        rows, cols = eos[:, :-1].nonzero(as_tuple=True)
        assert (batch.positions[rows, cols + 1] == 0).all()
        assert torch.equal(batch.labels[:, :-1], batch.inputs[:, 1:])


def test_the_two_packings_differ_where_the_generations_do():
    """The reference's two contracts are not the same contract: a wrong generation's reference
    fails the comparison (so the generation's choice in titan_api is itself checked)."""
    within, across = (reference(0, packing=p)[0] for p in ref.PACKINGS)
    assert ref.compare(within, across), "the two packings gave identical batches"


@pytest.mark.parametrize("rank", range(DP))
def test_config_dataloader_matches_reference(rank):
    found = mismatches(config_batches(rank, N_BATCHES), reference(rank, N_BATCHES))
    assert not found, "\n".join(found)


@pytest.mark.parametrize("plant", DATA_PLANTS)
def test_config_dataloader_check_catches_planted_defect(plant):
    with planted(plant):
        found = [m for rank in range(DP)
                 for m in mismatches(config_batches(rank, 1), reference(rank, 1))]
    assert found, f"planted {plant} went unnoticed"


@pytest.fixture(scope="module")
def instrumented_native():
    with instrumented.instrumented_backend("titan_native") as name:
        yield name


def trainer_run(backend_runs, name, attention=None, plants=()):
    result = backend_runs.get(instrumented.native_feed_spec(name, plants=plants,
                                                            attention=attention))
    assert result.ok, result.describe()
    return result


def trainer_batches(result) -> list[Batch]:
    return load_batches(result.run_dir)


def check_trainer_feed(result, attention: str) -> list[str]:
    """Raw batches vs the reference; what the model is fed vs what the variant promises."""
    found = []
    mask = BACKENDS["titan_native"].mask(attention)
    for rank, dump in enumerate(trainer_batches(result)):
        want = reference(rank)[0]
        found += [f"rank {rank} dataloader: {m}" for m in ref.compare(dump, want)]
        if not torch.equal(dump.fed.inputs, want.inputs):
            found.append(f"rank {rank}: the model is fed other tokens than the reference's")
        if not torch.equal(dump.fed.labels, want.labels):
            found.append(f"rank {rank}: the loss gets other labels than the reference's")
        expected_positions = (torch.arange(TINY.seq_len).expand_as(want.inputs)
                              if mask == "row_causal" else want.positions)
        if not torch.equal(dump.fed.positions, expected_positions):
            found.append(f"rank {rank}: model positions are not the {mask} variant's")
    return found


def test_trainer_feeds_reference_batches(device_runs, steps, workarounds):
    """torchtitan's real trainer, default (sdpa, row-causal) variant, in the run template's
    titan_native random-init run (one launch serves its checks and these): the dataloader's
    batches equal the reference on both ranks; the model gets them with row positions 0..255."""
    case = RunCase("cpu", "titan_native", "tiny", "random", BACKENDS["titan_native"].default_attention)
    result = device_runs("cpu").get(case.suite_spec(steps, workarounds=workarounds))
    assert result.ok, result.describe()
    found = check_trainer_feed(result, BACKENDS["titan_native"].default_attention)
    assert not found, "\n".join(found)


@pytest.mark.slow
def test_trainer_feeds_reference_batches_flex(backend_runs, instrumented_native):
    """The per-document variant: the model gets the per-document positions."""
    result = trainer_run(backend_runs, instrumented_native, attention="flex")
    found = check_trainer_feed(result, "flex")
    assert not found, "\n".join(found)


@pytest.mark.slow
@pytest.mark.parametrize("plant", DATA_PLANTS)
def test_trainer_check_catches_planted_defect(backend_runs, instrumented_native, plant):
    result = trainer_run(backend_runs, instrumented_native, attention="flex", plants=(plant,))
    assert check_trainer_feed(result, "flex"), f"planted {plant} went unnoticed"
