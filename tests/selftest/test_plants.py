"""Plants (harness/plants): one mechanism for the defects the self-tests plant.

Specification:
- a plant has exactly one realisation (a patch, a broken kernel, a broken copy) and names the
  checks that must catch it;
- every plant is shown caught: a test names it (kernel plants get a generated test each);
- a run asks for plants by name; a name that is unknown, or that is not a patch, is refused
  before any rank starts, with the names that exist;
- in the ranks, ``HARNESS_PLANTS`` installs exactly the named patches at import; in-process,
  ``planted(...)`` undoes its patches when the block ends.
"""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest
from torchtitan.components.tokenizer import HuggingFaceTokenizer

from harness import plants
from harness.launch.run import RunSpec
from harness.plants import Plant
from harness.registry import environment, paths

TESTS = paths.REPO_ROOT / "tests"


def named_in_tests(test_files) -> set[str]:
    """Every string literal in the test files (a plant is used by its name)."""
    found = set()
    for path in test_files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found.add(node.value)
    return found


def unshown(registry: dict[str, Plant], test_files) -> list[str]:
    """Plants no test shows caught. Kernel plants are instantiated from the registry by
    tests/kernels/test_checker_catches.py, one test each."""
    names = named_in_tests(test_files)
    return sorted(n for n, p in registry.items() if p.realisation != "kernel" and n not in names)


def _test_files():
    return [p for p in TESTS.rglob("test_*.py") if p.name != "test_plants.py"]


def test_every_plant_is_shown_caught_by_a_test():
    assert unshown(plants.registry(), _test_files()) == []


def test_coverage_check_names_a_plant_no_test_uses():
    never = Plant("never_used_anywhere", "trainer", "x", ("completed",), make=lambda: None)
    assert unshown({**plants.registry(), never.name: never}, _test_files()) == ["never_used_anywhere"]


def test_a_plant_has_exactly_one_realisation_and_a_check_that_catches_it():
    with pytest.raises(ValueError, match="exactly one of patch, kernel, make"):
        Plant("two", "model", "x", ("c",), patch=("m", lambda m: None), make=lambda: None)
    with pytest.raises(ValueError, match="exactly one of patch, kernel, make"):
        Plant("none", "model", "x", ("c",))
    with pytest.raises(ValueError, match="names no check"):
        Plant("uncaught", "model", "x", (), make=lambda: None)


def test_names_are_unique_across_realisations():
    names = [p.name for p in plants.registry().values()]
    assert len(names) == len(set(names))
    assert {p.realisation for p in plants.registry().values()} == {"patch", "kernel", "make"}


def test_a_run_refuses_an_unknown_plant_or_one_that_is_not_a_patch():
    with pytest.raises(ValueError, match=r"unknown plant 'no_such_plant'; known: \["):
        RunSpec("titan_native", plants=("no_such_plant",))
    with pytest.raises(ValueError, match="realised as 'make', not as a patch"):
        RunSpec("titan_native", plants=("checkpoint_drops_q_proj",))
    assert RunSpec("titan_native", plants=("nan_loss",)).name.endswith("+plant:nan_loss")


def test_planted_patches_in_process_and_undoes_them():
    original = HuggingFaceTokenizer.encode
    with plants.planted("drop_eos"):
        assert HuggingFaceTokenizer.encode is not original
    assert HuggingFaceTokenizer.encode is original
    with pytest.raises(RuntimeError, match="inside"), plants.planted("drop_eos"):
        raise RuntimeError("inside")
    assert HuggingFaceTokenizer.encode is original


ENCODE = "from torchtitan.components.tokenizer import HuggingFaceTokenizer as T; print(T.encode.__qualname__)"


def _rank_like(names: str):
    """A child started as a launched rank starts (the boot installs HARNESS_PLANTS): the
    install at import is the behaviour under test, so it needs a process of its own."""
    return subprocess.run([sys.executable, "-c", ENCODE],
                          env=environment.child_environment(rank=True, plants=(names,)),
                          capture_output=True, text=True, timeout=120)


def test_ranks_install_the_named_patch_at_import():
    done = _rank_like("drop_eos")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "_drop_eos" in done.stdout, done.stdout  # the plant's encode, not upstream's


def test_ranks_refuse_an_unknown_plant():
    done = _rank_like("no_such_plant")
    assert done.returncode != 0
    assert (f"cannot install {environment.PLANTS}: unknown plant(s) ['no_such_plant']"
            in done.stderr), done.stderr[-2000:]
