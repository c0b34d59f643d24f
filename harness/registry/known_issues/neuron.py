"""Known issues of the Neuron stack itself (torch-neuronx 2.14.3, Neuron SDK 2.33) that decide
what trn2 can run: the one home of their entries. Each matches on ``collectives="neuron"``
(the refusals a run's process group obeys: ProcessGroupNeuron's on trn2, and in its strict CPU
stand-in, harness/device/neuron_collectives.py), so the rehearsed night meets them where trn2
would. What an entry is: harness/registry/known_issues/mechanism.py.
"""

from __future__ import annotations

from harness.registry.known_issues.mechanism import KnownIssue, Signature, Where

NEURON_EP_UNEVEN_ALL_TO_ALL = KnownIssue(
    name="torch-neuronx-alltoall-uneven-splits",
    upstream="torch-neuronx 2.14.3 torch_neuronx/distributed/backend.py "
             "ProcessGroupNeuron.alltoall_base (split sizes None or all 1s only), reached by "
             "torchtitan's expert-parallel token dispatch (spring-2026 main, the fork's base: "
             "models/common/token_dispatcher.py, all_to_all_single_autograd with the per-step "
             "input/output split lists)",
    summary="expert parallelism cannot run on trn2 with torchtitan's dispatch: each EP rank "
            "sends every other rank the tokens routed to its experts, a different count per "
            "rank and step, and ProcessGroupNeuron's all_to_all_single refuses any split list "
            "that is not all 1s, so the run dies at its first MoE layer. Neuron's own EP "
            "backend (neuron_ep) runs on Trn3 only (Neuron 2.33 docs, training/torchtitan/"
            "guides/how-to-use-ep-to-train-model). The MoE's FSDP runs (no all-to-all) stay "
            "checked; the EP layouts are checked on the cpu and cuda tiers.",
    evidence="torch-neuronx's own test test_invalid_split_sizes_error expects RuntimeError "
             "'Only even split sizes are supported' for split sizes [2, 1]; its source raises "
             "NotImplementedError('alltoall_base: Only even split sizes are supported. Got "
             "output_split_sizes: [...]'). The rehearsed night's stand-in ranks, refusing the "
             "same, stop nki_moe@ep at step 1 with that error.",
    where=(Where(check="completed", layout=("ep", "ep64"), collectives=("neuron",)),),
    signature=Signature(quantity="error", contains=("Only even split sizes are supported",)),
)

ISSUES: tuple[KnownIssue, ...] = (NEURON_EP_UNEVEN_ALL_TO_ALL,)
