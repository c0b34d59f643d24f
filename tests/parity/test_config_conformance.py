"""Config conformance: each native Qwen3 model the harness trains vs the config.json of the
checkpoint it is used with, field by field, read from the built model's modules.

Subjects: the backends' own configs (``<backend>.tiny()`` / ``.full()``, exactly what their
``--module`` gives torchtitan) and torchtitan's registered flavors vs the published configs
they correspond to. Known violations are data (harness/parity/known_config_violations.toml):
any other violation fails; each known one is a strict xfail naming its upstream defect.
"""

from __future__ import annotations

import pytest

from harness.backends import nki_moe, paths, titan_native
from harness.parity import compare, workarounds
from harness.parity.config_conformance import config_violations, known_violations
from harness.parity.defects import PARITY_DEFECTS
from harness.parity.spec import read_config_json

REFS = paths.FIXTURES / "reference_configs"
KNOWN = known_violations()
DEFECTS_BY_NAME = {d.name: d for d in PARITY_DEFECTS.values()}


def _flavor(name):
    def get():
        import torchtitan.models.qwen3 as qwen3

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


def known_fields(subject: str) -> dict[str, str]:
    """{violation field: defect name} known for ``subject``."""
    return {f: k["defect"] for k in KNOWN if k["subject"] == subject for f in k["fields"]}


_cache: dict = {}


def conformance(subject: str, applied=frozenset()):
    key = (subject, frozenset(applied))
    if key not in _cache:
        factory, hf_dir = SUBJECTS[subject]
        hf = read_config_json(hf_dir)
        config = factory()
        if "titan_4b_theta" in applied and known_fields(subject):
            config = workarounds.theta_from_hf(config, hf)
        _cache[key] = config_violations(config, hf, f"{subject} vs {hf_dir.name}/config.json")
    return _cache[key]


@pytest.mark.parametrize("subject", list(SUBJECTS))
def test_no_violation_beyond_the_known_defects(subject, parity_workarounds):
    report = conformance(subject, parity_workarounds)
    known = known_fields(subject)
    new = [v for v in report.violations if v.key not in known]
    assert not new, compare.parity_message(
        f"{len(new)} violation(s) not explained by a known defect:", *(f"  {v}" for v in new),
        report.format())


KNOWN_CASES = [(k["subject"], k["defect"]) for k in KNOWN]


@pytest.mark.parametrize("subject,defect_name", KNOWN_CASES, ids=[f"{s}-{d}" for s, d in KNOWN_CASES])
def test_known_defect_is_still_present(request, subject, defect_name, parity_workarounds):
    """Strict xfail naming the defect: passes (XPASS -> failure) once upstream is fixed."""
    defect = DEFECTS_BY_NAME[defect_name]
    if defect.workaround_shim not in parity_workarounds:
        request.applymarker(defect.xfail())
    report = conformance(subject, parity_workarounds)
    fields = {f for f, d in known_fields(subject).items() if d == defect_name}
    hits = [v for v in report.violations if v.key in fields]
    assert not hits, compare.parity_message(*(str(v) for v in hits), report.format())
