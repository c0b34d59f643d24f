"""The model under test, one unit in memory at a time (forward, then backward).

The diagnosis compares the run's own model with the float64 reference module by module. At
full size (Qwen3-4B: 16 GB of fp32 parameters) that model is never held whole: it is built on
the meta device exactly as the trainer builds it, and walked one unit at a time
(harness/model/unit_walk.py: embedding, each decoder layer, final norm, lm_head):

- forward: each unit is materialised, its buffers initialised by the model's own
  ``init_states`` (RoPE cache, expert bias), its weights loaded from the run's HF checkpoint
  through the trainer's state-dict adapter (``to_hf`` names what to read, ``from_hf`` maps it
  back: the same mapping as the whole-model load), run on the previous unit's output with the
  masks and positions the model's own forward feeds it, and freed; only its input is kept;
- backward: from the loss back, each unit is materialised and loaded again, its forward
  recomputed from its saved input with grad, backwarded with the gradient its output received,
  and its parameter gradients recorded under HF names (the adapter's ``to_hf``); it is freed.

Live parameters are never more than one unit's (``peak_parameter_bytes`` records it). The
module outputs and output gradients the comparison reads are recorded by hooks
(harness/diagnosis/localize.py ``Recorder``) and handed to the comparison unit by unit, as
each unit is done (``forward(modules, visit)``, ``backward(modules, labels, visit)``): the
comparison runs the reference's same unit then and there, and nothing of a unit outlives its
step but its input.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from harness.diagnosis.errors import NotDiagnosable
from harness.diagnosis.localize import Recorder
from harness.model import build
from harness.model.unit_walk import free, live_parameter_bytes, materialise, model_units, parameter_bytes, run_layer
from harness.references.loss import avg_loss
from harness.references.model import WeightSource

EMBED = "model.embed_tokens.weight"


def native_on_meta(model_dir: Path, *, custom_ops: bool, attention: str):
    """torchtitan's native Qwen3 on the meta device as the trainer builds it (the config of
    harness/parity/models.py ``build_native``), and the trainer's HF state-dict adapter."""
    from torchtitan.models.qwen3 import Qwen3StateDictAdapter, model_registry  # noqa: PLC0415  heavy: torchtitan, for building a model alone

    from harness.parity.models import native_model_config, prepare_in_process  # noqa: PLC0415  heavy: torchtitan, for building a model alone

    prepare_in_process()
    config = native_model_config(model_dir, custom_ops=custom_ops, attention=attention)
    model = build.on_meta(build.trainer_config_for(build.with_model(model_registry("debugmodel"), config),
                                                   model_dir))
    model.eval()
    return model, Qwen3StateDictAdapter(config, str(model_dir))


def load_gaps(model: nn.Module, adapter) -> set[str]:
    """The native state entries the trainer's HF load would leave at their init: what
    ``from_hf(to_hf(state))`` does not produce, found on the meta model (no weights read)."""
    state = dict(model.state_dict())
    produced = adapter.from_hf(dict(adapter.to_hf(state)))
    return set(state) - set(produced)


class _Streamed:
    """What both streamed models share: the forward's record, the backward walk (each unit
    reloaded, rerun from its saved input with grad, backwarded with the gradient its output
    received, freed) and the memory numbers. A subclass says how its forward runs the units
    (``_forward(after)``: ``after(unit name)`` once each unit has run and been freed), how a
    unit reruns from its saved input (``_rerun``: (input, output)) and names its parameter
    gradients (``_hf_grads``)."""

    # -- what harness/diagnosis/localize.py first_divergence runs ----------------------------
    reference_unit: dict[str, str] = {}  # the model's unit name -> the reference's, where they differ
    not_rerun = ()  # units with no parameters and no trace modules (transformers' rotary_emb)

    def forward(self, modules, visit) -> None:
        """The forward, one unit in memory at a time; after each unit, ``visit(reference unit
        name, {trace name: output tensors})`` with its modules' outputs (a visit that raises
        stops the walk)."""
        with Recorder(modules) as recorder, torch.no_grad():
            self._forward(lambda name: visit(self.reference_unit.get(name, name), recorder.take()))

    def backward(self, modules, labels, visit) -> None:
        """Back from the run's loss on ``labels``, one unit in memory at a time; after each
        unit's backward, ``visit(reference unit name, {trace name: {slot: output gradient}},
        {HF name: parameter gradient}, the gradient w.r.t. the unit's input or None)``. A tied
        weight's gradient is visited once per use (the lm_head's, then the embedding's): the
        two sum to the model's."""
        grad = None
        for name, unit in reversed(self.walk.units):
            if name in self.not_rerun:
                continue
            self.load(name, unit)
            with Recorder(modules, grads=True) as recorder, torch.enable_grad():
                x, out = self._rerun(name, unit)
            out = out[0] if isinstance(out, tuple) else out
            with torch.enable_grad():
                (avg_loss(out, labels) if grad is None else out).backward(None if grad is None else grad)
            del out
            grad = x.grad if x.is_floating_point() else None
            hf_grads = self._hf_grads(name, unit)
            free(unit)
            visit(self.reference_unit.get(name, name), recorder.out_grads, hf_grads, grad)

    def memory(self) -> dict:
        """Parameter bytes: the most ever live at once, the largest unit's, the whole model's."""
        return {"peak_live_parameter_bytes": self.peak_parameter_bytes,
                "largest_unit_parameter_bytes": self.largest_unit_bytes,
                "model_parameter_bytes": self.model_parameter_bytes}


