"""trn2 rules the emulator enforces, each with where the Neuron docs state it.

A kernel that breaks one raises ``RuleViolation`` naming the rule, what the kernel did and
the docs page that states the rule. The limits are trn2's (NeuronCore-v3): the real
``nki.simulate`` without a chip targets trn3, whose looser limits (moving free size up to
4096, bf16 PSUM results) would let these through.
"""

from __future__ import annotations

from dataclasses import dataclass

DOCS = "https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.0/nki"


@dataclass(frozen=True)
class Rule:
    name: str
    statement: str
    source: str


def _rule(name: str, statement: str, page: str) -> Rule:
    return Rule(name, statement, f"{DOCS}/{page}")


_ISA = "api/generated/nki.isa"
RULES = {
    r.name: r
    for r in (
        _rule("partition-dim", "an SBUF/PSUM tile's partition dimension (dim 0) is at most 128 (nl.tile_size.pmax)",
              "api/generated/nki.language.ndarray.html; nki.language.tile_size.pmax"),
        _rule("partition-access", "an on-chip view's dim 0 steps exactly one partition (the access on the partition "
              "dimension must be contiguous: reading every other partition is illegal) and its free dims stay inside "
              "one partition", "deep-dives/nki-aps.html (Restriction on SBUF/PSUM Tensors)"),
        _rule("sbuf-capacity", "trn2's SBUF holds 128 partitions of 224 KiB (NeuronCore-v3: 28 MiB): one tile at "
              "most 224 KiB per partition, and the tiles live at any instruction at most 28 MiB (partitions x bytes "
              "per partition); a tile's contents are live from a write to the last read of what it wrote",
              "guides/architecture/trainium2_arch.html (NeuronCore-v3 SBUF capacity)"),
        _rule("psum-capacity", "PSUM holds 128 partitions of 16 KiB (2 MiB: 8 banks of 2 KiB per partition): one "
              "tile at most 16 KiB per partition, and the tiles live at any instruction at most 2 MiB; a PSUM tile "
              "is live from its first write to its last (its accumulation groups; an eviction may run right after)",
              "guides/architecture/trainium2_arch.html (PSUM capacity remains "
              "2MiB); nki.language.tile_size.psum_num_banks"),
        _rule("matmul-memory", "nc_matmul reads stationary and moving from SBUF and writes dst in PSUM",
              f"{_ISA}.nc_matmul.html (Memory types)"),
        _rule("matmul-contraction", "stationary and moving have the same partition size, at most 128",
              f"{_ISA}.nc_matmul.html (Tile size)"),
        _rule("matmul-stationary-fmax", "the stationary free size is at most 128 (gemm_stationary_fmax)",
              f"{_ISA}.nc_matmul.html (Tile size)"),
        _rule("matmul-moving-fmax", "on NeuronCore-v3 (trn2) the moving free size is at most 512 (gemm_moving_fmax), "
              "one PSUM bank of float32", f"{_ISA}.nc_matmul.html (Tile size)"),
        _rule("pinned-address", "a tile pinned with nl.ndarray(address=(partition_offset, free_offset)) lies inside "
              "its memory (partitions 0..127, the bytes of a partition), and tiles pinned over the same bytes share "
              "them: a pinned tile's contents are its own until a tile pinned over its bytes is written",
              "api/generated/nki.language.ndarray.html (address)"),
        _rule("matmul-psum-bank", "an nc_matmul result fits one PSUM bank: 2 KiB per partition",
              f"{_ISA}.nc_matmul.html (Tile size); arch/trainium2_arch.html"),
        _rule("matmul-dtype", "nc_matmul inputs are float8_e4m3/float8_e5m2/bfloat16/float16/tfloat32/float32, a "
              "float32/tfloat32 input needs the other to be float32/tfloat32 too, and on trn2 dst is float32",
              f"{_ISA}.nc_matmul.html (Data types)"),
        _rule("matmul-accumulate-init", "accumulate=True is valid only after a matmul with accumulate=False started "
              "the PSUM location; onto PSUM a non-matmul instruction wrote it is undefined on trn2",
              f"{_ISA}.nc_matmul.html (Accumulation mode)"),
        _rule("matmul-transpose", "an nc_matmul in transpose mode (is_transpose=True) transposes its stationary tile "
              "through an identity moving tile", f"{_ISA}.nc_matmul.html (Transpose mode); {_ISA}.nc_transpose.html"),
        _rule("matmul-tiling", "tile_position and tile_size are set together; row and column tiles are 32, 64 or 128 "
              "and start at a multiple of their size inside the 128x128 array", f"{_ISA}.nc_matmul.html (Tiling mode)"),
        _rule("matmul-double-row", "perf_mode=double_row (NeuronCore-v3's double FP8 matmul) takes float8_e4m3/"
              "float8_e5m2 stationary [K, 2, M] and moving [K, 2, N], contracts over K x 2 (<= 128 x 2), and is not "
              "combined with column tiling or transpose mode; perf_mode is none or double_row",
              f"{_ISA}.nc_matmul.html (Performance mode); arch/trainium2_arch.html (Double FP8 Matmul Performance)"),
        _rule("local-gather", "local_gather: dst, src_buffer and index on the same partitions, a multiple of a GpSimd "
              "core's 16; integer indices; num_valid_indices at most a core's index count; dst holds num_valid_indices "
              "x num_elem_per_idx elements a partition, of src_buffer's dtype", f"{_ISA}.local_gather.html"),
        _rule("matmul-shape", "dst is [stationary free, moving free]", f"{_ISA}.nc_matmul.html (Layout)"),
        _rule("transpose-memory", "Tensor Engine nc_transpose reads SBUF and writes PSUM",
              f"{_ISA}.nc_transpose.html (Memory types)"),
        _rule("transpose-size", "Tensor Engine nc_transpose takes at most [128, 128], Vector Engine at most [32, 32]",
              f"{_ISA}.nc_transpose.html (Tile size)"),
        _rule("transpose-dtype", "nc_transpose dst has the dtype of data", f"{_ISA}.nc_transpose.html (Data types)"),
        _rule("on-chip-operand", "compute-engine operands are SBUF or PSUM tiles", f"{_ISA}.tensor_tensor.html"),
        _rule("two-psum-inputs", "the two tensor inputs of tensor_tensor / tensor_tensor_scan cannot both be in PSUM",
              f"{_ISA}.tensor_tensor.html (Memory types); {_ISA}.tensor_tensor_scan.html"),
        _rule("gpsimd-psum", "GpSimd Engine cannot access PSUM", f"{_ISA}.tensor_copy.html"),
        _rule("same-tile-size", "the operands have the same partition size and the same number of elements per "
              "partition", f"{_ISA}.tensor_tensor.html; {_ISA}.tensor_copy.html; {_ISA}.activation.html"),
        _rule("scalar-operand", "a tensor_scalar / activation vector operand is a [partitions, 1] float tile "
              "(the docs ask for float32; the compiler accepts the bfloat16 nki-library passes)",
              f"{_ISA}.tensor_scalar.html; {_ISA}.activation.html"),
        _rule("reduce-axes", "tensor_reduce reduces the last contiguous free axes, never axis 0, and dst holds "
              "what is left", f"{_ISA}.tensor_reduce.html (Layout, Tile size)"),
        _rule("iota-memory", "iota writes an SBUF tile and the pattern's element count matches dst's per-partition "
              "count", f"{_ISA}.iota.html"),
        _rule("dma-size", "dma_copy (and dma_transpose) src and dst hold the same number of elements; a "
              "dma_transpose lowered to the hardware DGE (dge_mode=hwdge) or an indirect one moves 2-byte elements "
              "(at dge_mode=unknown a direct one has no dtype limit)", f"{_ISA}.dma_copy.html (Tile size); "
              f"{_ISA}.dma_transpose.html (DMA Direct / Indirect Transpose Constraints)"),
        _rule("dma-memory", "dma_copy moves data between HBM and SBUF (not PSUM)",
              f"{_ISA}.dma_copy.html (Memory types)"),
        _rule("bounds", "an access stays inside its tensor (out-of-bounds DMA raises by default: oob_mode.error)",
              f"{_ISA}.dma_copy.html (oob_mode)"),
        _rule("stream-shuffle", "nc_stream_shuffle: a 32-entry mask, dst and src of one dtype and per-partition size, "
              "start partitions 0 (96/128 active), 0/64 (64) or 0/32/64/96 (32)", f"{_ISA}.nc_stream_shuffle.html"),
        _rule("alu-op", "an ALU instruction's op is in the Supported Math Operators table (bitvec operators need "
              "integer tiles; tensor_reduce's op is a Legal Reduction op)", "api/nki.api.shared.html (Supported Math "
              "Operators for NKI ISA)"),
        _rule("activation-op", "nki.isa.activation's op is in the Supported Activation Functions table",
              "api/nki.api.shared.html (Supported Activation Functions for NKI ISA)"),
        _rule("trn3-only", "abs_max and abs_min are available only on NeuronCore-v4 (trn3) and newer; the emulator is "
              "trn2", "api/generated/nki.language.abs_max.html; api/generated/nki.language.abs_min.html"),
        _rule("dma-rmw", "nki.isa.dma_copy has no dst_rmw_op in NKI 0.7 (removed in NKI 0.3): a read-modify-write "
              "DMA is not an NKI 0.7 instruction", f"{_ISA}.dma_copy.html (signature)"),
        _rule("core-barrier", "nki.isa.core_barrier synchronizes cores=(0, 1): every program of the launch named in "
              "cores reaches the same sequence of barriers, and its data is a shared HBM tensor (the docs: 'This "
              "must be data in shared HBM that multiple cores are accessing')", f"{_ISA}.core_barrier.html"),
        _rule("lnc-race", "programs of an LNC=2 launch that read what the other wrote, or write different values to "
              "the same HBM element, are ordered by an nki.isa.core_barrier between the accesses",
              f"{_ISA}.core_barrier.html (the use case: disjoint writes, a barrier, then reads)"),
    )
}


