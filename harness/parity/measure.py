"""Re-measure the numbers behind the parity section of harness/registry/tolerances.py.

    python -m harness.parity.measure                      # everything (~10 min on 2 cores)
    python -m harness.parity.measure tiny_moe training    # a subset: tiny_dense, tiny_moe, training

Prints, for several data batches and several random-weight checkpoints besides the trained
fixtures, the worst relative differences (max|a-b| / max|ref|) per quantity, and for training
the per-tensor update error, size ratio and direction. The torchrun numbers (update ratio and
cosine of saved checkpoints, grad norms per step) come from tests/parity/test_torchrun_parity.py's
runs: its failure messages print every tensor's ratio, cosine and error. Tolerances are
set from these with a stated margin; rerun this after a torch/transformers/torchtitan bump.
"""

from __future__ import annotations

import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

from harness.registry import paths


def random_checkpoint(template_dir: Path, seed: int, out_dir: Path) -> Path:
    """An HF checkpoint with the template's config and freshly seeded weights (HF init)."""
    import transformers  # noqa: PLC0415  heavy: transformers; the module loads with torch alone

    cfg = transformers.AutoConfig.from_pretrained(str(template_dir))
    torch.manual_seed(seed)
    model = getattr(transformers, cfg.architectures[0])(cfg).float()
    with torch.no_grad():  # HF's init is std 0.02: scale up so logits are O(1), as when trained
        for _name, p in model.named_parameters():
            if p.dim() >= 2:
                p.mul_(5.0)
    model.save_pretrained(str(out_dir))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (out_dir / f).write_bytes((template_dir / f).read_bytes())
    return out_dir


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    scale = float(b.double().abs().max())
    return float((a.double() - b.double()).abs().max()) / (scale if scale > 0 else 1.0)


def rms_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    denom = float(b.double().norm())
    return float((a.double() - b.double()).norm()) / (denom if denom > 0 else 1.0)


def measure_forward(model_dir: Path, batches, stats, tag: str) -> None:
    from harness.parity import models as M  # noqa: PLC0415  heavy: torchtitan via parity.models; loaded per measurement

    moe = M.Qwen3Arch.from_dir(model_dir).is_moe
    hf, nat, ref = M.load_hf(model_dir), M.build_native(model_dir), M.reference_model(model_dir)
    refb = M.reference_model(model_dir, expert_dtype=torch.bfloat16) if moe else None
    cus = M.build_native(model_dir, custom_ops=True) if moe else None
    kind = ("moe" if moe else "dense") + (" [random]" if "random" in tag else " [trained]")
    for b in batches:
        _, ah = hf.record_activations(b)
        _, an = nat.record_activations(b)
        _, ar = ref.record_activations(b)
        for k in ar:
            if k.endswith("router_top_ids"):
                frac = float((ah[k].sort(-1).values != an[k].sort(-1).values).any(-1).float().mean())
                stats[f"{kind} router flips hf vs native"].append(frac)
                continue
            stats[f"{kind} act hf vs ref [{k.split('.')[-1] if '.' in k else k}]"].append(rel(ah[k], ar[k]))
            stats[f"{kind} act native vs hf [{k.split('.')[-1] if '.' in k else k}]"].append(rel(an[k], ah[k]))
            stats[f"{kind} act native vs hf RMS [{k.split('.')[-1] if '.' in k else k}]"].append(rms_rel(an[k], ah[k]))
        if moe:
            _, arb = refb.record_activations(b)
            _, ac = cus.record_activations(b)
            stats["moe logits native vs ref-bf16"].append(rel(an["logits"], arb["logits"]))
            stats["moe logits custom vs native"].append(rel(ac["logits"], an["logits"]))
        lh, ln = hf.loss(b), nat.loss(b)
        stats[f"{kind} |loss hf - native|"].append(abs(float(lh.detach()) - float(ln.detach())))
        # gradients
        for m in (hf, nat):
            m.zero_grad()
            m.module.train()
            m.loss(b).backward()
            m.module.eval()
        gh, gn = hf.hf_tensors("grad"), nat.hf_tensors("grad")
        worst = max(rel(gn[k], gh[k]) for k in gh if k in gn)
        stats[f"{kind} grad native vs hf (worst param)"].append(worst)
        stats[f"{kind} grad native vs hf RMS (worst param)"].append(max(rms_rel(gn[k], gh[k]) for k in gh if k in gn))
        hf.zero_grad()
        nat.zero_grad()
    print(f"  measured {tag}", flush=True)


def measure_training(model_dir: Path, steps: int, stats) -> None:
    from harness.parity import models as M  # noqa: PLC0415  heavy: torchtitan via parity.models; loaded per measurement
    from harness.parity import training as T  # noqa: PLC0415  heavy: torchtitan via parity.training; loaded per measurement

    batches = M.dataloader_batches(model_dir, steps)
    nat = M.build_native(model_dir)
    hf = M.load_hf(model_dir)
    rn = T.train_native(nat, nat.trainer_config, batches, total_steps=steps)
    rh = T.train_reference(hf, batches, total_steps=steps)
    for s in range(1, steps + 1):
        errs = T.update_errors(rn, rh, s)
        stats[f"train step {s} update rel err (worst tensor)"].append(max(errs.values()))
        agree = T.record_update_agreement(rn, rh, s)
        stats[f"train step {s} update |ratio-1| (worst tensor)"].append(max(abs(a.ratio - 1) for a in agree.values()))
        stats[f"train step {s} update 1-cos (worst tensor)"].append(max(1 - a.cosine for a in agree.values()))
        stats[f"train step {s} |loss diff|"].append(abs(rn.losses[s - 1] - rh.losses[s - 1]))
        stats[f"train step {s} |grad norm diff|/norm"].append(
            abs(rn.grad_norms[s - 1] - rh.grad_norms[s - 1]) / rh.grad_norms[s - 1])


def main(argv: list[str]) -> int:
    only = set(argv)
    from harness.parity import models as M  # noqa: PLC0415  heavy: torchtitan via parity.models; loaded per measurement

    stats: dict[str, list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        for template in (paths.TINY_DENSE, paths.TINY_MOE):
            if only and template.name not in only:
                continue
            batches = [b[0] for b in M.dataloader_batches(template, 4)]
            measure_forward(template, batches, stats, f"{template.name} (trained, 4 batches)")
            for seed in (1, 2, 3):
                d = random_checkpoint(template, seed, Path(tmp) / f"{template.name}-{seed}")
                measure_forward(d, batches[:2], stats, f"{template.name} random seed {seed}")
        for template in (paths.TINY_DENSE,):
            if only and "training" not in only:
                continue
            measure_training(template, 3, stats)
            for seed in (1, 2):
                d = Path(tmp) / f"{template.name}-{seed}"
                if not d.exists():
                    d = random_checkpoint(template, seed, d)
                measure_training(d, 3, stats)
    width = max(len(k) for k in stats)
    for k in sorted(stats):
        v = stats[k]
        print(f"{k:<{width}}  max {max(v):.3e}  mean {sum(v) / len(v):.3e}  n={len(v)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
