"""A fourth backend is one registry entry and one module: the run template, the CLI and the
report pick it up with nothing else touched."""

import importlib
import sys
from pathlib import Path

import pytest

from harness import backends
from harness.backends import BACKENDS, BackendSpec, register, unregister
from harness.checks import run_checks as checks
from harness.cli import commands as cli
from harness.launch.run import RunSpec
from harness.launch.run_matrix import cases

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
    importlib.import_module(MODULE)  # the ranks import it from the same folder
    module_dir = str(Path(sys.modules[MODULE].__file__).parent) if MODULE in sys.modules else None
    run = backend_runs.get(RunSpec("titan_again", init="pretrained", steps=2, save_hf=True,
                                   pythonpath=(module_dir,) if module_dir else ()))
    verdicts = checks.verdicts(run, 2)
    statuses = {name: v.status for name, (v, _) in verdicts.items()}
    messages = [v.message for v, _ in verdicts.values()]
    # Every check runs on it; its step-1 loss has no expectation yet, which is a failure that
    # prints the observed value and how to record it, never a silent pass.
    assert statuses == {**{name: "pass" for name in checks.RUN_CHECKS},
                        "first_step_loss": "fail"}, messages
    assert "no expectation for backend='titan_again'" in verdicts["first_step_loss"][0].message
    assert "record it in fixtures/expectations.toml" in verdicts["first_step_loss"][0].message


def test_an_unknown_backend_names_the_registered_ones():
    with pytest.raises(ValueError, match="registered: .*titan_native"):
        backends.backend("titan_nativ")
