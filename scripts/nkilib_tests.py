"""nki-library's own integration tests, run in their simulation mode on the harness's NKI
emulator: the emulator's acceptance test.

    python3 scripts/nkilib_tests.py             # every file below, prints the table, exits 1 on a failure
    python3 scripts/nkilib_tests.py --whole     # the ten files kept whole; --core: the core files after them
                                                # (2: a test tarball is not installed: get_upstream.py)
    python3 scripts/nkilib_tests.py core/cumsum/test_cumsum.py   # some files (paths under test/integration/nkilib)

What it does, each run:

1. extracts the pinned test tarballs (constraints/upstream.toml ``nki-library-tests`` and
   ``nki-library-tests-core``, put under ``build/upstream/`` by ``scripts/get_upstream.py``, which
   checks the commit: a mirrored tarball by its sha256, a source one by its checkout; their files
   are never changed) into ``build/nkilib-tests/`` (git-ignored);
2. builds, or reuses, ``build/nkilib-tests/venv``: a venv on top of the system packages with
   the packages nki-library's test tree imports, pinned in ``constraints/nkilib_tests.txt``;
3. runs pytest in the extracted tree (two sessions: the first ten files, then the others) as
   nki-library's README says (``--test-mode simulation``),
   with ``-p harness.kernels.emu.cpu_simulator.pytest_plugin`` (the emulator installed as
   ``nki_cpu_simulator``, which nki-library's ``simulation_setup.py`` installs as ``nki``),
   nki-library's default selection (its large shapes skip unless NKILIB_SIMULATION_RUN_ALL=1),
   ``-n 2``, ``--force-local-cleanup`` and NEURON_PYTHONHASHSEED=0 (the sampled
   parametrisations are fixed);
4. prints the table (file, collected, passed, failed, skipped, deselected) and the time, and
   writes it to ``build/nkilib-tests/summary.md``.

nki-library's default selection still holds cross-entropy cases of 10^8 to 2*10^9 logits and
blockwise-MoE cases of 64 experts (0.8*10^9 weight elements): a 2-core 24 GiB machine holds
them neither in memory (the inputs, the golden and the emulator's copy: about 16 bytes an
element) nor in the CI budget, so the plugin deselects the cases whose largest input exceeds
``MAX_ELEMENTS`` (``--nki-emu-max-elements``), by name, and the table counts them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this tree's harness (its known issues), not an installed one
from harness.registry import known_issues, upstream  # noqa: E402  (this tree's, after the path insert)

# The pinned tarballs, in extraction order: the first holds nki-library/ (src/, test/utils/, ten
# test files); the second, every test file under core/ attention, mlp, qkv, output_projection,
# rmsnorm, subkernels, moe and moe_block, extracted over the first's tree.
PINS = (upstream.pin("nki-library-tests"), upstream.pin("nki-library-tests-core"))
TARBALLS = tuple(entry.fetched for entry in PINS)
TARBALL = TARBALLS[0]  # the source tree (src/, test/utils/) and the first ten test files
WORK = REPO / "build" / "nkilib-tests"
TREE = WORK / "nki-library"
VENV = WORK / "venv"
REQUIREMENTS = REPO / "constraints" / "nkilib_tests.txt"
PLUGIN = "harness.kernels.emu.cpu_simulator.pytest_plugin"
TESTS = "test/integration/nkilib"
FILES = (
    "core/embeddings/test_rope.py",
    "core/embeddings/test_rope_hf.py",
    "core/cumsum/test_cumsum.py",
    "core/router_topk/test_router_topk.py",
    "core/max/test_cascaded_max.py",
    "core/topk/test_topk.py",
    "core/moe/moe_cte/test_moe_cte.py",
    "experimental/moe/test_bwmm_bwd.py",
    "experimental/loss/test_cross_entropy_forward.py",
    "experimental/loss/test_cross_entropy_backward.py",
    # the second tarball (core/moe/moe_cte/test_moe_cte.py is in both)
    "core/attention/test_attention_bwd.py",
    "core/attention/test_attention_cte.py",
    "core/attention/test_attention_cte_model_config.py",
    "core/attention/test_attention_tkg.py",
    "core/attention/test_attention_tkg_model_config.py",
    "core/attention/test_attention_tkg_utils.py",
    "core/attention/test_gen_mask_tkg.py",
    "core/mlp/test_mlp_common.py",
    "core/mlp/test_mlp_cte.py",
    "core/mlp/test_mlp_cte_model_config.py",
    "core/mlp/test_mlp_proj_mxfp4.py",
    "core/mlp/test_mlp_tkg.py",
    "core/mlp/test_mlp_tkg_model_config.py",
    "core/moe/moe_cte/test_moe_bwmm_mx_cte.py",
    "core/moe/moe_cte/test_moe_bwmm_mx_cte_model_config.py",
    "core/moe/moe_cte/test_moe_cte_common.py",
    "core/moe/moe_cte/test_moe_cte_model_config.py",
    "core/moe/moe_cte/test_moe_cte_unified.py",
    "core/moe/moe_cte/test_utils.py",
    "core/moe/moe_tkg/test_moe_tkg.py",
    "core/moe/moe_tkg/test_moe_tkg_model_config.py",
    "core/moe/moe_tkg/test_moe_tkg_utils.py",
    "core/moe/moe_tkg/test_moe_tkg_wrapper.py",
    "core/moe_block/test_moe_block_tkg.py",
    "core/moe_block/test_moe_block_tkg_model_config.py",
    "core/output_projection/test_output_proj_cte.py",
    "core/output_projection/test_output_proj_cte_model_config.py",
    "core/output_projection/test_output_proj_tkg.py",
    "core/qkv/test_qkv_common.py",
    "core/qkv/test_qkv_cte.py",
    "core/qkv/test_qkv_cte_model_config.py",
    "core/qkv/test_qkv_tkg.py",
    "core/rmsnorm/test_rmsnorm_quant.py",
    "core/subkernels/test_find_nonzero_indices.py",
    "core/subkernels/test_indexed_flatten.py",
    "core/subkernels/test_layernorm_tkg.py",
    "core/subkernels/test_rmsnorm_mx_quantize_tkg.py",
    "core/subkernels/test_rmsnorm_tkg.py",
)
MAX_ELEMENTS = 2**26  # the largest input of a case run here: 67M elements, ~1 GiB of the copies a case makes
# The files kept whole (nki-library's default selection, less MAX_ELEMENTS): the first tarball's.
WHOLE = FILES[:10]
# The other files: a case whose integer parameters multiply to more than MAX_WORK is deselected by
# size; of the rest, SAMPLE runnable cases per file, drawn with SEED (pytest_plugin's docstring).
# MAX_WORK is MAX_ELEMENTS: at 2**27, rmsnorm_quant's [19968, 6144] case (1.2*10^8 elements) ran and
# failed allocating its input in a worker at the data cap.
MAX_WORK = MAX_ELEMENTS
SAMPLE = 12
SEED = 0
# per pytest process: a case that outgrows it fails alone. The first ten files' own topk and cumsum
# sweeps peak at 11 GiB a worker (measured); at 8 GiB, 8 of their cases failed on allocation.
MAX_DATA_GIB = 12
# A case past CASE_SECONDS ends its worker, its stacks appended to hangs.txt: a process at the data cap
# can hang (a thread whose first allocation fails dies inside Thread.start), and the stage must fail
# that case by name, not stall (pytest-xdist reports it and starts a new worker).
CASE_SECONDS = 180  # 3x the slowest case measured (test_topk_sweep[1024-5-4058-2048-2], 60 s)


MISSING = 2  # exit status: no tarball, nothing to test with (.ci/run warns and goes on)


def extract() -> None:
    for entry in PINS:
        if not entry.fetched.is_file():
            print(f"nkilib_tests: SKIP: {entry.fetched} is missing: it holds nki-library's source and tests at "
                  f"{entry.commit}; `{entry.install}` installs it", file=sys.stderr)
            raise SystemExit(MISSING)
    if TREE.exists():
        subprocess.run(["rm", "-rf", str(TREE)], check=True)
    WORK.mkdir(parents=True, exist_ok=True)
    for tarball in TARBALLS:
        # A mirrored core tarball holds test/ only; one archived from the source, nki-library/ whole.
        with tarfile.open(tarball) as tar:
            into = WORK if tar.getnames()[0].split("/")[0] == "nki-library" else TREE
            tar.extractall(into, filter="data")


def venv_python() -> Path:
    python = VENV / "bin" / "python"
    stamp = VENV / "requirements.txt"
    if python.exists() and stamp.is_file() and stamp.read_text() == REQUIREMENTS.read_text():
        return python
    subprocess.run(["rm", "-rf", str(VENV)], check=True)
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r",
                    str(REQUIREMENTS)], check=True)
    stamp.write_text(REQUIREMENTS.read_text())
    return python


def run(files, workers: int = 2) -> tuple[int, Path, float]:
    """pytest over ``files`` in two sessions, the files kept whole (WHOLE) first and the sampled
    others after: a worker's memory grows with the cases it ran (a worker of one session over all
    49 files reached the 8 GiB cap and failed cumsum cases that pass alone), so the first ten
    stay as they were before the others came. The sessions' JUnit XML and deselection records
    are merged into ``junit.xml`` and ``deselected.txt``; the status is the worse of the two."""
    python = venv_python()
    junit = WORK / "junit.xml"
    for stale in WORK.glob("junit*.xml"):
        stale.unlink()
    for stale in WORK.glob("deselected*.txt"):
        stale.unlink()
    junit.with_name("hangs.txt").unlink(missing_ok=True)
    env = {**os.environ, "NEURON_PYTHONHASHSEED": "0", "PYTHONPATH": str(REPO),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    env.pop("NKILIB_SIMULATION_RUN_ALL", None)  # nki-library's default selection
    groups = [g for g in ([f for f in files if f in WHOLE], [f for f in files if f not in WHOLE]) if g]
    start, statuses, suites, records = time.monotonic(), [], [], []
    for index, group in enumerate(groups):
        part, record = WORK / f"junit-{index}.xml", WORK / f"deselected-{index}.txt"
        command = [str(python), "-m", "pytest", "-p", PLUGIN, *(f"{TESTS}/{f}" for f in group), "--test-mode",
                   "simulation", "--force-local-cleanup", "-p", "no:cacheprovider", "-q", "-rfE", "-n", str(workers),
                   f"--nki-emu-max-elements={MAX_ELEMENTS}", f"--nki-emu-deselected={record}",
                   f"--nki-emu-max-work={MAX_WORK}", f"--nki-emu-sample={SAMPLE}", f"--nki-emu-seed={SEED}",
                   f"--nki-emu-max-data-gib={MAX_DATA_GIB}", *(f"--nki-emu-whole={f}" for f in WHOLE),
                   f"--nki-emu-case-seconds={CASE_SECONDS}", f"--nki-emu-hang-log={junit.with_name('hangs.txt')}",
                   "--continue-on-collection-errors", f"--junitxml={part}", "--durations=15"]
        statuses.append(subprocess.run(command, cwd=TREE, env=env).returncode)
        if part.is_file():
            suites.extend(ET.parse(part).getroot().iter("testsuite"))
        if record.is_file():
            records.append(record.read_text())
    if suites:
        merged = ET.Element("testsuites")
        merged.extend(suites)
        ET.ElementTree(merged).write(junit)
        junit.with_name("deselected.txt").write_text("".join(records))
    status = max(statuses, key=lambda s: (s not in (0, 1), s))  # an internal error outranks failures
    return status, junit, time.monotonic() - start


COLUMNS = ("collected", "passed", "failed", "known", "skipped", "size", "sample", "platform")


def _path_of(case) -> str | None:
    """integration.nkilib.core.cumsum.test_cumsum.TestCumsumKernel -> core/cumsum/test_cumsum.py; a
    collection error's case is named by its file (test/integration/nkilib/core/mlp/test_mlp_cte.py),
    or under pytest-xdist by its module (integration.nkilib.core.mlp.test_mlp_cte)."""
    parts = case.get("classname", "").split(".")
    module = next((i for i, part in enumerate(parts) if part.startswith("test_")), None)
    if module is not None and "nkilib" in parts:
        return "/".join(parts[parts.index("nkilib") + 1:module + 1]) + ".py"
    name = case.get("name", "")
    if "integration/nkilib/" in name:
        return name.split("integration/nkilib/")[-1]
    parts = name.split(".")
    if not case.get("classname") and "nkilib" in parts and parts[-1].startswith("test_"):
        return "/".join(parts[parts.index("nkilib") + 1:]) + ".py"
    return None


def _problem(case) -> str | None:
    for tag in ("failure", "error"):
        node = case.find(tag)
        if node is not None:
            return f"{node.get('message', '')}\n{node.text or ''}"
    return None


def outcomes(junit: Path) -> list[tuple[str, str, str, str]]:
    """(file, test, outcome, detail) per case: outcome passed / failed / known / skipped; a failure
    that a known issue of nki-library (check ``nkilib_suite``) explains by its signature is
    ``known``, its detail the issue's name."""
    rows, seen = [], set()
    for case in ET.parse(junit).getroot().iter("testcase"):
        path = _path_of(case)
        if path is None or (path, case.get("name", "")) in seen:  # every xdist worker reports a collection error
            continue
        seen.add((path, case.get("name", "")))
        problem = _problem(case)
        if problem is None:
            outcome, detail = ("skipped", "") if case.find("skipped") is not None else ("passed", "")
        else:
            verdict = known_issues.judge("nkilib_suite", problem, {"error": problem}, case=path)
            outcome, detail = (("known", ", ".join(i.name for i in verdict.issues)) if verdict.status == "known"
                               else ("failed", problem.strip().splitlines()[0][:300] if problem.strip() else ""))
        rows.append((path, case.get("name", ""), outcome, detail))
    return rows


