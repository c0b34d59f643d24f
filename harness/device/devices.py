"""Which device a run uses, and what each rank needs to run there.

A ``DeviceProfile`` is everything that differs between neuron, cuda and cpu runs of the same
backend: the process-group backend, how many ranks a node holds, the environment each rank
needs, and the upstream shims it must install. Nothing downstream branches on the device
name; it reads the profile. torch is imported where a device is asked about, not with this
module: the tiers' names, stand-ins and markers cost a child process nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from harness.device.package_probe import nki_available, probe_module
from harness.registry import environment

KINDS = ("neuron", "cuda", "cpu")
# The logical-NeuronCore configuration ranks run at unless the environment says otherwise:
# trn2's default (neuronx-cc compiles for LNC 2); NKI 0.7 rejects a kernel whose LNC differs
# from the compiler's (NCC_EVRF066), so in-process kernel tests use the same value.
NEURON_LNC_DEFAULT = "2"

# The model sizes each device tier runs (the run template instantiates every backend at each).
# CPU runs the full size's code path from the assets twin (harness/registry/assets_twin.py): a tiny
# model laid out as the real download, through the same asset flags, save maps and checks.
TIER_SIZES = {"cpu": ("tiny", "full"), "cuda": ("tiny",), "neuron": ("tiny", "full")}
# Attention variants a device cannot run: flex attention is always wrapped in torch.compile
# (Inductor), and the Neuron backend compiles through its own "neuron" backend, eager otherwise.
UNSUPPORTED_ATTENTION = {"neuron": ("flex",)}
# The pytest marker of each accelerator tier; the CPU tier runs unmarked, on every commit.
TIER_MARKERS = {"neuron": "neuron", "cuda": "cuda"}
# Tiers whose device runtime belongs to the first process that initialises it: the Neuron
# runtime reserves every NeuronCore for it, so an in-process test of the device runs in a child
# of its own, never in the pytest process that launches the runs (harness/launch/own_process.py).
EXCLUSIVE_RUNTIME = ("neuron",)
# The trn2 night rehearsed on CPU (scripts/nightly/rehearse.py, in .ci/run): with
# HARNESS_NEURON_STANDIN=cpu the neuron tier runs its launched runs, test for test, on the cpu
# profile (gloo, 2 ranks, the CPU shims); every consequence (the full size from the assets twin,
# CPU timeouts and numbers) follows from ``runs_on``. In-process tests of the 'neuron' torch
# device have no stand-in: the rehearsal deselects them (conftest.py), naming why.
STANDIN_KINDS = ("cpu",)
# The shim that makes the stand-in's process group refuse what ProcessGroupNeuron refuses, and
# the recorded setting naming whose collectives a run's ranks obey (known issues of the neuron
# process group match on it: harness/registry/known_issues/neuron.py).
STANDIN_COLLECTIVES = "neuron_collectives"
COLLECTIVES_RECORD = "collectives"


def standin_for(kind: str, environ=None) -> str | None:
    """The device kind standing in for tier ``kind`` (only the neuron tier has one), or None."""
    value = (os.environ if environ is None else environ).get(environment.NEURON_STANDIN, "")
    if kind != "neuron" or not value:
        return None
    if value not in STANDIN_KINDS:
        raise ValueError(f"{environment.NEURON_STANDIN}={value!r}: the neuron tier can stand in on "
                         f"{STANDIN_KINDS} only; unset it to run on trn2")
    return value


def runs_on(kind: str) -> str:
    """The device tier ``kind``'s runs actually use: its stand-in, else itself."""
    return standin_for(kind) or kind


def tier_status(kind: str) -> tuple[bool, str]:
    """Whether tier ``kind``'s launched runs can run here: its device, or its stand-in."""
    standin = standin_for(kind)
    if standin:
        return True, (f"stand-in: the {standin} profile runs the {kind} tier's launches "
                      f"({environment.NEURON_STANDIN}={standin}, the nightly's rehearsal)")
    return device_status(kind)


