"""C4 as the source's full-size runs read it, from the Hub or from a local copy.

torchtitan's ``c4`` dataset calls ``load_dataset(path, name="en", split="train", streaming=True)``
with ``path = --dataloader.dataset_path or "allenai/c4"`` (hf_datasets/text_datasets.py
``_load_c4_dataset``, spring-2026 main and 0.3.0 alike). So a C4 run always gets an explicit
``--dataloader.dataset_path`` (``dataset_flags``): without one it would take whatever path the
config function set (the configs read the fixture corpus), and ``load_dataset(<corpus>,
name="en")`` fails with "BuilderConfig 'en' not found".

A local copy is allenai/c4's own layout: its ``README.md`` (whose ``configs:`` front matter
declares the ``en`` config's data files, ``en/c4-train.*.json.gz`` and
``en/c4-validation.*.json.gz``), at least one validation shard (datasets 4.x refuses a config
one of whose splits matches no file: "Couldn't infer the same data file format for all splits")
and the train shards the runs read. Streaming splits the shards over the ranks (datasets
``split_dataset_by_node``: when the shard count divides by the world size, rank r reads shards
r, r + W, ...), so rank r of W starts on train shard r, on the Hub's 1024 shards and on a local
copy of the first W alike: the first W shards give every rank the documents it would stream
from the Hub (``files_for``). ``fixtures/c4`` is a synthetic copy in the same layout, for two
ranks (the CPU tier's full-size runs and the nightly's rehearsal read it).
"""

from __future__ import annotations

from pathlib import Path

HUB_REPO = "allenai/c4"
CONFIG = "en"
README = "README.md"
TRAIN_SHARDS = 1024
VALIDATION_SHARDS = 8


def train_shard(index: int) -> str:
    return f"{CONFIG}/c4-train.{index:05d}-of-{TRAIN_SHARDS:05d}.json.gz"


def validation_shard(index: int = 0) -> str:
    return f"{CONFIG}/c4-validation.{index:05d}-of-{VALIDATION_SHARDS:05d}.json.gz"


class C4Error(FileNotFoundError):
    pass


def files_for(ranks: int) -> list[str]:
    """The files of a local copy that ``ranks`` data-parallel ranks read as from the Hub."""
    if not 1 <= ranks <= TRAIN_SHARDS:
        raise ValueError(f"{ranks} ranks: a local C4 copy serves 1..{TRAIN_SHARDS} ranks")
    return [README, validation_shard(), *(train_shard(i) for i in range(ranks))]


def download_command(dest: str | Path, ranks: int) -> str:
    """The one command that makes a local copy for ``ranks`` ranks (huggingface_hub >= 1.0:
    ``hf``; the dataset is public, ``HF_TOKEN`` only lifts the anonymous rate limit)."""
    return (f"hf download --repo-type dataset --local-dir {dest} {HUB_REPO} "
            + " ".join(files_for(ranks)))


def missing_files(path: str | Path, ranks: int) -> list[str]:
    return [name for name in files_for(ranks) if not (Path(path) / name).is_file()]


def check_local_copy(path: str | Path, ranks: int) -> Path:
    """``path`` if it is a local copy ``ranks`` ranks can read, else a C4Error naming what is
    missing and the command that fetches it."""
    path = Path(path)
    missing = missing_files(path, ranks)
    if missing:
        shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise C4Error(f"{path} is not a local copy of {HUB_REPO} for {ranks} ranks: it lacks "
                      f"{shown}. Fetch them with: {download_command(path, ranks)}")
    return path


def dataset_flags(data_path: str | Path | None) -> list[str]:
    """The dataloader overrides of a C4 run: the dataset and always its path (a local copy's
    folder, or the Hub's repository when ``data_path`` is None)."""
    return ["--dataloader.dataset", "c4", "--dataloader.dataset_path", str(data_path or HUB_REPO)]


def load_as_torchtitan_does(path: str | Path):
    """The streaming train split, opened by torchtitan's own ``c4`` loader (what a rank calls)."""
    from torchtitan.hf_datasets.text_datasets import DATASETS  # noqa: PLC0415  heavy: torchtitan, datasets; fetch_data.py checks files without them

    return DATASETS["c4"].loader(str(path))
