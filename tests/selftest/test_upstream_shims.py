"""Each upstream shim is still needed, and does its job when installed.

When one of the ``still_needed`` tests fails, upstream fixed the problem: delete the shim
(harness/upstream/<name>.py and its entry in install.py) and this test.

Every probe below runs in a child process that starts as a launched rank starts
(harness/upstream/probes.py: the boot ``sitecustomize`` installs ``HARNESS_SHIMS`` as upstream
imports, the child imports this tree's harness): under no shim, it shows what upstream does by
itself; under the shims a CPU rank of this generation gets, what the shims change. A shim
patches the whole process, so each shim configuration is one child, which runs all of that
configuration's probes once per session (shared by the pytest-xdist workers); a probe that
raises fails its own tests only.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
from datetime import timedelta
from types import SimpleNamespace
from typing import NamedTuple

import pytest
import torch
import torch.distributed as dist
import torchtitan.models.qwen3 as qwen3

from harness.backends.titan_native import full_model_spec
from harness.device.devices import CPU_SHIMS
from harness.launch.run import RunSpec
from harness.launch.run_cache import shared_folder
from harness.registry import environment, known_issues, paths
from harness.upstream import dtensor_full_init, probes, titan_api
from harness.upstream.gloo_all_to_all import _rows_all_to_all
from harness.upstream.install import after_import
from harness.upstream.titan_4b_theta import theta_from_assets


class Probe(NamedTuple):
    name: str
    code: str  # prints what it observes


on_v0_3 = pytest.mark.skipif(titan_api.generation() != "v0_3",
                             reason="torchtitan 0.3.0 only (the v0_3 generation)")
on_spring2026 = pytest.mark.skipif(titan_api.generation() != "spring2026",
                                   reason="torchtitan spring-2026 main only "
                                   "(python3 scripts/get_upstream.py torchtitan-spring2026)")


DEVICE_TYPE = Probe("device_type", "import torchtitan.tools.utils as u; print(u.device_type)")

FLEX_BACKWARD = Probe("flex_backward", """
import torch
from torch.nn.attention.flex_attention import flex_attention
q = torch.randn(1, 2, 8, 16, requires_grad=True)
try:
    flex_attention(q, q, q).sum().backward()
    print("ok", q.grad.abs().sum().item() > 0)
except NotImplementedError as error:
    print("refused")
""")

FLEX_EAGER = Probe("flex_eager", """
import torch.nn.attention.flex_attention as fa
from torchtitan.models.common.attention import FlexAttention
print(FlexAttention._compiled_flex_attn is fa.flex_attention)
""")

FLEX_UNDER_DETERMINISM = Probe("flex_under_determinism", """
import types
import torch.nn.attention.flex_attention as fa
from torchtitan.config import DebugConfig
from torchtitan.distributed import utils
from torchtitan.models.common.attention import FlexAttention
single_rank = types.SimpleNamespace(world_size=1)
utils.set_determinism(single_rank, "cpu", DebugConfig(seed=1, deterministic=True), [])
print(FlexAttention._compiled_flex_attn is fa.flex_attention)
""")

# A per-document causal mask over two packed rows of 512 (full and partial blocks, documents
# crossing block edges): how it was built (dynamo compiled a frame or not) and its blocks.
BLOCK_MASK = Probe("block_mask", """
import hashlib, torch
from torch._dynamo.utils import counters
from torchtitan.models.common import attention
doc = torch.tensor([[0] * 100 + [1] * 250 + [2] * 162, [0] * 400 + [1] * 112])
def document_causal(b, h, q_idx, kv_idx):
    return (doc[b, q_idx] == doc[b, kv_idx]) & (q_idx >= kv_idx)
frames = counters["frames"]["ok"]
mask = attention.create_attention_mask(document_causal, 2, None, 512, 512, device="cpu")
digest = hashlib.sha1(repr((mask.BLOCK_SIZE, mask.seq_lengths)).encode())
for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
             "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices"):
    t = getattr(mask, name)
    digest.update(name.encode() + (b"-" if t is None else t.contiguous().numpy().tobytes()))
print("compiled" if counters["frames"]["ok"] > frames else "eager", digest.hexdigest()[:16])
""")

GRADIENT_FACTORS = Probe("gradient_factors", """
import torch
from torch.distributed.fsdp._fully_shard import _fsdp_collectives as c
class G:
    def size(self): return 2
