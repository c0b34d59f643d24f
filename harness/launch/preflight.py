"""Check a run's inputs before launching 2..64 ranks on them.

A broken asset otherwise surfaces minutes later as a rank traceback deep in torchtitan or
safetensors. Each problem raises ``PreflightError`` naming the file and the fix.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from harness.registry import paths

REGENERATE = "regenerate the fixtures with `python scripts/make_fixtures.py`"


class PreflightError(ValueError):
    pass


def _fix_for(path: Path) -> str:
    if paths.FIXTURES in path.resolve().parents:
        return REGENERATE
    return "re-download the model's HF assets (e.g. `hf download <repo> --local-dir <dir>`)"


def check_safetensors(path: Path) -> None:
    """Header and data extent of one .safetensors file (no tensor is loaded)."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            if header_len <= 0 or 8 + header_len > size:
                raise ValueError(f"header length {header_len} does not fit a {size}-byte file")
            header = json.loads(f.read(header_len))
    except (struct.error, ValueError, UnicodeDecodeError) as error:
        raise PreflightError(f"{path}: not a readable safetensors file ({error}); "
                             f"{_fix_for(path)}") from error
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if 8 + header_len + end > size:
        raise PreflightError(
            f"{path}: truncated: tensors need {8 + header_len + end} bytes, the file has {size}; "
            f"{_fix_for(path)}")


def check_weights_dir(directory: Path) -> None:
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise PreflightError(f"{directory}: no *.safetensors weights; {_fix_for(directory)}")
    for file in files:
        check_safetensors(file)
    index = directory / "model.safetensors.index.json"
    if index.exists():
        listed = set(json.loads(index.read_text())["weight_map"].values())
        missing = sorted(name for name in listed if not (directory / name).is_file())
        if missing:
            raise PreflightError(f"{index}: lists shard(s) {missing} that are not in {directory}; "
                                 f"{_fix_for(directory)}")


def check_tokenizer(assets: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if not (assets / name).is_file():
            raise PreflightError(
                f"{assets / name} is missing: torchtitan loads the tokenizer from hf_assets_path "
                f"({assets}); {_fix_for(assets)}")
    try:
        json.loads((assets / "tokenizer.json").read_text())
    except ValueError as error:
        raise PreflightError(f"{assets / 'tokenizer.json'}: not valid JSON ({error}); "
                             f"{_fix_for(assets)}") from error


def check_model_config(model_dir: Path) -> dict:
    path = model_dir / "config.json"
    if not path.is_file():
        raise PreflightError(f"{path} is missing; {_fix_for(model_dir)}")
    try:
        config = json.loads(path.read_text())
    except ValueError as error:
        raise PreflightError(f"{path}: not valid JSON ({error}); {_fix_for(model_dir)}") from error
    problems = []
    heads, kv = config.get("num_attention_heads"), config.get("num_key_value_heads")
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"):
        if not isinstance(config.get(key), int) or config[key] <= 0:
            problems.append(f"{key}={config.get(key)!r} must be a positive integer")
    if isinstance(heads, int) and isinstance(kv, int) and kv > 0 and heads % kv:
        problems.append(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv}")
    if "head_dim" not in config and isinstance(heads, int) and heads > 0 \
            and isinstance(config.get("hidden_size"), int) and config["hidden_size"] % heads:
        problems.append(f"hidden_size={config['hidden_size']} is not a multiple of "
                        f"num_attention_heads={heads} and no head_dim is given")
    top_k = config.get("num_experts_per_tok")
    experts = config.get("num_experts") or config.get("num_local_experts")
    if experts and top_k and top_k > experts:
        problems.append(f"num_experts_per_tok={top_k} exceeds the {experts} experts")
    if problems:
        raise PreflightError(f"{path}: inconsistent config: " + "; ".join(problems)
                             + f"; fix the file or {_fix_for(model_dir)}")
    return config


def check_vocab(config: dict, model_dir: Path, assets: Path) -> None:
    vocab = json.loads((assets / "tokenizer.json").read_text()).get("model", {}).get("vocab", {})
    added = json.loads((assets / "tokenizer.json").read_text()).get("added_tokens", [])
    size = len(vocab) + len([t for t in added if t.get("content") not in vocab])
    if size > config["vocab_size"]:
        raise PreflightError(
            f"{assets / 'tokenizer.json'} has {size} tokens but {model_dir / 'config.json'} "
            f"says vocab_size={config['vocab_size']}: token ids would overflow the embedding; "
            f"use the tokenizer that belongs to the model")


def check_run_inputs(model_dir: Path, assets: Path, weights: Path | None) -> None:
    """Everything a run reads: config, tokenizer, and (pretrained) weights."""
    config = check_model_config(model_dir)
    check_tokenizer(assets)
    check_vocab(config, model_dir, assets)
    if weights is not None:
        check_weights_dir(weights)
