"""The operator registry: for each op its reference, cases and implementations under test.

Tests are generated from ``OPS`` (tests/kernels/test_conformance.py); nothing is hand-listed
there. Add an implementation here and it is tested on every case, dtype and device it lists.
"""

from __future__ import annotations

import importlib
import inspect

import torch

from harness.kernels.checks import cases, references
from harness.kernels.checks.adapters import harness_ops, nki_kernels, nkilib, torchtitan, transformers
from harness.kernels.checks.spec import Implementation, OpSpec, module_probe
from harness.kernels.ops.neuron import nki_available
from harness.registry import upstream

HOST = ("cpu", "cuda")

has_torchtitan = module_probe("torchtitan")
has_transformers = module_probe("transformers")


def has_nkilib() -> tuple[bool, str]:
    """The real ``nki`` and nki-library (bundled ``nkilib`` or the standalone ``nkilib_src``)."""
    ok, reason = nki_available()
    if not ok:
        return False, reason
    bundled = module_probe("nkilib")()
    return bundled if bundled[0] else module_probe("nkilib_src.nkilib")()


def has_nkilib_wheel() -> tuple[bool, str]:
    """nki-library's standalone wheel (package ``nkilib_src.nkilib``, pinned in
    constraints/upstream.toml), for the emulator tier."""
    reason = upstream.missing("nki-library")
    return (False, reason) if reason else (True, "nkilib_src imports")


def has_torchtitan_and_nkilib_wheel() -> tuple[bool, str]:
    ok, reason = has_torchtitan()
    return has_nkilib_wheel() if ok else (ok, reason)


EMU = {"nki-emu": has_nkilib_wheel}


def _input(dtype, device):
    return dtype


def _fp32_at_least(dtype, device):
    return torch.promote_types(dtype, torch.float32)


def _bf16(dtype, device):
    return torch.bfloat16


def _same(name: str):
    return lambda dtype, device: {name: dtype}


def _torchtitan_router_compute(dtype, device):
    # torch.autocast(dtype=float32) works on CUDA; on CPU torch disables it ("CPU Autocast only
    # supports dtypes of torch.bfloat16, torch.float16"), so the gate and softmax run in dtype.
    return torch.promote_types(dtype, torch.float32) if device == "cuda" else dtype


def _router_cotangents(outputs: dict, inputs: dict, gen: torch.Generator) -> dict:
    """Upstream gradient per (token, expert id), gathered by the ids chosen: order-invariant."""
    tokens, experts = outputs["weights"].shape[0], inputs["gate_weight"].shape[0]
    dense = torch.randn(tokens, experts, generator=gen, dtype=torch.float64)
    return {"weights": dense.gather(1, outputs["ids"].detach().cpu().long())}


