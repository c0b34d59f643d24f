"""Every kind of check has a default-tier form (harness/registry/check_kinds.py): the rule, and the rule
failing when a kind loses its cheap form, when a named test moves tiers or vanishes, and when
a test module belongs to no kind."""

from __future__ import annotations

from dataclasses import replace

from harness.registry import check_kinds


def test_every_kind_has_a_default_tier_test():
    found = check_kinds.problems()
    assert not found, "\n".join(found)


def _without(name: str, **change):
    return tuple(replace(k, **change) if k.name == name else k for k in check_kinds.KINDS)


def test_a_kind_without_its_default_tier_test_fails():
    found = check_kinds.problems(_without("load_balancing", default=()))
    assert any("'load_balancing' has no default-tier test" in f for f in found), found


def test_a_slow_test_listed_as_the_cheap_form_fails():
    slow = check_kinds.kind("load_balancing").slow[0]
    found = check_kinds.problems(_without("load_balancing", default=(slow,)))
    assert any("listed in the default tier but is marked slow" in f for f in found), found


def test_a_missing_test_fails():
    found = check_kinds.problems(_without("data_path", default=(
        "tests/e2e/test_data_path.py::test_no_such_check",)))
    assert any("no such test function" in f for f in found), found


def test_a_test_module_of_no_kind_fails():
    kinds = tuple(replace(k, default=tuple(t for t in k.default if "test_ignored_labels" not in t),
                          slow=tuple(t for t in k.slow if "test_ignored_labels" not in t))
                  for k in check_kinds.KINDS)
    found = check_kinds.problems(kinds)
    assert any("test_ignored_labels.py: its tests belong to no check kind" in f for f in found), found
