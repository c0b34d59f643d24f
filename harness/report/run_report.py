"""The main job's report: a table on the console and a folder a person can read at a glance.

``write_report`` makes ``summary.md``, ``results.json``, ``loss_curves.png`` (every backend on
one plot) and ``junit.xml`` (one test case per check, one per compared pair) from the runs and
their verdicts, and the pairs of runs that should agree (harness/report/equivalence.py).
"""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from harness.checks.run_checks import Outcome
from harness.registry.known_issues import Verdict
from harness.report import equivalence
from harness.report.baseline import run_key
from harness.results.run_result import RunResult


@dataclass
class RunVerdict:
    """A run and the verdict of each of its checks (harness/checks/run_checks.py)."""

    run: RunResult
    checks: dict[str, tuple[Verdict, Outcome]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(verdict.ok for verdict, _ in self.checks.values())

    @property
    def expected_first_loss(self) -> float | None:
        _, outcome = self.checks.get("first_step_loss", (None, Outcome(None)))
        return outcome.observed.get("expected")

    def known_issues(self) -> list[str]:
        return sorted({i.name for verdict, _ in self.checks.values()
                       if verdict.status == "known" for i in verdict.issues})


def _fmt(value: float | None, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def _verdict_text(v: RunVerdict) -> str:
    if not v.checks:
        return "not checked in this session"
    if not v.ok:
        return "FAIL: " + "; ".join(k for k, (verdict, _) in v.checks.items() if not verdict.ok)
    known = v.known_issues()
    inherited = sorted({verdict.inherited_from for verdict, _ in v.checks.values()
                        if verdict.status == "known" and verdict.inherited_from})
    kind = f"inherited from {', '.join(inherited)}: " if inherited else ""
    return f"xfail ({kind}known issue: {', '.join(known)})" if known else "ok"


def table_rows(verdicts: list[RunVerdict], baseline=None) -> list[tuple[str, ...]]:
    """``baseline``: a harness.report.baseline.BaselineReport (adds "vs baseline")."""
    header = ("run", "step-1 loss", "expected", "diff", "final loss", "tokens/s", "step s",
              "peak GiB", "verdict") + (("vs baseline",) if baseline is not None else ())
    rows = [header]
    for v in verdicts:
        steps = v.run.steps
        first = steps[0].loss if steps else None
        diff = (first - v.expected_first_loss
                if first is not None and v.expected_first_loss is not None else None)
        later = steps[1:] or steps
        rows.append((
            v.run.spec.name, _fmt(first, 6), _fmt(v.expected_first_loss, 6),
            "n/a" if diff is None else f"{diff:+.2e}",
            _fmt(steps[-1].loss if steps else None),
            _fmt(sum(s.tokens_per_s for s in later) / len(later), 0) if later else "n/a",
            _fmt(sum(s.step_time_s for s in later) / len(later), 3) if later else "n/a",
            _fmt(max((s.peak_memory_gib for s in steps), default=None), 2),
            _verdict_text(v),
        ) + ((baseline.runs[v.run.spec.name].cell() if v.run.spec.name in baseline.runs else "n/a",)
             if baseline is not None else ()))
    return rows


def format_table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def _markdown_table(rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(r) + " |" for r in rows[1:]]
    return "\n".join(lines)


def plot_losses(verdicts: list[RunVerdict], path: Path, baseline: dict | None = None) -> None:
    """Every run's loss curve; with ``baseline`` (its results.json), the baseline's curve of
    the same run beside it, dashed, in the same colour."""
    import matplotlib  # noqa: PLC0415  heavy: matplotlib, for the plots alone

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415  order: after matplotlib.use selects Agg

    fig, ax = plt.subplots(figsize=(8, 4.5))

    before = {run_key(r["name"]): r for r in (baseline or {}).get("runs", [])}
    for v in verdicts:
        if v.run.steps:
            line, = ax.plot([s.step for s in v.run.steps], v.run.losses, marker="o",
                            label=v.run.spec.name)
            old = before.get(run_key(v.run.spec.name), {}).get("steps")
            if old:
                ax.plot([s["step"] for s in old], [s["loss"] for s in old], linestyle="--",
                        color=line.get_color(), alpha=0.7, label=f"{v.run.spec.name} (baseline)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (global average)")
    ax.set_title("Loss curves per backend run")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_junit(verdicts: list[RunVerdict], path: Path, baseline=None, pairs=()) -> None:
    suite = ET.Element("testsuite", name="harness-run")
    failures = 0
    tests = 0
    for pair in pairs:  # the equivalence section's compared pairs
        if pair.status in ("not comparable", "not compared"):
            continue
        tests += 1
        case = ET.SubElement(suite, "testcase", classname=f"{pair.run} vs {pair.reference}",
                             name="equivalence", time="0")
        if not pair.ok:
            failures += 1
            ET.SubElement(case, "failure", message=pair.line()).text = pair.message
        elif pair.status == "known difference":
            ET.SubElement(case, "skipped", type="pytest.xfail", message=pair.message)
    if baseline is not None:
        for v in verdicts:
            c = baseline.runs.get(v.run.spec.name)
            if c is None:
                continue
            tests += 1
            case = ET.SubElement(suite, "testcase", classname=v.run.spec.name, name="vs_baseline", time="0")
            if c.flags:
                failures += 1
                text = "\n".join(f.text() for f in c.flags) + (
                    f"\nfirst divergent module: {c.module}" if c.module else "")
                ET.SubElement(case, "failure", message=c.cell()).text = text
    for v in verdicts:
        for check, (verdict, _) in v.checks.items():
            case = ET.SubElement(suite, "testcase", classname=v.run.spec.name, name=check,
                                 time=f"{v.run.duration_s:.1f}")
            if verdict.status == "fail":
                failures += 1
                ET.SubElement(case, "failure", message=verdict.message.splitlines()[0]).text = verdict.message
            elif verdict.status == "known":
                ET.SubElement(case, "skipped", type="pytest.xfail", message=verdict.message)
    suite.set("tests", str(tests + sum(len(v.checks) for v in verdicts)))
    suite.set("failures", str(failures))
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)


def write_report(verdicts: list[RunVerdict], out: Path, header: dict[str, str],
                 compared=None, baseline: dict | None = None) -> Path:
    """The report folder. ``compared``: the comparison with a previous report
    (harness.report.baseline.compare of ``results_document`` and ``baseline``, that
    report's results.json): a "vs baseline" column, section, junit case and dashed curves."""
    out.mkdir(parents=True, exist_ok=True)
    document = results_document(verdicts, header)
    if compared is not None:
        document["baseline"] = compared.to_json()
    rows = table_rows(verdicts, compared)
    pairs = equivalence.pairs([v.run for v in verdicts])
    plot_losses(verdicts, out / "loss_curves.png", baseline)
    write_junit(verdicts, out / "junit.xml", compared, pairs)
    (out / "results.json").write_text(json.dumps(document, indent=2, default=str))
    _write_summary(verdicts, out, header, rows, compared, pairs)
    return out


def results_document(verdicts: list[RunVerdict], header: dict[str, str]) -> dict:
    """What results.json holds (plain JSON values): the header, every run with its checks, and
    ``equivalence``: every pair of runs that should agree (harness/report/equivalence.py)."""
    return json.loads(json.dumps(_results(verdicts, header), default=str))


def _results(verdicts: list[RunVerdict], header: dict[str, str]) -> dict:
    return {
        "header": header,
        "equivalence": [p.to_json() for p in equivalence.pairs([v.run for v in verdicts])],
        "runs": [{**v.run.to_json(), "expected_first_loss": v.expected_first_loss, "ok": v.ok,
                  "checks": {name: {"status": verdict.status, "message": verdict.message,
                                    "known_issues": [i.name for i in verdict.issues],
                                    "inherited_from": verdict.inherited_from,
                                    "observed": outcome.observed, "how": outcome.how}
                             for name, (verdict, outcome) in v.checks.items()}}
                 for v in verdicts],
    }


def _write_summary(verdicts, out: Path, header, rows, compared, pairs) -> None:
    lines = ["# Harness run", ""]
    lines += [f"- **{k}**: {val}" for k, val in header.items()]
    lines += ["", _markdown_table(rows), "", "![loss curves](loss_curves.png)", ""]
    lines += ["## Equivalence", "", *equivalence.lines(pairs), ""]
    if compared is not None:
        lines += ["## vs baseline", "", *compared.lines(), ""]
    lines += ["## Checks", ""]
    for v in verdicts:
        for check, (verdict, outcome) in v.checks.items():
            mark = {"pass": "pass", "fail": "FAIL", "known": "xfail"}[verdict.status]
            detail = f" ({verdict.message.splitlines()[0]})" if verdict.message else ""
            lines.append(f"- `{v.run.spec.name}` {check}: {mark}{detail}")
            if outcome.how:
                lines.append(f"  - how: {outcome.how}")
            for line in (outcome.observed.get("diagnosis") or {}).get("lines", ()):
                lines.append(f"  - {line}")
    (out / "summary.md").write_text("\n".join(lines) + "\n")
