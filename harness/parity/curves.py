"""A launched run's curves against the in-process reference trajectory or another run.

The reference trajectory: transformers' model, ``torch.optim.AdamW``, the expected schedule and
clipping, on a run's own global batches (each data-parallel rank's dataloader shard,
concatenated, every microbatch of the step), packed rows masked as the run masks them. One per
(model, steps, mask, batches) per process.
"""

from __future__ import annotations

from harness.parity import compare
from harness.parity import models as M
from harness.parity import training as T
from harness.registry.tolerances import parity_tolerance

_trajectories: dict = {}


def reference_trajectory(model_dir, steps: int, mask: str, dp: int = 2,
                         rows_per_rank: int = 2) -> T.TrainRecord:
    """The reference trajectory on the global batches of ``dp`` data-parallel ranks reading
    ``rows_per_rank`` rows per step (a tiny FSDP run: 2 x 2), masked as ``mask``: "document",
    "row_causal" (a batch's form, ``Batch.masked_as``) or "causal" (the model's, ``load_hf``)."""
    key = (str(model_dir), steps, mask, dp, rows_per_rank)
    if key not in _trajectories:
        model_mask = "causal" if mask == "causal" else "document"
        batches = [[b if mask == "causal" else b.masked_as(mask) for b in ranks]
                   for ranks in M.dataloader_batches(model_dir, steps, dp=dp, local_batch_size=rows_per_rank)]
        _trajectories[key] = T.train_reference(M.load_hf(model_dir, mask=model_mask), batches,
                                               total_steps=steps)
    return _trajectories[key]


def _values(x, what: str) -> list[float]:
    """A TrainRecord's list, or a run's per-step values."""
    if isinstance(x, T.TrainRecord) or what == "loss":
        return list(getattr(x, {"loss": "losses", "grad_norm": "grad_norms", "lr": "lrs"}[what]))
    return [getattr(s, what) for s in x.steps]


def curve_reports(name, result, ref_name, ref, regime: str, loss: str = "torchrun_loss",
                  grad_norm: str = "grad_norm", device: str | None = None) -> list:
    """Loss, pre-clip grad norm and learning rate, step by step, against ``ref`` (a reference
    TrainRecord or another run's result), within the policy's ``loss`` and ``grad_norm``
    tolerances of ``regime`` on the device the run ran on (``device``: another device's bands,
    e.g. "neuron" to hold a CPU run to the coarse bounds trn2 is held to before it is measured)."""
    device = device or getattr(result, "device", None) or "cpu"
    band = parity_tolerance(loss, regime, device).atol
    gn_tol, lr_tol = parity_tolerance(grad_norm, regime, device), parity_tolerance("lr")
    gn_ref, lr_ref = _values(ref, "grad_norm"), _values(ref, "lr")
    return [
        compare.compare_curves("loss", name, _values(result, "loss"), ref_name, _values(ref, "loss"), band),
        compare.compare_curves("grad norm (pre-clip)", name, _values(result, "grad_norm"), ref_name, gn_ref,
                               [gn_tol.bound(abs(x)) for x in gn_ref]),
        compare.compare_curves("lr", name, _values(result, "lr"), ref_name, lr_ref,
                               [lr_tol.bound(abs(x)) for x in lr_ref]),
    ]


def saved_weights_problem(name, saved, initial, ref, regime, device: str = "cpu") -> str | None:
    """Per tensor: relative error (``torchrun_update``), size ratio and direction
    (``update_ratio``, ``update_cosine``) of the saved update against the reference's, within
    the bands of the device the run ran on."""
    agreements = T.update_agreement(saved, initial, ref.params[-1])
    bound = parity_tolerance("torchrun_update", regime).rtol
    problems = T.update_agreement_problems(agreements, regime, device)
    problems.update({k: f"rel err {a.error:.3e} > {bound:g}" for k, a in agreements.items()
                     if not a.error <= bound and k not in problems})
    if not problems:
        return None
    return compare.parity_message(
        f"{name}: {len(problems)} of {len(agreements)} saved tensors' updates are not the "
        f"reference trajectory's:", *T.format_update_agreement(agreements, problems))


def curves_problem(reports, *context: str) -> str | None:
    """None when every curve agrees, else the reports and ``context`` as one message."""
    if all(r.ok for r in reports):
        return None
    return compare.parity_message(*(r.format() for r in reports), *context)
