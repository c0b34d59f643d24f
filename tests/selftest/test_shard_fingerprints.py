"""A launched run's ranks start step 1 from distinct shards (harness/rank/step0.py, read back
by harness/registry/dump_layout.py; the ``shards_distinct`` check of harness/checks/run_checks.py).

Specification:
- each rank fingerprints its local shard of every parameter: shape, a hash of its bytes, sums
  and samples, whether it is constant; reading them back gives, per parameter, whether two
  ranks at different places among the shards hold identical bytes;
- parameters constant by design (every shard all one value: norm weights of ones, zero
  biases), replicated ones, and ranks that differ only on a replicating mesh dimension are not
  expected to differ and are not counted;
- the check fails naming every parameter with identical shards and the fraction affected;
- the known issue (torch's DTensor RNG on a CPU mesh) excuses only its own signature: most of a
  random-init CPU run's parameters duplicated; one duplicated parameter is a different failure,
  and so is any on a pretrained run or under the workaround.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest
import torch

from harness.checks import run_checks as checks
from harness.launch.run import RunSpec
from harness.rank import step0 as rank_step0
from harness.registry import dump_layout, known_issues
from harness.results.run_result import RunResult

ISSUE = "torch-dtensor-random-init-identical-shards-on-cpu"


def records(shards_by_rank: dict[int, dict[str, torch.Tensor]], placements=("S(0)",),
            coordinate=lambda rank: [rank]) -> dict[int, dict]:
    """What ranks holding these local shards write (placements and coordinates as a pure
    FSDP mesh gives them)."""
    out = {}
    for rank, shards in shards_by_rank.items():
        params = {}
        for name, local in shards.items():
            fp = rank_step0.fingerprint(local)
            params[name] = {**fp, "placements": list(placements), "shard_coordinate": coordinate(rank)}
        out[rank] = {"rank": rank, "world": len(shards_by_rank), "params": params}
    return out


def two_ranks(duplicated: int, distinct: int, constant: int = 2) -> dict[int, dict]:
    g = torch.Generator().manual_seed(0)
    ranks: dict[int, dict[str, torch.Tensor]] = {0: {}, 1: {}}
    for i in range(duplicated):
        shard = torch.randn(4, 8, generator=g)
        ranks[0][f"dup{i}.weight"], ranks[1][f"dup{i}.weight"] = shard, shard.clone()
    for i in range(distinct):
        ranks[0][f"own{i}.weight"], ranks[1][f"own{i}.weight"] = (torch.randn(4, 8, generator=g),
                                                                  torch.randn(4, 8, generator=g))
    for i in range(constant):
        ranks[0][f"norm{i}.weight"], ranks[1][f"norm{i}.weight"] = torch.ones(4), torch.ones(4)
    return records(ranks)


def run_with(tmp_path, by_rank, init="random", device="cpu", workarounds=(),
             backend="titan_native") -> RunResult:
    for rank, record in by_rank.items():
        path = dump_layout.shard_file(dump_layout.dump_folder(tmp_path), rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record))
    spec = RunSpec(backend, init=init, workarounds=tuple(workarounds))
    return RunResult(spec=spec, device=device, nproc=len(by_rank), layout="fsdp",
                     degrees=spec.parallel_degrees(len(by_rank)), command=[], returncode=0,
                     timed_out=False, duration_s=0, run_dir=tmp_path,
                     versions={"torchtitan-generation": "v0_3"})


def test_fingerprint_names_shape_hash_sums_and_constancy():
    fp = rank_step0.fingerprint(torch.arange(8.0).reshape(2, 4))
    assert fp["global_shape"] == [2, 4] and fp["local_numel"] == 8 and not fp["constant"]
    assert (fp["sum"], fp["sum_sq"], fp["samples"]) == (28.0, 140.0, [0.0, 2.0, 4.0, 6.0])
    assert rank_step0.fingerprint(torch.ones(3))["constant"]
    assert rank_step0.fingerprint(torch.arange(8.0).reshape(2, 4).bfloat16())["sha1"] != fp["sha1"]
    assert rank_step0.fingerprint(torch.empty(0, 4))["empty"]


def test_identical_shards_are_named_and_constant_or_replicated_ones_are_not_counted():
    checked, identical = rank_step0.identical_shards(two_ranks(duplicated=3, distinct=5))
    assert identical == ["dup0.weight", "dup1.weight", "dup2.weight"]
    assert len(checked) == 8  # the two all-ones norms are constant by design
    replicated = records({0: {"w": torch.randn(4)}, 1: {"w": torch.randn(4)}}, placements=("R",),
                         coordinate=lambda rank: [])
    assert rank_step0.identical_shards(replicated) == ([], [])
    # HSDP: ranks 0 and 1 share a shard (the replicating dimension), 2 and 3 the other one.
    shard_a, shard_b = torch.randn(4), torch.randn(4)
    hsdp = records({0: {"w": shard_a}, 1: {"w": shard_a.clone()}, 2: {"w": shard_b}, 3: {"w": shard_b.clone()}},
                   placements=("R", "S(0)"), coordinate=lambda rank: [rank // 2])
    assert rank_step0.identical_shards(hsdp) == (["w"], [])


def test_the_check_fails_naming_the_parameters_and_the_fraction(tmp_path):
    outcome = checks.shards_distinct(run_with(tmp_path, two_ranks(duplicated=1, distinct=7), init="pretrained"), 2)
    assert outcome.problem is not None and "dup0.weight" in outcome.problem
    assert "1 of 8" in outcome.problem and "fraction 0.125" in outcome.problem
    assert outcome.observed["identical_fraction"] == 0.125
    clean = checks.shards_distinct(run_with(tmp_path / "clean", two_ranks(duplicated=0, distinct=8),
                                            init="pretrained"), 2)
    assert clean.problem is None and clean.observed["checked"] == 8


def test_a_run_without_fingerprints_fails_saying_where_they_should_be(tmp_path):
    run = replace(run_with(tmp_path, {}), run_dir=tmp_path / "elsewhere")
    assert "no shard fingerprints under" in checks.shards_distinct(run, 2).problem


@pytest.mark.parametrize("duplicated, distinct, init, workarounds, status", [
    (10, 6, "random", (), "known"),  # torchtitan 0.3.0 native Qwen3: all but the fused QKV
    (16, 0, "random", (), "known"),  # the transformers backend: every parameter
    (1, 15, "random", (), "fail"),  # one duplicated parameter: a different failure
    (0, 16, "random", (), "fail"),  # distinct on CPU: upstream fixed it, the entry is stale
    (10, 6, "pretrained", (), "fail"),  # a loader handing every rank the same slice
    (1, 15, "random", ("dtensor_full_init",), "fail"),  # under the workaround, held strictly
    (0, 16, "random", ("dtensor_full_init",), "pass"),
])
def test_the_known_issue_excuses_only_its_signature(tmp_path, duplicated, distinct, init, workarounds, status):
    run = run_with(tmp_path, two_ranks(duplicated, distinct), init=init, workarounds=workarounds)
    outcome = checks.shards_distinct(run, 2)
    verdict = known_issues.judge("shards_distinct", outcome.problem, outcome.observed, run.spec.all_workarounds,
                                 **run.where())
    assert verdict.status == status, verdict.message
    if status == "known":
        assert [i.name for i in verdict.issues] == [ISSUE]
    if (duplicated, init, workarounds) == (1, "random", ()):
        assert "not as known issue" in verdict.message and ISSUE in verdict.message


def test_the_unloaded_experts_of_spring_moe_are_excused_only_as_exactly_the_experts(tmp_path):
    """spring2026's MoE adapter leaves the routed experts unloaded (their random init, whose
    shards are identical on a CPU mesh): excused as exactly those kinds, on that generation."""
    g = torch.Generator().manual_seed(1)
    experts = {f"layers.{i}.moe.experts.{w}": torch.randn(4, 8, generator=g)
               for i in range(2) for w in ("w1_EFD", "w2_EDF", "w3_EFD")}
    def loaded():
        return {f"layers.{i}.attention.wo.weight": torch.randn(4, 8, generator=g) for i in range(2)}

    by_rank = records({0: {**experts, **loaded()}, 1: {**{k: v.clone() for k, v in experts.items()}, **loaded()}})
    for generation, wo_too, status in (("spring2026", False, "known"), ("v0_3", False, "fail"),
                                       ("spring2026", True, "fail")):
        ranks = copy.deepcopy(by_rank)
        if wo_too:
            wo = "layers.0.attention.wo.weight"
            ranks[1]["params"][wo] = {**ranks[0]["params"][wo], "shard_coordinate": [1]}
        run = replace(run_with(tmp_path / f"{generation}{wo_too}", ranks, init="pretrained", backend="nki_moe"),
                      versions={"torchtitan-generation": generation})
        outcome = checks.shards_distinct(run, 2)
        verdict = known_issues.judge("shards_distinct", outcome.problem, outcome.observed, (), **run.where())
        assert verdict.status == status, (generation, wo_too, verdict.message)
