"""Typed results of one backend run: per-step records read from the harness's JSONL sink."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.registry import dump_layout
from harness.registry.dump_layout import LOSS_KEY

GIB = 1024**3


@dataclass(frozen=True)
class StepRecord:
    step: int
    loss: float
    grad_norm: float
    tokens_per_s: float
    step_time_s: float
    peak_memory_gib: float
    lr: float | None = None

    @classmethod
    def from_metrics(cls, metrics: dict) -> "StepRecord":
        return cls(
            step=int(metrics["step"]),
            loss=float(metrics[LOSS_KEY]),
            grad_norm=float(metrics["grad_norm"]),
            tokens_per_s=float(metrics["throughput(tps)"]),
            step_time_s=float(metrics["time_metrics/end_to_end(s)"]),
            peak_memory_gib=float(metrics["memory/max_reserved(GiB)"]),
            lr=next((float(v) for k, v in metrics.items() if k.startswith("lr")), None),
        )


def read_step_records(jsonl: Path) -> list[StepRecord]:
    if not jsonl.is_file():
        return []
    text = jsonl.read_text()
    lines = [line for line in text.splitlines() if line.strip()]
    if lines and not text.endswith("\n"):
        lines.pop()  # a record still being written
    return [StepRecord.from_metrics(json.loads(line)) for line in lines]


# Exceptions whose message names no cause: torch.distributed.checkpoint's
# "CheckpointException ranks:dict_keys([1])", followed in the log by each failing rank's own
# traceback.
CAUSE_WRAPPERS = ("CheckpointException",)


@dataclass
class RunResult:
    """What one launch produced. ``ok`` is the process outcome; checks live in tests."""

    name: str
    backend: str
    size: str
    init: str
    device: str
    nproc: int  # every node's ranks
    command: list[str]
    returncode: int | None
    timed_out: bool
    duration_s: float
    run_dir: Path
    steps: list[StepRecord] = field(default_factory=list)
    rank_logs: dict[int, list[Path]] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    attention: str = ""
    model: str | None = None  # the expectations' model key
    mask: str = ""  # how attention treats packed rows (the recorded loss that applies)
    workarounds: tuple[str, ...] = ()
    layout: str = "fsdp"  # harness/registry/layouts.py
    assets_dir: str | None = None  # the HF assets dir of a full-size run
    # The folders the run read (harness/launch/run.py ``run_inputs``, subjects included): the
    # config.json its model was built from, and its HF weights (None: random init). Every
    # later stage reads these; none resolves them again.
    model_dir: str | None = None
    weights_dir: str | None = None
    # The device's compile cache around the run (``CompileCache``), where it has one.
    compile_cache: dict | None = None
    nodes: int = 1  # the torchrun agents the ranks were spread over (RunSpec.nodes)
    # How its ranks started: {"warm": forked from a zygote, "cold": plain torchrun workers}
    # (harness/rank/warm_start.py), counted from their stderr.
    started: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def _option(self, name: str) -> str | None:
        command = list(self.command)
        return command[command.index(name) + 1] if name in command[:-1] else None

    @property
    def planned_steps(self) -> int | None:
        """The last step the run's own command asked for (``--training.steps``)."""
        value = self._option("--training.steps")
        return int(value) if value is not None else None

    @property
    def first_planned_step(self) -> int:
        """1, or K + 1 for a run resumed from a full step-K checkpoint
        (``--checkpoint.no-initial-load-model-only`` with ``initial_load_path`` .../step-K)."""
        path = self._option("--checkpoint.initial_load_path")
        if path is None or "--checkpoint.no-initial-load-model-only" not in self.command:
            return 1
        name = Path(path).name
        return int(name[len("step-"):]) + 1 if name.startswith("step-") and name[5:].isdigit() else 1

    @property
    def losses(self) -> list[float]:
        return [s.loss for s in self.steps]

    @property
    def first_nonfinite_step(self) -> int | None:
        return next((s.step for s in self.steps if not math.isfinite(s.loss)), None)

    @property
    def hf_checkpoint_dirs(self) -> list[Path]:
        """Folders of HF safetensors written by ``checkpoint.last_save_in_hf``."""
        return dump_layout.hf_checkpoint_dirs(self.run_dir)

    def where(self) -> dict[str, str]:
        """Where the run happened, in the known-issues registry's terms."""
        return {"backend": self.backend, "size": self.size, "init": self.init, "device": self.device,
                "attention": self.attention, "layout": self.layout, "generation": self.versions.get("torchtitan-generation", ""),
                "ranks": str(self.nproc), "collectives": self.versions.get("collectives", "")}

    def first_error(self) -> str | None:
        """The first exception line any rank logged ("SomeError: message"), if any; for a
        wrapper that names no cause (``CAUSE_WRAPPERS``), the first exception after it in that
        log, the cause it wraps, where there is one."""
        import re

        pattern = re.compile(r"^(?:\[rank\d+\]:?\s*)?([A-Za-z_.]*(?:Error|Exception)): (.+)$")
        for _, files in sorted(self.rank_logs.items()):
            for path in files:
                if not path.exists():
                    continue
                found = [f"{m.group(1).rsplit('.', 1)[-1]}: {m.group(2).strip()}"
                         for m in map(pattern.match, (line.strip() for line in
                                                      path.read_text(errors="replace").splitlines()))
                         if m]
                if found:
                    wrapped = found[0].split(":", 1)[0] in CAUSE_WRAPPERS
                    return found[1] if wrapped and len(found) > 1 else found[0]
        return None

    def log_tails(self, lines: int = 30) -> str:
        out = []
        for rank, files in sorted(self.rank_logs.items()):
            for path in files:
                text = path.read_text(errors="replace").splitlines() if path.exists() else []
                if text:
                    out.append(f"--- rank {rank}: last {min(lines, len(text))} lines of {path} ---")
                    out.extend(text[-lines:])
        if not self.rank_logs:  # the launcher's log, or each node's
            for launcher in dump_layout.launcher_logs(self.run_dir):
                text = launcher.read_text(errors="replace").splitlines() if launcher.exists() else []
                out.append(f"--- no rank logs; last lines of {launcher} ---")
                out.extend(text[-lines:])
        return "\n".join(out)

    def describe(self) -> str:
        state = "timed out" if self.timed_out else f"exit code {self.returncode}"
        return (
            f"{self.name}: {self.backend}/{self.size}/{self.init} ({self.attention} attention, "
            f"workarounds: {', '.join(self.workarounds) or 'none'}) on {self.device} x{self.nproc}"
            f"{f' ({self.nodes} nodes)' if self.nodes > 1 else ''}, "
            f"{state}, {len(self.steps)} step(s) in {self.duration_s:.1f}s\n"
            f"command: {' '.join(self.command)}\nrun dir: {self.run_dir}"
        )

    def to_json(self) -> dict:
        data = asdict(self)
        data["run_dir"] = str(self.run_dir)
        data["rank_logs"] = {r: [str(p) for p in ps] for r, ps in self.rank_logs.items()}
        return data


class RunFailed(AssertionError):
    """A launch that did not finish cleanly; the message carries every rank's last lines."""

    def __init__(self, result: RunResult, why: str) -> None:
        self.result = result
        super().__init__(f"{why}\n{result.describe()}\n{result.log_tails()}")
