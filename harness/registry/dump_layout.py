"""The one home of a launched run's dump folder: every path under it, and every reader of what
the ranks leave there. The rank side (harness/rank/step0.py, harness/rank/hooks.py,
harness/upstream/metrics_sink.py) writes to the paths named here, and every reader (the launcher, the
checks, the expectations, the diagnosis, the tests) reads through the functions here (a dumped
batch's form is its type's: harness/references/batch.py ``Batch``); no other file spells a
folder or file name of the layout.

The launcher passes ``<run dir>/dump`` as torchtitan's ``--dump_folder`` (``dump_folder``):

    dump/
      checkpoint/step-<N>/                  torchtitan's checkpoints (DCP, or HF safetensors)
      harness_metrics/rank<R>.jsonl         every rank's step records (harness/upstream/metrics_sink.py)
      harness_batches/rank<R>_step<S>.pt    every rank's batch of step S, as the dataloader gave
                                            it and as the model and the loss got it (the dumped
                                            form of harness/references/batch.py ``Batch``); under
                                            gradient accumulation every microbatch's rows, in order
      harness_initial/native_rank0_<unit>.pt  a random-init run's step-0 weights under
                                            torchtitan's names, one file per unit (embedding,
                                            each layer, final norm, head)
      harness_initial/hf/                   those weights as an HF checkpoint
                                            (harness/diagnosis/rank_dump.py)
      harness_step0/shards_rank<R>.json     every rank's fingerprint of each local shard, as
                                            step 1 starts from it
      harness_state/rank<R>.json            per phase (built, loaded, trained): tying state
      harness_state/rank<R>_<phase>.pt      per phase: every ``expert_bias`` buffer's local values
      harness_state/rank<R>_balance.pt      MoE models: load balancing, per optimizer step
      harness_state/rank<R>_resumed.pt      a resumed run: every model and optimizer tensor the
                                            trainer holds once its checkpoint load returned
                                            (local shard, global offset and shape)
      harness_state/rank<R>_grads.pt        every parameter's step-1 gradient, before clipping
                                            (local shard, global offset and shape)

The writers take the dump folder (a rank knows it as ``trainer.config.dump_folder``); the
readers take the run dir. Standard library only: the ranks import it before torch.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

DUMP = "dump"
CHECKPOINTS = "checkpoint"
CHECKPOINT_STEP = "step-{step}"
METRICS = "harness_metrics"
# The key of the loss in a step record: torchtitan's metrics processor names it so, and the sink
# (harness/upstream/metrics_sink.py) writes the record as torchtitan hands it over.
LOSS_KEY = "loss_metrics/global_avg_loss"
METRICS_FILE = "rank{rank}.jsonl"
BATCHES = "harness_batches"
BATCH_FILE = "rank{rank}_step{step}.pt"
INITIAL = "harness_initial"
INITIAL_FILE = "native_rank0_{unit}.pt"
INITIAL_HF = "hf"
SHARDS = "harness_step0"
SHARD_FILE = "shards_rank{rank}.json"
STATE = "harness_state"
STATE_FILE = "rank{rank}.json"
EXPERT_BIAS_FILE = "rank{rank}_{phase}.pt"
BALANCE_FILE = "rank{rank}_balance.pt"
RESUMED_FILE = "rank{rank}_resumed.pt"
GRADS_FILE = "rank{rank}_grads.pt"

_RANK = re.compile(r"rank(\d+)")


# ------------------------------------------------------------------ paths (writers and readers)

def dump_folder(run_dir: str | Path) -> Path:
    """The run's ``--dump_folder``."""
    return Path(run_dir) / DUMP


def checkpoints(run_dir: str | Path) -> Path:
    return dump_folder(run_dir) / CHECKPOINTS


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    return checkpoints(run_dir) / CHECKPOINT_STEP.format(step=step)


def metrics_file(dump: str | Path, rank: int, folder: str = METRICS) -> Path:
    """A rank's step records (``folder``: the sink's, ``JsonlMetricsProcessor.Config.sink_folder``)."""
    return Path(dump) / folder / METRICS_FILE.format(rank=rank)


def batch_file(dump: str | Path, rank: int, step: int) -> Path:
    return Path(dump) / BATCHES / BATCH_FILE.format(rank=rank, step=step)


def initial_folder(dump: str | Path) -> Path:
    return Path(dump) / INITIAL


def initial_file(dump: str | Path, unit: str) -> Path:
    return initial_folder(dump) / INITIAL_FILE.format(unit=unit)


def initial_hf_dir(initial: str | Path) -> Path:
    """Where the step-0 weights of ``initial`` (``initial_weights_dir``) are written as HF."""
    return Path(initial) / INITIAL_HF


def shard_file(dump: str | Path, rank: int) -> Path:
    return Path(dump) / SHARDS / SHARD_FILE.format(rank=rank)


def state_file(dump: str | Path, rank: int) -> Path:
    return Path(dump) / STATE / STATE_FILE.format(rank=rank)


def expert_bias_file(dump: str | Path, rank: int, phase: str) -> Path:
    return Path(dump) / STATE / EXPERT_BIAS_FILE.format(rank=rank, phase=phase)


