#!/usr/bin/env python3
"""Nightly step "Preflight": every precondition of the night, checked before anything else runs.

    python3 scripts/nightly/preflight.py            # by hand on a runner, or as the night's first step
    python3 scripts/nightly/preflight.py --markdown # the table as the job summary writes it

Prints one table: each precondition, the value found, and for each that fails the exact command
that fixes it. A failing precondition that ``stops`` the night exits 1 (the workflow then runs
no test; the table is the job summary). Rows that ``inform`` (what the device's collectives
accept, whether random-init shards differ) never stop the night: they say which known issues
the night will meet, decided on this runner rather than assumed.

Runs with the system ``python3`` and the standard library only; what needs torch runs in the
night's own python (the runner's venv over the image's, found as scripts/nightly/image_env.sh
finds them) as small child processes, the device probes as 2-rank torchrun launches. All of it
takes well under 3 minutes (each child is held to ``PROBE_TIMEOUT_S``).

The paths the night writes default to the runner user's own folders ($HOME/...): the GitHub
runner refuses to run as root (actions/runner config.sh: "Must not run with sudo"), so nothing
of the night may need root, and /opt is not the runner's.

Env (the workflow's): ASSETS_DIR, C4_DIR, HARNESS_VENV, NEURON_VENV, NEURON_OPT_ROOT,
RUNNER_TEMP, GITHUB_WORKSPACE, GITHUB_STEP_SUMMARY, GITHUB_REPOSITORY, GITHUB_API_URL,
GH_TOKEN (artifact access), HF_ENDPOINT, HARNESS_NEURON_STANDIN (the rehearsal).
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NIGHTLY = REPO / "scripts" / "nightly"
PROBE_TIMEOUT_S = 60
HOME = Path(os.path.expanduser("~"))

# Where the night writes, by default under the runner user's home (repository variables move them).
DEFAULT_ASSETS = "$HOME/hf-assets"
DEFAULT_C4 = "$HOME/hf-data/c4"
DEFAULT_HARNESS_VENV = "$HOME/.venvs/titan-night"

# The night's peak disk use, GB: the data it fetches once (Qwen3-4B-Instruct-2507's safetensors,
# 8.0; C4's 64 train shards and one validation shard, about 20), one bfloat16 HF export of the
# 4B at a time (8.0; harness/checks/run_checks.py deletes each once read), the NEFF cache (at most
# the 10 GB an Actions cache holds per repository) and the reports and rank logs (an allowance).
DATA_GB = {"Qwen3-4B-Instruct-2507": 8.0, "C4 (64 ranks)": 20.0}
RUN_GB = {"one HF export": 8.0, "NEFF cache": 10.0, "reports and logs": 2.0}
# The rehearsal's stand-in night reads the assets twin and fixtures/c4 (kilobytes to megabytes):
# its peak is its reports, rank logs and the twin's checkpoints (scripts/nightly/rehearse.py).
STANDIN_DATA_GB = {"Qwen3-4B-Instruct-2507": 0.1, "C4 (64 ranks)": 0.1}
STANDIN_RUN_GB = {"reports, logs and checkpoints": 1.0}

# nki-library's entry points the harness calls (harness/kernels/checks/adapters/nkilib.py,
# harness/kernels/ops/nki/grouped_swiglu_backward.py), with the parameters of the release it was
# written against (the standalone wheel 0.1.0+gd4920de): (name, has a default) in order.
NKILIB_ENTRY_POINTS: dict[str, tuple[tuple[str, bool], ...]] = {
    "core.embeddings.rope:RoPE": (
        ("x_in", False), ("cos", False), ("sin", False), ("lnc_shard", True),
        ("contiguous_layout", True), ("relayout_in_sbuf", True)),
    "experimental.loss.cross_entropy:cross_entropy_forward": (
        ("logits_hbm", False), ("targets_hbm", False), ("positions_per_batch", True),
        ("chunk_size", True), ("dtype", True)),
    "experimental.loss.cross_entropy:cross_entropy_backward": (
        ("logits_hbm", False), ("targets_hbm", False), ("lse_state_hbm", False), ("reduction", True),
        ("positions_per_batch", True), ("chunk_size", True), ("dtype", True), ("inplace", True)),
    "core.moe.moe_cte.bwmm_shard_on_block:bwmm_shard_on_block": (
        ("hidden_states", False), ("expert_affinities_masked", False),
        ("gate_up_proj_weight", False), ("down_proj_weight", False), ("block_size", False),
        ("token_position_to_id", False), ("block_to_expert", False)),
    "experimental.moe.bwd.blockwise_mm_backward:blockwise_mm_bwd": (
        ("hidden_states", False), ("expert_affinities_masked", False),
        ("gate_up_proj_weight", False), ("down_proj_weight", False),
        ("gate_up_proj_act_checkpoint_T", False), ("down_proj_act_checkpoint", False),
        ("token_position_to_id", False), ("block_to_expert", False),
        ("output_hidden_states_grad", False), ("block_size", False)),
}


@dataclass
class Row:
    name: str
    value: str
    ok: bool
    fix: str = ""
    stops: bool = True  # False: informs (what the night will expect), never stops it

    @property
    def status(self) -> str:
        if self.ok:
            return "ok"
        return "FAIL" if self.stops else "note"


def expand(value: str) -> Path:
    return Path(os.path.expandvars(value.replace("$HOME", str(HOME)))).expanduser()


# ------------------------------------------------------------------------------------ the runner


def runner_user() -> Row:
    user, uid = getpass.getuser(), os.getuid()
    if uid == 0:
        return Row("runner user", f"{user} (uid 0)", False,
                   "run the runner as its own user: `sudo useradd -m runner && sudo -u runner "
                   "./config.sh ...` then `sudo ./svc.sh install runner` (actions/runner refuses "
                   "root: 'Must not run with sudo')")
    return Row("runner user", f"{user} (uid {uid})", True)


def writable(path: Path) -> tuple[bool, str]:
    """Whether the night can write ``path``: itself if it exists, else its nearest ancestor."""
    probe = path
    while not probe.exists():
        probe = probe.parent
    ok = os.access(probe, os.W_OK | os.X_OK)
    where = "exists" if probe == path else f"to create under {probe}"
    return ok, f"{path} ({where}, {'writable' if ok else 'NOT writable'})"


def night_paths(env: dict[str, str]) -> list[tuple[str, Path, str]]:
    """(what, path, the variable that moves it) of everything the night writes."""
    workspace = Path(env.get("GITHUB_WORKSPACE") or os.getcwd())
    return [
        ("reports", workspace / "reports", "(the checkout)"),
        ("model assets", expand(env.get("ASSETS_DIR") or DEFAULT_ASSETS), "TRN2_ASSETS_DIR"),
        ("C4 copy", expand(env.get("C4_DIR") or DEFAULT_C4), "TRN2_C4_DIR"),
        ("harness venv", expand(env.get("HARNESS_VENV") or DEFAULT_HARNESS_VENV), "TRN2_HARNESS_VENV"),
        ("NEFF cache", HOME / ".cache" / "neuron-neff", "TORCH_NEURONX_NEFF_CACHE_DIR"),
        ("NEFF local cache", expand(env.get("TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR")
                                    or "$HOME/.cache/neuron-neff-local"),
         "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR"),
        ("compiler artifacts", expand(env.get("TORCH_NEURONX_DEBUG_DIR") or "/tmp/neuron_backend"),
         "TORCH_NEURONX_DEBUG_DIR"),
        ("runner temp", Path(env.get("RUNNER_TEMP") or tempfile.gettempdir()), "RUNNER_TEMP"),
    ]


def path_rows(env: dict[str, str]) -> list[Row]:
    rows = []
    for what, path, variable in night_paths(env):
        ok, value = writable(path)
        fix = "" if ok else (f"set the repository variable {variable} to a folder the runner user "
                             f"owns (e.g. $HOME/{path.name}), or once as an admin: "
                             f"`sudo install -d -o $(id -un) {path}`")
        rows.append(Row(f"writable: {what}", value, ok, fix))
    return rows


def disk_row(env: dict[str, str]) -> Row:
    assets, c4 = expand(env.get("ASSETS_DIR") or DEFAULT_ASSETS), expand(env.get("C4_DIR") or DEFAULT_C4)
    missing = [n for n, f in (("Qwen3-4B-Instruct-2507", assets / "Qwen3-4B-Instruct-2507"),
                              ("C4 (64 ranks)", c4)) if not (f.is_dir() and any(f.iterdir()))]
    data, run = (STANDIN_DATA_GB, STANDIN_RUN_GB) if env.get("HARNESS_NEURON_STANDIN") else (DATA_GB, RUN_GB)
    need = sum(data[n] for n in missing) + sum(run.values())
    probe = assets
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free / 1e9
    value = (f"{free:.0f} GB free on {probe}; the night's peak {need:.0f} GB "
             f"({', '.join(missing) + ' to fetch, ' if missing else ''}"
             f"{', '.join(f'{k} {v:g}' for k, v in run.items())})")
    return Row("disk", value, free >= need,
               f"free {need - free:.0f} GB on {probe} (e.g. `rm -rf ~/.cache/neuron-neff/*` keeps "
               f"only what the next night restores), or point TRN2_ASSETS_DIR / TRN2_C4_DIR at a "
               f"larger volume")


# ------------------------------------------------------------------------------- the python env


def night_python(env: dict[str, str]) -> tuple[str | None, Row]:
    """The python the night's steps run (image_env.sh's answer), as a row."""
    with tempfile.TemporaryDirectory() as scratch:
        files = {k: Path(scratch) / k for k in ("GITHUB_PATH", "GITHUB_ENV")}
        for f in files.values():
            f.touch()
        done = subprocess.run(["bash", str(NIGHTLY / "image_env.sh")], capture_output=True,
                              text=True, env={**env, **{k: str(v) for k, v in files.items()},
                                              "PREFLIGHT": "1"}, cwd=scratch)
        lines = files["GITHUB_PATH"].read_text().split()
        first = lines[-1] if lines else None  # the last line GitHub prepends is first on PATH
    if done.returncode != 0:
        why = " ".join(line.removeprefix("::error::") for line in done.stdout.splitlines()
                       if "::error::" in line) or done.stderr.strip()
        return None, Row("Neuron venv", why[:300], False,
                         "on a Neuron 2.33 DLAMI: set the repository variable TRN2_NEURON_VENV to "
                         "/opt/aws_neuronx_venv_torch_neuronx_2_14_0 (or run on the DLAMI)")
    python = str(Path(first) / "python3") if first else "python3"
    return python, Row("Neuron venv", done.stdout.strip().splitlines()[0] if done.stdout.strip()
                       else python, True)


def probe(python: str, code: str, env: dict[str, str], timeout: float = PROBE_TIMEOUT_S) -> tuple[int, str]:
    try:
        done = subprocess.run([python, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                              timeout=timeout, env={**env, "PYTHONPATH": str(REPO)}, cwd=REPO)
    except subprocess.TimeoutExpired:
        return -1, f"timed out after {timeout:.0f} s"
    except OSError as error:
        return -1, str(error)
    return done.returncode, (done.stdout.strip() or done.stderr.strip())


FORK_PROBE = """
import json
from importlib import metadata
from harness.registry.generations import KNOWN_FORK_VERSIONS, is_fork
try:
    version = metadata.version("torchtitan")
