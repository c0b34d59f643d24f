"""HF assets folders for the full-size runs, and their CPU twin.

A full-size run reads one assets folder per model under ``--assets-dir ROOT``:

- ``ROOT/Qwen3-4B-Instruct-2507/``: what ``hf download Qwen/Qwen3-4B-Instruct-2507 --local-dir
  ROOT/Qwen3-4B-Instruct-2507`` writes: ``config.json``, ``generation_config.json``, the tokenizer
  files, ``model-0000k-of-0000n.safetensors`` and ``model.safetensors.index.json``
  (``{"metadata": {"total_size": bytes}, "weight_map": {key: shard file}}``). torchtitan builds
  its HF save map from that index (``StateDictAdapter.fqn_to_index_mapping``), so only a model
  whose keys are the index's can be saved against it.
- ``ROOT/qwen3_30b_a3b_4l_64e_top4/``: the MoE's own (``derived_assets``): its config.json and
  the Qwen3 tokenizer, and no index (random init only; torchtitan then saves one
  ``model.safetensors`` with every key the model has). Built from the reference config and the
  4B folder's tokenizer when absent (``full_size_assets_dir``).

``build_twin(ROOT)`` lays out the same tree from the committed tiny fixtures, at test time (so it
always follows them): the tiny dense model (tied embeddings, head_dim 48 apart from
hidden/heads 32, as Qwen3-4B's 128 vs 80) sharded as the real download is, and the tiny MoE's
config beside the twin's tokenizer. The CPU tier launches every backend's ``full`` code path
from it: the same asset flags, save maps and checks as a trn2 night.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from harness.registry import paths

DENSE_ASSETS = "Qwen3-4B-Instruct-2507"
MOE_ASSETS = "qwen3_30b_a3b_4l_64e_top4"
INDEX = "model.safetensors.index.json"
CONFIG_FILES = ("config.json", "generation_config.json")
# What `hf download` brings of a Qwen3 tokenizer (vocab.json / merges.txt where the model has
# them; the fixtures' BPE tokenizer is tokenizer.json only).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")
# Qwen3-4B-Instruct-2507 is three shards on the Hub; the twin is sharded the same way.
TWIN_SHARDS = 3


# What a full-size run needs of the 4B's folder, and the command that fetches it (huggingface_hub
# >= 1.0: the CLI is `hf`; Qwen/Qwen3-4B-Instruct-2507 is public).
HUB_MODEL = f"Qwen/{DENSE_ASSETS}"
REQUIRED_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", INDEX)


class AssetsError(FileNotFoundError):
    pass


def download_command(root: str | Path) -> str:
    return f"hf download --local-dir {Path(root) / DENSE_ASSETS} {HUB_MODEL}"


def missing_dense_assets(root: str | Path) -> list[str]:
    """What ``root``'s 4B folder lacks of what a full-size run reads ([] when complete)."""
    folder = Path(root) / DENSE_ASSETS
    missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
    if not any(folder.glob("*.safetensors")):
        missing.append("*.safetensors")
    return missing


def _copy_present(src: Path, dst: Path, names) -> list[str]:
    copied = []
    for name in names:
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)
            copied.append(name)
    return copied


def _shard_size_for(state_dict, shards: int) -> int:
    """The smallest max_shard_size that splits ``state_dict`` into at most ``shards`` files."""
    from huggingface_hub import split_torch_state_dict_into_shards  # noqa: PLC0415  heavy: the registry imports nothing heavy

    total = sum(t.numel() * t.element_size() for t in state_dict.values())
    size = -(-total // shards)
    while len(split_torch_state_dict_into_shards(state_dict, max_shard_size=size)
              .filename_to_tensors) > shards:
        size += max(1, total // 100)
    return size


def hf_download_layout(model_dir: str | Path, out: str | Path, shards: int = TWIN_SHARDS) -> Path:
    """``out`` laid out as ``hf download`` lays out a sharded model, from ``model_dir``'s
    config, tokenizer and single ``model.safetensors`` (split with huggingface_hub's own
    sharding, the one ``save_pretrained`` uses)."""
    from huggingface_hub import split_torch_state_dict_into_shards  # noqa: PLC0415  heavy: the registry imports nothing heavy
    from safetensors.torch import load_file, save_file  # noqa: PLC0415  heavy: the registry imports nothing heavy

    model_dir, out = Path(model_dir), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _copy_present(model_dir, out, CONFIG_FILES + TOKENIZER_FILES)
    state_dict = load_file(model_dir / "model.safetensors")
    split = split_torch_state_dict_into_shards(
        state_dict, max_shard_size=_shard_size_for(state_dict, shards))
    for filename, keys in split.filename_to_tensors.items():
        save_file({k: state_dict[k].contiguous() for k in keys}, out / filename,
                  metadata={"format": "pt"})
    index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
    (out / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return out


def derived_assets(config_dir: str | Path, tokenizer_dir: str | Path, out: str | Path) -> Path:
    """A model's own assets folder: ``config_dir``'s config files and ``tokenizer_dir``'s
    tokenizer, no weights and no index (a random-init model saved in HF format gets a save map
    of its own keys)."""
    config_dir, tokenizer_dir, out = Path(config_dir), Path(tokenizer_dir), Path(out)
    if not (config_dir / "config.json").is_file():
        raise AssetsError(f"{config_dir} has no config.json to build {out.name}'s assets from")
    out.mkdir(parents=True, exist_ok=True)
    if not _copy_present(tokenizer_dir, out, TOKENIZER_FILES):
        raise AssetsError(f"{tokenizer_dir} has none of the tokenizer files {TOKENIZER_FILES}; "
                          f"the {out.name} assets take the Qwen3 tokenizer from there")
    _copy_present(config_dir, out, CONFIG_FILES)
    return out


def build_twin(root: str | Path) -> Path:
    """The full-size assets tree (``ROOT/<dense>``, ``ROOT/<moe>``) of the tiny fixtures."""
    root = Path(root)
    dense = hf_download_layout(paths.TINY_DENSE, root / DENSE_ASSETS)
    derived_assets(paths.TINY_MOE, dense, root / MOE_ASSETS)
    return root


def full_size_assets_dir(folder: str, root: str | Path, derive_from: str | Path | None,
                         workdir: str | Path) -> Path:
    """The assets folder ``folder`` of a full-size run under ``root``: ``root/folder`` when it
    is there, else (a model with ``derive_from``, its config dir) built under ``workdir`` from
    that config and ``root``'s Qwen3-4B tokenizer."""
    given = Path(root) / folder
    if given.is_dir() or derive_from is None:
        return given
    return derived_assets(derive_from, Path(root) / DENSE_ASSETS, Path(workdir) / folder)
