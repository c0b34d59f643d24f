"""The nightly's own steps (scripts/nightly/), on CPU: the pieces the rehearsal strings together.

Specification:
- the image's venv is found by its Neuron 2.33 DLAMI name (aws_neuronx_venv_torch_neuronx_*,
  newest first), then by the older aws_neuronx_venv_pytorch_*; none, and no python3 importing
  torch_neuronx, fails naming where it looked and the variable that names one;
- with HARNESS_NEURON_STANDIN=cpu the neuron tier's launches run on the cpu profile: available,
  recorded as a stand-in, 2 ranks, the full size from the assets twin at CPU timeouts, and
  scheduled as on trn2 (no xdist worker, cold launches, no prefetch); its ranks refuse what
  ProcessGroupNeuron refuses (uneven all-to-all splits at least), and the known issue that
  refusal raises on EP is matched by its signature; anything else is refused naming what is
  accepted;
- the rehearsal evaluates the workflow's expressions as GitHub does (or refuses one it does not
  know), reads GITHUB_ENV / GITHUB_OUTPUT as the runner does, and uploads artifacts by
  actions/upload-artifact's path rules;
- a night's test step that passed leaves a run report with no failing verdict.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import os
import pwd
import re
import subprocess
import sys

import pytest
import torch.distributed.distributed_c10d as c10d
import torchtitan.trainer
from torchtitan.distributed import utils

from harness.device import devices
from harness.device.neuron_collectives import alltoall_base_refusal, alltoall_refusal, barrier_refusal
from harness.launch.run_matrix import RunCase, cases
from harness.rank.warm_start import STARTED_WARM
from harness.registry import dump_layout, environment, known_issues, paths

NIGHTLY = paths.REPO_ROOT / "scripts" / "nightly"


def _nightly(name: str):
    spec = importlib.util.spec_from_file_location(f"nightly_{name}", NIGHTLY / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _image_env(tmp_path, venvs: list[str], env: dict | None = None):
    root = tmp_path / "opt"
    for name in venvs:
        (root / name / "bin").mkdir(parents=True)
        (root / name / "bin" / "python3").symlink_to(sys.executable)
    files = {k: tmp_path / k for k in ("GITHUB_PATH", "GITHUB_ENV")}
    for f in files.values():
        f.touch()
    run_env = {**os.environ, "NEURON_OPT_ROOT": str(root), "NEURON_VENV": "", "HOME": str(tmp_path),
               "PATH": f"{tmp_path / 'nopython'}:/usr/bin:/bin", **{k: str(v) for k, v in files.items()},
               **(env or {})}
    done = subprocess.run(["bash", str(NIGHTLY / "image_env.sh")], cwd=tmp_path, env=run_env,
                          capture_output=True, text=True)
    return done, files["GITHUB_PATH"].read_text().split(), root


def test_the_2_33_dlami_venv_is_found_by_its_own_name_newest_first(tmp_path):
    done, path, root = _image_env(tmp_path, ["aws_neuronx_venv_pytorch_2_9_0",
                                             "aws_neuronx_venv_torch_neuronx_2_13_0",
                                             "aws_neuronx_venv_torch_neuronx_2_14_0"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert path[0] == str(root / "aws_neuronx_venv_torch_neuronx_2_14_0" / "bin")


def test_an_older_dlami_venv_is_still_found(tmp_path):
    done, path, root = _image_env(tmp_path, ["aws_neuronx_venv_pytorch_2_9_0"])
    assert done.returncode == 0 and path[0] == str(root / "aws_neuronx_venv_pytorch_2_9_0" / "bin")


def test_no_venv_and_no_neuron_python_fails_naming_where_it_looked(tmp_path):
    done, path, root = _image_env(tmp_path, [])
    assert done.returncode == 1 and not path
    for said in ("aws_neuronx_venv_torch_neuronx_*", "aws_neuronx_venv_pytorch_*",
                 "TRN2_NEURON_VENV", f"{root}/aws_neuronx_venv_torch_neuronx_2_14_0"):
        assert said in done.stdout, done.stdout


# -- the stand-in


def test_the_neuron_tier_stands_in_on_the_cpu_profile(monkeypatch):
    monkeypatch.setenv(environment.NEURON_STANDIN, "cpu")
    available, reason = devices.tier_status("neuron")
    assert available and "stand-in" in reason
    assert devices.device_status("neuron")[0] is False, "the device itself is not there"
    profile = devices.profile_for("neuron")
    assert (profile.kind, profile.process_group_backend, profile.ranks_per_node) == ("cpu", "gloo", 2)
    assert profile.recorded["standin-for"] == "neuron"
    assert profile.recorded["collectives"] == "neuron" and "neuron_collectives" in profile.shims
    assert devices.xdist_workers(None, "neuron", 2) == 0
    assert not profile.warm_start and not profile.prefetch
    neuron = cases(("neuron",))
    full = [c for c in neuron if c.size == "full"]
    assert full and all(c.twin and c.timeout_s == devices.TIMEOUTS_S["cpu"]["full"] for c in full)
    assert {(c.backend, c.init) for c in full} == {("hf_v5", "pretrained"), ("titan_native", "pretrained"),
                                                   ("nki_moe", "random")}
    monkeypatch.setenv(environment.NEURON_STANDIN, "cuda")
    with pytest.raises(ValueError, match=r"can stand in on \('cpu',\) only"):
        devices.tier_status("neuron")


def test_without_the_stand_in_the_neuron_tier_is_trn2_s(monkeypatch):
    monkeypatch.delenv(environment.NEURON_STANDIN, raising=False)
    assert devices.xdist_workers(None, "neuron", 2) == 0
    full = [c for c in cases(("neuron",)) if c.size == "full"]
    assert len(full) == 7 and not any(c.twin for c in full)
    # the source's five FSDP runs, the docs' recipe layout (TP4 x FSDP16) of native Qwen3, and
    # the MoE cut with its experts split over every rank
    assert [c.id for c in full if c.layout != "fsdp"] == ["neuron-titan_native-full-pretrained@tp4+fsdp",
                                                         "neuron-nki_moe-full-random@ep64"]
    assert all(c.timeout_s == devices.NEURON_TIMEOUTS_S["full"] for c in full)


# -- the stand-in refuses what ProcessGroupNeuron refuses


def test_the_refusals_are_process_group_neurons():
    for accepted in ((None, None), ([], []), ([1, 1], [1, 1]), (None, [1, 1])):
        assert alltoall_base_refusal(*accepted, 2) is None, accepted
    # torch-neuronx's own test_invalid_split_sizes_error: [2, 1] on 2 ranks
    assert "Only even split sizes are supported. Got input_split_sizes: [2, 1]" in \
        alltoall_base_refusal(None, [2, 1], 2)
    # equal splits of more than one row are refused too ("even" there means all 1s); output first
    assert "Got output_split_sizes: [2, 2]" in alltoall_base_refusal([2, 2], [3, 1], 2)
    assert "length (3) must match group_size (2)" in alltoall_base_refusal([1, 2, 1], None, 2)
    assert alltoall_refusal(4, 2) is None and "not divisible" in alltoall_refusal(4, 3)
    assert barrier_refusal(2, 2) is None and "only for default group" in barrier_refusal(4, 2)


REFUSALS_IN_A_RANK = """
import torch, torch.distributed as dist
from harness.upstream.install import install
install(["neuron_collectives"])
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
from torch.distributed._functional_collectives import all_to_all_single_autograd
x = torch.arange(4.0)
seen = []
for call in (lambda: dist.all_to_all_single(torch.empty(1), x[:1], [1], [1]),
             lambda: all_to_all_single_autograd(x[:1], [1], [1], dist.group.WORLD),
             lambda: dist.all_to_all_single(torch.empty(4), x, [4], [4]),
             lambda: all_to_all_single_autograd(x, [4], [4], dist.group.WORLD)):
    try:
        call(); seen.append("ok")
    except NotImplementedError as error:
        seen.append(str(error))
