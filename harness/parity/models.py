"""The models under comparison, built in-process from one HF checkpoint directory.

Every model is wrapped in a :class:`ParityModel` with one interface: ``logits(batch)``, the
modules whose outputs are the canonical activations (``embed``, ``layers.{i}.attn``,
``layers.{i}.mlp``, ``layers.{i}``, ``norm``, ``logits``), its tensors under HF on-disk names
(``hf_tensors("param" | "grad")``) and a dict of settings that is printed on a mismatch.

- :func:`load_hf` -- transformers' ``Qwen3ForCausalLM`` / ``Qwen3MoeForCausalLM`` via
  ``from_pretrained`` (its loading report is kept).
- :func:`build_native` -- torchtitan's ``Qwen3Model`` built the way the trainer builds it
  (``update_from_config`` with a ``Trainer.Config``, meta device, ``to_empty``,
  ``init_weights``) and loaded the way the trainer's ``initial_load_in_hf`` loads it
  (``to_hf`` of the model's state dict as the request, ``dcp.load`` through the adapter's
  ``HuggingFaceStorageReader``, ``from_hf``, non-strict ``load_state_dict``).
  ``custom_ops=True`` gives the ``nki_moe`` backend's model (``harness.kernels.ops.use_custom_ops``).
- :func:`build_hf_backend` -- torchtitan's transformers-backend ``HFTransformerModel``, the
  same way (it builds without a process group: FSDP/TP are applied by ``parallelize_fn``,
  which is not needed for one process).
- :func:`reference_model` -- :mod:`harness.references.model` on the checkpoint's tensors.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed.checkpoint as dcp
from safetensors import safe_open
from torch import nn
from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.components.tokenizer import HuggingFaceTokenizer
from torchtitan.models.common.attention import ScaledDotProductAttention
from torchtitan.models.qwen3 import Qwen3StateDictAdapter, model_registry

from harness.backends.native_qwen3 import native_config_from_hf
from harness.kernels.ops import use_custom_ops
from harness.model import build
from harness.model.build import seed_everything  # noqa: F401  (the parity suites seed through it)
from harness.parity import settings as effective
from harness.parity.env import prepare_in_process
from harness.references import model as reference
from harness.references.batch import Batch
from harness.references.loss import avg_loss
from harness.registry import paths
from harness.registry.hf_config import Qwen3Arch, normalized_hf_dict
from harness.upstream import hf_masking, titan_api


def dataloader_batches(model_dir: str | Path, steps: int, dp: int = 1, local_batch_size: int = 2,
                       seq_len: int = 256, dataset: str = "c4_test",
                       dataset_path: str | Path = paths.CORPUS) -> list[list[Batch]]:
    """``[step][dp rank]`` batches from torchtitan's own tokenizer and dataloader, as the
    trainer builds them (tokenizer from the HF assets dir; ``dataset``: torchtitan's dataset
    name, read from ``dataset_path``: ``c4_test`` on fixtures/corpus by default, ``c4`` on a
    local C4 copy)."""
    prepare_in_process()

    tokenizer = HuggingFaceTokenizer(tokenizer_path=str(model_dir))
    loader_class = titan_api.HuggingFaceTextDataLoader
    config = loader_class.Config(dataset=dataset, dataset_path=str(dataset_path))
    per_rank = []
    for rank in range(dp):
        loader = loader_class(config, dp_world_size=dp, dp_rank=rank, tokenizer=tokenizer,
                              seq_len=seq_len, local_batch_size=local_batch_size)
        it = iter(loader)
        rows = []
        for _ in range(steps):
            rows.append(Batch.from_loader(*next(it)))
        per_rank.append(rows)
    return [[per_rank[r][s] for r in range(dp)] for s in range(steps)]


def _first_tensor(output):
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        return next(o for o in output if isinstance(o, torch.Tensor))
    if hasattr(output, "last_hidden_state"):
        return output.last_hidden_state
    raise TypeError(f"no tensor in module output of type {type(output).__name__}")


def with_grads_as_params(module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose parameters hold its gradients (zeros where there is none),
    so the model's own state-dict hooks (fused-QKV split, tying) and converters apply to
    gradients exactly as they apply to weights."""
    clone = copy.deepcopy(module)
    grads = {name: p.grad for name, p in module.named_parameters(remove_duplicate=False)}
    with torch.no_grad():
        for name, p in clone.named_parameters(remove_duplicate=False):
            g = grads.get(name)
            p.copy_(torch.zeros_like(p) if g is None else g)
            p.grad = None
    return clone


