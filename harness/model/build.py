"""Building a model the way torchtitan's trainer builds it: the one home.

The trainer calls a config function for a ``Trainer.Config`` whose ``model_spec`` holds the model
config; it applies ``update_from_config`` (the run's settings reach the model: sequence length,
vocabulary from the assets, attention masks), builds the model on the meta device under the run's
default dtype, then materialises it (``to_empty``) and calls ``init_weights``. Every in-process
model of the harness (parity, the diagnosis walk, the random-init forward, config conformance,
a user config's lint) is built by these functions, from the backend's own config function where
the model is a backend's (``backend_config``), or from a ``Trainer.Config`` holding another spec
(``trainer_config_for``).

- ``backend_config(backend, size, attention, assets)``: what ``--module M --config C`` gives the
  trainer (the config functions are pure); a full size's assets are exported as the launcher
  exports them.
- ``meta_module(model_config, dtype)``: the model config built on the meta device.
- ``on_meta(config)``: the trainer's ``update_from_config``, then ``meta_module`` at the run's
  dtype (the transformers backend's global patches of transformers undone after the build).
- ``initialised(config, seed)``: ``on_meta``, ``to_empty``, ``init_weights``, ``train()``.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import os
import random
from pathlib import Path

import torch
from torch import nn

from harness.backends import backend as backend_spec
from harness.registry import environment


@contextlib.contextmanager
def _full_assets(assets: str | Path | None):
    """``environment.FULL_ASSETS`` set to ``assets`` inside the block (a full size's config function
    reads the assets it is built for there, as it does in a launched rank)."""
    if assets is None:
        yield
        return
    before = os.environ.get(environment.FULL_ASSETS)
    os.environ[environment.FULL_ASSETS] = str(assets)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(environment.FULL_ASSETS, None)
        else:
            os.environ[environment.FULL_ASSETS] = before


def backend_config(backend: str, size: str = "tiny", attention: str | None = None,
                   assets: str | Path | None = None):
    """The ``Trainer.Config`` of the registered backend's config function for ``size`` and
    ``attention`` (its default: the source's), with ``assets`` as a full size's assets dir."""
    spec = backend_spec(backend)
    module = importlib.import_module(spec.module)
    with _full_assets(assets):
        config = getattr(module, spec.config_name(size, attention))()
    if assets is not None:
        config.hf_assets_path = str(assets)
    return config


def trainer_config_for(model_spec, hf_assets_path: str | Path, trainer_cls=None):
    """A ``Trainer.Config`` holding ``model_spec``, with the tiny runs' shape and the backends'
    shared settings (harness/backends/common.py), reading ``hf_assets_path``."""
    from torchtitan.trainer import Trainer  # noqa: PLC0415  heavy: torchtitan; building on meta needs no trainer

    from harness.backends.common import TINY, shared_fields  # noqa: PLC0415  heavy: torchtitan via backends.common; building on meta needs it not

    cls = trainer_cls or Trainer.Config
    return cls(model_spec=model_spec, **shared_fields(TINY, hf_assets_path=str(hf_assets_path)))


def with_model(model_spec, model_config):
    """A copy of ``model_spec`` holding ``model_config`` (torchtitan's registry returns shared
    spec objects: never edit one in place)."""
    spec = copy.copy(model_spec)
    spec.model = model_config
    return spec


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def meta_module(model_config, dtype: torch.dtype = torch.float32) -> nn.Module:
    """``model_config.build()`` on the meta device, ``dtype`` the default (the trainer's
    ``training.dtype``)."""
    from torchtitan.tools.utils import set_default_dtype  # noqa: PLC0415  heavy: torchtitan; the module loads with torch alone

    with torch.device("meta"), set_default_dtype(dtype):
        return model_config.build()


def is_transformers_backend(config) -> bool:
    return hasattr(config, "hf_model")


_PATCH_SCOPES = [0]  # open transformers_backend_patches_restored blocks: only the outermost restores


@contextlib.contextmanager
def transformers_backend_patches_restored():
    """``HFTransformerModel.__init__`` monkey-patches transformers globally
    (``PreTrainedModel._init_weights`` / ``_initialize_weights`` and the decoder layers'
    ``__init__``): whatever is built (and initialised) inside this block has them; they are
    restored after it, so other models built in this process are unaffected. Blocks nest: an
    inner one (``on_meta`` inside a caller that initialises the model later, unit by unit)
    leaves the patches to the outermost, so the init that follows the build still has them."""
    if _PATCH_SCOPES[0]:
        _PATCH_SCOPES[0] += 1
        try:
            yield
        finally:
            _PATCH_SCOPES[0] -= 1
        return
    import transformers.models.qwen3.modeling_qwen3 as q3  # noqa: PLC0415  heavy: transformers; only the transformers backend's build patches it
    import transformers.models.qwen3_moe.modeling_qwen3_moe as q3m  # noqa: PLC0415  heavy: transformers; only the transformers backend's build patches it
    from transformers.modeling_utils import PreTrainedModel  # noqa: PLC0415  heavy: transformers; only the transformers backend's build patches it

    saved = {
        (PreTrainedModel, "_init_weights"): PreTrainedModel.__dict__["_init_weights"],
        (PreTrainedModel, "_initialize_weights"): PreTrainedModel.__dict__["_initialize_weights"],
        (q3.Qwen3DecoderLayer, "__init__"): q3.Qwen3DecoderLayer.__dict__["__init__"],
        (q3m.Qwen3MoeDecoderLayer, "__init__"): q3m.Qwen3MoeDecoderLayer.__dict__["__init__"],
    }
    _PATCH_SCOPES[0] = 1
    try:
        yield
    finally:
        _PATCH_SCOPES[0] = 0
        for (owner, attr), value in saved.items():
            setattr(owner, attr, value)


def _patches_restored(config):
    return transformers_backend_patches_restored() if is_transformers_backend(config) else contextlib.nullcontext()


def _built(config, updated: bool) -> nn.Module:
    from torchtitan.config import TORCH_DTYPE_MAP  # noqa: PLC0415  heavy: torchtitan; the module loads with torch alone

    model_config = config.model_spec.model
    if not updated:
        model_config.update_from_config(config=config)
    return meta_module(model_config, TORCH_DTYPE_MAP[config.training.dtype])


def on_meta(config, *, updated: bool = False) -> nn.Module:
    """The model of ``config`` (a ``Trainer.Config``) on the meta device, as the trainer builds
    it before parallelising: ``update_from_config`` (unless the caller already applied it),
    then ``meta_module`` at the run's ``training.dtype``."""
    with _patches_restored(config):
        return _built(config, updated)


def initialised(config, seed: int, *, updated: bool = False) -> nn.Module:
    """``on_meta``, then what the trainer does on one process: ``to_empty`` on CPU,
    ``init_weights``, ``train()`` (seeded; the transformers backend's patches of transformers
    stay in force until its weights are initialised)."""
    seed_everything(seed)
    with _patches_restored(config):
        model = _built(config, updated)
        model.to_empty(device="cpu")
        with torch.no_grad():
            model.init_weights(buffer_device=None)
    model.train()
    return model
