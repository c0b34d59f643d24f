"""Random-init first-step loss of the real architectures, forward only, on CPU (library).

Used by tests/e2e/test_full_size_random_init_cpu.py (slow tier); each case runs in its own
process, ``python -m harness.checks.random_init_forward case NAME``.

Specification (slow tier, ``pytest -m slow``): from random init, the first-step loss of
- torchtitan's native Qwen3 "4B" flavor with torchtitan's own init (``titan_native``'s ``full``),
- HF ``Qwen3ForCausalLM`` built from Qwen3-4B-Instruct-2507's config.json with the init
  torchtitan's transformers backend applies (``hf_v5``'s ``full``),
- native Qwen3 MoE in the 30B-A3B shape cut to 4 layers / 64 experts / top-4,
equals the analytic ``ln V + s^2/2`` (``s^2 = std(lm_head)^2 * hidden``: the final RMSNorm makes
``|h|^2 = hidden``) within the ``analytic_random_init`` tolerance, and equals the source's
published value (fixtures/expectations.toml, key device "neuron": the number comes from the
source's Trainium runs) within the ``published`` tolerance.

How, on a 24 GiB / 2-core machine (4B parameters are 16 GB in fp32):
- the model is built on the meta device exactly as torchtitan's trainer builds it (backend
  config function -> ``update_from_config`` -> ``build()`` under ``torch.device("meta")``);
- it is materialised one unit (embedding, one decoder layer, final norm, lm_head) at a time;
  each unit is initialised by the model's own init code (native: ``Module.init_states``, as
  ``init_weights`` does; transformers backend: the patched ``PreTrainedModel._init_weights``
  applied post-order, as ``HFTransformerModel.init_states`` does), in the model's own init order
  from the trainer's seed, so the weights are bit-identical to a whole-model init on one process
  (``test_streamed_init_and_forward_equal_whole_model`` proves this on the tiny fixtures). Native
  4B ties its embedding to lm_head, which torchtitan initialises *after* the layers: the layers
  are then initialised twice (a first pass records the RNG state before each, a second pass
  replays it for the forward) so that the order, and the weights, stay the model's;
- each layer runs forward as soon as it is initialised and is then freed; parameters are cast to
  bf16 for compute, as the source's runs do (FSDP ``mixed_precision_param = bfloat16``, fp32
  init); the lm_head / cross-entropy over the 151936-token vocabulary is chunked over tokens,
  and the logits are upcast to fp32 for the loss as torchtitan's loss does.

Token ids: the fixture tokenizer has 2048 tokens, Qwen3 151936, so the batch is 2 x 513
uniformly random ids in [0, V) from a fixed seed (inputs = ids[:, :-1], labels = ids[:, 1:]).
Because labels are independent of the model, the expected loss over labels is
``mean_t(logsumexp(z_t) - mean_v z_tv)``: that label-averaged loss is what is compared (its
sampling noise is ~1e-3); the sampled cross-entropy the trainer would log (noise ~0.03 on 1024
tokens) is reported and checked for consistency with it.

Each case runs in its own process (this file run as a script) with the CPU ranks' upstream
shims, so peak RSS is the case's own and a runaway case is killed at the memory limit.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from harness.device.devices import CPU_SHIMS
from harness.launch.subjects import _native_attention
from harness.registry import environment, paths
from harness.upstream.flex_attention_cpu import build_block_masks_eagerly_on_cpu
from harness.upstream.hf_rope_init import _recompute_inv_freq
from harness.upstream.versions import package_versions

GIB = 1024**3
QWEN3_4B = "Qwen3-4B-Instruct-2507"
MOE_4L = "qwen3_30b_a3b_4l_64e_top4"
REFERENCE = paths.FIXTURES / "reference_configs"

BATCH, SEQ_LEN = 2, 512
TOKEN_SEED = 1234  # the random token ids; the weights use the trainer's seed (common.SEED)
LOGIT_CHUNK = 128  # tokens per lm_head / cross-entropy chunk: 128 x 151936 fp32 = 78 MB
COMPUTE_DTYPE = "bfloat16"  # FULL.param_dtype: FSDP mixed precision of the source's runs
MEMORY_LIMIT_GIB = 18.0  # the parent kills a case whose RSS passes this
CASE_TIMEOUT_S = 1200


@dataclass(frozen=True)
class Case:
    backend: str  # the expectations' backend key
    model: str  # the expectations' model key
    what: str  # for messages

    @property
    def name(self) -> str:
        return f"{self.backend}-{self.model}"


CASES = {
    c.name: c
    for c in (
        Case("titan_native", QWEN3_4B, "torchtitan native Qwen3 '4B' flavor, torchtitan init"),
        Case("hf_v5", QWEN3_4B, "HF Qwen3ForCausalLM from config.json, transformers-backend init"),
        # The expectation key is nki_moe's (the backend that trains this shape); the model here
        # is native Qwen3 MoE without nki_moe's custom-op swap, which changes no init.
        Case("nki_moe", MOE_4L, "native Qwen3 MoE, 30B-A3B shape, 4 layers, 64 experts, top-4"),
    )
}
SMALL_CASES = ("titan_native-tiny_dense", "hf_v5-tiny_dense", "titan_native-tiny_moe")


# --------------------------------------------------------------------------------------------
# Child side: build, stream-initialise and run one model (imports torchtitan; run as a script).
# --------------------------------------------------------------------------------------------


def _trainer_config(name: str, seq_len: int):
    """The backend's own trainer config for this model (harness/model/build.py), with the run's
    sequence length."""
    from harness.backends.native_qwen3 import model_spec_from_hf  # noqa: PLC0415  heavy: the parent side launches the child without it
    from harness.model.build import backend_config  # noqa: PLC0415  heavy: the parent side launches the child without it

    if name == f"titan_native-{QWEN3_4B}":
        config = backend_config("titan_native", "full", assets=REFERENCE / QWEN3_4B)  # the "4B" flavor
    elif name == f"hf_v5-{QWEN3_4B}":
        config = backend_config("hf_v5", "full", assets=REFERENCE / QWEN3_4B)
    elif name == f"nki_moe-{MOE_4L}":
        config = backend_config("titan_native", "full", assets=REFERENCE / QWEN3_4B)
        config.model_spec = model_spec_from_hf(REFERENCE / MOE_4L, flavor="30b_a3b_4l_64e_top4")
    elif name == "titan_native-tiny_dense":
        config = backend_config("titan_native")
    elif name == "hf_v5-tiny_dense":
        config = backend_config("hf_v5")
    elif name == "titan_native-tiny_moe":
        config = backend_config("titan_native")
        config.model_spec = model_spec_from_hf(paths.TINY_MOE, flavor="tiny_moe")
    else:
        raise ValueError(f"unknown case {name!r}")
    config.training.seq_len = seq_len
    return config


def _eager_block_masks() -> None:
    """Build flex BlockMasks with the same function, uncompiled (saves an inductor compile):
    the CPU ranks' shim (harness/upstream/flex_attention_cpu.py)."""
    from torchtitan.models.common import attention  # noqa: PLC0415  heavy: the parent side launches the child without it

    build_block_masks_eagerly_on_cpu(attention)


