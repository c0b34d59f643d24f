"""Each upstream shim is still needed, and does its job when installed.

When one of the ``still_needed`` tests fails, upstream fixed the problem: delete the shim
(harness/upstream/<name>.py and its entry in install.py) and this test.
"""

import os
import subprocess
import sys

import pytest

from harness import known_issues
import torch

from harness.launch import BOOT_DIR
from harness.paths import REPO_ROOT

# The child imports this tree's harness, as a launched rank does (harness/launch.py
# rank_environment), never whatever copy is pip-installed.
CHILD_PYTHONPATH = os.pathsep.join((str(BOOT_DIR), str(REPO_ROOT)))


def _python(code: str, shims: str = "") -> str:
    env = dict(os.environ, HARNESS_SHIMS=shims, PYTHONPATH=CHILD_PYTHONPATH)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


DEVICE_TYPE = "import torchtitan.tools.utils as u; print(u.device_type)"


@pytest.mark.skipif(torch.cuda.is_available(), reason="only meaningful without a GPU")
def test_cpu_device_still_needed():
    assert _python(DEVICE_TYPE) == "cuda", "torchtitan now picks the CPU itself: delete cpu_device"


def test_cpu_device_shim_selects_cpu():
    assert _python(DEVICE_TYPE, shims="cpu_device") == "cpu"


FLEX_BACKWARD = """
import torch
from torch.nn.attention.flex_attention import flex_attention
q = torch.randn(1, 2, 8, 16, requires_grad=True)
try:
    flex_attention(q, q, q).sum().backward()
    print("ok", q.grad.abs().sum().item() > 0)
except NotImplementedError as error:
    print("refused")
"""


def test_flex_attention_cpu_still_needed():
    assert _python(FLEX_BACKWARD) == "refused", "torch runs flex backward on CPU: delete the shim"


def test_flex_attention_cpu_shim_allows_backward():
    assert _python(FLEX_BACKWARD, shims="flex_attention_cpu") == "ok True"


def test_flex_attention_cpu_shim_keeps_torchtitan_eager_under_determinism():
    code = """
import types
import torch.nn.attention.flex_attention as fa
from torchtitan.config import DebugConfig
from torchtitan.distributed import utils
from torchtitan.models.common.attention import FlexAttention
single_rank = types.SimpleNamespace(world_size=1)
utils.set_determinism(single_rank, "cpu", DebugConfig(seed=1, deterministic=True), [])
print(FlexAttention._compiled_flex_attn is fa.flex_attention)
"""
    assert _python(code, shims="flex_attention_cpu") == "True"




GRADIENT_FACTORS = """
import torch
from torch.distributed.fsdp._fully_shard import _fsdp_collectives as c
class G:
    def size(self): return 2
_, _, rs_op, _ = c._get_gradient_divide_factors(G(), None, torch.float32, "cpu", factor=4.0)
print("SUM" if rs_op == c.ReduceOp.SUM else "not SUM")
"""


def test_gloo_reduce_op_still_needed():
    assert _python(GRADIENT_FACTORS) == "not SUM", "FSDP2 reduces with SUM on CPU: delete the shim"


def test_gloo_reduce_op_shim_uses_sum():
    assert _python(GRADIENT_FACTORS, shims="gloo_reduce_op") == "SUM"


def test_unknown_shim_is_a_clear_error():
    env = dict(os.environ, HARNESS_SHIMS="no_such_shim", PYTHONPATH=CHILD_PYTHONPATH)
    done = subprocess.run([sys.executable, "-c", "pass"], env=env, capture_output=True, text=True)
    assert done.returncode != 0 and "unknown upstream shim(s) ['no_such_shim']" in done.stderr


# --- API-generation shims (harness/titan_api): each is tested on the generation that needs it;
# CI runs this file on both (.ci/run: the system env is v0_3, the spring venv spring2026).

from harness import titan_api  # noqa: E402

on_v0_3 = pytest.mark.skipif(titan_api.generation() != "v0_3",
                             reason="torchtitan 0.3.0 only (the v0_3 generation)")
on_spring2026 = pytest.mark.skipif(titan_api.generation() != "spring2026",
                                   reason="torchtitan spring-2026 main only (scripts/make_titan_venv.sh)")


def test_generation_names():
    assert titan_api.generation_of("0.3.0") == "v0_3"
    assert titan_api.generation_of("0.2.2+main.a9c5edc74") == "spring2026"
    assert titan_api.generation_of("0.2.2+neuron.1") == "spring2026-neuron"  # its own (shares the API)
    for unsupported in ("0.2.2", "0.3.1", "0.2.1+neuron.1"):
        with pytest.raises(titan_api.UnsupportedTorchtitanError, match="Supported: v0_3"):
            titan_api.generation_of(unsupported)


SDPA_CONFIG = """
import torchtitan.models.qwen3 as qwen3
try:
    spec = qwen3.model_registry("debugmodel", attn_backend="sdpa")
except ValueError as error:
    print("refused" if "sdpa is no longer supported" in str(error) else f"other: {error}")
else:
    print(type(spec.model.layers[0].attention.inner_attention).__qualname__)
"""


