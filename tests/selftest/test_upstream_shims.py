"""Each upstream shim is still needed, and does its job when installed.

When one of the ``still_needed`` tests fails, upstream fixed the problem: delete the shim
(harness/upstream/<name>.py and its entry in install.py) and this test.
"""

import os
import subprocess
import sys

import pytest
import torch

from harness.launch import BOOT_DIR


def _python(code: str, shims: str = "") -> str:
    env = dict(os.environ, HARNESS_SHIMS=shims, PYTHONPATH=str(BOOT_DIR))
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
    env = dict(os.environ, HARNESS_SHIMS="no_such_shim", PYTHONPATH=str(BOOT_DIR))
    done = subprocess.run([sys.executable, "-c", "pass"], env=env, capture_output=True, text=True)
    assert done.returncode != 0 and "unknown upstream shim(s) ['no_such_shim']" in done.stderr
