"""A few optimizer steps two ways: torchtitan's components vs an independent reference.

torchtitan side (:func:`train_native`): the native model with the optimizer container, LR
scheduler container, loss and gradient clipping built from the backend's own
``Trainer.Config`` (``config.optimizer.build``, ``config.lr_scheduler.build``,
``config.loss.build``, ``torchtitan.distributed.utils.clip_grad_norm_``), stepped the way
``Trainer.train_step`` steps them; data-parallel ranks are emulated by summing each rank's
``sum-CE / global tokens`` loss, which is what FSDP's gradient reduction computes.

Reference side (:func:`train_reference`): the HF model (or :mod:`harness.references.model`)
with ``torch.optim.AdamW``, ``torch.optim.lr_scheduler.LambdaLR`` over
:func:`reference_lr_factor` and ``torch.nn.utils.clip_grad_norm_``, on the same global
batches with a plain mean cross-entropy; an MoE also with torchtitan's expert-bias load
balancing (:class:`ExpertBiasBalancing`), part of the recipe the backends train with. Its
hyperparameters are :data:`EXPECTED`, the harness's own statement of the run
(``harness/backends/common.py``'s TINY shape plus torchtitan 0.3.0's documented ``default_adamw`` /
``LRSchedulersContainer`` / ``TrainingConfig`` defaults), not values read back from the code under
test, so a changed constant in torchtitan shows up as a trajectory difference and as a
:func:`hyperparameter_violations` entry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torchtitan.distributed import utils as dist_utils

from harness.parity.models import ParityModel
from harness.references.batch import Batch
from harness.references.loss import avg_loss, valid_labels
from harness.registry.tolerances import parity_tolerance
from harness.upstream import titan_api


@dataclass(frozen=True)
class Hyperparameters:
    lr: float = 8e-4  # harness/backends/common.py TINY
    betas: tuple[float, float] = (0.9, 0.95)  # torchtitan default_adamw
    eps: float = 1e-8  # torchtitan default_adamw
    weight_decay: float = 0.1  # torchtitan default_adamw
    max_norm: float = 1.0  # torchtitan TrainingConfig.max_norm
    warmup_steps: int = 2  # harness/backends/common.py TINY
    decay_ratio: float | None = None  # torchtitan LRSchedulersContainer.Config default
    decay_type: str = "linear"  # torchtitan default
    min_lr_factor: float = 0.0  # torchtitan default
    # MoE only: torchtitan's aux-loss-free load balancing (MoE.Config.load_balance_coeff
    # default, both generations): a per-expert bias on the top-k choice, stepped before each
    # optimizer step by coeff * sign(mean load - load), centred.
    load_balance_coeff: float = 1e-3


EXPECTED = Hyperparameters()


def reference_lr_factor(step: int, total_steps: int, hp: Hyperparameters = EXPECTED) -> float:
    """LR multiplier used for optimizer step ``step`` (0-based), written from the documented
    schedule: linear warmup over ``warmup_steps`` (factors 1/w, 2/w, ..., 1), then the peak
    held for one more step, then linear decay to ``min_lr_factor`` over the remaining
    ``total - warmup`` steps, the last factor being one decay-step above the minimum (the
    schedule's "virtual last step" keeps the final LR above zero)."""
    w = hp.warmup_steps
    decay = total_steps - w if hp.decay_ratio is None else round(total_steps * hp.decay_ratio)
    decay = min(decay, total_steps - w)
    stable = total_steps + 1 - w - decay
    if step < w:
        return (step + 1) / w
    if step < w + stable:
        return 1.0
    progress = (step + 1 - (w + stable)) / decay
    if hp.decay_type == "linear":
        factor = 1.0 - progress
    elif hp.decay_type == "cosine":
        factor = 0.5 * (1.0 + math.cos(math.pi * progress))
    elif hp.decay_type == "sqrt":
        factor = 1.0 - math.sqrt(progress)
    else:
        raise ValueError(hp.decay_type)
    return hp.min_lr_factor + (1.0 - hp.min_lr_factor) * factor


def reference_lrs(total_steps: int, n: int, hp: Hyperparameters = EXPECTED) -> list[float]:
    return [hp.lr * reference_lr_factor(i, total_steps, hp) for i in range(n)]


def stated_hyperparameters(trainer_config) -> dict:
    """What a backend's ``Trainer.Config`` says (optimizer kwargs, schedule, clipping)."""
    groups = trainer_config.optimizer.param_groups
    kw = dict(groups[0].optimizer_kwargs)
    sched = trainer_config.lr_scheduler
    return {
        "optimizer": groups[0].optimizer_name,
        "param_group_pattern": groups[0].pattern,
        "n_param_groups": len(groups),
        "lr": kw.get("lr"),
        "betas": tuple(kw.get("betas", ())),
        "eps": kw.get("eps"),
        "weight_decay": kw.get("weight_decay"),
        "max_norm": trainer_config.training.max_norm,
        "warmup_steps": sched.warmup_steps,
        "decay_ratio": sched.decay_ratio,
        "decay_type": sched.decay_type,
        "min_lr_factor": sched.min_lr_factor,
    }


def hyperparameter_violations(stated: dict, hp: Hyperparameters = EXPECTED) -> list[str]:
    """Every field where the config differs from the expected hyperparameters."""
    expected = {"optimizer": "AdamW", "param_group_pattern": ".*", "n_param_groups": 1,
                **{k: getattr(hp, k) for k in ("lr", "betas", "eps", "weight_decay", "max_norm",
                                                "warmup_steps", "decay_ratio", "decay_type",
                                                "min_lr_factor")}}
    out = []
    for key, want in expected.items():
        got = stated.get(key)
        same = (math.isclose(got, want, rel_tol=1e-12) if isinstance(want, float) and isinstance(got, (int, float))
                else tuple(got) == tuple(want) if isinstance(want, tuple) and got is not None
                else got == want)
        if not same:
            out.append(f"{key}: config states {got!r}, expected {want!r}")
    return out


def built_optimizer_violations(optimizers, hp: Hyperparameters = EXPECTED) -> list[str]:
    """The hyperparameters the *built* torch optimizer(s) actually carry, before any step
    (``lr`` as the scheduler left it for step 1)."""
    out = []
    for opt in optimizers:
        if type(opt).__name__ != "AdamW":
            out.append(f"optimizer class {type(opt).__name__}, expected AdamW")
        for i, g in enumerate(opt.param_groups):
            for key, want in (("betas", hp.betas), ("eps", hp.eps), ("weight_decay", hp.weight_decay)):
                got = g[key]
                ok = tuple(got) == tuple(want) if key == "betas" else math.isclose(got, want, rel_tol=1e-12)
                if not ok:
                    out.append(f"param group {i}: {key}={got!r}, expected {want!r}")
            if g.get("amsgrad"):
                out.append(f"param group {i}: amsgrad=True")
            if g.get("maximize"):
                out.append(f"param group {i}: maximize=True")
    return out


@dataclass
class TrainRecord:
    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    params: list[dict[str, torch.Tensor]] = field(default_factory=list)  # HF names, after each step
    initial: dict[str, torch.Tensor] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _snapshot(model: ParityModel) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.hf_tensors("param").items()}