print(repr(seen))
dist.destroy_process_group()
"""


def test_a_stand_in_rank_refuses_an_uneven_all_to_all_as_trn2_does():
    """In a process that installed the shim, every torch entry point of ``alltoall_base``
    refuses what ProcessGroupNeuron refuses (splits of 1 pass, [4] is refused); without it gloo
    takes both."""
    for shims, expected in ((True, ["ok", "ok", "Only even", "Only even"]), (False, ["ok"] * 4)):
        code = REFUSALS_IN_A_RANK if shims else REFUSALS_IN_A_RANK.replace(
            'install(["neuron_collectives"])', "")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              cwd=paths.REPO_ROOT, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(paths.REPO_ROOT)})
        assert done.returncode == 0, done.stderr[-2000:]
        seen = eval(done.stdout.strip().splitlines()[-1])
        assert [s if s == "ok" else "Only even" if "Only even split sizes" in s else s
                for s in seen] == expected, seen


def test_ep_on_neuron_collectives_is_the_named_known_issue_and_nothing_else():
    error = ("NotImplementedError: alltoall_base: Only even split sizes are supported. "
             "Got output_split_sizes: [301, 211]")
    where = dict(backend="nki_moe", layout="ep", device="cpu", collectives="neuron")
    verdict = known_issues.judge("completed", f"first error: {error}", {"error": error}, **where)
    assert verdict.status == "known" and verdict.issues[0].name == "torch-neuronx-alltoall-uneven-splits"
    # another crash of the same run is a failure, and so is an EP run that completes
    other = "RuntimeError: connection reset"
    assert known_issues.judge("completed", other, {"error": other}, **where).status == "fail"
    assert known_issues.judge("completed", None, {}, **where).status == "fail"
    # the MoE's FSDP runs, and EP on gloo (cpu, cuda tiers), are untouched
    assert known_issues.judge("completed", None, {}, **{**where, "layout": "fsdp"}).status == "pass"
    assert known_issues.judge("completed", None, {}, **{**where, "collectives": ""}).status == "pass"


# -- the rehearsal's runner


def test_expressions_evaluate_as_github_does():
    rehearse = _nightly("rehearse")
    contexts = rehearse.Contexts(vars={"TRN2_ASSETS_DIR": ""}, inputs={}, secrets={},
                                 github={"run_id": "7"}, runner={"os": "Linux"},
                                 steps={"pytest": {"outputs": {"exit-code": "1"}}})
    assert contexts.substitute("${{ vars.TRN2_ASSETS_DIR || '/opt/hf-assets' }}") == "/opt/hf-assets"
    assert contexts.substitute("a-${{ runner.os }}-${{ github.run_id }}") == "a-Linux-7"
    assert contexts.substitute("${{ steps.pytest.outputs.exit-code }}") == "1"
    assert contexts.condition(None) and contexts.condition("${{ always() }}")
    contexts.failed = True
    assert not contexts.condition(None) and contexts.condition("${{ always() }}")
    with pytest.raises(rehearse.RehearsalError, match="hashFiles"):
        contexts.substitute("${{ hashFiles('x') }}")


def test_runner_files_are_read_as_the_runner_reads_them(tmp_path):
    rehearse = _nightly("rehearse")
    env = tmp_path / "env"
    env.write_text("A=1\nB=x=y\nTEXT<<EOF\nline one\nline two\nEOF\n")
    assert rehearse.read_assignments(env) == {"A": "1", "B": "x=y", "TEXT": "line one\nline two"}
    assert env.read_text() == "", "consumed"


def test_artifacts_follow_upload_artifact_path_rules(tmp_path):
    rehearse = _nightly("rehearse")
    work = tmp_path / "work"
    for name in ("reports/run-report/results.json", "reports/tmp/run/dump/checkpoint/step-1/a.bin",
                 "reports/tmp/run/model.safetensors", "reports/junit.xml"):
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text("x")
    count = rehearse.upload(work, "reports/\n!reports/**/checkpoint/**\n!reports/**/*.safetensors\n",
                            tmp_path / "out")
    kept = sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*")
                  if p.is_file())
    assert count == 2 and kept == ["junit.xml", "run-report/results.json"], kept


def test_a_night_whose_tests_passed_has_no_failing_verdict_in_its_report(tmp_path):
    rehearse = _nightly("rehearse")
    report = tmp_path / "reports" / "run-report"
    report.mkdir(parents=True)
    document = {"runs": [{"name": "titan_native-full-pretrained", "checks": {
        "completed": {"status": "pass"}, "hf_checkpoint_complete": {"status": "known"}}}]}
    (report / "results.json").write_text(json.dumps(document))
    assert rehearse.report_problems(tmp_path) == []
    document["runs"][0]["checks"]["hf_checkpoint_complete"] = {
        "status": "fail", "message": "no HF checkpoint under .../dump/checkpoint"}
    (report / "results.json").write_text(json.dumps(document))
    assert rehearse.report_problems(tmp_path) == [
        "the run report says titan_native-full-pretrained hf_checkpoint_complete failed (no HF "
        "checkpoint under .../dump/checkpoint), though pytest passed"]


def test_a_full_size_or_neuron_run_may_wait_on_a_collective_as_long_as_it_may_run():
    """torchtitan lowers the collective timeout after step 1 through torch's set_timeout, which
    a backend may ignore (then the init timeout stays): both are the run's own timeout."""
    for case in (RunCase("neuron", "titan_native", "full", "pretrained", "sdpa"),
                 RunCase("cpu", "titan_native", "full", "pretrained", "sdpa")):
        overrides = list(case.run_spec(10, assets_root="/assets").overrides)
        seconds = str(int(case.timeout_s))
        for flag in ("--comm.init_timeout_seconds", "--comm.train_timeout_seconds"):
            assert overrides[overrides.index(flag) + 1] == seconds, (case.id, overrides)
        assert overrides[overrides.index("--checkpoint.export_dtype") + 1] == "bfloat16"
    # a tiny neuron run's cold compile may outlast torchtitan's 300 s too; a tiny CPU run's not
    tiny = RunCase("neuron", "titan_native", "tiny", "pretrained", "sdpa")
    overrides = list(tiny.run_spec(10).overrides)
    assert overrides[overrides.index("--comm.init_timeout_seconds") + 1] == str(int(tiny.timeout_s))
    assert "--comm.init_timeout_seconds" not in RunCase("cpu", "titan_native", "tiny", "pretrained",
                                                        "sdpa").run_spec(10).overrides


