#!/usr/bin/env python3
"""The trn2 night, rehearsed on CPU: .github/workflows/nightly-trn2.yml executed step by step.

    python3 scripts/nightly/rehearse.py                 # two nights in a fresh temporary root
    python3 scripts/nightly/rehearse.py --nights 1 --root /tmp/night --keep

Builds a fake Neuron image under a temporary root (the Neuron 2.33 DLAMI's venv by its own path
name, holding this machine's CPU stack and spring-2026 torchtitan labelled as TorchTitan Neuron)
and runs the workflow's own steps in it, as a GitHub runner does: each ``run:`` step in bash
with the job's environment, ``${{ }}`` expressions evaluated, ``GITHUB_ENV`` / ``GITHUB_PATH`` /
``GITHUB_OUTPUT`` / ``GITHUB_STEP_SUMMARY`` honoured between steps, ``if: always()`` and
``timeout-minutes`` obeyed; the actions it uses (checkout, cache, upload-artifact) are
emulated on local folders. Two nights in a row: the second fetches the first's run report as
its baseline, through the workflow's own ``gh`` calls. Everything that differs from a trn2
night is in ``DIFFERENCES`` below, each with its reason; nothing else is changed.

Exit status 0 when every night concluded with success and the second night compared itself
with the first; else 1, with the failing step's log tail.
"""

from __future__ import annotations

import argparse
import fnmatch
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "nightly-trn2.yml"
FAKES = Path(__file__).resolve().parent / "rehearsal"
# Neuron 2.33's DLAMI venv (docs: setup/pytorch/update-dlami) and where scripts/nightly/
# image_env.sh looks for it.
VENV_NAME = "aws_neuronx_venv_torch_neuronx_2_14_0"
FORK_VERSION = "0.2.2+neuron.rehearsal"
REPOSITORY = "rehearsal/titan-parity-harness"

# What the rehearsal swaps, and why. Nothing else differs from a trn2 night.
DIFFERENCES = (
    ("device", "the neuron tier's launches on trn2's NeuronCores (process group 'neuron', 64 "
     "ranks per full-size run)", "the cpu profile (gloo, 2 ranks): HARNESS_NEURON_STANDIN=cpu, "
     "the one switch (harness/device/devices.py standin_for)", "no Trainium here"),
    ("sizes", "Qwen3-4B-Instruct-2507 and the 4-layer 30B-A3B cut at seq 2048", "the assets "
     "twin (harness/registry/assets_twin.py: the tiny fixtures laid out as the real download) at seq 256, "
     "pretrained where it has weights (the twin's tied-embedding init rules would swamp a "
     "random-init check)", "a 4B model does not train on 2 CPU cores"),
    ("numbers", "the source's published 6.54 / 12.43 and trn2's timeouts", "the twin's recorded "
     "stand-ins on fixtures/c4 (fixtures/expectations.toml) and the CPU timeouts",
     "the published numbers are Qwen3-4B's on trn2"),
    ("in-process neuron tests", "tests/kernels' 'neuron' device cells, each module in its own "
     "child process (harness/launch/own_process.py)", "deselected, named in the session's summary "
     "(their CPU twins are the nki-emu cells of the default suite)",
     "torch-neuronx's device has no stand-in"),
    ("image root", "/opt (the DLAMI's venvs and tools)", "<root>/opt, NEURON_OPT_ROOT",
     "the machine's /opt is not ours to write"),
    ("torchtitan", "TorchTitan Neuron 0.2.2+neuron.1 (aws-neuron/torchtitan-neuron)",
     f"spring-2026 main (../shared/wheels) labelled {FORK_VERSION}",
     "the fork is not reachable here; its public base is, with every defect the base has"),
    ("torch stack", "torch 2.14.0 + torch-neuronx 2.14.3.x + nki + neuronx-cc in the venv",
     "this machine's CPU stack (torch 2.14.0, constraints/cpu.txt), seen through "
     "--system-site-packages", "no Neuron packages here"),
    ("the Hub", "huggingface.co (hf download)", "a fake `hf` serving the twin and fixtures/c4 "
     "(scripts/nightly/rehearsal/hf)", "no Hub access here"),
    ("GitHub", "the runner, actions/* and `gh`", "this file's step runner, local folders for "
     "the cache and the artifacts, a fake `gh` over them (scripts/nightly/rehearsal/gh)",
     "no GitHub here"),
    ("HOME", "the runner user's home (the NEFF cache)", "<root>/home", "isolation"),
)