# The documented semantics the emulator computes by (not rules a kernel can break), each with the
# page that states it: a behaviour the emulator follows and where to check it.
SEMANTICS = {
    "cast-at-destination": ("engines compute arithmetic in float32 and round at dst's dtype",
                            f"{DOCS}/api/nki.api.shared.html (Supported Math Operators: arithmetic operators convert "
                            f"to float32); {DOCS}/{_ISA}.tensor_tensor.html (Data types)"),
    "same-dtype-copies": ("dma_copy and tensor_copy between one dtype move the values untouched (through float32 only "
                          "when the dtypes differ)", f"{DOCS}/{_ISA}.dma_copy.html (Data types); "
                          f"{DOCS}/{_ISA}.tensor_copy.html (bit-accurate copy when input and output types are the "
                          "same)"),
    "int32-tensor-tensor": ("tensor_tensor with every tile int32/uint32 runs on GpSimd in native integer arithmetic "
                            "(exact), unless an operand is in PSUM or engine=vector",
                            f"{DOCS}/{_ISA}.tensor_tensor.html"),
    "bitvec-operators": ("bitvec operators treat integer tiles as bit patterns, no cast",
                         f"{DOCS}/api/nki.api.shared.html (Supported Math Operators, Bitvec)"),
    "integer-memset": ("memset supports every NKI dtype: an integer constant into an integer tile is that integer",
                       f"{DOCS}/{_ISA}.memset.html"),
    "float-to-integer": ("a float32 result written to an integer tile rounds to nearest even and saturates at the "
                         "type's range (as measured on Neuron 2.32's nki.simulate; the docs name the float32 "
                         "intermediate but no rounding mode)", f"{DOCS}/api/nki.api.shared.html (Type Casting)"),
    "signed-abs-max": ("abs_max / abs_min return the original signed value of larger / smaller magnitude; "
                       "NeuronCore-v4 (trn3) only", f"{DOCS}/api/generated/nki.language.abs_max.html"),
    "numpy-dtypes": ("nki.language dtypes are NumPy dtypes (ml_dtypes for bfloat16 and the float8 formats)",
                     f"{DOCS}/api/nki.api.shared.html (Supported Data Types); nki-library's tests build inputs "
                     "with np.random.randn(...).astype(nl.bfloat16)"),
    "partition-slice": ("on an on-chip tensor an integer index on dim 0 is a size-1 slice; results stay at least 2-d",
                        f"{DOCS}/api/generated/nki.language.NkiTensor.html (__getitem__)"),
    "ap-pattern": (".ap(pattern, offset) reads [[stride, count], ...] of the storage",
                   f"{DOCS}/deep-dives/nki-aps.html"),
    "transpose-mode": ("Tensor Engine transposes (nc_matmul is_transpose=True, nc_transpose) are bit-accurate from "
                       "NeuronCore-v3 (NaN and Inf included)", f"{DOCS}/{_ISA}.nc_matmul.html (Transpose mode); "
                       f"{DOCS}/guides/architecture/trainium2_arch.html"),
    "max8-find-replace": ("max8: the 8 largest per partition, descending; nc_find_index8: first occurrences, repeated "
                          "vals in ascending slots, missing ones all-ones; nc_match_replace8: vals taken i = 7..0",
                          f"{DOCS}/{_ISA}.max8.html; {DOCS}/{_ISA}.nc_find_index8.html; "
                          f"{DOCS}/{_ISA}.nc_match_replace8.html"),
    "scan": ("tensor_tensor_scan: result[:, i] = op1(op0(data0[:, i], result[:, i-1]), data1[:, i]) in float32",
             f"{DOCS}/{_ISA}.tensor_tensor_scan.html"),
    "reduce-registers": ("activation's reduce_regs: reset / reduce / reset_reduce / idle, read out by reduce_res",
                         f"{DOCS}/{_ISA}.activation.html"),
    "oob-skip": ("an indirect DMA with oob_mode=skip skips the transfers whose dynamic index is out of bounds",
                 f"{DOCS}/{_ISA}.dma_copy.html (oob_mode)"),
    "lnc-programs": ("at LNC=2 the two cores run the kernel together; shared HBM is ordered by core_barrier "
                     "(cores=(0, 1)) and sendrecv exchanges SBUF tiles", f"{DOCS}/{_ISA}.core_barrier.html; "
                     f"{DOCS}/{_ISA}.sendrecv.html"),
    "reordering": ("the compiler's scheduler may reorder independent instructions (so a PSUM eviction can run right "
                   "after its last matmul)", f"{DOCS}/api/generated/nki.language.no_reorder.html"),
    "nki-object-fields": ("an nl.NKIObject class (a dataclass or not) takes each field by keyword, defaulting to its "
                          "class value, then runs __post_init__; a field is an annotated name or a plain class "
                          "attribute; a field not given stays unset (reading it is an AttributeError): nki-library's "
                          "MLPTKGConstantsDimensionSizes never passes its remainderIFused, in all four releases",
                          f"{DOCS}/get-started/nki-language-guide.html (Classes: the default __init__); "
                          f"{DOCS}/api/generated/nki.language.NKIObject.html (__init__(**kwargs)); nki-library's "
                          "attention_cte.SectionParams(section_idx=...)"),
    "ap-reinterpret": ("ap(pattern, dtype=...) reinterprets the tensor's bytes as dtype, its pattern and offset "
                       "counted in elements of dtype (a partition of a [P, 1] float32 tile is 4 float8 elements)",
                       f"{DOCS}/deep-dives/nki-aps.html (Reinterpret Cast with ap)"),
    "ap-loop-order": ("an access pattern is a loop over its [step, num] pairs, outermost first; a write through one "
                      "that reaches an element twice (a 0 step) leaves the loop's last value there (nki-library's "
                      "qkv_cte writes activation_reduce's unused dst through [[1, s], [0, H]])",
                      f"{DOCS}/deep-dives/nki-aps.html (Semantics of the Access Pattern)"),
    "range-select": ("range_select keeps on_true_tile where free index + range_start passes comp_op0 against bound0 "
                     "and comp_op1 against bound1 (one value per partition), else on_false_value; reduce_op through "
                     "the Vector Engine's accumulator registers (reduce_cmd) into reduce_res; NeuronCore-v3 (trn2) "
                     "and newer", f"{DOCS}/{_ISA}.range_select.html; {DOCS}/{_ISA}.reduce_cmd.html"),
    "tensor-scalar-reduce": ("tensor_scalar_reduce: tensor_scalar with one arithmetic operator, and reduce_op (add, "
                             "multiply, maximum, minimum) of the result along the free axes into reduce_res",
                             f"{DOCS}/{_ISA}.tensor_scalar_reduce.html"),
    "tensor-partition-reduce": ("tensor_partition_reduce (GpSimd): dst [1, free...] = op over data's partitions, at "
                                "most four free dimensions; op add, mean, max, bitwise_or/and/xor (add and max "
                                "implemented)",
                                f"{DOCS}/{_ISA}.tensor_partition_reduce.html"),
    "activation-reduce": ("activation_reduce is activation with reduce_cmd=reset_reduce into reduce_res (reduce_op "
                          "nl.add)", f"{DOCS}/{_ISA}.activation_reduce.html"),
}


class RuleViolation(Exception):
    """A kernel broke a trn2 rule the compiler (or the hardware) enforces."""

    def __init__(self, rule: str, detail: str):
        self.rule = RULES[rule]
        self.detail = detail
        super().__init__(f"nki emulator: trn2 rule '{rule}' violated: {detail}. Rule: {self.rule.statement} "
                         f"(stated in {self.rule.source})")


def check(condition: bool, rule: str, detail) -> None:
    """Raise ``RuleViolation(rule, detail)`` unless ``condition``; ``detail`` may be a callable."""
    if not condition:
        raise RuleViolation(rule, detail() if callable(detail) else detail)
