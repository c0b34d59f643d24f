"""Checkpoint conformance: is a saved HF checkpoint exactly what transformers expects?

The expected key set, shapes and dtypes come from transformers itself: the model class for
the config is built on the meta device and put through ``save_pretrained``'s own steps
(``remove_tied_weights_from_state_dict``, ``revert_weight_conversion``), so the reference is
"what HF would have written for this config", including its tied-embedding convention (the
tied ``lm_head.weight`` is not written) and its per-expert MoE layout.

Checks (each returns a list of :class:`Violation`, every problem listed, never just the
first):

- :func:`checkpoint_violations` -- missing keys, unexpected keys, shape and dtype mismatches,
  tied-embedding convention;
- :func:`index_violations` -- sharded-index consistency: every key of
  ``model.safetensors.index.json`` in exactly one listed file and really in that file, every
  listed file present, no ``.safetensors`` file the index does not list (orphan), no key
  stored twice or stored but unindexed;
- :func:`reload_report` -- ``from_pretrained`` with ``output_loading_info``: no missing,
  unexpected or mismatched keys;
- :func:`adapter_round_trip_violations` -- torchtitan's adapter ``from_hf(to_hf(sd))``
  reproduces every native tensor bit for bit, and :func:`unmapped_native_keys` -- every
  native tensor has an HF name, except those in the data allow-list
  (``harness/parity/conformance/expected_unmapped_keys.toml``).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from harness.references.model import load_hf_tensors

ALLOW_LIST = Path(__file__).with_name("expected_unmapped_keys.toml")
INDEX_NAME = "model.safetensors.index.json"

_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
           "I64": torch.int64, "I32": torch.int32, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


@dataclass(frozen=True)
class Violation:
    check: str
    key: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.check}] {self.key}: {self.detail}"


_ROUTED_EXPERT = re.compile(r"(^|\.)(mlp|moe)\.experts\.")


def keys_outside_routed_experts(keys) -> int:
    """How many of ``keys`` (native or HF names) are not a routed expert's tensor: the
    ``checkpoint_conformance`` observation a known adapter defect of the experts is judged by."""
    return sum(1 for k in keys if not _ROUTED_EXPERT.search(k))


def format_violations(title: str, violations: list[Violation]) -> str:
    lines = [f"{title}: {len(violations)} violation(s)"]
    lines += [f"  {v}" for v in violations]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# what transformers expects
# --------------------------------------------------------------------------------------------

def hf_config(config_dir: str | Path):
    import transformers  # noqa: PLC0415  heavy: transformers; the checkpoint listing loads without it

    return transformers.AutoConfig.from_pretrained(str(config_dir))


def expected_hf_checkpoint(config_dir: str | Path, dtype: torch.dtype | None = None
                           ) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """``{key: (shape, dtype)}`` that ``save_pretrained`` writes for the config in
    ``config_dir``. ``dtype`` defaults to the config's ``dtype`` (fp32 if unset)."""
    import transformers  # noqa: PLC0415  heavy: transformers; the checkpoint listing loads without it

    from harness.parity.models import hf_state_to_disk_names  # noqa: PLC0415  heavy: torchtitan via parity.models; the listing loads without it

    cfg = hf_config(config_dir)
    if dtype is None:
        dtype = getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", None) or torch.float32
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    state = hf_state_to_disk_names(model, model.state_dict())
    return {k: (tuple(v.shape), v.dtype) for k, v in state.items()}


# --------------------------------------------------------------------------------------------
# what is on disk
# --------------------------------------------------------------------------------------------

@dataclass
class CheckpointListing:
    directory: Path
    files: dict[str, dict[str, tuple[tuple[int, ...], torch.dtype | str]]]  # file -> key -> (shape, dtype)
    index: dict | None
    extra_safetensors: list[str] = field(default_factory=list)  # in subdirectories

    @property
    def tensors(self) -> dict[str, tuple[tuple[int, ...], torch.dtype | str]]:
        out = {}
        for keys in self.files.values():
            out.update(keys)
        return out

    def locations(self) -> dict[str, list[str]]:
        loc: dict[str, list[str]] = {}
        for fname, keys in self.files.items():
            for k in keys:
                loc.setdefault(k, []).append(fname)
        return loc


def list_checkpoint(directory: str | Path) -> CheckpointListing:
    directory = Path(directory)
    files = {}
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            files[path.name] = {
                k: (tuple(f.get_slice(k).get_shape()), _DTYPES.get(f.get_slice(k).get_dtype(),
                                                                    f.get_slice(k).get_dtype()))
                for k in f.keys()
            }
    index_path = directory / INDEX_NAME
    index = json.loads(index_path.read_text()) if index_path.is_file() else None
    extra = sorted(str(p.relative_to(directory)) for p in directory.rglob("*.safetensors")
                   if p.parent != directory)
    return CheckpointListing(directory, files, index, extra)


