"""The runs every device tier makes, generated from the backend registry and the device tiers
(``instantiate_device_type_tests`` for launched runs).

A ``RunCase`` is one (device, backend, size, attention, init). Each device runs the sizes of
its tier (harness/device/devices.py ``TIER_SIZES``); each backend runs every init of the size with
its default attention (the source's configuration), and its other attention variants from the
pretrained fixture at tiny size, where a recorded loss tells the masks apart (on the devices
that can run them: ``UNSUPPORTED_ATTENTION``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from harness.backends import BACKENDS
from harness.device.devices import KINDS, TIER_SIZES, TIMEOUTS_S, UNSUPPORTED_ATTENTION, runs_on
from harness.launch.run import RunSpec
from harness.launch.subjects import Subject, infer
from harness.registry import known_issues, paths
from harness.registry.assets_twin import full_size_assets_dir
from harness.registry.generations import installed_generation as generation
from harness.registry.layouts import FSDP, LAYOUTS

# Per-run timeouts by device and size (harness/device/devices.py TIMEOUTS_S: a cold compile on
# neuron). Every neuron run at its timeout must fit the nightly test step's limit
# (.github/workflows/nightly-trn2.yml; tests/e2e/test_workflows.py checks the sum).
FULL_TIMEOUT_S = TIMEOUTS_S["neuron"]["full"]
TINY_TIMEOUT_S = TIMEOUTS_S["cpu"]["tiny"]
# The full size on a device without the real model runs from the assets twin
# (harness/registry/assets_twin.py), kept cheap: 2 ranks, short rows, one init per backend (pretrained
# where the size has weights). Random init of the tied dense models is left to the real width
# (tests/e2e/test_full_size_random_init_cpu.py): at the twin's width the tied-embedding init
# rules dominate it (hf_v5-tied-embedding-init-scale), as at tiny size.
TWIN_DEVICES = ("cpu",)
TWIN_OVERRIDES = ("--training.seq_len", "256")
# The neuron tier's full-size layouts (harness/registry/layouts.py ``full_size``), beside the
# source's FSDP runs, each run by the backends of its model kind listed here (from the size's
# weights where it has them): native Qwen3 in the dense recipe, whose config the recipe is
# (torchtitan_neuron.models.qwen3 qwen3_8b_tp4_fsdp16_sac), and the NKI MoE cut under EP.
FULL_LAYOUT_BACKENDS = ("titan_native", "nki_moe")
# Full-size runs read the source's data: C4 as spring-2026's qwen3_32b() loads it (torchtitan's
# "c4" dataset), always with an explicit path (harness/backends/c4.py): a local copy (--c4-path;
# the twin's default is fixtures/c4, allenai/c4's layout) or the Hub's repository.
SOURCE_DATA = "c4"
C4_FIXTURE = paths.FIXTURES / "c4"
# The HF export of a full-size run: bfloat16, the dtype Qwen3-4B-Instruct-2507 ships in (torchtitan
# exports float32 by default: 16 GB for the 4B, 7.6 GB for the MoE cut; bfloat16 halves both).
FULL_EXPORT_DTYPE = "bfloat16"
FULL_OVERRIDES = ("--checkpoint.export_dtype", FULL_EXPORT_DTYPE)


def collective_timeout_overrides(timeout_s: float) -> tuple[str, ...]:
    """Every collective of a full-size run, and of any neuron run, may wait as long as the run
    itself may last.

    torchtitan creates the process group with ``comm.init_timeout_seconds`` (300 s) and, after
    step 1, lowers it to ``comm.train_timeout_seconds`` (100 s) through ``set_pg_timeouts``
    (trainer.py; distributed/utils.py -> torch ``distributed_c10d._set_pg_timeout`` ->
    ``set_timeout``), which torch forwards to each backend, and "backends that do not support
    changing their timeout ... leave their timeout unchanged" (torch 2.14 ``set_timeout``): on a
    backend that ignores it (as the review found for the neuron process group) the 300 s of
    init stays, and a cold compile of step 1 or the HF save (gather and consolidation on every
    rank) outlasts it. Both are set to the run's own timeout (harness/device/devices.py TIMEOUTS_S,
    sized for a cold compile, the steps and the save), so whichever one applies, no collective
    times out before the run does."""
    seconds = str(int(timeout_s))
    return ("--comm.init_timeout_seconds", seconds, "--comm.train_timeout_seconds", seconds)

# How long the test suite's runs are (``RunCase.suite_spec``): the session's ``--steps``, except
# the tiny MoE's random-init run on CPU, which also carries the default tier's training state,
# MoE load balancing and determinism checks (tests/e2e/test_training_state.py): it takes
# ``TRAINING_STATE_STEPS``, with a full (DCP) checkpoint after every step but the last, whose
# save stays the template's HF checkpoint. Its resumed run starts from the step-1 checkpoint;
# both runs save step 2 fully (weights, optimizer, lr schedule, dataloader, expert_bias),
# compared bitwise, and the HF checkpoint of step 3. torchtitan 0.3.0 and spring 2026 save
# alike: an interval save is always full, the last one HF model-only. Nothing else reads that
# run past its first step (its first-step expectation, its step-0 weights and shards, its HF
# checkpoint; every step of the MoE past the third is held finite in its pretrained run).
# Other runs keep ``--steps``: the pretrained tiny runs are read as curves
# (tests/parity/test_torchrun_parity.py), and fewer steps of a random-init run or a twin saved
# nothing outside the noise (measured side by side, 7 steps fewer: the dense runs 0 to 2 CPU s
# saved, the MoE's twin from 6 saved to 1 lost). Accelerator tiers keep every run at
# ``--steps`` (the nightly's report and baseline compare whole runs).
TRAINING_STATE_DEVICES = ("cpu",)
TRAINING_STATE_BACKEND = "nki_moe"
TRAINING_STATE_STEPS = 3
TRAINING_STATE_INTERVAL = 1
TRAINING_STATE_LAST_FULL = TRAINING_STATE_STEPS - 1  # the last step whose checkpoint is full
TRAINING_STATE_OVERRIDES = ("--checkpoint.enable", "--checkpoint.interval", str(TRAINING_STATE_INTERVAL))


def can_save_hf(backend: str) -> bool:
    """Whether runs save an HF checkpoint: always, unless a known issue (check ``hf_save``)
    says this backend cannot here; then its other checks still run on a run without it."""
    return not known_issues.applicable("hf_save", backend=backend, generation=generation())


@dataclass(frozen=True)
class RunCase:
    device: str
    backend: str
    size: str
    init: str
    attention: str
    # A variant whose expected step-1 loss its band cannot tell from the default variant's
    # tells nothing a commit needs: it runs in the slow tier (``cases`` decides, from data).
    slow: bool = False
    # A full-size layout (the neuron tier's recipe); the tiny layouts are ``LayoutCase``s.
    layout: str = FSDP

    @property
    def id(self) -> str:
        default = BACKENDS[self.backend].default_attention
        attention = "" if self.attention == default else f"-{self.attention}"
        at = "" if self.layout == FSDP else f"@{self.layout}"
        return f"{self.device}-{self.backend}-{self.size}{attention}-{self.init}{at}"

    @property
    def runs_on(self) -> str:
        """The device this case's run uses: its tier's, or the tier's stand-in (the rehearsal)."""
        return runs_on(self.device)

    @property
    def twin(self) -> bool:
        """A full-size code path run from the assets twin (harness/registry/assets_twin.py)."""
        return self.size == "full" and self.runs_on in TWIN_DEVICES

    @property
    def data(self) -> str:
        return SOURCE_DATA if self.size == "full" else "fixture"

    @property
    def timeout_s(self) -> float:
        return TIMEOUTS_S[self.runs_on][self.size]

    @property
    def carries_training_state(self) -> bool:
        """The run the default tier's training-state checks read (``TRAINING_STATE_BACKEND``)."""
        return (self.runs_on in TRAINING_STATE_DEVICES and self.attention == BACKENDS[self.backend].default_attention
                and (self.backend, self.size, self.init) == (TRAINING_STATE_BACKEND, "tiny", "random"))

    def suite_steps(self, steps: int) -> int:
        """The steps of this case's run in the test suite, ``steps`` being the session's
        ``--steps`` (see ``TRAINING_STATE_STEPS``)."""
        return TRAINING_STATE_STEPS if self.carries_training_state else steps

    def suite_spec(self, steps: int, assets_root: str | None = None, workarounds=(),
                   workdir: str | None = None, data_path: str | None = None) -> RunSpec:
        """The run of this case that the test suite launches and every check of it reads:
        ``run_spec`` at ``suite_steps``, checkpointed for the training-state checks where
        the case carries them."""
        spec = self.run_spec(self.suite_steps(steps), assets_root, workarounds, workdir, data_path)
        if self.carries_training_state:
            spec = replace(spec, overrides=(*spec.overrides, *TRAINING_STATE_OVERRIDES))
        return spec

    def run_spec(self, steps: int, assets_root: str | None = None, workarounds=(),
                 workdir: str | None = None, data_path: str | None = None) -> RunSpec:
        """``assets_root``: the --assets-dir of a full-size run (the twin's root on CPU);
        ``workdir``: where an assets folder derived for the run is built; ``data_path``: a local
        C4 copy for a full-size run (the twin's default: fixtures/c4; else the Hub's)."""
        full = self.size == "full"
        assets = None
        if full:
            size = BACKENDS[self.backend].size(self.size)
            if assets_root is None:
                raise ValueError(f"{self.id}: a full-size run needs the assets root (--assets-dir)")
            assets = str(full_size_assets_dir(size.assets, assets_root, size.derive_assets_from,
                                              workdir or assets_root))
        # A neuron run's timeout is sized for a cold compile (tiny ones too: 15 min), so every
        # neuron run, and every full-size run, may wait on a collective as long as it may run.
        overrides = collective_timeout_overrides(self.timeout_s) if full or self.device == "neuron" else ()
        if full:
            overrides = (*FULL_OVERRIDES, *overrides, *(TWIN_OVERRIDES if self.twin else ()))
            data_path = data_path or (str(C4_FIXTURE) if self.twin else None)
        return RunSpec(backend=self.backend, size=self.size, init=self.init, steps=steps,
                       attention=self.attention, save_hf=can_save_hf(self.backend),
                       workarounds=tuple(workarounds), hf_assets_path=assets,
                       nproc=2 if self.twin else None, overrides=overrides,
                       data=self.data, data_path=data_path if self.data == SOURCE_DATA else None,
                       timeout_s=self.timeout_s, layout=self.layout,
                       twin=self.twin and self.layout != FSDP)


