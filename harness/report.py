"""The main job's report: a table on the console and a folder a person can read at a glance.

``write_report`` makes ``summary.md``, ``results.json``, ``loss_curves.png`` (every backend on
one plot) and ``junit.xml`` (one test case per check) from the runs and their verdicts.
"""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from harness.results import RunResult


@dataclass
class RunVerdict:
    run: RunResult
    expected_first_loss: float | None
    checks: dict[str, list[str]] = field(default_factory=dict)  # check name -> violations
    comparison: str = ""  # how the step-1 comparison is made (bitwise, banded, why)

    @property
    def ok(self) -> bool:
        return all(not problems for problems in self.checks.values())


def _fmt(value: float | None, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def _verdict_text(v: RunVerdict) -> str:
    if not v.ok:
        return "FAIL: " + "; ".join(k for k, p in v.checks.items() if p)
    xfails = [k.split("xfail: ", 1)[1].rstrip(")") for k in v.checks if "xfail: " in k]
    return f"xfail (known defect: {', '.join(xfails)})" if xfails else "ok"


def table_rows(verdicts: list[RunVerdict]) -> list[tuple[str, ...]]:
    header = ("run", "step-1 loss", "expected", "diff", "final loss", "tokens/s", "step s",
              "peak GiB", "verdict")
    rows = [header]
    for v in verdicts:
        steps = v.run.steps
        first = steps[0].loss if steps else None
        diff = (first - v.expected_first_loss
                if first is not None and v.expected_first_loss is not None else None)
        later = steps[1:] or steps
        rows.append((
            v.run.name, _fmt(first, 6), _fmt(v.expected_first_loss, 6),
            "n/a" if diff is None else f"{diff:+.2e}",
            _fmt(steps[-1].loss if steps else None),
            _fmt(sum(s.tokens_per_s for s in later) / len(later), 0) if later else "n/a",
            _fmt(sum(s.step_time_s for s in later) / len(later), 3) if later else "n/a",
            _fmt(max((s.peak_memory_gib for s in steps), default=None), 2),
            _verdict_text(v),
        ))
    return rows


def format_table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _markdown_table(rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    return "\n".join(lines)


def plot_losses(verdicts: list[RunVerdict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for v in verdicts:
        if v.run.steps:
            ax.plot([s.step for s in v.run.steps], v.run.losses, marker="o", label=v.run.name)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (global average)")
    ax.set_title("Loss curves per backend run")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_junit(verdicts: list[RunVerdict], path: Path) -> None:
    suite = ET.Element("testsuite", name="harness-run")
    failures = 0
    for v in verdicts:
        for check, problems in v.checks.items():
            case = ET.SubElement(suite, "testcase", classname=v.run.name, name=check,
                                 time=f"{v.run.duration_s:.1f}")
            if problems:
                failures += 1
                ET.SubElement(case, "failure", message=problems[0]).text = "\n".join(problems)
    suite.set("tests", str(sum(len(v.checks) for v in verdicts)))
    suite.set("failures", str(failures))
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)


def write_report(verdicts: list[RunVerdict], out: Path, header: dict[str, str]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    rows = table_rows(verdicts)
    plot_losses(verdicts, out / "loss_curves.png")
    write_junit(verdicts, out / "junit.xml")
    (out / "results.json").write_text(json.dumps({
        "header": header,
        "runs": [{**v.run.to_json(), "expected_first_loss": v.expected_first_loss,
                  "checks": v.checks, "comparison": v.comparison, "ok": v.ok} for v in verdicts],
    }, indent=2, default=str))
    lines = ["# Harness run", ""]
    lines += [f"- **{k}**: {val}" for k, val in header.items()]
    lines += ["", _markdown_table(rows), "", "![loss curves](loss_curves.png)", "", "## Checks", ""]
    for v in verdicts:
        for check, problems in v.checks.items():
            mark = "pass" if not problems else "FAIL"
            lines.append(f"- `{v.run.name}` {check}: {mark}" + (f" ({problems[0]})" if problems else ""))
        if v.comparison:
            lines.append(f"  - comparison: {v.comparison}")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    return out
