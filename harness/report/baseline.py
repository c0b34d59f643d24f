"""Tonight against last night: every run compared with the same run of a baseline report.

``compare(tonight, baseline)`` takes two ``results.json`` documents (harness/report/run_report.py) and,
per run (matched by name, a self-test's ``+plant:`` suffix aside), flags:

- step-1 loss not exactly the baseline's; the loss and grad-norm curves' first divergent step
  (exact: seeded reruns are bitwise identical);
- step time, compile time (step 1) and peak memory above the ratio thresholds of
  harness/registry/tolerances.py (``BASELINE_THRESHOLDS``);
- a run present in one report only.

A numeric change with the same code commit and the same package versions in both headers is
flagged as such: that is how a silent image update shows. The first divergent module of a
failing run (its diagnosis) is named beside its flags.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

NUMERIC = ("step-1 loss", "loss curve", "grad-norm curve")


class BaselineError(ValueError):
    pass


def load(path: str | Path) -> dict:
    """A report folder (its results.json) or a results.json file."""
    path = Path(path)
    file = path / "results.json" if path.is_dir() else path
    if not file.is_file():
        raise BaselineError(f"--baseline {path}: no results.json there; pass a report folder "
                            f"(python -m harness run --output-dir) or its results.json")
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as error:
        raise BaselineError(f"--baseline {file}: not JSON ({error})") from None
    if not isinstance(data, dict) or "runs" not in data:
        raise BaselineError(f"--baseline {file}: not a harness results.json (no 'runs')")
    return data


def run_key(name: str) -> str:
    return re.sub(r"\+plant:[A-Za-z0-9_]+", "", name)


@dataclass
class Flag:
    what: str  # "step-1 loss", "loss curve", "grad-norm curve", "step time", ...
    step: int | None
    detail: str

    def text(self) -> str:
        return f"{self.what}" + (f" (step {self.step})" if self.step else "") + f": {self.detail}"


@dataclass
class RunComparison:
    name: str
    flags: list[Flag] = field(default_factory=list)
    module: str | None = None  # tonight's first divergent module, when a check was diagnosed
    ratios: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what was not compared, and why

    @property
    def numeric_change(self) -> bool:
        return any(f.what in NUMERIC for f in self.flags)

    def cell(self) -> str:
        """The summary table's "vs baseline" column."""
        if not self.flags:
            return "same"
        first = self.flags[0]
        text = first.what + (f" @ step {first.step}" if first.step else "")
        more = f" (+{len(self.flags) - 1})" if len(self.flags) > 1 else ""
        return text + more + (f"; at {self.module}" if self.module else "")

    def to_json(self) -> dict:
        return {"name": self.name, "flags": [f.__dict__ | {"text": f.text()} for f in self.flags],
                "module": self.module, "ratios": self.ratios, "notes": self.notes,
                "cell": self.cell()}


@dataclass
class BaselineReport:
    source: str
    runs: dict[str, RunComparison]
    unchanged_code: bool  # same commit and package versions in both reports
    header_changes: list[str]
    missing: list[str]  # baseline runs tonight did not run

    @property
    def flagged(self) -> list[RunComparison]:
        return [c for c in self.runs.values() if c.flags]

    @property
    def ok(self) -> bool:
        return not self.flagged and not self.missing

    @property
    def silent_change(self) -> bool:
        return self.unchanged_code and any(c.numeric_change for c in self.runs.values())

    def lines(self) -> list[str]:
        out = [f"baseline: {self.source}"]
        out.append("code and versions: " + ("unchanged" if self.unchanged_code else
                                            "; ".join(self.header_changes)))
        if self.silent_change:
            out.append("NUMERIC CHANGE WITH NO CODE OR VERSION CHANGE: same commit and package "
                       "versions as the baseline, different numbers (a silent image update?)")
        for c in self.flagged:
            for f in c.flags:
                out.append(f"- `{c.name}` {f.text()}" + (f"; first divergent module {c.module}"
                                                          if c.module and f.what in NUMERIC else ""))
        out += [f"- `{c.name}`: {note}" for c in self.runs.values() for note in c.notes]
        out += [f"- `{name}`: in the baseline, not run tonight" for name in self.missing]
        if self.ok:
            out.append("nothing flagged")
        return out

    def to_json(self) -> dict:
        return {"source": self.source, "ok": self.ok, "unchanged_code": self.unchanged_code,
                "silent_change": self.silent_change, "header_changes": self.header_changes,
                "missing": self.missing, "runs": {k: c.to_json() for k, c in self.runs.items()}}