class RehearsalError(RuntimeError):
    pass


# ------------------------------------------------------------------------------ expressions

EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


@dataclass
class Contexts:
    vars: dict[str, str]
    inputs: dict[str, str]
    secrets: dict[str, str]
    github: dict[str, str]
    runner: dict[str, str]
    steps: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)
    failed: bool = False

    def lookup(self, path: str) -> str:
        head, *rest = path.split(".")
        if head not in ("vars", "inputs", "secrets", "github", "runner", "steps"):
            raise RehearsalError(f"expression context {head!r} (in {path!r}) is not one the "
                                 f"rehearsal knows: add it to scripts/nightly/rehearse.py")
        value = getattr(self, head)
        for part in rest:
            value = value.get(part, "") if isinstance(value, dict) else ""
        return value if isinstance(value, str) else ""

    def evaluate(self, expression: str):
        """A GitHub expression of the forms the workflow uses: ``a || b``, ``'literal'``,
        ``context.name``, ``always()`` / ``success()`` / ``failure()``."""
        terms = [t.strip() for t in expression.split("||")]
        value = ""
        for term in terms:
            value = self._term(term)
            if value:
                return value
        return value

    def _term(self, term: str):
        if term.startswith("'") and term.endswith("'"):
            return term[1:-1]
        functions = {"always()": True, "success()": not self.failed, "failure()": self.failed,
                     "cancelled()": False}
        if term in functions:
            return functions[term]
        if re.fullmatch(r"[A-Za-z_][\w.-]*", term):
            return self.lookup(term)
        raise RehearsalError(f"expression {term!r} is not one the rehearsal evaluates")

    def substitute(self, text: str) -> str:
        return EXPRESSION.sub(lambda m: str(self.evaluate(m.group(1))), str(text))

    def condition(self, text: str | None) -> bool:
        if text is None:
            return not self.failed
        match = EXPRESSION.fullmatch(str(text).strip())
        return bool(self.evaluate(match.group(1) if match else str(text)))


# ------------------------------------------------------------------------------ the runner


@dataclass
class Night:
    number: int
    root: Path
    workspace: Path
    logs: Path
    contexts: Contexts
    env: dict[str, str]
    path: list[str] = field(default_factory=list)
    results: list[tuple[str, str, float]] = field(default_factory=list)

    @property
    def succeeded(self) -> bool:
        return not self.contexts.failed


def read_assignments(path: Path) -> dict[str, str]:
    """``NAME=value`` lines and ``NAME<<EOF`` blocks, as the runner reads its files."""
    out, lines = {}, path.read_text().splitlines() if path.is_file() else []
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and "=" not in line.split("<<")[0]:
            name, marker = line.split("<<", 1)
            block = []
            i += 1
            while i < len(lines) and lines[i] != marker:
                block.append(lines[i])
                i += 1
            out[name] = "\n".join(block)
        elif "=" in line:
            name, value = line.split("=", 1)
            out[name] = value
        i += 1
    path.write_text("")
    return out