_, _, rs_op, _ = c._get_gradient_divide_factors(G(), None, torch.float32, "cpu", factor=4.0)
print("SUM" if rs_op == c.ReduceOp.SUM else "not SUM")
""")

# --- API-generation shims (harness/upstream/titan_api): each is tested on the generation that needs it;
# CI runs this file on both (.ci/run: the system env is v0_3, the spring venv spring2026).

SDPA_CONFIG = Probe("sdpa_config", """
import torchtitan.models.qwen3 as qwen3
try:
    spec = qwen3.model_registry("debugmodel", attn_backend="sdpa")
except ValueError as error:
    print("refused" if "sdpa is no longer supported" in str(error) else f"other: {error}")
else:
    print(type(spec.model.layers[0].attention.inner_attention).__qualname__)
""")

# It patches the process itself (the real trainer; native_config_from_hf installs the sdpa
# shim in-process), so it runs after every probe of its configuration.
SDPA_POSITIONS = Probe("sdpa_positions", """
import types, torch
from harness.backends.native_qwen3 import native_config_from_hf, read_hf_config
from harness.registry import paths
from harness.upstream import titan_sdpa_attention as shim
import torchtitan.trainer as real_trainer
shim.causal_positions_for_sdpa(real_trainer)  # the real class can be patched
seen = {}
class Trainer:  # records what the original post_dataloading_process receives
    def post_dataloading_process(self, input_dict, labels):
        seen[self.name] = input_dict["positions"].tolist()
        return input_dict, labels
fake = types.SimpleNamespace(Trainer=Trainer)
shim.causal_positions_for_sdpa(fake)
hf = read_hf_config(paths.TINY_DENSE)
batch = {"input": torch.zeros(1, 5, dtype=torch.long),
         "positions": torch.tensor([[0, 1, 0, 1, 2]])}
for backend in ("sdpa", "flex"):
    trainer = Trainer()
    trainer.name, trainer.model_config = backend, native_config_from_hf(hf, backend)
    trainer.post_dataloading_process(batch, None)
print(seen["sdpa"], seen["flex"])
""")

HF_BACKEND_IMPORT = Probe("hf_backend_import", """
import dataclasses
try:
    from torchtitan.experiments.transformers_modeling_backend.model import HFTransformerModel
except TypeError as error:
    print("refused" if "must be keyword-only" in str(error) else f"other: {error}")
else:
    from transformers import PretrainedConfig
    leaked = [f.name for f in dataclasses.fields(PretrainedConfig) if f.kw_only]
    print("ok", leaked)
""")

TIED_FSDP = Probe("tied_fsdp", """
import torch, torch.nn as nn, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # no port
import torchtitan.experiments.transformers_modeling_backend.parallelize as par

class Tied(nn.Module):  # the attribute names HFTransformerModel exposes to apply_fsdp
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(16, 8)
        self.layers = nn.ModuleList([nn.Linear(8, 8)])
        self.norm = nn.LayerNorm(8)
        self.lm_head = nn.Linear(8, 16, bias=False)
        self.lm_head.weight = self.tok_embeddings.weight
    def forward(self, x):
        h = self.tok_embeddings(x)
        for layer in self.layers:
            h = layer(h)
        return self.lm_head(self.norm(h))

model = Tied()
par.apply_fsdp(model, init_device_mesh("cpu", (1,)), param_dtype=torch.float32,
               reduce_dtype=torch.float32, pp_enabled=False)
try:
    model(torch.tensor([[1, 2, 3]])).sum().backward()
    print("ok", model.tok_embeddings.weight is model.lm_head.weight)
except ValueError as error:
    print("refused" if "already managed by another FSDP group" in str(error) else f"other: {error}")