def balance_file(dump: str | Path, rank: int) -> Path:
    return Path(dump) / STATE / BALANCE_FILE.format(rank=rank)


def resumed_file(dump: str | Path, rank: int) -> Path:
    return Path(dump) / STATE / RESUMED_FILE.format(rank=rank)


def grads_file(dump: str | Path, rank: int) -> Path:
    return Path(dump) / STATE / GRADS_FILE.format(rank=rank)


# ------------------------------------------------------------------ readers

def rank_of(path: Path) -> int:
    """The rank a dump file belongs to (every per-rank name holds ``rank<R>``)."""
    return int(_RANK.search(Path(path).name).group(1))


def by_rank(folder: Path, pattern: str, **fields) -> dict[int, Path]:
    """rank -> its file of ``pattern`` (a ``*_FILE`` name) in ``folder``, in rank order."""
    files = Path(folder).glob(pattern.format(rank="*", **fields))
    return dict(sorted((rank_of(path), path) for path in files))


def metrics_files(run_dir: str | Path) -> dict[int, Path]:
    """rank -> its step records (the sink's default folder)."""
    return by_rank(dump_folder(run_dir) / METRICS, METRICS_FILE)


def loss_rank_metrics(run_dir: str | Path, last: bool = False) -> Path | None:
    """The step records of the lowest rank on this node (any rank logs the global loss), or of
    the highest (``last``: under pipeline parallelism only the last stage's ranks log it)."""
    files = list(metrics_files(run_dir).values())
    return (files[-1] if last else files[0]) if files else None


def hf_checkpoint_dirs(run_dir: str | Path) -> list[Path]:
    """Folders of HF safetensors written by ``checkpoint.last_save_in_hf``."""
    root = checkpoints(run_dir)
    return sorted({p.parent for p in root.glob("step-*/*.safetensors")}) if root.exists() else []


def saved_hf_tensors(run_dir: str | Path, step: int) -> dict:
    """Every tensor of the HF checkpoint the run saved at ``step``."""
    from safetensors.torch import load_file

    folder = checkpoint_dir(run_dir, step)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no safetensors (was the run saved with save_hf?)")
    out: dict = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


def batch_files(run_dir: str | Path, step: int = 1) -> dict[int, Path]:
    """rank -> its dumped batch of ``step`` (read as a Batch: harness/references/batch.py
    ``load_batches``)."""
    return by_rank(dump_folder(run_dir) / BATCHES, BATCH_FILE, step=step)


def initial_weights_dir(run_dir: str | Path) -> Path | None:
    """The folder of a random-init run's dumped step-0 weights (native names), if any."""
    folder = initial_folder(dump_folder(run_dir))
    return folder if folder.is_dir() and any(folder.glob(INITIAL_FILE.format(unit="*"))) else None


def initial_weight_files(initial: str | Path) -> list[Path]:
    """The files of the dumped step-0 weights in ``initial`` (``initial_weights_dir``)."""
    return sorted(Path(initial).glob(INITIAL_FILE.format(unit="*")))


def initial_native_state(initial: str | Path) -> dict:
    """The dumped step-0 state, every unit's file together (torchtitan's names)."""
    import torch

    native = {}
    for path in initial_weight_files(initial):
        native.update(torch.load(path, weights_only=True))
    return native


def read_fingerprints(run_dir: str | Path) -> dict[int, dict] | None:
    """rank -> its shard fingerprints (``None`` when the run left none)."""
    files = by_rank(dump_folder(run_dir) / SHARDS, SHARD_FILE)
    if not files:
        return None
    records = (json.loads(path.read_text()) for path in files.values())
    return {int(record["rank"]): record for record in records}


def rank_state_records(run_dir: str | Path) -> dict[int, dict]:
    """The ranks' state records: rank -> phase -> record."""
    files = by_rank(dump_folder(run_dir) / STATE, STATE_FILE)
    return {rank: json.loads(path.read_text()) for rank, path in files.items()}


def expert_bias_at(run_dir: str | Path, rank: int, phase: str) -> dict:
    """A rank's ``expert_bias`` buffers at ``phase`` (``part<i>.``-prefixed names)."""
    import torch

    return torch.load(expert_bias_file(dump_folder(run_dir), rank, phase))


def balance_records(run_dir: str | Path) -> dict[int, list[dict]]:
    """The ranks' load-balancing records: rank -> one record per optimizer step."""
    import torch

    files = by_rank(dump_folder(run_dir) / STATE, BALANCE_FILE)
    return {rank: torch.load(path) for rank, path in files.items()}


def resumed_state_records(run_dir: str | Path) -> dict[int, dict]:
    """The ranks' records of the state a resumed trainer holds after its load: rank -> key ->
    (local shard, global offset, global shape) or a plain value."""
    import torch

    files = by_rank(dump_folder(run_dir) / STATE, RESUMED_FILE)
    return {rank: torch.load(path, weights_only=False) for rank, path in files.items()}


def grad_records(run_dir: str | Path) -> dict[int, dict]:
    """The ranks' step-1 gradients: rank -> parameter -> (local shard, global offset, global shape)."""
    import torch

    files = by_rank(dump_folder(run_dir) / STATE, GRADS_FILE)
    return {rank: torch.load(path, weights_only=False) for rank, path in files.items()}