def run_step(night: Night, step: dict, index: int, store: Path) -> str:
    name = step.get("name") or step.get("uses") or f"step {index}"
    contexts = night.contexts
    if not contexts.condition(step.get("if")):
        return "skipped"
    log = night.logs / f"{index:02d}-{re.sub(r'[^A-Za-z0-9]+', '-', name).strip('-')[:50]}.log"
    timeout = 60 * float(step.get("timeout-minutes", 360))
    if "uses" in step:
        emulate_action(night, step, store, log)
        return "success"
    files = {k: night.root / f"{k.lower()}-{index}" for k in ("GITHUB_ENV", "GITHUB_PATH",
                                                            "GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY")}
    for path in files.values():
        path.touch()
    env = {**night.env, **{k: contexts.substitute(v) for k, v in step.get("env", {}).items()},
           **{k: str(v) for k, v in files.items()}}
    # The fake services first (nothing of the image may answer for them), then GITHUB_PATH's.
    env["PATH"] = os.pathsep.join([str(FAKES), *night.path, env["PATH"]])
    script = night.root / f"step-{index}.sh"
    script.write_text(contexts.substitute(step["run"]))
    with open(log, "wb") as out:
        try:
            code = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
                                  cwd=night.workspace, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            code = None
    night.env.update(read_assignments(files["GITHUB_ENV"]))
    night.path[:0] = reversed([p for p in files["GITHUB_PATH"].read_text().splitlines() if p])
    files["GITHUB_PATH"].write_text("")
    if step.get("id"):
        contexts.steps[step["id"]] = {"outputs": read_assignments(files["GITHUB_OUTPUT"])}
    summary = files["GITHUB_STEP_SUMMARY"].read_text()
    if summary:
        with open(night.root / "step-summary.md", "a") as f:
            f.write(summary)
    if code == 0:
        return "success"
    return "timed out" if code is None else f"failed (exit {code})"


def emulate_action(night: Night, step: dict, store: Path, log: Path) -> None:
    action = step["uses"].split("@")[0]
    inputs = {k: night.contexts.substitute(v) for k, v in (step.get("with") or {}).items()}
    home = Path(night.env["HOME"])
    if action == "actions/checkout":
        message = f"workspace {night.workspace}: a copy of this working tree (made before the night)"
    elif action == "actions/cache/restore":
        target = Path(inputs["path"].replace("~", str(home)))
        keys = sorted((store / "cache").glob("*"), key=lambda p: p.stat().st_mtime, reverse=True)
        prefixes = [inputs["key"], *[k for k in inputs.get("restore-keys", "").splitlines() if k]]
        hit = next((k for prefix in prefixes for k in keys if k.name.startswith(prefix)), None)
        if hit:
            shutil.copytree(hit, target, dirs_exist_ok=True)
        message = f"cache {'restored from ' + hit.name if hit else 'miss'} -> {target}"
    elif action == "actions/cache/save":
        source = Path(inputs["path"].replace("~", str(home)))
        if source.is_dir():
            shutil.copytree(source, store / "cache" / inputs["key"], dirs_exist_ok=True)
        message = f"cache saved as {inputs['key']}"
    elif action == "actions/upload-artifact":
        copied = upload(night.workspace, inputs["path"],
                        store / "runs" / night.contexts.github["run_id"] / "artifacts" / inputs["name"])
        message = f"artifact {inputs['name']}: {copied} file(s)"
    else:
        raise RehearsalError(f"action {action} is not one the rehearsal emulates: add it to "
                             f"scripts/nightly/rehearse.py (and to DIFFERENCES)")
    log.write_text(message + "\n")


def upload(workspace: Path, spec: str, out: Path) -> int:
    """actions/upload-artifact's path rules: glob lines, ``!`` lines exclude, stored relative to
    the least common ancestor of the included patterns' fixed parts."""
    lines = [line.strip() for line in spec.splitlines() if line.strip()]
    include = [line for line in lines if not line.startswith("!")]
    exclude = [line[1:] for line in lines if line.startswith("!")]
    roots = [Path(re.split(r"[*?\[]", p)[0]).parent if re.search(r"[*?\[]", p) else Path(p.rstrip("/"))
             for p in include]
    common = Path(os.path.commonpath([str(r) for r in roots])) if roots else Path(".")
    files = set()
    for pattern in include:
        pattern = pattern + "**" if pattern.endswith("/") else pattern
        for name in glob.glob(str(workspace / pattern), recursive=True):
            if Path(name).is_file():
                files.add(Path(name).relative_to(workspace))
    kept = [f for f in files if not any(fnmatch.fnmatch(f.as_posix(), e) for e in exclude)]
    for rel in kept:
        target = out / rel.relative_to(common) if rel.is_relative_to(common) else out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(workspace / rel, target)
    return len(kept)


# ------------------------------------------------------------------------------ the image