""")

HF_SHAPE = Probe("hf_shape", """
import json
from harness.registry import paths
from torchtitan.experiments.transformers_modeling_backend import model_registry
from torchtitan.experiments.transformers_modeling_backend.configs import TransformersBackendConfig
hf = json.loads((paths.TINY_DENSE / "config.json").read_text())
config = TransformersBackendConfig(hf_model=str(paths.TINY_DENSE), model_spec=model_registry("full"))
model = config.model_spec.model.update_from_config(config=config)
keys = ("num_hidden_layers", "hidden_size", "num_attention_heads", "head_dim", "intermediate_size")
print({k: getattr(model, k) for k in keys} == {k: hf[k] for k in keys})
""")

WHOLE_INIT = Probe("whole_init", """
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, Replicate, Shard
from harness.upstream.dtensor_full_init import init_whole_then_shard
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # no port
mesh = init_device_mesh("cpu", (1,))
param = distribute_tensor(torch.zeros(6, 3), mesh, [Shard(0)])
torch.manual_seed(3); init_whole_then_shard("w", param, torch.nn.init.normal_)
torch.manual_seed(3); plain = torch.nn.init.normal_(torch.zeros(6, 3))
kept = distribute_tensor(torch.full((4,), 7.0), mesh, [Shard(0)])
init_whole_then_shard("tied", kept, lambda t: None)
try:
    init_whole_then_shard("tp", distribute_tensor(torch.zeros(4), mesh, [Replicate()]), torch.nn.init.normal_)
    refused = "not refused"
except NotImplementedError as error:
    refused = "refused" if "'tp'" in str(error) and "pure FSDP" in str(error) else str(error)
print(torch.equal(param.to_local(), plain), bool((kept.to_local() == 7).all()), refused)
""")


# The shim configurations this file observes upstream under, and each one's probes, in the
# order they run: no shim; the transformers backend made importable and nothing else
# (spring2026); everything a CPU rank of this generation installs (the device profile's shims
# and the generation's).
NO_SHIMS: tuple[str, ...] = ()
KW_ONLY = ("hf_config_kw_only",)
GENERATION_SHIMS = {"v0_3": ("titan_sdpa_attention",),
                    "spring2026": ("hf_config_kw_only", "hf_tied_fsdp", "hf_shape_from_config")}
# Expert parallelism's token dispatch on gloo: two ranks (threads on one HashStore) exchange
# chunks of different sizes, as EP sends each rank the tokens routed to its experts.
UNEVEN_ALL_TO_ALL = Probe("uneven_all_to_all", """
import threading
from datetime import timedelta
import torch
import torch.distributed as dist
store, seen = dist.HashStore(), {}
def rank(r):
    pg = dist.ProcessGroupGloo(store, r, 2, timedelta(seconds=60))
    chunks = [torch.full((1 + r + j, 2), float(r)) for j in range(2)]
    try:
        pg.alltoall([torch.empty(1 + j + r, 2) for j in range(2)], chunks).wait()
        seen[r] = "ok"
    except RuntimeError as error:
        seen[r] = "refused" if "invalid tensor size" in str(error) else f"error: {error}"
threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
[t.start() for t in threads]
[t.join() for t in threads]
print(seen[0])
""")

CPU_RANK = (*CPU_SHIMS, *GENERATION_SHIMS.get(titan_api.generation(), ()))
OBSERVED: dict[tuple[str, ...], tuple[Probe, ...]] = {
    "v0_3": {
        NO_SHIMS: (DEVICE_TYPE, FLEX_BACKWARD, BLOCK_MASK, GRADIENT_FACTORS, WHOLE_INIT,
                   SDPA_CONFIG, SDPA_POSITIONS, UNEVEN_ALL_TO_ALL),
        CPU_RANK: (DEVICE_TYPE, FLEX_BACKWARD, FLEX_EAGER, BLOCK_MASK, GRADIENT_FACTORS,
                   SDPA_CONFIG, FLEX_UNDER_DETERMINISM),
    },
    "spring2026": {
        NO_SHIMS: (DEVICE_TYPE, FLEX_BACKWARD, BLOCK_MASK, GRADIENT_FACTORS, WHOLE_INIT,
                   HF_BACKEND_IMPORT, UNEVEN_ALL_TO_ALL),
        KW_ONLY: (TIED_FSDP, HF_SHAPE),
        CPU_RANK: (DEVICE_TYPE, FLEX_BACKWARD, FLEX_EAGER, BLOCK_MASK, GRADIENT_FACTORS,
                   HF_BACKEND_IMPORT, TIED_FSDP, HF_SHAPE, FLEX_UNDER_DETERMINISM),
    },
}.get(titan_api.generation(), {})


@pytest.fixture(scope="session")
def upstream(tmp_path_factory):
    """``upstream(PROBE, shims)``: what PROBE printed in the child of that shim configuration
    (its exception, if it raised). Each configuration's child runs once per session."""
    seen: dict[tuple[str, ...], dict[str, probes.Observation]] = {}

    def observe(shims: tuple[str, ...]) -> dict[str, probes.Observation]:
        batch = {probe.name: probe.code for probe in OBSERVED[shims]}
        digest = hashlib.sha1(json.dumps([shims, batch]).encode()).hexdigest()[:10]

        def build(folder):
            folder.mkdir(parents=True)
            found = probes.observe(batch, shims)
            (folder / "observed.json").write_text(json.dumps([o.to_json() for o in found.values()]))

        folder = shared_folder(tmp_path_factory, f"upstream_probes-{digest}", build)
        return {o["probe"]: probes.Observation.from_json(o)
                for o in json.loads((folder / "observed.json").read_text())}

    def printed(probe: Probe, shims: tuple[str, ...]) -> str:
        if probe not in OBSERVED.get(shims, ()):
            raise KeyError(f"probe {probe.name!r} under {shims} is not in OBSERVED: add it there")
        if shims not in seen:
            seen[shims] = observe(shims)
        return seen[shims][probe.name].printed()

    return printed


