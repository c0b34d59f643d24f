"""The known-issue mechanism: what an entry of the registry is, how a check is judged against
the entries, and how a test ends on the verdict. The one home of ``Where``, ``Signature``,
``KnownIssue``, ``Workaround``, ``Verdict``, ``Registry`` (``applicable``, ``judge``,
``inherited``) and ``settle``; the entries themselves live beside it, grouped by what they
concern (harness/registry/known_issues/__init__.py assembles them).

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

How a test uses the verdict: ``settle``, the one idiom (any other way of excusing a known
issue under tests/ fails tests/selftest/test_checks_catch_defects.py):

    verdict = known_issues.judge(check, problem, observed, workarounds, **where)
    known_issues.settle(verdict, problem)

Planted defects for the harness's self-tests are a different thing and live in
``harness/plants``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from typing import Any

from packaging.specifiers import SpecifierSet

from harness.registry.generations import base_of

WHERE_FIELDS = ("backend", "size", "init", "device", "attention", "layout", "generation", "subject",
                "op", "impl", "case", "dtype", "property", "ranks", "collectives")
ENTRIES = "harness/registry/known_issues/"  # where the entries live, for the messages that send there


@dataclass(frozen=True)
class Workaround:
    """How to make a known issue go away, in the ranks and in-process."""

    name: str
    what: str
    rank_shim: str | None = None  # harness/upstream/<name>.py, installed in each launched rank
    rank_overrides: tuple[str, ...] = ()  # torchtitan CLI overrides added to the launch
    in_process: str | None = None  # "module:function" the in-process suites apply
    backends: tuple[str, ...] = ()  # the backends it changes (empty: any)
    masking: str | None = None  # the masking of packed rows it gives those backends' runs

    def applies_to(self, backend: str) -> bool:
        return not self.backends or backend in self.backends


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
    layout: tuple[str, ...] = ()  # harness/registry/layouts.py ("fsdp": the source's)
    generation: tuple[str, ...] = ()  # torchtitan API generation (harness/upstream/titan_api)
    subject: tuple[str, ...] = ()  # a config or model under a conformance check
    op: tuple[str, ...] = ()
    impl: tuple[str, ...] = ()
    case: tuple[str, ...] = ()
    dtype: tuple[str, ...] = ()
    property: tuple[str, ...] = ()  # the one property of a kernel cell excused (e.g. "dtype:scores")
    ranks: tuple[str, ...] = ()  # a run's world sizes, as text (a dimension that splits unevenly)
    # Whose refusals the ranks' process group obeys ("neuron": ProcessGroupNeuron's, on trn2 and
    # in its strict CPU stand-in; harness/device/neuron_collectives.py).
    collectives: tuple[str, ...] = ()
    versions: tuple[tuple[str, str], ...] = ()

    def matches(self, check: str, context: dict[str, str]) -> bool:
        if check != self.check:
            return False
        for name in WHERE_FIELDS:
            allowed = getattr(self, name)
            if allowed and context.get(name) not in allowed:
                return False
        return all(_version_matches(pkg, spec) for pkg, spec in self.versions)

    def inherited_by(self, check: str, context: dict[str, str]) -> bool:
        """Whether a fork (``context["generation"]``) inherits this from the generation it
        forks (harness/registry/generations.py ``FORK_OF``): it applies there, not to the fork itself."""
        base = base_of(context.get("generation") or "")
        return (base is not None and not self.matches(check, context)
                and self.matches(check, {**context, "generation": base}))


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
    contains: tuple[str, ...] = ()  # text observations: contains one of these

    def __post_init__(self) -> None:
        if self.equals is None and self.low is None and self.high is None and not self.contains:
            raise ValueError(f"signature of {self.quantity!r} bounds nothing")

    def matches(self, observed: Any) -> bool:
        if self.equals is not None:
            return observed == self.equals
        if self.contains:
            return isinstance(observed, str) and any(text in observed for text in self.contains)
        if not isinstance(observed, (int, float)) or not math.isfinite(observed):
            return False
        return ((self.low is None or observed >= self.low)
                and (self.high is None or observed <= self.high))

    def describe(self) -> str:
        if self.equals is not None:
            return f"{self.quantity} == {self.equals!r}"
        if self.contains:
            return f"{self.quantity} contains one of {list(self.contains)}"
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
    # Where one issue breaks several checks that observe different quantities: check -> its
    # signature (``signature`` is the default).
    signatures: tuple[tuple[str, Signature], ...] = ()

    def signature_for(self, check: str) -> Signature:
        return dict(self.signatures).get(check, self.signature)

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
    # On a fork: the generation whose known issues ``issues`` are (shown, or not shown: a pass).
    inherited_from: str | None = None

    @property
    def ok(self) -> bool:
        return self.status != "fail"


def _version_matches(package: str, specifier: str) -> bool:
    version = installed_version(package)
    return version is not None and SpecifierSet(specifier).contains(version, prereleases=True)


@cache
def installed_version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def inherited(issue: KnownIssue, check: str, context: dict[str, str]) -> bool:
    """Whether ``issue`` applies to ``check`` here only as a fork's inheritance from its base."""
    return (not any(w.matches(check, context) for w in issue.where)
            and any(w.inherited_by(check, context) for w in issue.where))