except metadata.PackageNotFoundError:
    version = None
print(json.dumps({"version": version, "fork": bool(version and is_fork(version)),
                  "known": version in KNOWN_FORK_VERSIONS, "known_list": list(KNOWN_FORK_VERSIONS)}))
"""


C4_LOADER_PROBE = """
from torchtitan.hf_datasets.text_datasets import DATASETS
print("c4" in DATASETS and callable(DATASETS["c4"].loader))
"""


def c4_loader_row(python: str, env: dict[str, str]) -> Row:
    """The fork's own C4 loader, where harness/backends/c4.py reads it (before 28 GB are fetched
    for it, not after)."""
    status, out = probe(python, C4_LOADER_PROBE, env)
    ok = status == 0 and out.splitlines()[-1:] == ["True"]
    return Row("torchtitan's c4 loader", "torchtitan.hf_datasets.text_datasets.DATASETS['c4']"
               + (": there" if ok else f": {out.splitlines()[-1] if out else 'not found'}"), ok,
               "the fork moved or renamed torchtitan's dataset registry: update "
               "harness/backends/c4.py load_as_torchtitan_does to where it is now")


def fork_rows(python: str, env: dict[str, str]) -> list[Row]:
    code, out = probe(python, FORK_PROBE, env)
    provision = ("once, as the runner user (no root): `python3 scripts/nightly/provision.py "
                 "--fork <a clone of https://github.com/aws-neuron/torchtitan-neuron>` "
                 "(docs/nightly.md#provisioning-the-runner)")
    if code != 0:
        return [Row("TorchTitan Neuron", f"could not ask {python}: {out[-300:]}", False, provision)]
    facts = json.loads(out.splitlines()[-1])
    if not facts["version"]:
        return [Row("TorchTitan Neuron", f"no torchtitan in {python}", False, provision)]
    if not facts["fork"]:
        return [Row("TorchTitan Neuron", f"torchtitan {facts['version']} (not +neuron)", False,
                    provision), c4_loader_row(python, env)]
    rows = [Row("TorchTitan Neuron", f"torchtitan {facts['version']}", True), c4_loader_row(python, env)]
    rows.append(Row("fork release known to the harness", f"{facts['version']} (known: "
                    f"{', '.join(facts['known_list'])})", facts["known"],
                    "record the release in harness/registry/generations.py KNOWN_FORK_VERSIONS "
                    "once a night has passed on it (until then its results say it is unknown)",
                    stops=False))
    return rows


NKILIB_PROBE = """
import importlib, inspect, json, os
import_module = importlib.import_module
if os.environ.get("HARNESS_NEURON_STANDIN"):  # the rehearsal: the standalone wheel on the harness's NKI emulator
    from harness.kernels import emu
    import_module = emu.import_module