def test_every_swap_the_rehearsal_makes_is_a_listed_difference():
    rehearse = _nightly("rehearse")
    listed = " ".join(" ".join(row) for row in rehearse.DIFFERENCES)
    source = (NIGHTLY / "rehearse.py").read_text()
    for swapped in (environment.NEURON_STANDIN, "NEURON_OPT_ROOT", '"HOME"', "FORK_VERSION", "FAKES",
                    "GITHUB_API_URL", "HF_ENDPOINT", "RUNNER_USER", "S_IXOTH"):
        assert swapped in source, swapped
    for said in (f"{environment.NEURON_STANDIN}=cpu", "NEURON_OPT_ROOT", "HOME", rehearse.FORK_VERSION,
                 "scripts/nightly/rehearsal/hf", "REST", "HF_ENDPOINT", "useradd", "o+x",
                 "neuron_collectives", "Inductor", "provision.py", "read-only", "NKI emulator"):
        assert said in listed, f"the rehearsal swaps {said} but DIFFERENCES does not say so"


def test_the_rehearsal_has_no_gh_and_no_night_step_calls_it():
    """The DLAMI has no GitHub CLI: nothing of the night may call it, and the rehearsal gives
    it none to find."""
    assert not (NIGHTLY / "rehearsal" / "gh").exists()
    for script in NIGHTLY.glob("*"):
        if script.is_file() and script.name != "rehearse.py":
            calls = [line for line in script.read_text().splitlines()
                     if re.search(r"(^|[\s;(|&$`])gh\s+(run|api|release)", line) and not line.lstrip().startswith("#")]
            assert not calls, f"{script.name} calls gh: {calls}"


