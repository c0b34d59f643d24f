"""The layout registry: how a run spreads one training step over its ranks, one ``Layout`` per
parallel layout our users train with (like the backend registry, harness/backends).

A layout is a dimension of the run template (``RunSpec.layout``): the same backend, size, init
and attention, on other ranks. Every layout keeps the run's *global* batch (the rows one
optimizer step reads): ``TINY``'s 2 ranks x local batch 2 = 4 rows, so its trajectory is held to
the reference trajectory on its own global batches, and to the FSDP run itself where both read
the same rows (``same_batches_as_fsdp``).

What each field becomes on torchtitan's command line is one function per generation
(harness/upstream/titan_cli.py ``layout_overrides``): the spellings differ, the layouts do not.

Adding a layout: one entry below. The README's layout table is generated from here and from
the known issues (``layout_table_markdown``; tests/selftest/test_doc_links.py holds it).
"""

from __future__ import annotations

from dataclasses import dataclass

# The global batch of a tiny run (harness/backends/common.py TINY: 2 ranks x local batch 2).
TINY_GLOBAL_BATCH = 4
FSDP = "fsdp"
# Activation checkpointing of the backends' configs when a layout says nothing: torchtitan's
# default (ActivationCheckpointConfig.mode = "selective" in both generations).
DEFAULT_AC = "selective"
MODEL_KINDS = ("dense", "moe")


# The condition a layout's class of bug needs before it shows, one per layout (``Layout.
# condition``). A cheap form that never reaches it runs the layout and sees nothing: a lost row
# of a reshard needs a dimension that does not split evenly over the new ranks; a per-microbatch
# normalisation needs microbatches whose valid-label counts differ; a double count or a
# recompute that computes otherwise needs a recompute of a forward that changes state; a
# dispatch or combine bug needs an all-to-all whose chunks differ in size; a sum taken as
# complete needs a sum split over ranks.
UNEVEN_SPLIT = "uneven split"
UNEVEN_VALID_TOKENS = "uneven valid tokens"
STATEFUL_RECOMPUTE = "recompute of a stateful forward"
UNEVEN_ALL_TO_ALL = "uneven all-to-all"
PARTIAL_SUMS = "partial sums"
CONDITIONS = (UNEVEN_SPLIT, UNEVEN_VALID_TOKENS, STATEFUL_RECOMPUTE, UNEVEN_ALL_TO_ALL, PARTIAL_SUMS)


