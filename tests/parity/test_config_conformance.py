"""Config conformance: each native Qwen3 model the harness trains vs the config.json of the
checkpoint it is used with, field by field, read from the built model's modules (and the
RoPE, attention scale and embedding tying exercised, not read).

Subjects: the backends' own configs (``<backend>.tiny()`` / ``.full()``, exactly what their
``--module`` gives torchtitan) and torchtitan's registered flavors vs the published configs
they correspond to. Known violations are entries of harness/registry/known_issues/ (check
``config_conformance``, selected by ``subject``; the signature names the violated fields):
a subject with no known issue fails on any violation; one with a known issue is an xfail
naming it only when the violated fields are exactly the recorded ones, and fails when they
differ or when it conforms (upstream fixed: delete the entry).
"""

from __future__ import annotations

import pytest
import torchtitan.models.qwen3 as qwen3

from harness.backends import nki_moe, titan_native
from harness.parity.conformance.config import config_violations, conformance_outcome
from harness.registry import known_issues, paths
from harness.registry.hf_config import read_config_json
from harness.upstream import workarounds as W

REFS = paths.FIXTURES / "reference_configs"
CHECK = "config_conformance"


def _flavor(name):
    def get():
        return qwen3.model_registry(name).model
    return get


SUBJECTS = {
    # subject: (native config factory, HF config dir)
    "backend:titan_native.tiny": (lambda: titan_native.tiny().model_spec.model, paths.TINY_DENSE),
    "backend:nki_moe.tiny": (lambda: nki_moe.tiny().model_spec.model, paths.TINY_MOE),
    "backend:nki_moe.full": (lambda: nki_moe.full().model_spec.model, REFS / "qwen3_30b_a3b_4l_64e_top4"),
    "backend:titan_native.full": (lambda: titan_native.full().model_spec.model, REFS / "Qwen3-4B-Instruct-2507"),
    "flavor:4B": (_flavor("4B"), REFS / "Qwen3-4B-Instruct-2507"),
    "flavor:30B-A3B": (_flavor("30B-A3B"), REFS / "Qwen3-30B-A3B"),
}

_cache: dict = {}


def conformance(subject: str, applied=()):
    key = (subject, frozenset(applied))
    if key not in _cache:
        factory, hf_dir = SUBJECTS[subject]
        hf = read_config_json(hf_dir)
        config = W.apply("titan_4b_theta", applied, factory(), hf) if "titan_4b_theta" in applied \
            else factory()
        _cache[key] = config_violations(config, hf, f"{subject} vs {hf_dir.name}/config.json")
    return _cache[key]


@pytest.mark.parametrize("subject", list(SUBJECTS))
def test_native_config_conforms_to_config_json(subject, workarounds):
    """Fails on any violation not covered by a known issue's recorded signature."""
    report = conformance(subject, workarounds)
    problem, observed = conformance_outcome(report)
    verdict = known_issues.judge(CHECK, problem, observed, workarounds, subject=subject)
    known_issues.settle(verdict, problem)
    assert problem is None, problem  # not a known issue: the config conforms


def test_every_known_config_issue_names_a_subject_checked_here():
    """A registry entry for this check whose subject is not checked here would never show."""
    stale = [f"{i.name}: {s}" for i in known_issues.ISSUES for w in i.where if w.check == CHECK
             for s in w.subject if s not in SUBJECTS]
    assert not stale, f"known issues for {CHECK!r} name subjects this suite does not check: {stale}"