class Streamer:
    """One model, materialised and initialised one unit at a time in the model's init order.

    ``units``: (name, module) in the order the whole-model init visits them; ``init_unit`` runs
    the model's own init on one unit. ``materialise`` fills parameters with NaN first, so a
    parameter the init does not write is caught (``check_initialised``) instead of used.
    """

    def __init__(self, model, kind: str) -> None:
        import torch  # noqa: PLC0415  heavy: the parent side launches the child without it

        from harness.model.unit_walk import model_units  # noqa: PLC0415  heavy: the parent side launches the child without it

        self.torch = torch
        self.model = model
        self.kind = kind
        walk = model_units(model, kind)  # the one unit walk (harness/model/unit_walk.py)
        self.units, self.layers, self.tied = walk.units, walk.layers, walk.tied
        self.module = dict(self.units)
        self.initialised_params = 0

    # -- the model's own init, one unit ------------------------------------------------------
    def init_unit(self, name: str) -> None:
        torch = self.torch
        unit = self.module[name]
        with torch.no_grad():
            if self.kind == "native":
                unit.init_states(buffer_device=None)  # what Decoder/Module.init_states calls
            else:
                # HFTransformerModel.init_states: self.model.apply(self.model._init_weights), a
                # post-order walk; on one unit the walk visits the unit's modules in the same
                # order. _init_weights is torchtitan's patched PreTrainedModel._init_weights.
                unit.apply(self.model.model._init_weights)
                if name == "rotary_emb":
                    # inv_freq after to_empty() is uninitialised memory (known defect
                    # hf_v5-rope-inv-freq-uninitialised); recompute it as the opt-in
                    # workaround does. No parameters, no RNG: the init order is unaffected.

                    _recompute_inv_freq(unit)

    def materialise(self, name: str) -> None:
        torch = self.torch
        from harness.model.unit_walk import materialise  # noqa: PLC0415  heavy: the parent side launches the child without it

        unit = self.module[name]
        materialise(unit, "cpu")
        with torch.no_grad():
            for p in unit.parameters():
                p.fill_(float("nan"))
        if self.tied and self.kind == "native" and name in ("tok_embeddings", "lm_head"):
            self.tie()  # native: tied before init (Decoder.init_states); HF: after (tie_weights)

    def tie(self) -> None:
        if self.kind == "native":
            lm_head, emb = self.model.lm_head, self.model.tok_embeddings
            if lm_head.weight.device.type != "meta":
                # Decoder.init_states re-ties before init: the embedding is the lm_head weight.
                emb.weight = lm_head.weight
        else:
            hf = self.model.model
            if hf.lm_head.weight.device.type != "meta" and \
                    hf.model.embed_tokens.weight.device.type != "meta":
                hf.tie_weights()  # what HFTransformerModel.init_states ends with

    def free(self, name: str) -> None:
        from harness.model.unit_walk import free  # noqa: PLC0415  heavy: the parent side launches the child without it

        free(self.module[name])

    def check_initialised(self, name: str) -> None:
        torch = self.torch
        for pname, p in self.module[name].named_parameters():
            if torch.isnan(p).any():
                raise AssertionError(f"{name}.{pname}: left uninitialised by the model's init")

    def cast(self, name: str, dtype) -> None:
        """FSDP mixed precision: parameters (not buffers) in the compute dtype."""
        with self.torch.no_grad():
            for p in self.module[name].parameters():
                p.data = p.data.to(dtype)


