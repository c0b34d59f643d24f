"""An independent reference of torchtitan's pretraining data path, written from each
generation's documented contract, sharing no code with torchtitan or ``datasets``:

- each JSONL record's ``text`` is tokenised with the ``tokenizers`` library (tokenizer.json);
  the document is ``[BOS] + ids + [EOS]`` (BOS/EOS from tokenizer_config.json; a null token is
  not added, nor one the tokenizer already adds);
- packing (``packing``, the installed generation's ``titan_api.TEXT_PACKING``):
  - ``"within_document"`` (0.3.0): the shift is within each document: inputs ``doc[:-1]``,
    labels ``doc[1:]`` (a document's last input never predicts the next document's first
    token); the documents are concatenated and cut into rows of exactly ``seq_len``;
  - ``"across_row"`` (spring 2026): the documents are concatenated whole and cut into windows
    of ``seq_len + 1``; inputs ``window[:-1]``, labels ``window[1:]`` (a document's EOS input
    predicts the next document's first token; the window's last token is a label only and
    never an input);
- positions count from 0 at every document start and at every row start (a document carried
  over from the previous row restarts at 0 in the new row);
- dp sharding is contiguous: rank ``r`` of ``n`` reads records ``[r*q + min(r, m), ...)`` with
  ``q, m = divmod(len, n)``, and its local batch ``b`` is its rows ``b*B .. b*B+B-1``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

from harness.references.batch import KEYS, Batch


def _special(config: dict, key: str) -> str | None:
    value = config.get(key)
    if isinstance(value, dict):
        value = value.get("content")
    return value


def read_texts(corpus: str | Path) -> list[str]:
    path = Path(corpus)
    if path.is_dir():
        files = sorted(path.glob("*.jsonl"))
        if len(files) != 1:
            raise ValueError(f"{path}: expected one *.jsonl, found {files}")
        path = files[0]
    return [json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip()]


class TokenizerRef:
    def __init__(self, tokenizer_dir: str | Path) -> None:
        tokenizer_dir = Path(tokenizer_dir)
        self.tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
        config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
        bos, eos = _special(config, "bos_token"), _special(config, "eos_token")
        self.bos_id = self.tok.token_to_id(bos) if bos else None
        self.eos_id = self.tok.token_to_id(eos) if eos else None

    def document(self, text: str) -> list[int]:
        ids = list(self.tok.encode(text).ids)
        if self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            ids.insert(0, self.bos_id)
        if self.eos_id is not None and (not ids or ids[-1] != self.eos_id):
            ids.append(self.eos_id)
        return ids


def shard(n: int, rank: int, world: int) -> range:
    q, m = divmod(n, world)
    start = rank * q + min(rank, m)
    return range(start, start + q + (1 if rank < m else 0))


PACKINGS = ("within_document", "across_row")


def _positions(starts: list[bool]) -> list[int]:
    """0 at every document start and at the row start, counting up in between."""
    pos, p = [], 0
    for i, s in enumerate(starts):
        p = 0 if (s or i == 0) else p + 1
        pos.append(p)
    return pos


def packed_rows(texts: list[str], tok: TokenizerRef, seq_len: int, max_rows: int,
                packing: str = "within_document"):
    """Rows (inputs, positions, labels) as lists, at most ``max_rows``, packed as ``packing``."""
    if packing not in PACKINGS:
        raise ValueError(f"unknown packing {packing!r}; known: {PACKINGS}")
    # the token streams of inputs and labels, and where a document begins in the input stream
    inputs: list[int] = []
    labels: list[int] = []
    doc_start: list[bool] = []
    # within_document: a row is seq_len shifted pairs; across_row: seq_len + 1 whole tokens
    width = seq_len if packing == "within_document" else seq_len + 1
    rows = []
    for text in texts:
        doc = tok.document(text)
        if packing == "within_document":
            inputs += doc[:-1]
            labels += doc[1:]
            doc_start += [True] + [False] * (len(doc) - 2)
        else:
            inputs += doc
            doc_start += [True] + [False] * (len(doc) - 1)
        while len(inputs) >= width and len(rows) < max_rows:
            window, starts = inputs[:width], doc_start[:width]
            if packing == "within_document":
                row_in, row_lab = window, labels[:width]
                labels = labels[width:]
            else:
                row_in, row_lab, starts = window[:-1], window[1:], starts[:-1]
            inputs, doc_start = inputs[width:], doc_start[width:]
            rows.append((row_in, _positions(starts), row_lab))
        if len(rows) >= max_rows:
            break
    return rows


def reference_batches(corpus: str | Path, tokenizer_dir: str | Path, *, seq_len: int,
                      local_batch_size: int, dp_rank: int, dp_world: int,
                      n_batches: int = 1, packing: str = "within_document") -> list[Batch]:
    texts = read_texts(corpus)
    mine = [texts[i] for i in shard(len(texts), dp_rank, dp_world)]
    rows = packed_rows(mine, TokenizerRef(tokenizer_dir), seq_len, n_batches * local_batch_size,
                       packing)
    out = []
    for b in range(n_batches):
        chunk = rows[b * local_batch_size:(b + 1) * local_batch_size]
        out.append(Batch(*(torch.tensor([r[k] for r in chunk], dtype=torch.long)
                           for k in range(3))))
    return out


@dataclass
class Mismatch:
    field: str
    row: int
    count: int
    first_col: int
    got: list[int]
    want: list[int]

    def __str__(self) -> str:
        return (f"{self.field} row {self.row}: {self.count} tokens differ, first at column "
                f"{self.first_col}: trainer {self.got} vs reference {self.want}")


def compare(got: Batch, want: Batch) -> list[Mismatch]:
    """Token-for-token differences (empty: identical)."""
    out = []
    for name in ("inputs", "labels", "positions"):
        a, b = getattr(got, name), getattr(want, name)
        if a.shape != b.shape:
            out.append(Mismatch(KEYS[name], -1, -1, -1, list(a.shape), list(b.shape)))
            continue
        for row in range(a.shape[0]):
            diff = (a[row] != b[row]).nonzero().flatten()
            if len(diff):
                c = int(diff[0])
                out.append(Mismatch(KEYS[name], row, len(diff), c, a[row, c:c + 6].tolist(),
                                    b[row, c:c + 6].tolist()))
    return out