@dataclass(frozen=True)
class Registry:
    """The known issues, and the questions every check asks of them. Names are unique, among
    the issues and among their workarounds."""

    issues: tuple[KnownIssue, ...]

    def __post_init__(self) -> None:
        for kind, names in (("known issue", [i.name for i in self.issues]),
                            ("workaround", [w.name for w in self._distinct_workarounds()])):
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise ValueError(f"{kind} name(s) {twice} recorded twice in {ENTRIES}: "
                                 "give each entry its own name")

    def _distinct_workarounds(self) -> list[Workaround]:
        return list({id(i.workaround): i.workaround for i in self.issues if i.workaround}.values())

    @property
    def workarounds(self) -> dict[str, Workaround]:
        return {w.name: w for w in self._distinct_workarounds()}

    def applicable(self, check: str, workarounds: Iterable[str] = (), **context: str) -> list[KnownIssue]:
        """The issues expected to show in ``check`` here, less those whose workaround is applied:
        those recorded where it runs, and on a fork those of the generation it forks (``inherited``)."""
        unknown = set(context) - set(WHERE_FIELDS)
        if unknown:
            raise TypeError(f"unknown context field(s) {sorted(unknown)}; known: {WHERE_FIELDS}")
        applied = set(workarounds)
        return [issue for issue in self.issues
                if any(w.matches(check, context) or w.inherited_by(check, context) for w in issue.where)
                and not (issue.workaround and issue.workaround.name in applied)]

    def judge(self, check: str, problem: str | None, observed: dict[str, Any] | None = None,
              workarounds: Iterable[str] = (), **context: str) -> Verdict:
        """The verdict of ``check`` given its own outcome (``problem``: None when it passed) and
        the quantities it observed, once the known issues that apply here are taken into account."""
        issues = tuple(self.applicable(check, workarounds, **context))
        if not issues:
            return Verdict("pass") if problem is None else Verdict("fail", problem)
        names = ", ".join(i.name for i in issues)
        from_base = [i for i in issues if inherited(i, check, context)]
        base = base_of(context.get("generation") or "")
        if problem is None and len(from_base) == len(issues):
            return Verdict("pass", f"the fork ({context.get('generation')}) does not show known "
                           f"issue(s) {names} of {base}, which it inherits: {check!r} passes", issues,
                           inherited_from=base)
        if problem is None:
            return Verdict("fail", f"known issue(s) {names} should make {check!r} fail here "
                           f"({_where_text(context)}), but it passed: if upstream fixed it, delete the "
                           f"entry from {ENTRIES}", issues)
        observed = observed or {}
        for issue in issues:
            signature = issue.signature_for(check)
            value = observed.get(signature.quantity)
            if not signature.matches(value):
                return Verdict("fail", f"{check!r} failed, but not as known issue {issue.name} "
                               f"records ({signature.describe()}; observed "
                               f"{signature.quantity} = {value!r}): a different failure.\n"
                               f"{problem}", issues)
        kind = f"inherited from {base}: " if from_base else ""
        return Verdict("known", f"{kind}known issue(s) {names}: {problem}", issues,
                       inherited_from=base if from_base else None)

    def issue(self, name: str) -> KnownIssue:
        for entry in self.issues:
            if entry.name == name:
                return entry
        raise KeyError(f"no known issue {name!r}; known: {[i.name for i in self.issues]}")

    def workaround(self, name: str) -> Workaround:
        """The workaround called ``name``; an unknown name is an error listing the known ones."""
        known = self.workarounds
        if name not in known:
            raise ValueError(f"unknown workaround {name!r}; known: {sorted(known)} ({ENTRIES})")
        return known[name]


def _where_text(context: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in context.items() if v)


def settle(verdict: Verdict, problem: str | None, details: str = "") -> None:
    """The one way a test ends on a verdict: it goes on when the verdict is "pass", xfails
    naming the known issue(s) (and whether the fork inherits them) when it is "known", and
    fails with the verdict's message (then ``details``) when it is "fail". ``problem`` is
    what the check observed, shown in the xfail."""
    import pytest  # noqa: PLC0415  heavy: pytest; the registry loads without it (the CLI)

    if verdict.status == "known":
        kind = f"inherited from {verdict.inherited_from}: " if verdict.inherited_from else ""
        pytest.xfail(kind + " | ".join(sorted({i.reason() for i in verdict.issues}))
                     + f" Observed: {problem}")
    if verdict.status != "pass":
        pytest.fail("\n".join(filter(None, (verdict.message, details))), pytrace=False)