def _positions_and_masks(model, kind: str, batch: int, seq_len: int):
    import torch  # noqa: PLC0415  heavy: the parent side launches the child without it

    # One document per row (random ids contain no EOS): positions 0..L-1, the masks the
    # trainer builds from them (native flex: causal + per-document; transformers backend:
    # causal). Native SDPA (the backends' default, as the source's configurations) takes no
    # mask: it is causal by itself.
    positions = torch.arange(seq_len).unsqueeze(0).expand(batch, seq_len)
    if kind == "native":
        if _native_attention(model.config) == "sdpa":
            return positions, None
    if not hasattr(model, "get_attention_masks"):
        # spring's HFTransformerModel builds no mask (its forward passes none: transformers'
        # Qwen3Model makes its own causal one from the inputs)
        return positions, None
    return positions, model.get_attention_masks(positions)


class LossStats:
    """First-step loss statistics, accumulated over chunks of tokens in float64."""

    def __init__(self) -> None:
        self.n = 0
        self.ce = self.ce2 = self.label_avg = self.label_avg2 = self.logit_var = self.own = 0.0

    def add(self, logits, labels, inputs) -> None:
        import torch  # noqa: PLC0415  heavy: the parent side launches the child without it

        z = logits.float()  # torchtitan's cross_entropy_loss upcasts the logits
        lse = torch.logsumexp(z, dim=-1)
        ce = lse - z.gather(1, labels[:, None])[:, 0]
        self.n += z.shape[0]
        self.ce += ce.double().sum().item()
        self.ce2 += ce.double().square().sum().item()
        label_avg = (lse - z.mean(dim=-1)).double()
        self.label_avg += label_avg.sum().item()
        self.label_avg2 += label_avg.square().sum().item()
        self.logit_var += z.var(dim=-1, unbiased=False).double().sum().item()
        self.own += z.gather(1, inputs[:, None])[:, 0].double().sum().item()

    def result(self) -> dict:
        mean = self.ce / self.n
        var = max(self.ce2 / self.n - mean**2, 0.0)
        label_mean = self.label_avg / self.n
        label_var = max(self.label_avg2 / self.n - label_mean**2, 0.0)
        return {
            "tokens": self.n,
            "sampled_loss": mean,
            "sampled_loss_se": math.sqrt(var / self.n),
            "label_averaged_loss": label_mean,
            "label_averaged_loss_se": math.sqrt(label_var / self.n),
            "logit_variance": self.logit_var / self.n,
            "own_input_token_logit": self.own / self.n,
        }


