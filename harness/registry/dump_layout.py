"""The one home of a launched run's folder: every path in it, beside it and in the run cache that
holds it, and every reader of what the launcher and the ranks leave there. The launcher
(harness/launch/run.py), the run cache (harness/launch/run_cache.py, harness/launch/prefetch.py),
the rank side (harness/rank/step0.py, harness/rank/hooks.py, harness/upstream/metrics_sink.py)
and the checks' verdicts (harness/checks/run_checks.py) write to the paths named here, and every
reader (the launcher, the results, the checks, the expectations, the diagnosis, the tests) reads
through the functions here (a dumped batch's form is its type's: harness/references/batch.py
``Batch``); no other file spells a folder or file name of the layout. The names
are the ones CI keeps as artifacts (.github/workflows: ``launcher.log``, ``command.txt``,
``torchrun/``), so they do not change.

A run's folder sits in a test session's run cache (``<session root>/<kind>_runs/<name>-<key>``:
``runs_folder``, ``cache_run_dir``) or in a main job's report (``<report>/runs/<name>``:
``report_run_dir``). A run cache's folder holds one folder per run and, beside each, what the
cache keeps of it:

    <kind>_runs/
      launches.jsonl                        the ledger: one line per launch (``ledger``)
      prefetch.claim, prefetch.specs.pickle, prefetch.log
                                            the session's prefetcher: who started it, the specs
                                            it launches, its output (``prefetch_claim``, ...;
                                            the claim's lock: prefetch.claim.lock)
      <run>/                                a run's folder, <name>-<key> (``cache_run_dir``), below
      <run>.lock                            held while the run launches (``lock_file``)
      <run>.result.pickle                   its RunResult, for every process (``stored_result``)
      <run>.read                            a test has read it (``read_mark``)
      <run>.whole/step-<N>/                 its step-N checkpoint written again whole, for a
                                            resharded resume (``whole_copy_dir``)

A run's folder:

    <run>/
      command.txt                           the torchrun command, a line per node (``command_file``)
      launcher.log                          torchrun's stdout and stderr; one per node of a run
                                            of several: launcher.node<i>.log (``launcher_log``)
      torchrun/<run id>/attempt_<k>/<local rank>/{stderr,stdout}.log
                                            every rank's log (torchrun's ``--log-dir``,
                                            ``torchrun_log_dir``); a run of several nodes:
                                            torchrun/node<i>/<run id>/... (``find_rank_logs``)
      verdicts/<check>.json                 each check's verdict as its test recorded it
                                            (``verdict_file``)
      dump/                                 torchtitan's ``--dump_folder`` (``dump_folder``), below

The launcher passes ``<run dir>/dump`` as torchtitan's ``--dump_folder``:

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

The dump's writers take the dump folder (a rank knows it as ``trainer.config.dump_folder``);
the readers take the run dir. Standard library only: the ranks import it before torch.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

# A run cache's folder and what it keeps beside each run's folder; a report's folder of runs.
RUNS_FOLDER = "{kind}_runs"
CACHE_RUN = "{name}-{key}"
REPORT_RUNS = "runs"
LEDGER = "launches.jsonl"
PREFETCH_CLAIM = "prefetch.claim"
PREFETCH_SPECS = "prefetch.specs.pickle"
PREFETCH_LOG = "prefetch.log"
LOCK = ".lock"
STORED_RESULT = ".result.pickle"
READ_MARK = ".read"
WHOLE_COPY = ".whole"

# A run's folder.
COMMAND = "command.txt"
LAUNCHER_LOG = "launcher.log"
NODE_LAUNCHER_LOG = "launcher.node{node}.log"
TORCHRUN_LOGS = "torchrun"
NODE_LOGS = "node{node}"
RANK_LOG_FILES = ("stderr.log", "stdout.log")  # torchtitan logs to stderr, prints to stdout
VERDICTS = "verdicts"
VERDICT_FILE = "{check}.json"
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


# ------------------------------------------------------------------ the run cache's folder

def runs_folder(session_root: str | Path, kind: str) -> Path:
    """The run cache of device ``kind``'s runs under a session's temporary root."""
    return Path(session_root) / RUNS_FOLDER.format(kind=kind)


def cache_run_dir(folder: str | Path, name: str, key: str) -> Path:
    """The folder of run ``name`` in a run cache's ``folder``; ``key``: the cache's digest of
    its spec (one spec, one folder, in every process)."""
    return Path(folder) / re.sub(r"[^A-Za-z0-9_.-]", "_", CACHE_RUN.format(name=name, key=key))


def report_run_dir(report: str | Path, name: str) -> Path:
    """The folder of run ``name`` in a main job's report folder (``python -m harness run``)."""
    return Path(report) / REPORT_RUNS / name.replace(":", "__").replace("/", "_")


