"""spring-2026 torchtitan: FSDP2 for the transformers backend with tied embeddings.

Defect (torchtitan ``main`` a9c5edc74, the public base of TorchTitan Neuron 0.2.2+neuron.1):
``torchtitan/experiments/transformers_modeling_backend/parallelize.py`` ``apply_fsdp`` shards
``model.tok_embeddings`` in one FSDP group and ``[model.norm, model.lm_head]`` in another. With
``tie_word_embeddings`` (Qwen3-0.6B..4B, the tiny dense fixture) the embedding and the output
projection are one parameter, so the first forward fails in FSDP's lazy init: ``ValueError:
Parameter 'None' is shared with a parameter already managed by another FSDP group`` (even on
one rank: FSDP is applied whenever dp_shard is on). torchtitan 0.3.0 fixed it by sharding
``[tok_embeddings, norm, lm_head]`` as one group when the weights are tied.

Shim: while spring's ``apply_fsdp`` runs on a tied model, its ``fully_shard`` defers the
embedding's own group and adds the embedding to the ``[norm, lm_head]`` group: exactly
0.3.0's grouping (that group keeps spring's ``reshard_after_forward`` choice, as 0.3.0 does).
Untied models are untouched.

Applied by ``harness.upstream.titan_api.spring2026`` in-process before the backend is used (and by name
through ``HARNESS_SHIMS=hf_tied_fsdp``). tests/selftest/test_upstream_shims.py notices when
the generation no longer needs it.
"""

from __future__ import annotations

from types import ModuleType

SHIM_NAME = "hf_tied_fsdp"


def _tied(model) -> bool:
    embeddings, lm_head = getattr(model, "tok_embeddings", None), getattr(model, "lm_head", None)
    weight = getattr(embeddings, "weight", None)
    return weight is not None and weight is getattr(lm_head, "weight", None)


def group_tied_embeddings(parallelize_module: ModuleType) -> None:
    """Wrap ``parallelize_module.apply_fsdp`` (idempotent)."""
    original = parallelize_module.apply_fsdp
    if getattr(original, "_harness_shim", None) == SHIM_NAME:
        return

    def apply_fsdp(model, *args, **kwargs):
        if not _tied(model):
            return original(model, *args, **kwargs)
        module_fully_shard = parallelize_module.fully_shard
        embeddings = model.tok_embeddings

        def fully_shard(modules, *a, **k):
            if modules is embeddings:
                return modules  # deferred: sharded with [norm, lm_head] below
            if isinstance(modules, list) and model.lm_head in modules:
                modules = [embeddings, *modules]
            return module_fully_shard(modules, *a, **k)

        parallelize_module.fully_shard = fully_shard
        try:
            return original(model, *args, **kwargs)
        finally:
            parallelize_module.fully_shard = module_fully_shard

    apply_fsdp.__wrapped__ = original
    apply_fsdp._harness_shim = SHIM_NAME
    parallelize_module.apply_fsdp = apply_fsdp


PATCHES = (
    ("torchtitan.experiments.transformers_modeling_backend.parallelize", group_tied_embeddings),
)
