"""What a launched run's ranks record about the trainer's state beyond step 0, for the
training-state, tied-embedding and load-balancing checks. Observers only (installed in every
launched rank by harness/rank/observers.py: a run's losses and grad norms are bitwise those of
the same run without them); the paths are harness/registry/dump_layout.py's, which reads them back. The
defects the checks are shown failing on are plants (harness/plants/in_torchtitan.py). Their
cost is a few tensor copies per phase and, for a MoE model, a top-k and a histogram of each
router's output per microbatch.

- ``record_state(trainer, phase)``: per phase (``built``: trainer built; ``loaded``: after the
  checkpoint load at the start of ``train``; ``trained``: after the last step) whether the
  output projection and the token embedding are one parameter, and whether their values agree;
  and every ``expert_bias`` buffer's local values.
- ``record_balance(trainer)`` (MoE models): per optimizer step, per MoE layer, what the
  aux-loss-free load balancing saw and did: the router's own choices in that step (a histogram
  of the chosen expert ids, counted here from the router's output, independently of
  torchtitan's ``tokens_per_expert_E``), how many tokens' choices differ from the top-k of the
  scores plus the layer's ``expert_bias_E`` (the bias applied in routing), and
  ``tokens_per_expert_E`` and ``expert_bias_E`` right before and right after the optimizer
  step (whose pre-hook updates the bias from the counts and resets them), with the layer's
  ``load_balance_coeff``. Judged by harness/checks/training_state.py ``balance_findings``.
"""

from __future__ import annotations

import json

import torch

from harness.rank.step0 import rank_of_process as _rank
from harness.registry import dump_layout


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def _state_of(model) -> dict:
    """Tying and expert-bias state of one model part."""
    out: dict = {}
    emb = getattr(getattr(model, "tok_embeddings", None), "weight", None)
    head = getattr(getattr(model, "lm_head", None), "weight", None)
    if emb is not None and head is not None:
        le, lh = _local(emb.detach()), _local(head.detach())
        out["tied_same_parameter"] = emb is head
        out["tied_same_storage"] = (le.shape == lh.shape
                                    and le.untyped_storage().data_ptr()
                                    == lh.untyped_storage().data_ptr())
        out["tied_values_equal"] = bool(le.shape == lh.shape and torch.equal(le, lh))
        out["weight_tying_flag"] = bool(getattr(model, "enable_weight_tying", False))
    bias = {name: _local(buf.detach()).cpu().clone() for name, buf in model.named_buffers()
            if "expert_bias" in name}
    out["expert_bias_abs_sum"] = (float(sum(b.float().abs().sum() for b in bias.values()))
                                  if bias else None)
    return out, bias