@dataclass(frozen=True)
class Layout:
    name: str
    what: str
    ranks: int  # ranks of a tiny run (the CPU and cuda tiers)
    tp: int = 1  # tensor parallel degree
    cp: int = 1  # context parallel degree
    ep: int = 1  # expert parallel degree (borrowed from the data-parallel ranks, as torchtitan does)
    replicate: int = 1  # HSDP: data-parallel replicas (each shards over ranks / replicate)
    pp: int = 1  # pipeline parallel stages (torchtitan's default schedule, 1F1B, microbatches of 1 row)
    ga: int = 1  # gradient accumulation: microbatches per optimizer step
    ac: str = DEFAULT_AC  # activation checkpointing: none | selective | full
    # torch.compile of these trainer components (torchtitan's --compile.components): () none,
    # ("loss",) the cheap form, ("model", "loss") what users compile
    compile: tuple[str, ...] = ()
    kinds: tuple[str, ...] = MODEL_KINDS  # the model kinds it applies to (EP: MoE only)
    attention: str | None = None  # an attention it needs (CP: flex); None: the backend's default
    slow: bool = False  # the slow tier's (4 ranks); the default tier runs the cheap forms
    # A full-size configuration (the neuron tier's): the device's ranks at the size's own local
    # batch, as users run it, and ``ranks`` a trn2.48xlarge's; else a tiny layout, its ranks and
    # global batch as above (the cpu and cuda tiers, and the neuron tier's ``NEURON_LAYOUTS``).
    full_size: bool = False
    # A full-size layout's stand-in on the CPU assets twin (harness/registry/assets_twin.py),
    # whose model is the tiny one: the tiny layout whose degrees the twin runs in its place
    # (the twin's 2 KV heads split at most 2 ways; its 2 ranks hold an EP degree of 2).
    twin: str = ""
    # The condition its class of bug needs (one of ``CONDITIONS``), and the test that reaches
    # it in the default tier: a pytest node id (tests/parity/test_layout_conditions.py holds
    # every layout to it). Only a layout without a cheap form (``slow`` or ``full_size``) may
    # leave ``reached_by`` empty: its condition is then reached in the slow or neuron tier.
    condition: str = ""
    reached_by: str = ""

    @property
    def size(self) -> str:
        """The model size it runs: "full" or "tiny"."""
        return "full" if self.full_size else "tiny"

    @property
    def data_parallel(self) -> int:
        """Ranks that read different rows (EP borrows from them and keeps their data)."""
        return self.ranks // (self.tp * self.cp * self.pp)

    @property
    def local_batch_size(self) -> int:
        """Rows per rank per microbatch that keep the tiny run's global batch."""
        rows, rest = divmod(TINY_GLOBAL_BATCH, self.data_parallel * self.ga)
        if rest or rows < 1:
            raise ValueError(f"layout {self.name}: {TINY_GLOBAL_BATCH} rows do not split over "
                             f"{self.data_parallel} data-parallel ranks x {self.ga} microbatches")
        return rows

    @property
    def rows_per_rank(self) -> int:
        """Rows each data-parallel rank reads per optimizer step (its microbatches in order)."""
        return self.local_batch_size * self.ga

    @property
    def same_batches_as_fsdp(self) -> bool:
        """Whether its global batches are the FSDP run's, row for row: each data-parallel rank
        reads the same shard of the data, the same rows per step. A full-size layout reads the
        size's local batch, so only one that keeps every rank data-parallel (EP) reads the FSDP
        run's rows; TP, CP or PP leave fewer data-parallel ranks: other rows."""
        if self.full_size:
            return self.data_parallel == self.ranks and self.ga == 1
        fsdp = LAYOUTS[FSDP]
        return (self.data_parallel, self.rows_per_rank) == (fsdp.data_parallel, fsdp.rows_per_rank)

    def applies_to(self, kind: str) -> bool:
        return kind in self.kinds

    def degrees(self, ranks: int) -> dict[str, int]:
        """Its parallel degrees over ``ranks`` ranks, named as torchtitan names them
        (``DEGREES``)."""
        return resolved_degrees({"data_parallel_replicate_degree": self.replicate,
                                 "context_parallel_degree": self.cp,
                                 "tensor_parallel_degree": self.tp,
                                 "pipeline_parallel_degree": self.pp,
                                 "expert_parallel_degree": self.ep}, ranks)


# The parallel degrees of a run, as torchtitan's ``ParallelismConfig`` names them (its
# ``--parallelism.<name>`` flags); torchtitan's defaults where a config sets none.
DEGREES = {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": -1,
           "context_parallel_degree": 1, "tensor_parallel_degree": 1,
           "pipeline_parallel_degree": 1, "expert_parallel_degree": 1}


def resolved_degrees(degrees: dict[str, int], ranks: int) -> dict[str, int]:
    """``degrees`` (``DEGREES``' names) over ``ranks`` ranks, a data-parallel shard degree of -1
    resolved as torchtitan's ``ParallelDims`` resolves it: the ranks the others leave."""
    out = {**DEGREES, **degrees}
    if out["data_parallel_shard_degree"] == -1:
        rest = (out["data_parallel_replicate_degree"] * out["context_parallel_degree"]
                * out["tensor_parallel_degree"] * out["pipeline_parallel_degree"])
        out["data_parallel_shard_degree"] = ranks // rest
    return out