ROTARY_EMBEDDING = OpSpec(
    name="rotary_embedding",
    title="Rotary position embedding (rotate-half, Qwen3)",
    op_class="elementwise",
    reference=references.rotary_embedding,
    float_inputs=("x",),
    diff_inputs=("x",),
    diff_outputs=("y",),
    cases=cases.rope_cases(),
    gradcheck_case=cases.rope_gradcheck_case(),
    kernels=(("harness.kernels.ops.rope", "rope"), ("harness.kernels.ops.nki.rope_kernel", "rope_halves_kernel")),
    implementations=(
        Implementation(
            "torchtitan", "torchtitan", "torchtitan.models.common.rope.CosSinRoPE", HOST,
            torchtitan.rotary_embedding, _fp32_at_least, requires=has_torchtitan, output_dtypes=_same("y"),
        ),
        Implementation(
            "transformers", "transformers", "transformers Qwen3RotaryEmbedding + qwen3 apply_rotary_pos_emb", HOST,
            transformers.rotary_embedding, _input, requires=has_transformers, output_dtypes=_same("y"),
            notes="cos/sin are cast to x's dtype before the products (HF's dtype policy)",
        ),
        Implementation(
            "harness_op", "harness", "torch.ops.harness.rope via CustomOpCosSinRoPE", (*HOST, "neuron"),
            harness_ops.rotary_embedding, _fp32_at_least, requires=has_torchtitan, output_dtypes=_same("y"),
        ),
        Implementation(
            "nki_contract", "harness", "harness.kernels.ops.nki.rope_kernel: torch twin through the kernel layout",
            ("cpu",), nki_kernels.rotary_embedding, _fp32_at_least, backward=False, requires=has_torchtitan,
            output_dtypes=_same("y"),
        ),
        Implementation(
            "nki_kernel", "nki", "harness.kernels.ops.nki.rope_kernel.rope_halves_kernel",
            ("nki-emu", "nki-sim", "neuron"), nki_kernels.rotary_embedding, _fp32_at_least, backward=False,
            requires=has_torchtitan, output_dtypes=_same("y"),
        ),
        Implementation(
            "nkilib", "nkilib", "nkilib.core.embeddings.rope.RoPE", ("nki-emu", "nki-sim", "neuron"),
            nkilib.rotary_embedding, _input, backward=False, requires=has_nkilib, output_dtypes=_same("y"),
            device_requires={"nki-emu": has_torchtitan_and_nkilib_wheel},
        ),
    ),
)

RMS_NORM = OpSpec(
    name="rms_norm",
    title="RMSNorm",
    op_class="normalization",
    reference=references.rms_norm,
    float_inputs=("x", "weight"),
    diff_inputs=("x", "weight"),
    diff_outputs=("y",),
    cases=cases.rmsnorm_cases(),
    gradcheck_case=cases.rmsnorm_gradcheck_case(),
    implementations=(
        Implementation(
            "torchtitan", "torchtitan", "torchtitan.models.common.nn_modules.RMSNorm (nn.RMSNorm)", HOST,
            torchtitan.rms_norm, _input, requires=has_torchtitan, output_dtypes=_same("y"),
        ),
        Implementation(
            "transformers", "transformers", "transformers Qwen3RMSNorm", HOST,
            transformers.rms_norm, _input, requires=has_transformers, output_dtypes=_same("y"),
        ),
    ),
)

MOE_ROUTER = OpSpec(
    name="moe_router",
    title="MoE router: softmax over experts, top-k, renormalise",
    op_class="routing",
    reference=references.moe_router,
    float_inputs=("x", "gate_weight"),
    diff_inputs=("x", "gate_weight"),
    diff_outputs=("weights",),
    discrete_outputs=("ids",),
    ignore_outputs=("probs",),
    cases=cases.router_cases(),
    gradcheck_case=cases.router_gradcheck_case(),
    pin=lambda outputs: {"ids": outputs["ids"].detach().cpu().long()},
    cotangents=_router_cotangents,
    implementations=(
        Implementation(
            "torchtitan", "torchtitan", "torchtitan.models.common.moe.TokenChoiceTopKRouter (softmax, route_norm)",
            HOST,
            torchtitan.moe_router, _torchtitan_router_compute, requires=has_torchtitan,
            output_dtypes=torchtitan.router_output_dtypes,
        ),
        Implementation(
            "transformers", "transformers", "transformers Qwen3MoeTopKRouter", HOST,
            transformers.moe_router, _input, requires=has_transformers, output_dtypes=transformers.router_output_dtypes,
        ),
    ),
)