@dataclass
class ParityModel:
    name: str
    kind: str  # "hf" | "native" | "hf_backend" | "reference"
    module: nn.Module | None
    arch: Qwen3Arch
    logits_fn: Callable[[Batch], torch.Tensor]
    activation_modules: dict[str, nn.Module] = field(default_factory=dict)
    router_modules: dict[str, nn.Module] = field(default_factory=dict)
    to_hf_fn: Callable[[nn.Module], dict[str, torch.Tensor]] | None = None
    settings: dict = field(default_factory=dict)
    load_report: object | None = None

    def logits(self, batch: Batch) -> torch.Tensor:
        return self.logits_fn(batch)

    def loss(self, batch: Batch) -> torch.Tensor:
        return avg_loss(self.logits(batch), batch.labels)

    def hf_tensors(self, which: str = "param") -> dict[str, torch.Tensor]:
        """Parameters (or their gradients) under HF on-disk names."""
        if self.to_hf_fn is None:
            raise NotImplementedError(f"{self.name}: no HF name mapping")
        source = self.module if which == "param" else with_grads_as_params(self.module)
        return {k: v.detach() for k, v in self.to_hf_fn(source).items()}

    def zero_grad(self) -> None:
        if self.module is not None:
            self.module.zero_grad(set_to_none=True)

    def record_activations(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(logits, {canonical activation name: output}) via forward hooks."""
        if self.kind == "reference":
            with torch.no_grad():
                logits = self.logits(batch)
            record = self.last_record  # type: ignore[attr-defined]
            return logits, {k: v.detach() for k, v in record.items()}
        acts: dict[str, torch.Tensor] = {}
        handles = []
        for name, mod in self.activation_modules.items():
            def hook(_m, _inp, out, name=name):
                acts[name] = _first_tensor(out).detach()
            handles.append(mod.register_forward_hook(hook))
        for name, mod in self.router_modules.items():
            def router_hook(_m, _inp, out, name=name):
                acts[name] = self._router_ids(out).detach()
            handles.append(mod.register_forward_hook(router_hook))
        try:
            with torch.no_grad():
                logits = self.logits(batch)
        finally:
            for h in handles:
                h.remove()
        silent = sorted(n for n in (*self.activation_modules, *self.router_modules) if n not in acts)
        if silent:  # a hooked module the forward never ran: its comparison would vanish
            raise RuntimeError(f"{self.name}: modules registered for comparison did not run: {silent}")
        acts["logits"] = logits.detach()
        return logits, acts

    def _router_ids(self, out) -> torch.Tensor:
        # torchtitan router: (topk_scores, topk_ids, scores); HF Qwen3MoeTopKRouter:
        # (router_logits, router_scores, router_indices). Ids are the integer tensor.
        ints = [o for o in out if isinstance(o, torch.Tensor) and not o.is_floating_point()]
        ids = ints[0]
        return ids.reshape(-1, ids.shape[-1])


# --------------------------------------------------------------------------------------------
# transformers
# --------------------------------------------------------------------------------------------

def hf_state_to_disk_names(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What ``save_pretrained`` would write for ``state``: tied aliases removed, transformers'
    weight conversions (e.g. fused MoE experts -> per-expert tensors) reverted."""
    from transformers.core_model_loading import revert_weight_conversion  # noqa: PLC0415  heavy: transformers; the native models load without it
    from transformers.modeling_utils import remove_tied_weights_from_state_dict  # noqa: PLC0415  heavy: transformers; the native models load without it

    state = remove_tied_weights_from_state_dict(dict(state), model)
    return revert_weight_conversion(model, state)


def _hf_to_disk(model: nn.Module) -> dict[str, torch.Tensor]:
    return hf_state_to_disk_names(model, model.state_dict())


def _hf_activation_modules(base: nn.Module, lm_head: nn.Module, arch: Qwen3Arch):
    layers = base.layers
    get = (lambda i: layers[str(i)]) if isinstance(layers, nn.ModuleDict) else (lambda i: layers[i])
    mods: dict[str, nn.Module] = {"embed": base.embed_tokens}
    routers: dict[str, nn.Module] = {}
    for i in range(arch.num_hidden_layers):
        layer = get(i)
        mods[f"layers.{i}.attn"] = layer.self_attn
        mods[f"layers.{i}.mlp"] = layer.mlp
        mods[f"layers.{i}"] = layer
        if arch.layer_is_moe(i):
            gate = getattr(layer.mlp, "gate", None)
            if not isinstance(gate, nn.Module):
                raise AttributeError(
                    f"MoE layer {i} ({type(layer.mlp).__name__}) has no router module `.gate`: the "
                    f"harness cannot record its expert choices (transformers renamed it?); update "
                    f"harness/parity/models.py _hf_activation_modules")
            routers[f"layers.{i}.mlp.router_top_ids"] = gate
    mods["norm"] = base.norm
    return mods, routers


def load_hf(model_dir: str | Path, *, dtype: torch.dtype = torch.float32,
            attn_implementation: str | None = None, mask: str = "document") -> ParityModel:
    """transformers' model of ``model_dir``. ``mask``: how it masks a packed row whose
    positions restart at each document: "document" (causal within each document: transformers'
    packed-sequence detection, no attention_mask) or "causal" (causal over the whole row at
    those positions: an all-ones attention_mask turns the detection off; 0.3.0's transformers
    backend, known issue hf_v5-causal-mask-across-documents)."""
    if mask not in ("document", "causal"):
        raise ValueError(f"load_hf: mask {mask!r} is not one of document, causal (row_causal is "
                         f"a batch's form: Batch.masked_as)")
    prepare_in_process()
    import transformers  # noqa: PLC0415  order: after prepare_in_process's shims and offline Hub

    kwargs = {"dtype": dtype, "output_loading_info": True}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    model, info = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), **kwargs)
    model.eval()
    arch = Qwen3Arch.from_dir(model_dir)

    def logits_fn(batch: Batch) -> torch.Tensor:
        return model(input_ids=batch.inputs, position_ids=batch.positions,
                     attention_mask=hf_masking.attention_mask(batch.inputs, mask), use_cache=False).logits

    mods, routers = _hf_activation_modules(model.model, model.lm_head, arch)
    model_settings = effective.hf_settings(
        model, attn_mask=effective.DOCUMENT_CAUSAL if mask == "document" else "causal")
    model_settings["dtype"] = str(dtype)
    return ParityModel(
        name=f"hf:{type(model).__name__}", kind="hf", module=model, arch=arch, logits_fn=logits_fn,
        activation_modules=mods, router_modules=routers, to_hf_fn=_hf_to_disk,
        settings=model_settings, load_report={k: sorted(v) if isinstance(v, (set, list)) else v
                                        for k, v in info.items()},
    )


