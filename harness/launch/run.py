"""Launch one backend run: ``torchrun ... -m torchtitan.train --module M --config C``.

The launcher owns the process tree: torchrun runs in its own session (process group), every
rank's stdout/stderr lands in its own file, and whatever happens (success, crash, timeout,
Ctrl-C) the whole tree is gone when ``launch`` returns. Results come back from the JSONL sink
(harness/upstream/metrics_sink.py), never from console text.

A run over several nodes (``RunSpec.nodes``) is launched here as several torchrun agents on
this machine, one per node, each in its own session with its own launcher log and log folder,
meeting through torchrun's static rendezvous (``node_commands``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from harness import plants
from harness.backends import BackendSpec, backend, c4
from harness.device.devices import HF_ENV, DeviceProfile
from harness.launch import warm
from harness.launch.preflight import check_run_inputs
from harness.launch.subjects import Facts
from harness.rank import observers as rank_observers
from harness.registry import dump_layout, environment, known_issues
from harness.registry.hf_config import read_config_json
from harness.registry.layouts import DEGREES, FSDP, Layout, resolved_degrees
from harness.registry.layouts import layout as layout_entry
from harness.results.run_result import RunResult, read_step_records
from harness.upstream import install as shim_install
from harness.upstream import titan_cli
from harness.upstream.versions import package_versions

DATA_SOURCES = ("fixture", "c4")
STARTS = ("warm", "cold")  # RunSpec.start


@dataclass(frozen=True)
class RunSpec:
    backend: str
    size: str = "tiny"
    init: str = "random"
    steps: int = 10
    attention: str | None = None  # None: the backend's default (the source's configuration)
    nproc: int | None = None  # default: the size's, else the device profile's ranks per node
    save_hf: bool = False
    timeout_s: float = 600.0
    hf_assets_path: str | None = None  # full-size runs: the HF assets dir
    # What the dataloader reads: "fixture" (the harness's corpus) or "c4" (the source's data:
    # allenai/c4 "en" as spring-2026's qwen3_32b() loads it: from a local copy at ``data_path``
    # (harness/backends/c4.py), else streamed from the Hub).
    data: str = "fixture"
    data_path: str | None = None
    overrides: tuple[str, ...] = ()  # extra torchtitan CLI overrides
    rendezvous: tuple[str, ...] = ()  # torchrun rendezvous options; default --standalone
    extra_env: tuple[tuple[str, str], ...] = ()
    # Workarounds for named upstream defects (harness/registry/known_issues/), on top of the ones the
    # backend always gets (BackendSpec.workarounds).
    workarounds: tuple[str, ...] = ()
    # Plants (harness/plants): defects the self-tests put into the ranks' torchtitan.
    plants: tuple[str, ...] = ()
    # A user's config function instead of a registered backend's (``RunSpec.for_subject``):
    # what the harness inferred about it (harness/launch/subjects.py); ``backend`` is then its kind.
    subject: Facts | None = None
    pythonpath: tuple[str, ...] = ()  # folders the ranks need to import a subject's module
    # How the run spreads a step over its ranks (harness/registry/layouts.py); its ranks and
    # global batch are the layout's.
    layout: str = FSDP
    # A full-size run from the CPU assets twin (harness/registry/assets_twin.py): its layout's
    # degrees are the layout's twin's (``Layout.twin``: the twin's model is the tiny one).
    twin: bool = False
    # Nodes the ranks are spread over, each its own torchrun agent on this machine (CPU): the
    # run's ranks (``ranks``) split evenly, node i holding global ranks i*per_node.. .
    nodes: int = 1
    # "warm": on a device that has them (CPU), each rank is forked from a zygote that has already
    # imported torch (harness/rank/warm_start.py); "cold": plain torchrun workers throughout.
    start: str = "warm"
    # A name of its own for a run that must never be taken for the template's run of the same
    # backend (a report, the nightly's baseline pair runs by name): "<name>@<label>".
    label: str = ""
    # A full checkpoint (model, optimizer, lr schedule, train state: torchtitan's
    # ``--checkpoint.no-initial-load-model-only``) the run resumes from, and the step it was
    # saved at: the run logs steps ``resume_step + 1`` on (``first_step``).
    resume_from: str | None = None
    resume_step: int = 0

    @classmethod
    def for_subject(cls, facts: Facts, **fields) -> RunSpec:
        return cls(backend=facts.kind, size=facts.size, init=facts.init,
                   attention=facts.attention, subject=facts, **fields)

    def __post_init__(self) -> None:
        spec = backend(self.backend)  # validates the backend name
        plants.check_patch_names(self.plants)  # known, and installable in a rank
        for name in self.workarounds:
            known_issues.workaround(name)  # validates the name
        # Only the workarounds that change this backend: one key per distinct run.
        object.__setattr__(self, "workarounds", tuple(
            w for w in self.workarounds if known_issues.workaround(w).applies_to(self.backend)))
        if self.data not in DATA_SOURCES:
            raise ValueError(f"data must be one of {DATA_SOURCES}, not {self.data!r}")
        if self.start not in STARTS:
            raise ValueError(f"start must be one of {STARTS}, not {self.start!r}")
        if (self.resume_from is None) != (self.resume_step == 0) or self.resume_step < 0:
            raise ValueError(f"a resumed run names its checkpoint and the step it was saved at "
                             f"(resume_from={self.resume_from!r}, resume_step={self.resume_step!r})")
        degrees = [flag for flag in self.overrides if flag.removeprefix("--parallelism.") in DEGREES]
        if degrees:
            raise ValueError(f"overrides {degrees}: a run's parallel degrees are its layout's "
                             f"(RunSpec.layout, harness/registry/layouts.py), which it records")
        if not isinstance(self.nodes, int) or self.nodes < 1:
            raise ValueError(f"nodes must be a whole number of at least 1, not {self.nodes!r}")
        if self.nodes > 1 and self.rendezvous:
            raise ValueError(f"nodes={self.nodes} starts its nodes on this machine and picks their "
                             f"rendezvous itself; rendezvous options {self.rendezvous} are for one "
                             f"torchrun per host (leave nodes=1 there)")
        if self.layout != FSDP:
            entry = self.layout_spec
            if self.subject is not None or self.size != entry.size:
                raise ValueError(f"layout {self.layout!r} runs the registered backends' "
                                 f"{entry.size} models (its ranks and batch are sized for them); "
                                 f"{self.name} is not one")
            if self.twin and not entry.twin:
                raise ValueError(f"layout {self.layout!r} names no twin layout (Layout.twin) for "
                                 f"the assets twin to run in its place")
            if not entry.applies_to(self.model_kind):
                raise ValueError(f"layout {self.layout!r} applies to {entry.kinds} models; "
                                 f"{self.backend}/{self.size} is {self.model_kind}")
        if self.subject is not None:  # the subject's own config decides init, size, attention
            return
        if self.attention is None:  # one key per distinct run: the default, spelled out
            object.__setattr__(self, "attention", spec.default_attention)
        if self.init not in self.size_spec.inits:
            raise ValueError(f"{self.backend}/{self.size}: init must be one of "
                             f"{self.size_spec.inits}, not {self.init!r}")
        spec.config_name(self.size, self.attention)  # validates size and attention
        if self.twin and self.size != "full":
            raise ValueError(f"twin=True runs a full-size code path from the assets twin; {self.name} "
                             f"is {self.size} (drop twin)")

    @property
    def spec(self) -> BackendSpec:
        return backend(self.backend)

    @property
    def layout_spec(self) -> Layout:
        return layout_entry(self.layout)

    @property
    def launched_layout(self) -> Layout:
        """The layout whose parallel degrees the ranks run: the run's, or on the assets twin its
        twin's (``Layout.twin``)."""
        entry = self.layout_spec
        return layout_entry(entry.twin) if self.twin and entry.twin else entry

    def parallel_degrees(self, ranks: int) -> dict[str, int]:
        """The parallel degrees its ``ranks`` ranks run, named as torchtitan names them
        (harness/registry/layouts.py ``DEGREES``): the launched layout's (its flags,
        ``layout_flags``), or a subject's own config's (no flag overrides them)."""
        if self.subject:
            return resolved_degrees(dict(self.subject.degrees), ranks)
        return self.launched_layout.degrees(ranks)

    def with_layout(self, name: str) -> RunSpec:
        """The same run in layout ``name`` (on the assets twin, a full-size layout runs its twin's
        degrees; FSDP is the configs' own)."""
        return replace(self, layout=name, twin=self.twin and name != FSDP)

    def model_dir(self) -> Path:
        """The folder whose config.json its model is built from (a subject's: ``Facts.config_dir``)."""
        if self.subject:
            return self.subject.config_dir
        return self.size_spec.resolve(self.size_spec.model_dir, self.hf_assets_path)

    def weights_dir(self) -> Path | None:
        """The HF safetensors it starts from; None: a random init."""
        if self.init != "pretrained":
            return None
        if self.subject:
            return self.subject.weights_dir
        return self.size_spec.resolve(self.size_spec.weights_dir, self.hf_assets_path)

    def assets_dir(self) -> Path:
        """Its tokenizer's folder (torchtitan's hf_assets_path)."""
        if self.subject:
            return self.subject.assets_dir
        return Path(self.hf_assets_path) if self.hf_assets_path else self.model_dir()

    @property
    def first_step(self) -> int:
        """The first step it logs: 1, or the step after the one it resumes from."""
        return self.resume_step + 1

    @property
    def setting(self) -> tuple:
        """What it trains on beyond its configuration (backend, size, init, attention, layout):
        its data, the weights and checkpoint it starts from, and its own overrides."""
        return (self.data, self.data_path, self.weights_dir(), self.resume_from, self.overrides)

    @property
    def model_kind(self) -> str:
        """"moe" or "dense", from the model's config.json (its routed experts)."""
        return "moe" if (self.model_config.get("num_experts")
                        or self.model_config.get("num_local_experts")) else "dense"

    @property
    def model_config(self) -> dict:
        return read_config_json(self.model_dir())

    @property
    def size_spec(self):
        return backend(self.backend).size(self.size)

    @property
    def attention_name(self) -> str:
        return self.attention or self.spec.default_attention

    @property
    def module(self) -> str:
        return self.subject.module if self.subject else self.spec.module

    @property
    def config(self) -> str:
        return self.subject.config if self.subject else self.spec.config_name(self.size, self.attention)

    @property
    def model(self) -> str | None:
        """The expectations' model key."""
        return self.subject.model if self.subject else self.size_spec.model

    @property
    def mask(self) -> str:
        """How this run's attention treats packed rows (a workaround may change it)."""
        for name in self.all_workarounds:
            if known_issues.workaround(name).masking:
                return known_issues.workaround(name).masking
        return self.subject.mask if self.subject else self.spec.mask(self.attention)

    @property
    def all_workarounds(self) -> tuple[str, ...]:
        """The backend's and its size's own workarounds, and those asked for, that change this
        backend."""
        size = tuple(w for w in self.size_spec.workarounds
                     if known_issues.workaround(w).applies_to(self.backend))
        return tuple(dict.fromkeys((*self.spec.workarounds, *size, *self.workarounds)))

    def ranks(self, profile: DeviceProfile) -> int:
        """Ranks of this run on one node: asked for, else the size's (never more than the node
        has: a 1-GPU host runs the tiny models on one rank and asks for the dp1 expectation)."""
        wanted = (2 if self.size == "tiny" else None) if self.subject else self.size_spec.nproc
        tiny_layout = self.layout != FSDP and self.size == "tiny"  # full size: the size's ranks
        if tiny_layout and profile.kind == "cpu":
            return self.nproc or self.layout_spec.ranks  # CPU ranks are processes: any count
        if tiny_layout:
            wanted = self.layout_spec.ranks
        return self.nproc or min(wanted or profile.ranks_per_node, profile.ranks_per_node)

    def ranks_per_node(self, profile: DeviceProfile) -> int:
        """Ranks of each node: the run's ranks (``ranks``) over its nodes, which must divide
        them; several nodes are started on this machine, so only where ranks are processes."""
        total = self.ranks(profile)
        if self.nodes == 1:
            return total
        if profile.kind != "cpu":
            raise ValueError(f"{self.name}: nodes={self.nodes} starts every node on this machine, "
                             f"which only the cpu tier's ranks allow; on {profile.kind}, run one "
                             f"torchrun per host (pytest's --torchrun-arg, docs/tiers.md)")
        if total % self.nodes:
            raise ValueError(f"{self.name}: {total} ranks do not split over {self.nodes} nodes; "
                             f"make nodes a divisor of {total}, or set nproc to a multiple of "
                             f"{self.nodes}")
        return total // self.nodes

    @property
    def name(self) -> str:
        suffix = "".join(f"+{w}" for w in self.all_workarounds) + "".join(f"+plant:{p}" for p in self.plants)
        if self.nodes > 1:
            suffix = f"@{self.nodes}nodes{suffix}"
        if self.nproc is not None and self.size == "tiny":  # not the size's or the layout's ranks
            suffix = f"@{self.nproc}ranks{suffix}"
        if self.layout != FSDP:
            suffix = f"@{self.layout}{suffix}"
        if self.label:
            suffix = f"{suffix}@{self.label}"
        if self.subject:
            return f"{self.subject.module}:{self.subject.config}{suffix}"
        attention = "" if self.attention == self.spec.default_attention else f"-{self.attention}"
        return f"{self.backend}-{self.size}{attention}-{self.init}{suffix}"