def table(junit: Path, files, seconds: float) -> str:
    counts: dict[str, Counter] = {f: Counter() for f in files}
    for path, _, outcome, _ in outcomes(junit):
        counts.setdefault(path, Counter())[outcome] += 1
    deselected = _deselected(junit)
    lines = ["| file | collected | passed | failed | known issue (upstream) | skipped | deselected: size | "
             "deselected: not sampled | deselected: not trn2 |", "|---|---|---|---|---|---|---|---|---|"]
    total = Counter()
    for f in files:
        c = counts.get(f, Counter())
        for reason in ("size", "sample", "platform"):
            c[reason] = deselected.get((f, reason), 0)
        c["collected"] = sum(c[k] for k in COLUMNS[1:])
        total.update(c)
        lines.append(f"| {f} | " + " | ".join(str(c[k]) for k in COLUMNS) + " |")
    lines.append("| all | " + " | ".join(str(total[k]) for k in COLUMNS) + " |")
    return "\n".join(lines) + (f"\n\n{seconds:.0f} s wall, 2 workers, nki-library d2ad3a5 on the harness NKI emulator "
                               f"(files after the first ten: at most {SAMPLE} runnable cases each, seed {SEED}, "
                               f"work <= {MAX_WORK})\n")


def failures(junit: Path) -> str:
    """The failed and known cases, one line each, grouped by cause (the first line of the error)."""
    causes: dict[tuple[str, str], list[str]] = {}
    for path, name, outcome, detail in outcomes(junit):
        if outcome in ("failed", "known"):
            causes.setdefault((outcome, detail), []).append(f"{path}::{name}")
    lines = []
    for (outcome, detail), cases in sorted(causes.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"{len(cases):4d} {outcome}: {detail}\n       e.g. {cases[0]}")
    return "\n".join(lines)


