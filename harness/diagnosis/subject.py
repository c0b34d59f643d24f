"""What the diagnosis runs: the run's own model, starting weights and first batch.

- the model: the backend's model built as the trainer builds it, with the run's plants applied
  while it is built and run, on the run's device. torchtitan's native Qwen3 (titan_native,
  nki_moe with its custom operators) and its transformers backend (hf_v5) are built on the
  meta device and streamed one unit at a time at every size (harness/diagnosis/streamed.py),
  so one unit's parameters are all the model ever holds;
- the weights: the HF weights a pretrained run loads, or the step-0 weights the ranks of a
  random-init run dumped (harness/diagnosis/rank_dump.py);
- the batch: rank 0's first batch as the ranks dumped it, else as torchtitan's own dataloader
  makes it from the run's tokenizer (the same code, the same seed-free order).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

import torch

from harness.diagnosis import rank_dump, streamed
from harness.diagnosis.errors import NotDiagnosable
from harness.diagnosis.localize import hf_modules
from harness.parity.compare import native_keys_not_loaded_kinds
from harness.plants import planted
from harness.references.batch import load_batches
from harness.references.model import WeightSource
from harness.registry import dump_layout, known_issues
from harness.registry.hf_config import Qwen3Arch
from harness.upstream import workarounds as W
from harness.upstream.hf_rope_init import _recompute_inv_freq

# The backends whose model the diagnosis can rebuild in-process, and how: torchtitan's native
# Qwen3 (with the harness's custom operators for nki_moe), or its transformers backend.
NATIVE_BUILDS = {"titan_native": {"custom_ops": False}, "nki_moe": {"custom_ops": True},
                 "hf_v5": {"transformers_backend": True}}


@dataclass
class Subject:
    module: torch.nn.Module
    run: object  # the whole model (stream=False): one forward on the batch
    weights: WeightSource
    arch: object
    inputs: torch.Tensor
    positions: torch.Tensor
    mask: str  # the reference's mask: "document" or "causal"
    regime: str
    weights_from: str
    batch_from: str
    known: list[str] = field(default_factory=list)  # known issues the run's model shows, by name
    modules: dict | None = None  # {trace name: (model's name, modules)}; None: native names
    labels: torch.Tensor | None = None  # the batch's labels (the gradient comparison's loss)
    model_grads: object = None  # the whole model: its parameter gradients under HF names
    under_test: object = None  # the streamed model (harness/diagnosis/streamed.py); None: whole


def _first_batch(run_dir: Path, tokenizer_dir: Path, nproc: int):
    from harness.parity.models import dataloader_batches  # noqa: PLC0415  heavy: torchtitan; diagnose reads NATIVE_BUILDS without it

    try:
        return load_batches(run_dir)[0], "rank 0's dump"
    except FileNotFoundError:  # no dump: the rows torchtitan's dataloader gives rank 0
        batch = dataloader_batches(tokenizer_dir, steps=1, dp=nproc)[0][0]
        return batch, f"torchtitan's dataloader on {tokenizer_dir} (rank 0 of {nproc})"


def build(backend: str, attention: str, model_dir: Path, weights_dir: Path | None,
          run_dir: Path, nproc: int, device: str = "cpu", plants: tuple[str, ...] = (),
          regime: str = "float32", workarounds: tuple[str, ...] = (),
          gradients: bool = True, stream: bool = True) -> tuple[Subject, contextlib.ExitStack]:
    """The run's model with the run's plants (and workarounds) in force (the returned stack
    undoes the plants). ``stream``: the model is streamed one unit at a time (the diagnosis's
    only way); False builds it whole (``Subject.run``, ``model_grads``; no ``under_test``),
    only for the test that the streamed model computes what the whole model computes."""
    if backend not in NATIVE_BUILDS:
        raise NotDiagnosable(f"backend {backend!r}: the diagnosis rebuilds only "
                             f"{sorted(NATIVE_BUILDS)} in-process")

    stack = contextlib.ExitStack()
    stack.enter_context(planted(*plants))
    dumped = dump_layout.initial_weights_dir(run_dir)
    if weights_dir is None and dumped is None:
        stack.close()
        raise NotDiagnosable(f"random init, and no step-0 weights dumped under {run_dir}")
    try:
        source = weights_dir if weights_dir is not None else rank_dump.hf_weights_from_dump(dumped, model_dir)
        batch, batch_from = _first_batch(run_dir, model_dir, nproc)
        weights_from = (str(source) if weights_dir is not None
                        else f"the ranks' step-0 weights ({dumped})")
        native = not NATIVE_BUILDS[backend].get("transformers_backend")
        if native and stream:
            subject = _streamed_native(backend, attention, Path(source), model_dir, batch, device,
                                       regime, gradients, weights_from, batch_from)
            return subject, stack
        if stream:
            subject = _streamed_transformers_backend(Path(source), tuple(workarounds), model_dir,
                                                     batch, device, regime, gradients,
                                                     weights_from, batch_from)
            return subject, stack
        if native:
            from harness.parity.models import build_native  # noqa: PLC0415  heavy: torchtitan; diagnose reads NATIVE_BUILDS without it

            parity = build_native(source, attention=attention, **NATIVE_BUILDS[backend])
            kinds = gaps = native_keys_not_loaded_kinds(parity)
            known, modules = known_load_gap_issues(kinds), None
            if kinds:
                _fill_experts(parity.module, WeightSource(source), kinds)
            # native sdpa: causal over the row at row positions; flex: per document
            mask = "row_causal" if attention == "sdpa" else "document"
        else:
            parity, known, modules, mask = _transformers_backend(Path(source), tuple(workarounds))
            gaps = ()
    except Exception:
        stack.close()
        raise
    model = parity.module.to(device)
    device_batch = type(batch)(batch.inputs.to(device), batch.positions.to(device),
                               batch.labels.to(device))
    seen, ref_mask = reference_form(batch, mask)
    subject = Subject(model, lambda: parity.logits(device_batch), WeightSource(source),
                      Qwen3Arch.from_dir(model_dir), seen.inputs, seen.positions, ref_mask,
                      regime, weights_from, batch_from, known, modules,
                      batch.labels if gradients else None,
                      (lambda: parity.hf_tensors("grad") | _expert_grads(model, gaps, ""))
                      if gradients else None)
    return subject, stack


def _streamed_native(backend: str, attention: str, source: Path, model_dir: Path, batch,
                     device: str, regime: str, gradients: bool, weights_from: str,
                     batch_from: str) -> Subject:
    """torchtitan's native Qwen3 on the meta device, streamed one unit at a time
    (harness/diagnosis/streamed.py), at every size: the CPU tier's tiny runs walk the path the
    full-size runs walk."""
    model, adapter = streamed.native_on_meta(source, custom_ops=NATIVE_BUILDS[backend]["custom_ops"],
                                             attention=attention)
    weights = WeightSource(source)
    kinds = native_keys_not_loaded_kinds(streamed.known_gaps_report(model, adapter))
    known = known_load_gap_issues(kinds)
    fill = gap_grads = None
    if kinds:
        def fill(name, unit):
            _fill_experts(unit, weights, kinds, prefix=name + ".")

        def gap_grads(name, unit):
            return _expert_grads(unit, kinds, prefix=name + ".")
    runner = streamed.StreamedNative(model, adapter, weights, batch, device=device, fill=fill,
                                     gap_grads=gap_grads)
    if known:
        known = [line + " (streamed: filled as each layer is loaded)" for line in known]
    # native sdpa: causal over the row at row positions; flex: per document
    seen, ref_mask = reference_form(batch, "row_causal" if attention == "sdpa" else "document")
    return Subject(model, None, weights, Qwen3Arch.from_dir(model_dir), seen.inputs,
                   seen.positions, ref_mask, regime, weights_from, batch_from, known, None,
                   batch.labels if gradients else None, None, runner)


def reference_form(batch, mask: str):
    """(the batch as the reference trace sees it, the trace's mask) for a model that masks as
    ``mask``: "document" (causal within each document, per-document positions), "causal"
    (causal over the packed row, per-document positions: 0.3.0's transformers backend) or
    "row_causal" (causal over the row at row positions: native sdpa, spring's backend)."""
    if mask == "document":
        return batch, "document"
    if mask == "causal":
        return batch, "causal"
    if mask == "row_causal":
        return batch.masked_as("row_causal"), "causal"
    raise ValueError(f"unknown mask {mask!r} (known: document, causal, row_causal)")


def _transformers_backend(source: Path, workarounds: tuple[str, ...]):
    """torchtitan's transformers backend built as the run built it: with exactly the run's
    workarounds (``hf_block_causal`` changes its mask, ``hf_rope_init`` recomputes RoPE). Its
    known defects that the run did not work around are named; the mask one is compared like for
    like (the reference masked as the run masked); the uninitialised RoPE is recomputed after
    it is named, since the run's RoPE table is whatever memory held and cannot be rebuilt."""
    from harness.parity.models import build_hf_backend  # noqa: PLC0415  heavy: torchtitan; diagnose reads NATIVE_BUILDS without it

    applied = set(workarounds)
    parity = build_hf_backend(source, configure=W.hf_backend_configure(applied))
    W.hf_backend_after_init(parity, applied)
    if "hf_rope_init" not in applied:
        W.hf_rope_init(parity.module)
    known, mask = _hf_known_issues(applied)
    parity.module.train(False)
    return parity, known, hf_modules(parity.module.model, parity.arch), mask


def _hf_known_issues(applied: set[str]) -> tuple[list[str], str]:
    """(the transformers backend's known defects the run did not work around, by name; the
    mask its model applies). The uninitialised RoPE is recomputed after it is named, since the
    run's RoPE table is whatever memory held and cannot be rebuilt; the mask one is compared
    like for like (the reference masked as the run masked)."""
    from harness.upstream import titan_api  # noqa: PLC0415  heavy: torchtitan; diagnose reads NATIVE_BUILDS without it

    api = titan_api.transformers_backend()
    known = []
    if "hf_rope_init" not in applied:
        issue = known_issues.issue("hf_v5-rope-inv-freq-uninitialised")
        known.append(f"known issue {issue.name}: the run did not apply hf_rope_init, so its RoPE "
                     f"inv_freq was uninitialised memory; the diagnosis recomputed it to look "
                     f"past it")
    block = "hf_block_causal" in applied and api.block_causal
    mask = "document" if block else api.masking
    if mask != "document":
        name = ("spring2026-hf_v5-row-positions" if mask == "row_causal"
                else "hf_v5-causal-mask-across-documents")
        issue = known_issues.issue(name)
        known.append(f"known issue {issue.name}: the run's model masks {mask.replace('_', '-')} "
                     f"across packed documents; compared with the reference masked the same way")
    return known, mask


def _streamed_transformers_backend(source: Path, workarounds: tuple[str, ...], model_dir: Path,
                                   batch, device: str, regime: str, gradients: bool,
                                   weights_from: str, batch_from: str) -> Subject:
    """torchtitan's transformers backend on the meta device, built as the run built it (its
    config-level workarounds), streamed one unit at a time through its own forward
    (harness/diagnosis/streamed.py)."""
    applied = set(workarounds)
    arch = Qwen3Arch.from_dir(model_dir)
    if arch.is_moe:
        raise NotDiagnosable(
            "the transformers backend's MoE: the run's model is not what a rebuild holds. "
            "torchtitan 0.3.0's transformers backend swaps each HF MoE block for torchtitan's MoE at "
            "parallelize time (moe_replacement.build_and_swap_native_moe, which needs the run's "
            "ParallelDims) and initialises it there, while the model built here keeps "
            "transformers' fused experts (mlp.experts.gate_up_proj [E, 2F, D], down_proj "
            "[E, D, F]), which the checkpoint's per-expert tensors do not name; and the harness "
            "registers no hf_v5 MoE size")
    model = streamed.hf_backend_on_meta(source, configure=W.hf_backend_configure(applied))
    weights = WeightSource(source)

    def rope_init(rotary):
        with torch.no_grad():
            _recompute_inv_freq(rotary)

    runner = streamed.StreamedHF(model, weights, batch, rope_init=rope_init, device=device)
    known, mask = _hf_known_issues(applied)
    seen, ref_mask = reference_form(batch, mask)
    return Subject(model, None, weights, arch, seen.inputs, seen.positions, ref_mask, regime,
                   weights_from, batch_from, known, hf_modules(model.model, arch),
                   batch.labels if gradients else None, None, runner)


def known_load_gap_issues(kinds) -> list[str]:
    """The tensors (``kinds``: layer index dropped) the trainer's HF load leaves at their init,
    judged as the parity suite judges them (``native_moe_parity``: harness/registry/known_issues/). A
    gap that is a known issue's signature is named, and is to be filled from the checkpoint
    under the right names, so that the module walk looks past it for a further defect; any
    other gap is an error (the diagnosis cannot say which weights the model computes with).
    Returns one line per known issue."""
    from harness.upstream import titan_api  # noqa: PLC0415  heavy: torchtitan; diagnose reads NATIVE_BUILDS without it

    if not kinds:
        return []
    issues = [issue for issue in known_issues.ISSUES
              if any(w.check == "native_moe_parity" and (not w.generation
                                                        or titan_api.generation() in w.generation)
                     for w in issue.where)
              and issue.signature_for("native_moe_parity").matches(kinds)]
    if not issues:
        raise NotDiagnosable(f"the run's HF load left {list(kinds)} at their init, which no known "
                             f"issue records: fix the load (or record it in "
                             f"harness/registry/known_issues/) before a module walk can mean anything")
    return [f"known issue {issue.name}: the HF load left {', '.join(kinds)} at their init "
            f"(the run's step-1 loss shows it); the diagnosis loaded them from the checkpoint "
            f"to look past it" for issue in issues]


_EXPERT_HF = {"w1_EFD": "gate_proj", "w3_EFD": "up_proj", "w2_EDF": "down_proj"}


def _fill_experts(model, weights: WeightSource, kinds, prefix: str = "") -> int:
    """Stack each layer's per-expert HF tensors into the native grouped experts' parameters
    (``w1``/``w3``: [E, F, D] from gate/up_proj, ``w2``: [E, D, F] from down_proj). ``model``:
    the native model, or one of its units (``prefix``: its name and a dot, ``layers.1.``)."""
    filled = 0
    with torch.no_grad():
        for name, param in model.named_parameters(prefix=prefix.rstrip(".")):
            kind = next((k for k in kinds if name.endswith(k)), None)
            leaf = name.rsplit(".", 1)[-1]
            if kind is None or leaf not in _EXPERT_HF:
                if kind is not None:
                    raise NotDiagnosable(f"{name}: the diagnosis cannot fill this kind of tensor")
                continue
            layer = int(name.split(".")[1])
            stacked = torch.stack([weights[f"model.layers.{layer}.mlp.experts.{e}.{_EXPERT_HF[leaf]}.weight"]
                                   for e in range(param.shape[0])])
            param.copy_(stacked.to(param.dtype))
            filled += 1
    return filled


def _expert_grads(unit, kinds, prefix: str) -> dict[str, torch.Tensor]:
    """The gradients of the grouped experts' parameters that ``_fill_experts`` filled, under
    the per-expert HF names it read them from (``w1``/``w3``: [E, F, D] -> gate/up_proj,
    ``w2``: [E, D, F] -> down_proj, one slice per expert): the adapter's ``to_hf`` names
    them no more than its ``from_hf`` loaded them."""
    out = {}
    for name, param in unit.named_parameters(prefix=prefix.rstrip(".")):
        leaf = name.rsplit(".", 1)[-1]
        if param.grad is None or leaf not in _EXPERT_HF or not any(name.endswith(k) for k in kinds):
            continue
        layer = int(name.split(".")[1])
        for e in range(param.shape[0]):
            out[f"model.layers.{layer}.mlp.experts.{e}.{_EXPERT_HF[leaf]}.weight"] = param.grad[e].detach().clone()
    return out