def train_native(model: ParityModel, trainer_config, global_batches: list[list[Batch]],
                 total_steps: int | None = None) -> TrainRecord:
    """Step ``model`` (a native ParityModel) with torchtitan's own training components."""
    module = model.module
    module.train()
    steps = total_steps or trainer_config.training.steps
    optimizers = trainer_config.optimizer.build(model_parts=[module])
    schedulers = trainer_config.lr_scheduler.build(optimizers=optimizers, training_steps=steps)
    loss_fn = trainer_config.loss.build(compile_config=trainer_config.compile)
    rec = TrainRecord(initial=_snapshot(model))
    rec.notes = built_optimizer_violations(list(optimizers))
    for ranks in global_batches:
        global_tokens = torch.tensor(valid_labels(b.labels for b in ranks))
        total = torch.zeros(())
        for b in ranks:
            masks = module.get_attention_masks(positions=b.positions)
            pred = module(b.inputs, positions=b.positions, attention_masks=masks)
            loss = titan_api.call_loss(loss_fn, pred, b.labels, global_tokens)  # as the Trainer calls it
            loss.backward()
            total += loss.detach()
        grad_norm = dist_utils.clip_grad_norm_(list(module.parameters()), trainer_config.training.max_norm,
                                               foreach=True)
        rec.lrs.append(float(next(iter(schedulers)).get_last_lr()[0]))
        optimizers.step()
        schedulers.step()
        optimizers.zero_grad()
        rec.losses.append(float(total))
        rec.grad_norms.append(float(grad_norm))
        rec.params.append(_snapshot(model))
    module.eval()
    return rec


