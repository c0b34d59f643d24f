"""The first trn2 session: our kernels at the 30B-A3B cut on an LNC=2 NeuronCore, each output
compared with the NKI emulator's on the same inputs, compile time and NEFF size recorded, our
MoE forward timed against nki-library's. ``scripts/trn2_first_session.py`` runs it with no
arguments and writes ``report.json`` and ``report.md``.

The kernels (``KERNELS``), each called on the device and on the emulator with one seeded set of
inputs, and compared output by output under the kernel tolerance (harness/registry/tolerances.py, rule 1
with the emulator's result as the reference):

``rope``                harness rope kernel: Qwen3-30B-A3B queries, 1 x seq x 32 heads x 128
``moe_forward``         our grouped SwiGLU forward: the cut's routed rows (tokens x top-4) over
                        64 experts, D 2048, F 768, a seeded top-4 routing
``moe_backward``        its backward: our recompute + nki-library's blockwise backward
``nkilib_moe_forward``  nki-library's bwmm_shard_on_block on the same rows (timing reference)

Per kernel: the first call's wall time (on the device: compile + load + run), the median of
``repeats`` later calls (steady state), the bytes of NEFF files the first call added to the
compile cache, and per output the comparison. The report's ``status`` is "fail" when any
kernel raises or any output misses the tolerance; the script then exits non-zero.

Only ``NeuronDevice`` needs a trn2; everything else runs anywhere. On CPU ``EmulatorDevice``
stands in for the device (``--stand-in``: the emulator on both sides, at ``TINY_CUT`` by
default), which is how the report's format is tested (tests/kernels/test_trn2_session.py).
"""

from __future__ import annotations

import datetime
import importlib.metadata as md
import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from harness.device.devices import device_status
from harness.kernels.checks.compare import elementwise
from harness.kernels.ops.neuron import nki_available
from harness.kernels.ops.rope_torch import rope_cos_sin
from harness.registry.tolerances import kernel_tolerance

# Per rank in the source's run: local batch 1 x seq 2048 tokens, top-4 of 64 experts, hidden
# 2048, moe_intermediate 768; Qwen3-30B-A3B attention: 32 query heads of 128.
SOURCE_CUT = {"tokens": 2048, "top_k": 4, "dim": 2048, "hidden": 768, "experts": 64, "heads": 32, "head_dim": 128}
TINY_CUT = {"tokens": 64, "top_k": 4, "dim": 256, "hidden": 128, "experts": 8, "heads": 4, "head_dim": 128}
ROPE_THETA = 1_000_000.0
SEED = 29  # the seed of every input of the session (SEED + 1, + 2 for the others)


# ------------------------------------------------------------------ inputs


def rope_inputs(cut: dict) -> tuple:
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(1, cut["tokens"], cut["heads"], cut["head_dim"], generator=g).bfloat16()
    cos, sin = rope_cos_sin(torch.arange(cut["tokens"]), cut["head_dim"], ROPE_THETA, dtype=torch.float32)
    return x, cos.float(), sin.float()


def routed_counts(cut: dict) -> torch.Tensor:
    """Rows per expert of a seeded top-k routing of the cut's tokens (softmax of random scores)."""
    g = torch.Generator().manual_seed(SEED)
    scores = torch.randn(cut["tokens"], cut["experts"], generator=g)
    chosen = scores.topk(cut["top_k"], dim=-1).indices.reshape(-1)
    return torch.bincount(chosen, minlength=cut["experts"])


def moe_inputs(cut: dict) -> tuple:
    g = torch.Generator().manual_seed(SEED + 1)
    counts = routed_counts(cut)
    rows, experts, dim, hidden = int(counts.sum()), cut["experts"], cut["dim"], cut["hidden"]
    x = torch.randn(rows, dim, generator=g).bfloat16()
    w1, w3 = (torch.randn(experts, hidden, dim, generator=g).mul(0.02).bfloat16() for _ in range(2))
    w2 = torch.randn(experts, dim, hidden, generator=g).mul(0.02).bfloat16()
    return x, torch.cumsum(counts, 0, dtype=torch.int32), w1, w2, w3


def moe_backward_inputs(cut: dict) -> tuple:
    x, offsets, w1, w2, w3 = moe_inputs(cut)
    grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(SEED + 2)).bfloat16()
    return grad, x, offsets, w1, w2, w3


# ------------------------------------------------------------------ the kernels per device