def index_violations(listing: CheckpointListing) -> list[Violation]:
    out: list[Violation] = []
    loc = listing.locations()
    for key, where in sorted(loc.items()):
        if len(where) > 1:
            out.append(Violation("index", key, f"stored in {len(where)} files: {where}"))
    if listing.index is None:
        if len(listing.files) > 1:
            out.append(Violation("index", INDEX_NAME,
                                 f"{len(listing.files)} .safetensors files but no index "
                                 f"(transformers would read only model.safetensors): {sorted(listing.files)}"))
        if listing.files and "model.safetensors" not in listing.files and len(listing.files) == 1:
            only = next(iter(listing.files))
            out.append(Violation("index", only, "single file without an index must be named "
                                                "model.safetensors for from_pretrained to find it"))
        if not listing.files:
            out.append(Violation("index", str(listing.directory), "no .safetensors file"))
        return out
    weight_map = listing.index.get("weight_map")
    if not isinstance(weight_map, dict):
        return out + [Violation("index", INDEX_NAME, "no weight_map")]
    listed_files = set(weight_map.values())
    for fname in sorted(listed_files):
        if fname not in listing.files:
            out.append(Violation("index", fname, "listed in the index but not present"))
    for fname in sorted(set(listing.files) - listed_files):
        out.append(Violation("index", fname, "orphan: .safetensors file not listed in the index"))
    for key, fname in sorted(weight_map.items()):
        if fname in listing.files and key not in listing.files[fname]:
            where = loc.get(key)
            out.append(Violation("index", key, f"indexed in {fname} but not stored there"
                                               + (f" (stored in {where})" if where else " (stored nowhere)")))
    for key in sorted(set(loc) - set(weight_map)):
        out.append(Violation("index", key, f"stored in {loc[key]} but missing from the index"))
    total = listing.index.get("metadata", {}).get("total_size")
    if total is not None:
        actual = 0
        for _key, (shape, dtype) in listing.tensors.items():
            if isinstance(dtype, torch.dtype):
                n = 1
                for s in shape:
                    n *= s
                actual += n * torch.empty((), dtype=dtype).element_size()
        if int(total) != actual:
            out.append(Violation("index", "metadata.total_size",
                                 f"index says {total} bytes, tensors hold {actual}"))
    return out


def checkpoint_violations(directory: str | Path, config_dir: str | Path | None = None,
                          dtype: torch.dtype | None = None) -> list[Violation]:
    """Key set, shapes, dtypes and tied-embedding convention vs transformers' expectation,
    plus :func:`index_violations`. ``config_dir`` supplies config.json when ``directory``
    has none (torchtitan's ``last_save_in_hf`` writes weights only)."""
    directory = Path(directory)
    config_dir = Path(config_dir) if config_dir else directory
    listing = list_checkpoint(directory)
    expected = expected_hf_checkpoint(config_dir, dtype)
    actual = listing.tensors
    out = index_violations(listing)
    cfg = hf_config(config_dir)
    for key in sorted(set(expected) - set(actual)):
        out.append(Violation("missing", key, f"expected {expected[key][0]} {expected[key][1]}, not in checkpoint"))
    for key in sorted(set(actual) - set(expected)):
        why = "not a tensor of the HF model for this config"
        if key == "lm_head.weight" and getattr(cfg, "tie_word_embeddings", False):
            why = "tie_word_embeddings=True: transformers does not store the tied lm_head.weight"
        out.append(Violation("unexpected", key, why))
    for key in sorted(set(expected) & set(actual)):
        (es, ed), (as_, ad) = expected[key], actual[key]
        if es != as_:
            out.append(Violation("shape", key, f"expected {es}, checkpoint has {as_}"))
        if ed != ad:
            out.append(Violation("dtype", key, f"expected {ed}, checkpoint has {ad}"))
    if not getattr(cfg, "tie_word_embeddings", False) and "lm_head.weight" in actual \
            and "model.embed_tokens.weight" in actual:
        loc = listing.locations()
        with safe_open(str(directory / loc["lm_head.weight"][0]), "pt") as f:
            head = f.get_tensor("lm_head.weight")
        with safe_open(str(directory / loc["model.embed_tokens.weight"][0]), "pt") as f:
            emb = f.get_tensor("model.embed_tokens.weight")
        if head.shape == emb.shape and torch.equal(head, emb):
            out.append(Violation("tied", "lm_head.weight",
                                 "untied config but lm_head.weight equals embed_tokens bit for bit"))
    return out


