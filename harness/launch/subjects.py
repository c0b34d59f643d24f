"""Any torchtitan config function as a subject: ``--module M --config C``.

A user's own config file (the source's walkthrough ends with a ``neuron_qwen3.py`` holding a
``v5_qwen3_4b()`` config function) is checked like the harness's built-in backends, which are
subjects too (``harness.backends.<name>:<config>``). What is checked is inferred from the
config, never typed by the user (``infer``): which model it trains (matched by parameter
count and shape against the known config.json files), whether it starts from HF weights
(its checkpoint settings), its precision regime, its attention masking, and which kind of
backend it is (the expectations' backend key). ``lint`` checks the config before any rank
starts: the model spec against the config.json it loads, the assets dir, parameter counts.
"""

from __future__ import annotations

import copy
import importlib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from harness.backends import BACKENDS
from harness.launch.preflight import PreflightError, check_run_inputs
from harness.registry import known_issues, paths
from harness.registry.hf_config import read_config_json
from harness.registry.layouts import DEGREES
from harness.upstream.versions import package_versions

# The models the harness knows (the expectations' model keys) and their config.json folders.
KNOWN_MODEL_DIRS = {
    "tiny_dense": paths.TINY_DENSE,
    "tiny_moe": paths.TINY_MOE,
    **{p.name: p for p in sorted((paths.FIXTURES / "reference_configs").iterdir()) if p.is_dir()},
}


class SubjectError(ValueError):
    pass


@dataclass(frozen=True)
class Subject:
    module: str
    config: str

    @classmethod
    def parse(cls, text: str) -> Subject:
        module, sep, config = text.partition(":")
        if not sep or not module or not config:
            raise SubjectError(f"{text!r} is not MODULE:CONFIG (e.g. neuron_qwen3:v5_qwen3_4b, "
                               f"the --module and --config of torchtitan.train)")
        return cls(module, config)

    @classmethod
    def of_backend(cls, backend: str, size: str = "tiny", attention: str | None = None) -> Subject:
        spec = BACKENDS[backend]
        return cls(spec.module, spec.config_name(size, attention))

    @property
    def name(self) -> str:
        return f"{self.module}:{self.config}"

    def load(self):
        """The ``Trainer.Config`` the function returns, exactly as torchtitan.train gets it.

        Imports the module first itself, so an ImportError inside it is shown as it is
        (torchtitan turns it into "config function not found")."""
        try:
            module = importlib.import_module(self.module)
        except ImportError as error:
            raise SubjectError(f"cannot import --module {self.module!r}: {error}. Is its folder "
                               f"on PYTHONPATH (run from that folder, or pass --pythonpath)?") from error
        function = getattr(module, self.config, None)
        if not callable(function):
            found = sorted(n for n, v in vars(module).items()
                           if callable(v) and not n.startswith("_") and getattr(v, "__module__", "") == module.__name__)
            raise SubjectError(f"{self.module} has no config function {self.config!r}; it defines {found}")
        return function()


@dataclass(frozen=True)
class Facts:
    """What the harness infers about a subject from its config."""

    module: str  # the subject: torchtitan --module and --config
    config: str
    kind: str  # the expectations' backend key: "hf_v5", "titan_native" or "nki_moe"
    model: str | None  # the expectations' model key; None: a model the harness does not know
    model_dir: Path | None  # the config.json the model is matched to
    assets_dir: Path  # hf_assets_path: tokenizer (and config.json)
    init: str  # "pretrained" (HF weights) or "random"
    weights_dir: Path | None
    precision: str  # training.mixed_precision_param
    attention: str  # "sdpa", "flex" or the transformers backend's attn_mask_type
    mask: str  # "row_causal", "causal" or "document" (harness/backends BackendSpec.attention)
    parameters: int
    notes: tuple[str, ...] = field(default_factory=tuple)
    # The parallel degrees its config sets ((name, degree) as torchtitan's ParallelismConfig
    # names them: harness/registry/layouts.py ``DEGREES``); the launcher passes none of its own.
    degrees: tuple[tuple[str, int], ...] = ()

    @property
    def size(self) -> str:
        return "tiny" if self.model in ("tiny_dense", "tiny_moe") else "full"

    @property
    def config_dir(self) -> Path:
        """The folder whose config.json its model is built from: the one it is matched to, else
        its weights' or its assets' (``RunSpec.model_dir`` of a subject's run)."""
        return self.model_dir or self.weights_dir or self.assets_dir

    def describe(self) -> str:
        return (f"{self.kind} backend, model {self.model or 'unknown'} ({self.parameters:,} "
                f"parameters), {self.init} init"
                + (f" from {self.weights_dir}" if self.weights_dir else "")
                + f", {self.precision} params, attention {self.attention} ({self.mask} masking), "
                f"assets {self.assets_dir}")


