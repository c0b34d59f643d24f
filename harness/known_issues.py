"""Every confirmed upstream defect the harness knows, as data: the one registry.

In the manner of PyTorch OpInfo's ``DecorateInfo``: each ``KnownIssue`` says exactly where it
applies (``Where``: which check, on which backend / size / init / device / attention /
kernel implementation / dtype / package versions), what exactly it does to that check (its
``Signature``: the sign and size of the deviation, the wrong value, the violated field), the
evidence, and its ``Workaround`` with both realisations (in the launched ranks, in-process).

How a check uses it (``judge``): when no issue applies, the check passes or fails as usual.
When one applies, the check must fail *exactly as recorded*: the observed quantity must lie
inside the signature. Then the verdict is ``known`` (an xfail naming the issue). Any other
failure (another sign, another size, a crash) is a failure, and a check that passes where the
issue should show is a failure too (upstream fixed it: delete the entry). An applied
workaround removes the issue from the expectation, and the check is held to its tolerance.

Planted defects for the harness's self-tests are a different thing and live in
``harness/plants.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import metadata
from typing import Any, Iterable

# ---------------------------------------------------------------------------------------------
# The mechanism
# ---------------------------------------------------------------------------------------------

WHERE_FIELDS = ("backend", "size", "init", "device", "attention", "generation", "subject",
                "op", "impl", "case", "dtype", "property")


@dataclass(frozen=True)
class Workaround:
    """How to make a known issue go away, in the ranks and in-process."""

    name: str
    what: str
    rank_shim: str | None = None  # harness/upstream/<name>.py, installed in each launched rank
    rank_overrides: tuple[str, ...] = ()  # torchtitan CLI overrides added to the launch
    in_process: str | None = None  # "module:function" the in-process suites apply


@dataclass(frozen=True)
class Where:
    """Where an issue applies. An empty selector matches anything; ``check`` is required.

    ``versions`` holds (package, PEP 440 specifier) pairs, e.g. ("transformers", ">=5.9").
    """

    check: str
    backend: tuple[str, ...] = ()
    size: tuple[str, ...] = ()
    init: tuple[str, ...] = ()
    device: tuple[str, ...] = ()
    attention: tuple[str, ...] = ()
    generation: tuple[str, ...] = ()  # torchtitan API generation (harness/titan_api)
    subject: tuple[str, ...] = ()  # a config or model under a conformance check
    op: tuple[str, ...] = ()
    impl: tuple[str, ...] = ()
    case: tuple[str, ...] = ()
    dtype: tuple[str, ...] = ()
    property: tuple[str, ...] = ()  # the one property of a kernel cell excused (e.g. "dtype:scores")
    versions: tuple[tuple[str, str], ...] = ()

    def matches(self, check: str, context: dict[str, str]) -> bool:
        if check != self.check:
            return False
        for name in WHERE_FIELDS:
            allowed = getattr(self, name)
            if allowed and context.get(name) not in allowed:
                return False
        return all(_version_matches(pkg, spec) for pkg, spec in self.versions)


@dataclass(frozen=True)
class Signature:
    """What the check observes when this issue, and nothing else, is at work.

    ``quantity`` names the observed value the check reports (e.g. "deviation" = observed minus
    expected loss). A numeric signature is a closed interval ``[low, high]`` (None: unbounded
    on that side, never both); ``equals`` is an exact value (a dtype name, a violated field).
    """

    quantity: str
    low: float | None = None
    high: float | None = None
    equals: Any = None

    def __post_init__(self) -> None:
        if self.equals is None and self.low is None and self.high is None:
            raise ValueError(f"signature of {self.quantity!r} bounds nothing")

    def matches(self, observed: Any) -> bool:
        if self.equals is not None:
            return observed == self.equals
        if not isinstance(observed, (int, float)) or not math.isfinite(observed):
            return False
        return ((self.low is None or observed >= self.low)
                and (self.high is None or observed <= self.high))

    def describe(self) -> str:
        if self.equals is not None:
            return f"{self.quantity} == {self.equals!r}"
        low = "-inf" if self.low is None else f"{self.low:+.4g}"
        high = "+inf" if self.high is None else f"{self.high:+.4g}"
        return f"{self.quantity} in [{low}, {high}]"


@dataclass(frozen=True)
class KnownIssue:
    name: str
    upstream: str  # the file/function upstream and the versions it was seen with
    summary: str
    evidence: str  # what was measured, with numbers
    where: tuple[Where, ...]
    signature: Signature
    workaround: Workaround | None = None

    def reason(self) -> str:
        text = f"[{self.name}] {self.upstream}: {self.summary} Evidence: {self.evidence}"
        if self.workaround:
            text += f" Workaround: --workaround {self.workaround.name} ({self.workaround.what})"
        return text


@dataclass(frozen=True)
class Verdict:
    status: str  # "pass", "fail" or "known"
    message: str = ""
    issues: tuple[KnownIssue, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status != "fail"


def _version_matches(package: str, specifier: str) -> bool:
    from packaging.specifiers import SpecifierSet

    version = installed_version(package)
    return version is not None and SpecifierSet(specifier).contains(version, prereleases=True)


@lru_cache(maxsize=None)
def installed_version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def applicable(check: str, workarounds: Iterable[str] = (), **context: str) -> list[KnownIssue]:
    """The issues expected to show in ``check`` here, less those whose workaround is applied."""
    unknown = set(context) - set(WHERE_FIELDS)
    if unknown:
        raise TypeError(f"unknown context field(s) {sorted(unknown)}; known: {WHERE_FIELDS}")
    applied = set(workarounds)
    return [issue for issue in ISSUES
            if any(w.matches(check, context) for w in issue.where)
            and not (issue.workaround and issue.workaround.name in applied)]


def judge(check: str, problem: str | None, observed: dict[str, Any] | None = None,
          workarounds: Iterable[str] = (), **context: str) -> Verdict:
    """The verdict of ``check`` given its own outcome (``problem``: None when it passed) and
    the quantities it observed, once the known issues that apply here are taken into account."""
    issues = tuple(applicable(check, workarounds, **context))
    if not issues:
        return Verdict("pass") if problem is None else Verdict("fail", problem)
    names = ", ".join(i.name for i in issues)
    if problem is None:
        return Verdict("fail", f"known issue(s) {names} should make {check!r} fail here "
                       f"({_where_text(context)}), but it passed: if upstream fixed it, delete the "
                       f"entry from harness/known_issues.py", issues)
    observed = observed or {}
    for issue in issues:
        value = observed.get(issue.signature.quantity)
        if not issue.signature.matches(value):
            return Verdict("fail", f"{check!r} failed, but not as known issue {issue.name} "
                           f"records ({issue.signature.describe()}; observed "
                           f"{issue.signature.quantity} = {value!r}): a different failure.\n"
                           f"{problem}", issues)
    return Verdict("known", f"known issue(s) {names}: {problem}", issues)


def enforce(check: str, problem: str | None, observed: dict[str, Any] | None = None,
            workarounds: Iterable[str] = (), **context: str) -> None:
    """``judge`` for pytest: fail on "fail", xfail naming the issue on "known"."""
    import pytest

    verdict = judge(check, problem, observed, workarounds, **context)
    if verdict.status == "fail":
        pytest.fail(verdict.message, pytrace=False)
    if verdict.status == "known":
        pytest.xfail(" | ".join(i.reason() for i in verdict.issues) + f" Observed: {problem}")


def _where_text(context: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in context.items() if v)


def workaround(name: str) -> Workaround:
    """The workaround called ``name``; an unknown name is an error listing the known ones."""
    if name not in WORKAROUNDS:
        raise ValueError(f"unknown workaround {name!r}; known: {sorted(WORKAROUNDS)} "
                         f"(harness/known_issues.py)")
    return WORKAROUNDS[name]


def issue(name: str) -> KnownIssue:
    for entry in ISSUES:
        if entry.name == name:
            return entry
    raise KeyError(f"no known issue {name!r}; known: {[i.name for i in ISSUES]}")


# ---------------------------------------------------------------------------------------------
# The workarounds
# ---------------------------------------------------------------------------------------------

HF_ROPE_INIT = Workaround(
    name="hf_rope_init",
    what="recompute every Qwen3RotaryEmbedding.inv_freq after HFTransformerModel.init_states",
    rank_shim="hf_rope_init",
    in_process="harness.upstream.hf_rope_init:recompute_inv_freq",
)
HF_BLOCK_CAUSAL = Workaround(
    name="hf_block_causal",
    what="attn_mask_type='block_causal' for the transformers backend (per-document mask, as "
         "native Qwen3 with flex attention)",
    rank_overrides=("--override.imports", "harness.parity.titan_overrides.hf_block_causal_mask"),
    in_process="harness.parity.titan_overrides:hf_block_causal_mask",
)
TITAN_4B_THETA = Workaround(
    name="titan_4b_theta",
    what="set every layer's RoPE theta from the checkpoint's config.json (5e6 for 2507)",
    in_process="harness.parity.workarounds:theta_from_hf",
)

# ---------------------------------------------------------------------------------------------
# The issues
# ---------------------------------------------------------------------------------------------

HF_V5_ROPE_INV_FREQ = KnownIssue(
    name="hf_v5-rope-inv-freq-uninitialised",
    upstream="torchtitan 0.3.0 transformers_modeling_backend/model.py "
             "HFTransformerModel.init_states, with transformers 5.9.0",
    summary="inv_freq is recomputed only for rotary modules with a `rope_init_fn` attribute; "
            "Qwen3RotaryEmbedding keeps rope_init_fn local, so after meta init + to_empty() "
            "RoPE runs on uninitialised memory.",
    evidence="tiny_dense pretrained step-1 loss 2.31-2.48 (varies run to run, NaN in 2 of 8 "
             "suite runs) vs recorded 1.2754; with the workaround 1.2754054 exactly. "
             "In-process: inv_freq after init_states differs from 1/theta^(2i/d).",
    where=(Where(check="rope_inv_freq", backend=("hf_v5",)),),
    signature=Signature(quantity="inv_freq_max_rel_error", low=1e-3),
    workaround=HF_ROPE_INIT,
)

HF_V5_TIED_EMBEDDING_INIT = KnownIssue(
    name="hf_v5-tied-embedding-init-scale",
    upstream="torchtitan 0.3.0 transformers_modeling_backend/model.py _init_weights_patched",
    summary="a tied embedding is initialised with the lm_head rule, trunc-normal std "
            "hidden^-0.5 (torchtitan's native Qwen3 uses 0.02). At small hidden sizes the "
            "input embedding then dominates the residual stream, so every position predicts "
            "its own input token: the random-init loss is far above ln V + s^2/2.",
    evidence="tiny_dense (hidden 128) random-init step-1 loss 11.86 vs ln V + 1/2 = 8.12 "
             "(+3.74); saved embedding std 0.0873 = 128^-0.5. At Qwen3-4B width (2560) the "
             "effect is gone: 12.4186 vs 12.4179.",
    where=(Where(check="first_step_loss", backend=("hf_v5",), init=("random",), size=("tiny",)),),
    signature=Signature(quantity="deviation", low=3.0, high=4.5),
)

HF_V5_CAUSAL_MASK = KnownIssue(
    name="hf_v5-causal-mask-across-documents",
    upstream="torchtitan 0.3.0 experiments/transformers_modeling_backend/__init__.py "
             "TitanModelConfig.attn_mask_type (default \"causal\")",
    summary="the transformers backend masks the packed row causally only, so tokens attend "
            "across document boundaries, while native Qwen3 with flex attention masks per "
            "document: compared with the flex (document-mask) native run, the two backends "
            "train different models on the same packed data.",
    evidence="tiny_dense pretrained, 2 ranks, step 1: hf_v5 1.2754054 (recorded causal loss) vs "
             "titan_native flex 1.1804091 (recorded document loss): +0.095; with the "
             "workaround hf_v5 equals titan_native flex bit for bit at step 1.",
    where=(Where(check="loss_vs_document_mask", backend=("hf_v5",)),),
    signature=Signature(quantity="deviation", low=0.05, high=0.15),
    workaround=HF_BLOCK_CAUSAL,
)

TITAN_4B_ROPE_THETA = KnownIssue(
    name="titan-4B-rope-theta-1e6",
    upstream="torchtitan 0.3.0 models/qwen3/__init__.py _4b(): CosSinRoPE.Config(theta=1e6)",
    summary="the native \"4B\" flavor hard-codes rope theta 1e6; Qwen3-4B-Instruct-2507's "
            "config.json says 5e6 and Qwen3StateDictAdapter never compares them, so 2507 "
            "weights load silently into a model that rotates q/k at the wrong frequencies.",
    evidence="config conformance vs fixtures/reference_configs/Qwen3-4B-Instruct-2507: "
             "rope_theta 1e6 vs 5e6 in 36/36 layers; the built RoPE's output is off by max "
             "rel 1.97 from RoPE at theta 5e6.",
    where=(Where(check="config_conformance", subject=("flavor:4B", "backend:titan_native.full")),),
    signature=Signature(quantity="violated_fields",
                        equals=("RoPE computation", "rope_theta (rope config)")),
    workaround=TITAN_4B_THETA,
)

ISSUES: tuple[KnownIssue, ...] = (
    HF_V5_ROPE_INV_FREQ,
    HF_V5_TIED_EMBEDDING_INIT,
    HF_V5_CAUSAL_MASK,
    TITAN_4B_ROPE_THETA,
)

WORKAROUNDS: dict[str, Workaround] = {
    i.workaround.name: i.workaround for i in ISSUES if i.workaround is not None
}
