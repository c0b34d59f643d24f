"""nki-library's own tests on the NKI emulator (scripts/nkilib_tests.py, .ci/run): the pieces
that make it run, cheaply, and, in the slow tier, one of its test files run for real.

Specification:
- the ``nki_cpu_simulator`` package (harness/kernels/emu/cpu_simulator) holds every module
  nki-library's ``test/utils/simulation_setup.py`` imports, read from the tarball the run uses,
  and its ``nki.cpu_simulate(kernel)[lnc](**numpy)`` runs a kernel on LNC=1 and LNC=2;
- the plugin deselects, by the largest input in the test id, only the cross-entropy and
  blockwise-MoE cases above the limit; the private modules nki-library does not publish raise,
  naming themselves, when used;
- ``neuron_dtypes`` (Neuron SDK, not on PyPI) casts as NumPy and ml_dtypes round;
- the plugin keeps, of each file not kept whole, the runnable cases whose integer parameters
  multiply to at most the work limit, and of those a sample drawn with a fixed seed (the same
  cases whatever the collection order; another seed draws others); every deselection has its
  reason;
- the script's table counts each file's outcomes from pytest's JUnit XML, a failure matching a
  known issue of nki-library's tree by its signature apart from the emulator's failures, and the
  deselections by reason.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
import tarfile

import ml_dtypes
import numpy as np
import pytest

from harness.kernels.emu import cpu_simulator
from harness.kernels.emu import isa as nisa
from harness.kernels.emu import language as nl
from harness.kernels.emu.cpu_simulator import neuron_dtypes, pytest_plugin
from harness.registry import known_issues, paths, upstream

SCRIPT = paths.REPO_ROOT / "scripts" / "nkilib_tests.py"


def _script():
    spec = importlib.util.spec_from_file_location("nkilib_tests", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _simulation_setup_imports() -> list[str]:
    script = _script()
    if not script.TARBALL.is_file():
        pytest.skip(upstream.missing("nki-library-tests") + ": nothing to read the imports from")
    with tarfile.open(script.TARBALL) as tar:
        source = tar.extractfile("nki-library/test/utils/simulation_setup.py").read().decode()
    return sorted({alias.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Import)
                   for alias in node.names if alias.name.startswith("nki_cpu_simulator")}
                  | {node.module for node in ast.walk(ast.parse(source))
                     if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nki_cpu_simulator")})


def test_the_cpu_simulator_package_holds_what_simulation_setup_imports():
    names = _simulation_setup_imports()
    assert "nki_cpu_simulator.nki.isa.constants" in names and len(names) >= 9
    cpu_simulator.install()
    assert [importlib.import_module(name).__emulator__ for name in names] == [True] * len(names)


def _halves(x):
    """Each program of an LNC=2 launch doubles its half of x."""
    rows = x.shape[0] // nl.num_programs(0)
    start = nl.program_id(0) * rows
    t = nl.ndarray((rows, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x[start:start + rows, :])
    nisa.tensor_tensor(dst=t, data1=t, data2=t, op=nl.add)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out[start:start + rows, :], src=t)
    return out


@pytest.mark.parametrize("lnc", [1, 2])
def test_cpu_simulate_runs_a_kernel_on_numpy_by_keyword(lnc):
    cpu_simulator.install()
    nki = importlib.import_module("nki_cpu_simulator.nki")
    x = np.arange(16, dtype=np.float32).reshape(4, 4).astype(ml_dtypes.bfloat16)
    out = nki.cpu_simulate(_halves)[lnc](x=x)
    assert out.dtype == ml_dtypes.bfloat16 and np.array_equal(out.astype(np.float32), 2 * x.astype(np.float32))


@pytest.mark.parametrize("nodeid, size", [
    ("integration/nkilib/experimental/loss/test_cross_entropy_forward.py::T::t[_manual_ce_config__B-4_T-2048_V-32128_"
     "dtype-bfloat16_PB-64_CS-32128]", 4 * 2048 * 32128),
    ("integration/nkilib/core/moe/moe_cte/test_moe_cte.py::T::t[BWMMFunc.SHARD_ON_INTERMEDIATE-3072-1024-64-512-8-2048-"
     "dtype1-0-True]", 64 * 3072 * 2 * 2048),
    ("integration/nkilib/core/topk/test_topk.py::T::test_topk_sweep[1024-5-4058-2048-2]", None),
    ("integration/nkilib/core/embeddings/test_rope_hf.py::T::t[B-4_T-2048_V-32128_]", None),  # not a loss test
])
def test_the_plugin_reads_the_largest_input_from_the_test_id(nodeid, size):
    assert pytest_plugin.largest_input(nodeid) == size


def test_the_private_modules_nki_library_does_not_publish_raise_naming_themselves():
    module = pytest_plugin._absent_module("test.utils.perf_analysis_private")
    with pytest.raises(NotImplementedError, match="perf_analysis_private.analyze_trace: nki-library's private"):
        module.analyze_trace("trace.json")
    assert not hasattr(module, "__file__")  # tools that walk sys.modules see a plain module


def test_neuron_dtypes_casts_as_numpy_and_ml_dtypes_round():
    x = np.array([1.0 + 2**-8, 1.0 + 3 * 2**-8, 300.7], dtype=np.float64)
    assert neuron_dtypes.static_cast(x, ml_dtypes.bfloat16).astype(np.float64).tolist() == [1.0, 1.015625, 300.0]
    assert neuron_dtypes.is_float_type(nl.bfloat16) and not neuron_dtypes.is_float_type(np.int32)
    # bytes per element, as nki-library's own allocator.sizeinbytes (rmsnorm_quant's packing ratio)
    assert [neuron_dtypes.sizeinbytes(d) for d in (np.float32, nl.bfloat16, np.int16, ml_dtypes.float8_e4m3fn,
                                                   np.int8)] == [4, 2, 2, 1, 1]


def test_the_table_counts_each_files_outcomes(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite>'
        '<testcase classname="integration.nkilib.core.cumsum.test_cumsum.TestCumsumKernel" name="a"/>'
        '<testcase classname="integration.nkilib.core.cumsum.test_cumsum.TestCumsumKernel" name="b">'
        '<skipped/></testcase>'
        '<testcase classname="integration.nkilib.experimental.loss.test_cross_entropy_forward.T" name="c">'
        '<failure/></testcase>'
        '<testcase classname="" name="test/integration/nkilib/core/mlp/test_mlp_cte.py"><error message="collection '
        'failure">E   IndentationError: unexpected indent</error></testcase>'
        '<testcase classname="" name="test/integration/nkilib/core/mlp/test_mlp_tkg.py"><error message="collection '
        'failure">E   ImportError: something else</error></testcase>'
        '</testsuite></testsuites>')
    (tmp_path / "deselected.txt").write_text(
        "test/integration/nkilib/experimental/loss/test_cross_entropy_forward.py::T::d\t9\tsize\n"
        "test/integration/nkilib/core/mlp/test_mlp_cte.py::T::e\t\tsample\n"
        "test/integration/nkilib/core/mlp/test_mlp_cte.py::T::f\t\tplatform\n")
    files = ("core/cumsum/test_cumsum.py", "experimental/loss/test_cross_entropy_forward.py",
             "core/mlp/test_mlp_cte.py", "core/mlp/test_mlp_tkg.py")
    lines = _script().table(junit, files, 12.0).splitlines()
    # file | collected | passed | failed | known | skipped | size | sample | platform
    assert lines[2] == "| core/cumsum/test_cumsum.py | 2 | 1 | 0 | 0 | 1 | 0 | 0 | 0 |"
    assert lines[3] == "| experimental/loss/test_cross_entropy_forward.py | 2 | 0 | 1 | 0 | 0 | 1 | 0 | 0 |"
    assert lines[4] == "| core/mlp/test_mlp_cte.py | 3 | 0 | 0 | 1 | 0 | 0 | 1 | 1 |"  # the known issue's signature
    assert lines[5] == "| core/mlp/test_mlp_tkg.py | 1 | 0 | 1 | 0 | 0 | 0 | 0 | 0 |"  # another error: not excused
    assert lines[6] == "| all | 8 | 1 | 2 | 1 | 1 | 1 | 1 | 1 |"
    assert "1 known: nkilib-mlp-py-does-not-parse" in _script().failures(junit)


class _Item:
    def __init__(self, nodeid, params=None, skip=False):
        self.nodeid = nodeid
        self.callspec = type("CallSpec", (), {"params": params or {}})() if params is not None else None
        self._skip = skip

    def iter_markers(self):
        return [type("Mark", (), {"name": "skip"})()] if self._skip else []


class _Config:
    def __init__(self, **options):
        self.options = {"--nki-emu-max-elements": None, "--nki-emu-max-work": None, "--nki-emu-sample": None,
                        "--nki-emu-seed": 0, "--nki-emu-whole": [], **options}
        self.deselected = []
        self.hook = type("Hook", (), {"pytest_deselected": lambda _, items: self.deselected.extend(items)})()

    def getoption(self, name, default=None):
        return self.options.get(name, default)


def _select(items, **options):
    config = _Config(**options)
    kept = list(items)
    pytest_plugin.pytest_collection_modifyitems(config, kept)
    return [i.nodeid for i in kept], config._nki_emu_reasons


def test_the_plugin_samples_runnable_cases_per_file_with_its_seed_and_deselects_by_work():
    base = "integration/nkilib/core/qkv/test_qkv_cte.py::T::t"
    items = ([_Item(f"{base}[{n}]", {"b": 1, "s": n, "d": 8}) for n in range(1, 21)]
             + [_Item(f"{base}[big]", {"shape": (4, 4096, 4096)}), _Item(f"{base}[skipped]", {"s": 1}, skip=True),
                _Item("integration/nkilib/core/cumsum/test_cumsum.py::T::t[1]", {"s": 10**9})])
    kept, reasons = _select(items, **{"--nki-emu-max-work": 2**20, "--nki-emu-sample": 5,
                                      "--nki-emu-whole": ["core/cumsum/test_cumsum.py"]})
    assert reasons[f"{base}[big]"] == ("size", 4 * 4096 * 4096)  # 67M > 2**20
    assert f"{base}[skipped]" in kept and "integration/nkilib/core/cumsum/test_cumsum.py::T::t[1]" in kept  # whole
    sampled = [k for k in kept if k.startswith(base) and "skipped" not in k]
    assert len(sampled) == 5 and sum(reason == "sample" for reason, _ in reasons.values()) == 15
    reversed_order = _select(list(reversed(items)), **{"--nki-emu-max-work": 2**20, "--nki-emu-sample": 5,
                                                       "--nki-emu-whole": ["core/cumsum/test_cumsum.py"]})[0]
    assert reversed_order.count(sampled[0]) == 1
    again = _select(items, **{"--nki-emu-max-work": 2**20, "--nki-emu-sample": 5})[0]
    assert [k for k in again if k in sampled] == sampled  # the same draw, run after run
    other_seed = _select(items, **{"--nki-emu-max-work": 2**20, "--nki-emu-sample": 5, "--nki-emu-seed": 1,
                                   "--nki-emu-whole": ["core/cumsum/test_cumsum.py"]})[0]
    assert set(other_seed) != set(kept) and len(other_seed) == len(kept)


def test_the_work_of_a_case_is_the_product_of_its_integer_parameters():
    params = {"bs": 2, "shape": (3, 4), "dtype": "bfloat16", "causal": True, "s": 0.5}
    assert pytest_plugin.work(_Item("x", params)) == 24
    assert pytest_plugin.work(_Item("x", None)) == 0


@pytest.mark.slow
def test_nki_librarys_rope_hf_tests_pass_on_the_emulator():
    """nki-library's test_rope_hf.py, unchanged, in its simulation mode on the emulator
    (minutes: the venv with the test tree's packages is built once, build/nkilib-tests)."""
    if not _script().TARBALL.is_file():
        pytest.skip(upstream.missing("nki-library-tests"))
    run = subprocess.run([sys.executable, str(SCRIPT), "core/embeddings/test_rope_hf.py"], capture_output=True,
                         text=True, timeout=1800)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "| core/embeddings/test_rope_hf.py | 21 | 21 | 0 | 0 | 0 |" in run.stdout


class _Options:
    def __init__(self, **options):
        self.options = options

    def getoption(self, name, default=None):
        return self.options.get(name, default)


def test_the_plugin_arms_each_cases_watchdog_and_disarms_it_after(monkeypatch, tmp_path):
    """--nki-emu-case-seconds: faulthandler ends a case's process past the limit (its stacks to
    --nki-emu-hang-log), so a hung case fails by name instead of stalling the run; a case that
    ends in time disarms it."""
    calls = []
    monkeypatch.setattr(pytest_plugin.faulthandler, "dump_traceback_later",
                        lambda seconds, exit=False, file=None: calls.append(("arm", seconds, exit, file.name)))
    monkeypatch.setattr(pytest_plugin.faulthandler, "cancel_dump_traceback_later", lambda: calls.append(("disarm",)))
    log = tmp_path / "hangs.txt"
    item = type("Item", (), {"config": _Options(**{"--nki-emu-case-seconds": 300.0, "--nki-emu-hang-log": str(log)})})
    call = pytest_plugin.pytest_runtest_call(item)
    next(call)
    assert calls == [("arm", 300.0, True, str(log))]
    with pytest.raises(StopIteration):
        call.send(None)
    assert calls[-1] == ("disarm",)
    calls.clear()
    unarmed = pytest_plugin.pytest_runtest_call(type("Item", (), {"config": _Options()}))
    next(unarmed)
    assert calls == []


def test_the_table_counts_a_collection_error_once_as_pytest_xdist_names_it(tmp_path):
    """Under -n 2 each worker reports a file's collection error, named by its module."""
    junit = tmp_path / "junit.xml"
    error = ('<testcase classname="" name="integration.nkilib.core.mlp.test_mlp_cte"><error message="collection '
             'failure">E   IndentationError: unexpected indent</error></testcase>')
    junit.write_text(f"<testsuites><testsuite>{error}{error}</testsuite></testsuites>")
    lines = _script().table(junit, ("core/mlp/test_mlp_cte.py",), 1.0).splitlines()
    assert lines[2] == "| core/mlp/test_mlp_cte.py | 1 | 0 | 0 | 1 | 0 | 0 | 0 | 0 |"


def test_the_work_of_a_ranged_case_is_its_tensors_shape():
    """nki-library's ranged tests (qkv_cte's sweep) pass one RangeTestCase: its tensors dict holds
    the shape; a 0 is a flag; the range config it refers to is no size of this case."""
    config = type("TensorRangeConfig", (), {})()
    config.__dict__.update(batch=(1, 4), seqlen=(1, 8192))
    case = type("RangeTestCase", (), {})()
    case.__dict__.update(test_type="monotonic", additional_params={}, test_config_ref=config,
                         tensors={"_monotonic_dummy_": {"batch": 4, "seqlen": 7508, "hidden_dim": 16000,
                                                        "fused_add": 0, "output_layout": 1}})
    assert pytest_plugin.work(_Item("x", {"range_test_options": case})) == 4 * 7508 * 16000


@pytest.mark.parametrize("case, error, issue", [
    ("core/attention/test_gen_mask_tkg.py", "KeyError: 'mask_out_hbm'", "nkilib-gen-mask-tkg-test-output-key"),
    ("core/moe/moe_cte/test_moe_cte_unified.py", "nki emulator: trn2 rule 'core-barrier' violated: "
     "nki.isa.core_barrier: data is in nl.sbuf (the shared HBM ...)", "nkilib-core-barrier-on-sbuf-tile"),
])
def test_nki_librarys_own_defects_are_known_only_in_their_files_and_by_their_signatures(case, error, issue):
    verdict = known_issues.judge("nkilib_suite", error, {"error": error}, case=case)
    assert verdict.status == "known" and [i.name for i in verdict.issues] == [issue]
    elsewhere = known_issues.judge("nkilib_suite", error, {"error": error}, case="core/cumsum/test_cumsum.py")
    other = known_issues.judge("nkilib_suite", "KeyError: 'other'", {"error": "KeyError: 'other'"}, case=case)
    assert elsewhere.status != "known" and other.status != "known"