def _native_attention(model_config) -> str:
    inner = type(getattr(model_config.layers[0].attention, "inner_attention", None)).__qualname__
    if "ScaledDotProduct" in inner:
        return "sdpa"
    if "Flex" in inner:
        return "flex"
    if "Varlen" in inner:
        return "varlen"
    return inner


def _uses_custom_ops(model_config) -> bool:
    from harness.kernels.ops.modules import CustomOpCosSinRoPE  # noqa: PLC0415  heavy: torch; the launcher and prefetcher import this module without it

    return any(isinstance(layer.attention.rope, CustomOpCosSinRoPE.Config) for layer in model_config.layers)


def _meta_parameters(config) -> int:
    """Parameters of the model the trainer builds from ``config`` (harness/model/build.py)."""
    from harness.model.build import on_meta  # noqa: PLC0415  heavy: torch; the launcher and prefetcher import this module without it

    return sum(p.numel() for p in on_meta(copy.deepcopy(config)).parameters())


@cache
def hf_parameters(model_dir: Path) -> int:
    """Parameters of the HF model a config.json describes (meta device: no memory)."""
    import torch  # noqa: PLC0415  heavy: torch; the launcher and prefetcher import this module without it
    from transformers import AutoConfig, AutoModelForCausalLM  # noqa: PLC0415  heavy: torch; the launcher and prefetcher import this module without it

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return sum(p.numel() for p in model.parameters())


def _config_shape(model_dir: Path) -> tuple:
    hf = read_config_json(model_dir)
    return (hf["vocab_size"], hf["hidden_size"], hf["num_hidden_layers"])


def _matches(directory: Path | None, shape: tuple, parameters: int) -> bool:
    return (directory is not None and (directory / "config.json").is_file()
            and _config_shape(directory) == shape and hf_parameters(directory) == parameters)


def is_transformers_backend(config) -> bool:
    """harness/model/build.py's, imported where a subject is read: the launcher imports this
    module, and a process that only launches (the prefetcher) has no use for torch."""
    from harness.model import build  # noqa: PLC0415  heavy: torch; the launcher and prefetcher import this module without it

    return build.is_transformers_backend(config)


def _match_model(config, parameters: int, own_dirs: list[Path]) -> tuple[str | None, Path | None]:
    """(model key, config.json folder) of the model: the folder is the subject's own weights or
    assets dir when its config.json describes the model, else a known one; the key is the known
    model of the same shape and size (so any copy of Qwen3-4B-Instruct-2507 gets its key)."""
    if is_transformers_backend(config):
        shape = _config_shape(Path(config.hf_model))
    else:
        model = config.model_spec.model
        shape = (model.vocab_size, model.dim, len(model.layers))
    known = next((name for name, d in KNOWN_MODEL_DIRS.items() if _matches(d, shape, parameters)), None)
    own = next((d for d in own_dirs if _matches(d, shape, parameters)), None)
    if own is None and known is not None:
        own = KNOWN_MODEL_DIRS[known]
    return (known or (own.name if own else None)), own


def infer(subject: Subject, config=None) -> Facts:
    config = config if config is not None else subject.load()
    checkpoint = config.checkpoint
    pretrained = bool(checkpoint.enable and checkpoint.initial_load_in_hf and checkpoint.initial_load_path)
    weights = Path(checkpoint.initial_load_path) if pretrained else None
    assets = Path(config.hf_assets_path)
    notes = []
    if is_transformers_backend(config):
        kind = "hf_v5"
        mask_type = getattr(config.model_spec.model, "attn_mask_type", "causal")
        attention, mask = mask_type, {"causal": "causal", "block_causal": "document"}.get(mask_type, mask_type)
    else:
        model_config = config.model_spec.model
        moe = any(getattr(layer, "moe", None) is not None for layer in model_config.layers)
        kind = "nki_moe" if moe and _uses_custom_ops(model_config) else "titan_native"
        attention = _native_attention(model_config)
        mask = BACKENDS["titan_native"].attention.get(attention, attention)
    parameters = _meta_parameters(config)
    model, model_dir = _match_model(config, parameters, [d for d in (weights, assets) if d])
    if model is None:
        notes.append(f"the model ({parameters:,} parameters) matches no config.json the harness "
                     f"knows ({', '.join(KNOWN_MODEL_DIRS)}) nor {assets}/config.json")
    return Facts(module=subject.module, config=subject.config, kind=kind, model=model, model_dir=model_dir,
                 assets_dir=assets,
                 init="pretrained" if pretrained else "random", weights_dir=weights,
                 precision=config.training.mixed_precision_param, attention=attention, mask=mask,
                 parameters=parameters, notes=tuple(notes),
                 degrees=tuple((name, getattr(config.parallelism, name)) for name in DEGREES))


