#!/usr/bin/env python3
"""Turn a night's report into measured device bands (harness/registry/tolerances.py).

    python3 scripts/record_bands.py --device neuron --report reports/run-report/results.json
    python3 scripts/record_bands.py --device neuron --report night1.json --report night2.json

Until a comparison has been measured on a device, the device's runs are held to its coarse
bound (``tolerances.coarse_tolerance``) and every check records its exact delta. This reads the
equivalence section of one or more nights' ``results.json`` (the run report, an artifact of
every night: ``reports-trn2/run-report/``), takes each (quantity, regime) compared on
``--device`` (the pair's run ran there) and writes its measured band to
``fixtures/device_bands.toml``: 10x the worst |delta| seen (the CPU bands' margin), with the
nights, run pairs and numbers in its ``why``. A band that would be coarser than the coarse
bound is refused (exit 1): it would no longer catch the defects the coarse bound is sized for,
so the device's numerics need a look first. Entries already in the file for other quantities
are kept; commit the file as the goldens are committed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.registry import tolerances as T  # noqa: E402

MARGIN = 10  # the bands' margin over the worst measured delta (as the CPU bands)


def measured(reports: list[Path], device: str) -> dict[tuple[str, str], list[tuple[float, str]]]:
    """{(quantity, regime): [(|delta|, where)]} of every pair compared on ``device``."""
    found: dict[tuple[str, str], list[tuple[float, str]]] = {}
    for path in reports:
        report = json.loads(path.read_text())
        devices = {run["name"]: run.get("device") for run in report.get("runs", [])}
        night = report.get("header", {}).get("date") or path.name
        for pair in report.get("equivalence", []):
            if not pair.get("tolerance") or pair.get("max_delta") is None:
                continue
            if devices.get(pair["run"]) != device:
                continue
            quantity, regime = pair["tolerance"].split()[:2]
            found.setdefault((quantity, regime), []).append(
                (abs(float(pair["max_delta"])), f"{pair['run']} vs {pair['reference']} ({night}, "
                                                 f"{pair.get('steps')} steps)"))
    return found


def toml_entry(key: str, atol: float, rtol: float, why: str) -> str:
    escaped = why.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{key}" = {{ atol = {atol!r}, rtol = {rtol!r}, why = "{escaped}" }}'


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", required=True)
    parser.add_argument("--report", action="append", required=True, type=Path)
    parser.add_argument("--output", type=Path, default=REPO / T.DEVICE_BANDS_FILE)
    args = parser.parse_args(argv)
    found = measured(args.report, args.device)
    if not found:
        print(f"no comparison in {[str(p) for p in args.report]} ran on {args.device}")
        return 1

    existing = tomllib.loads(args.output.read_text()) if args.output.is_file() else {}
    table = dict(existing.get(args.device, {}))
    refused = []
    for (quantity, regime), deltas in sorted(found.items()):
        worst, where = max(deltas)
        coarse = T.coarse_tolerance(quantity, regime, args.device) if quantity in T.DEFECT_EFFECTS else None
        band = MARGIN * worst
        if coarse is not None and band > (coarse.atol or coarse.rtol):
            refused.append(f"{quantity}/{regime}: {MARGIN} x the worst delta {worst:.3g} ({where}) = "
                           f"{band:.3g} is coarser than the coarse bound {coarse.atol or coarse.rtol:.3g}")
            continue
        why = (f"measured on {args.device}: worst |delta| {worst:.3g} over {len(deltas)} pair(s), worst "
               f"{where}; {MARGIN}x margin (scripts/record_bands.py)")
        table[f"{quantity}/{regime}"] = {"atol": band, "rtol": 0.0, "why": why}
        print(f"{quantity}/{regime} on {args.device}: {band:.3g} ({why})")
    if refused:
        for line in refused:
            print(f"refused: {line}: the device's numerics need a look before a band is recorded")
        return 1
    existing[args.device] = table
    lines = ["# Bands measured on devices by their nights (scripts/record_bands.py); read by",
             "# harness/registry/tolerances.py device_bands(). One table per device.", ""]
    for device, entries in sorted(existing.items()):
        lines.append(f"[{device}]")
        lines += [toml_entry(key, float(e.get("atol", 0.0)), float(e.get("rtol", 0.0)), e["why"])
                  for key, e in sorted(entries.items())]
        lines.append("")
    args.output.write_text("\n".join(lines))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
