"""Plants realised as patches of torchtitan's own modules (see harness/plants/__init__.py).

Each ``apply(module)`` breaks one thing in the imported upstream module and returns the undo.
In a launched rank the plant acts on torchtitan's real trainer, data path and model (installed
at import like an upstream shim). In-process it acts inside ``with planted(name)``.
"""

from __future__ import annotations

import os
import re
import time
from types import ModuleType

import torch

from harness.plants import PLANT_STEP, Plant
from harness.references.loss import IGNORE_INDEX


def _rank() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ.get("RANK", "0"))


def _replace(owner, attribute: str, make_new):
    """``owner.attribute = make_new(original)``; returns the undo."""
    original = getattr(owner, attribute)
    setattr(owner, attribute, make_new(original))
    return lambda: setattr(owner, attribute, original)


# ---------------------------------------------------------------------- faults in the trainer

def _after_forward_backward(action):
    def apply(trainer_module: ModuleType):
        def make(original):
            def forward_backward_step(self, *args, **kwargs):
                return action(self, original(self, *args, **kwargs))
            return forward_backward_step
        return _replace(trainer_module.Trainer, "forward_backward_step", make)
    return apply


def _nan_from_plant_step(self, loss):
    return loss * float("nan") if self.step >= PLANT_STEP else loss


def _rank1_hangs(self, loss):
    if self.step >= PLANT_STEP and _rank() == 1:
        print(f"plant hang_rank1: rank 1 hangs at step {self.step}", flush=True)
        while True:
            time.sleep(1)
    return loss


def _rank1_crashes(self, loss):
    if self.step >= PLANT_STEP and _rank() == 1:
        raise RuntimeError(f"plant crash_rank1: rank 1 crashed at step {self.step}")
    return loss


# ---------------------------------------------------------------------- model and adapter

def _rope_theta_x10(rope_module: ModuleType):
    def make(original):
        def _precompute_cache(self):
            theta = self.config.theta
            self.config.theta = theta * 10
            try:
                return original(self)
            finally:
                self.config.theta = theta
        return _precompute_cache
    return _replace(rope_module.CosSinRoPE, "_precompute_cache", make)


def _adapter_swaps_gate_up(adapter_module: ModuleType):
    def make(original_init):
        def __init__(self, *args, **kwargs):
            original_init(self, *args, **kwargs)
            gate = "model.layers.{}.mlp.gate_proj.weight"
            up = "model.layers.{}.mlp.up_proj.weight"
            self.from_hf_map[gate], self.from_hf_map[up] = self.from_hf_map[up], self.from_hf_map[gate]
        return __init__
    return _replace(adapter_module.Qwen3StateDictAdapter, "__init__", make)


def _untie_embeddings(trainer_module: ModuleType):
    """The model is built with weight tying off. The embedding gets its own init (a tied flavor
    skips it), so the run trains normally and only the tying is wrong."""
    def make(original_init):
        def __init__(self, config, *args, **kwargs):
            from torchtitan.models import qwen3  # noqa: PLC0415  order: torchtitan loads after the plants are hooked

            config.model_spec.model.enable_weight_tying = False
            config.model_spec.model.tok_embeddings.param_init = qwen3._EMBEDDING_INIT
            original_init(self, config, *args, **kwargs)
        return __init__
    return _replace(trainer_module.Trainer, "__init__", make)


# ---------------------------------------------------------------------- loss and training state

def _all_token_norm(trainer_module: ModuleType):
    def make(original):
        def forward_backward_step(self, *, input_dict, labels, global_valid_tokens):
            world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
            # every label of the step: each rank's microbatches are alike in size
            count = labels.numel() * world * getattr(self, "gradient_accumulation_steps", 1)
            # spring passes the count as a float, 0.3.0 a tensor
            all_tokens = (torch.full_like(global_valid_tokens, count)
                          if isinstance(global_valid_tokens, torch.Tensor) else float(count))
            return original(self, input_dict=input_dict, labels=labels, global_valid_tokens=all_tokens)
        return forward_backward_step
    return _replace(trainer_module.Trainer, "forward_backward_step", make)