def _with_grad(x: torch.Tensor) -> torch.Tensor:
    return x.detach().requires_grad_(True) if x.is_floating_point() else x


class StreamedNative(_Streamed):
    """torchtitan's native Qwen3 (titan_native, nki_moe), streamed one unit at a time."""

    def __init__(self, model: nn.Module, adapter, weights: WeightSource, batch, *,
                 device: str = "cpu", fill=None, gap_grads=None) -> None:
        from torchtitan.models.common.attention import ScaledDotProductAttention  # noqa: PLC0415  heavy: torchtitan, for building a model alone

        self.model, self.adapter, self.weights, self.device = model, adapter, weights, device
        self.walk = model_units(model, "native")
        self.fill = fill  # fill(unit_name, unit): a known load gap completed from the checkpoint
        # gap_grads(unit_name, unit): {HF name: gradient} of what fill filled (to_hf names none)
        self.gap_grads = gap_grads
        row_causal = isinstance(model.layers["0"].attention.inner_attention,
                                ScaledDotProductAttention)
        # Trainer.post_dataloading_process: flex/varlen masks from positions; SDPA: no mask,
        # RoPE at row positions (as harness/parity/models.py build_native's logits_fn).
        self.batch = batch.masked_as("row_causal") if row_causal else batch
        self.inputs = self.batch.inputs.to(device)
        self.positions = self.batch.positions.to(device)
        self.masks = None if row_causal else model.get_attention_masks(positions=self.positions)
        self.saved: dict[str, torch.Tensor] = {}  # each unit's input, kept for the backward
        self.peak_parameter_bytes = 0
        self.largest_unit_bytes = max(parameter_bytes(u) for _, u in self.walk.units)
        self.model_parameter_bytes = sum(parameter_bytes(u) for _, u in self.walk.units) - (
            parameter_bytes(model.lm_head) if self.walk.tied else 0)

    # -- one unit in memory ------------------------------------------------------------------
    def _hf_names(self, name: str, unit: nn.Module) -> list[str]:
        state = {f"{name}.{k}": v for k, v in unit.state_dict().items()}
        keys = list(self.adapter.to_hf(state))
        if self.walk.tied and name == "lm_head":
            keys.append(EMBED)  # the adapter reads a tied lm_head from the embedding
        return keys

    def load(self, name: str, unit: nn.Module) -> None:
        materialise(unit, self.device)
        with torch.no_grad():
            unit.init_states(buffer_device=None)  # buffers (RoPE cache): the model's own init
        hf = {k: self.weights[k] for k in self._hf_names(name, unit)}
        if self.walk.tied and "lm_head.weight" not in hf and EMBED not in hf:
            # from_hf maps a tied model's lm_head from the embedding, and requires one of the
            # two; a unit that holds neither gets an empty stand-in (never loaded: not its key)
            hf["lm_head.weight"] = torch.empty(0, device="meta")
        native = self.adapter.from_hf(hf)
        prefix = name + "."
        own = {k[len(prefix):]: v for k, v in native.items() if k.startswith(prefix)}
        with torch.no_grad():
            unit.load_state_dict(own, strict=False)  # copy_ casts the float64 read to the model's dtype
        if self.fill is not None:
            self.fill(name, unit)
        self.peak_parameter_bytes = max(self.peak_parameter_bytes, live_parameter_bytes(self.model))

    def _run(self, name: str, unit: nn.Module, h: torch.Tensor) -> torch.Tensor:
        if name.startswith("layers."):
            return run_layer("native", unit, h, self.masks, self.positions)
        return unit(h)

    # -- the walks ---------------------------------------------------------------------------
    def _forward(self, after) -> None:
        h = self.inputs
        for name, unit in self.walk.units:
            self.load(name, unit)
            self.saved[name] = h.detach()
            h = self._run(name, unit, h)
            free(unit)
            after(name)

    def _rerun(self, name: str, unit: nn.Module):
        x = _with_grad(self.saved[name])
        return x, self._run(name, unit, x)

    def _hf_grads(self, name: str, unit: nn.Module) -> dict[str, torch.Tensor]:
        from harness.parity.models import with_grads_as_params  # noqa: PLC0415  heavy: torchtitan, for building a model alone

        # the unit's own state-dict hooks (fused QKV split) apply to gradients as to weights
        state = {f"{name}.{k}": v.detach()
                 for k, v in with_grads_as_params(unit).state_dict().items()}
        if self.walk.tied and name == "lm_head":
            return {EMBED: state["lm_head.weight"]}  # the tied weight's gradient sums both uses
        grads = dict(self.adapter.to_hf(state))
        return grads | self.gap_grads(name, unit) if self.gap_grads is not None else grads