out, packages, unimportable = {}, [], {}
for package in ("nkilib", "nkilib_src.nkilib"):
    try:
        import_module(package)
        packages.append(package)
    except Exception as error:
        unimportable[package] = f"{type(error).__name__}: {error}"
if not packages:
    print(json.dumps({"unimportable": unimportable}))
    raise SystemExit(0)
for key in ENTRY:
    module, name = key.split(":")
    found = None
    for package in packages:
        try:
            obj = getattr(import_module(f"{package}.{module}"), name)
        except Exception as error:
            missing = getattr(error, "name", None) if isinstance(error, ImportError) else None
            if missing and missing.split(".")[0] not in ("nkilib", "nkilib_src"):
                unimportable[package] = f"{type(error).__name__}: {error}"  # a dependency, not the entry point
            found = found or f"{type(error).__name__}: {error}"
            continue
        obj = getattr(obj, "func", None) or getattr(obj, "__wrapped__", None) or obj
        params = [(p.name, p.default is not inspect.Parameter.empty)
                  for p in inspect.signature(obj).parameters.values()]
        found = {"package": package, "params": params}
        break
    out[key] = found
if all(not isinstance(v, dict) for v in out.values()) and all(p in unimportable for p in packages):
    out = {"unimportable": unimportable}
print(json.dumps(out))
"""


def signature_problem(expected, params) -> str | None:
    """Why an entry point with parameters ``params`` ((name, has a default) in order) no longer
    takes the harness's call written for ``expected``, or None. The harness passes the required
    parameters by position and the optional ones it uses by name: every expected parameter must
    still exist, the required ones first and in order, and no new required one may appear."""
    names = [name for name, _ in params]
    missing = [name for name, _ in expected if name not in names]
    required = [name for name, has_default in params if not has_default]
    expected_required = [name for name, has_default in expected if not has_default]
    new_required = [name for name in required if name not in expected_required]
    reordered = required[:len(expected_required)] != expected_required
    problems = ([f"missing {missing}"] if missing else []) + \
        ([f"new required {new_required}"] if new_required else []) + \
        (["required parameters reordered"] if reordered and not missing else [])
    return "; ".join(problems) or None


def nkilib_rows(python: str, env: dict[str, str]) -> list[Row]:
    code = f"ENTRY = {json.dumps(list(NKILIB_ENTRY_POINTS))}\n" + textwrap.dedent(NKILIB_PROBE)
    status, out = probe(python, code, env)
    if status != 0:
        return [Row("nki-library entry points", f"could not ask {python}: {out[-300:]}", False,
                    "install the Neuron 2.33 stack in the image's venv (neuronx-cc bundles nkilib)")]
    found = json.loads(out.splitlines()[-1])
    if "unimportable" in found:
        return [Row("nki-library", "none importable: " + "; ".join(
                        f"{package}: {why}" for package, why in found["unimportable"].items())[:400], False,
                    "nki-library comes with neuronx-cc in the image's Neuron venv (see the row 'Neuron "
                    "venv'); its entry points are checked by signature once it imports")]
    rows = []
    for key, expected in NKILIB_ENTRY_POINTS.items():
        got = found.get(key)
        if not isinstance(got, dict):
            rows.append(Row(f"nki-library {key}", f"missing ({got})", False,
                            f"the bundled nki-library lacks {key}: update harness/kernels/checks/"
                            f"adapters/nkilib.py to its API (the entry point moved?) or pin "
                            f"neuronx-cc to the 2.33 release"))
            continue
        params = [tuple(p) for p in got["params"]]
        problem = signature_problem(expected, params)
        ok = problem is None
        value = f"{got['package']}: " + ("as written for" if ok else problem)
        rows.append(Row(f"nki-library {key}", value, ok,
                        "" if ok else f"adapt the harness's call of {key} to this signature "
                                      f"({[p[0] for p in params]}) and record it in "
                                      f"scripts/nightly/preflight.py NKILIB_ENTRY_POINTS"))
    return rows


# ------------------------------------------------------------------------------------ the device

DEVICE_PROBE = """
import json, os
from harness.device.devices import standin_for, tier_status, NEURON_LNC_DEFAULT
standin = standin_for("neuron")
available, reason = tier_status("neuron")
count = None
if available and not standin:
    import torch
    count = torch.neuron.device_count()