def _token_batch(vocab: int, batch: int, seq_len: int):
    import torch  # noqa: PLC0415  heavy: the parent side launches the child without it

    generator = torch.Generator().manual_seed(TOKEN_SEED)
    ids = torch.randint(0, vocab, (batch, seq_len + 1), generator=generator)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def _std(weight) -> float:
    """std of an initialised weight (fp32, before any cast to the compute dtype)."""
    return weight.detach().float().std().item()


def _chunked_loss(head, h, inputs, labels, chunk: int) -> LossStats:
    stats = LossStats()
    h2, in1, lab1 = h.flatten(0, 1), inputs.flatten(), labels.flatten()
    for start in range(0, h2.shape[0], chunk):
        rows = slice(start, start + chunk)
        stats.add(head(h2[rows]), lab1[rows], in1[rows])
    return stats


def streamed_first_step(name: str, batch: int, seq_len: int, compute_dtype: str,
                        chunk: int = LOGIT_CHUNK, keep_weights: bool = False) -> dict:
    """Stream-initialise and run the model of case ``name``; return its loss statistics. The
    transformers backend's init is its patched ``_init_weights``, in force from the build
    (``on_meta``) through the unit-by-unit init that follows it: one block around both."""
    from harness.model.build import transformers_backend_patches_restored  # noqa: PLC0415  heavy: the parent side launches the child without it

    with transformers_backend_patches_restored():
        return _streamed_first_step(name, batch, seq_len, compute_dtype, chunk, keep_weights)