def record_state(trainer, phase: str) -> None:
    """This rank's tying and expert-bias state at ``phase``."""
    dump, rank = trainer.config.dump_folder, _rank()
    states, biases = [], {}
    for i, part in enumerate(trainer.model_parts):
        state, bias = _state_of(part)
        states.append(state)
        biases.update({f"part{i}.{k}": v for k, v in bias.items()})
    path = dump_layout.state_file(dump, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = json.loads(path.read_text()) if path.is_file() else {}
    record[phase] = {"step": int(trainer.step), "parts": states}
    path.write_text(json.dumps(record, indent=1))
    if biases:
        torch.save(biases, dump_layout.expert_bias_file(dump, rank, phase))


# ---- MoE load balancing ----------------------------------------------------------------------

def _moe_layers(trainer) -> list[tuple[str, torch.nn.Module]]:
    out = []
    for i, part in enumerate(trainer.model_parts):
        layers = getattr(part, "layers", None)
        for key, layer in (layers.items() if layers is not None else ()):
            if getattr(layer, "moe_enabled", False):
                out.append((f"part{i}.layers.{key}.moe", layer.moe))
    return out


def _plain_local(t):
    return None if t is None else _local(t.detach()).cpu().clone().float()


def record_balance(trainer) -> None:
    """Per-step load-balancing records (module docstring), for MoE models only: hooks on each
    router and around the optimizer step."""
    moes = _moe_layers(trainer)
    if not moes:
        return
    seen: dict[str, dict] = {name: {} for name, _ in moes}  # this step's router observations
    records: list[dict] = []
    path = dump_layout.balance_file(trainer.config.dump_folder, _rank())

    def router_hook(name, moe):
        def hook(_router, _args, out):
            ids, scores = _local(out[1].detach()), _local(out[2].detach())
            num_experts = scores.shape[-1]
            bias = _plain_local(moe.expert_bias_E)
            biased = scores.float() + (bias.to(scores.device) if bias is not None else 0.0)
            want = torch.topk(biased, k=ids.shape[-1], dim=-1).indices
            mismatched = int((ids.sort(dim=-1).values != want.sort(dim=-1).values).any(dim=-1).sum())
            hist = torch.bincount(ids.flatten().cpu(), minlength=num_experts).float()
            entry = seen[name]
            entry["hist"] = entry.get("hist", 0) + hist
            entry["mismatched"] = entry.get("mismatched", 0) + mismatched
            entry["tokens"] = entry.get("tokens", 0) + int(ids.shape[:-1].numel())
        return hook

    for name, moe in moes:
        moe.router.register_forward_hook(router_hook(name, moe))

    optimizer_step = trainer.optimizers.step

    def step(*args, **kwargs):
        before = {name: (_plain_local(moe.tokens_per_expert_E), _plain_local(moe.expert_bias_E))
                  for name, moe in moes}
        result = optimizer_step(*args, **kwargs)
        layers = {}
        for name, moe in moes:
            layers[name] = {
                "hist": seen[name].get("hist"), "mismatched": seen[name].get("mismatched", 0),
                "tokens": seen[name].get("tokens", 0),
                "counts_before": before[name][0], "bias_before": before[name][1],
                "counts_after": _plain_local(moe.tokens_per_expert_E),
                "bias_after": _plain_local(moe.expert_bias_E),
                "coeff": moe.load_balance_coeff,
            }
            seen[name] = {}
        records.append({"step": int(trainer.step), "layers": layers})
        torch.save(records, path)
        return result

    trainer.optimizers.step = step


# ---- tensors as the trainer holds them: after a resume's load, and the step-1 gradients -------

# Above this many parameters a run records neither (a full-size model's state is gigabytes per
# rank); the tiny fixtures hold about 2.3 million (MoE) and 0.7 million (dense).
RECORD_MAX_PARAMS = 50_000_000


def _small_enough(trainer) -> bool:
    return sum(p.numel() for part in trainer.model_parts for p in part.parameters()) <= RECORD_MAX_PARAMS


def _placed(value):
    """A state value as this rank holds it: a DTensor as (local shard, global offset, global
    shape); a plain tensor as (itself, None, its shape); anything else as it is."""
    from torch.distributed.tensor import DTensor  # noqa: PLC0415  heavy: torch.distributed.tensor adds about 1 s over torch
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset  # noqa: PLC0415  heavy: torch.distributed.tensor adds about 1 s over torch

    if isinstance(value, DTensor):
        _, offset = compute_local_shape_and_global_offset(value.shape, value.device_mesh,
                                                          value.placements)
        return (value.to_local().detach().cpu().clone(), tuple(int(o) for o in offset),
                tuple(value.shape))
    if isinstance(value, torch.Tensor):
        return (value.detach().cpu().clone(), None, tuple(value.shape))
    return value


def record_resumed_state(trainer) -> None:
    """Every model and optimizer entry the trainer holds right after its checkpoint load
    returned, read from the trainer through torchtitan's own state-dict functions (the ones its
    save uses, so the keys are the checkpoint's: the model's at the top, the optimizer's under
    ``optimizer.``), each as this rank holds it (``_placed``)."""
    if not _small_enough(trainer):
        return
    states = trainer.checkpointer.states
    model = states["model"]
    read = getattr(model, "_get_state_dict", None) or model.state_dict
    record = {key: _placed(value) for key, value in read().items()}
    if "optimizer" in states:
        record |= {f"optimizer.{key}": _placed(value)
                   for key, value in states["optimizer"].state_dict().items()}
    path = dump_layout.resumed_file(trainer.config.dump_folder, _rank())
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(record, path)


def record_first_step_grads(trainer) -> None:
    """Every parameter's gradient once the first trained step's last microbatch has run its
    backward, before clipping and the optimizer step: wraps this trainer's
    ``forward_backward_step`` (called once per microbatch group)."""
    if not _small_enough(trainer):
        return
    forward_backward = trainer.forward_backward_step
    microbatches = max(1, int(getattr(trainer, "gradient_accumulation_steps", 1) or 1))
    seen = {"step": None, "calls": 0, "done": False}

    def forward_backward_step(*args, **kwargs):
        loss = forward_backward(*args, **kwargs)
        if not seen["done"]:
            if seen["step"] is None:
                seen["step"] = int(trainer.step)
            seen["calls"] += 1
            if seen["calls"] == microbatches:
                seen["done"] = True
                grads = {name: _placed(p.grad) for i, part in enumerate(trainer.model_parts)
                         for name, p in part.named_parameters() if p.grad is not None}
                path = dump_layout.grads_file(trainer.config.dump_folder, _rank())
                path.parent.mkdir(parents=True, exist_ok=True)
                torch.save({"step": seen["step"], "grads": grads}, path)
        return loss

    trainer.forward_backward_step = forward_backward_step