@dataclass(frozen=True)
class SubjectCase:
    """A user's config function (``--subject M:C``) on one device: the same checks."""

    device: str
    subject: Subject
    pythonpath: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return f"{self.device}-{self.subject.name}"

    def run_spec(self, steps: int, assets_dir: str | None = None, workarounds=()) -> RunSpec:
        facts = infer(self.subject)
        timeout = TIMEOUTS_S[runs_on(self.device)][facts.size]
        return RunSpec.for_subject(facts, steps=steps, save_hf=True, timeout_s=timeout,
                                   workarounds=tuple(workarounds), pythonpath=self.pythonpath)


def cases(devices=KINDS) -> list[RunCase]:
    out = []
    for device in devices:
        for size in TIER_SIZES[device]:
            for spec in BACKENDS.values():
                if size not in spec.sizes:
                    continue
                for attention in spec.attention:
                    if attention in UNSUPPORTED_ATTENTION.get(device, ()):
                        continue
                    inits = spec.size(size).inits
                    if size == "full" and runs_on(device) in TWIN_DEVICES:
                        inits = inits[-1:]  # pretrained where it has weights, else random
                    for init in inits:
                        default = attention == spec.default_attention
                        if default or (size == "tiny" and init == "pretrained"):
                            slow = not default and not _distinguishable(spec, size, attention)
                            out.append(RunCase(device, spec.name, size, init, attention, slow))
                if size == "full" and spec.name in FULL_LAYOUT_BACKENDS:
                    # the cpu tier's twin runs in the slow tier (the rehearsed night's in its night)
                    out += [RunCase(device, spec.name, size, spec.size(size).inits[-1],
                                    spec.default_attention, slow=device == "cpu", layout=lay)
                            for lay in full_layouts(RunSpec(spec.name).model_kind)]
    return out