def _nkilib_forward(device: str):
    from harness.kernels.checks.adapters import nkilib  # noqa: PLC0415  heavy: torchtitan via the adapters; only the nki-library forward needs it

    def call(x, offsets, w1, w2, w3):
        counts = torch.diff(offsets.to(torch.int64), prepend=offsets.new_zeros(1).to(torch.int64))
        return nkilib.grouped_swiglu({"x": x, "w1": w1, "w2": w2, "w3": w3, "num_tokens_per_expert": counts}, {},
                                     device)["y"]

    return call


def device_calls() -> dict:
    """The kernels on Neuron tensors (LNC=2 launches inside each)."""
    from harness.kernels.ops.nki import grouped_swiglu_backward as gb  # noqa: PLC0415  optional: the kernel imports nki where installed
    from harness.kernels.ops.nki import grouped_swiglu_kernel as gk  # noqa: PLC0415  optional: the kernel imports nki where installed
    from harness.kernels.ops.nki import rope_kernel  # noqa: PLC0415  optional: the kernel imports nki where installed

    return {"rope": rope_kernel.rope_neuron, "moe_forward": gk.grouped_swiglu_neuron,
            "moe_backward": gb.grouped_swiglu_backward_neuron, "nkilib_moe_forward": _nkilib_forward("neuron")}


def emulator_calls() -> dict:
    """The same kernels on the harness's NKI emulator (two programs each)."""
    from harness.kernels.ops.nki import grouped_swiglu_backward as gb  # noqa: PLC0415  optional: the kernel imports nki where installed
    from harness.kernels.ops.nki import grouped_swiglu_kernel as gk  # noqa: PLC0415  optional: the kernel imports nki where installed
    from harness.kernels.ops.nki import rope_kernel  # noqa: PLC0415  optional: the kernel imports nki where installed

    return {"rope": rope_kernel.rope_emulated, "moe_forward": gk.grouped_swiglu_emulated,
            "moe_backward": gb.grouped_swiglu_backward_emulated, "nkilib_moe_forward": _nkilib_forward("nki-emu")}


@dataclass(frozen=True)
class Kernel:
    name: str
    inputs: object  # cut -> args
    outputs: tuple[str, ...]
    op_class: str  # the kernel tolerance's op class


KERNELS = (
    Kernel("rope", rope_inputs, ("y",), "elementwise"),
    Kernel("moe_forward", moe_inputs, ("y",), "grouped_matmul"),
    Kernel("moe_backward", moe_backward_inputs, ("dx", "dw1", "dw2", "dw3"), "grouped_matmul"),
    Kernel("nkilib_moe_forward", moe_inputs, ("y",), "grouped_matmul"),
)


# ------------------------------------------------------------------ devices


def _as_tuple(value) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _neff_sizes(root: Path | None) -> dict[str, int]:
    if root is None or not root.is_dir():
        return {}
    return {str(p): p.stat().st_size for p in root.rglob("*.neff")}


class EmulatorDevice:
    """The CPU stand-in: the emulator's kernels, timed on CPU; no NEFF."""

    name = "emulator (stand-in)"
    stand_in = True
    neff_root: Path | None = None

    def __init__(self, calls: dict | None = None):
        self.calls = calls or emulator_calls()

    def environment(self) -> dict:
        return {}

    def call(self, name: str, args: tuple) -> tuple:
        return tuple(torch.as_tensor(t) for t in _as_tuple(self.calls[name](*args)))

    def synchronize(self) -> None:
        pass


