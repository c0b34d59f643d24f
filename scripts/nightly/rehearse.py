#!/usr/bin/env python3
"""The trn2 night, rehearsed on CPU: .github/workflows/nightly-trn2.yml executed step by step.

    python3 scripts/nightly/rehearse.py                 # two nights in a fresh temporary root
    python3 scripts/nightly/rehearse.py --nights 1 --root /tmp/night --keep

Builds a fake Neuron image under a temporary root (the Neuron 2.33 DLAMI's venv by its own path
name, holding this machine's CPU stack, root's and read-only, and no TorchTitan Neuron), runs the
documented provisioning step (scripts/nightly/provision.py: the runner user's venv over the
image's, with spring-2026 torchtitan labelled as TorchTitan Neuron), and runs the workflow's own
steps as a GitHub runner does: as a user that is not root (created with useradd when this runs
as root, as on a CI machine), each ``run:`` step in bash with the job's environment, ``${{ }}``
expressions evaluated, ``GITHUB_ENV`` / ``GITHUB_PATH`` / ``GITHUB_OUTPUT`` /
``GITHUB_STEP_SUMMARY`` honoured between steps, ``if:`` and ``timeout-minutes`` obeyed; the
actions it uses (checkout, cache, upload-artifact, download-artifact) are emulated on local
folders, and GitHub's REST API (the baseline's run id, the preflight's artifact check) on a
local HTTP server that asks for the job's token. There is no ``gh``. Two nights in a row: the
second fetches the first's run report as its baseline. Everything that differs from a trn2
night is in ``DIFFERENCES`` below, each with its reason; nothing else is changed.

Exit status 0 when every night concluded with success and the second night compared itself
with the first; else 1, with the failing step's log tail.
"""

from __future__ import annotations

import argparse
import fcntl
import fnmatch
import glob
import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import yaml

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "nightly-trn2.yml"
FAKES = Path(__file__).resolve().parent / "rehearsal"
# Neuron 2.33's DLAMI venv (docs: setup/pytorch/update-dlami) and where scripts/nightly/
# image_env.sh looks for it.
VENV_NAME = "aws_neuronx_venv_torch_neuronx_2_14_0"
FORK_VERSION = "0.2.2+neuron.rehearsal"
REPOSITORY = "rehearsal/titan-parity-harness"
TOKEN = "rehearsal-token"  # github.token: what the local REST API and download-artifact ask for
# The user the night runs as when the rehearsal itself runs as root (GitHub's runner refuses
# root: actions/runner config.sh "Must not run with sudo").
RUNNER_USER = "night-runner"

