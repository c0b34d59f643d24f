"""spring-2026 torchtitan + transformers 5.x: let the transformers backend's Config import.

Defect (torchtitan ``main`` a9c5edc74, 2026-06-09, the public base of TorchTitan Neuron
0.2.2+neuron.1): ``torchtitan/experiments/transformers_modeling_backend/model.py`` declares
``HFTransformerModel.Config(BaseModel.Config, PretrainedConfig)`` with
``@dataclass(kw_only=True, slots=True)``. transformers 5.x made ``PretrainedConfig`` itself a
dataclass whose fields (``transformers_version``, ``architectures``, ``output_hidden_states``,
``return_dict``, ``dtype``, ``chunk_size_feed_forward``, ``is_encoder_decoder``, ``id2label``,
``label2id``, ``problem_type``) are not keyword-only, and ``Configurable.__init_subclass__``
(``torchtitan/config/configurable.py``) rejects any init field that is not keyword-only:
importing the backend raises ``TypeError: HFTransformerModel.Config field
'transformers_version' must be keyword-only``, so that commit's transformers backend cannot
be used at all with transformers 5.x (its README names transformers 4.57.1). torchtitan
0.3.0 fixed it by redeclaring those fields ``init=False`` in the Config.

Shim: while ``Configurable.__init_subclass__`` checks a Config that inherits from
transformers' ``PretrainedConfig``, the fields it inherits from ``PretrainedConfig`` count as
keyword-only (the Config defines its own ``__init__``, so the dataclass-generated signature the
check protects is never used). The fields are shared ``dataclasses.Field`` objects, so they are
flipped only for the duration of that one check and restored after it: transformers' own
config classes are unaffected. Every other check is kept.

Applied by ``harness.upstream.titan_api.spring2026`` in-process before it imports the transformers
backend (and by name through ``HARNESS_SHIMS=hf_config_kw_only``). Delete it when the fork
(or the harness's supported generations) no longer needs it
(tests/selftest/test_upstream_shims.py notices).
"""

from __future__ import annotations

import dataclasses
from types import ModuleType

SHIM_NAME = "hf_config_kw_only"


def _pretrained_config_base(config_cls: type) -> type | None:
    # transformers 5.x names the class PreTrainedConfig (PretrainedConfig is an alias).
    for base in config_cls.__mro__:
        if base.__module__ == "transformers.configuration_utils" and base.__name__ in (
            "PreTrainedConfig", "PretrainedConfig"
        ):
            return base
    return None


def _inherited_positional_fields(config_cls) -> list[dataclasses.Field]:
    if not isinstance(config_cls, type) or not dataclasses.is_dataclass(config_cls):
        return []
    base = _pretrained_config_base(config_cls)
    if base is None or not dataclasses.is_dataclass(base):
        return []
    inherited = base.__dataclass_fields__
    return [
        f for f in dataclasses.fields(config_cls)
        if f.init and not f.kw_only and inherited.get(f.name) is f
    ]


def allow_pretrained_config_fields(configurable_module: ModuleType) -> None:
    """Wrap ``Configurable.__init_subclass__`` (idempotent)."""
    cls = configurable_module.Configurable
    current = cls.__dict__["__init_subclass__"]
    original = current.__func__ if isinstance(current, classmethod) else current
    if getattr(original, "_harness_shim", None) == SHIM_NAME:
        return

    def __init_subclass__(subclass, **kwargs):
        flipped = _inherited_positional_fields(subclass.__dict__.get("Config"))
        for f in flipped:
            f.kw_only = True
        try:
            original(subclass, **kwargs)
        finally:
            for f in flipped:
                f.kw_only = False

    __init_subclass__._harness_shim = SHIM_NAME
    __init_subclass__.__wrapped__ = original
    cls.__init_subclass__ = classmethod(__init_subclass__)


PATCHES = (("torchtitan.config.configurable", allow_pretrained_config_fields),)
