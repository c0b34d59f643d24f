#!/usr/bin/env python3
"""Nightly step "Fetch the runs' data": what the full-size runs read, fetched once, then kept.

- ``$ASSETS_DIR/Qwen3-4B-Instruct-2507``: the model's config, tokenizer, safetensors and index
  (harness/registry/assets_twin.py), fetched with ``hf download Qwen/Qwen3-4B-Instruct-2507`` when a file
  is missing (about 8 GB).
- ``$C4_DIR``: a local copy of allenai/c4 in its own layout (harness/backends/c4.py): README.md, one
  validation shard and the train shards 0..W-1 that the W ranks of a full-size run read first
  (W = the neuron tier's ranks per node: 64 on a trn2.48xlarge at LNC=2, about 20 GB), so every
  rank streams exactly the documents it would stream from the Hub, and 64 ranks never hit the
  Hub's rate limit at once (torchtitan #2239).

Files already there are not fetched again: a warm runner needs no network. Fetching needs
huggingface.co over HTTPS; both repositories are public, and ``HF_TOKEN`` (the repository secret
of that name) only lifts the anonymous rate limit. Then the copy is opened exactly as a rank
opens it (torchtitan's own ``c4`` loader, split as rank 0 of W) and its first document printed:
a copy that does not load fails here, not in 64 ranks at once.

Env: ASSETS_DIR, C4_DIR (scripts/nightly/image_env.sh exports them; defaults ~/hf-assets and
~/hf-data/c4, the runner user's own: nothing of the night needs root).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from harness.backends import c4
from harness.device.devices import profile_for
from harness.registry.assets_twin import DENSE_ASSETS, download_command, missing_dense_assets


def ranks() -> int:
    """The world size of a full-size neuron run here (its stand-in's in the rehearsal)."""
    return profile_for("neuron").ranks_per_node


def fetch(command: str, what: str) -> None:
    print(f"fetching {what}: {command}", flush=True)
    done = subprocess.run(shlex.split(command))
    if done.returncode != 0:
        raise SystemExit(f"::error::fetching {what} failed (exit {done.returncode}): {command}")


def fetch_model(assets: Path) -> None:
    missing = missing_dense_assets(assets)
    if not missing:
        print(f"{assets / DENSE_ASSETS}: present")
        return
    fetch(download_command(assets), f"{DENSE_ASSETS} (missing {missing})")
    still = missing_dense_assets(assets)
    if still:
        raise SystemExit(f"::error::{assets / DENSE_ASSETS} still lacks {still} after the download")


def fetch_c4(folder: Path, world: int) -> None:
    missing = c4.missing_files(folder, world)
    if missing:
        fetch(c4.download_command(folder, world), f"C4 for {world} ranks ({len(missing)} file(s))")
    else:
        print(f"{folder}: C4 for {world} ranks present")
    c4.check_local_copy(folder, world)
    first = first_document(folder, world)
    print(f"{folder}: rank 0 of {world} starts with {first[:80]!r}")


def first_document(folder: Path, world: int) -> str:
    """Rank 0's first document, read as a trn2 rank reads it."""
    from datasets.distributed import split_dataset_by_node  # noqa: PLC0415  heavy: datasets, for the first document alone

    dataset = split_dataset_by_node(c4.load_as_torchtitan_does(folder), rank=0, world_size=world)
    return next(iter(dataset))["text"]


def main() -> int:
    assets = Path(os.environ.get("ASSETS_DIR") or os.path.expanduser("~/hf-assets"))
    c4_dir = Path(os.environ.get("C4_DIR") or os.path.expanduser("~/hf-data/c4"))
    fetch_model(assets)
    fetch_c4(c4_dir, ranks())
    return 0


if __name__ == "__main__":
    sys.exit(main())