@dataclass
class LintReport:
    subject: str
    facts: Facts | None = None
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def format(self) -> str:
        lines = [f"lint {self.subject}: " + ("ok" if self.ok else f"{len(self.violations)} violation(s)")]
        if self.facts:
            lines.append(f"  inferred: {self.facts.describe()}")
        lines += [f"  VIOLATION: {v}" for v in self.violations]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def lint(subject: Subject) -> LintReport:
    """Everything that can be checked about a config before any rank starts (seconds, CPU,
    meta device): the model spec against the config.json it loads, the assets dir, the
    parameter count, and what it will run with (attention, torchtitan)."""
    report = LintReport(subject.name)
    try:
        config = subject.load()
        facts = infer(subject, config)
    except SubjectError as error:
        report.violations.append(str(error))
        return report
    report.facts = facts
    versions = package_versions()
    report.notes.append(f"torchtitan {versions.get('torchtitan')} ({versions.get('torchtitan-generation')} "
                        f"API generation), transformers {versions.get('transformers')}, torch {versions.get('torch')}")
    report.notes.append(f"attention {facts.attention}: {facts.mask} masking of packed rows"
                        + (" (flex attention is always torch.compile'd with Inductor, which the "
                           "Neuron backend does not have)" if facts.attention == "flex" else ""))
    report.notes.extend(facts.notes)
    # The config.json the weights come with (pretrained) or the assets dir's.
    reference = facts.weights_dir or facts.assets_dir
    try:
        check_run_inputs(facts.config_dir, facts.assets_dir, facts.weights_dir)
    except (PreflightError, FileNotFoundError) as error:
        report.violations.append(f"inputs: {error}")
        return report
    hf_json = Path(reference) / "config.json"
    if not hf_json.is_file():
        report.notes.append(f"{reference} has no config.json: nothing to lint the model against")
        return report
    if (facts.init == "random" and facts.model_dir is not None
            and facts.model_dir.resolve() != Path(reference).resolve()):
        report.notes.append(f"random init: the model is {facts.model} ({facts.model_dir}/config.json); "
                            f"{hf_json} only supplies the tokenizer")
        hf_json = facts.model_dir / "config.json"
    expected = hf_parameters(hf_json.parent)
    if expected != facts.parameters:
        report.violations.append(f"parameters: the model has {facts.parameters:,}, the HF model of "
                                 f"{hf_json} has {expected:,}")
    if facts.kind == "hf_v5":
        if Path(config.hf_model).resolve() != hf_json.parent.resolve():
            report.notes.append(f"the HF model class is built from {config.hf_model}/config.json, "
                                f"the weights come with {hf_json}")
        return report
    from harness.parity.conformance.config import config_violations  # noqa: PLC0415  heavy: torch; the launcher and prefetcher import this module without it

    conformance = config_violations(config.model_spec.model, read_config_json(hf_json.parent), subject.name)
    fields = {v.key for v in conformance.violations}
    issues = [i for i in known_issues.ISSUES if i.signature.quantity == "violated_fields"
              and i.signature.equals == tuple(sorted(fields))]
    for violation in conformance.violations:
        report.violations.append(f"{violation.key}: {violation.detail} (model spec of {subject.name} "
                                 f"vs {hf_json})")
    for issue in issues:
        report.notes.append(f"the same fields as known upstream defect {issue.name} (is this "
                            f"config built on that flavor?): {issue.summary}"
                            + (f" Workaround: {issue.workaround.what}" if issue.workaround else ""))
    return report