class NeuronDevice:
    """The trn2 side, as thin as it can be. Neuron 2.33 docs for each call:
    - LNC=2: ``NEURON_LOGICAL_NC_CONFIG=2`` for the runtime and ``kernel[2]`` at the call site, which
      must agree (nki/get-started/about/lnc.html; nki/api/generated/nki.jit.html; NCC_EVRF066:
      compiler/error-codes/EVRF066.html);
    - an ``@nki.jit`` kernel called on Neuron tensors is compiled on its first call per shape, dtype
      and non-tensor arguments (torch/guides/how-to-work-with-nki.html);
    - NEFFs land in the persistent cache ``TORCH_NEURONX_NEFF_CACHE_DIR``
      (compiler/about-compiler-artifacts.html; torch/reference/env-vars.html);
    - ``torch.accelerator.synchronize()`` waits for the ``neuron`` device (torch_neuronx registers
      it as the accelerator: torch/reference/api/torch-neuron-module.html).
    """

    name = "neuron"
    stand_in = False

    def __init__(self, neff_root: Path):
        """``neff_root``: the NEFF cache directory, set in ``TORCH_NEURONX_NEFF_CACHE_DIR`` before
        torch loaded (the script does it first thing)."""
        self.neff_root = neff_root
        lnc = os.environ.get("NEURON_LOGICAL_NC_CONFIG", "2")
        if lnc != "2":
            raise RuntimeError(f"NEURON_LOGICAL_NC_CONFIG={lnc}: this session runs the kernels at LNC=2 (trn2's "
                               f"default); unset it or set it to 2")
        import torch_neuronx  # noqa: F401, PLC0415  optional: on a trn2 only; registers the 'neuron' device (torch normally autoloads it)

        self.device = torch.device("neuron")
        self.calls = device_calls()

    def environment(self) -> dict:
        versions = {}
        for package in ("torch-neuronx", "neuronx-cc", "nki", "nki-library"):
            try:
                versions[package] = md.version(package)
            except md.PackageNotFoundError:
                versions[package] = None
        return {"packages": versions, "neuron_device_count": torch.neuron.device_count(),
                **{k: os.environ.get(k) for k in ("NEURON_LOGICAL_NC_CONFIG", "TORCH_NEURONX_NEFF_CACHE_DIR",
                                                  "NEURON_RT_VISIBLE_CORES", "NEURON_CC_FLAGS")}}

    def call(self, name: str, args: tuple) -> tuple:
        on_device = [a.to(self.device) for a in args]
        results = _as_tuple(self.calls[name](*on_device))
        return tuple(torch.as_tensor(t).cpu() for t in results)

    def synchronize(self) -> None:
        torch.accelerator.synchronize()


def neuron_device_or_reason(neff_root: Path):
    """(NeuronDevice, None) on a trn2 with the Neuron SDK, else (None, why not). A usable device
    is the 'neuron' device (``harness.device.devices``, the one probe) and the real ``nki``."""
    ok, reason = device_status("neuron")
    if ok:
        ok, reason = nki_available()
    if not ok:
        return None, reason
    return NeuronDevice(neff_root), None


# ------------------------------------------------------------------ one kernel


@dataclass
class KernelResult:
    name: str
    status: str = "fail"  # "pass" / "fail"
    first_call_s: float | None = None
    steady_s: float | None = None
    repeats: int = 0
    neff_bytes: int | None = None
    outputs: dict = field(default_factory=dict)
    error: str | None = None


def _timed(device, name, args) -> tuple[tuple, float]:
    start = time.perf_counter()
    results = device.call(name, args)
    device.synchronize()
    return results, time.perf_counter() - start


def compare_outputs(kernel: Kernel, got: tuple, want: tuple) -> dict:
    tolerance = kernel_tolerance(kernel.op_class, torch.bfloat16)
    report = {}
    # a device result with a missing output is compared as far as it goes; the count is its own entry below
    for name, a, b in zip(kernel.outputs, got, want, strict=False):
        entry = {"shape": list(a.shape), "dtype": str(a.dtype), "reference_dtype": str(b.dtype)}
        if tuple(a.shape) != tuple(b.shape):
            entry.update(passed=False, problem=f"shape {tuple(a.shape)} != emulator's {tuple(b.shape)}")
        else:
            stats = elementwise(a, b.double(), tolerance)
            entry.update(passed=bool(stats["passed"]), tau=tolerance.tau,
                         max_abs_err=float((a.double() - b.double()).abs().max()) if a.numel() else 0.0,
                         **{k: stats[k] for k in ("mismatched", "total", "worst_in_tau") if k in stats})
        report[name] = entry
    if len(got) != len(kernel.outputs):
        report["(count)"] = {"passed": False, "problem": f"{len(got)} outputs, expected {len(kernel.outputs)}"}
    return report


def run_kernel(kernel: Kernel, cut: dict, device, emulator, repeats: int) -> KernelResult:
    result = KernelResult(kernel.name)
    try:
        args = kernel.inputs(cut)
        before = _neff_sizes(device.neff_root)
        got, result.first_call_s = _timed(device, kernel.name, args)
        after = _neff_sizes(device.neff_root)
        if device.neff_root is not None:
            result.neff_bytes = sum(size for path, size in after.items() if path not in before)
        times = [_timed(device, kernel.name, args)[1] for _ in range(repeats)]
        result.repeats, result.steady_s = repeats, (statistics.median(times) if times else None)
        want = emulator.call(kernel.name, args)
        result.outputs = compare_outputs(kernel, got, want)
        result.status = "pass" if all(o["passed"] for o in result.outputs.values()) else "fail"
    except Exception as error:
        result.error = f"{type(error).__name__}: {error}"
    return result