def test_each_probe_fails_alone_whether_it_raises_or_kills_its_child():
    found = probes.observe({"before": "print('seen')", "raises": "raise ValueError('wrong')",
                            "kills": "import os; os._exit(3)", "after": "print('still seen')"})
    assert found["before"].printed() == "seen" and found["after"].printed() == "still seen"
    with pytest.raises(probes.ProbeError, match="ValueError: wrong"):
        found["raises"].printed()
    with pytest.raises(probes.ProbeError, match="exited with status 3"):
        found["kills"].printed()
    refused = probes.observe({"any": "print(1)"}, shims=("no_such_shim",))["any"]
    with pytest.raises(probes.ProbeError, match=r"unknown upstream shim\(s\) \['no_such_shim'\]"):
        refused.printed()


@pytest.mark.skipif(torch.cuda.is_available(), reason="only meaningful without a GPU")
def test_cpu_device_still_needed(upstream):
    assert upstream(DEVICE_TYPE, NO_SHIMS) == "cuda", "torchtitan now picks the CPU itself: delete cpu_device"


def test_cpu_device_shim_selects_cpu(upstream):
    assert upstream(DEVICE_TYPE, CPU_RANK) == "cpu"


def test_flex_attention_cpu_still_needed(upstream):
    assert upstream(FLEX_BACKWARD, NO_SHIMS) == "refused", "torch runs flex backward on CPU: delete the shim"


def test_flex_attention_cpu_shim_allows_backward(upstream):
    assert upstream(FLEX_BACKWARD, CPU_RANK) == "ok True"


def test_flex_attention_cpu_shim_runs_torchtitan_flex_eagerly(upstream):
    """As torchtitan's attention module is imported (the block-mask patch on the same module
    must not displace it)."""
    assert upstream(FLEX_EAGER, CPU_RANK) == "True"


def test_flex_attention_cpu_shim_keeps_torchtitan_eager_under_determinism(upstream):
    assert upstream(FLEX_UNDER_DETERMINISM, CPU_RANK) == "True"


def test_flex_attention_cpu_block_masks_still_needed(upstream):
    assert upstream(BLOCK_MASK, NO_SHIMS).startswith("compiled "), (
        "torchtitan builds block masks uncompiled: delete build_block_masks_eagerly_on_cpu "
        "from harness/upstream/flex_attention_cpu.py")


def test_flex_attention_cpu_shim_builds_the_same_block_masks_uncompiled(upstream):
    compiled = upstream(BLOCK_MASK, NO_SHIMS).split()[-1]
    assert upstream(BLOCK_MASK, CPU_RANK) == f"eager {compiled}"


def test_gloo_reduce_op_still_needed(upstream):
    assert upstream(GRADIENT_FACTORS, NO_SHIMS) == "not SUM", "FSDP2 reduces with SUM on CPU: delete the shim"