def _first_difference(a: list[float], b: list[float]) -> int | None:
    for i in range(max(len(a), len(b))):
        if i >= len(a) or i >= len(b) or not _same(a[i], b[i]):
            return i + 1
    return None


def _same(x, y) -> bool:
    return x == y or (isinstance(x, float) and isinstance(y, float) and x != x and y != y)


def _diagnosed_module(run: dict) -> str | None:
    for check in run.get("checks", {}).values():
        module = ((check.get("observed") or {}).get("diagnosis") or {}).get("module")
        if module:
            return module
    return None


def compare_run(name: str, tonight: dict, base: dict) -> RunComparison:
    from harness.registry.tolerances import BASELINE_THRESHOLDS  # noqa: PLC0415  heavy: torch; the pytest plugin imports this module

    c = RunComparison(name, module=_diagnosed_module(tonight))
    t_steps, b_steps = tonight.get("steps", []), base.get("steps", [])
    if t_steps and b_steps and not _same(t_steps[0]["loss"], b_steps[0]["loss"]):
        t, b = t_steps[0]["loss"], b_steps[0]["loss"]
        c.flags.append(Flag("step-1 loss", 1, f"{t!r} vs baseline {b!r} ({t - b:+.3e})"))
    for what, key in (("loss curve", "loss"), ("grad-norm curve", "grad_norm")):
        a, b = [s[key] for s in t_steps], [s[key] for s in b_steps]
        step = _first_difference(a, b)
        if step is not None and not (what == "loss curve" and step == 1 and c.flags):
            i = step - 1
            detail = (f"{a[i]!r} vs baseline {b[i]!r}" if i < len(a) and i < len(b)
                      else f"{len(a)} steps vs baseline {len(b)}")
            c.flags.append(Flag(what, step, "first divergent step; " + detail))
    measures = {
        "compile_time": lambda s: s[0]["step_time_s"] if s else None,
        "step_time": lambda s: statistics.median(x["step_time_s"] for x in s[1:]) if len(s) > 1 else None,
        "peak_memory": lambda s: max((x["peak_memory_gib"] for x in s), default=None),
    }
    cache_note = _compile_cache_difference(tonight.get("compile_cache"), base.get("compile_cache"))
    if cache_note:
        c.notes.append(f"compile time not compared: {cache_note}")
    for what, measure in measures.items():
        t, b = measure(t_steps), measure(b_steps)
        if not t or not b or (what == "compile_time" and cache_note):
            continue
        ratio = t / b
        c.ratios[what] = round(ratio, 3)
        threshold = BASELINE_THRESHOLDS[what]
        if ratio > threshold.max_ratio:
            c.flags.append(Flag(what.replace("_", " "), None,
                                f"{t:.3g} vs baseline {b:.3g}: x{ratio:.2f} > x{threshold.max_ratio:g} "
                                f"({threshold.why})"))
    return c


def _compile_cache_difference(tonight: dict | None, base: dict | None) -> str | None:
    """Why step 1's time cannot be compared: one night compiled its graphs (a cold cache: the
    first night, a new compiler, an evicted cache) and the other found them compiled. Runs in
    the same state (or on a device with no cache) compare as usual."""
    states = [(d or {}).get("state") for d in (tonight, base)]
    if states[0] == states[1]:
        return None
    def said(doc):
        doc = doc or {}
        return (f"{doc.get('state', 'unknown')} ({doc.get('new_entries', '?')} new cache entries)"
                if doc else "unknown")
    return f"tonight's compile cache was {said(tonight)}, the baseline's {said(base)}"


def _code_and_versions(header: dict) -> dict:
    return {k: v for k, v in header.items() if k == "commit" or k.startswith("version ")}


def compare(tonight: dict, baseline: dict, source: str = "") -> BaselineReport:
    base_runs = {run_key(r["name"]): r for r in baseline.get("runs", [])}
    runs = {}
    for run in tonight.get("runs", []):
        key = run_key(run["name"])
        if key not in base_runs:
            runs[run["name"]] = RunComparison(run["name"], [Flag("run", None, "not in the baseline")])
            continue
        runs[run["name"]] = compare_run(run["name"], run, base_runs[key])
    seen = {run_key(r["name"]) for r in tonight.get("runs", [])}
    a, b = _code_and_versions(tonight.get("header", {})), _code_and_versions(baseline.get("header", {}))
    changes = [f"{k}: {b.get(k, 'absent')} -> {a.get(k, 'absent')}" for k in sorted(set(a) | set(b))
               if a.get(k) != b.get(k)]
    return BaselineReport(source, runs, unchanged_code=not changes, header_changes=changes,
                          missing=sorted(set(base_runs) - seen))
