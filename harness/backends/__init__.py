"""The backend registry: one ``BackendSpec`` per training backend, in the manner of torchtitan's
``ModelSpec`` / ``model_registry``. Every run-level test, the CLI and the report are generated
from ``BACKENDS``; nothing else lists the backends.

Each entry owns its torchtitan ``--module`` (a module of config functions, launched as
``torchrun -m torchtitan.train --module <module> --config <size>[_<attention>]``), per size the
model it trains (the directory whose config.json it is built from, where pretrained weights
come from, its precision regime), the attention variants it offers, how the HF assets dir is
passed to it, and the workarounds every run of it gets.

Adding a backend: write its module of config functions, add one ``BackendSpec`` below.

Beside the entries: the datasets their configs name (``c4``: C4 from the Hub or a local copy;
``sft_config``: the SFT data path of the tiny native backend).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.registry import paths
from harness.registry.assets_twin import DENSE_ASSETS, MOE_ASSETS

# The HF assets dir of a full-size run (--assets-dir/<SizeSpec.assets>, harness/registry/assets_twin.py);
# "{assets}" in a SizeSpec path stands for it.
ASSETS_MODEL = DENSE_ASSETS
ASSETS = "{assets}"
SIZES = ("tiny", "full")
INITS = ("random", "pretrained")


@dataclass(frozen=True)
class SizeSpec:
    """What one size of a backend trains."""

    model: str  # the expectations' model key
    model_dir: str  # the dir whose config.json the model is built from ("{assets}" allowed)
    weights_dir: str | None  # pretrained weights; None: this size only starts from random init
    precision: str  # parity precision regime: "float32" or "bf16_experts"
    nproc: int | None = None  # ranks per run; None: every rank of the device's node
    # Full size: the assets folder under --assets-dir (its config.json, tokenizer, weights and
    # index are the run's), and the config dir it is derived from when absent (a model with no
    # download of its own: harness/registry/assets_twin.py full_size_assets_dir).
    assets: str | None = None
    derive_assets_from: str | None = None
    # Workarounds (harness/registry/known_issues/) every run of this size gets, where they change the
    # backend (``Workaround.backends``): a known defect of the model the size builds.
    workarounds: tuple[str, ...] = ()

    @property
    def inits(self) -> tuple[str, ...]:
        return INITS if self.weights_dir is not None else ("random",)

    def resolve(self, path: str | None, assets: str | Path | None) -> Path | None:
        if path is None:
            return None
        if ASSETS in path:
            if assets is None:
                raise ValueError(f"model {self.model!r} needs the HF assets dir (--assets-dir)")
            path = path.replace(ASSETS, str(assets))
        return Path(path)


@dataclass(frozen=True)
class BackendSpec:
    name: str
    module: str  # torchtitan --module
    summary: str
    sizes: dict[str, SizeSpec]
    # attention variant -> how it treats packed rows (the recorded loss that applies):
    # "row_causal" (causal over the row, RoPE at row positions: the row is one sequence),
    # "causal" (causal over the row, RoPE at per-document positions), "document" (causal
    # within each document, per-document positions). The first variant is the default (the
    # source's configuration); a non-default variant's config function is "<size>_<variant>".
    attention: dict[str, str]
    # Trainer-config flags that take the HF assets dir on the command line.
    asset_flags: tuple[str, ...] = ("--hf_assets_path",)
    # Workarounds (harness/registry/known_issues/) applied to every run: without them a known upstream
    # defect would hide every other defect of this backend.
    workarounds: tuple[str, ...] = ()
    # Flags its configs need under context parallelism (harness/launch/run.py ``layout_flags``).
    cp_flags: tuple[str, ...] = ()

    @property
    def default_attention(self) -> str:
        return next(iter(self.attention))

    def size(self, size: str) -> SizeSpec:
        if size not in self.sizes:
            raise ValueError(f"backend {self.name!r} has no size {size!r}; it has {list(self.sizes)}")
        return self.sizes[size]

    def mask(self, attention: str | None = None) -> str:
        return self.attention[attention or self.default_attention]

    def config_name(self, size: str, attention: str | None = None) -> str:
        self.size(size)
        attention = attention or self.default_attention
        if attention not in self.attention:
            raise ValueError(f"backend {self.name!r} has no attention variant {attention!r}; "
                             f"it has {list(self.attention)}")
        return size if attention == self.default_attention else f"{size}_{attention}"


_TINY = {"nproc": 2}
DENSE_TINY = SizeSpec("tiny_dense", str(paths.TINY_DENSE), str(paths.TINY_DENSE), "float32", **_TINY)
MOE_TINY = SizeSpec("tiny_moe", str(paths.TINY_MOE), str(paths.TINY_MOE), "bf16_experts", **_TINY)
# Native Qwen3's "4B" flavor hard-codes rope theta 1e6 against 2507's 5e6 (titan-4B-rope-theta-1e6):
# every full-size titan_native run takes config.json's theta, so its step 1 is held to the HF
# forward of the weights it loads; the defect stays checked by config conformance.
QWEN3_4B = SizeSpec(ASSETS_MODEL, ASSETS, ASSETS, "bfloat16", assets=DENSE_ASSETS,
                    workarounds=("titan_4b_theta",))
# Random init only, from its own assets dir: its config.json and Qwen3's tokenizer, no index
# (the 4B's index would be its HF save map, and the MoE's keys are not in it).
MOE_4L = SizeSpec("qwen3_30b_a3b_4l_64e_top4", ASSETS, None, "bfloat16", assets=MOE_ASSETS,
                  derive_assets_from=str(paths.FIXTURES / "reference_configs" / MOE_ASSETS))

# Native Qwen3's attention variants: "sdpa" (torch SDPA, causal over the row, row positions),
# as the source's configurations; "flex" (flex attention, per-document mask and positions).
NATIVE_ATTENTION = {"sdpa": "row_causal", "flex": "document"}

_REGISTERED = (
    BackendSpec(
        name="hf_v5",
        module="harness.backends.hf_v5",
        summary="torchtitan's transformers (v5) modeling backend: the HF model class, HF "
                "safetensors in and out",
        sizes={"tiny": DENSE_TINY, "full": QWEN3_4B},
        # The backend's default attn_mask_type "causal", with the dataloader's per-document
        # RoPE positions.
        attention={"causal": "causal"},
        asset_flags=("--hf_assets_path", "--hf_model"),
        workarounds=("hf_rope_init",),
        # Its trainer shards the flex BlockMask under CP only with the round-robin load
        # balancer, and refuses torchtitan's default "headtail" saying so (0.3.0
        # transformers_modeling_backend/trainer.py): users pass this.
        cp_flags=("--parallelism.context_parallel_load_balancer", "ptrr"),
    ),
    BackendSpec(
        name="titan_native",
        module="harness.backends.titan_native",
        summary="torchtitan's native Qwen3; weights through torchtitan's HF state-dict adapter",
        sizes={"tiny": DENSE_TINY, "full": QWEN3_4B},
        attention=NATIVE_ATTENTION,
    ),
    BackendSpec(
        name="nki_moe",
        module="harness.backends.nki_moe",
        summary="native Qwen3 MoE whose RoPE and expert MLP are custom operators: NKI kernels "
                "on neuron, torch kernels elsewhere",
        sizes={"tiny": MOE_TINY, "full": MOE_4L},
        attention=NATIVE_ATTENTION,
    ),
)

BACKENDS: dict[str, BackendSpec] = {spec.name: spec for spec in _REGISTERED}


def backend(name: str) -> BackendSpec:
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; registered: {list(BACKENDS)} "
                         f"(harness/backends/__init__.py)")
    return BACKENDS[name]


def register(spec: BackendSpec) -> BackendSpec:
    """Add a backend at run time (tests of the registry itself); returns it."""
    if spec.name in BACKENDS:
        raise ValueError(f"backend {spec.name!r} is already registered")
    BACKENDS[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    if name in {s.name for s in _REGISTERED}:
        raise ValueError(f"{name!r} is a built-in backend")
    BACKENDS.pop(name, None)
