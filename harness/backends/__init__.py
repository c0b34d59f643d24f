"""The three Qwen3 training backends, as torchtitan config functions.

Each module is a torchtitan ``--module``: ``torchrun -m torchtitan.train --module
harness.backends.<name> --config <tiny|full>``.

- ``hf_v5``: torchtitan's transformers (v5) modeling backend; the HF model, safetensors in/out.
- ``titan_native``: torchtitan's native Qwen3, weights through its HF state-dict adapter.
- ``nki_moe``: native Qwen3 MoE whose RoPE and expert MLP run as custom operators
  (NKI kernels on neuron, torch kernels elsewhere).
"""

BACKENDS = ("hf_v5", "titan_native", "nki_moe")
SIZES = ("tiny", "full")


# The trainer-config flags that take the HF assets dir on the command line. The transformers
# backend also builds its model class from ``hf_model``'s config.json.
ASSET_FLAGS = {"hf_v5": ("--hf_assets_path", "--hf_model")}
DEFAULT_ASSET_FLAGS = ("--hf_assets_path",)


def asset_flags(backend: str) -> tuple[str, ...]:
    return ASSET_FLAGS.get(backend, DEFAULT_ASSET_FLAGS)


def module_name(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    return f"{__name__}.{backend}"


def model_name(backend: str, size: str) -> str:
    """The model a backend's ``tiny``/``full`` config trains (the expectations' model key)."""
    module_name(backend)
    if size == "tiny":
        return "tiny_moe" if backend == "nki_moe" else "tiny_dense"
    return "qwen3_30b_a3b_4l_64e_top4" if backend == "nki_moe" else "Qwen3-4B-Instruct-2507"