def _deselected(junit: Path) -> dict[tuple[str, str], int]:
    record = junit.with_name("deselected.txt")
    counts: Counter = Counter()
    if record.is_file():
        for line in record.read_text().splitlines():
            fields = line.split("\t")
            reason = fields[2] if len(fields) > 2 else "size"
            counts[(fields[0].split("::")[0].split("integration/nkilib/")[-1], reason)] += 1
    return counts


# Named selections: the ten files kept whole, and the core files sampled after them (CI runs and
# gates on both: ``python3 scripts/nkilib_tests.py``).
SELECTIONS = {"--whole": WHOLE, "--core": FILES[len(WHOLE):]}


def main(argv: list[str]) -> int:
    files = SELECTIONS[argv[0]] if argv[:1] and argv[0] in SELECTIONS else (tuple(argv) or FILES)
    extract()
    status, junit, seconds = run(files)
    if not junit.is_file():
        print(f"nkilib_tests: pytest exited {status} before writing {junit}", file=sys.stderr)
        return status or 1
    summary = table(junit, files, seconds)
    causes = failures(junit)
    (WORK / "summary.md").write_text(summary + ("\nFailures and known issues by cause:\n\n" + causes + "\n"
                                                if causes else ""))
    print(summary)
    hangs = WORK / "hangs.txt"
    if hangs.is_file() and hangs.stat().st_size:
        print(f"Cases past {CASE_SECONDS} s, their stacks ({hangs}):\n{hangs.read_text()[-20000:]}")
    if causes:
        print("Failures and known issues by cause:\n" + causes)
    # a failure the emulator owns fails the stage; a known issue of nki-library does not
    if status not in (0, 1):  # interrupted, internal error, usage error: pytest's own status
        return status
    if any(outcome == "failed" for _, _, outcome, _ in outcomes(junit)):
        return status or 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