def build_command(spec: RunSpec, profile: DeviceProfile, run_dir: Path,
                  node: tuple[int, int] | None = None) -> list[str]:
    """The torchrun command of ``spec``; ``node``: (node rank, rendezvous port) of one of
    several nodes on this machine (``node_commands``)."""
    nproc = spec.ranks(profile)
    rendezvous = spec.rendezvous or ("--standalone",)
    per_node, log_dir = nproc, dump_layout.torchrun_log_dir(run_dir)
    if node is not None:
        rank, port = node
        per_node, log_dir = spec.ranks_per_node(profile), dump_layout.torchrun_log_dir(run_dir, rank)
        rendezvous = (f"--nnodes={spec.nodes}", f"--node-rank={rank}",
                      "--master-addr=127.0.0.1", f"--master-port={port}")
    command = [
        sys.executable, "-m", "torch.distributed.run",
        *rendezvous,
        f"--nproc-per-node={per_node}",
        f"--log-dir={log_dir}",
        "--redirects=3",
        "-m", "torchtitan.train",
        "--module", spec.module,
        "--config", spec.config,
        "--dump_folder", str(dump_layout.dump_folder(run_dir)),
        "--training.steps", str(spec.steps),
    ]
    if spec.hf_assets_path and not spec.subject:
        for flag in spec.spec.asset_flags:
            command += [flag, spec.hf_assets_path]
    command += data_flags(spec.data, spec.data_path, nproc)
    if spec.init == "pretrained" or spec.save_hf or spec.resume_from:
        command += ["--checkpoint.enable"]
    if spec.init == "pretrained" and not spec.subject:  # a subject's config loads its own
        command += [
            "--checkpoint.initial_load_in_hf",
            "--checkpoint.initial_load_path", str(spec.weights_dir().resolve()),
        ]
    if spec.resume_from:
        command += ["--checkpoint.initial_load_path", str(Path(spec.resume_from).resolve()),
                    "--checkpoint.no-initial-load-model-only"]
    if spec.save_hf:
        command += [
            "--checkpoint.last_save_in_hf",
            "--checkpoint.last_save_model_only",
            "--checkpoint.interval", str(spec.steps),
        ]
    for name in spec.all_workarounds:
        command += list(known_issues.workaround(name).rank_overrides)
    # The layout's flags come last: 0.3.0's activation checkpointing is a subcommand.
    return command + list(spec.overrides) + list(layout_flags(spec, profile.compile_backend))


