"""What the ranks leave for the diagnosis, under the run's dump folder, and how it is read.

- ``harness_batches/rank0_step1.pt``: rank 0's first batch as the trainer received it
  (``harness_initial/batch_rank0.pt`` where an earlier harness version wrote it);
- ``harness_initial/native_rank0_<unit>.pt``: a random-init run's step-0 weights under
  torchtitan's names, one file per unit (embedding, each layer, final norm, head), written by
  rank 0 after every rank gathered its shards, so memory stays that of one layer; models over
  ``MAX_PARAMS`` are not dumped. ``hf_weights_from_dump`` turns them into HF safetensors
  (harness/conformance/native_to_hf.py, not the adapter under test).

The ranks write them through the one step-0 hook, harness/rank_step0.py (installed by every
registered config function and by the boot ``sitecustomize``; it observes only).

A run without them is still diagnosable when it is pretrained (its weights are the HF
weights it loaded; its batch comes from torchtitan's dataloader, harness/diagnosis/subject.py).
"""

from __future__ import annotations

from pathlib import Path

INITIAL = "harness_initial"


def first_batch(run_dir: Path) -> dict | None:
    """Rank 0's first batch (input, positions, labels) as the trainer received it."""
    import torch

    for path in (Path(run_dir) / "dump" / INITIAL / BATCH,
                 Path(run_dir) / "dump" / "harness_batches" / "rank0_step1.pt"):
        if path.is_file():
            return torch.load(path, weights_only=True)
    return None


def initial_weights_dir(run_dir: Path) -> Path | None:
    """The folder of a random-init run's dumped step-0 weights (native names), if any."""
    folder = Path(run_dir) / "dump" / INITIAL
    return folder if folder.is_dir() and any(folder.glob(NATIVE.format(unit="*"))) else None


def initial_native_state(folder: Path) -> dict:
    """The dumped step-0 state, every unit's file together (torchtitan's names)."""
    import torch

    native = {}
    for path in sorted(Path(folder).glob(NATIVE.format(unit="*"))):
        native.update(torch.load(path, weights_only=True))
    return native


def hf_weights_from_dump(folder: Path, model_dir: Path) -> Path:
    """The dumped native state as an HF checkpoint folder (the harness's own conversion,
    harness/conformance/native_to_hf.py, not the adapter under test; the model's config.json
    beside it), written once into ``folder/hf``."""
    import shutil

    from safetensors.torch import save_file

    from harness.conformance.native_to_hf import hf_state_from_native

    import os

    out = Path(folder) / "hf"
    if (out / "model.safetensors").is_file():
        return out
    hf = {k: v.contiguous() for k, v in
          hf_state_from_native(initial_native_state(folder), model_dir).items()}
    out.mkdir(exist_ok=True)
    shutil.copy(Path(model_dir) / "config.json", out / "config.json")
    partial = out / f"model.safetensors.{os.getpid()}.partial"  # readers in other processes
    save_file(hf, str(partial))
    os.replace(partial, out / "model.safetensors")
    return out


# The rank side (what writes these files) is harness/rank_step0.py.
from harness.rank_step0 import MAX_PARAMS, NATIVE  # noqa: E402,F401

BATCH = "batch_rank0.pt"  # written by earlier harness versions; read if present