def test_gloo_reduce_op_shim_uses_sum(upstream):
    assert upstream(GRADIENT_FACTORS, CPU_RANK) == "SUM"


def test_gloo_all_to_all_still_needed(upstream):
    assert upstream(UNEVEN_ALL_TO_ALL, NO_SHIMS) == "refused", (
        "gloo's alltoall takes chunks of different sizes: delete harness/upstream/gloo_all_to_all.py")


def test_gloo_all_to_all_sends_uneven_chunks_as_rows():
    """Each rank receives exactly the chunk every other rank addressed to it, whatever its
    size (two ranks as threads on raw gloo groups, standing in for ``dist``)."""
    def all_to_all_single(out, inp, out_splits, in_splits, group):
        group.alltoall_base(out, inp, out_splits, in_splits, dist.AllToAllOptions()).wait()

    fake = SimpleNamespace(all_to_all_single=all_to_all_single)
    store, received = dist.HashStore(), {}

    def rank(r):
        pg = dist.ProcessGroupGloo(store, r, 2, timedelta(seconds=60))
        sent = [torch.arange((1 + r + j) * 3, dtype=torch.float32).view(-1, 3) + 100 * r + 10 * j
                for j in range(2)]
        outs = [torch.empty(1 + j + r, 3) for j in range(2)]
        _rows_all_to_all(fake, outs, sent, pg)
        received[r] = outs

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    for r in range(2):
        for j in range(2):  # rank j's chunk for rank r
            want = torch.arange((1 + j + r) * 3, dtype=torch.float32).view(-1, 3) + 100 * j + 10 * r
            assert torch.equal(received[r][j], want), (r, j)


