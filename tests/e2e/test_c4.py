"""C4 as the full-size runs read it (harness/backends/c4.py): the source's data, with its path named.

Specification:
- a C4 run always names its dataset path: a local copy, or the Hub's repository; never the
  fixture corpus the config functions set (torchtitan takes ``dataset_path or "allenai/c4"``,
  and ``load_dataset(<corpus>, name="en")`` has no config "en");
- a local copy holds allenai/c4's README.md, a validation shard and the first W train shards for
  W ranks; anything less is refused before any rank starts, naming the files and the one command
  that fetches them;
- fixtures/c4 is such a copy for 2 ranks, and torchtitan's own "c4" loader reads it with each
  rank on its own shard (rank r of W starts on shard r, as from the Hub's 1024);
- every full-size run of the template reads C4 that way (on CPU, the twin reads fixtures/c4).
"""

from __future__ import annotations

import shutil

import pytest
from datasets.distributed import split_dataset_by_node

from harness.backends import c4
from harness.launch.run import data_flags
from harness.launch.run_matrix import C4_FIXTURE, RunCase, cases
from harness.registry import paths


def test_a_c4_run_always_names_its_dataset_path(tmp_path):
    assert data_flags("fixture", None, 2) == []
    assert data_flags("c4", None, 2) == ["--dataloader.dataset", "c4", "--dataloader.dataset_path",
                                         "allenai/c4"]
    assert data_flags("c4", str(C4_FIXTURE), 2)[-1] == str(C4_FIXTURE)


def test_the_corpus_the_configs_set_is_no_c4():
    """What a C4 run without its own path loaded (the first-night failure this prevents)."""
    with pytest.raises(ValueError, match="BuilderConfig 'en' not found"):
        c4.load_as_torchtitan_does(paths.CORPUS)


def test_an_incomplete_local_copy_is_refused_naming_the_fix(tmp_path):
    shutil.copytree(C4_FIXTURE, tmp_path / "c4")
    (tmp_path / "c4" / c4.validation_shard()).unlink()
    with pytest.raises(c4.C4Error) as refused:
        data_flags("c4", str(tmp_path / "c4"), 2)
    text = str(refused.value)
    assert c4.validation_shard() in text and c4.download_command(tmp_path / "c4", 2) in text
    with pytest.raises(c4.C4Error, match="c4-train.00063-of-01024.json.gz"):
        c4.check_local_copy(C4_FIXTURE, 64)  # the fixture holds what 2 ranks read, not 64


def test_the_download_command_names_readme_validation_and_one_train_shard_per_rank():
    command = c4.download_command("/data/c4", 64).split()
    assert command[:7] == ["hf", "download", "--repo-type", "dataset", "--local-dir", "/data/c4",
                           "allenai/c4"]
    assert command[7:9] == ["README.md", "en/c4-validation.00000-of-00008.json.gz"]
    assert command[9:] == [f"en/c4-train.{i:05d}-of-01024.json.gz" for i in range(64)]


def test_torchtitan_reads_the_fixture_copy_each_rank_on_its_own_shard():
    dataset = c4.load_as_torchtitan_does(C4_FIXTURE)
    firsts = [next(iter(split_dataset_by_node(dataset, rank=r, world_size=2))) for r in range(2)]
    urls = [doc["url"] for doc in firsts]
    assert "c4-train.00000" in urls[0] and "c4-train.00001" in urls[1], urls
    assert set(firsts[0]) == {"text", "timestamp", "url"}, "C4's schema"


def test_every_full_size_run_reads_c4_with_its_path():
    full = [case for case in cases() if case.size == "full"]
    assert full and all(case.data == "c4" for case in full)
    cpu_twin = next(case for case in full if case.device == "cpu")
    spec = cpu_twin.run_spec(2, assets_root="/assets")
    assert spec.data_path == str(C4_FIXTURE)
    trn2 = RunCase("neuron", "titan_native", "full", "pretrained", "sdpa")
    assert trn2.run_spec(2, assets_root="/assets", data_path="/data/c4").data_path == "/data/c4"
    assert trn2.run_spec(2, assets_root="/assets").data_path is None  # the Hub, named by dataset_flags