print(json.dumps({"standin": standin, "available": available, "reason": reason, "count": count,
                  "lnc": os.environ.get("NEURON_LOGICAL_NC_CONFIG") or NEURON_LNC_DEFAULT}))
"""

# Run by every rank of a 2-rank torchrun on the night's device (or its stand-in): an uneven
# all-to-all (what EP's dispatch sends) and the random-init draw of a sharded DTensor.
COLLECTIVES_PROBE = """
import json, os, sys
import torch
import torch.distributed as dist
standin = os.environ.get("HARNESS_NEURON_STANDIN")
if standin:
    from harness.upstream.install import install
    install(["neuron_collectives"])
device = "cpu" if standin else "neuron"
dist.init_process_group("gloo" if standin else "neuron")
rank = dist.get_rank()
out = {}
x = torch.arange(3.0, device=device)
try:
    # rank 0 sends 1 row to itself and 2 to rank 1; rank 1 sends 2 to rank 0 and 1 to itself
    splits = [1, 2] if rank == 0 else [2, 1]
    dist.all_to_all_single(torch.empty(3, device=device), x, splits, splits)
    out["uneven_all_to_all"] = "accepted"
except Exception as error:
    out["uneven_all_to_all"] = f"{type(error).__name__}: {error}"
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, Shard
mesh = init_device_mesh(device, (dist.get_world_size(),))
torch.manual_seed(0)
param = distribute_tensor(torch.zeros(8, 4, device=device), mesh, [Shard(0)])
torch.nn.init.normal_(param)
local = param.to_local().detach().cpu()
gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
dist.all_gather_object(gathered, local)
out["shards_identical"] = bool(torch.equal(gathered[0], gathered[1]))
if rank == 0:
    print("PROBE " + json.dumps(out), flush=True)