def xdist_workers(device_option: str | None, markexpr: str | None, cpu_count: int | None) -> int:
    """pytest-xdist workers for ``-n auto``. A CPU-only selection gets two: both launch runs
    and run the in-process tests (``--dist load``; the run cache is shared by the workers, so
    each run is still launched once per session); a launch leaves about a third of two cores
    idle (rank start-up, rendezvous, shutdown). An accelerator tier (``-m neuron``,
    ``-m cuda``, ``--device neuron|cuda``) gets none: its runs and its in-process tests must not
    share the devices; nor does a tier stood in by the cpu (the rehearsal schedules the night
    as trn2 does: serially). Neither does a single core."""
    accelerator = [m for m in TIER_MARKERS if device_option == m or m in (markexpr or "")]
    return 0 if accelerator or (cpu_count or 1) < 2 else 2


THREADS_ENV = "OMP_NUM_THREADS"
# pyarrow's bundled jemalloc starts a background purging thread (``jemalloc_bg_thd``) as
# pyarrow is imported (torchtitan's trainer imports datasets, which imports it). A process
# with a second thread cannot fork a rank (a fork copies only the calling thread), so the warm
# start (harness/rank/warm_start.py) could not preload datasets. Every CPU rank, warm or cold,
# runs with that thread off, so both import alike; it frees memory later, computes nothing.
# Still needed while pyarrow's jemalloc defaults to it (tests/selftest/test_warm_start.py).
ARROW_ENV = {"JE_ARROW_MALLOC_CONF": "background_thread:false"}

# How every harness process runs the Hugging Face libraries: offline (the harness reads local
# assets only) and quiet. The in-process checks set these in their own environment
# (harness/parity/env.py), and every rank gets them whether or not that has happened yet
# (harness/launch/run.py rank_environment), each only where the caller left it unset: a rank's
# environment must not depend on which in-process tests ran before its launch (it decides which
# zygote forks the rank, harness/launch/warm.py).
HF_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}


