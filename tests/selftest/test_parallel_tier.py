"""How the suite spreads over pytest-xdist workers (``-n auto``, conftest.py).

Specification:
- a CPU-only selection gets two workers; an accelerator tier (``-m neuron``/``-m cuda``, or
  ``--device neuron|cuda``) and a single core get none (one process);
- every test that launches runs, or shares the session's run cache, is in one xdist group, so
  one worker launches each run once; the others are in none.
"""

import pytest

from harness.devices import xdist_workers


@pytest.mark.parametrize(("device", "markexpr", "cpus", "workers"), [
    (None, "not slow", 2, 2),
    ("cpu", "slow", 16, 2),
    (None, "neuron", 128, 0),
    (None, "cuda and not slow", 16, 0),
    ("neuron", "not slow", 128, 0),
    ("cuda", None, 16, 0),
    (None, "not slow", 1, 0),
    (None, None, None, 0),
])
def test_workers_for_a_selection(device, markexpr, cpus, workers):
    assert xdist_workers(device, markexpr, cpus) == workers


def test_a_test_sharing_the_run_cache_is_in_the_launch_group(request, backend_runs):
    marker = request.node.get_closest_marker("xdist_group")
    assert marker is not None and marker.args == ("launches",)


def test_an_in_process_test_is_in_no_group(request):
    assert request.node.get_closest_marker("xdist_group") is None
