"""The emulator checked against code nobody here wrote: nki-library's kernels, run on the
emulator, against nki-library's own torch references (``X_torch.py``), on shapes and within
tolerances taken from nki-library's own tests (aws-neuron/nki-library ``test/integration``),
with nki-library's comparator (``maxAllClose``, mode "max": ``|a - b| <= atol + rtol *
max|ref|``) plus the reference's dtype.

``CASES`` is the table; ``validate(case)`` runs one row and returns its measured line;
``python -m harness.kernels.emu.validation`` prints the table.
The kernels come from the standalone wheel (package ``nkilib_src.nkilib``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.kernels.emu import install, language
from harness.kernels.emu.launch import launch

PACKAGE = "nkilib_src.nkilib"
TESTS = "aws-neuron/nki-library test/integration/nkilib"
BF16_EPS = 2.0**-7


@dataclass(frozen=True)
class ValidationCase:
    id: str
    kernel: str  # module:function under PACKAGE
    reference: str  # module:function under PACKAGE
    shape: str
    rtol: float
    atol: float
    source: str  # the nki-library test the shape and tolerance come from
    build: object = field(repr=False, compare=False)  # generator -> (kernel args, kernel kwargs, grid)
    expected: object = field(repr=False, compare=False)  # (reference module function, args, kwargs) -> {name: tensor}
    outputs: object = field(repr=False, compare=False)  # kernel results -> {name: tensor}


def _randn(gen, *shape, dtype):
    return torch.randn(*shape, generator=gen).to(dtype)


# ------------------------------------------------------------------ rope_hf


def _rope_hf(batch, q_heads, kv_heads, seq, head_dim, dtype, backward, lnc):
    def build(gen):
        q = _randn(gen, batch, q_heads, seq, head_dim, dtype=dtype)
        k = _randn(gen, batch, kv_heads, seq, head_dim, dtype=dtype)
        cos, sin = _randn(gen, batch, seq, head_dim, dtype=dtype), _randn(gen, batch, seq, head_dim, dtype=dtype)
        args = (q, k, torch.zeros_like(q), torch.zeros_like(k))
        return args, {"cos": cos, "sin": sin, "backward": backward}, (lnc,) if lnc > 1 else ()

    name = str(dtype).removeprefix("torch.")
    return ValidationCase(
        f"rope_hf-{batch}x{q_heads}x{kv_heads}x{seq}x{head_dim}-{name}{'-bwd' if backward else ''}-lnc{lnc}",
        "core.embeddings.rope_hf:rope_hf", "core.embeddings.rope_hf_torch:rope_hf_torch_ref",
        f"q [{batch},{q_heads},{seq},{head_dim}], k [{batch},{kv_heads},{seq},{head_dim}] {name}"
        f"{', backward' if backward else ''}, LNC {lnc}",
        1e-6, 1e-6, "core/embeddings/test_rope_hf.py ROPE_HF_TEST_CASES (rtol=atol=1e-6)",
        build, lambda ref, args, kwargs: ref(*args, **kwargs), lambda out: {"q_out": out[0], "k_out": out[1]},
    )


# ------------------------------------------------------------------ RoPE (core/embeddings/rope.py)


def _rope(d_head, batch, heads, seq, contiguous, relayout, lnc):
    def build(gen):
        x = _randn(gen, d_head, batch, heads, seq, dtype=torch.bfloat16)
        cos, sin = (_randn(gen, d_head // 2, batch, seq, dtype=torch.bfloat16) for _ in range(2))
        kwargs = {"lnc_shard": lnc > 1, "contiguous_layout": contiguous, "relayout_in_sbuf": relayout}
        return (x, cos, sin), kwargs, (lnc,) if lnc > 1 else ()

    path = ("SBUF matmul relayout" if relayout and not contiguous
            else "strided-DMA relayout" if not contiguous else "contiguous")
    return ValidationCase(
        f"RoPE-{d_head}x{batch}x{heads}x{seq}-{'contig' if contiguous else 'interleaved'}"
        f"{'-sbuf_relayout' if relayout else ''}-lnc{lnc}",
        "core.embeddings.rope:RoPE", "core.embeddings.rope_torch:rope_torch_ref",
        f"x [{d_head},{batch},{heads},{seq}] bfloat16, {path}, LNC {lnc}",
        BF16_EPS, 1e-3, "core/embeddings/test_rope.py test_rope_fast / test_rope_manual (rtol 2^-7, atol 1e-3)",
        build, lambda ref, args, kwargs: ref(*args, **kwargs), lambda out: {"x_out": out},
    )


# ------------------------------------------------------------------ cumsum


def _cumsum(batch, hidden, ndim, seq, dtype):
    def build(gen):
        shape = (batch, seq, hidden) if ndim == 3 else (batch, hidden)
        return (_randn(gen, *shape, dtype=dtype),), {}, ()

    bf16 = dtype == torch.bfloat16
    name = str(dtype).removeprefix("torch.")
    return ValidationCase(
        f"cumsum-{batch}_{hidden}_{ndim}_{seq}_{name}", "core.cumsum.cumsum:cumsum",
        "core.cumsum.cumsum_torch:cumsum_torch_ref",
        f"x [{batch},{seq},{hidden}] {name}" if ndim == 3 else f"x [{batch},{hidden}] {name}",
        1e-2 if bf16 else 1e-3, 1e-2 if hidden > 5000 else 1e-3,
        "core/cumsum/test_cumsum.py FAST_TEST_PARAMS (rtol 1e-2 bf16 / 1e-3, atol 1e-3 up to hidden 5000)",
        build, lambda ref, args, kwargs: ref(*args, **kwargs), lambda out: {"output_0": out},
    )


# ------------------------------------------------------------------ cross entropy


def _nl_dtype(dtype):
    return language.bfloat16 if dtype == torch.bfloat16 else language.float32


def _ce_forward(positions, vocab, dtype, per_batch, chunk, source):
    def build(gen):
        logits = _randn(gen, positions, vocab, dtype=dtype)
        targets = torch.randint(0, vocab, (positions,), generator=gen, dtype=torch.int32)
        return (logits, targets), {"positions_per_batch": per_batch, "chunk_size": chunk, "dtype": _nl_dtype(dtype)}, ()

    def expected(ref, args, kwargs):
        loss, lse = ref(args[0], args[1].long())  # the golden casts to the kernel's dtype
        return {"loss_hbm": loss.to(args[0].dtype), "lse_state_hbm": lse.to(args[0].dtype)}

    bf16 = dtype == torch.bfloat16
    name = str(dtype).removeprefix("torch.")
    return ValidationCase(
        f"cross_entropy_forward-{positions}x{vocab}-{name}-pb{per_batch}-cs{chunk}",
        "experimental.loss.cross_entropy:cross_entropy_forward",
        "experimental.loss.cross_entropy_torch:cross_entropy_forward_torch_ref",
        f"logits [{positions},{vocab}] {name}, positions_per_batch {per_batch}, chunk {chunk}",
        1e-2 if bf16 else 1e-5, 1e-2 if bf16 else 1e-5, source,
        build, expected, lambda out: {"loss_hbm": out[0], "lse_state_hbm": out[1]},
    )


def _ce_backward(positions, vocab, dtype, per_batch, chunk, reduction, source):
    def build(gen):
        logits = _randn(gen, positions, vocab, dtype=dtype)
        targets = torch.randint(0, vocab, (positions,), generator=gen, dtype=torch.int32)
        lse = torch.logsumexp(logits.float(), dim=1).to(dtype)  # the test feeds the golden LSE
        kwargs = {"reduction": reduction, "positions_per_batch": per_batch, "chunk_size": chunk,
                  "dtype": _nl_dtype(dtype), "inplace": False}
        return (logits, targets, lse), kwargs, ()

    def expected(ref, args, kwargs):
        return {"grad_logits_hbm": ref(args[0].float(), args[1].long(), kwargs["reduction"]).to(args[0].dtype)}

    bf16 = dtype == torch.bfloat16
    name = str(dtype).removeprefix("torch.")
    return ValidationCase(
        f"cross_entropy_backward-{positions}x{vocab}-{name}-pb{per_batch}-cs{chunk}-{reduction}",
        "experimental.loss.cross_entropy:cross_entropy_backward",
        "experimental.loss.cross_entropy_torch:cross_entropy_backward_torch_ref",
        f"logits [{positions},{vocab}] {name}, positions_per_batch {per_batch}, chunk {chunk}, {reduction}",
        1e-2 if bf16 else 1e-5, 1e-2 if bf16 else 1e-5, source,
        build, expected, lambda out: {"grad_logits_hbm": out},
    )


_CE_FWD = "experimental/loss/test_cross_entropy_forward.py {}"
_CE_BWD = "experimental/loss/test_cross_entropy_backward.py {}"
CASES: tuple[ValidationCase, ...] = (
    _rope_hf(1, 32, 8, 256, 128, torch.bfloat16, False, 1),
    _rope_hf(1, 32, 8, 256, 128, torch.float32, True, 2),
    _rope(64, 1, 8, 16, False, True, 1),
    _rope(128, 8, 1, 16, False, True, 2),
    _rope(64, 32, 4, 64, False, False, 1),
    _rope(64, 8, 8, 16, True, False, 2),
    _cumsum(1, 256, 2, 1, torch.float32),
    _cumsum(64, 1024, 3, 4, torch.bfloat16),
    _cumsum(128, 2048, 2, 1, torch.float32),
    _ce_forward(1, 32128, torch.bfloat16, 1, 32128, _CE_FWD.format("FAST [1, 1, 32128, bf16, PB 1, CS 32128]; 1e-2")),
    _ce_forward(64, 32128, torch.float32, 64, 8192,
                _CE_FWD.format("tolerance 1e-5 (float32); V/PB/CS of backward FAST [4, 4096, 32128, fp32, 64, 8192], "
                               "positions cut to 64 for CPU time")),
    _ce_backward(1, 32128, torch.bfloat16, 1, 16384, "mean",
                 _CE_BWD.format("FAST [1, 1, 32128, bf16, PB 1, CS 16384, mean]; 1e-2")),
    _ce_backward(64, 32128, torch.float32, 64, 8192, "sum",
                 _CE_BWD.format("FAST [4, 4096, 32128, fp32, PB 64, CS 8192, sum] with positions cut to 64; 1e-5")),
)


def by_id(case_id: str) -> ValidationCase:
    for case in CASES:
        if case.id == case_id:
            return case
    raise KeyError(f"no nki-library validation case {case_id!r}")


def _function(spec: str):
    module, name = spec.split(":")
    return getattr(install.import_module(f"{PACKAGE}.{module}"), name)


def max_all_close(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> dict:
    """nki-library's comparator (mode "max"): pass iff every |a - b| <= atol + rtol * max|b|
    (NaN fails), and the dtype is the reference's."""
    a, b = actual.double(), expected.double()
    err = (a - b).abs()
    max_err = float(err.max()) if bool(torch.isfinite(err).all()) else float("nan")
    bound = atol + rtol * float(b.abs()[torch.isfinite(b)].max())
    dtype_ok = actual.dtype == expected.dtype and tuple(actual.shape) == tuple(expected.shape)
    return {"max_err": max_err, "bound": bound, "dtype": str(actual.dtype).removeprefix("torch."),
            "passed": dtype_ok and max_err == max_err and max_err <= bound}