GROUPED_SWIGLU = OpSpec(
    name="grouped_swiglu",
    title="MoE grouped expert SwiGLU MLP",
    op_class="grouped_matmul",
    reference=references.grouped_swiglu,
    float_inputs=("x", "w1", "w2", "w3"),
    diff_inputs=("x", "w1", "w2", "w3"),
    diff_outputs=("y",),
    cases=cases.swiglu_cases(),
    gradcheck_case=cases.swiglu_gradcheck_case(),
    kernels=(("harness.kernels.ops.grouped_swiglu", "grouped_swiglu"),
             ("harness.kernels.ops.nki.grouped_swiglu_kernel", "grouped_swiglu_kernel"),
             ("harness.kernels.ops.nki.grouped_swiglu_kernel", "grouped_swiglu_checkpoint_kernel")),
    implementations=(
        Implementation(
            "torchtitan", "torchtitan", "torchtitan.models.common.moe.GroupedExperts", HOST,
            torchtitan.grouped_swiglu, _bf16, requires=has_torchtitan, output_dtypes=_same("y"),
            notes="bf16 grouped GEMMs whatever the input dtype (torchtitan's policy)",
        ),
        Implementation(
            "harness_op", "harness", "torch.ops.harness.grouped_swiglu via CustomOpGroupedExperts", (*HOST, "neuron"),
            harness_ops.grouped_swiglu, _bf16, requires=has_torchtitan, output_dtypes=_same("y"),
        ),
        Implementation(
            "transformers_eager", "transformers", "transformers Qwen3MoeExperts (eager)", HOST,
            transformers.grouped_swiglu_eager, _input, requires=has_transformers, output_dtypes=_same("y"),
        ),
        Implementation(
            "transformers_grouped_mm", "transformers",
            "transformers Qwen3MoeExperts (experts_implementation=grouped_mm)",
            HOST, transformers.grouped_swiglu_grouped_mm, _input, requires=has_transformers, output_dtypes=_same("y"),
        ),
        Implementation(
            "nki_contract", "harness",
            "harness.kernels.ops.nki.grouped_swiglu_kernel: torch twin through the kernel layout",
            ("cpu",), nki_kernels.grouped_swiglu, _bf16, backward=False, output_dtypes=_same("y"),
        ),
        Implementation(
            "nki_kernel", "nki",
            "harness.kernels.ops.nki.grouped_swiglu_kernel.grouped_swiglu_kernel (LNC=2); backward: "
            "its recompute + nkilib.experimental.moe.bwd.blockwise_mm_bwd (B=256, LNC=2)",
            ("nki-emu", "nki-sim", "neuron"),
            nki_kernels.grouped_swiglu, _bf16, requires=has_nkilib, output_dtypes=_same("y"),
            device_requires=EMU,
            notes="the backward is nki-library's (harness/kernels/ops/nki/grouped_swiglu_backward.py); on nki-emu "
                  "its lnc-race on the EA grad, which this path drops, is settled as known issue "
                  "nkilib-bwd-ea-grad-lnc-race",
        ),
        Implementation(
            "nkilib_blockwise", "nkilib", "nkilib.core.moe.moe_cte.bwmm_shard_on_block (rows as one-hot tokens, B=128)",
            ("nki-emu", "nki-sim", "neuron"), nkilib.grouped_swiglu, _bf16, backward=False, requires=has_nkilib,
            output_dtypes=_same("y"), device_requires=EMU,
            device_cases={"nki-emu": ("qwen3_30b_dims", "empty_first_last")},
            notes="launched on two programs (LNC=2), as the kernel's PING_PONG block split assumes; on nki-emu "
                  "two cases (CPU time: the 30B dims, empty first and last experts), every case passes there "
                  "(python -m harness.kernels.checks list --run runs them all)",
        ),
    ),
)