def test_download_artifact_is_emulated_as_strictly_as_v4(tmp_path):
    """actions/download-artifact v4 downloads another run's artifact only with a github-token;
    an artifact that is not there fails the step."""
    rehearse = _nightly("rehearse")
    store, workspace = tmp_path / "store", tmp_path / "ws"
    (store / "runs" / "1" / "artifacts" / "reports-trn2" / "run-report").mkdir(parents=True)
    (store / "runs" / "1" / "artifacts" / "reports-trn2" / "run-report" / "results.json").write_text("{}")
    workspace.mkdir()
    contexts = rehearse.Contexts(vars={}, inputs={}, secrets={}, github={"run_id": "2", "token": rehearse.TOKEN},
                                 runner={"temp": str(tmp_path / "t")})
    night = rehearse.Night(2, tmp_path, workspace, tmp_path, contexts, {"HOME": str(tmp_path)})
    step = {"uses": "actions/download-artifact@v4", "with": {
        "name": "reports-trn2", "path": "${{ runner.temp }}/baseline", "run-id": "1",
        "github-token": "${{ github.token }}"}}
    log = tmp_path / "log"
    assert rehearse.emulate_action(night, step, store, log) == "success"
    assert (tmp_path / "t" / "baseline" / "run-report" / "results.json").is_file()
    no_token = {**step, "with": {k: v for k, v in step["with"].items() if k != "github-token"}}
    assert rehearse.emulate_action(night, no_token, store, log) != "success"
    assert "Artifact not found" in log.read_text()
    other = {**step, "with": {**step["with"], "run-id": "7"}}
    assert rehearse.emulate_action(night, other, store, log) != "success"


