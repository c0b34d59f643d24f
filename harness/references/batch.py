"""A batch of token rows, the one type of it: what a dataloader yields (torchtitan's, and the
references' of harness/references/data.py and sft_data.py), what a model is fed, and what a
launched rank dumps (harness/rank/step0.py writes it with ``to_dump``; ``load_batches`` reads
it back; where its file lies: harness/registry/dump_layout.py).

A batch is ``inputs``, ``positions`` and ``labels``, each ``[B, L]`` int64: token ids, each
token's position in its document (0 at each document start and at each row start; None where
a model is given none), and the next-token targets already aligned with the inputs (no shift;
``IGNORE_INDEX`` where no loss is taken, harness/references/loss.py). A dumped batch is the
dataloader's, with ``fed``: the same rows as ``post_dataloading_process`` made them, what the
model and the loss got.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from harness.registry import dump_layout

# A dumped batch's keys: the dataloader's names (torchtitan's ``input_dict`` and its labels) by
# field, and the ``fed`` batch's under the prefix ``FED``.
KEYS = {"inputs": "input", "positions": "positions", "labels": "labels"}
FED = "model_"


def _cat(tensors: Sequence[torch.Tensor | None]) -> torch.Tensor | None:
    return None if any(t is None for t in tensors) else torch.cat(list(tensors))


@dataclass
class Batch:
    inputs: torch.Tensor  # [B, L] token ids
    positions: torch.Tensor | None  # [B, L] per-document positions (0 at each document start)
    labels: torch.Tensor  # [B, L] next-token targets (already shifted, torchtitan style)
    fed: Batch | None = None  # these rows as the model and the loss got them (a dumped batch)

    @classmethod
    def from_loader(cls, input_dict: dict, labels: torch.Tensor) -> Batch:
        """A batch as torchtitan's dataloader yields it: ``(input_dict, labels)``."""
        return cls(input_dict["input"], input_dict.get("positions"), labels)

    @staticmethod
    def cat(batches: Sequence[Batch]) -> Batch:
        """The rows of ``batches``, in order (positions None if any has none; ``fed`` where
        every one has it)."""
        fed = [b.fed for b in batches]
        return Batch(*(_cat([getattr(b, name) for b in batches]) for name in KEYS),
                     fed=None if any(f is None for f in fed) else Batch.cat(fed))

    def apply(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
        """This batch with ``fn`` applied to each of its tensors (``fed``'s too)."""
        return Batch(*(None if getattr(self, name) is None else fn(getattr(self, name))
                       for name in KEYS),
                     fed=None if self.fed is None else self.fed.apply(fn))

    def masked_as(self, mask: str) -> Batch:
        """This batch as a model that treats packed rows as ``mask`` sees it, for models that
        derive the mask from positions (transformers without an attention mask, the
        reference): "document" (per-document positions: causal within each document) as is;
        "row_causal" (native Qwen3 with sdpa: causal over the row, RoPE at row positions)
        with positions ``arange(L)`` on every row."""
        if mask == "document":
            return self
        if mask == "row_causal":
            L = self.inputs.shape[1]
            return replace(self, positions=torch.arange(L).expand_as(self.inputs).contiguous())
        raise ValueError(f"no position-derived form of mask {mask!r} (known: document, row_causal)")

    def to_dump(self) -> dict[str, torch.Tensor | None]:
        """The dumped form: the dataloader's keys, and ``fed``'s under ``FED``."""
        record = {key: getattr(self, name) for name, key in KEYS.items()}
        if self.fed is not None:
            record.update({FED + key: getattr(self.fed, name) for name, key in KEYS.items()})
        return record

    @classmethod
    def from_dump(cls, record: dict) -> Batch:
        """A batch from its dumped form (``to_dump``)."""
        def part(prefix: str) -> Batch:
            return cls(*(record.get(prefix + key) for key in KEYS.values()))

        return replace(part(""), fed=part(FED) if FED + KEYS["inputs"] in record else None)


def load_batches(run_dir: str | Path, step: int = 1) -> list[Batch]:
    """Every rank's dumped batch of ``step``, in rank order (each with ``fed``)."""
    files = dump_layout.batch_files(run_dir, step)
    if not files:
        raise FileNotFoundError(f"{dump_layout.dump_folder(run_dir) / dump_layout.BATCHES}: "
                                f"no batch dumps of step {step}")
    return [Batch.from_dump(torch.load(path, weights_only=True)) for path in files.values()]


def microbatches(run_dir: str | Path, rows: int, step: int = 1) -> list[Batch]:
    """Every rank's ``step`` microbatches of ``rows`` rows each, rank by rank (a ``ga=k`` run's
    dump holds the rows of all k, in feeding order)."""
    return [b.apply(lambda t, i=i: t[i:i + rows])
            for b in load_batches(run_dir, step) for i in range(0, len(b.fed.labels), rows)]