dist.destroy_process_group()
"""


def device_rows(python: str, env: dict[str, str]) -> list[Row]:
    status, out = probe(python, DEVICE_PROBE, env)
    if status != 0:
        return [Row("neuron device", f"could not ask {python}: {out[-300:]}", False,
                    "run the night on a trn2 with the Neuron DLAMI (torch-neuronx in the venv)")]
    facts = json.loads(out.splitlines()[-1])
    rows = []
    if not facts["available"]:
        return [Row("neuron device", f"none: {facts['reason']}", False,
                    "run on a trn2 instance with the Neuron driver and runtime: "
                    "`neuron-ls` must list the devices (`sudo apt-get install aws-neuronx-dkms "
                    "aws-neuronx-runtime-lib` on a plain Ubuntu image)"),
                Row("collectives: uneven all-to-all (EP)", "not probed: no neuron device", False,
                    "decided once the device is there", stops=False),
                Row("random-init shards distinct", "not probed: no neuron device", False,
                    "decided once the device is there", stops=False)]
    if facts["standin"]:
        rows.append(Row("neuron device", f"stand-in: {facts['reason']}", True))
    else:
        count = facts["count"]
        rows.append(Row("neuron device", f"{count} logical NeuronCores", count >= 2,
                        "the tier needs at least 2 NeuronCores: check `neuron-ls` and "
                        "NEURON_RT_VISIBLE_CORES (unset it)"))
    lnc = facts["lnc"]
    rows.append(Row("LNC", f"NEURON_LOGICAL_NC_CONFIG={lnc}", lnc == "2",
                    "unset NEURON_LOGICAL_NC_CONFIG (trn2's default is 2; the expectations and "
                    "the NKI kernels assume it)"))
    rows += collective_rows(python, env)
    return rows


def collective_rows(python: str, env: dict[str, str]) -> list[Row]:
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(textwrap.dedent(COLLECTIVES_PROBE))
    torchrun = [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", f.name]
    try:
        done = subprocess.run(torchrun, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S * 2,
                              env={**env, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}, cwd=REPO)
        text = done.stdout + done.stderr
    except subprocess.TimeoutExpired:
        text = "timed out"
    finally:
        os.unlink(f.name)
    line = next((found for found in text.splitlines() if found.startswith("PROBE ")), None)
    if line is None:
        return [Row("collectives probe (2 ranks)", f"did not run: {text.strip()[-300:]}", False,
                    "check that 2 ranks can start: `torchrun --nproc-per-node=2` with the neuron "
                    "backend (neuron-top shows a core held by another process?)")]
    facts = json.loads(line.removeprefix("PROBE "))
    a2a = facts["uneven_all_to_all"]
    rows = [Row("collectives: uneven all-to-all (EP)", a2a, a2a == "accepted",
                "EP runs will stop as known issue torch-neuronx-alltoall-uneven-splits (expected); "
                "if this shows 'accepted', delete that entry from "
                "harness/registry/known_issues/neuron.py" if a2a != "accepted" else "",
                stops=False)]
    identical = facts["shards_identical"]
    rows.append(Row("random-init shards distinct", "identical across ranks" if identical
                    else "distinct", not identical,
                    "random-init runs' shards_distinct will fail on this device: run the night "
                    "with --workaround dtensor_full_init (workflow input pytest-args) and record "
                    "the known issue for this device" if identical else "", stops=False))
    return rows


# ------------------------------------------------------------------------------ the network


def http_ok(url: str, token: str | None = None, timeout: float = 15) -> tuple[bool, str]:
    request = urllib.request.Request(url, method="GET")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return True, f"HTTP {response.status}"
    except urllib.error.HTTPError as error:
        return False, f"HTTP {error.code}"
    except (urllib.error.URLError, OSError) as error:
        return False, f"{type(error).__name__}: {getattr(error, 'reason', error)}"


def artifact_row(env: dict[str, str]) -> Row:
    api = env.get("GITHUB_API_URL") or "https://api.github.com"
    repository = env.get("GITHUB_REPOSITORY")
    token = env.get("GH_TOKEN") or env.get("GITHUB_TOKEN")
    if not repository or not token:
        return Row("artifacts (the baseline)", "no GITHUB_REPOSITORY / GH_TOKEN: not a workflow run",
                   False, "the workflow passes GH_TOKEN: ${{ github.token }} with permissions "
                   "actions: read", stops=False)
    url = f"{api}/repos/{repository}/actions/artifacts?name=reports-trn2&per_page=1"
    ok, value = http_ok(url, token)
    return Row("artifacts (the baseline)", f"{url}: {value}", ok,
               "grant the workflow `permissions: actions: read` and let the runner reach "
               f"{api} over HTTPS (proxy: HTTPS_PROXY)")


def hub_row(env: dict[str, str]) -> Row:
    endpoint = env.get("HF_ENDPOINT") or "https://huggingface.co"
    assets = expand(env.get("ASSETS_DIR") or DEFAULT_ASSETS) / "Qwen3-4B-Instruct-2507"
    c4 = expand(env.get("C4_DIR") or DEFAULT_C4)
    needed = not ((assets / "config.json").is_file() and c4.is_dir() and any(c4.iterdir()))
    ok, value = http_ok(f"{endpoint}/api/models/Qwen/Qwen3-4B-Instruct-2507", env.get("HF_TOKEN") or None)
    value = f"{endpoint}: {value}" + ("" if needed else " (data already here: not needed tonight)")
    return Row("Hub egress", value, ok or not needed,
               f"let the runner reach {endpoint} over HTTPS (HTTPS_PROXY), or fetch the data "
               f"once by hand (docs/nightly.md#data) into {assets.parent} and {c4}",
               stops=needed)


# ------------------------------------------------------------------------------------ the table


def rows(env: dict[str, str]) -> list[Row]:
    out = [runner_user(), *path_rows(env), disk_row(env)]
    python, venv = night_python(env)
    out.append(venv)
    # without the image's venv, the rest is asked of this python: each row still says what is missing
    python = python or sys.executable
    out += fork_rows(python, env) + nkilib_rows(python, env) + device_rows(python, env)
    out += [artifact_row(env), hub_row(env)]
    return out


def table(found: list[Row]) -> str:
    lines = ["| precondition | status | value | fix |", "|---|---|---|---|"]
    for row in found:
        cells = [row.name, row.status, row.value, "" if row.ok else row.fix]
        lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.parse_args(argv)
    env = dict(os.environ)
    found = rows(env)
    failing = [r for r in found if not r.ok and r.stops]
    text = "## Preflight\n\n" + table(found) + "\n\n" + (
        f"**{len(failing)} precondition(s) fail: the night stops here.** "
        + "; ".join(f"{r.name}: {r.fix}" for r in failing) if failing
        else "Every precondition holds.") + "\n"
    print(text)
    summary = env.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a") as f:
            f.write(text)
    for row in failing:
        print(f"::error::preflight: {row.name}: {row.value}. Fix: {row.fix}")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