def build_image(root: Path) -> Path:
    """The DLAMI's venv by its 2.33 path name, with the CPU stack and the fork's stand-in."""
    venv = root / "opt" / VENV_NAME
    done = subprocess.run([str(REPO / "scripts" / "make_titan_venv.sh")], env={**os.environ,
                          "TITAN_VENV": str(venv)}, capture_output=True, text=True)
    if done.returncode != 0:
        raise RehearsalError(f"building the image's venv failed (exit {done.returncode}; exit 2: "
                             f"no spring wheel in ../shared/wheels):\n{done.stderr}")
    label_as_fork(venv, FORK_VERSION)
    (root / "opt" / "aws" / "neuron" / "bin").mkdir(parents=True, exist_ok=True)
    return venv


def label_as_fork(venv: Path, version: str) -> None:
    """Give the venv's torchtitan the fork's version (its METADATA and dist-info name)."""
    infos = list(venv.glob("lib/python*/site-packages/torchtitan-*.dist-info"))
    if len(infos) != 1:
        raise RehearsalError(f"expected one torchtitan dist-info in {venv}, found {infos}")
    metadata = infos[0] / "METADATA"
    metadata.write_text(re.sub(r"(?m)^Version: .*$", f"Version: {version}", metadata.read_text()))
    infos[0].rename(infos[0].with_name(f"torchtitan-{version}.dist-info"))


def provision(root: Path) -> dict[str, str]:
    """The runner's persistent folders (repository variables name them): the twin's MoE assets
    (derived on trn2 from the 30B-A3B cut's config, which is too big here), empty C4 and 4B
    folders for the first night to fetch into."""
    sys.path.insert(0, str(REPO))
    from harness.registry import paths
    from harness.registry.assets_twin import MOE_ASSETS, derived_assets

    assets, c4 = root / "opt" / "hf-assets", root / "opt" / "hf-data" / "c4"
    derived_assets(paths.TINY_MOE, paths.TINY_DENSE, assets / MOE_ASSETS)
    c4.mkdir(parents=True, exist_ok=True)
    return {"TRN2_ASSETS_DIR": str(assets), "TRN2_C4_DIR": str(c4)}


def copy_working_tree(out: Path) -> None:
    """What actions/checkout gives: a clone of this repository at HEAD, with this working tree's
    files on top (tracked, and untracked that git does not ignore: the change being rehearsed)."""
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(REPO), str(out)], check=True)
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, names):
        source = REPO / name
        if source.is_file():
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, out / name)
    subprocess.run(["git", "reset", "--quiet"], cwd=out, check=True)


# ------------------------------------------------------------------------------ the nights


def rehearse_night(number: int, root: Path, image_root: Path, variables: dict[str, str],
                   store: Path) -> Night:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    (job,) = workflow["jobs"].values()
    night_root = root / f"night-{number}"
    workspace, logs = night_root / "workspace", night_root / "logs"
    logs.mkdir(parents=True)
    copy_working_tree(workspace)
    contexts = Contexts(vars=variables, inputs={"pytest-args": ""}, secrets={"HF_TOKEN": ""},
                        github={"token": "rehearsal", "run_id": str(number),
                                "repository": REPOSITORY},
                        runner={"os": "Linux", "arch": "X64"})
    home = image_root / "home"
    home.mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "PYTEST_", "VIRTUAL_ENV"))}
    env = {**base, "HOME": str(home), "NEURON_OPT_ROOT": str(image_root / "opt"),
           "HARNESS_NEURON_STANDIN": "cpu", "GITHUB_WORKSPACE": str(workspace),
           "GITHUB_REPOSITORY": REPOSITORY, "GITHUB_RUN_ID": str(number), "CI": "true",
           "RUNNER_TEMP": str(night_root / "runner-temp"), "REHEARSAL_STORE": str(store),
           **{k: contexts.substitute(v) for k, v in job.get("env", {}).items()}}
    Path(env["RUNNER_TEMP"]).mkdir()
    night = Night(number, night_root, workspace, logs, contexts, env)
    for index, step in enumerate(job["steps"]):
        start = time.monotonic()
        status = run_step(night, step, index, store)
        if status not in ("success", "skipped"):
            contexts.failed = True
        night.results.append((step.get("name") or step.get("uses"), status, time.monotonic() - start))
        print(f"  night {number}: {status:>16s} {time.monotonic() - start:7.1f} s  "
              f"{step.get('name') or step.get('uses')}", flush=True)
    (store / "runs" / str(number)).mkdir(parents=True, exist_ok=True)
    (store / "runs" / str(number) / "conclusion").write_text(
        "success" if night.succeeded else "failure")
    return night


