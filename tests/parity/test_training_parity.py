"""Three optimizer steps: torchtitan's training components vs an independent reference.

torchtitan side: the native model stepped by the optimizer, LR schedule, loss and gradient
clipping that the ``titan_native`` backend's own ``Trainer.Config`` builds. Reference side:
transformers' model with ``torch.optim.AdamW``, ``LambdaLR`` and ``clip_grad_norm_`` set from
the harness's statement of the run (harness/parity/training.py ``EXPECTED``: lr 8e-4, betas
(0.9, 0.95), eps 1e-8, weight decay 0.1, clip 1.0, 2 warmup steps, linear decay to 0).
Compared per step: loss, pre-clip grad norm, learning rate, and every tensor's accumulated
update (relative error, and separately its size ratio and direction).
"""

from __future__ import annotations

import pytest
import torch

from harness.backends import hf_v5, nki_moe, titan_native
from harness.parity import compare
from harness.parity import models as M
from harness.parity import training as T
from harness.registry.tolerances import parity_tolerance as tolerance

STEPS = 3


@pytest.mark.parametrize("backend", [titan_native, hf_v5, nki_moe],
                         ids=["titan_native", "hf_v5", "nki_moe"])
def test_backend_config_states_the_expected_hyperparameters(backend):
    stated = T.stated_hyperparameters(backend.tiny())
    problems = T.hyperparameter_violations(stated)
    assert not problems, compare.parity_message(
        f"{backend.__name__}.tiny(): optimizer / schedule / clipping differ from the expected run:",
        *(f"  {p}" for p in problems), f"stated: {stated}")


def test_lr_schedule_matches_reference_schedule():
    """torchtitan's LambdaLR factors over a 10-step run equal the documented schedule."""
    cfg = titan_native.tiny()
    steps = cfg.training.steps
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([param], lr=T.EXPECTED.lr)
    holder = type("Opts", (), {"__iter__": lambda self: iter([opt]), "__len__": lambda self: 1})()
    scheds = cfg.lr_scheduler.build(optimizers=holder, training_steps=steps)
    got = []
    for _ in range(steps):
        got.append(next(iter(scheds)).get_last_lr()[0])
        opt.step()
        for s in scheds:
            s.step()
    want = T.reference_lrs(steps, steps)
    report = compare.compare_curves("learning rate", "torchtitan", got, "reference", want,
                                    lambda i: tolerance("lr").bound(abs(want[i - 1])))
    assert report.ok, compare.parity_message(report.format())


@pytest.fixture(scope="module")
def three_steps(dense_dir):
    batches = M.dataloader_batches(dense_dir, STEPS)
    native = M.build_native(dense_dir)
    hf = M.load_hf(dense_dir)
    native_rec = T.train_native(native, native.trainer_config, batches, total_steps=STEPS)
    ref_rec = T.train_reference(hf, batches, total_steps=STEPS)
    return native_rec, ref_rec


def test_built_optimizer_carries_the_expected_hyperparameters(three_steps):
    native_rec, _ = three_steps
    assert not native_rec.notes, compare.parity_message(*native_rec.notes)


def test_three_steps_losses_grad_norms_and_lrs_match(three_steps):
    n, r = three_steps
    reports = [
        compare.compare_curves("loss", "torchtitan", n.losses, "reference", r.losses,
                               tolerance("train_loss").atol),
        compare.compare_curves("grad norm (pre-clip)", "torchtitan", n.grad_norms, "reference", r.grad_norms,
                               [tolerance("grad_norm").bound(abs(x)) for x in r.grad_norms]),
        compare.compare_curves("learning rate", "torchtitan", n.lrs, "reference", r.lrs,
                               [tolerance("lr").bound(abs(x)) for x in r.lrs]),
    ]
    assert all(rep.ok for rep in reports), compare.parity_message(*(rep.format() for rep in reports))


@pytest.mark.parametrize("step", range(1, STEPS + 1))
def test_parameters_after_each_step_match(three_steps, step):
    """Per HF tensor: ||update_native - update_ref|| / ||update_ref|| after ``step`` steps."""
    n, r = three_steps
    errors = T.update_errors(n, r, step)
    bound = tolerance("train_update").rtol
    bad = {k: e for k, e in errors.items() if not e <= bound}
    worst = sorted(errors.items(), key=lambda kv: -kv[1])[:8]
    missing = sorted(set(r.params[step - 1]) ^ set(n.params[step - 1]))
    assert not bad and not missing, compare.parity_message(
        f"after step {step}: {len(bad)} of {len(errors)} tensors' accumulated updates differ by more "
        f"than {bound:g} (relative):",
        *(f"  {k:<50} {e:.3e}{'  <--' if k in bad else ''}" for k, e in worst),
        f"  tensors only on one side: {missing}" if missing else "",
        compare.compare_curves("loss", "torchtitan", n.losses, "reference", r.losses,
                               tolerance("train_loss").atol).format())


@pytest.mark.parametrize("step", range(1, STEPS + 1))
def test_each_tensor_update_has_the_reference_size_and_direction(three_steps, step):
    """Per HF tensor, after ``step`` steps: ||du|| / ||du_ref|| within ``update_ratio`` of 1
    and cos(du, du_ref) within ``update_cosine`` of 1 (a frozen, detached or double-counted
    tensor, or an update in the wrong direction, is named)."""
    n, r = three_steps
    agreements = T.record_update_agreement(n, r, step)
    problems = T.update_agreement_problems(agreements, "float32")
    assert not problems and len(agreements) == len(r.params[step - 1]), compare.parity_message(
        f"after step {step}: {len(problems)} of {len(agreements)} tensors' updates differ in size or "
        f"direction:", *T.format_update_agreement(agreements, problems))
