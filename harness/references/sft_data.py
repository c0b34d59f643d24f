"""An independent reference of the SFT batches (torchtitan ``ChatDataset``'s documented
contract, the same in 0.3.0 and spring 2026), sharing no code with torchtitan or ``datasets``:

- record order: the dataset shuffled once with seed 42 (``numpy.random.default_rng(42)
  .permutation``), then dp-sharded contiguously;
- a conversation is rendered by hand (the fixture's chat template:
  ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per turn), trailing newline stripped, tokenised
  with ``tokenizers``, EOS appended unless present; a sample longer than ``seq_len + 1`` tokens
  is dropped; inputs ``tokens[:-1]``, labels ``tokens[1:]`` with the first ``len(prompt) - 1``
  labels ignored, where the prompt is the user turn plus ``<|im_start|>assistant\\n``;
- greedy packing: a sample that does not fit the row's remaining room closes the row with EOS
  inputs, ignored labels and positions 0.. for the padding; positions restart at 0 per sample.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from harness.references.batch import Batch
from harness.references.data import TokenizerRef, shard
from harness.references.loss import IGNORE_INDEX


def _render(messages, generation_prompt: bool = False) -> str:
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if generation_prompt else "")


def sft_reference_batches(corpus_file: str | Path, tokenizer_dir: str | Path, to_chat, *,
                          seq_len: int, local_batch_size: int, dp_rank: int, dp_world: int,
                          n_batches: int = 1) -> list[Batch]:
    records = [json.loads(line) for line in Path(corpus_file).read_text().splitlines() if line.strip()]
    order = np.random.default_rng(42).permutation(len(records))
    mine = [records[int(order[i])] for i in shard(len(records), dp_rank, dp_world)]
    tok = TokenizerRef(tokenizer_dir)
    eos = tok.eos_id
    rows: list[tuple[list, list, list]] = []
    buf_in, buf_lab, buf_pos = [], [], []
    need = n_batches * local_batch_size

    def flush():
        nonlocal buf_in, buf_lab, buf_pos
        rows.append((buf_in, buf_pos, buf_lab))  # a Batch's order
        buf_in, buf_lab, buf_pos = [], [], []

    for record in mine:
        if len(rows) >= need:
            break
        messages = to_chat(record)
        ids = list(tok.tok.encode(_render(messages).rstrip("\n")).ids)
        if ids[-1] != eos:
            ids.append(eos)
        if len(ids) - 1 > seq_len:
            continue
        inputs, labels = ids[:-1], ids[1:]
        prompt = tok.tok.encode(_render(messages[:1], generation_prompt=True)).ids
        cut = min(max(len(prompt) - 1, 0), len(labels))
        labels = [IGNORE_INDEX] * cut + labels[cut:]
        room = seq_len - len(buf_in)
        if len(inputs) > room and buf_in:
            buf_in += [eos] * room
            buf_lab += [IGNORE_INDEX] * room
            buf_pos += list(range(room))
            flush()
        buf_in += inputs
        buf_lab += labels
        buf_pos += list(range(len(inputs)))
        if len(buf_in) == seq_len:
            flush()
    rows = rows[:need]
    out = []
    for b in range(n_batches):
        chunk = rows[b * local_batch_size:(b + 1) * local_batch_size]
        out.append(Batch(*(torch.tensor([r[k] for r in chunk]) for k in range(3))))
    return out
