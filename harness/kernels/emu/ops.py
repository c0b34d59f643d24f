"""``nl.*`` math operators and activation functions, and where each may be used, from the
docs' two tables (https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.1/nki/api/nki.api.shared.html):

- "Supported Math Operators for NKI ISA": the ALU operators of ``tensor_tensor``,
  ``tensor_scalar``, ``tensor_reduce`` (the "Legal Reduction op" column), ``tensor_tensor_scan``
  ...: arithmetic (inputs cast to float32), bitvec (integer bit patterns) and arithmetic unary;
- "Supported Activation Functions for NKI ISA": the ``op`` of ``activation`` (Scalar Engine).

An operator outside an instruction's table is a ``RuleViolation`` (rules ``alu-op`` /
``activation-op``). ``abs_max`` / ``abs_min`` return the signed input of larger / smaller
magnitude (``nki.language.abs_max``) and are NeuronCore-v4 (trn3) only: refused on trn2
(rule ``trn3-only``). The operators compute on float32 torch tensors (bitvec ones on int64);
calling one directly as a tile function (``nl.add(a, b)``) is NKI's higher-level API, which the
emulator does not implement.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from harness.kernels.emu import semantics


class Op:
    def __init__(self, name: str, fn, arity: int, tables: frozenset, trn3_only: bool = False):
        self.name, self.fn, self.arity, self.tables, self.trn3_only = name, fn, arity, tables, trn3_only

    def __repr__(self) -> str:
        return f"nl.{self.name}"

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"nki emulator: nki.language.{self.name} as a tile-level function is not "
                                  f"implemented; pass it as the op of an nki.isa instruction")

    def apply(self, *args):
        return self.fn(*args)

    @property
    def bitvec(self) -> bool:
        return "bitvec" in self.tables


def _f(b: torch.Tensor) -> torch.Tensor:
    return b.to(torch.float32)


def _abs_pick(larger: bool):
    def pick(a, b):
        if not semantics.current().abs_max_signed:  # planted: magnitudes
            return torch.maximum(a.abs(), b.abs()) if larger else torch.minimum(a.abs(), b.abs())
        a, b = torch.broadcast_tensors(a, b)
        take_a = a.abs() > b.abs() if larger else a.abs() < b.abs()
        return torch.where(take_a, a, b)  # "x if |x| > |y|, else y"

    return pick


def _gelu_dx(x):
    return 0.5 * (1 + torch.erf(x / 2**0.5)) + x * torch.exp(-0.5 * x * x) / (2 * torch.pi) ** 0.5


def _gelu_sigmoid_dx(x):
    s = torch.sigmoid(1.702 * x)
    return s + 1.702 * x * s * (1 - s)


def _silu_dx(x):
    s = torch.sigmoid(x)
    return s * (1 + x * (1 - s))


ARITHMETIC = {
    "add": torch.add, "subtract": torch.sub, "multiply": torch.mul,
    "maximum": torch.maximum, "minimum": torch.minimum, "power": torch.pow,
    "equal": lambda a, b: _f(a == b), "not_equal": lambda a, b: _f(a != b),
    "less": lambda a, b: _f(a < b), "less_equal": lambda a, b: _f(a <= b),
    "greater": lambda a, b: _f(a > b), "greater_equal": lambda a, b: _f(a >= b),
    "logical_and": lambda a, b: _f((a != 0) & (b != 0)), "logical_or": lambda a, b: _f((a != 0) | (b != 0)),
    "logical_xor": lambda a, b: _f((a != 0) ^ (b != 0)),
    "abs_max": _abs_pick(True), "abs_min": _abs_pick(False),
}
BITVEC = {
    "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or, "bitwise_xor": torch.bitwise_xor,
    "left_shift": torch.bitwise_left_shift, "right_shift": torch.bitwise_right_shift,
}
ARITHMETIC_UNARY = {"abs": torch.abs, "square": torch.square, "relu": torch.relu, "rsqrt": torch.rsqrt,
                    "reciprocal": torch.reciprocal}
ACTIVATIONS = {
    "copy": lambda x: x, "square": torch.square, "sigmoid": torch.sigmoid, "relu": torch.relu,
    "gelu": F.gelu, "gelu_dx": _gelu_dx, "gelu_apprx_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_apprx_sigmoid": lambda x: x * torch.sigmoid(1.702 * x), "gelu_apprx_sigmoid_dx": _gelu_sigmoid_dx,
    "silu": F.silu, "silu_dx": _silu_dx, "tanh": torch.tanh, "softplus": F.softplus, "mish": F.mish,
    "erf": torch.erf, "erf_dx": lambda x: 2 / torch.pi**0.5 * torch.exp(-x * x), "exp": torch.exp,
    "log": torch.log, "sin": torch.sin, "arctan": torch.arctan, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
    "reciprocal": torch.reciprocal, "sign": torch.sign, "abs": torch.abs,
}
LEGAL_REDUCTIONS = {"add", "subtract", "multiply", "maximum", "minimum", "logical_and", "logical_or", "logical_xor",
                    "bitwise_and", "bitwise_or", "bitwise_xor"}
REDUCTIONS = {"add": torch.sum, "maximum": torch.amax, "minimum": torch.amin, "multiply": torch.prod}
TRN3_ONLY = {"abs_max", "abs_min"}
# documented nl names with no place in either table (nl-level tile functions only, or the
# activation functions nki.isa.activation does not list); importable, refused by every instruction
OTHER = {"divide": torch.div, "negative": torch.neg, "cos": torch.cos, "tan": torch.tan, "ceil": torch.ceil,
         "floor": torch.floor, "trunc": torch.trunc, "bypass": lambda x: x, "prelu": None, "average": None,
         "invert": torch.bitwise_not, "logical_not": None, "fmod": torch.fmod, "mod": None, "gelu_dx": _gelu_dx}


def _op(name: str) -> Op:
    tables = set()
    if name in ARITHMETIC:
        tables.add("alu")
    if name in BITVEC or name == "invert":
        tables |= {"alu", "bitvec"}
    if name in ARITHMETIC_UNARY:
        tables.add("alu")
    if name in ACTIVATIONS:
        tables.add("activation")
    if name in LEGAL_REDUCTIONS:
        tables.add("reduction")
    fn = {**OTHER, **ACTIVATIONS, **ARITHMETIC_UNARY, **BITVEC, **ARITHMETIC}.get(name)
    arity = 2 if name in ARITHMETIC or name in BITVEC or name in ("divide", "fmod", "mod") else 1
    return Op(name, fn, arity, frozenset(tables), name in TRN3_ONLY)


OPS = {name: _op(name) for name in {**OTHER, **ACTIVATIONS, **ARITHMETIC_UNARY, **BITVEC, **ARITHMETIC}}