def tail(night: Night, lines: int = 60) -> str:
    failed = [i for i, (_, status, _) in enumerate(night.results) if status not in ("success", "skipped")]
    out = []
    for i in failed[:2]:
        for log in sorted(night.logs.glob(f"{i:02d}-*.log")):
            text = log.read_text(errors="replace").splitlines()
            out += [f"--- {log} (last {min(lines, len(text))} lines) ---", *text[-lines:]]
    return "\n".join(out)


def report_problems(workspace: Path) -> list[str]:
    """A night whose tests passed has a run report that says so: every verdict in it is the one
    a test computed (a report that judged again after the clean-up would find the full-size
    checkpoints gone)."""
    import json

    results = workspace / "reports" / "run-report" / "results.json"
    if not results.is_file():
        return [f"no run report at {results}"]
    return [f"the run report says {run['name']} {check} failed "
            f"({(verdict.get('message') or '').splitlines()[0] if verdict.get('message') else ''}), "
            f"though pytest passed"
            for run in json.loads(results.read_text())["runs"]
            for check, verdict in run.get("checks", {}).items() if verdict["status"] == "fail"]


def second_night_problems(night: Night) -> list[str]:
    """What the second night must show: it read the first night's report as its baseline."""
    import json

    problems = []
    if "--baseline" not in night.env.get("BASELINE_ARGS", ""):
        problems.append(f"night {night.number} found no baseline (BASELINE_ARGS="
                        f"{night.env.get('BASELINE_ARGS')!r})")
    results = night.workspace / "reports" / "run-report" / "results.json"
    baseline = json.loads(results.read_text()).get("baseline") if results.is_file() else None
    if not baseline:
        problems.append(f"{results} has no baseline section")
    elif not baseline.get("runs"):
        problems.append(f"{results}: the baseline section compared no run")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nights", type=int, default=2)
    parser.add_argument("--root", default=None, help="a new folder for the rehearsal (default: a "
                        "temporary one, removed afterwards unless --keep)")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--differences", action="store_true",
                        help="print what the rehearsal swaps (a markdown table) and exit")
    args = parser.parse_args()
    if args.differences:
        print("| what | on trn2 | in the rehearsal | why |\n|---|---|---|---|")
        for row in DIFFERENCES:
            print("| " + " | ".join(row) + " |")
        return 0
    root = Path(args.root or tempfile.mkdtemp(prefix="rehearsal-"))
    root.mkdir(parents=True, exist_ok=True)
    print("The trn2 night, rehearsed on CPU. What differs from trn2 (and why):")
    for what, trn2, here, why in DIFFERENCES:
        print(f"  - {what}: trn2 {trn2}; here {here} ({why})")
    try:
        image_root = root / "image"
        build_image(image_root)
        variables = provision(image_root)
        store = root / "actions"
        nights = []
        for number in range(1, args.nights + 1):
            print(f"night {number} ({root / f'night-{number}'}):", flush=True)
            night = rehearse_night(number, root, image_root, variables, store)
            nights.append(night)
            if not night.succeeded:
                print(f"night {number} FAILED:\n{tail(night)}")
                return 1
        problems = [f"night {n.number}: {p}" for n in nights for p in report_problems(n.workspace)]
        problems += second_night_problems(nights[1]) if len(nights) > 1 else []
        for problem in problems:
            print(f"rehearsal FAILED: {problem}")
        if not problems:
            print(f"rehearsal passed: {len(nights)} night(s)")
        return 1 if problems else 0
    finally:
        if not args.keep and not args.root:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
