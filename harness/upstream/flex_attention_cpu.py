"""FlexAttention on CPU: run it eagerly and let autograd through.

Why: torchtitan 0.3.0 always wraps flex attention in ``torch.compile`` (its ``sdpa`` backend is
rejected: "sdpa is no longer supported"), torch 2.14's ``flex_attention`` refuses backward on
CPU in ``_validate_device`` ("FlexAttention does not support backward on CPU"), and the
inductor CPU flex backward is not a path upstream supports. Eager flex attention computes the
same math densely (the HOP's reference implementation) and differentiates through it, which
is what the tiny CPU models need. Only the CPU check is lifted: every other device check
is kept.

``torchtitan.distributed.utils.set_determinism`` re-assigns the compiled kernel when
``debug.deterministic`` is on, so that function is wrapped to put the eager one back.
transformers 5.x compiles flex attention on its own (``compile_friendly_flex_attention``),
which the transformers modeling backend reaches; on CPU tensors that call runs eagerly too.

Block masks likewise: torchtitan builds every flex ``BlockMask`` through
``_compiled_create_block_mask = torch.compile(create_block_mask)`` (both generations). On CPU
that is an inductor C++ compile in every rank of every launch: step 1 of a tiny flex run took
5-7 s against 0.3-0.8 s for the SDPA runs, measured. The uncompiled function evaluates the same
mask_mod over the same blocks and returns the same block indices, bit for bit (the shim's
effect test holds the two against each other), in milliseconds. A mask for another device
still goes through the compiled function.
"""

from __future__ import annotations

from types import ModuleType

SHIM_NAME = "flex_attention_cpu"


def allow_cpu_backward(flex_module: ModuleType) -> None:
    original = flex_module._validate_device

    def _validate_device(query, key, value):
        if query.device.type == "cpu":
            return None
        return original(query, key, value)

    _validate_device.__wrapped__ = original
    flex_module._validate_device = _validate_device


def run_flex_eagerly(attention_module: ModuleType) -> None:
    from torch.nn.attention.flex_attention import flex_attention  # noqa: PLC0415  heavy: torch; the rank's shims install before torch loads

    attention_module.FlexAttention._compiled_flex_attn = staticmethod(flex_attention)


def keep_flex_eager_under_determinism(dist_utils_module: ModuleType) -> None:
    original = dist_utils_module.set_determinism

    def set_determinism(*args, **kwargs):
        result = original(*args, **kwargs)
        from torchtitan.models.common import attention  # noqa: PLC0415  heavy: torchtitan; the rank's shims install before it loads

        run_flex_eagerly(attention)
        return result

    set_determinism.__wrapped__ = original
    dist_utils_module.set_determinism = set_determinism


def transformers_flex_eager_on_cpu(hf_flex_module: ModuleType) -> None:
    from torch.nn.attention.flex_attention import flex_attention  # noqa: PLC0415  heavy: torch; the rank's shims install before torch loads

    original = hf_flex_module.compile_friendly_flex_attention

    def compile_friendly_flex_attention(query, key, value, training=False, **kwargs):
        if query.device.type == "cpu":
            return flex_attention(query, key, value, **kwargs)
        return original(query, key, value, training=training, **kwargs)

    compile_friendly_flex_attention.__wrapped__ = original
    hf_flex_module.compile_friendly_flex_attention = compile_friendly_flex_attention


def build_block_masks_eagerly_on_cpu(attention_module: ModuleType) -> None:
    from torch.nn.attention.flex_attention import create_block_mask  # noqa: PLC0415  heavy: torch; the rank's shims install before torch loads

    compiled = attention_module._compiled_create_block_mask
    if getattr(compiled, "shim", None) == SHIM_NAME:
        return  # installed already (torch.compile's own wrapper has a __wrapped__ too)

    def _create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device=None, **kwargs):
        import torch  # noqa: PLC0415  heavy: torch; the rank's shims install before torch loads

        # create_block_mask's own default: the current accelerator, else the CPU
        where = device if device is not None else (torch.accelerator.current_accelerator() or "cpu")
        if torch.device(where).type == "cpu":
            return create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device=device, **kwargs)
        return compiled(mask_mod, B, H, Q_LEN, KV_LEN, device=device, **kwargs)

    _create_block_mask.__wrapped__ = compiled
    _create_block_mask.shim = SHIM_NAME
    attention_module._compiled_create_block_mask = _create_block_mask