def node_commands(spec: RunSpec, profile: DeviceProfile, run_dir: Path) -> list[list[str]]:
    """One torchrun command per node: the run's single command for one node; for several, each
    node an agent of torchrun's static rendezvous on this machine (``--nnodes``, its own
    ``--node-rank``, node 0 hosting the store on a free port). Static, not c10d: c10d ranks the
    agents in the order of its own participant list and ignores ``--node-rank``, so which
    global ranks a node's log folder holds would be unknown; static gives node i the global
    ranks i*per_node + local rank."""
    if spec.nodes == 1:
        return [build_command(spec, profile, run_dir)]
    spec.ranks_per_node(profile)  # refuses nodes that do not divide the ranks
    port = free_port()
    return [build_command(spec, profile, run_dir, node=(rank, port)) for rank in range(spec.nodes)]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the rendezvous store of several nodes binds it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def layout_flags(spec: RunSpec, compile_backend: str) -> tuple[str, ...]:
    """The command line of ``spec``'s layout (none for FSDP, the configs' own): the parallel
    degrees, at tiny size the batch that keeps the tiny run's global batch (a full-size layout
    keeps the size's local batch, as users run it), compile through the device's backend
    (``DeviceProfile.compile_backend``), and what the generation spells its own way
    (``titan_cli.layout_overrides``)."""
    if spec.layout == FSDP:
        return ()
    lay = spec.launched_layout
    flags = (
        "--parallelism.tensor_parallel_degree", str(lay.tp),
        "--parallelism.context_parallel_degree", str(lay.cp),
        "--parallelism.expert_parallel_degree", str(lay.ep),
        "--parallelism.data_parallel_replicate_degree", str(lay.replicate),
        *(("--parallelism.pipeline_parallel_degree", str(lay.pp)) if lay.pp > 1 else ()),
        *(("--training.local_batch_size", str(lay.local_batch_size),
           "--training.global_batch_size", str(lay.local_batch_size * lay.data_parallel * lay.ga))
          if spec.size == "tiny" else ()),
        *(("--compile.enable", "--compile.components", ",".join(lay.compile),
           "--compile.backend", compile_backend) if lay.compile else ()),
        *(spec.spec.cp_flags if lay.cp > 1 else ()),
    )
    return flags + titan_cli.layout_overrides(tp=lay.tp, ep=lay.ep, pp=lay.pp, ac=lay.ac,
                                              vocab_size=spec.model_config["vocab_size"])