class ExpertBiasBalancing:
    """torchtitan's load balancing on transformers' Qwen3-MoE routers: the k experts are
    chosen by ``probs + bias`` while the weights stay ``probs`` (renormalised), tokens per
    expert are counted over the step's forward passes, and before each optimizer step
    ``bias += coeff * sign(mean - count)`` minus its mean. Qwen3-MoE itself has no such
    bias (transformers routes by ``probs``): this is the training recipe the backends run.
    Without it an expert that no token chooses stays frozen (weight decay only) while
    torchtitan's bias revives it."""

    def __init__(self, module: torch.nn.Module, coeff: float):
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter  # noqa: PLC0415  heavy: transformers; native training loads without it

        self.coeff = coeff
        self.routers = [m for m in module.modules() if isinstance(m, Qwen3MoeTopKRouter)]
        for router in self.routers:
            router.expert_bias = torch.zeros(router.num_experts)
            router.tokens = torch.zeros(router.num_experts)
            router.forward = self._biased_forward(router)

    @staticmethod
    def _biased_forward(router):
        def forward(hidden_states):
            x = hidden_states.reshape(-1, router.hidden_dim)
            logits = F.linear(x, router.weight)
            probs = torch.softmax(logits, dtype=torch.float, dim=-1)
            _, ids = torch.topk(probs + router.expert_bias, router.top_k, dim=-1)
            weights = probs.gather(-1, ids)
            if router.norm_topk_prob:
                weights = weights / weights.sum(dim=-1, keepdim=True)
            router.tokens += torch.bincount(ids.reshape(-1), minlength=router.num_experts).float()
            return logits, weights.to(logits.dtype), ids
        return forward

    def step(self) -> None:
        with torch.no_grad():
            for router in self.routers:
                delta = self.coeff * torch.sign(router.tokens.mean() - router.tokens)
                router.expert_bias += delta - delta.mean()
                router.tokens.zero_()


def train_reference(model: ParityModel, global_batches: list[list[Batch]], total_steps: int,
                    hp: Hyperparameters = EXPECTED) -> TrainRecord:
    """Step an HF (or reference) ParityModel with plain torch AdamW and the expected schedule
    (an HF Qwen3-MoE also with torchtitan's expert-bias load balancing)."""
    module = model.module
    balancing = ExpertBiasBalancing(module, hp.load_balance_coeff)
    module.train()
    params = [p for p in module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=hp.lr, betas=hp.betas, eps=hp.eps,
                            weight_decay=hp.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: reference_lr_factor(i, total_steps, hp))
    rec = TrainRecord(initial=_snapshot(model))
    for ranks in global_batches:
        batch = Batch.cat(ranks)
        loss = avg_loss(model.logits(batch), batch.labels)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, hp.max_norm)
        rec.lrs.append(float(sched.get_last_lr()[0]))
        balancing.step()  # torchtitan: an optimizer step pre-hook
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        rec.losses.append(float(loss.detach()))
        rec.grad_norms.append(float(grad_norm))
        rec.params.append(_snapshot(model))
    module.eval()
    return rec


def update_errors(a: TrainRecord, b: TrainRecord, step: int) -> dict[str, float]:
    """Per HF tensor: ||(a_k - a_0) - (b_k - b_0)|| / ||b_k - b_0|| after step ``k`` (1-based):
    how far the accumulated updates differ, relative to the update itself."""
    out = {}
    for key in sorted(set(a.params[step - 1]) & set(b.params[step - 1])):
        ua = a.params[step - 1][key].double() - a.initial[key].double()
        ub = b.params[step - 1][key].double() - b.initial[key].double()
        denom = float(ub.norm())
        out[key] = float((ua - ub).norm()) / denom if denom > 0 else float((ua - ub).norm())
    return out


def saved_update_errors(saved: dict[str, torch.Tensor], initial: dict[str, torch.Tensor],
                        reference_final: dict[str, torch.Tensor]) -> dict[str, float]:
    """Like :func:`update_errors` for a saved checkpoint: per reference tensor, the relative
    difference between the saved and the reference update from ``initial`` (inf if absent)."""
    out = {}
    for key, ref in reference_final.items():
        if key not in saved or saved[key].shape != ref.shape:
            out[key] = float("inf")
            continue
        ua = saved[key].double() - initial[key].double()
        ub = ref.double() - initial[key].double()
        denom = float(ub.norm())
        out[key] = float((ua - ub).norm()) / denom if denom > 0 else float((ua - ub).norm())
    return out


