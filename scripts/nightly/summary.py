#!/usr/bin/env python3
"""Nightly step "Summary": the job summary from the junit XML, and a failure when nothing ran.

    PYTEST_EXIT=<the test step's exit-code output> python3 scripts/nightly/summary.py

Runs whatever happened before it (``always()``). Writes the counts (passed, failed, errors,
skipped, xfailed) and one line per test that did not pass to ``$GITHUB_STEP_SUMMARY`` (and to
stdout). Exits 1 when pytest collected nothing or refused its arguments (exit 4 or 5), when
there is no junit XML, or when the XML lists no test: a night that ran nothing is a failure,
whatever pytest's own exit said.
"""

from __future__ import annotations

import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

JUNIT = Path("reports/junit.xml")
COUNTS = ("passed", "failed", "error", "skipped", "xfailed")


def outcomes(root: ET.Element) -> tuple[dict[str, int], list[str]]:
    counts = dict.fromkeys(COUNTS, 0)
    rows = []
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        child = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
        if child is None:
            counts["passed"] += 1
            continue
        kind = child.tag
        if kind == "skipped" and child.get("type") == "pytest.xfail":
            kind = "xfailed"
        counts["failed" if kind == "failure" else kind] += 1
        if kind != "xfailed":
            message = (child.get("message") or child.text or "").strip()
            message = (message.splitlines()[0] if message else "").replace("|", "\\|")[:300]
            rows.append(f"| {kind} | `{name}` | {message} |")
    return counts, rows


def summary(root: ET.Element | None, why: str = "") -> str:
    out = ["## pytest -m neuron", ""]
    if root is None:
        out.append(f"No junit XML ({why}); see the pytest log artifact.")
    else:
        counts, rows = outcomes(root)
        out += ["| passed | failed | errors | skipped | xfailed |", "|---|---|---|---|---|",
                "| {passed} | {failed} | {error} | {skipped} | {xfailed} |".format(**counts), ""]
        if rows:
            out += ["| outcome | test | message |", "|---|---|---|", *rows, ""]
    out.append("Artifacts: junit XML, the reports folder (pytest log, environment, run report, run "
               "dirs) and every rank's logs.")
    return "\n".join(out) + "\n"


def main() -> int:
    code = os.environ.get("PYTEST_EXIT", "")
    try:
        root, why = ET.parse(JUNIT).getroot(), ""
    except (OSError, ET.ParseError) as error:
        root, why = None, str(error)
    text = summary(root, why)
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if target:
        with open(target, "a") as f:
            f.write(text)
    print(text)
    if code in ("4", "5"):
        print(f"::error::pytest -m neuron collected no test or rejected its arguments (exit {code})")
        return 1
    if root is None:
        print(f"::error::no junit XML from pytest ({why}); pytest exit code {code or 'unknown'}")
        return 1
    total = sum(int(s.get("tests", 0)) for s in root.iter("testsuite"))
    if total == 0:
        print("::error::pytest -m neuron ran no test (junit XML lists none)")
        return 1
    print(f"{total} test(s) ran")
    return 0


if __name__ == "__main__":
    sys.exit(main())