def _reset_expert_bias_on_load(checkpoint_module: ModuleType):
    def make(original):
        def load(self, *args, **kwargs):
            loaded = original(self, *args, **kwargs)
            if loaded:
                with torch.no_grad():
                    for part in self.states["model"].model:
                        for name, buf in part.named_buffers():
                            if "expert_bias" in name:
                                buf.zero_()
            return loaded
        return load
    return _replace(checkpoint_module.CheckpointManager, "load", make)


def _drop_uneven_last_row(tensor) -> str | None:
    """Zero the last row of ``tensor`` where it is a DTensor sharded on dim 0 over a 1-D mesh
    whose size does not divide that dimension (FSDP's shorter last shard), on the rank that
    holds the row; the tensor's global shape when it did."""
    from torch.distributed.tensor import DTensor, Shard  # noqa: PLC0415  heavy: torch.distributed.tensor adds about 1 s over torch

    if not isinstance(tensor, DTensor) or tensor.device_mesh.ndim != 1 or tensor.ndim == 0:
        return None
    if tensor.placements != (Shard(0),):
        return None
    rows, ranks = tensor.shape[0], tensor.device_mesh.size()
    if rows % ranks == 0:
        return None
    chunk = -(-rows // ranks)  # torch.chunk's split, as FSDP2 shards
    if tensor.device_mesh.get_local_rank() == (rows - 1) // chunk:
        tensor.to_local()[-1].zero_()
    return str(tuple(tensor.shape))


def _reshard_drops_uneven_row(checkpoint_module: ModuleType):
    """After a checkpoint load that restores the training state (a resume, not the model-only
    HF load), the last row of every parameter and optimizer state whose sharded dimension does
    not split evenly over the ranks is zero: a reshard that loses the shorter last shard's
    last row."""
    def make(original):
        def load(self, *args, **kwargs):
            loaded = original(self, *args, **kwargs)
            if loaded and "optimizer" in self.states:
                dropped = []
                with torch.no_grad():
                    for part in self.states["model"].model:
                        for name, param in part.named_parameters():
                            if _drop_uneven_last_row(param):
                                dropped.append(name)
                    for optimizer in getattr(self.states["optimizer"], "optimizers", ()):
                        for state in optimizer.state.values():
                            for value in state.values():
                                _drop_uneven_last_row(value)
                if dropped and _rank() == 0:
                    print(f"plant reshard_drops_uneven_row: last row zeroed in {len(dropped)} "
                          f"parameters and their optimizer state ({dropped[0]}, ...)", flush=True)
            return loaded
        return load
    return _replace(checkpoint_module.CheckpointManager, "load", make)


def _model_load_drops_uneven_row(checkpoint_module: ModuleType):
    """Inside torchtitan's own load path: ``ModelWrapper.load_state_dict`` (which
    ``CheckpointManager.dcp_load`` calls with the state DCP has just read) loses the last row of
    every tensor whose sharded dimension does not split evenly over the ranks, whatever
    checkpoint it came from: a load that drops the shorter last shard's last row on every load
    at that world size, the whole-tensor copy's as much as the sharded checkpoint's."""
    def make(original):
        def load_state_dict(self, state_dict):
            with torch.no_grad():
                dropped = [key for key, value in state_dict.items() if _drop_uneven_last_row(value)]
            if dropped and _rank() == 0:
                print(f"plant model_load_drops_uneven_row: last row lost in {len(dropped)} "
                      f"tensors on load ({dropped[0]}, ...)", flush=True)
            return original(self, state_dict)
        return load_state_dict
    # torchtitan.components.checkpoint holds ModelWrapper in both generations (0.3.0 re-exports
    # it from components/checkpointer/base.py: the same class)
    return _replace(checkpoint_module.ModelWrapper, "load_state_dict", make)


def _replicate_one_shard(trainer_module: ModuleType):
    """Right after the checkpoint load at the start of ``train`` (whether it loaded anything or
    not: step 1 starts right after it), every rank's shard of layer 0's query projection is
    replaced by rank 0's: one parameter whose shards are identical, as a loader that hands
    every rank the same slice would leave it."""
    def replicate(model_parts) -> None:
        with torch.no_grad():
            for part in model_parts:
                for name, param in part.named_parameters():
                    if re.search(r"layers\.0\..*(wq|wqkv|q_proj)\.weight$", name) and hasattr(param, "to_local"):
                        group = param.device_mesh.get_group()
                        torch.distributed.broadcast(param.to_local(), group=group,
                                                    src=torch.distributed.get_global_rank(group, 0))
                        print(f"plant replicate_one_shard: every rank holds rank 0's shard of {name}",
                              flush=True)
                        return

    def make(original_init):
        def __init__(self, *args, **kwargs):
            original_init(self, *args, **kwargs)
            load = self.checkpointer.load

            def load_then_replicate(*a, **k):
                loaded = load(*a, **k)
                replicate(self.model_parts)
                return loaded

            self.checkpointer.load = load_then_replicate
        return __init__
    return _replace(trainer_module.Trainer, "__init__", make)


# ---------------------------------------------------------------------- data path

def _each_sample(transform):
    def apply(text_datasets: ModuleType):
        def make(original):
            def __iter__(self):
                for input_dict, labels in original(self):
                    yield transform(input_dict, labels)
            return __iter__
        return _replace(text_datasets.HuggingFaceTextDataset, "__iter__", make)
    return apply


def _label_shift(input_dict, labels):
    return input_dict, torch.cat([labels[1:], labels[-1:]])


def _positions_no_reset(input_dict, labels):
    return {**input_dict, "positions": torch.arange(len(input_dict["input"]))}, labels


def _drop_eos(tokenizer_module: ModuleType):
    def make(original):
        def encode(self, *args, **kwargs):
            kwargs["add_eos"] = False
            return original(self, *args, **kwargs)
        return encode
    return _replace(tokenizer_module.HuggingFaceTokenizer, "encode", make)


def _sft_mask_off_by_one(text_datasets: ModuleType):
    def make(original):
        def _tokenize_sample(self, sample):
            result = original(self, sample)
            if result is not None:
                labels = result[1]
                first = next((i for i, v in enumerate(labels) if v != IGNORE_INDEX), None)
                if first is not None:
                    labels[first] = IGNORE_INDEX
            return result
        return _tokenize_sample
    return _replace(text_datasets.ChatDataset, "_tokenize_sample", make)


TRAINER = "torchtitan.trainer"
DATASETS = "torchtitan.hf_datasets.text_datasets"

PATCH_PLANTS = (
    Plant("nan_loss", "trainer", f"every rank's loss becomes NaN from step {PLANT_STEP} on",
          ("completed", "finite"), patch=(TRAINER, _after_forward_backward(_nan_from_plant_step))),
    Plant("hang_rank1", "trainer", f"rank 1 stops answering at step {PLANT_STEP} (a hung collective)",
          ("completed",), patch=(TRAINER, _after_forward_backward(_rank1_hangs))),
    Plant("crash_rank1", "trainer", f"rank 1 raises at step {PLANT_STEP}",
          ("completed",), patch=(TRAINER, _after_forward_backward(_rank1_crashes))),
    Plant("rope_theta_x10", "model", "native RoPE's cos/sin cache is built with theta * 10",
          ("first_step_loss",), patch=("torchtitan.models.common.rope", _rope_theta_x10)),
    Plant("adapter_swaps_gate_up", "adapter",
          "the HF state-dict adapter maps gate_proj and up_proj the wrong way round",
          ("first_step_loss", "logits parity"),
          patch=("torchtitan.models.qwen3.state_dict_adapter", _adapter_swaps_gate_up)),
    Plant("untie_embeddings", "model", "the model is built with weight tying off",
          ("tied embeddings",), patch=(TRAINER, _untie_embeddings)),
    Plant("all_token_norm", "loss", "the loss is normalised by every label, ignored ones included",
          ("loss normalised over valid tokens",), patch=(TRAINER, _all_token_norm)),
    Plant("reset_expert_bias_on_load", "training state", "MoE expert_bias is zeroed after a checkpoint load",
          ("expert_bias restored",), patch=("torchtitan.components.checkpoint", _reset_expert_bias_on_load)),
    Plant("reshard_drops_uneven_row", "checkpoint", "a checkpoint loaded at another world size "
          "loses the last row of every tensor whose sharded dimension does not split evenly",
          ("resharded resume",), patch=("torchtitan.components.checkpoint", _reshard_drops_uneven_row)),
    Plant("model_load_drops_uneven_row", "checkpoint", "torchtitan's ModelWrapper.load_state_dict "
          "loses the last row of every tensor whose sharded dimension does not split evenly, on "
          "every load at that world size (both runs of the resharded comparison)",
          ("resumed state",), patch=("torchtitan.components.checkpoint",
                                     _model_load_drops_uneven_row), patches_a_class=True),
    Plant("replicate_one_shard", "model", "every rank starts step 1 from rank 0's shard of layer 0's "
          "query projection (a loader handing every rank the same slice)",
          ("shards_distinct",), patch=(TRAINER, _replicate_one_shard)),
    Plant("label_shift", "data", "each label is the token after the right one (off-by-one shift)",
          ("dataloader reference", "trainer feed"), patch=(DATASETS, _each_sample(_label_shift))),
    Plant("positions_no_reset", "data", "positions count over the row, not reset at document boundaries",
          ("dataloader reference", "trainer feed"), patch=(DATASETS, _each_sample(_positions_no_reset))),
    Plant("drop_eos", "data", "the tokenizer's add_eos is ignored (documents run together)",
          ("dataloader reference", "trainer feed"), patch=("torchtitan.components.tokenizer", _drop_eos)),
    Plant("sft_mask_off_by_one", "data", "the chat dataset also ignores the first assistant label",
          ("SFT reference",), patch=(DATASETS, _sft_mask_off_by_one)),
)


# ---------------------------------------------------------------------- MoE load balancing
# Defects of aux-loss-free load balancing as torchtitan's history has seen them: the update
# hook lost, its sign, the routing counts, the bias in routing, the bias in the checkpoint.
# The update is a step pre-hook on the OptimizersContainer (the only one the harness's runs
# register), so the update plants wrap what that container registers.

MOE = "torchtitan.models.common.moe"
OPTIMIZER = "torchtitan.components.optimizer"


def _moe_layers_of(model_parts):
    for part in model_parts:
        for module in part.modules():
            if hasattr(module, "tokens_per_expert_E"):
                yield module


def _wrap_container_pre_hooks(wrap):
    """Each step pre-hook the OptimizersContainer registers becomes ``wrap(hook, container)``."""
    def apply(optimizer_module: ModuleType):
        def make(original):
            def register_step_pre_hook(self, hook):
                return original(self, wrap(hook, self))
            return register_step_pre_hook
        return _replace(optimizer_module.OptimizersContainer, "register_step_pre_hook", make)
    return apply


def _hook_dropped(optimizer_module: ModuleType):
    class _Handle:
        def remove(self):
            pass

    return _replace(optimizer_module.OptimizersContainer, "register_step_pre_hook",
                    lambda original: lambda self, hook: _Handle())


def _sign_flipped(hook, container):
    def flipped(*args, **kwargs):
        moes = list(_moe_layers_of(container.model_parts))
        before = [m.expert_bias_E.detach().clone() for m in moes]
        result = hook(*args, **kwargs)
        with torch.no_grad():
            for m, b in zip(moes, before, strict=True):
                m.expert_bias_E.copy_(2 * b - m.expert_bias_E)
        return result
    return flipped


def _counts_kept(hook, container):
    def kept(*args, **kwargs):
        moes = list(_moe_layers_of(container.model_parts))
        before = [m.tokens_per_expert_E.detach().clone() for m in moes]
        result = hook(*args, **kwargs)
        with torch.no_grad():
            for m, c in zip(moes, before, strict=True):
                m.tokens_per_expert_E.copy_(c)
        return result
    return kept


def _around_each_moe_forward(change):
    """A plant that hooks every built MoE layer around its forward (the forward itself is left
    alone): ``change(counts, counts_before)`` rewrites tokens_per_expert after it."""
    def apply(moe_module: ModuleType):
        def make(original):
            def __init__(self, *args, **kwargs):
                original(self, *args, **kwargs)
                kept = {}

                def before(module, _args):
                    kept["counts"] = module.tokens_per_expert_E.detach().clone()

                def after(module, _args, _out):
                    with torch.no_grad():
                        change(module.tokens_per_expert_E, kept.pop("counts"))

                self.register_forward_pre_hook(before)
                self.register_forward_hook(after)
            return __init__
        return _replace(moe_module.MoE, "__init__", make)
    return apply


# Each MoE layer's forward leaves tokens_per_expert as it found it.
_counts_not_accumulated = _around_each_moe_forward(lambda counts, before: counts.copy_(before))
# Each MoE layer's forward adds its routing counts twice, as a forward recomputed under
# activation checkpointing does.
_counts_twice = _around_each_moe_forward(lambda counts, before: counts.add_(counts - before))


def _router_ignores_bias(moe_module: ModuleType):
    def make(original):
        def forward(self, x, expert_bias_E=None, *args, **kwargs):
            return original(self, x, None, *args, **kwargs)
        return forward
    return _replace(moe_module.TokenChoiceTopKRouter, "forward", make)


def _bias_not_persistent(moe_module: ModuleType):
    def make(original):
        def __init__(self, *args, **kwargs):
            original(self, *args, **kwargs)
            if getattr(self, "expert_bias_E", None) is not None:
                self._non_persistent_buffers_set.add("expert_bias_E")
        return __init__
    return _replace(moe_module.MoE, "__init__", make)


RECOMPUTE_DRIFT = 1e-2  # how much the planted recompute's routing weights grow


def _forward_reads_its_counts(moe_module: ModuleType):
    """A stateful MoE forward: torchtitan's ``MoE.forward`` scales its routing weights by
    ``1 + RECOMPUTE_DRIFT`` once ``tokens_per_expert_E`` holds counts, state its own forward
    adds to. A step's first forward starts from counts the optimizer step reset, and computes
    what it always did; a recompute under activation checkpointing finds the counts its forward
    added, and computes other routing weights for the backward: the gradients change, the loss
    does not."""
    def make(original):
        def forward(self, x_BLD):
            router = self.router
            scale = router.route_scale
            if self.training and bool(self.tokens_per_expert_E.sum() > 0):
                router.route_scale = scale * (1 + RECOMPUTE_DRIFT)
            try:
                return original(self, x_BLD)
            finally:
                router.route_scale = scale
        return forward
    return _replace(moe_module.MoE, "forward", make)


_BALANCE = ("load balancing records",)
PATCH_PLANTS += (
    Plant("moe_balance_hook_dropped", "training state",
          "the optimizer never registers the MoE load-balancing update: expert_bias never moves",
          _BALANCE, patch=(OPTIMIZER, _hook_dropped)),
    Plant("moe_bias_update_sign_flipped", "training state",
          "the expert_bias update has the wrong sign (over-used experts get chosen more)",
          _BALANCE, patch=(OPTIMIZER, _wrap_container_pre_hooks(_sign_flipped))),
    Plant("moe_counts_not_reset", "training state",
          "tokens_per_expert is never reset after an update: counts accumulate across steps",
          _BALANCE, patch=(OPTIMIZER, _wrap_container_pre_hooks(_counts_kept))),
    Plant("moe_counts_not_accumulated", "training state",
          "the MoE forward never adds its routing counts to tokens_per_expert",
          _BALANCE, patch=(MOE, _counts_not_accumulated)),
    Plant("moe_counts_twice", "training state",
          "each MoE forward adds its routing counts to tokens_per_expert twice",
          ("moe_routing_counts",), patch=(MOE, _counts_twice)),
    Plant("moe_forward_reads_its_counts", "model",
          "the MoE forward's routing weights depend on the routing counts its own forward adds: "
          "a recompute under activation checkpointing computes other gradients",
          ("full AC vs no AC",), patch=(MOE, _forward_reads_its_counts), patches_a_class=True),
    Plant("moe_router_ignores_bias", "training state",
          "the router picks its top-k from the raw scores, without expert_bias",
          _BALANCE, patch=(MOE, _router_ignores_bias)),
    Plant("moe_expert_bias_not_checkpointed", "training state",
          "expert_bias is a non-persistent buffer: not saved, so a resumed run restarts it at zero",
          ("expert_bias restored",), patch=(MOE, _bias_not_persistent)),
)

# ---------------------------------------------------------------------- parallel layouts
# Defects of the layouts as upstream has had them (tests/parity/test_layouts.py): each acts
# only where its layout is in use, so the FSDP run it is compared with stays clean.

def _expert_grads_doubled_under_ep(trainer_module: ModuleType):
    """pytorch #160285: under EP 2 the routed experts' gradients come out exactly twice EP 1's
    (the loss curves look the same)."""
    from harness.upstream.titan_api import MOE_GROUPED_EXPERTS_PATH  # noqa: PLC0415  order: titan_api imports torchtitan, which the plants patch on import

    experts = f".{MOE_GROUPED_EXPERTS_PATH}."

    def make(original):
        def forward_backward_step(self, *args, **kwargs):
            loss = original(self, *args, **kwargs)
            if self.parallel_dims.ep_enabled:
                with torch.no_grad():
                    for part in self.model_parts:
                        for name, param in part.named_parameters():
                            if experts in name and param.grad is not None:
                                param.grad.mul_(2)
            return loss
        return forward_backward_step
    return _replace(trainer_module.Trainer, "forward_backward_step", make)


def _tp_partial_sums_unreduced(placement_types: ModuleType):
    """A partial sum over the tensor-parallel ranks is taken as the full sum: DTensor's
    ``Partial`` reduction on the ``tp`` mesh dimension is skipped. In torchtitan 0.3.0 the
    forward's row-parallel sums go through spmd_types, so what this leaves unreduced is the
    gradient norm's: each rank clips by its own shard's norm (the per-group grad norm of
    Megatron-LM #5916)."""
    def make(original):
        def _reduce_value(self, tensor, mesh, mesh_dim):
            if (mesh.mesh_dim_names or ())[mesh_dim:mesh_dim + 1] == ("tp",):
                return tensor
            return original(self, tensor, mesh, mesh_dim)
        return _reduce_value
    return _replace(placement_types.Partial, "_reduce_value", make)


def _loss_mean_per_microbatch(trainer_module: ModuleType):
    """torchtitan #1759: under gradient accumulation each microbatch's loss is averaged over its
    own valid labels (then scaled by 1 / microbatches), not over the step's: microbatches with
    fewer valid labels weigh more per token."""
    def make(original):
        def forward_backward_step(self, *, input_dict, labels, global_valid_tokens):
            world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
            microbatches = getattr(self, "gradient_accumulation_steps", 1)
            count = float((labels != IGNORE_INDEX).sum()) * world * microbatches
            own = (torch.full_like(global_valid_tokens, count)
                   if isinstance(global_valid_tokens, torch.Tensor) else count)
            return original(self, input_dict=input_dict, labels=labels, global_valid_tokens=own)
        return forward_backward_step
    return _replace(trainer_module.Trainer, "forward_backward_step", make)


def _backward_mean_per_microbatch(trainer_module: ModuleType):
    """torchtune #1875's shape under gradient accumulation: each microbatch's backward is
    normalised by its own valid labels (times the ranks and microbatches), while the loss it
    returns, which torchtitan logs, is rescaled to the step's normalisation: the logged loss is
    right, the gradients are not."""
    def make(original):
        def forward_backward_step(self, *, input_dict, labels, global_valid_tokens):
            microbatches = getattr(self, "gradient_accumulation_steps", 1)
            if microbatches < 2:
                return original(self, input_dict=input_dict, labels=labels,
                                 global_valid_tokens=global_valid_tokens)
            world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
            count = float((labels != IGNORE_INDEX).sum()) * world * microbatches
            own = (torch.full_like(global_valid_tokens, count)
                   if isinstance(global_valid_tokens, torch.Tensor) else count)
            loss = original(self, input_dict=input_dict, labels=labels, global_valid_tokens=own)
            return loss * (own / global_valid_tokens)
        return forward_backward_step
    return _replace(trainer_module.Trainer, "forward_backward_step", make)


_LAYOUT_EQUIVALENCE = ("layout_vs_fsdp",)
PATCH_PLANTS += (
    Plant("ep_expert_grads_doubled", "trainer",
          "under expert parallelism the routed experts' gradients are doubled",
          _LAYOUT_EQUIVALENCE, patch=(TRAINER, _expert_grads_doubled_under_ep)),
    Plant("tp_partial_sums_unreduced", "model",
          "a partial sum over the tensor-parallel ranks is used unreduced (DTensor's Partial "
          "reduction on the tp mesh dimension skipped)",
          ("first_step_loss",), patch=("torch.distributed.tensor.placement_types",
                                       _tp_partial_sums_unreduced), patches_a_class=True),
    Plant("ga_microbatch_mean", "loss",
          "under gradient accumulation the loss is averaged per microbatch, not per valid token",
          ("loss normalised over valid tokens",), patch=(TRAINER, _loss_mean_per_microbatch)),
    Plant("ga_microbatch_backward", "loss",
          "under gradient accumulation each microbatch's backward is normalised by its own valid "
          "labels; the logged loss stays right",
          ("ga=2 gradients vs the single batch",), patch=(TRAINER, _backward_mean_per_microbatch)),
)

# ---------------------------------------------------------------------- one module, for the diagnosis
# Each acts in exactly one place of the built model (torchtitan's Decoder), so the diagnosis
# (harness/diagnosis) must name that module and no earlier one.

DECODER = "torchtitan.models.common.decoder"
PLANTED_LAYER = 1  # the layer the one-layer plants break (not the first: "not an earlier one")
FINAL_NORM_EPS = 1e-2  # Qwen3's 1e-6, planted in the final norm only


def _after_decoder_init(break_model):
    def apply(decoder_module: ModuleType):
        def make(original_init):
            def __init__(self, *args, **kwargs):
                original_init(self, *args, **kwargs)
                break_model(self)
            return __init__
        return _replace(decoder_module.Decoder, "__init__", make)
    return apply


def _planted_layer(model):
    return model.layers[str(min(PLANTED_LAYER, len(model.layers) - 1))]


def _swap_q_and_k_norm_during_forward(attention) -> None:
    """``attention`` (torchtitan's or transformers' module: both name them q_norm / k_norm)
    normalises q with k_norm and k with q_norm while its forward runs."""
    forward = attention.forward

    def swapped(*args, **kwargs):
        attention.q_norm, attention.k_norm = attention.k_norm, attention.q_norm
        try:
            return forward(*args, **kwargs)
        finally:
            attention.q_norm, attention.k_norm = attention.k_norm, attention.q_norm

    attention.forward = swapped


def _swap_qk_norm_in_one_layer(model) -> None:
    """In that layer's attention, q is normalised with k_norm and k with q_norm."""
    _swap_q_and_k_norm_during_forward(_planted_layer(model).attention)


def _swap_two_experts_in_one_layer(model) -> None:
    """In that layer's MoE, the tokens routed to expert 0 are computed by expert 1 and the
    other way round (router and routing weights unchanged)."""
    moe = getattr(_planted_layer(model), "moe", None)
    if moe is None:
        raise ValueError(f"plant swap_experts_layer{PLANTED_LAYER}: layer {PLANTED_LAYER} is not MoE")
    # 0.3.0: MoE.routed_experts; spring-2026 main: MoE.experts (the same signature).
    routed = getattr(moe, "routed_experts", None) or moe.experts
    forward = routed.forward

    def swapped(x, scores, ids, counts):
        swap = torch.where(ids == 0, 1, torch.where(ids == 1, 0, ids))
        order = torch.arange(counts.numel(), device=counts.device)
        order[0], order[1] = 1, 0
        return forward(x, scores, swap, counts[order])

    routed.forward = swapped


def _final_norm_eps(model) -> None:
    model.norm.eps = FINAL_NORM_EPS


DIAGNOSIS_PLANTS = (
    Plant(f"qk_norm_swap_layer{PLANTED_LAYER}", "model",
          f"layer {PLANTED_LAYER}'s attention normalises q with k_norm and k with q_norm",
          ("first_step_loss", f"diagnosis: layers.{PLANTED_LAYER}.attention.q_norm"),
          patch=(DECODER, _after_decoder_init(_swap_qk_norm_in_one_layer))),
    Plant(f"swap_experts_layer{PLANTED_LAYER}", "model",
          f"layer {PLANTED_LAYER}'s MoE computes expert 0's tokens with expert 1 and back",
          ("first_step_loss", f"diagnosis: layers.{PLANTED_LAYER}.moe.routed_experts"),
          patch=(DECODER, _after_decoder_init(_swap_two_experts_in_one_layer))),
    Plant("final_norm_eps", "model", f"the final RMSNorm's eps is {FINAL_NORM_EPS:g}",
          ("first_step_loss", "diagnosis: norm"),
          patch=(DECODER, _after_decoder_init(_final_norm_eps))),
)
PATCH_PLANTS = PATCH_PLANTS + DIAGNOSIS_PLANTS


# ------------------------------------------- one module of the transformers backend; one backward
# The transformers backend's model is transformers' Qwen3 (HF module names), so its one-module
# plant patches transformers' Qwen3Model; the backward-only plant leaves every forward output
# exact, so only the gradient comparison can find it.

HF_QWEN3 = "transformers.models.qwen3.modeling_qwen3"
BACKWARD_SCALE = 0.5  # what the planted backward multiplies the gradient by


def _after_hf_qwen3_init(break_model):
    def apply(qwen3_module: ModuleType):
        def make(original_init):
            def __init__(self, *args, **kwargs):
                original_init(self, *args, **kwargs)
                break_model(self)
            return __init__
        return _replace(qwen3_module.Qwen3Model, "__init__", make)
    return apply


def _swap_hf_qk_norm_in_one_layer(qwen3_model) -> None:
    """In transformers' layer ``PLANTED_LAYER``, q is normalised with k_norm and k with q_norm."""
    _swap_q_and_k_norm_during_forward(
        qwen3_model.layers[min(PLANTED_LAYER, len(qwen3_model.layers) - 1)].self_attn)


class _ScaledBackward(torch.autograd.Function):
    """The identity forward; a backward that scales the gradient (a wrong custom backward)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * BACKWARD_SCALE


def _scale_ffn_norm_backward_in_one_layer(model) -> None:
    """Layer ``PLANTED_LAYER``'s ffn_norm computes its output exactly, but its backward scales
    the gradient it receives before computing its weight's and its input's gradients."""
    norm = _planted_layer(model).ffn_norm
    forward = norm.forward
    norm.forward = lambda x: _ScaledBackward.apply(forward(x))


def _scale_attention_norm_input_gradient_in_one_layer(model) -> None:
    """Layer ``PLANTED_LAYER``'s attention_norm computes its output and its weight's gradient
    exactly, but scales the gradient it sends back to its input (the layer's input)."""
    norm = _planted_layer(model).attention_norm
    forward = norm.forward
    norm.forward = lambda x: forward(_ScaledBackward.apply(x))


MORE_DIAGNOSIS_PLANTS = (
    Plant(f"hf_qk_norm_swap_layer{PLANTED_LAYER}", "model",
          f"the transformers backend's layer {PLANTED_LAYER} normalises q with k_norm and k with q_norm",
          ("first_step_loss", f"diagnosis: model.layers.{PLANTED_LAYER}.self_attn.q_norm"),
          patch=(HF_QWEN3, _after_hf_qwen3_init(_swap_hf_qk_norm_in_one_layer))),
    Plant(f"ffn_norm_backward_layer{PLANTED_LAYER}", "model",
          f"layer {PLANTED_LAYER}'s ffn_norm: exact forward, its backward scales the incoming "
          f"gradient by {BACKWARD_SCALE}",
          (f"diagnosis: layers.{PLANTED_LAYER}.ffn_norm gradient",),
          patch=(DECODER, _after_decoder_init(_scale_ffn_norm_backward_in_one_layer))),
    Plant(f"attention_norm_input_backward_layer{PLANTED_LAYER}", "model",
          f"layer {PLANTED_LAYER}'s attention_norm: exact forward and weight gradient, the "
          f"gradient it sends to its input scaled by {BACKWARD_SCALE}",
          (f"diagnosis: layers.{PLANTED_LAYER} input gradient",),
          patch=(DECODER, _after_decoder_init(_scale_attention_norm_input_gradient_in_one_layer))),
)
PATCH_PLANTS = PATCH_PLANTS + MORE_DIAGNOSIS_PLANTS