# What the rehearsal swaps, and why. Nothing else differs from a trn2 night.
DIFFERENCES = (
    ("device", "the neuron tier's launches on trn2's NeuronCores (process group 'neuron', 64 "
     "ranks per full-size run)", "the cpu profile (gloo, 2 ranks): HARNESS_NEURON_STANDIN=cpu, "
     "the one switch (harness/device/devices.py standin_for)", "no Trainium here"),
    ("sizes", "Qwen3-4B-Instruct-2507 and the 4-layer 30B-A3B cut at seq 2048", "the assets "
     "twin (harness/registry/assets_twin.py: the tiny fixtures laid out as the real download) at seq 256, "
     "pretrained where it has weights (the twin's tied-embedding init rules would swamp a "
     "random-init check); the preflight's disk peak is the twin's", "a 4B model does not train "
     "on 2 CPU cores"),
    ("numbers", "the source's published 6.54 / 12.43 and trn2's timeouts", "the twin's recorded "
     "stand-ins on fixtures/c4 (fixtures/expectations.toml) and the CPU timeouts",
     "the published numbers are Qwen3-4B's on trn2"),
    ("in-process neuron tests", "tests/kernels' 'neuron' device cells, each module in its own "
     "child process (harness/launch/own_process.py)", "deselected, named in the session's summary "
     "(their CPU twins are the nki-emu cells of the default suite)",
     "torch-neuronx's device has no stand-in"),
    ("collectives", "ProcessGroupNeuron (torch-neuronx 2.14.3)", "gloo, with ProcessGroupNeuron's "
     "refusals checked as torch's collectives are called (harness/device/neuron_collectives.py: "
     "uneven all-to-all splits, a barrier on a subgroup, all_to_all on a group that does not "
     "divide the world, the coalesced reduce-scatter), not inside the backend", "no NeuronCores here"),
    ("compile", "torch.compile through TorchNeuron's 'neuron' backend", "Inductor (the cpu "
     "profile's compile backend)", "the neuron backend needs torch-neuronx"),
    ("image root", "/opt (the DLAMI's venvs and tools, root's)", "<root>/opt, NEURON_OPT_ROOT, "
     "root's and read-only as on the DLAMI", "the machine's /opt is not ours to write"),
    ("the runner's user", "the runner's own user (GitHub's runner refuses root)", f"{RUNNER_USER}, "
     "made with useradd when the rehearsal runs as root (else the invoking user); every folder "
     "on the way to this machine's interpreter gets o+x (traverse only) for the night, restored "
     "after", "this machine's python lives under /root"),
    ("torchtitan", "TorchTitan Neuron 0.2.2+neuron.1 (aws-neuron/torchtitan-neuron), installed "
     "once by the documented provisioning step (scripts/nightly/provision.py) into the runner's "
     "venv", "the same step, as the runner user, installing spring-2026 main (the pinned wheel, "
     f"scripts/get_upstream.py) "
     f"repacked as {FORK_VERSION} (--no-deps: the image venv already holds its requirements)",
     "the fork is not reachable here; its public base is, with every defect the base has"),
    ("torch stack", "torch 2.14.0 + torch-neuronx 2.14.3.x + nki + neuronx-cc in the venv",
     "this machine's CPU stack (torch 2.14.0, constraints/cpu.txt), seen through "
     "--system-site-packages, and the spring wheel's own pins (scripts/make_titan_venv.sh)",
     "no Neuron packages here"),
    ("nki-library", "the copy neuronx-cc bundles (nkilib), under the real nki", "the standalone "
     "wheel (nkilib_src) under the harness's NKI emulator (the preflight's signature check)",
     "no neuronx-cc here"),
    ("the Hub", "huggingface.co (hf download; the preflight's egress check)", "a fake `hf` "
     "serving the twin and fixtures/c4 (scripts/nightly/rehearsal/hf); HF_ENDPOINT on the local "
     "HTTP server for the egress check", "no Hub access here"),
    ("GitHub", "the runner, actions/*, GitHub's REST API", "this file's step runner, local "
     "folders for the cache and the artifacts, a local HTTP server answering the two REST calls "
     "the night makes (with the job's token), no `gh` (the DLAMI has none)", "no GitHub here"),
    ("HOME", "the runner user's home (the venv, the data, the NEFF cache)", "<root>/home, owned "
     "by that user", "isolation"),
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
        """A GitHub expression of the forms the workflow uses: ``a || b``, ``a == b``,
        ``a != b``, ``'literal'``, ``context.name``, ``always()`` / ``success()`` / ``failure()``."""
        terms = [t.strip() for t in expression.split("||")]
        value = ""
        for term in terms:
            value = self._term(term)
            if value:
                return value
        return value

    def _term(self, term: str):
        comparison = re.fullmatch(r"(.+?)\s*(==|!=)\s*(.+)", term)
        if comparison:
            left, operator, right = comparison.groups()
            equal = str(self._term(left.strip())) == str(self._term(right.strip()))
            return equal if operator == "==" else not equal
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
    user: Runner | None = None

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
        return emulate_action(night, step, store, log)
    files = {k: night.root / f"{k.lower()}-{index}" for k in ("GITHUB_ENV", "GITHUB_PATH",
                                                            "GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY")}
    for path in files.values():
        path.touch()
        give(path, night.user)
    env = {**night.env, **{k: contexts.substitute(v) for k, v in step.get("env", {}).items()},
           **{k: str(v) for k, v in files.items()}}
    # The fake services first (nothing of the image may answer for them), then GITHUB_PATH's.
    env["PATH"] = os.pathsep.join([str(FAKES), *night.path, env["PATH"]])
    script = night.root / f"step-{index}.sh"
    script.write_text(contexts.substitute(step["run"]))
    give(script, night.user)
    with open(log, "wb") as out:
        try:
            code = subprocess.run([*as_runner(night.user), "bash", "--noprofile", "--norc", "-eo",
                                   "pipefail", str(script)],
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


def emulate_action(night: Night, step: dict, store: Path, log: Path) -> str:
    action = step["uses"].split("@")[0]
    inputs = {k: night.contexts.substitute(v) for k, v in (step.get("with") or {}).items()}
    home = Path(night.env["HOME"])
    status = "success"
    if action == "actions/checkout":
        message = f"workspace {night.workspace}: a copy of this working tree (made before the night)"
    elif action == "actions/cache/restore":
        target = Path(inputs["path"].replace("~", str(home)))
        keys = sorted((store / "cache").glob("*"), key=lambda p: p.stat().st_mtime, reverse=True)
        prefixes = [inputs["key"], *[k for k in inputs.get("restore-keys", "").splitlines() if k]]
        hit = next((k for prefix in prefixes for k in keys if k.name.startswith(prefix)), None)
        if hit:
            shutil.copytree(hit, target, dirs_exist_ok=True)
            give(target, night.user, recursive=True)  # the runner writes what it restores as its user
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
    elif action == "actions/download-artifact":
        # v4: without github-token it downloads from the current run only (run-id is then
        # ignored); an artifact that is not there fails the step
        run_id = inputs.get("run-id") if inputs.get("github-token") == TOKEN else night.contexts.github["run_id"]
        source = store / "runs" / str(run_id) / "artifacts" / inputs["name"]
        target = Path(inputs.get("path") or night.workspace)
        if source.is_dir():
            shutil.copytree(source, target, dirs_exist_ok=True)
            give(target, night.user, recursive=True)
            message = f"artifact {inputs['name']} of run {run_id} -> {target}"
        else:
            status = "failed (exit 1)"
            message = (f"Unable to download artifact(s): Artifact not found for name: "
                       f"{inputs['name']} (run {run_id}"
                       f"{'' if inputs.get('github-token') else ': no github-token, the current run'})")
    else:
        raise RehearsalError(f"action {action} is not one the rehearsal emulates: add it to "
                             f"scripts/nightly/rehearse.py (and to DIFFERENCES)")
    log.write_text(message + "\n")
    return status


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


# ------------------------------------------------------------------------------ the runner's user


@dataclass(frozen=True)
class Runner:
    name: str
    uid: int
    gid: int


def as_runner(user: Runner | None) -> list[str]:
    """The command prefix that runs a step as the runner's user (its groups, this environment)."""
    if user is None:
        return []
    return ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--init-groups"]


def give(path: Path, user: Runner | None, recursive: bool = False) -> None:
    if user is None:
        return
    paths = [path, *(path.rglob("*") if recursive and path.is_dir() else ())]
    for item in paths:
        os.lchown(item, user.uid, user.gid)


def runner_user() -> Runner | None:
    """The user the night runs as: this one when it is not root, else ``RUNNER_USER`` (made
    with useradd if missing); None means "as this process"."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(RUNNER_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        RUNNER_USER], check=True)
        entry = pwd.getpwnam(RUNNER_USER)
    return Runner(RUNNER_USER, entry.pw_uid, entry.pw_gid)


TRAVERSE_STATE = Path(tempfile.gettempdir()) / "rehearsal-traverse.json"


class Traverse:
    """o+x (traverse, not read) on the folders between / and this machine's interpreter, the
    checkout and the wheels, for the night's user, restored once the last rehearsal using them
    ends (a count in ``TRAVERSE_STATE``, under a lock)."""

    def __init__(self, user: Runner | None, targets: list[Path]):
        self.user, self.targets = user, targets

    def _update(self, change) -> None:
        with open(str(TRAVERSE_STATE) + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = json.loads(TRAVERSE_STATE.read_text()) if TRAVERSE_STATE.is_file() else {"holders": 0, "modes": {}}
            change(state)
            TRAVERSE_STATE.write_text(json.dumps(state))

    def __enter__(self):
        if self.user is None:
            return self

        def grant(state):
            state["holders"] += 1
            for target in self.targets:
                for folder in [*reversed(Path(os.path.realpath(target)).parents)]:
                    mode = stat.S_IMODE(folder.stat().st_mode)
                    if not mode & stat.S_IXOTH:
                        state["modes"].setdefault(str(folder), mode)
                        folder.chmod(mode | stat.S_IXOTH)
        self._update(grant)
        return self

    def __exit__(self, *exc):
        if self.user is None:
            return

        def release(state):
            state["holders"] -= 1
            if state["holders"] <= 0:
                for folder, mode in state["modes"].items():
                    Path(folder).chmod(mode)
                state.update(holders=0, modes={})
        self._update(release)


# ------------------------------------------------------------------------------ the image


def build_image(root: Path) -> Path:
    """The DLAMI's venv by its 2.33 path name, with the CPU stack and without TorchTitan
    Neuron (the DLAMI does not ship it), root's and read-only; and the fork's stand-in as the
    wheel the provisioning step installs (``fork_wheel``)."""
    venv = root / "opt" / VENV_NAME
    done = subprocess.run([str(REPO / "scripts" / "make_titan_venv.sh")], env={**os.environ,
                          "TITAN_VENV": str(venv)}, capture_output=True, text=True)
    if done.returncode != 0:
        raise RehearsalError(f"building the image's venv failed (exit {done.returncode}; exit 2: "
                             f"no spring wheel: `python3 scripts/get_upstream.py torchtitan-spring2026` puts it in "
                             f"build/upstream/wheels):\n{done.stderr}")
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "uninstall", "--quiet", "-y",
                    "torchtitan"], check=True, capture_output=True)
    (root / "opt" / "aws" / "neuron" / "bin").mkdir(parents=True, exist_ok=True)
    return venv


def lock_image(root: Path) -> None:
    """/opt as the DLAMI has it: root's, and nobody may write it."""
    for item in [root / "opt", *(root / "opt").rglob("*")]:
        if item.is_symlink():
            continue
        if os.geteuid() == 0:
            os.chown(item, 0, 0)
        item.chmod(stat.S_IMODE(item.stat().st_mode) & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def fork_wheel(out: Path, version: str) -> Path:
    """The pinned spring-2026 wheel (build/upstream/wheels, scripts/get_upstream.py) repacked as
    TorchTitan Neuron ``version``."""
    wheel_dir = Path(os.environ.get("TITAN_WHEEL_DIR") or REPO / "build" / "upstream" / "wheels")
    wheels = sorted(wheel_dir.glob("torchtitan-0.2.2+*-py3-none-any.whl"))
    if len(wheels) != 1:
        raise RehearsalError(f"expected one spring torchtitan wheel in {wheel_dir}, found {wheels}: "
                             "`python3 scripts/get_upstream.py torchtitan-spring2026` puts it there")
    old = wheels[0].name.removeprefix("torchtitan-").removesuffix("-py3-none-any.whl")
    out.mkdir(parents=True, exist_ok=True)
    target = out / f"torchtitan-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheels[0]) as source, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as sink:
        for item in source.infolist():
            name = item.filename.replace(f"torchtitan-{old}.dist-info", f"torchtitan-{version}.dist-info")
            data = source.read(item)
            if name.endswith(".dist-info/METADATA"):
                data = re.sub(rb"(?m)^Version: .*$", f"Version: {version}".encode(), data)
            if name.endswith(".dist-info/RECORD"):
                data = re.sub(rb"(?m)^(torchtitan-)[^/]*(\.dist-info/(METADATA|RECORD)),.*$",
                              lambda m: m.group(1) + version.encode() + m.group(2) + b",,", data)
                data = data.replace(f"torchtitan-{old}.dist-info".encode(),
                                    f"torchtitan-{version}.dist-info".encode())
            sink.writestr(name, data)
    return target


def provision(root: Path, user: Runner | None, wheel: Path) -> dict[str, str]:
    """The runner's persistent folders, as its admin leaves them and the documented
    provisioning step makes them: its home, the twin's MoE assets (derived on trn2 from the
    30B-A3B cut's config, which is too big here) in the default assets folder, and the runner's
    venv with the fork (scripts/nightly/provision.py, run as the runner user). No repository
    variable is set: the night's folders are its defaults under $HOME."""
    sys.path.insert(0, str(REPO))
    from harness.registry import paths  # noqa: PLC0415  order: after sys.path holds this tree
    from harness.registry.assets_twin import MOE_ASSETS, derived_assets  # noqa: PLC0415  order: after sys.path holds this tree

    home = root / "home"
    home.mkdir(parents=True, exist_ok=True)
    derived_assets(paths.TINY_MOE, paths.TINY_DENSE, home / "hf-assets" / MOE_ASSETS)
    give(home, user, recursive=True)
    env = {**os.environ, "HOME": str(home), "NEURON_OPT_ROOT": str(root / "opt"),
           "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}
    done = subprocess.run([*as_runner(user), sys.executable, str(REPO / "scripts" / "nightly" /
                           "provision.py"), "--fork", str(wheel), "--no-deps"],
                          env=env, cwd=home, capture_output=True, text=True)
    if done.returncode != 0:
        raise RehearsalError(f"provisioning the runner failed:\n{done.stdout}{done.stderr}")
    return {}


# ------------------------------------------------------------------------------ GitHub's REST API


class Api:
    """The two REST calls the night makes, over the rehearsal's store: the last successful
    nightly run (scripts/nightly/baseline_run.py) and the artifact list (the preflight). A
    request without the job's token is a 401, as GitHub answers it."""

    def __init__(self, store: Path):
        store_ = store

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path.startswith(("/api/models/", "/api/datasets/")):
                    return self._send(200, {"id": self.path.split("/", 3)[-1]})  # the Hub's stand-in
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    return self._send(401, {"message": "Bad credentials"})
                url = urlparse(self.path)
                query = parse_qs(url.query)
                runs = sorted(((int(f.name), (f / "conclusion").read_text().strip())
                               for f in (store_ / "runs").glob("*")
                               if f.name.isdigit() and (f / "conclusion").is_file()), reverse=True)
                if url.path == f"/repos/{REPOSITORY}/actions/workflows/nightly-trn2.yml/runs":
                    status = query.get("status", [None])[0]
                    found = [{"id": n, "conclusion": c} for n, c in runs if status in (None, c)]
                    return self._send(200, {"total_count": len(found),
                                            "workflow_runs": found[:int(query.get("per_page", [30])[0])]})
                if url.path == f"/repos/{REPOSITORY}/actions/artifacts":
                    name = query.get("name", [None])[0]
                    found = [{"name": a.name, "workflow_run": {"id": int(r.name)}}
                             for r in (store_ / "runs").glob("*") for a in (r / "artifacts").glob("*")
                             if name in (None, a.name)]
                    return self._send(200, {"total_count": len(found), "artifacts": found})
                return self._send(404, {"message": "Not Found"})

            def _send(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        (store / "runs").mkdir(parents=True, exist_ok=True)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


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
                   store: Path, user: Runner | None = None, api: str = "",
                   pytest_args: str = "") -> Night:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    (job,) = workflow["jobs"].values()
    night_root = root / f"night-{number}"
    workspace, logs = night_root / "workspace", night_root / "logs"
    logs.mkdir(parents=True)
    copy_working_tree(workspace)
    runner_temp = night_root / "runner-temp"
    contexts = Contexts(vars=variables, inputs={"pytest-args": pytest_args}, secrets={"HF_TOKEN": ""},
                        github={"token": TOKEN, "run_id": str(number),
                                "repository": REPOSITORY},
                        runner={"os": "Linux", "arch": "X64", "temp": str(runner_temp)})
    home = image_root / "home"
    home.mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("GITHUB_", "PYTEST_", "VIRTUAL_ENV", "PYENV", "HARNESS_", "TMP"))}
    # the interpreter's own folder, not a shim under root's home (pyenv's)
    base["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), base.get("PATH", "")])
    env = {**base, "HOME": str(home), "NEURON_OPT_ROOT": str(image_root / "opt"),
           "HARNESS_NEURON_STANDIN": "cpu", "GITHUB_WORKSPACE": str(workspace),
           "GITHUB_REPOSITORY": REPOSITORY, "GITHUB_RUN_ID": str(number), "CI": "true",
           "GITHUB_API_URL": api, "HF_ENDPOINT": api, "RUNNER_TEMP": str(runner_temp),
           **({"USER": user.name, "LOGNAME": user.name} if user else {}),
           **{k: contexts.substitute(v) for k, v in job.get("env", {}).items()}}
    runner_temp.mkdir()
    for folder in (night_root, workspace, runner_temp):
        give(folder, user, recursive=folder != night_root)
    night = Night(number, night_root, workspace, logs, contexts, env, user=user)
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
    results = workspace / "reports" / "run-report" / "results.json"
    if not results.is_file():
        return [f"no run report at {results}"]
    return [f"the run report says {run['name']} {check} failed "
            f"({(verdict.get('message') or '').splitlines()[0] if verdict.get('message') else ''}), "
            f"though pytest passed"
            for run in json.loads(results.read_text())["runs"]
            for check, verdict in run.get("checks", {}).items() if verdict["status"] == "fail"]


# What a trn2 night's test step does that a kinder stand-in would not (harness/device/devices.py:
# the neuron tier runs -n 0, every launch cold, none ahead of need): read from what it left.
STARTED_WARM = "harness: rank started warm, forked from zygote"  # harness/rank/warm_start.py
PREFETCH_CLAIM = "prefetch.claim"  # harness/registry/dump_layout.py


def schedule_problems(workspace: Path) -> list[str]:
    """The night's test step was scheduled as on trn2: one pytest process (no xdist worker),
    cold launches, nothing prefetched."""
    problems = []
    log = workspace / "reports" / "pytest.log"
    text = log.read_text(errors="replace") if log.is_file() else ""
    if re.search(r"\[gw\d+\]|created: \d+/\d+ workers", text):
        problems.append("the test step ran pytest-xdist workers (trn2 runs -n 0)")
    tmp = workspace / "reports" / "tmp"
    warm = [p for p in tmp.rglob("*.log") if STARTED_WARM in p.read_text(errors="replace")] if tmp.is_dir() else []
    if warm:
        problems.append(f"{len(warm)} rank log(s) started warm, forked from a zygote (trn2 starts "
                        f"every rank cold): {warm[0]}")
    claims = list(tmp.rglob(f"*{PREFETCH_CLAIM}*")) if tmp.is_dir() else []
    if claims:
        problems.append(f"runs were prefetched ahead of need (trn2 prefetches none): {claims[0]}")
    return problems


def profile_problems() -> list[str]:
    """What the stand-in profile runs differently from trn2's neuron profile is named in
    DIFFERENCES (its process group and compile backend), and it schedules as trn2 does (cold
    ranks, no prefetch, the neuron process group's refusals)."""
    sys.path.insert(0, str(REPO))
    from harness.device import devices  # noqa: PLC0415  order: after sys.path holds this tree
    from harness.registry import environment  # noqa: PLC0415  order: after sys.path holds this tree

    saved = os.environ.get(environment.NEURON_STANDIN)
    os.environ[environment.NEURON_STANDIN] = "cpu"
    try:
        standin = devices.profile_for("neuron")
    finally:
        if saved is None:
            os.environ.pop(environment.NEURON_STANDIN)
        else:
            os.environ[environment.NEURON_STANDIN] = saved
    trn2 = devices.neuron_profile(64, {})
    listed = " ".join(" ".join(row) for row in DIFFERENCES).lower()
    problems = [f"the stand-in's {what} is {getattr(standin, what)!r} (trn2: {getattr(trn2, what)!r}), "
                f"a swap DIFFERENCES does not name"
                for what in ("process_group_backend", "compile_backend")
                if getattr(standin, what) != getattr(trn2, what)
                and str(getattr(standin, what)).lower() not in listed]
    problems += [f"the stand-in's {what} is {getattr(standin, what)!r}: trn2's is {getattr(trn2, what)!r}"
                 for what in ("warm_start", "prefetch") if getattr(standin, what) != getattr(trn2, what)]
    if devices.STANDIN_COLLECTIVES not in standin.shims:
        problems.append("the stand-in's ranks do not refuse what ProcessGroupNeuron refuses "
                        f"(shim {devices.STANDIN_COLLECTIVES})")
    return problems


def second_night_problems(night: Night) -> list[str]:
    """What the second night must show: it read the first night's report as its baseline."""
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
    parser.add_argument("--pytest-args", default="", help="the workflow_dispatch input pytest-args "
                        "(e.g. -k ep: a night of a few tests)")
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
    root.chmod(0o755)  # the night's user reaches its folders through it
    print("The trn2 night, rehearsed on CPU. What differs from trn2 (and why):")
    for what, trn2, here, why in DIFFERENCES:
        print(f"  - {what}: trn2 {trn2}; here {here} ({why})")
    kinder = profile_problems()
    if kinder:
        for problem in kinder:
            print(f"rehearsal FAILED: {problem}")
        return 1
    user = runner_user()
    print(f"the night runs as {user.name if user else pwd.getpwuid(os.getuid()).pw_name} "
          f"(uid {user.uid if user else os.getuid()})")
    api = None
    started = time.monotonic()
    try:
        with Traverse(user, [Path(sys.executable), REPO]):
            image_root = root / "image"
            build_image(image_root)
            wheel = fork_wheel(root / "provisioning", FORK_VERSION)
            lock_image(image_root)
            variables = provision(image_root, user, wheel)
            store = root / "actions"
            api = Api(store)
            nights = []
            for number in range(1, args.nights + 1):
                print(f"night {number} ({root / f'night-{number}'}):", flush=True)
                night = rehearse_night(number, root, image_root, variables, store, user, api.url,
                                       args.pytest_args)
                nights.append(night)
                if not night.succeeded:
                    print(f"night {number} FAILED:\n{tail(night)}")
                    return 1
        problems = [f"night {n.number}: {p}" for n in nights
                    for p in report_problems(n.workspace) + schedule_problems(n.workspace)]
        problems += second_night_problems(nights[1]) if len(nights) > 1 else []
        for problem in problems:
            print(f"rehearsal FAILED: {problem}")
        if not problems:
            print(f"rehearsal passed: {len(nights)} night(s) in {time.monotonic() - started:.0f} s")
        return 1 if problems else 0
    finally:
        if api:
            api.close()
        if not args.keep and not args.root:
            remove(root)


def remove(root: Path) -> None:
    """The rehearsal's folder, read-only image included."""
    def writable_again(function, path, _):
        Path(path).parent.chmod(0o755)
        if os.path.isdir(path) and not os.path.islink(path):
            Path(path).chmod(0o755)
        function(path)
    shutil.rmtree(root, onerror=writable_again)


if __name__ == "__main__":
    sys.exit(main())