def worker_threads(workers: int, cpu_count: int | None) -> int | None:
    """Intra-op threads of each of ``workers`` pytest-xdist workers, and of the processes its
    tests start: the worker's share of the cores (None outside xdist: torch's default, every
    core). At torch's default, two workers beside the launched ranks put four busy-waiting
    OpenMP threads on two cores: tests/parity/test_forward_parity.py and
    test_hf_backend_parity.py took 68 s of user CPU (86-99 s wall) at 2 threads, 28-41 s
    (38-44 s wall) at 1, on the shared 2-core machine (``scripts/benchmark.py threads``). CPU
    ranks have their own setting (one thread each, ``profile_for``)."""
    return max(1, (cpu_count or 1) // workers) if workers > 0 else None


@dataclass(frozen=True)
class DeviceProfile:
    kind: str
    process_group_backend: str
    ranks_per_node: int
    device_count: int
    rank_env: dict[str, str] = field(default_factory=dict)
    shims: tuple[str, ...] = ()
    # Inherited variables the ranks must not see (``rank_environment`` drops them).
    rank_env_unset: tuple[str, ...] = ()
    # Settings every result of this device records beside the package versions.
    recorded: dict[str, str] = field(default_factory=dict)
    # Per-run timeouts by size, in seconds (a cold compile on neuron; harness/launch/run_matrix.py).
    timeouts_s: dict[str, float] = field(default_factory=lambda: dict(CPU_TIMEOUTS_S))
    # Whether ranks are forked from a zygote that has imported torch (harness/rank/warm_start.py):
    # CPU only. A CPU rank's start-up is mostly imports, the floor of every CPU-tier launch; an
    # accelerator rank's is its device's initialisation, which a fork must not copy.
    warm_start: bool = False
    # Whether a test session may launch the runs its tests will read ahead of need, beside the
    # ones its workers launch (harness/launch/prefetch.py): CPU only. A CPU launch mostly waits
    # (rendezvous, checkpoint writes), so another one overlaps it; accelerator launches would
    # share the devices.
    prefetch: bool = False
    # torch.compile's backend for a run that compiles (torchtitan's --compile.backend): Inductor,
    # torch's own, on CPU and CUDA; TorchNeuron's "neuron" TorchDynamo backend on trn2 (Neuron
    # 2.33 docs, torch.compile on Neuron; TorchTitan Neuron: "--compile.enable --compile.backend
    # neuron").
    compile_backend: str = "inductor"

    @property
    def compile_cache_dir(self) -> str | None:
        """Where the ranks keep compiled graphs across runs (neuron: the NEFF cache), if anywhere."""
        return self.rank_env.get(NEFF_CACHE_ENV)

    def describe(self) -> str:
        return (
            f"{self.kind} ({self.device_count} device(s), {self.ranks_per_node} ranks/node, "
            f"process group {self.process_group_backend})"
        )


# What makes the neuron tier runnable: no pip command installs the Neuron SDK's device stack.
NEURON_FIX = ("the neuron tier runs on a trn2 host in the Neuron SDK 2.33 image's venv "
              "(README.md, 'On a Neuron image')")


def neuron_status() -> tuple[bool, str]:
    """(available, reason). PyPI's torch-neuronx is a placeholder: it counts as absent."""
    importable, reason = probe_module("torch_neuronx")
    if not importable:
        return False, f"{reason}; {NEURON_FIX}"
    import torch  # noqa: PLC0415  heavy: torch; conftest and the launcher import this module

    if torch._C._get_privateuse1_backend_name() != "neuron":
        return False, "torch-neuronx imported but no 'neuron' PrivateUse1 device is registered"
    count = torch.neuron.device_count()  # type: ignore[attr-defined]
    if count < 1:
        return False, "the 'neuron' device is registered but reports 0 NeuronCores"
    return True, f"{count} logical NeuronCores"


def cuda_status() -> tuple[bool, str]:
    import torch  # noqa: PLC0415  heavy: torch; conftest and the launcher import this module

    if not torch.cuda.is_available():
        return False, "torch.cuda.is_available() is False (no CUDA GPU or driver)"
    return True, f"{torch.cuda.device_count()} CUDA device(s)"


def device_status(kind: str) -> tuple[bool, str]:
    """(available, reason) of a device kind: the one definition every tier and suite asks.

    Besides ``KINDS``, kernel tests know "nki-sim" (the Neuron SDK's NKI CPU simulator) and
    "nki-emu" (the harness's NKI emulator, harness/kernels/emu: always available)."""
    if kind == "neuron":
        return neuron_status()
    if kind == "cuda":
        return cuda_status()
    if kind == "cpu":
        return True, f"{os.cpu_count()} CPU cores"
    if kind == "nki-sim":
        ok, reason = nki_available()
        return ok, reason if ok else f"NKI simulator unavailable: {reason}"
    if kind == "nki-emu":
        return True, "the harness's NKI emulator (CPU, trn2 rules)"
    raise ValueError(f"unknown device kind {kind!r}; choose one of {(*KINDS, 'nki-sim', 'nki-emu')}")


# Per-run timeouts. CPU: tiny runs take seconds; the full-size twin is as small. Neuron:
# TorchNeuron eager compiles every new op and shape the first time it runs (a cold compile
# cache), so even a tiny run's first step can take many minutes (15 min each, against the
# CPU's 600 s); a full-size run compiles on its first step, then runs 10 steps of the real
# model and saves. All of them at their limits fit the nightly's test step (620 min for 6 tiny
# and 5 full-size runs: tests/e2e/test_workflows.py).
CPU_TIMEOUTS_S = {"tiny": 600, "full": 600}
NEURON_TIMEOUTS_S = {"tiny": 15 * 60, "full": 100 * 60}
TIMEOUTS_S = {"cpu": CPU_TIMEOUTS_S, "cuda": CPU_TIMEOUTS_S, "neuron": NEURON_TIMEOUTS_S}
# Core visibility: torch-neuronx assigns NeuronCores to torchrun's ranks only when these are
# unset (the runtime reserves every core for the first process otherwise); a runner that
# exports them would give every rank the same cores.
NEURON_CORE_VISIBILITY = ("NEURON_RT_VISIBLE_CORES", "NEURON_RT_NUM_CORES")
# neuronx-cc auto-casts fp32 matmuls to bf16 by default; TorchNeuron eager passes
# --auto-cast=none, then appends NEURON_CC_FLAGS, so an image that sets that variable changes
# the numerics. The expectations (fp32 recorded losses, bf16 params at full size) assume none;
# the ranks get it last, so it wins over anything inherited.
NEURON_AUTO_CAST = "none"
# TorchNeuron's compile cache: the nightly keeps it across nights (actions/cache), so a night's
# compile time depends on whether it was warm (harness/report/baseline.py compares alike only).
NEFF_CACHE_ENV = "TORCH_NEURONX_NEFF_CACHE_DIR"
NEFF_CACHE_DEFAULT = "~/.cache/neuron-neff"


def neuron_rank_env(environ: dict[str, str]) -> tuple[dict[str, str], tuple[str, ...], dict[str, str]]:
    """(rank environment, inherited variables to drop, settings to record) of neuron ranks,
    from the launcher's environment: a pure function, checked on CPU."""
    inherited = environ.get("NEURON_CC_FLAGS", "").strip()
    flags = f"{inherited} --auto-cast={NEURON_AUTO_CAST}".strip()
    env = {
        "NEURON_LOGICAL_NC_CONFIG": environ.get("NEURON_LOGICAL_NC_CONFIG", NEURON_LNC_DEFAULT),
        NEFF_CACHE_ENV: environ.get(NEFF_CACHE_ENV, os.path.expanduser(NEFF_CACHE_DEFAULT)),
        "NEURON_CC_FLAGS": flags,
    }
    recorded = {COLLECTIVES_RECORD: "neuron", "neuron-auto-cast": NEURON_AUTO_CAST, "neuron-cc-flags": flags,
                "neuron-inherited-core-visibility": ",".join(
                    f"{k}={environ[k]}" for k in NEURON_CORE_VISIBILITY if k in environ) or "none"}
    return env, NEURON_CORE_VISIBILITY, recorded


# Shims torchtitan needs on CPU; see harness/upstream/ (gloo_all_to_all: EP's uneven token dispatch).
CPU_SHIMS = ("cpu_device", "flex_attention_cpu", "gloo_reduce_op", "gloo_all_to_all")


def profile_for(kind: str) -> DeviceProfile:
    standin = standin_for(kind)
    if standin:
        # As strict as trn2 where CPU can be: the ranks refuse what ProcessGroupNeuron refuses
        # (harness/device/neuron_collectives.py), and the runs are scheduled as on trn2: cold
        # launches, none ahead of need (pytest runs -n 0 there too, ``xdist_workers``).
        stood_in = profile_for(standin)
        return replace(stood_in, shims=(*stood_in.shims, STANDIN_COLLECTIVES), warm_start=False,
                       prefetch=False, recorded={**stood_in.recorded, "standin-for": kind,
                                                 COLLECTIVES_RECORD: kind})
    available, reason = device_status(kind)
    if not available:
        raise RuntimeError(f"device {kind!r} is not available here: {reason}")
    if kind == "neuron":
        import torch  # noqa: PLC0415  heavy: torch; conftest and the launcher import this module

        count = torch.neuron.device_count()  # type: ignore[attr-defined]
        return neuron_profile(count, dict(os.environ))
    if kind == "cuda":
        import torch  # noqa: PLC0415  heavy: torch; conftest and the launcher import this module

        count = torch.cuda.device_count()
        return DeviceProfile(
            kind="cuda", process_group_backend="nccl", ranks_per_node=count, device_count=count
        )
    # Two ranks share the CPU: one intra-op thread each keeps them from fighting over cores
    # and keeps float reductions in a fixed order (bit-identical seeded reruns).
    return DeviceProfile(
        kind="cpu",
        process_group_backend="gloo",
        ranks_per_node=2,
        device_count=1,
        rank_env={THREADS_ENV: "1", **ARROW_ENV},
        shims=CPU_SHIMS,
        warm_start=True,
        prefetch=True,
    )


def neuron_profile(count: int, environ: dict[str, str]) -> DeviceProfile:
    """The neuron profile for ``count`` logical NeuronCores, from the launcher's environment."""
    env, unset, recorded = neuron_rank_env(environ)
    return DeviceProfile(kind="neuron", process_group_backend="neuron", ranks_per_node=count,
                         device_count=count, rank_env=env, rank_env_unset=unset,
                         recorded=recorded, timeouts_s=dict(NEURON_TIMEOUTS_S),
                         compile_backend="neuron")


def detect(requested: str | None = None) -> DeviceProfile:
    """The profile for ``requested``, or for the best device present (neuron > cuda > cpu)."""
    if requested:
        return profile_for(requested)
    for kind in KINDS:
        if device_status(kind)[0]:
            return profile_for(kind)
    raise AssertionError("unreachable: cpu is always available")