# ------------------------------------------------------------------ the session and its report


def _output_problem(entry: dict) -> str:
    if "problem" in entry:
        return entry["problem"]
    return f"{entry['mismatched']} of {entry['total']} elements outside tau={entry['tau']:.3g}"


def _failure(result: KernelResult) -> str:
    if result.error:
        return f"{result.name}: raised {result.error}"
    bad = [f"{name} {_output_problem(entry)}" for name, entry in result.outputs.items() if not entry["passed"]]
    return f"{result.name}: " + "; ".join(bad)


def run_session(device, cut: dict = SOURCE_CUT, repeats: int = 5, emulator=None, kernels=KERNELS) -> dict:
    emulator = emulator or EmulatorDevice()
    started = datetime.datetime.now(datetime.UTC)
    results = [run_kernel(k, cut, device, emulator, repeats) for k in kernels]
    by_name = {r.name: r for r in results}
    ours, library = by_name.get("moe_forward"), by_name.get("nkilib_moe_forward")
    timing = None
    if ours and library and ours.steady_s and library.steady_s:
        timing = {"ours_moe_forward_s": ours.steady_s, "nkilib_moe_forward_s": library.steady_s,
                  "ours_over_nkilib": ours.steady_s / library.steady_s}
    failures = [_failure(r) for r in results if r.status != "pass"]
    return {
        "schema": 1,
        "title": "first trn2 session: kernels at the 30B-A3B cut, LNC=2, against the NKI emulator",
        "status": "pass" if not failures else "fail",
        "started": started.isoformat(timespec="seconds"),
        "finished": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": {"name": device.name, "stand_in": device.stand_in, "lnc": 2},
        "cut": dict(cut),
        "routed_rows": int(routed_counts(cut).sum()),
        "environment": {"python": platform.python_version(), "torch": torch.__version__, "host": platform.node(),
                        **device.environment()},
        "kernels": [asdict(r) for r in results],
        "timing": timing,
        "failures": failures,
    }


def markdown(report: dict) -> str:
    lines = [f"# {report['title']}", "",
             f"Status: **{report['status'].upper()}**; device {report['device']['name']}, "
             f"LNC={report['device']['lnc']}; "
             f"{report['started']} .. {report['finished']}", "",
             f"Cut: {json.dumps(report['cut'])}; {report['routed_rows']} routed rows.", "",
             "## Kernels", "",
             "| kernel | status | first call s (compile) | steady s (median) | NEFF bytes | outputs vs emulator |",
             "|---|---|---|---|---|---|"]
    for k in report["kernels"]:
        outputs = "; ".join(f"{n}: {'ok' if v['passed'] else 'MISMATCH'}"
                            + (f" ({v['worst_in_tau']:.2g} tau)" if "worst_in_tau" in v else "")
                            for n, v in k["outputs"].items()) or (k["error"] or "")
        fmt = lambda v, spec: "" if v is None else format(v, spec)  # noqa: E731
        lines.append(f"| {k['name']} | {k['status']} | {fmt(k['first_call_s'], '.3f')} | {fmt(k['steady_s'], '.4f')} | "
                     f"{fmt(k['neff_bytes'], ',')} | {outputs} |")
    lines += ["", "## MoE forward: ours against nki-library's", ""]
    if report["device"]["stand_in"]:
        lines += ["(stand-in: these are the emulator's CPU time, not device time)", ""]
    t = report["timing"]
    lines.append("not measured (a kernel failed)" if t is None else
                 f"ours {t['ours_moe_forward_s']:.4f} s, nki-library {t['nkilib_moe_forward_s']:.4f} s: "
                 f"ours / nki-library = {t['ours_over_nkilib']:.2f}")
    if report.get("runs"):
        lines += ["", "## First runs (what the night's limits and its published check assume)", "",
                  "```json", json.dumps(report["runs"], indent=2, default=str), "```"]
    if report["failures"]:
        lines += ["", "## Failures", ""] + [f"- {f}" for f in report["failures"]]
    lines += ["", "## Environment", "", "```json", json.dumps(report["environment"], indent=2, default=str), "```"]
    return "\n".join(lines) + "\n"


def write_report(report: dict, output_dir: Path) -> tuple[Path, Path]:
    output_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = output_dir / "report.json", output_dir / "report.md"
    json_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    md_path.write_text(markdown(report))
    return json_path, md_path
