"""What the ranks leave for the diagnosis, under the run's dump folder, and how it is read.

- ``harness_batches/rank0_step1.pt``: rank 0's first batch (written by the data-path hooks,
  harness/data/rank_hooks.py, when a run has them);
- ``harness_initial/``: a random-init run's step-0 weights in HF safetensors, beside the
  model's config.json (``initial_weights_dir``).

A run without them is still diagnosable when it is pretrained (its weights are the HF
weights it loaded; its batch comes from torchtitan's dataloader, harness/diagnosis/subject.py).
"""

from __future__ import annotations

from pathlib import Path

INITIAL = "harness_initial"


def first_batch(run_dir: Path) -> dict | None:
    path = Path(run_dir) / "dump" / "harness_batches" / "rank0_step1.pt"
    if not path.is_file():
        return None
    import torch

    return torch.load(path, weights_only=True)


def initial_weights_dir(run_dir: Path) -> Path | None:
    folder = Path(run_dir) / "dump" / INITIAL
    ok = folder.is_dir() and (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))
    return folder if ok else None