def ledger(folder: str | Path) -> Path:
    return Path(folder) / LEDGER


def ledgers(session_root: str | Path) -> list[Path]:
    """The ledgers of every run cache of a session: the shared ones (``<root>/<kind>_runs``)
    and those a pytest-xdist worker kept to itself (``<root>/popen-gwN/<kind>_runs``)."""
    root = Path(session_root)
    return [*root.glob(f"*/{LEDGER}"), *root.glob(f"popen-gw*/*/{LEDGER}")]


def prefetch_claim(folder: str | Path) -> Path:
    return Path(folder) / PREFETCH_CLAIM


def prefetch_specs(folder: str | Path) -> Path:
    return Path(folder) / PREFETCH_SPECS


def prefetch_log(folder: str | Path) -> Path:
    return Path(folder) / PREFETCH_LOG


def _beside(run_dir: str | Path, suffix: str) -> Path:
    run_dir = Path(run_dir)
    return run_dir.with_name(run_dir.name + suffix)


def lock_file(path: str | Path) -> Path:
    """The file lock beside ``path``: a run's folder is locked while it launches, the
    prefetcher's claim while it is claimed."""
    return _beside(path, LOCK)


def stored_result(run_dir: str | Path) -> Path:
    return _beside(run_dir, STORED_RESULT)


def read_mark(run_dir: str | Path) -> Path:
    return _beside(run_dir, READ_MARK)


def whole_copy_dir(run_dir: str | Path, step: int) -> Path:
    """Where the run's step-``step`` checkpoint is written again whole, beside the run's folder."""
    return _beside(run_dir, WHOLE_COPY) / CHECKPOINT_STEP.format(step=step)


def cache_files(session_root: str | Path, run: str, suffix: str) -> list[Path]:
    """The file ``<run><suffix>`` (``STORED_RESULT``, ``READ_MARK``) beside run folder ``run``
    in any shared run cache of a session."""
    return list(Path(session_root).glob(f"{RUNS_FOLDER.format(kind='*')}/{run}{suffix}"))


# ------------------------------------------------------------------ the run's folder

def command_file(run_dir: str | Path) -> Path:
    return Path(run_dir) / COMMAND


def launcher_log(run_dir: str | Path, node: int = 0, nodes: int = 1) -> Path:
    """The output of the launcher of ``node`` (of ``nodes``) of the run."""
    name = LAUNCHER_LOG if nodes == 1 else NODE_LAUNCHER_LOG.format(node=node)
    return Path(run_dir) / name


def launcher_logs(run_dir: str | Path) -> list[Path]:
    """The launcher logs the run left (one per node), else where a run of one node's goes."""
    run_dir = Path(run_dir)
    found = {*run_dir.glob(LAUNCHER_LOG), *run_dir.glob(NODE_LAUNCHER_LOG.format(node="*"))}
    return sorted(found) or [launcher_log(run_dir)]