def _streamed_first_step(name: str, batch: int, seq_len: int, compute_dtype: str, chunk: int,
                         keep_weights: bool) -> dict:
    import torch  # noqa: PLC0415  heavy: the parent side launches the child without it

    from harness.backends.common import SEED  # noqa: PLC0415  heavy: the parent side launches the child without it
    from harness.model.unit_walk import run_layer  # noqa: PLC0415  heavy: the parent side launches the child without it

    timings = {}
    start = time.monotonic()
    config = _trainer_config(name, seq_len)
    from harness.model.build import on_meta  # noqa: PLC0415  heavy: the parent side launches the child without it

    model = on_meta(config)
    kind = "native" if name.startswith(("titan_native", "nki_moe")) else "hf"
    s = Streamer(model, kind)
    dtype = getattr(torch, compute_dtype)
    vocab = model.config.vocab_size if kind == "native" else model.model.config.vocab_size
    hidden = model.config.dim if kind == "native" else model.model.config.hidden_size
    inputs, labels = _token_batch(vocab, batch, seq_len)
    positions, masks = _positions_and_masks(model, kind, batch, seq_len)
    weights: dict[str, torch.Tensor] = {}

    def keep(unit_name: str) -> None:
        if keep_weights:
            for pname, p in s.module[unit_name].named_parameters(remove_duplicate=False):
                weights[f"{unit_name}.{pname}"] = p.detach().clone()

    torch.manual_seed(SEED)  # dist_utils.set_determinism(seed=SEED) on one process
    embed_name = s.units[0][0]
    replay: dict[str, torch.Tensor] = {}
    if kind == "native" and s.tied:
        # torchtitan inits the tied embedding (= lm_head) after the layers: walk the whole
        # init order once, recording the RNG state before each layer, then replay the layers.
        s.materialise("lm_head")
        s.materialise("tok_embeddings")
        for unit_name, _ in s.units:
            if unit_name.startswith("layers."):
                replay[unit_name] = torch.get_rng_state()
                s.materialise(unit_name)
                s.init_unit(unit_name)
                s.free(unit_name)
            else:
                if unit_name not in ("lm_head", "tok_embeddings"):
                    s.materialise(unit_name)
                s.init_unit(unit_name)
        for unit_name in ("tok_embeddings", "norm", "lm_head"):
            s.check_initialised(unit_name)
            keep(unit_name)
        head_std = _std(s.module["lm_head"].weight)
    else:
        s.materialise(embed_name)
        s.init_unit(embed_name)
        s.check_initialised(embed_name)
        keep(embed_name)
        if s.tied:  # the transformers backend ties lm_head to the embedding (tie_weights)
            head_std = _std(s.module[embed_name].weight)
    timings["init_head_s"] = time.monotonic() - start

    with torch.no_grad():
        s.cast(embed_name, dtype)
        h = s.module[embed_name](inputs)
        position_embeddings = None
        if kind == "hf":
            s.materialise("rotary_emb")  # no parameters: its place in the order is immaterial
            s.init_unit("rotary_emb")
            position_embeddings = s.module["rotary_emb"](h, positions)
        layer_init_s = layer_fwd_s = 0.0
        for unit_name, layer in s.layers:
            t0 = time.monotonic()
            if replay:
                torch.set_rng_state(replay[unit_name])
            s.materialise(unit_name)
            s.init_unit(unit_name)
            s.check_initialised(unit_name)
            keep(unit_name)
            s.cast(unit_name, dtype)
            t1 = time.monotonic()
            h = run_layer(kind, layer, h, masks, positions, position_embeddings)
            s.free(unit_name)
            layer_init_s += t1 - t0
            layer_fwd_s += time.monotonic() - t1
        timings["layer_init_s"], timings["layer_forward_s"] = layer_init_s, layer_fwd_s
        t0 = time.monotonic()
        if not replay:
            for unit_name in ("norm", "lm_head"):
                s.materialise(unit_name)
                s.init_unit(unit_name)
                if unit_name == "lm_head" and s.tied:
                    s.tie()
                s.check_initialised(unit_name)
                keep(unit_name)
            if not s.tied:
                head_std = _std(s.module["lm_head"].weight)
        head = s.module["lm_head"]
        s.cast("norm", dtype)
        s.cast("lm_head", dtype)
        h = s.module["norm"](h)
        stats = _chunked_loss(head, h, inputs, labels, chunk)
        timings["head_s"] = time.monotonic() - t0
    result = {
        "case": name,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "batch": batch,
        "seq_len": seq_len,
        "compute_dtype": compute_dtype,
        "init_seed": SEED,
        "token_seed": TOKEN_SEED,
        "lm_head_std": head_std,
        "tied": s.tied,
        "layer_init_passes": 2 if replay else 1,
        **stats.result(),
        **{k: round(v, 2) for k, v in timings.items()},
        "wall_s": round(time.monotonic() - start, 2),
    }
    if keep_weights:
        result["weights"] = weights
    return result


