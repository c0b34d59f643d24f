"""FSDP2 gradient reduction over gloo: use SUM, then divide.

Why: torchtitan 0.3.0 gives FSDP2 a gradient divide factor, and torch 2.14's FSDP2 then
reduce-scatters with ``ReduceOp.PREMUL_SUM(1/factor)``, which gloo rejects ("Cannot use
ReduceOp.PREMUL_SUM with Gloo"). FSDP2 already has the fallback that MTIA uses: reduce with
SUM and divide afterwards (``force_sum_reduction_for_comms``). This shim turns that fallback
on for CPU tensors, i.e. whenever the process group is gloo. Same result up to float
rounding order.
"""

from __future__ import annotations

from types import ModuleType

SHIM_NAME = "gloo_reduce_op"


def force_sum_reduction_on_cpu(collectives: ModuleType) -> None:
    original = collectives._get_gradient_divide_factors

    def _get_gradient_divide_factors(*args, **kwargs):
        device_type = kwargs.get("device_type", args[3] if len(args) > 3 else "")
        if device_type == "cpu":
            kwargs["force_sum_reduction_for_comms"] = True
            args = args[:5]
        return original(*args, **kwargs)

    _get_gradient_divide_factors.__wrapped__ = original
    collectives._get_gradient_divide_factors = _get_gradient_divide_factors
