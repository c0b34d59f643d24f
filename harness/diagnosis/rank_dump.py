"""The step-0 weights a random-init run's ranks dumped (harness/rank/step0.py, under
torchtitan's names; found and read by harness/registry/dump_layout.py ``initial_weights_dir``,
``initial_native_state``), as an HF checkpoint: the harness's own conversion
(harness/parity/conformance/native_to_hf.py), not the adapter under test.

A run without them is still diagnosable when it is pretrained (its weights are the HF
weights it loaded; its batch comes from torchtitan's dataloader, harness/diagnosis/subject.py).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from safetensors.torch import save_file

from harness.parity.conformance.native_to_hf import hf_state_from_native
from harness.registry import dump_layout


def hf_weights_from_dump(folder: Path, model_dir: Path) -> Path:
    """The dumped native state in ``folder`` (``dump_layout.initial_weights_dir``) as an HF
    checkpoint folder (the model's config.json beside it), written once into
    ``dump_layout.initial_hf_dir(folder)``."""
    out = dump_layout.initial_hf_dir(folder)
    if (out / "model.safetensors").is_file():
        return out
    hf = {k: v.contiguous() for k, v in
          hf_state_from_native(dump_layout.initial_native_state(folder), model_dir).items()}
    out.mkdir(exist_ok=True)
    shutil.copy(Path(model_dir) / "config.json", out / "config.json")
    partial = out / f"model.safetensors.{os.getpid()}.partial"  # readers in other processes
    save_file(hf, str(partial))
    os.replace(partial, out / "model.safetensors")
    return out