def whole_model_first_step(name: str, batch: int, seq_len: int, chunk: int) -> dict:
    """Reference for the small check: the whole model, init and forward as the trainer does."""
    from harness.model.build import transformers_backend_patches_restored  # noqa: PLC0415  heavy: the parent side launches the child without it

    with transformers_backend_patches_restored():  # as streamed_first_step
        return _whole_model_first_step(name, batch, seq_len, chunk)


def _whole_model_first_step(name: str, batch: int, seq_len: int, chunk: int) -> dict:
    import torch  # noqa: PLC0415  heavy: the parent side launches the child without it

    from harness.backends.common import SEED  # noqa: PLC0415  heavy: the parent side launches the child without it

    config = _trainer_config(name, seq_len)
    from harness.model.build import on_meta  # noqa: PLC0415  heavy: the parent side launches the child without it

    model = on_meta(config)
    kind = "native" if name.startswith(("titan_native", "nki_moe")) else "hf"
    model.to_empty(device="cpu")
    torch.manual_seed(SEED)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
        if kind == "hf":
            _recompute_inv_freq(model.model)
    vocab = model.config.vocab_size if kind == "native" else model.model.config.vocab_size
    inputs, labels = _token_batch(vocab, batch, seq_len)
    positions, masks = _positions_and_masks(model, kind, batch, seq_len)
    with torch.no_grad():
        logits = model(inputs, positions=positions, attention_masks=masks)
    stats = LossStats()
    flat = logits.flatten(0, 1)
    for start in range(0, flat.shape[0], chunk):
        rows = slice(start, start + chunk)
        stats.add(flat[rows], labels.flatten()[rows], inputs.flatten()[rows])
    if kind == "native":
        named = dict(model.named_parameters(remove_duplicate=False))
    else:
        hf = model.model
        named = {k.replace("model.", "", 1) if k.startswith("model.") else k: v
                 for k, v in hf.named_parameters(remove_duplicate=False)}
    return {**stats.result(), "weights": {k: v.detach() for k, v in named.items()}}