def test_the_baseline_run_is_asked_of_the_rest_api_with_the_token(tmp_path):
    """scripts/nightly/baseline_run.py against the rehearsal's REST stand-in: the last
    successful night with the token; nothing (and no failure) without it."""
    rehearse = _nightly("rehearse")
    store = tmp_path / "store"
    for number, conclusion in ((1, "success"), (2, "failure")):
        (store / "runs" / str(number)).mkdir(parents=True)
        (store / "runs" / str(number) / "conclusion").write_text(conclusion)
    api = rehearse.Api(store)
    try:
        base = {**os.environ, "GITHUB_API_URL": api.url, "GITHUB_REPOSITORY": rehearse.REPOSITORY}
        for token, expected in ((rehearse.TOKEN, "run-id=1"), ("wrong", "run-id=")):
            done = subprocess.run([sys.executable, str(NIGHTLY / "baseline_run.py")], text=True,
                                  capture_output=True, env={**base, "GH_TOKEN": token})
            assert done.returncode == 0 and done.stdout.strip() == expected, (done.stdout, done.stderr)
    finally:
        api.close()


def test_the_rehearsal_reads_a_kinder_schedule_off_the_night(tmp_path):
    """A night whose test step used xdist workers, warm ranks or the prefetcher is not a trn2
    night: the rehearsal fails it."""
    rehearse = _nightly("rehearse")
    # its copies (it imports no harness module at its top) are the harness's
    assert (rehearse.STARTED_WARM, rehearse.PREFETCH_CLAIM) == (STARTED_WARM, dump_layout.PREFETCH_CLAIM)
    reports = tmp_path / "reports"
    (reports / "tmp" / "run" / "torchrun").mkdir(parents=True)
    (reports / "pytest.log").write_text("== 3 passed ==\n")
    assert rehearse.schedule_problems(tmp_path) == []
    (reports / "pytest.log").write_text("[gw0] PASSED tests/e2e/test_runs.py::x\n")
    (reports / "tmp" / "run" / "torchrun" / "0.log").write_text(rehearse.STARTED_WARM + "\n")
    (reports / "tmp" / rehearse.PREFETCH_CLAIM).write_text("1")
    problems = rehearse.schedule_problems(tmp_path)
    assert len(problems) == 3 and "xdist" in problems[0] and "warm" in problems[1], problems


def test_expressions_compare_as_github_does():
    rehearse = _nightly("rehearse")
    contexts = rehearse.Contexts(vars={}, inputs={}, secrets={}, github={}, runner={},
                                 steps={"previous": {"outputs": {"run-id": ""}}})
    assert contexts.condition("${{ steps.previous.outputs.run-id != '' }}") is False
    contexts.steps["previous"]["outputs"]["run-id"] = "12"
    assert contexts.condition("${{ steps.previous.outputs.run-id != '' }}") is True
    assert contexts.condition("${{ steps.previous.outputs.run-id == '12' }}") is True