LAYOUTS: dict[str, Layout] = {lay.name: lay for lay in (
    Layout(FSDP, "FSDP over every rank (the source's configurations)", ranks=2,
           condition=UNEVEN_SPLIT,
           reached_by="tests/parity/test_layout_resharded_resume.py::test_the_resumed_trainer_holds_the_saved_state[2-to-3]"),
    Layout("tp", "tensor parallel 2", ranks=2, tp=2, condition=PARTIAL_SUMS,
           reached_by="tests/parity/test_layouts.py::test_layout_follows_the_reference_trajectory"
                      "[cpu-titan_native-tiny-pretrained@tp]"),
    Layout("cp", "context parallel 2 (FlexAttention, per-document mask)", ranks=2, cp=2,
           attention="flex", slow=True, condition=PARTIAL_SUMS),
    Layout("ep", "expert parallel 2 over the FSDP ranks (MoE)", ranks=2, ep=2, kinds=("moe",),
           condition=UNEVEN_ALL_TO_ALL,
           reached_by="tests/parity/test_layouts.py::test_layout_equals_the_fsdp_run"
                      "[cpu-nki_moe-tiny-pretrained@ep]"),
    # Its cheap form is the SFT run (ignored prompt labels and padding): packed pretraining
    # rows hold no ignored label, so every microbatch has the same valid-label count.
    Layout("ga=2", "gradient accumulation: 2 microbatches of 1 row per rank", ranks=2, ga=2,
           condition=UNEVEN_VALID_TOKENS,
           reached_by="tests/parity/test_layouts.py::"
                      "test_gradient_accumulation_over_uneven_valid_tokens_is_the_single_batch"),
    # The reference of activation checkpointing: what a recompute must reproduce.
    Layout("ac=none", "no activation checkpointing", ranks=2, ac="none", condition=STATEFUL_RECOMPUTE,
           reached_by="tests/parity/test_layouts.py::test_full_ac_on_the_moe_equals_no_ac"),
    Layout("ac=full", "full activation checkpointing", ranks=2, ac="full", condition=STATEFUL_RECOMPUTE,
           reached_by="tests/parity/test_layouts.py::test_full_ac_on_the_moe_equals_no_ac"),
    Layout("compile", "torch.compile of model and loss (inductor on CPU)", ranks=2,
           compile=("model", "loss"), slow=True, condition=PARTIAL_SUMS),
    # The default tier's cheap form of compile: inductor compiles the model in ~40 s on 2 CPU
    # cores, the loss alone in seconds; the slow tier compiles both.
    # Its bug class: the compiled loss's sum over tokens split into partial sums (a reduction
    # reordered or taken per chunk), against the eager FSDP run on the same rows.
    Layout("compile=loss", "torch.compile of the loss only", ranks=2, compile=("loss",),
           condition=PARTIAL_SUMS,
           reached_by="tests/parity/test_layouts.py::test_layout_equals_the_fsdp_run"
                      "[cpu-titan_native-tiny-pretrained@compile=loss]"),
    Layout("fsdp+tp", "FSDP 2 x tensor parallel 2", ranks=4, tp=2, slow=True, condition=PARTIAL_SUMS),
    Layout("hsdp", "HSDP: 2 replicas x FSDP 2", ranks=4, replicate=2, slow=True,
           condition=PARTIAL_SUMS),
    Layout("fsdp+ep", "FSDP 4 with expert parallel 2 (MoE)", ranks=4, ep=2, kinds=("moe",),
           slow=True, condition=UNEVEN_ALL_TO_ALL),
    # The loss is the last stage's: the first logs -1 (harness/launch/run.py reads the highest
    # rank's records when pp > 1).
    Layout("fsdp+pp", "FSDP 2 x pipeline parallel 2 stages (1F1B, microbatches of 1 row)",
           ranks=4, pp=2, slow=True, condition=UNEVEN_VALID_TOKENS),
    # TorchTitan Neuron's Qwen3 recipe (its basic-training tutorial's qwen3_8b_tp4_fsdp16_sac:
    # tensor parallel 4, data-parallel shard degree -1, selective activation checkpointing), at
    # full size on the neuron tier's 64 ranks. The CPU assets twin runs it at TP 2.
    Layout("tp4+fsdp", "TorchTitan Neuron's Qwen3 recipe: tensor parallel 4 x FSDP 16, selective "
           "activation checkpointing (full size)", ranks=64, tp=4, ac="selective",
           kinds=("dense",), full_size=True, twin="tp", condition=PARTIAL_SUMS),
    # The MoE cut with its experts split over every rank, as TorchTitan Neuron's EP recipes
    # split theirs (the EP tutorial's qwen3_235b..._ep128...: EP over all 128 ranks), through
    # torchtitan's own all-to-all dispatch: Neuron's own EP backend (neuron_ep) "does not run
    # on Trn2" (Neuron 2.33 docs, How to use EP to train a model with TorchTitan on Neuron).
    # EP borrows the FSDP ranks, so it reads the FSDP 64 run's rows. The twin runs EP 2.
    Layout("ep64", "expert parallel 64 over the FSDP 64 ranks (MoE, full size): one expert per "
           "rank, torchtitan's all-to-all dispatch", ranks=64, ep=64, kinds=("moe",),
           full_size=True, twin="ep", condition=UNEVEN_ALL_TO_ALL),
)}


def layout(name: str) -> Layout:
    try:
        return LAYOUTS[name]
    except KeyError:
        raise ValueError(f"unknown layout {name!r}; the registry (harness/registry/layouts.py) "
                         f"has {sorted(LAYOUTS)}") from None