def known_gaps_report(model: nn.Module, adapter):
    """What ``native_keys_not_loaded_kinds`` reads (a load report), from ``load_gaps``."""
    return SimpleNamespace(load_report=SimpleNamespace(native_keys_not_loaded=load_gaps(model, adapter)))


def hf_backend_on_meta(model_dir: Path, configure=None):
    """torchtitan's transformers-backend model on the meta device, as the trainer builds it
    (the config and patches of harness/parity/models.py ``build_hf_backend``)."""
    from harness.parity.models import hf_backend_config  # noqa: PLC0415  heavy: torchtitan, for building a model alone

    trainer_config, _api = hf_backend_config(model_dir, configure)
    model = build.on_meta(trainer_config, updated=True)
    model.eval()
    return model


class StreamedHF(_Streamed):
    """torchtitan's transformers backend (hf_v5), streamed one unit at a time.

    The forward is the model's own (``HFTransformerModel.forward`` -> transformers'
    ``Qwen3Model.forward``: its masks, positions and RoPE): a pre-hook on each unit
    materialises and loads it and keeps its inputs, a hook frees it. The rotary embedding
    (no parameters) stays materialised, its ``inv_freq`` recomputed (``rope_init``, the
    ``hf_rope_init`` workaround's code: the run's own table was uninitialised memory). The
    weights are read by the HF model's own parameter names, which are the checkpoint's."""

    def __init__(self, model: nn.Module, weights: WeightSource, batch, *, rope_init,
                 device: str = "cpu") -> None:
        self.model, self.weights, self.device = model, weights, device
        self.walk = model_units(model, "hf")
        self.inputs = batch.inputs.to(device)
        self.positions = batch.positions.to(device)
        self.saved: dict[str, tuple] = {}  # each unit's (args, kwargs), kept for the backward
        self.prefix = {name: self._prefix(name) for name, _ in self.walk.units}
        rotary = self.walk.module["rotary_emb"]
        materialise(rotary, device)
        rope_init(rotary)
        self.peak_parameter_bytes = 0
        self.largest_unit_bytes = max(parameter_bytes(u) for _, u in self.walk.units)
        self.model_parameter_bytes = sum(parameter_bytes(u) for _, u in self.walk.units) - (
            parameter_bytes(model.model.lm_head) if self.walk.tied else 0)

    def _prefix(self, name: str) -> str:
        return "lm_head." if name == "lm_head" else f"model.{name}."

    def load(self, name: str, unit: nn.Module) -> None:
        materialise(unit, self.device)
        state = {}
        for key, _p in unit.named_parameters():
            hf = self.prefix[name] + key
            if hf not in self.weights.keys() and self.walk.tied and hf == "lm_head.weight":
                hf = EMBED
            if hf not in self.weights.keys():
                raise NotDiagnosable(f"{hf}: the streamed transformers backend reads weights by "
                                     f"the HF model's names, and the checkpoint has no such tensor")
            state[key] = self.weights[hf]
        with torch.no_grad():
            unit.load_state_dict(state, strict=False)
        self.peak_parameter_bytes = max(self.peak_parameter_bytes, live_parameter_bytes(self.model))

    reference_unit = {"embed_tokens": "tok_embeddings"}
    not_rerun = ("rotary_emb",)

    def _forward(self, after) -> None:
        handles = []
        for name, unit in self.walk.units:
            if name in self.not_rerun:
                continue

            def before(mod, args, kwargs, name=name):
                self.load(name, mod)
                self.saved[name] = (args, kwargs)

            def done(mod, _inputs, _output, name=name):
                free(mod)
                after(name)

            handles.append(unit.register_forward_pre_hook(before, with_kwargs=True))
            handles.append(unit.register_forward_hook(done))
        try:
            self.model(self.inputs, positions=self.positions)
        finally:
            for h in handles:
                h.remove()

    def _rerun(self, name: str, unit: nn.Module):
        args, kwargs = self.saved[name]
        x = _with_grad(args[0] if args else kwargs.get("hidden_states", kwargs.get("input")))
        args = (x, *args[1:]) if args else args
        return x, unit(*args, **kwargs)

    def _hf_grads(self, name: str, unit: nn.Module) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for key, p in unit.named_parameters():
            hf = self.prefix[name] + key
            hf = EMBED if self.walk.tied and hf == "lm_head.weight" else hf
            g = (p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone()
            out[hf] = out[hf] + g if hf in out else g
        return out
