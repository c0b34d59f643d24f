"""What every backend's trainer config shares: data, optimizer, metrics sink, run shape.

The config functions built from it are pure, as torchtitan's are: they build and return a
``Trainer.Config``, nothing else (what the ranks record about a run is installed by the
launcher in every rank, harness/rank/observers.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.components.loss import CrossEntropyLoss
from torchtitan.components.optimizer import default_adamw
from torchtitan.config import DebugConfig, ParallelismConfig, TrainingConfig

from harness.registry import environment, paths
from harness.registry.hf_config import read_config_json
from harness.upstream.metrics_sink import JsonlMetricsProcessor
from harness.upstream.titan_api import HuggingFaceTextDataLoader, LRSchedulersContainer


@dataclass(frozen=True)
class RunShape:
    seq_len: int
    local_batch_size: int
    steps: int
    lr: float
    warmup_steps: int
    param_dtype: str  # FSDP mixed_precision_param


# Seconds per step on 2 CPU cores; float32 end to end so cross-backend parity is fp32-tight.
TINY = RunShape(seq_len=256, local_batch_size=2, steps=10, lr=8e-4, warmup_steps=2,
                param_dtype="float32")
# The source's runs: local batch 1 on each of 64 NeuronCores, 10 steps, bf16 params.
FULL = RunShape(seq_len=2048, local_batch_size=1, steps=10, lr=8e-4, warmup_steps=2,
                param_dtype="bfloat16")

SEED = 42

def full_assets(default: str) -> str:
    """The run's assets dir, exported by the launcher (a config function runs before torchtitan
    applies the command line, and the model's shape is the assets': Qwen3-4B on trn2, the tiny
    twin on CPU, harness/registry/assets_twin.py)."""
    return os.environ.get(environment.FULL_ASSETS) or default


def assets_config(assets: str) -> dict | None:
    """The assets dir's config.json, or None where there is none (meta-device config tests)."""
    return read_config_json(assets) if (Path(assets) / "config.json").is_file() else None


def shared_fields(shape: RunShape, hf_assets_path: str) -> dict:
    """Keyword arguments for ``Trainer.Config`` (or a subclass) common to all backends.

    Checkpointing is off here; the launcher turns on HF loading/saving per run
    (``--checkpoint.enable --checkpoint.initial_load_in_hf ...``), so one config serves both
    random-init and pretrained runs.
    """
    return dict(
        hf_assets_path=hf_assets_path,
        loss=CrossEntropyLoss.Config(),
        metrics=JsonlMetricsProcessor.Config(log_freq=1, disable_color_printing=True),
        dataloader=HuggingFaceTextDataLoader.Config(
            dataset="c4_test", dataset_path=str(paths.CORPUS)
        ),
        optimizer=default_adamw(lr=shape.lr),
        lr_scheduler=LRSchedulersContainer.Config(warmup_steps=shape.warmup_steps),
        training=TrainingConfig(
            local_batch_size=shape.local_batch_size,
            seq_len=shape.seq_len,
            steps=shape.steps,
            mixed_precision_param=shape.param_dtype,
        ),
        parallelism=ParallelismConfig(),
        checkpoint=CheckpointManager.Config(enable=False, interval=10_000),
        debug=DebugConfig(seed=SEED, deterministic=True),
    )
