"""``nl.*`` math operators and activation functions, as the ISA instructions apply them:
on float32 torch tensors. Calling one directly as a tile function (``nl.add(a, b)``) is
NKI's higher-level API, which the emulator does not implement."""

from __future__ import annotations

import torch
import torch.nn.functional as F

class Op:
    def __init__(self, name: str, fn, arity: int, kind: str = "arith"):
        self.name, self.fn, self.arity, self.kind = name, fn, arity, kind

    def __repr__(self) -> str:
        return f"nl.{self.name}"

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"nki emulator: nki.language.{self.name} as a tile-level function is not "
                                  f"implemented; pass it as the op of an nki.isa instruction")

    def apply(self, *args):
        return self.fn(*args)

def _f(b: torch.Tensor) -> torch.Tensor:
    return b.to(torch.float32)

BINARY = {
    "add": torch.add, "subtract": torch.sub, "multiply": torch.mul, "divide": torch.div,
    "maximum": torch.maximum, "minimum": torch.minimum, "power": torch.pow,
    "equal": lambda a, b: _f(a == b), "not_equal": lambda a, b: _f(a != b),
    "less": lambda a, b: _f(a < b), "less_equal": lambda a, b: _f(a <= b),
    "greater": lambda a, b: _f(a > b), "greater_equal": lambda a, b: _f(a >= b),
    "abs_max": lambda a, b: torch.maximum(a.abs(), b.abs()), "abs_min": lambda a, b: torch.minimum(a.abs(), b.abs()),
}
UNARY = {
    "copy": lambda x: x, "bypass": lambda x: x, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu,
    "gelu": F.gelu, "gelu_apprx_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_apprx_sigmoid": lambda x: x * torch.sigmoid(1.702 * x), "silu": F.silu, "square": torch.square,
    "abs": torch.abs, "negative": torch.neg, "reciprocal": torch.reciprocal, "sin": torch.sin, "cos": torch.cos,
    "erf": torch.erf, "softplus": F.softplus, "sign": torch.sign, "ceil": torch.ceil, "floor": torch.floor,
    "trunc": torch.trunc, "mish": F.mish,
}
REDUCTIONS = {"add": torch.sum, "maximum": torch.amax, "minimum": torch.amin, "multiply": torch.prod}

OPS = {name: Op(name, fn, 2) for name, fn in BINARY.items()}
OPS.update({name: Op(name, fn, 1, "activation") for name, fn in UNARY.items()})