# --------------------------------------------------------------------------------------------
# torchtitan native
# --------------------------------------------------------------------------------------------

@dataclass
class HFLoadReport:
    """What the trainer's ``initial_load_in_hf`` path read, produced and left untouched."""

    file_keys: set[str]  # every tensor in the checkpoint dir
    requested_hf_keys: set[str]  # adapter.to_hf(model.state_dict()): what dcp.load asked for
    native_keys: set[str]  # model.state_dict() keys
    produced_native_keys: set[str]  # adapter.from_hf(...) output keys
    missing_on_load: list[str]  # load_state_dict(strict=False) report
    unexpected_on_load: list[str]
    error: str | None = None  # the load raised (``Type: message``): nothing was loaded

    @property
    def unread_file_keys(self) -> set[str]:
        """Tensors in the checkpoint no native parameter asked for (silently ignored)."""
        return self.file_keys - self.requested_hf_keys

    @property
    def native_keys_not_loaded(self) -> set[str]:
        """Native state entries the load did not write (they keep their initial values)."""
        return self.native_keys - self.produced_native_keys


def checkpoint_keys(model_dir: str | Path) -> set[str]:
    keys: set[str] = set()
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            keys |= set(f.keys())
    return keys


def load_hf_checkpoint_like_trainer(model: nn.Module, adapter, model_dir: str | Path) -> HFLoadReport:
    """torchtitan's ``dcp_load(from_hf=True)``, step for step, on one process."""
    state = {k: v for k, v in model.state_dict().items()}
    native_keys = set(state)
    hf_state = adapter.to_hf(state)
    requested = set(hf_state)
    dcp.load(hf_state, storage_reader=adapter.get_hf_storage_reader(str(model_dir)))
    native_state = adapter.from_hf(hf_state)
    result = model.load_state_dict(native_state, strict=False)
    return HFLoadReport(
        file_keys=checkpoint_keys(model_dir), requested_hf_keys=requested,
        native_keys=native_keys, produced_native_keys=set(native_state),
        missing_on_load=list(result.missing_keys), unexpected_on_load=list(result.unexpected_keys),
    )