CROSS_ENTROPY = OpSpec(
    name="cross_entropy",
    title="Cross-entropy loss (sum over non-ignored positions)",
    op_class="loss",
    reference=references.cross_entropy,
    float_inputs=("logits",),
    diff_inputs=("logits",),
    diff_outputs=("loss",),
    cases=cases.ce_cases(),
    gradcheck_case=cases.ce_gradcheck_case(),
    implementations=(
        Implementation(
            "torchtitan", "torchtitan", "torchtitan.components.loss.CrossEntropyLoss", HOST,
            torchtitan.cross_entropy, _fp32_at_least, requires=has_torchtitan,
            output_dtypes=lambda dtype, device: {"loss": torch.promote_types(dtype, torch.float32)},
        ),
        Implementation(
            "transformers", "transformers", "transformers.loss.loss_utils.ForCausalLMLoss (shift_labels given)", HOST,
            transformers.cross_entropy, _fp32_at_least, requires=has_transformers,
            output_dtypes=lambda dtype, device: {"loss": torch.promote_types(dtype, torch.float32)},
        ),
        Implementation(
            "nkilib", "nkilib",
            "nkilib.experimental.loss.cross_entropy_forward / _backward (nkilib.core.loss before 2026-04)",
            ("nki-emu", "nki-sim", "neuron"),
            nkilib.cross_entropy, _input, requires=has_nkilib, device_requires=EMU,
        ),
    ),
)

OPS: dict[str, OpSpec] = {op.name: op for op in (ROTARY_EMBEDDING, RMS_NORM, MOE_ROUTER, GROUPED_SWIGLU, CROSS_ENTROPY)}


def get_op(name: str) -> OpSpec:
    return OPS[name]


# ------------------------------------------------------------------ kernel / torch twin pairing

OWN_LIBRARIES = ("harness", "nki")  # implementations whose kernels live in harness/kernels/ops


def twin_of(module_name: str, name: str) -> tuple[str, str]:
    """nki-library's convention: kernel ``f`` in ``X.py`` -> ``f_torch_ref`` in ``X_torch.py``."""
    return f"{module_name}_torch", f"{name}_torch_ref"


def _callable(obj):
    """The Python function behind a kernel object (custom op, decorated function)."""
    if isinstance(obj, torch._library.custom_ops.CustomOpDef):
        obj = obj._init_fn
    return inspect.unwrap(obj)


def _parameters(fn) -> list[tuple[str, str, object]]:
    # Names, kinds and defaults; annotations are not compared (an NKI kernel carries none).
    return [(p.name, p.kind.name, p.default) for p in inspect.signature(fn).parameters.values()]


def twin_problems(module_name: str, name: str) -> list[str]:
    """Why the kernel ``module_name.name`` and its torch twin do not pair up ([] when they do).

    The kernel is ``name + "_source"`` when the module defines it (the undecorated body of an
    NKI kernel, which is ``None`` without ``nki``), else ``name``."""
    try:
        module = importlib.import_module(module_name)
    except Exception as error:
        return [f"kernel module {module_name} does not import: {type(error).__name__}: {error}"]
    kernel = getattr(module, f"{name}_source", None) or getattr(module, name, None)
    if kernel is None:
        return [f"{module_name} defines no kernel {name!r}"]
    twin_module_name, twin_name = twin_of(module_name, name)
    try:
        twin_module = importlib.import_module(twin_module_name)
    except ModuleNotFoundError as error:
        return [f"kernel {module_name}.{name} has no torch twin: {twin_module_name} is missing ({error})"]
    twin = getattr(twin_module, twin_name, None)
    if twin is None:
        return [f"kernel {module_name}.{name} has no torch twin: {twin_module_name} defines no {twin_name!r}"]
    kernel_fn, twin_fn = _callable(kernel), _callable(twin)
    if _parameters(kernel_fn) != _parameters(twin_fn):
        return [f"kernel {module_name}.{name}{inspect.signature(kernel_fn)} and its twin "
                f"{twin_module_name}.{twin_name}{inspect.signature(twin_fn)} differ in signature"]
    return []


def op_twin_problems(op: OpSpec) -> list[str]:
    """Every pairing problem of ``op``'s kernels; an op with an implementation of the harness's
    own (library in ``OWN_LIBRARIES``) must list its kernels."""
    problems = []
    own = [impl.name for impl in op.implementations if impl.library in OWN_LIBRARIES]
    if own and not op.kernels:
        problems.append(f"op {op.name}: implementations {own} are the harness's own but the op lists no kernels")
    for module_name, name in op.kernels:
        problems.extend(twin_problems(module_name, name))
    return problems
