"""Typed results of one backend run: per-step records read from the harness's JSONL sink."""

from __future__ import annotations

import json
import math
import re
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
    def from_metrics(cls, metrics: dict) -> StepRecord:
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
    """What one launch produced: the spec it ran (harness/launch/run.py ``RunSpec``: what was
    asked, and through its methods the folders it read) and what came of it. ``ok`` is the
    process outcome; checks live in tests."""

    spec: RunSpec  # noqa: F821  harness/launch/run.py's, a stage above this one: read, not imported
    device: str
    nproc: int  # every node's ranks
    # The layout whose degrees the ranks ran (harness/registry/layouts.py): the spec's, or on the
    # assets twin its twin (``Layout.twin``); and those degrees, as torchtitan names them
    # (``data_parallel_shard_degree``, ``tensor_parallel_degree``, ...: ``DEGREES``).
    layout: str
    degrees: dict[str, int]
    command: list[str]
    returncode: int | None
    timed_out: bool
    duration_s: float
    run_dir: Path
    steps: list[StepRecord] = field(default_factory=list)
    rank_logs: dict[int, list[Path]] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    # The device's compile cache around the run (``CompileCache``), where it has one.
    compile_cache: dict | None = None
    # How its ranks started: {"warm": forked from a zygote, "cold": plain torchrun workers}
    # (harness/rank/warm_start.py), counted from their stderr.
    started: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

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
        """Where the run happened, in the known-issues registry's terms (the layout: the one
        whose degrees it ran)."""
        spec = self.spec
        return {"backend": spec.backend, "size": spec.size, "init": spec.init, "device": self.device,
                "attention": spec.attention, "layout": self.layout,
                "generation": self.versions.get("torchtitan-generation", ""),
                "ranks": str(self.nproc), "collectives": self.versions.get("collectives", "")}

    def first_error(self) -> str | None:
        """The first exception line any rank logged ("SomeError: message"), if any; for a
        wrapper that names no cause (``CAUSE_WRAPPERS``), the first exception after it in that
        log, the cause it wraps, where there is one."""
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
        spec = self.spec
        state = "timed out" if self.timed_out else f"exit code {self.returncode}"
        return (
            f"{spec.name}: {spec.backend}/{spec.size}/{spec.init} ({spec.attention} attention, "
            f"workarounds: {', '.join(spec.all_workarounds) or 'none'}) on {self.device} x{self.nproc}"
            f"{f' ({spec.nodes} nodes)' if spec.nodes > 1 else ''}, layout {self.layout} "
            f"({', '.join(f'{k} {v}' for k, v in self.degrees.items())}), "
            f"{state}, {len(self.steps)} step(s) in {self.duration_s:.1f}s\n"
            f"command: {' '.join(self.command)}\nrun dir: {self.run_dir}"
        )

    def to_json(self) -> dict:
        """Plain values (results.json): the run's name, its spec's fields, and what it produced."""
        data = asdict(self)
        data["name"] = self.spec.name
        data["run_dir"] = str(self.run_dir)
        data["rank_logs"] = {r: [str(p) for p in ps] for r, ps in self.rank_logs.items()}
        return data


class RunFailed(AssertionError):
    """A launch that did not finish cleanly; the message carries every rank's last lines."""

    def __init__(self, result: RunResult, why: str) -> None:
        self.result = result
        super().__init__(f"{why}\n{result.describe()}\n{result.log_tails()}")