def hf_load_refused_like_trainer(model: nn.Module, model_dir: str | Path) -> HFLoadReport:
    """The trainer's ``initial_load_in_hf`` for a model spec without a state-dict adapter:
    torchtitan's own ``CheckpointManager.dcp_load(from_hf=True)``, run on a checkpointer that
    holds no adapter (as the trainer's does), and the error it raises recorded."""
    checkpointer = SimpleNamespace(sd_adapter=None, states={"model": model})
    try:
        CheckpointManager.dcp_load(checkpointer, dict(model.state_dict()),
                                   checkpoint_id=str(model_dir), from_hf=True, from_quantized=False)
    except Exception as error:
        message = f"{type(error).__name__}: {error}"
    else:
        message = None
    keys = set(model.state_dict())
    return HFLoadReport(file_keys=checkpoint_keys(model_dir), requested_hf_keys=set(),
                        native_keys=keys, produced_native_keys=set(), missing_on_load=sorted(keys),
                        unexpected_on_load=[], error=message or "no adapter, yet dcp_load passed")


def native_model_config(model_dir: str | Path, *, custom_ops: bool = False, attention: str = "flex"):
    """torchtitan ``Qwen3Model.Config`` for the checkpoint's shape (harness.backends helper),
    with attention backend ``attention`` ("flex": per-document mask; "sdpa": causal over the
    row, as the source's configurations)."""
    config = native_config_from_hf(normalized_hf_dict(model_dir), attention)
    if custom_ops:
        config = use_custom_ops(config)
    return config


def _native_activation_modules(model: nn.Module, arch: Qwen3Arch):
    mods: dict[str, nn.Module] = {"embed": model.tok_embeddings}
    routers: dict[str, nn.Module] = {}
    for i in range(arch.num_hidden_layers):
        layer = model.layers[str(i)]
        mods[f"layers.{i}.attn"] = layer.attention
        ffn = layer.moe if getattr(layer, "moe_enabled", False) else layer.feed_forward
        mods[f"layers.{i}.mlp"] = ffn
        mods[f"layers.{i}"] = layer
        if getattr(layer, "moe_enabled", False):
            routers[f"layers.{i}.mlp.router_top_ids"] = layer.moe.router
    mods["norm"] = model.norm
    return mods, routers