def _child_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("case", "check-streaming"))
    parser.add_argument("case", nargs="?")
    args = parser.parse_args(argv)
    _eager_block_masks()
    if args.mode == "case":
        result = streamed_first_step(args.case, BATCH, SEQ_LEN, COMPUTE_DTYPE)
        result["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB
        result["versions"] = package_versions()
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    # check-streaming: on the tiny fixtures, streamed init + forward == whole-model init +
    # forward, fp32, same seed: identical weights, same loss statistics.
    report = {}
    for name in SMALL_CASES:
        whole = whole_model_first_step(name, batch=2, seq_len=64, chunk=16)
        streamed = streamed_first_step(name, batch=2, seq_len=64, compute_dtype="float32",
                                       chunk=16, keep_weights=True)
        ww, sw = whole.pop("weights"), streamed.pop("weights")
        missing = sorted(set(ww) - set(sw))
        extra = sorted(set(sw) - set(ww))
        differ = sorted(k for k in set(ww) & set(sw) if not bool((ww[k] == sw[k]).all()))
        report[name] = {
            "missing_in_streamed": missing,
            "extra_in_streamed": extra,
            "weights_differ": differ,
            "whole": whole,
            "streamed": {k: streamed[k] for k in whole},
        }
    print("RESULT " + json.dumps(report), flush=True)
    return 0


def random_init_problems(result: dict, backend: str, published) -> tuple[list[str], str]:
    """Every way a case's result misses its expectations: the measured lm_head init std vs the
    std the backend is configured with, the loss vs ``ln V + s^2/2`` at that configured std
    (never the measured one: a wrong init scale must not move its own expectation), the
    sampled vs the label-averaged loss, and the published value. Returns (problems, summary)."""
    from harness.references.expected_loss import analytic_random_init_loss, configured_lm_head_std  # noqa: PLC0415  heavy: the parent side launches the child without it
    from harness.registry.tolerances import INIT_STD_RTOL, loss_band  # noqa: PLC0415  heavy: the parent side launches the child without it

    tolerance = loss_band("analytic_random_init").value
    configured = configured_lm_head_std(backend, result["hidden_size"])
    analytic = analytic_random_init_loss(result["vocab_size"], result["hidden_size"], configured)
    observed = result["label_averaged_loss"]
    summary = (
        f"label-averaged first-step loss {observed:.4f} +- {result['label_averaged_loss_se']:.4f}, "
        f"sampled {result['sampled_loss']:.4f} +- {result['sampled_loss_se']:.4f} "
        f"({result['tokens']} tokens), logit variance {result['logit_variance']:.4f}; analytic "
        f"ln V + s^2/2 = {analytic:.4f} (configured lm_head std {configured:.5f}, measured "
        f"{result['lm_head_std']:.5f}); published {published.value} ({published.source}); "
        f"{result['wall_s']:.0f} s, peak RSS {result['peak_rss_gib']:.1f} GiB")
    problems = []
    if abs(result["lm_head_std"] / configured - 1) > INIT_STD_RTOL:
        problems.append(f"lm_head init std {result['lm_head_std']:.5f} vs configured "
                        f"{configured:.5f} (rtol {INIT_STD_RTOL})")
    if abs(observed - analytic) > tolerance:
        problems.append(f"vs analytic: |{observed:.4f} - {analytic:.4f}| > {tolerance}")
    gap = abs(result["sampled_loss"] - observed)
    if gap > 4 * result["sampled_loss_se"] + 1e-3:
        problems.append(f"sampled loss is {gap:.4f} from the label-averaged loss (> 4 SE)")
    mismatch = published.check(observed)
    if mismatch:
        problems.append(f"vs published: {mismatch}")
    return problems, summary


# --------------------------------------------------------------------------------------------
# Parent side: run a case in its own process, under a memory limit.
# --------------------------------------------------------------------------------------------


def run_child(args: list[str], log: Path, timeout_s: float = CASE_TIMEOUT_S,
              memory_limit_gib: float = MEMORY_LIMIT_GIB):
    """Run this module in a child process; return (parsed RESULT, wall s, peak RSS GiB)."""
    start = time.monotonic()
    peak = 0.0
    with open(log, "w") as out:
        # Started as a CPU rank starts: the CPU ranks' shims (cpu device, eager flex).
        proc = subprocess.Popen([sys.executable, "-m", __name__, *args],
                                env=environment.child_environment(rank=True, shims=CPU_SHIMS),
                                stdout=out, stderr=subprocess.STDOUT, cwd=paths.REPO_ROOT)
        handle = psutil.Process(proc.pid)
        why = None
        try:
            while proc.poll() is None and why is None:
                try:
                    rss = handle.memory_info().rss / GIB
                except psutil.NoSuchProcess:
                    break
                peak = max(peak, rss)
                if rss > memory_limit_gib:
                    why = f"RSS {rss:.1f} GiB passed the {memory_limit_gib} GiB limit"
                elif time.monotonic() - start > timeout_s:
                    why = f"no result within {timeout_s:.0f} s"
                else:
                    time.sleep(0.5)
        finally:  # a limit, an error or Ctrl-C: the child does not outlive the test
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    text = log.read_text(errors="replace")
    lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
    if why or proc.returncode != 0 or not lines:
        tail = "\n".join(text.splitlines()[-40:])
        why = why or f"exit code {proc.returncode}"
        raise RuntimeError(f"{' '.join(args)}: {why}; log {log}:\n{tail}")
    return json.loads(lines[-1][len("RESULT "):]), time.monotonic() - start, peak




if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