def full_layouts(kind: str) -> list[str]:
    """The full-size layouts (the neuron tier's) that apply to a ``kind`` model."""
    return [lay.name for lay in LAYOUTS.values() if lay.full_size and lay.applies_to(kind)]


def _distinguishable(spec, size: str, attention: str) -> bool:
    """Whether the pretrained step-1 expectation of ``attention`` differs from the default
    variant's by more than its band (else a mask mix-up would pass the check anyway)."""
    from harness.references.expected_loss import expected_loss  # noqa: PLC0415  heavy: torch; the CLI and budget.py list runs without it
    from harness.registry.expectations import MissingExpectation  # noqa: PLC0415  heavy: torch; the CLI and budget.py list runs without it

    model = spec.size(size).model
    try:
        default, variant = (expected_loss(spec.name, model, "pretrained", "cpu", spec.mask(a))
                            for a in (spec.default_attention, attention))
    except MissingExpectation:
        return True  # the run will say what is missing
    return abs(default.value - variant.value) > max(default.tolerance, variant.tolerance)


# ---------------------------------------------------------------------------------------------
# Layouts (harness/registry/layouts.py): every backend's tiny pretrained run in every layout
# that applies to its model, on the cpu and cuda tiers; the neuron tier runs the few below
# beside its full-size configurations (every tiny run there is a 15-minute limit in the
# night's budget, scripts/nightly/budget.py).
LAYOUT_DEVICES = ("cpu", "cuda", "neuron")
LAYOUT_BACKENDS = ("hf_v5", "titan_native", "nki_moe")
# The default tier's cheap form of each kind of layout, one launch each: TP and compile (of the
# loss) on the dense model, EP, full activation checkpointing (a recompute of the MoE's
# stateful forward) and no activation checkpointing (its reference) on the MoE. Gradient
# accumulation's cheap form is the SFT run under ga=2 (uneven valid labels per microbatch,
# tests/parity/test_layouts.py), not a pretraining layout run: packed rows hold no ignored
# label. Every other (backend, layout) runs in the slow tier; what each layout's cheap form
# reaches is the registry's (harness/registry/layouts.py ``CONDITIONS``).
DEFAULT_TIER_LAYOUTS = frozenset({("titan_native", "tp"), ("titan_native", "compile=loss"),
                                  ("nki_moe", "ep"), ("nki_moe", "ac=full"), ("nki_moe", "ac=none")})