# --------------------------------------------------------------------------------------------
# reload through transformers
# --------------------------------------------------------------------------------------------

def with_config(directory: str | Path, config_dir: str | Path, out_dir: str | Path) -> Path:
    """A loadable HF dir: ``directory``'s weights (symlinked) plus ``config_dir``'s config."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for p in Path(directory).iterdir():
        if p.is_file() and (p.suffix == ".safetensors" or p.name == INDEX_NAME):
            target = out_dir / p.name
            if not target.exists():
                target.symlink_to(p.resolve())
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        src = Path(config_dir) / name
        if src.is_file() and not (out_dir / name).exists():
            shutil.copy(src, out_dir / name)
    return out_dir


def reload_report(directory: str | Path) -> tuple[object, list[Violation]]:
    """``from_pretrained(directory)`` in fp32; violations for every missing, unexpected or
    mismatched key and every load error transformers reports."""
    import transformers  # noqa: PLC0415  heavy: transformers; the checkpoint listing loads without it

    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        str(directory), dtype=torch.float32, output_loading_info=True)
    out = []
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        for item in sorted(info.get(kind) or [], key=str):
            out.append(Violation(f"from_pretrained {kind}", str(item), "reported by transformers"))
    # No tie check here: from_pretrained re-ties lm_head to embed_tokens whatever the file
    # holds, so it could not fail. The native side is checked by tied_embedding_violations.
    return model.eval(), out


# --------------------------------------------------------------------------------------------
# torchtitan adapter
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AllowedUnmapped:
    pattern: str  # fnmatch over native state-dict keys
    reason: str


def load_allow_list(path: Path = ALLOW_LIST) -> list[AllowedUnmapped]:
    data = tomllib.loads(Path(path).read_text())
    return [AllowedUnmapped(e["pattern"], e["reason"]) for e in data.get("unmapped", [])]


def is_allowed(key: str, allow: list[AllowedUnmapped]) -> AllowedUnmapped | None:
    return next((a for a in allow if fnmatch.fnmatchcase(key, a.pattern)), None)


def _tied_alias(model_state: dict[str, torch.Tensor], key: str) -> str | None:
    """Another key whose tensor shares storage with ``key`` (weight tying)."""
    t = model_state[key]
    for other, u in model_state.items():
        if other != key and u.data_ptr() == t.data_ptr() and u.shape == t.shape:
            return other
    return None


def unmapped_native_keys(adapter, model_state: dict[str, torch.Tensor],
                         allow: list[AllowedUnmapped]) -> tuple[list[Violation], list[str]]:
    """Native tensors that ``adapter.to_hf`` gives no HF name (each key probed alone).

    A key is fine if it maps, or is an alias of a tied tensor that maps, or matches the
    allow-list; returns (violations, allowed keys that were indeed unmapped)."""
    out, allowed_seen = [], []
    for key in sorted(model_state):
        produced = adapter.to_hf({key: model_state[key]})
        if produced:
            continue
        alias = _tied_alias(model_state, key)
        if alias is not None and adapter.to_hf({alias: model_state[alias]}):
            continue
        rule = is_allowed(key, allow)
        if rule is not None:
            allowed_seen.append(key)
            continue
        out.append(Violation("unmapped", key, "to_hf drops it: no HF tensor carries it, so a saved "
                                              "checkpoint loses it and a load leaves it at its init value"))
    return out, allowed_seen


def adapter_round_trip_violations(adapter, model_state: dict[str, torch.Tensor],
                                  allow: list[AllowedUnmapped]) -> list[Violation]:
    """``from_hf(to_hf(state))`` must give back every native tensor bit for bit (allow-listed
    keys excepted)."""
    hf = adapter.to_hf({k: v.detach().clone() for k, v in model_state.items()})
    back = adapter.from_hf(dict(hf))
    out = []
    for key in sorted(model_state):
        if key not in back:
            if is_allowed(key, allow):
                continue
            out.append(Violation("round trip", key, "missing after from_hf(to_hf(.))"))
            continue
        a, b = model_state[key].detach(), back[key].detach()
        if a.shape != b.shape:
            out.append(Violation("round trip", key, f"shape {tuple(a.shape)} -> {tuple(b.shape)}"))
        elif a.dtype != b.dtype:
            out.append(Violation("round trip", key, f"dtype {a.dtype} -> {b.dtype}"))
        elif not torch.equal(a, b):
            n = int((a != b).sum())
            out.append(Violation("round trip", key, f"{n}/{a.numel()} elements changed"))
    for key in sorted(set(back) - set(model_state)):
        out.append(Violation("round trip", key, "from_hf produced a key the model does not have"))
    return out


def hf_names_violations(adapter, model_state: dict[str, torch.Tensor], config_dir: str | Path) -> list[Violation]:
    """``to_hf`` output vs transformers' expected checkpoint for the config: names, shapes."""
    hf = adapter.to_hf({k: v.detach() for k, v in model_state.items()})
    expected = expected_hf_checkpoint(config_dir)
    out = []
    for key in sorted(set(expected) - set(hf)):
        out.append(Violation("to_hf missing", key, "transformers expects it; to_hf does not produce it"))
    for key in sorted(set(hf) - set(expected)):
        out.append(Violation("to_hf unexpected", key, "to_hf produces a name transformers does not use"))
    for key in sorted(set(hf) & set(expected)):
        if tuple(hf[key].shape) != expected[key][0]:
            out.append(Violation("to_hf shape", key,
                                 f"{tuple(hf[key].shape)}, transformers expects {expected[key][0]}"))
    return out




