"""``python -m harness``: run backends or any torchtitan config function, check, report.

- ``run``: the registered backends (default: all three, tiny, pretrained) or the subjects named
  by ``--module M --config C`` / ``--subject M:C``, on the detected device; every run is
  checked (harness/checks/run_checks.py), every pair of runs that should agree is compared
  (harness/report/equivalence.py: a "DIFFER" fails like a failing check) and a report folder
  is written. ``--compare M:C1 M:C2`` runs two subjects on the same data and seed and prints
  their loss curves side by side.
- ``lint``: the config checks that need no rank (seconds, CPU, meta device).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from harness.backends import BACKENDS, INITS, SIZES
from harness.checks import run_checks as checks
from harness.device.devices import KINDS, detect
from harness.launch.run import RunSpec, launch
from harness.launch.run_matrix import RunCase
from harness.launch.subjects import Subject, SubjectError, infer, lint
from harness.registry import dump_layout, known_issues
from harness.registry.tolerances import parity_tolerance
from harness.report import baseline as baseline_module
from harness.report import equivalence
from harness.report.run_report import RunVerdict, format_table, results_document, table_rows, write_report
from harness.upstream.versions import code_commit, package_versions


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run backends or config functions, check them, write a report")
    run.add_argument("--device", choices=KINDS, default=None, help="default: detected")
    run.add_argument("--backends", nargs="+", choices=list(BACKENDS), default=list(BACKENDS))
    run.add_argument("--inits", nargs="+", choices=INITS, default=["pretrained"])
    run.add_argument("--steps", type=int, default=10)
    run.add_argument("--profile", choices=SIZES, default="tiny")
    run.add_argument("--assets-dir", default=None,
                     help="full profile: dir holding Qwen3-4B-Instruct-2507/ (HF assets)")
    run.add_argument("--output-dir", default="reports/latest", help="report folder")
    run.add_argument("--workaround", **known_issues.WORKAROUND_OPTION)
    run.add_argument("--baseline", metavar="PATH", default=None,
                     help="a previous report folder (or its results.json): compare every run "
                          "with the same run there (losses exactly, time and memory as ratios)")
    _subject_options(run)
    run.add_argument("--compare", nargs=2, metavar="M:C",
                     help="run two config functions on the same data and seed, side by side")
    check = sub.add_parser("lint", help="check config functions before any rank starts")
    _subject_options(check)
    return parser


def _subject_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--module", help="a torchtitan --module (a module of config functions)")
    parser.add_argument("--config", help="its config function (torchtitan --config)")
    parser.add_argument("--subject", action="append", default=[], metavar="M:C",
                        help="a config function as MODULE:CONFIG, repeatable")
    parser.add_argument("--pythonpath", action="append", default=[],
                        help="folder holding the subjects' modules (default: the current folder)")


def _subjects(args: argparse.Namespace) -> list[Subject]:
    if bool(args.module) != bool(args.config):
        raise SubjectError("--module and --config go together (as for torchtitan.train)")
    subjects = [Subject(args.module, args.config)] if args.module else []
    subjects += [Subject.parse(text) for text in (*args.subject, *(getattr(args, "compare", None) or ()))]
    return subjects


def _import_path(args: argparse.Namespace) -> tuple[str, ...]:
    folders = tuple(str(Path(p).resolve()) for p in (args.pythonpath or ["."]))
    for folder in reversed(folders):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    return folders


def lint_command(args: argparse.Namespace) -> int:
    _import_path(args)
    reports = [lint(subject) for subject in _subjects(args)]
    if not reports:
        print("lint: name config functions with --module M --config C or --subject M:C")
        return 2
    for report in reports:
        print(report.format())
    return 0 if all(r.ok for r in reports) else 1


def _specs(args: argparse.Namespace, subjects: list[Subject], folders, device: str) -> list[RunSpec]:
    """The runs to launch: a user's config functions, or the registered backends built exactly
    as the run template builds them (``RunCase.run_spec``: a full size's own assets folder
    under ``--assets-dir``, its data, save map and timeouts)."""
    common = dict(steps=args.steps, save_hf=True, workarounds=tuple(args.workaround))
    if subjects:
        return [RunSpec.for_subject(infer(s), pythonpath=folders, **common) for s in subjects]
    specs = []
    for backend in args.backends:
        for init in args.inits:
            offered = BACKENDS[backend].size(args.profile).inits
            if init not in offered:
                print(f"[{backend}] {args.profile} starts only from {offered}: skipping init {init}")
                continue
            case = RunCase(device, backend, args.profile, init, BACKENDS[backend].default_attention)
            specs.append(case.run_spec(args.steps, assets_root=args.assets_dir,
                                       workarounds=tuple(args.workaround)))
    return specs


def compare_table(a, b) -> tuple[str, int | None]:
    """The two runs' loss curves side by side and the first step where they differ by more
    than the loss-curve parity tolerance of their precision regime."""
    regime = "bf16_experts" if "nki_moe" in (a.spec.backend, b.spec.backend) else "float32"
    band = parity_tolerance("torchrun_loss", regime).atol
    rows = [("step", a.spec.name, b.spec.name, "diff")]
    first = None
    # strict=False: the steps both logged are compared; a step only one logged diverges (below)
    for sa, sb in zip(a.steps, b.steps, strict=False):
        diff = sb.loss - sa.loss
        if first is None and not abs(diff) <= band:
            first = sa.step
        rows.append((str(sa.step), f"{sa.loss:.6f}", f"{sb.loss:.6f}", f"{diff:+.2e}"))
    longer, shorter = (a, b) if len(a.steps) > len(b.steps) else (b, a)
    for extra in longer.steps[len(shorter.steps):]:
        first = extra.step if first is None else first
        row = [str(extra.step), "-", "-", "only one run"]
        row[1 if longer is a else 2] = f"{extra.loss:.6f}"
        rows.append(tuple(row))
    verdict = (f"first divergent step: {first} (|diff| > {band:g}, torchrun_loss {regime})"
               if first is not None else f"no step differs by more than {band:g} (torchrun_loss {regime})")
    if len(a.steps) != len(b.steps):
        verdict += f"; {a.spec.name} logged {len(a.steps)} steps, {b.spec.name} {len(b.steps)}"
    return format_table(rows) + "\n" + verdict, first


def exit_status(verdicts: list[RunVerdict], pairs, compared=None) -> int:
    """1 when a check fails, a pair of runs that should agree differs (harness/report/
    equivalence.py "DIFFER" or "FAIL") or the baseline flags something; else 0."""
    ok = (all(v.ok for v in verdicts) and all(p.ok for p in pairs)
          and (compared is None or compared.ok))
    return 0 if ok else 1


def run(args: argparse.Namespace) -> int:
    folders = _import_path(args)
    subjects = _subjects(args)
    for subject in subjects:  # a trn2 hour is not spent to learn what lint can say in seconds
        report = lint(subject)
        print(report.format(), flush=True)
        if not report.ok:
            print(f"{subject.name}: lint failed; nothing launched")
            return 1
    baseline = baseline_module.load(args.baseline) if args.baseline else None
    profile = detect(args.device)
    out = Path(args.output_dir).resolve()
    versions = package_versions()
    print(f"device: {profile.describe()}\nversions: {versions}\nreport: {out}", flush=True)
    verdicts = []
    for spec in _specs(args, subjects, folders, profile.kind):
        start = time.monotonic()
        print(f"[{spec.name}] launching {spec.steps} steps ...", flush=True)

        def progress(record, name=spec.name, start=start):
            print(f"[{name}] step {record.step:3d}  loss {record.loss:.6f}  "
                  f"({time.monotonic() - start:.0f}s)", flush=True)

        result = launch(spec, profile, dump_layout.report_run_dir(out, spec.name), on_step=progress)
        verdict = RunVerdict(result, checks.verdicts(result, spec.steps))
        verdicts.append(verdict)
        print(f"[{spec.name}] {'ok' if verdict.ok else 'FAIL'} in {result.duration_s:.0f}s", flush=True)
        for name, (v, _) in verdict.checks.items():
            if v.status != "pass":
                print(f"  {name}: {v.status}: {v.message}", flush=True)
        if not result.ok:
            print(result.log_tails(15), flush=True)
    header = {"device": profile.describe(), "profile": args.profile, "steps": str(args.steps),
              "commit": code_commit(),
              **{f"version {k}": v for k, v in versions.items()},
              "workarounds": ", ".join(args.workaround) or "none"}
    compared = (baseline_module.compare(results_document(verdicts, header), baseline,
                                        str(Path(args.baseline).resolve()))
                if baseline is not None else None)
    write_report(verdicts, out, header, compared, baseline)
    print()
    print(format_table(table_rows(verdicts, compared)))
    pairs = equivalence.pairs([v.run for v in verdicts])
    print("\nequivalence:\n" + "\n".join(equivalence.lines(pairs)))
    if compared is not None:
        print("\nvs baseline:\n" + "\n".join(compared.lines()))
    status = exit_status(verdicts, pairs, compared)
    if args.compare:
        text, _ = compare_table(verdicts[-2].run, verdicts[-1].run)
        print("\n" + text)
        (out / "compare.txt").write_text(text + "\n")
    print(f"\nreport: {out / 'summary.md'}")
    return status


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "run":
            return run(args)
        if args.command == "lint":
            return lint_command(args)
    except (SubjectError, baseline_module.BaselineError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
