"""torchtitan config overrides for opt-in parity workarounds (``--override.imports``).

torchtitan imports an override module in every rank and applies the named factory to the
matching config node after ``update_from_config`` (torchtitan/config/override.py). The harness
uses this for workarounds that are configuration, not code (harness/registry/known_issues/
``Workaround.rank_overrides`` / ``in_process``): applied only when asked (the root
``--workaround``) or when a test names the workaround it needs, never by default.
"""

from __future__ import annotations

from torchtitan.config.override import override
from torchtitan.experiments.transformers_modeling_backend.model import HFTransformerModel

BLOCK_CAUSAL = "harness.upstream.titan_overrides.hf_block_causal_mask"


@override(target=HFTransformerModel.Config,
          description="transformers backend: per-document causal mask (as native Qwen3)")
def hf_block_causal_mask(cfg: HFTransformerModel.Config) -> HFTransformerModel.Config:
    """Workaround for ``hf_v5-causal-mask-across-documents``: the ``full`` flavor's
    ``attn_mask_type`` defaults to "causal", so packed documents attend to each other in the
    transformers backend while torchtitan's native Qwen3 masks per document."""
    cfg.attn_mask_type = "block_causal"
    return cfg