def build_native(model_dir: str | Path, *, custom_ops: bool = False, seed: int = 0,
                 model_config=None, adapter_factory: Callable | None = None,
                 attention: str = "flex") -> ParityModel:
    """``adapter_factory(model_config, model_dir) -> adapter`` replaces torchtitan's
    ``Qwen3StateDictAdapter`` (the self-tests plant broken adapters this way). ``attention``
    (when ``model_config`` is not given): "flex" or "sdpa"; a model with SDPA attention is fed
    as the trainer feeds it: no mask, RoPE at row positions (``Batch.masked_as("row_causal")``)."""
    prepare_in_process()

    arch = Qwen3Arch.from_dir(model_dir)
    config = model_config if model_config is not None else native_model_config(
        model_dir, custom_ops=custom_ops, attention=attention)
    trainer_config = build.trainer_config_for(build.with_model(model_registry("debugmodel"), config),
                                              model_dir)
    model = build.initialised(trainer_config, seed)
    make_adapter = adapter_factory or (lambda cfg, d: Qwen3StateDictAdapter(cfg, str(d)))
    adapter = make_adapter(config, model_dir)
    report = load_hf_checkpoint_like_trainer(model, adapter, model_dir)
    model.eval()

    row_causal = isinstance(model.layers["0"].attention.inner_attention, ScaledDotProductAttention)

    def logits_fn(batch: Batch) -> torch.Tensor:
        # Trainer.post_dataloading_process: masks from positions for flex/varlen attention;
        # for SDPA (spring-2026 "causal"), no mask and RoPE at row positions.
        if row_causal:
            batch = batch.masked_as("row_causal")
            return model(batch.inputs, positions=batch.positions, attention_masks=None)
        masks = model.get_attention_masks(positions=batch.positions)
        return model(batch.inputs, positions=batch.positions, attention_masks=masks)

    def to_hf(module: nn.Module) -> dict[str, torch.Tensor]:
        return adapter.to_hf(dict(module.state_dict()))

    mods, routers = _native_activation_modules(model, arch)
    name = ("native+custom_ops" if custom_ops else "native") + ("[sdpa]" if row_causal else "")
    parity = ParityModel(name=name, kind="native", module=model, arch=arch, logits_fn=logits_fn,
                         activation_modules=mods, router_modules=routers, to_hf_fn=to_hf,
                         settings=effective.native_settings(
                             model, **({"attn_mask": "row_causal (sdpa)"} if row_causal else {})),
                         load_report=report)
    parity.adapter = adapter  # type: ignore[attr-defined]
    parity.model_config = config  # type: ignore[attr-defined]
    parity.trainer_config = trainer_config  # type: ignore[attr-defined]
    return parity


# --------------------------------------------------------------------------------------------
# torchtitan transformers backend
# --------------------------------------------------------------------------------------------

def hf_backend_config(model_dir: str | Path, configure: Callable | None = None):
    """(the transformers backend's ``Trainer.Config`` for ``model_dir``, its model config
    updated from it as the trainer updates it and adjusted by ``configure``;
    ``titan_api.transformers_backend()``)."""
    prepare_in_process()

    api = titan_api.transformers_backend()
    # model_registry returns one shared config object: copy it, or update_from_config and
    # ``configure`` (a workaround) would leak into every later build in this process.
    spec = copy.deepcopy(api.model_registry("full"))
    config = spec.model
    trainer_config = build.trainer_config_for(spec, model_dir, api.TransformersBackendConfig)
    trainer_config.hf_model = str(model_dir)
    config.update_from_config(config=trainer_config)
    if configure is not None:
        configure(config)
    return trainer_config, api