def torchrun_log_dir(run_dir: str | Path, node: int | None = None) -> Path:
    """torchrun's ``--log-dir`` for the run, or for ``node`` of a run of several nodes."""
    root = Path(run_dir) / TORCHRUN_LOGS
    return root if node is None else root / NODE_LOGS.format(node=node)


def find_rank_logs(run_dir: str | Path, ranks_per_node: int | None = None) -> dict[int, list[Path]]:
    """torchrun writes <log-dir>/<run id>/attempt_<k>/<local rank>/{stderr,stdout}.log.

    Keeps the last attempt's files of each rank (torchtitan logs to stderr, prints to stdout),
    under its global rank: node i's local rank r (``torchrun_log_dir(run_dir, i)``) is global
    rank i * ``ranks_per_node`` + r (by default the most local ranks any node has).
    """
    root = torchrun_log_dir(run_dir)
    prefix = NODE_LOGS.format(node="")
    nodes = {int(d.name[len(prefix):]): _local_rank_logs(d) for d in root.glob(f"{prefix}*/")
             if d.name[len(prefix):].isdigit()}
    if not nodes:
        return _local_rank_logs(root)
    per_node = ranks_per_node or max((max(local) + 1 for local in nodes.values() if local), default=0)
    return {node * per_node + local: files for node, ranks in sorted(nodes.items())
            for local, files in ranks.items()}


def _local_rank_logs(log_dir: Path) -> dict[int, list[Path]]:
    logs: dict[int, list[Path]] = {}
    for rank_dir in sorted(log_dir.glob("*/attempt_*/*/")):
        if rank_dir.name.isdigit():
            logs[int(rank_dir.name)] = [rank_dir / name for name in RANK_LOG_FILES]
    return logs


def verdicts_folder(run_dir: str | Path) -> Path:
    return Path(run_dir) / VERDICTS


def verdict_file(run_dir: str | Path, check: str) -> Path:
    return verdicts_folder(run_dir) / VERDICT_FILE.format(check=check)


def verdict_files(run_dir: str | Path) -> dict[str, Path]:
    """check -> the file of its recorded verdict, in check order."""
    files = verdicts_folder(run_dir).glob(VERDICT_FILE.format(check="*"))
    return {path.name[:-len(VERDICT_FILE.format(check=""))]: path for path in sorted(files)}


# ------------------------------------------------------------------ the dump (writers and readers)

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
    from safetensors.torch import load_file  # noqa: PLC0415  heavy: torch; the registry imports nothing heavy

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
    import torch  # noqa: PLC0415  heavy: torch; the registry imports nothing heavy

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
    import torch  # noqa: PLC0415  heavy: torch; the registry imports nothing heavy

    return torch.load(expert_bias_file(dump_folder(run_dir), rank, phase))


def balance_records(run_dir: str | Path) -> dict[int, list[dict]]:
    """The ranks' load-balancing records: rank -> one record per optimizer step."""
    import torch  # noqa: PLC0415  heavy: torch; the registry imports nothing heavy

    files = by_rank(dump_folder(run_dir) / STATE, BALANCE_FILE)
    return {rank: torch.load(path) for rank, path in files.items()}


def resumed_state_records(run_dir: str | Path) -> dict[int, dict]:
    """The ranks' records of the state a resumed trainer holds after its load: rank -> key ->
    (local shard, global offset, global shape) or a plain value."""
    import torch  # noqa: PLC0415  heavy: torch; the registry imports nothing heavy

    files = by_rank(dump_folder(run_dir) / STATE, RESUMED_FILE)
    return {rank: torch.load(path, weights_only=False) for rank, path in files.items()}


def grad_records(run_dir: str | Path) -> dict[int, dict]:
    """The ranks' step-1 gradients: rank -> parameter -> (local shard, global offset, global shape)."""
    import torch  # noqa: PLC0415  heavy: torch; the registry imports nothing heavy

    files = by_rank(dump_folder(run_dir) / STATE, GRADS_FILE)
    return {rank: torch.load(path, weights_only=False) for rank, path in files.items()}