def test_post_import_patches_of_one_module_all_run_in_order(tmp_path, monkeypatch):
    (tmp_path / "harness_hooked_module.py").write_text("seen = []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # the hooks go with the test
    after_import("harness_hooked_module", lambda m: m.seen.append("first"))
    after_import("harness_hooked_module", lambda m: m.seen.append("second"))
    try:
        import harness_hooked_module  # noqa: PLC0415  order: imported after the hooks registered above
    finally:
        sys.modules.pop("harness_hooked_module", None)
    assert harness_hooked_module.seen == ["first", "second"]


def test_unknown_shim_is_a_clear_error():
    """The boot refuses it before anything runs (its own child: the refusal is the start-up)."""
    done = subprocess.run([sys.executable, "-c", "pass"],
                          env=environment.child_environment(rank=True, shims=("no_such_shim",)),
                          capture_output=True, text=True)
    assert done.returncode != 0 and "unknown upstream shim(s) ['no_such_shim']" in done.stderr


def test_generation_names():
    assert titan_api.generation_of("0.3.0") == "v0_3"
    assert titan_api.generation_of("0.2.2+main.a9c5edc74") == "spring2026"
    assert titan_api.generation_of("0.2.2+neuron.1") == "spring2026-neuron"  # its own (shares the API)
    for unsupported in ("0.2.2", "0.3.1", "0.2.1+neuron.1"):
        with pytest.raises(titan_api.UnsupportedTorchtitanError, match="Supported: v0_3"):
            titan_api.generation_of(unsupported)


@on_v0_3
def test_titan_sdpa_attention_still_needed(upstream):
    assert upstream(SDPA_CONFIG, NO_SHIMS) == "refused", (
        "torchtitan builds attn_backend='sdpa' again: delete harness/upstream/titan_sdpa_attention.py"
    )


@on_v0_3
def test_titan_sdpa_attention_builds_causal_sdpa(upstream):
    assert upstream(SDPA_CONFIG, CPU_RANK) == "ScaledDotProductAttention.Config"


@on_v0_3
def test_titan_sdpa_attention_gives_sdpa_models_causal_positions(upstream):
    """spring main feeds RoPE 0..L-1 for causal (SDPA) models; flex keeps per-document ones."""
    assert upstream(SDPA_POSITIONS, NO_SHIMS) == "[[0, 1, 2, 3, 4]] [[0, 1, 0, 1, 2]]"


@on_spring2026
def test_hf_config_kw_only_still_needed(upstream):
    # the upstream defect this shim works around, recorded in the one registry
    assert known_issues.issue('spring2026-hf_v5-config-not-keyword-only').workaround.rank_shim == 'hf_config_kw_only'
    assert upstream(HF_BACKEND_IMPORT, NO_SHIMS) == "refused", (
        "the transformers backend imports with this transformers: delete "
        "harness/upstream/hf_config_kw_only.py"
    )


@on_spring2026
def test_hf_config_kw_only_imports_without_touching_transformers(upstream):
    assert upstream(HF_BACKEND_IMPORT, CPU_RANK) == "ok []"


@on_spring2026
def test_hf_tied_fsdp_still_needed(upstream):
    # the upstream defect this shim works around, recorded in the one registry
    assert known_issues.issue('spring2026-hf_v5-tied-embedding-fsdp').workaround.rank_shim == 'hf_tied_fsdp'
    assert upstream(TIED_FSDP, KW_ONLY) == "refused", (
        "FSDP now groups tied embeddings in the transformers backend: delete "
        "harness/upstream/hf_tied_fsdp.py"
    )


@on_spring2026
def test_hf_tied_fsdp_shards_tied_embeddings_together(upstream):
    assert upstream(TIED_FSDP, CPU_RANK) == "ok True"


@on_spring2026
def test_hf_shape_from_config_still_needed(upstream):
    # the upstream defect this shim works around, recorded in the one registry
    issue = known_issues.issue('spring2026-hf_v5-flavor-overrides-config-json')
    assert issue.workaround.rank_shim == 'hf_shape_from_config'
    assert upstream(HF_SHAPE, KW_ONLY) == "False", (
        "the transformers backend builds config.json's shape itself: delete "
        "harness/upstream/hf_shape_from_config.py"
    )


@on_spring2026
def test_hf_shape_from_config_builds_the_checkpoint_shape(upstream):
    assert upstream(HF_SHAPE, CPU_RANK) == "True"


def test_dtensor_full_init_still_needed():
    assert known_issues.issue("torch-dtensor-random-init-identical-shards-on-cpu").workaround.rank_shim \
        == "dtensor_full_init"
    assert dtensor_full_init.needed_on("cpu"), (
        "torch's DTensor RNG tracker now supports CPU meshes: delete harness/upstream/"
        "dtensor_full_init.py and the known issue, and record the random-init expectations anew")


def test_dtensor_full_init_draws_the_whole_tensor_keeps_skipped_values_and_refuses_other_placements(upstream):
    assert upstream(WHOLE_INIT, NO_SHIMS) == "True True refused"


# -- titan_4b_theta: the full-size titan_native ranks' 4B flavor, in-process (a config only:
# -- the same call a trn2 rank makes on Qwen3-4B-Instruct-2507's config.json, no weights)

REFERENCE_4B = "Qwen3-4B-Instruct-2507"


def _thetas_of_the_full_titan_native_config(monkeypatch, patched: bool) -> set[float]:
    assets = str(paths.FIXTURES / "reference_configs" / REFERENCE_4B)
    monkeypatch.setenv(environment.FULL_ASSETS, assets)
    monkeypatch.setattr(qwen3, "model_registry", qwen3.model_registry)  # restored after the test
    if patched:
        theta_from_assets(qwen3)
    spec = full_model_spec(assets, "sdpa")
    return {layer.attention.rope.theta for layer in spec.model.layers}


def test_titan_4b_theta_still_needed(monkeypatch):
    assert _thetas_of_the_full_titan_native_config(monkeypatch, patched=False) == {1e6}, (
        "torchtitan's 4B flavor no longer hard-codes theta 1e6: delete the titan_4b_theta shim")


def test_titan_4b_theta_takes_the_assets_theta_for_every_layer(monkeypatch):
    assert _thetas_of_the_full_titan_native_config(monkeypatch, patched=True) == {5e6}


def test_titan_4b_theta_is_applied_to_every_full_size_titan_native_run_only():
    full = RunSpec("titan_native", size="full", init="pretrained", hf_assets_path="/assets")
    assert "titan_4b_theta" in full.all_workarounds and full.name.endswith("+titan_4b_theta")
    assert "titan_4b_theta" not in RunSpec("hf_v5", size="full", init="pretrained",
                                           hf_assets_path="/assets").all_workarounds
    assert "titan_4b_theta" not in RunSpec("titan_native", size="tiny").all_workarounds