def data_flags(data: str, data_path: str | None, ranks: int) -> list[str]:
    """The dataloader overrides of a run's data (the configs read the fixture corpus): a C4 run
    always names its dataset path (harness/backends/c4.py), a local copy checked to hold what
    ``ranks`` ranks read."""
    if data == "fixture":
        return []
    if data_path:
        c4.check_local_copy(data_path, ranks)
    return c4.dataset_flags(data_path)


def remove_checkpoints(run_dir: Path) -> None:
    """Delete a run's checkpoints (``dump/checkpoint``) once its checks have read them."""
    shutil.rmtree(dump_layout.checkpoints(run_dir), ignore_errors=True)


def rank_environment(spec: RunSpec, profile: DeviceProfile) -> dict[str, str]:
    """What every rank starts with (harness/registry/environment.py ``child_environment``): the
    device's variables, the boot folder first on the path (on every device) with the shims,
    plants and rank-side observers it installs (harness/rank/boot/sitecustomize.py), then
    ``spec.extra_env``."""
    base = {k: v for k, v in os.environ.items() if k not in profile.rank_env_unset}
    for name, value in HF_ENV.items():  # as the in-process checks set them, ran they or not
        base.setdefault(name, value)
    base.update(profile.rank_env)
    if spec.size == "full" and spec.hf_assets_path and not spec.subject:
        base[environment.FULL_ASSETS] = str(spec.hf_assets_path)
    workaround_shims = [known_issues.workaround(name).rank_shim for name in spec.all_workarounds]
    # A subject's config has torchtitan's own metrics processor: the ranks swap in the
    # harness's JSONL sink (the harness reads results from nowhere else).
    sink = ("jsonl_metrics_sink",) if spec.subject else ()
    shims = (*profile.shims, *sink, *(s for s in workaround_shims if s))
    return environment.child_environment(
        base=base, rank=True, shims=shims, plants=spec.plants,
        observers=rank_observers.OBSERVERS,  # every run, every device
        python_path=spec.pythonpath, **dict(spec.extra_env))


