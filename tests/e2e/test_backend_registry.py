"""A fourth backend is one registry entry and one module: the run template, the CLI and the
report pick it up with nothing else touched."""

import sys

import pytest

from harness import backends, checks, cli
from harness.backends import BACKENDS, BackendSpec, register, unregister
from harness.run_matrix import cases

MODULE = "harness_throwaway_backend"


@pytest.fixture
def throwaway_backend(tmp_path, monkeypatch):
    """titan_native under another name: its own module (outside harness/) and one entry."""
    (tmp_path / f"{MODULE}.py").write_text(
        "from harness.backends.titan_native import tiny, tiny_flex, full  # noqa: F401\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    native = BACKENDS["titan_native"]
    spec = register(BackendSpec(name="titan_again", module=MODULE, summary="titan_native, renamed",
                                sizes=native.sizes, attention=native.attention))
    yield spec
    unregister(spec.name)
    sys.modules.pop(MODULE, None)


def test_a_registered_backend_is_instantiated_on_every_device(throwaway_backend):
    ids = {c.id for c in cases()}
    for device in ("cpu", "cuda", "neuron"):
        assert f"{device}-titan_again-tiny-pretrained" in ids
        assert f"{device}-titan_again-tiny-random" in ids
    assert "neuron-titan_again-full-pretrained" in ids


def test_the_cli_offers_a_registered_backend(throwaway_backend):
    args = cli._parser().parse_args(["run", "--backends", "titan_again"])
    assert args.backends == ["titan_again"]


@pytest.mark.slow
def test_a_registered_backend_launches_and_is_checked(throwaway_backend, backend_runs, steps):
    from harness.launch import RunSpec

    run = backend_runs.get(RunSpec("titan_again", init="pretrained", steps=2, save_hf=True))
    verdicts = checks.verdicts(run, 2)
    assert {name: v.status for name, (v, _) in verdicts.items()} == {
        name: "pass" for name in checks.RUN_CHECKS}, [v.message for v, _ in verdicts.values()]


def test_an_unknown_backend_names_the_registered_ones():
    with pytest.raises(ValueError, match="registered: .*titan_native"):
        backends.backend("titan_nativ")
