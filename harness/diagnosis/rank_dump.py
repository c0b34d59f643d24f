"""What the ranks leave for the diagnosis, under the run's dump folder, and how it is read.

- ``harness_initial/batch_rank0.pt``: rank 0's first batch as the trainer received it (else
  ``harness_batches/rank0_step1.pt`` of the data-path hooks, harness/data/rank_hooks.py);
- ``harness_initial/native_rank0_<unit>.pt``: a random-init run's step-0 weights under
  torchtitan's names, one file per unit (embedding, each layer, final norm, head), written by
  rank 0 after every rank gathered its shards, so memory stays that of one layer; models over
  ``MAX_PARAMS`` are not dumped. ``hf_weights_from_dump`` turns them into HF safetensors.

The ranks get the dump from the harness's ``sitecustomize`` (harness/upstream/boot), which
installs ``install`` as a post-import patch of ``torchtitan.trainer`` in every launched rank
that has the boot folder on its path (every CPU rank; it observes only).

A run without them is still diagnosable when it is pretrained (its weights are the HF
weights it loaded; its batch comes from torchtitan's dataloader, harness/diagnosis/subject.py).
"""

from __future__ import annotations

from pathlib import Path

INITIAL = "harness_initial"


def first_batch(run_dir: Path) -> dict | None:
    """Rank 0's first batch (input, positions, labels) as the trainer received it."""
    import torch

    for path in (Path(run_dir) / "dump" / INITIAL / BATCH,
                 Path(run_dir) / "dump" / "harness_batches" / "rank0_step1.pt"):
        if path.is_file():
            return torch.load(path, weights_only=True)
    return None


def initial_weights_dir(run_dir: Path) -> Path | None:
    """The folder of a random-init run's dumped step-0 weights (native names), if any."""
    folder = Path(run_dir) / "dump" / INITIAL
    return folder if folder.is_dir() and any(folder.glob(NATIVE.format(unit="*"))) else None


def initial_native_state(folder: Path) -> dict:
    """The dumped step-0 state, every unit's file together (torchtitan's names)."""
    import torch

    native = {}
    for path in sorted(Path(folder).glob(NATIVE.format(unit="*"))):
        native.update(torch.load(path, weights_only=True))
    return native


def hf_weights_from_dump(folder: Path, model_dir: Path) -> Path:
    """The dumped native state as an HF checkpoint folder (the harness's own conversion,
    harness/conformance/native_to_hf.py, not the adapter under test; the model's config.json
    beside it), written once into ``folder/hf``."""
    import shutil

    from safetensors.torch import save_file

    from harness.conformance.native_to_hf import hf_state_from_native

    import os

    out = Path(folder) / "hf"
    if (out / "model.safetensors").is_file():
        return out
    hf = {k: v.contiguous() for k, v in
          hf_state_from_native(initial_native_state(folder), model_dir).items()}
    out.mkdir(exist_ok=True)
    shutil.copy(Path(model_dir) / "config.json", out / "config.json")
    partial = out / f"model.safetensors.{os.getpid()}.partial"  # readers in other processes
    save_file(hf, str(partial))
    os.replace(partial, out / "model.safetensors")
    return out


# ---------------------------------------------------------------------------- rank side

BATCH = "batch_rank0.pt"
NATIVE = "native_rank0_{unit}.pt"  # one file per unit (embedding, each layer, norm, head)
MAX_PARAMS = 200_000_000  # a larger model is not dumped (a 4B random init would be 16 GB)


def _unit(name: str) -> str:
    parts = name.split(".")
    return f"{parts[0]}.{parts[1]}" if parts[0] == "layers" else parts[0]


def _dump_initial(trainer) -> None:
    """Every rank takes part (a sharded parameter is gathered); rank 0 writes, one unit at a
    time, so memory stays that of one layer."""
    import torch
    import torch.distributed as dist

    folder = Path(trainer.config.dump_folder) / INITIAL
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    model = trainer.model_parts[0]
    named = list(model.state_dict().items())
    if sum(t.numel() for _, t in named) > MAX_PARAMS:
        return
    if rank == 0:
        folder.mkdir(parents=True, exist_ok=True)
    units: dict[str, dict] = {}
    for name, tensor in named:
        t = tensor.detach()
        t = t.full_tensor() if hasattr(t, "full_tensor") else t
        if rank == 0:
            units.setdefault(_unit(name), {})[name] = t.cpu().clone()
            if len(units) > 1:  # the previous unit is complete
                done = next(iter(units))
                torch.save(units.pop(done), folder / NATIVE.format(unit=done))
    if rank == 0:
        for unit, tensors in units.items():
            torch.save(tensors, folder / NATIVE.format(unit=unit))


def install(trainer_module) -> None:
    """Post-import patch of ``torchtitan.trainer``: a random-init run's step-0 weights (right
    after the trainer built and initialised them) and rank 0's first batch, for the diagnosis."""
    import torch

    cls = trainer_module.Trainer
    if getattr(cls, "_harness_diagnosis_dump", False):
        return
    cls._harness_diagnosis_dump = True
    original_init = cls.__init__

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        if not getattr(self.config.checkpoint, "initial_load_path", None):
            _dump_initial(self)
        post = self.post_dataloading_process

        def first_batch(input_dict, labels):
            if self.step == 1 and _rank() == 0:
                folder = Path(self.config.dump_folder) / INITIAL
                folder.mkdir(parents=True, exist_ok=True)
                positions = input_dict.get("positions")
                torch.save({"input": input_dict["input"].detach().cpu().clone(),
                            "positions": None if positions is None else positions.detach().cpu().clone(),
                            "labels": labels.detach().cpu().clone()}, folder / BATCH)
            return post(input_dict, labels)

        self.post_dataloading_process = first_batch

    cls.__init__ = __init__


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def install_in_rank() -> None:
    """``install`` right after ``torchtitan.trainer`` is imported, on top of whatever other
    post-import patches (shims, plants) that module gets: the spec comes from the finders
    after this one, whose loaders are wrapped, never replaced."""
    import importlib.abc
    import sys

    class ChainedPostImport(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname != "torchtitan.trainer":
                return None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None and spec.loader is not None:
                    break
            else:
                return None
            exec_module = spec.loader.exec_module

            def exec_and_install(module):
                exec_module(module)
                install(module)

            spec.loader.exec_module = exec_and_install
            return spec

    if "torchtitan.trainer" in sys.modules:
        install(sys.modules["torchtitan.trainer"])
    else:
        sys.meta_path.insert(0, ChainedPostImport())