def test_why_both_collective_timeouts_are_set_still_holds_upstream():
    """The premise of ``collective_timeout_overrides``, read from the installed code: torchtitan
    lowers the process groups' timeout to train_timeout_seconds after the first step, through
    torch's set_timeout, which lets a backend keep its own. If either changes, revisit it."""
    # Read from the file, not the live class: the rank hooks may have wrapped Trainer.train in
    # this process.
    tree = ast.parse(inspect.getsource(torchtitan.trainer))
    (trainer,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Trainer"]
    (train,) = [n for n in trainer.body if isinstance(n, ast.FunctionDef) and n.name == "train"]
    assert "train_timeout_seconds" in ast.unparse(train)
    lowers = inspect.getsource(utils.set_pg_timeouts)  # 0.3.0: set_timeout; spring: its alias
    assert "distributed.set_timeout(" in lowers or "_set_pg_timeout(" in lowers
    assert "set_timeout(timeout, group)" in inspect.getsource(c10d._set_pg_timeout)
    assert "leave their timeout unchanged" in " ".join(inspect.getdoc(c10d.set_timeout).split())


def test_the_stand_in_profile_is_as_strict_as_trn2s_or_named():
    """The rehearsal refuses to start when the stand-in runs the neuron tier more kindly than
    trn2 (warm ranks, prefetch, gloo's acceptance) or swaps something DIFFERENCES does not name."""
    rehearse = _nightly("rehearse")
    assert rehearse.profile_problems() == []
    rows = rehearse.DIFFERENCES
    try:
        rehearse.DIFFERENCES = tuple(r for r in rows if r[0] != "compile")
        assert any("compile_backend" in p for p in rehearse.profile_problems())
    finally:
        rehearse.DIFFERENCES = rows


def test_the_rehearsal_never_runs_the_night_as_root(monkeypatch):
    """GitHub's runner refuses root: a rehearsal started as root runs the night as another user
    (made with useradd when missing), never as root itself."""
    rehearse = _nightly("rehearse")
    made = []
    entry = pwd.struct_passwd((rehearse.RUNNER_USER, "x", 4242, 4242, "", "/nonexistent", "/usr/sbin/nologin"))
    monkeypatch.setattr(rehearse.os, "geteuid", lambda: 0)
    monkeypatch.setattr(rehearse.pwd, "getpwnam", lambda name: entry if made else (_ for _ in ()).throw(KeyError(name)))
    monkeypatch.setattr(rehearse.subprocess, "run", lambda command, **kw: made.append(command)
                        or subprocess.CompletedProcess(command, 0))
    user = rehearse.runner_user()
    assert user is not None and (user.name, user.uid) == (rehearse.RUNNER_USER, 4242)
    assert made and made[0][0] == "useradd" and made[0][-1] == rehearse.RUNNER_USER
    assert rehearse.as_runner(user)[:2] == ["setpriv", "--reuid=4242"]


def test_the_rehearsal_gets_the_fork_only_through_the_provisioning_step(monkeypatch, tmp_path):
    """The image's venv has no torchtitan (the DLAMI ships none); the fork reaches the night only
    through scripts/nightly/provision.py, run as the runner user with the fork's wheel."""
    rehearse = _nightly("rehearse")
    calls = []
    monkeypatch.setattr(rehearse.subprocess, "run", lambda command, **kw: calls.append(command)
                        or subprocess.CompletedProcess(command, 0, "", ""))
    venv = rehearse.build_image(tmp_path / "image")
    assert [str(venv / "bin" / "python"), "-m", "pip", "uninstall", "--quiet", "-y", "torchtitan"] in calls
    user = rehearse.Runner("night-runner", 4242, 4242)
    monkeypatch.setattr(rehearse, "give", lambda *a, **k: None)
    calls.clear()
    rehearse.provision(tmp_path / "image", user, tmp_path / "torchtitan-0.2.2+neuron.rehearsal-py3-none-any.whl")
    (command,) = [c for c in calls if any(str(part).endswith("provision.py") for part in c)]
    assert command[:2] == ["setpriv", "--reuid=4242"]
    assert command[-3:] == ["--fork", str(tmp_path / "torchtitan-0.2.2+neuron.rehearsal-py3-none-any.whl"), "--no-deps"]