def run_patches(env: dict[str, str], profile: DeviceProfile) -> frozenset[str]:
    """The modules a run's ranks patch as they import them, beyond what the device's shims
    patch: its own shims' (workarounds, the sink) and its plants'."""
    own = [n for n in environment.names(env.get(environment.SHIMS)) if n not in profile.shims]
    planted = environment.names(env.get(environment.PLANTS))
    return shim_install.targets(own) | plants.targets(planted)


def kill_tree(root_pid: int, grace_s: float = 10.0) -> None:
    """SIGTERM the launcher's process group and every descendant, then SIGKILL survivors."""
    kill_trees((root_pid,), grace_s)


def kill_trees(root_pids, grace_s: float = 10.0) -> None:
    """``kill_tree`` of several launchers at once (the nodes of one run): every tree is sent
    SIGTERM before any is waited for, so no node's ranks outlive another's and wait on them."""
    victims = []
    for root_pid in root_pids:
        try:
            root = psutil.Process(root_pid)
            victims += [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    for root_pid in root_pids:
        try:
            os.killpg(root_pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    for proc in victims:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(victims, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace_s)


def _wait(procs: list[subprocess.Popen], timeout_s: float, sink: Path, on_step) -> bool:
    """Wait for every launcher of ``procs`` to exit, or one to fail (the other nodes' ranks would
    wait on its ranks until their collectives time out); report each new step record to
    ``on_step``. True if it timed out."""
    deadline = time.monotonic() + timeout_s
    reported = 0
    while (any(p.poll() is None for p in procs)
           and not any(p.poll() not in (None, 0) for p in procs)):
        if time.monotonic() > deadline:
            return True
        time.sleep(0.1)
        if on_step is not None:
            records = read_step_records(sink)
            for record in records[reported:]:
                on_step(record)
            reported = len(records)
    return False


def cache_entries(folder: str | None) -> int | None:
    """Files in a compile cache folder (None: the device keeps no cache)."""
    if folder is None:
        return None
    return sum(len(files) for _, _, files in os.walk(os.path.expanduser(folder)))


def compile_cache_state(folder: str | None, before: int | None) -> dict | None:
    """Whether the run found its graphs compiled ("warm": it added nothing to the cache) or
    compiled some itself ("cold"), with the counts; None where the device keeps no cache."""
    after = cache_entries(folder)
    if before is None or after is None:
        return None
    return {"dir": folder, "entries_before": before, "new_entries": after - before,
            "state": "cold" if after > before else "warm"}


def launch(spec: RunSpec, profile: DeviceProfile, run_dir: Path, on_step=None) -> RunResult:
    """Run ``spec`` on ``profile`` in a fresh ``run_dir`` and return what it produced.

    ``on_step(StepRecord)`` is called as steps are logged (progress display).
    """
    per_node = spec.ranks_per_node(profile)  # nodes that do not divide the ranks: refused here
    check_run_inputs(spec.model_dir(), spec.assets_dir(), spec.weights_dir())
    run_dir = Path(run_dir)
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a stale dump/checkpoint would be resumed instead of loaded
    run_dir.mkdir(parents=True)
    commands = node_commands(spec, profile, run_dir)
    command = commands[0]
    ranks = spec.ranks(profile)
    degrees = spec.parallel_degrees(ranks)  # what the command runs (``layout_flags``)
    dump_layout.command_file(run_dir).write_text("".join(" ".join(c) + "\n" for c in commands))
    cache_before = cache_entries(profile.compile_cache_dir)
    start = time.monotonic()
    timed_out = False
    env = rank_environment(spec, profile)
    why_cold = "" if profile.warm_start else f"{profile.kind} ranks start cold"
    if profile.warm_start and spec.start == "warm":
        warm_socket, why_cold = warm.socket_for(env, profile.shims, run_patches(env, profile))
        if warm_socket:
            env[environment.WARM_SOCKET] = warm_socket
    elif spec.start == "cold":
        why_cold = "the run asks for a cold start"
    procs: list[subprocess.Popen] = []
    logs = [open(dump_layout.launcher_log(run_dir, node, spec.nodes), "wb")
            for node in range(spec.nodes)]
    try:
        for node_command, log in zip(commands, logs, strict=True):
            procs.append(subprocess.Popen(
                node_command,
                cwd=run_dir,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            ))
        sink = dump_layout.metrics_file(dump_layout.dump_folder(run_dir), rank=0)
        timed_out = _wait(procs, spec.timeout_s, sink, on_step)
        # A node that failed is the run's outcome (the others were still running).
        codes = [p.poll() for p in procs]
    finally:
        kill_trees([p.pid for p in procs])
        for p in procs:
            p.wait()
        for log in logs:
            log.close()
    returncode = None if timed_out else next((c for c in codes if c not in (None, 0)), 0)
    rank_logs = dump_layout.find_rank_logs(run_dir, per_node)
    return RunResult(
        spec=spec,
        device=profile.kind,
        nproc=ranks,
        layout=spec.launched_layout.name,
        degrees=degrees,
        command=command,
        returncode=returncode,
        timed_out=timed_out,
        duration_s=time.monotonic() - start,
        run_dir=run_dir,
        # Multi-node: this node may not hold global rank 0; any rank logs the global loss, but
        # under pipeline parallelism only the last stage's ranks (the highest) do.
        steps=read_step_records(dump_layout.loss_rank_metrics(run_dir, last=degrees["pipeline_parallel_degree"] > 1)
                                or sink),
        rank_logs=rank_logs,
        started=warm.started_warm(rank_logs, why_cold),
        versions={**package_versions(), **profile.recorded},
        compile_cache=compile_cache_state(profile.compile_cache_dir, cache_before),
    )