@dataclass(frozen=True)
class UpdateAgreement:
    """One tensor's update against the reference's: r = ||du|| / ||du_ref||, cos, and the
    relative error ||du - du_ref|| / ||du_ref||."""

    key: str
    ratio: float
    cosine: float
    error: float

    def problem(self, regime: str = "float32", device: str = "cpu") -> str | None:
        """Why this update is not the reference's (frozen, detached, double-counted, wrong
        direction), or None."""
        r_tol = parity_tolerance("update_ratio", regime, device).atol
        c_tol = parity_tolerance("update_cosine", regime, device).atol
        reasons = []
        if not abs(self.ratio - 1.0) <= r_tol:
            kind = ("frozen: no update" if self.ratio == 0 else
                    "update ~2x the reference's: double-counted?" if 1.7 <= self.ratio <= 2.3 else
                    "update far smaller than the reference's: detached or frozen?" if self.ratio < 0.5
                    else "update size differs")
            reasons.append(f"||du||/||du_ref|| = {self.ratio:.6g} (|r-1| > {r_tol:g}; {kind})")
        if not 1.0 - self.cosine <= c_tol:
            reasons.append(f"1 - cos(du, du_ref) = {1.0 - self.cosine:.3g} (> {c_tol:g}; direction differs)")
        return "; ".join(reasons) or None


def _agreement(key: str, du: torch.Tensor, du_ref: torch.Tensor) -> UpdateAgreement:
    du, du_ref = du.double(), du_ref.double()
    ref_norm, norm = float(du_ref.norm()), float(du.norm())
    ratio = norm / ref_norm if ref_norm > 0 else (0.0 if norm == 0 else float("inf"))
    cosine = float((du * du_ref).sum()) / (norm * ref_norm) if norm > 0 and ref_norm > 0 else float("nan")
    error = float((du - du_ref).norm()) / ref_norm if ref_norm > 0 else norm
    return UpdateAgreement(key, ratio, cosine, error)


def update_agreement(final: dict[str, torch.Tensor], initial: dict[str, torch.Tensor],
                     reference_final: dict[str, torch.Tensor],
                     reference_initial: dict[str, torch.Tensor] | None = None) -> dict[str, UpdateAgreement]:
    """Per reference tensor: the update ``final - initial`` against the reference's
    ``reference_final - reference_initial`` (default: the same initial). A tensor absent or
    of another shape in ``final`` gets ratio and error inf."""
    reference_initial = reference_initial if reference_initial is not None else initial
    out = {}
    for key, ref in reference_final.items():
        if key not in final or final[key].shape != ref.shape:
            out[key] = UpdateAgreement(key, float("inf"), float("nan"), float("inf"))
            continue
        out[key] = _agreement(key, final[key] - initial[key], ref - reference_initial[key])
    return out


def record_update_agreement(a: TrainRecord, b: TrainRecord, step: int) -> dict[str, UpdateAgreement]:
    """:func:`update_agreement` of two in-process records after ``step`` steps (1-based)."""
    return update_agreement(a.params[step - 1], a.initial, b.params[step - 1], b.initial)


def update_agreement_problems(agreements: dict[str, UpdateAgreement], regime: str = "float32",
                              device: str = "cpu") -> dict[str, str]:
    """{tensor: why} for every tensor whose update is not the reference's, within the bands of
    ``device`` (harness/registry/tolerances.py: coarse where never measured there)."""
    return {k: p for k, a in agreements.items() if (p := a.problem(regime, device))}


def format_update_agreement(agreements: dict[str, UpdateAgreement], problems: dict[str, str],
                            limit: int = 10) -> list[str]:
    worst = sorted(agreements.values(), key=lambda a: -max(abs(a.ratio - 1.0) if a.ratio == a.ratio else 9.0,
                                                           1.0 - a.cosine if a.cosine == a.cosine else 9.0))
    lines = [f"  {'tensor':<50} {'|du|/|du_ref|':>13} {'cos':>12} {'rel err':>10}"]
    for a in worst[:limit]:
        lines.append(f"  {a.key:<50} {a.ratio:>13.6g} {a.cosine:>12.8f} {a.error:>10.3e}"
                     f"{'  <-- ' + problems[a.key] if a.key in problems else ''}")
    return lines