# The neuron tier's tiny layouts: what only trn2 can tell, each held to the FSDP run on its own
# rows: torch.compile of the model and loss through the Neuron backend against eager (the
# device's compile backend, harness/device/devices.py), and torchtitan's EP all-to-all on the
# neuron process group against EP 1 (the expert kernels are the NKI ones there).
NEURON_LAYOUTS = frozenset({("titan_native", "compile"), ("nki_moe", "ep")})


@dataclass(frozen=True)
class LayoutCase:
    """One backend's tiny pretrained run in one layout, on one device tier."""

    device: str
    backend: str
    layout: str
    slow: bool = False

    @property
    def id(self) -> str:
        return f"{self.device}-{self.backend}-tiny-pretrained@{self.layout}"

    @property
    def layout_spec(self):
        return LAYOUTS[self.layout]

    @property
    def attention(self) -> str:
        """The attention the layout needs where the backend has it as a variant of its own (CP:
        native Qwen3's flex); else the backend's default (the transformers backend has one
        attention, whose kernel its generation chooses: flex on 0.3.0)."""
        spec = BACKENDS[self.backend]
        needed = self.layout_spec.attention
        return needed if needed in spec.attention else spec.default_attention

    @property
    def model_kind(self) -> str:
        return RunSpec(self.backend).model_kind

    def fsdp_case(self) -> RunCase:
        """The same run under FSDP (the template's tiny pretrained run)."""
        return RunCase(self.device, self.backend, "tiny", "pretrained", self.attention)

    def run_spec(self, steps: int, workarounds=()) -> RunSpec:
        return replace(self.fsdp_case().run_spec(steps, workarounds=workarounds), layout=self.layout)