def validate(case: ValidationCase, seed: int = 0) -> dict:
    """Run the nki-library kernel on the emulator and compare each output with the reference."""
    args, kwargs, grid = case.build(torch.Generator().manual_seed(seed))
    results, report = launch(_function(case.kernel), args, kwargs, grid)
    actual = case.outputs(results)
    expected = case.expected(_function(case.reference), args, kwargs)
    outputs = {name: max_all_close(actual[name], expected[name], case.rtol, case.atol) for name in expected}
    return {"case": case, "outputs": outputs, "passed": all(o["passed"] for o in outputs.values()), "report": report}


def table(rows) -> str:
    """Markdown: kernel, shape, reference, tolerance, max error (per output)."""
    lines = ["| kernel | shape | reference | tolerance (nki-library test) | output | max error | bound | pass |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        case = row["case"]
        for name, o in row["outputs"].items():
            lines.append(f"| {case.kernel.split(':')[1]} | {case.shape} | {case.reference.split(':')[1]} | "
                         f"rtol {case.rtol:.3g}, "
                         f"atol {case.atol:.3g} ({case.source}) | {name} ({o['dtype']}) | {o['max_err']:.3g} | "
                         f"{o['bound']:.3g} | {'yes' if o['passed'] else 'NO'} |")
    return "\n".join(lines)


def main() -> int:
    """``python -m harness.kernels.emu.validation``: run every case, print the table."""
    rows = [validate(case) for case in CASES]
    print(table(rows))
    return 0 if all(row["passed"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