def build_hf_backend(model_dir: str | Path, *, seed: int = 0,
                     configure: Callable | None = None) -> ParityModel:
    """torchtitan's transformers-backend model, built and loaded like the trainer does.

    ``HFTransformerModel.__init__`` monkey-patches transformers globally
    (``PreTrainedModel._init_weights`` / ``_initialize_weights`` and the decoder layer's
    ``__init__``); they are restored once the model is initialised so other models built in
    this process are unaffected. ``configure(model_config)`` may adjust the config after
    ``update_from_config`` (the trainer's override hook point).

    Where the generation's backend has no HF state-dict adapter
    (``titan_api.transformers_backend().state_dict_adapter is None``), the trainer's load is
    refused (``load_report.error``, judged by the load test against the known issue), and the
    weights are copied into the inner HF model from transformers' own load of the same
    checkpoint, so that everything else about the backend's model stays compared.
    """
    trainer_config, api = hf_backend_config(model_dir, configure)
    config = trainer_config.model_spec.model
    arch = Qwen3Arch.from_dir(model_dir)
    model = build.initialised(trainer_config, seed, updated=True)
    if api.state_dict_adapter is not None:
        report = load_hf_checkpoint_like_trainer(
            model, api.state_dict_adapter(config, str(model_dir)), model_dir)
    else:
        report = hf_load_refused_like_trainer(model, model_dir)
        _copy_weights_by_hf_names(model.model, model_dir)
    model.eval()

    def logits_fn(batch: Batch) -> torch.Tensor:
        return model(batch.inputs, positions=batch.positions)

    def to_hf(module: nn.Module) -> dict[str, torch.Tensor]:
        inner = module.model  # the HF ForCausalLM
        return hf_state_to_disk_names(inner, inner.state_dict())

    mods, routers = _hf_activation_modules(model.model.model, model.model.lm_head, arch)
    mask = getattr(model.model.config, "attn_mask_type", "causal")
    model_settings = effective.hf_settings(
        model.model, attn_mask=effective.DOCUMENT_CAUSAL if mask == "block_causal" else mask)
    parity = ParityModel(name="hf_backend", kind="hf_backend", module=model, arch=arch,
                         logits_fn=logits_fn, activation_modules=mods, router_modules=routers,
                         to_hf_fn=to_hf, settings=model_settings, load_report=report)
    parity.model_config = config  # type: ignore[attr-defined]
    return parity


def _copy_weights_by_hf_names(inner: nn.Module, model_dir: str | Path) -> None:
    """Every tensor of transformers' own load of ``model_dir`` into ``inner`` (the backend's HF
    model, the same class), strictly: a key missing on either side is an error."""
    import transformers  # noqa: PLC0415  heavy: transformers; the native models load without it

    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    result = inner.load_state_dict(loaded.state_dict(), strict=True)
    del loaded, result


# --------------------------------------------------------------------------------------------
# independent reference
# --------------------------------------------------------------------------------------------

class _ReferenceModule(nn.Module):
    def __init__(self, tensors: dict[str, torch.Tensor]):
        super().__init__()
        self.keys = sorted(tensors)
        self.params = nn.ParameterList(nn.Parameter(tensors[k].float().clone()) for k in self.keys)

    def weights(self) -> dict[str, torch.Tensor]:
        return dict(zip(self.keys, self.params, strict=True))


def reference_model(model_dir: str | Path, *, expert_dtype: torch.dtype | None = None,
                    document_mask: bool = True) -> ParityModel:
    arch = Qwen3Arch.from_dir(model_dir)
    module = _ReferenceModule(reference.load_hf_tensors(model_dir))
    last_record: dict = {}

    def logits_fn(batch: Batch) -> torch.Tensor:
        last_record.clear()
        return reference.forward(module.weights(), arch, batch.inputs, batch.positions,
                                 document_mask=document_mask, expert_dtype=expert_dtype,
                                 record=last_record)

    def to_hf(mod: nn.Module) -> dict[str, torch.Tensor]:
        return dict(mod.weights())

    parity = ParityModel(
        name="reference" + (f"[experts {expert_dtype}]" if expert_dtype else ""), kind="reference",
        module=module, arch=arch, logits_fn=logits_fn, to_hf_fn=to_hf,
        settings={**effective.arch_settings(arch),
                  "attention_mask": effective.DOCUMENT_CAUSAL if document_mask else "causal",
                  "expert_dtype": str(expert_dtype)},
    )
    parity.last_record = last_record  # type: ignore[attr-defined]
    return parity
