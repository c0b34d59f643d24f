#!/usr/bin/env python3
"""Nightly step "Record the environment": reports/environment.{json,md} and the job summary.

The image's Python, platform, Neuron / torch / torchtitan packages, its Neuron system packages,
the device as the harness sees it (or its stand-in), the LNC and the variables that change the
numerics; ``neuron-ls`` where it exists. Runs whatever happened before it (``always()``):
a failed install is exactly when the record matters."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ENV_KEYS = ("NEURON_LOGICAL_NC_CONFIG", "NEURON_RT_VISIBLE_CORES", "TORCH_NEURONX_NEFF_CACHE_DIR",
            "NEURON_CC_FLAGS", "ASSETS_DIR", "C4_DIR", "NEURON_VENV", "HARNESS_NEURON_STANDIN")
PACKAGE_PREFIXES = ("torch", "neuron", "libneuron", "nki", "aws-neuron")
PACKAGES = ("transformers", "torchtitan", "titan-parity-harness", "safetensors", "tokenizers",
            "triton", "pytest", "datasets", "huggingface-hub")


def run(command: list[str]) -> str:
    if shutil.which(command[0]) is None:
        return f"({command[0]} not found)"
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    return (done.stdout + done.stderr).strip() or f"(no output, exit {done.returncode})"


def packages() -> dict[str, str]:
    """The version Python imports of each package of interest (a venv's shadows the system's
    where both are installed: the first on sys.path)."""
    names = {dist.metadata["Name"] or "" for dist in metadata.distributions()}
    wanted = [n for n in names if n.lower().replace("_", "-").startswith(PACKAGE_PREFIXES)
              or n.lower().replace("_", "-") in PACKAGES]
    return {name: metadata.version(name) for name in sorted(wanted, key=str.lower)}


def device() -> str:
    try:
        from harness.device.devices import tier_status  # noqa: PLC0415  optional: a failed install leaves no harness

        return tier_status("neuron")[1]
    except Exception as error:  # recorded, not fatal: the tests report it too
        return f"{type(error).__name__}: {error}"


def record() -> dict:
    if shutil.which("dpkg-query"):
        system = run(["dpkg-query", "-W", "-f", "${Package} ${Version}\n", "aws-neuronx-*"])
    else:
        system = run(["rpm", "-qa", "aws-neuronx-*"])
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": packages(),
        "system_packages": system.splitlines(),
        "neuron_device": device(),
        "lnc": os.environ.get("NEURON_LOGICAL_NC_CONFIG", "unset (harness default 2)"),
        "env": {k: os.environ.get(k, "unset") for k in ENV_KEYS},
        "neuron_ls": run(["neuron-ls"]),
    }


def markdown(data: dict) -> str:
    lines = ["## Environment", "",
             f"- Python {data['python']} on {data['platform']}",
             f"- Neuron device: {data['neuron_device']}",
             f"- Logical NeuronCore config (LNC): {data['lnc']}", "",
             "| package | version |", "|---|---|",
             *(f"| {k} | {v} |" for k, v in data["packages"].items()), "",
             "<details><summary>Neuron SDK system packages, environment, neuron-ls</summary>", "",
             "```", *data["system_packages"], "",
             *(f"{k}={v}" for k, v in data["env"].items()), "", data["neuron_ls"], "```",
             "</details>", ""]
    return "\n".join(lines)


def main() -> int:
    data = record()
    reports = Path("reports")
    reports.mkdir(exist_ok=True)
    (reports / "environment.json").write_text(json.dumps(data, indent=2))
    text = markdown(data)
    (reports / "environment.md").write_text(text)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a") as f:
            f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