@on_v0_3
def test_titan_sdpa_attention_still_needed():
    assert _python(SDPA_CONFIG) == "refused", (
        "torchtitan builds attn_backend='sdpa' again: delete harness/upstream/titan_sdpa_attention.py"
    )


@on_v0_3
def test_titan_sdpa_attention_builds_causal_sdpa():
    assert _python(SDPA_CONFIG, shims="titan_sdpa_attention") == "ScaledDotProductAttention.Config"


SDPA_POSITIONS = """
import types, torch
from harness.backends.native_qwen3 import native_config_from_hf, read_hf_config
from harness import paths
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
"""


@on_v0_3
def test_titan_sdpa_attention_gives_sdpa_models_causal_positions():
    """spring main feeds RoPE 0..L-1 for causal (SDPA) models; flex keeps per-document ones."""
    assert _python(SDPA_POSITIONS) == "[[0, 1, 2, 3, 4]] [[0, 1, 0, 1, 2]]"


HF_BACKEND_IMPORT = """
import dataclasses
try:
    from torchtitan.experiments.transformers_modeling_backend.model import HFTransformerModel
except TypeError as error:
    print("refused" if "must be keyword-only" in str(error) else f"other: {error}")
else:
    from transformers import PretrainedConfig
    leaked = [f.name for f in dataclasses.fields(PretrainedConfig) if f.kw_only]
    print("ok", leaked)
"""


@on_spring2026
def test_hf_config_kw_only_still_needed():
    # the upstream defect this shim works around, recorded in the one registry
    assert known_issues.issue('spring2026-hf_v5-config-not-keyword-only').workaround.rank_shim == 'hf_config_kw_only'
    assert _python(HF_BACKEND_IMPORT) == "refused", (
        "the transformers backend imports with this transformers: delete "
        "harness/upstream/hf_config_kw_only.py"
    )


@on_spring2026
def test_hf_config_kw_only_imports_without_touching_transformers():
    assert _python(HF_BACKEND_IMPORT, shims="hf_config_kw_only") == "ok []"


TIED_FSDP = """
import os, socket, torch, torch.nn as nn, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
with socket.socket() as s:  # a free port: parallel test processes never collide
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo")
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
finally:
    dist.destroy_process_group()
"""


@on_spring2026
def test_hf_tied_fsdp_still_needed():
    # the upstream defect this shim works around, recorded in the one registry
    assert known_issues.issue('spring2026-hf_v5-tied-embedding-fsdp').workaround.rank_shim == 'hf_tied_fsdp'
    assert _python(TIED_FSDP, shims="hf_config_kw_only") == "refused", (
        "FSDP now groups tied embeddings in the transformers backend: delete "
        "harness/upstream/hf_tied_fsdp.py"
    )


@on_spring2026
def test_hf_tied_fsdp_shards_tied_embeddings_together():
    assert _python(TIED_FSDP, shims="hf_config_kw_only,hf_tied_fsdp") == "ok True"


HF_SHAPE = """
import json
from harness import paths
from torchtitan.experiments.transformers_modeling_backend import model_registry
from torchtitan.experiments.transformers_modeling_backend.configs import TransformersBackendConfig
hf = json.loads((paths.TINY_DENSE / "config.json").read_text())
config = TransformersBackendConfig(hf_model=str(paths.TINY_DENSE), model_spec=model_registry("full"))
model = config.model_spec.model.update_from_config(config=config)
keys = ("num_hidden_layers", "hidden_size", "num_attention_heads", "head_dim", "intermediate_size")
print({k: getattr(model, k) for k in keys} == {k: hf[k] for k in keys})
"""


@on_spring2026
def test_hf_shape_from_config_still_needed():
    # the upstream defect this shim works around, recorded in the one registry
    assert known_issues.issue('spring2026-hf_v5-flavor-overrides-config-json').workaround.rank_shim == 'hf_shape_from_config'
    assert _python(HF_SHAPE, shims="hf_config_kw_only") == "False", (
        "the transformers backend builds config.json's shape itself: delete "
        "harness/upstream/hf_shape_from_config.py"
    )


@on_spring2026
def test_hf_shape_from_config_builds_the_checkpoint_shape():
    assert _python(HF_SHAPE, shims="hf_config_kw_only,hf_shape_from_config") == "True"


def test_dtensor_full_init_still_needed():
    from harness.upstream import dtensor_full_init

    assert known_issues.issue("torch-dtensor-random-init-identical-shards-on-cpu").workaround.rank_shim \
        == "dtensor_full_init"
    assert dtensor_full_init.needed_on("cpu"), (
        "torch's DTensor RNG tracker now supports CPU meshes: delete harness/upstream/"
        "dtensor_full_init.py and the known issue, and record the random-init expectations anew")


WHOLE_INIT = """
import os
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29400 + os.getpid() % 500), RANK="0", WORLD_SIZE="1")
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, Replicate, Shard
from harness.upstream.dtensor_full_init import init_whole_then_shard
dist.init_process_group("gloo")
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
dist.destroy_process_group()
"""


def test_dtensor_full_init_draws_the_whole_tensor_keeps_skipped_values_and_refuses_other_placements():
    assert _python(WHOLE_INIT) == "True True refused"