# --------------------------------------------------------------------------------------------
# torchtitan's save path, in one process
# --------------------------------------------------------------------------------------------

def save_like_trainer(model: torch.nn.Module, adapter, out_dir: str | Path) -> Path:
    """torchtitan ``dcp_save(to_hf=True)``: ``adapter.to_hf(model.state_dict())`` written by
    ``HuggingFaceStorageWriter`` (sharded per the adapter's ``fqn_to_index_mapping`` and
    consolidated, or a single consolidated file), as ``checkpoint.last_save_in_hf`` does."""
    import torch.distributed.checkpoint as dcp  # noqa: PLC0415  heavy: torch.distributed.checkpoint adds about 1 s over torch
    from torch.distributed.checkpoint import HuggingFaceStorageWriter  # noqa: PLC0415  heavy: torch.distributed.checkpoint adds about 1 s over torch

    out_dir = Path(out_dir)
    state = adapter.to_hf({k: v for k, v in model.state_dict().items()})
    mapping = adapter.fqn_to_index_mapping
    save_path = os.path.join(out_dir, "sharded") if mapping else str(out_dir)
    writer = HuggingFaceStorageWriter(path=save_path, save_distributed=True,
                                      fqn_to_index_mapping=mapping, enable_consolidation=not mapping)
    dcp.save(state, storage_writer=writer)
    if mapping:
        from torch.distributed.checkpoint._consolidate_hf_safetensors import (  # noqa: PLC0415  heavy: torch.distributed.checkpoint adds about 1 s over torch
            consolidate_safetensors_files_on_every_rank,
        )

        consolidate_safetensors_files_on_every_rank(input_dir=save_path, output_dir=str(out_dir),
                                                    fqn_to_index_mapping=mapping, num_threads=1)
    return out_dir


def tensor_equality_violations(directory: str | Path, expected: dict[str, torch.Tensor],
                               what: str = "saved") -> list[Violation]:
    """Every tensor in ``directory`` equals ``expected`` bit for bit (and none is missing)."""
    got = load_hf_tensors(directory)
    out = []
    for key in sorted(set(expected) - set(got)):
        out.append(Violation(what, key, "missing"))
    for key in sorted(set(got) & set(expected)):
        a, b = got[key], expected[key]
        if a.shape != b.shape:
            out.append(Violation(what, key, f"shape {tuple(a.shape)}, expected {tuple(b.shape)}"))
        elif a.dtype != b.dtype:
            out.append(Violation(what, key, f"dtype {a.dtype}, expected {b.dtype}"))
        elif not torch.equal(a, b):
            n = int((a != b).sum())
            if a.dim() == 2 and torch.equal(a, b.T.contiguous().reshape(b.shape)):
                # a square matrix transposed, or any 2-D tensor's elements in transposed order
                out.append(Violation(what, key, "transposed"))
            else:
                out.append(Violation(what, key, f"{n}/{a.numel()} elements differ "
                                                f"(max |d| {float((a.float() - b.float()).abs().max()):.3e})"))
    return out


def tied_embedding_violations(native_module, titan_written: set[str], hf_written: set[str]) -> list[str]:
    """Tied word embeddings, the native side: its ``lm_head.weight`` must be its
    ``tok_embeddings.weight`` (the same tensor), and torchtitan's save must write exactly the
    keys transformers' ``save_pretrained`` writes for the same tied model (``hf_written``)."""
    out = []
    if native_module.lm_head.weight is not native_module.tok_embeddings.weight:
        out.append("native lm_head.weight is not tok_embeddings.weight: two tensors (untied), "
                   "though the checkpoint ties them")
    if titan_written != hf_written:
        out.append(f"torchtitan's save writes other keys than save_pretrained: only torchtitan "
                   f"{sorted(titan_written - hf_written)}, only save_pretrained "
                   f"{sorted(hf_written - titan_written)}")
    return out