def layout_cases(devices=LAYOUT_DEVICES) -> list[LayoutCase]:
    out = []
    for device in devices:
        for name in LAYOUT_BACKENDS:
            kind = RunSpec(name).model_kind
            for lay in LAYOUTS.values():
                if lay.name == FSDP or not lay.applies_to(kind) or lay.full_size:
                    continue
                if device == "neuron":
                    if (name, lay.name) in NEURON_LAYOUTS:
                        out.append(LayoutCase(device, name, lay.name))
                    continue
                slow = lay.slow or (name, lay.name) not in DEFAULT_TIER_LAYOUTS
                out.append(LayoutCase(device, name, lay.name, slow))
    return out


KIND_NAMES = {"dense": "dense", "moe": "MoE"}


def layout_table_markdown() -> str:
    """The README's layout table: layout x backend, each cell the tier that runs it (cpu and
    cuda; ``slow``: the slow tier) and the known issues recorded for that backend and layout
    (harness/registry/known_issues/), with the generations they apply to; tests/selftest/
    test_doc_links.py holds the README to it."""
    backends = list(BACKENDS)
    rows = ["| layout | ranks | " + " | ".join(f"`{b}`" for b in backends) + " |",
            "|---|---|" + "---|" * len(backends)]
    run = {(c.backend, c.layout): c for c in layout_cases(("cpu",))}
    run |= {(c.backend, c.layout): c for c in cases(("neuron",)) if c.layout != FSDP}
    on_neuron = {(c.backend, c.layout) for c in layout_cases(("neuron",))}
    for lay in LAYOUTS.values():
        cells = []
        full = lay.full_size
        for name in backends:
            case = run.get((name, lay.name))
            if lay.name == FSDP:
                cell = "the run template"
            elif case is None:
                kind = RunSpec(name).model_kind
                cells.append(f"n/a ({', '.join(KIND_NAMES[k] for k in lay.kinds)} only)"
                             if not lay.applies_to(kind) else
                             "n/a (a native Qwen3 recipe)" if full else "not run")
                continue
            elif full:
                cell = "neuron (nightly, full size; its CPU twin: slow)"
            else:
                cell = ("slow" if case.slow else "default") + (
                    "; neuron (nightly)" if (name, lay.name) in on_neuron else "")
            issues = [f"{i.name}{_generations(w)}" for i in known_issues.ISSUES for w in i.where
                      if (lay.name in w.layout and (not w.backend or name in w.backend))
                      or _stops_every_layout(w, name, *(("full", "neuron") if full else ()))]
            cells.append(cell + "".join(f"; known: `{text}`" for text in dict.fromkeys(issues)))
        rows.append(f"| `{lay.name}` | {lay.ranks} | " + " | ".join(cells) + " |")
    resumed: dict[tuple, dict[str, ReshardCase]] = {}
    for case in RESHARD_CASES:  # a training-state run's checkpoint, resumed elsewhere
        resumed.setdefault((case.name, case.ranks, case.layout), {})[case.backend] = case
    for (_, ranks, layout_name), by_backend in resumed.items():
        ranks = ranks or LAYOUTS[layout_name].ranks
        where = f"{ranks} rank{'s' * (ranks > 1)} (FSDP)" if layout_name == FSDP else f"`{layout_name}`"
        cells = []
        for name in backends:
            case = by_backend.get(name)
            if case is None:
                cells.append("not run")
                continue
            tier = "slow" if case.slow else "default"
            issues = [f"{i.name}{_generations(w)}" for i in known_issues.ISSUES for w in i.where
                      if w.check == "resume" and (not w.backend or name in w.backend)]
            cells.append(tier + "".join(f"; known: `{text}`" for text in dict.fromkeys(issues)))
        rows.append(f"| resumed from 2 ranks at {where} | {ranks} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _stops_every_layout(where, backend: str, size: str = "tiny", device: str = "cpu") -> bool:
    """A known issue that stops ``backend``'s pretrained run (of ``size`` on ``device``)
    whatever its layout."""
    return (where.check == "completed" and not where.layout and backend in where.backend
            and all(not values or wanted in values for values, wanted in (
                (where.size, size), (where.init, "pretrained"), (where.device, device))))


def _generations(where) -> str:
    return f" ({', '.join(where.generation)})" if where.generation else ""


# ---------------------------------------------------------------------------------------------
# Resharded resume (docs/layouts.md): the template's training-state run (2 ranks, FSDP, a full
# checkpoint after every step but the last) resumed from its step-``TRAINING_STATE_INTERVAL``
# checkpoint at another world size or layout.
def training_state_spec(backend: str, steps: int, workarounds=()) -> RunSpec:
    """``backend``'s CPU random-init run of the template as the training-state run is: a full
    checkpoint after every step but the last. For ``TRAINING_STATE_BACKEND`` it is the
    template's own run (one launch serves both); another backend's is a run of its own."""
    case = RunCase("cpu", backend, "tiny", "random", BACKENDS[backend].default_attention)
    if case.carries_training_state:
        return case.suite_spec(steps, workarounds=workarounds)
    spec = case.run_spec(TRAINING_STATE_STEPS, workarounds=workarounds)
    return replace(spec, overrides=(*spec.overrides, *TRAINING_STATE_OVERRIDES))


@dataclass(frozen=True)
class ReshardCase:
    """Where a backend's training-state run's checkpoint is resumed: ``ranks`` under FSDP, or
    a layout (harness/registry/layouts.py) at its own ranks."""

    name: str
    ranks: int | None = None  # FSDP over this many ranks; None: the layout's
    layout: str = "fsdp"
    slow: bool = False
    backend: str = TRAINING_STATE_BACKEND

    @property
    def id(self) -> str:
        own = "" if self.backend == TRAINING_STATE_BACKEND else f"{self.backend}-"
        return f"{own}2-to-{self.name}"


RESHARD_CASES = (
    # One rank: every tensor the saving run sharded is whole.
    ReshardCase("1", ranks=1, slow=True),
    # The default tier's cheap form, at the uneven world size: 2048 (vocab), 128 (hidden) and
    # 32 (experts) over 3 ranks leave FSDP a shorter last shard (harness/results/
    # training_state.py ``uneven_tensors``), the condition a reshard's lost row needs.
    ReshardCase("3", ranks=3),
    ReshardCase("4", ranks=4, slow=True),
    ReshardCase("tp", layout="tp", slow=True),  # FSDP to tensor parallel 2
    # The dense backends, each from a training-state run of its own, every case in the slow
    # tier (vocab 2048 and hidden 128 are uneven over 3 ranks there too).
    *(ReshardCase(name, ranks=ranks, layout=lay, slow=True, backend=backend)
      for backend in ("hf_v5", "titan_native")
      for name, ranks, lay in (("1", 1, "fsdp"), ("3", 3, "fsdp"), ("4", 4, "fsdp"), ("tp", None, "tp"))),
)
# The rank count of the default tier's planted run: the uneven one, where a row can be lost.
RESHARD_UNEVEN_RANKS = 3


def template_spec(backend: str, steps: int, workarounds=(), plants=()) -> RunSpec:
    """The run template's CPU tiny random-init run of ``backend`` (the same RunSpec as the
    template's: one launch serves its checks and the training-state ones), ``plants`` put in."""
    case = RunCase("cpu", backend, "tiny", "random", BACKENDS[backend].default_attention)
    spec = case.suite_spec(steps, workarounds=workarounds)
    return replace(spec, plants=tuple(plants)) if plants else spec
